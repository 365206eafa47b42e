// The anthropic stream integration with the real `@anthropic-ai/sdk` client
// against the loopback SSE server (messages with `stream: true`). In every run the consumer's events are the sealed bundle's
// event log one to one, the bundle verifies, and every request carried the
// Idempotency-Key.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { createHash } from "node:crypto";

import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { anthropicMessagesStream, anthropicStreamReader, runStreamWithAnthropic } from "../dist/anthropic.js";
import { KEY, policyWith } from "./helpers.mjs";
import { DEFAULT_TEXT, sseServer } from "./sse-loopback.mjs";

/** @param {import("../dist/index.js").StreamMode} mode */
const streamPolicy = (mode) =>
  policyWith((p) => {
    p.stream = { mode, max_response_bytes: 65536, idle_timeout_ms: 2000 };
  });

/** @param {string} url */
const client = (url) => new Anthropic({ apiKey: "test-key", baseURL: url, maxRetries: 0 });

/** @param {{url: (r: string) => string}} server */
const clients = (server) => ({
  "private-primary": client(server.url("private-primary")),
  "external-fallback": client(server.url("external-fallback")),
});

/** @param {any} run */
async function collect(run) {
  const events = [];
  let error;
  try {
    for await (const ev of run) events.push(ev);
  } catch (e) {
    error = e;
  }
  return { events, error };
}

const sha = (/** @type {string} */ t) => createHash("sha256").update(t, "utf8").digest("hex");

/** @param {any} sealed @param {any[]} events */
function checkLog(sealed, events) {
  const log = sealed.bundle.stream_events;
  assert.deepEqual(
    events.map((e) => [e.kind, e.status, e.attempt, e.sequence]),
    log.map((/** @type {any} */ e) => [e.kind, e.status, e.attempt_ordinal, e.sequence]),
  );
  events.forEach((e, i) => {
    if (e.kind === "delta") assert.equal(sha(e.text), log[i].delta_sha256);
  });
  const verdict = rl.verifyBundle(sealed.bundle_json);
  assert.equal(verdict.kind, "verified", JSON.stringify(verdict));
}

/** Text of the deltas of one attempt. @param {any[]} events @param {number} attempt */
const textOf = (events, attempt) =>
  events
    .filter((e) => e.kind === "delta" && e.attempt === attempt)
    .map((e) => e.text)
    .join("");

/**
 * A provider whose streams open (200, text/event-stream) and are cut before
 * their first event; it records each request's Idempotency-Key.
 */
async function cuttingServer() {
  /** @type {(string | undefined)[]} */
  const keys = [];
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const k = req.headers["idempotency-key"];
      keys.push(Array.isArray(k) ? k.join(",") : k);
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.flushHeaders();
      res.socket?.write("", () => res.socket?.destroy());
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  return {
    keys,
    url: (/** @type {string} */ route) => `http://127.0.0.1:${address.port}/${route}`,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve(undefined));
        server.closeAllConnections();
      }),
  };
}

const messages = anthropicMessagesStream({ model: "claude-fake", max_tokens: 64, messages: [{ role: "user", content: "hi" }] });

test("a stream cut before its first event is retried invisibly", async () => {
  const cutting = await cuttingServer();
  const server = await sseServer({ "external-fallback": [{}] });
  try {
    const run = /** @type {any} */ (
      runStreamWithAnthropic(
        streamPolicy("tentative"),
        { "private-primary": client(cutting.url("p")), "external-fallback": client(server.url("external-fallback")) },
        messages,
        { idempotencyKey: KEY },
      )
    );
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.deepEqual(cutting.keys, [KEY, KEY]);
    assert.ok(events.every((e) => e.attempt === 3));
    assert.equal(events.at(-1).kind, "commit");
    assert.equal(textOf(events, 3), DEFAULT_TEXT);
    assert.equal(run.receipt.stream.invalidated_events, 0);
    assert.deepEqual(
      server.requests.map((r) => [r.method, r.path, r.idempotencyKey]),
      [["POST", "/external-fallback/v1/messages", KEY]],
    );
    const last = run.bundle.attempts.attempts[2].stream;
    assert.equal(last.response_id, "msg_external-fallback_0");
    assert.equal(last.terminal_event, true);
    assert.equal(last.usage_event, true);
    checkLog(run.sealed, events);
  } finally {
    await cutting.close();
    await server.close();
  }
});

