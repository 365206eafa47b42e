// A worker process for the journal crash tests (journal-crash.test.mjs), the
// same as python/tests/journal_child.py:
//
//   node journal-child.mjs '{"mode": "run"|"resume", "backend", "target", "runId", "url"}'
//
// prints the run's end as JSON. The run clock is virtual (sleep advances it,
// every call takes 100 ms) and starts, on resume, where the journal left off.
// Crash points from the environment: JOURNAL_KILL_AFTER_SEQ=k (SIGKILL right
// after seq k is appended), JOURNAL_KILL_AFTER_CLAIM=1 (right after the lease
// claim, before `created`), JOURNAL_KILL_AFTER_CALL=n (after attempt n's
// answer, before its observation), JOURNAL_PAUSE_AFTER_CALL=n with
// JOURNAL_PAUSE_DIR (create `paused`, wait for `go`, then go on as the fenced
// old owner and offer its event raw to the store).
import fs from "node:fs";
import path from "node:path";

import * as rl from "../dist/index.js";
import { KEY, referencePolicy } from "./helpers.mjs";

// `node --test test/` runs every module here: without arguments this is not a worker.
if (process.argv[2] === undefined) process.exit(0);

const T0 = 1_780_000_000_000;
const LATENCY_MS = 100;
const args = JSON.parse(process.argv[2] ?? "{}");
const env = (/** @type {string} */ n) => (process.env[n] === undefined || process.env[n] === "" ? undefined : Number(process.env[n]));
const killSeq = env("JOURNAL_KILL_AFTER_SEQ");
const killCall = env("JOURNAL_KILL_AFTER_CALL");
const pauseCall = env("JOURNAL_PAUSE_AFTER_CALL");
const pauseDir = process.env.JOURNAL_PAUSE_DIR ?? ".";

/** @type {any} */
let store;
if (args.backend === "sqlite") {
  const { SQLiteStore } = await import("../dist/stores/sqlite.js");
  store = new SQLiteStore(args.target);
} else {
  const { PostgresStore } = await import("../dist/stores/postgres.js");
  store = new PostgresStore({ connectionString: args.target, connectTimeoutMs: 10000, statementTimeoutMs: 10000, max: 1 });
}
if (env("JOURNAL_KILL_AFTER_CLAIM") === 1) {
  // SIGKILL right after the lease claim commits, before `created` is appended.
  const cas = store.compareAndSet.bind(store);
  store.compareAndSet = async (/** @type {string} */ k, /** @type {number} */ g, /** @type {any} */ d) => {
    const written = await cas(k, g, d);
    if (written.ok) process.kill(process.pid, "SIGKILL");
    return written;
  };
}
const log = rl.journalLog(args.runId);
const held = (await store.read(log, 0)).map((/** @type {{text: string}} */ e) => JSON.parse(e.text));
let start = 0;
if (args.mode === "resume") {
  for (const e of held) {
    if (e.kind === "dispatched") start = Math.max(start, e.started_at_ms);
    if (e.kind === "observed") start = Math.max(start, e.attempt.completed_at_ms);
  }
}
let now = T0 + start;
const clock = () => now;
const sleep = async (/** @type {number} */ ms) => {
  now += ms;
};
const policy = rl.compilePolicy(referencePolicy());

/** @param {rl.JournalStep} step */
async function dispatch(step) {
  const res = await fetch(`${args.url}/attempt`, {
    method: "POST",
    body: "{}",
    headers: {
      "idempotency-key": step.idempotencyKey,
      "x-run": args.runId,
      "x-ordinal": String(step.ordinal),
      "x-route": step.routeId,
      "x-route-ordinal": String(step.routeOrdinal),
    },
  });
  const body = await res.text();
  now += LATENCY_MS;
  if (killCall === step.ordinal) process.kill(process.pid, "SIGKILL");
  if (pauseCall === step.ordinal) {
    fs.writeFileSync(path.join(pauseDir, "paused"), "1");
    while (!fs.existsSync(path.join(pauseDir, "go"))) await new Promise((r) => setTimeout(r, 20));
  }
  if (res.status === 200) {
    step.charge(step.reserveCost);
    return body;
  }
  step.charge(0);
  if (res.status === 429) throw rl.AttemptError.retryable("rate_limited", 250);
  throw rl.AttemptError.retryable("unavailable");
}

/** @param {rl.ReconcileQuestion} attempt */
async function reconcile(attempt) {
  const res = await fetch(`${args.url}/status?run=${encodeURIComponent(args.runId)}&ordinal=${attempt.ordinal}`, {
    headers: { "idempotency-key": attempt.idempotency_key },
  });
  return /** @type {rl.ReconcileAnswer} */ (await res.json());
}

/** @type {Record<string, unknown>} */
let result;
const options = {
  idempotencyKey: KEY,
  store,
  runId: args.runId,
  clock,
  sleep,
  reconcile,
  onAppend: (/** @type {rl.JournalEvent} */ e) => {
    if (killSeq === e.seq) process.kill(process.pid, "SIGKILL");
  },
};
/** @param {rl.JournaledEnd} r */
const endOf = (r) => ({
  terminal: r.terminal,
  receipt_sha256: r.receiptSha256,
  bundle: JSON.stringify(r.bundle),
  reconciled: r.reconciled,
  lease_generation: r.leaseGeneration,
});
try {
  const r = args.mode === "run" ? await rl.runJournaled(policy, dispatch, options) : await rl.resumeJournaled(policy, dispatch, options);
  result = { ...endOf(r), value: r.result ?? null };
} catch (e) {
  if (e instanceof rl.JournaledStopError) result = { ...endOf(e), value: null };
  else if (e instanceof rl.JournaledRunError && e.code === "lease_lost") {
    const now = (await store.read(log, 0)).map((/** @type {{text: string}} */ x) => JSON.parse(x.text));
    let rawOk = null;
    let classified = null;
    if (e.event !== undefined && e.seq !== undefined) {
      rawOk = (await store.append(log, e.seq, JSON.stringify(e.event))).ok;
      classified = rl.journalClassify(policy, now, e.event);
    }
    result = { lease_lost: true, code: e.code, seq: e.seq, evidence: e.evidence ?? null, raw_append_ok: rawOk, classified };
  } else throw e;
}
await store.close?.();
process.stdout.write(JSON.stringify(result));
