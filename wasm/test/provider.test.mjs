// Provider error tables through the real SDKs and fetch against loopback
// servers (test/loopback.mjs): a route that names its provider family is
// judged by the core's tables from the error body the host passes
// (docs/PROVIDERS.md). The host classifies nothing.
import { test } from "node:test";
import assert from "node:assert/strict";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { ApiError, GoogleGenAI } from "@google/genai";

import * as rl from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";
import { runWithAnthropic } from "../dist/anthropic.js";
import { HttpStatusError, runWithFetch } from "../dist/fetch.js";
import { googleGenAIDispatch, runWithGoogleGenAI } from "../dist/google-genai.js";
import { KEY, policyWith } from "./helpers.mjs";
import { scriptedServer } from "./loopback.mjs";

/** @typedef {import("./loopback.mjs").Reply} Reply */

/** The reference policy with every route naming `family`. @param {import("../dist/index.js").ProviderFamily} family */
const policyFor = (family) =>
  policyWith((p) => {
    for (const r of p.routes) r.provider_family = family;
  });

/** @param {unknown} e @returns {rl.RunStoppedError} */
function stopped(e) {
  assert.ok(e instanceof rl.RunStoppedError, String(e));
  return e;
}

/** A fake clock whose sleep advances it. */
function fakeClock() {
  const clock = { now: 0, sleeps: /** @type {number[]} */ ([]) };
  return {
    clock,
    options: {
      clock: () => clock.now,
      sleep: async (/** @type {number} */ ms) => {
        clock.sleeps.push(ms);
        clock.now += ms;
      },
    },
  };
}

const QUOTA = {
  error: {
    message: "You exceeded your current quota, please check your plan and billing details.",
    type: "insufficient_quota",
    param: null,
    code: "insufficient_quota",
  },
};

const COMPLETION = {
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 0,
  model: "fake-model",
  choices: [{ index: 0, message: { role: "assistant", content: "summary" }, finish_reason: "stop" }],
};

const CHAT = { model: "fake-model", messages: [{ role: /** @type {const} */ ("user"), content: "INC-4471" }] };

/** @param {string} base */
const openaiClients = (base) => ({
  "private-primary": new OpenAI({ apiKey: "test-key", baseURL: `${base}/primary/v1`, maxRetries: 0 }),
  "external-fallback": new OpenAI({ apiKey: "test-key", baseURL: `${base}/fallback/v1`, maxRetries: 0 }),
});

/** @type {(client: OpenAI, options: import("../dist/openai.js").OpenAIRequestOptions) => Promise<string | null | undefined>} */
const chat = async (client, options) => (await client.chat.completions.create(CHAT, options)).choices[0]?.message.content;

test("openai: insufficient_quota stops after one attempt with stop_non_retryable", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, headers: { "retry-after": "1" }, body: QUOTA }],
    fallback: [{ status: 200, body: COMPLETION }],
  });
  try {
    const e = stopped(await runWithOpenAI(policyFor("openai"), openaiClients(provider.base), chat, { idempotencyKey: KEY }).then(() => undefined, (x) => x));
    assert.equal(e.code, "stop_non_retryable");
    assert.equal(provider.seen.length, 1);
    assert.ok(e.cause instanceof OpenAI.RateLimitError);
    assert.deepEqual(
      e.sealed.bundle.attempts.attempts.map((a) => a.outcome),
      [{ class: "non_retryable", kind: "quota_exhausted" }],
    );
    assert.equal(rl.verifyBundle(e.sealed.bundle).kind, "verified");
  } finally {
    await provider.close();
  }
});

test("openai: without a provider family the same answer is retried (v1 rules)", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, headers: { "retry-after-ms": "5" }, body: QUOTA }],
    fallback: [{ status: 200, body: COMPLETION }],
  });
  try {
    const run = await runWithOpenAI(policyWith(() => {}), openaiClients(provider.base), chat, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.deepEqual(
      provider.seen.map((s) => s.route),
      ["primary", "primary", "fallback"],
    );
  } finally {
    await provider.close();
  }
});

const MESSAGE = {
  id: "msg_fake",
  type: "message",
  role: "assistant",
  model: "claude-fake",
  content: [{ type: "text", text: "summary" }],
  stop_reason: "end_turn",
  stop_sequence: null,
  usage: { input_tokens: 10, output_tokens: 5 },
};

/** @param {string} base */
const anthropicClients = (base) => ({
  "private-primary": new Anthropic({ apiKey: "test-key", baseURL: `${base}/primary`, maxRetries: 0 }),
  "external-fallback": new Anthropic({ apiKey: "test-key", baseURL: `${base}/fallback`, maxRetries: 0 }),
});

/** @type {(client: Anthropic, options: import("../dist/anthropic.js").AnthropicRequestOptions) => Promise<string>} */
const ask = async (client, options) => {
  const msg = await client.messages.create({ model: "claude-fake", max_tokens: 8, messages: [{ role: "user", content: "x" }] }, options);
  const first = msg.content[0];
  return first?.type === "text" ? first.text : "";
};

