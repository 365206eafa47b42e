// The fetch integration against a real HTTP server on 127.0.0.1
// (test/loopback.mjs), scripted per route, through Node's own fetch.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import * as rl from "../dist/index.js";
import { HttpStatusError, checkResponse, fetchDispatch, runWithFetch } from "../dist/fetch.js";
import { KEY, referencePolicy } from "./helpers.mjs";
import { closedPort, gapsAfterHints, scriptedServer } from "./loopback.mjs";

/** @typedef {import("./loopback.mjs").Reply} Reply */

/** @param {string} text @returns {Reply} */
const ok = (text) => ({ status: 200, body: { text } });
/** @param {number} status @param {Record<string, string>} [headers] @returns {Reply} */
const failure = (status, headers = {}) => ({ status, headers, body: { error: status } });

/** URL targets, one per route of the reference policy. @param {string} base */
const targetsFor = (base) => ({ "private-primary": `${base}/primary/summarize`, "external-fallback": new URL(`${base}/fallback/summarize`) });

const POST = { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ incident: "INC-4471" }) };

/** Reads the JSON body's text. @param {Response} response @returns {Promise<string>} */
const readText = async (response) => /** @type {{text: string}} */ (await response.json()).text;

/** @param {unknown} e @returns {rl.RunStoppedError} */
function stopped(e) {
  assert.ok(e instanceof rl.RunStoppedError, String(e));
  return e;
}

test("success: one POST with the Idempotency-Key and the caller's headers and body", async () => {
  const provider = await scriptedServer({ primary: [ok("summary")] });
  try {
    const run = await runWithFetch(referencePolicy(), targetsFor(provider.base), { idempotencyKey: KEY }, { init: POST, read: readText });
    assert.equal(run.result, "summary");
    assert.equal(run.receipt.terminal, "completed");
    assert.equal(run.receipt.attempt_count, 1);
    assert.deepEqual(provider.seen.map((s) => [s.path, s.idempotencyKey, s.body]), [["/primary/summarize", KEY, POST.body]]);
    // Without `read` the run's result is the Response.
    const raw = await runWithFetch(referencePolicy(), targetsFor(provider.base), { idempotencyKey: KEY });
    assert.ok(raw.result instanceof Response);
    assert.deepEqual(await raw.result.json(), { text: "summary" });
  } finally {
    await provider.close();
  }
});

test("429 with Retry-After, then 429 with retry-after-ms, then success: one Idempotency-Key, nothing before its hint", async () => {
  const provider = await scriptedServer({ primary: [failure(429, { "retry-after": "1" })], fallback: [failure(429, { "retry-after-ms": "300" }), ok("summary")] });
  try {
    const policy = referencePolicy();
    const run = await runWithFetch(policy, targetsFor(provider.base), { idempotencyKey: KEY }, { init: POST, read: readText });
    assert.equal(run.result, "summary");
    const seen = provider.seen;
    assert.ok(seen.length <= policy.max_total_attempts);
    for (const s of seen) assert.equal(s.idempotencyKey, KEY);
    // Each attempt records the SHA-256 of the body the server received.
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => a.request_body_sha256),
      seen.map((s) => createHash("sha256").update(s.body).digest("hex")),
    );
    const gaps = gapsAfterHints(seen, assert.ok);
    assert.deepEqual(
      run.receipt.schedule.map((s) => [s.route_id, s.outcome, s.retry_after_floor_ms, s.delay_ms]),
      [
        ["private-primary", "rate_limited", 0, 0],
        ["private-primary", "rate_limited", 1000, 1000],
        ["external-fallback", "rate_limited", 1000, 1000],
        ["external-fallback", "success", 300, 300],
      ],
    );
    console.log(`fetch: ${seen.length} requests (bound ${policy.max_total_attempts}), one Idempotency-Key, gaps ${gaps.map((g) => g.toFixed(0)).join(", ")} ms`);
  } finally {
    await provider.close();
  }
});

test("503 on the primary, then the fallback route", async () => {
  const provider = await scriptedServer({ primary: [failure(503, { "retry-after-ms": "50" })], fallback: [ok("from fallback")] });
  try {
    const run = await runWithFetch(referencePolicy(), targetsFor(provider.base), { idempotencyKey: KEY }, { init: POST, read: readText });
    assert.equal(run.result, "from fallback");
    assert.equal(run.receipt.fallback_used, true);
    assert.equal(run.receipt.final_route_id, "external-fallback");
    assert.deepEqual(provider.seen.map((s) => [s.route, s.status]), [["primary", 503], ["primary", 503], ["fallback", 200]]);
    assert.deepEqual(run.bundle.attempts.attempts.map((a) => a.outcome), [
      { class: "retryable", kind: "unavailable", retry_after_ms: 50 },
      { class: "retryable", kind: "unavailable", retry_after_ms: 50 },
      { class: "success" },
    ]);
    gapsAfterHints(provider.seen, assert.ok);
  } finally {
    await provider.close();
  }
});

