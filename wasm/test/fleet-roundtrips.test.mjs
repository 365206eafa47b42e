// What a fleet costs its store per attempt, and the multi-key check-and-set
// every backend offers (`checkAndSet`).
//
// Round trips are counted through an ioredis client that counts what it
// sends: each command, and each pipeline as one. In the steady state an
// attempt is admitted in two (the view read in one pipeline, the changed
// snapshots written by one script) and recorded in one (the breaker's next
// snapshot computed from the fleet's cached one and written by the same
// script); when another process wrote the breaker since, the script's answer
// refreshes the cache and the outcome is recorded again without a separate
// read. A TypeScript process and a Python process share one Redis breaker.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Redis } from "ioredis";

import * as rl from "../dist/index.js";
import { MemoryStore } from "../dist/stores/memory.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { RedisStore } from "../dist/stores/redis.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const redis = redisGate();
const postgres = postgresGate();
const BUDGET = { scope: "tenant-7/summaries", ratio_permille: 500, floor_per_second: 1, max_tokens: 1000 };
const RETURNED = /** @type {const} */ ({ result: "returned" });
const URL = /** @type {string} */ (redis.url);

/**
 * An ioredis client counting its round trips in `sent`: each command sent on
 * its own, and each pipeline (sent at once) as one, `PIPELINE`.
 * @param {string} url
 */
function countingClient(url) {
  const client = new Redis(url, { maxRetriesPerRequest: 0 });
  client.on("error", () => {});
  /** @type {string[]} */
  const sent = [];
  const send = /** @type {(...a: any[]) => any} */ (client.sendCommand.bind(client));
  // A pipeline sends its commands with a stream: counted once, on exec.
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

/** @param {string} url */
function countingFleet(url) {
  const { client, sent } = countingClient(url);
  const fleet = new rl.Fleet(new RedisStore({ client }), { namespace: namespace("trips") });
  return { client, sent, fleet };
}

/** One run of `compiled` whose every dispatch answers. @param {rl.CompiledPolicy} compiled @param {rl.Fleet} fleet */
async function oneRun(compiled, fleet) {
  const time = fakeTime();
  const r = await rl.runWithPolicy(compiled, async () => "ok", { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  return r.sealed.terminal;
}

/**
 * Admit a session's first attempt; returns the session and the dispatch.
 * @param {rl.CompiledPolicy} compiled @param {rl.Fleet} fleet
 */
async function admitted(compiled, fleet) {
  const session = compiled.session();
  await fleet.admit(session, 0);
  const d = session.next();
  assert.equal(d.kind, "dispatch");
  return { session, dispatch: /** @type {any} */ (d) };
}

test("Redis steady state: one script to admit, one to record", { skip: redis.skip }, async () => {
  const { client, sent, fleet } = countingFleet(/** @type {string} */ (redis.url));
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    assert.equal(await oneRun(compiled, fleet), "completed"); // loads the scripts, fills the cache
    sent.length = 0;
    const { session } = await admitted(compiled, fleet);
    assert.deepEqual(sent, ["EVALSHA"]); // every key checked from the cached view; the budget's deposit
    session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: RETURNED });
    sent.length = 0;
    assert.notEqual(await fleet.record(session), undefined);
    assert.deepEqual(sent, ["EVALSHA"]); // from the cached breaker, no read
    session.free();
    // Whole runs: two round trips per one-attempt run.
    sent.length = 0;
    for (let i = 0; i < 20; i++) assert.equal(await oneRun(compiled, fleet), "completed");
    assert.equal(sent.length, 2 * 20, sent.join(" "));
    assert.equal(fleet.stats.conflicts, 0);
  } finally {
    compiled.free();
    client.disconnect();
  }
});

test("Redis: a breaker-only policy admits in one script (every breaker checked) and records in one", { skip: redis.skip }, async () => {
  const { client, sent, fleet } = countingFleet(/** @type {string} */ (redis.url));
  const compiled = rl.compilePolicy(fleetPolicy());
  try {
    await oneRun(compiled, fleet);
    sent.length = 0;
    for (let i = 0; i < 10; i++) assert.equal(await oneRun(compiled, fleet), "completed");
    // A closed breaker admits without a write: its generation checked, then the record.
    assert.deepEqual(sent, Array.from({ length: 10 }, () => ["EVALSHA", "EVALSHA"]).flat());
  } finally {
    compiled.free();
    client.disconnect();
  }
});

