#!/usr/bin/env bash
# RabbitMQ for Setpoint's tests and demo: Debian's rabbitmq-server, run as a
# plain process on 127.0.0.1:5672 (no systemd here).
#
#   rabbitmq.sh up     install when missing, start, wait for AMQP (idempotent)
#   rabbitmq.sh down   stop it
#   rabbitmq.sh status exit 0 when it accepts AMQP connections
#   rabbitmq.sh fresh-vhost NAME
#                      delete the virtual host NAME with everything in it and
#                      create it empty, for users guest and setpoint-test
#                      (password amqp-pw-7c1e9b3f): each `make test` starts
#                      from an empty broker and leaves no queues behind it to
#                      pile up over runs
#
# A 3-node cluster on loopback for the broker-failure tests
# (tests/broker_cluster.rs), beside the broker above and without touching
# it: same epmd and cookie, its own node names, ports and directories.
#
#   rabbitmq.sh cluster-up       start setpoint-ha-{1,2,3}@localhost on AMQP
#                                ports 5681-5683 and join them (idempotent)
#   rabbitmq.sh cluster-down     stop the three nodes, remove their data
#   rabbitmq.sh cluster-stop N   stop node N (1-3)
#   rabbitmq.sh cluster-start N  start node N again; it rejoins
#   rabbitmq.sh cluster-status   exit 0 when the three nodes run clustered
set -euo pipefail

PORT=5672
# The tests' own user (tests/support/mod.rs names the same).
TEST_USER=setpoint-test
TEST_PASSWORD=amqp-pw-7c1e9b3f
# The consistent-hash exchange shards Applications over the worker queues.
PLUGINS=(rabbitmq_consistent_hash_exchange)

log() { printf '[rabbitmq] %s\n' "$*"; }
die() { printf '[rabbitmq] error: %s\n' "$*" >&2; exit 1; }

# An AMQP 0-9-1 handshake: send the protocol header, expect Connection.Start
# (a method frame, type 1, of class 10 method 10).
amqp_ready() {
  python3 - "${1:-$PORT}" <<'EOF'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    frame = s.recv(11)
    s.close()
    sys.exit(0 if len(frame) == 11 and frame[0] == 1 and frame[7:11] == b"\x00\x0a\x00\x0a" else 1)
except OSError:
    sys.exit(1)
EOF
}

install() {
  command -v rabbitmq-server >/dev/null 2>&1 && return 0
  log "installing rabbitmq-server from Debian's packages"
  # No init system here: keep the package's scripts from starting a service.
  local policy=/usr/sbin/policy-rc.d added=""
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
  fi
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null ||
    die "apt-get install rabbitmq-server failed"
  [[ -n "$added" ]] && rm -f "$policy"
  true
}

configure() {
  mkdir -p /etc/rabbitmq
  cat >/etc/rabbitmq/rabbitmq-env.conf <<EOF
# Written by Setpoint's tests/broker/rabbitmq.sh: a loopback-only node.
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$PORT
# Each durable queue holds a file handle while the node recovers it. With the
# soft limit su(1) leaves (1024 files), a node that holds more queues than
# that never finishes booting. The server sources this file as the rabbitmq
# user, so the limit is raised here, up to the hard limit.
ulimit -n "\$(ulimit -Hn)" 2>/dev/null || true
EOF
  local p
  for p in "${PLUGINS[@]}"; do
    grep -qw "$p" /etc/rabbitmq/enabled_plugins 2>/dev/null ||
      rabbitmq-plugins enable --offline "$p" >/dev/null
  done
}

cmd_up() {
  if amqp_ready; then
    log "already up on 127.0.0.1:$PORT"
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || die "python3 is missing: it checks the AMQP port"
  install
  configure
  log "starting rabbitmq-server on 127.0.0.1:$PORT"
  local start=$SECONDS
  rabbitmq-server -detached >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 300))
  until amqp_ready; do
    if ((SECONDS >= deadline)); then
      tail -n 30 /var/log/rabbitmq/rabbit@localhost.log >&2 2>/dev/null || true
      die "rabbitmq-server did not accept AMQP connections within 300s (log above)"
    fi
    sleep 0.5
  done
  log "up in $((SECONDS - start))s"
}

cmd_down() {
  if command -v rabbitmqctl >/dev/null 2>&1 && amqp_ready; then
    rabbitmqctl stop >/dev/null 2>&1 || true
    log "stopped"
  fi
}

