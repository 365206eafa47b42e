// The @anthropic-ai/sdk integration against a fake provider: a real HTTP
// server on 127.0.0.1 (test/loopback.mjs), scripted per route.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { anthropicDispatch, runWithAnthropic } from "../dist/anthropic.js";
import { KEY, referencePolicy } from "./helpers.mjs";
import { closedPort, gapsAfterHints, scriptedServer } from "./loopback.mjs";

/** @typedef {import("./loopback.mjs").Reply} Reply */

const BODY = { model: "claude-fake", max_tokens: 256, messages: [{ role: /** @type {const} */ ("user"), content: "summarize INC-4471" }] };

/** A Messages API success. @param {string} text @returns {Reply} */
const message = (text) => ({
  status: 200,
  body: {
    id: "msg_fake",
    type: "message",
    role: "assistant",
    model: "claude-fake",
    content: [{ type: "text", text }],
    stop_reason: "end_turn",
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 5 },
  },
});

/** A Messages API error. @param {number} status @param {string} type @param {Record<string, string>} [headers] @returns {Reply} */
const failure = (status, type, headers = {}) => ({ status, headers, body: { type: "error", error: { type, message: type } } });

/** Clients with no SDK retries, one per route of the reference policy. @param {string} base */
function clientsFor(base) {
  return {
    "private-primary": new Anthropic({ apiKey: "test-key", baseURL: `${base}/primary`, maxRetries: 0 }),
    "external-fallback": new Anthropic({ apiKey: "test-key", baseURL: `${base}/fallback`, maxRetries: 0 }),
  };
}

/** One messages.create call; charges the tokens and returns the text. @type {(client: Anthropic, options: import("../dist/anthropic.js").AnthropicRequestOptions, step: import("../dist/index.js").Step) => Promise<string>} */
async function summarize(client, options, step) {
  const msg = await client.messages.create(BODY, options);
  step.charge(msg.usage.input_tokens + msg.usage.output_tokens);
  const first = msg.content[0];
  return first?.type === "text" ? first.text : "";
}

/** @param {unknown} e @returns {rl.RunStoppedError} */
function stopped(e) {
  assert.ok(e instanceof rl.RunStoppedError, String(e));
  return e;
}

test("exercise 7, naive: a three-attempt harness over the SDK's default retries sends 3 x 3 = 9 requests", async () => {
  const provider = await scriptedServer({ primary: [failure(529, "overloaded_error", { "retry-after-ms": "20" })] });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: `${provider.base}/primary` });
    assert.equal(client.maxRetries, 2, "the SDK retries twice by default");
    let failures = 0;
    for (let attempt = 0; attempt < 3; attempt += 1) {
      try {
        await client.messages.create(BODY);
        break;
      } catch (e) {
        assert.ok(e instanceof Anthropic.OverloadedError);
        failures += 1;
      }
    }
    assert.equal(failures, 3);
    assert.equal(provider.seen.length, 9, "nine requests reached the provider for one logical call");
    console.log(`anthropic, naive harness with SDK retries: ${provider.seen.length} requests for one logical call`);
  } finally {
    await provider.close();
  }
});

