// README.md shows wasm/README.md's AI SDK and LangChain.js examples as they
// stand there (docs/INTEGRATIONS.md has what each adapter does).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../../", import.meta.url));
/** @param {string} p */
const read = (p) => readFileSync(root + p, "utf8");

/** The first TypeScript block under a heading of wasm/README.md. @param {string} heading */
function block(heading) {
  const text = read("wasm/README.md");
  const at = text.indexOf(`## ${heading}\n`);
  assert.ok(at >= 0, `wasm/README.md has the ${heading} section`);
  const m = text.slice(at).match(/```ts\n[\s\S]*?```/);
  assert.ok(m, `the ${heading} section shows its example`);
  return m[0];
}

for (const heading of ["AI SDK", "LangChain.js"]) {
  test(`README.md shows wasm/README.md's ${heading} example`, () => {
    assert.ok(read("README.md").includes(block(heading)));
  });
}
