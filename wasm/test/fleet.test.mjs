// Fleet protection through the drivers: runWithPolicy and runStream admit
// every attempt against the fleet's store before dispatch and record its
// route's breaker after; stops, conflicts, an unavailable store, and
// concurrent runs sharing one store.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace, tempDbPath } from "./fleet-helpers.mjs";

const { AttemptError, Fleet, MemoryStore, runWithPolicy, runStream, verifyBundle } = rl;

/** @typedef {import("../dist/index.js").FleetStore} FleetStore */

/**
 * A dispatch on a fake clock: the primary route fails unavailable (or
 * succeeds when `primaryUp`), the fallback succeeds; every call's route
 * is kept.
 * @param {ReturnType<typeof fakeTime>} time @param {string[]} routes @param {boolean} [primaryUp]
 */
function dispatcher(time, routes, primaryUp = false) {
  /** @param {import("../dist/index.js").Step} step */
  return async (step) => {
    routes.push(step.routeId);
    time.advance(10);
    if (step.routeId === "private-primary" && !primaryUp) throw AttemptError.retryable("unavailable");
    return `ok from ${step.routeId}`;
  };
}

/** @param {import("../dist/index.js").Fleet} fleet @param {ReturnType<typeof fakeTime>} time @param {string[]} routes @param {import("../dist/index.js").Policy} policy */
function runOnce(fleet, time, routes, policy) {
  return runWithPolicy(policy, dispatcher(time, routes), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
}

test("a run opens the primary's breaker; the next run skips the primary without dispatching it, and both bundles verify", async () => {
  const policy = fleetPolicy();
  const fleet = new Fleet(new MemoryStore(), { namespace: namespace("open") });
  const time = fakeTime();
  const first = /** @type {string[]} */ ([]);
  const a = await runOnce(fleet, time, first, policy);
  assert.deepEqual(first, ["private-primary", "private-primary", "external-fallback"]);
  assert.equal(a.receipt.terminal, "completed");
  assert.deepEqual(a.receipt.fleet, { admitted_without_store: 0, probes: 0, routes_skipped: 0, withdrawals: 0 });
  assert.equal(verifyBundle(a.sealed.bundle_json).kind, "verified");
  assert.ok(a.bundle.fleet_snapshots !== undefined && a.bundle.fleet_snapshots.breakers.length > 0);
  assert.deepEqual(Object.keys(a.bundle), ["attempts", "fleet_snapshots", "policy", "receipt", "schema"]);
  assert.equal(rl.digest(a.sealed.bundle_json), rl.digest(JSON.stringify(a.bundle)));
  const primary = policy.routes[0]?.route_release_sha256 ?? "";
  const stored = await fleet.store.get(fleet.breakerKey(primary));
  assert.equal(/** @type {any} */ (stored.document)?.state, "open");

  const second = /** @type {string[]} */ ([]);
  const b = await runOnce(fleet, time, second, policy);
  assert.deepEqual(second, ["external-fallback"]);
  assert.equal(b.receipt.fleet?.routes_skipped, 1);
  const admission = b.bundle.attempts.attempts[0]?.admission;
  assert.equal(admission?.skipped?.[0]?.route_id, "private-primary");
  assert.equal(verifyBundle(b.sealed.bundle_json).kind, "verified");
});

test("every route open: stop_circuit_open before any dispatch", async () => {
  const policy = fleetPolicy({ breaker: { consecutive_failures: 1, half_open_probes: 1, open_ms: 600000 } });
  const fleet = new Fleet(new MemoryStore(), { namespace: namespace("allopen") });
  const time = fakeTime();
  // Both routes fail once each: both breakers open.
  /** @param {import("../dist/index.js").Step} step */
  const failing = async (step) => {
    time.advance(5);
    throw AttemptError.retryable("unavailable", undefined);
  };
  await assert.rejects(runWithPolicy(policy, failing, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet }), rl.RunStoppedError);
  let calls = 0;
  const err = await runWithPolicy(
    policy,
    () => {
      calls++;
      return "x";
    },
    { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet },
  ).catch((e) => e);
  assert.ok(err instanceof rl.RunStoppedError);
  assert.equal(err.terminal, "stop_circuit_open");
  assert.equal(calls, 0);
  assert.equal(err.attempts.fleet_stop?.reason, "circuit_open");
  assert.equal(verifyBundle(err.sealed.bundle_json).kind, "verified");
});

test("the retry budget refuses a retry it does not cover: stop_retry_budget after one dispatch", async () => {
  const policy = fleetPolicy({ retry_budget: { scope: "tenant-7/test", ratio_permille: 100, floor_per_second: 0, max_tokens: 5 } });
  delete policy.fleet?.breaker;
  const fleet = new Fleet(new MemoryStore(), { namespace: namespace("budget") });
  const time = fakeTime();
  const routes = /** @type {string[]} */ ([]);
  const err = await runOnce(fleet, time, routes, policy).catch((e) => e);
  assert.ok(err instanceof rl.RunStoppedError);
  assert.equal(err.terminal, "stop_retry_budget");
  assert.deepEqual(routes, ["private-primary"]);
  const budget = await fleet.store.get(fleet.budgetKey("tenant-7/test"));
  assert.equal(/** @type {any} */ (budget.document)?.balance_milli, 100);
  assert.equal(verifyBundle(err.sealed.bundle_json).kind, "verified");
});

