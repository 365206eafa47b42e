// Admission limits through runWithPolicy: each attempt admitted under a cap on
// attempts in flight and request / token buckets kept in the store; a queued
// attempt waits its planned start (fake clock), a full cap is asked again
// until the queue bound stops the run, and every attempt's slot is released.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace } from "./fleet-helpers.mjs";

const { AttemptError, Fleet, MemoryStore, runWithPolicy, verifyBundle } = rl;
const EPOCH = 1_780_000_000_000;

/** @param {any} admission @param {(p: any) => void} [change] */
function limited(admission, change) {
  return fleetPolicy({ admission }, (/** @type {any} */ p) => {
    delete p.fleet.breaker;
    if (change !== undefined) change(p);
  });
}

/** @param {ReturnType<typeof fakeTime>} time @param {object} [options] */
function fleetOn(time, options = {}) {
  return new Fleet(new MemoryStore(), { namespace: namespace("admission"), now: () => EPOCH + time.state.now, ...options });
}

/** @param {any} policy @param {import("../dist/index.js").Fleet} fleet @param {ReturnType<typeof fakeTime>} time @param {(step: any) => Promise<string>} [dispatch] */
async function once(policy, fleet, time, dispatch = async () => "ok") {
  try {
    return await runWithPolicy(policy, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  } catch (e) {
    if (e instanceof rl.RunStoppedError) return e;
    throw e;
  }
}

test("a spent bucket queues the next run for its planned start; the slot is released after each run", async () => {
  const policy = limited({ max_in_flight: 2, max_queue_ms: 1000, request_burst: 1, requests_per_second: 10 });
  const time = fakeTime();
  const fleet = fleetOn(time);
  const a = await once(policy, fleet, time);
  assert.equal(a.receipt.terminal, "completed");
  assert.equal(a.bundle.attempts.attempts[0]?.admission?.limits?.queue_wait_ms, 0);
  const b = await once(policy, fleet, time);
  assert.equal(b.receipt.terminal, "completed");
  const limits = b.bundle.attempts.attempts[0]?.admission?.limits;
  assert.equal(limits?.queue_wait_ms, 100);
  assert.equal(limits?.start_epoch_ms, EPOCH + 100);
  assert.deepEqual(time.state.sleeps, [100]);
  assert.equal(b.receipt.fleet?.queue_wait_ms, 100);
  assert.equal(verifyBundle(b.sealed.bundle_json).kind, "verified");
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  const stored = /** @type {any} */ ((await fleet.store.get(fleet.admissionKey(release))).document);
  assert.equal(stored.in_flight, 0);
  assert.equal(fleet.stats.releases, 2);
});

test("a full in-flight cap is asked again every 20 ms, then the queue bound stops the run before dispatch", async () => {
  const policy = limited({ max_in_flight: 1, max_queue_ms: 50 });
  const time = fakeTime();
  const fleet = fleetOn(time);
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  const held = {
    generation: 1, in_flight: 1, request_level_milli: 0, requests_at_epoch_ms: EPOCH, route_release_sha256: release,
    schema: "retryledger.admission.v1", token_level_milli: 0, tokens_at_epoch_ms: EPOCH, updated_at_epoch_ms: EPOCH,
  };
  assert.equal((await fleet.store.compareAndSet(fleet.admissionKey(release), 0, held)).ok, true);
  let calls = 0;
  const r = await once(policy, fleet, time, async () => {
    calls++;
    return "ok";
  });
  assert.equal(r.sealed.terminal, "stop_admission");
  assert.equal(calls, 0);
  assert.deepEqual(time.state.sleeps, [20, 20]);
  const stop = r.sealed.bundle.attempts.fleet_stop;
  assert.equal(stop?.reason, "admission");
  assert.equal(stop?.limits?.queue_wait_ms, 40);
  assert.equal(verifyBundle(r.sealed.bundle_json).kind, "verified");
});

test("errors release their slots and every attempt reserves the fleet's tokens", async () => {
  const policy = limited({ max_in_flight: 1, max_queue_ms: 1000, token_bound: 1000, tokens_per_second: 100 });
  const time = fakeTime();
  const fleet = fleetOn(time, { reserveTokens: 300 });
  const r = await once(policy, fleet, time, async () => {
    throw AttemptError.retryable("unavailable");
  });
  const attempts = r.sealed.bundle.attempts.attempts;
  assert.equal(attempts.length, 4);
  assert.ok(attempts.every((/** @type {any} */ a) => a.admission?.limits?.tokens === 300));
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  const stored = /** @type {any} */ ((await fleet.store.get(fleet.admissionKey(release))).document);
  assert.equal(stored.in_flight, 0);
  assert.equal(verifyBundle(r.sealed.bundle_json).kind, "verified");
});

test("bad limits are coded validation errors before dispatch", () => {
  /** @type {Array<[any, string]>} */
  const cases = [
    [{ max_in_flight: 0, max_queue_ms: 100 }, "/fleet/admission/max_in_flight"],
    [{ max_in_flight: 1, max_queue_ms: 0 }, "/fleet/admission/max_queue_ms"],
    [{ max_queue_ms: 100, tokens_per_second: 10 }, "/fleet/admission/token_bound"],
  ];
  for (const [admission, path] of cases) {
    assert.throws(() => rl.compilePolicy(limited(admission)), (/** @type {any} */ e) => e.code === "invalid_admission" && e.path === path);
  }
});

test("reported tokens settle the reservation when the slot is released", async () => {
  const policy = limited({ max_queue_ms: 1000, token_bound: 1000, tokens_per_second: 100 });
  const time = fakeTime();
  const fleet = fleetOn(time, { reserveTokens: 300 });
  const r = await once(policy, fleet, time, async (step) => {
    step.tokensUsed(60);
    step.tokensUsed(40);
    return "ok";
  });
  assert.equal(r.sealed.terminal, "completed");
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  const stored = /** @type {any} */ ((await fleet.store.get(fleet.admissionKey(release))).document);
  // 1,000 - 300 reserved + 200 unused back.
  assert.deepEqual([stored.in_flight, stored.token_level_milli], [0, 900000]);
});

test("tenant shares: a tenant over its share waits behind one under it, then stops with tenant_over_share past the queue bound", async () => {
  /** @param {number} maxQueueMs */
  const shares = (maxQueueMs) =>
    limited({
      max_queue_ms: maxQueueMs,
      request_burst: 1,
      requests_per_second: 10,
      tenant_weights: [{ tenant: "a", weight: 1 }, { tenant: "b", weight: 1 }],
    });
  for (const [maxQueueMs, want] of /** @type {const} */ ([[1000, "completed"], [50, "stop_admission"]])) {
    const policy = shares(maxQueueMs);
    const store = new MemoryStore();
    const ns = namespace("tenants");
    const time = fakeTime();
    /** @param {string} tenant */
    const fleet = (tenant) => new Fleet(store, { namespace: ns, now: () => EPOCH + time.state.now, tenant });
    // a is admitted at once; b, under its share, queues 100 ms in the spent bucket.
    const first = await once(policy, fleet("a"), time);
    assert.equal(first.receipt.terminal, "completed");
    time.state.now = 0;
    const second = await once(policy, fleet("b"), time);
    if (want === "completed") {
      assert.equal(second.receipt.terminal, "completed");
      assert.equal(second.bundle.attempts.attempts[0]?.admission?.limits?.tenant, "b");
      assert.equal(second.bundle.attempts.attempts[0]?.admission?.limits?.queue_wait_ms, 100);
    } else {
      // A 100 ms queue is past a 50 ms bound: b stops for the bound (no reason).
      assert.equal(second.sealed.terminal, "stop_admission");
      assert.equal(second.sealed.bundle.attempts.fleet_stop?.limits?.refusal, undefined);
    }
    // a again: over its share (of two, or alone over the rate), it reserves
    // nothing and waits for its share, or stops past the queue bound.
    time.state.now = 0;
    const third = await once(policy, fleet("a"), time);
    const sealed = third.sealed;
    assert.equal(sealed.terminal, want);
    if (want === "completed") {
      const limits = sealed.bundle.attempts.attempts[0]?.admission?.limits;
      assert.deepEqual([limits?.tenant, limits?.queue_wait_ms, limits?.start_epoch_ms], ["a", 200, EPOCH + 200]);
    } else {
      const stop = sealed.bundle.attempts.fleet_stop;
      assert.deepEqual([stop?.limits?.refusal, stop?.limits?.tenant], ["tenant_over_share", "a"]);
      assert.equal(sealed.bundle.attempts.attempts.length, 0);
    }
    assert.equal(verifyBundle(sealed.bundle_json).kind, "verified");
  }
  // A call without a listed tenant is refused before any dispatch.
  for (const tenant of [undefined, "c"]) {
    const time = fakeTime();
    await assert.rejects(
      once(shares(1000), new Fleet(new MemoryStore(), { namespace: namespace("tenants"), now: () => EPOCH + time.state.now, ...(tenant === undefined ? {} : { tenant }) }), time),
      (/** @type {any} */ e) => e.code === "invalid_value" && e.path === "/tenant",
    );
  }
  assert.throws(() => new Fleet(new MemoryStore(), { tenant: "" }), TypeError);
});
