#!/usr/bin/env bash
# Build the kube-apiserver and etcd binaries used by the test suite from Go
# modules (k8s.io/kubernetes, go.etcd.io/etcd/server/v3) via the Go module
# proxy. Binaries go to a cache dir outside the work tree; nothing is done if
# they are already there.
#
#   tests/envtest/build.sh          # build if missing, print the bin dir
#   tests/envtest/build.sh --node   # also kubelet, kube-scheduler, kube-controller-manager, kube-proxy,
#                                   # kube-router (NetworkPolicy enforcement, its own module), and the
#                                   # node's container runtime: containerd (with ctr and its runc shim)
#                                   # and runc, each from its own module
#   tests/envtest/build.sh --print  # only print the bin dir (no build)
#
# Env:
#   SANDBOX_CONTROLLER_CACHE  cache root (default: $HOME/.cache/sandbox-controller)
#   ENVTEST_FORCE=1           rebuild even if present
#   ENVTEST_NICE              nice level for go build (default 10)
set -euo pipefail

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
# The real node's NetworkPolicy enforcement (firewall only). Built with `go install pkg@version`
# from its own module (its own pins of the Kubernetes libraries); the version the Go module
# proxy serves is v2.1.0. A stamp file beside the binary makes a new pin rebuild it.
KUBE_ROUTER_VERSION=v2.1.0
KUBE_ROUTER_MODULE=github.com/cloudnativelabs/kube-router/v2
# The real node's container runtime, each built with `go install pkg@version` from its own module
# and stamped like kube-router: containerd 2.3 (the long-term line; containerd, ctr and
# containerd-shim-runc-v2, without cgo, as containerd's own static release is built) and runc 1.4
# (cgo: its nsenter is C, and seccomp filters come from libseccomp, hence RUNC_BUILD_DEPS).
CONTAINERD_VERSION=v2.3.7
CONTAINERD_MODULE=github.com/containerd/containerd/v2
RUNC_VERSION=v1.4.4
RUNC_MODULE=github.com/opencontainers/runc
# Debian packages runc's build needs (installed with apt-get when missing and running as root);
# libseccomp2, which the binary links against, comes with libseccomp-dev.
RUNC_BUILD_DEPS=(gcc libc6-dev pkg-config libseccomp-dev)
# The directory name changes whenever either pin changes.
ENVTEST_VERSION="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${SANDBOX_CONTROLLER_CACHE:-${HOME}/.cache/sandbox-controller}"
bin_dir="${cache_root}/envtest/${ENVTEST_VERSION}"

if [[ "${1:-}" == "--print" ]]; then
  echo "${bin_dir}"
  exit 0
fi

# The binaries wanted: the API server tier needs two; the real-node tier (tests/node)
# also needs a kubelet, a scheduler, a controller-manager and kube-proxy, built in the same
# module, kube-router, containerd (with ctr and the runc shim) and runc.
wanted=(etcd kube-apiserver)
if [[ "${1:-}" == "--node" ]]; then
  wanted+=(kubelet kube-scheduler kube-controller-manager kube-proxy kube-router containerd runc)
fi
stamped() { # <stamp name> <version>: the binaries of that name were built at that pin
  [[ "$(cat "${bin_dir}/$1.version" 2>/dev/null)" == "$2" ]]
}
present() { # <binary>
  case "$1" in
    kube-router) [[ -x "${bin_dir}/kube-router" ]] && stamped kube-router "${KUBE_ROUTER_VERSION}" ;;
    containerd) [[ -x "${bin_dir}/containerd" && -x "${bin_dir}/ctr" && -x "${bin_dir}/containerd-shim-runc-v2" ]] \
      && stamped containerd "${CONTAINERD_VERSION}" ;;
    runc) [[ -x "${bin_dir}/runc" ]] && stamped runc "${RUNC_VERSION}" ;;
    *) [[ -x "${bin_dir}/$1" ]] ;;
  esac
}
all_present() {
  local b
  for b in "${wanted[@]}"; do present "${b}" || return 1; done
}

