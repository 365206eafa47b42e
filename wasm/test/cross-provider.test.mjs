// One logical request across providers (retryledger/providers): one policy
// whose routes are openai, anthropic and google, each dispatched through its
// own real SDK client against a loopback server speaking that wire. Each
// server compares the body it received with the body the core's lowering
// promised for its route (computed here, apart from the driver) and answers
// 400 when they differ.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";

import * as rl from "../dist/index.js";
import { planAcrossProviders, runAcrossProviders } from "../dist/providers.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const KEY = "ticket-4411";

/** The three-wire spec of the lowering vectors (read in place), with this test's route ids. */
function vectorSpec() {
  const all = JSON.parse(fs.readFileSync(path.join(here, "../../tests/vectors/lowering.json"), "utf8"));
  const c = all.cases.find((/** @type {any} */ x) => x.name === "routes_thinking_history_refused");
  return { request: JSON.parse(c.input.request), spec: JSON.parse(c.input.spec) };
}

const IDS = ["openai-primary", "anthropic-fallback", "gemini-last"];

/** @param {{maxAttempts?: number[], drop?: boolean, only?: number[]}} [o] */
function spec(o = {}) {
  const { spec } = vectorSpec();
  delete spec.idempotency_key_sha256;
  // A hint longer than the cap leaves the route: a quota that cannot clear within the run.
  spec.backoff = { base_ms: 20, max_ms: 100, retry_after_cap_ms: 2000, retry_after_over_cap: "skip_route" };
  spec.routes.forEach((/** @type {any} */ r, /** @type {number} */ i) => {
    r.route_id = IDS[i];
    r.max_attempts = o.maxAttempts?.[i] ?? 1;
  });
  spec.max_total_cost = 100000;
  if (o.only !== undefined) spec.routes = o.only.map((i) => spec.routes[i]);
  if (o.drop) spec.provider_bound_parts = "drop";
  return spec;
}

/** A plain conversation: system, two turns, an output bound and a temperature. @type {import("../dist/index.js").ConversationRequest} */
const REQUEST = {
  schema: "retryledger.request.v1",
  operation: "chat",
  system: "You answer incident questions briefly.",
  messages: [
    { role: "user", content: [{ type: "text", text: "What failed in the 02:00 deploy?" }] },
    { role: "assistant", content: [{ type: "text", text: "A migration timed out." }] },
    { role: "user", content: [{ type: "text", text: "And the fix?" }] },
  ],
  max_output_tokens: 512,
  sampling: { temperature: 0.2 },
};

/** The history of the vectors: an Anthropic thinking block with its signature. */
const THINKING = vectorSpec().request;

/**
 * @typedef {{status: number, headers?: Record<string, string>, body: unknown}} Reply
 * @typedef {{route: string, path: string, body: any, matched: boolean, key: string | undefined}} Seen
 */

/**
 * One loopback server; the first path segment names the route. Each route
 * answers its replies in order (the last repeats), after comparing the body
 * with `expected[route]`: a different body gets a 400 in the route's wire.
 * @param {Record<string, Reply[]>} script @param {Record<string, unknown>} expected
 */
