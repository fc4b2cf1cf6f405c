#!/usr/bin/env bash
# The root filesystem of Setpoint's image, from Debian packages.
#
#   rootfs.sh build OUT.tar   mmdebstrap the pinned packages, prune, write OUT.tar
#   rootfs.sh lock            resolve the packages anew and rewrite debian.lock
#
# mmdebstrap (variant essential, root mode) installs the `keep` packages of
# packages.txt from the Debian mirror this machine's apt uses
# (SETPOINT_DEBIAN_SOURCES, default: the /etc/apt sources signed by the Debian
# archive keyring), at the versions debian.lock pins (apt preferences; a
# build whose installed versions differ from the lock fails, naming them, or
# with IMAGE_DEBIAN_LOCK=warn only says so: CI, so that a Debian security
# update does not block an unrelated change).
# The lock's epoch is SOURCE_DATE_EPOCH, so the same lock gives the same
# tarball. prune.py then keeps only what the `keep` packages need at run time.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lock="$here/debian.lock"

log() { printf '[rootfs] %s\n' "$*" >&2; }
die() { printf '[rootfs] error: %s\n' "$*" >&2; exit 1; }

suite="$(awk '$1 == "suite" {print $2; exit}' "$here/packages.txt")"
keep="$(awk '$1 == "keep" {print $2}' "$here/packages.txt" | paste -sd, -)"
[[ -n "$suite" && -n "$keep" ]] || die "packages.txt names no suite or no keep packages"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (make image-deps installs it)"

# The Debian sources of this machine's apt, as files mmdebstrap pastes into
# the chroot's sources.list.
debian_sources() {
  if [[ -n "${SETPOINT_DEBIAN_SOURCES:-}" ]]; then
    printf '%s\n' "$SETPOINT_DEBIAN_SOURCES"
    return
  fi
  local f found=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    if grep -qE 'debian-archive-keyring|^[^#]*deb .*/debian(-security)?/? ' "$f"; then
      printf '%s\n' "$f"
      found=1
    fi
  done
  [[ -n "$found" ]] || die "no Debian source in /etc/apt: set SETPOINT_DEBIAN_SOURCES to a sources file"
}

mmdebstrap_run() { # OUT EPOCH [mmdebstrap options...]
  local out="$1" epoch="$2"
  shift 2
  local -a sources
  mapfile -t sources < <(debian_sources)
  SOURCE_DATE_EPOCH="$epoch" mmdebstrap --mode=root --variant=essential --include="$keep" \
    --aptopt='Acquire::Languages "none"' --aptopt='Acquire::Retries "3"' \
    "$@" "$suite" "$out" "${sources[@]}"
}

cmd_build() {
  local out="${1:?usage: rootfs.sh build OUT.tar}"
  [[ -f "$lock" ]] || die "$lock is missing: run \`make image-lock\`"
  local epoch
  epoch="$(awk '$1 == "epoch" {print $2; exit}' "$lock")"
  [[ "$epoch" =~ ^[0-9]+$ ]] || die "$lock names no epoch"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  # apt preferences pinning every package of the lock to its version.
  awk '$1 == "pkg" {printf "Package: %s\nPin: version %s\nPin-Priority: 1001\n\n", $2, $3}' "$lock" >"$work/pins"
  awk '$1 == "pkg" {print $2, $3}' "$lock" | sort >"$work/want"
  log "mmdebstrap $suite (epoch $epoch): $keep"
  # prune.py removes apt's and dpkg's leftovers, logs and caches itself, so
  # mmdebstrap's own cleanup of those is skipped.
  mmdebstrap_run "$work/rootfs.tar" "$epoch" --quiet \
    --skip=cleanup/apt,cleanup/mmdebstrap,cleanup/reproducible \
    --setup-hook="mkdir -p \"\$1/etc/apt/preferences.d\" && cp '$work/pins' \"\$1/etc/apt/preferences.d/setpoint-lock\"" \
    --customize-hook="dpkg-query --admindir=\"\$1/var/lib/dpkg\" -W -f '\${Package} \${Version}\n' | sort >'$work/got'" \
    --customize-hook="python3 '$here/prune.py' \"\$1\" '$here/packages.txt'" \
    --customize-hook="ldconfig -r \"\$1\" && rm -rf \"\$1/var/cache/ldconfig\"" \
    --customize-hook="cp \"\$1/var/lib/dpkg/status\" '$work/status'" ||
    die "mmdebstrap failed (output above)"
  if ! diff -u "$work/want" "$work/got" >"$work/diff"; then
    cat "$work/diff" >&2
    local what="the mirror installed other versions than $lock pins (above: - pinned, + installed): it no longer serves them; run \`make image-lock\` and commit debian.lock"
    [[ "${IMAGE_DEBIAN_LOCK:-strict}" == warn ]] || die "$what"
    log "warning: $what; IMAGE_DEBIAN_LOCK=warn: building with the installed versions (the SBOM lists them)"
  fi
  mv "$work/rootfs.tar" "$out"
  cp "$work/status" "$out.dpkg-status"
  log "wrote $out ($(du -m "$out" | cut -f1) MB)"
}

cmd_lock() {
  local work epoch
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  epoch="$(date -u -d "$(date -u +%F)" +%s)"
  log "resolving $keep on the mirror"
  mmdebstrap_run /dev/null "$epoch" --quiet \
    --customize-hook="dpkg-query --admindir=\"\$1/var/lib/dpkg\" -W -f '\${Package} \${Version}\n' | sort >'$work/got'" ||
    die "mmdebstrap failed (output above)"
  {
    echo "# Written by \`make image-lock\` (image/rootfs.sh lock): the Debian packages"
    echo "# mmdebstrap installs before prune.py, at these versions, and the"
    echo "# SOURCE_DATE_EPOCH of the root filesystem. Commit it; a new lock is a new image."
    echo "epoch $epoch"
    awk '{print "pkg", $1, $2}' "$work/got"
  } >"$lock"
  log "wrote $lock ($(grep -c '^pkg ' "$lock") packages, epoch $epoch)"
}

case "${1:-}" in
  build) cmd_build "${2:-}" ;;
  lock) cmd_lock ;;
  *) die "usage: rootfs.sh build OUT.tar | lock" ;;
esac
