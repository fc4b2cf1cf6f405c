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
  python3 - "$PORT" <<'EOF'
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

case "${1:-}" in
  up) cmd_up ;;
  fresh-vhost) cmd_fresh_vhost "${2:-}" ;;
  down) cmd_down ;;
  status) amqp_ready ;;
  *) echo "usage: $0 up|down|status|fresh-vhost NAME" >&2; exit 2 ;;
esac
