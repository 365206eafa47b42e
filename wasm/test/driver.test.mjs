// runWithPolicy: plans with the core, waits, dispatches, classifies, seals.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, policyWith, referencePolicy } from "./helpers.mjs";

const { AttemptError, runWithPolicy, verifyBundle } = rl;

/**
 * A scripted dispatch on a fake clock: each entry takes `ms`, charges `cost`,
 * then returns `value` or throws `error`.
 * @param {ReturnType<typeof fakeTime>} time
 * @param {{ms: number, cost?: number, error?: unknown, value?: unknown}[]} script
 */
function scripted(time, script) {
  /** @type {import("../dist/index.js").Step[]} */
  const steps = [];
  /** @param {import("../dist/index.js").Step} step */
  const dispatch = async (step) => {
    steps.push(step);
    const s = script[steps.length - 1];
    if (s === undefined) throw new Error("dispatched beyond the script");
    time.advance(s.ms);
    if (s.cost !== undefined) step.charge(s.cost);
    if (s.error !== undefined) throw s.error;
    return s.value;
  };
  return { steps, dispatch };
}

test("the reference run through the driver seals the lab's baseline, byte for byte", async () => {
  const time = fakeTime();
  const { steps, dispatch } = scripted(time, [
    { ms: 1100, cost: 0, error: AttemptError.retryable("rate_limited", 250) },
    { ms: 100, cost: 0, error: AttemptError.retryable("unavailable") },
    { ms: 750, cost: 1800, value: "summary" },
  ]);
  const run = await runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  assert.equal(run.result, "summary");
  assert.equal(run.receipt.terminal, "completed");
  // The pinned digests of README's reference run.
  assert.equal(run.receipt.attempts_sha256, "0a285a76dcde80217687bdbce992d32afe25ffc7141bc5c5cecab45f7207c602");
  assert.equal(run.receipt.policy_sha256, "83f8b0c2fa4cd912d3a35f6bc6a2545edc7c774bd40afa121dee48f9c9d52c60");
  assert.equal(rl.digest(run.receipt), "1411cb304ad8ee0f4bab1b6bda72103dd7dfe7dbd601c0572c354423bee7d987");
  assert.deepEqual(
    steps.map((s) => [s.ordinal, s.routeId, s.routeOrdinal, s.startedAtMs, s.remainingMs, s.reserveCost, s.idempotencyKey]),
    [
      [1, "private-primary", 1, 0, 5000, 1500, KEY],
      [2, "private-primary", 2, 1350, 3650, 1500, KEY],
      [3, "external-fallback", 1, 1650, 3350, 3000, KEY],
    ],
  );
  // No timer for the first attempt (wait 0); one sleep to each later not_before.
  assert.deepEqual(time.state.sleeps, [250, 200]);
  const verdict = verifyBundle(run.bundle);
  assert.equal(verdict.kind, "verified");
});

test("the idempotency key must hash to the policy's digest, checked before any dispatch", async () => {
  let calls = 0;
  await assert.rejects(
    runWithPolicy(referencePolicy(), () => ++calls, { idempotencyKey: "another key" }),
    (e) => e instanceof rl.DriftError && e.code === "idempotency_key_drift" && e.path === "/idempotency_key_sha256",
  );
  await assert.rejects(
    // @ts-expect-error the key is required
    runWithPolicy(referencePolicy(), () => ++calls, {}),
    (e) => e instanceof rl.DecodeError && e.code === "missing_field",
  );
  assert.equal(calls, 0);
});

test("runWithPolicy always answers with a promise: what fails before the run rejects it, never throws", () => {
  let calls = 0;
  /** @type {unknown[]} */
  const got = [];
  // A policy the core refuses, options whose reading throws, a dispatch that is not a function.
  const runs = [
    () => runWithPolicy({ ...referencePolicy(), retry_owner: "transport_sdk" }, () => ++calls, { idempotencyKey: KEY }),
    () =>
      runWithPolicy(
        referencePolicy(),
        () => ++calls,
        /** @type {import("../dist/index.js").RunOptions} */ (
          new Proxy(
            {},
            {
              get() {
                throw new Error("options unreadable");
              },
            },
          )
        ),
      ),
    // @ts-expect-error dispatch must be a function
    () => runWithPolicy(referencePolicy(), 42, { idempotencyKey: KEY }),
  ];
  for (const run of runs) {
    const p = run();
    assert.ok(p instanceof Promise);
    got.push(p.then(() => "resolved", (/** @type {Error} */ e) => e.message));
  }
  return Promise.all(got).then((messages) => {
    assert.equal(calls, 0);
    assert.match(String(messages[0]), /retry_owner_not_harness/);
    assert.equal(messages[1], "options unreadable");
    assert.equal(messages[2], "dispatch must be a function");
  });
});

