//! What a DataStage may ask for, judged once for the validating webhook
//! (at admission, so the author is told at `kubectl apply`) and for the
//! controller (which refuses the same with a condition, for a cluster
//! without the webhook or an object from before a rule). Pure: the
//! callers look up the NodeCache and the namespace's labels.
//!
//! Every field that would make the operator do more than stage the data
//! for its author is refused unless the cluster admin allowed it, with a
//! message that says who may: a raw hostPath (the admin's namespaces
//! only), a NodeCache whose selector leaves the namespace out, a stager
//! image of the author's choosing, a web identity token for an audience
//! the admin did not list, or one sent over plain HTTP.

use std::collections::BTreeMap;

use ferry_contract::Scheme;
use ferry_crds::plan::{Direction, Plan, Volume};
use ferry_crds::{DataStage, NodeCache, WebIdentityCredentials};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt as _;

use crate::config::OperatorConfig;
use crate::schedule::Schedule;
use crate::status::reasons;

/// Why a spec cannot be carried out as written.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix, and who may allow it.
    pub message: String,
}

/// What the cluster holds that a DataStage is judged against.
#[derive(Debug, Default)]
pub struct Facts<'a> {
    /// The NodeCache the DataStage names, if it exists.
    pub node_cache: Option<&'a NodeCache>,
    /// The labels of the DataStage's namespace; `None`: not known (the
    /// caller could not read it), and a NodeCache's selector is not judged.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
}

/// The smallest part of a multipart upload S3 accepts.
const MIN_UPLOAD_PART: u64 = 5 << 20;

/// Checks what the schema cannot: what the admin allows (hostPaths,
/// NodeCaches, images, web identities), options the chosen store does not
/// support, and the schedule. Returns the parsed schedule, if any.
///
/// # Errors
/// [`Invalid`] with a reason and a message a user can act on.
pub fn validate(
    ds: &DataStage,
    plan: &Plan<'_>,
    config: &OperatorConfig,
    facts: &Facts<'_>,
) -> Result<Option<Schedule>, Invalid> {
    let name = ds.name_any();
    let namespace = ds.namespace().unwrap_or_default();
    if name.len() > ferry_crds::MAX_NAME_LENGTH {
        return Err(Invalid {
            reason: reasons::NAME_TOO_LONG,
            message: format!(
                "metadata.name is {} characters; Ferry labels the DataStage's Jobs and pods with it, and a label value holds at most {}: recreate it with a shorter name",
                name.len(),
                ferry_crds::MAX_NAME_LENGTH
            ),
        });
    }
    volume(plan, &namespace, config, facts)?;
    if let Some((field, why)) = ds.spec.placement.as_ref().and_then(crate::placement_syntax::placement_error) {
        return Err(Invalid {
            reason: reasons::INVALID_PLACEMENT,
            message: format!(
                "{field}: {why}; the worker pods carry spec.placement as written, and the API server refuses such a pod"
            ),
        });
    }
    if let Some(image) = ds.spec.image.as_deref()
        && !config.image_allowed(image)
    {
        let allowed = if config.allowed_images.is_empty() {
            "it allows none".to_owned()
        } else {
            format!("it allows {}", config.allowed_images.join(", "))
        };
        return Err(Invalid {
            reason: reasons::IMAGE_NOT_ALLOWED,
            message: format!(
                "spec.image {image} is not an image the cluster admin allows for workers (the operator's --allowed-images, the chart's stager.allowedImages; {allowed}): remove spec.image to run Ferry's stager"
            ),
        });
    }
    web_identity(plan, config)?;
    if plan.store.anonymous == Some(true) && plan.location.scheme == Scheme::S3 {
        return Err(Invalid {
            reason: reasons::UNSUPPORTED_STORE,
            message:
                "anonymous applies to gs://, az://, oci:// and hf:// only; for s3:// give credentials or rely on the pod's identity"
                    .into(),
        });
    }
    let part_size = ds.spec.transfer.as_ref().and_then(|t| t.part_size.as_ref());
    if plan.direction == Direction::Push
        && let Some(size) = part_size.filter(|s| s.bytes() < MIN_UPLOAD_PART)
    {
        return Err(Invalid {
            reason: reasons::INVALID_TRANSFER,
            message: format!(
                "transfer.partSize {size} is below 5MiB, the smallest part S3 accepts in an upload; use 5Mi or more"
            ),
        });
    }
    let Some(expression) = ds.spec.schedule.as_deref() else { return Ok(None) };
    Schedule::parse(expression, ds.spec.time_zone.as_deref())
        .map(Some)
        .map_err(|error| Invalid { reason: reasons::INVALID_SCHEDULE, message: format!("spec.schedule: {error}") })
}

