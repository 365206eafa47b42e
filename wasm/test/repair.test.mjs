// Output checks and bounded repair through runWithPolicy (docs/REPAIR.md):
// verdicts judged by the core, refusals that never fall back, validators that
// break, and chains of repairs the core's replay verifies.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import * as rl from "../dist/index.js";
import { FakeClock } from "../dist/testing.js";
import { KEY, policyWith, referencePolicy } from "./helpers.mjs";

const { DecodeError, DriftError, RunStoppedError, UnrecognizedDispatchError, outputCheck, schemaCheck, runWithPolicy, verifyBundle, verifyRepairChain, requestSha256 } = rl;

const GOOD = '{"title":"disk full","severity":2}';
const MISSING = '{"title":"disk full"}';

/** A hand-written schema with zod's safeParse contract: title (string) and severity (integer) required. */
const summary = {
  /** @param {any} v */
  safeParse(v) {
    /** @type {{message: string, path: PropertyKey[]}[]} */
    const issues = [];
    if (typeof v !== "object" || v === null) return { success: false, error: { issues: [{ message: "Expected object", path: [] }] } };
    if (typeof v.title !== "string") issues.push({ message: "Required", path: ["title"] });
    if (!Number.isInteger(v.severity)) issues.push({ message: "Required", path: ["severity"] });
    return issues.length === 0 ? { success: true } : { success: false, error: { issues } };
  },
};

/** @param {string} text */
const request = (text) => ({ schema: "retryledger.request.v1", operation: "chat", input: [{ role: "user", content: text }] });

/** @param {number} [maxRepairs] @param {number} [share] */
const repairedPolicy = (maxRepairs = 2, share = 50) =>
  policyWith((p) => {
    p.repair = { max_repairs: maxRepairs, cost_share_percent: share };
  });

/** @param {...unknown} answers */
function script(...answers) {
  /** @type {any[]} */
  const steps = [];
  return {
    steps,
    /** @param {any} step */
    dispatch(step) {
      steps.push(step);
      const a = answers[steps.length - 1];
      if (a instanceof Error) throw a;
      return a;
    },
  };
}

/** @param {unknown} policy @param {(step: any) => unknown} dispatch @param {Record<string, unknown>} options */
function run(policy, dispatch, options) {
  const clock = new FakeClock();
  return runWithPolicy(/** @type {any} */ (policy), dispatch, { idempotencyKey: KEY, clock: clock.clock, sleep: clock.sleep, ...options });
}

/** @param {unknown} defects */
const defectsSha256 = (defects) => createHash("sha256").update(JSON.stringify(defects)).digest("hex");

test("a schema failure is invalid_output recorded by its digest", async () => {
  const s = script(MISSING);
  const err = await run(referencePolicy(), s.dispatch, { checks: [schemaCheck(summary, { validator: "summary" })] }).catch((e) => /** @type {any} */ (e));
  assert.ok(err instanceof RunStoppedError);
  assert.equal(err.code, "stop_non_retryable");
  const attempt = /** @type {any} */ (err.bundle.attempts.attempts[0]);
  assert.deepEqual(attempt.outcome, { class: "non_retryable", kind: "invalid_output" });
  assert.deepEqual(attempt.output_check, {
    defect_count: 1,
    defects_sha256: defectsSha256([{ message: "Required", path: "/severity" }]),
    kind: "schema",
    validator: "summary",
  });
  assert.equal(verifyBundle(err.sealed.bundle_json).kind, "verified");
});

test("unparsable JSON is its own check kind", async () => {
  const err = await run(referencePolicy(), script('{"title": ').dispatch, { checks: [schemaCheck(summary, { validator: "summary" })] }).catch((e) => /** @type {any} */ (e));
  assert.equal(err.bundle.attempts.attempts[0].output_check.kind, "unparsable_json");
});

test("a passing check completes and records nothing", async () => {
  const r = await run(referencePolicy(), script(GOOD).dispatch, { checks: [schemaCheck(summary, { validator: "summary" })] });
  assert.equal(r.result, GOOD);
  assert.equal(r.bundle.attempts.attempts[0]?.output_check, undefined);
});

test("a refusal stops on its route and never falls back", async () => {
  const s = script("refused", GOOD, GOOD);
  const refusal = outputCheck((o) => (o === "refused" ? ["I can't help with that."] : true), { validator: "refusal", kind: "refusal" });
  const err = await run(referencePolicy(), s.dispatch, { checks: [refusal] }).catch((e) => /** @type {any} */ (e));
  assert.equal(err.code, "stop_non_retryable");
  assert.equal(s.steps.length, 1);
  assert.equal(err.receipt.fallback_used, false);
  assert.equal(err.bundle.attempts.attempts[0].outcome.kind, "policy_denied");
});

test("a verdict that is not one is a coded error and the attempt is recorded", async () => {
  const s = script(GOOD, GOOD);
  const err = await run(referencePolicy(), s.dispatch, { checks: [outputCheck(() => 42, { validator: "broken" })] }).catch((e) => /** @type {any} */ (e));
  assert.ok(err instanceof UnrecognizedDispatchError);
  assert.ok(err.cause instanceof DecodeError);
  assert.equal(err.cause.code, "output_verdict_invalid");
  assert.equal(s.steps.length, 1);
  assert.equal(err.receipt.attempt_count, 1);
  assert.equal(err.bundle.attempts.attempts[0]?.outcome.class, "indeterminate");
});

test("defects over the bound are a coded error", async () => {
  const many = outputCheck(() => Array.from({ length: 65 }, (_, i) => `defect ${i}`), { validator: "many" });
  const err = await run(referencePolicy(), script(GOOD).dispatch, { checks: [many] }).catch((e) => /** @type {any} */ (e));
  assert.equal(err.cause?.code, "output_defects_over_bound");
});

