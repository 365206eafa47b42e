// README's openai example runs as written (its body, after the imports): a
// policy built from the SDK call and the builder vectors' spec, real openai
// clients, a loopback server. readme.check.ts type-checks the same lines.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import ts from "typescript";
import * as rl from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";
import { scriptedServer } from "./loopback.mjs";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** The example's body after its imports. @returns {string} */
function body() {
  const text = readFileSync(root + "README.md", "utf8");
  const m = text.match(/```ts\nimport OpenAI from "openai";\nimport \{ buildPolicy, idempotencyKeySha256, liftRequest \} from "retryledger";\nimport \{ runWithOpenAI \} from "retryledger\/openai";\n\n([\s\S]*?)```/);
  assert.ok(m && m[1] !== undefined, "README shows the openai example");
  return m[1];
}

test("README's openai example type-checks as readme.check.ts shows it", () => {
  const checked = (readFileSync(root + "wasm/test/readme.check.ts", "utf8").split("// openai:begin\n")[1] ?? "").split("// openai:end")[0];
  assert.equal(body(), checked);
});

test("README's openai example runs against a loopback server", async () => {
  const builder = JSON.parse(readFileSync(root + "tests/vectors/builder.json", "utf8")).cases;
  const spec = JSON.parse(builder.find((/** @type {{name: string}} */ c) => c.name === "build_reference_spec").input.spec);
  const completion = {
    id: "c-1", object: "chat.completion", created: 0, model: "m",
    choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
  };
  const server = await scriptedServer({
    "private-primary": [{ status: 503, headers: { "retry-after-ms": "5" }, body: { error: { message: "down" } } }],
    "external-fallback": [{ status: 200, body: completion }],
  });
  /** @type {Record<string, string>} */
  const urls = Object.fromEntries(spec.routes.map((/** @type {{route_id: string}} */ r) => [r.route_id, `${server.base}/${r.route_id}/v1`]));
  /** @type {unknown[][]} */
  const logged = [];
  const console = { log: (/** @type {unknown[]} */ ...args) => logged.push(args) };
  try {
    // The README's TypeScript, compiled by the package's own TypeScript compiler.
    const js = ts.transpileModule(`(async () => {\n${body()}\n})`, { compilerOptions: { target: ts.ScriptTarget.ES2022 } }).outputText;
    const run = new Function("OpenAI", "buildPolicy", "idempotencyKeySha256", "liftRequest", "runWithOpenAI", "spec", "urls", "console",
      `return (${js.trim().replace(/;$/, "")})();`);
    await run(OpenAI, rl.buildPolicy, rl.idempotencyKeySha256, rl.liftRequest, runWithOpenAI, spec, urls, console);
  } finally {
    await server.close();
  }
  assert.match(String(logged[0]?.[0]), /^[0-9a-f]{64}$/);
  assert.deepEqual(server.seen.map((s) => s.route), ["private-primary", "private-primary", "external-fallback"]);
  assert.deepEqual([...new Set(server.seen.map((s) => s.idempotencyKey))], ["incident-42"]);
});
