//! The Helm chart (`charts/ferry`) on the real control plane.
//!
//! * It lints strictly, refuses bad values with the path of the bad value,
//!   and renders for the default values and non-default combinations, each
//!   of which passes server-side dry-run admission on the real API server.
//! * It installs, upgrades and uninstalls; uninstalling leaves nothing but
//!   the CRDs. The operator it installs runs as a pod (through the node
//!   agent) under the chart's ServiceAccount and stages a DataStage end to
//!   end (and, after an upgrade, a gated model from the Hugging Face Hub
//!   with its token from a Secret), in namespaces that enforce the
//!   `restricted` Pod Security Standard:
//!   that proves the RBAC suffices. A `kubectl auth can-i` matrix proves it
//!   grants no more than that.
//! * A real Prometheus scrapes the operator and the stager pods through the
//!   chart's ServiceMonitor and PodMonitor during the staging; the series
//!   are there with sensible values, `promtool check metrics` passes on both
//!   expositions, and every Grafana panel's query returns data for the
//!   staging that just ran.
//!
//! * The README's quick start, its commands run as written in a checkout
//!   whose example points at this test's MinIO, stages a dataset onto both
//!   nodes and a training Job reads it.
//!
//! There is no prometheus-operator here: the test turns the monitors the
//! chart installed into the scrape configuration prometheus-operator would
//! generate from them (Kubernetes service discovery, keep-relabelling on
//! the selectors and port names, the monitors' own relabelings).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry_crds::{DataStage, Phase, StoreBudget};
use ferry_e2e::chart::{CHART_WORKERS_NS, RELEASE, SYSTEM_NS, chart_dir, helm_install, image_values, set_args};
use ferry_e2e::tools::{Tools, run_tool};
use ferry_e2e::{Cluster, create_namespace, image, job_succeeded, object_store, wait_for};
use ferry_testkit::{free_port, pattern, read_tree, repo_root, tool_path};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

const DATA_NS: &str = "ml";
const OTHER_NS: &str = "research";
/// Every pod of the test runs under this Pod Security Standard.
const RESTRICTED: [(&str, &str); 2] =
    [("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")];

/// The objects of a multi-document YAML stream, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

/// Stand-ins for CRDs of other projects (`kinds`: kind and plural, in
/// `group`) so the API server accepts the chart's objects of those kinds:
/// same group, kinds and scope, with the schema left open (the real ones
/// cannot be fetched here).
async fn install_stand_in_crds(tools: &Tools, group: &str, kinds: &[(&str, &str)]) {
    let mut names = Vec::new();
    for (kind, plural) in kinds {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_ascii_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]},
        });
        tools.kubectl(&["apply", "--server-side", "-f", "-"], Some(&crd.to_string())).expect("stand-in CRD");
        names.push(format!("crd/{plural}.{group}"));
    }
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=30s"];
    args.extend(names.iter().map(String::as_str));
    tools.kubectl(&args, None).expect("stand-in CRDs established");
}

/// prometheus-operator's ServiceMonitor and PodMonitor, as stand-ins.
async fn install_monitoring_crds(tools: &Tools) {
    install_stand_in_crds(
        tools,
        "monitoring.coreos.com",
        &[("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors")],
    )
    .await;
}

