#!/usr/bin/env bash
# Setpoint's container image, built with buildah from the Containerfile
# without a Docker engine or a registry. Run by the Makefile (`make image`,
# `make image-context`; image/smoke.sh for `make test-image`), which passes
# the inputs:
#
#   build.sh build     the OCI archive under $CARGO_TARGET_DIR/image, with its
#                      SPDX SBOM beside it; last line: "<archive> <digest>"
#   build.sh context   the build context of the Containerfile (rootfs.tar,
#                      setpoint and renderers.tar); prints its directory
#   build.sh rootfs    the root filesystem only (cached); prints its path
#   build.sh sizes     what each part of the image unpacks to (MiB)
#
# Environment: CARGO_TARGET_DIR (the release binary is
# $CARGO_TARGET_DIR/release/setpoint), IMAGE_RENDERERS (helm and kustomize
# in one binary, image/renderers/build.sh), SETPOINT_CACHE (default
# ~/.cache/setpoint), IMAGE_SOURCE (the org.opencontainers.image.source
# label), IMAGE_OUT (where the archive goes; default $CARGO_TARGET_DIR/image).
#
# Caches, keyed by what goes in: the root filesystem by the package list, the
# lock and the scripts that make it ($SETPOINT_CACHE/image/rootfs-<hash>.tar);
# the archive by the root filesystem, the binaries, the Containerfile
# and the labels (<archive>: setpoint-<version>-<hash>.oci.tar). The image's
# timestamps are the commit's, so the same commit gives the same digest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=image/storage.sh
source "$here/storage.sh"
out_dir="${IMAGE_OUT:-${CARGO_TARGET_DIR:?CARGO_TARGET_DIR is not set}/image}"
binary="${CARGO_TARGET_DIR:?CARGO_TARGET_DIR is not set}/release/setpoint"
renderers="${IMAGE_RENDERERS:?IMAGE_RENDERERS is not set}"

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

command -v buildah >/dev/null || die "buildah is not installed (make image-deps installs it)"

name=setpoint
version="$(awk -F'"' '/^version *=/ {print $2; exit}' "$repo/Cargo.toml")"
revision="$(git -C "$repo" rev-parse HEAD)"
git -C "$repo" diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
epoch="$(git -C "$repo" log -1 --format=%ct)"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
source_url="${IMAGE_SOURCE:-unknown}"

mkdir -p "$image_cache" "$out_dir"
# One image build at a time on this machine: they share buildah's storage.
exec 9>"$image_cache/.lock"
flock 9

need_binaries() {
  local f
  for f in "$binary" "$renderers"; do
    [[ -x "$f" ]] || die "$f is missing: \`make image\` builds it first"
  done
}

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

rootfs_tar() {
  local key tar
  key="$(hash_of "$here/packages.txt" "$here/debian.lock" "$here/rootfs.sh" "$here/prune.py")"
  tar="$image_cache/rootfs-$key.tar"
  if [[ ! -f "$tar" || ! -f "$tar.dpkg-status" ]]; then
    log "building the root filesystem $tar (Debian packages; about 2 minutes)"
    "$here/rootfs.sh" build "$tar.tmp" || exit 1
    mv "$tar.tmp.dpkg-status" "$tar.dpkg-status"
    mv "$tar.tmp" "$tar"
    # Only the current root filesystem is kept.
    find "$image_cache" -maxdepth 1 -name 'rootfs-*.tar*' ! -name "$(basename "$tar")*" -delete
  fi
  echo "$tar"
}

# The build context: the root filesystem, setpoint without its symbol table
# (the release profile keeps it, for profilers), and renderers.tar: helm, and
# kustomize as a link to it (a tar, which ADD unpacks, as COPY would not keep
# the link). The libraries setpoint links must be in the root filesystem,
# which image/prune.py cuts to what its own programs link.
make_context() {
  local dir="$1" rootfs="$2" lib
  need_binaries
  mkdir -p "$dir/renderers"
  cp "$rootfs" "$dir/rootfs.tar"
  strip --strip-all -o "$dir/setpoint" "$binary"
  chmod 0755 "$dir/setpoint"
  for lib in $(readelf -d "$dir/setpoint" | awk '$2 == "(NEEDED)" {gsub(/[][]/, "", $5); print $5}'); do
    grep -qxF "./usr/lib/x86_64-linux-gnu/$lib" <(tar -tf "$rootfs") ||
      die "setpoint links $lib, which the root filesystem lacks: add it to KEEP_LIBS in image/prune.py"
  done
  cp "$renderers" "$dir/renderers/helm"
  chmod 0755 "$dir/renderers/helm"
  ln -s helm "$dir/renderers/kustomize"
  tar --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$dir/renderers" -cf "$dir/renderers.tar" helm kustomize
  rm -rf "$dir/renderers"
}

