#!/usr/bin/env bash
# Build the images the real-node tier runs, with no container registry:
#
#   sandbox-controller  (Dockerfile, default target)    localhost/sandbox-controller:node
#   sandbox-runner      (runner_image/Dockerfile)        localhost/sandbox-runner:node
#   redis               (tests/node/redis.Dockerfile)    localhost/scc-redis:node
#   pause               (tests/node/pause.Dockerfile)    localhost/pause:1
#
# How: Debian packages from apt (podman, buildah, runc, mmdebstrap, gcc, ...); base root
# filesystems bootstrapped with mmdebstrap from the host's apt sources and `podman import`ed;
# the controller's Python dependencies, lock/product.txt's wheels, downloaded on the host (pip,
# hashes checked) and mounted into a `podman build --network=none`; the pinned codex fetched
# and integrity-checked by runner_image/fetch-codex.sh; the pause binary compiled from the k8s.io/kubernetes module.
# Each image is saved as an OCI archive under the cache, named by a hash of its inputs, so a
# warm run only checks that the archives exist.
#
#   tests/node/images.sh    # build what is missing; prints one JSON line per image:
#                           # {"name", "ref", "archive", "size_bytes", "build_seconds"}
#
# Env: SANDBOX_CONTROLLER_CACHE (default ~/.cache/sandbox-controller).
set -euo pipefail
shopt -s inherit_errexit

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache_root="${SANDBOX_CONTROLLER_CACHE:-${HOME}/.cache/sandbox-controller}"
node_cache="${cache_root}/node"
suite=bookworm
kube_version=v1.37.2
codex_version=0.171.0
codex_platform=linux-x64
# runc here is podman's (the image builds); the node runs containerd and runc built from Go
# modules (tests/envtest/build.sh --node). The CNI plugins are the node's.
packages=(runc podman buildah containernetworking-plugins mmdebstrap iptables ipset gcc libc6-dev)

say() { echo "node/images.sh: $*" >&2; }
mkdir -p "${node_cache}"/{rootfs,images,ctx,wheels}
exec 8>"${node_cache}/.images.lock"
flock 8

# -- Debian packages ---------------------------------------------------------------------------
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  start=$SECONDS
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null)
  say "installed in $((SECONDS - start))s"
fi