async fn install_crds(tools: &Tools) {
    for (file, name) in [
        ("ferry.dev_datastages.yaml", "crd/datastages.ferry.dev"),
        ("ferry.dev_storebudgets.yaml", "crd/storebudgets.ferry.dev"),
        ("ferry.dev_stagingquotas.yaml", "crd/stagingquotas.ferry.dev"),
        ("ferry.dev_nodecaches.yaml", "crd/nodecaches.ferry.dev"),
    ] {
        let crd = chart_dir().join("crds").join(file);
        tools.kubectl(&["apply", "--server-side", "-f", crd.to_str().unwrap()], None).expect("the chart's CRD applies");
        // Not `kubectl wait --for=condition=Established`: right after the
        // apply the CRD may have no conditions yet, and kubectl then fails
        // at once ("accessor error: <nil>") instead of waiting.
        let established = r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let status = tools.kubectl(&["get", name, "-o", established], None);
            if status.as_deref().map(str::trim) == Ok("True") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{name} not established within 30 s: {status:?}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

/// Every RBAC rule of a rendering: no wildcards anywhere.
fn assert_no_wildcards(objects: &[Value], what: &str) {
    for object in objects.iter().filter(|o| matches!(o["kind"].as_str(), Some("Role" | "ClusterRole"))) {
        for rule in object["rules"].as_array().into_iter().flatten() {
            for field in ["verbs", "resources", "apiGroups", "resourceNames"] {
                for item in rule[field].as_array().into_iter().flatten() {
                    assert_ne!(
                        item, "*",
                        "{what}: {} {} grants a wildcard in {field}",
                        object["kind"], object["metadata"]["name"]
                    );
                }
            }
        }
    }
}

#[test]
fn the_chart_lints_strictly_and_refuses_bad_values_with_a_message_naming_them() {
    let tools = Tools::new(Path::new("/nonexistent"));
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    tools.helm(&["lint", "--strict", chart]).unwrap_or_else(|e| panic!("helm lint --strict:\n{e}"));
    tools
        .helm(&["lint", "--strict", chart, "--set", "watchNamespace=ml", "--set", "metrics.podMonitor.enabled=true"])
        .unwrap_or_else(|e| panic!("helm lint --strict with values:\n{e}"));
    for (bad, names) in [
        ("replicaCount=-1", "replicaCount"),
        ("watchNamespace=Not_A_Namespace", "watchNamespace"),
        ("leaseDuration=soon", "leaseDuration"),
        ("metrics.port=70000", "port"),
        ("allowedHostPaths[0]=relative/path", "allowedHostPaths"),
        // An empty allow-list once rendered `--allowed-host-paths=`, one
        // empty prefix that every path starts with.
        ("allowedHostPaths=null", "allowedHostPaths"),
        ("allowedHostPaths[0]=", "allowedHostPaths"),
        ("sharedHostPaths[0]=relative/path", "sharedHostPaths"),
        ("hostPathNamespaces[0]=Not_A_Namespace", "hostPathNamespaces"),
        ("nodeCaches[0].root=relative", "nodeCaches"),
        ("nodeCaches[0].sharing=Everywhere", "nodeCaches"),
        ("webIdentity.audiences=null", "webIdentity"),
        ("stager.imagee.tag=x", "imagee"),
    ] {
        let error = tools.helm(&["template", RELEASE, chart, "--set", bad]).expect_err(bad);
        assert!(error.contains("values don't meet the specifications of the schema"), "{bad}: {error}");
        assert!(error.contains(names), "{bad}: the message should name {names}:\n{error}");
    }
}

#[test]
fn the_committed_dashboard_is_the_one_hack_dashboard_py_generates() {
    let output = Command::new("python3")
        .arg(repo_root().join("hack/dashboard.py"))
        .arg("--check")
        .output()
        .expect("run python3 hack/dashboard.py --check");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn the_chart_runs_the_images_hack_images_sh_builds_with_flags_they_accept() {
    let tools = Tools::new(Path::new("/nonexistent"));
    let images: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("images/images.json")).expect("images/images.json"),
    )
    .expect("images.json is JSON");
    let image = |name: &str| images["images"][name].clone();
    let rendered = tools.helm(&["template", RELEASE, chart_dir().to_str().unwrap()]).expect("helm template");
    let objects = documents(&rendered);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let command = container["command"][0].as_str().expect("a command");
    assert_eq!(
        image("ferry-operator")["entrypoint"],
        json!([command]),
        "the chart runs the operator image's entrypoint"
    );
    assert_eq!(
        image("ferry-stager")["entrypoint"],
        json!(["/usr/local/bin/ferry-stager"]),
        "worker Jobs pass only arguments"
    );
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert!(
        image("ferry-operator")["exposedPorts"].as_array().unwrap().contains(&json!(port)),
        "the operator image exposes {port}"
    );
    assert!(
        image("ferry-stager")["exposedPorts"].as_array().unwrap().contains(&json!(9464)),
        "the stager's metrics port"
    );
    assert!(
        container["image"].as_str().unwrap().starts_with(images["repositoryPrefix"].as_str().unwrap()),
        "the chart's default image is the one hack/images.sh names"
    );
    // The rendered arguments parse: clap rejects an unknown flag before it
    // honours --help.
    let mut args: Vec<String> =
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    args.push("--help".into());
    let binary = ferry_e2e::workspace_binary("ferry-operator");
    let output = Command::new(&binary).args(&args).output().expect("run ferry-operator");
    assert!(
        output.status.success(),
        "ferry-operator refuses the chart's arguments {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_webhook_never_sees_ferrys_own_worker_and_clean_up_pods() {
    // A clean-up pod wired as a reader waited behind the gate for the data it
    // was to remove, pinned to a node the gate no longer sends pods to.
    let tools = Tools::new(Path::new("/nonexistent"));
    let chart = chart_dir();
    let rendered = tools
        .helm(&["template", RELEASE, chart.to_str().unwrap(), "--set", "webhook.annotationOptIn=true"])
        .expect("helm template");
    let objects = documents(&rendered);
    let configuration =
        objects.iter().find(|o| o["kind"] == "MutatingWebhookConfiguration").expect("a MutatingWebhookConfiguration");
    let webhooks = configuration["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 2, "both the label and the annotation webhook");
    for webhook in webhooks {
        let expressions = &webhook["objectSelector"]["matchExpressions"];
        for label in [ferry_crds::names::WORKER, ferry_crds::names::CLEANUP] {
            assert!(
                expressions.as_array().unwrap().contains(&json!({"key": label, "operator": "DoesNotExist"})),
                "{} sends pods labelled {label}: {expressions}",
                webhook["name"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_rendering_of_the_chart_passes_server_side_dry_run_and_grants_no_wildcards() {
    let cluster = Cluster::start().await.expect("cluster");
    let tools = Tools::new(cluster.kubeconfig());
    for namespace in [SYSTEM_NS, DATA_NS, OTHER_NS] {
        create_namespace(&cluster, namespace, &RESTRICTED).await;
    }
    // The chart creates the workers' namespace; a dry run of the objects in
    // it needs it to exist.
    create_namespace(&cluster, CHART_WORKERS_NS, &[]).await;
    install_crds(&tools).await;
    install_monitoring_crds(&tools).await;
    install_stand_in_crds(&tools, "cert-manager.io", &[("Certificate", "certificates"), ("Issuer", "issuers")]).await;
    let combinations: [(&str, Vec<&str>); 6] = [
        ("the default values", vec![]),
        (
            "cert-manager issues the webhook certificate, annotation-only pods wired too",
            vec!["webhook.certManager.enabled=true", "webhook.annotationOptIn=true", "webhook.certLifetime=30d"],
        ),
        (
            "the webhook off (the init-container form), no status policy",
            vec!["webhook.enabled=false", "statusWritersPolicy=false"],
        ),
        (
            "one watched namespace, two replicas, monitors and the dashboard elsewhere",
            vec![
                "watchNamespace=ml",
                "replicaCount=2",
                "metrics.serviceMonitor.enabled=true",
                "metrics.podMonitor.enabled=true",
                "grafana.dashboard.enabled=true",
                "grafana.dashboard.namespace=research",
            ],
        ),
        (
            "two DataStage namespaces, existing accounts, no stager metrics, a NodePort",
            vec![
                "dataStageNamespaces={ml,research}",
                "serviceAccount.create=false",
                "serviceAccount.name=ops-operator",
                "stager.serviceAccount.create=false",
                "stager.serviceAccount.name=team-stager",
                "stager.metricsPort=0",
                "metrics.podMonitor.enabled=true",
                "metrics.service.type=NodePort",
            ],
        ),
        (
            "custom images, host paths, node caches, web identities, scheduling and monitor labels",
            vec![
                "image.repository=registry.example/ferry/operator",
                "image.tag=1.2.3",
                "stager.image.repository=registry.example/ferry/stager",
                "stager.allowedImages={registry.example/ferry/*}",
                "hostPathNamespaces={ops}",
                "allowedHostPaths={/scratch,/nvme}",
                "sharedHostPaths={/nvme/ferry}",
                "nodeCaches[0].name=nvme",
                "nodeCaches[0].root=/nvme/cache",
                "nodeCaches[0].sharing=Cluster",
                "nodeCaches[0].eviction=WhenSpaceIsNeeded",
                "nodeCaches[0].namespaceSelector.matchLabels.team=ml",
                "webIdentity.audiences={sts.amazonaws.com,minio}",
                "webIdentity.allowHttpSts=true",
                "workers.namespace=ferry-system",
                "nodeSelector.pool=system",
                "tolerations[0].key=dedicated",
                "tolerations[0].operator=Exists",
                "metrics.serviceMonitor.enabled=true",
                "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
                "dataStageNamespaces={ml}",
                "logLevel=debug",
            ],
        ),
    ];
    for (what, values) in combinations {
        // As on a cluster that serves admission policies (`helm install`
        // asks the cluster; `helm template` cannot).
        let mut args = vec![
            "template",
            RELEASE,
            "--namespace",
            SYSTEM_NS,
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
        ];
        let chart = chart_dir();
        args.push(chart.to_str().unwrap());
        for value in &values {
            args.extend(["--set", value]);
        }
        let rendered = tools.helm(&args).unwrap_or_else(|e| panic!("{what}: helm template:\n{e}"));
        let objects = documents(&rendered);
        assert!(objects.iter().any(|o| o["kind"] == "Deployment"), "{what}: no Deployment");
        assert_no_wildcards(&objects, what);
        tools
            .kubectl(
                &["apply", "--server-side", "--dry-run=server", "--field-manager=helm", "-f", "-"],
                Some(&rendered),
            )
            .unwrap_or_else(|e| panic!("{what}: the API server refuses the rendering:\n{e}"));
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        let policies = objects.iter().filter(|o| o["kind"] == "ValidatingAdmissionPolicy").count();
        assert_eq!(policies, usize::from(!what.ends_with("no status policy")), "{what}: the status-writers policy");
        // Worker Jobs are made where Roles say, never cluster-wide.
        let cluster_job_creators = objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
            .filter(|rule| {
                rule["resources"].as_array().is_some_and(|r| r.contains(&json!("jobs")))
                    && rule["verbs"].as_array().is_some_and(|v| v.contains(&json!("create")))
            })
            .count();
        assert_eq!(cluster_job_creators, 0, "{what}: no ClusterRole creates Jobs");
        match what {
            w if w.starts_with("one watched") => {
                assert!(args.contains("--watch-namespace=ml"), "{args}");
                assert!(
                    !objects.iter().any(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "ferry-operator")
                );
                assert!(objects.iter().any(|o| o["kind"] == "ConfigMap" && o["metadata"]["namespace"] == "research"));
            }
            w if w.starts_with("two DataStage") => {
                assert!(
                    !args.contains("--stager-service-account=ferry-stager") && args.contains("team-stager"),
                    "{args}"
                );
                assert!(!objects.iter().any(|o| o["kind"] == "PodMonitor"), "no PodMonitor without a metrics port");
                let secret_roles: Vec<&Value> = objects
                    .iter()
                    .filter(|o| o["kind"] == "Role" && o["metadata"]["name"] == "ferry-operator-tenant")
                    .collect();
                assert_eq!(secret_roles.len(), 2, "Secret access in each DataStage namespace, nowhere else");
                assert!(args.contains("--workers-namespace=ferry-workers"), "{args}");
            }
            w if w.starts_with("custom") => {
                assert!(args.contains("--allowed-host-paths=/scratch,/nvme"), "{args}");
                assert!(args.contains("--shared-host-paths=/nvme/ferry"), "{args}");
                assert!(args.contains("--host-path-namespaces=ops"), "{args}");
                assert!(args.contains("--allowed-images=registry.example/ferry/*"), "{args}");
                assert!(args.contains("--web-identity-audiences=sts.amazonaws.com,minio"), "{args}");
                assert!(
                    args.contains("--allow-http-sts") && args.contains("--workers-namespace=ferry-system"),
                    "{args}"
                );
                assert!(args.contains("registry.example/ferry/stager:0.1.0"), "{args}");
                let cache = objects.iter().find(|o| o["kind"] == "NodeCache").expect("a NodeCache");
                assert_eq!(cache["spec"]["root"], "/nvme/cache");
                assert_eq!(cache["spec"]["namespaceSelector"]["matchLabels"]["team"], "ml");
                assert!(!objects.iter().any(|o| o["kind"] == "Namespace"), "the workers run in the release namespace");
            }
            _ => {}
        }
    }
    cluster.stop().await;
}

/// prometheus-operator's translation of a ServiceMonitor or PodMonitor into
/// a scrape configuration (the parts the chart uses).
///
/// A ServiceMonitor is resolved to the pods behind its Services here,
/// rather than discovered through EndpointSlices as prometheus-operator
/// does: the node agent's pods have loopback addresses, which the API
/// server does not allow in an EndpointSlice, so the slices stay empty.
/// The chain it checks is the same: monitor selector → Service labels,
/// Service selector → pod labels, monitor port → Service port → the
/// container port it targets.
fn scrape_config(monitor: &Value, services: &[Value], kubeconfig: &Path, interval: &str) -> Value {
    let kind = monitor["kind"].as_str().unwrap();
    let sanitize =
        |label: &str| label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>();
    let keep_labels = |labels: &Value| -> Vec<Value> {
        labels
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, value)| json!({"action": "keep", "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(key))], "regex": value}))
            .collect()
    };
    let selector = &monitor["spec"]["namespaceSelector"];
    let mut sd = json!({"role": "pod", "kubeconfig_file": kubeconfig});
    if let Some(names) = selector["matchNames"].as_array() {
        sd["namespaces"] = json!({"names": names});
    }
    let (endpoint, mut relabel) = match kind {
        "PodMonitor" => {
            let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
            let mut relabel = keep_labels(&monitor["spec"]["selector"]["matchLabels"]);
            relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]}));
            (endpoint, relabel)
        }
        "ServiceMonitor" => {
            let endpoint = &monitor["spec"]["endpoints"][0];
            let wanted = monitor["spec"]["selector"]["matchLabels"].as_object().cloned().unwrap_or_default();
            let matching: Vec<&Value> =
                services.iter().filter(|svc| wanted.iter().all(|(k, v)| &svc["metadata"]["labels"][k] == v)).collect();
            assert_eq!(matching.len(), 1, "the ServiceMonitor selects exactly one Service: {matching:?}");
            let service = matching[0];
            let port = service["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == endpoint["port"])
                .unwrap_or_else(|| panic!("the Service has no port named {}", endpoint["port"]));
            let mut relabel = keep_labels(&service["spec"]["selector"]);
            relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port["targetPort"]}));
            relabel.push(json!({"target_label": "service", "replacement": service["metadata"]["name"]}));
            (endpoint, relabel)
        }
        other => panic!("not a monitor: {other}"),
    };
    relabel.push(json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}));
    relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}));
    for rule in endpoint["relabelings"].as_array().into_iter().flatten() {
        let mut translated = json!({"source_labels": rule["sourceLabels"], "target_label": rule["targetLabel"]});
        for (from, to) in [("regex", "regex"), ("action", "action"), ("replacement", "replacement")] {
            if !rule[from].is_null() {
                translated[to] = rule[from].clone();
            }
        }
        relabel.push(translated);
    }
    let namespace = monitor["metadata"]["namespace"].as_str().unwrap();
    let name = monitor["metadata"]["name"].as_str().unwrap();
    json!({
        "job_name": format!("{}/{namespace}/{name}/0", kind.to_ascii_lowercase()),
        "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
        "kubernetes_sd_configs": [sd],
        "relabel_configs": relabel,
    })
}

