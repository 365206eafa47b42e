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
import * as receiver from "../dist/receiver.js";

const encoder = new TextEncoder();

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
    case "next_repair":
      return rl.nextRepair(input.links, input.request_sha256, input.idempotency_key_sha256, input.started_at_ms);
    case "verify_repair_chain":
      return rl.verifyRepairChain(input.chain);
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
    case "bind_policy_template": {
      const bound = rl.compilePolicyTemplate(input.spec).bind(input.request, input.idempotency_key_sha256);
      return { policy: bound.policy, policy_sha256: bound.digest };
    }
    case "request_sha256":
      return rl.requestSha256(input.request);
    case "idempotency_key_sha256":
      return rl.idempotencyKeySha256(
        input.key,
        input.tenant === undefined && input.operation === undefined ? undefined : { tenant: input.tenant, operation: input.operation },
      );
    case "stream_session":
      return streamSession(input.policy, input.script);
    case "breaker_admit":
      return rl.breakerAdmit(input.config, input.snapshot, input.now_epoch_ms);
    case "breaker_record":
      return rl.breakerRecord(input.config, input.snapshot, input.probe, input.outcome, input.now_epoch_ms);
    case "budget_deposit":
      return rl.budgetDeposit(input.config, input.snapshot, input.now_epoch_ms);
    case "budget_withdraw":
      return rl.budgetWithdraw(input.config, input.snapshot, input.now_epoch_ms);
    case "fleet_session":
      return fleetSession(input.policy, input.store, input.script);
    case "admission_admit":
      return rl.admissionAdmit(input.config, input.snapshot, input.now_epoch_ms, input.queued_since_epoch_ms, input.tokens, input.tenant);
    case "admission_release":
      return rl.admissionRelease(input.config, input.snapshot, input.now_epoch_ms, input.reserved, input.used);
    case "admission_observe":
      return rl.admissionObserve(input.config, input.snapshot, input.headers, input.now_epoch_ms);
    case "priced_session":
      return streamSession(input.policy, input.script, input.schedule);
    case "hedge_session":
      return hedgeSession(input.policy, input.script);
    case "job_session":
      return streamSession(input.policy, input.script, undefined, true);
    case "machine":
      return rl.machineTranscript(input.policy, input.options, input.journal, input.events);
    case "key_pool_select":
      return rl.keyPoolSelect(input.config, input.snapshot, input.now_epoch_ms, input.affinity);
    case "key_pool_record":
      return rl.keyPoolRecord(input.config, input.snapshot, input.key_sha256, input.outcome, input.now_epoch_ms, input.status);
    case "key_sha256":
      return rl.keySha256(input.secret);
    case "check_idempotency_header":
      receiver.checkIdempotencyHeader(input.raw);
      return null;
    case "http_request_sha256":
      return receiver.httpRequestSha256(input.method, input.target, encoder.encode(input.body));
    case "http_response_sha256":
      return receiver.httpResponseSha256(input.status, JSON.parse(input.headers), encoder.encode(input.body));
    case "journal_verify":
      return rl.journalVerify(input.policy, input.events);
    case "journal_recover":
      return rl.journalRecover(input.policy, input.events, input.reconciliation);
    case "journal_append":
      return rl.journalAppend(input.policy, input.events, input.lease_generation, input.entry);
    case "journal_classify":
      return rl.journalClassify(input.policy, input.events, input.event);
    case "idempotency_claim":
      return rl.idempotencyClaim(input.retention, input.record ?? null, input.request, input.now_epoch_ms);
    case "idempotency_complete":
      return rl.idempotencyComplete(input.retention, input.record, input.completion, input.now_epoch_ms);
    case "lower_request":
      return rl.lowerRequest(input.request, input.release, input.options);
    case "route_capabilities":
      return rl.routeCapabilities(input.request, input.spec);
    default:
      throw new Error(`unknown op ${op}`);
  }
}

/**
 * A scripted session, replayed as the core's `drive` does (core/src/lab.rs):
 * each step cancels at the last completion, or starts at the planned
 * `not_before_ms` (never before the last completion) plus `lag_ms`,
 * completes `duration_ms` later and is observed with its facts and deltas
 * (after its usage reports and request body digest, in a priced session);
 * then the sealed bundle's digest and its replay's verdict.
 * @param {string} policy @param {string} script @param {string} [schedule]
 */
