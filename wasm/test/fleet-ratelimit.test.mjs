// Rate-limit headers observed on any response update the admission buckets
// (docs/FLEET.md): against real loopback providers answering with OpenAI-
// and Anthropic-style rate-limit headers, a response that says `remaining` 0
// with a reset empties the route's bucket until the reset, so the next run
// through the same fleet store (memory, Redis) does not dispatch to that
// route before the server said capacity returns; token reservations come
// from the request's bound and are settled with the usage the response
// reports.
import { test } from "node:test";
import assert from "node:assert/strict";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";
import { runWithAnthropic } from "../dist/anthropic.js";
import { RedisStore } from "../dist/stores/redis.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace, redisGate } from "./fleet-helpers.mjs";
import { scriptedServer } from "./loopback.mjs";

const { Fleet, MemoryStore, RunStoppedError, admissionObserve, requestTokenBound, verifyBundle } = rl;
const EPOCH = 1_780_000_000_000;
const redis = redisGate();

const COMPLETION = {
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 0,
  model: "fake-model",
  choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 40, completion_tokens: 60, total_tokens: 100 },
};
const MESSAGE = {
  id: "msg_1",
  type: "message",
  role: "assistant",
  model: "fake-model",
  content: [{ type: "text", text: "ok" }],
  stop_reason: "end_turn",
  stop_sequence: null,
  usage: { input_tokens: 30, output_tokens: 20 },
};
const RATE_LIMITED = { type: "error", error: { type: "rate_limit_error", message: "slow down" } };

/** @param {any} admission */
function limited(admission) {
  return fleetPolicy({ admission }, (/** @type {any} */ p) => {
    delete p.fleet.breaker;
    p.backoff = { ...p.backoff, base_ms: 10, max_ms: 50, retry_after_cap_ms: 60_000 };
  });
}

/** @param {string} backend */
function storeFor(backend) {
  return backend === "redis" ? new RedisStore({ url: /** @type {string} */ (redis.url) }) : new MemoryStore();
}

/** @param {any} store @param {string} ns @param {ReturnType<typeof fakeTime>} time */
function fleetOn(store, ns, time) {
  return new Fleet(store, { namespace: ns, now: () => EPOCH + time.state.now });
}

/** @param {ReturnType<typeof fakeTime>} time */
function clocks(time) {
  return { clock: time.clock, sleep: time.sleep, wallClock: () => EPOCH + time.state.now };
}

/** @param {string} base */
function openaiClients(base) {
  return {
    "private-primary": new OpenAI({ apiKey: "t", baseURL: `${base}/primary/v1`, maxRetries: 0 }),
    "external-fallback": new OpenAI({ apiKey: "t", baseURL: `${base}/fallback/v1`, maxRetries: 0 }),
  };
}

/** @param {string} base */
function anthropicClients(base) {
  return {
    "private-primary": new Anthropic({ apiKey: "t", baseURL: `${base}/primary`, maxRetries: 0 }),
    "external-fallback": new Anthropic({ apiKey: "t", baseURL: `${base}/fallback`, maxRetries: 0 }),
  };
}

/** @param {number} ms */
const rfc3339 = (ms) => new Date(ms).toISOString();

/** @param {any} fleet @param {any} policy */
async function stored(fleet, policy) {
  const release = policy.routes[0]?.route_release_sha256 ?? "";
  return /** @type {any} */ ((await fleet.store.get(fleet.admissionKey(release))).document);
}