async function providers(script, expected) {
  /** @type {Seen[]} */
  const seen = [];
  /** @type {Map<string, number>} */
  const counts = new Map();
  const server = http.createServer((req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      const url = req.url ?? "/";
      const route = url.split("/")[1] ?? "";
      const body = JSON.parse(text);
      let matched = true;
      try {
        assert.deepEqual(body, expected[route]);
      } catch {
        matched = false;
      }
      const k = req.headers["idempotency-key"];
      seen.push({ route, path: url, body, matched, key: Array.isArray(k) ? k.join(",") : k });
      const n = counts.get(route) ?? 0;
      counts.set(route, n + 1);
      const replies = script[route] ?? [];
      const reply = matched ? replies[Math.min(n, replies.length - 1)] : { status: 400, body: { error: { type: "invalid_request_error", message: "body differs from the lowering" } } };
      res.writeHead(reply?.status ?? 404, { "content-type": "application/json", ...(reply?.headers ?? {}) });
      res.end(JSON.stringify(reply?.body ?? {}));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  const base = `http://127.0.0.1:${address.port}`;
  return {
    seen,
    base,
    close: () => new Promise((resolve) => {
      server.close(() => resolve(undefined));
      server.closeAllConnections();
    }),
  };
}

/** One real SDK client per route, each pointed at its route on the server. @param {string} base */
const clientsAt = (base) => ({
  "openai-primary": new OpenAI({ apiKey: "k", baseURL: `${base}/openai-primary`, maxRetries: 0 }),
  "anthropic-fallback": new Anthropic({ apiKey: "k", baseURL: `${base}/anthropic-fallback`, maxRetries: 0 }),
  "gemini-last": new GoogleGenAI({ apiKey: "k", httpOptions: { baseUrl: `${base}/gemini-last`, apiVersion: "v1beta" } }),
});

/** What the core's lowering promises each route of `s` (the routes the core keeps). @param {any} request @param {any} s */
function promised(request, s) {
  const keep = new Set(rl.buildPolicy(request, { ...s, idempotency_key_sha256: rl.sha256Hex(KEY) }).policy.routes.map((r) => r.route_id));
  /** @type {Record<string, any>} */
  const out = {};
  for (const r of s.routes) {
    if (!keep.has(r.route_id)) continue;
    out[r.route_id] = rl.lowerRequest(request, r.release, s.provider_bound_parts === undefined ? {} : { provider_bound_parts: s.provider_bound_parts });
  }
  return out;
}

const OVERLOADED = { status: 529, body: { error: { type: "overloaded_error", message: "Overloaded" } } };
const QUOTA = {
  status: 429,
  headers: { "retry-after": "3600" },
  body: { type: "error", error: { type: "rate_limit_error", message: "This request would exceed your organization's rate limit" } },
};
/** @param {Record<string, unknown>} [extra] */
const geminiOk = (extra = { modelVersion: "gemini-2.5-pro-002" }) => ({
  status: 200,
  body: {
    candidates: [{ content: { role: "model", parts: [{ text: "Roll back deploy 981." }] }, finishReason: "STOP", index: 0 }],
    usageMetadata: { promptTokenCount: 40, candidatesTokenCount: 6, totalTokenCount: 46 },
    ...extra,
  },
});
const anthropicOk = {
  status: 200,
  body: {
    id: "msg_1",
    type: "message",
    role: "assistant",
    model: "claude-sonnet-4-5-20250929",
    content: [{ type: "text", text: "Roll back deploy 981." }],
    stop_reason: "end_turn",
    stop_sequence: null,
    usage: { input_tokens: 40, output_tokens: 6 },
  },
};

test("openai 529 twice, anthropic 429 with a quota that cannot clear, google answers: one run, each route through its own SDK", async () => {
  const s = spec({ maxAttempts: [2, 2, 1] });
  const want = promised(REQUEST, s);
  assert.deepEqual(Object.keys(want), IDS);
  const server = await providers(
    { "openai-primary": [OVERLOADED], "anthropic-fallback": [QUOTA], "gemini-last": [geminiOk()] },
    Object.fromEntries(Object.entries(want).map(([id, l]) => [id, l.body])),
  );
  try {
    const run = await runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: clientsAt(server.base) });
    // Every server saw exactly the body the lowering promised its route.
    assert.deepEqual(server.seen.map((x) => [x.route, x.matched]), [
      ["openai-primary", true],
      ["openai-primary", true],
      ["anthropic-fallback", true],
      ["gemini-last", true],
    ]);
    assert.equal(server.seen[0]?.path, "/openai-primary/chat/completions");
    assert.equal(server.seen[2]?.path, "/anthropic-fallback/v1/messages");
    assert.equal(server.seen[3]?.path, "/gemini-last/v1beta/models/gemini-2.5-pro:generateContent");
    assert.ok(server.seen.every((x) => x.key === KEY));

    const { receipt, bundle } = run;
    assert.equal(receipt.terminal, "completed");
    assert.equal(receipt.final_route_id, "gemini-last");
    // Physical requests counted equal the receipt's attempts.
    assert.equal(receipt.attempt_count, server.seen.length);
    assert.deepEqual(
      receipt.schedule.map((e) => [e.route_id, e.outcome]),
      [
        ["openai-primary", "unavailable"],
        ["openai-primary", "unavailable"],
        ["anthropic-fallback", "rate_limited"],
        ["gemini-last", "success"],
      ],
    );
    // Requested and served model per attempt; a failure's served model is unknown, not invented.
    assert.deepEqual(
      receipt.schedule.map((e) => e.model),
      [{ requested: "gpt-4.1" }, { requested: "gpt-4.1" }, { requested: "claude-sonnet-4-5-20250929" }, { requested: "gemini-2.5-pro", served: "gemini-2.5-pro-002" }],
    );
    // Each attempt's body digest is the lowering's for its route.
    assert.deepEqual(
      bundle.attempts.attempts.map((a) => a.request_body_sha256),
      ["openai-primary", "openai-primary", "anthropic-fallback", "gemini-last"].map((id) => want[id].body_sha256),
    );
    assert.deepEqual(run.result.servedModel, "gemini-2.5-pro-002");
    assert.equal(run.result.routeId, "gemini-last");
    assert.equal(/** @type {any} */ (run.result.response).text, "Roll back deploy 981.");
    assert.equal(rl.verifyBundle(bundle).kind, "verified");
  } finally {
    await server.close();
  }
});

