//! Where a DataStage's workers live, and how everything made for them there
//! is named, labelled and owned (pure; the controller creates the objects).
//!
//! The workers of a node-local volume (a NodeCache's directory or an
//! admin's hostPath) mount a node directory, and one step runs as root to
//! ready it. They run in the workers' namespace, which the operator owns:
//! no tenant can create pods there, so no tenant can run its own image
//! beside node data, mount another namespace's directory, or feed a
//! DataStage's status with a pod of its own. What they need from the
//! DataStage's namespace (the store's credentials, a CA bundle, a web
//! identity token) the operator reads there and copies next to them, for
//! this DataStage's workers only.
//!
//! The workers of a claim run in the DataStage's namespace: a claim can be
//! mounted only there, and such a worker holds nothing its namespace does
//! not (no root step, no node path, the tenant's own service account).
//!
//! In the workers' namespace one ConfigMap per DataStage, its *anchor*,
//! owns everything made for it there (a namespaced owner cannot own across
//! namespaces): when the DataStage goes, the operator deletes the anchor
//! and the garbage collector the rest ([`crate::sweeper`]).

use std::collections::BTreeMap;

use ferry_crds::DataStage;
use ferry_crds::names;
use ferry_crds::plan::Plan;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource as _;

pub use ferry_crds::names::DataStageKey;

/// Where one DataStage's workers run and what is made for them there.
#[derive(Clone, Debug, PartialEq)]
pub struct Home {
    /// The DataStage.
    pub datastage: DataStageKey,
    /// The namespace of its workers' Jobs, and of what they need.
    pub namespace: String,
    /// What every name made there starts with: the DataStage's name in its
    /// own namespace; in the workers' namespace its namespace, name and a
    /// hash of its uid (`x` of `team-a` and `a-x` of `team` stay apart).
    pub prefix: String,
    /// The owner of everything made there: the DataStage in its own
    /// namespace; in the workers' namespace its anchor, once it exists.
    pub owner: Option<OwnerReference>,
}

impl Home {
    /// The home of `ds`'s workers by `plan`: node-local volumes in
    /// `workers_namespace`, owned there by `anchor` (the anchor's owner
    /// reference, once it exists); claims in the DataStage's own.
    pub fn of(ds: &DataStage, plan: &Plan<'_>, workers_namespace: &str, anchor: Option<OwnerReference>) -> Self {
        let datastage = DataStageKey::of(ds);
        if !plan.per_node() {
            let owner = ds.controller_owner_ref(&());
            return Self { prefix: datastage.name.clone(), namespace: datastage.namespace.clone(), owner, datastage };
        }
        Self { prefix: workers_prefix(&datastage), namespace: workers_namespace.to_owned(), owner: anchor, datastage }
    }

    /// The owner reference of an anchor as the API server returned it.
    pub fn anchor_owner(anchor: &ConfigMap) -> Option<OwnerReference> {
        anchor.controller_owner_ref(&())
    }

    /// Whether the workers run outside the DataStage's namespace.
    pub fn elsewhere(&self) -> bool {
        self.namespace != self.datastage.namespace
    }

    /// A name for an object of this home: the prefix, `-part` and `suffix`,
    /// at most 63 characters.
    pub fn name(&self, part: &str, suffix: &str) -> String {
        self.name_within(part, suffix, MAX_NAME)
    }

    /// [`Home::name`] in at most `limit` characters, for a name something
    /// else is appended to later.
    pub fn name_within(&self, part: &str, suffix: &str, limit: usize) -> String {
        let base = if part.is_empty() { self.prefix.clone() } else { format!("{}-{part}", self.prefix) };
        bounded_name_within(&base, suffix, limit)
    }

