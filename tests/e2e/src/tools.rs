//! The command-line tools tests drive a cluster with, as a user would:
//! helm and kubectl from `hack/tools.sh`, with helm's state kept out of the
//! user's home.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ferry_testkit::tool_path;

/// Runs a command-line tool; `Ok(stdout)` on success, `Err(stdout + stderr)`.
pub fn run_tool(program: &Path, args: &[&str], env: &[(&str, &Path)], stdin: Option<&str>) -> Result<String, String> {
    let mut command = Command::new(program);
    command.args(args).stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    if let Some(input) = stdin {
        use std::io::Write as _;
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    let output = child.wait_with_output().expect("wait for the tool");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)))
    }
}

/// helm and kubectl against one cluster, with helm's state in a temporary
/// directory rather than the user's home.
pub struct Tools {
    helm: PathBuf,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Tools {
    /// helm and kubectl from `hack/tools.sh` for the cluster of `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> Self {
        Self {
            helm: tool_path("helm"),
            kubectl: tool_path("kubectl"),
            kubeconfig: kubeconfig.to_owned(),
            home: tempfile::tempdir().expect("helm home"),
        }
    }

    /// The environment both run with.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        let home = self.home.path();
        vec![
            ("KUBECONFIG", self.kubeconfig.clone()),
            ("HELM_CACHE_HOME", home.join("cache")),
            ("HELM_CONFIG_HOME", home.join("config")),
            ("HELM_DATA_HOME", home.join("data")),
        ]
    }

    /// `helm ARGS`: stdout, or stdout and stderr as the error.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        let env = self.env();
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        run_tool(&self.helm, args, &env, None)
    }

    /// `kubectl ARGS` with `stdin`: stdout, or stdout and stderr as the error.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        run_tool(&self.kubectl, args, &[("KUBECONFIG", &self.kubeconfig)], stdin)
    }
}
