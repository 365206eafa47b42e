#!/usr/bin/env bash
# Run a command with a Redis server of its own: Debian's redis-server on
# 127.0.0.1 on a free port, its data under target/redis/<port>, no
# persistence; REDIS_URL tells the command where it is. The server is stopped
# when the command ends, whatever its exit status (also on a signal).
#
#   tests/servers/with-redis.sh <command> [args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v redis-server >/dev/null || { echo "redis-server is not installed (make setup-redis)" >&2; exit 1; }
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
dir="$root/target/redis/$port"
rm -rf "$dir" && mkdir -p "$dir"
redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save "" --appendonly no \
  --daemonize no --logfile "$dir/redis.log" --protected-mode yes &
pid=$!
stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap stop EXIT INT TERM
for _ in $(seq 1 200); do
  if redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then break; fi
  kill -0 "$pid" 2>/dev/null || { cat "$dir/redis.log" >&2; exit 1; }
  sleep 0.05
done
redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null
export REDIS_URL="redis://127.0.0.1:$port/0"
export REDIS_SERVER_PID="$pid"
export REDIS_PORT="$port"
export REDIS_DIR="$dir"
set +e
"$@"
status=$?
exit "$status"