    /// The labels every object made here carries, with `role`: the
    /// DataStage's name and uid, and its namespace when that is not this
    /// one.
    pub fn labels(&self, role: (&str, &str)) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (names::DATASTAGE.to_owned(), self.datastage.name.clone()),
            (names::MANAGED_BY.0.to_owned(), names::MANAGED_BY.1.to_owned()),
            (role.0.to_owned(), role.1.to_owned()),
        ]);
        if !self.datastage.uid.is_empty() {
            labels.insert(names::DATASTAGE_UID.to_owned(), self.datastage.uid.clone());
        }
        if self.elsewhere() {
            labels.insert(names::DATASTAGE_NAMESPACE.to_owned(), self.datastage.namespace.clone());
        }
        labels
    }

    /// The metadata of an object named `name` made here, with `role`.
    pub fn metadata(&self, name: String, role: (&str, &str)) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels(role)),
            owner_references: self.owner.clone().map(|owner| vec![owner]),
            ..ObjectMeta::default()
        }
    }

    /// Whether `meta` (of an object in the cache) was made for this
    /// DataStage here: in this namespace, labelled with its name, and with
    /// its namespace and uid where the object carries them. An object
    /// without a uid label counts only in the DataStage's own namespace
    /// (a release before the labels); a tenant's object in its own
    /// namespace never counts for workers that run elsewhere.
    pub fn holds(&self, meta: &ObjectMeta) -> bool {
        let Some(labels) = meta.labels.as_ref() else { return false };
        let Some(key) = DataStageKey::from_labels(meta.namespace.as_deref(), labels) else { return false };
        meta.namespace.as_deref() == Some(self.namespace.as_str())
            && key.name == self.datastage.name
            && key.namespace == self.datastage.namespace
            && (key.uid == self.datastage.uid || (key.uid.is_empty() && !self.elsewhere()))
    }

    /// The anchor to create when the workers run elsewhere: a ConfigMap in
    /// the workers' namespace naming the DataStage, which owns everything
    /// made for it there.
    pub fn anchor(&self) -> Option<ConfigMap> {
        self.elsewhere().then(|| ConfigMap {
            metadata: ObjectMeta {
                owner_references: None,
                ..self.metadata(self.prefix.clone(), (names::ANCHOR, "true"))
            },
            data: Some(BTreeMap::from([
                ("namespace".to_owned(), self.datastage.namespace.clone()),
                ("name".to_owned(), self.datastage.name.clone()),
                ("uid".to_owned(), self.datastage.uid.clone()),
            ])),
            ..ConfigMap::default()
        })
    }

    /// The name of a Secret or ConfigMap this home holds for the workers:
    /// `credentials`, `ca-bundle`, `web-identity`, `peers`.
    pub fn held(&self, what: &str) -> String {
        self.name("", &format!("-{what}"))
    }
}

/// The prefix of names in the workers' namespace for `key`: its namespace
/// and name, and six hex digits of a hash of its uid, so that neither a
/// DataStage of another namespace whose dashes line up nor one created
/// again under the same name (whose predecessor's objects may still be
/// going) shares a name with it.
fn workers_prefix(key: &DataStageKey) -> String {
    let hashed = if key.uid.is_empty() { format!("{}/{}", key.namespace, key.name) } else { key.uid.clone() };
    let hash = ferry_contract::hash::fnv1a(hashed.as_bytes());
    bounded_name(&format!("{}-{}", key.namespace, key.name), &format!("-{:06x}", hash & 0xff_ffff))
}

/// A Kubernetes name of at most 63 characters from `base` and `suffix`:
/// when too long, `base` is cut and a hash of all of it keeps names of
/// different long bases apart.
pub(crate) fn bounded_name(base: &str, suffix: &str) -> String {
    bounded_name_within(base, suffix, MAX_NAME)
}

/// The longest name a label value (and a DNS label) holds.
pub(crate) const MAX_NAME: usize = 63;

/// [`bounded_name`] in at most `limit` characters.
fn bounded_name_within(base: &str, suffix: &str, limit: usize) -> String {
    let full = format!("{base}{suffix}");
    if full.len() <= limit {
        return full;
    }
    let hash = ferry_contract::hash::fnv1a(base.as_bytes());
    let keep = limit.saturating_sub(suffix.len() + 9);
    let cut = base.char_indices().map(|(i, _)| i).take_while(|i| *i <= keep).last().unwrap_or(0);
    format!("{}-{:08x}{suffix}", base[..cut.min(keep)].trim_end_matches(['-', '.']), hash as u32)
}

