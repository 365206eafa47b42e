// The openai stream integration with the real `openai` client against the
// loopback SSE server (chat completions and the Responses API with
// resumption). In every run the consumer's events are the sealed bundle's
// event log one to one, the bundle verifies, and every request carried the
// Idempotency-Key.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { createHash } from "node:crypto";

import OpenAI from "openai";

import * as rl from "../dist/index.js";
import { openaiChatStream, openaiResponsesStream, openaiStreamReader, runStreamWithOpenAI } from "../dist/openai.js";
import { KEY, policyWith } from "./helpers.mjs";
import { DEFAULT_TEXT, sseServer } from "./sse-loopback.mjs";

/** @param {import("../dist/index.js").StreamMode} mode */
const streamPolicy = (mode) =>
  policyWith((p) => {
    p.stream = { mode, max_response_bytes: 65536, idle_timeout_ms: 2000 };
  });

/** @param {string} url */
const client = (url) => new OpenAI({ apiKey: "test-key", baseURL: url, maxRetries: 0 });

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

const chat = openaiChatStream({ model: "gpt-fake", messages: [{ role: "user", content: "hi" }], stream_options: { include_usage: true } });
const responses = openaiResponsesStream({ model: "gpt-fake", input: "hi" });

test("chat: a stream cut before its first event is retried invisibly", async () => {
  const cutting = await cuttingServer();
  const server = await sseServer({ "external-fallback": [{}] });
  try {
    const run = /** @type {any} */ (
      runStreamWithOpenAI(
        streamPolicy("tentative"),
        { "private-primary": client(cutting.url("p")), "external-fallback": client(server.url("external-fallback")) },
        chat,
        { idempotencyKey: KEY },
      )
    );
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.deepEqual(cutting.keys, [KEY, KEY], "the primary's two attempts");
    assert.ok(events.every((e) => e.attempt === 3));
    assert.equal(events.at(-1).kind, "commit");
    assert.equal(textOf(events, 3), DEFAULT_TEXT);
    assert.deepEqual(
      run.bundle.attempts.attempts.map((/** @type {any} */ a) => a.outcome),
      [
        { class: "retryable", kind: "unavailable" },
        { class: "retryable", kind: "unavailable" },
        { class: "success" },
      ],
    );
    assert.equal(run.receipt.stream.invalidated_events, 0);
    assert.deepEqual(
      server.requests.map((r) => [r.method, r.route, r.idempotencyKey]),
      [["POST", "external-fallback", KEY]],
    );
    checkLog(run.sealed, events);
  } finally {
    await cutting.close();
    await server.close();
  }
});

