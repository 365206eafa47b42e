// The cost of a run with one repair (docs/REPAIR.md) next to the same two
// calls made by hand: the first answer fails its check, the repair builds the
// next request from the defects, the second answer passes. By hand: call,
// validate, build the second request, call, validate. retryledger:
// runWithPolicy with checks and repair (the same calls and validations, plus
// the core's judgement of each verdict, two sealed runs, the repair's policy
// derived by the core and the chain). In memory (the overhead alone) and
// through the real `openai` client against a provider on 127.0.0.1. CPU is
// process.cpuUsage(), wall performance.now(); medians of R interleaved
// rounds of N logical requests.
//
//   node bench/repair.mjs [--requests N] [--rounds R] [--write ../docs/BENCHMARKS.md]
//
// --write replaces the text between <!-- wasm-repair:begin --> and
// <!-- wasm-repair:end --> in that file (printed either way).
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

import * as rl from "../dist/index.js";
import { openaiAnswerChecks, runWithOpenAI } from "../dist/openai-node.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
/** @param {string} name @param {string} fallback */
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? /** @type {string} */ (args[i + 1]) : fallback;
};
const N = Number(arg("--requests", "400"));
const ROUNDS = Number(arg("--rounds", "9"));
const WRITE = arg("--write", "");
const KEY = "bench-key: tenant-1/op-repair";
const BAD = '{"title":"disk full"}';
const GOOD = '{"title":"disk full","severity":2}';

/** @param {unknown} text */
function validate(text) {
  const v = JSON.parse(String(text));
  /** @type {{message: string, path: string}[]} */
  const defects = [];
  if (typeof v?.title !== "string") defects.push({ message: "Required", path: "/title" });
  if (!Number.isInteger(v?.severity)) defects.push({ message: "Required", path: "/severity" });
  return defects;
}
const summary = rl.outputCheck(validate, { validator: "summary" });

/** @param {{message: string, path?: string}[]} defects */
const request = (defects) => ({
  schema: "retryledger.request.v1",
  operation: "chat",
  input: [
    { role: "user", content: "summarize INC-4471 as JSON" },
    { role: "user", content: `Your last answer was invalid (${defects.map((d) => `${d.path ?? ""} ${d.message}`).join("; ")}). Answer again.` },
  ],
});

function policy() {
  const plan = JSON.parse(fs.readFileSync(path.join(here, "../../tests/vectors/plan.json"), "utf8"));
  const p = JSON.parse(plan.cases.find((/** @type {any} */ c) => c.name === "empty_run_dispatches_primary").input.policy);
  p.idempotency_key_sha256 = createHash("sha256").update(KEY).digest("hex");
  p.deadline_ms = 600_000;
  p.repair = { max_repairs: 1, cost_share_percent: 50 };
  return p;
}

/** @param {(req: any) => Promise<string>} call */
async function byHand(call) {
  const first = await call(undefined);
  const defects = validate(first);
  if (defects.length === 0) return first;
  const second = await call(request(defects));
  if (validate(second).length > 0) throw new Error("still invalid");
  return second;
}

/** @returns {[() => Promise<unknown>, () => Promise<unknown>]} */
function memoryPair() {
  const compiled = new rl.CompiledPolicy(policy());
  return [
    () => byHand(async (req) => (req === undefined ? BAD : GOOD)),
    async () => {
      const r = /** @type {any} */ (
        await rl.runWithPolicy(compiled, (step) => (step.repairOrdinal === 0 ? BAD : GOOD), {
          idempotencyKey: KEY,
          checks: [summary],
          repair: (_o, defects) => request(defects),
        })
      );
      if (r.chain.links.length !== 2) throw new Error("not one repair");
      return r;
    },
  ];
}

/** @param {string} content */
const completion = (content) =>
  JSON.stringify({ id: "chatcmpl-1", object: "chat.completion", created: 0, model: "fake-model", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] });

