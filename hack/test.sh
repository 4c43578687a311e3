#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs the pinned
# servers the tests talk to (cached after the first run), builds the
# workspace once in release mode, and runs unit and integration tests.
#
#   hack/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache="${FERRY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}"
# Keep build artifacts in the cache so a fresh clone on the same machine
# does not rebuild the AWS SDK from scratch.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"

# Pinned servers: MinIO and moto for the stager, etcd and Kubernetes for e2e.
hack/tools.sh install minio moto etcd kube-apiserver
FERRY_MINIO_BIN="$(hack/tools.sh path minio)"
FERRY_MOTO_BIN="$(hack/tools.sh path moto)"
export FERRY_MINIO_BIN FERRY_MOTO_BIN

cargo fmt --all --check
# e2e tests run the workspace's binaries (operator, stager) as processes:
# build them first, so no test ever runs a stale one.
cargo build --release --workspace --locked --bins
# Integration tests move hundreds of MiB through checksums: they run against
# the optimised build, which the demo and benchmarks share.
# A hung test must fail CI, not stall it.
timeout --kill-after=60 45m cargo test --release --workspace --locked "$@"