cmd_fresh_vhost() {
  local vhost=${1:?usage: $0 fresh-vhost NAME}
  amqp_ready || die "rabbitmq-server is not up (make rabbitmq-up)"
  if rabbitmqctl list_vhosts -q 2>/dev/null | grep -qxF "$vhost"; then
    rabbitmqctl delete_vhost -q "$vhost" >/dev/null || die "could not delete vhost $vhost"
  fi
  rabbitmqctl add_vhost -q "$vhost" >/dev/null || die "could not create vhost $vhost"
  rabbitmqctl set_permissions -q -p "$vhost" guest '.*' '.*' '.*' >/dev/null ||
    die "could not grant guest access to vhost $vhost"
  # A user of its own with a password no other string contains, so a test
  # can look for the password in everything Setpoint wrote.
  if ! rabbitmqctl list_users -q 2>/dev/null | awk '{print $1}' | grep -qxF "$TEST_USER"; then
    rabbitmqctl add_user -q "$TEST_USER" "$TEST_PASSWORD" >/dev/null || die "could not add user $TEST_USER"
  fi
  rabbitmqctl set_permissions -q -p "$vhost" "$TEST_USER" '.*' '.*' '.*' >/dev/null ||
    die "could not grant $TEST_USER access to vhost $vhost"
  log "vhost $vhost is empty"
}


# The cluster's nodes: data under HA_DIR (the rabbitmq user must reach it,
# so not under root's home), node N on AMQP port HA_PORT_BASE+N and
# distribution port HA_DIST_BASE+N.
HA_DIR=${SETPOINT_HA_DIR:-/tmp/setpoint-rabbitmq-ha}
HA_PORT_BASE=5680
HA_DIST_BASE=25680
HA_NODES=(1 2 3)

ha_node() { printf 'setpoint-ha-%s@localhost' "$1"; }

# The environment rabbitmq-server and rabbitmqctl read for node N: its own
# env file instead of /etc/rabbitmq/rabbitmq-env.conf (the default node's).
ha_env() {
  local n=$1 dir="$HA_DIR/$1"
  printf 'RABBITMQ_NODENAME=%s RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=%s ' \
    "$(ha_node "$n")" "$((HA_PORT_BASE + n))"
  printf 'RABBITMQ_DIST_PORT=%s RABBITMQ_CONF_ENV_FILE=%s RABBITMQ_CONFIG_FILE=%s ' \
    "$((HA_DIST_BASE + n))" "$dir/rabbitmq-env.conf" "$dir/rabbitmq"
  printf 'RABBITMQ_MNESIA_BASE=%s RABBITMQ_LOG_BASE=%s RABBITMQ_ENABLED_PLUGINS_FILE=%s ' \
    "$dir/mnesia" "$dir/log" "$dir/enabled_plugins"
  printf 'RABBITMQ_PID_FILE=%s HOME=/var/lib/rabbitmq' "$dir/pid"
}

# Runs a RabbitMQ command for node N as the rabbitmq user (its cookie).
ha_as_rabbitmq() {
  local n=$1
  shift
  su rabbitmq -s /bin/sh -c "cd /var/lib/rabbitmq && env $(ha_env "$n") $*"
}

ha_ctl() {
  local n=$1
  shift
  ha_as_rabbitmq "$n" /usr/lib/rabbitmq/bin/rabbitmqctl -n "$(ha_node "$n")" "$@"
}

ha_ready() { amqp_ready "$((HA_PORT_BASE + $1))"; }

ha_configure() {
  local n=$1 dir="$HA_DIR/$1"
  mkdir -p "$dir/mnesia" "$dir/log"
  printf '%s\n' "# Written by tests/broker/rabbitmq.sh: node $n of the test cluster." \
    'ulimit -n "$(ulimit -Hn)" 2>/dev/null || true' >"$dir/rabbitmq-env.conf"
  # Loopback only; management is not enabled.
  printf '%s\n' "listeners.tcp.default = 127.0.0.1:$((HA_PORT_BASE + n))" >"$dir/rabbitmq.conf"
  printf '[%s].\n' "$(IFS=,; echo "${PLUGINS[*]}")" >"$dir/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$dir"
}

