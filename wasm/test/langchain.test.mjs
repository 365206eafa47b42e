// The LangChain.js adapter with real parts: a RetryledgerChatModel over
// `@langchain/openai` ChatOpenAI and `@langchain/anthropic` ChatAnthropic,
// talking to the loopback provider servers on 127.0.0.1. Each test makes one
// framework call (one logical request) and checks that the requests the
// servers counted equal the attempts of the receipt.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ChatOpenAI } from "@langchain/openai";
import { ChatAnthropic } from "@langchain/anthropic";
import { StateGraph, MessagesAnnotation, START, END } from "@langchain/langgraph";

import { PolicyError, RunStoppedError, digest, checkOn } from "../dist/index.js";
import { hasN } from "./frameworks-support.mjs";
import { RetryledgerChatModel, messageText, assertNoGraphRetries } from "../dist/langchain.js";
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

/** @param {{url: (route: string) => string}} server @param {number} [retries] */
function routes(server, retries = 0) {
  return {
    [PRIMARY]: new ChatOpenAI({ model: "gpt-fake", apiKey: "sk-loopback", maxRetries: retries, configuration: { baseURL: server.url(PRIMARY) } }),
    [FALLBACK]: new ChatAnthropic({ model: "claude-fake", apiKey: "sk-ant-loopback", maxRetries: 0, anthropicApiUrl: server.url(FALLBACK) }),
  };
}

/** @param {any} message */
function receiptOf(message) {
  const r = message?.response_metadata?.retryledger;
  assert.ok(r !== undefined, "the message carries response_metadata.retryledger");
  assert.equal(r.receipt_sha256, digest(r.receipt), "the receipt digest is the digest of the receipt it carries");
  return r;
}

test("a 429 then success: one invoke, two requests, two attempts", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 429, headers: { "retry-after-ms": "30" } }, { text: "fine now" }] });
  try {
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const answer = await model.invoke("hello");
    assert.equal(answer.content, "fine now");
    const meta = receiptOf(answer);
    assert.equal(meta.terminal, "completed");
    assert.equal(meta.receipt.fallback_used, false);
    assert.equal(server.count(), 2);
    assert.equal(meta.attempts, server.count());
    assert.deepEqual(server.requests.map((q) => q.idempotencyKey), [KEY, KEY], "every attempt sends the same Idempotency-Key");
  } finally {
    await server.close();
  }
});

test("a fallback across providers: ChatOpenAI fails twice, ChatAnthropic answers", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 503 }], [FALLBACK]: [{ text: "from the fallback" }] });
  try {
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const answer = await model.invoke("hello");
    assert.equal(answer.content, "from the fallback");
    const meta = receiptOf(answer);
    assert.equal(meta.terminal, "completed");
    assert.equal(meta.receipt.fallback_used, true);
    assert.equal(server.count(PRIMARY), 2);
    assert.equal(server.count(FALLBACK), 1);
    assert.equal(meta.attempts, server.count());
    assert.deepEqual(server.requests.map((q) => q.idempotencyKey), [KEY, KEY, KEY], "openai and anthropic attempts send the same Idempotency-Key");
  } finally {
    await server.close();
  }
});

test("a route whose maxRetries is on, and withRetry / withFallbacks over the model, are refused before any request", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: "never sent" }] });
  try {
    assert.throws(
      () => new RetryledgerChatModel({ routes: routes(server, 2), policy: policy(), idempotencyKey: KEY }),
      (/** @type {any} */ e) => e instanceof PolicyError && e.code === "retry_owner_not_harness",
    );
    const defaulted = { ...routes(server), [PRIMARY]: new ChatOpenAI({ model: "gpt-fake", apiKey: "sk", configuration: { baseURL: server.url(PRIMARY) } }) };
    assert.throws(
      () => new RetryledgerChatModel({ routes: defaulted, policy: policy(), idempotencyKey: KEY }),
      (/** @type {any} */ e) => e.code === "retry_owner_not_harness",
    );
    const wrapped = { ...routes(server), [PRIMARY]: routes(server)[PRIMARY].withRetry({ stopAfterAttempt: 3 }) };
    assert.throws(
      () => new RetryledgerChatModel({ routes: /** @type {any} */ (wrapped), policy: policy(), idempotencyKey: KEY }),
      (/** @type {any} */ e) => e.code === "retry_owner_not_harness",
    );
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    assert.throws(() => model.withRetry(), (/** @type {any} */ e) => e.code === "retry_owner_not_harness");
    assert.throws(() => model.withFallbacks([model]), (/** @type {any} */ e) => e.code === "retry_owner_not_harness");
    assert.equal(server.count(), 0);
  } finally {
    await server.close();
  }
});

test("a stopped run throws the driver's error with the sealed run", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 400 }] });
  try {
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const err = await model.invoke("hello").catch((/** @type {any} */ e) => e);
    assert.ok(err instanceof RunStoppedError, String(err));
    assert.equal(server.count(), 1);
    assert.equal(err.sealed.bundle.attempts.attempts.length, server.count());
  } finally {
    await server.close();
  }
});

test("stream: a stream cut before any output is retried; the last chunk carries the receipt", async () => {
  const server = await sseServer({ [PRIMARY]: [{ cutAfter: 0 }, { text: "streamed answer", chunks: 3 }] });
  try {
    const model = new RetryledgerChatModel({
      routes: routes(server),
      policy: policy((p) => (p.stream = { mode: "buffer", max_response_bytes: 1 << 20 })),
      idempotencyKey: KEY,
    });
    let text = "";
    /** @type {any} */
    let last;
    for await (const chunk of await model.stream("hello")) {
      text += typeof chunk.content === "string" ? chunk.content : "";
      last = chunk;
    }
    assert.equal(text, "streamed answer");
    const meta = receiptOf(last);
    assert.equal(server.count(), 2);
    assert.equal(meta.attempts, server.count());
  } finally {
    await server.close();
  }
});

