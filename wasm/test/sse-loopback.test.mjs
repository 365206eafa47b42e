// The streaming fake providers (test/sse-loopback.mjs) against the real openai
// and @anthropic-ai/sdk clients: full streams in each dialect, Responses
// resumption, and what each client throws for each fault.
//
// What the clients do with the faults (openai 6.30, @anthropic-ai/sdk 1.16, Node's fetch):
//
//   cutAfter      iterating a stream (both SDKs): TypeError "terminated", cause undici
//                 SocketError (code UND_ERR_SOCKET); the helpers responses.stream() and
//                 messages.stream() reject with OpenAIError / AnthropicError "terminated"
//                 (cause that TypeError)
//   errorAfter    openai chat: APIError (base class, status undefined); openai responses:
//                 no throw, an "error" event is yielded; responses.stream() rejects with
//                 the plain error event object (not an Error); anthropic: APIError (base
//                 class, status undefined), not OverloadedError
//   noTerminal    no throw when iterating, in either SDK; anthropic messages.stream()
//                 finalMessage() rejects with AnthropicError ("stream ended without
//                 producing a Message with role=assistant")
//   malformed     SyntaxError from JSON.parse (helpers: OpenAIError / AnthropicError, cause SyntaxError)
//   status 429    openai.RateLimitError / Anthropic.RateLimitError
import { test } from "node:test";
import assert from "node:assert/strict";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import { sseServer, splitText } from "./sse-loopback.mjs";

const TEXT = "Hello world from the primary";
const MESSAGES = [{ role: /** @type {const} */ ("user"), content: "summarize INC-4471" }];

/** @typedef {Awaited<ReturnType<typeof sseServer>>} Server */
/** @typedef {import("openai/resources/responses/responses").ResponseStreamEvent} ResponseStreamEvent */

/** @param {Server} server @param {string} route */
const oai = (server, route) => new OpenAI({ baseURL: server.url(route), apiKey: "k", maxRetries: 0, logLevel: "off" });
/** @param {Server} server @param {string} route */
const claude = (server, route) => new Anthropic({ baseURL: server.url(route), apiKey: "k", maxRetries: 0, logLevel: "off" });

/** @template T @param {AsyncIterable<T>} iterable @param {T[]} [into] */
async function collect(iterable, into = []) {
  for await (const x of iterable) into.push(x);
  return into;
}

/** @param {Server} server @param {string} route @param {string[]} [into] @param {Record<string, string>} [headers] */
async function chatTexts(server, route, into = [], headers = {}) {
  const stream = await oai(server, route).chat.completions.create({ model: "gpt-fake", messages: MESSAGES, stream: true }, { headers });
  for await (const chunk of stream) if (chunk.choices[0] !== undefined) into.push(chunk.choices[0].delta.content ?? "");
  return into;
}

/** @param {Server} server @param {string} route @param {ResponseStreamEvent[]} [into] */
async function responseEvents(server, route, into = []) {
  return collect(await oai(server, route).responses.create({ model: "gpt-fake", input: "hi", stream: true }), into);
}

/** @param {Server} server @param {string} route */
async function anthropicEvents(server, route) {
  return collect(await claude(server, route).messages.create({ model: "claude-fake", max_tokens: 64, messages: MESSAGES, stream: true }));
}

/** @param {ResponseStreamEvent[]} events */
const deltas = (events) => events.map((e) => (e.type === "response.output_text.delta" ? e.delta : "")).join("");

/** The SDKs' cut: fetch's TypeError "terminated" with undici's socket error as cause. @param {unknown} e */
const terminated = (e) => e instanceof TypeError && e.message === "terminated" && /** @type {{code?: string}} */ (e.cause).code === "UND_ERR_SOCKET";

test("splitText keeps the text", () => {
  for (let n = 1; n < 12; n += 1) {
    const pieces = splitText(TEXT, n);
    assert.equal(pieces.join(""), TEXT);
    assert.equal(pieces.length, Math.min(n, TEXT.length));
    assert.ok(pieces.every((p) => p.length > 0));
  }
});

