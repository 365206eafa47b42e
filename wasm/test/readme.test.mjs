// README.md and wasm/README.md show the same TypeScript example, the one
// readme.check.ts type-checks; here it runs against a fake client whose first
// call fails the way an SDK does (a class with a status and Retry-After).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as retryledger from "../dist/index.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
/** @param {string} p */
const read = (p) => readFileSync(root + p, "utf8");

/** @param {string} markdown @returns {string} */
function block(markdown) {
  const m = markdown.match(/```ts\nimport \{ compilePolicy, runWithPolicy \} from "retryledger";\n\n([\s\S]*?)```/);
  assert.ok(m && m[1] !== undefined, "the example block is present");
  return m[1];
}

test("README.md and wasm/README.md show the example readme.check.ts type-checks", () => {
  const checked = (read("wasm/test/readme.check.ts").split("// example:begin\n")[1] ?? "").split("// example:end")[0];
  assert.equal(block(read("README.md")), checked);
  assert.equal(block(read("wasm/README.md")), checked);
});

test("the README example runs: a 429 with Retry-After, then success", async () => {
  const idempotencyKey = "readme-key";
  const vectors = JSON.parse(read("tests/vectors/drivers.json"));
  const policy = JSON.parse(vectors.cases[0].input.policy);
  policy.idempotency_key_sha256 = createHash("sha256").update(idempotencyKey).digest("hex");
  const policyJson = JSON.stringify(policy);
  class RateLimitError extends Error {
    /** @type {number} */ status;
    /** @type {Headers} */ headers;
    constructor() {
      super("rate limited");
      this.status = 429;
      this.headers = new Headers({ "retry-after-ms": "5" });
    }
  }
  let calls = 0;
  /** @param {string} routeId @param {{idempotencyKey: string}} options */
  const callModel = async (routeId, { idempotencyKey: key }) => {
    assert.equal(key, idempotencyKey);
    calls += 1;
    if (calls === 1) throw new RateLimitError();
    return { costMicroUsd: 7, text: `hello from ${routeId}` };
  };
  /** @type {unknown[][]} */
  const logged = [];
  const console = { log: (/** @type {unknown[]} */ ...args) => logged.push(args) };
  const body = block(read("README.md"));
  const run = new Function("compilePolicy", "runWithPolicy", "policyJson", "idempotencyKey", "callModel", "console",
    `return (async () => {\n${body}\n})();`);
  await run(retryledger.compilePolicy, retryledger.runWithPolicy, policyJson, idempotencyKey, callModel, console);
  assert.equal(calls, 2);
  assert.equal(logged.length, 1);
  const [value, terminal, digest] = logged[0] ?? [];
  assert.equal(value, "hello from private-primary");
  assert.equal(terminal, "completed");
  assert.match(String(digest), /^[0-9a-f]{64}$/);
});