test("an answer that names no model records the served model as unknown", async () => {
  const s = spec({ only: [2] });
  const want = promised(REQUEST, s);
  const server = await providers({ "gemini-last": [geminiOk({})] }, { "gemini-last": want["gemini-last"].body });
  try {
    const run = await runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: clientsAt(server.base) });
    assert.deepEqual(run.receipt.schedule.map((e) => e.model), [{ requested: "gemini-2.5-pro" }]);
    assert.equal(run.result.servedModel, undefined);
    assert.equal(run.bundle.attempts.attempts[0]?.usage, undefined);
  } finally {
    await server.close();
  }
});

test("a route without a client is route_client_missing before any dispatch", async () => {
  const s = spec();
  const server = await providers({ "openai-primary": [OVERLOADED] }, {});
  try {
    const { "gemini-last": _, ...two } = clientsAt(server.base);
    await assert.rejects(
      runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: /** @type {any} */ (two) }),
      (e) => e instanceof rl.PolicyError && e.code === "route_client_missing" && e.path === "/routes/2/route_id" && /gemini-last/.test(e.message),
    );
    // A client of another wire cannot send the route's request.
    const wrong = { ...clientsAt(server.base), "anthropic-fallback": new OpenAI({ apiKey: "k", baseURL: server.base, maxRetries: 0 }) };
    await assert.rejects(
      runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: /** @type {any} */ (wrong) }),
      (e) => e instanceof rl.DecodeError && e.code === "invalid_type" && e.path === "/clients/anthropic-fallback",
    );
    // A route whose release has no lowering settings cannot be sent the lowered request.
    const bare = spec();
    delete bare.routes[1].release.lowering;
    assert.throws(
      () => planAcrossProviders(REQUEST, bare, { idempotencyKey: KEY }),
      (e) => e instanceof rl.DecodeError && e.code === "missing_field" && e.path === "/routes/1/release/lowering",
    );
    // A repair would be another request than the one lowered: refused.
    await assert.rejects(
      runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: clientsAt(server.base), .../** @type {any} */ ({ repair: () => REQUEST }) }),
      (e) => e instanceof rl.DecodeError && e.code === "invalid_value" && e.path === "/repair",
    );
    // A client that retries on its own is refused as in every integration.
    const retrying = { ...clientsAt(server.base), "openai-primary": new OpenAI({ apiKey: "k", baseURL: server.base, maxRetries: 2 }) };
    await assert.rejects(
      runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: /** @type {any} */ (retrying) }),
      (e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness",
    );
    assert.equal(server.seen.length, 0);
  } finally {
    await server.close();
  }
});

