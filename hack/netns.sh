#!/usr/bin/env bash
# Runs a command in a network namespace of its own in which the e2e pod
# network (10.224.0.0/12) is routed to `lo`, so the node agent can give
# pods addresses the API server accepts as endpoints, and the API server
# can call webhooks behind Services as in a cluster. Everything the tests
# start (control plane, object stores, pods) lives on loopback inside it,
# and the namespace disappears with the command.
#
# For real nodes (tests/e2e/src/real_node.rs) it also holds the
# `kubernetes` Service's ClusterIP (10.96.0.1) and the machine's address as
# pods see it (10.250.0.1) on `lo`, and forwards between the nodes' pod
# bridges (10.244.0.0/16).
#
#   hack/netns.sh COMMAND [ARGS...]
#
# Needs root (or CAP_SYS_ADMIN) and iproute2; without them the command runs
# as it is, pods get loopback addresses, and the tests that need the API
# server to reach a pod say so.
set -euo pipefail
if [[ "${FERRY_IN_NETNS:-}" != 1 ]] && command -v ip >/dev/null && unshare -n true 2>/dev/null; then
  export FERRY_IN_NETNS=1
  exec unshare -n bash -c 'ip link set lo up && ip route add local 10.224.0.0/12 dev lo \
    && ip addr add 10.96.0.1/32 dev lo && ip addr add 10.250.0.1/32 dev lo \
    && sysctl -qw net.ipv4.ip_forward=1 && exec "$@"' netns "$@"
fi
exec "$@"