test("a bad policy is refused before any dispatch with its code", async () => {
  const p = policyWith((x) => {
    x.retry_owner = "transport_sdk";
  });
  let calls = 0;
  await assert.rejects(runWithPolicy(p, () => ++calls, { idempotencyKey: KEY }), (e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness");
  assert.equal(calls, 0);
});

test("an unrecognized error is recorded as indeterminate, never retried, and rethrown wrapped with the bundle", async () => {
  const time = fakeTime();
  const original = new TypeError("socket exploded");
  const { steps, dispatch } = scripted(time, [{ ms: 5, error: original }]);
  await assert.rejects(runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
    assert.ok(e instanceof rl.UnrecognizedDispatchError);
    assert.ok(e instanceof rl.RunStoppedError);
    assert.equal(e.cause, original);
    assert.equal(e.code, "stop_indeterminate");
    assert.equal(e.terminal, "stop_indeterminate");
    assert.deepEqual(e.bundle.attempts.attempts[0]?.outcome, { class: "indeterminate", kind: "unknown_provider_acceptance" });
    assert.equal(e.receipt.attempt_count, 1);
    assert.equal(verifyBundle(e.bundle).kind, "verified");
    return true;
  });
  assert.equal(steps.length, 1);
});

test("HTTP-like errors are classified by status and Retry-After headers", async () => {
  const time = fakeTime();
  const e429 = Object.assign(new Error("429"), { status: 429, headers: new Headers({ "retry-after-ms": "700" }) });
  const e503 = Object.assign(new Error("503"), { status: 503, headers: { "Retry-After": "1" } });
  const { dispatch } = scripted(time, [
    { ms: 10, error: e429 },
    { ms: 10, error: e503 },
    { ms: 10, value: 42 },
  ]);
  const run = await runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const outcomes = run.bundle.attempts.attempts.map((a) => a.outcome);
  assert.deepEqual(outcomes, [
    { class: "retryable", kind: "rate_limited", retry_after_ms: 700 },
    { class: "retryable", kind: "unavailable", retry_after_ms: 1000 },
    { class: "success" },
  ]);
  assert.deepEqual(
    run.receipt.schedule.map((s) => s.retry_after_floor_ms),
    [0, 700, 1000],
  );
  // An error is never a success, whatever status it claims.
  const odd = Object.assign(new Error("odd"), { status: 200 });
  const t2 = fakeTime();
  await assert.rejects(
    runWithPolicy(referencePolicy(), scripted(t2, [{ ms: 1, error: odd }]).dispatch, { idempotencyKey: KEY, clock: t2.clock, sleep: t2.sleep }),
    rl.UnrecognizedDispatchError,
  );
});

test("non-retryable stops without fallback; the error carries the bundle and the cause", async () => {
  const time = fakeTime();
  const err = AttemptError.nonRetryable("invalid_request");
  const { steps, dispatch } = scripted(time, [{ ms: 3, error: err }]);
  await assert.rejects(runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
    assert.ok(e instanceof rl.RunStoppedError && !(e instanceof rl.UnrecognizedDispatchError));
    assert.equal(e.code, "stop_non_retryable");
    assert.equal(e.cause, err);
    assert.equal(e.receipt.final_route_id, "private-primary");
    return true;
  });
  assert.equal(steps.length, 1);
});

test("route exhaustion: every planned attempt is dispatched once, then the run stops", async () => {
  const time = fakeTime();
  const fail = () => AttemptError.retryable("unavailable");
  const { steps, dispatch } = scripted(time, [
    { ms: 10, error: fail() },
    { ms: 10, error: fail() },
    { ms: 10, error: fail() },
    { ms: 10, error: fail() },
  ]);
  await assert.rejects(runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
    assert.ok(e instanceof rl.RunStoppedError);
    assert.equal(e.terminal, "stop_total_attempts");
    return true;
  });
  assert.equal(steps.length, 4);
  assert.deepEqual(
    steps.map((s) => s.routeId),
    ["private-primary", "private-primary", "external-fallback", "external-fallback"],
  );
});