test("a stream cut after message_start but before any text is retried invisibly", async () => {
  // cutAfter 0: message_start, content_block_start (and a ping) go out, then the cut.
  const server = await sseServer({ "private-primary": [{ cutAfter: 0 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithAnthropic(streamPolicy("tentative"), clients(server), messages, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.ok(events.every((e) => e.attempt === 2), "nothing of attempt 1 reached the consumer");
    assert.ok(!events.some((e) => e.kind === "invalidate"));
    assert.equal(events.at(-1).kind, "commit");
    assert.equal(run.bundle.attempts.attempts[0].stream.events, 0);
    assert.equal(server.count("private-primary"), 2);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("tentative: a cut after output is invalidated before any event of the next attempt", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithAnthropic(streamPolicy("tentative"), clients(server), messages, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    const firstOf2 = events.findIndex((e) => e.attempt === 2);
    const invalidate = events.findIndex((e) => e.kind === "invalidate");
    assert.ok(invalidate > 0 && invalidate === firstOf2 - 1);
    assert.equal(events[invalidate].attempt, 1);
    assert.equal(textOf(events, 1), DEFAULT_TEXT.split(" ").slice(0, 2).join(" "));
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    assert.equal(events.at(-1).kind, "commit");
    assert.deepEqual(
      server.requests.map((r) => [r.method, r.route, r.idempotencyKey]),
      [
        ["POST", "private-primary", KEY],
        ["POST", "private-primary", KEY],
      ],
    );
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("restart: a cut after output invalidates and the run stops indeterminate", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithAnthropic(streamPolicy("restart"), clients(server), messages, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.ok(error instanceof rl.RunStoppedError, String(error));
    assert.equal(run.terminal, "stop_indeterminate");
    assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "indeterminate", kind: "stream_interrupted_after_output" });
    assert.equal(events.at(-1).kind, "invalidate");
    assert.equal(server.count(), 1);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("buffer: an error event mid-stream (overloaded_error) is retried and nothing of it reaches the consumer", async () => {
  const server = await sseServer({ "private-primary": [{ errorAfter: 2 }, {}] });
  try {
    /** @type {unknown[]} */
    const errors = [];
    const run = /** @type {any} */ (
      runStreamWithAnthropic(streamPolicy("buffer"), clients(server), messages, {
        idempotencyKey: KEY,
        classify: (e) => {
          errors.push(e);
          return undefined;
        },
      })
    );
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    const e = /** @type {any} */ (errors[0]);
    assert.ok(e instanceof Anthropic.APIError, String(e));
    assert.equal(e.error?.error?.type, "overloaded_error");
    assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "retryable", kind: "unavailable" });
    assert.ok(events.every((x) => x.attempt === 2 && x.status === "committed"));
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    assert.equal(server.count(), 2);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("the stream's usage is charged under a price schedule", async () => {
  const server = await sseServer({ "private-primary": [{ inputTokens: 20 }] });
  try {
    const policy = streamPolicy("tentative");
    const schedule = {
      schema: /** @type {const} */ ("retryledger.price_schedule.v1"),
      cost_unit: policy.cost_unit,
      releases: policy.routes.map((r) => ({
        route_release_sha256: r.route_release_sha256,
        prices_per_million: { input: 1_000_000, output: 2_000_000, cached_input: 0, cache_creation_input: 0 },
      })),
    };
    const run = /** @type {any} */ (runStreamWithAnthropic(policy, clients(server), messages, { idempotencyKey: KEY, priceSchedule: schedule }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined, String(error));
    // message_start: 20 input tokens; message_delta: 5 output tokens (cumulative).
    assert.equal(run.bundle.attempts.attempts[0].cost, 20 * 1 + 5 * 2);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("anthropicStreamReader reads message events", () => {
  const r = anthropicStreamReader;
  assert.equal(r.text({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "Hi" } }), "Hi");
  assert.equal(r.text({ type: "content_block_delta", index: 0, delta: { type: "input_json_delta", partial_json: "{" } }), "");
  assert.equal(r.responseId?.({ type: "message_start", message: { id: "msg_1" } }), "msg_1");
  assert.equal(r.terminal?.({ type: "message_stop" }), true);
  assert.equal(r.terminal?.({ type: "message_delta" }), false);
  assert.deepEqual(r.usage?.({ type: "message_delta", usage: { output_tokens: 7 } }), { output: 7 });
});
