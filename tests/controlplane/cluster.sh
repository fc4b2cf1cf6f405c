#!/usr/bin/env bash
# The local Kubernetes control plane for Setpoint's tests and demo, as plain
# processes on loopback: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kwok (which plays the kubelet of one fake Node, so that
# scheduled pods really become Running).
#
#   cluster.sh build   build the binaries into the cache (once per release)
#   cluster.sh up      start everything (does nothing when already up)
#   cluster.sh down    stop what `up` started and remove its data
#   cluster.sh status  exit 0 when the cluster is up and answering
#   cluster.sh restart-apiserver [SECONDS]
#                      stop kube-apiserver, leave it down SECONDS (default 0),
#                      start it again on the same port and data, then restart
#                      kube-controller-manager and kube-scheduler (they stop
#                      syncing some controllers after an API server restart)
#
# Environment: K8S_VERSION (the pinned release, must match go.mod),
# SETPOINT_CACHE (default ~/.cache/setpoint), CLUSTER_DIR (default
# <repo>/.cluster).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
K8S_VERSION="${K8S_VERSION:-$(awk '{for (i = 1; i < NF; i++) if ($i == "k8s.io/kubernetes" && $(i + 1) ~ /^v/) {print $(i + 1); exit}}' "$here/go.mod")}"
[[ -n "$K8S_VERSION" ]] || { echo "[cluster] error: cannot read the k8s.io/kubernetes version from $here/go.mod" >&2; exit 1; }
cache_root="${SETPOINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/setpoint}"
bin="$cache_root/k8s-$K8S_VERSION/bin"
dir="${CLUSTER_DIR:-$repo/.cluster}"
node_name="kwok-node-0"
# A /16: 65,534 ClusterIPs, room for the 10,000-Application fleet benchmark's
# Services (a /24 holds 254). Outside kwok's pod range and node IP below.
# Changing it takes a fresh cluster (`make down up`): the API server keeps
# the allocated IPs in etcd.
service_range="10.96.0.0/16"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[cluster] %s\n' "$*"; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

# The pins' fingerprint: a change to go.mod/go.sum rebuilds, the same pins reuse.
pins_hash() { cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16; }