test("charge adds up; an attempt never charged costs its reserve", async () => {
  const time = fakeTime();
  /** @type {import("../dist/index.js").DispatchFn<string>} */
  const dispatch = async (step) => {
    time.advance(1);
    if (step.ordinal === 1) throw AttemptError.retryable("unavailable");
    step.charge(100);
    step.charge(23);
    assert.throws(() => step.charge(1.5), RangeError);
    assert.throws(() => step.charge(-1), RangeError);
    return "ok";
  };
  const run = await runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  assert.deepEqual(
    run.bundle.attempts.attempts.map((a) => a.cost),
    [1500, 123],
  );
  assert.equal(run.receipt.total_cost, 1623);
});

test("the deadline fires the attempt's signal; the attempt is a timeout and the run stops at the deadline", async () => {
  const p = policyWith((x) => {
    x.deadline_ms = 60;
  });
  const started = performance.now();
  /** @type {AbortSignal | undefined} */
  let seen;
  await assert.rejects(
    runWithPolicy(
      p,
      (_step, signal) =>
        new Promise((_resolve, reject) => {
          seen = signal;
          signal.addEventListener("abort", () => reject(signal.reason));
        }),
      { idempotencyKey: KEY },
    ),
    (e) => {
      assert.ok(e instanceof rl.RunStoppedError);
      assert.equal(e.terminal, "stop_deadline");
      assert.deepEqual(e.attempts.attempts[0]?.outcome, { class: "retryable", kind: "timeout_before_response" });
      // Host timers may fire a millisecond early; the terminal is stop_deadline either way.
      assert.ok((e.attempts.attempts[0]?.completed_at_ms ?? 0) >= 55);
      return true;
    },
  );
  assert.equal(seen?.aborted, true);
  assert.ok(performance.now() - started < 1000);
});

test("real timers: no attempt starts before its not_before", async () => {
  const p = policyWith((x) => {
    x.backoff = { base_ms: 20, max_ms: 40, retry_after_cap_ms: 100 };
  });
  /** @type {number[]} */
  const starts = [];
  const t0 = performance.now();
  const run = await runWithPolicy(
    p,
    (step) => {
      starts.push(performance.now() - t0);
      if (step.ordinal === 1) throw AttemptError.retryable("rate_limited", 30);
      if (step.ordinal === 2) throw AttemptError.retryable("unavailable");
      return "done";
    },
    { idempotencyKey: KEY },
  );
  assert.equal(run.receipt.terminal, "completed");
  const sched = run.receipt.schedule;
  assert.deepEqual(
    sched.map((s) => s.delay_ms),
    [0, 30, 40],
  );
  for (const s of sched) assert.ok(s.started_at_ms >= s.not_before_ms);
  assert.ok((starts[1] ?? 0) >= 30 && (starts[2] ?? 0) >= 70, `starts ${starts.join(", ")}`);
});

test("the caller's signal between attempts records cancelled_at_ms (stop_cancelled)", async () => {
  const controller = new AbortController();
  const p = policyWith((x) => {
    x.backoff = { base_ms: 10_000, max_ms: 10_000, retry_after_cap_ms: 10_000 };
    x.deadline_ms = 60_000;
  });
  const t0 = performance.now();
  setTimeout(() => controller.abort(new Error("user went away")), 30);
  await assert.rejects(
    runWithPolicy(p, () => { throw AttemptError.retryable("unavailable"); }, { idempotencyKey: KEY, signal: controller.signal }),
    (e) => {
      assert.ok(e instanceof rl.RunCancelledError);
      assert.equal(e.terminal, "stop_cancelled");
      assert.equal(e.code, "stop_cancelled");
      assert.ok((e.attempts.cancelled_at_ms ?? -1) >= 0);
      assert.equal(e.attempts.attempts.length, 1);
      assert.equal(/** @type {Error} */ (e.cause).message, "user went away");
      assert.equal(verifyBundle(e.bundle).kind, "verified");
      return true;
    },
  );
  assert.ok(performance.now() - t0 < 2000, "the sleep ends when the signal fires");
});

