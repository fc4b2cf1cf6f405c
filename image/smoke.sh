#!/usr/bin/env bash
# The image's smoke test (`make test-image`): builds the image (or reuses the
# archive of the same inputs), loads the OCI archive into buildah and runs,
# as UID 65532 with chroot isolation and the host's network:
#   setpoint --version, git --version, kustomize version, helm version, and
#   `setpoint reconcile` (through tini, the image's entrypoint) of
#   Applications whose Git repository is mounted into the container (a
#   directory, a kustomization, a Helm chart), against the local control
#   plane; the ConfigMap each renders must then be in the cluster.
# Ends with "N passed, 0 failed"; any failure exits non-zero.
#
# Environment: as image/build.sh, plus KUBECONFIG and SETPOINT_KUBECTL (the
# local control plane and the host's kubectl, from the Makefile).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=image/storage.sh
source "$here/storage.sh"
kubectl="${SETPOINT_KUBECTL:-kubectl}"
: "${KUBECONFIG:?KUBECONFIG is not set: the smoke test reconciles against the local control plane}"

log() { printf '[test-image] %s\n' "$*" >&2; }
passed=0
failed=0
# check NAME EXPECTED-REGEX COMMAND...: COMMAND succeeds and prints a match.
# check_fails: COMMAND fails, and prints a match.
check() { expect 0 "$@"; }
check_fails() { expect 1 "$@"; }
expect() {
  local failing="$1" name="$2" expected="$3" out status=0
  shift 3
  out="$("$@" 2>&1)" || status=$?
  if [[ $((status != 0)) -eq "$failing" ]] && grep -qE -- "$expected" <<<"$out"; then
    log "ok: $name: $(grep -oE -- "$expected" <<<"$out" | head -1 | cut -c1-120)"
    passed=$((passed + 1))
  else
    log "FAILED: $name (exit status $status, expected /$expected/):"
    printf '%s\n' "$out" | tail -20 >&2
    failed=$((failed + 1))
  fi
}

start=$SECONDS
read -r archive digest < <("$here/build.sh" build | tail -1)
[[ -f "$archive" ]] || { log "error: image/build.sh printed no archive"; exit 1; }
log "image $archive ($digest), ready after $((SECONDS - start))s"
sbom="$archive.spdx.json"
check "SBOM: Debian's git" '"referenceLocator": "pkg:deb/debian/git@' cat "$sbom"
check "SBOM: the kube crate" '"referenceLocator": "pkg:cargo/kube@' cat "$sbom"
check "SBOM: helm's Go module" '"referenceLocator": "pkg:golang/helm.sh/helm/v4@' cat "$sbom"
check "SBOM: kustomize's Go module" '"referenceLocator": "pkg:golang/sigs.k8s.io/kustomize/kustomize/v5@' cat "$sbom"
check "SBOM: the image digest" "\"referenceLocator\": \"pkg:oci/setpoint@${digest/:/%3A}" cat "$sbom"

work="$(mktemp -d)"
ctr=""
image_id=""
ns="setpoint-image-smoke-$RANDOM$RANDOM"
cleanup() {
  [[ -n "$ctr" ]] && buildah_ rm "$ctr" >/dev/null 2>&1
  [[ -n "$image_id" ]] && buildah_ rmi -f "$image_id" >/dev/null 2>&1
  "$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

exec 9>"$image_cache/.lock"
flock 9
# The archive itself, not what buildah built: what a registry would get.
image_id="$(buildah_ pull --quiet "oci-archive:$archive" | tail -1)"
buildah_ tag "$image_id" localhost/setpoint-smoke:latest
ctr="$(buildah_ from --quiet --pull-never localhost/setpoint-smoke:latest)"
flock -u 9

# What the image says about itself.
config="$(buildah_ inspect --type image localhost/setpoint-smoke:latest |
  python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["OCIv1"]["config"], sort_keys=True))')"
check "runs as 65532" '"User": "65532:65532"' echo "$config"
check "entrypoint: setpoint through tini" '"Entrypoint": \["/usr/bin/tini", "-s", "--", "/usr/local/bin/setpoint"\]' echo "$config"
check "OCI labels" '"org.opencontainers.image.licenses": "Apache-2.0".*"org.opencontainers.image.revision": "[0-9a-f]{40}' echo "$config"
check "volumes" '"Volumes": \{"/tmp": \{\}, "/var/cache/setpoint": \{\}\}' echo "$config"

# The smoke test's namespace is an admin namespace (tenancy: its Applications
# act with Setpoint's own rights); file:// repositories are allowed.
run_() { # as the image's user, host network, the mounts below
  buildah_ run --isolation chroot --user 65532:65532 --network host \
    --volume "$work/repo:/repo:ro" --volume "$work/kube:/kube:ro" \
    --env KUBECONFIG=/kube/config --env SETPOINT_ALLOW_LOCAL_REPOS=true \
    --env SETPOINT_ADMIN_NAMESPACES="$ns" --env TINI_SUBREAPER=1 \
    "$ctr" -- "$@"
}

