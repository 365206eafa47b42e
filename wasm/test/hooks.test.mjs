// Run hooks: onDecision, onSleep, onAttempt and onTerminal see the core's
// plain documents; a hook that throws is a HookWarning (code hook_failed,
// through process.emitWarning) and the run's decisions and receipt are what
// they are without hooks.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { FakeClock } from "../dist/testing.js";
import { KEY, policyWith, referencePolicy } from "./helpers.mjs";

const { AttemptError, HookWarning, RunStoppedError, runStream, runWithPolicy, verifyBundle } = rl;

/** @param {import("../dist/index.js").Step} step */
function flaky(step) {
  if (step.ordinal === 1) throw AttemptError.retryable("rate_limited", 250);
  if (step.ordinal === 2) throw AttemptError.retryable("unavailable");
  return `ok from ${step.routeId}`;
}

function seen() {
  /** @type {unknown[][]} */
  const log = [];
  return {
    log,
    hooks: {
      /** @param {unknown} d */ onDecision: (d) => log.push(["decision", d]),
      /** @param {unknown} s */ onSleep: (s) => log.push(["sleep", s]),
      /** @param {unknown} a @param {unknown} j */ onAttempt: (a, j) => log.push(["attempt", a, j]),
      /** @param {unknown} r */ onTerminal: (r) => log.push(["terminal", r]),
    },
  };
}

function raising() {
  const boom = () => {
    throw new Error("hook bug");
  };
  return { onDecision: boom, onSleep: boom, onAttempt: boom, onTerminal: boom };
}

/**
 * Collect the process warnings emitted while `fn` runs (and the ticks after it).
 * @template T
 * @param {() => Promise<T>} fn
 */
async function warningsDuring(fn) {
  /** @type {Error[]} */
  const warnings = [];
  const listener = (/** @type {Error} */ w) => warnings.push(w);
  process.on("warning", listener);
  try {
    const out = await fn();
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    return { out, warnings };
  } finally {
    process.off("warning", listener);
  }
}

async function plainRun() {
  const clock = new FakeClock();
  return runWithPolicy(referencePolicy(), flaky, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep });
}

test("hooks see the documents of the run, in order", async () => {
  const clock = new FakeClock();
  const s = seen();
  const run = await runWithPolicy(referencePolicy(), flaky, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep, ...s.hooks });
  assert.deepEqual(
    s.log.map((e) => e[0]),
    ["decision", "attempt", "decision", "sleep", "attempt", "decision", "sleep", "attempt", "decision", "terminal"],
  );
  const decisions = s.log.filter((e) => e[0] === "decision").map((e) => /** @type {any} */ (e[1]));
  const attempts = run.bundle.attempts.attempts;
  assert.equal(decisions.length, attempts.length + 1);
  attempts.forEach((attempt, i) => {
    assert.equal(decisions[i].kind, "dispatch");
    assert.equal(decisions[i].ordinal, attempt.ordinal);
    assert.equal(decisions[i].route_id, attempt.route_id);
    assert.ok(attempt.started_at_ms >= decisions[i].not_before_ms);
  });
  assert.deepEqual(decisions.at(-1), { kind: "terminal", terminal: "completed" });
  const sleeps = s.log.filter((e) => e[0] === "sleep").map((e) => /** @type {any} */ (e[1]));
  assert.deepEqual(sleeps.map((x) => x.ordinal), [2, 3]);
  for (const x of sleeps) {
    assert.equal(x.not_before_ms, decisions[x.ordinal - 1].not_before_ms);
    assert.equal(attempts[x.ordinal - 1]?.started_at_ms, x.not_before_ms);
    assert.equal(x.sleep_ms, x.not_before_ms - x.at_ms);
    assert.ok(x.sleep_ms > 0);
  }
  assert.ok(sleeps[0]?.sleep_ms >= 250, "the Retry-After floor");
  assert.deepEqual(s.log.filter((e) => e[0] === "attempt").map((e) => e[1]), attempts);
  assert.deepEqual(
    s.log.filter((e) => e[0] === "attempt").map((e) => /** @type {any} */ (e[2]).outcome.kind ?? /** @type {any} */ (e[2]).outcome.class),
    ["rate_limited", "unavailable", "success"],
  );
  assert.deepEqual(s.log.at(-1), ["terminal", run.receipt]);
  assert.equal(run.sealed.receipt_sha256, (await plainRun()).sealed.receipt_sha256);
});

