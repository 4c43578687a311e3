#!/usr/bin/env bash
# Lays out the `ferry` Python package from this checkout for tests and
# benchmarks: builds the extension with the workspace (hack/build.sh, the
# build every script shares, so nothing is compiled twice), puts it beside
# python/ferry's Python files in $CARGO_TARGET_DIR/python/, and prints that
# directory for PYTHONPATH.
#
#   PYTHONPATH="$(hack/python-package.sh PYTHON)" PYTHON -c 'import ferry'
#
# PYTHON is the interpreter that will import it (its extension suffix names
# the module). Users install the package with `pip install ./python`
# instead (docs/python.md), which builds a wheel with maturin.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
python="${1:?usage: hack/python-package.sh PYTHON}"
hack/build.sh >&2
out="$CARGO_TARGET_DIR/python"
rm -rf "$out" && mkdir -p "$out/ferry"
cp python/ferry/*.py python/ferry/*.pyi python/ferry/py.typed "$out/ferry/"
suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
cp "$CARGO_TARGET_DIR/release/lib_ferry.so" "$out/ferry/_ferry$suffix"
echo "$out"
