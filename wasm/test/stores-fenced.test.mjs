// appendFenced: an append in the same transaction as a check of a lease
// register's generation, on memory, SQLite, Redis and PostgreSQL (the same as
// python/tests/test_stores_fenced.py), and the takeover window it closes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { RedisStore } from "../dist/stores/redis.js";
import { postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const postgres = postgresGate();
const redis = redisGate();
/** @param {string} backend */
const skipOf = (backend) => (backend === "postgres" ? postgres.skip : backend === "redis" ? redis.skip : undefined);

/** @param {string} backend @param {string} [file] @returns {any} */
function open(backend, file) {
  if (backend === "memory") return new rl.MemoryStore();
  if (backend === "sqlite") return new SQLiteStore(file ?? tempDbPath());
  if (backend === "redis") return new RedisStore({ url: String(redis.url) });
  return new PostgresStore({ connectionString: String(postgres.url), max: 2 });
}

for (const backend of ["memory", "sqlite", "redis", "postgres"]) {
  test(`appendFenced checks the lease in the same write (${backend})`, { skip: skipOf(backend) }, async () => {
    const store = open(backend);
    const lease = `lease/${randomUUID()}`;
    const log = `journal/${randomUUID()}`;
    try {
      await assert.rejects(async () => store.appendFenced(log, 0, '{"a":0}', lease, 0), TypeError); // a held lease is at 1 or more
      assert.deepEqual(await store.appendFenced(log, 0, '{"a":0}', lease, 1), { ok: false, code: "lease_lost" });
      assert.deepEqual(await store.compareAndSet(lease, 0, { owner: 1 }), { ok: true, generation: 1 });
      assert.equal((await store.appendFenced(log, 0, '{"a":0}', lease, 1)).ok, true);
      assert.equal((await store.appendFenced(log, 1, '{"a":1}', lease, 1)).ok, true);
      assert.deepEqual(await store.appendFenced(log, 1, '{"late":1}', lease, 1), { ok: false, code: "seq_taken", existing: '{"a":1}' });
      assert.deepEqual(await store.compareAndSet(lease, 1, { owner: 2 }), { ok: true, generation: 2 });
      assert.deepEqual(await store.appendFenced(log, 2, '{"a":2}', lease, 1), { ok: false, code: "lease_lost" });
      assert.deepEqual(await store.appendFenced(log, 1, '{"a":1}', lease, 1), { ok: false, code: "lease_lost" }); // the lease first
      assert.equal((await store.appendFenced(log, 2, '{"b":2}', lease, 2)).ok, true);
      assert.deepEqual(
        (await store.read(log, 0)).map((/** @type {{text: string}} */ e) => e.text),
        ['{"a":0}', '{"a":1}', '{"b":2}'],
      );
    } finally {
      await store.close?.();
    }
  });
}

for (const backend of ["redis", "postgres"]) test(`racing takeovers and fenced appends through ${backend} never interleave generations`, { skip: skipOf(backend) }, async () => {
  const lease = `lease/${randomUUID()}`;
  const log = `journal/${randomUUID()}`;
  const stores = Array.from({ length: 4 }, () => open(backend));
  const [taker, ...writers] = stores;
  try {
    assert.ok((await taker.compareAndSet(lease, 0, { g: 1 })).ok);
    let stop = false;
    const writing = writers.map(async (/** @type {any} */ store) => {
      let seq = 0;
      while (!stop) {
        const { generation } = await store.get(lease);
        const answer = await store.appendFenced(log, seq, JSON.stringify({ g: generation }), lease, generation);
        if (answer.ok || answer.code === "seq_taken") seq++;
      }
    });
    let held = 0;
    for (let i = 0; i < 40; i++) {
      // Each generation gets an event in before the next takeover (so the
      // race is exercised however fast the machine is), waiting at most a
      // second for one.
      const until = Date.now() + 1000;
      while ((await taker.read(log, 0)).length <= held && Date.now() < until) await new Promise((r) => setTimeout(r, 1));
      held = (await taker.read(log, 0)).length;
      const { generation } = await taker.get(lease);
      await taker.compareAndSet(lease, generation, { g: generation + 1 });
    }
    stop = true;
    await Promise.all(writing);
    const gens = (await taker.read(log, 0)).map((/** @type {{text: string}} */ e) => JSON.parse(e.text).g);
    assert.ok(gens.length > 10, String(gens.length));
    assert.deepEqual(gens, [...gens].sort((a, b) => a - b));
  } finally {
    for (const s of stores) await s.close();
  }
});