for (const backend of ["memory", "redis"]) {
  const skip = backend === "redis" ? redis.skip : false;

  test(`${backend}: an OpenAI answer with remaining 0 holds the next run on that route until the reset`, { skip }, async () => {
    const server = await scriptedServer({
      primary: [{ status: 200, headers: { "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2.5s" }, body: COMPLETION }, { status: 200, body: COMPLETION }],
    });
    const policy = limited({ max_queue_ms: 60_000, request_burst: 5, requests_per_second: 5 });
    const time = fakeTime();
    const store = storeFor(backend);
    const ns = namespace("ratelimit");
    const fleet = fleetOn(store, ns, time);
    /** @type {number[]} */
    const sent = [];
    /** @type {(client: OpenAI, options: any) => Promise<string>} */
    const ask = async (client, options) => {
      sent.push(EPOCH + time.state.now);
      const r = await client.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "x" }] }, options);
      return r.choices[0]?.message.content ?? "";
    };
    try {
      const first = await runWithOpenAI(policy, openaiClients(server.base), ask, { idempotencyKey: KEY, fleet, ...clocks(time) });
      assert.equal(first.result, "ok");
      const releasedAt = EPOCH + time.state.now;
      const snapshot = await stored(fleet, policy);
      assert.equal(snapshot.request_level_milli, 0);
      assert.equal(snapshot.requests_at_epoch_ms, releasedAt + 2_500);
      assert.equal(snapshot.in_flight, 0);
      // A second run through the same store, by a fleet with nothing cached.
      const again = fleetOn(store, ns, time);
      const second = await runWithOpenAI(policy, openaiClients(server.base), ask, { idempotencyKey: KEY, fleet: again, ...clocks(time) });
      assert.equal(second.result, "ok");
      assert.equal(server.seen.filter((s) => s.route === "primary").length, 2);
      // Not dispatched before the reset: empty then, one request refilled 200 ms later.
      assert.ok((sent[1] ?? 0) >= releasedAt + 2_500);
      const limits = second.bundle.attempts.attempts[0]?.admission?.limits;
      assert.equal(limits?.start_epoch_ms, releasedAt + 2_700);
      assert.equal(limits?.queue_wait_ms, 2_700);
      assert.equal(verifyBundle(second.sealed.bundle_json).kind, "verified");
    } finally {
      await server.close();
      await fleet.close();
    }
  });

  test(`${backend}: an Anthropic 429 with an RFC 3339 reset holds the retry until the reset`, { skip }, async () => {
    const reset = EPOCH + 3_000;
    const server = await scriptedServer({
      primary: [
        {
          status: 429,
          headers: {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": rfc3339(reset),
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": rfc3339(reset - 1_000),
          },
          body: RATE_LIMITED,
        },
        { status: 200, body: MESSAGE },
      ],
      fallback: [{ status: 200, body: MESSAGE }],
    });
    const policy = limited({ max_in_flight: 4, max_queue_ms: 60_000, request_burst: 2, requests_per_second: 10 });
    const time = fakeTime();
    const fleet = fleetOn(storeFor(backend), namespace("ratelimit"), time);
    /** @type {number[]} */
    const sent = [];
    /** @type {(client: Anthropic, options: any) => Promise<string>} */
    const ask = async (client, options) => {
      sent.push(EPOCH + time.state.now);
      const m = await client.messages.create({ model: "fake-model", max_tokens: 64, messages: [{ role: "user", content: "x" }] }, options);
      const block = m.content[0];
      return block?.type === "text" ? block.text : "";
    };
    try {
      const run = await runWithAnthropic(policy, anthropicClients(server.base), ask, { idempotencyKey: KEY, fleet, ...clocks(time) });
      assert.equal(run.result, "ok");
      assert.deepEqual(
        server.seen.map((s) => s.route),
        ["primary", "primary"],
      );
      assert.equal(sent[0], EPOCH);
      assert.ok((sent[1] ?? 0) >= reset);
      assert.equal(run.bundle.attempts.attempts[1]?.admission?.limits?.start_epoch_ms, reset + 100);
      assert.equal((await stored(fleet, policy)).in_flight, 0);
      assert.equal(verifyBundle(run.sealed.bundle_json).kind, "verified");
    } finally {
      await server.close();
      await fleet.close();
    }
  });
}

test("a reset beyond the queue bound stops the next run before dispatch", async () => {
  const server = await scriptedServer({
    primary: [{ status: 200, headers: { "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s" }, body: COMPLETION }],
  });
  const policy = limited({ max_queue_ms: 5_000, request_burst: 5, requests_per_second: 5 });
  const time = fakeTime();
  const fleet = fleetOn(new MemoryStore(), namespace("ratelimit"), time);
  /** @type {(client: OpenAI, options: any) => Promise<unknown>} */
  const ask = (client, options) => client.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "x" }] }, options);
  try {
    await runWithOpenAI(policy, openaiClients(server.base), ask, { idempotencyKey: KEY, fleet, ...clocks(time) });
    await assert.rejects(runWithOpenAI(policy, openaiClients(server.base), ask, { idempotencyKey: KEY, fleet, ...clocks(time) }), (e) => {
      assert.ok(e instanceof RunStoppedError);
      assert.equal(e.sealed.terminal, "stop_admission");
      return true;
    });
    assert.equal(server.seen.length, 1);
  } finally {
    await server.close();
  }
});