test("the caller's signal during a dispatch makes that attempt indeterminate", async () => {
  const controller = new AbortController();
  await assert.rejects(
    runWithPolicy(
      referencePolicy(),
      (_step, signal) =>
        new Promise((_resolve, reject) => {
          signal.addEventListener("abort", () => reject(new Error("aborted")));
          setTimeout(() => controller.abort(), 10);
        }),
      { idempotencyKey: KEY, signal: controller.signal },
    ),
    (e) => {
      assert.ok(e instanceof rl.RunCancelledError);
      assert.equal(e.terminal, "stop_indeterminate");
      assert.deepEqual(e.attempts.attempts[0]?.outcome, { class: "indeterminate", kind: "unknown_provider_acceptance" });
      assert.equal(e.attempts.cancelled_at_ms, undefined);
      return true;
    },
  );
});

test("an already-aborted signal dispatches nothing", async () => {
  let calls = 0;
  await assert.rejects(
    runWithPolicy(referencePolicy(), () => ++calls, { idempotencyKey: KEY, signal: AbortSignal.abort() }),
    (e) => e instanceof rl.RunCancelledError && e.terminal === "stop_cancelled" && e.attempts.attempts.length === 0,
  );
  assert.equal(calls, 0);
});

test("a late success loses: stop_deadline, with the late result on the error", async () => {
  const time = fakeTime();
  const { dispatch } = scripted(time, [{ ms: 6000, value: "late" }]);
  await assert.rejects(runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
    assert.ok(e instanceof rl.RunStoppedError);
    assert.equal(e.terminal, "stop_deadline");
    assert.equal(e.result, "late");
    return true;
  });
});

test("a custom classifier runs before the generic rules; one that throws passes", async () => {
  const time = fakeTime();
  class Quota extends Error {}
  const { dispatch } = scripted(time, [
    { ms: 1, error: new Quota("quota") },
    { ms: 1, value: "ok" },
  ]);
  const run = await runWithPolicy(referencePolicy(), dispatch, {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
    classify: (e) => (e instanceof Quota ? { class: "retryable", kind: "rate_limited", retry_after_ms: 5 } : undefined),
  });
  assert.equal(run.receipt.attempt_count, 2);
  const t2 = fakeTime();
  await assert.rejects(
    runWithPolicy(referencePolicy(), scripted(t2, [{ ms: 1, error: new Quota("q") }]).dispatch, {
      idempotencyKey: KEY,
      clock: t2.clock,
      sleep: t2.sleep,
      classify: () => {
        throw new Error("classifier bug");
      },
    }),
    rl.UnrecognizedDispatchError,
  );
});

test("AttemptError refuses what is not an outcome", () => {
  // @ts-expect-error not an outcome
  assert.throws(() => new AttemptError({ class: "retryable", kind: "nope" }), (e) => e instanceof rl.DecodeError && e.code === "invalid_value");
  assert.deepEqual(AttemptError.retryable("rate_limited", 250).outcome, { class: "retryable", kind: "rate_limited", retry_after_ms: 250 });
});

test("a compiled policy is reused across runs", async () => {
  const compiled = rl.compilePolicy(JSON.stringify(referencePolicy()));
  for (let i = 0; i < 3; i += 1) {
    const run = await runWithPolicy(compiled, () => i, { idempotencyKey: KEY });
    assert.equal(run.result, i);
    assert.equal(run.receipt.policy_sha256, compiled.digest);
  }
});

