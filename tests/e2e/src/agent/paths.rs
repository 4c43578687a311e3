//! Container paths become host paths.
//!
//! Processes see this machine's filesystem, so every path a container would
//! see through a volume mount (or its termination-message file) is mapped to
//! a directory of the pod or the node, and arguments and environment values
//! that name such paths are rewritten: `/data/train` with `/data` mounted
//! from hostPath `/mnt/ferry` on node-b becomes `<root>/node-b/mnt/ferry/train`.

use std::path::{Path, PathBuf};

/// One container path and where it lives on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The path inside the container.
    pub container: String,
    /// The host path.
    pub host: PathBuf,
}

/// All mappings of one container.
#[derive(Clone, Debug, Default)]
pub struct PathMap {
    mappings: Vec<Mapping>,
}

impl PathMap {
    /// Adds a mapping; longer container paths win over their parents.
    pub fn add(&mut self, container: &str, host: PathBuf) {
        let container = container.trim_end_matches('/').to_owned();
        self.mappings.push(Mapping { container, host });
        self.mappings.sort_by_key(|m| std::cmp::Reverse(m.container.len()));
    }

    /// The host path for a container path, if it is under a mapping.
    pub fn host_path(&self, path: &str) -> Option<PathBuf> {
        self.mappings.iter().find_map(|m| {
            if path == m.container {
                Some(m.host.clone())
            } else {
                path.strip_prefix(&m.container).and_then(|rest| rest.strip_prefix('/')).map(|rest| m.host.join(rest))
            }
        })
    }

    /// Rewrites a value that is a mapped path, or a `--flag=PATH` with one.
    pub fn translate(&self, value: &str) -> String {
        if let Some(host) = self.host_path(value) {
            return host.display().to_string();
        }
        if value.starts_with('-')
            && let Some((flag, path)) = value.split_once('=')
            && let Some(host) = self.host_path(path)
        {
            return format!("{flag}={}", host.display());
        }
        value.to_owned()
    }
}

/// The host directory that stands for absolute `path` on node `node_root`.
pub fn node_path(node_root: &Path, path: &str) -> PathBuf {
    node_root.join(path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_paths_and_flag_values_are_rewritten() {
        let mut map = PathMap::default();
        map.add("/data", PathBuf::from("/n/b/mnt/ferry"));
        map.add("/data/cache/", PathBuf::from("/n/b/pods/u/cache"));
        assert_eq!(map.translate("/data/train"), "/n/b/mnt/ferry/train");
        assert_eq!(map.translate("/data/cache/x"), "/n/b/pods/u/cache/x");
        assert_eq!(map.translate("--summary-file=/data/s.json"), "--summary-file=/n/b/mnt/ferry/s.json");
        assert_eq!(map.translate("/database"), "/database");
        assert_eq!(map.translate("s3://bucket/data"), "s3://bucket/data");
        assert_eq!(node_path(Path::new("/n/b"), "/mnt/x"), PathBuf::from("/n/b/mnt/x"));
    }
}