test("anthropic: a 529 overloaded_error retries", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 529, headers: { "retry-after-ms": "5" }, body: { type: "error", error: { type: "overloaded_error", message: "Overloaded" } } }, { status: 200, body: MESSAGE }],
    fallback: [{ status: 200, body: MESSAGE }],
  });
  try {
    const run = await runWithAnthropic(policyFor("anthropic"), anthropicClients(provider.base), ask, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.deepEqual(
      provider.seen.map((s) => s.route),
      ["primary", "primary"],
    );
    assert.deepEqual(run.bundle.attempts.attempts[0]?.outcome, { class: "retryable", kind: "unavailable", retry_after_ms: 5, retry_after_source: "retry-after-ms" });
  } finally {
    await provider.close();
  }
});

test("anthropic: the requests reset header sets the wait when none remain", async () => {
  const now = Date.parse("2025-12-03T16:05:46Z");
  const limited = {
    status: 429,
    headers: { "anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2025-12-03T16:05:47.500Z" },
    body: { type: "error", error: { type: "rate_limit_error", message: "limited" } },
  };
  const provider = await scriptedServer({ primary: [limited, { status: 200, body: MESSAGE }], fallback: [{ status: 200, body: MESSAGE }] });
  try {
    const fake = fakeClock();
    const run = await runWithAnthropic(policyFor("anthropic"), anthropicClients(provider.base), ask, { idempotencyKey: KEY, ...fake.options, wallClock: () => now });
    assert.equal(run.result, "summary");
    assert.deepEqual(run.bundle.attempts.attempts[0]?.outcome, { class: "retryable", kind: "rate_limited", retry_after_ms: 1500, retry_after_source: "ratelimit_reset" });
    assert.deepEqual(fake.clock.sleeps, [1500]);
  } finally {
    await provider.close();
  }
});

/** Gemini's 429 envelope. @param {string} quotaId @param {string} retryDelay */
const gemini = (quotaId, retryDelay) => ({
  error: {
    code: 429,
    message: "You exceeded your current quota.",
    status: "RESOURCE_EXHAUSTED",
    details: [
      { "@type": "type.googleapis.com/google.rpc.QuotaFailure", violations: [{ quotaId }] },
      { "@type": "type.googleapis.com/google.rpc.RetryInfo", retryDelay },
    ],
  },
});

/** @param {string} base */
const geminiTargets = (base) => ({ "private-primary": `${base}/primary/v1beta/models/gemini:generateContent`, "external-fallback": `${base}/fallback/v1beta/models/gemini:generateContent` });

test("fetch: Gemini's per-minute RESOURCE_EXHAUSTED waits the body's retryDelay", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, body: gemini("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "1.5s") }, { status: 200, body: { ok: true } }],
    fallback: [{ status: 200, body: { ok: true } }],
  });
  try {
    const fake = fakeClock();
    const run = await runWithFetch(policyFor("google"), geminiTargets(provider.base), { idempotencyKey: KEY, ...fake.options });
    assert.equal(run.result.status, 200);
    assert.deepEqual(fake.clock.sleeps, [1500]);
    assert.equal(provider.seen.length, 2);
    assert.deepEqual(run.bundle.attempts.attempts[0]?.outcome, { class: "retryable", kind: "rate_limited", retry_after_ms: 1500, retry_after_source: "retry_info" });
  } finally {
    await provider.close();
  }
});

test("fetch: Gemini's per-day quota stops after one attempt", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, body: gemini("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "1.5s") }],
    fallback: [{ status: 200, body: { ok: true } }],
  });
  try {
    const e = stopped(await runWithFetch(policyFor("google"), geminiTargets(provider.base), { idempotencyKey: KEY }).then(() => undefined, (x) => x));
    assert.equal(e.code, "stop_non_retryable");
    assert.equal(provider.seen.length, 1);
    assert.ok(e.cause instanceof HttpStatusError);
    assert.equal(typeof e.cause.body, "string");
  } finally {
    await provider.close();
  }
});

test("facts: the body is passed bounded and well-formed, and only the core classifies", () => {
  const error = new OpenAI.RateLimitError(429, QUOTA.error, "quota", new Headers());
  const facts = rl.factsOf(error);
  assert.deepEqual(JSON.parse(facts.error_body ?? "null"), QUOTA.error);
  const judged = rl.judge(JSON.stringify({ ...facts, provider_family: "openai" }));
  assert.deepEqual(judged.outcome, { class: "non_retryable", kind: "quota_exhausted" });
  const long = { status: 429, body: "x".repeat(20_000) + "\uD800" };
  const big = rl.factsOf(long);
  assert.equal(big.error_body?.length, rl.MAX_ERROR_BODY_BYTES + 1);
  const lone = rl.factsOf({ status: 503, body: '{"error":"\uD800"}' });
  assert.equal(lone.error_body, '{"error":"\uFFFD"}');
  const noted = rl.judge(JSON.stringify({ ...big, provider_family: "openai" }));
  assert.deepEqual(noted.notes, ["body_oversize"]);
  assert.equal(rl.factsOf({ status: 200, body: "fine" }).error_body, undefined);
});

