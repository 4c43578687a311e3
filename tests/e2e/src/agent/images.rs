//! Which program a container image stands for.
//!
//! There is no container runtime, so an image is mapped by its repository
//! name (the last path segment, without tag or digest) to a program on this
//! machine: Ferry's own images to the binaries built from this workspace,
//! and one test-only image to `/bin/sh`. Any other image is refused.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The test-only image that runs `/bin/sh` (on a real cluster, set
/// `FERRY_E2E_IMAGE_FERRY_E2E_SHELL` to an image with a shell, e.g. busybox).
pub const SHELL_IMAGE: &str = "ferry-e2e-shell";

/// Image repository name → program.
#[derive(Clone, Debug, Default)]
pub struct ImageMap {
    programs: BTreeMap<String, PathBuf>,
}

impl ImageMap {
    /// Ferry's images mapped to the workspace binaries next to the running
    /// test executable, plus the shell image.
    pub fn workspace() -> Self {
        let mut map = Self::default();
        for binary in ["ferry-stager", "ferry-operator"] {
            map.insert(binary, crate::process::workspace_binary(binary));
        }
        map.insert(SHELL_IMAGE, PathBuf::from("/bin/sh"));
        map
    }

    /// Maps repository `name` to `program`.
    pub fn insert(&mut self, name: &str, program: PathBuf) {
        self.programs.insert(name.to_owned(), program);
    }

    /// The repository name of an image reference:
    /// `ghcr.io/ferry-dev/ferry-stager:0.1.0@sha256:…` → `ferry-stager`.
    pub fn repository_name(image: &str) -> &str {
        let without_digest = image.split('@').next().unwrap_or(image);
        let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
        last.split(':').next().unwrap_or(last)
    }

    /// The program for `image`, or why there is none.
    ///
    /// # Errors
    /// A message naming the image and the images that are known.
    pub fn resolve(&self, image: &str) -> Result<(&str, &PathBuf), String> {
        let name = Self::repository_name(image);
        self.programs.get_key_value(name).map(|(n, p)| (n.as_str(), p)).ok_or_else(|| {
            format!(
                "image '{image}' cannot run here: the node agent runs only {} as processes",
                self.programs.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_ignore_registry_tag_and_digest() {
        assert_eq!(ImageMap::repository_name("ghcr.io/ferry-dev/ferry-stager:0.1.0"), "ferry-stager");
        assert_eq!(ImageMap::repository_name("localhost:5000/ferry-stager@sha256:abc"), "ferry-stager");
        assert_eq!(ImageMap::repository_name("ferry-e2e-shell"), "ferry-e2e-shell");
        let map = ImageMap::workspace();
        assert!(map.resolve("nginx:1.27").unwrap_err().contains("ferry-stager"));
    }
}
