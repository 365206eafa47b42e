// The READMEs' first example runs verbatim against a loopback server: a 429
// with Retry-After then a 503 on the primary, a completion on the fallback;
// the run waits out the hint, falls back and logs a verified receipt. The
// block is compiled by the package's TypeScript compiler and imported as a
// module from inside the package (so "retryledger" resolves to this build);
// first-example.check.ts type-checks the same lines.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { scriptedServer } from "./loopback.mjs";

const root = fileURLToPath(new URL("../../", import.meta.url));
const IMPORTS = 'import OpenAI from "openai";\nimport { compilePolicyTemplate, idempotencyKeySha256, liftRequest, verifyBundle } from "retryledger";\nimport { runWithOpenAI } from "retryledger/openai";\n';

/** @param {string} path @returns {string} */
function block(path) {
  const text = readFileSync(root + path, "utf8");
  const start = text.indexOf("```ts\n" + IMPORTS);
  assert.ok(start >= 0, `${path} shows the first example`);
  const from = start + "```ts\n".length;
  return text.slice(from, text.indexOf("```", from));
}

test("README.md and wasm/README.md show the same first example, type-checked as first-example.check.ts", () => {
  assert.equal(block("README.md"), block("wasm/README.md"));
  const readme = readFileSync(root + "wasm/README.md", "utf8");
  assert.equal(readme.indexOf("```ts\n"), readme.indexOf("```ts\n" + IMPORTS), "wasm/README.md starts with it");
  const checked = (readFileSync(root + "wasm/test/first-example.check.ts", "utf8").split("// example:begin\n")[1] ?? "").split("// example:end")[0];
  assert.equal(block("README.md").slice(IMPORTS.length + 1), checked);
});

test("the first example runs against a loopback server", async () => {
  const completion = {
    id: "c-1", object: "chat.completion", created: 0, model: "m",
    choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
  };
  const server = await scriptedServer({
    primary: [
      { status: 429, headers: { "retry-after": "1" }, body: { error: { message: "slow down" } } },
      { status: 503, body: { error: { message: "down" } } },
    ],
    fallback: [{ status: 200, body: completion }],
  });
  const js = ts.transpileModule(block("README.md"), {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext },
  }).outputText;
  const file = root + `wasm/.first-example-${process.pid}.mjs`;
  /** @type {unknown[][]} */
  const logged = [];
  const log = console.log;
  const env = { ...process.env };
  process.env.LLM_BASE_URL = server.base;
  delete process.env.OPENAI_API_KEY;
  console.log = (...args) => void logged.push(args);
  try {
    writeFileSync(file, js);
    await import(file);
  } finally {
    console.log = log;
    process.env = env;
    rmSync(file, { force: true });
    await server.close();
  }
  assert.deepEqual(server.seen.map((s) => s.route), ["primary", "primary", "fallback"]);
  assert.deepEqual([...new Set(server.seen.map((s) => s.idempotencyKey))], ["incident-42"]);
  const [first, second] = server.seen;
  assert.ok(second && first && second.arrivedAt - first.respondedAt >= 990, "Retry-After waited out");
  assert.deepEqual(logged[0], ["ok", "completed", true]);
  assert.deepEqual(logged[1], ["verified"]);
});
