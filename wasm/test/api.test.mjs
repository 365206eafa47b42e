// The camelCase surface: plain objects or JSON text in, plain objects out,
// typed errors, and no input that panics or traps.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { KEY, referencePolicy } from "./helpers.mjs";

/** @typedef {import("../dist/index.js").Attempts} Attempts */

/** @type {Attempts} */
const EMPTY = { attempts: [], schema: "retryledger.attempts.v1" };

test("objects and JSON text give the same results", () => {
  const p = referencePolicy();
  assert.equal(rl.validatePolicy(p), rl.validatePolicy(JSON.stringify(p)));
  assert.equal(rl.validatePolicy(p), rl.digest(p));
  assert.deepEqual(rl.planNext(p, EMPTY), rl.planNext(JSON.stringify(p), JSON.stringify(EMPTY)));
  assert.equal(rl.sha256Hex(KEY), p.idempotency_key_sha256);
});

test("outputs are plain objects and numbers: no Map, no BigInt", () => {
  const d = rl.planNext(referencePolicy(), EMPTY);
  assert.equal(Object.getPrototypeOf(d), Object.prototype);
  for (const v of Object.values(d)) assert.notEqual(typeof v, "bigint");
  assert.equal(typeof rl.parseRetryAfter("retry-after", "2", 0, 60_000), "number");
  assert.equal(rl.parseRetryAfter("retry-after-ms", "250.1", 0, 60_000), 251);
  assert.equal(rl.parseRetryAfter("Retry-After", "99999999999999999999", 0, Number.MAX_SAFE_INTEGER), Number.MAX_SAFE_INTEGER);
});

test("duplicate keys are caught in JSON text", () => {
  const text = JSON.stringify(referencePolicy()).replace('"cost_unit":"micro_usd"', '"cost_unit":"micro_usd","cost_unit":"usd"');
  assert.throws(() => rl.validatePolicy(text), (e) => e instanceof rl.DecodeError && e.code === "duplicate_key" && e.path === "/cost_unit");
});

test("each family throws its own subclass with code, path and attempt index", () => {
  const p = referencePolicy();
  assert.throws(() => rl.validatePolicy("{"), (e) => e instanceof rl.DecodeError && e instanceof rl.RetryledgerError && e instanceof Error && e.code === "invalid_json" && e.family === "decode");
  const noRoutes = { ...p, routes: [] };
  assert.throws(() => rl.validatePolicy(noRoutes), (e) => e instanceof rl.PolicyError && e.code === "no_routes" && e.path === "/routes");
  const d = rl.planNext(p, EMPTY);
  assert.equal(d.kind, "dispatch");
  if (d.kind !== "dispatch") return;
  /** @type {Attempts} */
  const early = {
    schema: "retryledger.attempts.v1",
    attempts: [
      {
        completed_at_ms: 10,
        cost: 0,
        idempotency_key_sha256: d.idempotency_key_sha256,
        logical_request_sha256: d.logical_request_sha256,
        ordinal: 1,
        outcome: { class: "retryable", kind: "unavailable" },
        route_id: "external-fallback",
        route_ordinal: 1,
        route_release_sha256: d.route_release_sha256,
        started_at_ms: 0,
      },
    ],
  };
  assert.throws(
    () => rl.evaluate(p, early),
    (e) => e instanceof rl.DriftError && e.code === "route_drift" && e.path === "/attempts/0/route_id" && e.attemptIndex === 0,
  );
  assert.throws(() => rl.evaluate(p, EMPTY), (e) => e instanceof rl.RunError && e.code === "run_not_terminal");
  assert.throws(() => rl.parseRetryAfter("retry-after", "soon", 0, 1000), (e) => e instanceof rl.HttpError && e.code === "retry_after_invalid");
  assert.throws(() => rl.classifyHttp({ status: 600 }), (e) => e instanceof rl.HttpError && e.code === "invalid_status");
  assert.throws(() => rl.parseRetryAfter("retry-after", "1", 1.5, 1000), (e) => e instanceof rl.DecodeError && e.code === "float_value");
  assert.throws(() => rl.parseRetryAfter("retry-after", "1", -1, 1000), (e) => e instanceof rl.DecodeError && e.code === "integer_out_of_range");
  // @ts-expect-error a number where a string belongs
  assert.throws(() => rl.parseRetryAfter("retry-after", 5, 0, 1000), (e) => e instanceof rl.DecodeError && e.code === "invalid_type");
});