test("a policy with a fleet section needs a fleet, and a fleet a policy with one: refused before any dispatch", async () => {
  let calls = 0;
  const d = () => {
    calls++;
    return "x";
  };
  await assert.rejects(runWithPolicy(fleetPolicy(), d, { idempotencyKey: KEY }), (e) => e instanceof rl.DriftError && e.code === "admission_missing");
  const plain = fleetPolicy();
  delete plain.fleet;
  await assert.rejects(
    runWithPolicy(plain, d, { idempotencyKey: KEY, fleet: new Fleet(new MemoryStore()) }),
    (e) => e instanceof rl.DriftError && e.code === "admission_unexpected",
  );
  assert.equal(calls, 0);
});

/**
 * A store wrapper: `conflicts` compare-and-sets refused (as if another
 * process wrote first: the register's generation is raised), `down` throws.
 * @param {FleetStore} inner
 */
function flaky(inner) {
  const state = { conflicts: 0, down: false, writes: 0 };
  /** @type {FleetStore} */
  const store = {
    get: (k) => {
      if (state.down) throw new rl.StoreUnavailableError("down");
      return inner.get(k);
    },
    compareAndSet: async (k, g, d) => {
      if (state.down) throw new rl.StoreUnavailableError("down");
      if (state.conflicts > 0) {
        state.conflicts--;
        // Another process makes the same transition first.
        const cur = await inner.get(k);
        await inner.compareAndSet(k, cur.generation, d);
        return inner.compareAndSet(k, g, d);
      }
      state.writes++;
      return inner.compareAndSet(k, g, d);
    },
  };
  return { store, state };
}

