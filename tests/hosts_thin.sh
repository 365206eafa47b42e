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
#   - an `Idempotency-Key` rule of the host's own (a printable-ASCII test:
#     `isprintable()`, a `\x20-\x7e` class) or a digest made with `hashlib`
#     in the receiver's guard: the key rule and the request and response
#     digests are the core's (core/src/receiver.rs).
#   - in the host loops (wasm/ts/loop.ts, python/retryledger/_loop.py), any
#     field a decision is made from (`not_before_ms`, `delay_ms`,
#     `reserve_cost`, `deadline_ms`, a Retry-After hint, an outcome, its
#     class, a judgement's rule) or a journal event's kind: the loop carries
#     effects out and answers them, the machine decides what comes next;
#   - the live machine of the bindings (`LiveMachine`, `_core.Machine`)
#     outside the host loops: one loop per language drives it;
#   - a repair's idempotency key made in a host (`:repair:` followed by a
#     template or f-string substitution): the core's `repair_step` names it;
#   - a driver on the loop (the hedged runs, the async jobs, the journaled
#     runs, the Temporal workflow helper, the streams and, in Python, the
#     plain async runs without a fleet: wasm/ts/{hedge,job,journaled,
#     temporal,stream}.ts, python/retryledger/{_plain,hedge,job,journaled,
#     temporal,_stream}.py) that does not call the loop (`runLoop(` /
#     `run_loop(`), or that steps a session itself (`session.next()`,
#     `startAttempt`, a `new HedgeSession(`, the plain driver's
#     `next_attempt`) or hands its run to the plain driver's loop
#     (`runWithPolicy(`, `_run(`);
#   - a host-side policy refusal: a section of the policy read (`policy.fleet`,
#     `document.get("stream")`, `"fleet" in compiled.document`, ...) and a
#     coded error thrown or raised within the next lines. What a driver needs
#     or cannot carry, and whether a fleet fits, is the core's to refuse
#     (`requireDriver` / `require_driver`, `requireFleet` / `require_fleet`,
#     `requireJobCalls` / `require_job_calls`; docs/COMPOSITION.md).
# Allowed: the code tables generated from the core (wasm/ts/tables.ts,
# python/retryledger/_tables.py, checked against the core by `make
# tables-wasm` and the Python table test) and the TypeScript declarations of
# the documents (wasm/ts/types.ts), which describe fields and decode nothing.
set -euo pipefail

PATTERN='retryledger\.attempts\.v1|retryledger\.receipt\.v1|outcome_class|isprintable\(\)|\\x20-\\x7e'
RECEIVER_PATTERN='hashlib'
RECEIVERS=(python/retryledger/receiver.py)
ALLOWED='^(wasm/ts/tables\.ts|wasm/ts/types\.ts|python/retryledger/_tables\.py):'
LOOPS=(wasm/ts/loop.ts python/retryledger/_loop.py)
LOOP_PATTERN='not_before_ms|delay_ms|reserve_cost|deadline_ms|retry_after|outcome|\.class\b|\["class"\]|\brule\b|"(created|reserved|dispatched|decided)"'
MACHINE_PATTERN='LiveMachine|_core\.Machine\b'
LOOP_FILES='^(wasm/ts/loop\.ts|python/retryledger/_loop\.py):'
ON_LOOP=(wasm/ts/hedge.ts wasm/ts/job.ts wasm/ts/journaled.ts wasm/ts/temporal.ts wasm/ts/stream.ts
  python/retryledger/_plain.py python/retryledger/hedge.py python/retryledger/job.py python/retryledger/journaled.py
  python/retryledger/temporal.py python/retryledger/_stream.py)