if [[ "${ENVTEST_FORCE:-0}" != "1" ]] && all_present; then
  echo "${bin_dir}"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "envtest/build.sh: 'go' not found on PATH; cannot build kube-apiserver/etcd" >&2
  exit 3
fi

mkdir -p "${bin_dir}"
# Serialise concurrent callers (e.g. two pytest processes): the second waits,
# then finds the binaries built.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${bin_dir}/.build.lock"
  flock 9
  if [[ "${ENVTEST_FORCE:-0}" != "1" ]] && all_present; then
    echo "${bin_dir}"
    exit 0
  fi
fi
nice_level="${ENVTEST_NICE:-10}"
# -mod=mod: go.sum is committed, but let go fill in anything missing rather
# than fail (e.g. after a pin bump). -buildvcs=false: building from a module
# cache / nested module, there is no VCS info worth stamping.
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

ticker=""
start_ticker() { # <output name>: a cold kubelet build is quiet for ~10 minutes: say something
  # every minute so CI logs show it is alive.
  local out=$1 start=$SECONDS
  ( while sleep 60; do echo "envtest/build.sh: still building ${out} ($((SECONDS - start))s)" >&2; done ) &
  ticker=$!
}
stop_ticker() {
  kill "${ticker}" 2>/dev/null || true
  wait "${ticker}" 2>/dev/null || true
}

build() { # <module dir> <package> <output name> [extra ldflags]
  local mod_dir="$1" pkg="$2" out="$3" ldx="${4:-}" tmp
  tmp="$(mktemp "${bin_dir}/.${out}.XXXXXX")"
  echo "envtest/build.sh: building ${pkg} -> ${bin_dir}/${out}" >&2
  local start=$SECONDS
  start_ticker "${out}"
  if ! (cd "${mod_dir}" && nice -n "${nice_level}" go build -trimpath -ldflags="-s -w ${ldx}" -o "${tmp}" "${pkg}"); then
    stop_ticker
    return 1
  fi
  stop_ticker
  chmod 0755 "${tmp}"
  mv -f "${tmp}" "${bin_dir}/${out}" # atomic: a half-built file is never seen
  echo "envtest/build.sh: built ${out} in $((SECONDS - start))s" >&2
}

build_kube_router() { # `go install` in its own module (no replace directives there)
  local tmp start=$SECONDS
  tmp="$(mktemp -d "${bin_dir}/.kube-router.XXXXXX")"
  echo "envtest/build.sh: building ${KUBE_ROUTER_MODULE}@${KUBE_ROUTER_VERSION} -> ${bin_dir}/kube-router" >&2
  start_ticker kube-router
  if ! (cd "${tmp}" && GOBIN="${tmp}" nice -n "${nice_level}" go install -trimpath -ldflags="-s -w" \
      "${KUBE_ROUTER_MODULE}/cmd/kube-router@${KUBE_ROUTER_VERSION}"); then
    stop_ticker
    return 1
  fi
  stop_ticker
  mv -f "${tmp}/kube-router" "${bin_dir}/kube-router"
  echo "${KUBE_ROUTER_VERSION}" >"${bin_dir}/kube-router.version"
  echo "envtest/build.sh: built kube-router in $((SECONDS - start))s" >&2
}