cmd_build() {
  local stamp="$bin/.pins" c missing=""
  for c in "${components[@]}" kubectl; do [[ -x "$bin/$c" ]] || missing=1; done
  [[ -f "$bin/kwok-stages.yaml" ]] || missing=1
  if [[ -z "$missing" && -f "$stamp" && "$(cat "$stamp")" == "$(pins_hash)" ]]; then
    log "control plane $K8S_VERSION reused from $bin"
    return 0
  fi
  command -v go >/dev/null 2>&1 || die "go is not installed: the control plane is built from the Kubernetes Go modules, install Go 1.26 or newer"
  local proxy
  proxy="$(go env GOPROXY)"
  if ! (cd "$here" && timeout 60 go mod download -json k8s.io/kubernetes >/dev/null 2>&1); then
    die "the Go module proxy ($proxy) did not serve k8s.io/kubernetes@$K8S_VERSION: check GOPROXY and the network"
  fi
  log "building control plane $K8S_VERSION into $bin (first run only; about 15-25 minutes on 2 cores)"
  local tmp="$bin.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  local start=$SECONDS
  (
    cd "$here"
    go build -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    go build -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kubectl \
      sigs.k8s.io/kwok/cmd/kwok
  ) || { rm -rf "$tmp"; die "go build of the control plane failed (output above)"; }
  # kwok's "fast" stages (nodes Ready with a lease heartbeat; pods Ready,
  # completed and deleted at once), from the kwok module the build pinned.
  local kwok_dir f
  kwok_dir="$(cd "$here" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    printf -- '---\n' && cat "$kwok_dir/$f"
  done >"$tmp/kwok-stages.yaml"
  pins_hash >"$tmp/.pins"
  rm -rf "$bin" && mkdir -p "$(dirname "$bin")" && mv "$tmp" "$bin"
  log "built control plane in $((SECONDS - start))s"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

pid_of() { cat "$dir/pids/$1.pid" 2>/dev/null || true; }
alive() { local p; p="$(pid_of "$1")"; [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

kubectl_() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

cmd_status() {
  [[ -f "$dir/kubeconfig" ]] || return 1
  for c in "${components[@]}"; do alive "$c" || return 1; done
  kubectl_ get --raw /readyz >/dev/null 2>&1 || return 1
  node_ready
}

node_ready() {
  [[ "$(kubectl_ get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == "True" ]]
}

stop_all() {
  local c p
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    p="$(pid_of "$c")"
    [[ -n "$p" ]] && kill -TERM "$p" 2>/dev/null || true
  done
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    p="$(pid_of "$c")"
    [[ -n "$p" ]] || continue
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
    rm -f "$dir/pids/$c.pid"
  done
}

# stop_one NAME: SIGTERM, then SIGKILL after 10 s.
stop_one() {
  local p
  p="$(pid_of "$1")"
  [[ -n "$p" ]] || return 0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$p" 2>/dev/null || true
  rm -f "$dir/pids/$1.pid"
}

# A process that died during start: show why, stop the others, fail.
fail_start() {
  local c="$1" why="$2"
  printf '[cluster] error: %s %s; last lines of %s:\n' "$c" "$why" "$dir/logs/$c.log" >&2
  tail -n 30 "$dir/logs/$c.log" >&2 || true
  stop_all
  exit 1
}

start() {
  local c="$1"; shift
  # setsid: the processes outlive this script (and make's job control).
  setsid "$bin/$c" "$@" >"$dir/logs/$c.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$c.pid"
}

# wait_until NAME SECONDS COMMAND...: poll COMMAND while NAME stays alive.
wait_until() {
  local c="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$c" || fail_start "$c" "exited during start"
    ((SECONDS < deadline)) || fail_start "$c" "was not ready after ${secs}s"
    sleep 0.2
  done
}

gen_certs() {
  local pki="$dir/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=setpoint-test-ca" 2>/dev/null
    cat >server.ext <<EOF
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
      -days 3650 -extfile server.ext 2>/dev/null
    echo "extendedKeyUsage=clientAuth" >client.ext
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
      -subj "/O=system:masters/CN=setpoint-admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt \
      -days 3650 -extfile client.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

write_kubeconfig() {
  local port="$1" pki="$dir/pki"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: setpoint-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $pki/ca.crt
users:
- name: setpoint-admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: setpoint-local
  context:
    cluster: setpoint-local
    user: setpoint-admin
current-context: setpoint-local
EOF
}

# start_apiserver ETCD_PORT API_PORT: kube-apiserver on that port, until ready.
start_apiserver() {
  local etcd_port="$1" api_port="$2" pki="$dir/pki"
  log "starting kube-apiserver on 127.0.0.1:$api_port"
  start kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$pki/server.crt" --tls-private-key-file "$pki/server.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$service_range" --authorization-mode RBAC \
    --allow-privileged --profiling=false --enable-priority-and-fairness=false \
    --max-requests-inflight 2000 --max-mutating-requests-inflight 1000 \
    --cert-dir "$dir/apiserver-certs"
  wait_until kube-apiserver 120 kubectl_ get --raw /readyz
}

# The controllers that talk to the API server only (kwok is started apart).
start_controllers() {
  local pki="$dir/pki"
  start kube-controller-manager --kubeconfig "$dir/kubeconfig" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=false --leader-elect=false --secure-port 0 \
    --controllers '*' --kube-api-qps 500 --kube-api-burst 1000 --concurrent-deployment-syncs 10 \
    --concurrent-replicaset-syncs 10 --node-monitor-grace-period 60s
  start kube-scheduler --kubeconfig "$dir/kubeconfig" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --leader-elect=false --secure-port 0 --kube-api-qps 500 --kube-api-burst 1000
}

cmd_up() {
  if cmd_status; then
    log "already up: $(grep server: "$dir/kubeconfig" | awk '{print $2}') (KUBECONFIG=$dir/kubeconfig)"
    return 0
  fi
  command -v openssl >/dev/null 2>&1 || die "openssl is missing: it generates the cluster's certificates (apt-get install openssl)"
  command -v python3 >/dev/null 2>&1 || die "python3 is missing: it picks free loopback ports"
  cmd_build
  # Whatever is left of an earlier run is stale: stop it and start clean.
  stop_all
  rm -rf "$dir"
  mkdir -p "$dir/pids" "$dir/logs" "$dir/etcd"
  local start_time=$SECONDS
  gen_certs
  local etcd_port etcd_peer api_port
  etcd_port="$(free_port)"; etcd_peer="$(free_port)"; api_port="$(free_port)"
  write_kubeconfig "$api_port"
  echo "$etcd_port $api_port" >"$dir/ports"
  local pki="$dir/pki"

  log "starting etcd on 127.0.0.1:$etcd_port"
  start etcd --data-dir "$dir/etcd" --name setpoint \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "setpoint=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296
  wait_until etcd 60 curl -sf "http://127.0.0.1:$etcd_port/health"

  start_apiserver "$etcd_port" "$api_port"

  log "starting kube-controller-manager, kube-scheduler and kwok"
  start_controllers
  start kwok --kubeconfig "$dir/kubeconfig" --config "$bin/kwok-stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds 40 \
    --cidr 10.0.1.0/24 --node-ip 10.0.0.2 --server-address "127.0.0.1:$(free_port)"

  # The fake Node that kwok keeps Ready and whose pods it runs.
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $node_name
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: $node_name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000"}
EOF
  wait_until kwok 60 node_ready
  for c in kube-controller-manager kube-scheduler; do alive "$c" || fail_start "$c" "exited during start"; done
  log "up in $((SECONDS - start_time))s: node $node_name Ready; KUBECONFIG=$dir/kubeconfig"
}

cmd_restart_apiserver() {
  local down="${1:-0}" etcd_port api_port
  [[ -f "$dir/ports" ]] || die "no cluster in $dir to restart (start one with: CLUSTER_DIR=$dir $0 up)"
  alive kube-apiserver || die "kube-apiserver is not running in $dir"
  read -r etcd_port api_port <"$dir/ports"
  local start_time=$SECONDS
  log "stopping kube-apiserver on 127.0.0.1:$api_port"
  stop_one kube-apiserver
  ((down > 0)) && { log "kube-apiserver down for ${down}s"; sleep "$down"; }
  start_apiserver "$etcd_port" "$api_port"
  log "restarting kube-controller-manager and kube-scheduler"
  stop_one kube-controller-manager
  stop_one kube-scheduler
  start_controllers
  for c in kube-controller-manager kube-scheduler; do alive "$c" || fail_start "$c" "exited during start"; done
  log "kube-apiserver restarted in $((SECONDS - start_time))s"
}

cmd_down() {
  if [[ -d "$dir/pids" ]]; then
    stop_all
    log "stopped"
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  restart-apiserver) cmd_restart_apiserver "${2:-0}" ;;
  *) echo "usage: $0 build|up|down|status|restart-apiserver [SECONDS]" >&2; exit 2 ;;
esac