test("a compare-and-set conflict reads and admits again; too many in a row is store_conflict", async () => {
  const policy = fleetPolicy({ retry_budget: { scope: "s", ratio_permille: 1000, floor_per_second: 0, max_tokens: 10 } });
  const { store, state } = flaky(new MemoryStore());
  const fleet = new Fleet(store, { namespace: namespace("conflict"), maxConflicts: 3 });
  const time = fakeTime();
  state.conflicts = 2;
  const ok = await runWithPolicy(policy, () => "x", { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  assert.equal(ok.receipt.terminal, "completed");
  assert.equal(fleet.stats.conflicts, 2);
  assert.equal(verifyBundle(ok.sealed.bundle_json).kind, "verified");

  state.conflicts = 1000;
  let calls = 0;
  await assert.rejects(
    runWithPolicy(
      policy,
      () => {
        calls++;
        return "x";
      },
      { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet },
    ),
    (e) => e instanceof rl.RunError && e.code === "store_conflict",
  );
  assert.equal(calls, 0, "never a silent admit");
});

test("an unavailable store: fail_closed stops before dispatch, fail_open dispatches and says so", async () => {
  const { store, state } = flaky(new MemoryStore());
  state.down = true;
  const fleet = new Fleet(store, { namespace: namespace("down") });
  const time = fakeTime();
  let calls = 0;
  const d = () => {
    calls++;
    return "x";
  };
  const closed = await runWithPolicy(fleetPolicy(), d, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet }).catch((e) => e);
  assert.ok(closed instanceof rl.RunStoppedError);
  assert.equal(closed.terminal, "stop_store_unavailable");
  assert.equal(calls, 0);
  assert.ok(fleet.lastStoreError instanceof rl.StoreUnavailableError);
  assert.equal(verifyBundle(closed.sealed.bundle_json).kind, "verified");

  const open = await runWithPolicy(fleetPolicy({ on_store_unavailable: "fail_open" }), d, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  assert.equal(open.receipt.terminal, "completed");
  assert.equal(calls, 1);
  assert.equal(open.receipt.fleet?.admitted_without_store, 1);
  assert.equal(open.bundle.attempts.attempts[0]?.admission?.store, "unavailable");
  assert.equal(verifyBundle(open.sealed.bundle_json).kind, "verified");
});

/**
 * `workers` concurrent loops of `runs` runs each, sharing the stores; the
 * primary always fails. Returns how often each route was dispatched.
 * @param {() => import("../dist/index.js").Fleet} makeFleet @param {number} workers @param {number} runs
 */
async function concurrentRuns(makeFleet, workers, runs) {
  const policy = fleetPolicy({ breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 600000 } });
  const compiled = rl.compilePolicy(policy);
  const routes = /** @type {string[]} */ ([]);
  const verdicts = /** @type {string[]} */ ([]);
  try {
    await Promise.all(
      Array.from({ length: workers }, async () => {
        const fleet = makeFleet();
        for (let i = 0; i < runs; i++) {
          const time = fakeTime();
          /** @param {import("../dist/index.js").Step} step */
          const d = async (step) => {
            routes.push(step.routeId);
            await new Promise((r) => setImmediate(r));
            if (step.routeId === "private-primary") throw AttemptError.retryable("unavailable");
            return "ok";
          };
          const r = await runWithPolicy(compiled, d, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
          verdicts.push(verifyBundle(r.sealed.bundle_json).kind);
        }
      }),
    );
  } finally {
    compiled.free();
  }
  return { primary: routes.filter((r) => r === "private-primary").length, fallback: routes.filter((r) => r === "external-fallback").length, verdicts };
}

test("8 concurrent workers sharing a memory store: once the breaker opens no run dispatches the primary", async () => {
  const store = new MemoryStore();
  const ns = namespace("workers");
  const { primary, fallback, verdicts } = await concurrentRuns(() => new Fleet(store, { namespace: ns, maxConflicts: 50 }), 8, 5);
  assert.equal(fallback, 40, "every run completed on the fallback");
  assert.ok(verdicts.every((v) => v === "verified"));
  // Before the breaker opened (2 failures recorded) at most one attempt per worker was in flight.
  assert.ok(primary <= 2 + 8, `primary dispatched ${primary} times`);
});

test("8 concurrent workers, each with its own SQLite connection to one file", async () => {
  const file = tempDbPath();
  const ns = namespace("sqlite-workers");
  /** @type {SQLiteStore[]} */
  const opened = [];
  try {
    const { primary, fallback, verdicts } = await concurrentRuns(
      () => {
        const s = new SQLiteStore(file);
        opened.push(s);
        return new Fleet(s, { namespace: ns, maxConflicts: 50 });
      },
      8,
      5,
    );
    assert.equal(fallback, 40);
    assert.ok(verdicts.every((v) => v === "verified"));
    assert.ok(primary <= 2 + 8, `primary dispatched ${primary} times`);
  } finally {
    for (const s of opened) s.close();
  }
});

test("runStream admits before each streamed attempt and records the breaker after", async () => {
  const policy = fleetPolicy({}, (p) => {
    p.stream = { mode: "buffer", max_response_bytes: 1 << 20 };
  });
  const fleet = new Fleet(new MemoryStore(), { namespace: namespace("stream") });
  /** @param {{fail: boolean}} o */
  const go = async (o) => {
    const routes = /** @type {string[]} */ ([]);
    const run = runStream(
      policy,
      async function* (step) {
        routes.push(step.routeId);
        if (step.routeId === "private-primary" && o.fail) throw AttemptError.retryable("unavailable");
        yield "hello";
      },
      { idempotencyKey: KEY, fleet },
    );
    const texts = [];
    for await (const e of run) if (e.text !== undefined) texts.push(e.text);
    return { routes, texts, run };
  };
  const a = await go({ fail: true });
  assert.deepEqual(a.routes, ["private-primary", "private-primary", "external-fallback"]);
  assert.deepEqual(a.texts, ["hello"]);
  assert.equal(verifyBundle(/** @type {any} */ (a.run.sealed).bundle_json).kind, "verified");
  const b = await go({ fail: false });
  assert.deepEqual(b.routes, ["external-fallback"], "the open primary is skipped");
  assert.equal(b.run.receipt?.fleet?.routes_skipped, 1);
  const sealed = /** @type {import("../dist/index.js").Sealed} */ (b.run.sealed);
  assert.deepEqual(Object.keys(sealed.bundle), ["attempts", "fleet_snapshots", "policy", "receipt", "schema", "stream_events"]);
  assert.equal(verifyBundle(sealed.bundle_json).kind, "verified");
});

test("a consumer leaving a streamed half-open probe early still records it: the probe's place is freed", async () => {
  const policy = fleetPolicy({ breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 60000 } }, (p) => {
    p.stream = { mode: "tentative", max_response_bytes: 1 << 20 };
  });
  const store = new MemoryStore();
  const fleet = new Fleet(store, { namespace: namespace("probe") });
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  const opened = Date.now() - 120000;
  const open = { ...rl.freshBreaker(release, opened), generation: 1, opened_at_epoch_ms: opened, state: /** @type {const} */ ("open") };
  assert.equal((await store.compareAndSet(fleet.breakerKey(release), 0, open)).ok, true);
  const run = runStream(
    policy,
    async function* () {
      yield "first";
      await new Promise((r) => setTimeout(r, 5));
      yield "second";
    },
    { idempotencyKey: KEY, fleet },
  );
  for await (const e of run) {
    if (e.kind === "delta") break;
  }
  const attempt = run.bundle?.attempts.attempts[0];
  assert.equal(attempt?.admission?.breaker?.probe, true, "admitted as the half-open probe");
  const after = /** @type {any} */ ((await store.get(fleet.breakerKey(release))).document);
  assert.equal(after.state, "half_open");
  assert.equal(after.probes_in_flight, 0, "the abandoned probe was recorded");
});
