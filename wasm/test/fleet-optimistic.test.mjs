// The admission from the fleet's cached view: `session.admitPreview`, then
// one check-and-set carrying every key the admission reads (check-only
// entries first, then the changed snapshots, the budget first), then
// `session.admit` under the same view. In the steady state an attempt costs
// Redis two round trips: one script to admit, one to record. A stale cache
// is caught by the check, and the admission made again from the script's
// answer without a separate read.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Redis } from "ioredis";

import * as rl from "../dist/index.js";
import { MemoryStore } from "../dist/stores/memory.js";
import { RedisStore } from "../dist/stores/redis.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace, redisGate } from "./fleet-helpers.mjs";

const redis = redisGate();
const BUDGET = { scope: "tenant-7/summaries", ratio_permille: 500, floor_per_second: 1, max_tokens: 1000 };
const RETURNED = /** @type {const} */ ({ result: "returned" });

/**
 * An ioredis client counting its round trips in `sent`: each command sent on
 * its own, and each pipeline as one, `PIPELINE`.
 * @param {string} url
 */
function countingClient(url) {
  const client = new Redis(url, { maxRetriesPerRequest: 0 });
  client.on("error", () => {});
  /** @type {string[]} */
  const sent = [];
  const send = /** @type {(...a: any[]) => any} */ (client.sendCommand.bind(client));
  /** @type {any} */ (client).sendCommand = (/** @type {any} */ command, /** @type {any} */ stream, /** @type {any} */ node) => {
    if (stream === undefined) sent.push(String(command.name).toUpperCase());
    return send(command, stream, node);
  };
  const pipeline = client.pipeline.bind(client);
  /** @type {any} */ (client).pipeline = (/** @type {any[]} */ ...args) => {
    const p = pipeline(...args);
    const exec = p.exec.bind(p);
    p.exec = (/** @type {any[]} */ ...a) => {
      sent.push("PIPELINE");
      return exec(...a);
    };
    return p;
  };
  return { client, sent };
}

/**
 * One run of `compiled`; `primaryUp` false: the primary route fails (retryable).
 * @param {rl.CompiledPolicy} compiled @param {rl.Fleet} fleet @param {boolean} [primaryUp]
 */
async function oneRun(compiled, fleet, primaryUp = true) {
  const time = fakeTime();
  /** @type {string[]} */
  const routes = [];
  const r = await rl.runWithPolicy(
    compiled,
    async (/** @type {rl.Step} */ step) => {
      routes.push(step.routeId);
      if (step.routeId === "private-primary" && !primaryUp) throw rl.AttemptError.retryable("unavailable");
      return "ok";
    },
    { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet },
  );
  return { terminal: r.sealed.terminal, routes };
}

test("Redis steady state: one script to admit, one to record; 20 runs in 40 round trips", { skip: redis.skip }, async () => {
  const { client, sent } = countingClient(/** @type {string} */ (redis.url));
  const fleet = new rl.Fleet(new RedisStore({ client }), { namespace: namespace("optimistic") });
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    assert.equal((await oneRun(compiled, fleet)).terminal, "completed"); // loads the scripts, fills the cache
    // One attempt, step by step.
    const session = compiled.session();
    sent.length = 0;
    await fleet.admit(session, 0);
    assert.deepEqual(sent, ["EVALSHA"]); // both breakers checked, the budget's deposit written
    assert.equal(session.next().kind, "dispatch");
    session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: RETURNED });
    sent.length = 0;
    assert.notEqual(await fleet.record(session), undefined);
    assert.deepEqual(sent, ["EVALSHA"]);
    session.free();
    // Whole runs in a warm process: two round trips per one-attempt run.
    sent.length = 0;
    for (let i = 0; i < 20; i++) assert.equal((await oneRun(compiled, fleet)).terminal, "completed");
    assert.equal(sent.length, 40, sent.join(" "));
    assert.ok(sent.every((c) => c === "EVALSHA"), sent.join(" "));
    assert.equal(fleet.stats.conflicts, 0);
    // The store holds what the cache says: 22 deposits, 22 outcomes.
    const budget = await fleet.store.get(fleet.budgetKey(BUDGET.scope));
    assert.equal(/** @type {any} */ (budget.document).deposits, 22);
    const release = /** @type {any} */ (compiled.policy.routes[0]).route_release_sha256;
    const breaker = await fleet.store.get(fleet.breakerKey(release));
    assert.equal(/** @type {any} */ (breaker.document).window_total, 22);

    // A cold cache (a new process on the same keys): the first admission reads once.
    const cold = countingClient(/** @type {string} */ (redis.url));
    try {
      const fresh = new rl.Fleet(new RedisStore({ client: cold.client }), { namespace: fleet.namespace });
      await oneRun(compiled, fresh); // loads the scripts on this connection
      const s = compiled.session();
      const again = new rl.Fleet(new RedisStore({ client: cold.client }), { namespace: fleet.namespace });
      cold.sent.length = 0;
      await again.admit(s, 0);
      assert.deepEqual(cold.sent, ["PIPELINE", "EVALSHA"]);
      cold.sent.length = 0;
      await again.admit(s, 0); // admitted again before the observation: from the cache
      assert.deepEqual(cold.sent, ["EVALSHA"]);
      s.free();
      assert.equal(again.stats.conflicts, 0);
    } finally {
      cold.client.disconnect();
    }
  } finally {
    compiled.free();
    client.disconnect();
  }
});