// ---- @google/genai: Gemini's envelope through the real SDK ----------------------

const GENERATED = {
  candidates: [{ content: { role: "model", parts: [{ text: "summary" }] }, finishReason: "STOP", index: 0 }],
  usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 1, totalTokenCount: 4 },
};

/** @param {string} base @param {Record<string, unknown>} [extra] */
const genaiClients = (base, extra = {}) => ({
  "private-primary": new GoogleGenAI({ apiKey: "test-key", httpOptions: { baseUrl: `${base}/primary`, apiVersion: "v1beta", ...extra } }),
  "external-fallback": new GoogleGenAI({ apiKey: "test-key", httpOptions: { baseUrl: `${base}/fallback`, apiVersion: "v1beta" } }),
});

/** @type {(client: GoogleGenAI, options: import("../dist/google-genai.js").GoogleGenAIRequestOptions, step: import("../dist/index.js").Step, signal: AbortSignal) => Promise<string>} */
const generate = async (client, options, _step, signal) => {
  const reply = await client.models.generateContent({ model: "gemini-2.0-flash", contents: "INC-4471", config: { httpOptions: options, abortSignal: signal } });
  return reply.text ?? "";
};

test("@google/genai: per-minute RESOURCE_EXHAUSTED with retryDelay 1.5s waits 1.5 s before the next attempt", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, body: gemini("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "1.5s") }, { status: 200, body: GENERATED }],
    fallback: [{ status: 200, body: GENERATED }],
  });
  try {
    const fake = fakeClock();
    const run = await runWithGoogleGenAI(policyFor("google"), genaiClients(provider.base), generate, { idempotencyKey: KEY, ...fake.options });
    assert.equal(run.result, "summary");
    assert.deepEqual(fake.clock.sleeps, [1500]);
    assert.deepEqual(
      provider.seen.map((s) => [s.route, s.idempotencyKey]),
      [
        ["primary", KEY],
        ["primary", KEY],
      ],
    );
    assert.deepEqual(run.bundle.attempts.attempts[0]?.outcome, { class: "retryable", kind: "rate_limited", retry_after_ms: 1500, retry_after_source: "retry_info" });
  } finally {
    await provider.close();
  }
});

test("@google/genai: a per-day quota stops after one attempt with stop_non_retryable", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 429, body: gemini("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "1.5s") }],
    fallback: [{ status: 200, body: GENERATED }],
  });
  try {
    const e = stopped(await runWithGoogleGenAI(policyFor("google"), genaiClients(provider.base), generate, { idempotencyKey: KEY }).then(() => undefined, (x) => x));
    assert.equal(e.code, "stop_non_retryable");
    assert.equal(provider.seen.length, 1);
    assert.deepEqual(
      e.sealed.bundle.attempts.attempts.map((a) => a.outcome),
      [{ class: "non_retryable", kind: "quota_exhausted" }],
    );
  } finally {
    await provider.close();
  }
});

test("@google/genai: a client whose own retries are on is refused before any request", async () => {
  const provider = await scriptedServer({ primary: [{ status: 200, body: GENERATED }], fallback: [{ status: 200, body: GENERATED }] });
  try {
    const refused = (/** @type {unknown} */ e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness";
    for (const retryOptions of [{}, { attempts: 3 }]) {
      await assert.rejects(runWithGoogleGenAI(policyFor("google"), genaiClients(provider.base, { retryOptions }), generate, { idempotencyKey: KEY }), refused);
    }
    assert.throws(() => googleGenAIDispatch(/** @type {any} */ ({ models: {}, apiClient: { clientOptions: { httpOptions: 7 } } }), generate), refused);
    const once = genaiClients(provider.base, { retryOptions: { attempts: 1 } });
    const run = await runWithGoogleGenAI(policyFor("google"), once, generate, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.equal(provider.seen.length, 1);
  } finally {
    await provider.close();
  }
});

test("@google/genai: the SDK's own retries under a naive three-attempt loop send 3 x 3 = 9 requests", async () => {
  const provider = await scriptedServer({ primary: [{ status: 429, body: gemini("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "0.01s") }] });
  try {
    const client = new GoogleGenAI({ apiKey: "test-key", httpOptions: { baseUrl: `${provider.base}/primary`, apiVersion: "v1beta", retryOptions: { attempts: 3, initialDelay: 0.001, maxDelay: 0.002 } } });
    for (let i = 0; i < 3; i += 1) {
      await assert.rejects(client.models.generateContent({ model: "gemini-2.0-flash", contents: "x" }), (e) => e instanceof ApiError);
    }
    assert.equal(provider.seen.length, 9);
  } finally {
    await provider.close();
  }
});