test("a throwing hook is a coded warning and changes nothing", async () => {
  const clock = new FakeClock();
  const { out: run, warnings } = await warningsDuring(() =>
    runWithPolicy(referencePolicy(), flaky, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep, ...raising() }),
  );
  const hooks = warnings.filter((w) => w instanceof HookWarning);
  assert.equal(hooks.length, 10, "4 decisions, 2 sleeps, 3 attempts, 1 terminal");
  assert.deepEqual(new Set(hooks.map((w) => /** @type {any} */ (w).code)), new Set(["hook_failed"]));
  assert.deepEqual([...new Set(hooks.map((w) => /** @type {any} */ (w).hook))].sort(), ["onAttempt", "onDecision", "onSleep", "onTerminal"]);
  assert.ok(hooks.every((w) => /hook bug/.test(w.message) && /** @type {any} */ (w).error instanceof Error));
  assert.equal(run.sealed.receipt_sha256, (await plainRun()).sealed.receipt_sha256);
  assert.equal(verifyBundle(run.sealed.bundle_json).kind, "verified");
});

test("an async hook that rejects is a warning too", async () => {
  const clock = new FakeClock();
  const { out: run, warnings } = await warningsDuring(() =>
    runWithPolicy(referencePolicy(), flaky, {
      idempotencyKey: KEY,
      clock: clock.clock,
      sleep: clock.sleep,
      onTerminal: async () => {
        throw new Error("late hook bug");
      },
    }),
  );
  const hooks = warnings.filter((w) => w instanceof HookWarning);
  assert.equal(hooks.length, 1);
  assert.equal(/** @type {any} */ (hooks[0]).hook, "onTerminal");
  assert.equal(run.receipt.terminal, "completed");
});

test("a hook that mutates what it was given changes nothing", async () => {
  const clock = new FakeClock();
  const scribble = (/** @type {any} */ d) => {
    for (const k of Object.keys(d)) delete d[k];
    d.terminal = "forged";
  };
  const run = await runWithPolicy(referencePolicy(), flaky, {
    idempotencyKey: KEY,
    clock: clock.clock,
    sleep: clock.sleep,
    onDecision: scribble,
    onSleep: scribble,
    onAttempt: scribble,
    onTerminal: scribble,
  });
  assert.equal(run.receipt.terminal, "completed");
  assert.equal(run.sealed.receipt_sha256, (await plainRun()).sealed.receipt_sha256);
  assert.equal(verifyBundle(run.sealed.bundle_json).kind, "verified");
});

test("onTerminal sees a stopped run's receipt", async () => {
  const clock = new FakeClock();
  /** @type {unknown[]} */
  const receipts = [];
  const refused = () => {
    throw AttemptError.nonRetryable("invalid_request");
  };
  const err = await runWithPolicy(referencePolicy(), refused, {
    idempotencyKey: KEY,
    clock: clock.clock,
    sleep: clock.sleep,
    onTerminal: (r) => receipts.push(r),
  }).catch((e) => e);
  assert.ok(err instanceof RunStoppedError);
  assert.deepEqual(receipts, [err.sealed.receipt]);
  assert.equal(/** @type {any} */ (receipts[0]).terminal, "stop_non_retryable");
});

test("a stream run calls the hooks", async () => {
  const policy = policyWith((p) => {
    p.stream = { mode: "buffer", max_response_bytes: 64 };
  });
  const s = seen();
  const run = runStream(
    policy,
    async function* provider() {
      yield "a";
      yield "b";
    },
    { idempotencyKey: KEY, ...s.hooks },
  );
  /** @type {string[]} */
  const kinds = [];
  for await (const ev of run) kinds.push(ev.kind);
  assert.equal(kinds.at(-1), "commit");
  assert.deepEqual(s.log.map((e) => e[0]), ["decision", "attempt", "decision", "terminal"]);
  assert.deepEqual(s.log.at(-1), ["terminal", run.receipt]);
  const { warnings } = await warningsDuring(async () => {
    const again = runStream(
      policy,
      async function* provider() {
        yield "a";
        yield "b";
      },
      { idempotencyKey: KEY, ...raising() },
    );
    for await (const ev of again) void ev;
    assert.equal(again.receipt?.terminal, "completed");
  });
  assert.equal(warnings.filter((w) => w instanceof HookWarning).length, 4);
});
