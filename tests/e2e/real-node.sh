#!/usr/bin/env bash
# One real node of the e2e harness: containerd (with runc and the CNI
# plugins) and the kubelet, in a mount namespace of their own in which the
# node's disk ($FERRY_DISK_DIR/mnt) is /mnt, so two nodes on one machine
# each have their own hostPaths. Started by tests/e2e/src/real_node.rs,
# which writes the configuration files into RUNTIME_DIR; runs until killed.
#
#   unshare -m --propagation private real-node.sh RUNTIME_DIR CGROUP [KUBELET_FLAG...]
#
# Environment: FERRY_CONTAINERD_BIN, FERRY_CTR_BIN, FERRY_KUBELET_BIN (the
# containerd directory also holds containerd-shim-runc-v2, which containerd
# finds on PATH); FERRY_NODE_IMAGES, the OCI archives to import, separated
# by ':'; FERRY_DISK_DIR, the node's disk. Needs root; the caller's network namespace is the node's.
set -euo pipefail
runtime=$1 cgroup=$2
shift 2

# The kubelet's cgroup root must exist in every hierarchy (cgroup v1 here);
# a new cpuset cgroup starts empty and must be given its parent's CPUs.
for hierarchy in /sys/fs/cgroup/*/; do
  mkdir -p "$hierarchy$cgroup"
done
cpuset=/sys/fs/cgroup/cpuset
if [[ -d "$cpuset/$cgroup" ]]; then
  [[ -s "$cpuset/$cgroup/cpuset.cpus" ]] || cat "$cpuset/cpuset.cpus" >"$cpuset/$cgroup/cpuset.cpus"
  [[ -s "$cpuset/$cgroup/cpuset.mems" ]] || cat "$cpuset/cpuset.mems" >"$cpuset/$cgroup/cpuset.mems"
fi

# This node's disk is /mnt for everything started below (hostPath volumes
# are created and mounted from it), and nobody else sees the change; the
# kubelet's and the CNI plugins' fixed paths get directories of the node's.
mount_own() {
  mkdir -p "$1" "$2"
  mount --bind "$1" "$2"
}
mount_own "$FERRY_DISK_DIR/mnt" /mnt
mount_own "$runtime/var-log-containers" /var/log/containers
mount_own "$runtime/var-lib-cni" /var/lib/cni

export PATH="$(dirname "$FERRY_CONTAINERD_BIN"):$PATH"
socket="$runtime/containerd/containerd.sock"
"$FERRY_CONTAINERD_BIN" --config "$runtime/containerd.toml" >"$runtime/containerd.log" 2>&1 &
for _ in $(seq 1 100); do
  [[ -S "$socket" ]] && break
  sleep 0.1
done
[[ -S "$socket" ]] || { echo "real-node.sh: containerd did not start" >&2; tail -20 "$runtime/containerd.log" >&2; exit 1; }
# Images are imported, never pulled: nothing outside this machine is reached.
IFS=: read -r -a archives <<<"${FERRY_NODE_IMAGES:-}"
for archive in "${archives[@]}"; do
  "$FERRY_CTR_BIN" --address "$socket" --namespace k8s.io images import "$archive" >/dev/null
done
echo "real-node.sh: containerd up with ${#archives[@]} images"
exec "$FERRY_KUBELET_BIN" --config "$runtime/kubelet.json" --kubeconfig "$runtime/kubeconfig" \
  --root-dir "$runtime/kubelet" --cert-dir "$runtime/kubelet/pki" "$@"