test("Redis: a stale cache is refreshed from the script's answer, without a separate read", { skip: redis.skip }, async () => {
  const { client, sent, fleet } = countingFleet(/** @type {string} */ (redis.url));
  const other = new rl.Fleet(new RedisStore({ url: URL }), { namespace: fleet.namespace }); // another process
  const compiled = rl.compilePolicy(fleetPolicy());
  try {
    await oneRun(compiled, fleet);
    const { session, dispatch } = await admitted(compiled, fleet);
    const release = dispatch.route_release_sha256;
    // Between this admission and its record, the other process records an
    // outcome in the same breaker: this fleet's cached snapshot is stale.
    const o = await admitted(compiled, other);
    o.session.observe({ started_at_ms: 0, completed_at_ms: 5, facts: RETURNED });
    assert.notEqual(await other.record(o.session), undefined);
    o.session.free();
    const before = await fleet.store.get(fleet.breakerKey(release));
    assert.equal(/** @type {any} */ (before.document).window_total, 2);
    session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: RETURNED });
    sent.length = 0;
    const recorded = await fleet.record(session);
    session.free();
    // The first script conflicted and answered the current snapshot; the
    // outcome was recorded on it by a second script, with no read between.
    assert.deepEqual(sent, ["EVALSHA", "EVALSHA"]);
    assert.equal(fleet.stats.conflicts, 1);
    assert.equal(recorded?.window_total, 3);
    assert.deepEqual((await fleet.store.get(fleet.breakerKey(release))).document, recorded);
  } finally {
    compiled.free();
    client.disconnect();
    await other.close();
  }
});

/** @type {[string, () => {store: rl.FleetStore, done: () => unknown}][]} */
const BACKENDS = [
  ["memory", () => ({ store: new MemoryStore(), done: () => {} })],
  [
    "sqlite",
    () => {
      const store = new SQLiteStore(tempDbPath());
      return { store, done: () => store.close() };
    },
  ],
  [
    "redis",
    () => {
      const store = new RedisStore({ url: URL });
      return { store, done: () => store.close() };
    },
  ],
  [
    "postgres",
    () => {
      const store = new PostgresStore({ connectionString: /** @type {string} */ (postgres.url) });
      return { store, done: () => store.close() };
    },
  ],
];

/** @param {{text: string | null, generation: number}[]} rows */
const plain = (rows) => rows.map((r) => [r.text === null ? null : JSON.stringify(JSON.parse(r.text)), r.generation]);

for (const [backend, open] of BACKENDS) {
  const skip = backend === "redis" ? redis.skip : backend === "postgres" ? postgres.skip : false;

  test(`checkAndSet (${backend}): writes when every generation is the one expected`, { skip }, async () => {
    const { store, done } = open();
    try {
      const ns = namespace("cas");
      const [a, b, c] = [`${ns}/a`, `${ns}/b`, `${ns}/c`];
      assert.deepEqual(await store.compareAndSet(b, 0, { b: 1 }), { ok: true, generation: 1 });
      const answer = await /** @type {any} */ (store).checkAndSet([
        { key: a, expectedGeneration: 0, text: '{"a":1}' },
        { key: b, expectedGeneration: 1, text: null },
        { key: c, expectedGeneration: 0, text: '{"c":1}' },
      ]);
      assert.deepEqual(answer, { ok: true, rows: [] });
      const got = [];
      for (const k of [a, b, c]) got.push(await store.get(k));
      assert.deepEqual(got, [
        { document: { a: 1 }, generation: 1 },
        { document: { b: 1 }, generation: 1 },
        { document: { c: 1 }, generation: 1 },
      ]);
    } finally {
      await done();
    }
  });

  test(`checkAndSet (${backend}): a stale check writes nothing and answers every key`, { skip }, async () => {
    const { store, done } = open();
    try {
      const ns = namespace("cas");
      const [a, b] = [`${ns}/a`, `${ns}/b`];
      await store.compareAndSet(b, 0, { b: 1 });
      await store.compareAndSet(b, 1, { b: 2 });
      const answer = await /** @type {any} */ (store).checkAndSet([
        { key: a, expectedGeneration: 0, text: '{"a":1}' },
        { key: b, expectedGeneration: 1, text: null },
      ]);
      assert.equal(answer.ok, false);
      assert.deepEqual(plain(answer.rows), [
        [null, 0],
        ['{"b":2}', 2],
      ]);
      assert.deepEqual(await store.get(a), { document: null, generation: 0 });
    } finally {
      await done();
    }
  });

  test(`checkAndSet (${backend}): writes in order up to the first conflict, and those stay`, { skip }, async () => {
    const { store, done } = open();
    try {
      const ns = namespace("cas");
      const [budget, breaker] = [`${ns}/budget`, `${ns}/breaker`];
      await store.compareAndSet(breaker, 0, { v: 1 });
      const answer = await /** @type {any} */ (store).checkAndSet([
        { key: budget, expectedGeneration: 0, text: '{"v":1}' },
        { key: breaker, expectedGeneration: 0, text: '{"v":2}' },
      ]);
      assert.equal(answer.ok, false);
      assert.deepEqual(plain(answer.rows), [
        ['{"v":1}', 1],
        ['{"v":1}', 1],
      ]);
      assert.deepEqual(await store.get(budget), { document: { v: 1 }, generation: 1 });
      assert.deepEqual(await store.get(breaker), { document: { v: 1 }, generation: 1 });
    } finally {
      await done();
    }
  });
}

