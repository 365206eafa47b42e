// A policy built from a request and catalog documents, run with a scoped
// idempotency key: the digests come from the core, the raw key from the caller.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as rl from "../dist/index.js";

const cases = JSON.parse(readFileSync(new URL("../../tests/vectors/builder.json", import.meta.url), "utf8")).cases;
const base = cases.find((/** @type {{name: string}} */ c) => c.name === "build_reference_spec");

/** @param {string} tenant @param {string} operation @param {string} key */
function built(tenant, operation, key) {
  const spec = JSON.parse(base.input.spec);
  spec.idempotency_key_sha256 = rl.idempotencyKeySha256(key, { tenant, operation });
  return rl.buildPolicy(JSON.parse(base.input.request), spec);
}

test("a built policy runs with its scoped key", async () => {
  const policy = built("tenant-a", "chat.completions", "order-7");
  assert.equal(policy.policy.logical_request_sha256, rl.requestSha256(base.input.request));
  let t = 0;
  const run = await rl.runWithPolicy(policy, (step) => {
    assert.equal(step.idempotencyKey, "order-7");
    return "ok";
  }, {
    idempotencyKey: "order-7",
    keyScope: { tenant: "tenant-a", operation: "chat.completions" },
    clock: () => t,
    sleep: async (ms) => { t += ms; },
  });
  assert.equal(run.result, "ok");
  assert.equal(run.receipt.terminal, "completed");
  assert.ok(!JSON.stringify(run.bundle).includes("order-7"));
});

for (const [key, scope] of /** @type {[string, {tenant: string, operation: string} | undefined][]} */ ([
  ["order-7", { tenant: "tenant-b", operation: "chat.completions" }],
  ["order-7", undefined],
  ["order-8", { tenant: "tenant-a", operation: "chat.completions" }],
])) {
  test(`another scope or key is refused before dispatch (${key}, ${scope?.tenant ?? "bare"})`, async () => {
    const policy = built("tenant-a", "chat.completions", "order-7");
    await assert.rejects(
      rl.runWithPolicy(policy, () => assert.fail("dispatched"), scope === undefined ? { idempotencyKey: key } : { idempotencyKey: key, keyScope: scope }),
      (e) => e instanceof rl.DriftError && e.code === "idempotency_key_drift",
    );
  });
}

test("builder errors are validation's codes", () => {
  const spec = JSON.parse(base.input.spec);
  spec.max_data_boundary = "private_service";
  assert.throws(() => rl.buildPolicy(base.input.request, spec), (e) => e instanceof rl.PolicyError && e.code === "data_boundary_exceeded");
});