test("an Anthropic thinking block and a Gemini-only route: refused before dispatch, or dropped as the spec says; never a 400", async () => {
  const gemini = spec({ only: [2] });
  const server = await providers({ "gemini-last": [geminiOk()], "anthropic-fallback": [anthropicOk] }, {});
  try {
    // Refused (the default): the route is excluded with provider_bound_history, none is left.
    const report = rl.routeCapabilities(THINKING, { ...gemini, idempotency_key_sha256: rl.sha256Hex(KEY) });
    assert.deepEqual(report.routes, [{ route_id: "gemini-last", capable: false, code: "provider_bound_history", path: "/messages/1/content/0" }]);
    await assert.rejects(
      runAcrossProviders(THINKING, gemini, { idempotencyKey: KEY, clients: clientsAt(server.base) }),
      (e) => e instanceof rl.PolicyError && e.code === "no_capable_route",
    );
    assert.equal(server.seen.length, 0);

    // With anthropic and google routes, google is left out and anthropic carries the block.
    const both = spec({ only: [1, 2] });
    const plan = planAcrossProviders(THINKING, both, { idempotencyKey: KEY });
    assert.deepEqual(plan.policy.policy.routes.map((r) => r.route_id), ["anthropic-fallback"]);
    const kept = JSON.stringify(plan.lowered["anthropic-fallback"]?.body);
    assert.match(kept, /EqQBCkYIBxgCKkDx/);
  } finally {
    await server.close();
  }

  // Dropped, as the spec allows: Gemini receives the history without the block and answers.
  const drop = spec({ only: [2], drop: true });
  const want = promised(THINKING, drop);
  assert.deepEqual(want["gemini-last"].notes, [{ path: "/messages/1/content/0", what: "dropped_provider_bound" }]);
  const dropping = await providers({ "gemini-last": [geminiOk()] }, { "gemini-last": want["gemini-last"].body });
  try {
    const run = await runAcrossProviders(THINKING, drop, { idempotencyKey: KEY, clients: clientsAt(dropping.base) });
    assert.equal(run.receipt.terminal, "completed");
    assert.deepEqual(dropping.seen.map((x) => [x.route, x.matched]), [["gemini-last", true]]);
    assert.doesNotMatch(JSON.stringify(dropping.seen[0]?.body), /signature|EqQBCkYIBxgCKkDx/);
  } finally {
    await dropping.close();
  }
});

