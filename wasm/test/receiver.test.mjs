// The receiver guard over loopback HTTP (127.0.0.1): a fetch-style handler
// (guardIdempotency, behind a node:http bridge), Express middleware and a
// Fastify plugin, with records in the memory, SQLite and PostgreSQL stores.
// Replays (marked, the handler ran once), conflicts (409 with Retry-After
// while in progress), rejects (422 for another body under the key), 400
// without a key, 503 when the store is down (the handler never runs).
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { createHash } from "node:crypto";

import express from "express";
import Fastify from "fastify";

import { MemoryStore, StoreUnavailableError, idempotencyKeySha256 } from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { IdempotencyGuard, NoEffectError, guardIdempotency, httpRequestSha256, httpResponseSha256 } from "../dist/receiver-node.js";
import { idempotencyExpress, idempotencyExpressErrors } from "../dist/receiver-express.js";
import { idempotencyFastify } from "../dist/receiver-fastify.js";
import { namespace, postgresGate, tempDbPath } from "./fleet-helpers.mjs";

const postgres = postgresGate();
/** @type {import("../dist/index.js").Retention} */
const RETENTION = { expired: "reject", poll_after_ms: 2500, ttl_ms: 60000 };

/** @typedef {import("../dist/index.js").FleetStore} FleetStore */
/** @typedef {{status: number, headers: Array<[string, string]>, body: string}} Out */

/** A store that can be switched off or swapped, as a backend that cannot be reached. */
class Switch {
  /** @param {FleetStore} inner */
  constructor(inner) {
    this.inner = inner;
    this.down = false;
  }
  /** @param {string} key */
  async get(key) {
    if (this.down) throw new StoreUnavailableError("switched off");
    return this.inner.get(key);
  }
  /** @param {string} key @param {number} expected @param {import("../dist/index.js").StoreDocument} document */
  async compareAndSet(key, expected, document) {
    if (this.down) throw new StoreUnavailableError("switched off");
    return this.inner.compareAndSet(key, expected, document);
  }
}

/** The guarded work: counts its runs; `/slow` waits for the gate; `/boom` throws; `/big` answers `size` bytes. */
class Endpoint {
  constructor() {
    /** @type {string[]} */
    this.runs = [];
    /** @type {() => void} */
    this.open = () => {};
    this.gate = new Promise((resolve) => (this.open = () => resolve(undefined)));
    /** @type {() => void} */
    this.enter = () => {};
    this.entered = new Promise((resolve) => (this.enter = () => resolve(undefined)));
  }
  /** @param {string} path @param {string} query @param {string} body @returns {Promise<Out>} */
  async run(path, query, body) {
    this.runs.push(path);
    const n = this.runs.length;
    if (path === "/slow") {
      this.enter();
      await this.gate;
    }
    if (path === "/boom") throw query === "no_effect=1" ? new NoEffectError("refused before any change") : new Error("failed after the charge");
    if (path === "/down") return { status: 503, headers: [["content-type", "text/plain"]], body: "busy" };
    if (path === "/big") return { status: 200, headers: [["content-type", "application/octet-stream"]], body: "x".repeat(Number(query.split("=")[1])) };
    const payload = JSON.stringify({ order: JSON.parse(body || "null"), run: n });
    return { status: 201, headers: [["content-type", "application/json"], ["location", `/orders/${n}`], ["x-dropped", "1"]], body: payload };
  }
  /** @param {string} path */
  count(path) {
    return this.runs.filter((p) => p === path).length;
  }
}

/** @param {string} url */
function split(url) {
  const u = new URL(url, "http://x");
  return { path: u.pathname, query: u.search.slice(1) };
}

/** @param {IdempotencyGuard} guard @param {Endpoint} endpoint @returns {Promise<{port: number, close: () => Promise<void>}>} */
async function fetchServer(guard, endpoint) {
  const handler = guardIdempotency(async (request) => {
    const { path, query } = split(request.url);
    const out = await endpoint.run(path, query, await request.text());
    return new Response(out.body, { status: out.status, headers: out.headers });
  }, { guard });
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers.set(k, v);
    /** @type {RequestInit} */
    const init = { method: req.method ?? "GET", headers };
    if (req.method !== "GET") init.body = Buffer.concat(chunks);
    try {
      const response = await handler(new Request(`http://127.0.0.1${req.url}`, init));
      res.statusCode = response.status;
      response.headers.forEach((v, k) => res.setHeader(k, v));
      res.end(Buffer.from(await response.arrayBuffer()));
    } catch {
      res.statusCode = 500;
      res.end("handler failed");
    }
  });
  return listen(server);
}

/** @param {http.Server} server */
async function listen(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const port = /** @type {import("node:net").AddressInfo} */ (server.address()).port;
  return { port, close: () => new Promise((resolve) => server.close(() => resolve(undefined))).then(() => undefined) };
}

