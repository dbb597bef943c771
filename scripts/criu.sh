#!/usr/bin/env bash
# Build CRIU (checkpoint/restore in userspace) from Debian's source package of a release that
# runs on current kernels, into the cache, and run `criu check` with it.
#
#   scripts/criu.sh           # build if missing (root: apt-get installs the build dependencies),
#                             # run `criu check`, print the binary's path on the last line
#   scripts/criu.sh --print   # only print where the binary is (or would be); no build
#   scripts/criu.sh --variant proc-limits [--print]
#                             # the same release with scripts/criu-proc-limits.patch applied, in a
#                             # cache directory of its own (the real node tier's; see below)
#
# Why not the distribution's criu: bookworm ships 3.17, which stops at
# `vdso: Unexpected rt vDSO area bounds` on recent kernels, and 4.1 cannot dump a process that
# holds an inet socket on kernels >= 6.16 (`Can't get 1:16 opt: Operation not supported`,
# fixed in 4.2). The source comes from Debian's archive (the orig tarball of the unstable
# suite's package, fetched with `apt-get source --download-only` through a private sources
# list that reuses the mirror this host's apt already uses; nothing is added to the system's
# apt configuration) and is checked against the SHA-256 pinned below before it is unpacked.
# When the suite has moved past the pinned release, a newer 4.2+ one is built instead, its
# hashes checked by apt against the suite's signed index (the cache keeps the pinned name).
# The build takes 25 s to 1.5 minutes on 2 cores (as loaded); later runs only run `criu check`.
#
# The controller finds the binary through CONTROLLER_CRIU (default: `criu` on PATH); the test
# tiers export CONTROLLER_CRIU to the path this prints. Production: run this script once on
# the host (as root), or install CRIU >= 4.2 from your distribution, and set CONTROLLER_CRIU.
#
# The proc-limits variant: CRIU reads each task's rlimits with prlimit(2), which for another
# uid's task needs CAP_SYS_RESOURCE. Where root lacks it (this project's CI container does), a
# non-root container cannot be dumped (`Can't get rlimit 0: Operation not permitted`). The patch
# reads the limits from /proc/<pid>/limits (readable by all) when prlimit(2) answers EPERM, and
# changes nothing else. Only the real node tier uses it (tests/node: pods as the runner's uid
# under Pod Security "restricted"); the plain build, which the local runner's tests use, is left
# as it is. A node whose root has CAP_SYS_RESOURCE, as a cluster's does, needs no patch.
#
# Env: SANDBOX_CONTROLLER_CACHE (default ~/.cache/sandbox-controller);
#      CRIU_DEBIAN_MIRROR (default: the first Debian archive this host's apt sources name).
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_DEBIAN_SUITE=sid
CRIU_TARBALL="criu_${CRIU_VERSION}.orig.tar.xz"
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
# Debian package names of the build dependencies (bookworm's are new enough); the runtime
# libraries they pull in are what the binary links against.
BUILD_DEPS=(gcc make pkg-config libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler
  libnl-3-dev libnl-route-3-dev libcap-dev libnet1-dev libbsd-dev libgnutls28-dev uuid-dev)

cache_root="${SANDBOX_CONTROLLER_CACHE:-${HOME}/.cache/sandbox-controller}"
# The source tarball (and the lock) live in the plain build's directory; a variant's binary in
# its own, beside a copy of the patch it was built with (a changed patch is built again).
src_dir="${cache_root}/criu-${CRIU_VERSION}"
dir="${src_dir}"
patch_file=""
say() { echo "criu.sh: $*" >&2; }

print=false
while [ $# -gt 0 ]; do
  case "$1" in
    --print) print=true; shift ;;
    --variant)
      case "${2:-}" in
        proc-limits) patch_file="$(cd "$(dirname "$0")" && pwd)/criu-proc-limits.patch"; dir="${src_dir}-proc-limits" ;;
        *) say "unknown variant: ${2:-} (proc-limits)"; exit 2 ;;
      esac
      shift 2 ;;
    *) say "unknown option: $1 (--print, --variant proc-limits)"; exit 2 ;;
  esac
done
bin="${dir}/criu"
if [ -n "${patch_file}" ]; then BUILD_DEPS+=(patch); fi

if [ "${print}" = true ]; then
  echo "${bin}"
  exit 0
fi

mkdir -p "${src_dir}" "${dir}"
exec 8>"${src_dir}/.lock"
flock 8

if [ -n "${patch_file}" ] && [ -x "${bin}" ] && ! cmp -s "${patch_file}" "${dir}/applied.patch"; then
  say "scripts/$(basename "${patch_file}") changed since ${bin} was built: building it again"
  rm -f "${bin}"
fi

