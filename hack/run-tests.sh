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
# beside the other binaries, two at a time, which keep libtest's default of
# one thread per CPU. Inside it, each scenario runs in a process of its
# own, FERRY_E2E_JOBS (5) at a time, the longest first: libtest starts its
# tests in name order, so a long scenario that sorts late (real_nodes, four
# minutes) ran alone at the end while the other threads sat idle. How long
# each scenario took is read from the last run on this machine
# ($CARGO_TARGET_DIR/e2e-seconds.tsv) or, on a clean clone, from the figures
# checked in beside the tests (tests/e2e/scenario-seconds.tsv); a scenario in
# neither starts first, as the one most likely being worked on.
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

# How many e2e scenarios run at once (FERRY_E2E_JOBS overrides it), and
# the seconds each took, by the last run here and as checked in.
e2e_jobs="${FERRY_E2E_JOBS:-5}"
e2e_threads="${FERRY_E2E_TEST_THREADS:-4}"
# How many of the other test binaries run at once (FERRY_TEST_BINARY_JOBS
# overrides it; see binary_pool).
binary_jobs="${FERRY_TEST_BINARY_JOBS:-2}"
e2e_seconds="${CARGO_TARGET_DIR:-target}/e2e-seconds.tsv"
e2e_seconds_checked_in="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/e2e/scenario-seconds.tsv"

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# Stopped as hung (hack/test.sh's timeout): what the runs beside had printed,
# and the output of every e2e scenario that had not finished, say where
# they hung.
stopped() {
  local log name
  cat "$logs"/*.log "$logs"/binaries/*.log 2>/dev/null
  for log in "$logs"/e2e/*.log; do
    [[ -e "$log" ]] || continue
    name=${log##*/} name=${name%.log}
    cut -f1 "$logs/e2e-results.tsv" 2>/dev/null | grep -qxF "$name" && continue
    echo "== run-tests.sh: e2e $name had not finished; its output:"
    cat "$log"
  done
  exit 124
}
trap stopped TERM INT
failed=()

# in_package DIRECTORY EXECUTABLE [ARGUMENTS...]: runs a test binary as
# cargo runs it, from its package's directory with CARGO_MANIFEST_DIR set.
in_package() {
  local directory=$1
  shift
  (cd "$directory" && CARGO_MANIFEST_DIR="$directory" "$@" </dev/null)
}

# measured TIMES COMMAND...: runs COMMAND under bash's `time`, which writes
# the CPU seconds (user and system) that it and the processes it waited for
# used to the file TIMES; returns COMMAND's status. With binaries and
# scenarios side by side on two cores, wall seconds measure the machine as
# much as the test, CPU seconds what it costs. `time` runs in a subshell of
# its own: in the caller's shell it would also count a run beside that
# happened to end meanwhile (bash reaps it in passing).
measured() {
  local times=$1
  shift
  (TIMEFORMAT='%3U %3S' && time "$@" 2>&3 3>&-) 3>&2 2>"$times"
}

# cpu_seconds FILE: user plus system seconds from what `measured` wrote.
cpu_seconds() {
  awk 'END { printf "%.0f", $1 + $2 }' "$1"
}

# timed LABEL COMMAND...: runs COMMAND, prints how long it took and the CPU
# seconds it used.
timed() {
  local label=$1 start=$SECONDS status=0 times
  shift
  times=$(mktemp "$logs/times.XXXXXX")
  measured "$times" "$@" || status=$?
  echo "== run-tests.sh: $label: $((SECONDS - start)) s, $(cpu_seconds "$times") CPU s, exit $status"
  return "$status"
}

# run LABEL EXECUTABLE DIRECTORY [ARGUMENTS...]: one test binary, timed.
run() {
  local label=$1 executable=$2 directory=$3
  shift 3
  timed "$label" in_package "$directory" "$executable" "$@"
}

# wait_for_slot JOBS: returns once fewer than JOBS of this shell's
# background jobs run (a pool's next one may start).
wait_for_slot() {
  while (($(jobs -rp | wc -l) >= $1)); do wait -n || true; done
}

# run_beside LABEL COMMAND...: COMMAND in the background, its output kept
# until the end.
beside=()
run_beside() {
  local label=$1
  shift
  "$@" >"$logs/${#beside[@]}.log" 2>&1 &
  beside+=("$!:$label")
}

