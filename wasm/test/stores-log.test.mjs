// Every store backend (memory, SQLite, Redis, PostgreSQL) is an append log:
// the scenarios of tests/stores/log.json in order, each on a fresh namespace,
// its refused inputs, and its race (8 clients appending to one seq at once:
// exactly one wins, every other answer is the winner's event). Then what is
// PostgreSQL's own: an unreachable server is StoreUnavailableError for every
// call, a connection the server ended fails once and the next call opens
// another, and documents are kept as text.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { RedisStore } from "../dist/stores/redis.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const conformance = JSON.parse(fs.readFileSync(path.resolve(here, "../../tests/stores/log.json"), "utf8"));
const redis = redisGate();
const postgres = postgresGate();

/** @typedef {import("../dist/index.js").FleetStore & import("../dist/index.js").AppendLog & {close?: () => unknown}} Store */

/** @type {[string, string | false, () => Store][]} */
const BACKENDS = [
  ["memory", false, () => new rl.MemoryStore()],
  ["sqlite", false, () => new SQLiteStore(sqliteFile)],
  ["redis", redis.skip, () => new RedisStore({ url: /** @type {string} */ (redis.url) })],
  ["postgres", postgres.skip, () => new PostgresStore({ connectionString: /** @type {string} */ (postgres.url), max: 1 })],
];
const sqliteFile = tempDbPath();

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

test("the log conformance file has its scenarios", () => {
  assert.equal(conformance.schema, "retryledger.log_conformance.v1");
  assert.ok(conformance.scenarios.length >= 9);
  assert.ok(conformance.refused.appends.length >= 8);
});

for (const [backend, skip, open] of BACKENDS) {
  test(`${backend}: the log scenarios`, { skip }, async () => {
    const store = open();
    let steps = 0;
    try {
      for (const s of conformance.scenarios) {
        const ns = namespace("log");
        for (const [i, step] of s.steps.entries()) {
          const where = `${s.name} step ${i}`;
          if (step.append !== undefined) {
            const got = await store.append(`${ns}/${step.append}`, step.seq, step.event);
            assert.deepEqual(got, step.expect, where);
          } else if (step.read !== undefined) {
            const got = await store.read(`${ns}/${step.read}`, step.from ?? 0);
            assert.deepEqual(
              got.map((e) => [e.seq, e.text]),
              step.expect,
              where,
            );
          } else if (step.last_seq !== undefined) {
            assert.equal(await store.lastSeq(`${ns}/${step.last_seq}`), step.expect, where);
          } else if (step.cas !== undefined) {
            assert.deepEqual(await store.compareAndSet(`${ns}/${step.cas}`, step.expected, step.document), step.expect, where);
          } else if (step.get !== undefined) {
            assert.equal(canonical(await store.get(`${ns}/${step.get}`)), canonical(step.expect), where);
          } else {
            assert.fail(`unknown step ${JSON.stringify(step)}`);
          }
          steps++;
        }
      }
    } finally {
      await store.close?.();
    }
    assert.ok(steps >= 39);
  });

  test(`${backend}: the log refuses what no store takes, before the store is touched`, { skip }, async () => {
    const store = open();
    try {
      const log = `${namespace("bad")}/${conformance.refused.log}`;
      for (const bad of conformance.refused.appends) {
        await assert.rejects(async () => store.append(log, bad.seq, bad.event), TypeError, JSON.stringify(bad));
      }
      assert.deepEqual(await store.read(log), []);
      assert.equal(await store.lastSeq(log), null);
      await assert.rejects(async () => store.read(log, -1), TypeError);
      await assert.rejects(async () => store.append("", 0, "{}"), TypeError);
    } finally {
      await store.close?.();
    }
  });

  test(`${backend}: 8 clients append to one seq at once, one wins each time`, { skip }, async () => {
    const { workers, rounds } = conformance.race;
    const shared = open();
    const clients = backend === "memory" ? Array.from({ length: workers }, () => shared) : Array.from({ length: workers }, open);
    const log = `${namespace("race")}/journal`;
    try {
      for (let seq = 0; seq < rounds; seq++) {
        const answers = await Promise.all(clients.map((c, w) => c.append(log, seq, JSON.stringify({ seq, worker: w }))));
        const winners = answers.filter((a) => a.ok);
        assert.equal(winners.length, 1, `seq ${seq}: ${JSON.stringify(answers)}`);
        const [entry] = await shared.read(log, seq);
        assert.ok(entry !== undefined && entry.seq === seq);
        for (const a of answers) if (!a.ok) assert.deepEqual(a, { ok: false, code: "seq_taken", existing: entry.text });
      }
      assert.equal(await shared.lastSeq(log), rounds - 1);
    } finally {
      await shared.close?.();
      if (backend !== "memory") for (const c of clients) await c.close?.();
    }
  });
}