# -- podman configuration: runc (crun cannot drive cgroup v1 hybrid here), ulimits the machine
# allows (no CAP_SYS_RESOURCE), storage under the cache ----------------------------------------
export CONTAINERS_CONF="${node_cache}/containers.conf"
cat >"${CONTAINERS_CONF}" <<EOF
[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
EOF
export CONTAINERS_STORAGE_CONF="${node_cache}/storage.conf"
cat >"${CONTAINERS_STORAGE_CONF}" <<EOF
[storage]
driver = "overlay"
graphroot = "${node_cache}/podman-storage"
runroot = "/run/sandbox-controller-podman-$(printf '%s' "${node_cache}" | sha256sum | cut -c1-8)"
EOF

hash_of() { # files/dirs... -> short sha256 over names and contents
  local f
  for f in "$@"; do
    if [ -d "$f" ]; then
      find "$f" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
    elif [ -f "$f" ]; then
      sha256sum "$f"
    else
      printf '%s\n' "$f"
    fi
  done | sed "s#${root}/##; s#${node_cache}/##" | sha256sum | cut -c1-16
}

have_image() { podman image exists "$1" 2>/dev/null; }

# -- base root filesystems ---------------------------------------------------------------------
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
base() { # <name> <packages, comma separated> -> prints the image ref
  local name=$1 include=$2 key tar ref start
  key=$(hash_of "$suite" "$include" "$sources")
  tar="${node_cache}/rootfs/${name}-${key}.tar"
  ref="localhost/scc-base-${name}:${key}"
  if [ ! -s "$tar" ]; then
    say "mmdebstrap ${suite} minbase + ${include} -> ${tar}"
    start=$SECONDS
    mmdebstrap --quiet --variant=minbase --include="$include" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$suite" "${tar%.tar}.partial.tar" "$sources" >&2  # the .tar suffix selects the format
    mv -f "${tar%.tar}.partial.tar" "$tar"
    say "bootstrapped ${name} base in $((SECONDS - start))s"
  fi
  if ! have_image "$ref"; then
    podman import --quiet "$tar" "$ref" >/dev/null
  fi
  echo "$ref"
}

# -- one image: build (network off) unless its archive exists, then report --------------------
report() { # <name> <ref> <archive> <seconds>
  local size
  size=$(podman image inspect --format '{{.Size}}' "$2")
  printf '{"name": "%s", "ref": "%s", "archive": "%s", "size_bytes": %s, "build_seconds": %s}\n' \
    "$1" "$2" "$3" "$size" "$4" | tee "${3%.tar}.json"
}

image() { # <name> <ref> <key> <podman build args...>
  local name=$1 ref=$2 key=$3 archive start
  shift 3
  archive="${node_cache}/images/${name}-${key}.tar"
  if [ -s "$archive" ] && [ -s "${archive%.tar}.json" ]; then
    cat "${archive%.tar}.json"
    return
  fi
  say "podman build ${name} (${ref})"
  start=$SECONDS
  podman build --quiet --network=none --pull=never -t "$ref" "$@" >&2
  podman save --quiet --format oci-archive -o "${archive}.tmp" "$ref"
  mv -f "${archive}.tmp" "$archive"
  find "${node_cache}/images" -maxdepth 1 -name "${name}-*" ! -name "${name}-${key}.*" -delete  # older inputs
  report "$name" "$ref" "$archive" "$((SECONDS - start))"
}

# pause: Kubernetes' own pause.c, static.
gomodcache=$(go env GOMODCACHE)
pause_src="${gomodcache}/k8s.io/kubernetes@${kube_version}/build/pause/linux/pause.c"
if [ ! -f "$pause_src" ]; then
  (cd "${root}/tests/envtest/kube" && GOFLAGS=-mod=mod go mod download k8s.io/kubernetes)
fi
pause_ctx="${node_cache}/ctx/pause"
mkdir -p "$pause_ctx"
pause_key=$(hash_of "$pause_src" "${root}/tests/node/pause.Dockerfile")
if [ ! -x "${pause_ctx}/pause" ] || [ "$(cat "${pause_ctx}/key" 2>/dev/null)" != "$pause_key" ]; then
  gcc -static -Os -DVERSION="${kube_version}" -o "${pause_ctx}/pause" "$pause_src"
  strip "${pause_ctx}/pause"
  echo "$pause_key" >"${pause_ctx}/key"
fi
image pause localhost/pause:1 "$pause_key" -f "${root}/tests/node/pause.Dockerfile" "$pause_ctx"

# controller: Python 3.11 (Debian bookworm's) with venv; its dependencies are the files
# lock/product.txt pins, downloaded here (wheels only, hashes checked) and checked again by the
# image's own `pip install --require-hashes` in a build with no network.
controller_base=$(base controller python3,python3-venv)
wheels_key=$(hash_of "${root}/lock/product.txt")
wheels="${node_cache}/wheels/${wheels_key}"
if [ ! -f "${wheels}/.complete" ]; then
  say "pip download: lock/product.txt's wheels -> ${wheels}"
  rm -rf "$wheels" && mkdir -p "$wheels"
  # Every pin is fetched whatever its marker: pip would judge the markers by this host's Python,
  # and the image's (Debian's 3.11.2) needs what redis asks of Pythons before 3.11.3
  # (async-timeout). The image's pip applies the markers.
  sed -E 's/ ; [^\\]*//' "${root}/lock/product.txt" >"${wheels}.txt"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "${wheels}.txt" -d "$wheels" >&2
  rm -f "${wheels}.txt"
  touch "${wheels}/.complete"
fi
controller_key=$(hash_of "$controller_base" "$wheels_key" "${root}/Dockerfile" "${root}/.dockerignore" \
  "${root}/lock/product.txt" "${root}/pyproject.toml" "${root}/README.md" "${root}/controller")
image sandbox-controller localhost/sandbox-controller:node "$controller_key" \
  --build-arg PYTHON_IMAGE="$controller_base" --build-arg PIP_FIND_LINKS=/wheels \
  -v "${wheels}:/wheels:ro" -f "${root}/Dockerfile" "${root}"
# What the image installed is exactly the lock (tests/node/lock_check.py, run in the image).
if have_image localhost/sandbox-controller:node; then
  podman run --rm --network=none --entrypoint /opt/venv/bin/python \
    -v "${root}/lock/product.txt:/lock/product.txt:ro" -v "${root}/tests/node/lock_check.py:/lock/check.py:ro" \
    localhost/sandbox-controller:node /lock/check.py /lock/product.txt >&2
fi

# runner: the pinned codex (integrity-checked) on a Debian base with tini and ca-certificates.
runner_base=$(base runner tini,ca-certificates)
runner_ctx="${node_cache}/ctx/runner"
mkdir -p "$runner_ctx"
"${root}/runner_image/fetch-codex.sh" "$codex_version" "$codex_platform" "${runner_ctx}/codex-package.tgz"
cp -f "${root}/runner_image/Dockerfile" "${root}/runner_image/entrypoint.sh" "$runner_ctx/"
runner_key=$(hash_of "$runner_base" "${root}/runner_image/Dockerfile" "${root}/runner_image/entrypoint.sh" \
  "${root}/runner_image/codex.lock" "$codex_version-$codex_platform")
image sandbox-runner localhost/sandbox-runner:node "$runner_key" \
  --build-arg BASE_IMAGE="$runner_base" "$runner_ctx"

# redis: Debian's redis-server.
redis_base=$(base redis redis-server,redis-tools)
redis_key=$(hash_of "$redis_base" "${root}/tests/node/redis.Dockerfile")
image redis localhost/scc-redis:node "$redis_key" \
  --build-arg BASE_IMAGE="$redis_base" -f "${root}/tests/node/redis.Dockerfile" "${root}/tests/node"