test("jitter: every mode's draws are recorded on the attempts and the bundle replays", async () => {
  for (const mode of /** @type {const} */ (["full", "equal", "decorrelated"])) {
    const p = policyWith((x) => {
      x.jitter = { mode, scheduler_release: "sched-v1", seed: 42 };
      x.backoff = { base_ms: 100, max_ms: 1000, retry_after_cap_ms: 2000 };
    });
    const time = fakeTime();
    const { steps, dispatch } = scripted(time, [
      { ms: 10, error: AttemptError.retryable("unavailable") },
      { ms: 10, error: AttemptError.retryable("rate_limited", 50) },
      { ms: 10, error: AttemptError.retryable("unavailable") },
      { ms: 10, value: mode },
    ]);
    const run = await runWithPolicy(p, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal(run.result, mode);
    assert.equal(steps[0]?.decision.jitter_sample_ms, undefined, "the first dispatch has no draw");
    const samples = run.bundle.attempts.attempts.map((a) => a.jitter_sample_ms);
    assert.equal(samples[0], undefined);
    for (const s of samples.slice(1)) assert.ok(typeof s === "number" && s >= 0);
    for (const [i, step] of steps.entries()) {
      // The decision handed to dispatch is exactly what planNext says for the attempts before it.
      const before = { ...run.bundle.attempts, attempts: run.bundle.attempts.attempts.slice(0, i) };
      assert.deepEqual(step.decision, rl.planNext(p, before));
    }
    assert.equal(verifyBundle(run.bundle).kind, "verified", mode);
  }
});

test("onAttempt gets the core's attempt and judgement; output delivered before a failure is never retried", async () => {
  const time = fakeTime();
  /** @type {[unknown, unknown][]} */
  const seen = [];
  /** @type {import("../dist/index.js").DispatchFn<string>} */
  const dispatch = async (step) => {
    time.advance(5);
    if (step.ordinal === 1) throw Object.assign(new Error("503"), { status: 503 });
    step.outputDelivered();
    throw Object.assign(new Error("reset"), { code: "ECONNRESET" });
  };
  await assert.rejects(
    runWithPolicy(referencePolicy(), dispatch, {
      idempotencyKey: KEY,
      clock: time.clock,
      sleep: time.sleep,
      onAttempt: (attempt, judgement) => seen.push([attempt, judgement]),
    }),
    (e) => {
      assert.ok(e instanceof rl.RunStoppedError && !(e instanceof rl.UnrecognizedDispatchError));
      assert.equal(e.code, "stop_indeterminate");
      assert.deepEqual(
        seen.map(([a]) => a),
        e.attempts.attempts,
      );
      assert.deepEqual(
        seen.map(([, j]) => j),
        [
          { outcome: { class: "retryable", kind: "unavailable" }, rule: "status" },
          { outcome: { class: "indeterminate", kind: "stream_interrupted_after_output" }, rule: "output_delivered" },
        ],
      );
      assert.equal(e.sealed.receipt_sha256, rl.digest(e.receipt));
      return true;
    },
  );
});

test("with an injected clock no deadline timer is armed: an error at the deadline is the core's timeout", async () => {
  const time = fakeTime();
  /** @type {AbortSignal | undefined} */
  let seen;
  await assert.rejects(
    runWithPolicy(
      referencePolicy(),
      async (_step, signal) => {
        seen = signal;
        time.advance(6000);
        await new Promise((resolve) => setTimeout(resolve, 5));
        throw new Error("gave up");
      },
      { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, onAttempt: (_a, j) => assert.equal(j.rule, "deadline") },
    ),
    (e) => e instanceof rl.RunStoppedError && e.code === "stop_deadline",
  );
  assert.equal(seen?.aborted, false);
});

test("a policy given as an object is compiled once per text: a change between runs is honored", async () => {
  const run = async (/** @type {import("../dist/index.js").Policy} */ policy) => {
    const time = fakeTime();
    const { dispatch } = scripted(time, [{ ms: 10, value: "ok" }]);
    return runWithPolicy(policy, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  };
  const policy = referencePolicy();
  const first = await run(policy);
  const again = await run(policy);
  assert.equal(again.receipt.policy_sha256, first.receipt.policy_sha256);
  // One compiled policy served both runs: its decoded policy is shared by their bundles.
  assert.equal(again.bundle.policy, first.bundle.policy);
  // The same object changed: another text, another policy.
  policy.deadline_ms += 1;
  const changed = await run(policy);
  assert.notEqual(changed.receipt.policy_sha256, first.receipt.policy_sha256);
  assert.equal(changed.bundle.policy.deadline_ms, policy.deadline_ms);
  // A bad policy is still refused with its code, every time.
  policy.routes = [];
  for (let i = 0; i < 2; i += 1) await assert.rejects(run(policy), (e) => e instanceof rl.RetryledgerError);
});
