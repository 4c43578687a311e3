#!/usr/bin/env bash
# Ferry's main job, end to end on one machine, with nothing but this repo:
# brings up a real Kubernetes control plane with two nodes (process-running,
# or with --real-nodes real kubelets running Ferry's images; tests/e2e), a
# local MinIO with a sample dataset, and Ferry installed with its Helm chart
# (the operator runs as a pod under the chart's RBAC); applies
# examples/datastage-pull.yaml (and, on real nodes, examples/training-job.yaml,
# whose pod waits for the data, then runs where it is); watches the
# DataStage progress to Ready; shows that each node's disk holds the dataset
# byte for byte; and tears everything down. Pinned servers are built into the cache on the
# first run (about 20 minutes on 2 cores); later runs take about a minute.
#
#   hack/demo.sh                # FERRY_DEMO_KEEP=1 keeps the staged data
#   hack/demo.sh --real-nodes   # the same on real nodes: kubelet, containerd and
#                               # runc run the images hack/images.sh builds
#                               # (needs root; a few minutes more on a cold machine)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

real_nodes=0
[[ "${1:-}" == --real-nodes ]] && real_nodes=1
# In a network namespace of the demo's own (hack/netns.sh, where it can:
# root): pods get addresses the API server accepts as endpoints, so it
# calls Ferry's webhooks behind their Service, and real nodes' pods reach
# MinIO through an address there, where the pod bridges live too.
if [[ "${FERRY_IN_NETNS:-}" != 1 && "${FERRY_DEMO_NETNS_TRIED:-}" != 1 ]]; then
  export FERRY_DEMO_NETNS_TRIED=1
  exec hack/netns.sh "$0" "$@"
fi
if [[ "$real_nodes" == 1 && "${FERRY_IN_NETNS:-}" != 1 ]]; then
  echo "hack/demo.sh --real-nodes needs root (a network namespace and the kubelet)" >&2
  exit 1
fi
# Without one, pods have loopback addresses the API server cannot call:
# the webhooks stay off, and the operator judges DataStages by itself.
webhook_values=()
[[ "${FERRY_IN_NETNS:-}" != 1 ]] && webhook_values=(--set webhook.enabled=false)

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "Installing pinned MinIO, etcd, Kubernetes and helm (cached) and building Ferry"
hack/tools.sh install minio etcd kube-apiserver kubectl helm
minio="$(hack/tools.sh path minio)"
kubectl="$(hack/tools.sh path kubectl)"
helm="$(hack/tools.sh path helm)"
hack/build.sh
bin="$CARGO_TARGET_DIR/release"
stager="$bin/ferry-stager"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
if [[ "$real_nodes" == 1 ]]; then
  say "Installing the kubelet, containerd, runc and CNI plugins (cached) and building the images"
  hack/tools.sh install kubelet containerd ctr runc cni-plugins busybox
  hack/images.sh --no-build --test-images
  listen=10.250.0.1 shell_image="localhost/ferry-e2e-shell:$version"
  image_values=()   # the chart's defaults name the images just built
else
  listen=127.0.0.1 shell_image=""
  # The node agents map the images ferry-operator:dev and ferry-stager:dev
  # to this checkout's binaries.
  image_values=(--set image.tag=dev --set stager.image.tag=dev)
fi

work="$(mktemp -d -t ferry-demo.XXXXXX)"
# helm keeps its caches and repository list with the demo, not in $HOME.
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data"
minio_pid="" cluster_pid=""
cleanup() {
  for pid in $cluster_pid $minio_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ "${FERRY_DEMO_KEEP:-0}" == 1 ]]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("'"$listen"'", 0)); print(s.getsockname()[1])')"
export AWS_ACCESS_KEY_ID=ferry-demo AWS_SECRET_ACCESS_KEY=ferry-demo-secret AWS_REGION=us-east-1
export FERRY_ENDPOINT_URL="http://$listen:$port"