# One layer, no history, no buildah version label, the commit's time; chroot
# isolation (no runtime, no namespaces to set up).
build_flags() {
  printf -- '%s\n' --isolation=chroot --layers=false --omit-history --identity-label=false "--timestamp=$epoch"
}

build_args() {
  printf -- '--build-arg=%s\n' "VERSION=$version" "REVISION=$revision" "SOURCE=$source_url" "CREATED=$created"
}

cmd_context() {
  local rootfs dir
  rootfs="$(rootfs_tar)"
  dir="$image_cache/context"
  rm -rf "$dir"
  make_context "$dir" "$rootfs"
  log "the same image as \`make image\`: podman build $(build_flags | tr '\n' ' ')$(build_args | tr '\n' ' ')-t $name:$version -f Containerfile $dir"
  echo "$dir"
}

cmd_build() {
  local rootfs key archive digest_file sbom
  rootfs="$(rootfs_tar)"
  need_binaries
  key="$( (
    printf '%s\n' "$rootfs"
    build_args
    sha256sum "$binary" "$renderers" "$repo/Containerfile" "$here/build.sh" "$here/sbom.py" | cut -d' ' -f1
  ) | sha256sum | cut -c1-16)"
  archive="$out_dir/$name-$version-$key.oci.tar"
  digest_file="$archive.digest"
  sbom="$archive.spdx.json"
  if [[ -f "$archive" && -f "$digest_file" && -f "$sbom" ]]; then
    log "reused $archive (same inputs)"
    echo "$archive $(cat "$digest_file")"
    return 0
  fi
  local start=$SECONDS work tag
  work="$(mktemp -d "$image_cache/build.XXXXXX")"
  tag="localhost/$name:$version-$key"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'; buildah_ rmi -f '$tag' >/dev/null 2>&1 || true" EXIT
  make_context "$work/context" "$rootfs"
  log "building $name:$version ($revision) with buildah"
  local -a args
  mapfile -t args < <(build_flags && build_args)
  buildah_ build --quiet "${args[@]}" -f "$repo/Containerfile" -t "$tag" "$work/context" >/dev/null ||
    die "buildah build failed (output above)"
  buildah_ push --quiet --format oci --digestfile "$work/digest" "$tag" \
    "oci-archive:$work/image.oci.tar:$name:$version" || die "buildah push to the OCI archive failed"
  python3 "$here/sbom.py" --name "$name" --version "$version" --revision "$revision" \
    --created "$created" --digest "$(cat "$work/digest")" --dpkg-status "$rootfs.dpkg-status" \
    --cargo-manifest "$repo/Cargo.toml" --go-binary "renderers=$renderers" \
    >"$work/sbom.spdx.json" || die "the SBOM could not be written"
  mv "$work/sbom.spdx.json" "$sbom"
  mv "$work/digest" "$digest_file"
  mv "$work/image.oci.tar" "$archive"
  # The three newest archives are kept (with their digests and SBOMs).
  ls -t "$out_dir"/*.oci.tar | tail -n +4 | while read -r old; do rm -f "$old" "$old.digest" "$old.spdx.json"; done
  log "built in $((SECONDS - start))s: $(du -m "$archive" | cut -f1) MiB archive, $(image_size "$work/context") MiB uncompressed; SBOM $sbom"
  echo "$archive $(cat "$digest_file")"
}

# The image's uncompressed size: what its one layer unpacks to (the sizes of
# its files; links and directories count nothing).
image_size() {
  local dir="$1"
  tar -tvf "$dir/rootfs.tar" | cat - <(tar -tvf "$dir/renderers.tar") <(stat -c '- - %s' "$dir/setpoint") |
    awk '{s += $3} END {printf "%.1f\n", s / 1048576}'
}

# Each part's size, from a context as the build makes it (image/sizes.py).
cmd_sizes() {
  local work
  work="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  make_context "$work" "$(rootfs_tar)"
  python3 "$here/sizes.py" "$work" "$here/packages.txt"
}

case "${1:-}" in
  build) cmd_build ;;
  context) cmd_context ;;
  rootfs) rootfs_tar ;;
  sizes) cmd_sizes ;;
  *) die "usage: build.sh build | context | rootfs | sizes" ;;
esac
