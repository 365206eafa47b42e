// A call that sends another request than the one its policy binds is refused
// before it is sent (`request_drift`): the openai and anthropic integrations
// lift each SDK call's body as it is about to go out and the core compares it
// with the request the template bound. Physical requests are counted on a
// loopback server.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import * as rl from "../dist/index.js";
import { openaiChatStream, runStreamWithOpenAI, runWithOpenAI } from "../dist/openai.js";
import { runWithAnthropic } from "../dist/anthropic.js";
import { scriptedServer } from "./loopback.mjs";

/** @type {import("../dist/index.js").PolicySpec} */
const spec = {
  schema: "retryledger.policy_spec.v1",
  preset: "interactive",
  routes: [{ route_id: "primary", provider: "openai", model: "gpt-4.1-mini", base_url: "http://127.0.0.1:9/primary/v1", price: { input: 400000, output: 1600000 } }],
};
const template = rl.compilePolicyTemplate(spec);
const bound = [{ role: /** @type {const} */ ("user"), content: "Summarize the incident." }];
const other = [{ role: /** @type {const} */ ("user"), content: "Write a poem instead." }];
const chat = rl.liftRequest("openai.chat.completions", { model: "gpt-4.1-mini", messages: bound });
const completion = { id: "c1", object: "chat.completion", created: 1, model: "gpt-4.1-mini", choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: "ok" } }] };

async function server() {
  return scriptedServer({ primary: [{ status: 200, body: completion }] });
}

/** @param {any} e */
const drifted = (e) => e instanceof rl.DriftError && /** @type {any} */ (e).code === "request_drift";

test("the openai integration refuses another prompt before sending it", async () => {
  const s = await server();
  try {
    const policy = template.bind(chat, rl.sha256Hex("k"));
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 0 });
    await assert.rejects(
      runWithOpenAI(policy, { primary: client }, (c, options) => c.chat.completions.create({ model: "gpt-4.1-mini", messages: other }, options), { idempotencyKey: "k" }),
      (/** @type {any} */ e) => drifted(e) && e.path === "/input" && e.message.includes(rl.requestSha256(chat)),
    );
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("the bound prompt is sent, under any model", async () => {
  const s = await server();
  try {
    const policy = template.bind(chat, rl.sha256Hex("k"));
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 0 });
    const result = await runWithOpenAI(policy, { primary: client }, (c, options) => c.chat.completions.create({ model: "other", messages: bound }, options), { idempotencyKey: "k" });
    assert.equal(result.receipt.terminal, "completed");
    assert.equal(s.seen.length, 1);
  } finally {
    await s.close();
  }
});

test("a stream with another prompt is refused", async () => {
  const s = await server();
  try {
    const streaming = rl.compilePolicyTemplate({ ...spec, stream: { mode: /** @type {const} */ ("buffer"), max_response_bytes: 1 << 20 } });
    const policy = streaming.bind(chat, rl.sha256Hex("k"));
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 0 });
    const run = runStreamWithOpenAI(policy, { primary: client }, openaiChatStream({ model: "gpt-4.1-mini", messages: other }), { idempotencyKey: "k" });
    await assert.rejects(async () => {
      for await (const _ of /** @type {any} */ (run)) {
        // drained
      }
    }, drifted);
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("the anthropic integration refuses another prompt", async () => {
  const s = await server();
  try {
    const request = rl.liftRequest("anthropic.messages", { model: "claude-x", max_tokens: 64, messages: bound });
    const policy = template.bind(request, rl.sha256Hex("k"));
    const client = new Anthropic({ baseURL: `${s.base}/primary`, apiKey: "sk-test", maxRetries: 0 });
    await assert.rejects(
      runWithAnthropic(policy, { primary: client }, (c, options) => c.messages.create({ model: "claude-x", max_tokens: 64, messages: other }, options), { idempotencyKey: "k" }),
      (/** @type {any} */ e) => drifted(e) && e.path === "/input",
    );
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("a request written by hand is not compared", async () => {
  const s = await server();
  try {
    const policy = template.bind({ schema: "retryledger.request.v1", operation: "chat", input: ["hi"] }, rl.sha256Hex("k"));
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 0 });
    const result = await runWithOpenAI(policy, { primary: client }, (c, options) => c.chat.completions.create({ model: "m", messages: other }, options), { idempotencyKey: "k" });
    assert.equal(result.receipt.terminal, "completed");
    assert.equal(s.seen.length, 1);
  } finally {
    await s.close();
  }
});
