// A client timeout retried under the same key while the first request still
// runs, end to end over loopback HTTP (127.0.0.1): the project's receiver
// guard (guardIdempotency behind a node:http bridge, and the Express
// middleware) in front of a handler that holds the first request longer than
// the client's timeout. The driver times out, is answered 409 with
// Retry-After (idempotency_in_progress), judges it in_progress, waits the
// hint and asks again on the same route (past the route's own bound of two
// attempts, never on the fallback) with the same key and body, and completes
// with the replayed answer (Idempotent-Replayed: true). The handler ran once.
// The crash test's shape (a 3 s hold, a 1 s client timeout) at a smaller scale.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import express from "express";

import * as rl from "../dist/index.js";
import { MemoryStore } from "../dist/index.js";
import { runWithFetch } from "../dist/fetch.js";
import { IdempotencyGuard, guardIdempotency } from "../dist/receiver-node.js";
import { idempotencyExpress, idempotencyExpressErrors } from "../dist/receiver-express.js";
import { KEY, policyWith } from "./helpers.mjs";

const HOLD_MS = 1200; // the first request's work
const CLIENT_TIMEOUT_MS = 400; // the client gives up long before
/** @type {import("../dist/index.js").Retention} */
const RETENTION = { expired: "reject", poll_after_ms: 1000, ttl_ms: 60000 };
const ORDER = JSON.stringify({ sku: "A-1", qty: 2 });

/** The guarded work: holds each run, then answers 201 with the order and its run number. */
class HeldEndpoint {
  constructor() {
    this.runs = 0;
  }
  /** @param {string} body @returns {Promise<{status: number, headers: Array<[string, string]>, body: string}>} */
  async run(body) {
    this.runs += 1;
    const n = this.runs;
    await new Promise((resolve) => setTimeout(resolve, HOLD_MS));
    return { status: 201, headers: [["content-type", "application/json"]], body: JSON.stringify({ order: JSON.parse(body), run: n }) };
  }
}

/** @param {http.Server} server */
async function listen(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const port = /** @type {import("node:net").AddressInfo} */ (server.address()).port;
  return {
    port,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}

/** @param {IdempotencyGuard} guard @param {HeldEndpoint} endpoint */
async function fetchServer(guard, endpoint) {
  const handler = guardIdempotency(async (request) => {
    const out = await endpoint.run(await request.text());
    return new Response(out.body, { status: out.status, headers: out.headers });
  }, { guard });
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers.set(k, v);
    const response = await handler(new Request(`http://127.0.0.1${req.url}`, { method: req.method ?? "POST", headers, body: Buffer.concat(chunks) }));
    res.statusCode = response.status;
    response.headers.forEach((v, k) => res.setHeader(k, v));
    res.end(Buffer.from(await response.arrayBuffer()));
  });
  return listen(server);
}

/** @param {IdempotencyGuard} guard @param {HeldEndpoint} endpoint */
async function expressServer(guard, endpoint) {
  const app = express();
  app.set("env", "test");
  app.post(/.*/, idempotencyExpress({ guard }), async (req, res) => {
    const out = await endpoint.run(Buffer.isBuffer(req.body) ? req.body.toString() : "");
    res.status(out.status);
    for (const [k, v] of out.headers) res.setHeader(k, v);
    res.send(Buffer.from(out.body));
  });
  app.use(idempotencyExpressErrors());
  return listen(http.createServer(app));
}

/**
 * One POST that gives up after CLIENT_TIMEOUT_MS (a DOMException named
 * TimeoutError, as AbortSignal.timeout throws), or when the run's signal fires.
 * @param {string} url @param {import("../dist/fetch.js").FetchRequestOptions} o
 */
async function post(url, o) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new DOMException("the client's timeout", "TimeoutError")), CLIENT_TIMEOUT_MS);
  const onAbort = () => ac.abort(o.signal.reason);
  o.signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await fetch(url, { method: "POST", body: ORDER, headers: { ...o.headers, "content-type": "application/json" }, signal: ac.signal });
  } finally {
    clearTimeout(timer);
    o.signal.removeEventListener("abort", onAbort);
  }
}

for (const [front, serve] of Object.entries({ fetch: fetchServer, express: expressServer })) {
  test(`${front}: a timeout, then 409 in progress, then the replay completes on the same route; the handler ran once`, async () => {
    const endpoint = new HeldEndpoint();
    const server = await serve(new IdempotencyGuard({ store: new MemoryStore(), retention: RETENTION }), endpoint);
    let fallbackHits = 0;
    const policy = policyWith((p) => {
      p.backoff = { base_ms: 50, max_ms: 200, retry_after_cap_ms: 2000 };
      p.max_total_attempts = 6;
      p.deadline_ms = 10000;
      const primary = /** @type {import("../dist/index.js").Route} */ (p.routes[0]);
      primary.max_attempts = 2;
    });
    const started = performance.now();
    try {
      const run = await runWithFetch(
        policy,
        {
          "private-primary": (o) => post(`http://127.0.0.1:${server.port}/orders`, o),
          "external-fallback": async () => {
            fallbackHits += 1;
            return new Response("{}", { status: 201 });
          },
        },
        { idempotencyKey: KEY },
      );
      const elapsed = performance.now() - started;
      assert.equal(run.result.status, 201);
      assert.equal(run.result.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await run.result.json(), { order: { sku: "A-1", qty: 2 }, run: 1 });
      assert.equal(endpoint.runs, 1, "the handler ran once");
      assert.equal(fallbackHits, 0, "never asked another route");
      const attempts = run.bundle.attempts.attempts;
      const outcomes = attempts.map((a) => a.outcome);
      assert.deepEqual(outcomes[0], { class: "retryable", kind: "timeout_before_response" });
      assert.deepEqual(outcomes[1], { class: "retryable", kind: "in_progress", retry_after_ms: 1000 });
      assert.deepEqual(outcomes.at(-1), { class: "success" });
      for (const o of outcomes.slice(1, -1)) assert.deepEqual([o.class, "kind" in o ? o.kind : undefined], ["retryable", "in_progress"]);
      assert.deepEqual(new Set(attempts.map((a) => a.route_id)), new Set(["private-primary"]));
      assert.deepEqual(attempts.map((a) => a.route_ordinal), attempts.map((_, i) => i + 1));
      assert.ok((attempts.at(-1)?.route_ordinal ?? 0) > 2, "asked past the route's bound");
      assert.equal(run.receipt.terminal, "completed");
      assert.equal(run.receipt.fallback_used, false);
      assert.equal(rl.verifyBundle(run.bundle).kind, "verified");
      assert.ok(elapsed < 8000, `took ${elapsed} ms`);
    } finally {
      await server.close();
    }
  });
}