/// A real Prometheus on loopback, and its HTTP API.
struct Prometheus {
    /// Stopped when dropped.
    _process: ferry_e2e::process::ManagedProcess,
    url: String,
    http: reqwest::Client,
}

impl Prometheus {
    fn start(dir: &Path, scrape_configs: Vec<Value>) -> Self {
        let config =
            json!({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs});
        let config_path = dir.join("prometheus.yml");
        // JSON is YAML.
        std::fs::write(&config_path, config.to_string()).unwrap();
        let port = free_port();
        let mut command = Command::new(tool_path("prometheus"));
        command.args([
            format!("--config.file={}", config_path.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ]);
        let process = ferry_e2e::process::ManagedProcess::spawn("prometheus", command, &dir.join("prometheus.log"))
            .expect("start prometheus");
        Self { _process: process, url: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new() }
    }

    async fn api(&self, path: &str, params: &[(&str, String)]) -> Option<Value> {
        let response = self.http.get(format!("{}{path}", self.url)).query(params).send().await.ok()?;
        let body: Value = response.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// An instant query's result vector.
    async fn query(&self, promql: &str) -> Vec<Value> {
        let data = self.api("/api/v1/query", &[("query", promql.to_owned())]).await;
        data.and_then(|d| d["result"].as_array().cloned()).unwrap_or_default()
    }

    /// The single value of an instant query, if it has exactly one series.
    async fn scalar(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql).await;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// A range query's series, `start..now` at 1 s steps.
    async fn range(&self, promql: &str, start: f64) -> Result<Vec<Value>, String> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let params = [
            ("query", promql.to_owned()),
            ("start", format!("{start:.3}")),
            ("end", format!("{now:.3}")),
            ("step", "1".into()),
        ];
        let response = self
            .http
            .get(format!("{}/api/v1/query_range", self.url))
            .query(&params)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(body.to_string());
        }
        Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Targets of one scrape job that are up.
    async fn up_targets(&self, job_prefix: &str) -> Vec<Value> {
        let data = self.api("/api/v1/targets", &[("state", "active".into())]).await.unwrap_or_default();
        data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["scrapePool"].as_str().is_some_and(|p| p.starts_with(job_prefix)) && t["health"] == "up")
            .cloned()
            .collect()
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Runs `promtool check metrics` on an exposition.
fn promtool_check(exposition: &str, what: &str) {
    let result = run_tool(&tool_path("promtool"), &["check", "metrics"], &[], Some(exposition));
    if let Err(problems) = result {
        panic!("promtool check metrics fails on the {what} exposition:\n{problems}\n--- exposition ---\n{exposition}");
    }
}

/// `kubectl auth can-i` as a ServiceAccount: true for "yes".
fn can(tools: &Tools, account: &str, args: &[&str]) -> bool {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    let subject = format!("--as=system:serviceaccount:{account}");
    full.push(&subject);
    match tools.kubectl(&full, None) {
        Ok(out) => out.trim() == "yes",
        Err(out) if out.trim_start().starts_with("no") => false,
        Err(other) => panic!("kubectl auth can-i {args:?}: {other}"),
    }
}

/// A claim `name` in `namespace` bound to a PersistentVolume at
/// `/mnt/ferry/NAME` (hostPath volumes themselves are not allowed under the
/// restricted Pod Security Standard; claims are): a hostPath one usable on
/// any node (each node has its own directory on the harness), or with
/// `on_node`, a `local` one whose node affinity ties its pods to that node.
async fn create_claim(client: &kube::Client, namespace: &str, name: &str, on_node: Option<&str>) {
    let path = format!("/mnt/ferry/{name}");
    let (access, class, mut spec) = match on_node {
        None => ("ReadWriteMany", "manual", json!({"hostPath": {"path": path}})),
        Some(node) => (
            "ReadWriteOnce",
            "local",
            json!({"local": {"path": path}, "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "ferry.dev/e2e-node", "operator": "In", "values": [node]}]}]}}}),
        ),
    };
    spec["capacity"] = json!({"storage": "1Gi"});
    spec["accessModes"] = json!([access]);
    spec["storageClassName"] = json!(class);
    spec["persistentVolumeReclaimPolicy"] = json!("Retain");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("{name}-pv")}, "spec": spec,
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": [access], "storageClassName": class, "volumeName": format!("{name}-pv"),
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
}

const DATASET_OBJECTS: u64 = 48;
const OBJECT_BYTES: usize = 1 << 20;
/// Each stager's bandwidth cap: each of the two shards takes about 12 s,
/// long enough for several scrapes even though Prometheus's discovery
/// passes new targets on only every 5 s.
const BANDWIDTH: u64 = 2 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_an_operator_that_stages_under_its_own_rbac_and_prometheus_sees_it_all() {
    // The data: 48 MiB in 1 MiB objects.
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    let mut files = BTreeMap::new();
    for i in 0..DATASET_OBJECTS {
        files.insert(format!("shard-{i:03}.bin"), pattern(100 + i, OBJECT_BYTES));
    }
    for (key, data) in &files {
        s3.put("datasets", &format!("corpus/{key}"), data.clone()).await;
    }
    let dataset_bytes = (DATASET_OBJECTS as usize * OBJECT_BYTES) as f64;

    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let tools = Tools::new(cluster.kubeconfig());
    for namespace in [SYSTEM_NS, DATA_NS, OTHER_NS] {
        create_namespace(&cluster, namespace, &RESTRICTED).await;
    }
    install_monitoring_crds(&tools).await;

    // helm install: CRDs from the chart's crds/, then the templates.
    let mut values = image_values();
    values.extend(
        [
            "dataStageNamespaces={ml}",
            "leaseDuration=4s",
            "allowedHostPaths={/mnt/ferry}",
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.interval=1s",
            "metrics.serviceMonitor.scrapeTimeout=1s",
            "metrics.podMonitor.enabled=true",
            "metrics.podMonitor.interval=1s",
            "metrics.podMonitor.scrapeTimeout=1s",
            "grafana.dashboard.enabled=true",
        ]
        .map(String::from),
    );
    let chart = chart_dir();
    let notes = helm_install(&tools, &cluster, &values);
    assert!(
        notes.contains("rollout status deployment/ferry-operator"),
        "NOTES tell the user what to do next:\n{notes}"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    let ready_replicas = |want: i32| {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("ferry-operator").await.ok()?;
            (d.status?.ready_replicas.unwrap_or(0) == want).then_some(())
        }
    };
    wait_for(&cluster, "the operator Deployment to be ready", Duration::from_secs(60), || ready_replicas(1)).await;
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let operator_pod = operator_pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=ferry-operator"))
        .await
        .unwrap()
        .items
        .remove(0);
    assert_eq!(operator_pod.spec.as_ref().unwrap().service_account_name.as_deref(), Some("ferry"));

    // Prometheus, configured from the monitors the chart installed.
    let monitors: Vec<Value> = ["servicemonitors", "podmonitors"]
        .iter()
        .flat_map(|kind| {
            let out = tools.kubectl(&["get", kind, "-n", SYSTEM_NS, "-o", "json"], None).expect("monitors");
            serde_json::from_str::<Value>(&out).unwrap()["items"].as_array().cloned().unwrap_or_default()
        })
        .collect();
    assert_eq!(monitors.len(), 2, "one ServiceMonitor and one PodMonitor");
    let prometheus_dir = tempfile::tempdir().unwrap();
    let services = tools.kubectl(&["get", "services", "-n", SYSTEM_NS, "-o", "json"], None).expect("services");
    let services = serde_json::from_str::<Value>(&services).unwrap()["items"].as_array().cloned().unwrap_or_default();
    let prometheus = Prometheus::start(
        prometheus_dir.path(),
        monitors.iter().map(|m| scrape_config(m, &services, cluster.kubeconfig(), "1s")).collect(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while prometheus.up_targets("servicemonitor/").await.is_empty() {
        if std::time::Instant::now() > deadline {
            let targets = prometheus.api("/api/v1/targets", &[]).await;
            let slices = tools.kubectl(&["get", "endpointslices,pods", "-n", SYSTEM_NS, "-o", "wide"], None);
            panic!(
                "Prometheus does not scrape the operator through its Service\ntargets: {targets:?}\n{slices:?}\n{}",
                ferry_e2e::process::tail(&prometheus_dir.path().join("prometheus.log"), 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A budget for the bucket, generous enough not to slow anything: its
    // split shows in the StoreBudget, the workers' metrics and the
    // dashboard. Its status says the operator, under the chart's RBAC,
    // sees it (and that the worker Jobs below will count it).
    let budgets: Api<StoreBudget> = Api::all(client.clone());
    let budget: StoreBudget = serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1",
        "kind": "StoreBudget", "metadata": {"name": "datasets"},
        "spec": {"uri": "s3://datasets", "endpoint": s3.endpoint, "requestsPerSecond": 1000, "bandwidth": "1Gi"}}))
    .unwrap();
    budgets.create(&PostParams::default(), &budget).await.unwrap();
    wait_for(&cluster, "the operator to split the StoreBudget", Duration::from_secs(30), || {
        let budgets = budgets.clone();
        async move { budgets.get("datasets").await.ok()?.status.filter(|s| s.share.is_some()).map(|_| ()) }
    })
    .await;

    // A DataStage sharded over two workers onto a claim (hostPath volumes
    // are not allowed under the restricted standard; claims are).
    create_claim(&client, DATA_NS, "corpus", None).await;
    let secret: Secret =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}}))
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), DATA_NS).create(&PostParams::default(), &secret).await.unwrap();
    let datastages: Api<DataStage> = Api::namespaced(client.clone(), DATA_NS);
    let staging_started = unix_now();
    let datastage: DataStage = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "corpus"},
        "spec": {
            "source": {"uri": "s3://datasets/corpus", "endpoint": s3.endpoint, "credentials": {"name": "s3"}},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "corpus", "subPath": "v1"}}},
            "workers": 2,
            "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
            "transfer": {"maxBandwidth": BANDWIDTH.to_string()},
        },
    }))
    .unwrap();
    datastages.create(&PostParams::default(), &datastage).await.unwrap();

    // The same onto a hostPath: node paths are the cluster admin's, so the
    // DataStage is refused at admission, saying who may and what to do
    // instead. (The webhook answers within seconds of the install: asked
    // until it answers.)
    let mut on_host = datastage.clone();
    on_host.metadata.name = Some("on-host".into());
    on_host.spec.destination = serde_json::from_value(json!({"volume": {"hostPath": "/mnt/ferry/corpus"}})).unwrap();
    let refusal =
        wait_for(&cluster, "the DataStage webhook to refuse a tenant's hostPath", Duration::from_secs(30), || {
            let (datastages, on_host) = (datastages.clone(), on_host.clone());
            async move {
                match datastages.create(&PostParams { dry_run: true, ..PostParams::default() }, &on_host).await {
                    Err(kube::Error::Api(refused)) => Some(refused.message),
                    _ => None,
                }
            }
        })
        .await;
    assert!(
        refusal.contains("volume.hostPath is for the cluster admin's namespaces only")
            && refusal.contains("hostPathNamespaces")
            && refusal.contains("volume.nodeCache"),
        "{refusal}"
    );

    // While it runs: one stager's exposition, straight from its pod.
    let data_pods: Api<Pod> = Api::namespaced(client.clone(), DATA_NS);
    let stager_exposition = wait_for(&cluster, "a running stager serving /metrics", Duration::from_secs(60), || {
        let data_pods = data_pods.clone();
        async move {
            let pods = data_pods.list(&ListParams::default().labels("ferry.dev/datastage=corpus")).await.ok()?;
            for pod in pods.items {
                let status = pod.status.clone()?;
                if status.phase.as_deref() != Some("Running") {
                    continue;
                }
                assert_eq!(pod.spec.as_ref()?.service_account_name.as_deref(), Some("ferry-stager"));
                let ip = status.pod_ip?;
                let url = format!("http://{ip}:9464/metrics");
                if let Ok(response) = reqwest::get(&url).await
                    && let Ok(text) = response.text().await
                    && text.contains("ferry_stager_transferred_bytes_total")
                {
                    return Some(text);
                }
            }
            None
        }
    })
    .await;
    // Its two workers (one Indexed Job of two pods) split the budget.
    assert!(
        stager_exposition.contains("ferry_stager_store_share_requests_per_second 500"),
        "each of the two workers follows half the budget:\n{stager_exposition}"
    );
    let split = budgets.get("datasets").await.unwrap().status.unwrap();
    assert!(split.workers <= 2 && split.throttled_requests == 0, "{split:?}");
    let succeeded = wait_for(&cluster, "the DataStage to succeed", Duration::from_secs(120), || {
        let datastages = datastages.clone();
        async move {
            let ds = datastages.get("corpus").await.ok()?;
            let status = ds.status?;
            assert_ne!(status.phase, Some(Phase::Failed), "the DataStage failed: {status:?}");
            (status.phase == Some(Phase::Succeeded)).then_some(status)
        }
    })
    .await;
    assert_eq!(succeeded.totals.as_ref().unwrap().bytes_done as f64, dataset_bytes);
    if let Some(node_b) = cluster.node_dir("node-b") {
        assert_eq!(read_tree(&node_b.join("mnt/ferry/corpus/v1")), files, "the claim holds the dataset byte for byte");
    }

    // The operator's view reaches Prometheus (it scrapes every second).
    let done = r#"ferry_operator_datastage_bytes{namespace="ml",datastage="corpus",state="done"}"#;
    let succeeded_count = r#"sum(ferry_operator_datastages{phase="Succeeded"})"#;
    wait_for(&cluster, "the operator's final totals and phase in Prometheus", Duration::from_secs(30), || async {
        (prometheus.scalar(done).await == Some(dataset_bytes) && prometheus.scalar(succeeded_count).await == Some(1.0))
            .then_some(())
    })
    .await;
    let window = format!("{}s", (unix_now() - staging_started).ceil() as u64 + 5);
    let raw = format!(r#"ferry_stager_transferred_bytes_total{{datastage="corpus"}}[{window}]"#);
    let scalar = |promql: String| {
        let (prometheus, raw) = (&prometheus, &raw);
        async move {
            match prometheus.scalar(&promql).await {
                Some(value) => value,
                None => panic!("no single value for {promql}; the stagers' samples: {:?}", prometheus.query(raw).await),
            }
        }
    };
    // Bytes: every stager's counter was scraped mid-flight or at the end; together no more than the dataset.
    let scraped_bytes = scalar(format!(
        r#"sum(max_over_time(ferry_stager_transferred_bytes_total{{namespace="ml",datastage="corpus",direction="download"}}[{window}]))"#
    ))
    .await;
    assert!(scraped_bytes > 0.0 && scraped_bytes <= dataset_bytes, "stager bytes {scraped_bytes} of {dataset_bytes}");
    // Throughput: positive and within what two capped workers can do.
    let peak = scalar(format!(
        r#"max_over_time(sum(rate(ferry_stager_transferred_bytes_total{{namespace="ml",datastage="corpus"}}[5s]))[{window}:1s])"#
    ))
    .await;
    assert!(
        peak > 0.0 && peak <= 4.0 * 2.0 * BANDWIDTH as f64,
        "peak throughput {peak} B/s with two workers capped at {BANDWIDTH}"
    );
    // The series carry the DataStage, the worker's node and pod.
    // (The stagers have exited: their series are stale now, so look back.)
    let by_node = prometheus
        .query(&format!(r#"count by (node, worker) (last_over_time(ferry_stager_transferred_bytes_total{{datastage="corpus"}}[{window}]))"#))
        .await;
    assert!(!by_node.is_empty() && by_node.iter().all(|s| s["metric"]["node"] == "node-b"), "{by_node:?}");
    let objects = scalar(format!(
        r#"sum(max_over_time(ferry_stager_objects_total{{datastage="corpus",result="transferred"}}[{window}]))"#
    ))
    .await;
    assert!(objects > 0.0 && objects <= DATASET_OBJECTS as f64, "objects {objects}");
    assert!(scalar(r#"sum(ferry_operator_reconciles_total{result="ok"})"#.into()).await >= 1.0);
    assert!(scalar("sum(ferry_operator_reconcile_duration_seconds_count)".into()).await >= 1.0);
    assert_eq!(
        scalar(r#"sum(ferry_operator_reconcile_errors_total{reason="Forbidden"})"#.into()).await,
        0.0,
        "the chart's RBAC is enough"
    );

    // Both expositions pass promtool's lint.
    promtool_check(&stager_exposition, "stager");
    let operator_ip = operator_pods.get(&operator_pod.name_any()).await.unwrap().status.unwrap().pod_ip.unwrap();
    let operator_exposition =
        reqwest::get(format!("http://{operator_ip}:8080/metrics")).await.unwrap().text().await.unwrap();
    promtool_check(&operator_exposition, "operator");

    // Every panel of the dashboard returns data for this staging.
    let dashboard_config = tools
        .kubectl(&["get", "configmap", "ferry-dashboard", "-n", SYSTEM_NS, "-o", "json"], None)
        .expect("the dashboard ConfigMap");
    let configmap: Value = serde_json::from_str(&dashboard_config).unwrap();
    assert_eq!(configmap["metadata"]["labels"]["grafana_dashboard"], "1", "the Grafana sidecar's label");
    let dashboard: Value = serde_json::from_str(configmap["data"]["ferry.json"].as_str().unwrap()).unwrap();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap().iter().filter(|p| p["type"] != "row") {
        panels += 1;
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$namespace", DATA_NS)
                .replace("$datastage", "corpus")
                .replace("$__rate_interval", "10s");
            let series = prometheus
                .range(&expr, staging_started - 5.0)
                .await
                .unwrap_or_else(|e| panic!("panel {:?}: {expr} fails: {e}", panel["title"]));
            let finite = series.iter().any(|s| {
                s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v[1].as_str().is_some_and(|x| x.parse::<f64>().is_ok_and(f64::is_finite)))
            });
            assert!(finite, "panel {:?} shows no data for the staging: {expr}", panel["title"]);
        }
    }
    assert!(panels >= 12, "the dashboard has {panels} panels");

    // The RBAC is exactly what the operator and stagers need.
    let operator = format!("{SYSTEM_NS}:ferry");
    let stager = format!("{DATA_NS}:ferry-stager");
    let workers_stager = format!("{CHART_WORKERS_NS}:ferry-stager");
    for (account, allowed, args) in [
        (&operator, true, vec!["watch", "datastages.ferry.dev", "--all-namespaces"]),
        (&operator, true, vec!["patch", "datastages.ferry.dev", "--subresource=status", "-n", DATA_NS]),
        (&operator, true, vec!["create", "jobs.batch", "-n", DATA_NS]),
        (&operator, true, vec!["create", "jobs.batch", "-n", CHART_WORKERS_NS]),
        (&operator, false, vec!["create", "jobs.batch", "-n", OTHER_NS]),
        (&operator, true, vec!["create", "secrets", "-n", CHART_WORKERS_NS]),
        (&operator, false, vec!["create", "secrets", "-n", DATA_NS]),
        (&operator, true, vec!["create", "serviceaccounts", "--subresource=token", "-n", DATA_NS]),
        (&operator, false, vec!["create", "serviceaccounts", "--subresource=token", "-n", OTHER_NS]),
        (&operator, true, vec!["create", "persistentvolumeclaims", "-n", DATA_NS]),
        (&operator, true, vec!["create", "persistentvolumes"]),
        (&operator, true, vec!["patch", "nodes"]),
        (&operator, true, vec!["watch", "nodecaches.ferry.dev"]),
        (&operator, false, vec!["create", "nodecaches.ferry.dev"]),
        (&operator, true, vec!["update", "validatingwebhookconfigurations/ferry-datastages"]),
        (&workers_stager, true, vec!["patch", "datastages.ferry.dev", "--subresource=status", "-n", OTHER_NS]),
        (&workers_stager, false, vec!["get", "secrets", "-n", CHART_WORKERS_NS]),
        // Its caches: Jobs and pods watched, not listed per reconciliation.
        (&operator, true, vec!["watch", "jobs.batch", "--all-namespaces"]),
        (&operator, false, vec!["patch", "jobs.batch", "-n", DATA_NS]),
        (&operator, true, vec!["list", "pods", "-n", OTHER_NS]),
        (&operator, true, vec!["list", "nodes"]),
        (&operator, true, vec!["watch", "storebudgets.ferry.dev"]),
        (&operator, true, vec!["patch", "storebudgets.ferry.dev", "--subresource=status"]),
        (&operator, false, vec!["patch", "storebudgets.ferry.dev"]),
        (&operator, false, vec!["create", "storebudgets.ferry.dev"]),
        (&operator, true, vec!["watch", "nodes"]),
        (&operator, true, vec!["get", "secrets", "-n", DATA_NS]),
        (&operator, true, vec!["get", "configmaps", "-n", DATA_NS]),
        (&operator, false, vec!["get", "configmaps", "-n", OTHER_NS]),
        (&operator, false, vec!["list", "configmaps", "-n", DATA_NS]),
        (&operator, true, vec!["create", "events.events.k8s.io", "-n", DATA_NS]),
        (&operator, true, vec!["update", "leases/ferry-operator-leader", "-n", SYSTEM_NS]),
        // The pod webhook: gated pods watched and patched, its own certificate and caBundle.
        (&operator, true, vec!["watch", "pods", "--all-namespaces"]),
        (&operator, true, vec!["patch", "pods", "-n", OTHER_NS]),
        (&operator, true, vec!["update", "secrets/ferry-webhook-tls", "-n", SYSTEM_NS]),
        (&operator, true, vec!["update", "mutatingwebhookconfigurations/ferry-pod-data"]),
        (&operator, false, vec!["create", "secrets", "-n", SYSTEM_NS]),
        (&operator, false, vec!["update", "secrets/someone-elses", "-n", SYSTEM_NS]),
        (&operator, false, vec!["update", "mutatingwebhookconfigurations/someone-elses"]),
        (&operator, false, vec!["delete", "pods", "-n", DATA_NS]),
        (&operator, false, vec!["update", "pods", "-n", DATA_NS]),
        (&operator, false, vec!["get", "secrets", "-n", OTHER_NS]),
        (&operator, false, vec!["get", "secrets", "--all-namespaces"]),
        (&operator, false, vec!["list", "secrets", "-n", DATA_NS]),
        (&operator, false, vec!["delete", "datastages.ferry.dev", "-n", DATA_NS]),
        (&operator, false, vec!["create", "pods", "-n", DATA_NS]),
        (&operator, false, vec!["update", "leases", "-n", DATA_NS]),
        (&operator, false, vec!["update", "leases/someone-elses", "-n", SYSTEM_NS]),
        (&operator, false, vec!["create", "rolebindings.rbac.authorization.k8s.io", "-n", DATA_NS]),
        (&operator, false, vec!["delete", "nodes"]),
        (&stager, true, vec!["get", "datastages.ferry.dev", "-n", DATA_NS]),
        (&stager, true, vec!["patch", "datastages.ferry.dev", "--subresource=status", "-n", DATA_NS]),
        (&stager, false, vec!["list", "datastages.ferry.dev", "-n", DATA_NS]),
        (&stager, false, vec!["patch", "datastages.ferry.dev", "-n", DATA_NS]),
        (&stager, false, vec!["get", "datastages.ferry.dev", "-n", OTHER_NS]),
        (&stager, false, vec!["get", "secrets", "-n", DATA_NS]),
        (&stager, false, vec!["create", "jobs.batch", "-n", DATA_NS]),
    ] {
        assert_eq!(can(&tools, account, &args), allowed, "{account} can-i {args:?} should be {allowed}");
    }

    // helm upgrade with changed values: two replicas, debug logs.
    let mut args: Vec<String> =
        ["upgrade", RELEASE, chart.to_str().unwrap(), "--namespace", SYSTEM_NS, "--wait", "--timeout", "3m"]
            .map(String::from)
            .to_vec();
    let mut upgraded = values.clone();
    upgraded.extend(["replicaCount=2".to_owned(), "logLevel=debug".to_owned()]);
    args.extend(set_args(&upgraded));
    tools.helm(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap_or_else(|e| panic!("helm upgrade:\n{e}"));
    wait_for(&cluster, "two operator replicas after the upgrade", Duration::from_secs(90), || ready_replicas(2)).await;
    let deployment = deployments.get("ferry-operator").await.unwrap();
    let env = deployment.spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("debug")));
    // The upgraded operator still stages (a second, small DataStage).
    let again: DataStage = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "corpus-again"},
        "spec": {
            "source": {"uri": "s3://datasets/corpus", "endpoint": s3.endpoint, "credentials": {"name": "s3"}},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "corpus", "subPath": "v2"}}},
            "include": ["shard-00*"],
            "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
        },
    }))
    .unwrap();
    datastages.create(&PostParams::default(), &again).await.unwrap();
    wait_for(&cluster, "a DataStage staged by the upgraded release", Duration::from_secs(120), || {
        let datastages = datastages.clone();
        async move { (datastages.get("corpus-again").await.ok()?.status?.phase == Some(Phase::Succeeded)).then_some(()) }
    })
    .await;

    // And a gated model from the Hugging Face Hub (olah behind the
    // testkit's front), its token from a Secret, read by the chart's
    // stager image in the restricted namespace: byte for byte, at the
    // commit the status names.
    let hub = ferry_testkit::HubServer::start();
    let model: BTreeMap<String, Vec<u8>> = [
        ("config.json".to_owned(), br#"{"hidden_size": 64}"#.to_vec()),
        ("model.safetensors".to_owned(), pattern(500, (2 << 20) + 3)),
    ]
    .into();
    hub.put_all("chart-model", model.clone()).await;
    hub.gate("chart-model", "hf_chart_token");
    let token = ferry_e2e::hub_token_secret("hf", "hf_chart_token");
    Api::<Secret>::namespaced(client.clone(), DATA_NS).create(&PostParams::default(), &token).await.unwrap();
    let from_hub: DataStage = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "model"},
        "spec": {
            "source": {"uri": "hf://ferry/chart-model", "endpoint": hub.endpoint, "credentials": {"name": "hf"}},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "corpus", "subPath": "model"}}},
            "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
        },
    }))
    .unwrap();
    datastages.create(&PostParams::default(), &from_hub).await.unwrap();
    let staged = wait_for(&cluster, "the model from the Hub", Duration::from_secs(120), || {
        let datastages = datastages.clone();
        async move {
            let status = datastages.get("model").await.ok()?.status?;
            assert_ne!(status.phase, Some(Phase::Failed), "the model failed: {status:?}");
            (status.phase == Some(Phase::Succeeded)).then_some(status)
        }
    })
    .await;
    let revision = staged.snapshot.and_then(|s| s.revision);
    assert_eq!(revision, Some(hub.commit("chart-model", "main")), "the status names the commit");
    if let Some(node_b) = cluster.node_dir("node-b") {
        assert_eq!(read_tree(&node_b.join("mnt/ferry/corpus/model")), model, "the model byte for byte");
    }

    // helm uninstall leaves nothing behind but the CRDs.
    tools
        .helm(&["uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait", "--timeout", "2m"])
        .unwrap_or_else(|e| panic!("helm uninstall:\n{e}"));
    let kinds = "deployments,replicasets,pods,services,serviceaccounts,configmaps,secrets,leases,roles,rolebindings,servicemonitors,podmonitors";
    wait_for(&cluster, "every namespaced object of the release to be gone", Duration::from_secs(60), || async {
        let left = tools
            .kubectl(&["get", kinds, "--all-namespaces", "-l", "app.kubernetes.io/instance=ferry", "-o", "name"], None)
            .ok()?;
        let in_system = tools.kubectl(&["get", "pods,leases,secrets", "-n", SYSTEM_NS, "-o", "name"], None).ok()?;
        (left.trim().is_empty() && in_system.trim().is_empty()).then_some(())
    })
    .await;
    let cluster_scoped = tools
        .kubectl(
            &[
                "get",
                "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,nodecaches,namespaces",
                "-l",
                "app.kubernetes.io/instance=ferry",
                "-o",
                "name",
            ],
            None,
        )
        .unwrap();
    assert!(cluster_scoped.trim().is_empty(), "left behind: {cluster_scoped}");
    let stager_accounts = tools.kubectl(&["get", "serviceaccounts", "-n", DATA_NS, "-o", "name"], None).unwrap();
    assert!(!stager_accounts.contains("ferry-stager"), "{stager_accounts}");
    tools.kubectl(&["get", "crd", "datastages.ferry.dev"], None).expect("Helm keeps the CRDs it installed");

    // A release scoped to one namespace (namespaced Roles, no cluster-wide
    // access but listing nodes) stages there and leaves other namespaces alone.
    let mut args: Vec<String> =
        ["install", "scoped", chart.to_str().unwrap(), "--namespace", SYSTEM_NS, "--wait", "--timeout", "3m"]
            .map(String::from)
            .to_vec();
    let mut scoped = image_values();
    scoped.extend(["watchNamespace=research".to_owned(), "leaseDuration=4s".to_owned()]);
    args.extend(set_args(&scoped));
    tools
        .helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("helm install scoped:\n{e}"));
    let scoped_operator = format!("{SYSTEM_NS}:scoped-ferry");
    assert!(can(&tools, &scoped_operator, &["watch", "datastages.ferry.dev", "-n", OTHER_NS]));
    assert!(!can(&tools, &scoped_operator, &["watch", "datastages.ferry.dev", "--all-namespaces"]));
    assert!(!can(&tools, &scoped_operator, &["create", "jobs.batch", "-n", DATA_NS]));
    assert!(can(&tools, &scoped_operator, &["patch", "pods", "-n", OTHER_NS]));
    assert!(!can(&tools, &scoped_operator, &["watch", "pods", "--all-namespaces"]));
    create_claim(&client, OTHER_NS, "research", None).await;
    Api::<Secret>::namespaced(client.clone(), OTHER_NS).create(&PostParams::default(), &secret).await.unwrap();
    let small = |claim: &str| -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "subset"},
            "spec": {
                "source": {"uri": "s3://datasets/corpus", "endpoint": s3.endpoint, "credentials": {"name": "s3"}},
                "destination": {"volume": {"persistentVolumeClaim": {"claimName": claim, "subPath": "subset"}}},
                "include": ["shard-00*"],
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
            },
        }))
        .unwrap()
    };
    let research: Api<DataStage> = Api::namespaced(client.clone(), OTHER_NS);
    research.create(&PostParams::default(), &small("research")).await.unwrap();
    datastages.create(&PostParams::default(), &small("corpus")).await.unwrap();
    wait_for(&cluster, "the scoped release to stage in its namespace", Duration::from_secs(120), || {
        let research = research.clone();
        async move { (research.get("subset").await.ok()?.status?.phase == Some(Phase::Succeeded)).then_some(()) }
    })
    .await;
    let ignored = datastages.get("subset").await.unwrap();
    assert!(ignored.status.is_none(), "a DataStage outside the watched namespace is left alone: {:?}", ignored.status);

    drop(prometheus);
    cluster.stop().await;
}

