//! Fleet staging (`fanout: PeerToPeer`): what the operator gives the
//! workers of one DataStage so that they can feed each other. A Secret per
//! DataStage, in the workers' namespace (no tenant can create or read
//! Secrets there), holds the shared secret and the DataStage's peer CA and
//! certificate ([`ferry_contract::peers::tls`]). It is created once and
//! never changed while workers run: a new token or CA would lock out the
//! workers already running. So the certificate lives as long as its CA.
//! The operator uses only a Secret it made for this very DataStage (its
//! labels name the DataStage's namespace, name and uid), and only one that
//! holds current certificates: anything else under that name is replaced
//! before workers start, so the peers never talk without mutual TLS. A
//! worker pod needs its own IP, the secret, the certificate files, the
//! peer port and the `--peer-*` flags. Pure builders; the controller
//! creates the Secret, [`crate::jobs`] puts the rest into the worker Job.
//!
//! Not here: which peer holds what, and checking what a peer serves (the
//! stager does both, against the store's checksum).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use ferry_contract::peers::{DEFAULT_PEER_PORT, PEER_TOKEN_ENV, PEER_TOKEN_KEY, PeerOptions, tls};
use ferry_crds::names;
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ContainerPort, EnvVar, EnvVarSource, KeyToPath, ObjectFieldSelector, Secret, SecretKeySelector, SecretVolumeSource,
    Volume, VolumeMount,
};
use kube::ResourceExt as _;

use crate::certs::{self, Bundle, CertError, Lifetimes, Purpose};
use crate::home::Home;
use crate::worker::Worker;

/// Name of the worker container port on which a worker serves its peers.
pub const PEER_PORT_NAME: &str = "peers";
pub use ferry_contract::peers::POD_IP_ENV;
/// Random bytes in a peer secret (hex-encoded in the Secret).
const TOKEN_BYTES: usize = 32;
/// Where a worker finds its `--peer-tls` files: the peer Secret's CA,
/// certificate and key (never the CA's key).
pub const TLS_DIR: &str = "/etc/ferry/peer-tls";
/// The pod volume that holds them.
const TLS_VOLUME: &str = "peer-tls";
/// How long a DataStage's peer CA and certificate live: never renewed
/// (see above), they outlive any DataStage they are likely to serve.
const TLS_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);

/// What the peer Secret holds, for its [`names::HOLDS`] label.
pub const HOLDS_PEERS: &str = "peers";

/// The name of a DataStage's peer Secret in its workers' home:
/// `<prefix>-peers`.
pub fn secret_name(home: &Home) -> String {
    home.held(HOLDS_PEERS)
}

/// Whether `secret`, found under the peer Secret's name, is one the
/// operator made for this DataStage (of this uid) as its peer Secret, with
/// certificates its workers can use at `now`. Anything else (a Secret
/// someone else made, one left by a predecessor of the same name, one of
/// a release before peer TLS, one whose certificates expired) is replaced
/// before workers start.
pub fn usable_secret(home: &Home, secret: &Secret, now: SystemTime) -> bool {
    home.holds(&secret.metadata)
        && secret.labels().get(names::HOLDS).map(String::as_str) == Some(HOLDS_PEERS)
        && holds_certificates(secret.data.as_ref(), now)
        && secret.data.as_ref().is_some_and(|data| data.get(PEER_TOKEN_KEY).is_some_and(|t| t.0.len() >= TOKEN_BYTES))
}

