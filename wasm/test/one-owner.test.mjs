// One retry owner on every path that is given or can see the client: an
// openai client left at its default retries, physical requests counted on a
// loopback server. withPolicy given the client and the openai integration
// refuse it before any request; withPolicy without it cannot tell, and the
// server sees the SDK's own retries under each recorded attempt.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import * as rl from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";
import { scriptedServer } from "./loopback.mjs";

const template = rl.compilePolicyTemplate({
  schema: "retryledger.policy_spec.v1",
  preset: "interactive",
  routes: [{ route_id: "primary", provider: "openai", model: "gpt-4.1-mini", base_url: "http://127.0.0.1:9/primary/v1", price: { input: 400000, output: 1600000 } }],
});
const request = { schema: /** @type {const} */ ("retryledger.request.v1"), operation: "chat", input: ["hi"] };
const messages = [{ role: /** @type {const} */ ("user"), content: "hi" }];

async function server() {
  return scriptedServer({ primary: [{ status: 429, headers: { "retry-after-ms": "1" }, body: { error: { message: "slow down" } } }] });
}

/** @param {any} e */
const ownerRefused = (e) => e instanceof rl.PolicyError && /** @type {any} */ (e).code === "retry_owner_not_harness";

test("withPolicy given the client refuses it when wrapping", async () => {
  const s = await server();
  try {
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test" });
    assert.throws(() => rl.withPolicy(template, () => client.chat.completions.create({ model: "m", messages }),
      { idempotencyKey: "k", request, clients: [client] }), ownerRefused);
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("withPolicy refuses a client whose retries are turned on after wrapping", async () => {
  const s = await server();
  try {
    /** @type {Record<string, OpenAI>} */
    const clients = { primary: new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 0 }) };
    const f = rl.withPolicy(template, () => clients.primary?.chat.completions.create({ model: "m", messages }),
      { idempotencyKey: "k", request, clients });
    clients.primary = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test", maxRetries: 3 });
    await assert.rejects(f(), ownerRefused);
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("an unreadable client is refused", () => {
  assert.throws(() => rl.withPolicy(template, () => 1, { idempotencyKey: "k", request, clients: [{}] }), ownerRefused);
});

test("the openai integration refuses it before any request", async () => {
  const s = await server();
  try {
    const policy = template.bind(request, rl.sha256Hex("k"));
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test" });
    await assert.rejects(runWithOpenAI(policy, { primary: client }, (c, options) => c.chat.completions.create({ model: "m", messages }, options),
      { idempotencyKey: "k" }), ownerRefused);
    assert.equal(s.seen.length, 0);
  } finally {
    await s.close();
  }
});

test("withPolicy without the client cannot see its retries", async () => {
  const s = await server();
  let now = 0;
  try {
    const client = new OpenAI({ baseURL: `${s.base}/primary/v1`, apiKey: "sk-test" });
    const f = rl.withPolicy(template, () => client.chat.completions.create({ model: "m", messages }),
      { idempotencyKey: "k", request, clock: () => now, sleep: async (ms) => { now += ms; } });
    /** @type {any} */
    let stopped;
    await f().catch((e) => { stopped = e; });
    assert.ok(stopped instanceof rl.RunStoppedError);
    const attempts = stopped.bundle.attempts.attempts.length;
    // each recorded attempt hid the SDK's own retries: 3 requests per attempt
    assert.equal(s.seen.length, 3 * attempts);
  } finally {
    await s.close();
  }
});
