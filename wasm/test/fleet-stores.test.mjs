// The store conformance scenarios (tests/stores/register.json) on every
// backend: memory, SQLite (better-sqlite3), Redis (ioredis, REDIS_URL),
// PostgreSQL (pg, DATABASE_URL).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { setImmediate as tick } from "node:timers/promises";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { RedisStore } from "../dist/stores/redis.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const conformance = JSON.parse(fs.readFileSync(path.resolve(here, "../../tests/stores/register.json"), "utf8"));
const redis = redisGate();
const postgres = postgresGate();

/** @typedef {import("../dist/index.js").FleetStore} FleetStore */

/** @param {unknown} x @returns {string} */
function canonical(x) {
  if (Array.isArray(x)) return `[${x.map(canonical).join(",")}]`;
  if (typeof x === "object" && x !== null) {
    const o = /** @type {Record<string, unknown>} */ (x);
    return `{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(x);
}

/**
 * Every scenario in order, each on a fresh namespace.
 * @param {FleetStore} store
 */
async function scenarios(store) {
  assert.equal(conformance.schema, "retryledger.store_conformance.v1");
  assert.ok(conformance.scenarios.length >= 7);
  for (const s of conformance.scenarios) {
    const ns = namespace("conf");
    for (const step of s.steps) {
      if (step.get !== undefined) {
        const got = await store.get(`${ns}/${step.get}`);
        assert.equal(canonical(got), canonical(step.expect), `${s.name}: get ${step.get}`);
      } else {
        const got = await store.compareAndSet(`${ns}/${step.cas}`, step.expected, step.document);
        assert.equal(canonical(got), canonical(step.expect), `${s.name}: cas ${step.cas}`);
      }
    }
  }
}

/**
 * The concurrency section: `workers` each add 1 to a counter `increments`
 * times through get and compare-and-set, retrying on conflict.
 * @param {FleetStore[]} stores one per worker (connections of the same backend)
 * @returns {Promise<number>} conflicts seen
 */
async function concurrency(stores) {
  const { workers, increments } = conformance.concurrency;
  assert.equal(stores.length, workers);
  const key = `${namespace("count")}/counter`;
  let conflicts = 0;
  await Promise.all(
    stores.map(async (store) => {
      for (let i = 0; i < increments; i++) {
        for (;;) {
          const r = await store.get(key);
          const n = r.document === null ? 0 : /** @type {number} */ (r.document.n);
          await tick(); // let the other workers interleave between the read and the write
          const w = await store.compareAndSet(key, r.generation, { n: n + 1 });
          if (w.ok) break;
          conflicts++;
        }
      }
    }),
  );
  const end = await /** @type {FleetStore} */ (stores[0]).get(key);
  assert.deepEqual(end, { document: { n: workers * increments }, generation: workers * increments });
  return conflicts;
}

test("memory store: the conformance scenarios and 8 concurrent incrementers", async () => {
  const store = new rl.MemoryStore();
  await scenarios(store);
  const conflicts = await concurrency(Array.from({ length: conformance.concurrency.workers }, () => store));
  assert.ok(conflicts > 0, "the workers interleaved (some writes conflicted)");
});

test("memory store: a bad generation or document is refused", () => {
  const store = new rl.MemoryStore();
  assert.throws(() => store.compareAndSet("k", -1, {}), TypeError);
  assert.throws(() => store.compareAndSet("k", 0.5, {}), TypeError);
  assert.throws(() => store.compareAndSet("k", 0, /** @type {any} */ ([1])), TypeError);
  assert.deepEqual(store.get("k"), { document: null, generation: 0 });
});

test("SQLite store: the conformance scenarios, 8 connections incrementing, and documents kept across reopen", async () => {
  const file = tempDbPath();
  const store = new SQLiteStore(file);
  try {
    await scenarios(store);
    const others = Array.from({ length: conformance.concurrency.workers }, () => new SQLiteStore(file));
    try {
      const conflicts = await concurrency(others);
      assert.ok(conflicts > 0, "the connections interleaved (some writes conflicted)");
    } finally {
      for (const s of others) s.close();
    }
    store.compareAndSet("persist/k", 0, { v: "kept" });
  } finally {
    store.close();
  }
  const again = new SQLiteStore(file);
  try {
    assert.deepEqual(again.get("persist/k"), { document: { v: "kept" }, generation: 1 });
  } finally {
    again.close();
  }
});

test("SQLite store: an unopenable file is StoreUnavailableError", () => {
  assert.throws(() => new SQLiteStore("/nonexistent-dir/x/fleet.db"), rl.StoreUnavailableError);
});

test("Redis store: the conformance scenarios and 8 clients incrementing", { skip: redis.skip }, async () => {
  const url = /** @type {string} */ (redis.url);
  const store = new RedisStore({ url });
  const others = Array.from({ length: conformance.concurrency.workers }, () => new RedisStore({ url }));
  try {
    await scenarios(store);
    const conflicts = await concurrency(others);
    assert.ok(conflicts > 0, "the clients interleaved (some writes conflicted)");
    // One pipeline reads several keys, in order.
    const ns = namespace("many");
    await store.compareAndSet(`${ns}/a`, 0, { a: 1 });
    assert.deepEqual(await store.getMany([`${ns}/b`, `${ns}/a`]), [
      { document: null, generation: 0 },
      { document: { a: 1 }, generation: 1 },
    ]);
  } finally {
    await store.close();
    for (const s of others) await s.close();
  }
});

test("Redis store: a server that does not answer is StoreUnavailableError within the timeouts", async () => {
  // A port nothing listens on (bound and released).
  const net = await import("node:net");
  const port = await new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, "127.0.0.1", () => {
      const a = /** @type {import("node:net").AddressInfo} */ (srv.address());
      srv.close(() => resolve(a.port));
    });
  });
  const store = new RedisStore({ url: `redis://127.0.0.1:${port}`, connectTimeoutMs: 300 });
  try {
    const t0 = performance.now();
    await assert.rejects(() => Promise.resolve(store.get("k")), rl.StoreUnavailableError);
    await assert.rejects(() => Promise.resolve(store.compareAndSet("k", 0, { a: 1 })), rl.StoreUnavailableError);
    assert.ok(performance.now() - t0 < 5000, "failed within the timeouts");
  } finally {
    await store.close();
  }
});

test("PostgreSQL store: the conformance scenarios and 8 clients incrementing", { skip: postgres.skip }, async () => {
  const connectionString = /** @type {string} */ (postgres.url);
  const store = new PostgresStore({ connectionString });
  const others = Array.from({ length: conformance.concurrency.workers }, () => new PostgresStore({ connectionString, max: 1 }));
  try {
    await scenarios(store);
    const conflicts = await concurrency(others);
    assert.ok(conflicts > 0, "the clients interleaved (some writes conflicted)");
    // One statement reads several keys, in order.
    const ns = namespace("many");
    await store.compareAndSet(`${ns}/a`, 0, { a: 1 });
    assert.deepEqual(await store.getMany([`${ns}/b`, `${ns}/a`]), [
      { document: null, generation: 0 },
      { document: { a: 1 }, generation: 1 },
    ]);
  } finally {
    await store.close();
    for (const s of others) await s.close();
  }
});