/// A new peer secret: 32 bytes from the thread's CSPRNG, hex-encoded.
pub fn new_token() -> String {
    let bytes: [u8; TOKEN_BYTES] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new peer CA and certificate.
///
/// # Errors
/// Issuing failed.
pub fn new_certificates(now: SystemTime) -> Result<Bundle, CertError> {
    let lifetimes = Lifetimes { ca: TLS_LIFETIME, serving: TLS_LIFETIME };
    let issued = certs::renew(Purpose::Peers, None, &[tls::SERVER_NAME.to_owned()], lifetimes, now)?;
    Ok(issued.expect("with nothing to renew, renew issues"))
}

/// Whether a peer Secret's data holds certificates its workers can use at
/// `now`: not one from a release before peer TLS, or one long expired.
pub fn holds_certificates(data: Option<&BTreeMap<String, ByteString>>, now: SystemTime) -> bool {
    let Some(bundle) = data.and_then(|data| Bundle::from_secret_data(data).ok()) else { return false };
    certs::validity_of(&bundle.cert).is_ok_and(|validity| !validity.expired(now))
}

/// The peer Secret of the DataStage at `home` holding `token` and the
/// peer `certificates`, owned there (by its anchor) so that it goes with
/// it.
pub fn build_secret(home: &Home, token: &str, certificates: &Bundle) -> Secret {
    Secret {
        metadata: home.metadata(secret_name(home), (names::HOLDS, HOLDS_PEERS)),
        type_: Some("Opaque".into()),
        data: Some(secret_data(token, certificates)),
        ..Secret::default()
    }
}

/// A peer Secret's data.
fn secret_data(token: &str, certificates: &Bundle) -> BTreeMap<String, ByteString> {
    let mut data = certificates.to_secret_data();
    data.insert(PEER_TOKEN_KEY.to_owned(), ByteString(token.as_bytes().to_vec()));
    data
}

/// The pod volume of the peer Secret `secret`'s certificate files, and
/// where the worker mounts it ([`TLS_DIR`]).
pub fn tls_volume(secret: &str) -> (Volume, VolumeMount) {
    let item = |key: &str| KeyToPath { key: key.to_owned(), path: key.to_owned(), mode: None };
    let volume = Volume {
        name: TLS_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            items: Some(vec![item(tls::CA_FILE), item(tls::CERT_FILE), item(tls::KEY_FILE)]),
            optional: Some(false),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mount = VolumeMount {
        name: TLS_VOLUME.into(),
        mount_path: TLS_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    (volume, mount)
}

/// The `--peer-*` options of a worker whose peers are `group` (the plan's
/// workers when its Job is created), short of `--peer-listen`, which
/// [`listen_on_pod_ip`] adds; with `tls` (the peer Secret holds
/// certificates, mounted by [`tls_volume`]) they speak mutual TLS.
/// `running`: the members that divide the dataset in each of the run's
/// existing worker Jobs ([`running_groups`]). When none names this worker,
/// it joins a fleet that divided the dataset without it: the members of
/// theirs that the plan still names are its `--peer-owners`, and it reads
/// from them what they read. When one does (its Job comes after theirs),
/// it divides the dataset exactly as they do, never with the workers that
/// joined them: every member must agree on who owns what, or two of them
/// wait on each other. Peer addresses are not passed: each worker
/// publishes its own in its `status.workers[]` entry and reads the others'
/// there (`--report-to`).
pub fn options(
    worker: &Worker,
    group: &[Worker],
    running: &[Vec<String>],
    serve_bandwidth: Option<ferry_contract::ByteSize>,
    tls: bool,
) -> PeerOptions {
    // Sorted and without duplicates: the Job's arguments do not depend on
    // the order nodes were listed in.
    let mut names: BTreeSet<String> = group.iter().map(|w| w.name.clone()).collect();
    names.insert(worker.name.clone());
    let naming_me = most_common(running.iter().filter(|g| g.contains(&worker.name)));
    let owners = match naming_me {
        // Its group takes in every member it divides with (one the plan
        // has dropped still owns a share in the others' eyes, and is
        // bypassed like any member that is gone); it says its owners only
        // when they are not its whole group.
        Some(dividing) => {
            names.extend(dividing.iter().cloned());
            if names.iter().eq(&dividing) { Vec::new() } else { dividing }
        }
        None => {
            most_common(running.iter()).unwrap_or_default().into_iter().filter(|name| names.contains(name)).collect()
        }
    };
    PeerOptions {
        peer_group: names.into_iter().collect(),
        peer_owners: owners,
        peer_serve_bandwidth: serve_bandwidth,
        peer_tls: tls.then(|| TLS_DIR.into()),
        ..PeerOptions::default()
    }
}

/// The group, sorted, that most of `groups` are (the first in order
/// among equals): Jobs created in one pass share one, and a worker must
/// pick the same one whichever order the Jobs are listed in.
fn most_common<'a>(groups: impl Iterator<Item = &'a Vec<String>>) -> Option<Vec<String>> {
    let mut counts: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for group in groups {
        let sorted: BTreeSet<&String> = group.iter().collect();
        *counts.entry(sorted.into_iter().cloned().collect()).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    counts.into_iter().find(|(_, count)| *count == most).map(|(group, _)| group)
}

/// The annotation on a PeerToPeer worker Job ([`names::PEER_GROUP`]) that
/// records the members that divide the dataset among themselves as its
/// worker sees them: its group, or, for one that joined a running fleet,
/// its owners. The controller's cache keeps no pod template, so it reads
/// them here when a node joins ([`running_groups`]).
pub const GROUP_ANNOTATION: &str = names::PEER_GROUP;

/// The [`GROUP_ANNOTATION`] of a Job whose workers divide the dataset
/// among `dividing` (its `--peer-owners`, or its group when it has none).
pub fn group_annotation(dividing: &[String]) -> (String, String) {
    (GROUP_ANNOTATION.to_owned(), dividing.join(","))
}

/// The members that divide the dataset in each of `jobs` (worker Jobs).
pub fn running_groups(jobs: &[Job]) -> Vec<Vec<String>> {
    jobs.iter()
        .filter_map(|job| job.annotations().get(GROUP_ANNOTATION))
        .map(|group| group.split(',').filter(|name| !name.is_empty()).map(str::to_owned).collect())
        .collect()
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
/// `--peer-listen`), and the secret, from the DataStage's peer Secret
/// `secret`: never a flag, which would show in the pod spec and in `ps`.
pub fn pod_env(secret: &str) -> Vec<EnvVar> {
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
                    name: secret.to_owned(),
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

    /// The chart's NetworkPolicy and notes name the peer port through one
    /// helper; it must be the port the operator renders.
    #[test]
    fn the_charts_peer_port_is_the_one_workers_listen_on() {
        let templates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ferry/templates");
        let helpers = std::fs::read_to_string(templates.join("_helpers.tpl")).unwrap();
        let body = helpers.split(r#"{{- define "ferry.peerPort" -}}"#).nth(1).expect("the ferry.peerPort helper");
        let port: u16 = body.split("{{- end -}}").next().unwrap().trim().parse().unwrap();
        assert_eq!(port, DEFAULT_PEER_PORT);
        for template in std::fs::read_dir(&templates).unwrap() {
            let path = template.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            if path.file_name().is_some_and(|name| name != "_helpers.tpl") {
                assert!(
                    !text.contains(&port.to_string()),
                    "{} spells the peer port: include \"ferry.peerPort\"",
                    path.display()
                );
            }
        }
    }

    fn home(name: &str) -> Home {
        let ds: ferry_crds::DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": "ml", "uid": "u-1"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}},
        }))
        .unwrap();
        let anchor = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "anchor".into(),
            uid: "anchor-uid".into(),
            controller: Some(true),
            ..Default::default()
        };
        Home::of(&ds, &ds.spec.plan().unwrap(), "ferry-workers", Some(anchor))
    }

    #[test]
    fn tokens_are_32_random_bytes_in_hex() {
        let (one, two) = (new_token(), new_token());
        assert_eq!(one.len(), 64);
        assert!(one.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{one}");
        assert_ne!(one, two);
    }

    #[test]
    fn the_secret_is_the_datastages_own_in_the_workers_namespace() {
        let home = home("imagenet");
        let now = SystemTime::now();
        let certificates = new_certificates(now).unwrap();
        let secret = build_secret(&home, &new_token(), &certificates);
        let name = secret.metadata.name.clone().unwrap();
        assert!(name.starts_with("ml-imagenet-") && name.ends_with("-peers"), "{name}");
        assert_eq!(secret.metadata.namespace.as_deref(), Some("ferry-workers"));
        let labels = secret.metadata.labels.clone().unwrap();
        assert_eq!((labels[names::DATASTAGE].as_str(), labels[names::DATASTAGE_UID].as_str()), ("imagenet", "u-1"));
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("ConfigMap", "anchor-uid"), "its anchor owns it");
        assert!(usable_secret(&home, &secret, now));
        let data = secret.data.clone().unwrap();
        // The certificates read back as they were written.
        assert_eq!(Bundle::from_secret_data(&data).unwrap(), certificates);
        assert!(certificates.ca_key.is_some(), "kept, to renew the certificate under the same CA");

        // Anything else under its name is replaced: one someone made with a
        // token they know and no certificates, one of a predecessor of the
        // same name, one whose certificates expired.
        let mut planted = secret.clone();
        planted.metadata.labels = None;
        assert!(!usable_secret(&home, &planted, now));
        let mut plain = secret.clone();
        plain.data = Some(BTreeMap::from([(PEER_TOKEN_KEY.to_owned(), ByteString(b"known".to_vec()))]));
        assert!(!usable_secret(&home, &plain, now));
        let mut predecessor = secret.clone();
        predecessor.metadata.labels.as_mut().unwrap().insert(names::DATASTAGE_UID.into(), "u-0".into());
        assert!(!usable_secret(&home, &predecessor, now));
        let expiry = certs::validity_of(&certificates.cert).unwrap().not_after;
        assert!(!usable_secret(&home, &secret, expiry));
    }

    /// The extended key usages of the first certificate in `pem`.
    fn usages(pem: &str) -> (bool, bool) {
        use x509_parser::prelude::{FromDer as _, X509Certificate};
        let der = ::pem::parse(pem).unwrap().into_contents();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let usage = cert.extended_key_usage().unwrap().unwrap().value;
        (usage.server_auth, usage.client_auth)
    }

    #[test]
    fn peer_certificates_serve_and_ask_for_as_long_as_their_ca_lives() {
        let now = SystemTime::now();
        let certificates = new_certificates(now).unwrap();
        assert_eq!(usages(&certificates.cert), (true, true), "a worker serves and asks with one certificate");
        let (ca, cert) =
            (certs::validity_of(&certificates.ca_bundle).unwrap(), certs::validity_of(&certificates.cert).unwrap());
        assert_eq!(cert.not_after, ca.not_after);
        assert!(cert.not_after > now + Duration::from_secs(9 * 365 * 86_400));
        let data = secret_data("abc", &certificates);
        assert!(holds_certificates(Some(&data), now));
        assert!(!holds_certificates(Some(&data), cert.not_after), "expired");
        // A Secret of a release before peer TLS holds only the token.
        let old = BTreeMap::from([(PEER_TOKEN_KEY.to_owned(), ByteString(b"abc".to_vec()))]);
        assert!(!holds_certificates(Some(&old), now));
        assert!(!holds_certificates(None, now));
    }

    #[test]
    fn workers_mount_the_ca_certificate_and_key_but_never_the_cas_key() {
        let (volume, mount) = tls_volume("imagenet-peers");
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("imagenet-peers"));
        let keys: Vec<_> = secret.items.unwrap().into_iter().map(|i| i.key).collect();
        assert_eq!(keys, [tls::CA_FILE, tls::CERT_FILE, tls::KEY_FILE]);
        assert_eq!((mount.name, mount.mount_path.as_str(), mount.read_only), (volume.name, TLS_DIR, Some(true)));
    }

    #[test]
    fn the_group_holds_every_worker_once_in_order() {
        let group = [Worker::on_node("c"), Worker::on_node("a"), Worker::on_node("c")];
        let options = options(&Worker::on_node("b"), &group, &[], None, true);
        assert_eq!(options.peer_group, ["a", "b", "c"]);
        assert_eq!(options.peer_listen, None, "added to the arguments, where $(POD_IP) can be said");
        assert!(options.peers.is_empty(), "addresses come from the status");
        assert_eq!(options.peer_tls.as_deref(), Some(std::path::Path::new(TLS_DIR)));
        assert_eq!(super::options(&Worker::on_node("b"), &group, &[], None, false).peer_tls, None, "no certificates");
        assert!(options.peer_owners.is_empty(), "workers that start together all read from the store");
        // One that joins workers already running, whose groups do not name
        // it, reads from them what they read; a member of theirs the plan
        // no longer names is not an owner of its.
        let running = [vec!["c".to_owned(), "a".to_owned(), "gone".to_owned()]];
        let joiner = super::options(&Worker::on_node("b"), &group, &running, None, true);
        assert_eq!(joiner.peer_owners, ["a", "c"]);
        // One that a running group names (its Job was created late) is an
        // owner like the others: they wait for its share.
        let named = [vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]];
        assert!(super::options(&Worker::on_node("b"), &group, &named, None, true).peer_owners.is_empty());
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn a_member_whose_job_comes_after_a_joiners_divides_the_dataset_as_the_other_members_do() {
        // a and c run in a group of three; b's Job has yet to be created
        // when d joins.
        let plan = [Worker::on_node("a"), Worker::on_node("b"), Worker::on_node("c"), Worker::on_node("d")];
        let members = names(&["c", "a", "b"]);
        let joiner = options(&Worker::on_node("d"), &plan, &[members.clone(), members.clone()], None, true);
        assert_eq!(
            (joiner.peer_group, joiner.peer_owners.clone()),
            (names(&["a", "b", "c", "d"]), names(&["a", "b", "c"]))
        );
        // Then b's Job is created: the joiner's Job names it too, but b
        // owns what a and c think it owns, so it divides among the three
        // alone, whichever order the Jobs are listed in, and serves d.
        for running in [
            vec![members.clone(), joiner.peer_owners.clone(), members.clone()],
            vec![joiner.peer_owners.clone(), members.clone(), members.clone()],
        ] {
            let late = options(&Worker::on_node("b"), &plan, &running, None, true);
            assert_eq!((late.peer_group, late.peer_owners), (names(&["a", "b", "c", "d"]), names(&["a", "b", "c"])));
        }
        // A member the plan has dropped still owns a share in the running
        // members' eyes: the late one divides with it too (and, like them,
        // bypasses it once it is gone).
        let with_gone = names(&["a", "b", "gone"]);
        let late = options(&Worker::on_node("b"), &plan[..2], std::slice::from_ref(&with_gone), None, true);
        assert_eq!((late.peer_group, late.peer_owners), (with_gone, Vec::<String>::new()));
    }

    #[test]
    fn groups_from_jobs_created_in_other_passes_are_settled_by_the_most_common_then_by_order() {
        let (one, two) = (names(&["a", "b"]), names(&["b", "a", "c"]));
        assert_eq!(most_common([&one, &two, &two].into_iter()), Some(names(&["a", "b", "c"])));
        assert_eq!(most_common([&two, &one].into_iter()), Some(one.clone()));
        assert_eq!(most_common([&one, &two].into_iter()), Some(one));
        assert_eq!(most_common(std::iter::empty()), None);
    }

    #[test]
    fn the_listen_flag_goes_before_the_positionals() {
        let args = listen_on_pod_ip(vec!["pull".into(), "--worker=a".into(), "--".into(), "s3://b/p".into()]);
        assert_eq!(args, ["pull", "--worker=a", "--peer-listen=$(POD_IP):9466", "--", "s3://b/p"]);
    }
}
