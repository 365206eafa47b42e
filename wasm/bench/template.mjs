// A policy per call: a template's bind next to buildPolicy, through the
// package (object request in, CompiledPolicy out), medians of interleaved rounds.
import { readFileSync } from "node:fs";
import * as rl from "../dist/index.js";

const ROUNDS = 41;
const PER_ROUND = 2000;
const cases = JSON.parse(readFileSync(new URL("../../tests/vectors/builder.json", import.meta.url), "utf8")).cases;
const c = cases.find((/** @type {{name: string}} */ x) => x.name === "build_reference_spec");
const request = JSON.parse(c.input.request);
const full = JSON.parse(c.input.spec);
const { idempotency_key_sha256: key, ...spec } = full;
const template = rl.compilePolicyTemplate(spec);
if (template.bind(request, key).policyJson !== rl.buildPolicy(request, full).policyJson) throw new Error("bind differs from buildPolicy");
/** @param {number[]} xs */
const median = (xs) => /** @type {number} */ (xs.sort((a, b) => a - b)[xs.length >> 1]);
/** @type {number[]} */
const bind = [];
/** @type {number[]} */
const build = [];
for (let r = 0; r < ROUNDS; r++) {
  let start = process.hrtime.bigint();
  for (let i = 0; i < PER_ROUND; i++) template.bind(request, key).free();
  bind.push(Number(process.hrtime.bigint() - start) / PER_ROUND);
  start = process.hrtime.bigint();
  for (let i = 0; i < PER_ROUND / 10; i++) rl.buildPolicy(request, full).free();
  build.push(Number(process.hrtime.bigint() - start) / (PER_ROUND / 10));
}
const b = median(bind);
const p = median(build);
console.log(
  `policy per call (Node): template bind ${(b / 1000).toFixed(2)} µs, buildPolicy ${(p / 1000).toFixed(2)} µs, buildPolicy / bind = ${(p / b).toFixed(1)} (median of ${ROUNDS} rounds)`,
);