if [ ! -x "${bin}" ]; then
  if [ "$(id -u)" != 0 ]; then
    say "building CRIU needs root (apt-get for the build dependencies; CRIU itself runs as root)"
    exit 1
  fi
  missing=()
  for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null)
  fi

  if [ ! -f "${src_dir}/${CRIU_TARBALL}" ] || { [ ! -f "${src_dir}/built-from" ] \
    && ! echo "${CRIU_SHA256}  ${src_dir}/${CRIU_TARBALL}" | sha256sum -c --quiet -; }; then
    mirror="${CRIU_DEBIAN_MIRROR:-}"
    if [ -z "${mirror}" ]; then
      # The Debian archive this host already uses (deb822 .sources or one-line sources.list).
      mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' \
        | grep -v -- '-security' | head -n1 || true)"
    fi
    if [ -z "${mirror}" ]; then
      mirror="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
        /etc/apt/sources.list 2>/dev/null || true)"
    fi
    if [ -z "${mirror}" ]; then
      say "no Debian archive found in this host's apt sources: set CRIU_DEBIAN_MIRROR"
      exit 1
    fi
    apt_dir="$(mktemp -d)"
    trap 'rm -rf "${apt_dir}"' EXIT
    mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/src"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror} ${CRIU_DEBIAN_SUITE} main" \
      >"${apt_dir}/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=${apt_dir}/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=${apt_dir}/lists" -o APT::Sandbox::User=root)
    say "fetching Debian's source of criu ${CRIU_VERSION} (${CRIU_DEBIAN_SUITE})"
    apt-get -qq "${apt_opts[@]}" update
    # Only the upstream tarball is used (Debian's packaging files are not needed to build, and
    # a failure to fetch them is ignored); the pinned checksum decides whether it is the one.
    (cd "${apt_dir}/src" && apt-get -qq "${apt_opts[@]}" source --download-only criu >/dev/null 2>&1 || true)
    if [ -f "${apt_dir}/src/${CRIU_TARBALL}" ]; then
      mv "${apt_dir}/src/${CRIU_TARBALL}" "${src_dir}/${CRIU_TARBALL}"
      if ! echo "${CRIU_SHA256}  ${src_dir}/${CRIU_TARBALL}" | sha256sum -c --quiet -; then
        say "checksum mismatch for ${CRIU_TARBALL}: refusing to build it"
        rm -f "${src_dir}/${CRIU_TARBALL}"
        exit 1
      fi
    else
      # The suite moved on (its archive keeps only the current version). A newer 4.2+ release
      # is taken instead: apt-get checked its hashes against the suite's signed index.
      newer="$(cd "${apt_dir}/src" && ls criu_*.orig.tar.xz 2>/dev/null | head -n1 || true)"
      version="${newer#criu_}"
      version="${version%.orig.tar.xz}"
      if [ -z "${newer}" ] || ! printf '4.2\n%s\n' "${version}" | sort -V -C; then
        say "the archive did not provide ${CRIU_TARBALL} nor a newer 4.2+ release (${newer:-none})"
        exit 1
      fi
      say "criu ${CRIU_VERSION} is no longer in ${CRIU_DEBIAN_SUITE}; building ${version} (hashes checked by apt):"
      sha256sum "${apt_dir}/src/${newer}" >&2
      tar -xJf "${apt_dir}/src/${newer}" -C "${apt_dir}"
      mv "${apt_dir}/criu-${version}" "${apt_dir}/criu-${CRIU_VERSION}"
      tar -cJf "${src_dir}/${CRIU_TARBALL}" -C "${apt_dir}" "criu-${CRIU_VERSION}"
      echo "${version}" >"${src_dir}/built-from"
    fi
  fi

  build="$(mktemp -d)"
  say "building criu $(cat "${src_dir}/built-from" 2>/dev/null || echo "${CRIU_VERSION}") (under 2 minutes on 2 cores; log: ${dir}/build.log)"
  tar -xJf "${src_dir}/${CRIU_TARBALL}" -C "${build}"
  if [ -n "${patch_file}" ]; then
    say "applying scripts/$(basename "${patch_file}")"
    if ! patch -p1 -d "${build}/criu-${CRIU_VERSION}" --forward --quiet <"${patch_file}" >&2; then
      say "scripts/$(basename "${patch_file}") does not apply to this release"
      rm -rf "${build}"
      exit 1
    fi
  fi
  if ! (cd "${build}/criu-${CRIU_VERSION}" && nice -n 10 make -j"$(nproc)" criu) >"${dir}/build.log" 2>&1; then
    say "build failed; the end of ${dir}/build.log:"
    tail -n 20 "${dir}/build.log" >&2
    rm -rf "${build}"
    exit 1
  fi
  install -m 0755 "${build}/criu-${CRIU_VERSION}/criu/criu" "${bin}.partial"
  mv "${bin}.partial" "${bin}"
  if [ -n "${patch_file}" ]; then cp "${patch_file}" "${dir}/applied.patch"; fi
  rm -rf "${build}"
fi

"${bin}" --version >&2
if ! "${bin}" check >&2; then
  say "criu check failed on this host: checkpointing is not available here"
  exit 1
fi
echo "${bin}"