/** A port nothing listens on (bound and released). @returns {Promise<number>} */
function closedPort() {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, "127.0.0.1", () => {
      const a = /** @type {net.AddressInfo} */ (srv.address());
      srv.close(() => resolve(a.port));
    });
  });
}

test("PostgreSQL store: a server that does not answer is StoreUnavailableError (code store_unavailable) for every call", async () => {
  const store = new PostgresStore({ connectionString: `postgresql://retryledger@127.0.0.1:${await closedPort()}/retryledger`, connectTimeoutMs: 500 });
  try {
    const t0 = performance.now();
    /** @type {(() => unknown)[]} */
    const calls = [
      () => store.get("k"),
      () => store.getMany(["k", "l"]),
      () => store.compareAndSet("k", 0, { a: 1 }),
      () => store.checkAndSet([{ key: "k", expectedGeneration: 0, text: '{"a":1}' }]),
      () => store.append("log", 0, "{}"),
      () => store.read("log"),
      () => store.lastSeq("log"),
    ];
    for (const call of calls) {
      await assert.rejects(async () => call(), (e) => e instanceof rl.StoreUnavailableError && e.code === "store_unavailable");
    }
    assert.ok(performance.now() - t0 < 10000, "failed within the timeouts");
  } finally {
    await store.close();
  }
});

test("PostgreSQL store: a connection the server ended fails once, the next call opens another", { skip: postgres.skip }, async () => {
  const connectionString = /** @type {string} */ (postgres.url);
  const store = new PostgresStore({ connectionString, max: 1 });
  const admin = new pg.Client({ connectionString });
  await admin.connect();
  try {
    const ns = namespace("lost");
    assert.deepEqual(await store.compareAndSet(`${ns}/k`, 0, { v: 1 }), { ok: true, generation: 1 });
    await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()");
    // The pool may notice the ended connection before the next statement (then no failure is seen) or on it.
    let failed = 0;
    try {
      await store.compareAndSet(`${ns}/k`, 1, { v: 2 });
    } catch (e) {
      assert.ok(e instanceof rl.StoreUnavailableError);
      failed++;
    }
    const now = await store.get(`${ns}/k`);
    assert.deepEqual(now, failed === 1 ? { document: { v: 1 }, generation: 1 } : { document: { v: 2 }, generation: 2 });
    if (failed === 1) assert.deepEqual(await store.compareAndSet(`${ns}/k`, 1, { v: 2 }), { ok: true, generation: 2 });
    assert.deepEqual(await store.get(`${ns}/k`), { document: { v: 2 }, generation: 2 });
  } finally {
    await admin.end();
    await store.close();
  }
});

test("PostgreSQL store: documents and events are text, kept byte for byte", { skip: postgres.skip }, async () => {
  const connectionString = /** @type {string} */ (postgres.url);
  const store = new PostgresStore({ connectionString });
  try {
    const ns = namespace("text");
    assert.deepEqual(await store.checkAndSet([{ key: `${ns}/k`, expectedGeneration: 0, text: '{"z":1, "a" :2}' }]), { ok: true, rows: [] });
    assert.deepEqual(await store.getManyRaw([`${ns}/k`]), [{ text: '{"z":1, "a" :2}', generation: 1 }]);
  } finally {
    await store.close();
  }
});

test("SQLite store: synchronous NORMAL (default) or FULL, as the connection reports it, journal WAL", () => {
  const file = tempDbPath();
  for (const [options, want] of /** @type {const} */ ([
    [{}, "NORMAL"],
    [{ synchronous: "NORMAL" }, "NORMAL"],
    [{ synchronous: "FULL" }, "FULL"],
  ])) {
    const store = new SQLiteStore(file, options);
    try {
      assert.equal(store.synchronous, want);
      assert.equal(store.journalMode, "wal");
    } finally {
      store.close();
    }
  }
  assert.throws(() => new SQLiteStore(file, { synchronous: /** @type {any} */ ("OFF") }), TypeError);
});