/** @param {unknown} _output @param {unknown} defects */
const fix = (_output, defects) => request(`answer again; fix ${JSON.stringify(defects)}`);

test("one repair completes under its own request and key", async () => {
  const s = script(MISSING, GOOD);
  /** @type {unknown[][]} */
  const seen = [];
  const r = await run(repairedPolicy(), s.dispatch, {
    checks: [schemaCheck(summary, { validator: "summary" })],
    request: request("summarize"),
    repair: (/** @type {unknown} */ o, /** @type {unknown} */ d) => {
      seen.push([o, d]);
      return fix(o, d);
    },
  });
  assert.equal(r.result, GOOD);
  assert.deepEqual(seen, [[MISSING, [{ kind: "schema", validator: "summary", message: "Required", path: "/severity" }]]]);
  const [first, second] = s.steps;
  assert.deepEqual([first.repairOrdinal, second.repairOrdinal], [0, 1]);
  assert.deepEqual(first.request, request("summarize"));
  assert.equal(second.idempotencyKey, `${KEY}:repair:1`);
  const chain = /** @type {any} */ (r).chain;
  const [root, link] = chain.links;
  assert.equal(link.parent_request_sha256, root.bundle.policy.logical_request_sha256);
  assert.equal(link.bundle.policy.logical_request_sha256, requestSha256(second.request));
  assert.notEqual(link.bundle.policy.logical_request_sha256, root.bundle.policy.logical_request_sha256);
  assert.equal(link.bundle.policy.deadline_ms, 5000 - link.started_at_ms);
  assert.equal(link.bundle.policy.max_total_cost, 5000);
  const verdict = verifyRepairChain(chain);
  assert.equal(verdict.kind, "verified");
  assert.equal(verdict.kind === "verified" && verdict.repairs, 1);
});

test("repairs stop at max_repairs and the chain says so", async () => {
  const s = script(MISSING, MISSING, GOOD);
  const err = await run(repairedPolicy(1), s.dispatch, { checks: [schemaCheck(summary, { validator: "summary" })], repair: fix }).catch((e) => /** @type {any} */ (e));
  assert.ok(err instanceof RunStoppedError);
  assert.equal(s.steps.length, 2);
  assert.ok(/** @type {any} */ (err).repairRefused instanceof DriftError);
  assert.equal(/** @type {any} */ (err).repairRefused.code, "repair_over_budget");
  assert.deepEqual(/** @type {any} */ (err).chain.links.map((/** @type {any} */ l) => l.repair_ordinal), [undefined, 1]);
  assert.equal(verifyRepairChain(/** @type {any} */ (err).chain).kind, "verified");
});

test("a refusal is never repaired", async () => {
  const s = script("refused", GOOD);
  let repairs = 0;
  const refusal = outputCheck(() => "no", { validator: "refusal", kind: "refusal" });
  const err = await run(repairedPolicy(), s.dispatch, {
    checks: [refusal],
    repair: (/** @type {unknown} */ o, /** @type {any} */ d) => {
      repairs++;
      return fix(o, d);
    },
  }).catch((e) => /** @type {any} */ (e));
  assert.equal(repairs, 0);
  assert.equal(s.steps.length, 1);
  assert.equal(err.bundle.attempts.attempts[0].outcome.kind, "policy_denied");
});

for (const [name, repair] of /** @type {[string, (o: unknown, d: unknown) => unknown][]} */ ([
  [
    "throws",
    () => {
      throw new Error("repair bug");
    },
  ],
  ["returns a request that cannot be canonicalized", () => ({ schema: "retryledger.request.v1", operation: "chat", input: [], temperature: Number.NaN })],
])) {
  test(`a repair function that ${name} is a coded error with the chain`, async () => {
    const s = script(MISSING, GOOD);
    const err = await run(repairedPolicy(), s.dispatch, { checks: [schemaCheck(summary, { validator: "summary" })], repair }).catch((e) => /** @type {any} */ (e));
    assert.ok(err instanceof DecodeError);
    assert.equal(err.code, "repair_function_failed");
    assert.equal(/** @type {any} */ (err).chain.links.length, 1);
    assert.equal(/** @type {any} */ (err).chain.links[0].bundle.attempts.attempts.length, 1);
    assert.equal(s.steps.length, 1);
    assert.equal(verifyRepairChain(/** @type {any} */ (err).chain).kind, "verified");
  });
}

test("a JSON Schema failure through ajv (its compiled validator) is invalid_output", async () => {
  // ajv is in node_modules as a dependency of fastify (the receiver's tests).
  const Ajv = /** @type {any} */ ((await import("ajv")).default);
  const ajv = new Ajv({ allErrors: true });
  const validate = ajv.compile({ type: "object", required: ["title", "severity"], properties: { title: { type: "string" }, severity: { type: "integer" } } });
  const check = rl.ajvCheck(validate, { validator: "summary-schema" });
  assert.deepEqual(check.check(GOOD), { kind: "schema", validator: "summary-schema", verdict: "pass" });
  assert.equal(check.check('{"title": ').kind, "unparsable_json");
  const err = await run(referencePolicy(), script('{"title":"x","severity":"high"}').dispatch, { checks: [check] }).catch((e) => /** @type {any} */ (e));
  assert.equal(err.code, "stop_non_retryable");
  const attempt = err.bundle.attempts.attempts[0];
  assert.deepEqual(attempt.output_check, {
    defect_count: 1,
    defects_sha256: defectsSha256([{ message: "must be integer", path: "/severity" }]),
    kind: "schema",
    validator: "summary-schema",
  });
});