go_install() { # <name> <version or ""> <env and go install arguments...>: `go install pkg@version`
  # into a temporary GOBIN, then every binary it made moves into the bin dir and, given a version,
  # the stamp <name>.version is written.
  local name=$1 version=$2 tmp start=$SECONDS f
  shift 2
  tmp="$(mktemp -d "${bin_dir}/.${name}.XXXXXX")"
  echo "envtest/build.sh: building ${name}${version:+ ${version}} -> ${bin_dir}" >&2
  start_ticker "${name}"
  if ! (cd "${tmp}" && env GOBIN="${tmp}" nice -n "${nice_level}" "$@"); then
    stop_ticker
    return 1
  fi
  stop_ticker
  for f in "${tmp}"/*; do mv -f "${f}" "${bin_dir}/"; done
  rmdir "${tmp}"
  [[ -z "${version}" ]] || echo "${version}" >"${bin_dir}/${name}.version"
  echo "envtest/build.sh: built ${name} in $((SECONDS - start))s" >&2
}

build_containerd() { # containerd, ctr and the runc shim (the shim without gRPC, as containerd's Makefile does)
  local v=${CONTAINERD_MODULE}/version
  local ld="-s -w -X ${v}.Version=${CONTAINERD_VERSION} -X ${v}.Package=${CONTAINERD_MODULE}"
  # The shim as containerd releases it: without gRPC (one runs per pod). Stamped with the rest.
  go_install containerd-shim-runc-v2 "" go install -trimpath -tags "urfave_cli_no_docs no_grpc" \
    -ldflags="${ld}" "${CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}"
  go_install containerd "${CONTAINERD_VERSION}" go install -trimpath -tags urfave_cli_no_docs -ldflags="${ld}" \
    "${CONTAINERD_MODULE}/cmd/containerd@${CONTAINERD_VERSION}" "${CONTAINERD_MODULE}/cmd/ctr@${CONTAINERD_VERSION}"
}

build_runc() { # cgo, with seccomp (runc's default build tags)
  local missing=() p
  for p in "${RUNC_BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [[ "${#missing[@]}" -gt 0 ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
      echo "envtest/build.sh: runc's build needs ${missing[*]} (Debian packages): install them" >&2
      return 1
    fi
    echo "envtest/build.sh: apt-get install ${missing[*]}" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null)
  fi
  go_install runc "${RUNC_VERSION}" env CGO_ENABLED=1 go install -trimpath -tags "seccomp urfave_cli_no_docs" \
    -ldflags="-s -w" "${RUNC_MODULE}@${RUNC_VERSION}"
}

trap 'rm -rf "${bin_dir}"/.kube-* "${bin_dir}"/.etcd.* "${bin_dir}"/.kubelet.* "${bin_dir}"/.containerd* "${bin_dir}"/.runc.*' EXIT

if [[ "${ENVTEST_FORCE:-0}" == "1" || ! -x "${bin_dir}/etcd" ]]; then
  build "${here}/etcd" go.etcd.io/etcd/server/v3 etcd
fi
# Stamp the version the way kubernetes' own build does (else /version
# reports v0.0.0-master). Link-time only: does not invalidate GOCACHE.
v=k8s.io/component-base/version
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
stamp="-X ${v}.gitVersion=${KUBE_VERSION} -X ${v}.gitMajor=1 -X ${v}.gitMinor=${minor} -X ${v}.gitTreeState=clean"
for b in "${wanted[@]}"; do
  [[ "${b}" == etcd || "${b}" == kube-router || "${b}" == containerd || "${b}" == runc ]] && continue
  if [[ "${ENVTEST_FORCE:-0}" == "1" || ! -x "${bin_dir}/${b}" ]]; then
    build "${here}/kube" "k8s.io/kubernetes/cmd/${b}" "${b}" "${stamp}"
  fi
done
if [[ " ${wanted[*]} " == *" kube-router "* ]] && { [[ "${ENVTEST_FORCE:-0}" == "1" ]] || ! present kube-router; }; then
  build_kube_router
fi
if [[ " ${wanted[*]} " == *" containerd "* ]] && { [[ "${ENVTEST_FORCE:-0}" == "1" ]] || ! present containerd; }; then
  build_containerd
fi
if [[ " ${wanted[*]} " == *" runc "* ]] && { [[ "${ENVTEST_FORCE:-0}" == "1" ]] || ! present runc; }; then
  build_runc
fi

echo "${bin_dir}"