function streamSession(policy, script, schedule, jobs = false) {
  const compiled = new rl.CompiledPolicy(policy);
  const session = compiled.session();
  try {
    if (schedule !== undefined) session.setPriceSchedule(schedule);
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
      for (const usage of step.usage ?? []) session.addUsage(usage);
      if (step.request_body_sha256 !== undefined) session.setRequestBodySha256(step.request_body_sha256);
      if (step.job !== undefined) session.setJob(step.job.id, step.job.status);
      if (step.reconciled !== undefined) session.setReconciled(step.reconciled);
      judgements.push(session.observe({ started_at_ms: started, completed_at_ms: now, cost: step.cost, facts, deltas: step.deltas ?? [] }));
      decisions.push(session.next());
    }
    const sealed = session.seal();
    const bundleJson = sealed.bundle_json;
    if (schedule !== undefined || jobs) {
      // The bundle object and its canonical JSON agree.
      assert.equal(rl.digest(JSON.stringify(sealed.bundle)), rl.digest(bundleJson));
      return {
        attempts: sealed.bundle.attempts,
        bundle_sha256: rl.digest(bundleJson),
        decisions,
        judgements,
        receipt: sealed.receipt,
        verdict: rl.verifyBundle(bundleJson),
      };
    }
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

/**
 * A scripted hedged session, replayed as the core's `hedge::script` does
 * (core/src/hedge.rs) through the package's `HedgeSession`: each step is an
 * event at its run-clock time (`start`, `observe` with facts, `cancelled`,
 * `cancel_run`); then the attempts, receipt, sealed bundle's digest and its
 * replay's verdict.
 * @param {string} policy @param {string} script
 */
function hedgeSession(policy, script) {
  const session = new rl.HedgeSession(policy);
  try {
    const next = session.next();
    const steps = [];
    for (const step of JSON.parse(script)) {
      const at = step.at ?? 0;
      if (step.start !== undefined) steps.push({ step: session.startAttempt(step.start, at) });
      else if (step.observe !== undefined) steps.push(session.observe(step.observe, at, step.facts, step.cost));
      else if (step.cancelled !== undefined) steps.push({ step: session.cancelled(step.cancelled, at) });
      else {
        session.cancel(step.cancel_run);
        steps.push({ step: session.next() });
      }
    }
    const { bundle, bundle_json } = session.seal();
    return {
      attempts: bundle.attempts,
      bundle_sha256: rl.digest(bundle_json),
      next,
      receipt: bundle.receipt,
      steps,
      verdict: rl.verifyBundle(bundle_json),
    };
  } finally {
    session.free();
  }
}

/**
 * A scripted fleet session, replayed as the core's `fleet_session` does
 * (core/src/lab.rs), through the package's `Fleet` over a `MemoryStore`
 * seeded with the vector's store: `admit` steps read the view and write back
 * with compare-and-set at the step's wall clock (`store_down`: the store
 * throws), `observe` steps observe and record the breaker at the admission's
 * wall clock plus the duration, `set` steps are another process's write.
 * @param {string} policy @param {string} storeJson @param {string} script
 */
async function fleetSession(policy, storeJson, script) {
  const compiled = new rl.CompiledPolicy(policy);
  const session = compiled.session();
  const memory = new rl.MemoryStore();
  let down = false;
  let wall = 0;
  /** @type {import("../dist/index.js").FleetStore} */
  const store = {
    get: (k) => {
      if (down) throw new rl.StoreUnavailableError("down");
      return memory.get(k);
    },
    compareAndSet: (k, g, d) => {
      if (down) throw new rl.StoreUnavailableError("down");
      return memory.compareAndSet(k, g, d);
    },
  };
  const fleet = new rl.Fleet(store, { namespace: "v", now: () => wall });
  const scope = compiled.policy.fleet?.retry_budget?.scope;
  /** @param {string} key @param {any} doc */
  const put = (key, doc) => {
    memory.compareAndSet(key, memory.get(key).generation, doc);
  };
  /** @param {any} doc */
  const putBudget = (doc) => put(fleet.budgetKey(scope ?? doc.scope), doc);
  try {
    const seed = JSON.parse(storeJson);
    for (const [k, b] of Object.entries(seed.breakers ?? {})) put(fleet.breakerKey(k), b);
    if (seed.budget !== undefined) putBudget(seed.budget);
    const steps = [];
    let now = 0;
    let epoch = 0;
    for (const step of JSON.parse(script)) {
      if (step.admit !== undefined) {
        epoch = step.admit;
        wall = epoch;
        const d = session.next();
        const atMs = d.kind === "dispatch" ? Math.max(d.not_before_ms, now) : now;
        now = atMs;
        down = step.store_down === true;
        try {
          steps.push(await fleet.admit(session, atMs));
        } finally {
          down = false;
        }
      } else if (step.observe !== undefined) {
        const started = now;
        const duration = step.observe.duration_ms ?? 0;
        now = started + duration;
        const facts = step.observe.facts === undefined ? "null" : JSON.stringify(step.observe.facts);
        const judgement = session.observe({ started_at_ms: started, completed_at_ms: now, facts });
        wall = epoch + duration;
        const breaker = (await fleet.record(session)) ?? null;
        steps.push({ breaker, judgement, next: session.next() });
      } else if (step.set !== undefined) {
        if (step.set.schema === "retryledger.retry_budget.v1") putBudget(step.set);
        else put(fleet.breakerKey(step.set.route_release_sha256), step.set);
        steps.push({ set: true });
      }
    }
    /** @type {Record<string, unknown>} */
    const breakers = {};
    const prefix = fleet.breakerKey("");
    for (const k of memory.keys()) if (k.startsWith(prefix)) breakers[k.slice(prefix.length)] = memory.get(k).document;
    const budget = scope === undefined ? null : memory.get(fleet.budgetKey(scope)).document;
    const sealed = session.seal();
    const bundleJson = sealed.bundle_json;
    return {
      bundle_sha256: rl.digest(bundleJson),
      receipt: sealed.receipt,
      steps,
      store: { breakers, budget },
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
      // Driver scripts (op `drive`) replay in drivers.test.mjs.
      if (c.op === "drive") continue;
      await t.test(c.name, async () => {
        if ("ok" in c.expect) {
          const got = await run(c.op, c.input);
          assert.equal(JSON.stringify(got), canonical(c.expect.ok));
        } else {
          let thrown;
          try {
            await run(c.op, c.input);
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