/// An endpoint as workers in another namespace must spell it: a host
/// without a dot names a Service of the DataStage's namespace
/// (`http://minio:9000` from `team-a` is `http://minio.team-a:9000`),
/// which the workers' namespace's DNS search path would otherwise resolve
/// in its own namespace; IP addresses, `localhost` and names with a dot
/// stay as written.
pub fn qualified_endpoint(endpoint: &str, namespace: &str) -> String {
    let Some((scheme, rest)) = endpoint.split_once("://") else { return endpoint.to_owned() };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    if host_port.starts_with('[') {
        return endpoint.to_owned();
    }
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (host, format!(":{port}")),
        None => (host_port, String::new()),
    };
    let single_label = !host.contains('.') && !host.is_empty() && !host.eq_ignore_ascii_case("localhost");
    if !single_label {
        return endpoint.to_owned();
    }
    format!("{scheme}://{userinfo}{host}.{namespace}{port}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn datastage(namespace: &str, name: &str, volume: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}/{name}")},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": volume}},
        }))
        .unwrap()
    }

    const WORKERS: &str = "ferry-workers";

    #[test]
    fn node_local_workers_live_in_the_workers_namespace_and_a_claims_in_its_own() {
        let cached = datastage("team-a", "imagenet", json!({"nodeCache": "nvme"}));
        let home = Home::of(&cached, &cached.spec.plan().unwrap(), WORKERS, None);
        assert_eq!(home.namespace, "ferry-workers");
        assert!(home.elsewhere() && home.owner.is_none(), "owned by the anchor once it exists");
        assert!(home.prefix.starts_with("team-a-imagenet-") && home.prefix.len() == "team-a-imagenet-".len() + 6);
        let labels = home.labels((names::WORKER, "node-a"));
        assert_eq!(labels[names::DATASTAGE_NAMESPACE], "team-a");
        assert_eq!(labels[names::DATASTAGE_UID], "uid-team-a/imagenet");
        let anchor = home.anchor().unwrap();
        assert_eq!(anchor.metadata.namespace.as_deref(), Some("ferry-workers"));
        assert_eq!(anchor.data.as_ref().unwrap()["namespace"], "team-a");

        let claim = datastage("team-a", "shared", json!({"persistentVolumeClaim": {"claimName": "c"}}));
        let home = Home::of(&claim, &claim.spec.plan().unwrap(), WORKERS, None);
        assert_eq!((home.namespace.as_str(), home.prefix.as_str()), ("team-a", "shared"));
        assert!(!home.elsewhere() && home.anchor().is_none());
        assert_eq!(home.owner.as_ref().map(|o| o.kind.as_str()), Some("DataStage"));
        assert!(!home.labels((names::WORKER, "shared")).contains_key(names::DATASTAGE_NAMESPACE));
    }

    #[test]
    fn names_of_two_namespaces_never_meet_even_when_their_dashes_do() {
        let one = datastage("team-a", "x", json!({"nodeCache": "nvme"}));
        let two = datastage("team", "a-x", json!({"nodeCache": "nvme"}));
        let home = |ds: &DataStage| Home::of(ds, &ds.spec.plan().unwrap(), WORKERS, None);
        assert_ne!(home(&one).prefix, home(&two).prefix);
        assert_ne!(home(&one).name("node-a", "-r1"), home(&two).name("node-a", "-r1"));
        let long = datastage(&"n".repeat(63), &"d".repeat(63), json!({"nodeCache": "nvme"}));
        let name = home(&long).name("node-with-a-long-name", "-r12");
        assert!(name.len() <= 63 && name.ends_with("-r12"), "{name}");
    }

    #[test]
    fn only_objects_in_the_home_with_the_datastages_labels_count() {
        let ds = datastage("team-a", "imagenet", json!({"nodeCache": "nvme"}));
        let home = Home::of(&ds, &ds.spec.plan().unwrap(), WORKERS, None);
        let meta = |namespace: &str, labels: BTreeMap<String, String>| ObjectMeta {
            namespace: Some(namespace.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        };
        let ours = home.labels((names::WORKER, "node-a"));
        assert!(home.holds(&meta("ferry-workers", ours.clone())));
        // A tenant's pod labelled like a worker, in its own namespace.
        let forged = BTreeMap::from([
            (names::DATASTAGE.to_owned(), "imagenet".to_owned()),
            (names::WORKER.to_owned(), "node-a".to_owned()),
        ]);
        assert!(!home.holds(&meta("team-a", forged)));
        // A predecessor of the same name (another uid).
        let mut older = ours.clone();
        older.insert(names::DATASTAGE_UID.to_owned(), "uid-before".to_owned());
        assert!(!home.holds(&meta("ferry-workers", older)));
        // Another namespace's DataStage of the same name.
        let mut other = ours;
        other.insert(names::DATASTAGE_NAMESPACE.to_owned(), "team-b".to_owned());
        assert!(!home.holds(&meta("ferry-workers", other)));

        // A claim's Job of a release before the uid label still counts.
        let claim = datastage("team-a", "shared", json!({"persistentVolumeClaim": {"claimName": "c"}}));
        let home = Home::of(&claim, &claim.spec.plan().unwrap(), WORKERS, None);
        let old = BTreeMap::from([(names::DATASTAGE.to_owned(), "shared".to_owned())]);
        assert!(home.holds(&meta("team-a", old)));
    }

    #[test]
    fn a_service_name_without_a_dot_is_qualified_by_the_datastages_namespace() {
        let q = |endpoint: &str| qualified_endpoint(endpoint, "team-a");
        assert_eq!(q("http://minio:9000"), "http://minio.team-a:9000");
        assert_eq!(q("https://minio"), "https://minio.team-a");
        assert_eq!(q("http://minio:9000/path"), "http://minio.team-a:9000/path");
        for unchanged in [
            "http://minio.storage:9000",
            "https://s3.us-east-1.amazonaws.com",
            "http://10.0.0.5:9000",
            "http://[fd00::1]:9000",
            "http://localhost:9000",
            "not a url",
        ] {
            assert_eq!(q(unchanged), unchanged);
        }
    }
}