/// Why this operator refuses the raw hostPath `plan` names, if it does:
/// what a DataStage made before a rule is held to before any privileged
/// Job touches its path (a clean-up included).
pub fn host_path_refusal(plan: &Plan<'_>, namespace: &str, config: &OperatorConfig) -> Option<Invalid> {
    match plan.volume {
        Volume::HostPath(_) => volume(plan, namespace, config, &Facts::default()).err(),
        _ => None,
    }
}

/// The volume: a hostPath only in the admin's namespaces and under an
/// allowed prefix; a NodeCache that exists and admits the namespace.
fn volume(plan: &Plan<'_>, namespace: &str, config: &OperatorConfig, facts: &Facts<'_>) -> Result<(), Invalid> {
    match plan.volume {
        Volume::HostPath(path) => {
            if !config.host_paths_allowed_in(namespace) {
                let admins = if config.host_path_namespaces.is_empty() {
                    "none are named".to_owned()
                } else {
                    config.host_path_namespaces.join(", ")
                };
                return Err(Invalid {
                    reason: reasons::HOST_PATH_NOT_ALLOWED,
                    message: format!(
                        "volume.hostPath is for the cluster admin's namespaces only (the operator's --host-path-namespaces, the chart's hostPathNamespaces: {admins}), and namespace {namespace} is not one: name a NodeCache instead (volume.nodeCache; kubectl get nodecaches lists them)"
                    ),
                });
            }
            if !config.host_path_allowed(path) {
                return Err(Invalid {
                    reason: reasons::HOST_PATH_NOT_ALLOWED,
                    message: format!(
                        "hostPath {path} is outside the directories this operator may write ({}); use one of them or ask the cluster admin to allow it",
                        config.allowed_host_paths.join(", ")
                    ),
                });
            }
            Ok(())
        }
        Volume::NodeCache(cache) => {
            let Some(found) = facts.node_cache else {
                return Err(Invalid {
                    reason: reasons::NODE_CACHE_NOT_FOUND,
                    message: format!(
                        "NodeCache {cache} (volume.nodeCache) does not exist: kubectl get nodecaches lists those the cluster admin made"
                    ),
                });
            };
            if let (Some(selector), Some(labels)) = (found.spec.namespace_selector.as_ref(), facts.namespace_labels)
                && !selector_matches(selector, labels)
            {
                return Err(Invalid {
                    reason: reasons::NODE_CACHE_NOT_ALLOWED,
                    message: format!(
                        "NodeCache {cache} does not admit namespace {namespace} (its namespaceSelector, which the cluster admin sets): name another NodeCache, or ask the admin to admit the namespace"
                    ),
                });
            }
            Ok(())
        }
        Volume::Claim { .. } => Ok(()),
    }
}

/// A web identity: an audience the admin allows, and an STS reached over
/// HTTPS unless the admin allows plain HTTP.
fn web_identity(plan: &Plan<'_>, config: &OperatorConfig) -> Result<(), Invalid> {
    let Some(identity) = plan.store.credentials.as_ref().and_then(|c| c.web_identity.as_ref()) else { return Ok(()) };
    let audience = identity.audience.as_deref().unwrap_or(WebIdentityCredentials::DEFAULT_AUDIENCE);
    if !config.web_identity_audiences.iter().any(|allowed| allowed == audience) {
        return Err(Invalid {
            reason: reasons::AUDIENCE_NOT_ALLOWED,
            message: format!(
                "credentials.webIdentity.audience {audience} is not one the cluster admin allows tokens for (the operator's --web-identity-audiences, the chart's webIdentity.audiences: {}): a token for another audience (the API server's, another service's) must never leave the cluster; use one of them",
                config.web_identity_audiences.join(", ")
            ),
        });
    }
    let sts = identity.sts_endpoint.as_deref().or(plan.store.endpoint.as_deref());
    if let Some(sts) = sts
        && !sts.to_ascii_lowercase().starts_with("https://")
        && !config.allow_http_sts
    {
        return Err(Invalid {
            reason: reasons::INSECURE_STS,
            message: format!(
                "the STS {sts} that credentials.webIdentity sends its token to is not https://: the token would cross the network in the clear. Use an https:// stsEndpoint, or ask the cluster admin to allow plain HTTP (the operator's --allow-http-sts, the chart's webIdentity.allowHttpSts)"
            ),
        });
    }
    Ok(())
}