test("exercise 7, refused: a client with SDK retries on is refused before any request", async () => {
  const provider = await scriptedServer({ primary: [message("never")], fallback: [message("never")] });
  try {
    const retrying = new Anthropic({ apiKey: "test-key", baseURL: `${provider.base}/primary` });
    const quiet = new Anthropic({ apiKey: "test-key", baseURL: `${provider.base}/fallback`, maxRetries: 0 });
    const refused = (/** @type {unknown} */ e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness";
    assert.throws(() => anthropicDispatch({ "private-primary": retrying, "external-fallback": quiet }, summarize), refused);
    await assert.rejects(runWithAnthropic(referencePolicy(), retrying, summarize, { idempotencyKey: KEY }), refused);
    const three = new Anthropic({ apiKey: "test-key", baseURL: `${provider.base}/primary`, maxRetries: 3 });
    await assert.rejects(runWithAnthropic(referencePolicy(), { "private-primary": quiet, "external-fallback": three }, summarize, { idempotencyKey: KEY }), refused);
    await assert.rejects(
      runWithAnthropic(referencePolicy(), { "private-primary": quiet }, summarize, { idempotencyKey: KEY }),
      /no anthropic client for route\(s\) external-fallback/,
    );
    assert.equal(provider.seen.length, 0);
  } finally {
    await provider.close();
  }
});

test("exercise 7, bound: 429 then 503 then the fallback, within the policy's bound, one Idempotency-Key, nothing before its Retry-After", async () => {
  const provider = await scriptedServer({
    primary: [failure(429, "rate_limit_error", { "retry-after": "1" }), failure(503, "api_error", { "retry-after-ms": "50" })],
    fallback: [message("summary")],
  });
  try {
    const policy = referencePolicy();
    const run = await runWithAnthropic(policy, clientsFor(provider.base), summarize, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.equal(run.receipt.terminal, "completed");
    assert.equal(run.receipt.fallback_used, true);
    assert.equal(run.receipt.final_route_id, "external-fallback");
    const seen = provider.seen;
    assert.ok(seen.length <= policy.max_total_attempts, `${seen.length} requests > bound ${policy.max_total_attempts}`);
    assert.deepEqual(
      seen.map((s) => [s.path, s.status]),
      [
        ["/primary/v1/messages", 429],
        ["/primary/v1/messages", 503],
        ["/fallback/v1/messages", 200],
      ],
    );
    for (const s of seen) assert.equal(s.idempotencyKey, KEY);
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => a.request_body_sha256),
      seen.map((s) => createHash("sha256").update(s.body).digest("hex")),
    );
    const gaps = gapsAfterHints(seen, assert.ok);
    assert.deepEqual(
      run.receipt.schedule.map((s) => [s.outcome, s.retry_after_floor_ms, s.delay_ms]),
      [
        ["rate_limited", 0, 0],
        ["unavailable", 1000, 1000],
        ["success", 50, 200],
      ],
    );
    assert.equal(rl.verifyBundle(run.bundle).kind, "verified");
    console.log(`anthropic with the helper: ${seen.length} requests (bound ${policy.max_total_attempts}), one Idempotency-Key, gaps ${gaps.map((g) => g.toFixed(0)).join(", ")} ms`);
  } finally {
    await provider.close();
  }
});

test("success on the first request: one request, the Idempotency-Key, the run's timeout", async () => {
  const provider = await scriptedServer({ primary: [message("summary")] });
  try {
    /** @type {import("../dist/anthropic.js").AnthropicRequestOptions[]} */
    const given = [];
    const run = await runWithAnthropic(
      referencePolicy(),
      clientsFor(provider.base),
      (client, options, step) => {
        given.push(options);
        return summarize(client, options, step);
      },
      { idempotencyKey: KEY },
    );
    assert.equal(run.result, "summary");
    assert.equal(run.receipt.terminal, "completed");
    assert.equal(run.receipt.fallback_used, false);
    assert.equal(run.receipt.attempt_count, 1);
    assert.deepEqual(provider.seen.map((s) => [s.path, s.idempotencyKey]), [["/primary/v1/messages", KEY]]);
    assert.equal(JSON.parse(/** @type {string} */ (provider.seen[0]?.body)).model, "claude-fake");
    const o = /** @type {import("../dist/anthropic.js").AnthropicRequestOptions} */ (given[0]);
    assert.equal(o.maxRetries, 0);
    assert.ok(o.timeout > 0 && o.timeout <= 5000, `timeout ${o.timeout}`);
    assert.ok(o.signal instanceof AbortSignal);
    assert.deepEqual(o.headers, { "Idempotency-Key": KEY });
  } finally {
    await provider.close();
  }
});