/// A pod spec that finds `count` files under `dirs` (where the webhook
/// mounts the data), compliant with the restricted Pod Security Standard.
fn training_pod_template(labels: Value, annotations: Value, dirs: &[&str], count: usize) -> Value {
    // Paths reach the script through env (the agent maps values, not script text).
    let env: Vec<Value> = dirs.iter().enumerate().map(|(i, d)| json!({"name": format!("D{i}"), "value": d})).collect();
    let args: Vec<String> = (0..dirs.len()).map(|i| format!("\"$D{i}\"")).collect();
    let script = format!("n=$$(find {} -type f -not -path '*/.*' | wc -l) && test \"$n\" -eq {count}", args.join(" "));
    json!({
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "train", "image": image("ferry-e2e-shell"), "command": ["sh", "-c", script], "env": env,
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        },
    })
}

fn job(name: &str, template: Value) -> k8s_openapi::api::batch::v1::Job {
    serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": template}}))
    .unwrap()
}

/// The pod a Job created, once it exists.
async fn job_pod(cluster: &Cluster, pods: &Api<Pod>, job: &str) -> Pod {
    wait_for(cluster, &format!("the pod of Job {job}"), Duration::from_secs(60), || {
        let pods = pods.clone();
        let selector = format!("batch.kubernetes.io/job-name={job}");
        async move { pods.list(&ListParams::default().labels(&selector)).await.ok()?.items.into_iter().next() }
    })
    .await
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

/// A Warning Event with `reason` on pod `name`, once there is one.
async fn pod_warning(cluster: &Cluster, client: &kube::Client, namespace: &str, name: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    wait_for(cluster, &format!("a {reason} Warning on pod {name}"), Duration::from_secs(60), || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.regarding.as_ref()?.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning"))
                .then(|| e.note.unwrap_or_default())
            })
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_webhook_holds_training_pods_until_their_data_is_ready_and_the_scheduler_places_them_with_it() {
    assert!(
        ferry_e2e::pod_network_routed(),
        "the API server can only call the webhook behind its Service when pods have addresses it accepts as \
         endpoints: run the e2e tests under hack/netns.sh (hack/test.sh does)"
    );
    const TRAIN_NS: &str = "train";
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    for i in 0..6 {
        s3.put("datasets", &format!("small/obj-{i}"), pattern(300 + i, 256 << 10)).await;
    }
    for i in 0..3 {
        s3.put("datasets", &format!("extra/obj-{i}"), pattern(400 + i, 4096)).await;
    }

    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let tools = Tools::new(cluster.kubeconfig());
    create_namespace(&cluster, SYSTEM_NS, &RESTRICTED).await;
    create_namespace(&cluster, DATA_NS, &RESTRICTED).await;
    // Node-local data needs no hostPath in a tenant's pod: restricted too.
    create_namespace(&cluster, TRAIN_NS, &RESTRICTED).await;

    // Two replicas answer the webhook; a 40 s serving certificate renews
    // (with a third left) while the test runs.
    let mut values = image_values();
    values.extend(
        [
            "dataStageNamespaces={ml,train}",
            "leaseDuration=4s",
            "nodeCaches[0].name=local",
            "nodeCaches[0].root=/mnt/ferry",
            "replicaCount=2",
            "webhook.certLifetime=40s",
            "webhook.timeoutSeconds=3",
        ]
        .map(String::from),
    );
    helm_install(&tools, &cluster, &values);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NS);
    let serving_cert = || {
        let secrets = secrets.clone();
        async move {
            let data = secrets.get("ferry-webhook-tls").await.ok()?.data?;
            Some(String::from_utf8_lossy(&data.get("tls.crt")?.0).into_owned())
        }
    };
    let first_cert =
        wait_for(&cluster, "the operator to issue its webhook certificate", Duration::from_secs(60), serving_cert)
            .await;

    let store = json!({"uri": "s3://datasets/small", "endpoint": s3.endpoint, "credentials": {"name": "s3"}});
    let create_secret = |namespace: &'static str| {
        let secret: Secret =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}}))
            .unwrap();
        let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
        async move { secrets.create(&PostParams::default(), &secret).await.unwrap() }
    };
    create_secret(DATA_NS).await;
    let datastage = |name: &str, spec: Value| -> DataStage {
        serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    let train_stages: Api<DataStage> = Api::namespaced(client.clone(), TRAIN_NS);
    let train_pods: Api<Pod> = Api::namespaced(client.clone(), TRAIN_NS);
    let train_jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), TRAIN_NS);

    // 1. Node-local data on node-b only. Its credentials Secret comes only
    //    after the Job's pod has been seen waiting: a DataStage that could
    //    run at once might finish before the pod exists, however slowed.
    train_stages
        .create(
            &PostParams::default(),
            &datastage(
                "on-b",
                json!({"source": store, "destination": {"volume": {"nodeCache": "local"}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
                "transfer": {"maxBandwidth": "512Ki"}}),
            ),
        )
        .await
        .unwrap();
    let template = training_pod_template(json!({"ferry.dev/datastage": "on-b"}), json!({}), &["/data"], 6);
    train_jobs.create(&PostParams::default(), &job("train-b", template)).await.unwrap();
    let pod = job_pod(&cluster, &train_pods, "train-b").await;
    let spec = pod.spec.clone().unwrap();
    assert_eq!(gates(&pod), ["ferry.dev/data-ready"], "admitted gated");
    assert!(spec.node_name.is_none(), "not scheduled while the data stages");
    let volume = spec.volumes.iter().flatten().find(|v| v.name == "ferry-on-b").expect("the DataStage's volume");
    let claim = volume.persistent_volume_claim.as_ref().expect("the claim Ferry binds, not a hostPath");
    assert_eq!((claim.claim_name.as_str(), claim.read_only), ("ferry-on-b", Some(true)));
    let mount = spec.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "ferry-on-b").unwrap();
    assert_eq!((mount.mount_path.as_str(), mount.read_only), ("/data", Some(true)));
    let waiting_for_secret = || {
        let train_stages = train_stages.clone();
        async move {
            let status = train_stages.get("on-b").await.ok()?.status?;
            status.conditions.iter().any(|c| c.type_ == "Progressing" && c.reason == "SecretNotFound").then_some(status)
        }
    };
    let status = wait_for(&cluster, "on-b to wait for its Secret", Duration::from_secs(60), waiting_for_secret).await;
    assert_eq!(status.phase, Some(Phase::Pending));
    let says_what_it_waits_for = || {
        let train_pods = train_pods.clone();
        let name = pod.name_any();
        async move {
            let pod = train_pods.get(&name).await.ok()?;
            pod.annotations().get("ferry.dev/waiting-for").is_some_and(|w| w.contains("on-b")).then_some(pod)
        }
    };
    let still =
        wait_for(&cluster, "the pod to say what it waits for", Duration::from_secs(60), says_what_it_waits_for).await;
    assert!(still.spec.as_ref().unwrap().node_name.is_none(), "still unscheduled while the DataStage waits");
    assert_eq!(gates(&still), ["ferry.dev/data-ready"], "still gated");
    create_secret(TRAIN_NS).await;
    job_succeeded(&cluster, &client, TRAIN_NS, "train-b").await;
    let placed = train_pods.get(&pod.name_any()).await.unwrap().spec.unwrap();
    assert_eq!(placed.node_name.as_deref(), Some("node-b"), "placed where the data is");
    assert!(placed.scheduling_gates.unwrap_or_default().is_empty());
    let pin = serde_json::to_value(placed.affinity.unwrap().node_affinity.unwrap()).unwrap();
    assert_eq!(
        pin["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["node-b"])
    );

    // 2. Two DataStages on one pod: each under /data/NAME, on the one node holding both.
    train_stages
        .create(
            &PostParams::default(),
            &datastage(
                "everywhere",
                json!({"source": {"uri": "s3://datasets/extra", "endpoint": s3.endpoint,
                "credentials": {"name": "s3"}}, "destination": {"volume": {"nodeCache": "local"}}}),
            ),
        )
        .await
        .unwrap();
    let template = training_pod_template(
        json!({"ferry.dev/datastage": "everywhere"}),
        json!({"ferry.dev/datastage": "everywhere,on-b"}),
        &["/data/everywhere", "/data/on-b"],
        9,
    );
    train_jobs.create(&PostParams::default(), &job("train-both", template)).await.unwrap();
    let both = job_pod(&cluster, &train_pods, "train-both").await;
    let mounts: Vec<String> = both.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name.starts_with("ferry-"))
        .map(|m| m.mount_path.clone())
        .collect();
    assert_eq!(mounts, ["/data/everywhere", "/data/on-b"]);
    job_succeeded(&cluster, &client, TRAIN_NS, "train-both").await;
    let both = train_pods.get(&both.name_any()).await.unwrap();
    assert_eq!(both.spec.unwrap().node_name.as_deref(), Some("node-b"));

    // A pod with node affinity of its own, onto data on both nodes: its
    // term is narrowed (several nodes go by hostname label), not replaced.
    let mut template = training_pod_template(json!({"ferry.dev/datastage": "everywhere"}), json!({}), &["/data"], 3);
    template["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "ferry.dev/e2e-node", "operator": "Exists"}]}]}}});
    train_jobs.create(&PostParams::default(), &job("train-own-affinity", template)).await.unwrap();
    let own = job_pod(&cluster, &train_pods, "train-own-affinity").await;
    job_succeeded(&cluster, &client, TRAIN_NS, "train-own-affinity").await;
    let own = serde_json::to_value(train_pods.get(&own.name_any()).await.unwrap().spec.unwrap().affinity).unwrap();
    assert_eq!(
        own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([{"key": "ferry.dev/e2e-node", "operator": "Exists"},
               {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a", "node-b"]}])
    );

    // 3. A missing DataStage and a failed one: Warning Events, pods stay gated.
    train_stages
        .create(
            &PostParams::default(),
            &datastage(
                "broken",
                json!({"source": {"uri": "s3://no-such-bucket/x", "endpoint": s3.endpoint,
                "credentials": {"name": "s3"}}, "destination": {"volume": {"nodeCache": "local"}},
                "backoffLimit": 0}),
            ),
        )
        .await
        .unwrap();
    for (name, wants) in [("wants-missing", "nope"), ("wants-broken", "broken")] {
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"ferry.dev/datastage": wants}},
            "spec": training_pod_template(json!({}), json!({}), &["/data"], 0)["spec"]}))
        .unwrap();
        train_pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let missing = pod_warning(&cluster, &client, TRAIN_NS, "wants-missing", "DataStageNotFound").await;
    assert!(missing.contains("nope"), "{missing}");
    let failed = pod_warning(&cluster, &client, TRAIN_NS, "wants-broken", "DataStageFailed").await;
    assert!(failed.contains("broken"), "{failed}");
    for name in ["wants-missing", "wants-broken"] {
        let pod = train_pods.get(name).await.unwrap();
        assert_eq!(gates(&pod), ["ferry.dev/data-ready"], "{name} stays gated");
        assert!(pod.spec.unwrap().node_name.is_none());
        let described = tools.kubectl(&["describe", "pod", name, "-n", TRAIN_NS], None).unwrap();
        assert!(described.contains("ferry.dev/waiting-for") && described.contains("Warning"), "{described}");
        let listed = tools.kubectl(&["get", "pod", name, "-n", TRAIN_NS], None).unwrap();
        assert!(listed.contains("SchedulingGated"), "{listed}");
    }

    // 4. A claim-backed DataStage (its workers run in the namespace, which
    //    enforces restricted too); the pod passes Pod Security and reads it.
    // A local PersistentVolume on node-a: its node affinity, not Ferry,
    // takes the pod there (a shared network volume would let it run anywhere).
    create_claim(&client, DATA_NS, "shared", Some("node-a")).await;
    let ml_stages: Api<DataStage> = Api::namespaced(client.clone(), DATA_NS);
    ml_stages
        .create(
            &PostParams::default(),
            &datastage(
                "shared",
                json!({"source": store,
                "destination": {"volume": {"persistentVolumeClaim": {"claimName": "shared", "subPath": "v1"}}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}}),
            ),
        )
        .await
        .unwrap();
    let ml_jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), DATA_NS);
    let template = training_pod_template(json!({"ferry.dev/datastage": "shared"}), json!({}), &["/data"], 6);
    ml_jobs.create(&PostParams::default(), &job("train-shared", template)).await.unwrap();
    job_succeeded(&cluster, &client, DATA_NS, "train-shared").await;

    // 5. The serving certificate renews and the webhook keeps answering.
    let renewed = wait_for(&cluster, "the serving certificate to be renewed", Duration::from_secs(60), || async {
        serving_cert().await.filter(|c| *c != first_cert)
    })
    .await;
    assert_ne!(renewed, first_cert);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let template = training_pod_template(json!({"ferry.dev/datastage": "on-b"}), json!({}), &["/data"], 6);
    train_jobs.create(&PostParams::default(), &job("after-renewal", template)).await.unwrap();
    job_succeeded(&cluster, &client, TRAIN_NS, "after-renewal").await;

    // 6. No operator answering: labelled pods are refused (failurePolicy
    //    Fail), everything else, and every system namespace, is unaffected.
    tools.kubectl(&["scale", "deployment/ferry-operator", "-n", SYSTEM_NS, "--replicas=0"], None).expect("scale down");
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    wait_for(&cluster, "no operator pods", Duration::from_secs(60), || {
        let operator_pods = operator_pods.clone();
        async move {
            let left = operator_pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=ferry-operator"))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        }
    })
    .await;
    let bare = |name: &str, labels: Value| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": training_pod_template(json!({}), json!({}), &["/data"], 0)["spec"]}))
        .unwrap()
    };
    let refused = train_pods
        .create(&PostParams::default(), &bare("unwired", json!({"ferry.dev/datastage": "on-b"})))
        .await
        .expect_err("a labelled pod is refused while no operator answers");
    assert!(refused.to_string().contains("pods.ferry.dev"), "the refusal names the webhook: {refused}");
    train_pods.create(&PostParams::default(), &bare("unrelated", json!({}))).await.expect("other pods are admitted");
    Api::<Pod>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &bare("system", json!({"ferry.dev/datastage": "on-b"})))
        .await
        .expect("system namespaces never reach the webhook");

    cluster.stop().await;
}

