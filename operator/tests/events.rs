//! The operator's Event publisher against a real API server (the control
//! plane of the end-to-end harness, without nodes): what it does depends on
//! the API server's answers (a series' PATCH, a deleted Event). It is
//! tested here, beside its crate, rather than in the e2e binary, so that a
//! change to the operator does not rebuild that binary.

use ferry_e2e::{Cluster, create_namespace};
use ferry_operator::events::EventPublisher;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// The operator's Event publisher against the real API server: repeats of
/// one Event count up a single series (a PATCH), another note is another
/// Event, and a series whose Event was deleted starts a new one.
#[tokio::test(flavor = "multi_thread")]
async fn repeated_events_count_up_one_series_on_the_api_server() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource as _;
    use kube::runtime::events::{Event, EventType, Reporter};

    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    create_namespace(&cluster, "events", &[]).await;
    let subject: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "subject"}})).unwrap();
    let subject = Api::<ConfigMap>::namespaced(client.clone(), "events")
        .create(&PostParams::default(), &subject)
        .await
        .unwrap()
        .object_ref(&());
    let reporter = Reporter { controller: "ferry-operator".into(), instance: Some("e2e".into()) };
    let publisher = EventPublisher::new(client.clone(), reporter);
    let event = |note: &str| Event {
        type_: EventType::Warning,
        reason: "SecretNotFound".into(),
        note: Some(note.into()),
        action: "Sync".into(),
        secondary: None,
    };
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), "events");
    let listed = || async {
        let mut found: Vec<(String, String, i32)> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == subject.uid.as_deref())
            .map(|e| {
                let count = e.series.map_or(1, |s| s.count);
                (e.metadata.name.unwrap_or_default(), e.note.unwrap_or_default(), count)
            })
            .collect();
        found.sort_by(|a, b| a.1.cmp(&b.1));
        found
    };

    for _ in 0..3 {
        publisher.publish(&event("no Secret s3"), &subject).await.unwrap();
    }
    publisher.publish(&event("no Secret gcs"), &subject).await.unwrap();
    let found = listed().await;
    let counts: Vec<(&str, i32)> = found.iter().map(|(_, note, n)| (note.as_str(), *n)).collect();
    assert_eq!(counts, [("no Secret gcs", 1), ("no Secret s3", 3)], "{found:?}");

    // The series' Event deleted (as the API server's event TTL does): the
    // next repeat is a new Event, not an error.
    let first = found.iter().find(|(_, note, _)| note == "no Secret s3").unwrap().0.clone();
    events.delete(&first, &Default::default()).await.unwrap();
    publisher.publish(&event("no Secret s3"), &subject).await.unwrap();
    publisher.publish(&event("no Secret s3"), &subject).await.unwrap();
    let found = listed().await;
    let s3 = found.iter().find(|(_, note, _)| note == "no Secret s3").expect("a new Event");
    assert!(s3.0 != first && s3.2 == 2, "{found:?}");
    cluster.stop().await;
}
