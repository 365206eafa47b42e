// The AI SDK adapter with real parts: `ai`'s generateText / streamText /
// generateObject over `@ai-sdk/openai` and `@ai-sdk/anthropic` provider
// models, talking to the loopback provider servers on 127.0.0.1. Each test
// makes one framework call (one logical request) and checks that the
// requests the servers counted equal the attempts of the receipt.
import { test } from "node:test";
import assert from "node:assert/strict";

import { generateText, streamText, generateObject, Output, tool, jsonSchema } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";

import { PolicyError, RunStoppedError, digest, checkOn } from "../dist/index.js";
import { hasN } from "./frameworks-support.mjs";
import { retryledgerModel, harnessOwned, aiSdkText } from "../dist/ai-sdk.js";
import { KEY, policyWith } from "./helpers.mjs";
import { sseServer } from "./sse-loopback.mjs";

const PRIMARY = "private-primary";
const FALLBACK = "external-fallback";

/** @param {(p: import("../dist/index.js").Policy) => void} [change] */
const policy = (change) =>
  policyWith((p) => {
    p.backoff = { base_ms: 10, max_ms: 50, retry_after_cap_ms: 200 };
    change?.(p);
  });
const streamPolicy = () => policy((p) => (p.stream = { mode: "buffer", max_response_bytes: 1 << 20 }));

/** OpenAI chat completions on the primary route, Anthropic messages on the fallback. @param {{url: (route: string) => string}} server */
function routes(server) {
  const openai = createOpenAI({ baseURL: server.url(PRIMARY), apiKey: "sk-loopback" });
  const anthropic = createAnthropic({ baseURL: `${server.url(FALLBACK)}/v1`, apiKey: "sk-ant-loopback" });
  return { [PRIMARY]: openai.chat("gpt-fake"), [FALLBACK]: anthropic("claude-fake") };
}

/** @param {any} meta */
function receiptOf(meta) {
  const r = meta?.retryledger;
  assert.ok(r !== undefined, "the result carries providerMetadata.retryledger");
  assert.equal(r.receipt_sha256, digest(r.receipt), "the receipt digest is the digest of the receipt it carries");
  return r;
}

test("a 429 then success: one generateText call, two requests, two attempts", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 429, headers: { "retry-after-ms": "30" } }, { text: "fine now" }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const r = await generateText({ model, prompt: "hello", ...harnessOwned() });
    assert.equal(r.text, "fine now");
    const meta = receiptOf(r.providerMetadata);
    assert.equal(meta.terminal, "completed");
    assert.equal(meta.receipt.fallback_used, false);
    assert.equal(server.count(), 2);
    assert.equal(meta.attempts, server.count());
    assert.equal(meta.receipt.attempt_count, server.count());
    assert.deepEqual(server.requests.map((q) => q.idempotencyKey), [KEY, KEY]);
  } finally {
    await server.close();
  }
});

test("a fallback across providers: openai fails twice, anthropic answers", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 503 }], [FALLBACK]: [{ text: "from the fallback" }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const r = await generateText({ model, prompt: "hello", ...harnessOwned() });
    assert.equal(r.text, "from the fallback");
    const meta = receiptOf(r.providerMetadata);
    assert.equal(meta.terminal, "completed");
    assert.equal(meta.receipt.fallback_used, true);
    assert.equal(server.count(PRIMARY), 2);
    assert.equal(server.count(FALLBACK), 1);
    assert.equal(meta.attempts, server.count());
    assert.equal(server.requests.at(-1)?.path, `/${FALLBACK}/v1/messages`);
  } finally {
    await server.close();
  }
});

test("the AI SDK's retries left on are refused before any request", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: "never sent" }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    for (const call of [
      () => generateText({ model, prompt: "hello" }),
      () => generateText({ model, prompt: "hello", maxRetries: 2, providerOptions: { retryledger: { maxRetries: 2 } } }),
    ]) {
      const err = await call().catch((/** @type {any} */ e) => e);
      assert.ok(err instanceof PolicyError, String(err));
      assert.equal(err.code, "retry_owner_not_harness");
    }
    /** @type {any} */
    let err;
    const streamed = streamText({ model, prompt: "hello", onError: ({ error }) => void (err = error) });
    await streamed.consumeStream();
    assert.ok(err instanceof PolicyError, String(err));
    assert.equal(err.code, "retry_owner_not_harness");
    assert.equal(server.count(), 0);
  } finally {
    await server.close();
  }
});

