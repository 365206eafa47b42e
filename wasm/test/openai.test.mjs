// The openai integration against a fake provider: a real HTTP server on
// 127.0.0.1, started here, scripted to answer 429 with Retry-After, then 503,
// then success on the fallback route.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";

import OpenAI from "openai";

import * as rl from "../dist/index.js";
import { openaiDispatch, runWithOpenAI } from "../dist/openai.js";
import { KEY, referencePolicy } from "./helpers.mjs";

/**
 * @typedef {{route: string, arrivedAt: number, respondedAt: number, status: number, idempotencyKey: string | undefined, retryAfterMs: number, body: string}} Seen
 */

/** The fake provider. Each server counts what it receives and answers from its script. */
async function fakeProvider() {
  /** @type {Seen[]} */
  const seen = [];
  let primaryCount = 0;
  const server = http.createServer((req, res) => {
    const arrivedAt = performance.now();
    let body = "";
    req.on("data", (chunk) => {
      body += chunk;
    });
    req.on("end", () => {
      const route = (req.url ?? "").startsWith("/primary/") ? "primary" : "fallback";
      const key = req.headers["idempotency-key"];
      /** @type {number} */
      let status;
      /** @type {Record<string, string>} */
      const headers = { "content-type": "application/json" };
      let retryAfterMs = 0;
      let payload;
      if (route === "primary") {
        primaryCount += 1;
        if (primaryCount === 1) {
          status = 429;
          headers["retry-after"] = "1";
          retryAfterMs = 1000;
          payload = { error: { message: "slow down", type: "rate_limit_exceeded" } };
        } else {
          status = 503;
          headers["retry-after-ms"] = "50";
          retryAfterMs = 50;
          payload = { error: { message: "overloaded", type: "server_error" } };
        }
      } else {
        status = 200;
        payload = {
          id: "chatcmpl-fake",
          object: "chat.completion",
          created: 1,
          model: JSON.parse(body || "{}").model ?? "fake",
          choices: [{ index: 0, message: { role: "assistant", content: "summary" }, finish_reason: "stop" }],
          usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
        };
      }
      // Stamped before sending: the client cannot see the response earlier.
      const respondedAt = performance.now();
      seen.push({ route, arrivedAt, respondedAt, status, idempotencyKey: Array.isArray(key) ? key.join(",") : key, retryAfterMs, body });
      res.writeHead(status, headers);
      res.end(JSON.stringify(payload));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  const base = `http://127.0.0.1:${address.port}`;
  return {
    seen,
    base,
    close: () => new Promise((resolve) => server.close(() => resolve(undefined))),
  };
}

const BODY = { model: "gpt-fake", messages: [{ role: /** @type {const} */ ("user"), content: "summarize INC-4471" }] };

test("a three-attempt harness over the SDK's default retries sends 3 x 3 = 9 requests for one logical call", async () => {
  const provider = await fakeProvider();
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/primary/v1` });
    assert.equal(client.maxRetries, 2, "the SDK retries twice by default");
    let failures = 0;
    for (let attempt = 0; attempt < 3; attempt += 1) {
      try {
        await client.chat.completions.create(BODY);
        break;
      } catch {
        failures += 1;
      }
    }
    assert.equal(failures, 3);
    assert.equal(provider.seen.length, 9, "nine requests reached the provider for one logical call");
    console.log(`naive harness with SDK retries: ${provider.seen.length} requests for one logical call`);
  } finally {
    await provider.close();
  }
});

test("with the helper: at most the policy's bound, one Idempotency-Key, nothing before its Retry-After, success on the fallback", async () => {
  const provider = await fakeProvider();
  try {
    const policy = referencePolicy();
    const clients = {
      "private-primary": new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/primary/v1`, maxRetries: 0 }),
      "external-fallback": new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/fallback/v1`, maxRetries: 0 }),
    };
    const run = await runWithOpenAI(
      policy,
      clients,
      async (client, options, step) => {
        const completion = await client.chat.completions.create(BODY, options);
        step.charge(completion.usage?.total_tokens ?? 0);
        return completion.choices[0]?.message.content;
      },
      { idempotencyKey: KEY },
    );
    assert.equal(run.result, "summary");
    assert.equal(run.receipt.terminal, "completed");
    assert.equal(run.receipt.fallback_used, true);
    assert.equal(run.receipt.final_route_id, "external-fallback");

    const seen = provider.seen;
    assert.ok(seen.length <= policy.max_total_attempts, `${seen.length} requests > bound ${policy.max_total_attempts}`);
    assert.deepEqual(
      seen.map((s) => [s.route, s.status]),
      [
        ["primary", 429],
        ["primary", 503],
        ["fallback", 200],
      ],
    );
    for (const s of seen) assert.equal(s.idempotencyKey, KEY);
    // Each attempt records the SHA-256 of the body the server received (the client's fetch is wrapped per attempt).
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => a.request_body_sha256),
      seen.map((s) => createHash("sha256").update(s.body).digest("hex")),
    );
    // Each request arrived no earlier than the previous response's Retry-After
    // (and the policy's backoff) allowed.
    const receipt = run.receipt.schedule;
    for (let i = 1; i < seen.length; i += 1) {
      const prev = /** @type {Seen} */ (seen[i - 1]);
      const cur = /** @type {Seen} */ (seen[i]);
      const gap = cur.arrivedAt - prev.respondedAt;
      const planned = /** @type {number} */ (receipt[i]?.delay_ms);
      assert.ok(planned >= prev.retryAfterMs, `planned delay ${planned} below Retry-After ${prev.retryAfterMs}`);
      assert.ok(gap >= prev.retryAfterMs, `request ${i + 1} came ${gap.toFixed(1)} ms after a Retry-After of ${prev.retryAfterMs} ms`);
    }
    assert.deepEqual(
      receipt.map((s) => [s.outcome, s.retry_after_floor_ms, s.delay_ms]),
      [
        ["rate_limited", 0, 0],
        ["unavailable", 1000, 1000],
        ["success", 50, 200],
      ],
    );
    assert.equal(rl.verifyBundle(run.bundle).kind, "verified");
    console.log(`with the helper: ${seen.length} requests (bound ${policy.max_total_attempts}), one Idempotency-Key, gaps ${seen.slice(1).map((s, i) => (s.arrivedAt - /** @type {Seen} */ (seen[i]).respondedAt).toFixed(0)).join(", ")} ms`);
  } finally {
    await provider.close();
  }
});

test("a client with SDK retries on is refused before any request", async () => {
  const provider = await fakeProvider();
  try {
    const retrying = new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/primary/v1` });
    const quiet = new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/fallback/v1`, maxRetries: 0 });
    assert.throws(
      () => openaiDispatch({ "private-primary": retrying, "external-fallback": quiet }, (c, o) => c.chat.completions.create(BODY, o)),
      (e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness",
    );
    await assert.rejects(
      runWithOpenAI(referencePolicy(), retrying, (c, o) => c.chat.completions.create(BODY, o), { idempotencyKey: KEY }),
      (e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness",
    );
    await assert.rejects(
      runWithOpenAI(referencePolicy(), { "private-primary": quiet }, (c, o) => c.chat.completions.create(BODY, o), { idempotencyKey: KEY }),
      /no openai client for route\(s\) external-fallback/,
    );
    assert.equal(provider.seen.length, 0);
  } finally {
    await provider.close();
  }
});

test("openai's errors are judged by the core's tables", () => {
  const ctx = { nowUnixMs: 784111777000 };
  /** @param {number} status @param {Record<string, string>} [h] */
  const apiError = (status, h = {}) => OpenAI.APIError.generate(status, { error: { message: "x" } }, undefined, new Headers(h));
  const cases = /** @type {[unknown, unknown][]} */ ([
    [apiError(429, { "retry-after-ms": "250" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 250 }],
    [apiError(429, { "retry-after": "2" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 2000 }],
    [apiError(429, { "retry-after": "Sun, 06 Nov 1994 08:49:47 GMT" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 10_000 }],
    [apiError(500), { class: "retryable", kind: "unavailable" }],
    [apiError(503, { "retry-after": "1" }), { class: "retryable", kind: "unavailable", retry_after_ms: 1000 }],
    [apiError(501), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(408), { class: "retryable", kind: "timeout_before_response" }],
    [apiError(400), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(401), { class: "non_retryable", kind: "rejected" }],
    [apiError(403), { class: "non_retryable", kind: "policy_denied" }],
    [apiError(404), { class: "non_retryable", kind: "invalid_request" }],
    [apiError(409), { class: "non_retryable", kind: "rejected" }],
    [apiError(422), { class: "non_retryable", kind: "invalid_request" }],
    [new OpenAI.APIConnectionTimeoutError(), { class: "retryable", kind: "timeout_before_response" }],
    [
      new OpenAI.APIConnectionError({ cause: Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("refused"), { code: "ECONNREFUSED" }) }) }),
      { class: "retryable", kind: "unavailable" },
    ],
    [new OpenAI.APIConnectionError({ cause: Object.assign(new Error("reset"), { code: "ECONNRESET" }) }), { class: "indeterminate", kind: "unknown_provider_acceptance" }],
    // An abort by a signal that is not the caller's (the caller's is the `cancelled` rule) before the deadline.
    [new OpenAI.APIUserAbortError(), { class: "indeterminate", kind: "unknown_provider_acceptance" }],
  ]);
  assert.ok(apiError(429) instanceof OpenAI.RateLimitError);
  assert.ok(apiError(500) instanceof OpenAI.InternalServerError);
  for (const [error, expected] of cases) {
    assert.deepEqual(rl.judge(rl.factsOf(error, ctx)).outcome, expected, String(error));
  }
  assert.equal(rl.judge(rl.factsOf(new Error("something else"), ctx)).rule, "unrecognized");
});

test("a refused connection is unavailable (retried), through the real SDK", async () => {
  const provider = await fakeProvider();
  const { base } = provider;
  await provider.close();
  const client = new OpenAI({ apiKey: "test-key", baseURL: `${base}/primary/v1`, maxRetries: 0 });
  await assert.rejects(
    runWithOpenAI(referencePolicy(), client, (c, o) => c.chat.completions.create(BODY, o), { idempotencyKey: KEY }),
    (e) => {
      assert.ok(e instanceof rl.RunStoppedError);
      const outcomes = e.attempts.attempts.map((a) => a.outcome);
      assert.deepEqual(outcomes[0], { class: "retryable", kind: "unavailable" });
      assert.ok(outcomes.length >= 2, "a connection that was never made is retried");
      return true;
    },
  );
});

test("the package's own names resolve: retryledger/openai alone loads the module in Node", async () => {
  const { execFileSync } = await import("node:child_process");
  const script = `
    const m = await import("retryledger/openai");
    let refused = "";
    try { m.assertNoSdkRetries({ maxRetries: 2 }); } catch (e) { refused = e.code; }
    const root = await import("retryledger");
    const o = root.judge(root.factsOf(Object.assign(new Error("x"), { status: 429, headers: new Headers({ "retry-after": "3" }) }))).outcome;
    console.log(refused, JSON.stringify(o), typeof root.runWithPolicy, typeof (await import("retryledger/web")).init);
  `;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: new URL("..", import.meta.url), encoding: "utf8" });
  assert.equal(out.trim(), 'retry_owner_not_harness {"class":"retryable","kind":"rate_limited","retry_after_ms":3000} function function');
});