test("a 400 stops the run without a retry; the error carries status, headers and the unread response", async () => {
  const provider = await scriptedServer({ primary: [failure(400, { "x-request-id": "r-1" })], fallback: [ok("never")] });
  try {
    await assert.rejects(runWithFetch(referencePolicy(), targetsFor(provider.base), { idempotencyKey: KEY }, { init: POST }), (e) => {
      const s = stopped(e);
      assert.deepEqual(s.attempts.attempts.map((a) => a.outcome), [{ class: "non_retryable", kind: "invalid_request" }]);
      const cause = s.cause;
      assert.ok(cause instanceof HttpStatusError);
      assert.equal(cause.status, 400);
      assert.ok(cause.headers instanceof Headers);
      assert.equal(cause.headers.get("x-request-id"), "r-1");
      assert.equal(cause.response.status, 400);
      assert.match(cause.message, /^HTTP 400 Bad Request from http:\/\/127\.0\.0\.1:\d+\/primary\/summarize$/);
      return true;
    });
    assert.equal(provider.seen.length, 1);
  } finally {
    await provider.close();
  }
});

test("a refused connection (a closed port) is unavailable and retried, from fetch's own error and its cause's code", async () => {
  const base = await closedPort();
  await assert.rejects(runWithFetch(referencePolicy(), targetsFor(base), { idempotencyKey: KEY }), (e) => {
    const s = stopped(e);
    const outcomes = s.attempts.attempts.map((a) => a.outcome);
    assert.ok(outcomes.length >= 2, "a connection that was never made is retried");
    for (const o of outcomes) assert.deepEqual(o, { class: "retryable", kind: "unavailable" });
    const facts = rl.factsOf(s.cause);
    assert.ok(facts.error_types?.includes("TypeError"));
    assert.ok(facts.error_codes?.includes("ECONNREFUSED"), JSON.stringify(facts));
    return true;
  });
});

test("a function target makes its own request with the options it is given; the helper checks the status", async () => {
  const provider = await scriptedServer({ primary: [failure(500), ok("summary")] });
  try {
    /** @type {import("../dist/fetch.js").FetchRequestOptions[]} */
    const given = [];
    const dispatch = fetchDispatch(
      (options, step) => {
        given.push(options);
        return fetch(`${provider.base}/primary/${step.routeId}/${step.ordinal}`, { headers: options.headers, signal: options.signal });
      },
      { read: readText },
    );
    const run = await rl.runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY });
    assert.equal(run.result, "summary");
    assert.deepEqual(provider.seen.map((s) => [s.path, s.status, s.idempotencyKey]), [
      ["/primary/private-primary/1", 500, KEY],
      ["/primary/private-primary/2", 200, KEY],
    ]);
    for (const o of given) {
      assert.equal(o.idempotencyKey, KEY);
      assert.deepEqual(o.headers, { "Idempotency-Key": KEY });
      assert.ok(o.timeout > 0 && o.timeout <= 5000);
    }
  } finally {
    await provider.close();
  }
});

test("HttpStatusError's facts go through the core's HTTP rules", () => {
  const ctx = { nowUnixMs: 784111777000 };
  /** @param {number} status @param {Record<string, string>} [headers] */
  const error = (status, headers = {}) => {
    try {
      checkResponse(new Response(null, { status, headers }));
    } catch (e) {
      return e;
    }
    assert.fail(`status ${status} passed`);
  };
  const cases = /** @type {[unknown, unknown][]} */ ([
    [error(429, { "retry-after-ms": "250" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 250 }],
    [error(429, { "retry-after": "2" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 2000 }],
    [error(429, { "retry-after": "Sun, 06 Nov 1994 08:49:47 GMT" }), { class: "retryable", kind: "rate_limited", retry_after_ms: 10_000 }],
    [error(503, { "retry-after": "1" }), { class: "retryable", kind: "unavailable", retry_after_ms: 1000 }],
    [error(529), { class: "retryable", kind: "unavailable" }],
    [error(501), { class: "non_retryable", kind: "invalid_request" }],
    [error(408), { class: "retryable", kind: "timeout_before_response" }],
    [error(400), { class: "non_retryable", kind: "invalid_request" }],
    [error(401), { class: "non_retryable", kind: "rejected" }],
    [error(403), { class: "non_retryable", kind: "policy_denied" }],
    [error(302), { class: "non_retryable", kind: "protocol_violation" }],
  ]);
  for (const [e, expected] of cases) {
    assert.ok(e instanceof HttpStatusError);
    assert.deepEqual(rl.judge(rl.factsOf(e, ctx)).outcome, expected, String(e));
  }
  const fine = new Response("x", { status: 200 });
  assert.equal(checkResponse(fine), fine);
});

test("a route without a target is refused before any request", async () => {
  await assert.rejects(runWithFetch(referencePolicy(), { "private-primary": "http://127.0.0.1:9/x" }, { idempotencyKey: KEY }), /no fetch target for route\(s\) external-fallback/);
});

test("the package's own name resolves: retryledger/fetch alone loads the module in Node", async () => {
  const { execFileSync } = await import("node:child_process");
  const script = `
    const m = await import("retryledger/fetch");
    const root = await import("retryledger");
    let o;
    try { m.checkResponse(new Response(null, { status: 429, headers: { "retry-after": "3" } })); } catch (e) { o = root.judge(root.factsOf(e)).outcome; }
    console.log(JSON.stringify(o), typeof m.runWithFetch, typeof m.fetchDispatch);
  `;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: new URL("..", import.meta.url), encoding: "utf8" });
  assert.equal(out.trim(), '{"class":"retryable","kind":"rate_limited","retry_after_ms":3000} function function');
});
