// The tape the module writes for a sealed receipt, read by `fromTape`
// (wasm/src/tape.rs, wasm/ts/core.ts): plain values, keys in the core's
// order, strings sliced by UTF-16 offsets, keys sent once then by number.
import assert from "node:assert/strict";
import test from "node:test";

import { createRequire } from "node:module";

import * as rl from "../dist/index.js";
import { fromTape, setBindings } from "../dist/core.js";

const O = 0, END_O = 1, A = 2, END_A = 3, KEY = 4, NEW_KEY = 5, LONE_KEY = 6, INT = 7, T = 8, F = 9, STR = 10, SEEN_STR = 11, NEW_STR = 12;

test("fromTape: objects, arrays, integers, booleans and non-ASCII strings", () => {
  // {"é":["ü𝄞x",9007199254740991,true,false],"z":{}} with the text "éü𝄞xz" (UTF-16 offsets).
  const text = "éü𝄞xz";
  const ops = new Float64Array([
    O, NEW_KEY, 9001, 0, 1, A, STR, 1, 5, INT, Number.MAX_SAFE_INTEGER, T, F, END_A, LONE_KEY, 5, 6, O, END_O, END_O,
  ]);
  const value = fromTape(ops, 0, ops.length, text);
  assert.deepStrictEqual(value, { é: ["ü𝄞x", Number.MAX_SAFE_INTEGER, true, false], z: {} });
  assert.equal(JSON.stringify(value), '{"é":["ü𝄞x",9007199254740991,true,false],"z":{}}');
  // The key numbered 9001 is known from now on.
  const again = new Float64Array([O, KEY, 9001, INT, 1, END_O]);
  assert.deepStrictEqual(fromTape(again, 0, again.length, ""), { é: 1 });
});

test("fromTape: a string numbered with its text is known by its number from then on", () => {
  const text = "ab";
  const ops = new Float64Array([A, NEW_STR, 7001, 0, 2, SEEN_STR, 7001, END_A]);
  assert.deepStrictEqual(fromTape(ops, 0, ops.length, text), ["ab", "ab"]);
  const again = new Float64Array([A, SEEN_STR, 7001, STR, 0, 1, END_A]);
  assert.deepStrictEqual(fromTape(again, 0, again.length, "x"), ["ab", "x"]);
});

test("a receipt sealed run after run: the policy's strings cross by number, the run's own digest as text", async () => {
  const raw = createRequire(import.meta.url)("../pkg-node/retryledger_wasm.js");
  const [policy, , options] = await oneRun();
  const compiled = new rl.CompiledPolicy(policy);
  /** @type {string[]} */
  const digests = [];
  for (let i = 0; i < 3; i += 1) {
    const [, dispatch, opts] = await oneRun();
    const run = await rl.runWithPolicy(compiled, dispatch, { ...opts, idempotencyKey: options.idempotencyKey });
    // The receipt is the core's, whatever crossed by number.
    assert.equal(rl.digest(run.receipt), run.sealed.receipt_sha256);
    assert.deepStrictEqual(run.receipt, JSON.parse(run.sealed.bundle_json).receipt);
    digests.push(run.receipt.policy_sha256);
  }
  // The policy digest was numbered by the module: its text is there by number.
  const texts = [];
  for (let id = 0; id < 4096; id += 1) {
    const t = raw.tape_str(id);
    if (t === undefined) break;
    texts.push(t);
  }
  assert.ok(texts.includes(/** @type {string} */ (digests[0])), "the policy digest is numbered");
  compiled.free();
});

test("fromTape: a key number this side never saw is asked of the module", async () => {
  // Seal a run, so that the module has numbered the receipt's keys, then read
  // a tape naming one by number only.
  const sealed = (await rl.runWithPolicy(...(await oneRun()))).sealed;
  const first = Object.keys(sealed.receipt)[0];
  assert.equal(first, "attempt_count");
  // Installing the module again forgets the keys on this side only.
  setBindings(createRequire(import.meta.url)("../pkg-node/retryledger_wasm.js"));
  const ops = new Float64Array([O, KEY, 0, INT, 3, END_O]);
  assert.deepStrictEqual(fromTape(ops, 0, ops.length, ""), { attempt_count: 3 });
});

test("a sealed receipt behaves as the plain receipt: equality, JSON, iteration, spread", async () => {
  const run = await rl.runWithPolicy(...(await oneRun()));
  const parsed = JSON.parse(run.sealed.bundle_json).receipt;
  assert.deepStrictEqual(run.receipt, parsed);
  assert.deepStrictEqual({ ...run.receipt }, parsed);
  assert.deepStrictEqual(Object.entries(run.receipt), Object.entries(parsed));
  assert.equal(JSON.stringify(run.receipt), JSON.stringify(parsed));
  assert.deepStrictEqual(structuredClone(run.receipt), parsed);
  assert.equal(rl.digest(run.receipt), run.sealed.receipt_sha256);
});

