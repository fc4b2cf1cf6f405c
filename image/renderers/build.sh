#!/usr/bin/env bash
# Builds the image's renderers (main.go: helm and kustomize in one binary)
# from the pins beside this script into the cache, once per pin, and prints
# the binary's path on stdout; `kustomize` beside it is a link to it.
#
#   build.sh        build when missing, print the path
#
# The pins are the tests' own: helm as tests/tools/helm/go.mod, kustomize as
# the kubectl of tests/controlplane/go.mod embeds it (a difference fails
# here, naming both). Built as helm's and kustomize's releases are: static
# (CGO_ENABLED=0), -trimpath, without symbol tables or DWARF (-s -w), helm's
# version stamped in; and without inlining (-gcflags=all=-l): 7 MiB smaller
# (64.6 MiB to 57.5), a `helm template` of `helm create`'s chart 0.20 s
# instead of 0.15 s here, which Setpoint pays once per chart and commit (its
# renders are cached by their inputs).
#
# Environment: SETPOINT_CACHE (default ~/.cache/setpoint).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
log() { printf '[renderers] %s\n' "$*" >&2; }
die() { printf '[renderers] error: %s\n' "$*" >&2; exit 1; }

pin() { # MODULE GO.MOD: the version GO.MOD requires
  awk -v m="$1" '{for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/) {print $(i + 1); exit}}' "$2"
}
helm_version="$(pin helm.sh/helm/v4 "$here/go.mod")"
kustomize_version="$(pin sigs.k8s.io/kustomize/kustomize/v5 "$here/go.mod")"
[[ -n "$helm_version" && -n "$kustomize_version" ]] || die "cannot read helm's and kustomize's versions from $here/go.mod"
tests_helm="$(pin helm.sh/helm/v4 "$repo/tests/tools/helm/go.mod")"
tests_kustomize="$(pin sigs.k8s.io/kustomize/kustomize/v5 "$repo/tests/controlplane/go.mod")"
[[ "$helm_version" == "$tests_helm" ]] ||
  die "helm $helm_version here, $tests_helm in tests/tools/helm/go.mod: update image/renderers (go get helm.sh/helm/v4@$tests_helm && go mod tidy)"
[[ "$kustomize_version" == "$tests_kustomize" ]] ||
  die "kustomize $kustomize_version here, $tests_kustomize in tests/controlplane/go.mod (kubectl's): update image/renderers (go get sigs.k8s.io/kustomize/kustomize/v5@$tests_kustomize && go mod tidy)"

ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"
pins_hash() { { cat "$here/go.mod" "$here/go.sum" "$here/main.go"; echo "$ldflags -gcflags=all=-l"; } | sha256sum | cut -c1-16; }
cache_root="${SETPOINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/setpoint}"
bin="$cache_root/renderers-helm-$helm_version-kustomize-$kustomize_version/bin"

if [[ -x "$bin/helm" && -L "$bin/kustomize" && -f "$bin/.pins" && "$(cat "$bin/.pins")" == "$(pins_hash)" ]]; then
  echo "$bin/helm"
  exit 0
fi
command -v go >/dev/null 2>&1 || die "go is not installed: the renderers are built from their Go modules, install Go 1.26 or newer"
if ! (cd "$here" && timeout 300 go mod download >/dev/null 2>&1); then
  die "the Go module proxy ($(go env GOPROXY)) did not serve the modules of $here/go.mod: check GOPROXY and the network"
fi
log "building helm $helm_version and kustomize $kustomize_version into $bin (once per pin; a few minutes on 2 cores)"
tmp="$bin.tmp.$$"
rm -rf "$tmp" && mkdir -p "$tmp"
start=$SECONDS
(cd "$here" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-l -ldflags "$ldflags" -o "$tmp/helm" .) ||
  { rm -rf "$tmp"; die "go build of the renderers failed (output above)"; }
ln -s helm "$tmp/kustomize"
pins_hash >"$tmp/.pins"
rm -rf "$bin" && mkdir -p "$(dirname "$bin")" && mv "$tmp" "$bin"
log "built in $((SECONDS - start))s"
echo "$bin/helm"
