#!/usr/bin/env bash
# Builds the OCI registry (CNCF distribution) from its Go module (the pin in
# go.mod beside this script) into
# the cache, once per pin, and prints the binary's path on stdout.
#
#   build.sh        build when missing, print the path
#
# Environment: SETPOINT_CACHE (default ~/.cache/setpoint).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "github.com/distribution/distribution/v3" {print $2; exit}' "$here/go.mod")"
[[ -n "$version" ]] || { echo "[registry] error: cannot read the github.com/distribution/distribution/v3 version from $here/go.mod" >&2; exit 1; }
cache_root="${SETPOINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/setpoint}"
bin="$cache_root/registry-$version/bin"

log() { printf '[registry] %s\n' "$*" >&2; }
die() { printf '[registry] error: %s\n' "$*" >&2; exit 1; }

pins_hash() { cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16; }

if [[ -x "$bin/registry" && -f "$bin/.pins" && "$(cat "$bin/.pins")" == "$(pins_hash)" ]]; then
  echo "$bin/registry"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "go is not installed: the registry is built from its Go module, install Go 1.26 or newer"
if ! (cd "$here" && timeout 120 go mod download -json github.com/distribution/distribution/v3 >/dev/null 2>&1); then
  die "the Go module proxy ($(go env GOPROXY)) did not serve github.com/distribution/distribution/v3@$version: check GOPROXY and the network"
fi
log "building the registry $version into $bin (first run only; a few minutes on 2 cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp" && mkdir -p "$tmp"
start=$SECONDS
(cd "$here" && go build -o "$tmp/registry" github.com/distribution/distribution/v3/cmd/registry) ||
  { rm -rf "$tmp"; die "go build of the registry failed (output above)"; }
pins_hash >"$tmp/.pins"
rm -rf "$bin" && mkdir -p "$(dirname "$bin")" && mv "$tmp" "$bin"
log "built the registry in $((SECONDS - start))s"
echo "$bin/registry"
