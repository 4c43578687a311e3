#!/usr/bin/env bash
# The e2e cluster from a shell: a real control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) and node agents for node-a and
# node-b that run pods as local processes. Runs until Ctrl-C.
#
#   hack/cluster.sh [--dir DIR] [--real-nodes]     then, in another shell:
#   nsenter --target <printed pid> --net   (when it prints one)
#   export KUBECONFIG=<printed path>; kubectl get nodes
#
# Where it can (root), it runs in a network namespace of its own
# (hack/netns.sh), so pods get addresses the API server accepts as
# endpoints and the operator's pod webhook works behind its Service.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
hack/tools.sh install etcd kube-apiserver kubectl
hack/build.sh >&2
# --real-nodes: kubelets with containerd and runc, running the images built here.
if [[ " $* " == *" --real-nodes "* ]]; then
  hack/tools.sh install kubelet containerd ctr runc cni-plugins busybox
  hack/images.sh --no-build --test-images >&2
fi
echo "kubectl: $(hack/tools.sh path kubectl)" >&2
exec hack/netns.sh "$CARGO_TARGET_DIR/release/ferry-cluster" up "$@"
