#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs the pinned
# servers the tests talk to (cached after the first run), builds the
# workspace once in release mode, and runs unit and integration tests.
#
#   hack/test.sh [--long] [CARGO ARGUMENTS...] [-- TEST ARGUMENTS...]
#
# CARGO ARGUMENTS select what is compiled and run (`--test e2e`); a filter
# goes after `--` (`hack/test.sh --test e2e -- operator::`), where the test
# binaries see it.
#
# --long runs the long versions of the scenarios that have one (FERRY_LONG=1:
# the full-size scale, soak and fleet runs, the many-DataStage bursts);
# the default run has a small version of each. tests/e2e/README.md lists
# them with their times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# How long the test run may take before it is stopped as hung: the default
# run's tests take 7-9 minutes on two cores, and other machines are slower.
test_limit=35m
if [[ "${1:-}" == --long ]]; then
  shift
  export FERRY_LONG=1
  test_limit=120m
  # Fewer e2e scenarios at once (hack/run-tests.sh): a long scenario keeps
  # a two-core machine busy by itself (the 1,000-DataStage burst holds the
  # API server at 1.5 cores), and five at once starved etcd until an API
  # server the crash waves restarted was not ready within two minutes.
  export FERRY_E2E_JOBS="${FERRY_E2E_JOBS:-3}"
fi
# Arguments before `--` go to cargo, those after it to the test binaries.
cargo_args=() test_args=()
while (($#)) && [[ "$1" != -- ]]; do cargo_args+=("$1"); shift; done
(($#)) && shift
test_args=("$@")

# Build artifacts stay in this checkout's target/: cargo judges freshness by
# paths relative to the workspace and by mtimes, so a target directory
# shared by two checkouts can hand one of them the other's stale artifacts.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

# Where the time goes, in CI's log too: the suite must stay well inside
# CI's limit, and a step that grows shows up here first.
step() { echo "== hack/test.sh: $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }
trap 'step "done, or stopped"' EXIT

# Pinned servers: MinIO, fake-gcs-server, moto, Azurite and the OCI registry
# (with oras, the client tests push artifacts with) for the stores, etcd and
# Kubernetes for e2e, helm and Prometheus for the chart's e2e tests, the
# kubelet, containerd, runc and CNI plugins for the e2e tests' real nodes.
step "tools"
hack/tools.sh install minio fake-gcs-server moto azurite-blob registry oras etcd kube-apiserver helm prometheus python-test \
  kubelet containerd ctr runc cni-plugins busybox
FERRY_MINIO_BIN="$(hack/tools.sh path minio)"
FERRY_FAKE_GCS_SERVER_BIN="$(hack/tools.sh path fake-gcs-server)"
FERRY_MOTO_BIN="$(hack/tools.sh path moto)"
FERRY_AZURITE_BLOB_BIN="$(hack/tools.sh path azurite-blob)"
FERRY_REGISTRY_BIN="$(hack/tools.sh path registry)"
FERRY_ORAS_BIN="$(hack/tools.sh path oras)"
FERRY_OLAH_BIN="$(hack/tools.sh path olah)"
FERRY_HF_BIN="$(hack/tools.sh path hf)"
export FERRY_MINIO_BIN FERRY_FAKE_GCS_SERVER_BIN FERRY_MOTO_BIN FERRY_AZURITE_BLOB_BIN FERRY_REGISTRY_BIN FERRY_ORAS_BIN
export FERRY_OLAH_BIN FERRY_HF_BIN

step "format and features"
cargo fmt --all --check
# cargo test must not rebuild what cargo build built (see the script).
hack/check-features.sh
# e2e tests run the workspace's binaries (operator, stager) as processes:
# build them first, so no test ever runs a stale one. hack/build.sh is the
# build every script makes (the Python extension included), so the demo,
# the images and the Python package find it done. `cargo test` must see the
# environment that build sets for PyO3, or it rebuilds the extension.
export PYO3_BUILD_EXTENSION_MODULE=1
step "build"
# hack/build.sh restores the dependencies an earlier run on this machine
# compiled (hack/target-cache.sh), if any.
hack/build.sh
# The images real nodes run (tests/e2e/tests/e2e/real_nodes.rs), from the
# binaries just built, with the e2e harness's pause and shell images.
step "images"
hack/images.sh --no-build --test-images
# Integration tests move hundreds of MiB through checksums: they run against
# the optimised build, which the demo and benchmarks share.
# Every crate the tests need, dev-dependencies included, is fetched here,
# where the crate registry is reachable: the test run below happens in a
# network namespace with no route out, so it runs --offline and a missing
# crate fails at once with cargo's own message instead of a DNS error.
cargo fetch --locked
# The test binaries are compiled first, outside the limit below: how long
# compiling takes depends on the machine and its caches, and a limit that
# counts it either stops a slow build or lets a hung test run long.
step "compile the tests"
test_binaries="$CARGO_TARGET_DIR/test-binaries.tsv"
cargo test --release --workspace --locked --offline --no-run --message-format=json-render-diagnostics \
  ${cargo_args[@]+"${cargo_args[@]}"} | hack/run-tests.sh --list >"$test_binaries"
hack/target-cache.sh save
# A hung test must fail CI, not stall it (the limit above). hack/netns.sh
# gives the run a network namespace in which pods get addresses the API
# server accepts as endpoints, so it calls the operator's webhook through
# its Service.
# hack/run-tests.sh runs the binaries just compiled, the e2e scenarios each
# in a process of its own beside the others (the script says why), and
# every one even when one fails, as `cargo test --no-fail-fast` would.
step "run the tests"
hack/netns.sh timeout --kill-after=60 "$test_limit" hack/run-tests.sh "$test_binaries" ${test_args[@]+"${test_args[@]}"}
# Examples in doc comments, which `cargo test --no-run` does not compile;
# only for the whole workspace (cargo refuses --doc beside a target).
if ((${#cargo_args[@]} == 0)); then
  cargo test --release --workspace --locked --offline --doc ${test_args[@]+-- "${test_args[@]}"}
fi

# The `ferry` Python package from this checkout, its tests against MinIO
# and fake-gcs-server (python/tests) in the pinned test environment.
step "Python package tests"
python="$(hack/tools.sh path python-test)"
PYTHONPATH="$(hack/python-package.sh "$python")" "$python" -m pytest -q -p no:cacheprovider python/tests

# The benchmark harness in miniature (seconds of data, every tool once), so
# neither Ferry's nor any peer's setup can rot unnoticed.
step "benchmark smoke"
bench_out="$(mktemp -d)"
bench/run --smoke --out "$bench_out"
rm -rf "$bench_out"
