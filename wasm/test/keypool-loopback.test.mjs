// A pool of four keys against a provider on 127.0.0.1 through the npm
// package (docs/FLEET.md, "Key pools"): one key revoked (401), one rate
// limited (429, Retry-After 4 s, past the policy's 2 s cap), two healthy.
// Runs one after another on the run machine (`runPooled`), the pool in a
// memory, a SQLite, a Redis and a PostgreSQL store: the revoked key is never sent again, the limited
// one not before its hint, the keys are taken in turn, and no secret appears
// in any stored row or bundle. The revoked key's 401 does not end its run: the
// run goes on at once with another key, each attempt naming its key by digest;
// a pool whose every key is refused ends its run sealed, `stop_no_usable_key`.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { RedisStore } from "../dist/stores/redis.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { KEY, policyWith } from "./helpers.mjs";
import { namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const redis = redisGate();
const postgres = postgresGate();

const SECRETS = ["sk-live-revoked-0001", "sk-live-limited-0002", "sk-live-healthy-0003", "sk-live-healthy-0004"];
const [REVOKED, LIMITED] = SECRETS;
const HINT_MS = 4_000;

/** The provider: 401 for the revoked key, one 429 for the limited key, then 200; `squeeze` limits each healthy key once (Retry-After 3). */
function provider() {
  /** @type {{key: string, at: number, status: number}[]} */
  const seen = [];
  /** @type {{squeeze: boolean, squeezed: string[]}} */
  const state = { squeeze: false, squeezed: [] };
  const server = http.createServer((req, res) => {
    const at = performance.now();
    req.resume();
    req.on("end", () => {
      const key = (req.headers.authorization ?? "").replace(/^Bearer /, "");
      const before = seen.some((s) => s.key === key);
      let status = 200;
      /** @type {Record<string, string>} */
      let headers = {};
      if (key === REVOKED || !SECRETS.includes(key)) status = 401;
      else if (key === LIMITED && !before) [status, headers] = [429, { "retry-after": String(HINT_MS / 1000) }];
      else if (SECRETS.slice(2).includes(key) && state.squeeze && !state.squeezed.includes(key)) {
        state.squeezed.push(key);
        [status, headers] = [429, { "retry-after": "3" }];
      }
      seen.push({ key, at, status });
      res.writeHead(status, { "content-type": "application/json", ...headers });
      res.end(JSON.stringify({ ok: status === 200 }));
    });
  });
  return { server, seen, state };
}

/** @param {string} url @param {string} apiKey */
async function call(url, apiKey) {
  const r = await fetch(url, { method: "POST", headers: { authorization: `Bearer ${apiKey}` }, body: "{}" });
  const body = await r.json();
  if (r.status !== 200) throw Object.assign(new Error(`HTTP ${r.status}`), { status: r.status, headers: r.headers });
  return body;
}

/** @param {string} backend @param {string} dbPath @returns {any} */
function storeOf(backend, dbPath) {
  if (backend === "memory") return new rl.MemoryStore();
  if (backend === "sqlite") return new SQLiteStore(dbPath);
  if (backend === "redis") return new RedisStore({ url: /** @type {string} */ (redis.url) });
  return new PostgresStore({ connectionString: /** @type {string} */ (postgres.url) });
}

for (const backend of ["memory", "sqlite", "redis", "postgres"]) {
  const skip = backend === "redis" ? redis.skip : backend === "postgres" ? postgres.skip : false;
  test(`four keys, one revoked, one limited (${backend})`, { skip }, async () => {
    const dbPath = tempDbPath();
    const store = storeOf(backend, dbPath);
    const ns = namespace("pool");
    const ring = new rl.KeyRing(SECRETS);
    const pool = rl.poolConfig("provider-keys", ring, { coolMs: 1_000, parkMs: 60_000 });
    const policy = policyWith((p) => {
      p.fleet = /** @type {any} */ ({ key_pools: [pool], on_store_unavailable: "fail_closed" });
      for (const r of p.routes) /** @type {any} */ (r).key_pool = "provider-keys";
    });
    const { server, seen, state } = provider();
    await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
    const address = /** @type {import("node:net").AddressInfo} */ (server.address());
    const url = `http://127.0.0.1:${address.port}/v1/chat`;
    /** @type {string[]} */
    const documents = [];
    /** @type {string[]} */
    const terminals = [];
    /** @type {any[]} */
    const bundles = [];
    const one = async () => {
      const run = await rl.runPooled(
        policy,
        (_step, key) => {
          assert.ok(key !== undefined, "every route takes its key from the pool");
          return call(url, key.apiKey);
        },
        { idempotencyKey: KEY, store, keys: ring, namespace: ns },
      );
      terminals.push(run.terminal);
      bundles.push(run.bundle);
      documents.push(JSON.stringify(run.bundle), JSON.stringify(run.receipt));
    };
    try {
      for (let i = 0; i < 6; i++) await one();
      const inTurn = seen.length;
      state.squeeze = true;
      await one();
      const keys = seen.map((s) => s.key);
      // The 401 moves the first run at once to another key: every run completes.
      assert.deepEqual(terminals, Array(7).fill("completed"));
      assert.equal(keys[0], REVOKED);
      assert.ok((seen[1]?.at ?? 0) - (seen[0]?.at ?? 0) < 1_000, "no backoff after a refused key");
      const firstAttempts = bundles[0].attempts.attempts;
      assert.equal(firstAttempts[0].key_refused, "unauthorized");
      assert.deepEqual(
        firstAttempts.map((/** @type {any} */ a) => a.admission.key.key_sha256),
        keys.slice(0, firstAttempts.length).map((k) => rl.keySha256(k)),
        "each attempt records the key it was sent with",
      );
      assert.equal(bundles[0].receipt.schedule[0].key_sha256, rl.keySha256(SECRETS[0] ?? ""));
      // The revoked key: once.
      assert.equal(keys.filter((k) => k === REVOKED).length, 1, "the revoked key is never sent again");
      // The limited key: again only after its hint.
      const limitedAt = seen.find((s) => s.key === LIMITED && s.status === 429)?.at ?? 0;
      const again = seen.filter((s) => s.key === LIMITED && s.at > limitedAt);
      assert.ok(again.length > 0, "the limited key is used again once cooled");
      assert.ok((again[0]?.at ?? 0) >= limitedAt + HINT_MS, "not before its hint");
      // The squeezed run: a healthy key limited, then the key least recently touched (the other healthy key, limited in its
      // turn, or the limited key again, its hint long past) until one answers; no key twice.
      const squeezed = seen.slice(inTurn);
      const end = squeezed.findIndex((s) => s.status === 200);
      assert.ok(end >= 1 && end <= 2, JSON.stringify(squeezed.map((s) => s.status)));
      assert.ok(squeezed.slice(0, end).every((s) => s.status === 429 && SECRETS.slice(2).includes(s.key)));
      assert.equal(new Set(squeezed.slice(0, end + 1).map((s) => s.key)).size, end + 1, "a key asked twice in one run");
      // In turn.
      const first = keys.slice(0, inTurn);
      assert.deepEqual([...first.slice(0, 4)].sort(), [...SECRETS].sort());
      for (let i = 1; i < first.length; i++) assert.notEqual(first[i], first[i - 1], "a key drained one after another");
      // No secret anywhere.
      const { document } = await store.get(`${ns}/key_pool/provider-keys`);
      const rows = [JSON.stringify(document)];
      if (backend === "sqlite") rows.push(fs.readFileSync(dbPath).toString("latin1"));
      assert.ok(rows[0]?.includes("disabled"));
      for (const text of [...documents, ...rows, JSON.stringify(ring)]) {
        for (const secret of SECRETS) assert.ok(!text.includes(secret), "a secret in a document");
      }
    } finally {
      server.close();
      await store.close?.();
    }
  });
}

test("every key refused: the run ends sealed, stop_no_usable_key", async () => {
  const gone = ["sk-live-revoked-0001", "sk-live-gone-0005", "sk-live-gone-0006"];
  const ring = new rl.KeyRing(gone);
  const pool = rl.poolConfig("provider-keys", ring, { coolMs: 1_000, parkMs: 60_000 });
  const policy = policyWith((p) => {
    p.fleet = /** @type {any} */ ({ key_pools: [pool], on_store_unavailable: "fail_closed" });
    for (const r of p.routes) /** @type {any} */ (r).key_pool = "provider-keys";
  });
  const store = new rl.MemoryStore();
  const ns = namespace("pool-gone");
  const { server, seen } = provider();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  const url = `http://127.0.0.1:${address.port}/v1/chat`;
  try {
    const one = () =>
      rl.runPooled(policy, (_step, key) => call(url, /** @type {any} */ (key).apiKey), { idempotencyKey: KEY, store, keys: ring, namespace: ns });
    const first = await one();
    const second = await one();
    assert.deepEqual(seen.map((s) => s.status), [401, 401, 401]);
    assert.deepEqual([...seen.map((s) => s.key)].sort(), [...gone].sort(), "each key once");
    for (const run of [first, second]) {
      assert.equal(run.terminal, "stop_no_usable_key");
      const verdict = rl.verifyBundle(run.bundle);
      assert.equal(verdict.kind, "verified");
      for (const secret of gone) assert.ok(!JSON.stringify(run.bundle).includes(secret), "a secret in a bundle");
    }
    const attempts = /** @type {any} */ (first.bundle).attempts;
    assert.deepEqual(
      attempts.attempts.map((/** @type {any} */ a) => a.admission.key.key_sha256),
      seen.map((s) => rl.keySha256(s.key)),
    );
    assert.deepEqual(attempts.attempts.map((/** @type {any} */ a) => a.key_refused), Array(3).fill("unauthorized"));
    assert.deepEqual(attempts.attempts.map((/** @type {any} */ a) => a.route_ordinal), [1, 1, 1], "a refused key spends no route attempt");
    assert.equal(attempts.fleet_stop.reason, "no_usable_key");
    assert.equal(attempts.fleet_stop.key_pool, "provider-keys");
    assert.deepEqual(/** @type {any} */ (second.bundle).attempts.attempts, []);
    const { document } = await store.get(`${ns}/key_pool/provider-keys`);
    const stored = /** @type {any} */ (document);
    assert.ok(stored !== null, "the pool is in the store");
    assert.deepEqual(stored.keys.map((/** @type {any} */ k) => k.reason), Array(3).fill("unauthorized"));
  } finally {
    server.close();
  }
});

test("a plain fleet run of a pooled policy is refused before anything is sent", async () => {
  const ring = new rl.KeyRing(SECRETS);
  const pool = rl.poolConfig("provider-keys", ring, { coolMs: 1_000, parkMs: 60_000 });
  const policy = policyWith((p) => {
    p.fleet = /** @type {any} */ ({ key_pools: [pool], on_store_unavailable: "fail_closed" });
    for (const r of p.routes) /** @type {any} */ (r).key_pool = "provider-keys";
  });
  let sent = 0;
  await assert.rejects(
    rl.runWithPolicy(policy, () => ++sent, { idempotencyKey: KEY, fleet: new rl.Fleet(new rl.MemoryStore()) }),
    (/** @type {any} */ e) => e.code === "machine_layer_missing",
  );
  assert.equal(sent, 0);
  assert.ok(!JSON.stringify(ring).includes("sk-"));
  assert.throws(() => ring.secret("0".repeat(64)), (/** @type {any} */ e) => e.code === "key_not_in_pool");
});