/// Whether `labels` satisfy `selector` (matchLabels and matchExpressions
/// with In, NotIn, Exists and DoesNotExist, as the API server judges it).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector.match_labels.iter().flatten().all(|(key, value)| labels.get(key) == Some(value));
    let by_expression = selector.match_expressions.iter().flatten().all(|requirement| {
        let value = labels.get(&requirement.key);
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // The API server refuses other operators in a selector.
            _ => false,
        }
    });
    by_label && by_expression
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(namespace: &str, spec: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": namespace, "uid": "u"}, "spec": spec,
        }))
        .unwrap()
    }

    fn judge(ds: &DataStage, config: &OperatorConfig, facts: &Facts<'_>) -> Result<(), Invalid> {
        validate(ds, &ds.spec.plan().unwrap(), config, facts).map(|_| ())
    }

    /// The examples a new user applies first stage onto the chart's
    /// default NodeCache, pass admission with the operator's defaults, and
    /// the init-container form mounts the claim Ferry binds for them.
    #[test]
    fn the_examples_stage_onto_the_charts_node_cache_and_pods_mount_its_claim() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
        let mut example: DataStage = serde_yaml::from_str(&read("examples/datastage-pull.yaml")).unwrap();
        example.metadata.namespace = Some("ml".into());
        let plan = example.spec.plan().unwrap();
        let values: serde_yaml::Value = serde_yaml::from_str(&read("charts/ferry/values.yaml")).unwrap();
        let default_cache = values["nodeCaches"][0]["name"].as_str().unwrap();
        assert_eq!(plan.volume, Volume::NodeCache(default_cache));
        let mut local = cache(None);
        local.metadata.name = Some(default_cache.to_owned());
        let facts = Facts { node_cache: Some(&local), namespace_labels: Some(&BTreeMap::new()) };
        let config: OperatorConfig = clap::Parser::parse_from(["ferry-operator"]);
        validate(&example, &plan, &config, &facts).unwrap();

        let init_form = read("examples/training-job-init-container.yaml");
        let job = serde_yaml::Deserializer::from_str(&init_form)
            .map(|doc| <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap())
            .find(|doc| doc["kind"] == "Job")
            .unwrap();
        let claim = &job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"];
        assert_eq!(claim["claimName"].as_str(), Some(crate::volumes::claim_name(&example.name_any()).as_str()));
        assert_eq!(claim["readOnly"].as_bool(), Some(true));
    }

    fn cache(selector: Option<serde_json::Value>) -> NodeCache {
        let mut spec = json!({"root": "/var/lib/ferry"});
        if let Some(selector) = selector {
            spec["namespaceSelector"] = selector;
        }
        serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "NodeCache",
            "metadata": {"name": "nvme"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn a_host_path_is_the_admins_and_is_refused_elsewhere_saying_who_may_use_it() {
        let config = OperatorConfig::test();
        let spec = |path: &str| json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": path}}});
        assert_eq!(judge(&ds("admin", spec("/mnt/x")), &config, &Facts::default()), Ok(()));
        let refused = judge(&ds("team-a", spec("/mnt/x")), &config, &Facts::default()).unwrap_err();
        assert_eq!(refused.reason, reasons::HOST_PATH_NOT_ALLOWED);
        assert!(refused.message.contains("cluster admin's namespaces") && refused.message.contains("admin"));
        assert!(refused.message.contains("volume.nodeCache"), "{}", refused.message);
        let outside = judge(&ds("admin", spec("/etc")), &config, &Facts::default()).unwrap_err();
        assert!(outside.message.contains("/mnt, /data"), "{}", outside.message);
    }

    #[test]
    fn a_node_cache_must_exist_and_admit_the_namespace() {
        let config = OperatorConfig::test();
        let pull =
            ds("team-a", json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        let missing = judge(&pull, &config, &Facts::default()).unwrap_err();
        assert_eq!(missing.reason, reasons::NODE_CACHE_NOT_FOUND);
        let open = cache(None);
        let team = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        assert_eq!(judge(&pull, &config, &Facts { node_cache: Some(&open), namespace_labels: Some(&team) }), Ok(()));
        let for_b = cache(Some(json!({"matchLabels": {"team": "b"}})));
        let refused =
            judge(&pull, &config, &Facts { node_cache: Some(&for_b), namespace_labels: Some(&team) }).unwrap_err();
        assert_eq!(refused.reason, reasons::NODE_CACHE_NOT_ALLOWED);
        assert!(refused.message.contains("team-a"));
        let for_a = cache(Some(json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "c"]}]})));
        assert_eq!(judge(&pull, &config, &Facts { node_cache: Some(&for_a), namespace_labels: Some(&team) }), Ok(()));
    }

    #[test]
    fn an_image_an_audience_and_a_plain_http_sts_need_the_admins_leave() {
        let mut config = OperatorConfig::test();
        let mut spec = json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}},
            "image": "evil.example/root:1"});
        let refused = judge(&ds("admin", spec.clone()), &config, &Facts::default()).unwrap_err();
        assert_eq!(refused.reason, reasons::IMAGE_NOT_ALLOWED);
        assert!(refused.message.contains("allows none") && refused.message.contains("remove spec.image"));
        config.allowed_images = vec!["evil.example/*".into()];
        assert_eq!(judge(&ds("admin", spec.clone()), &config, &Facts::default()), Ok(()));

        spec["source"]["credentials"] = json!({"webIdentity": {"roleArn": "arn:r", "audience": "kubernetes"}});
        let refused = judge(&ds("admin", spec.clone()), &config, &Facts::default()).unwrap_err();
        assert_eq!(refused.reason, reasons::AUDIENCE_NOT_ALLOWED);
        assert!(refused.message.contains("sts.amazonaws.com"));
        spec["source"]["credentials"] =
            json!({"webIdentity": {"roleArn": "arn:r", "stsEndpoint": "http://sts.evil:80"}});
        let refused = judge(&ds("admin", spec.clone()), &config, &Facts::default()).unwrap_err();
        assert_eq!(refused.reason, reasons::INSECURE_STS);
        // The store's own endpoint is the STS when none is named.
        spec["source"]["credentials"] = json!({"webIdentity": {"roleArn": "arn:r"}});
        spec["source"]["endpoint"] = json!("http://minio:9000");
        assert_eq!(
            judge(&ds("admin", spec.clone()), &config, &Facts::default()).unwrap_err().reason,
            reasons::INSECURE_STS
        );
        config.allow_http_sts = true;
        assert_eq!(judge(&ds("admin", spec.clone()), &config, &Facts::default()), Ok(()));
        spec["source"]["endpoint"] = json!("https://minio:9000");
        config.allow_http_sts = false;
        assert_eq!(judge(&ds("admin", spec), &config, &Facts::default()), Ok(()));
    }

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let labels = BTreeMap::from([("a".to_owned(), "1".to_owned())]);
        let selector = |value: serde_json::Value| -> LabelSelector { serde_json::from_value(value).unwrap() };
        assert!(selector_matches(&selector(json!({})), &labels), "an empty selector matches everything");
        assert!(selector_matches(
            &selector(json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!selector_matches(
            &selector(json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]})),
            &labels
        ));
        assert!(selector_matches(
            &selector(json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]})),
            &labels
        ));
    }

    fn host_path_ds(host_path: &str, uri: &str) -> DataStage {
        ds("admin", json!({"source": {"uri": uri}, "destination": {"volume": {"hostPath": host_path}}}))
    }

    #[test]
    fn host_paths_outside_the_allow_list_are_refused_with_advice() {
        let config = OperatorConfig::test();
        let check =
            |d: &DataStage| validate(d, &d.spec.plan().unwrap(), &config, &Facts::default()).map(|s| s.is_some());
        assert_eq!(check(&host_path_ds("/mnt/x", "s3://b/p")), Ok(false));
        let invalid = check(&host_path_ds("/etc/x", "s3://b/p")).unwrap_err();
        assert_eq!(invalid.reason, reasons::HOST_PATH_NOT_ALLOWED);
        assert!(invalid.message.contains("/mnt, /data"), "{}", invalid.message);
        assert_eq!(check(&host_path_ds("/mnt/x", "gs://b/p")), Ok(false));
        let mut anonymous_s3 = host_path_ds("/mnt/x", "s3://b/p");
        anonymous_s3.spec.source.anonymous = Some(true);
        assert_eq!(check(&anonymous_s3).unwrap_err().reason, reasons::UNSUPPORTED_STORE);
        let mut anonymous_azure = host_path_ds("/mnt/x", "az://public/p");
        anonymous_azure.spec.source.anonymous = Some(true);
        assert_eq!(check(&anonymous_azure), Ok(false), "a public container");
        let mut small_parts: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "admin"},
            "spec": {"source": {"volume": {"hostPath": "/mnt/x"}}, "destination": {"uri": "s3://b/p"},
                     "transfer": {"partSize": "4Mi"}}}))
        .unwrap();
        assert_eq!(check(&small_parts).unwrap_err().reason, reasons::INVALID_TRANSFER);
        small_parts.spec.transfer.as_mut().unwrap().part_size = Some("5Mi".parse().unwrap());
        assert_eq!(check(&small_parts), Ok(false));
    }

    #[test]
    fn a_name_too_long_for_a_label_fails_with_advice_instead_of_retrying() {
        let config = OperatorConfig::test();
        let mut long = host_path_ds("/mnt/x", "s3://b/p");
        long.metadata.name = Some("x".repeat(ferry_crds::MAX_NAME_LENGTH));
        assert_eq!(validate(&long, &long.spec.plan().unwrap(), &config, &Facts::default()), Ok(None));
        long.metadata.name = Some("x".repeat(ferry_crds::MAX_NAME_LENGTH + 1));
        let invalid = validate(&long, &long.spec.plan().unwrap(), &config, &Facts::default()).unwrap_err();
        assert_eq!(invalid.reason, reasons::NAME_TOO_LONG);
        assert!(invalid.message.contains("metadata.name is 64 characters"), "{}", invalid.message);
    }

    #[test]
    fn a_schedule_that_does_not_parse_is_refused_with_advice() {
        let config = OperatorConfig::test();
        let mut scheduled = host_path_ds("/mnt/x", "s3://b/p");
        scheduled.spec.schedule = Some("*/5 * * * * *".into());
        assert_eq!(
            validate(&scheduled, &scheduled.spec.plan().unwrap(), &config, &Facts::default()).map(|s| s.is_some()),
            Ok(true)
        );
        scheduled.spec.schedule = Some("61 * * * *".into());
        let invalid = validate(&scheduled, &scheduled.spec.plan().unwrap(), &config, &Facts::default()).unwrap_err();
        assert_eq!(invalid.reason, reasons::INVALID_SCHEDULE);
        assert!(invalid.message.contains("minute 61"), "{}", invalid.message);
        scheduled.spec.schedule = Some("@daily".into());
        scheduled.spec.time_zone = Some("Mars/Base".into());
        let invalid = validate(&scheduled, &scheduled.spec.plan().unwrap(), &config, &Facts::default()).unwrap_err();
        assert!(invalid.message.contains("Mars/Base"), "{}", invalid.message);
    }

    #[test]
    fn a_placement_the_api_server_would_refuse_in_a_pod_is_refused_naming_the_field() {
        let config = OperatorConfig::test();
        let mut placed = host_path_ds("/mnt/x", "s3://b/p");
        placed.spec.placement =
            Some(serde_json::from_value(serde_json::json!({"nodeSelector": {"zone": "a"}})).unwrap());
        assert_eq!(validate(&placed, &placed.spec.plan().unwrap(), &config, &Facts::default()), Ok(None));
        placed.spec.placement = Some(
            serde_json::from_value(serde_json::json!({"tolerations": [{"key": "<b>", "operator": "Exists"}]})).unwrap(),
        );
        let invalid = validate(&placed, &placed.spec.plan().unwrap(), &config, &Facts::default()).unwrap_err();
        assert_eq!(invalid.reason, reasons::INVALID_PLACEMENT);
        assert!(invalid.message.starts_with("spec.placement.tolerations[0]: key \"<b>\""), "{}", invalid.message);
    }
}
