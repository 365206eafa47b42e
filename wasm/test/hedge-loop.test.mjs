// runHedged on the host loop: the options every driver takes (fleet, clock
// and sleep, cancellation signal, hooks) and the one result shape (value,
// receipt, receipt_sha256, bundle), so otel.record takes a hedged run.
import { test } from "node:test";
import assert from "node:assert/strict";

import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import * as rl from "../dist/index.js";
import { runTelemetry } from "../dist/otel.js";
import { KEY, fakeTime, referencePolicy } from "./helpers.mjs";
import { fleetPolicy } from "./fleet-helpers.mjs";

/** A policy that hedges its lead on the fallback route after `delayMs`. */
function hedgedPolicy(delayMs = 20) {
  const p = referencePolicy();
  p.max_total_attempts = 6;
  for (const r of p.routes) r.max_attempts = 3;
  p.hedge = { cancelled_cost: "reserve", cost_share_percent: 50, delay_ms: delayMs, effects: "none", max_hedges: 1, routes: ["external-fallback"] };
  return p;
}

/** A lead that answers only when aborted (then rejects), a hedge that answers at once. @param {import("../dist/index.js").HedgeAttempt} a */
const slowLead = (a) =>
  a.hedges === undefined
    ? new Promise((_resolve, reject) => a.signal.addEventListener("abort", () => reject(a.signal.reason ?? new Error("aborted")), { once: true }))
    : Promise.resolve(`hedge of ${a.hedges}`);

test("a hedged run has the one result shape: otel.record takes it, its digest is the receipt's", async () => {
  const run = await rl.runHedged(hedgedPolicy(), slowLead, { idempotencyKey: KEY });
  assert.equal(run.terminal, "completed");
  assert.equal(run.value, "hedge of 1");
  assert.equal(run.result, run.value);
  assert.equal(run.receipt_sha256, rl.digest(run.receipt));
  assert.equal(rl.verifyBundle(run.bundle_json).kind, "verified");
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const spans = runTelemetry({ tracer: provider.getTracer("test") }).record(run);
  assert.equal(spans.run.attributes["retryledger.receipt_sha256"], run.receipt_sha256);
  assert.equal(exporter.getFinishedSpans().length, 1 + run.bundle.attempts.attempts.length);
});

test("hooks see every decision, every observed attempt and the receipt, and cannot change the run", async () => {
  /** @type {string[]} */
  const seen = [];
  const run = await rl.runHedged(hedgedPolicy(), slowLead, {
    idempotencyKey: KEY,
    onDecision: (d) => {
      seen.push(d.kind === "dispatch" ? `dispatch:${d.ordinal}:${d.route_id}` : `terminal:${d.terminal}`);
      /** @type {Record<string, unknown>} */ (/** @type {unknown} */ (d))["ordinal"] = 99; // a copy: the run is not changed
    },
    onAttempt: (a, j) => seen.push(`attempt:${a.ordinal}:${j.rule}`),
    onTerminal: (r) => seen.push(`receipt:${r.terminal}`),
  });
  assert.equal(run.terminal, "completed");
  assert.deepEqual(seen, ["dispatch:1:private-primary", "dispatch:2:external-fallback", "attempt:2:returned", "terminal:completed", "receipt:completed"]);
  assert.deepEqual(run.receipt.hedge?.losers.map((l) => [l.ordinal, l.reason]), [[1, "cancelled"]]);
});

test("an injected clock and sleep drive a retried round, and onSleep sees the wait", async () => {
  const time = fakeTime();
  /** @type {object[]} */
  const sleeps = [];
  let n = 0;
  const run = await rl.runHedged(
    hedgedPolicy(4000),
    async () => {
      n += 1;
      time.advance(10);
      if (n === 1) throw rl.AttemptError.retryable("rate_limited");
      return "second";
    },
    { idempotencyKey: KEY, clock: time.clock, sleep: (ms) => time.sleep(ms), onSleep: (s) => sleeps.push(s) },
  );
  assert.equal(run.terminal, "completed");
  assert.equal(run.value, "second");
  assert.equal(run.attempts, 2);
  const [first, second] = run.bundle.attempts.attempts;
  assert.equal(first?.completed_at_ms, 10);
  assert.equal(sleeps.length, 1);
  const s = /** @type {import("../dist/index.js").PlannedSleep} */ (sleeps[0]);
  assert.deepEqual(s, { ordinal: 2, route_id: second?.route_id, at_ms: 10, not_before_ms: second?.started_at_ms, sleep_ms: s.sleep_ms });
  assert.ok(s.sleep_ms > 0);
  assert.deepEqual(time.state.sleeps, [s.sleep_ms]);
});

test("the caller's signal aborts the attempts in flight (indeterminate) or stops the run between rounds", async () => {
  const policy = hedgedPolicy(4000);
  const during = new AbortController();
  const run = await rl.runHedged(
    policy,
    (a) => {
      setTimeout(() => during.abort(), 5);
      return slowLead(a);
    },
    { idempotencyKey: KEY, signal: during.signal },
  );
  // An attempt cut by the caller is judged cancelled: indeterminate, never retried.
  assert.equal(run.terminal, "stop_indeterminate");
  assert.equal(run.value, undefined);
  assert.equal(run.attempts, 1);
  assert.equal(rl.verifyBundle(run.bundle_json).kind, "verified");
  // Between rounds (the wait after a retryable failure): the run stops cancelled, nothing more sent.
  const between = new AbortController();
  let sent = 0;
  const stopped = await rl.runHedged(
    policy,
    async () => {
      sent += 1;
      setTimeout(() => between.abort(), 5);
      throw rl.AttemptError.retryable("rate_limited");
    },
    { idempotencyKey: KEY, signal: between.signal },
  );
  assert.equal(stopped.terminal, "stop_cancelled");
  assert.equal(sent, 1);
  assert.equal(stopped.bundle.attempts.cancelled_at_ms !== undefined, true);
  assert.equal(rl.verifyBundle(stopped.bundle_json).kind, "verified");
});

test("under a fleet every lead and hedge is admitted and the winner recorded on its route's breaker", async () => {
  const store = new rl.MemoryStore();
  const fleet = new rl.Fleet(store);
  const policy = fleetPolicy({}, (p) => {
    p.max_total_attempts = 6;
    for (const r of p.routes) r.max_attempts = 3;
    p.hedge = { cancelled_cost: "reserve", cost_share_percent: 50, delay_ms: 20, effects: "none", max_hedges: 1, routes: ["external-fallback"] };
  });
  const run = await rl.runHedged(policy, slowLead, { idempotencyKey: KEY, fleet });
  assert.equal(run.terminal, "completed");
  assert.equal(run.value, "hedge of 1");
  for (const a of run.bundle.attempts.attempts) assert.ok(a.admission !== undefined, `attempt ${a.ordinal} admitted`);
  const { document } = await store.get(`retryledger/breaker/${run.bundle.attempts.attempts[1]?.route_release_sha256}`);
  assert.ok(document !== null, "the hedge's route has a breaker record");
  await assert.rejects(
    rl.runHedged(policy, slowLead, { idempotencyKey: KEY }),
    (e) => e instanceof rl.DriftError && e.code === "admission_missing",
  );
});