test("a stopped run throws the driver's error with the sealed run, once (no AI SDK retry on top)", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 400 }], [FALLBACK]: [{ text: "unused" }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const err = await generateText({ model, prompt: "hello", ...harnessOwned() }).catch((/** @type {any} */ e) => e);
    assert.ok(err instanceof RunStoppedError, String(err));
    assert.equal(server.count(), 1);
    assert.equal(err.sealed.bundle.attempts.attempts.length, server.count());
  } finally {
    await server.close();
  }
});

test("streamText: a stream cut before any output is retried, the receipt is on the finish part", async () => {
  const server = await sseServer({ [PRIMARY]: [{ cutAfter: 0 }, { text: "streamed answer", chunks: 3 }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: streamPolicy(), idempotencyKey: KEY });
    const r = streamText({ model, prompt: "hello", ...harnessOwned() });
    let text = "";
    for await (const delta of r.textStream) text += delta;
    assert.equal(text, "streamed answer");
    const meta = receiptOf(await r.providerMetadata);
    assert.equal(meta.terminal, "completed");
    assert.equal(meta.receipt.fallback_used, false);
    assert.equal(server.count(), 2);
    assert.equal(meta.attempts, server.count());
  } finally {
    await server.close();
  }
});

test("a tool call through the fallback keeps the tool binding", async () => {
  const server = await sseServer({
    [PRIMARY]: [{ status: 500 }],
    [FALLBACK]: [{ toolCall: { name: "weather", arguments: { city: "Berlin" } } }],
  });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const r = await generateText({
      model,
      prompt: "weather in Berlin?",
      tools: { weather: tool({ description: "weather of a city", inputSchema: jsonSchema({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }) }) },
      ...harnessOwned(),
    });
    assert.equal(r.toolCalls.length, 1);
    assert.equal(r.toolCalls[0]?.toolName, "weather");
    assert.deepEqual(r.toolCalls[0]?.input, { city: "Berlin" });
    const sent = server.requests.at(-1)?.body;
    assert.equal(sent.tools?.[0]?.name, "weather", "the fallback request carries the tool");
    const meta = receiptOf(r.providerMetadata);
    assert.equal(meta.attempts, server.count());
    assert.equal(server.count(), 3);
  } finally {
    await server.close();
  }
});

test("structured output that fails its schema once is repaired (a new logical request)", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: '{"n": "seven"}' }, { text: '{"n": 7}' }] });
  try {
    const model = retryledgerModel({
      routes: routes(server),
      policy: policy((p) => (p.repair = { max_repairs: 1, cost_share_percent: 50 })),
      idempotencyKey: KEY,
      checks: [checkOn(hasN, aiSdkText)],
      repair: true,
    });
    const r = await generateObject({
      model,
      prompt: "a number",
      schema: jsonSchema({ type: "object", properties: { n: { type: "integer" } }, required: ["n"] }),
      ...harnessOwned(),
    });
    assert.deepEqual(r.object, { n: 7 });
    const meta = receiptOf(r.providerMetadata);
    assert.equal(server.count(), 2);
    // The repair's request repeats the answer and names the defect.
    const second = server.requests[1]?.body;
    assert.ok(JSON.stringify(second.messages).includes("n is not an integer"));
    assert.equal(server.requests[1]?.idempotencyKey, `${KEY}:repair:1`);
    assert.equal(meta.attempts, 1, "the last run of the chain made one attempt");
    assert.equal(meta.runs, 2, "the request and one repair");
    assert.equal(meta.chain_attempts, server.count(), "every request the server counted is an attempt of the chain");
  } finally {
    await server.close();
  }
});

