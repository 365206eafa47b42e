// Decoding reports every error it finds in one pass: the first stays the
// error's own code, path and message; the rest are in `moreErrors`.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as rl from "../dist/index.js";

const request = { schema: "retryledger.request.v1", operation: "chat", input: ["Summarize the incident."] };
const route = { provider: "openai", model: "gpt-4.1-mini", base_url: "http://127.0.0.1:8080/v1", price: { input: 400000, output: 1600000 } };
const spec = {
  schema: "retryledger.policy_spec.v1",
  preset: "fast",
  retries: 3,
  idempotency_key_sha256: "a".repeat(64),
  routes: [{ ...route, data_boundary: "external" }, { provider: "openai", model: "gpt-4.1", price: { input: "2000000", output: 8000000 } }],
};

test("every spec mistake in one pass", () => {
  /** @type {any} */
  let err;
  try {
    rl.buildPolicy(/** @type {any} */ (request), /** @type {any} */ (spec));
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof rl.DecodeError);
  assert.equal(err.code, "invalid_value");
  assert.equal(err.path, "/preset");
  assert.match(err.message, /expected one of `interactive`, `batch`/);
  assert.deepEqual(
    err.moreErrors.map((/** @type {any} */ m) => [m.code, m.path]),
    [
      ["unknown_field", "/retries"],
      ["invalid_value", "/routes/0/data_boundary"],
      ["invalid_type", "/routes/1/price/input"],
    ],
  );
  assert.match(err.moreErrors[1]?.message ?? "", /`local_process`, `private_service`, `external_provider`/);
});

test("the list is bounded, and empty for one error", () => {
  /** @type {Record<string, unknown>} */
  const many = { schema: "retryledger.policy_spec.v1", preset: "interactive", routes: [route] };
  for (let i = 0; i < 40; i++) many[`zz${String(i).padStart(2, "0")}`] = i;
  assert.throws(() => rl.compilePolicyTemplate(/** @type {any} */ (many)), (/** @type {any} */ e) => e.code === "unknown_field" && e.moreErrors.length === 19);
  assert.throws(
    () => rl.compilePolicyTemplate(/** @type {any} */ ({ schema: "retryledger.policy_spec.v1", preset: "interactive", routes: [route], retries: 3 })),
    (/** @type {any} */ e) => e.code === "unknown_field" && e.path === "/retries" && e.moreErrors.length === 0,
  );
});