test("a tampered bundle is a drift verdict, not an exception", () => {
  const p = referencePolicy();
  /** @type {Attempts} */
  const attempts = {
    schema: "retryledger.attempts.v1",
    attempts: [],
    cancelled_at_ms: 7,
  };
  const bundle = rl.seal(p, attempts);
  assert.equal(bundle.receipt.terminal, "stop_cancelled");
  assert.equal(rl.verifyBundle(bundle).kind, "verified");
  const tampered = structuredClone(bundle);
  tampered.receipt.finished_at_ms = 8;
  const v = rl.verifyBundle(tampered);
  assert.equal(v.kind, "drift");
  if (v.kind === "drift") {
    assert.equal(v.code, "receipt_mismatch");
    assert.equal(v.path, "/receipt/finished_at_ms");
  }
});

test("values JSON cannot carry are decode errors", () => {
  // @ts-expect-error a BigInt is no document integer
  assert.throws(() => rl.digest({ schema: "retryledger.attempts.v1", attempts: [], cancelled_at_ms: 10n }), (e) => e instanceof rl.DecodeError && e.code === "invalid_type");
  assert.throws(() => rl.digest({ schema: "retryledger.attempts.v1", attempts: [], cancelled_at_ms: NaN }), (e) => e instanceof rl.DecodeError && e.code === "null_value");
  assert.throws(() => rl.digest({ schema: "retryledger.attempts.v1", attempts: [], cancelled_at_ms: 0.5 }), (e) => e instanceof rl.DecodeError && e.code === "float_value");
  // @ts-expect-error undefined is no document
  assert.throws(() => rl.digest(undefined), (e) => e instanceof rl.DecodeError && e.code === "invalid_type");
  /** @type {Record<string, unknown>} */
  const loop = {};
  loop["self"] = loop;
  // @ts-expect-error not a document
  assert.throws(() => rl.digest(loop), (e) => e instanceof rl.DecodeError);
});

/** A small deterministic generator. @param {number} seed */
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

test("hostile input never panics or traps: thousands of mutated documents come back as coded errors", () => {
  const random = rng(20261202);
  const base = JSON.stringify(referencePolicy());
  const seal = rl.seal(referencePolicy(), { schema: "retryledger.attempts.v1", attempts: [], cancelled_at_ms: 0 });
  const bundle = JSON.stringify(seal);
  const pieces = ["{", "}", "[", "]", '"', ",", ":", "null", "-0", "1e309", "9007199254740992", "\\ud800", "\u0000", "\uFEFF", "true", "ü", "😀", " "];
  const ops = [
    (/** @type {string} */ t) => rl.validatePolicy(t),
    (/** @type {string} */ t) => rl.planNext(base, t),
    (/** @type {string} */ t) => rl.planNext(t, '{"attempts":[],"schema":"retryledger.attempts.v1"}'),
    (/** @type {string} */ t) => rl.verifyBundle(t),
    (/** @type {string} */ t) => rl.digest(t),
    (/** @type {string} */ t) => rl.classifyHttp(t),
    (/** @type {string} */ t) => rl.parseRetryAfter("retry-after", t.slice(0, 70), 784111777000, 60_000),
  ];
  const counts = { ok: 0, coded: 0 };
  for (let i = 0; i < 3000; i += 1) {
    const src = i % 2 === 0 ? base : bundle;
    let t = src;
    const edits = 1 + Math.floor(random() * 4);
    for (let k = 0; k < edits; k += 1) {
      const at = Math.floor(random() * t.length);
      const kind = random();
      if (kind < 0.4) t = t.slice(0, at) + t.slice(at + 1 + Math.floor(random() * 8));
      else if (kind < 0.8) t = t.slice(0, at) + pieces[Math.floor(random() * pieces.length)] + t.slice(at);
      else t = t.slice(0, at);
    }
    const op = ops[i % ops.length];
    if (op === undefined) continue;
    try {
      op(t);
      counts.ok += 1;
    } catch (e) {
      assert.ok(e instanceof rl.RetryledgerError, `op ${i % ops.length} threw ${String(e)} for ${JSON.stringify(t.slice(0, 120))}`);
      assert.match(e.code, /^[a-z_]+$/);
      counts.coded += 1;
    }
  }
  // Deep nesting, huge input, every kind of scalar: coded errors too.
  for (const t of ["[".repeat(200_000), `"${"x".repeat(3 * 1024 * 1024)}"`, "", "0", '"x"', "[]", "{}", "\uFEFF{}", '{"schema":"retryledger.bundle.v1"}']) {
    for (const op of ops) {
      try {
        op(t);
      } catch (e) {
        assert.ok(e instanceof rl.RetryledgerError, String(e));
      }
    }
  }
  assert.ok(counts.coded > 2000);
  // The module still answers after all of it.
  assert.equal(rl.validatePolicy(base), rl.digest(base));
});

