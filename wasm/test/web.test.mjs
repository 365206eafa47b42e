// The browser flavour (pkg-web + dist/web.js), exercised in Node: init() with
// the module's bytes, then the same API and the same digests.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as web from "../dist/web.js";
import { referencePolicy } from "./helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

test("the web build initializes from bytes and answers like the Node build", async () => {
  assert.throws(() => web.validatePolicy(referencePolicy()), /not initialized/);
  const bytes = fs.readFileSync(path.resolve(here, "../pkg-web/retryledger_wasm_bg.wasm"));
  await web.init(bytes);
  await web.init(bytes); // idempotent
  assert.equal(web.validatePolicy(referencePolicy()), "83f8b0c2fa4cd912d3a35f6bc6a2545edc7c774bd40afa121dee48f9c9d52c60");
  assert.throws(() => web.validatePolicy("{"), (e) => e instanceof web.DecodeError && e.code === "invalid_json");
  const run = await web.runWithPolicy(referencePolicy(), () => "ok", { idempotencyKey: "idempotency-key: tenant-7/op-summarize/INC-4471" });
  assert.equal(run.receipt.terminal, "completed");
  assert.equal(web.verifyBundle(run.bundle).kind, "verified");
});
