#!/usr/bin/env bash
# Run a command with a PostgreSQL server of its own: a throwaway cluster of
# Debian's postgresql (initdb) under target/postgres/<port>, listening on
# 127.0.0.1 on a free port (its unix socket in the same directory), trust
# authentication for the local user `retryledger`, database `retryledger`.
# DATABASE_URL and the libpq variables (PGHOST, PGPORT, PGUSER, PGDATABASE)
# tell the command where it is. The server is stopped when the command ends,
# whatever its exit status (also on a signal); the cluster is removed when the
# command succeeded and kept for a look when it failed.
#
#   tests/servers/with-postgres.sh <command> [args...]
#
# initdb and postgres refuse to run as root: run as root, the server runs as
# the `postgres` user (created by Debian's package; `nobody` otherwise) and
# owns its directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${PG_BIN:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$bin/postgres" ]; then
  # Another major version of Debian's package, the newest one there.
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
fi
[ -n "$bin" ] && [ -x "$bin/postgres" ] || { echo "postgresql is not installed (make setup-postgres)" >&2; exit 1; }
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
dir="$root/target/postgres/$port"
link=""
rm -rf "$dir" && mkdir -p "$dir"
as=()
if [ "$(id -u)" = 0 ]; then
  user=postgres
  id -u "$user" >/dev/null 2>&1 || user=nobody
  chown "$user" "$dir"
  as=(setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups --)
fi
# The server's user must reach the directory, and a unix socket path is at
# most 107 bytes: otherwise the cluster lives in a fresh directory under /tmp,
# linked from target/postgres/<port>.
if ! "${as[@]}" test -w "$dir" 2>/dev/null || [ "${#dir}" -gt 80 ]; then
  rmdir "$dir"
  link="$dir"
  dir="$(mktemp -d /tmp/retryledger-postgres.XXXXXX)"
  chmod 755 "$dir"
  [ "${#as[@]}" = 0 ] || chown "$user" "$dir"
  ln -s "$dir" "$link"
fi
"${as[@]}" "$bin/initdb" -D "$dir/data" -U retryledger --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
# listen_addresses: 127.0.0.1 only; the unix socket in $dir (a path under
# target/, not /var/run); fsync stays on (the benchmarks measure commits).
"${as[@]}" "$bin/postgres" -D "$dir/data" -h 127.0.0.1 -p "$port" -k "$dir" \
  -c max_connections=200 -c shared_buffers=32MB -c logging_collector=off \
  >"$dir/postgres.log" 2>&1 &
pid=$!
stopped=0
stop() {
  [ "$stopped" = 1 ] && return
  stopped=1
  # SIGINT: the fast shutdown (open sessions are ended, the cluster is left clean).
  kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
ready=0
for _ in $(seq 1 400); do
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U retryledger -d postgres; then ready=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
[ "$ready" = 1 ] || { cat "$dir/postgres.log" >&2; exit 1; }
"$bin/psql" -q -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U retryledger -d postgres \
  -c 'CREATE DATABASE retryledger' >/dev/null
export DATABASE_URL="postgresql://retryledger@127.0.0.1:$port/retryledger"
export PGHOST=127.0.0.1
export PGPORT="$port"
export PGUSER=retryledger
export PGDATABASE=retryledger
export POSTGRES_SERVER_PID="$pid"
export POSTGRES_DIR="$dir"
set +e
"$@"
status=$?
set -e
stop
if [ "$status" = 0 ]; then
  rm -rf "$dir"
  [ -z "$link" ] || rm -f "$link"
else
  echo "with-postgres.sh: the cluster is kept in ${link:-$dir}" >&2
fi
exit "$status"