/** @param {IdempotencyGuard} guard @param {Endpoint} endpoint */
async function expressServer(guard, endpoint) {
  const app = express();
  app.set("env", "test"); // the final handler does not print the errors the tests throw
  app.post(/.*/, idempotencyExpress({ guard }), async (req, res) => {
    const { path, query } = split(req.originalUrl);
    const out = await endpoint.run(path, query, Buffer.isBuffer(req.body) ? req.body.toString() : "");
    res.status(out.status);
    for (const [k, v] of out.headers) res.setHeader(k, v);
    res.send(Buffer.from(out.body));
  });
  app.use(idempotencyExpressErrors());
  return listen(http.createServer(app));
}

/** @param {IdempotencyGuard} guard @param {Endpoint} endpoint */
async function fastifyServer(guard, endpoint) {
  const app = Fastify();
  await app.register(idempotencyFastify, { guard });
  app.addContentTypeParser("*", { parseAs: "string" }, (_req, body, done) => done(null, body));
  app.post("/*", async (request, reply) => {
    const { path, query } = split(request.url);
    const out = await endpoint.run(path, query, typeof request.body === "string" ? request.body : JSON.stringify(request.body ?? null));
    reply.code(out.status);
    for (const [k, v] of out.headers) reply.header(k, v);
    return reply.send(Buffer.from(out.body));
  });
  await app.listen({ port: 0, host: "127.0.0.1" });
  const port = /** @type {import("node:net").AddressInfo} */ (app.server.address()).port;
  return { port, close: () => app.close() };
}

const FRONTS = { fetch: fetchServer, express: expressServer, fastify: fastifyServer };

/** @param {string} backend */
function openStore(backend) {
  if (backend === "memory") return new MemoryStore();
  if (backend === "sqlite") return new SQLiteStore(tempDbPath());
  return new PostgresStore({ connectionString: /** @type {string} */ (postgres.url) });
}

/**
 * @param {keyof typeof FRONTS} front @param {string} backend
 * @param {Partial<import("../dist/receiver.js").GuardOptions>} [options]
 */
async function rig(front, backend, options = {}) {
  const store = new Switch(openStore(backend));
  const guard = new IdempotencyGuard({ store, retention: RETENTION, prefix: `${namespace("receiver")}/idempotency/`, ...options });
  const endpoint = new Endpoint();
  const server = await FRONTS[front](guard, endpoint);
  /** @param {string} path @param {string} body @param {string} [key] */
  const post = async (path, body, key) => {
    /** @type {Record<string, string>} */
    const headers = { "content-type": "application/json" };
    if (key !== undefined) headers["idempotency-key"] = key;
    const r = await fetch(`http://127.0.0.1:${server.port}${path}`, { method: "POST", headers, body });
    return { status: r.status, headers: r.headers, text: await r.text() };
  };
  const close = async () => {
    await server.close();
    await store.inner.close?.();
  };
  return { store, guard, endpoint, post, close, backend };
}

// The request digest python/tests/test_receiver.py pins too.
const REQUEST_SHA256 = "8a7f9d9374aa551dfb55f63c66dcce78d5715443a8235ebbcbef523694282866";
const ORDER = JSON.stringify({ sku: "A-1", qty: 2 });

