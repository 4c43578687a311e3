#!/usr/bin/env bash
# Many workers, one store that throttles: WORKERS ferry-stager pulls at once
# of one prefix from a MinIO that serves at most MAX_IN_FLIGHT requests at a
# time (MINIO_API_REQUESTS_MAX) and answers the rest with 429
# TooManyRequests, as S3 answers 503 SlowDown per prefix. Each scenario runs
# REPS times; per run: the time until every pull ended, the requests all of
# them sent, how many were retried (here: refused), and how many pulls did
# not complete.
#
#   bench/throttle.sh [scenario ...]     scenario = name:stager-flags, e.g. "rate25:--max-request-rate=25"
#   WORKERS=20 MAX_IN_FLIGHT=16 OBJECTS=120 REPS=3 bench/throttle.sh
#
# Needs a release build (hack/build.sh) and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WORKERS="${WORKERS:-20}" MAX_IN_FLIGHT="${MAX_IN_FLIGHT:-16}" OBJECTS="${OBJECTS:-120}" REPS="${REPS:-3}"
stager="${CARGO_TARGET_DIR:-$PWD/target}/release/ferry-stager"
hack/tools.sh install minio >&2
minio="$(hack/tools.sh path minio)"
scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=("auto:" "fixed8:--concurrency=8" "rate25:--max-request-rate=25")

work="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
export AWS_ACCESS_KEY_ID=ferry-bench AWS_SECRET_ACCESS_KEY=ferry-bench-secret
MINIO_ROOT_USER=$AWS_ACCESS_KEY_ID MINIO_ROOT_PASSWORD=$AWS_SECRET_ACCESS_KEY MINIO_BROWSER=off \
  MINIO_API_REQUESTS_MAX="$MAX_IN_FLIGHT" \
  "$minio" server "$work/data" --address "127.0.0.1:$port" --console-address "127.0.0.1:$((port + 1))" --quiet \
  > "$work/minio.log" 2>&1 &
minio_pid=$!
trap 'kill $minio_pid 2>/dev/null; wait $minio_pid 2>/dev/null; rm -rf "$work"' EXIT
endpoint="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$endpoint/minio/health/cluster" && break; sleep 0.2; done

curl -sf -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$endpoint/shared"

# The dataset: OBJECTS files of 128 KiB and a few bytes, pushed once.
mkdir -p "$work/set"
for i in $(seq -w 1 "$OBJECTS"); do head -c $((131072 + 10#$i)) /dev/urandom > "$work/set/$i"; done
"$stager" --progress never push "$work/set" s3://shared/set --endpoint-url "$endpoint" > /dev/null 2>&1 \
  || { "$stager" --progress never push "$work/set" s3://shared/set --endpoint-url "$endpoint"; exit 1; }

echo "scenario  run  seconds  requests  refused  refused%  incomplete   ($WORKERS pulls, $MAX_IN_FLIGHT requests in flight at the store, $OBJECTS objects each)"
for scenario in "${scenarios[@]}"; do
  name="${scenario%%:*}"
  read -r -a flags <<< "${scenario#*:}"
  for rep in $(seq "$REPS"); do
    rm -rf "$work/out"
    mkdir -p "$work/out"
    started=$(date +%s.%N)
    pids=()
    for w in $(seq "$WORKERS"); do
      "$stager" --progress never pull s3://shared/set "$work/out/$w" --endpoint-url "$endpoint" \
        --summary-file "$work/out/$w.json" "${flags[@]}" > "$work/out/$w.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" || true
    ended=$(date +%s.%N)
    python3 - "$name" "$rep" "$started" "$ended" "$work/out" <<'PY'
import glob, json, sys
name, rep, started, ended, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
requests = retries = incomplete = 0
for path in glob.glob(f"{out}/*.json"):
    summary = json.load(open(path))
    requests += summary.get("requests", 0)
    retries += summary.get("retries", 0)
    incomplete += not summary["complete"]
print(f"{name:9} {rep:>3} {ended - started:8.1f} {requests:9} {retries:8} {100 * retries / max(requests, 1):8.1f}% {incomplete:11}")
PY
  done
done
