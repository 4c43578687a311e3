//! The Helm chart as the tests install it: the images the node agent (or a
//! real node) runs, and `helm install` of release `ferry` into
//! `ferry-system`.

use std::path::PathBuf;

use ferry_testkit::repo_root;

use crate::Cluster;
use crate::tools::Tools;

/// The release the tests install.
pub const RELEASE: &str = "ferry";
/// Its namespace.
pub const SYSTEM_NS: &str = "ferry-system";
/// The workers' namespace the chart makes for it.
pub const CHART_WORKERS_NS: &str = "ferry-workers";

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/ferry")
}

/// `--set` values for the chart's images: the ones the node agent maps to
/// this workspace's binaries, or `FERRY_E2E_IMAGE_*` on a real cluster.
pub fn image_values() -> Vec<String> {
    let split = |reference: String| -> (String, String) {
        match reference.rfind(':').filter(|at| !reference[*at..].contains('/')) {
            Some(at) => (reference[..at].to_owned(), reference[at + 1..].to_owned()),
            None => (reference, "latest".to_owned()),
        }
    };
    let (operator_repo, operator_tag) = split(crate::image("ferry-operator"));
    let (stager_repo, stager_tag) = split(crate::image("ferry-stager"));
    vec![
        format!("image.repository={operator_repo}"),
        format!("image.tag={operator_tag}"),
        format!("stager.image.repository={stager_repo}"),
        format!("stager.image.tag={stager_tag}"),
    ]
}

/// `--set VALUE` for each of `values`.
pub fn set_args(values: &[String]) -> Vec<String> {
    values.iter().flat_map(|v| ["--set".to_owned(), v.clone()]).collect()
}

/// `helm install` of the chart as [`RELEASE`] in [`SYSTEM_NS`] with
/// `values`, waiting for it; returns the NOTES.
///
/// # Panics
/// When the install fails, with the cluster's diagnostics.
pub fn helm_install(tools: &Tools, cluster: &Cluster, values: &[String]) -> String {
    let chart = chart_dir();
    let mut args: Vec<String> =
        ["install", RELEASE, chart.to_str().unwrap(), "--namespace", SYSTEM_NS, "--wait", "--timeout", "3m"]
            .map(String::from)
            .to_vec();
    args.extend(set_args(values));
    tools
        .helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .unwrap_or_else(|e| panic!("helm install:\n{e}\n{}", cluster.diagnostics()))
}