test("bound tools reach the fallback route and its tool call comes back", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 500 }], [FALLBACK]: [{ toolCall: { name: "weather", arguments: { city: "Berlin" } } }] });
  try {
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const withTools = model.bindTools([
      { type: "function", function: { name: "weather", description: "weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
    ]);
    const answer = await withTools.invoke("weather in Berlin?");
    assert.equal(answer.tool_calls?.length, 1);
    assert.equal(answer.tool_calls?.[0]?.name, "weather");
    assert.deepEqual(answer.tool_calls?.[0]?.args, { city: "Berlin" });
    assert.equal(server.requests.at(-1)?.body?.tools?.[0]?.name, "weather");
    assert.equal(server.requests[0]?.body?.tools?.[0]?.function?.name, "weather");
    const meta = receiptOf(answer);
    assert.equal(meta.attempts, server.count());
    assert.equal(server.count(), 3);
  } finally {
    await server.close();
  }
});

test("structured output that fails its schema once is repaired (a new logical request)", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: '{"n": "seven"}' }, { text: '{"n": 7}' }] });
  try {
    const model = new RetryledgerChatModel({
      routes: routes(server),
      policy: policy((p) => (p.repair = { max_repairs: 1, cost_share_percent: 50 })),
      idempotencyKey: KEY,
      checks: [checkOn(hasN, messageText)],
      repair: true,
    });
    const answer = await model.invoke("a number as JSON");
    assert.deepEqual(JSON.parse(String(answer.content)), { n: 7 });
    assert.equal(server.count(), 2);
    const second = server.requests[1]?.body;
    assert.ok(JSON.stringify(second.messages).includes("n is not an integer"), "the repair names the defect");
    assert.ok(JSON.stringify(second.messages).includes("seven"), "the repair repeats the answer");
    const meta = receiptOf(answer);
    assert.equal(meta.attempts, 1, "the last run of the chain made one attempt");
    assert.equal(meta.runs, 2, "the request and one repair");
    assert.equal(meta.chain_attempts, server.count(), "every request the server counted is an attempt of the chain");
  } finally {
    await server.close();
  }
});

test("stream: a stream cut after output is never joined (buffer: the next attempt's text alone; restart: stopped)", async () => {
  const server = await sseServer({ [PRIMARY]: [{ text: "first partial answer here", chunks: 4, cutAfter: 2 }, { text: "whole second answer", chunks: 3 }] });
  try {
    const model = new RetryledgerChatModel({
      routes: routes(server),
      policy: policy((p) => (p.stream = { mode: "buffer", max_response_bytes: 1 << 20 })),
      idempotencyKey: KEY,
    });
    let text = "";
    /** @type {any} */
    let last;
    for await (const chunk of await model.stream("hello")) {
      text += typeof chunk.content === "string" ? chunk.content : "";
      last = chunk;
    }
    assert.equal(text, "whole second answer");
    assert.equal(server.count(), 2);
    assert.equal(receiptOf(last).attempts, server.count());
  } finally {
    await server.close();
  }
  const cut = await sseServer({ [PRIMARY]: [{ text: "first partial answer here", chunks: 4, cutAfter: 2 }, { text: "never asked" }] });
  try {
    const model = new RetryledgerChatModel({
      routes: routes(cut),
      policy: policy((p) => (p.stream = { mode: "restart", max_response_bytes: 1 << 20 })),
      idempotencyKey: KEY,
    });
    const err = await (async () => {
      for await (const _ of await model.stream("hello"));
    })().catch((/** @type {any} */ e) => e);
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
    const model = new RetryledgerChatModel({
      routes: routes(server),
      policy: policy(),
      idempotencyKey: KEY,
      onAttempt: (a) => void seen.push(a.route_id),
      onTerminal: (receipt) => void (terminal = receipt),
    });
    const answer = await model.invoke("hello");
    assert.deepEqual(seen, [PRIMARY, PRIMARY]);
    assert.equal(seen.length, server.count());
    assert.equal(digest(terminal), receiptOf(answer).receipt_sha256);
  } finally {
    await server.close();
  }
});

test("LangGraph: a node retry policy over the model is refused before any request; without one, one graph run is one logical request", async () => {
  const server = await sseServer({ [PRIMARY]: [{ status: 429, headers: { "retry-after-ms": "10" } }, { text: "graph answer" }] });
  try {
    const model = new RetryledgerChatModel({ routes: routes(server), policy: policy(), idempotencyKey: KEY });
    const call = async (/** @type {{messages: any[]}} */ state) => ({ messages: [await model.invoke(state.messages)] });
    const build = (/** @type {any} */ options) => new StateGraph(MessagesAnnotation).addNode("agent", call, options).addEdge(START, "agent").addEdge("agent", END).compile();
    for (const retryPolicy of [{ maxAttempts: 3 }, {}]) {
      assert.throws(
        () => assertNoGraphRetries(build({ retryPolicy })),
        (/** @type {any} */ e) => e instanceof PolicyError && e.code === "retry_owner_not_harness",
      );
    }
    assertNoGraphRetries(build({ retryPolicy: { maxAttempts: 1 } }));
    const graph = build(undefined);
    assertNoGraphRetries(graph);
    assert.equal(server.count(), 0);
    const out = await graph.invoke({ messages: [{ role: "user", content: "hello" }] });
    const answer = /** @type {any} */ (out.messages.at(-1));
    assert.equal(answer.content, "graph answer");
    assert.equal(receiptOf(answer).attempts, server.count());
    assert.equal(server.count(), 2);
  } finally {
    await server.close();
  }
});