# e2e_pool EXECUTABLE DIRECTORY: every e2e scenario not marked #[ignore] in
# a process of its own, $e2e_jobs at a time, the longest first; prints one
# line per scenario, longest first, and the whole output of those that
# failed. Records the seconds each took in $e2e_seconds. The CPU seconds
# are those of the scenario's process and of the servers and pods it
# started and waited for (a real node's containers run under containerd's
# shims, which detach from it).
e2e_pool() {
  local executable=$1 directory=$2 results="$logs/e2e-results.tsv" name
  local -a order
  mkdir -p "$logs/e2e"
  : >"$results"
  # Names (libtest's terse list) less the ignored ones, with the seconds
  # recorded for each (none: first), the longest first.
  local seconds=/dev/null
  if [[ -s "$e2e_seconds" ]]; then
    seconds=$e2e_seconds
  elif [[ -s "$e2e_seconds_checked_in" ]]; then
    seconds=$e2e_seconds_checked_in
  fi
  mapfile -t order < <(
    cd "$directory"
    "$executable" --list --format terse --ignored | sed -n 's/: test$//p' >"$logs/e2e-ignored"
    "$executable" --list --format terse | sed -n 's/: test$//p' | grep -vxFf "$logs/e2e-ignored" |
      awk -F'\t' 'FILENAME != "-" { s[$1] = $2; next }
                  { print (($0 in s) ? s[$0] : 1e9) "\t" $0 }' "$seconds" - |
      sort -t$'\t' -k1,1gr | cut -f2
  )
  for name in "${order[@]}"; do
    wait_for_slot "$e2e_jobs"
    (
      start=$SECONDS status=0
      measured "$logs/e2e/$name.times" in_package "$directory" "$executable" --exact "$name" \
        >"$logs/e2e/$name.log" 2>&1 || status=$?
      printf '%s\t%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$status" \
        "$(cpu_seconds "$logs/e2e/$name.times")" >>"$results"
    ) &
  done
  wait
  sort -t$'\t' -k2,2nr "$results" | while IFS=$'\t' read -r name seconds status cpu; do
    echo "== run-tests.sh: e2e $name: $seconds s, $cpu CPU s, exit $status"
  done
  cut -f1,2 "$results" >"$e2e_seconds.new" && mv "$e2e_seconds.new" "$e2e_seconds"
  local -a failures
  mapfile -t failures < <(awk -F'\t' '$3 != 0 { print $1 }' "$results")
  for name in ${failures[@]+"${failures[@]}"}; do
    echo "== run-tests.sh: e2e $name failed; its output:"
    cat "$logs/e2e/$name.log"
  done
  ((${#failures[@]} == 0))
}

# binary_pool LIST [TEST ARGUMENTS...]: every test binary but e2e,
# $binary_jobs at a time, in the list's order; then each one's output and
# line in that order. Names those that failed in $logs/failed. Two at a
# time because the engine's unit tests spend most of their time waiting
# (peers' deadlines, a throttling store, a memory test: 248 s, 101 CPU s),
# and one after another with the stager's suite (313 s, 281 CPU s) they
# ended 80 s after the e2e scenarios. Whatever the list's order, the two
# long ones overlap: the short ones pass through the other slot. Run in a
# subshell of its own, so that `jobs` counts only its binaries.
binary_pool() {
  local list=$1 executable directory name
  shift
  local -a names=()
  mkdir -p "$logs/binaries"
  while IFS=$'\t' read -r executable directory name; do
    [[ "$name" == e2e ]] && continue
    names+=("$name")
    wait_for_slot "$binary_jobs"
    run "$name (${directory##*/})" "$executable" "$directory" "$@" >"$logs/binaries/$name.log" 2>&1 ||
      echo "$name" >>"$logs/failed" &
  done <"$list"
  wait
  for name in ${names[@]+"${names[@]}"}; do
    cat "$logs/binaries/$name.log"
  done
}

while IFS=$'\t' read -r executable directory name; do
  [[ "$name" == e2e ]] || continue
  if (($#)); then
    # A filter of the caller's: one process, as cargo would run it, with
    # the caller's --test-threads if they gave one (libtest refuses two).
    threads=(--test-threads "$e2e_threads")
    [[ " $* " == *" --test-threads"* ]] && threads=()
    run_beside e2e run e2e "$executable" "$directory" ${threads[@]+"${threads[@]}"} "$@"
  else
    run_beside e2e timed e2e e2e_pool "$executable" "$directory"
  fi
done <"$list"

# The other binaries, two at a time, in the list's order (see
# binary_pool).
(binary_pool "$list" "$@")
[[ -s "$logs/failed" ]] && mapfile -t -O "${#failed[@]}" failed <"$logs/failed"

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