/// The README's quick start, as a new user runs it: its `sh` blocks, in
/// order, through bash with kubectl and helm on the PATH and the store's
/// keys in the environment, in a checkout whose `examples/` differ only in
/// the DataStage's `endpoint` (this test's MinIO; `hack/demo.sh` does the
/// same). The DataStage the README shows is the example's, line for line.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_quick_start_as_written_stages_data_and_a_training_job_reads_it() {
    assert!(
        ferry_e2e::pod_network_routed(),
        "the chart's webhook gates the training pod: run the e2e tests under hack/netns.sh (hack/test.sh does)"
    );
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let quick_start = readme.split("\n## Quick start\n").nth(1).expect("a Quick start section");
    let quick_start = quick_start.split("\n## ").next().unwrap();
    let blocks = |language: &str| -> Vec<String> {
        let fence = format!("```{language}\n");
        quick_start.split(&fence).skip(1).map(|block| block.split("```").next().unwrap().to_owned()).collect()
    };
    let example = std::fs::read_to_string(repo_root().join("examples/datastage-pull.yaml")).unwrap();
    let shown = blocks("yaml").into_iter().next().expect("the DataStage the quick start shows");
    assert!(example.ends_with(&shown), "the README shows examples/datastage-pull.yaml as it is:\n{shown}");
    let script = blocks("sh").concat();
    assert!(script.contains("helm install") && script.contains("job/train"), "{script}");

    // The dataset `demo-v1`, shaped as the demo's.
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    let dataset: BTreeMap<String, Vec<u8>> = [
        ("checkpoints/model-00001.safetensors", pattern(900, (3 << 20) + 7)),
        ("shards/train-00000.tar", pattern(901, 1 << 20)),
        ("shards/train-00001.tar", pattern(902, 12_345)),
        ("images/000/000001.jpg", pattern(903, 64 << 10)),
    ]
    .into_iter()
    .map(|(key, body)| (key.to_owned(), body))
    .collect();
    for (key, body) in &dataset {
        s3.put("datasets", &format!("demo-v1/{key}"), body.clone()).await;
    }
    let checkout = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(chart_dir().parent().unwrap(), checkout.path().join("charts")).unwrap();
    std::fs::create_dir(checkout.path().join("examples")).unwrap();
    let endpoint_line = "endpoint: http://minio.storage.svc:9000";
    assert!(example.contains(endpoint_line), "the example names its endpoint as the test expects");
    let pointed = example.replace(endpoint_line, &format!("endpoint: {}", s3.endpoint));
    std::fs::write(checkout.path().join("examples/datastage-pull.yaml"), pointed).unwrap();
    std::fs::copy(repo_root().join("examples/training-job.yaml"), checkout.path().join("examples/training-job.yaml"))
        .unwrap();

    let cluster = Cluster::start().await.expect("cluster");
    let tools = Tools::new(cluster.kubeconfig());
    let path = [tool_path("kubectl"), tool_path("helm")]
        .iter()
        .map(|tool| tool.parent().unwrap().display().to_string())
        .chain(std::env::var("PATH").ok())
        .collect::<Vec<_>>()
        .join(":");
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(checkout.path())
        .envs(tools.env())
        .env("PATH", path)
        .env("AWS_ACCESS_KEY_ID", &s3.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &s3.secret_key)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the quick start failed:\n{said}\n{}", cluster.diagnostics());
    // The trainer fails on an empty /data: its Job completed (the script's
    // last wait) only if it read what was staged.
    assert!(said.contains("job.batch/train condition met"), "the training Job completed:\n{said}");
    for node in ["node-a", "node-b"] {
        if let Some(dir) = cluster.node_dir(node) {
            assert_eq!(read_tree(&dir.join("mnt/ferry/default/demo-v1")), dataset, "{node}: the dataset byte for byte");
        }
    }
    cluster.stop().await;
}
