// The driver vectors (../tests/vectors/drivers.json, read in place): every case
// replayed through runWithPolicy with a fake clock, a fake sleep, a scripted
// dispatch (error classes built by name, each a subclass of the next), an
// AbortController for the cancel cases and the case's classify hook, as
// docs/HOSTS.md ("Driver vectors") specifies. What the replay gives, in the
// shape of a case's `expect` (sleeps, attempts document, receipt digest,
// terminal, judging rules, result or error class and code), must equal it.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as rl from "../dist/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const file = path.resolve(here, "../../tests/vectors/drivers.json");
const doc = JSON.parse(fs.readFileSync(file, "utf8"));
// The drive cases with an output check live with the other output-check vectors.
const repair = JSON.parse(fs.readFileSync(path.resolve(here, "../../tests/vectors/repair.json"), "utf8"));

/**
 * @typedef {{types?: string[], status?: number, headers?: [string, string][], body?: string, code?: string, cause?: ErrorSpec, outcome?: import("../dist/index.js").Outcome}} ErrorSpec
 * @typedef {{sleep_overshoot_ms?: number, cancel_before?: boolean, duration_ms?: number, charge?: number[], output_delivered?: boolean, cancel_during?: boolean, returns?: string, raises?: ErrorSpec, verdict?: Record<string, unknown>}} ScriptStep
 * @typedef {{policy: string, idempotency_key: string, now_unix_ms: number, cancellable: boolean, classify?: Record<string, import("../dist/index.js").Outcome>, script: ScriptStep[]}} DriveInput
 * @typedef {{sleeps: number[], attempts?: unknown, receipt_sha256?: string, terminal?: string, rules?: string[], result?: string, error?: {class: string, code: string}}} Expect
 * @typedef {{name: string, op: string, input: DriveInput, expect: Expect}} Case
 */

/** @type {Case[]} */
const cases = [...doc.cases, ...repair.cases.filter((/** @type {Case} */ c) => c.op === "drive")];

/**
 * A class named `name` extending `Base`.
 * @param {string} name @param {new (message?: string) => Error} Base
 * @returns {new (message?: string) => Error}
 */
function named(name, Base) {
  const cls = class extends Base {};
  Object.defineProperty(cls, "name", { value: name });
  return cls;
}

/** The error a step raises: a class chain by name (the last a subclass of Error), or an AttemptError. @param {ErrorSpec} spec @returns {Error} */
function buildError(spec) {
  if (spec.outcome !== undefined) return new rl.AttemptError(spec.outcome);
  const types = spec.types ?? [];
  /** @type {new (message?: string) => Error} */
  let cls = Error;
  for (const name of [...types].reverse()) cls = named(name, cls);
  const e = /** @type {Error & Record<string, unknown>} */ (new cls(`scripted ${types[0] ?? "error"}`));
  if (spec.status !== undefined) e.status = spec.status;
  if (spec.headers !== undefined) e.headers = new Headers(spec.headers);
  if (spec.body !== undefined) e.body = spec.body;
  if (spec.code !== undefined) e.code = spec.code;
  if (spec.cause !== undefined) e.cause = buildError(spec.cause);
  return e;
}

/**
 * Replay one case; what it gave, in the shape of `expect`, and the attempts onAttempt saw.
 * @param {Case} c
 */
