#!/usr/bin/env bash
# Builds Ferry's container images on this machine, with no container daemon:
# OCI archives in target/images/ (ferry-operator.oci.tar,
# ferry-stager.oci.tar), each the workspace's release binary on a base of the
# files it needs from this machine's Debian packages (see images/README.md).
# The same tree gives the same digests.
#
#   hack/images.sh [--tag TAG] [--repository-prefix PREFIX] [--test-images] [--no-build]
#
# --tag defaults to the workspace version (the chart's appVersion);
# --repository-prefix to images/images.json's (ghcr.io/ferry-dev/).
# --test-images also builds the e2e harness's own images for real nodes:
# ferry-e2e-pause (the pod sandbox) and ferry-e2e-shell (busybox).
# --no-build packs the release binaries already in target/ (hack/test.sh
# builds the whole workspace first; building two packages alone would
# compile their dependencies again with other features).
# Prints one line per image: archive, manifest digest, size in bytes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

tag="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)" prefix="" test_images=0 build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --repository-prefix) prefix=$2; shift 2 ;;
    --test-images) test_images=1; shift ;;
    --no-build) build=0; shift ;;
    *) sed -n '2,17p' "$0" >&2; exit 2 ;;
  esac
done
out="$CARGO_TARGET_DIR/images"

if [[ "$build" == 1 ]]; then
  hack/build.sh >&2
fi
python3 images/oci_image.py ferry --bin-dir "$CARGO_TARGET_DIR/release" --out "$out" --tag "$tag" \
  ${prefix:+--repository-prefix "$prefix"}

if [[ "$test_images" == 1 ]]; then
  mkdir -p "$out/bin"
  cc -Os -static -o "$out/bin/pause" tests/e2e/images/pause.c
  python3 images/oci_image.py custom --name localhost/ferry-e2e-pause --tag "$tag" --out "$out" \
    --file "$out/bin/pause:/pause" --entrypoint /pause --user 65535:65535
  busybox="$(hack/tools.sh path busybox)"
  # Every busybox applet as /bin/NAME, as busybox --install would.
  applets=()
  for applet in $("$busybox" --list); do
    [[ "$applet" == busybox ]] || applets+=(--symlink "/bin/$applet:busybox")
  done
  python3 images/oci_image.py custom --name localhost/ferry-e2e-shell --tag "$tag" --out "$out" \
    --file "$busybox:/bin/busybox" "${applets[@]}" --entrypoint /bin/sh --user 65532:65532
fi
