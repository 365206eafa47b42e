// Journaled runs under a fleet, with the hooks of every driver: each attempt
// admitted through the fleet store before its `dispatched` event, its outcome
// written to its breaker after; a run crashed mid-way and resumed admits
// again under its fleet; tenant shares name the call's tenant; a fleet
// section without a fleet is refused before anything is claimed.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { RedisStore } from "../dist/stores/redis.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { KEY, fakeTime, policyWith } from "./helpers.mjs";
import { fleetPolicy, namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const T0 = 1_780_000_000_000;
const PRIMARY = "private-primary";
const BUDGET = { scope: "tenant-7/summaries", ratio_permille: 500, floor_per_second: 100, max_tokens: 100 };
const redis = redisGate();
const postgres = postgresGate();

class Crash extends Error {}

/** @param {{advance: (ms: number) => void}} time @param {string[]} routes */
function primaryDown(time, routes) {
  return async (/** @type {{ordinal: number, routeId: string}} */ step) => {
    routes.push(step.routeId);
    time.advance(50);
    if (step.routeId === PRIMARY) throw rl.AttemptError.retryable("unavailable");
    return "done";
  };
}

/** The fleet's clock on the fake time. @param {ReturnType<typeof fakeTime>} time */
const fleetOf = (/** @type {any} */ store, /** @type {ReturnType<typeof fakeTime>} */ time, /** @type {Record<string, unknown>} */ options = {}) =>
  new rl.Fleet(store, { now: time.clock, ...options });

/** @type {[string, (() => any) | undefined, string | false][]} */
const BACKENDS = [
  ["memory", () => new rl.MemoryStore(), false],
  ["sqlite", () => new SQLiteStore(tempDbPath()), false],
  ["redis", redis.skip ? undefined : () => new RedisStore({ url: /** @type {string} */ (redis.url) }), redis.skip],
  ["postgres", postgres.skip ? undefined : () => new PostgresStore({ connectionString: /** @type {string} */ (postgres.url) }), postgres.skip],
];

for (const [backend, make, skip] of BACKENDS) {
  test(`${backend}: a journaled run admits every attempt through its fleet and records each outcome`, { skip }, async () => {
    const store = /** @type {() => any} */ (make)();
    const ns = namespace("jf");
    const time = fakeTime();
    time.state.now = T0;
    /** @type {string[]} */
    const routes = [];
    /** @type {string[]} */
    const decisions = [];
    /** @type {number[]} */
    const attempts = [];
    /** @type {string[]} */
    const terminals = [];
    const policy = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
    try {
      const result = await rl.runJournaled(policy, primaryDown(time, routes), {
        idempotencyKey: KEY,
        store,
        runId: `f-1-${ns}`,
        log: `${ns}/journal`,
        lease: `${ns}/lease`,
        clock: time.clock,
        sleep: time.sleep,
        fleet: fleetOf(store, time, { namespace: ns }),
        onDecision: (d) => decisions.push(d.kind),
        onAttempt: (a) => attempts.push(a.ordinal),
        onTerminal: (r) => terminals.push(r.terminal),
      });
      assert.equal(result.terminal, "completed");
      assert.equal(result.result, "done");
      assert.equal(routes[0], PRIMARY);
      assert.notEqual(routes[routes.length - 1], PRIMARY);
      // Every retry withdrew from the retry budget; the bundle holds the snapshots each admission read.
      assert.equal(result.receipt.fleet?.withdrawals, routes.length - 1);
      assert.ok((result.bundle.fleet_snapshots?.breakers.length ?? 0) >= routes.length);
      assert.equal(rl.journalVerify(policy, result.events).terminal, "completed");
      rl.verifyBundle(result.bundle);
      const release = result.bundle.attempts.attempts[0]?.route_release_sha256;
      const breaker = await store.get(`${ns}/breaker/${release}`);
      assert.ok(breaker.generation >= 1 && breaker.document?.schema === "retryledger.breaker.v1");
      assert.deepEqual(decisions, [...routes.map(() => "dispatch"), "terminal"]);
      assert.deepEqual(attempts, routes.map((_, i) => i + 1));
      assert.deepEqual(terminals, ["completed"]);
    } finally {
      await store.close?.();
    }
  });
}

test("a fleet section without a fleet is refused before anything is claimed", async () => {
  const store = new rl.MemoryStore();
  await assert.rejects(
    rl.runJournaled(rl.compilePolicy(fleetPolicy()), async () => "ok", { idempotencyKey: KEY, store, runId: "f-2" }),
    (e) => e instanceof rl.RetryledgerError && e.code === "admission_missing",
  );
  assert.deepEqual(await store.read("journal/f-2", 0), []);
  assert.equal((await store.get("lease/f-2")).generation, 0);
});

test("a run crashed mid-way resumes and admits again under its fleet", async () => {
  const path = tempDbPath();
  const store = new SQLiteStore(path);
  const policy = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  const time = fakeTime();
  time.state.now = T0;
  /** @type {string[]} */
  const routes = [];
  // The owner dies once attempt 2's `dispatched` is durable: the attempt is in doubt.
  await assert.rejects(
    rl.runJournaled(policy, primaryDown(time, routes), {
      idempotencyKey: KEY,
      store,
      runId: "f-3",
      clock: time.clock,
      sleep: time.sleep,
      fleet: fleetOf(store, time),
      onAppend: (e) => {
        if (e.kind === "dispatched" && /** @type {{ordinal: number}} */ (/** @type {unknown} */ (e)).ordinal === 2) throw new Crash("the owner dies");
      },
    }),
    Crash,
  );
  assert.ok((await store.read("journal/f-3", 0)).length > 0);
  const before = (await store.get("retryledger/budget/tenant-7/summaries")).generation;
  const again = new SQLiteStore(path);
  const result = await rl.resumeJournaled(policy, primaryDown(time, routes), {
    idempotencyKey: KEY,
    store: again,
    runId: "f-3",
    clock: time.clock,
    sleep: time.sleep,
    fleet: fleetOf(again, time),
    reconcile: () => "failed_no_effect",
  });
  assert.equal(result.terminal, "completed");
  assert.equal(result.leaseGeneration, 2);
  assert.equal(rl.journalVerify(policy, result.events).terminal, "completed");
  assert.ok((await again.get("retryledger/budget/tenant-7/summaries")).generation > before);
  rl.verifyBundle(result.bundle);
  store.close?.();
  again.close?.();
});

test("tenant shares name the fleet's tenant in a journaled run; without one the core refuses at /tenant", async () => {
  const admission = {
    max_queue_ms: 1000,
    request_burst: 1,
    requests_per_second: 10,
    tenant_weights: [
      { tenant: "a", weight: 1 },
      { tenant: "b", weight: 1 },
    ],
  };
  const policy = rl.compilePolicy(policyWith((p) => (p.fleet = { admission, on_store_unavailable: "fail_closed" })));
  const time = fakeTime();
  time.state.now = T0;
  const store = new rl.MemoryStore();
  const result = await rl.runJournaled(policy, async () => "ok", { idempotencyKey: KEY, store, runId: "t-1", clock: time.clock, sleep: time.sleep, fleet: fleetOf(store, time, { tenant: "b" }) });
  assert.equal(result.terminal, "completed");
  const release = result.bundle.attempts.attempts[0]?.route_release_sha256;
  const held = await store.get(`retryledger/admission/${release}`);
  assert.deepEqual(/** @type {any} */ (held.document).tenants.map((/** @type {{tenant: string}} */ t) => t.tenant), ["b"]);
  const other = new rl.MemoryStore();
  await assert.rejects(
    rl.runJournaled(policy, async () => "ok", { idempotencyKey: KEY, store: other, runId: "t-2", clock: time.clock, sleep: time.sleep, fleet: fleetOf(other, time) }),
    (e) => e instanceof rl.RetryledgerError && e.code === "invalid_value" && e.path === "/tenant",
  );
});