for (const backend of ["memory", "sqlite", "postgres"]) {
  for (const front of /** @type {Array<keyof typeof FRONTS>} */ (Object.keys(FRONTS))) {
    const skip = backend === "postgres" ? postgres.skip : false;

    test(`${front} on ${backend}: same key and body replays the stored response, the handler ran once`, { skip }, async () => {
      const r = await rig(front, backend);
      try {
        const first = await r.post("/orders", ORDER, "order-1");
        assert.equal(first.status, 201);
        assert.equal(first.headers.get("idempotent-replayed"), null);
        const second = await r.post("/orders", ORDER, "order-1");
        assert.equal(second.status, 201);
        assert.equal(second.headers.get("idempotent-replayed"), "true");
        assert.equal(second.text, first.text);
        assert.deepEqual(JSON.parse(second.text), { order: { sku: "A-1", qty: 2 }, run: 1 });
        assert.equal(second.headers.get("location"), "/orders/1");
        assert.equal(second.headers.get("x-dropped"), null);
        assert.equal(r.endpoint.count("/orders"), 1);
        assert.equal(JSON.parse((await r.post("/orders", ORDER, "order-2")).text).run, 2);
      } finally {
        await r.close();
      }
    });

    test(`${front} on ${backend}: same key in progress is 409 with Retry-After`, { skip }, async () => {
      const r = await rig(front, backend);
      try {
        const first = r.post("/slow", ORDER, "slow-1");
        await r.endpoint.entered;
        const second = await r.post("/slow", ORDER, "slow-1");
        assert.equal(second.status, 409);
        assert.equal(second.headers.get("retry-after"), "3");
        assert.equal(JSON.parse(second.text).code, "idempotency_in_progress");
        r.endpoint.open();
        assert.equal((await first).status, 201);
        const third = await r.post("/slow", ORDER, "slow-1");
        assert.equal(third.headers.get("idempotent-replayed"), "true");
        assert.equal(r.endpoint.count("/slow"), 1);
      } finally {
        r.endpoint.open();
        await r.close();
      }
    });

    test(`${front} on ${backend}: same key another body is 422; no key is 400`, { skip }, async () => {
      const r = await rig(front, backend);
      try {
        assert.equal((await r.post("/orders", ORDER, "order-9")).status, 201);
        const other = await r.post("/orders", JSON.stringify({ sku: "A-1", qty: 3 }), "order-9");
        assert.equal(other.status, 422);
        assert.equal(JSON.parse(other.text).code, "idempotency_key_reuse");
        const missing = await r.post("/orders", ORDER);
        assert.equal(missing.status, 400);
        assert.equal(JSON.parse(missing.text).code, "idempotency_key_missing");
        assert.equal(r.endpoint.count("/orders"), 1);
      } finally {
        await r.close();
      }
    });

    test(`${front} on ${backend}: store down is 503 and the handler does not run`, { skip }, async () => {
      const r = await rig(front, backend);
      try {
        assert.equal((await r.post("/orders", ORDER, "before")).status, 201);
        if (backend === "memory") r.store.down = true;
        else if (backend === "sqlite") await r.store.inner.close?.();
        else {
          await r.store.inner.close?.();
          r.store.inner = new PostgresStore({ connectionString: "postgresql://retryledger@127.0.0.1:1/retryledger", connectTimeoutMs: 1000 });
        }
        for (const key of ["before", "after"]) {
          const reply = await r.post("/orders", ORDER, key);
          assert.equal(reply.status, 503, reply.text);
          assert.equal(JSON.parse(reply.text).code, "store_unavailable");
        }
        assert.equal(r.endpoint.count("/orders"), 1);
      } finally {
        await r.close();
      }
    });

    test(`${front} on ${backend}: a thrown error or a 5xx is indeterminate, NoEffectError runs again`, { skip }, async () => {
      const r = await rig(front, backend);
      try {
        assert.equal((await r.post("/boom", "{}", "boom-1")).status, 500);
        const again = await r.post("/boom", "{}", "boom-1");
        assert.equal(again.status, 409);
        assert.equal(JSON.parse(again.text).code, "idempotency_indeterminate");
        assert.equal(again.headers.get("retry-after"), null);
        assert.equal((await r.post("/down", "{}", "down-1")).status, 503);
        assert.equal(JSON.parse((await r.post("/down", "{}", "down-1")).text).code, "idempotency_indeterminate");
        for (let i = 0; i < 2; i++) assert.equal((await r.post("/boom?no_effect=1", "{}", "boom-2")).status, 500);
        assert.equal(r.endpoint.count("/boom"), 3);
        assert.equal(r.endpoint.count("/down"), 1);
      } finally {
        await r.close();
      }
    });
  }
}

test("a response over the bound is kept by digest only", async () => {
  const r = await rig("fetch", "memory", { maxResponseBytes: 1000 });
  try {
    const small = await r.post("/big?size=1000", "{}", "big-1");
    assert.equal((await r.post("/big?size=1000", "{}", "big-1")).text, small.text);
    assert.equal((await r.post("/big?size=1001", "{}", "big-2")).text.length, 1001);
    const replay = await r.post("/big?size=1001", "{}", "big-2");
    assert.equal(replay.status, 409);
    assert.equal(JSON.parse(replay.text).code, "idempotency_response_not_kept");
    const kept = /** @type {Array<[string, string]>} */ ([["content-type", "application/octet-stream"]]);
    assert.equal(replay.headers.get("idempotency-result-sha256"), httpResponseSha256(200, kept, new TextEncoder().encode("x".repeat(1001))));
    assert.equal(r.endpoint.count("/big"), 2);
  } finally {
    await r.close();
  }
});

test("the digests are the documented ones, the same as the Python package's", () => {
  const sha = (/** @type {string} */ s) => createHash("sha256").update(s).digest("hex");
  const body = '{"sku":"A-1","qty":2}';
  const literal = `{"body_sha256":"${sha(body)}","method":"POST","schema":"retryledger.http_request.v1","target":"/orders?dry=1"}`;
  assert.equal(httpRequestSha256("post", "/orders?dry=1", new TextEncoder().encode(body)), sha(literal));
  // The value python/tests/test_receiver.py pins too.
  assert.equal(httpRequestSha256("POST", "/orders?dry=1", new TextEncoder().encode(body)), REQUEST_SHA256);
  const response = `{"body_sha256":"${sha("{}")}","headers":[["content-type","application/json"]],"schema":"retryledger.http_response.v1","status":201}`;
  assert.equal(httpResponseSha256(201, [["content-type", "application/json"]], new TextEncoder().encode("{}")), sha(response));
});

