# Sourced by image/build.sh and image/smoke.sh: where the image's caches and
# buildah's storage live, and buildah and podman on that storage (vfs: no
# overlay mounts needed; one storage, so the smoke test's podman sees what
# buildah loaded).
cache_root="${SETPOINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/setpoint}"
image_cache="$cache_root/image"

buildah_() {
  buildah --root "$image_cache/storage" --runroot "$image_cache/runroot" --storage-driver vfs "$@"
}

# runc, not crun (which fails on this machine's hybrid cgroups); cgroupfs and
# a file for events, as there is no systemd.
podman_() {
  podman --root "$image_cache/storage" --runroot "$image_cache/runroot" --storage-driver vfs \
    --runtime runc --cgroup-manager cgroupfs --events-backend file "$@"
}
