//! Fleet staging (`fanout: PeerToPeer`): what the operator gives the
//! workers of one DataStage so that they can feed each other. The shared
//! secret (a Secret per DataStage, created once and never rotated under
//! running workers), and what a worker pod needs to serve and to ask: its
//! own IP, the secret, the peer port and the `--peer-*` flags. Pure
//! builders; the controller creates the Secret, [`crate::jobs`] puts the
//! rest into the worker Job.
//!
//! Not here: which peer holds what, and checking what a peer serves (the
//! stager does both, against the store's checksum).

use std::collections::BTreeMap;

use ferry_contract::peers::{DEFAULT_PEER_PORT, PEER_TOKEN_ENV, PEER_TOKEN_KEY, PeerOptions};
use ferry_crds::DataStage;
use k8s_openapi::api::core::v1::{ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, Secret, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource as _, ResourceExt as _};

use crate::jobs::{DATASTAGE_LABEL, Worker, bounded_name};

/// Name of the worker container port on which a worker serves its peers.
pub const PEER_PORT_NAME: &str = "peers";
/// The environment variable that carries the pod's IP (downward API) for
/// `--peer-listen`.
pub const POD_IP_ENV: &str = "POD_IP";
/// Random bytes in a peer secret (hex-encoded in the Secret).
const TOKEN_BYTES: usize = 32;

/// The name of a DataStage's peer Secret: `<datastage>-peers`.
pub fn secret_name(datastage: &str) -> String {
    bounded_name(datastage, "-peers")
}

/// A new peer secret: 32 bytes from the thread's CSPRNG, hex-encoded.
pub fn new_token() -> String {
    let bytes: [u8; TOKEN_BYTES] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The peer Secret of `ds` holding `token`, owned by the DataStage so that
/// it goes with it.
pub fn build_secret(ds: &DataStage, token: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&ds.name_any())),
            namespace: ds.namespace(),
            labels: Some(BTreeMap::from([
                (DATASTAGE_LABEL.to_owned(), ds.name_any()),
                ("app.kubernetes.io/name".to_owned(), "ferry-stager".to_owned()),
                ("app.kubernetes.io/managed-by".to_owned(), "ferry-operator".to_owned()),
            ])),
            owner_references: Some(vec![
                ds.controller_owner_ref(&()).expect("a DataStage from the API has a name and uid"),
            ]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(PEER_TOKEN_KEY.to_owned(), token.to_owned())])),
        ..Secret::default()
    }
}

/// The `--peer-*` options of a worker whose peers are `group` (the plan's
/// workers when its Job is created), short of `--peer-listen`, which
/// [`listen_on_pod_ip`] adds. Peer addresses are not passed: each worker
/// publishes its own in its `status.workers[]` entry and reads the others'
/// there (`--report-to`).
pub fn options(worker: &Worker, group: &[Worker], serve_bandwidth: Option<ferry_contract::ByteSize>) -> PeerOptions {
    let mut names: Vec<String> = group.iter().map(|w| w.name.clone()).collect();
    names.push(worker.name.clone());
    // Sorted and without duplicates: the Job's arguments do not depend on
    // the order nodes were listed in.
    names.sort();
    names.dedup();
    PeerOptions { peer_group: names, peer_serve_bandwidth: serve_bandwidth, ..PeerOptions::default() }
}

/// Adds `--peer-listen=$(POD_IP):9466` to rendered stager arguments, before
/// the `--` that ends the options. The typed options cannot say it: the
/// address is a `SocketAddr`, and the pod's IP exists only once the pod
/// does. The kubelet expands `$(POD_IP)` in a container's arguments from
/// its environment, where [`pod_env`] puts the IP from the downward API.
pub fn listen_on_pod_ip(mut args: Vec<String>) -> Vec<String> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args.insert(end, format!("--peer-listen=$({POD_IP_ENV}):{DEFAULT_PEER_PORT}"));
    args
}

/// The environment a worker needs to take part: its IP (for
/// `--peer-listen`), and the secret, from the DataStage's peer Secret:
/// never a flag, which would show in the pod spec and in `ps`.
pub fn pod_env(ds: &DataStage) -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: POD_IP_ENV.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: "status.podIP".into(), api_version: None }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        EnvVar {
            name: PEER_TOKEN_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name(&ds.name_any()),
                    key: PEER_TOKEN_KEY.into(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
    ]
}

/// The named container port peers connect to.
pub fn container_port() -> ContainerPort {
    ContainerPort {
        name: Some(PEER_PORT_NAME.into()),
        container_port: i32::from(DEFAULT_PEER_PORT),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn datastage(name: &str) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": "ml", "uid": "u-1"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}},
        }))
        .unwrap()
    }

    #[test]
    fn tokens_are_32_random_bytes_in_hex() {
        let (one, two) = (new_token(), new_token());
        assert_eq!(one.len(), 64);
        assert!(one.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{one}");
        assert_ne!(one, two);
    }

    #[test]
    fn the_secret_is_the_datastages_own_and_named_after_it() {
        let ds = datastage("imagenet");
        let secret = build_secret(&ds, "abc");
        assert_eq!(secret.metadata.name.as_deref(), Some("imagenet-peers"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(secret.metadata.labels.as_ref().unwrap()[DATASTAGE_LABEL], "imagenet");
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("DataStage", "u-1", Some(true)));
        assert_eq!(secret.string_data.unwrap()[PEER_TOKEN_KEY], "abc");

        let long = secret_name(&"d".repeat(70));
        assert!(long.len() <= 63 && long.ends_with("-peers"), "{long}");
    }

    #[test]
    fn the_group_holds_every_worker_once_in_order() {
        let group = [Worker::on_node("c"), Worker::on_node("a"), Worker::on_node("c")];
        let options = options(&Worker::on_node("b"), &group, None);
        assert_eq!(options.peer_group, ["a", "b", "c"]);
        assert_eq!(options.peer_listen, None, "added to the arguments, where $(POD_IP) can be said");
        assert!(options.peers.is_empty(), "addresses come from the status");
    }

    #[test]
    fn the_listen_flag_goes_before_the_positionals() {
        let args = listen_on_pod_ip(vec!["pull".into(), "--worker=a".into(), "--".into(), "s3://b/p".into()]);
        assert_eq!(args, ["pull", "--worker=a", "--peer-listen=$(POD_IP):9466", "--", "s3://b/p"]);
    }
}