test("a store with only get and compareAndSet still serves a fleet (a read before every write)", async () => {
  const memory = new MemoryStore();
  let calls = 0;
  /** @type {rl.FleetStore} */
  const store = {
    get: (k) => (calls++, memory.get(k)),
    compareAndSet: (k, g, d) => (calls++, memory.compareAndSet(k, g, d)),
  };
  const fleet = new rl.Fleet(store, { namespace: "plain" });
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    for (let i = 0; i < 3; i++) assert.equal(await oneRun(compiled, fleet), "completed");
    const release = /** @type {any} */ (compiled.policy.routes[0]).route_release_sha256;
    const breaker = memory.get(fleet.breakerKey(release));
    assert.equal(breaker.generation, 3);
    assert.equal(/** @type {any} */ (breaker.document).window_total, 3);
    assert.equal(memory.get(fleet.budgetKey(BUDGET.scope)).generation, 3);
    // Per run: the view's three gets (two breakers, the budget) and the
    // budget's compare-and-set; the breaker's get and compare-and-set.
    assert.equal(calls, 3 * 6);
    assert.equal(fleet.stats.records, 3);
  } finally {
    compiled.free();
  }
});

test("the fleet's cache is dropped when the store cannot be reached, and the next record reads again", async () => {
  const memory = new MemoryStore();
  let down = false;
  let reads = 0;
  /** @type {rl.FleetStore} */
  const store = {
    get: (k) => memory.get(k),
    compareAndSet: (k, g, d) => memory.compareAndSet(k, g, d),
    getManyRaw: (keys) => {
      if (down) throw new rl.StoreUnavailableError("down");
      reads++;
      return memory.getManyRaw(keys);
    },
    checkAndSet: (entries) => {
      if (down) throw new rl.StoreUnavailableError("down");
      return memory.checkAndSet(entries);
    },
  };
  const fleet = new rl.Fleet(store, { namespace: "cache" });
  const compiled = rl.compilePolicy(fleetPolicy({ on_store_unavailable: "fail_open" }));
  try {
    assert.equal(await oneRun(compiled, fleet), "completed");
    assert.equal(reads, 1); // the view; the record came from the cache
    down = true;
    const { session } = await admitted(compiled, fleet);
    assert.equal(fleet.stats.unavailable, 1);
    down = false;
    session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: RETURNED });
    reads = 0;
    assert.notEqual(await fleet.record(session), undefined);
    assert.equal(reads, 1); // the cache was dropped: the breaker read again
    session.free();
  } finally {
    compiled.free();
  }
});

test("a budget deposit and a half-open probe are written by one checkAndSet, the budget first", async () => {
  const memory = new MemoryStore();
  /** @type {{ok: boolean, keys: string[]}[]} */
  const calls = [];
  /** @type {rl.FleetStore} */
  const store = {
    get: (k) => memory.get(k),
    compareAndSet: (k, g, d) => memory.compareAndSet(k, g, d),
    getManyRaw: (keys) => memory.getManyRaw(keys),
    checkAndSet: (entries) => {
      const answer = memory.checkAndSet(entries);
      calls.push({ ok: answer.ok, keys: entries.map((e) => e.key) });
      return answer;
    },
  };
  let wall = 1_780_000_000_000;
  const fleet = new rl.Fleet(store, { namespace: "probe", now: () => wall });
  const compiled = rl.compilePolicy(fleetPolicy({ retry_budget: BUDGET }));
  try {
    const release = /** @type {any} */ (compiled.policy.routes[0]).route_release_sha256;
    // The primary down: the first run may stop on the empty budget; its
    // failures and the next run's open the breaker.
    for (let i = 0; i < 2; i++) {
      const time = fakeTime();
      try {
        await rl.runWithPolicy(
          compiled,
          async (/** @type {rl.Step} */ step) => {
            if (step.routeId === "private-primary") throw rl.AttemptError.retryable("unavailable");
            return "ok";
          },
          { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet },
        );
      } catch (e) {
        if (!(e instanceof rl.RunStoppedError)) throw e;
      }
    }
    assert.equal(/** @type {any} */ (memory.get(fleet.breakerKey(release)).document).state, "open");
    // After open_ms the primary is half-open: the admission reserves a probe
    // in its breaker and deposits into the budget, in one call.
    wall += 60_000;
    calls.length = 0;
    assert.equal(await oneRun(compiled, fleet), "completed");
    const fallback = /** @type {any} */ (compiled.policy.routes[1]).route_release_sha256;
    // The fallback's breaker checked only (first), then the writes, the budget first.
    assert.deepEqual(calls[0], { ok: true, keys: [fleet.breakerKey(fallback), fleet.budgetKey(BUDGET.scope), fleet.breakerKey(release)] });
    assert.equal(fleet.stats.conflicts, 0);
  } finally {
    compiled.free();
  }
});

