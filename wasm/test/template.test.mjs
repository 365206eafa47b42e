// A policy template compiled once and bound per call gives buildPolicy's
// document and digest on every builder and preset vector; withPolicy takes a
// template, so a function is wrapped once at module level.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as rl from "../dist/index.js";

/** @type {{name: string, op: string, input: any, expect: any}[]} */
const cases = ["builder.json", "preset.json"]
  .flatMap((f) => JSON.parse(readFileSync(new URL(`../../tests/vectors/${f}`, import.meta.url), "utf8")).cases)
  .filter((c) => c.op === "build_policy" && "idempotency_key_sha256" in JSON.parse(c.input.spec));

test("enough cases", () => assert.ok(cases.length >= 30, String(cases.length)));

for (const c of cases) {
  test(`bind equals buildPolicy: ${c.name}`, () => {
    const spec = JSON.parse(c.input.spec);
    const key = spec.idempotency_key_sha256;
    delete spec.idempotency_key_sha256;
    let bound;
    try {
      bound = rl.compilePolicyTemplate(spec).bind(c.input.request, key);
    } catch (e) {
      assert.ok(c.expect.error, `template refused what buildPolicy accepts: ${/** @type {any} */ (e).code}`);
      assert.equal(/** @type {any} */ (e).code, c.expect.error.code);
      return;
    }
    assert.ok(c.expect.ok, "template accepted what buildPolicy refuses");
    assert.deepEqual(bound.policy, c.expect.ok);
    assert.equal(bound.digest, rl.digest(c.expect.ok));
    assert.equal(bound.policyJson, rl.buildPolicy(c.input.request, c.input.spec).policyJson);
  });
}

const template = rl.compilePolicyTemplate({
  schema: "retryledger.policy_spec.v1",
  preset: "interactive",
  routes: [
    { provider: "openai", model: "gpt-4.1-mini", base_url: "http://127.0.0.1:9/v1", price: { input: 400000, output: 1600000 } },
    { provider: "anthropic", model: "claude-3-5-haiku", base_url: "http://127.0.0.1:9/a", price: { input: 800000, output: 4000000 } },
  ],
});
/** @param {string} text */
const requestOf = (text) => ({ schema: /** @type {const} */ ("retryledger.request.v1"), operation: "chat", input: [text] });
class Unavailable extends Error {
  status = 503;
}
let now = 0;
/** @type {string[]} */
const sent = [];
const summarize = rl.withPolicy(template, (step, _signal, /** @type {string} */ text) => {
  sent.push(step.routeId);
  if (sent.length === 1) throw new Unavailable();
  return text.toUpperCase();
}, {
  idempotencyKey: (text) => `k-${text}`,
  request: requestOf,
  clock: () => now,
  sleep: async (ms) => { now += ms; },
});

test("withPolicy(template): wrapped once, each call bound to its request and key", async () => {
  const first = await summarize.run("a");
  assert.equal(first.result, "A");
  assert.deepEqual(sent, ["openai/gpt-4.1-mini", "openai/gpt-4.1-mini"]);
  const second = await summarize.run("b");
  assert.equal(first.bundle.policy.logical_request_sha256, rl.requestSha256(requestOf("a")));
  assert.equal(second.bundle.policy.logical_request_sha256, rl.requestSha256(requestOf("b")));
  assert.equal(second.bundle.policy.idempotency_key_sha256, rl.sha256Hex("k-b"));
  assert.equal(rl.verifyBundle(second.bundle).kind, "verified");
});

test("withPolicy(template) without a request is refused at wrap time", () => {
  assert.throws(() => rl.withPolicy(template, () => 1, { idempotencyKey: "k" }), TypeError);
});
