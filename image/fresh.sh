#!/usr/bin/env bash
# `make check-fresh-image`: `make image` as the first command of a fresh
# clone (issue 31: it once needed crates that only `make test-ui` had
# downloaded). Run by CI after the other targets, so every cache is warm
# around it, as on the machine that found the bug.
#
# In a private mount namespace, it clones this checkout (the working tree's
# changes laid over it, so that it checks what is about to be committed),
# and runs `make image` there with nothing downloaded:
#   - Cargo's registry and git caches ($CARGO_HOME/registry, $CARGO_HOME/git)
#     and Go's module cache (GOMODCACHE): empty directories mounted over
#     them, so cargo (the build and image/sbom.py's `cargo metadata`) fetches
#     every crate from crates.io and go every module from the proxy;
#   - the Setpoint cache (SETPOINT_CACHE: the root filesystem from Debian's
#     mirror, the renderers, buildah's storage): a new directory.
# What stays warm are the compile caches (CARGO_TARGET_DIR, GOCACHE): they
# hold compiler outputs keyed by what went in, no source, so they cannot
# supply a crate or a module that a download would have to; with the
# registry mounted at its usual path, cargo's fingerprints still match and
# the release binary is not compiled again for the check (the clone's files
# keep the checkout's times). So each step that downloads runs as on a
# fresh machine, at the cost of the downloads, a root filesystem and one
# image build (under a minute here) rather than a cold compile.
#
# Passes when `make image` succeeds and its SBOM lists the runtime crates
# (kube) and not the dev-dependencies (fantoccini, cookie).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
log() { printf '[check-fresh-image] %s\n' "$*" >&2; }
die() { printf '[check-fresh-image] error: %s\n' "$*" >&2; exit 1; }

if [[ -z "${SETPOINT_FRESH_NAMESPACE:-}" ]]; then
  command -v unshare >/dev/null || die "unshare (util-linux) is not installed"
  exec unshare --mount --propagation private env SETPOINT_FRESH_NAMESPACE=1 "$0" "$@"
fi

: "${CARGO_TARGET_DIR:?CARGO_TARGET_DIR is not set (the Makefile sets it)}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
gomodcache="$(go env GOMODCACHE)"
work="$(mktemp -d "${TMPDIR:-/tmp}/setpoint-fresh.XXXXXX")"
cleanup() {
  local dir
  for dir in "$cargo_home/registry" "$cargo_home/git" "$gomodcache"; do
    umount "$dir" 2>/dev/null || true
  done
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The clone, with the working tree as it is (tracked and new files that
# git does not ignore; deletions too).
git clone --quiet --no-local "$repo" "$work/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | tar -C "$work/src" -xf -
(cd "$repo" && git ls-files -z --deleted) | (cd "$work/src" && xargs -0 -r rm -f --)

for dir in "$cargo_home/registry" "$cargo_home/git" "$gomodcache"; do
  mkdir -p "$dir" "$work/empty$dir"
  mount --bind "$work/empty$dir" "$dir"
  [[ -z "$(ls -A "$dir")" ]] || die "$dir is not empty after mounting an empty directory over it"
done

log "make image in $work/src: empty Cargo registry, Go module cache and Setpoint cache"
start=$SECONDS
out="$(
  cd "$work/src" &&
    env -u SETPOINT_KUBECTL -u SETPOINT_HELM -u SETPOINT_REGISTRY -u MAKEFLAGS -u MAKELEVEL \
      SETPOINT_CACHE="$work/cache" IMAGE_OUT="$work/out" GOFLAGS="-modcacherw ${GOFLAGS:-}" \
      make --no-print-directory image
)" || die "make image failed on a fresh clone (output above)"
read -r archive digest <<<"$(tail -1 <<<"$out")"
[[ -f "$archive" && "$digest" == sha256:* ]] || die "make image printed no archive and digest: $(tail -1 <<<"$out")"
sbom="$archive.spdx.json"
grep -q '"referenceLocator": "pkg:cargo/kube@' "$sbom" || die "the SBOM lists no kube crate"
if grep -qE '"referenceLocator": "pkg:cargo/(fantoccini|cookie)@' "$sbom"; then
  die "the SBOM lists a dev-dependency (fantoccini or cookie), which is not in the binary"
fi
crates="$(find "$work/empty$cargo_home/registry/cache" -name '*.crate' | wc -l)"
modules="$(du -sm "$work/empty$gomodcache" | cut -f1)"
log "ok: make image on a fresh clone in $((SECONDS - start))s ($digest), having downloaded $crates crates and $modules MiB of Go modules; the SBOM lists the runtime crates only"