// ---- a TypeScript process and a Python process sharing one Redis breaker ----

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const python = path.join(root, ".venv/bin/python");
const pythonChild = path.join(root, "python/tests/fleet_child.py");

/** Why the Python process cannot run here, or false. */
function pythonSkip() {
  if (redis.skip) return redis.skip;
  if (!fs.existsSync(python) || !fs.existsSync(pythonChild)) return "no .venv with the Python package (make python-setup)";
  try {
    execFileSync(python, ["-c", "import retryledger, redis"], { stdio: "ignore", env: { ...process.env, PYTHONPATH: path.join(root, "python") } });
  } catch {
    return "the Python package or redis-py is not importable from .venv";
  }
  return false;
}

/**
 * One run by a Python process (python/tests/fleet_child.py): `script` says
 * what each dispatch does (ok, unavailable). Returns {terminal, routes}.
 * @param {string} ns @param {string} policyPath @param {string} script
 */
async function pythonRun(ns, policyPath, script) {
  const out = path.join(path.dirname(policyPath), `out-${Math.random().toString(36).slice(2)}.json`);
  await promisify(execFile)(python, [pythonChild, "run", "redis", /** @type {string} */ (redis.url), ns, policyPath, script, out], {
    cwd: root,
    timeout: 60000,
    env: { ...process.env, PYTHONPATH: path.join(root, "python") },
  });
  return JSON.parse(fs.readFileSync(out, "utf8"));
}

test("a TypeScript process and a Python process share one Redis breaker", { skip: pythonSkip(), timeout: 120000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "retryledger-cross-"));
  const document = fleetPolicy({ breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 600000 } });
  const policyPath = path.join(dir, "policy.json");
  fs.writeFileSync(policyPath, JSON.stringify(document));
  const compiled = rl.compilePolicy(document);
  const { client, sent } = countingClient(/** @type {string} */ (redis.url));
  try {
    /** @param {string} ns @param {boolean} primaryUp */
    const tsRun = async (ns, primaryUp) => {
      const fleet = new rl.Fleet(new RedisStore({ client }), { namespace: ns });
      const routes = /** @type {string[]} */ ([]);
      const time = fakeTime();
      const r = await rl.runWithPolicy(
        compiled,
        async (/** @type {rl.Step} */ step) => {
          routes.push(step.routeId);
          if (step.routeId === "private-primary" && !primaryUp) throw rl.AttemptError.retryable("unavailable");
          return "ok";
        },
        { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet },
      );
      return { terminal: r.sealed.terminal, routes, skipped: r.sealed.receipt.fleet?.routes_skipped ?? 0, fleet };
    };

    // TypeScript opens the primary's breaker; Python reads it open and skips the primary.
    const ns1 = namespace("cross-ts");
    const a = await tsRun(ns1, false);
    assert.deepEqual(a.routes, ["private-primary", "private-primary", "external-fallback"]);
    const b = await pythonRun(ns1, policyPath, "ok");
    assert.equal(b.terminal, "completed");
    assert.deepEqual(b.routes, ["external-fallback"]);

    // Python opens it; TypeScript reads it open and skips the primary.
    const ns2 = namespace("cross-py");
    const c = await pythonRun(ns2, policyPath, "unavailable,unavailable,ok");
    assert.deepEqual(c.routes, ["private-primary", "private-primary", "external-fallback"]);
    const d = await tsRun(ns2, true);
    assert.equal(d.terminal, "completed");
    assert.deepEqual(d.routes, ["external-fallback"]);
    assert.equal(d.skipped, 1);

    // Python records in the breaker between a TypeScript admission and its
    // record: the record's script conflicts and the answer serves the retry.
    const ns3 = namespace("cross-stale");
    const fleet = new rl.Fleet(new RedisStore({ client }), { namespace: ns3 });
    await oneRun(compiled, fleet);
    const { session, dispatch } = await admitted(compiled, fleet);
    const e = await pythonRun(ns3, policyPath, "ok");
    assert.deepEqual(e.routes, ["private-primary"]);
    session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: RETURNED });
    sent.length = 0;
    const recorded = await fleet.record(session);
    session.free();
    assert.deepEqual(sent, ["EVALSHA", "EVALSHA"]);
    assert.equal(recorded?.window_total, 3);
    assert.deepEqual((await fleet.store.get(fleet.breakerKey(dispatch.route_release_sha256))).document, recorded);
  } finally {
    compiled.free();
    client.disconnect();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
