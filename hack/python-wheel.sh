#!/usr/bin/env bash
# Builds the `ferry` Python package (python/) into a wheel with the pinned
# maturin, reusing this checkout's target/ (so its Rust dependencies are not
# compiled twice), and prints the wheel's path. hack/test.sh installs it into
# the test environment and bench/run into the benchmark environment.
#
#   hack/python-wheel.sh
#
# A user installs the package with `pip install ./python` instead (see
# README.md); that builds the same wheel in pip's own environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
python="$(hack/tools.sh path python-test)"
out="$CARGO_TARGET_DIR/wheels"
rm -f "$out"/ferry-*.whl
"$(dirname "$python")/maturin" build --release --locked --quiet \
  --manifest-path python/Cargo.toml --interpreter "$python" --out "$out" >&2
ls "$out"/ferry-*.whl