test("Redis: a breaker opened by another process is caught by the check; the admission is redone from the answer and skips the route", { skip: redis.skip }, async () => {
  const { client, sent } = countingClient(/** @type {string} */ (redis.url));
  const ns = namespace("optimistic-stale");
  const fleet = new rl.Fleet(new RedisStore({ client }), { namespace: ns });
  const other = new rl.Fleet(new RedisStore({ url: /** @type {string} */ (redis.url) }), { namespace: ns }); // another process
  const compiled = rl.compilePolicy(fleetPolicy({ breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 600000 } }));
  try {
    assert.deepEqual((await oneRun(compiled, fleet)).routes, ["private-primary"]); // this process's cache: the primary closed
    const opened = await oneRun(compiled, other, false);
    assert.deepEqual(opened.routes, ["private-primary", "private-primary", "external-fallback"]);
    const primary = /** @type {any} */ (compiled.policy.routes[0]).route_release_sha256;
    assert.equal(/** @type {any} */ ((await other.store.get(other.breakerKey(primary))).document).state, "open");

    const session = compiled.session();
    sent.length = 0;
    const answer = await fleet.admit(session, 0);
    // The first script found the cached generations stale and answered every
    // key; the second, from that answer, was written. No read between.
    assert.deepEqual(sent, ["EVALSHA", "EVALSHA"]);
    assert.equal(fleet.stats.conflicts, 1);
    const d = /** @type {any} */ (answer.decision);
    assert.equal(d.kind, "dispatch");
    assert.equal(d.route_id, "external-fallback");
    assert.equal(/** @type {any} */ (session.next()).route_id, "external-fallback");
    session.free();

    // A whole run: the primary skipped, from the cache now current.
    sent.length = 0;
    const run = await oneRun(compiled, fleet);
    assert.equal(run.terminal, "completed");
    assert.deepEqual(run.routes, ["external-fallback"]);
    assert.deepEqual(sent, ["EVALSHA", "EVALSHA"]);
    assert.equal(fleet.stats.conflicts, 1);
  } finally {
    compiled.free();
    client.disconnect();
    await other.close();
  }
});

/**
 * A MemoryStore wrapper recording each checkAndSet (its entries and whether
 * it wrote) and counting reads.
 */
function watched() {
  const memory = new MemoryStore();
  /** @type {{ok: boolean, entries: {key: string, expectedGeneration: number, write: boolean}[]}[]} */
  const calls = [];
  const counts = { reads: 0 };
  /** @type {rl.FleetStore} */
  const store = {
    get: (k) => memory.get(k),
    compareAndSet: (k, g, d) => memory.compareAndSet(k, g, d),
    getManyRaw: (keys) => (counts.reads++, memory.getManyRaw(keys)),
    checkAndSet: (entries) => {
      const answer = memory.checkAndSet(entries);
      calls.push({ ok: answer.ok, entries: entries.map((e) => ({ key: e.key, expectedGeneration: e.expectedGeneration, write: e.text !== null })) });
      return answer;
    },
  };
  return { memory, store, calls, counts };
}

