#!/usr/bin/env bash
# Fetch the pinned codex executor's npm tarball (the platform package that carries the native
# binary) and check it against the integrity recorded in codex.lock.
#
#   runner_image/fetch-codex.sh VERSION PLATFORM DEST_FILE     # e.g. 0.171.0 linux-x64 codex-package.tgz
#
# `npm pack` reads npm's own cache first. A tarball whose sha512 differs from codex.lock is
# deleted and the script fails: nothing unpinned reaches the image.
set -euo pipefail
version=$1 platform=$2 dest=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pin="${version}-${platform}"
expected=$(awk -v pin="$pin" '$1 == pin { print $2 }' "$here/codex.lock")
if [ -z "$expected" ]; then
  echo "fetch-codex.sh: no integrity recorded for @openai/codex@$pin in codex.lock" >&2
  exit 2
fi
actual_of() { printf 'sha512-%s' "$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }
if [ -f "$dest" ] && [ "$(actual_of "$dest")" = "$expected" ]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent --pack-destination "$tmp" "@openai/codex@$pin" >/dev/null)
tarball=$(echo "$tmp"/*.tgz)
actual=$(actual_of "$tarball")
if [ "$actual" != "$expected" ]; then
  echo "fetch-codex.sh: @openai/codex@$pin has integrity $actual, codex.lock says $expected" >&2
  exit 1
fi
mv -f "$tarball" "$dest"
