// withPolicy: the driver as a function wrapper.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import * as rl from "../dist/index.js";

const base = JSON.parse(JSON.parse(readFileSync(new URL("../../tests/vectors/drivers.json", import.meta.url), "utf8")).cases[0].input.policy);

/** @param {string} key */
function policyFor(key) {
  return { ...base, idempotency_key_sha256: createHash("sha256").update(key).digest("hex") };
}

function fakeTime() {
  let t = 0;
  return { clock: () => t, sleep: async (/** @type {number} */ ms) => { t += ms; } };
}

class Unavailable extends Error {
  status = 503;
}

test("a wrapped function retries, returns its value and keeps its receipt", async () => {
  /** @type {string[]} */
  const calls = [];
  const summarize = rl.withPolicy(policyFor("k-1"), async (step, _signal, /** @type {string} */ text) => {
    calls.push(step.routeId);
    if (calls.length === 1) throw new Unavailable();
    return text.toUpperCase();
  }, { idempotencyKey: "k-1", ...fakeTime() });
  assert.equal(await summarize("hi"), "HI");
  assert.deepEqual(calls, ["private-primary", "private-primary"]);
  const run = await summarize.run("again");
  assert.equal(run.result, "AGAIN");
  assert.equal(run.receipt.terminal, "completed");
  assert.match(run.receipt.attempts_sha256, /^[0-9a-f]{64}$/);
});

test("policy and key from the arguments", async () => {
  const fetchOrder = rl.withPolicy((/** @type {string} */ order) => policyFor(order), (step, _signal, order) => {
    assert.equal(step.idempotencyKey, order);
    return order;
  }, { idempotencyKey: (order) => order, ...fakeTime() });
  assert.equal(await fetchOrder("o-1"), "o-1");
  assert.equal(await fetchOrder("o-2"), "o-2");
});

test("a stopped run rejects with the bundle; a bad fixed policy fails at wrap time", async () => {
  const broken = rl.withPolicy(policyFor("k-2"), () => {
    throw new TypeError("unknown");
  }, { idempotencyKey: "k-2", ...fakeTime() });
  await assert.rejects(broken(), (e) => e instanceof rl.UnrecognizedDispatchError && e.bundle.receipt.attempt_count === 1);
  assert.throws(() => rl.withPolicy({ ...base, routes: [] }, () => 1, { idempotencyKey: "k" }), (e) => e instanceof rl.PolicyError);
});