async function replay(c) {
  const input = c.input;
  const script = input.script;
  const state = { now: 0, index: 0, dispatched: 0 };
  /** @type {number[]} */
  const sleeps = [];
  /** @type {string[]} */
  const rules = [];
  /** @type {unknown[]} */
  const seen = [];
  const controller = new AbortController();
  const upcoming = () => script[state.index] ?? {};
  // A step's `verdict` is what the run's output check answers on its result.
  const PASS = { kind: "schema", validator: "script", verdict: "pass" };
  /** @type {Record<string, unknown>} */
  let verdict = PASS;

  /** @param {number} ms */
  const sleep = async (ms) => {
    sleeps.push(ms);
    const next = upcoming();
    if (next.cancel_before === true) {
      assert.ok(input.cancellable, "only a cancellable case cancels");
      controller.abort();
      state.index += 1;
      return;
    }
    state.now += ms + (next.sleep_overshoot_ms ?? 0);
  };

  /** @type {import("../dist/index.js").DispatchFn<string>} */
  const dispatch = async (step, signal) => {
    const s = script[state.index];
    assert.ok(s !== undefined, "dispatched more often than scripted");
    assert.ok(s.cancel_before !== true, "dispatched where the caller cancels before");
    state.index += 1;
    state.dispatched += 1;
    state.now += s.duration_ms ?? 0;
    for (const n of s.charge ?? []) step.charge(n);
    if (s.output_delivered === true) step.outputDelivered();
    if (s.cancel_during === true) {
      controller.abort();
      throw signal.reason;
    }
    if (s.raises !== undefined) throw buildError(s.raises);
    verdict = s.verdict ?? PASS;
    return /** @type {string} */ (s.returns);
  };

  const table = input.classify;
  /** @type {import("../dist/index.js").RunOptions} */
  const options = {
    idempotencyKey: input.idempotency_key,
    clock: () => state.now,
    sleep,
    wallClock: () => input.now_unix_ms,
    onAttempt: (attempt, judgement) => {
      seen.push(attempt);
      rules.push(judgement.rule);
    },
  };
  if (input.cancellable) options.signal = controller.signal;
  if (script.some((s) => s.verdict !== undefined)) {
    options.checks = [rl.outputCheck(() => verdict, { validator: "script" })];
  }
  if (table !== undefined) {
    options.classify = (e) => {
      const name = /** @type {{constructor?: {name?: string}}} */ (e)?.constructor?.name;
      return typeof name === "string" && Object.hasOwn(table, name) ? table[name] : undefined;
    };
  }

  /** @type {Expect} */
  const got = { sleeps };
  /** @type {import("../dist/index.js").Sealed | undefined} */
  let sealed;
  try {
    const run = await rl.runWithPolicy(input.policy, dispatch, options);
    sealed = run.sealed;
    got.result = run.result;
  } catch (e) {
    if (e instanceof rl.RunStoppedError) sealed = e.sealed;
    else if (!(e instanceof rl.RetryledgerError)) throw e;
    got.error = { class: e.constructor.name, code: e.code };
  }
  if (sealed !== undefined) {
    const error = got.error;
    const result = got.result;
    delete got.error;
    delete got.result;
    got.attempts = sealed.bundle.attempts;
    got.receipt_sha256 = sealed.receipt_sha256;
    got.terminal = sealed.terminal;
    got.rules = rules;
    if (result !== undefined) got.result = result;
    if (error !== undefined) got.error = error;
  }
  return { got, seen, sealed, state };
}

test("the driver vectors are there (never pass vacuously)", () => {
  assert.equal(doc.schema, "retryledger.vectors.v1");
  assert.ok(cases.length >= 50, `only ${cases.length} driver cases`);
  assert.ok(cases.every((c) => c.op === "drive"));
  assert.ok(cases.some((c) => c.input.cancellable));
});

test(`driver vectors (${cases.length} cases) through runWithPolicy`, async (t) => {
  for (const c of cases) {
    await t.test(c.name, async () => {
      const { got, seen, sealed, state } = await replay(c);
      assert.deepStrictEqual(got, c.expect);
      if (sealed !== undefined) {
        // onAttempt saw each attempt as the core recorded it; the bundle replays.
        assert.deepStrictEqual(seen, sealed.bundle.attempts.attempts);
        assert.equal(rl.verifyBundle(sealed.bundle_json).kind, "verified");
        assert.equal(rl.digest(sealed.receipt), sealed.receipt_sha256);
        // The receipt object (made from the module's tape) is a plain object equal to the
        // core's canonical receipt text, its keys in the same order.
        const text = /** @type {{receipt: unknown}} */ (JSON.parse(sealed.bundle_json)).receipt;
        assert.equal(Object.getPrototypeOf(sealed.receipt), Object.prototype);
        assert.deepStrictEqual(sealed.receipt, text);
        assert.equal(JSON.stringify(sealed.receipt), JSON.stringify(text));
        const dispatches = c.input.script.filter((s) => s.cancel_before !== true).length;
        assert.equal(state.dispatched, dispatches, "every scripted dispatch ran");
      } else {
        assert.equal(state.dispatched, 0, "refused before any dispatch");
      }
    });
  }
});

test("a change to any expected field fails the comparison", async () => {
  const withError = cases.find((c) => c.expect.error !== undefined && c.expect.attempts !== undefined && c.expect.sleeps.length > 0);
  const withResult = cases.find((c) => c.expect.result !== undefined && c.expect.sleeps.length > 0);
  assert.ok(withError !== undefined && withResult !== undefined);
  for (const c of [withError, withResult]) {
    const { got } = await replay(c);
    assert.deepStrictEqual(got, c.expect);
    for (const key of Object.keys(c.expect)) {
      /** @type {Record<string, unknown>} */
      const changed = structuredClone(c.expect);
      const v = changed[key];
      if (Array.isArray(v)) changed[key] = [...v, v[0] ?? 1];
      else if (typeof v === "string") changed[key] = `${v}x`;
      else if (key === "attempts") changed[key] = { ...(/** @type {object} */ (v)), cancelled_at_ms: 1 };
      else changed[key] = { ...(/** @type {object} */ (v)), code: "other" };
      assert.throws(() => assert.deepStrictEqual(got, changed), assert.AssertionError, `${c.name}: ${key}`);
      /** @type {Record<string, unknown>} */
      const missing = structuredClone(c.expect);
      delete missing[key];
      assert.throws(() => assert.deepStrictEqual(got, missing), assert.AssertionError, `${c.name}: without ${key}`);
    }
  }
});