test("429 with retry-after-ms, then success on the same route, no request before the hint", async () => {
  const provider = await scriptedServer({ primary: [failure(429, "rate_limit_error", { "retry-after-ms": "250" }), message("summary")] });
  try {
    const run = await runWithAnthropic(referencePolicy(), clientsFor(provider.base), summarize, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.equal(run.receipt.fallback_used, false);
    assert.deepEqual(provider.seen.map((s) => s.status), [429, 200]);
    for (const s of provider.seen) assert.equal(s.idempotencyKey, KEY);
    gapsAfterHints(provider.seen, assert.ok);
    assert.deepEqual(
      run.receipt.schedule.map((s) => [s.outcome, s.retry_after_floor_ms, s.delay_ms]),
      [
        ["rate_limited", 0, 0],
        ["success", 250, 250],
      ],
    );
  } finally {
    await provider.close();
  }
});

test("529 overloaded twice on the primary, then the fallback route", async () => {
  const provider = await scriptedServer({ primary: [failure(529, "overloaded_error")], fallback: [message("from fallback")] });
  try {
    const run = await runWithAnthropic(referencePolicy(), clientsFor(provider.base), summarize, { idempotencyKey: KEY });
    assert.equal(run.result, "from fallback");
    assert.equal(run.receipt.fallback_used, true);
    assert.deepEqual(provider.seen.map((s) => [s.route, s.status]), [["primary", 529], ["primary", 529], ["fallback", 200]]);
    assert.deepEqual(run.bundle.attempts.attempts.map((a) => a.outcome), [
      { class: "retryable", kind: "unavailable" },
      { class: "retryable", kind: "unavailable" },
      { class: "success" },
    ]);
  } finally {
    await provider.close();
  }
});

test("a 400 stops the run without a retry", async () => {
  const provider = await scriptedServer({ primary: [failure(400, "invalid_request_error")], fallback: [message("never")] });
  try {
    await assert.rejects(runWithAnthropic(referencePolicy(), clientsFor(provider.base), summarize, { idempotencyKey: KEY }), (e) => {
      const s = stopped(e);
      assert.deepEqual(s.attempts.attempts.map((a) => a.outcome), [{ class: "non_retryable", kind: "invalid_request" }]);
      assert.ok(s.cause instanceof Anthropic.BadRequestError);
      return true;
    });
    assert.equal(provider.seen.length, 1);
  } finally {
    await provider.close();
  }
});

test("a refused connection (a closed port) is unavailable and retried, through the real SDK", async () => {
  const base = await closedPort();
  await assert.rejects(runWithAnthropic(referencePolicy(), clientsFor(base), summarize, { idempotencyKey: KEY }), (e) => {
    const s = stopped(e);
    const outcomes = s.attempts.attempts.map((a) => a.outcome);
    assert.ok(outcomes.length >= 2, "a connection that was never made is retried");
    for (const o of outcomes) assert.deepEqual(o, { class: "retryable", kind: "unavailable" });
    assert.ok(s.cause instanceof Anthropic.APIConnectionError);
    return true;
  });
});

test("the SDK's errors are judged by the core's tables", () => {
  const ctx = { nowUnixMs: 784111777000 };
  /** @param {number} status @param {Record<string, string>} [h] */
  const apiError = (status, h = {}) => Anthropic.APIError.generate(status, { type: "error", error: { type: "x", message: "x" } }, undefined, new Headers(h));
  const refused = Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
  const cases = /** @type {[unknown, unknown][]} */ ([
    [apiError(429, { "retry-after-ms": "250" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 250 }],
    [apiError(429, { "retry-after": "2" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 2000 }],
    [apiError(429, { "retry-after": "Sun, 06 Nov 1994 08:49:47 GMT" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 10_000 }],
    [apiError(529), { class: "retryable", kind: "unavailable" }],
    [apiError(529, { "retry-after": "1" }), { class: "retryable", kind: "unavailable", retry_after_ms: 1000 }],
    [apiError(500), { class: "retryable", kind: "unavailable" }],
    [apiError(503), { class: "retryable", kind: "unavailable" }],
    [apiError(501), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(408), { class: "retryable", kind: "timeout_before_response" }],
    [apiError(400), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(401), { class: "non_retryable", kind: "rejected" }],
    [apiError(403), { class: "non_retryable", kind: "policy_denied" }],
    [apiError(404), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(413), { class: "non_retryable", kind: "invalid_request" }],
    [new Anthropic.APIConnectionTimeoutError(), { class: "retryable", kind: "timeout_before_response" }],
    [new Anthropic.APIConnectionError({ cause: refused }), { class: "retryable", kind: "unavailable" }],
    [new Anthropic.APIConnectionError({ cause: Object.assign(new Error("reset"), { code: "ECONNRESET" }) }), { class: "indeterminate", kind: "unknown_provider_acceptance" }],
    // An abort by a signal that is not the caller's (the caller's is the `cancelled` rule) before the deadline.
    [new Anthropic.APIUserAbortError(), { class: "indeterminate", kind: "unknown_provider_acceptance" }],
  ]);
  assert.ok(apiError(429) instanceof Anthropic.RateLimitError);
  assert.ok(apiError(529) instanceof Anthropic.OverloadedError);
  assert.ok(apiError(529) instanceof Anthropic.InternalServerError);
  for (const [error, expected] of cases) {
    assert.deepEqual(rl.judge(rl.factsOf(error, ctx)).outcome, expected, String(error));
  }
});

test("the package's own name resolves: retryledger/anthropic alone loads the module in Node", async () => {
  const { execFileSync } = await import("node:child_process");
  const script = `
    const m = await import("retryledger/anthropic");
    let refused = "";
    try { m.assertNoSdkRetries({ maxRetries: 2 }); } catch (e) { refused = e.code; }
    m.assertNoSdkRetries({ maxRetries: 0 });
    console.log(refused, typeof m.runWithAnthropic, typeof m.anthropicDispatch);
  `;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: new URL("..", import.meta.url), encoding: "utf8" });
  assert.equal(out.trim(), "retry_owner_not_harness function function");
});