test("chat completions stream with usage is read to the end", async () => {
  const server = await sseServer({ p: [{ text: TEXT, chunks: 5 }] });
  try {
    const stream = await oai(server, "p").chat.completions.create({ model: "gpt-fake", messages: MESSAGES, stream: true, stream_options: { include_usage: true } });
    const chunks = await collect(stream);
    assert.deepEqual(
      chunks.map((c) => c.object),
      Array(8).fill("chat.completion.chunk"),
    );
    assert.equal(chunks[0]?.choices[0]?.delta.role, "assistant");
    assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), TEXT);
    assert.equal(chunks[6]?.choices[0]?.finish_reason, "stop");
    assert.deepEqual(chunks[7]?.choices, []);
    assert.deepEqual(chunks[7]?.usage, { prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 });
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
    assert.equal(server.count("p"), 1);
    const seen = server.requests[0];
    assert.deepEqual([seen?.method, seen?.path, seen?.body.stream], ["POST", "/p/chat/completions", true]);
  } finally {
    await server.close();
  }
});

test("responses stream: sequence numbers from 0 and usage on response.completed", async () => {
  const server = await sseServer({ p: [{ text: TEXT, chunks: 5 }] });
  try {
    const events = await responseEvents(server, "p");
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      [...Array(13).keys()],
    );
    assert.deepEqual(
      events.map((e) => e.type),
      [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        ...Array(5).fill("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
      ],
    );
    assert.equal(deltas(events), TEXT);
    const first = events[0];
    const last = events.at(-1);
    assert.ok(first?.type === "response.created" && last?.type === "response.completed");
    assert.equal(first.response.id, "resp_p_0");
    assert.equal(last.response.id, "resp_p_0");
    const message = last.response.output[0];
    assert.ok(message?.type === "message" && message.content[0]?.type === "output_text");
    assert.equal(message.content[0].text, TEXT);
    assert.deepEqual([last.response.usage?.input_tokens, last.response.usage?.output_tokens, last.response.usage?.total_tokens], [12, 5, 17]);
    // The SDK's own helper accumulates the same stream (it sets output_text only when it parses).
    const final = await oai(server, "p").responses.stream({ model: "gpt-fake", input: "hi" }).finalResponse();
    const finalMessage = final.output[0];
    assert.ok(finalMessage?.type === "message" && finalMessage.content[0]?.type === "output_text");
    assert.equal(finalMessage.content[0].text, TEXT);
  } finally {
    await server.close();
  }
});

test("responses resume with starting_after replays exactly the events after N", async () => {
  const server = await sseServer({ p: [{ text: TEXT, chunks: 5, cutAfter: 2 }, {}] });
  try {
    const client = oai(server, "p");
    /** @type {ResponseStreamEvent[]} */
    const got = [];
    await assert.rejects(responseEvents(server, "p", got), terminated);
    assert.deepEqual(
      got.map((e) => e.sequence_number),
      [0, 1, 2, 3, 4, 5],
    );
    const created = got[0];
    assert.ok(created?.type === "response.created");
    const id = created.response.id;
    const last = /** @type {ResponseStreamEvent} */ (got.at(-1)).sequence_number;
    const rest = await collect(await client.responses.retrieve(id, { stream: true, starting_after: last }));
    assert.deepEqual(
      rest.map((e) => e.sequence_number),
      [6, 7, 8, 9, 10, 11, 12],
    );
    assert.equal(deltas(got) + deltas(rest), TEXT);
    const done = rest.at(-1);
    assert.ok(done?.type === "response.completed" && done.response.id === id);
    const resume = server.requests[1];
    assert.deepEqual([resume?.method, resume?.path, resume?.query], ["GET", `/p/responses/${id}`, { stream: "true", starting_after: String(last) }]);
    assert.equal((await client.responses.retrieve(id)).output_text, TEXT);
  } finally {
    await server.close();
  }
});