say "Starting MinIO on $FERRY_ENDPOINT_URL"
MINIO_ROOT_USER="$AWS_ACCESS_KEY_ID" MINIO_ROOT_PASSWORD="$AWS_SECRET_ACCESS_KEY" MINIO_BROWSER=off \
  "$minio" server "$work/minio" --address "$listen:$port" --console-address "127.0.0.1:0" --quiet \
  >"$work/minio.log" 2>&1 &
minio_pid=$!
for _ in $(seq 1 600); do
  curl -fs "$FERRY_ENDPOINT_URL/minio/health/cluster" >/dev/null && break
  kill -0 "$minio_pid" 2>/dev/null || { cat "$work/minio.log"; exit 1; }
  sleep 0.1
done
curl -fs "$FERRY_ENDPOINT_URL/minio/health/cluster" >/dev/null || { echo "MinIO did not become healthy"; exit 1; }
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

say "Starting a Kubernetes control plane with nodes node-a and node-b"
node_kind=()
[[ "$real_nodes" == 1 ]] && node_kind=(--real-nodes)
"$bin/ferry-cluster" up --dir "$work/cluster" --ready-file "$work/kubeconfig-path" "${node_kind[@]}" >"$work/cluster.log" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 1800); do
  [[ -s "$work/kubeconfig-path" ]] && break
  kill -0 "$cluster_pid" 2>/dev/null || { tail -40 "$work/cluster.log"; exit 1; }
  sleep 0.1
done
export KUBECONFIG="$(cat "$work/kubeconfig-path")"
"$kubectl" get nodes

say "helm install ferry charts/ferry (CRD, operator Deployment, RBAC, metrics Service)"
"$helm" install ferry charts/ferry --namespace ferry-system --create-namespace --wait --timeout 3m \
  "${image_values[@]}" "${webhook_values[@]}" --set dataStageNamespaces='{default}' \
  --set nodeCaches[0].name=local --set nodeCaches[0].root=/mnt/ferry
"$kubectl" -n ferry-system get pods -o wide
"$kubectl" create secret generic s3 \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY"

say "kubectl apply -f examples/datastage-pull.yaml (endpoint pointed at the local MinIO)"
sed "s#http://minio.storage.svc:9000#$FERRY_ENDPOINT_URL#" examples/datastage-pull.yaml | "$kubectl" apply -f -
# The webhook that holds a training pod is called through its Service, which
# needs pod addresses the API server accepts: the real nodes' network.
if [[ "$real_nodes" == 1 ]]; then
  say "kubectl apply -f examples/training-job.yaml: its pod waits, gated, until the data is on a node"
  sed "s#ghcr.io/ferry-dev/ferry-e2e-shell:dev#$shell_image#" examples/training-job.yaml | "$kubectl" apply -f -
fi
timeout 300 "$kubectl" get dstage -w &
watch_pid=$!
"$kubectl" wait --for=condition=Ready dstage/demo-v1 --timeout=300s >/dev/null
sleep 1; kill "$watch_pid" 2>/dev/null || true; wait "$watch_pid" 2>/dev/null || true
echo
"$kubectl" get dstage demo-v1 -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'

if [[ "$real_nodes" == 1 ]]; then
  say "The training Job ran where the data is and read it"
  "$kubectl" wait --for=condition=Complete job/train --timeout=180s >/dev/null
  "$kubectl" get pods -l batch.kubernetes.io/job-name=train -o wide
  "$kubectl" logs job/train | tail -3
fi

say "Verifying: each node's local disk holds the dataset, byte for byte"
for node in node-a node-b; do
  dir="$work/cluster/nodes/$node/mnt/ferry/default/demo-v1"
  diff -r --exclude=.ferry "$work/sample" "$dir" >/dev/null
  echo "$node: NodeCache local, /mnt/ferry/default/demo-v1 = $dir: identical, $(find "$dir" -path '*/.ferry' -prune -o -type f -print | wc -l) files"
done

say "Done; tearing down (FERRY_DEMO_KEEP=1 keeps $work)"