test("chat: a stream cut after its role chunk but before any text is retried invisibly", async () => {
  // cutAfter 0: the server sends the opening chunk (role, no content), then cuts.
  const server = await sseServer({ "private-primary": [{ cutAfter: 0 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("tentative"), clients(server), chat, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.ok(events.every((e) => e.attempt === 2), "nothing of attempt 1 reached the consumer");
    assert.ok(!events.some((e) => e.kind === "invalidate"));
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    assert.equal(events.at(-1).kind, "commit");
    assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "retryable", kind: "unavailable" });
    assert.equal(run.bundle.attempts.attempts[0].stream.events, 0);
    assert.equal(run.receipt.stream.invalidated_events, 0);
    assert.equal(server.count("private-primary"), 2);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("chat, tentative: a cut after output is invalidated before any event of the next attempt", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("tentative"), clients(server), chat, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    const firstOf2 = events.findIndex((e) => e.attempt === 2);
    const invalidate = events.findIndex((e) => e.kind === "invalidate");
    assert.ok(invalidate > 0 && invalidate === firstOf2 - 1, "the invalidate comes right before attempt 2");
    assert.equal(events[invalidate].attempt, 1);
    assert.ok(events.slice(0, invalidate).every((e) => e.kind === "delta" && e.status === "tentative" && e.attempt === 1));
    assert.equal(textOf(events, 1), DEFAULT_TEXT.split(" ").slice(0, 2).join(" "));
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    assert.deepEqual(
      events.slice(invalidate + 1).map((e) => e.kind),
      [...Array(events.length - invalidate - 2).fill("delta"), "commit"],
    );
    assert.deepEqual(
      server.requests.map((r) => [r.method, r.route, r.idempotencyKey]),
      [
        ["POST", "private-primary", KEY],
        ["POST", "private-primary", KEY],
      ],
    );
    // include_usage: the attempt that completed reported its usage.
    assert.equal(run.bundle.attempts.attempts[1].stream.usage_event, true);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("chat, restart: a cut after output invalidates and the run stops indeterminate", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  try {
    const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("restart"), clients(server), chat, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.ok(error instanceof rl.RunStoppedError, String(error));
    assert.equal(run.terminal, "stop_indeterminate");
    assert.equal(events.at(-1).kind, "invalidate");
    assert.ok(events.every((e) => e.attempt === 1));
    assert.equal(server.count(), 1);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("responses, continuation: a cut stream is resumed by retrieve(starting_after): no duplicate, no gap", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  try {
    /** @type {any[]} */
    const steps = [];
    const call = /** @type {typeof responses} */ ((c, o, step) => {
      steps.push(step);
      return responses(c, o, step);
    });
    const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("continuation"), clients(server), call, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.ok(!events.some((e) => e.kind === "invalidate"));
    const deltas = events.filter((e) => e.kind === "delta");
    const seqs = deltas.map((e) => e.data.sequence_number);
    assert.deepEqual(seqs, seqs.map((_, i) => i), "provider sequence numbers 0, 1, 2, … once each");
    const last1 = Math.max(...deltas.filter((e) => e.attempt === 1).map((e) => e.data.sequence_number));
    assert.deepEqual(steps[1].continuation, { continues_ordinal: 1, response_id: "resp_private-primary_0", starting_after: last1 });
    assert.equal(textOf(events, 1) + textOf(events, 2), DEFAULT_TEXT);
    assert.equal(events.at(-1).kind, "commit");
    assert.equal(events.at(-1).attempt, 2);
    assert.equal(deltas.at(-1).data.type, "response.completed");
    assert.deepEqual(
      server.requests.map((r) => [r.method, r.path, r.query.starting_after, r.idempotencyKey]),
      [
        ["POST", "/private-primary/responses", undefined, KEY],
        ["GET", "/private-primary/responses/resp_private-primary_0", String(last1), KEY],
      ],
    );
    assert.equal(server.requests[0]?.body.background, true);
    assert.equal(server.requests[1]?.query.stream, "true");
    assert.equal(run.receipt.stream.resumed_attempts, 1);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("responses: a sequence number going back is a protocol violation; a frame that is not JSON a malformed event", async () => {
  for (const [fault, violation] of /** @type {const} */ ([
    [{ sequenceBackAfter: 2 }, "sequence_back"],
    [{ malformedAfter: 2 }, "malformed_event"],
  ])) {
    const server = await sseServer({ "private-primary": [fault, {}] });
    try {
      const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("tentative"), clients(server), responses, { idempotencyKey: KEY }));
      const { events, error } = await collect(run);
      assert.ok(error instanceof rl.RunStoppedError, String(error));
      assert.equal(run.bundle.attempts.attempts[0].stream.violation, violation);
      assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "non_retryable", kind: "protocol_violation" });
      assert.equal(events.at(-1).kind, "invalidate");
      assert.equal(server.count(), 1);
      checkLog(run.sealed, events);
    } finally {
      await server.close();
    }
  }
});

test("responses: an error event inside the stream is raised with its code and judged a cut", async () => {
  const server = await sseServer({ "private-primary": [{ errorAfter: 1, errorCode: "server_error" }, {}] });
  try {
    /** @type {unknown[]} */
    const errors = [];
    const run = /** @type {any} */ (
      runStreamWithOpenAI(streamPolicy("tentative"), clients(server), responses, {
        idempotencyKey: KEY,
        classify: (e) => {
          errors.push(e);
          return undefined;
        },
      })
    );
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.equal(errors.length, 1);
    const e = /** @type {any} */ (errors[0]);
    assert.equal(e.name, "OpenAIStreamError");
    assert.equal(e.code, "server_error");
    assert.deepEqual(rl.factsOf(e).error_codes, ["server_error"]);
    assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "retryable", kind: "unavailable" });
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("openaiStreamReader reads chat chunks and Responses events", () => {
  const r = openaiStreamReader;
  const chunk = { id: "chatcmpl-1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "Hi" }, finish_reason: null }] };
  assert.equal(r.text(chunk), "Hi");
  assert.equal(r.responseId?.(chunk), "chatcmpl-1");
  assert.equal(r.terminal?.(chunk), false);
  assert.equal(r.terminal?.({ ...chunk, choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }), true);
  assert.deepEqual(r.usage?.({ ...chunk, choices: [], usage: { prompt_tokens: 12, completion_tokens: 5 } }), { input: 12, output: 5 });
  const delta = { type: "response.output_text.delta", delta: "Hello", sequence_number: 4 };
  assert.equal(r.text(delta), "Hello");
  assert.equal(r.sequence?.(delta), 4);
  assert.equal(r.responseId?.({ type: "response.created", response: { id: "resp_1" }, sequence_number: 0 }), "resp_1");
  assert.equal(r.terminal?.({ type: "response.completed", response: { id: "resp_1" } }), true);
  assert.throws(() => r.text({ type: "error", code: "server_error", message: "boom" }), { name: "OpenAIStreamError", code: "server_error" });
});

test("chat: a stream that stalls past the idle limit is aborted on the real clock, invalidated and retried", async () => {
  const server = await sseServer({ "private-primary": [{ stallAfter: 2, stallS: 2 }, {}] });
  try {
    const policy = policyWith((p) => {
      p.stream = { mode: "tentative", max_response_bytes: 65536, idle_timeout_ms: 300 };
    });
    /** @type {AbortSignal[]} */
    const signals = [];
    const call = /** @type {typeof chat} */ ((c, o, step) => {
      signals.push(o.signal);
      return chat(c, o, step);
    });
    const t0 = performance.now();
    const run = /** @type {any} */ (runStreamWithOpenAI(policy, clients(server), call, { idempotencyKey: KEY }));
    const { events, error } = await collect(run);
    assert.equal(error, undefined, String(error));
    assert.ok(performance.now() - t0 < 1500, "the stall was not waited out");
    assert.equal(signals[0]?.aborted, true);
    const a = run.bundle.attempts.attempts[0];
    assert.deepEqual(a.outcome, { class: "retryable", kind: "timeout_before_response" });
    assert.ok(a.completed_at_ms - a.started_at_ms >= 300);
    const invalidate = events.findIndex((e) => e.kind === "invalidate");
    assert.equal(events[invalidate + 1].attempt, 2);
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    assert.equal(server.count(), 2);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});

test("chat: a consumer that stops early closes the provider stream and the run is sealed", async () => {
  const server = await sseServer({ "private-primary": [{ stallAfter: 3, stallS: 2 }] });
  try {
    const run = /** @type {any} */ (runStreamWithOpenAI(streamPolicy("tentative"), clients(server), chat, { idempotencyKey: KEY }));
    const events = [];
    for await (const ev of run) {
      events.push(ev);
      if (events.length === 3) break;
    }
    assert.equal(run.terminal, "stop_indeterminate");
    const a = run.bundle.attempts.attempts[0];
    assert.equal(a.stream.events, 3);
    assert.deepEqual(a.outcome, { class: "indeterminate", kind: "stream_interrupted_after_output" });
    assert.equal(server.count(), 1);
    const log = run.bundle.stream_events;
    assert.deepEqual(
      events.map((e) => [e.kind, e.sequence]),
      log.slice(0, 3).map((/** @type {any} */ e) => [e.kind, e.sequence]),
    );
    assert.equal(log.at(-1).kind, "invalidate");
    assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
  } finally {
    await server.close();
  }
});

test("now: the run clock is the caller's (ms since admission), never re-zeroed, and its sleeps are the caller's", async () => {
  const server = await sseServer({ "private-primary": [{ cutAfter: 2 }, {}] });
  let t = 1500;
  /** @type {number[]} */
  const slept = [];
  /** @type {string[]} */
  const seen = [];
  try {
    const run = /** @type {any} */ (
      runStreamWithOpenAI(streamPolicy("tentative"), clients(server), chat, {
        idempotencyKey: KEY,
        now: () => t,
        // The run's waits move the caller's clock; the stream's watchdog (it passes a signal) waits for its end.
        sleep: async (/** @type {number} */ ms, /** @type {AbortSignal | undefined} */ signal) => {
          if (signal !== undefined) {
            await new Promise((resolve) => (signal.aborted ? resolve(undefined) : signal.addEventListener("abort", resolve, { once: true })));
            return;
          }
          slept.push(ms);
          t += ms;
        },
        onDecision: (d) => seen.push(d.kind),
        onSleep: (s) => seen.push(`sleep:${s.ordinal}`),
        onAttempt: (_a, j) => seen.push(`attempt:${j.stream}`),
        onTerminal: (r) => seen.push(`terminal:${r.terminal}`),
      })
    );
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    const [first, second] = run.bundle.attempts.attempts;
    assert.equal(first.started_at_ms, 1500);
    assert.equal(first.completed_at_ms, 1500);
    const backoff = slept.reduce((a, b) => a + b, 0);
    assert.ok(backoff > 0);
    assert.equal(second.started_at_ms, 1500 + backoff);
    assert.deepEqual(seen, ["dispatch", "attempt:invalidate", "dispatch", "sleep:2", "attempt:commit", "terminal", "terminal:completed"]);
    assert.equal(textOf(events, 2), DEFAULT_TEXT);
    checkLog(run.sealed, events);
  } finally {
    await server.close();
  }
});