test("a stream cut after its first events on openai completes on anthropic: one invalidate, then anthropic's events", async () => {
  const { sseServer } = await import("./sse-loopback.mjs");
  const { runStreamAcrossProviders } = await import("../dist/providers.js");
  const s = spec({ only: [0, 1], maxAttempts: [1, 1] });
  s.stream = { mode: "tentative", max_response_bytes: 65536, idle_timeout_ms: 2000 };
  const want = promised(REQUEST, s);
  const server = await sseServer({
    "openai-primary": [{ text: "The migration timed out because", chunks: 5, cutAfter: 2, model: "gpt-4.1-2025-04-14" }],
    "anthropic-fallback": [{ text: "Roll back deploy 981 and rerun it.", chunks: 4, model: "claude-sonnet-4-5-20250929" }],
  });
  try {
    const clients = {
      "openai-primary": new OpenAI({ apiKey: "k", baseURL: server.url("openai-primary"), maxRetries: 0 }),
      "anthropic-fallback": new Anthropic({ apiKey: "k", baseURL: server.url("anthropic-fallback"), maxRetries: 0 }),
    };
    const run = runStreamAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients });
    /** @type {any[]} */
    const events = [];
    for await (const e of run) events.push(e);
    const kinds = events.map((e) => `${e.kind}@${e.attempt}`);
    // The cut openai stream's tentative events, one invalidate, then anthropic's events and the commit.
    const cut = kinds.indexOf("invalidate@1");
    assert.ok(cut > 0, kinds.join(" "));
    assert.ok(kinds.slice(0, cut).every((k) => k === "delta@1"), kinds.join(" "));
    assert.equal(kinds.filter((k) => k.startsWith("invalidate")).length, 1);
    assert.ok(kinds.slice(cut + 1, -1).every((k) => k === "delta@2"), kinds.join(" "));
    assert.equal(kinds.at(-1), "commit@2");
    // Before the cut: openai chunks carrying the first two text pieces; after it: anthropic's events, read with anthropic's reader.
    const before = events.slice(0, cut);
    assert.ok(before.every((e) => e.data?.object === "chat.completion.chunk"));
    assert.equal(before.map((e) => e.text).join(""), "The migration");
    const after = events.slice(cut + 1, -1);
    assert.ok(after.length > 0 && after.every((e) => typeof e.data?.type === "string"));
    assert.equal(after.map((e) => e.text).join(""), "Roll back deploy 981 and rerun it.");

    const receipt = /** @type {any} */ (run.receipt);
    assert.equal(receipt.terminal, "completed");
    assert.equal(receipt.final_route_id, "anthropic-fallback");
    // Each server saw the lowered body of its route, with the stream flags of its wire.
    const [first, second] = server.requests;
    assert.deepEqual(first?.body, { ...want["openai-primary"].body, stream: true, stream_options: { include_usage: true } });
    assert.deepEqual(second?.body, { ...want["anthropic-fallback"].body, stream: true });
    assert.equal(server.requests.length, receipt.attempt_count);
    // The cut attempt never reported usage: none is recorded (unknown, not zero); it keeps its reservation.
    const attempts = /** @type {any} */ (run.bundle).attempts.attempts;
    assert.equal(attempts[0].usage, undefined);
    const reserve = /** @type {any} */ (run.bundle).policy.routes.find((/** @type {any} */ r) => r.route_id === "openai-primary").reserve_cost;
    assert.equal(attempts[0].cost, reserve);
    // Models: asked and served, per attempt, from the streams' own events.
    assert.deepEqual(receipt.schedule.map((/** @type {any} */ e) => e.model), [
      { requested: "gpt-4.1", served: "gpt-4.1-2025-04-14" },
      { requested: "claude-sonnet-4-5-20250929", served: "claude-sonnet-4-5-20250929" },
    ]);
    assert.equal(rl.verifyBundle(/** @type {any} */ (run.sealed).bundle_json).kind, "verified");
  } finally {
    await server.close();
  }
});

test("spans carry gen_ai.request.model and gen_ai.response.model per attempt and on the run", async () => {
  const { spansOf } = await import("../dist/otel.js");
  const s = spec({ maxAttempts: [1, 1, 1] });
  const want = promised(REQUEST, s);
  const server = await providers(
    { "openai-primary": [OVERLOADED], "anthropic-fallback": [QUOTA], "gemini-last": [geminiOk()] },
    Object.fromEntries(Object.entries(want).map(([id, l]) => [id, l.body])),
  );
  try {
    const run = await runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients: clientsAt(server.base) });
    const spans = spansOf(run.bundle, run.sealed.receipt_sha256, { operation: "chat" });
    assert.deepEqual(
      spans.attempts.map((a) => [a.name, a.attributes["gen_ai.request.model"], a.attributes["gen_ai.response.model"]]),
      [
        ["chat gpt-4.1", "gpt-4.1", undefined],
        ["chat claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20250929", undefined],
        ["chat gemini-2.5-pro", "gemini-2.5-pro", "gemini-2.5-pro-002"],
      ],
    );
    assert.equal(spans.run.attributes["gen_ai.request.model"], "gemini-2.5-pro");
    assert.equal(spans.run.attributes["gen_ai.response.model"], "gemini-2.5-pro-002");
  } finally {
    await server.close();
  }
});

test("the single-provider integrations refuse a route without a client with the same code", async () => {
  const { runWithAnthropic } = await import("../dist/anthropic.js");
  const { runWithGoogleGenAI } = await import("../dist/google-genai.js");
  const plan = planAcrossProviders(REQUEST, spec({ only: [1, 2] }), { idempotencyKey: KEY });
  const server = await providers({}, {});
  try {
    const clients = clientsAt(server.base);
    await assert.rejects(
      runWithAnthropic(plan.policy, { "anthropic-fallback": clients["anthropic-fallback"] }, async () => "never", { idempotencyKey: KEY }),
      (e) => e instanceof rl.PolicyError && e.code === "route_client_missing" && e.path === "/routes/1/route_id" && /no anthropic client for route\(s\) gemini-last/.test(e.message),
    );
    await assert.rejects(
      runWithGoogleGenAI(plan.policy, { "gemini-last": clients["gemini-last"] }, async () => "never", { idempotencyKey: KEY }),
      (e) => e instanceof rl.PolicyError && e.code === "route_client_missing" && e.path === "/routes/0/route_id" && /anthropic-fallback/.test(e.message),
    );
    assert.equal(server.seen.length, 0);
  } finally {
    await server.close();
  }
});

