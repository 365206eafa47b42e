#!/usr/bin/env bash
# The hosts stay thin: no outcome decoding and no construction of the
# attempts or receipt documents in the TypeScript or Python host code. Those
# belong to the core (core/) and its two bindings (wasm/src, python/src).
#
#   tests/hosts_thin.sh [ROOT]     check ROOT (default: the repository)
#   tests/hosts_thin.sh --self-test
#                                  show that the check fails on a host file
#                                  that names a document schema or decodes an
#                                  outcome class, and on a tree without the
#                                  host code, and passes on a clean one
#
# What is looked for, in wasm/ts/*.ts and python/retryledger/*.py:
#   - the attempts or receipt schema name (`retryledger.attempts.v1`,
#     `retryledger.receipt.v1`): a host writing that document itself;
#   - `outcome_class`: a host reading or deciding an outcome's class.
# Allowed: the code tables generated from the core (wasm/ts/tables.ts,
# python/retryledger/_tables.py, checked against the core by `make
# tables-wasm` and the Python table test) and the TypeScript declarations of
# the documents (wasm/ts/types.ts), which describe fields and decode nothing.
set -euo pipefail

PATTERN='retryledger\.attempts\.v1|retryledger\.receipt\.v1|outcome_class'
ALLOWED='^(wasm/ts/tables\.ts|wasm/ts/types\.ts|python/retryledger/_tables\.py):'

check() {
  local root=$1 hits dir
  # A tree without the host code would pass by finding nothing: refused.
  for dir in wasm/ts python/retryledger; do
    [ -d "$root/$dir" ] || { echo "hosts-thin: no $dir under $root" >&2; return 2; }
  done
  hits=$(cd "$root" && grep -rnE "$PATTERN" wasm/ts python/retryledger --include='*.ts' --include='*.py' |
    grep -vE "$ALLOWED" || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: outcome decoding or document construction outside the core and its bindings:" >&2
    echo "$hits" >&2
    return 1
  fi
}

if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/wasm/ts" "$tmp/python/retryledger"
  printf 'export const kind = "dispatch";\n' >"$tmp/wasm/ts/driver.ts"
  printf '"retryledger.attempts.v1",\n' >"$tmp/wasm/ts/tables.ts"
  check "$tmp" || { echo "hosts-thin self-test: a clean tree was refused" >&2; exit 1; }
  # Each violation in a file of its own, removed again after its check.
  for bad in \
    'wasm/ts/session.ts:const doc = { schema: "retryledger.attempts.v1", attempts };' \
    'wasm/ts/fleet.ts:if (attempt.outcome_class === "retryable") retry();' \
    'python/retryledger/_driver.py:receipt = {"schema": "retryledger.receipt.v1"}'; do
    file=${bad%%:*}
    printf '%s\n' "${bad#*:}" >"$tmp/$file"
    if check "$tmp" 2>/dev/null; then
      echo "hosts-thin self-test: not caught: $bad" >&2
      exit 1
    fi
    rm "$tmp/$file"
  done
  rm -r "$tmp/python/retryledger"
  if check "$tmp" 2>/dev/null; then
    echo "hosts-thin self-test: a tree without python/retryledger passed" >&2
    exit 1
  fi
  echo "hosts-thin self-test: ok (a clean tree passes; 3 violations and a missing host directory are caught)"
  exit 0
fi

check "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
echo "hosts-thin: ok (no outcome decoding or document construction in wasm/ts or python/retryledger)"