test("the Session refuses numbers that are not document integers, facts the core cannot decode, and drift, without trapping", () => {
  const compiled = rl.compilePolicy(referencePolicy());
  const session = compiled.session();
  try {
    const returned = { result: "returned" };
    for (const [o, code] of /** @type {[import("../dist/index.js").Observation, string][]} */ ([
      [{ started_at_ms: NaN, completed_at_ms: 0, facts: returned }, "float_value"],
      [{ started_at_ms: 0, completed_at_ms: Infinity, facts: returned }, "float_value"],
      [{ started_at_ms: 0, completed_at_ms: 1, cost: -5, facts: returned }, "integer_out_of_range"],
      [{ started_at_ms: 0, completed_at_ms: 1, cost: 2 ** 53, facts: returned }, "integer_out_of_range"],
      [{ started_at_ms: 0, completed_at_ms: 1, facts: { result: "raised", bogus: 1 } }, "unknown_field"],
      [{ started_at_ms: 0, completed_at_ms: 1, facts: { result: "raised", status: 700 } }, "invalid_status"],
      [{ started_at_ms: 0, completed_at_ms: 1, facts: '{"result":"raised","result":"raised"}' }, "duplicate_key"],
      [{ started_at_ms: 5, completed_at_ms: 1, facts: rl.RETURNED }, "completed_before_started"],
    ])) {
      assert.throws(
        () => session.observe(o),
        (e) => e instanceof rl.RetryledgerError && e.code === code,
        `${JSON.stringify(o)} -> ${code}`,
      );
    }
    // Nothing was recorded by the refused calls; the run goes on.
    assert.equal(session.terminal, null);
    assert.deepEqual(session.attempts, { attempts: [], schema: "retryledger.attempts.v1" });
    assert.throws(() => session.seal(), (e) => e instanceof rl.RunError && e.code === "run_not_terminal");
    assert.deepEqual(session.observe({ started_at_ms: 0, completed_at_ms: 10, facts: rl.RETURNED }), { outcome: { class: "success" }, rule: "returned" });
    assert.equal(session.terminal, "completed");
    assert.deepEqual(session.next(), { kind: "terminal", terminal: "completed" });
    assert.throws(
      () => session.observe({ started_at_ms: 10, completed_at_ms: 11, facts: rl.RETURNED }),
      (e) => e instanceof rl.DriftError && e.code === "attempt_after_terminal",
    );
    assert.equal(session.seal().receipt.terminal, "completed");
  } finally {
    session.free();
  }
});