ha_start() {
  local n=$1
  ha_ready "$n" && return 0
  ha_configure "$n"
  ha_as_rabbitmq "$n" /usr/lib/rabbitmq/bin/rabbitmq-server -detached >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 300))
  until ha_ready "$n"; do
    if ((SECONDS >= deadline)); then
      tail -n 30 "$HA_DIR/$n/log/"*.log >&2 2>/dev/null || true
      die "node $(ha_node "$n") did not accept AMQP connections within 300s (log above)"
    fi
    sleep 0.5
  done
}

# Exit 0 when the running nodes are exactly the three.
ha_clustered() {
  local status
  status=$(ha_ctl 1 cluster_status --formatter json 2>/dev/null) || return 1
  python3 -c '
import json, sys
status = json.loads(sys.argv[1])
want = {"setpoint-ha-%d@localhost" % n for n in (1, 2, 3)}
sys.exit(0 if set(status.get("running_nodes", [])) == want else 1)
' "$status"
}

cmd_cluster_up() {
  install
  if ha_clustered; then
    log "cluster already up (AMQP on 127.0.0.1:$((HA_PORT_BASE + 1))-$((HA_PORT_BASE + 3)))"
    return 0
  fi
  # Anything else (some nodes down, or data left by nodes that died with the
  # machine) starts over from empty directories: a node that was clustered
  # waits at boot for the peers it last saw (Mnesia's "Waiting for tables"),
  # and those are started only after it answers. The data is the tests' own.
  if [[ -d "$HA_DIR" ]]; then
    log "starting over: removing the nodes' previous data in $HA_DIR"
    cmd_cluster_down >/dev/null
  fi
  mkdir -p "$HA_DIR"
  chown rabbitmq:rabbitmq "$HA_DIR"
  local n start=$SECONDS
  for n in "${HA_NODES[@]}"; do ha_start "$n"; done
  if ! ha_clustered; then
    for n in 2 3; do
      if ! ha_ctl 1 cluster_status 2>/dev/null | grep -q "$(ha_node "$n")"; then
        ha_ctl "$n" stop_app >/dev/null 2>&1
        ha_ctl "$n" reset >/dev/null 2>&1
        ha_ctl "$n" join_cluster "$(ha_node 1)" >/dev/null
        ha_ctl "$n" start_app >/dev/null 2>&1
      fi
    done
  fi
  local deadline=$((SECONDS + 120))
  until ha_clustered; do
    ((SECONDS < deadline)) || die "the three nodes did not form a cluster within 120s"
    sleep 0.5
  done
  log "cluster up (AMQP on 127.0.0.1:$((HA_PORT_BASE + 1))-$((HA_PORT_BASE + 3))) in $((SECONDS - start))s"
}

cmd_cluster_stop() {
  local n=${1:?usage: $0 cluster-stop N}
  ha_ctl "$n" stop >/dev/null 2>&1 || true
  local deadline=$((SECONDS + 60))
  while ha_ready "$n"; do
    ((SECONDS < deadline)) || die "node $(ha_node "$n") still answers after 60s"
    sleep 0.2
  done
}

# The beam process of node N, from its pid file, when it still runs.
ha_pid() {
  local n=$1 pid
  pid=$(cat "$HA_DIR/$n/pid" 2>/dev/null) || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null |
    grep -qxF "RABBITMQ_NODENAME=$(ha_node "$n")" || return 1
  echo "$pid"
}

# The data is removed, so the nodes are stopped with a signal rather than
# rabbitmqctl, which waits without end on a node that never finished booting.
cmd_cluster_down() {
  local n pid deadline
  for n in "${HA_NODES[@]}"; do
    pid=$(ha_pid "$n") || continue
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$HA_DIR"
  log "cluster down"
}

case "${1:-}" in
  up) cmd_up ;;
  fresh-vhost) cmd_fresh_vhost "${2:-}" ;;
  down) cmd_down ;;
  status) amqp_ready ;;
  cluster-up) cmd_cluster_up ;;
  cluster-down) cmd_cluster_down ;;
  cluster-stop) cmd_cluster_stop "${2:-}" ;;
  cluster-start) ha_start "${2:?usage: $0 cluster-start N}" ;;
  cluster-status) ha_clustered ;;
  *)
    echo "usage: $0 up|down|status|fresh-vhost NAME|cluster-up|cluster-down|cluster-stop N|cluster-start N|cluster-status" >&2
    exit 2
    ;;
esac