test("the receipt's canonical JSON, written from the kept tape, is the core's sealed receipt", async () => {
  const [policy, dispatch, options] = await oneRun();
  const run = await rl.runWithPolicy(policy, dispatch, options);
  // The core seals the same policy and attempts by itself (its own SHA-256,
  // the receipt encoded directly): the same bundle, byte for byte.
  const raw = createRequire(import.meta.url)("../pkg-node/retryledger_wasm.js");
  const compiled = raw.Compiled.compile(JSON.stringify(policy));
  const bundle = compiled.seal(JSON.stringify(run.bundle.attempts));
  compiled.free();
  assert.equal(run.sealed.bundle_json, bundle);
  assert.equal(run.sealed.receipt_sha256, rl.digest(JSON.parse(bundle).receipt));
  // Mutating the receipt object changes neither the sealed text nor its digest.
  const second = await rl.runWithPolicy(...(await oneRun()));
  const digest = rl.digest(second.receipt);
  const cost = second.receipt.total_cost;
  Object.assign(second.receipt, { total_cost: cost + 1 });
  assert.equal(second.sealed.receipt_sha256, digest);
  assert.equal(JSON.parse(second.sealed.bundle_json).receipt.total_cost, cost);
});

test("tape_json: the core's canonical JSON of a tape's events; a malformed tape is a coded error", () => {
  const raw = createRequire(import.meta.url)("../pkg-node/retryledger_wasm.js");
  const text = "éü𝄞xz";
  const ops = new Float64Array([
    O, LONE_KEY, 0, 1, A, STR, 1, 5, INT, Number.MAX_SAFE_INTEGER, T, F, END_A, LONE_KEY, 5, 6, O, END_O, END_O,
  ]);
  assert.equal(raw.tape_json(ops, text), '{"é":["ü𝄞x",9007199254740991,true,false],"z":{}}');
  assert.equal(raw.tape_json(new Float64Array([STR, 0, 2]), 'a"'), '"a\\""');
  const bad = [
    [[O], ""], // unclosed
    [[O, END_O, O, END_O], ""], // two documents
    [[A, END_O], ""], // mismatched
    [[A, LONE_KEY, 0, 1, STR, 1, 2, END_A], "ab"], // a key in an array
    [[O, INT, 1, END_O], ""], // a value without its key
    [[O, LONE_KEY, 0, 1, END_O], "a"], // a key without its value
    [[INT, 1.5], ""], // not an integer
    [[INT, -1], ""],
    [[INT], ""], // a missing operand
    [[STR, 0, 1], "ab"], // text left over
    [[STR, 1, 2], "ab"], // a string not where the last one ended
    [[STR, 0, 1], "𝄞"], // inside a surrogate pair
    [[KEY, 4_000_000], ""], // a key never numbered
    [[O, NEW_KEY, 0, 0, 1, INT, 1, END_O], "\u0001"], // a key whose text is not its number's
    [[SEEN_STR, 4_000_000], ""], // a string never numbered
    [[NEW_STR, 4_000_000, 0, 1], "a"], // a string numbered by this side only
    [[42], ""], // an unknown operation
    [[], ""], // nothing
  ];
  for (const [tape, t] of bad) {
    assert.throws(
      () => raw.tape_json(new Float64Array(/** @type {number[]} */ (tape)), /** @type {string} */ (t)),
      (/** @type {unknown} */ e) => typeof e === "string" && JSON.parse(e).code === "invalid_value",
      JSON.stringify(tape),
    );
  }
});

/** A three-attempt run on the reference policy cut to one route: its arguments for runWithPolicy. */
async function oneRun() {
  const fs = await import("node:fs");
  const { createHash } = await import("node:crypto");
  const doc = JSON.parse(fs.readFileSync(new URL("../../tests/vectors/plan.json", import.meta.url), "utf8"));
  const c = doc.cases.find((/** @type {{name: string}} */ x) => x.name === "empty_run_dispatches_primary");
  const p = JSON.parse(c.input.policy);
  p.routes = [{ ...p.routes[0], max_attempts: 3 }];
  p.max_total_attempts = 3;
  p.backoff = { base_ms: 1, max_ms: 1, retry_after_cap_ms: 1 };
  const key = "tape-test-key";
  p.idempotency_key_sha256 = createHash("sha256").update(key, "utf8").digest("hex");
  let n = 0;
  let t = 0;
  /** @type {[import("../dist/index.js").Policy, () => Promise<number>, import("../dist/index.js").RunOptions]} */
  const args = [
    p,
    async () => {
      n += 1;
      if (n < 3) throw rl.AttemptError.retryable("unavailable");
      return n;
    },
    { idempotencyKey: key, clock: () => t, sleep: async (ms) => void (t += ms) },
  ];
  return args;
}
