#!/usr/bin/env bash
# Fails when `cargo test` would build a dependency with other features than
# `cargo build` does.
#
# Cargo unifies a dependency's features over what one command builds: a
# feature that only a dev-dependency asks for (tokio's `test-util`, say)
# makes the test build resolve a second copy of that crate, and rebuild
# everything above it, which for tokio is the AWS, GCS and Kubernetes
# clients, the engine and every binary (about ten minutes on two cores,
# measured on a clean clone). The fix is to ask for the feature in the
# workspace's own dependency (Cargo.toml says why for each).
#
#   hack/check-features.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# One line per package: "name@version [features];[features]…", each list as
# one build resolves it (a crate built for build scripts and for the target
# can have two).
resolved() {
  cargo tree --quiet --workspace --locked --offline -e "$1" -f '{p} [{f}]' --prefix none \
    | sed -e 's/ (\*)$//' -e 's/ (proc-macro)$//' -e 's/ ([^)]*)\( \[\)/\1/' | sort -u \
    | awk '{ key = $1 "@" $2; list = (key in lists) ? lists[key] ";" $3 : $3; lists[key] = list }
           END { for (key in lists) print key, lists[key] }' | sort
}

# Packages both builds compile, with other features in each.
split="$(join <(resolved normal,build) <(resolved normal,build,dev) \
  | awk '$2 != $3 { print "  " $1 "\n    build: " $2 "\n    test:  " $3 }')"
if [[ -n "$split" ]]; then
  echo "cargo test would rebuild these dependencies with other features than cargo build:" >&2
  echo "$split" >&2
  echo "ask for the test's features in the workspace's own dependency (Cargo.toml)" >&2
  exit 1
fi