/**
 * Gemini's stream on 127.0.0.1: `POST /{route}/v1beta/models/{model}:streamGenerateContent?alt=sse`
 * answers `pieces` as server-sent events (the last with finishReason, usage and modelVersion);
 * it records each request's path and body.
 * @param {string[]} pieces
 */
async function geminiStreamServer(pieces) {
  /** @type {{path: string, body: any}[]} */
  const requests = [];
  const server = http.createServer((req, res) => {
    let text = "";
    req.on("data", (c) => (text += c));
    req.on("end", () => {
      requests.push({ path: req.url ?? "", body: JSON.parse(text) });
      res.writeHead(200, { "content-type": "text/event-stream" });
      pieces.forEach((piece, i) => {
        const last = i === pieces.length - 1;
        const chunk = {
          candidates: [{ content: { role: "model", parts: [{ text: piece }] }, index: 0, ...(last ? { finishReason: "STOP" } : {}) }],
          responseId: "gem-1",
          modelVersion: "gemini-2.5-pro-002",
          ...(last ? { usageMetadata: { promptTokenCount: 40, candidatesTokenCount: 9, totalTokenCount: 49 } } : {}),
        };
        res.write(`data: ${JSON.stringify(chunk)}\r\n\r\n`);
      });
      res.end();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  return {
    requests,
    base: `http://127.0.0.1:${address.port}`,
    close: () => new Promise((resolve) => {
      server.close(() => resolve(undefined));
      server.closeAllConnections();
    }),
  };
}

test("a stream cut after its first events on anthropic completes on google: one invalidate, then Gemini's chunks", async () => {
  const { sseServer } = await import("./sse-loopback.mjs");
  const { runStreamAcrossProviders } = await import("../dist/providers.js");
  const s = spec({ only: [1, 2] });
  s.stream = { mode: "tentative", max_response_bytes: 65536, idle_timeout_ms: 2000 };
  const want = promised(REQUEST, s);
  const anthropic = await sseServer({ "anthropic-fallback": [{ text: "The migration timed out because", chunks: 5, cutAfter: 2, model: "claude-sonnet-4-5-20250929" }] });
  const gemini = await geminiStreamServer(["Roll back ", "deploy 981 ", "and rerun it."]);
  try {
    const clients = {
      "anthropic-fallback": new Anthropic({ apiKey: "k", baseURL: anthropic.url("anthropic-fallback"), maxRetries: 0 }),
      "gemini-last": new GoogleGenAI({ apiKey: "k", httpOptions: { baseUrl: `${gemini.base}/gemini-last`, apiVersion: "v1beta" } }),
    };
    const run = runStreamAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients });
    /** @type {any[]} */
    const events = [];
    for await (const e of run) events.push(e);
    const kinds = events.map((e) => `${e.kind}@${e.attempt}`);
    const cut = kinds.indexOf("invalidate@1");
    assert.ok(cut > 0 && kinds.slice(0, cut).every((k) => k === "delta@1"), kinds.join(" "));
    assert.equal(kinds.filter((k) => k.startsWith("invalidate")).length, 1);
    assert.deepEqual(kinds.slice(cut + 1), ["delta@2", "delta@2", "delta@2", "commit@2"]);
    assert.equal(events.slice(0, cut).map((e) => e.text).join(""), "The migration");
    assert.equal(events.slice(cut + 1, -1).map((e) => e.text).join(""), "Roll back deploy 981 and rerun it.");

    const receipt = /** @type {any} */ (run.receipt);
    assert.equal(receipt.terminal, "completed");
    assert.equal(receipt.final_route_id, "gemini-last");
    assert.deepEqual(anthropic.requests.map((r) => r.body), [{ ...want["anthropic-fallback"].body, stream: true }]);
    assert.deepEqual(gemini.requests.map((r) => r.path), ["/gemini-last/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"]);
    assert.deepEqual(gemini.requests.map((r) => r.body), [want["gemini-last"].body]);
    assert.equal(anthropic.requests.length + gemini.requests.length, receipt.attempt_count);
    assert.deepEqual(receipt.schedule.map((/** @type {any} */ e) => e.model), [
      { requested: "claude-sonnet-4-5-20250929", served: "claude-sonnet-4-5-20250929" },
      { requested: "gemini-2.5-pro", served: "gemini-2.5-pro-002" },
    ]);
    const bundle = /** @type {any} */ (run.bundle);
    assert.deepEqual(bundle.attempts.attempts.map((/** @type {any} */ a) => a.request_body_sha256), [want["anthropic-fallback"].body_sha256, want["gemini-last"].body_sha256]);
    assert.equal(rl.verifyBundle(/** @type {any} */ (run.sealed).bundle_json).kind, "verified");
  } finally {
    await anthropic.close();
    await gemini.close();
  }
});

test("under a price schedule each answer's usage is charged; an answer without usage keeps its reservation (unknown, not zero)", async () => {
  const s = spec({ only: [0, 2], maxAttempts: [1, 1] });
  const want = promised(REQUEST, s);
  const plan = planAcrossProviders(REQUEST, s, { idempotencyKey: KEY });
  /** @type {import("../dist/index.js").PriceSchedule} */
  const priceSchedule = {
    schema: "retryledger.price_schedule.v1",
    cost_unit: plan.policy.policy.cost_unit,
    releases: plan.policy.policy.routes.map((r) => ({
      route_release_sha256: r.route_release_sha256,
      prices_per_million: { input: 2_000_000, output: 8_000_000, cached_input: 500_000, reasoning: 8_000_000 },
    })),
  };
  const openaiNoUsage = {
    status: 200,
    body: {
      id: "chatcmpl-1",
      object: "chat.completion",
      created: 1,
      model: "gpt-4.1-2025-04-14",
      choices: [{ index: 0, message: { role: "assistant", content: "Roll back." }, finish_reason: "stop" }],
    },
  };
  // The openai answer names its model but carries no usage.
  const server = await providers(
    { "openai-primary": [openaiNoUsage], "gemini-last": [geminiOk()] },
    Object.fromEntries(Object.entries(want).map(([id, l]) => [id, l.body])),
  );
  try {
    const clients = clientsAt(server.base);
    const first = await runAcrossProviders(REQUEST, s, { idempotencyKey: KEY, clients, priceSchedule });
    const a = /** @type {any} */ (first.bundle.attempts.attempts[0]);
    assert.equal(a.route_id, "openai-primary");
    assert.equal(a.usage, undefined);
    assert.equal(a.cost, plan.policy.policy.routes[0]?.reserve_cost);
    assert.deepEqual(a.model, { requested: "gpt-4.1", served: "gpt-4.1-2025-04-14" });

    // Gemini's answer reports usage: 40 input, 6 output tokens, priced by the schedule.
    const gemini = spec({ only: [2] });
    const plan2 = planAcrossProviders(REQUEST, gemini, { idempotencyKey: KEY });
    /** @type {import("../dist/index.js").PriceSchedule} */
    const schedule2 = { ...priceSchedule, releases: priceSchedule.releases.filter((r) => r.route_release_sha256 === plan2.policy.policy.routes[0]?.route_release_sha256) };
    const second = await runAcrossProviders(REQUEST, gemini, { idempotencyKey: KEY, clients, priceSchedule: schedule2 });
    const g = /** @type {any} */ (second.bundle.attempts.attempts[0]);
    assert.deepEqual(g.usage, { input: 40, output: 6 });
    assert.equal(g.cost, rl.priceCost(schedule2, g.route_release_sha256, g.usage));
    assert.equal(g.cost, Math.ceil((40 * 2_000_000) / 1_000_000) + Math.ceil((6 * 8_000_000) / 1_000_000));
  } finally {
    await server.close();
  }
});
