#!/usr/bin/env bash
# Runs the test binaries `cargo test --no-run` compiled, each with the number
# of test threads that suits it, and prints how long each one took.
#
#   hack/run-tests.sh LIST [TEST ARGUMENTS...]
#
# LIST is what `hack/run-tests.sh --list` makes of the JSON messages of
# `cargo test --no-run --message-format=json-render-diagnostics` on its
# standard input: one line per test binary, "executable<TAB>package
# directory<TAB>target name". TEST ARGUMENTS (a filter, --ignored, …) go to
# every binary, as after `cargo test --`.
#
# Why not `cargo test`: it runs the binaries one after another with one
# `--test-threads` for all. The merged e2e binary spends most of its time
# waiting (control planes starting, pods scheduled, kubelets syncing: on two
# cores the CPUs sit 55-80 % idle during it), so it starts first and runs
# beside the other binaries, which are CPU-bound and keep libtest's default
# of one thread per CPU. Inside it, the real-node scenario (the longest, about
# four minutes) runs in a process of its own from the start, and the rest
# four at a time. Measured on two cores: e2e 845 s at two threads, 547 s at
# four with the real-node scenario among the rest; the whole test run
# 9.2-9.6 minutes this way instead of 18.7 under `cargo test`.
#
# Like `cargo test --no-fail-fast`, every binary runs even when one fails;
# the exit status is non-zero if any did. Each binary runs from its
# package's directory with CARGO_MANIFEST_DIR set, as cargo runs it.
set -euo pipefail

if [[ "${1:-}" == --list ]]; then
  python3 -c '
import json, os, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message["profile"]["test"] and message.get("executable"):
        directory = os.path.dirname(message["manifest_path"])
        print(message["executable"], directory, message["target"]["name"], sep="\t")
'
  exit 0
fi

list="$1"
shift

# The e2e binary's test threads (FERRY_E2E_TEST_THREADS overrides them), and
# the scenario that runs in a process of its own beside the rest.
e2e_threads="${FERRY_E2E_TEST_THREADS:-4}"
e2e_alone="real_nodes::"

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# Stopped as hung (hack/test.sh's timeout): what the runs beside had printed
# is what says where they hung.
trap 'cat "$logs"/*.log 2>/dev/null; exit 124' TERM INT
failed=()

# run LABEL EXECUTABLE DIRECTORY [ARGUMENTS...]: runs one test binary from
# its package's directory, prints how long it took.
run() {
  local label=$1 executable=$2 directory=$3 start status=0
  shift 3
  start=$SECONDS
  (cd "$directory" && CARGO_MANIFEST_DIR="$directory" "$executable" "$@" </dev/null) || status=$?
  echo "== run-tests.sh: $label: $((SECONDS - start)) s, exit $status"
  return "$status"
}

# run_beside LABEL EXECUTABLE DIRECTORY [ARGUMENTS...]: the same in the
# background, its output kept until the end.
beside=()
run_beside() {
  run "$@" >"$logs/${#beside[@]}.log" 2>&1 &
  beside+=("$!:$1")
}

while IFS=$'\t' read -r executable directory name; do
  [[ "$name" == e2e ]] || continue
  if (($#)); then
    # A filter of the caller's: one process, as cargo would run it, with
    # the caller's --test-threads if they gave one (libtest refuses two).
    threads=(--test-threads "$e2e_threads")
    [[ " $* " == *" --test-threads"* ]] && threads=()
    run_beside e2e "$executable" "$directory" ${threads[@]+"${threads[@]}"} "$@"
  else
    run_beside "e2e $e2e_alone" "$executable" "$directory" "$e2e_alone"
    run_beside "e2e, the rest" "$executable" "$directory" --test-threads "$e2e_threads" --skip "$e2e_alone"
  fi
done <"$list"

while IFS=$'\t' read -r executable directory name; do
  [[ "$name" == e2e ]] && continue
  run "$name (${directory##*/})" "$executable" "$directory" "$@" || failed+=("$name")
done <"$list"

# The runs beside, their output whole after the others', as cargo's reads.
for i in "${!beside[@]}"; do
  pid=${beside[$i]%%:*} label=${beside[$i]#*:}
  status=0
  wait "$pid" || status=$?
  cat "$logs/$i.log"
  [[ $status == 0 ]] || failed+=("$label")
done

if ((${#failed[@]})); then
  echo "== run-tests.sh: failed: ${failed[*]}" >&2
  exit 1
fi