# The Git repository the Application names, readable by 65532 (git refuses
# a repository owned by another user), and a kubeconfig with its
# certificates inline (the local one names files on the host).
mkdir -p "$work/kube" "$work/src/app" "$work/src/app-read-only" "$work/src/app-kustomize" "$work/src/app-helm/templates"
for dir in app app-read-only app-kustomize; do
  cat >"$work/src/$dir/configmap.yaml" <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: smoke-$dir
data:
  from: the setpoint image
EOF
done
# The image's renderers: kustomize (a kustomization naming the ConfigMap)
# and helm (a chart whose template takes it from its values).
echo "resources: [configmap.yaml]" >"$work/src/app-kustomize/kustomization.yaml"
printf 'apiVersion: v2\nname: smoke\nversion: 0.1.0\n' >"$work/src/app-helm/Chart.yaml"
echo "from: the setpoint image" >"$work/src/app-helm/values.yaml"
cat >"$work/src/app-helm/templates/configmap.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: smoke-app-helm
data:
  from: {{ .Values.from }}
EOF
git -C "$work/src" init --quiet -b main
git -C "$work/src" -c user.name=smoke -c user.email=smoke@setpoint.invalid add -A
git -C "$work/src" -c user.name=smoke -c user.email=smoke@setpoint.invalid commit --quiet -m smoke
git clone --quiet --bare "$work/src" "$work/repo"
"$kubectl" config view --raw --flatten --minify >"$work/kube/config"
chown -R 65532:65532 "$work/repo" "$work/kube"
chmod 0700 "$work/kube"
chmod 0600 "$work/kube/config"

check "setpoint --version" "^setpoint [0-9.]+" run_ /usr/local/bin/setpoint --version
check "git --version" "^git version [0-9.]+" run_ git --version
check "ssh -V (ssh:// repositories)" "OpenSSH_[^ ,]+" run_ ssh -V
check "the CA bundle for https (git hash-object reads it)" "^[0-9a-f]{40}$" \
  run_ git hash-object /etc/ssl/certs/ca-certificates.crt
check "kustomize version" "^v5\.[0-9]+\.[0-9]+" run_ kustomize version
check "helm version" 'Version:"v[0-9]+\.[0-9]+\.[0-9]+"' run_ helm version
check_fails "65532 cannot write to the root filesystem" "cannot mkdir /usr/local/bin/x: Permission denied" \
  run_ git init --quiet /usr/local/bin/x

"$kubectl" apply --server-side --force-conflicts -f "$repo/config/crd/applications.setpoint.dev.yaml" -f "$repo/config/crd/applicationsets.setpoint.dev.yaml" >/dev/null
"$kubectl" wait --for condition=Established --timeout=60s crd/applications.setpoint.dev >/dev/null
"$kubectl" create namespace "$ns" >/dev/null
for dir in app app-read-only app-kustomize app-helm; do
  "$kubectl" apply -f - >/dev/null <<EOF
apiVersion: setpoint.dev/v1alpha1
kind: Application
metadata:
  name: $dir
  namespace: $ns
spec:
  source:
    repoURL: file:///repo
    targetRevision: main
    path: $dir
  destination:
    namespace: $ns
  syncPolicy:
    automated:
      prune: true
      selfHeal: true
EOF
done
revision="$(git -C "$work/src" rev-parse HEAD)"
applied() { # APP: the ConfigMap is in the cluster and the status names the commit
  check "$1: the ConfigMap from the mounted repository is applied" "^the setpoint image$" \
    "$kubectl" -n "$ns" get configmap "smoke-$1" -o 'jsonpath={.data.from}'
  check "$1: the Application's status names the commit" "^$revision$" \
    "$kubectl" -n "$ns" get application "$1" -o 'jsonpath={.status.sync.revision}'
}
check "setpoint reconcile (through tini, as 65532)" "outcome: applied 1, .*Synced" \
  run_ /usr/bin/tini -s -- /usr/local/bin/setpoint reconcile "$ns/app"
applied app
for dir in app-kustomize app-helm; do
  check "setpoint reconcile of $dir (${dir#app-} in the image)" "outcome: applied 1, .*Synced" \
    run_ /usr/bin/tini -s -- /usr/local/bin/setpoint reconcile "$ns/$dir"
  applied "$dir"
done

# The same with a read-only root filesystem, through the image's own
# entrypoint, where a runtime here allows it: podman with runc (crun fails on
# this machine's hybrid cgroups), with limits below the host's (setting
# RLIMIT_NOFILE/NPROC to the host's own is refused here).
if command -v podman >/dev/null && command -v runc >/dev/null; then
  check "setpoint reconcile with a read-only root filesystem (podman, runc)" "outcome: applied 1, .*Synced" \
    podman_ run --rm --read-only --network host --ulimit nofile=8192:8192 --ulimit nproc=4096:4096 \
    --volume "$work/repo:/repo:ro" --volume "$work/kube:/kube:ro" \
    --env KUBECONFIG=/kube/config --env SETPOINT_ALLOW_LOCAL_REPOS=true \
    --env SETPOINT_ADMIN_NAMESPACES="$ns" \
    localhost/setpoint-smoke:latest reconcile "$ns/app-read-only"
  applied app-read-only
else
  log "skipped: the read-only root filesystem run needs podman and runc (make image-deps installs them)"
fi

log "done in $((SECONDS - start))s"
echo "test-image: $passed passed, $failed failed"
[[ "$failed" -eq 0 ]]