test("the Session: next is planNext's document, observe returns the core's judgement, seal the bundle the core seals", () => {
  const compiled = rl.compilePolicy(referencePolicy());
  const session = compiled.session();
  try {
    assert.deepEqual(session.next(), rl.planNext(compiled, session.attempts));
    assert.equal(JSON.stringify(session.next()), compiled.planNextText(session.attempts));
    const j = session.observe({
      started_at_ms: 0,
      completed_at_ms: 1100,
      cost: 0,
      facts: { result: "raised", status: 429, headers: [["retry-after-ms", "250"]], error_types: ["RateLimitError"] },
    });
    assert.deepEqual(j, { outcome: { class: "retryable", kind: "rate_limited", retry_after_ms: 250 }, rule: "status" });
    assert.deepEqual(session.next(), rl.planNext(compiled, session.attempts));
    const second = /** @type {import("../dist/index.js").DispatchDecision} */ (session.next());
    assert.equal(second.not_before_ms, 1350);
    const k = session.observe({ started_at_ms: 1350, completed_at_ms: 1450, facts: JSON.stringify({ error_codes: ["ECONNREFUSED"], result: "raised" }) });
    assert.deepEqual(k, { outcome: { class: "retryable", kind: "unavailable" }, rule: "transport" });
    assert.equal(session.terminal, null);
    session.cancel(1500);
    assert.equal(session.terminal, "stop_cancelled");
    assert.deepEqual(session.next(), { kind: "terminal", terminal: "stop_cancelled" });
    const sealed = session.seal();
    assert.equal(sealed.terminal, "stop_cancelled");
    assert.deepEqual(sealed.bundle, compiled.seal(session.attempts));
    assert.equal(sealed.bundle_json, JSON.stringify(compiled.seal(session.attempts)));
    assert.equal(sealed.receipt_sha256, rl.digest(sealed.receipt));
    assert.equal(rl.verifyBundle(sealed.bundle_json).kind, "verified");
    assert.equal(sealed.bundle.attempts.cancelled_at_ms, 1500);
  } finally {
    session.free();
  }
});

test("judge and factsOf: the host's facts and the core's judgement", () => {
  assert.deepEqual(rl.judge({ result: "returned" }), { outcome: { class: "success" }, rule: "returned" });
  class APIError extends Error {}
  class APIConnectionError extends APIError {}
  const e = new APIConnectionError("connection error", { cause: Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("x"), { code: "ECONNREFUSED" }) }) });
  assert.deepEqual(rl.factsOf(e), {
    result: "raised",
    error_types: ["APIConnectionError", "APIError", "Error", "TypeError", "Error", "Error"],
    error_codes: ["ECONNREFUSED"],
  });
  assert.deepEqual(rl.judge(rl.factsOf(e)), { outcome: { class: "retryable", kind: "unavailable" }, rule: "transport" });
  // Status and the headers the core reads, from any common holder.
  for (const headers of [
    new Headers({ "Retry-After": "2", "x-other": "1" }),
    new Map([["Retry-After", "2"], ["x-other", "1"]]),
    { "Retry-After": "2", "x-other": "1" },
    [["Retry-After", "2"], ["x-other", "1"]],
  ]) {
    const f = rl.factsOf({ statusCode: 999, response: { status: 503, headers } });
    assert.equal(f.status, 503);
    assert.deepEqual(f.headers?.map(([k, v]) => [k.toLowerCase(), v]), [["retry-after", "2"]]);
  }
  // A DOMException's name is read too.
  assert.ok(rl.factsOf(new DOMException("t", "TimeoutError")).error_types?.includes("TimeoutError"));
  // The classify hook's answer is the explicit outcome; one that is not an outcome, or throws, is none.
  const rejected = /** @type {const} */ ({ class: "non_retryable", kind: "rejected" });
  assert.deepEqual(rl.factsOf(new Error("q"), { classify: () => rejected }).outcome, rejected);
  // @ts-expect-error not an outcome
  assert.equal(rl.factsOf(new Error("q"), { classify: () => ({ class: "nope" }) }).outcome, undefined);
  assert.equal(rl.factsOf(new Error("q"), { classify: () => { throw new Error("bug"); } }).outcome, undefined);
  assert.deepEqual(rl.factsOf(new Error("q"), { outputDelivered: true, cancelled: true, nowUnixMs: 5 }), {
    result: "raised",
    error_types: ["Error"],
    response_bytes_received: true,
    cancelled: true,
    now_unix_ms: 5,
  });
});

test("the generated tables are the core's", () => {
  assert.deepEqual(rl.READ_HEADERS.slice(0, 2), ["retry-after", "retry-after-ms"]);
  assert.ok(rl.READ_HEADERS.includes("x-ratelimit-reset-requests") && rl.READ_HEADERS.includes("anthropic-ratelimit-tokens-reset"));
  assert.ok(rl.TERMINALS.includes("stop_cancelled"));
  assert.equal(rl.ERROR_CODE_FAMILY.idempotency_key_drift, "drift");
  // A code the core throws maps to the error class of its family.
  assert.throws(() => rl.validatePolicy("{"), (x) => x instanceof rl.DecodeError && rl.ERROR_CODE_FAMILY[x.code] === "decode");
});