test("anthropic messages.stream and create({stream: true})", async () => {
  const server = await sseServer({ p: [{ text: TEXT, chunks: 4 }] });
  try {
    const stream = claude(server, "p").messages.stream({ model: "claude-fake", max_tokens: 64, messages: MESSAGES });
    let text = "";
    stream.on("text", (t) => {
      text += t;
    });
    const final = await stream.finalMessage();
    assert.equal(text, TEXT);
    assert.equal(final.id, "msg_p_0");
    assert.equal(final.stop_reason, "end_turn");
    assert.deepEqual([final.usage.input_tokens, final.usage.output_tokens], [12, 4]);
    const events = await anthropicEvents(server, "p");
    // ping is skipped by the client
    assert.deepEqual(
      events.map((e) => e.type),
      ["message_start", "content_block_start", ...Array(4).fill("content_block_delta"), "content_block_stop", "message_delta", "message_stop"],
    );
    assert.equal(events.map((e) => (e.type === "content_block_delta" && e.delta.type === "text_delta" ? e.delta.text : "")).join(""), TEXT);
    assert.equal(server.requests[0]?.path, "/p/v1/messages");
  } finally {
    await server.close();
  }
});

test("cutAfter: TypeError 'terminated' (cause UND_ERR_SOCKET) from both SDKs; the helpers wrap it", async () => {
  const server = await sseServer({ c: [{ cutAfter: 2 }] });
  try {
    /** @type {string[]} */
    const texts = [];
    await assert.rejects(chatTexts(server, "c", texts), terminated);
    assert.deepEqual(texts, ["", "Hello", " world"]);
    /** @type {ResponseStreamEvent[]} */
    const got = [];
    await assert.rejects(responseEvents(server, "c", got), terminated);
    assert.equal(deltas(got), "Hello world");
    await assert.rejects(anthropicEvents(server, "c"), terminated);
    await assert.rejects(oai(server, "c").responses.stream({ model: "m", input: "x" }).finalResponse(), (e) => e instanceof OpenAI.OpenAIError && e.message === "terminated");
    await assert.rejects(
      claude(server, "c").messages.stream({ model: "m", max_tokens: 5, messages: MESSAGES }).finalMessage(),
      (e) => e instanceof Anthropic.AnthropicError && e.message === "terminated",
    );
  } finally {
    await server.close();
  }
});

test("cutAfter with cutReset: the same TypeError", async () => {
  const server = await sseServer({ c: [{ cutAfter: 1, cutReset: true }] });
  try {
    await assert.rejects(chatTexts(server, "c"), terminated);
    await assert.rejects(anthropicEvents(server, "c"), terminated);
  } finally {
    await server.close();
  }
});

test("errorAfter: APIError in chat and anthropic, an error event in responses", async () => {
  const server = await sseServer({ e: [{ errorAfter: 2, errorCode: "server_error", errorMessage: "boom" }], a: [{ error_after: 1 }] });
  try {
    await assert.rejects(chatTexts(server, "e"), (e) => e instanceof OpenAI.APIError && e.constructor === OpenAI.APIError && e.status === undefined && e.message === "boom");
    const events = await responseEvents(server, "e");
    const last = events.at(-1);
    assert.ok(last?.type === "error");
    assert.deepEqual([last.code, last.message, last.sequence_number], ["server_error", "boom", 6]);
    assert.equal(deltas(events), "Hello world");
    await assert.rejects(oai(server, "e").responses.stream({ model: "m", input: "x" }).finalResponse(), (e) => !(e instanceof Error) && /** @type {{type?: string}} */ (e).type === "error");
    await assert.rejects(anthropicEvents(server, "a"), (e) => {
      assert.ok(e instanceof Anthropic.APIError && e.constructor === Anthropic.APIError && e.status === undefined);
      assert.deepEqual(e.error, { type: "error", error: { type: "overloaded_error", message: "Overloaded" } });
      return true;
    });
  } finally {
    await server.close();
  }
});

test("noTerminal: iteration ends without a throw; anthropic's finalMessage() rejects", async () => {
  const server = await sseServer({ n: [{ noTerminal: true }] });
  try {
    assert.equal((await chatTexts(server, "n")).join(""), TEXT);
    const events = await responseEvents(server, "n");
    assert.equal(events.length, 12);
    assert.equal(events.at(-1)?.type, "response.output_item.done");
    assert.equal((await anthropicEvents(server, "n")).at(-1)?.type, "message_delta");
    await assert.rejects(claude(server, "n").messages.stream({ model: "m", max_tokens: 5, messages: MESSAGES }).finalMessage(), Anthropic.AnthropicError);
  } finally {
    await server.close();
  }
});

