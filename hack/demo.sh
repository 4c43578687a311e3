#!/usr/bin/env bash
# Ferry's main job, end to end on one machine, with nothing but this repo:
# starts a local MinIO (pinned, installed into the cache on first run),
# creates a sample dataset in it, stages it onto a "node-local" directory
# with ferry-stager, verifies it byte for byte, shows that a re-run reuses
# what is already staged, and tears everything down.
#
#   hack/demo.sh            # FERRY_DEMO_KEEP=1 keeps the staged data
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache="${FERRY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "Installing pinned MinIO (cached) and building ferry-stager"
hack/tools.sh install minio
minio="$(hack/tools.sh path minio)"
cargo build --release --locked -p ferry-stager
stager="$CARGO_TARGET_DIR/release/ferry-stager"

work="$(mktemp -d -t ferry-demo.XXXXXX)"
minio_pid=""
cleanup() {
  if [[ -n "$minio_pid" ]]; then kill "$minio_pid" 2>/dev/null || true; wait "$minio_pid" 2>/dev/null || true; fi
  if [[ "${FERRY_DEMO_KEEP:-0}" == 1 ]]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export AWS_ACCESS_KEY_ID=ferry-demo AWS_SECRET_ACCESS_KEY=ferry-demo-secret AWS_REGION=us-east-1
export FERRY_ENDPOINT_URL="http://127.0.0.1:$port"

say "Starting MinIO on $FERRY_ENDPOINT_URL"
MINIO_ROOT_USER="$AWS_ACCESS_KEY_ID" MINIO_ROOT_PASSWORD="$AWS_SECRET_ACCESS_KEY" MINIO_BROWSER=off \
  "$minio" server "$work/minio" --address "127.0.0.1:$port" --console-address "127.0.0.1:0" --quiet \
  >"$work/minio.log" 2>&1 &
minio_pid=$!
for _ in $(seq 1 600); do
  curl -fs "$FERRY_ENDPOINT_URL/minio/health/live" >/dev/null && break
  kill -0 "$minio_pid" 2>/dev/null || { cat "$work/minio.log"; exit 1; }
  sleep 0.1
done
curl -fs "$FERRY_ENDPOINT_URL/minio/health/live" >/dev/null || { echo "MinIO did not become healthy"; exit 1; }
curl -fsS --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -X PUT "$FERRY_ENDPOINT_URL/datasets" >/dev/null

say "Creating a sample dataset (1 x 256 MiB, 16 x 8 MiB, 1000 x 64 KiB) and uploading it"
python3 - "$work/sample" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(42)
def write(rel, size):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        while size > 0:
            n = min(size, 1 << 20)
            f.write(rng.randbytes(n))
            size -= n
write("checkpoints/model-00001.safetensors", 256 << 20)
for i in range(16):
    write(f"shards/train-{i:05}.tar", 8 << 20)
for i in range(1000):
    write(f"images/{i // 100:03}/{i:06}.jpg", 64 << 10)
PY
"$stager" push "$work/sample" s3://datasets/demo-v1

say "Staging s3://datasets/demo-v1 onto the node-local directory $work/node-local/demo-v1"
"$stager" pull s3://datasets/demo-v1 "$work/node-local/demo-v1" --progress always \
  --summary-file "$work/summary.json"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps({k: s[k] for k in ("complete","objects","bytes","verified","seconds","throughput_bytes_per_second","peak_rss_bytes")}, indent=2))' "$work/summary.json"

say "Verifying: staged data is byte-identical to the source"
diff -r --exclude=.ferry "$work/sample" "$work/node-local/demo-v1" && echo "identical: $(find "$work/node-local/demo-v1" -path '*/.ferry' -prune -o -type f -print | wc -l) files, $(du -sh --exclude=.ferry "$work/node-local/demo-v1" | cut -f1)"

say "Staging again: everything is already in place, nothing is transferred"
"$stager" pull s3://datasets/demo-v1 "$work/node-local/demo-v1"

say "Data landed in $work/node-local/demo-v1 (removed on exit unless FERRY_DEMO_KEEP=1)"