async function serve() {
  const bad = completion(BAD);
  const good = completion(GOOD);
  const server = http.createServer((req, res) => {
    const chunks = /** @type {Buffer[]} */ ([]);
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString());
      const payload = body.messages.length > 1 ? good : bad;
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
      res.end(payload);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  return server;
}

/** @param {string} base @returns {[() => Promise<unknown>, () => Promise<unknown>]} */
function httpPair(base) {
  const client = new OpenAI({ apiKey: "bench", baseURL: base, maxRetries: 0 });
  const p = policy();
  const compiled = new rl.CompiledPolicy(p);
  const clients = Object.fromEntries(p.routes.map((/** @type {any} */ r) => [r.route_id, client]));
  const first = [{ role: "user", content: "summarize INC-4471 as JSON" }];
  const checks = openaiAnswerChecks({ json: true, validators: [summary] });
  return [
    () =>
      byHand(async (req) => {
        const r = await client.chat.completions.create({ model: "fake-model", messages: /** @type {any} */ (req === undefined ? first : req.input) });
        return r.choices[0]?.message.content ?? "";
      }),
    () =>
      runWithOpenAI(
        compiled,
        clients,
        (c, opts, step) => c.chat.completions.create({ model: "fake-model", messages: /** @type {any} */ (step.request === undefined ? first : /** @type {any} */ (step.request).input) }, opts),
        { idempotencyKey: KEY, checks, repair: (_o, defects) => request(defects) },
      ),
  ];
}

/** @param {() => Promise<unknown>} fn @param {number} n */
async function timed(fn, n) {
  const c0 = process.cpuUsage();
  const w0 = performance.now();
  for (let i = 0; i < n; i++) await fn();
  const c = process.cpuUsage(c0);
  return { cpu: (c.user + c.system) / n, wall: ((performance.now() - w0) * 1000) / n };
}

/** @param {number[]} xs */
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return /** @type {number} */ (s[Math.floor(s.length / 2)]);
};

/** @param {[() => Promise<unknown>, () => Promise<unknown>]} pair @param {number} n */
async function measure([hand, driven], n) {
  for (let i = 0; i < Math.max(1, Math.floor(n / 10)); i++) {
    await hand();
    await driven();
  }
  /** @type {Record<string, number[]>} */
  const rows = { handCpu: [], handWall: [], runCpu: [], runWall: [] };
  for (let r = 0; r < ROUNDS; r++) {
    const h = await timed(hand, n);
    const d = await timed(driven, n);
    rows.handCpu?.push(h.cpu);
    rows.handWall?.push(h.wall);
    rows.runCpu?.push(d.cpu);
    rows.runWall?.push(d.wall);
  }
  return Object.fromEntries(Object.entries(rows).map(([k, v]) => [k, median(v)]));
}

const server = await serve();
const address = /** @type {import("node:net").AddressInfo} */ (server.address());
const httpN = Math.max(1, Math.floor(N / 8));
let memory;
let loop;
try {
  memory = await measure(memoryPair(), N);
  loop = await measure(httpPair(`http://127.0.0.1:${address.port}/v1`), httpN);
} finally {
  server.close();
}
const f = (/** @type {number | undefined} */ x) => `${(x ?? 0).toFixed(1)} µs`;
const ratio = (/** @type {number | undefined} */ a, /** @type {number | undefined} */ b) => `${((a ?? 0) / (b ?? 1)).toFixed(2)}x`;
const lines = [
  `Node ${process.version}; \`wasm/bench/repair.mjs\`, one logical request whose first answer fails its check and whose one repair passes, median of ${ROUNDS} interleaved rounds (${N} requests in memory, ${httpN} over HTTP).`,
  "",
  "| setting | by hand CPU | `runWithPolicy` + repair CPU | ratio | by hand wall | `runWithPolicy` + repair wall | ratio |",
  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
];
for (const [name, m] of /** @type {[string, Record<string, number>][]} */ ([
  ["in-memory dispatch", memory],
  ["`openai` client, provider on 127.0.0.1", loop],
])) {
  lines.push(`| ${name} | ${f(m.handCpu)} | ${f(m.runCpu)} | ${ratio(m.runCpu, m.handCpu)} | ${f(m.handWall)} | ${f(m.runWall)} | ${ratio(m.runWall, m.handWall)} |`);
}
lines.push("", `What the repaired run adds per logical request: ${f((memory.runCpu ?? 0) - (memory.handCpu ?? 0))} CPU in memory.`);
const text = lines.join("\n");
console.log(text);
if (WRITE !== "") {
  const file = path.resolve(process.cwd(), WRITE);
  const doc = fs.readFileSync(file, "utf8");
  const begin = "<!-- wasm-repair:begin -->";
  const end = "<!-- wasm-repair:end -->";
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${file}: markers ${begin} ... ${end} not found`);
  fs.writeFileSync(file, `${doc.slice(0, a + begin.length)}\n${text}\n${doc.slice(b)}`);
  console.log(`wrote ${path.relative(process.cwd(), file)} between ${begin} and ${end}`);
}
