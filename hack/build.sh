#!/usr/bin/env bash
# The one release build of Ferry that every script uses: the demo, the e2e
# cluster, the images, the Python package, the benchmarks and the tests.
#
#   hack/build.sh [extra cargo build arguments]
#
# Cargo resolves a dependency's features over the packages one command
# selects, so `cargo build -p ferry-stager` and `cargo build --workspace`
# compile the AWS, GCS and Kubernetes clients twice, with different
# features, into different artifacts (minutes each on two cores). Building
# the same selection everywhere means the second script finds everything
# built by the first. The environment matters as much as the selection:
# PyO3's build script reads PYO3_BUILD_EXTENSION_MODULE, so it is set here
# and by hack/test.sh for `cargo test`, which must reuse this build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# An extension module does not link libpython: the interpreter loading it
# provides it (what maturin sets for PyO3 as well).
export PYO3_BUILD_EXTENSION_MODULE=1
# The dependencies compiled by an earlier run on this machine, if any
# (hack/target-cache.sh, which hack/test.sh fills; it says why Ferry's own
# crates always compile anew): whichever script builds first in a clean
# clone, the demo included, then compiles only the workspace.
hack/target-cache.sh restore
exec cargo build --release --workspace --locked --bins --lib "$@"
