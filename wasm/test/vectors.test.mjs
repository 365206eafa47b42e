// The conformance vectors (../tests/vectors/*.json), read in place: every case
// through the package's public functions on the wasm-opt'd module (the
// driver cases, op `drive`, replay in drivers.test.mjs; tables.json holds no
// cases: it generates ts/tables.ts). The
// result, serialized as it comes back (JSON.stringify keeps the core's key
// order), must equal the expected output in RFC 8785 form byte for byte;
// error codes and paths are compared exactly.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as rl from "../dist/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = path.resolve(here, "../../tests/vectors");

/** @param {unknown} x @returns {string} */
function canonical(x) {
  if (Array.isArray(x)) return `[${x.map(canonical).join(",")}]`;
  if (typeof x === "object" && x !== null) {
    const o = /** @type {Record<string, unknown>} */ (x);
    return `{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(x);
}

/** @param {string} op @param {Record<string, any>} input @returns {unknown} */
function run(op, input) {
  switch (op) {
    case "validate_policy":
      return rl.validatePolicy(input.policy);
    case "plan_next":
      return rl.planNext(input.policy, input.attempts);
    case "evaluate":
      return rl.evaluate(input.policy, input.attempts);
    case "verify_bundle":
      return rl.verifyBundle(input.bundle);
    case "digest":
      return rl.digest(input.document);
    case "parse_retry_after":
      return rl.parseRetryAfter(input.header, input.value, input.now_unix_ms, input.cap_ms);
    case "classify_http":
      return rl.classifyHttp(input.observation);
    case "judge":
      return rl.judge(input.facts);
    case "canonical_request":
      return rl.canonicalRequest(input.request);
    case "check_price_schedule":
      return rl.checkPriceSchedule(input.policy, input.schedule);
    case "price_cost":
      return rl.priceCost(input.schedule, input.route_release_sha256, input.usage);
    case "lift_request":
      return rl.liftRequest(input.call, input.params);
    case "build_policy":
      return rl.buildPolicy(input.request, input.spec).policy;
    case "request_sha256":
      return rl.requestSha256(input.request);
    case "idempotency_key_sha256":
      return rl.idempotencyKeySha256(
        input.key,
        input.tenant === undefined && input.operation === undefined ? undefined : { tenant: input.tenant, operation: input.operation },
      );
    case "stream_session":
      return streamSession(input.policy, input.script);
    default:
      throw new Error(`unknown op ${op}`);
  }
}

/**
 * A scripted streamed session, replayed as the core's `drive_stream` does
 * (core/src/lab.rs): each step cancels at the last completion, or starts at
 * the planned `not_before_ms` (never before the last completion) plus
 * `lag_ms`, completes `duration_ms` later and is observed with its facts and
 * deltas; then the sealed bundle's digest and its replay's verdict.
 * @param {string} policy @param {string} script
 */
function streamSession(policy, script) {
  const compiled = new rl.CompiledPolicy(policy);
  const session = compiled.session();
  try {
    const judgements = [];
    const decisions = [];
    let now = 0;
    for (const step of JSON.parse(script)) {
      if (step.cancel !== undefined) {
        session.cancel(now);
        decisions.push(session.next());
        continue;
      }
      const d = session.next();
      const notBefore = d.kind === "dispatch" ? d.not_before_ms : now;
      const started = Math.max(notBefore, now) + (step.lag_ms ?? 0);
      now = started + (step.duration_ms ?? 0);
      const facts = step.facts === undefined ? "null" : JSON.stringify(step.facts);
      judgements.push(session.observe({ started_at_ms: started, completed_at_ms: now, cost: step.cost, facts, deltas: step.deltas ?? [] }));
      decisions.push(session.next());
    }
    const sealed = session.seal();
    const bundleJson = sealed.bundle_json;
    return {
      bundle_sha256: rl.digest(bundleJson),
      decisions,
      judgements,
      receipt: sealed.receipt,
      stream_events: sealed.bundle.stream_events ?? null,
      verdict: rl.verifyBundle(bundleJson),
    };
  } finally {
    session.free();
    compiled.free();
  }
}

/** The files of single-operation cases (not the driver scripts, not the tables). */
const files = fs.existsSync(dir)
  ? fs
      .readdirSync(dir)
      .filter((f) => f.endsWith(".json") && f !== "tables.json" && f !== "drivers.json")
      .sort()
  : [];

test("the vectors are there (never pass vacuously)", () => {
  assert.ok(files.length > 0, `no vector files in ${dir}`);
});

let total = 0;
for (const file of files) {
  const doc = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
  assert.equal(doc.schema, "retryledger.vectors.v1", `${file}: schema`);
  assert.ok(Array.isArray(doc.cases) && doc.cases.length > 0, `${file}: no cases`);
  total += doc.cases.length;
  test(`vectors ${file} (${doc.family}, ${doc.cases.length} cases)`, async (t) => {
    for (const c of doc.cases) {
      await t.test(c.name, () => {
        if ("ok" in c.expect) {
          const got = run(c.op, c.input);
          assert.equal(JSON.stringify(got), canonical(c.expect.ok));
        } else {
          let thrown;
          try {
            run(c.op, c.input);
          } catch (e) {
            thrown = e;
          }
          assert.ok(thrown instanceof rl.RetryledgerError, `expected ${c.expect.error.code}, got ${String(thrown)}`);
          assert.equal(thrown.code, c.expect.error.code);
          assert.equal(thrown.path, c.expect.error.path);
        }
      });
    }
  });
}

test("every vector case ran", () => {
  assert.ok(total >= 500, `only ${total} cases found`);
  console.log(`vectors: ${total} cases in ${files.length} files`);
});
