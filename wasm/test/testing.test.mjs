// The testing kit: a fake clock, a seeded fault injector for dispatch
// functions and fetch; injected failures go through the core's rules and the
// receipt counts them. The README's example runs here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import * as rl from "../dist/index.js";
import { FakeClock, FaultPlanError, InjectedFault, faultyFetch, injectFaults } from "../dist/testing.js";
import { runWithFetch } from "../dist/fetch.js";
import { KEY, referencePolicy } from "./helpers.mjs";
import { scriptedServer } from "./loopback.mjs";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** The reference policy with room for two 30 s waits on the primary. */
function patientPolicy(key = KEY) {
  const p = referencePolicy();
  p.backoff.retry_after_cap_ms = 30_000;
  p.deadline_ms = 120_000;
  p.max_total_attempts = 4;
  const primary = p.routes[0];
  assert.ok(primary !== undefined);
  primary.max_attempts = 3;
  p.idempotency_key_sha256 = createHash("sha256").update(key).digest("hex");
  return p;
}

test("the README example: 60 s of injected backoff in well under a second of wall time, counted in the receipt", async () => {
  const readme = readFileSync(root + "README.md", "utf8");
  const m = readme.match(/```ts\nimport \{ runWithPolicy \} from "retryledger";\nimport \{ FakeClock, injectFaults \} from "retryledger\/testing";\n\n([\s\S]*?)```/);
  assert.ok(m && m[1] !== undefined, "README shows the testing example");
  const body = m[1].replace(/ as const/g, "");
  const started = performance.now();
  const run = new Function("runWithPolicy", "FakeClock", "injectFaults", "policy", "assert", `return (async () => {\n${body}\nreturn run;\n})();`);
  const result = await run(rl.runWithPolicy, FakeClock, injectFaults, patientPolicy("order-7"), assert);
  assert.ok(performance.now() - started < 1_000);
  assert.equal(result.bundle.attempts.attempts.filter((/** @type {{injected_fault?: boolean}} */ a) => a.injected_fault === true).length, 2);
  assert.equal(rl.verifyBundle(result.bundle).kind, "verified");
});

test("every fault kind is judged by the core's rules like a real failure, and marked injected", async () => {
  /** @type {[import("../dist/testing.js").Fault, string, number | undefined][]} */
  const cases = [
    [{ kind: "rate_limited", retryAfterMs: 250 }, "rate_limited", 250],
    [{ kind: "rate_limited", retryAfter: "2" }, "rate_limited", 2000],
    [{ kind: "unavailable" }, "unavailable", undefined],
    [{ kind: "overloaded" }, "unavailable", undefined],
    [{ kind: "timeout" }, "timeout_before_response", undefined],
    [{ kind: "reset" }, "unknown_provider_acceptance", undefined],
  ];
  for (const [fault, kind, hint] of cases) {
    const clock = new FakeClock();
    const dispatch = injectFaults(async () => "ok", { script: [fault], clock, latencyMs: 20 });
    const outcome = await rl.runWithPolicy(patientPolicy(), dispatch, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep }).then(
      (run) => run.bundle.attempts.attempts[0],
      (e) => (e instanceof rl.RunStoppedError ? e.sealed.bundle.attempts.attempts[0] : assert.fail(String(e))),
    );
    assert.ok(outcome !== undefined);
    assert.equal(outcome.injected_fault, true, fault.kind);
    const o = /** @type {{kind?: string, retry_after_ms?: number}} */ (outcome.outcome);
    assert.equal(o.kind, kind, fault.kind);
    assert.equal(o.retry_after_ms, hint, fault.kind);
    assert.equal(outcome.completed_at_ms - outcome.started_at_ms, 20);
    assert.equal(dispatch.injected(), 1);
  }
});

test("by rate: the same seed injects the same faults; a slow fault only advances the clock", async () => {
  const calls = () => {
    const dispatch = injectFaults(async () => "ok", { rates: { unavailable: 0.3, timeout: 0.2 }, seed: 42 });
    return { dispatch };
  };
  const pattern = async () => {
    const { dispatch } = calls();
    const out = [];
    for (let i = 0; i < 200; i++) {
      out.push(await Promise.resolve(dispatch(/** @type {any} */ ({}), new AbortController().signal)).then(() => "ok", (e) => (e instanceof InjectedFault ? e.fault.kind : "other")));
    }
    return out;
  };
  const a = await pattern();
  assert.deepEqual(await pattern(), a);
  // The Python kit draws the same faults from the same seed (python/tests/test_testing.py pins the same 40 calls).
  assert.equal(a.slice(0, 40).map((k) => (k === "ok" ? "." : k[0])).join(""), ".t..u.u..tu..tu...ut.u.uuuu..uu.t.ttuu..");
  const unavailable = a.filter((k) => k === "unavailable").length;
  const timeout = a.filter((k) => k === "timeout").length;
  assert.ok(unavailable > 35 && unavailable < 85, `unavailable ${unavailable} of 200 at 0.3`);
  assert.ok(timeout > 20 && timeout < 60, `timeout ${timeout} of 200 at 0.2`);
  const clock = new FakeClock();
  const slow = injectFaults(async () => "ok", { script: [{ kind: "slow", ms: 700 }], clock });
  assert.equal(await slow(/** @type {any} */ ({}), new AbortController().signal), "ok");
  assert.equal(clock.now, 700);
  assert.equal(slow.injected(), 0);
});

test("a plan that cannot be used is a coded error before anything runs", () => {
  for (const plan of [{ rates: { unavailable: 1.5 } }, { rates: { unavailable: -0.1 } }, { rates: { unavailable: 0.6, reset: 0.6 } }, { rates: { gremlins: 0.1 } }, { seed: 1.5 }, { script: [{ kind: "slow", ms: -1 }] }]) {
    assert.throws(() => injectFaults(async () => "ok", /** @type {any} */ (plan)), (e) => e instanceof FaultPlanError && e.code === "invalid_fault_plan");
  }
});

test("faultyFetch: injected HTTP answers and connection failures through the fetch integration against a real server", async () => {
  const provider = await scriptedServer({ primary: [{ status: 200, body: { text: "summary" } }], fallback: [{ status: 200, body: { text: "fallback" } }] });
  try {
    const clock = new FakeClock();
    const fetch = faultyFetch(globalThis.fetch, { script: [{ kind: "rate_limited", retryAfterMs: 100 }, { kind: "reset" }], clock });
    const targets = { "private-primary": `${provider.base}/primary`, "external-fallback": `${provider.base}/fallback` };
    const run = await runWithFetch(patientPolicy(), targets, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep }, { fetch, read: async (r) => (await r.json()).text });
    // The reset is unknown acceptance: never retried, the run stops indeterminate.
    assert.fail(`the run should stop, it returned ${String(run.result)}`);
  } catch (e) {
    assert.ok(e instanceof rl.RunStoppedError, String(e));
    assert.equal(e.terminal, "stop_indeterminate");
    const attempts = e.sealed.bundle.attempts.attempts;
    assert.deepEqual(attempts.map((a) => [a.injected_fault, a.outcome.class]), [[true, "retryable"], [true, "indeterminate"]]);
    assert.equal(e.receipt.injected_faults, 2);
    assert.equal(provider.seen.length, 0);
  } finally {
    await provider.close();
  }
});