test("tokens are reserved from the request's bound and settled with the usage the response reports", async () => {
  const server = await scriptedServer({
    primary: [{ status: 200, headers: { "x-ratelimit-remaining-tokens": "9950" }, body: COMPLETION }],
  });
  const policy = limited({ max_queue_ms: 5_000, token_bound: 10_000, tokens_per_second: 1 });
  const time = fakeTime();
  const fleet = fleetOn(new MemoryStore(), namespace("ratelimit"), time);
  const params = { model: "fake-model", max_completion_tokens: 500, messages: [{ role: "user", content: "x" }] };
  const reserve = requestTokenBound(params, 100);
  assert.equal(reserve, 600);
  assert.equal(requestTokenBound(params), 500 + Math.ceil(JSON.stringify(params).length / 4));
  assert.throws(() => requestTokenBound({ messages: [] }), /no output bound/);
  /** @type {(client: OpenAI, options: any) => Promise<unknown>} */
  const ask = (client, options) => client.chat.completions.create(/** @type {any} */ (params), options);
  try {
    const run = await runWithOpenAI(policy, openaiClients(server.base), ask, { idempotencyKey: KEY, fleet, reserveTokens: reserve, ...clocks(time) });
    assert.equal(run.bundle.attempts.attempts[0]?.admission?.limits?.tokens, 600);
    // 600 reserved, 100 used (the usage's total): 9,900 left; the server's
    // 9,950 remaining is above it and never raises it.
    assert.equal((await stored(fleet, policy)).token_level_milli, 9_900_000);
  } finally {
    await server.close();
  }
});

test("the Anthropic usage settles a reservation; a lower token remaining lowers the bucket", async () => {
  const server = await scriptedServer({
    primary: [{ status: 200, body: MESSAGE }, { status: 200, headers: { "anthropic-ratelimit-output-tokens-remaining": "4000" }, body: MESSAGE }],
  });
  const policy = limited({ max_queue_ms: 5_000, token_bound: 10_000, tokens_per_second: 1 });
  const time = fakeTime();
  const fleet = fleetOn(new MemoryStore(), namespace("ratelimit"), time);
  const params = { model: "fake-model", max_tokens: 64, messages: [{ role: "user", content: "x" }] };
  /** @type {(client: Anthropic, options: any) => Promise<unknown>} */
  const ask = (client, options) => client.messages.create(/** @type {any} */ (params), options);
  try {
    const reserveTokens = requestTokenBound(params, 36);
    await runWithAnthropic(policy, anthropicClients(server.base), ask, { idempotencyKey: KEY, fleet, reserveTokens, ...clocks(time) });
    // 100 reserved, 50 used (30 in, 20 out).
    assert.equal((await stored(fleet, policy)).token_level_milli, 9_950_000);
    await runWithAnthropic(policy, anthropicClients(server.base), ask, { idempotencyKey: KEY, fleet, reserveTokens, ...clocks(time) });
    assert.equal((await stored(fleet, policy)).token_level_milli, 4_000_000);
  } finally {
    await server.close();
  }
});

test("the core applies headers and keeps the snapshot (and its digest) when none applies", () => {
  const policy = limited({ max_queue_ms: 5_000, request_burst: 2, requests_per_second: 10 });
  const config = /** @type {any} */ (policy).fleet.admission;
  /** @type {import("../dist/index.js").AdmissionSnapshot} */
  const snapshot = {
    generation: 0, in_flight: 0, request_level_milli: 2000, requests_at_epoch_ms: EPOCH,
    route_release_sha256: policy.routes[0]?.route_release_sha256 ?? "", schema: "retryledger.admission.v1",
    token_level_milli: 0, tokens_at_epoch_ms: EPOCH, updated_at_epoch_ms: EPOCH,
  };
  assert.deepEqual(admissionObserve(config, snapshot, [["content-type", "text/plain"]], EPOCH), { snapshot });
  assert.equal(admissionObserve(config, snapshot, [["RateLimit", '"default";r=0;t=30']], EPOCH).snapshot.requests_at_epoch_ms, EPOCH + 30_000);
  const far = admissionObserve(config, snapshot, [["x-ratelimit-remaining-requests", "0"], ["x-ratelimit-reset-requests", "999h"]], EPOCH);
  assert.deepEqual(far.notes, ["reset_too_far"]);
});

