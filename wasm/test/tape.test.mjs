// The tape the module writes for a sealed receipt, read by `fromTape`
// (wasm/src/tape.rs, wasm/ts/core.ts): plain values, keys in the core's
// order, strings sliced by UTF-16 offsets, keys sent once then by number.
import assert from "node:assert/strict";
import test from "node:test";

import { createRequire } from "node:module";

import * as rl from "../dist/index.js";
import { fromTape, setBindings } from "../dist/core.js";

const O = 0, END_O = 1, A = 2, END_A = 3, KEY = 4, NEW_KEY = 5, LONE_KEY = 6, INT = 7, T = 8, F = 9, STR = 10;

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
