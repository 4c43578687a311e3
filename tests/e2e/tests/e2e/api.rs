//! The DataStage API on a real API server: the generated CRD installs, a
//! valid DataStage is accepted, and invalid ones are refused at admission
//! with messages that say what to fix.

use ferry_crds::DataStage;
use ferry_e2e::{Cluster, create_namespace, install_crd};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn stage(name: &str, spec: Value) -> DataStage {
    serde_json::from_value(
        json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name}, "spec": spec}),
    )
    .expect("deserializable DataStage")
}

fn pull_spec() -> Value {
    json!({
        "source": {"uri": "s3://datasets/imagenet", "endpoint": "http://minio:9000", "credentials": {"name": "s3"}},
        "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
    })
}

/// Asserts that `spec` is refused with a message containing `expected`.
/// Sent as raw JSON, as `kubectl apply` would: the typed struct could not
/// even hold some of these mistakes.
async fn assert_refused(api: &Api<DynamicObject>, name: &str, spec: Value, expected: &str) {
    let message = refusal(api, name, spec).await;
    assert!(message.contains(expected), "{name}: expected {expected:?} in the refusal, got: {message}");
}

/// The message of the refusal of `spec`; panics if it was accepted.
async fn refusal(api: &Api<DynamicObject>, name: &str, spec: Value) -> String {
    let object: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name}, "spec": spec}),
    )
    .expect("a dynamic object");
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => panic!("{name}: an invalid DataStage was accepted"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{name}: {status:?}");
            status.message
        }
        Err(other) => panic!("{name}: unexpected error {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_datastages_are_refused_at_admission_with_messages_that_say_what_to_fix() {
    let cluster = Cluster::start().await.expect("cluster");
    install_crd(&cluster).await;
    create_namespace(&cluster, "api", &[]).await;
    let client = cluster.client().await.unwrap();
    let api: Api<DataStage> = Api::namespaced(client.clone(), "api");
    let raw: Api<DynamicObject> = Api::namespaced_with(client, "api", &ApiResource::erase::<DataStage>(&()));

    api.create(&PostParams::default(), &stage("valid", pull_spec())).await.expect("a valid pull is accepted");

    let mut spec = pull_spec();
    spec["source"]["volume"] = json!({"hostPath": "/data"});
    assert_refused(&raw, "both", spec, "spec.source: Invalid value: set exactly one of uri (object storage) or volume")
        .await;

    let spec = json!({"source": {"volume": {"hostPath": "/a"}}, "destination": {"volume": {"hostPath": "/b"}}});
    assert_refused(&raw, "volumes", spec, "one of spec.source and spec.destination must be object storage").await;

    let spec = json!({"source": {"uri": "s3://a/x"}, "destination": {"uri": "s3://b/y"}});
    assert_refused(&raw, "buckets", spec, "must be a volume").await;

    let mut spec = pull_spec();
    spec["destination"]["volume"]["hostPath"] = json!("relative/dir");
    assert_refused(&raw, "relative", spec, "volume.hostPath must be an absolute path").await;

    let mut spec = pull_spec();
    spec["source"]["uri"] = json!("https://datasets/imagenet");
    assert_refused(
        &raw,
        "scheme",
        spec,
        "uri must look like s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, oci://registry/repository:tag or hf://org/repo@revision",
    )
    .await;

    let spec = json!({"source": {"volume": {"hostPath": "/mnt/ckpt"}}, "destination": {"uri": "oci://registry.example/ckpt:v1"}});
    assert_refused(&raw, "oci-push", spec, "oci:// is a source only").await;

    let mut spec = pull_spec();
    spec["source"]["uri"] = json!("oci://registry.example/Models:v1");
    assert_refused(&raw, "oci-name", spec, "oci://registry/repository:tag").await;

    let spec = json!({"source": {"volume": {"hostPath": "/mnt/ckpt"}}, "destination": {"uri": "hf://acme/ckpt"}});
    assert_refused(&raw, "hf-push", spec, "hf:// is a source only").await;

    let mut spec = pull_spec();
    spec["source"]["uri"] = json!("hf://acme");
    assert_refused(&raw, "hf-name", spec, "hf://org/repo@revision").await;

    let mut spec = pull_spec();
    spec["transfer"] = json!({"concurrency": 0, "partSize": "lots"});
    let message = refusal(&raw, "bounds", spec).await;
    assert!(message.contains("spec.transfer.concurrency: Invalid value: 0: spec.transfer.concurrency in body should be greater than or equal to 1"), "{message}");
    assert!(
        message.contains("spec.transfer.partSize: Invalid value: \"lots\": must be a size: a positive whole number"),
        "{message}"
    );

    let mut spec = pull_spec();
    spec["schedule"] = json!("every day");
    assert_refused(&raw, "schedule", spec, "spec.schedule must be five cron fields").await;
    let mut spec = pull_spec();
    spec["schedule"] = json!("CRON_TZ=UTC 0 * * * *");
    assert_refused(&raw, "schedule-tz", spec, "set spec.timeZone instead").await;
    let push = json!({"source": {"volume": {"hostPath": "/mnt/out"}}, "destination": {"uri": "s3://b/out"}, "schedule": "@daily"});
    assert_refused(&raw, "push-schedule", push, "spec.schedule re-syncs a pull").await;

    let mut spec = pull_spec();
    spec["capacity"] = json!({"reserve": "150%"});
    assert_refused(&raw, "reserve", spec, "spec.capacity.reserve: Invalid value: \"150%\": must be a capacity reserve: a size (e.g. 64MiB, 10G, or 0 for none) or a whole percentage of the volume below 100").await;
    let push = json!({"source": {"volume": {"hostPath": "/mnt/out"}}, "destination": {"uri": "s3://b/out"},
                      "capacity": {"reserve": "1GiB"}});
    assert_refused(&raw, "push-capacity", push, "spec.capacity is about the destination volume of a pull").await;
    for (name, reserve) in [("reserve-percent", "10%"), ("reserve-none", "0"), ("reserve-size", "2GiB")] {
        let mut spec = pull_spec();
        spec["capacity"] = json!({ "reserve": reserve });
        api.create(&PostParams::default(), &stage(name, spec)).await.unwrap_or_else(|e| panic!("{reserve}: {e}"));
    }
    let mut claim = pull_spec();
    claim["destination"] = json!({"volume": {"persistentVolumeClaim": {"claimName": "data"}}});
    claim["capacity"] = json!({"eviction": "WhenSpaceIsNeeded"});
    assert_refused(
        &raw,
        "claim-eviction",
        claim.clone(),
        "spec.capacity.eviction removes a node's copy of a pull onto a nodeCache or hostPath",
    )
    .await;
    claim["capacity"] = json!({"eviction": "Never"});
    api.create(&PostParams::default(), &stage("claim-never-evicted", claim)).await.unwrap();
    let mut spec = pull_spec();
    spec["capacity"] = json!({"eviction": "Sometimes"});
    assert_refused(&raw, "eviction-enum", spec, "supported values: \"Never\", \"WhenSpaceIsNeeded\"").await;
    let mut spec = pull_spec();
    spec["capacity"] = json!({"idleSeconds": 3600});
    assert_refused(&raw, "idle-never", spec, "it needs spec.capacity.eviction: WhenSpaceIsNeeded").await;
    let mut spec = pull_spec();
    spec["capacity"] = json!({"eviction": "WhenSpaceIsNeeded", "idleSeconds": 0});
    assert_refused(&raw, "idle-zero", spec, "spec.capacity.idleSeconds: Invalid value: 0").await;
    let mut spec = pull_spec();
    spec["capacity"] = json!({"reserve": "1GiB", "eviction": "WhenSpaceIsNeeded", "idleSeconds": 86400});
    api.create(&PostParams::default(), &stage("evictable", spec)).await.unwrap();

    let mut spec = pull_spec();
    spec["reclaimPolicy"] = json!("Keep");
    assert_refused(&raw, "enum", spec, "Unsupported value: \"Keep\": supported values: \"Retain\", \"Delete\"").await;

    let push = json!({"source": {"volume": {"hostPath": "/mnt/out"}}, "destination": {"uri": "s3://b/out"},
                      "reclaimPolicy": "Delete"});
    assert_refused(&raw, "push-delete", push, "reclaimPolicy Delete removes what a pull staged").await;

    let mut both = pull_spec();
    both["source"]["anonymous"] = json!(true);
    assert_refused(&raw, "anonymous", both, "anonymous sends no credentials: remove credentials or anonymous").await;

    let mut volume_ca = pull_spec();
    volume_ca["destination"]["caBundle"] = json!({"name": "storage-ca"});
    let refusal = "caBundle is the CA of an object store's HTTPS certificate: set uri too";
    assert_refused(&raw, "volume-ca", volume_ca, refusal).await;
    let mut empty_ca = pull_spec();
    empty_ca["source"]["caBundle"] = json!({"name": ""});
    assert_refused(&raw, "empty-ca", empty_ca, "spec.source.caBundle.name").await;

    let role = json!({"roleArn": "arn:minio:iam:::role/datasets"});
    let mut both_credentials = pull_spec();
    both_credentials["source"]["credentials"]["webIdentity"] = role.clone();
    let refusal = "credentials: set exactly one of name (a Secret of keys) or webIdentity";
    assert_refused(&raw, "both-credentials", both_credentials, refusal).await;
    let mut neither = pull_spec();
    neither["source"]["credentials"] = json!({});
    assert_refused(&raw, "no-credentials", neither, refusal).await;
    let gcs_identity = json!({"source": {"uri": "gs://datasets/imagenet", "credentials": {"webIdentity": role}},
                              "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}}});
    let refusal = "credentials.webIdentity exchanges a token at an S3 STS: use it with an s3:// uri";
    assert_refused(&raw, "gcs-web-identity", gcs_identity, refusal).await;
    let mut short_token = pull_spec();
    short_token["source"]["credentials"] =
        json!({"webIdentity": {"roleArn": "arn:minio:iam:::role/datasets", "expirationSeconds": 60}});
    assert_refused(&raw, "short-token", short_token, "should be greater than or equal to 600").await;
    let mut web_identity = pull_spec();
    web_identity["source"]["credentials"] = json!({"webIdentity": {"roleArn": "arn:minio:iam:::role/datasets"}});
    api.create(&PostParams::default(), &stage("web-identity", web_identity))
        .await
        .expect("a web identity instead of a Secret is admitted");

    // Source and destination cannot change after creation.
    let mut changed = pull_spec();
    changed["source"]["uri"] = json!("s3://datasets/other");
    let update = api
        .patch("valid", &PatchParams::apply("ferry.dev/e2e-tests").force(), &Patch::Apply(stage("valid", changed)))
        .await;
    let Err(kube::Error::Api(status)) = update else { panic!("changing the source was accepted: {update:?}") };
    assert!(status.message.contains("spec.source is immutable"), "{}", status.message);

    // Versioned: the source may change (it stays a pull); the strategy may not.
    let mut versioned = pull_spec();
    versioned["updateStrategy"] = json!("Versioned");
    api.create(&PostParams::default(), &stage("versioned", versioned.clone())).await.expect("a versioned pull");
    versioned["source"]["uri"] = json!("s3://datasets/v2");
    let apply = PatchParams::apply("ferry.dev/e2e-tests").force();
    api.patch("versioned", &apply, &Patch::Apply(stage("versioned", versioned.clone())))
        .await
        .expect("a versioned pull's source may change");
    let mut in_place = versioned.clone();
    in_place["updateStrategy"] = json!("InPlace");
    let update = api.patch("versioned", &apply, &Patch::Apply(stage("versioned", in_place))).await;
    let Err(kube::Error::Api(status)) = update else { panic!("changing the strategy was accepted: {update:?}") };
    assert!(status.message.contains("spec.updateStrategy is immutable"), "{}", status.message);
    let mut to_versioned = pull_spec();
    to_versioned["updateStrategy"] = json!("Versioned");
    to_versioned["source"]["uri"] = json!("s3://datasets/other");
    let update = api.patch("valid", &apply, &Patch::Apply(stage("valid", to_versioned))).await;
    let Err(kube::Error::Api(status)) = update else { panic!("turning versioned with a new source was accepted") };
    assert!(status.message.contains("spec.updateStrategy is immutable"), "{}", status.message);
    let push = json!({"source": {"volume": {"hostPath": "/mnt/ferry/ckpt"}},
                      "destination": {"uri": "s3://checkpoints/run"}, "updateStrategy": "Versioned"});
    assert_refused(&raw, "versioned-push", push, "spec.updateStrategy Versioned applies to pulls").await;
    cluster.stop().await;
}

/// Every size the API server admits, the stager parses, and every size it
/// refuses, the stager refuses too: one grammar on both sides.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_admits_exactly_the_sizes_the_stager_parses() {
    let cluster = Cluster::start().await.expect("cluster");
    install_crd(&cluster).await;
    create_namespace(&cluster, "sizes", &[]).await;
    let client = cluster.client().await.unwrap();
    let raw: Api<DynamicObject> = Api::namespaced_with(client, "sizes", &ApiResource::erase::<DataStage>(&()));
    let corpus = [
        "1",
        "8",
        "4096",
        "1048576",
        "999999999999999",
        "1000000000000000",
        "8B",
        "8K",
        "8k",
        "8Ki",
        "8KiB",
        "8KB",
        "8M",
        "8Mi",
        "8MiB",
        "8MB",
        "1G",
        "1Gi",
        "16GiB",
        "2T",
        "999999TiB",
        "1000000TiB",
        "0",
        "08M",
        "-1",
        "8m",
        "8mi",
        "8 MiB",
        "8iB",
        "8BiB",
        "8MBi",
        "8MiBB",
        "MiB",
        "",
        "8E",
        "1.5Gi",
        "1e6",
        "8Mi ",
        " 8Mi",
        "８Mi",
    ];
    for (i, text) in corpus.iter().enumerate() {
        let mut spec = pull_spec();
        spec["transfer"] = json!({"partSize": text, "memoryLimit": text, "maxBandwidth": text});
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": format!("size-{i}")}, "spec": spec}))
        .unwrap();
        let admitted = match raw.create(&PostParams::default(), &object).await {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.code == 422 => false,
            Err(other) => panic!("{text:?}: {other}"),
        };
        let parses = text.parse::<ferry_contract::ByteSize>().is_ok();
        assert_eq!(
            admitted,
            parses,
            "{text:?}: the API server {} it, the stager {} it",
            if admitted { "admits" } else { "refuses" },
            if parses { "parses" } else { "refuses" }
        );
    }
    cluster.stop().await;
}