test("the record is the core's, under the scoped key digest; the raw key is never stored", async () => {
  const store = new MemoryStore();
  const guard = new IdempotencyGuard({ store, retention: RETENTION, tenant: "t-7", operation: "orders.create", nowMs: () => 5000 });
  const handler = guardIdempotency(async () => new Response("ok", { status: 201, headers: { "content-type": "text/plain" } }), { guard });
  const request = new Request("http://127.0.0.1/orders", { method: "POST", headers: { "Idempotency-Key": "raw-key-1" }, body: "{}" });
  assert.equal((await handler(request)).status, 201);
  const keySha = idempotencyKeySha256("raw-key-1", { tenant: "t-7", operation: "orders.create" });
  assert.equal(guard.keySha256("raw-key-1"), keySha);
  const { document, generation } = store.get(guard.recordKey(keySha));
  assert.equal(generation, 2);
  assert.deepEqual(document, {
    created_at_epoch_ms: 5000,
    expires_at_epoch_ms: 65000,
    idempotency_key_sha256: keySha,
    request_sha256: httpRequestSha256("POST", "/orders", new TextEncoder().encode("{}")),
    result_sha256: httpResponseSha256(201, [["content-type", "text/plain"]], new TextEncoder().encode("ok")),
    schema: "retryledger.idempotency_record.v1",
    status: "succeeded",
    updated_at_epoch_ms: 5000,
  });
  assert.ok(!JSON.stringify(store.get(guard.responseKey(keySha)).document).includes("raw-key-1"));
});

for (const expired of /** @type {const} */ (["reject", "proceed"])) {
  test(`an expired record answers as the retention says: ${expired}`, async () => {
    let now = 1_800_000_000_000;
    const r = await rig("fetch", "memory", { retention: { expired, poll_after_ms: 1000, ttl_ms: 10000 }, nowMs: () => now });
    try {
      assert.equal((await r.post("/orders", ORDER, "old")).status, 201);
      now += 10000;
      const reply = await r.post("/orders", ORDER, "old");
      if (expired === "reject") {
        assert.deepEqual([reply.status, JSON.parse(reply.text).code], [422, "idempotency_key_expired"]);
        assert.equal(r.endpoint.count("/orders"), 1);
      } else {
        assert.deepEqual([reply.status, JSON.parse(reply.text).run], [201, 2]);
        assert.equal(reply.headers.get("idempotent-replayed"), null);
      }
    } finally {
      await r.close();
    }
  });
}

test("a key that is not 1 to 255 printable ASCII characters is 400", async () => {
  const r = await rig("fetch", "memory");
  try {
    for (const key of ["x".repeat(256), "clé"]) {
      const reply = await r.post("/orders", ORDER, key);
      assert.deepEqual([reply.status, JSON.parse(reply.text).code], [400, "idempotency_key_invalid"]);
    }
    assert.equal(r.endpoint.count("/orders"), 0);
  } finally {
    await r.close();
  }
});

test("express: the body from express.json's verify (rawBody); a body parsed without it is refused, unrun", async () => {
  const guard = new IdempotencyGuard({ store: new MemoryStore(), retention: RETENTION });
  let runs = 0;
  const app = express();
  app.set("env", "test");
  app.use(
    "/with-raw",
    express.json({
      verify: (req, _res, buf) => {
        /** @type {any} */ (req).rawBody = buf;
      },
    }),
  );
  app.use("/without-raw", express.json());
  app.post(/.*/, idempotencyExpress({ guard }), (req, res) => {
    runs++;
    res.status(201).json({ got: req.body, runs });
  });
  const server = await listen(http.createServer(app));
  try {
    /** @param {string} path @param {string} body */
    const post = async (path, body) => {
      const r = await fetch(`http://127.0.0.1:${server.port}${path}`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": "k" }, body });
      return { status: r.status, replayed: r.headers.get("idempotent-replayed"), body: await r.json() };
    };
    assert.deepEqual(await post("/with-raw", ORDER), { status: 201, replayed: null, body: { got: { sku: "A-1", qty: 2 }, runs: 1 } });
    assert.deepEqual(await post("/with-raw", ORDER), { status: 201, replayed: "true", body: { got: { sku: "A-1", qty: 2 }, runs: 1 } });
    const refused = await post("/without-raw", ORDER);
    assert.deepEqual([refused.status, refused.body.code], [500, "idempotency_body_unavailable"]);
    assert.equal(runs, 1);
  } finally {
    await server.close();
  }
});