SECTIONS='fleet|stream|hedge|async_job|repair'
SECTION_READ='policy\.('"$SECTIONS"')([^A-Za-z_]|$)|(document|doc)(\.get\(|\[)"('"$SECTIONS"')"|"('"$SECTIONS"')" (not )?in [A-Za-z_.]*(document|doc)([^A-Za-z_]|$)'
# A section read, then a coded error thrown or raised within the next 6 lines.
REFUSAL_AWK='FNR == 1 { armed = 0 }
{
  if ($0 ~ ENVIRON["SECTION_READ"]) { armed = 6; at = FNR; what = $0 } else if (armed > 0) armed--
  if (armed > 0 && $0 ~ /(throw new [A-Za-z]*Error\(|raise [A-Za-z]*Error\()/) { printf "%s:%d:%s\n", FILENAME, at, what; armed = 0 }
}'
# A repair's key made in a host (a template or an f-string after `:repair:`): the core names it (repair_step).
REPAIR_KEY_PATTERN=':repair:(\$\{|\{)'
OWN_LOOP_PATTERN='session\.(next|startAttempt|start_attempt|observe|cancelled)\(|new HedgeSession\(|= HedgeSession\(|runWithPolicy\(|\b_run(_async)?\(|\bnext_attempt(_async)?\('

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
  hits=$(cd "$root" && grep -rnE "$REPAIR_KEY_PATTERN" wasm/ts python/retryledger --include='*.ts' --include='*.py' || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: a repair's idempotency key made in a host (the core's repair_step names it):" >&2
    echo "$hits" >&2
    return 1
  fi
  hits=$(cd "$root" && for f in "${RECEIVERS[@]}"; do [ ! -f "$f" ] || grep -nHE "$RECEIVER_PATTERN" "$f"; done || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: a digest made in the receiver's guard (the core's http_request_sha256 / http_response_sha256):" >&2
    echo "$hits" >&2
    return 1
  fi
  for f in "${LOOPS[@]}"; do
    [ -f "$root/$f" ] || { echo "hosts-thin: no host loop $f under $root" >&2; return 2; }
  done
  hits=$(cd "$root" && grep -nHE "$LOOP_PATTERN" "${LOOPS[@]}" || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: a decision field read in a host loop (the machine decides):" >&2
    echo "$hits" >&2
    return 1
  fi
  hits=$(cd "$root" && grep -rnE "$MACHINE_PATTERN" wasm/ts python/retryledger --include='*.ts' --include='*.py' |
    grep -vE "$LOOP_FILES" || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: the run machine driven outside the host loops:" >&2
    echo "$hits" >&2
    return 1
  fi
  for f in "${ON_LOOP[@]}"; do
    [ -f "$root/$f" ] || continue
    if ! grep -qE 'runLoop\(|run_loop\(' "$root/$f"; then
      echo "hosts-thin: $f does not run on the host loop" >&2
      return 1
    fi
  done
  hits=$(cd "$root" && for f in "${ON_LOOP[@]}"; do [ -f "$f" ] && grep -nHE "$OWN_LOOP_PATTERN" "$f"; done || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: a driver on the host loop steps a session or the plain driver's loop itself:" >&2
    echo "$hits" >&2
    return 1
  fi
  hits=$(cd "$root" && find wasm/ts python/retryledger -maxdepth 1 \( -name '*.ts' -o -name '*.py' \) -print0 | sort -z |
    SECTION_READ="$SECTION_READ" xargs -0 awk "$REFUSAL_AWK" | grep -vE "$ALLOWED" || true)
  if [ -n "$hits" ]; then
    echo "hosts-thin: a policy refused in a host (the core's requireDriver / require_driver, requireFleet / require_fleet):" >&2
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
  printf 'const m = b.LiveMachine.start(p, o);\n' >"$tmp/wasm/ts/loop.ts"
  printf 'machine = _core.Machine.start(p, o)\n' >"$tmp/python/retryledger/_loop.py"
  printf 'return runLoop(machine, adapter);\n' >"$tmp/wasm/ts/hedge.ts"
  printf 'run = pump(run_loop(machine, adapter), adapter)\n' >"$tmp/python/retryledger/job.py"
  check "$tmp" || { echo "hosts-thin self-test: a clean tree was refused" >&2; exit 1; }
  # Each violation in a file of its own, removed again after its check.
  for bad in \
    'wasm/ts/session.ts:const doc = { schema: "retryledger.attempts.v1", attempts };' \
    'wasm/ts/fleet.ts:if (attempt.outcome_class === "retryable") retry();' \
    'python/retryledger/_driver.py:receipt = {"schema": "retryledger.receipt.v1"}' \
    'wasm/ts/hooks.ts:const m = b.LiveMachine.start(p, o);' \
    'python/retryledger/journaled.py:machine = _core.Machine.start(p, o)' \
    'python/retryledger/receiver.py:if not raw.isprintable(): return bad()' \
    'wasm/ts/receiver.ts:const printableAscii = /^[\x20-\x7e]+$/;' \
    'python/retryledger/receiver.py:digest = hashlib.sha256(body).hexdigest()' \
    'wasm/ts/repair.ts:const nextKey = `${rootKey}:repair:${n}`;' \
    'python/retryledger/_repair.py:key = f"{self.root_key}:repair:{ordinal}"'; do
    file=${bad%%:*}
    printf '%s\n' "${bad#*:}" >"$tmp/$file"
    if check "$tmp" 2>/dev/null; then
      echo "hosts-thin self-test: not caught: $bad" >&2
      exit 1
    fi
    rm "$tmp/$file"
  done
  # A decision in a host loop: appended to the loop, then the loop restored.
  for bad in \
    'wasm/ts/loop.ts:if (effect.dispatch.not_before_ms > now) await sleep();' \
    'wasm/ts/loop.ts:if (judgement.rule === "retryable") again();' \
    'python/retryledger/_loop.py:if attempt["outcome"]["class"] == "retryable": again()' \
    'python/retryledger/_loop.py:if event["kind"] == "decided": plan()'; do
    file=${bad%%:*}
    cp "$tmp/$file" "$tmp/$file.clean"
    printf '%s\n' "${bad#*:}" >>"$tmp/$file"
    if check "$tmp" 2>/dev/null; then
      echo "hosts-thin self-test: not caught: $bad" >&2
      exit 1
    fi
    mv "$tmp/$file.clean" "$tmp/$file"
  done
  # A driver on the loop that steps a session or the plain loop itself, or
  # does not call the loop: appended to it (or it replaced), then restored.
  for bad in \
    'wasm/ts/hedge.ts:step = session.startAttempt(d.ordinal, now());' \
    'wasm/ts/hedge.ts:const session = new HedgeSession(compiled);' \
    'python/retryledger/job.py:return _run(compiled, dispatch, idempotency_key, **options)' \
    'wasm/ts/job.ts:return await runWithPolicy(compiled, dispatch, options);' \
    'wasm/ts/stream.ts:let decision = session.next();' \
    'python/retryledger/_stream.py:plan, now = _SYNC_LOOP.next_attempt(host, clock, t0, sleep)'; do
    file=${bad%%:*}
    [ -f "$tmp/$file" ] && cp "$tmp/$file" "$tmp/$file.clean"
    printf '%s\n' "${bad#*:}" >>"$tmp/$file"
    if check "$tmp" 2>/dev/null; then
      echo "hosts-thin self-test: not caught: $bad" >&2
      exit 1
    fi
    if [ -f "$tmp/$file.clean" ]; then mv "$tmp/$file.clean" "$tmp/$file"; else rm "$tmp/$file"; fi
  done
  # A policy refused in a host: a section read, then a coded error.
  for bad in \
    'wasm/ts/temporal.ts:if (compiled.policy.fleet !== undefined) {\n  throw new DriftError("admission_missing", "no fleet store in a workflow", { path: "/fleet" });\n}' \
    'wasm/ts/job.ts:const section = compiled.policy.async_job;\nif (section === undefined) {\n  throw new PolicyError("invalid_async_job", "a job needs an async_job section", { path: "/async_job" });\n}' \
    'python/retryledger/temporal.py:if "stream" in compiled.document:\n    raise DriftError("stream_record_missing", "no stream record in a workflow", "/stream")' \
    'python/retryledger/_driver.py:if fleet is not None and compiled.document.get("fleet") is None:\n    raise DriftError("admission_unexpected", "a fleet without a section", "/fleet")' \
    'python/retryledger/langchain.py:mode = (call.policy.document.get("stream") or {}).get("mode")\nif mode in ("tentative", "continuation"):\n    raise PolicyError("stream_mode_unsupported", "no take-back", "/stream/mode")'; do
    file=${bad%%:*}
    [ -f "$tmp/$file" ] && cp "$tmp/$file" "$tmp/$file.clean"
    printf '%b\n' "${bad#*:}" >>"$tmp/$file"
    # A driver file on the loop needs the loop call, so that only the refusal is the violation.
    printf 'return runLoop(machine, adapter); run_loop(machine, adapter)\n' >>"$tmp/$file"
    if check "$tmp" 2>"$tmp/why"; then
      echo "hosts-thin self-test: not caught: $bad" >&2
      exit 1
    fi
    grep -q "a policy refused in a host" "$tmp/why" || { echo "hosts-thin self-test: caught for another reason: $bad" >&2; cat "$tmp/why" >&2; exit 1; }
    if [ -f "$tmp/$file.clean" ]; then mv "$tmp/$file.clean" "$tmp/$file"; else rm "$tmp/$file"; fi
  done
  # The core's check in their place passes, and so does a section read with no refusal after it.
  cp "$tmp/wasm/ts/hedge.ts" "$tmp/hedge.ts.clean" && cp "$tmp/python/retryledger/job.py" "$tmp/job.py.clean"
  printf '%s\n' 'compiled.requireDriver("workflow");' 'const contract = compiled.policy.stream;' 'const live = contract?.mode !== "buffer";' >>"$tmp/wasm/ts/hedge.ts"
  printf '%s\n' 'compiled._compiled.require_fleet(fleet is not None)' 'contract = compiled.document["stream"]' >>"$tmp/python/retryledger/job.py"
  check "$tmp" || { echo "hosts-thin self-test: the core's refusals in place of a host's were refused" >&2; exit 1; }
  mv "$tmp/hedge.ts.clean" "$tmp/wasm/ts/hedge.ts" && mv "$tmp/job.py.clean" "$tmp/python/retryledger/job.py"
  cp "$tmp/wasm/ts/hedge.ts" "$tmp/hedge.ts.clean"
  printf 'for (;;) { step = await plan(); }\n' >"$tmp/wasm/ts/hedge.ts"
  if check "$tmp" 2>/dev/null; then
    echo "hosts-thin self-test: a driver off the host loop passed" >&2
    exit 1
  fi
  mv "$tmp/hedge.ts.clean" "$tmp/wasm/ts/hedge.ts"
  check "$tmp" || { echo "hosts-thin self-test: the restored tree was refused" >&2; exit 1; }
  rm "$tmp/wasm/ts/loop.ts"
  if check "$tmp" 2>/dev/null; then
    echo "hosts-thin self-test: a tree without the TypeScript host loop passed" >&2
    exit 1
  fi
  printf 'const m = b.LiveMachine.start(p, o);\n' >"$tmp/wasm/ts/loop.ts"
  rm -r "$tmp/python/retryledger"
  if check "$tmp" 2>/dev/null; then
    echo "hosts-thin self-test: a tree without python/retryledger passed" >&2
    exit 1
  fi
  echo "hosts-thin self-test: ok (a clean tree passes; 25 violations (5 of them policy refusals in a host), a driver off the loop, a missing host loop and a missing host directory are caught)"
  exit 0
fi

check "${1:-$(cd "$(dirname "$0")/.." && pwd)}"
echo "hosts-thin: ok (no outcome decoding or document construction in wasm/ts or python/retryledger; no repair key made in a host; no decision field in the host loops, the machine driven only by them, the hedged, job, journaled, Temporal and stream drivers and the Python async plain driver on them, and no policy refused in a host)"
