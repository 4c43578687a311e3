//! The container images `hack/images.sh` builds (`images/oci_image.py`):
//! what is in them and that the same tree gives the same digests. That
//! they run is `real_nodes.rs`'s part.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_e2e::real_node::images_dir;
use ferry_testkit::repo_root;
use serde_json::Value;

/// Builds Ferry's images from the release binaries into `out`; returns
/// what the script printed (archive, manifest digest, size per line).
fn build_images(out: &Path) -> String {
    let bin_dir = ferry_e2e::workspace_binary("ferry-stager").parent().unwrap().to_path_buf();
    let output = Command::new("python3")
        .arg(repo_root().join("images/oci_image.py"))
        .args(["ferry", "--tag", "test", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run images/oci_image.py");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// One member of a tar archive (`tar -xO`), gunzipped when `gzip`.
fn member(archive: &Path, name: &str, gzip: bool) -> Vec<u8> {
    let output =
        Command::new("tar").arg(if gzip { "-xzOf" } else { "-xOf" }).arg(archive).arg(name).output().expect("run tar");
    assert!(output.status.success(), "{name} in {}: {}", archive.display(), String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

/// The image's manifest and config, and its layers written out to `dir`.
fn open_image(archive: &Path, dir: &Path) -> (Value, Value, Vec<PathBuf>) {
    let blob = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let index = json(&member(archive, "index.json", false));
    let manifest = json(&member(archive, &blob(index["manifests"][0]["digest"].as_str().unwrap()), false));
    let config = json(&member(archive, &blob(manifest["config"]["digest"].as_str().unwrap()), false));
    let layers = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let path = dir.join(format!("layer-{i}.tar.gz"));
            std::fs::write(&path, member(archive, &blob(layer["digest"].as_str().unwrap()), false)).unwrap();
            path
        })
        .collect();
    (manifest, config, layers)
}

#[test]
fn the_images_are_the_same_bytes_when_built_twice_from_one_tree() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let digests = |printed: String| -> Vec<String> {
        printed.lines().map(|l| l.split('\t').nth(1).expect("a digest").to_owned()).collect()
    };
    let (one, two) = (digests(build_images(first.path())), digests(build_images(second.path())));
    assert_eq!(one.len(), 2, "two images");
    assert_eq!(one, two, "the same tree, the same digests");
    for name in ["ferry-operator", "ferry-stager"] {
        let a = std::fs::read(first.path().join(format!("{name}.oci.tar"))).unwrap();
        assert_eq!(a, std::fs::read(second.path().join(format!("{name}.oci.tar"))).unwrap(), "{name}: same archive");
    }
}

#[test]
fn the_stager_image_runs_as_nonroot_with_the_system_ca_bundle_and_the_libraries_it_links() {
    let out = tempfile::tempdir().unwrap();
    build_images(out.path());
    let (manifest, config, layers) = open_image(&out.path().join("ferry-stager.oci.tar"), out.path());
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/usr/local/bin/ferry-stager"]));
    let env: Vec<&str> = config["config"]["Env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert!(env.contains(&"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"), "{env:?}");
    assert!(
        manifest["annotations"]["dev.ferry.image.base-packages"].as_str().unwrap().contains("libc6="),
        "the base records the Debian packages it came from"
    );
    // HTTPS stores need the system's CA bundle, byte for byte.
    let bundle = member(&layers[0], "etc/ssl/certs/ca-certificates.crt", true);
    assert_eq!(bundle, std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap());
    // Every library the binary links is in the base layer.
    let listing = Command::new("tar").arg("-tzf").arg(&layers[0]).output().unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let binary = ferry_e2e::workspace_binary("ferry-stager");
    let ldd = String::from_utf8(Command::new("ldd").arg(&binary).output().unwrap().stdout).unwrap();
    for library in ldd.lines().filter_map(|l| l.split("=>").nth(1).or(Some(l))?.split_whitespace().next()) {
        if library.starts_with('/') {
            assert!(listing.lines().any(|entry| format!("/{entry}") == library), "{library} is not in the image");
        }
    }
    let program = Command::new("tar").arg("-tzf").arg(&layers[1]).output().unwrap();
    assert_eq!(String::from_utf8(program.stdout).unwrap().lines().last(), Some("usr/local/bin/ferry-stager"));
}

#[test]
fn the_test_images_the_real_nodes_import_were_built() {
    // hack/test.sh builds them before the tests (hack/images.sh --test-images).
    let archives = ferry_e2e::real_node::image_archives().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(archives.len(), 4);
    assert!(archives.iter().all(|a| a.starts_with(images_dir())));
}