test("a stream's usage settles its reservation", async () => {
  const { openaiChatStream, runStreamWithOpenAI } = await import("../dist/openai.js");
  const { DEFAULT_TEXT, sseServer, splitText } = await import("./sse-loopback.mjs");
  const policy = limited({ max_queue_ms: 5_000, token_bound: 10_000, tokens_per_second: 1 });
  /** @type {any} */ (policy).stream = { mode: "tentative", max_response_bytes: 65536, idle_timeout_ms: 2000 };
  const fleet = new Fleet(new MemoryStore(), { namespace: namespace("ratelimit"), now: () => EPOCH });
  const params = { model: "gpt-fake", max_completion_tokens: 100, messages: [{ role: "user", content: "x" }], stream_options: { include_usage: true } };
  const server = await sseServer({ "private-primary": [{}] });
  try {
    const clients = {
      "private-primary": new OpenAI({ apiKey: "t", baseURL: server.url("private-primary"), maxRetries: 0 }),
      "external-fallback": new OpenAI({ apiKey: "t", baseURL: server.url("external-fallback"), maxRetries: 0 }),
    };
    const run = runStreamWithOpenAI(policy, clients, openaiChatStream(params), { idempotencyKey: KEY, fleet, reserveTokens: requestTokenBound(params, 20), wallClock: () => EPOCH });
    /** @type {any[]} */
    const events = [];
    for await (const ev of run) events.push(ev);
    assert.equal(events.at(-1)?.kind, "commit");
    const sealed = /** @type {any} */ (run).sealed;
    assert.equal(sealed.bundle.attempts.attempts[0]?.admission?.limits?.tokens, 120);
    // 120 reserved; the loopback's usage: 12 prompt tokens and one completion
    // token per piece of its text, all settled.
    assert.equal((await stored(fleet, policy)).token_level_milli, (10_000 - 12 - splitText(DEFAULT_TEXT, 5).length) * 1000);
  } finally {
    await server.close();
  }
});

test("@google/genai: the response's usageMetadata settles a reservation from config.maxOutputTokens", async () => {
  const { GoogleGenAI } = await import("@google/genai");
  const { runWithGoogleGenAI } = await import("../dist/google-genai.js");
  const generated = {
    candidates: [{ content: { role: "model", parts: [{ text: "ok" }] }, finishReason: "STOP", index: 0 }],
    usageMetadata: { promptTokenCount: 30, candidatesTokenCount: 12, totalTokenCount: 42 },
  };
  const server = await scriptedServer({ primary: [{ status: 200, body: generated }] });
  const clients = {
    "private-primary": new GoogleGenAI({ apiKey: "t", httpOptions: { baseUrl: `${server.base}/primary`, apiVersion: "v1beta" } }),
    "external-fallback": new GoogleGenAI({ apiKey: "t", httpOptions: { baseUrl: `${server.base}/fallback`, apiVersion: "v1beta" } }),
  };
  const policy = limited({ max_queue_ms: 5_000, token_bound: 10_000, tokens_per_second: 1 });
  const time = fakeTime();
  const fleet = fleetOn(new MemoryStore(), namespace("ratelimit"), time);
  const request = { model: "gemini-2.0-flash", contents: "x", config: { maxOutputTokens: 200 } };
  const reserveTokens = requestTokenBound(request, 50);
  assert.equal(reserveTokens, 250);
  /** @type {(client: any, options: any, step: any, signal: AbortSignal) => Promise<unknown>} */
  const call = (client, options, _step, signal) => client.models.generateContent({ ...request, config: { ...request.config, httpOptions: options, abortSignal: signal } });
  try {
    await runWithGoogleGenAI(policy, clients, call, { idempotencyKey: KEY, fleet, reserveTokens, ...clocks(time) });
    // 250 reserved, 42 used (totalTokenCount).
    assert.equal((await stored(fleet, policy)).token_level_milli, (10_000 - 42) * 1000);
  } finally {
    await server.close();
  }
});

test("fetch: the IETF RateLimit field of an answer holds the route until its reset", async () => {
  const { runWithFetch } = await import("../dist/fetch.js");
  const server = await scriptedServer({
    primary: [{ status: 200, headers: { RateLimit: '"default";r=0;t=2', "RateLimit-Policy": '"default";q=10;w=60' }, body: { ok: true } }],
  });
  const policy = limited({ max_in_flight: 2, max_queue_ms: 5_000 });
  const time = fakeTime();
  const fleet = fleetOn(new MemoryStore(), namespace("ratelimit"), time);
  const targets = { "private-primary": `${server.base}/primary/v1`, "external-fallback": `${server.base}/fallback/v1` };
  try {
    await runWithFetch(policy, targets, { idempotencyKey: KEY, fleet, ...clocks(time) });
    const snapshot = await stored(fleet, policy);
    // No request bucket configured: the reset still holds the route for 2 s.
    assert.equal(snapshot.requests_at_epoch_ms, EPOCH + time.state.now + 2_000);
    assert.equal(snapshot.in_flight, 0);
  } finally {
    await server.close();
  }
});