test("every key of the view is in the one checkAndSet: check-only entries first, then the budget, then the breaker", async () => {
  const { memory, store, calls, counts } = watched();
  let wall = 1_780_000_000_000;
  const fleet = new rl.Fleet(store, { namespace: "entries", now: () => wall });
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    const [primary, fallback] = /** @type {any[]} */ (compiled.policy.routes).map((r) => r.route_release_sha256);
    // The primary down: its failures open its breaker (the first run may stop on the empty budget).
    for (let i = 0; i < 2; i++) {
      try {
        await oneRun(compiled, fleet, false);
      } catch (e) {
        if (!(e instanceof rl.RunStoppedError)) throw e;
      }
    }
    assert.equal(/** @type {any} */ (memory.get(fleet.breakerKey(primary)).document).state, "open");
    assert.equal(counts.reads, 1, "the view read once, for the cold cache");
    // After open_ms the primary is half-open: a probe reserved in its breaker
    // and a deposit into the budget, the fallback's breaker checked, in one call.
    wall += 60_000;
    calls.length = 0;
    const run = await oneRun(compiled, fleet);
    assert.equal(run.terminal, "completed");
    assert.deepEqual(run.routes, ["private-primary"]);
    const gen = (/** @type {string} */ key) => memory.get(key).generation;
    assert.deepEqual(
      calls[0]?.entries.map((e) => [e.key, e.write]),
      [
        [fleet.breakerKey(fallback), false],
        [fleet.budgetKey(BUDGET.scope), true],
        [fleet.breakerKey(primary), true],
      ],
    );
    assert.equal(calls[0]?.ok, true);
    assert.equal(calls.length, 2); // the admission; the record
    assert.equal(counts.reads, 1);
    assert.equal(fleet.stats.conflicts, 0);
    // The cache follows the store: the next admission expects the current generations.
    calls.length = 0;
    await oneRun(compiled, fleet);
    for (const e of /** @type {any} */ (calls[0]).entries) assert.ok(e.expectedGeneration <= gen(e.key));
    assert.equal(calls[0]?.ok, true);
  } finally {
    compiled.free();
  }
});

test("writes made before a mismatch stay; the admission is redone on them from the answer, with no read", async () => {
  const { memory, store, calls, counts } = watched();
  let wall = 1_780_000_000_000;
  const fleet = new rl.Fleet(store, { namespace: "partial", now: () => wall });
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    const primary = fleet.breakerKey(/** @type {any} */ (compiled.policy.routes[0]).route_release_sha256);
    const budget = fleet.budgetKey(BUDGET.scope);
    for (let i = 0; i < 2; i++) {
      try {
        await oneRun(compiled, fleet, false);
      } catch (e) {
        if (!(e instanceof rl.RunStoppedError)) throw e;
      }
    }
    assert.equal(/** @type {any} */ (memory.get(primary).document).state, "open");
    wall += 60_000;
    // Another process rewrites the primary's breaker: the cached generation is stale.
    const b = memory.get(primary);
    assert.equal(memory.compareAndSet(primary, b.generation, /** @type {any} */ (b.document)).ok, true);
    const before = memory.get(budget);
    calls.length = 0;
    const session = compiled.session();
    const answer = await fleet.admit(session, 0);
    assert.equal(/** @type {any} */ (answer.decision).route_id, "private-primary"); // the half-open probe
    // The first call wrote the budget, then met the breaker; the second, from its answer, wrote both.
    assert.deepEqual(
      calls.map((c) => c.ok),
      [false, true],
    );
    assert.equal(counts.reads, 1, "only the cold cache's read");
    assert.equal(fleet.stats.conflicts, 1);
    // The known bounded case: the deposit made before the mismatch stays, and the retry deposits again.
    const after = memory.get(budget);
    assert.equal(after.generation, before.generation + 2);
    assert.equal(/** @type {any} */ (after.document).deposits, /** @type {any} */ (before.document).deposits + 2);
    assert.equal(/** @type {any} */ (memory.get(primary).document).probes_in_flight, 1);
    session.free();
  } finally {
    compiled.free();
  }
});

test("a store error admits with store_unavailable, and the next admission reads again", async () => {
  const { store, counts } = watched();
  let down = false;
  const check = /** @type {NonNullable<rl.FleetStore["checkAndSet"]>} */ (store.checkAndSet);
  store.checkAndSet = (entries) => {
    if (down) throw new rl.StoreUnavailableError("down");
    return check(entries);
  };
  const fleet = new rl.Fleet(store, { namespace: "down" });
  const compiled = rl.compilePolicy(fleetPolicy({ on_store_unavailable: "fail_open" }));
  try {
    await oneRun(compiled, fleet);
    assert.equal(counts.reads, 1);
    down = true;
    const session = compiled.session();
    await fleet.admit(session, 0);
    assert.equal(fleet.stats.unavailable, 1);
    assert.equal(session.next().kind, "dispatch"); // fail_open
    session.free();
    down = false;
    await oneRun(compiled, fleet);
    assert.equal(counts.reads, 2, "the cache was dropped: the view read again");
  } finally {
    compiled.free();
  }
});
