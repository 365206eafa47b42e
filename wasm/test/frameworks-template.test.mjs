// The framework adapters take a PolicyTemplate: compiled once, each call
// binds its own logical request (the adapter's request document of the
// call) and idempotency key, so the receipt of every call names that call's
// request and exactly the policy `buildPolicy` gives for it. Real parts: the
// AI SDK and LangChain.js over the real provider packages, against the
// loopback provider servers on 127.0.0.1.
import { test } from "node:test";
import assert from "node:assert/strict";

import { generateText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI } from "@langchain/openai";
import { HumanMessage } from "@langchain/core/messages";

import { buildPolicy, compilePolicyTemplate, digest, requestSha256, sha256Hex } from "../dist/index.js";
import { retryledgerModel, harnessOwned, aiSdkRequestDocument } from "../dist/ai-sdk.js";
import { RetryledgerChatModel, chatRequestDocument } from "../dist/langchain.js";
import { sseServer } from "./sse-loopback.mjs";

const ROUTE = "openai/gpt-fake";
const KEY = "frameworks-template-key";

/** @param {{url: (route: string) => string}} server */
const spec = (server) => ({
  schema: /** @type {const} */ ("retryledger.policy_spec.v1"),
  preset: /** @type {const} */ ("interactive"),
  routes: [{ provider: "openai", model: "gpt-fake", base_url: server.url("oa"), price: { input: 400000, output: 1600000 } }],
});

/** The receipt a framework result carries, its digest checked. @param {any} meta */
function receiptOf(meta) {
  assert.ok(meta !== undefined, "the result carries the retryledger metadata");
  assert.equal(meta.receipt_sha256, digest(meta.receipt));
  return meta.receipt;
}

test("AI SDK: a template binds each call's request and key; the policy is buildPolicy's", async () => {
  const server = await sseServer({ oa: [{ text: "first" }, { text: "second" }] });
  try {
    const real = createOpenAI({ baseURL: server.url("oa"), apiKey: "sk-loopback" }).chat("gpt-fake");
    /** @type {any[]} */
    const seen = [];
    const recording = {
      specificationVersion: real.specificationVersion,
      provider: real.provider,
      modelId: real.modelId,
      supportedUrls: real.supportedUrls,
      /** @param {any} o */
      doGenerate: (o) => (seen.push(o), real.doGenerate(o)),
      /** @param {any} o */
      doStream: (o) => (seen.push(o), real.doStream(o)),
    };
    const s = spec(server);
    const template = compilePolicyTemplate(s);
    const model = retryledgerModel({ routes: { [ROUTE]: recording }, policy: template, idempotencyKey: KEY });
    const receipts = [];
    for (const prompt of ["first question", "second question"]) {
      const r = await generateText({ model, prompt, ...harnessOwned() });
      receipts.push(receiptOf(r.providerMetadata?.retryledger));
    }
    assert.equal(server.count(), 2);
    assert.equal(seen.length, 2);
    for (const [i, receipt] of receipts.entries()) {
      const { abortSignal: _s, headers: _h, ...call } = seen[i];
      const request = aiSdkRequestDocument(call);
      assert.equal(receipt.logical_request_sha256, requestSha256(request), `call ${i} names its own request`);
      const built = buildPolicy(request, { ...s, idempotency_key_sha256: sha256Hex(KEY) });
      assert.equal(receipt.policy_sha256, built.digest, `call ${i} runs exactly buildPolicy's policy`);
    }
    assert.notEqual(receipts[0].logical_request_sha256, receipts[1].logical_request_sha256);
  } finally {
    await server.close();
  }
});

test("LangChain.js: a template binds each call's messages and key; the policy is buildPolicy's", async () => {
  const server = await sseServer({ oa: [{ status: 429, headers: { "retry-after-ms": "20" } }, { text: "fine" }, { text: "again" }] });
  try {
    const s = spec(server);
    const route = new ChatOpenAI({ model: "gpt-fake", apiKey: "sk-loopback", maxRetries: 0, configuration: { baseURL: server.url("oa") } });
    const model = new RetryledgerChatModel({ routes: { [ROUTE]: route }, policy: compilePolicyTemplate(s), idempotencyKey: KEY });
    const prompts = ["hello", "hello again"];
    const receipts = [];
    for (const prompt of prompts) receipts.push(receiptOf((await model.invoke(prompt)).response_metadata?.retryledger));
    assert.equal(server.count(), 3, "a 429 then success, then one more call");
    assert.equal(receipts[0].attempt_count + receipts[1].attempt_count, server.count());
    for (const [i, receipt] of receipts.entries()) {
      const request = chatRequestDocument([new HumanMessage(String(prompts[i]))], undefined);
      assert.equal(receipt.logical_request_sha256, requestSha256(request), `call ${i} names its own request`);
      const built = buildPolicy(request, { ...s, idempotency_key_sha256: sha256Hex(KEY) });
      assert.equal(receipt.policy_sha256, built.digest, `call ${i} runs exactly buildPolicy's policy`);
    }
  } finally {
    await server.close();
  }
});