test("endAfter ends the body cleanly mid-stream", async () => {
  const server = await sseServer({ n: [{ endAfter: 2 }] });
  try {
    assert.deepEqual(await chatTexts(server, "n"), ["", "Hello", " world"]);
    assert.equal(deltas(await responseEvents(server, "n")), "Hello world");
  } finally {
    await server.close();
  }
});

test("malformedAfter: SyntaxError from each dialect", async () => {
  const server = await sseServer({ m: [{ malformedAfter: 1 }] });
  try {
    await assert.rejects(chatTexts(server, "m"), SyntaxError);
    await assert.rejects(responseEvents(server, "m"), SyntaxError);
    await assert.rejects(anthropicEvents(server, "m"), SyntaxError);
  } finally {
    await server.close();
  }
});

test("oversizeAfter and sequenceBackAfter", async () => {
  const server = await sseServer({ o: [{ text: "a b", chunks: 2, oversizeAfter: 1, oversizeBytes: 100_000 }], s: [{ sequenceBackAfter: 2 }] });
  try {
    // role chunk, deltas, finish chunk
    assert.deepEqual(
      (await chatTexts(server, "o")).map((t) => t.length),
      [0, 1, 100_000, 2, 0],
    );
    const seqs = (await responseEvents(server, "s")).map((e) => e.sequence_number);
    assert.deepEqual(seqs, [0, 1, 2, 3, 4, 5, 4, 7, 8, 9, 10, 11, 12]);
  } finally {
    await server.close();
  }
});

test("stallAfter pauses, then the stream finishes", async () => {
  const server = await sseServer({ s: [{ stallAfter: 1, stallS: 0.3 }] });
  try {
    /** @type {number[]} */
    const arrivals = [];
    const stream = await oai(server, "s").chat.completions.create({ model: "m", messages: MESSAGES, stream: true });
    for await (const chunk of stream) if (chunk.choices[0]?.delta.content) arrivals.push(performance.now());
    assert.equal(arrivals.length, 5);
    assert.ok(/** @type {number} */ (arrivals[1]) - /** @type {number} */ (arrivals[0]) >= 250);
  } finally {
    await server.close();
  }
});

test("status 429: RateLimitError in both SDKs; the log has the Idempotency-Key", async () => {
  const server = await sseServer({ r: [{ status: 429, headers: { "retry-after": "1" } }, { text: "ok" }], q: [{ status: 429 }] });
  try {
    await assert.rejects(chatTexts(server, "r", [], { "Idempotency-Key": "key-1" }), (e) => {
      assert.ok(e instanceof OpenAI.RateLimitError);
      assert.equal(e.headers.get("retry-after"), "1");
      assert.equal(e.code, "rate_limit_exceeded");
      return true;
    });
    assert.equal((await chatTexts(server, "r")).join(""), "ok");
    assert.equal(server.count("r"), 2);
    assert.equal(server.requests[0]?.idempotencyKey, "key-1");
    assert.ok(/** @type {number} */ (server.requests[0]?.arrivedAt) <= /** @type {number} */ (server.requests[1]?.arrivedAt));
    await assert.rejects(anthropicEvents(server, "q"), (e) => {
      assert.ok(e instanceof Anthropic.RateLimitError);
      assert.deepEqual(e.error, { type: "error", error: { type: "rate_limit_error", message: "fake 429" } });
      return true;
    });
    await assert.rejects(responseEvents(server, "q"), OpenAI.RateLimitError);
  } finally {
    await server.close();
  }
});

test("the n-th request gets the n-th reply and the last repeats", async () => {
  const server = await sseServer({ p: [{ text: "one" }, { text: "two" }], q: [{ text: "other" }] });
  try {
    const got = [];
    for (let i = 0; i < 3; i += 1) got.push((await chatTexts(server, "p")).join(""));
    assert.deepEqual(got, ["one", "two", "two"]);
    assert.equal((await chatTexts(server, "q")).join(""), "other");
    assert.deepEqual([server.count("p"), server.count("q"), server.count()], [3, 1, 4]);
  } finally {
    await server.close();
  }
});
