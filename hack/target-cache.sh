#!/usr/bin/env bash
# Keeps the compiled dependencies of the release build in the tool cache, so
# that a clean clone on a machine that built Ferry before compiles only
# Ferry's own crates.
#
#   hack/target-cache.sh restore   into an empty $CARGO_TARGET_DIR/release
#   hack/target-cache.sh save      after a build and the tests' build
#
# Only dependencies travel, never Ferry's crates. Cargo decides that one of
# the workspace's crates is fresh by comparing its sources' mtimes with its
# last build; a checkout whose files are older than the cached build (an old
# checkout with its target/ removed) would take another commit's artifacts
# as its own. Dependencies carry no such risk: a registry crate's source is
# fixed by its version and checksum, and cargo's fingerprint of it (rustc,
# features, profile, its own dependencies) decides whether the cached
# artifact fits. The entry is keyed by the toolchain and Cargo.lock only to
# keep the cache from growing: a changed lockfile starts a new entry, and the
# previous ones are removed.
#
# Without this cache (a fresh machine, or FERRY_TARGET_CACHE=0) the build is
# the same, only longer.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
here="$PWD"
target="${CARGO_TARGET_DIR:-$PWD/target}"
cache="${FERRY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}/cargo-target"
log() { echo "target-cache.sh: $*" >&2; }
[[ "${FERRY_TARGET_CACHE:-1}" == 0 ]] && { log "off (FERRY_TARGET_CACHE=0)"; exit 0; }

key="$( (rustc -vV; cargo -V; cat "$here/Cargo.lock") | sha256sum | cut -c1-16)"
entry="$cache/$key"

# The names of the workspace's packages and of their targets (a binary, a
# test, the Python extension), as cargo names their artifacts: with `_` for
# `-`, as in deps/libferry_engine-<hash>.rlib and deps/e2e-<hash>.
workspace_names() {
  cargo metadata --no-deps --format-version 1 --locked --offline | python3 -c '
import json, sys
names = set()
for package in json.load(sys.stdin)["packages"]:
    names.add(package["name"])
    names.update(target["name"] for target in package["targets"])
for name in sorted(names):
    print(name)
    print(name.replace("-", "_"))'
}

# Removes every artifact of a workspace crate below DIR (a release directory).
strip_workspace() {
  local dir=$1 name
  while read -r name; do
    rm -rf "$dir/.fingerprint/$name"-* "$dir/build/$name"-* \
      "$dir/deps/$name"-* "$dir/deps/lib$name"-* "$dir/deps/$name".* "$dir/deps/lib$name".*
  done < <(workspace_names)
}

case "${1:-}" in
  restore)
    if [[ -e "$target/release/.fingerprint" ]]; then
      log "$target/release already holds a build; cargo reuses that"
    elif [[ -d "$entry/release" ]]; then
      mkdir -p "$target"
      cp -a --reflink=auto "$entry/release" "$target/release"
      log "restored the dependencies' build $key ($(du -sh "$entry" | cut -f1))"
    else
      log "no cached build for $key: everything compiles"
    fi
    ;;
  save)
    [[ -d "$target/release/.fingerprint" ]] || { log "nothing built in $target/release"; exit 0; }
    mkdir -p "$cache"
    rm -rf "$cache/.partial"
    mkdir -p "$cache/.partial/release"
    cp -a --reflink=auto "$target/release/.fingerprint" "$target/release/build" "$target/release/deps" \
      "$cache/.partial/release/"
    strip_workspace "$cache/.partial/release"
    # One entry: older ones belong to other lockfiles or toolchains.
    find "$cache" -mindepth 1 -maxdepth 1 ! -name .partial -exec rm -rf {} +
    mv "$cache/.partial" "$entry"
    log "saved the dependencies' build as $key ($(du -sh "$entry" | cut -f1))"
    ;;
  *)
    sed -n '2,8p' "$0" >&2
    exit 2
    ;;
esac