test("Output.object through generateText on the anthropic route", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 429 }], [FALLBACK]: [{ text: '{"n": 3}' }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: policy((p) => (/** @type {any} */ (p.routes[0]).max_attempts = 1)), idempotencyKey: KEY });
    const r = await generateText({
      model,
      prompt: "a number",
      output: Output.object({ schema: jsonSchema({ type: "object", properties: { n: { type: "integer" } }, required: ["n"] }) }),
      ...harnessOwned(),
    });
    assert.deepEqual(r.output, { n: 3 });
    const meta = receiptOf(r.providerMetadata);
    assert.equal(meta.attempts, server.count());
    assert.equal(server.count(), 2);
  } finally {
    await server.close();
  }
});

test("streamText: a stream cut after output is never joined (buffer: the next attempt's text alone; restart: stopped)", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: "first partial answer here", chunks: 4, cutAfter: 2 }, { text: "whole second answer", chunks: 3 }] });
  try {
    const model = retryledgerModel({ routes: routes(server), policy: streamPolicy(), idempotencyKey: KEY });
    const r = streamText({ model, prompt: "hello", ...harnessOwned() });
    let text = "";
    for await (const delta of r.textStream) text += delta;
    assert.equal(text, "whole second answer");
    const meta = receiptOf(await r.providerMetadata);
    assert.equal(server.count(), 2);
    assert.equal(meta.attempts, server.count());
  } finally {
    await server.close();
  }
  const cut = await sseServer({ [PRIMARY]: [{ text: "first partial answer here", chunks: 4, cutAfter: 2 }, { text: "never asked" }] });
  try {
    const model = retryledgerModel({
      routes: routes(cut),
      policy: policy((p) => (p.stream = { mode: "restart", max_response_bytes: 1 << 20 })),
      idempotencyKey: KEY,
    });
    /** @type {any} */
    let err;
    const r = streamText({ model, prompt: "hello", ...harnessOwned(), onError: ({ error }) => void (err = error) });
    await r.consumeStream();
    assert.ok(err instanceof RunStoppedError, String(err));
    assert.equal(err.code, "stop_indeterminate");
    assert.equal(cut.count(), 1);
    assert.equal(err.sealed.bundle.attempts.attempts.length, cut.count());
  } finally {
    await cut.close();
  }
});

test("driver options reach the run: onAttempt sees every attempt, onTerminal the receipt", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 429, headers: { "retry-after-ms": "10" } }, { text: "ok" }] });
  try {
    /** @type {string[]} */
    const seen = [];
    /** @type {any} */
    let terminal;
    const model = retryledgerModel({
      routes: routes(server),
      policy: policy(),
      idempotencyKey: KEY,
      onAttempt: (a) => void seen.push(a.route_id),
      onTerminal: (receipt) => void (terminal = receipt),
    });
    const r = await generateText({ model, prompt: "hello", ...harnessOwned() });
    assert.deepEqual(seen, [PRIMARY, PRIMARY]);
    assert.equal(seen.length, server.count());
    assert.equal(digest(terminal), receiptOf(r.providerMetadata).receipt_sha256);
  } finally {
    await server.close();
  }
});

test("a stream mode the AI SDK cannot carry is the core's refusal, when the model is built", () => {
  const stub = { specificationVersion: "v2", provider: "stub", modelId: "stub", supportedUrls: {}, doGenerate: async () => ({}), doStream: async () => ({}) };
  const models = { [PRIMARY]: stub, [FALLBACK]: stub };
  for (const mode of ["tentative", "continuation"]) {
    const refused = policy((p) => (p.stream = { mode: /** @type {any} */ (mode), max_response_bytes: 1 << 20 }));
    assert.throws(
      () => retryledgerModel({ routes: /** @type {any} */ (models), policy: refused, idempotencyKey: KEY }),
      (/** @type {any} */ e) => e instanceof PolicyError && e.code === "invalid_stream_contract" && e.path === "/stream/mode" && e.message.includes(`\`${mode}\``),
    );
  }
  for (const mode of ["buffer", "restart"]) {
    const taken = policy((p) => (p.stream = { mode: /** @type {any} */ (mode), max_response_bytes: 1 << 20 }));
    assert.ok(retryledgerModel({ routes: /** @type {any} */ (models), policy: taken, idempotencyKey: KEY }));
  }
});
