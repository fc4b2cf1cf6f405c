#!/usr/bin/env bash
# `make demo`: the canonical case, end to end, on the local control plane.
# A Git repository holds a Deployment with replicas: 5; `setpoint run` syncs
# it when a webhook signed as GitHub signs it announces the commit; someone
# runs `kubectl scale --replicas=1`; Setpoint sees the drift and scales back.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
: "${KUBECTL:?}" "${SETPOINT:?}" "${KUBECONFIG:?}"
work="$repo_root/.cluster/demo"
ns=demo
secret=demo-webhook-secret
amqp="amqp://guest:guest@127.0.0.1:5672/%2f"
prefix="setpoint-demo"

t0=$(date +%s.%N)
last=$t0
step() {
  local now; now=$(date +%s.%N)
  awk -v now="$now" -v t0="$t0" -v last="$last" -v msg="$*" \
    'BEGIN { printf "[demo] %6.2fs (+%5.2fs)  %s\n", now - t0, now - last, msg }'
  last=$now
}
k() { "$KUBECTL" "$@"; }
wait_until() { # wait_until SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "[demo] timed out waiting for $what" >&2; tail -n 40 "$work/setpoint.log" >&2; exit 1; }
    sleep 0.1
  done
}
running_pods() { [[ "$(k -n $ns get pods -l app=web --field-selector=status.phase=Running -o name | wc -l)" == "$1" ]]; }
replicas_are() { [[ "$(k -n $ns get deployment web -o jsonpath='{.spec.replicas}')" == "$1" ]]; }
synced_at() {
  [[ "$(k -n $ns get application web -o jsonpath='{.status.sync.status}/{.status.sync.revision}')" == "Synced/$1" ]]
}

step "control plane and RabbitMQ are up"
rm -rf "$work" && mkdir -p "$work"
k delete namespace $ns --ignore-not-found --wait=true >/dev/null
k create namespace $ns >/dev/null
"$SETPOINT" crd | k apply --server-side -f - >/dev/null
"$SETPOINT" crd --applicationset | k apply --server-side -f - >/dev/null
k wait --for condition=Established crd/applications.setpoint.dev >/dev/null

git init -q --bare -b main "$work/origin.git"
git init -q -b main "$work/repo"
cd "$work/repo"
git config user.name "Demo" && git config user.email demo@setpoint.invalid
mkdir -p apps/web
cat >apps/web/deployment.yaml <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 5
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.example/web:1.0
EOF
git add -A && git commit -q -m "web: 5 replicas" && git remote add origin "$work/origin.git" && git push -q origin main
commit=$(git rev-parse HEAD)
step "Git repository $work/origin.git holds a Deployment with replicas: 5 at ${commit:0:12}"

k -n $ns apply -f - >/dev/null <<EOF
apiVersion: setpoint.dev/v1alpha1
kind: Application
metadata:
  name: web
spec:
  source:
    repoURL: file://$work/origin.git
    targetRevision: main
    path: apps/web
  syncPolicy:
    automated: {prune: true, selfHeal: true}
EOF
step "Application $ns/web created"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
metrics_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ui_port=${DEMO_UI_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
# The dashboard, without login: it listens on 127.0.0.1 only (see README,
# "Dashboard", for --ui-auth kubernetes and tokens).
SETPOINT_LOG=info "$SETPOINT" run --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port" \
  --ui-listen "127.0.0.1:$ui_port" --ui-auth none \
  --amqp-url "$amqp" --amqp-prefix "$prefix" \
  --github-secret "$secret" --cache-dir "$work/cache" --sweep-interval 10m \
  --admin-namespaces "$ns" --allow-local-repos >"$work/setpoint.log" 2>&1 &
setpoint_pid=$!
trap 'kill $setpoint_pid 2>/dev/null || true' EXIT
wait_until 60 "the webhook" curl -sf "http://127.0.0.1:$port/healthz"
step "setpoint run started (pid $setpoint_pid, webhook on 127.0.0.1:$port, RabbitMQ queues $prefix.*)"
wait_until 30 "the dashboard" curl -sf "http://127.0.0.1:$ui_port/healthz"
step "dashboard: http://127.0.0.1:$ui_port/ (open it to follow the push, the sync and the drift live)"

payload=$(printf '{"ref":"refs/heads/main","after":"%s","repository":{"clone_url":"file://%s","default_branch":"main"},"commits":[{"id":"%s","added":["apps/web/deployment.yaml"],"modified":[],"removed":[]}],"head_commit":{"id":"%s"}}' \
  "$commit" "$work/origin.git" "$commit" "$commit")
signature="sha256=$(printf '%s' "$payload" | openssl dgst -sha256 -hmac "$secret" | awk '{print $NF}')"
answer=$(curl -s -w ' (HTTP %{http_code})' -H 'Content-Type: application/json' -H 'X-GitHub-Event: push' \
  -H "X-GitHub-Delivery: demo-$(date +%s%N)" -H "X-Hub-Signature-256: $signature" \
  --data-binary "$payload" "http://127.0.0.1:$port/api/webhooks/github")
step "push webhook, signed as GitHub signs it, answered: $answer"

wait_until 120 "5 pods Running" running_pods 5
wait_until 60 "the Application Synced" synced_at "$commit"
step "5 pods Running; Application Synced at ${commit:0:12}"
k -n $ns get pods -l app=web

k -n $ns scale deployment web --replicas=1 >/dev/null
step "kubectl scale deployment web --replicas=1"
wait_until 60 "the scale-down corrected" replicas_are 5
step "drift detected and corrected: spec.replicas back to 5"
wait_until 120 "5 pods Running again" running_pods 5
step "5 pods Running again"

echo
k -n $ns get application web
echo
echo "[demo] Events on the Application:"
k -n $ns get events --field-selector involvedObject.kind=Application \
  -o custom-columns=REASON:.reason,MESSAGE:.message --sort-by=.metadata.creationTimestamp
echo
echo "[demo] From /metrics:"
curl -sf "http://127.0.0.1:$metrics_port/metrics" |
  grep -E '^setpoint_(drift_corrections_total|webhook_requests_total\{provider="github",outcome="accepted"\}|app_sync_status.*status="Synced"|reconciles_total)' || true

echo
echo "[demo] Dashboard: http://127.0.0.1:$ui_port/applications/$ns/web"
if [[ -n "${DEMO_KEEP:-}" ]]; then
  echo "[demo] DEMO_KEEP is set: Setpoint keeps running; Ctrl-C stops it."
  wait $setpoint_pid
fi
