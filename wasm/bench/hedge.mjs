// Hedging against a heavy-tailed loopback server in Node (the same as
// python/benches/bench_hedge.py): p50/p90/p99 latency (the run clock's
// finished_at_ms) and physical attempts per call, without hedging
// (runWithPolicy) and with it (runHedged), side by side in one run. The
// server (node:http on 127.0.0.1) draws every request's latency from one
// heavy-tailed mix on both routes: 93 % fast, 5 % slow, 2 % very slow, seeded
// by the call's index, the route and the attempt's ordinal (headers the bench
// sends), so call i meets the same server in both modes: the comparison is
// paired. The hedge goes to the fallback after delay_ms without a result;
// losers are aborted. Calls alternate between the two modes.
//
//   node bench/hedge.mjs [--calls N] [--write ../docs/BENCHMARKS.md]
//
// --write replaces the text between <!-- wasm-hedge:begin --> and
// <!-- wasm-hedge:end --> in that file (printed either way).
import fs from "node:fs";
import http from "node:http";
import path from "node:path";

import * as rl from "../dist/index.js";
import { KEY, referencePolicy } from "../test/helpers.mjs";

const args = process.argv.slice(2);
/** @param {string} name @param {string} fallback */
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? /** @type {string} */ (args[i + 1]) : fallback;
};
const CALLS = Number(arg("--calls", "300"));
const WRITE = arg("--write", "");
const FAST_MS = 5;
const SLOW_MS = 120;
const TAIL_MS = 800;
const DELAY_MS = 25;

/** A seeded PRNG (mulberry32). @param {number} seed */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A 32-bit FNV-1a hash of a string. @param {string} s */
function fnv(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

async function tailServer() {
  const stats = { requests: 0, closed: 0 };
  const server = http.createServer((req, res) => {
    stats.requests += 1;
    const u = prng(fnv(`7/${req.headers["x-bench-call"]}/${req.url}/${req.headers["x-bench-ordinal"]}`))();
    const delay = u < 0.02 ? TAIL_MS : u < 0.07 ? SLOW_MS : FAST_MS;
    let answered = false;
    const timer = setTimeout(() => {
      answered = true;
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"ok":true}');
    }, delay);
    res.on("close", () => {
      if (!answered) {
        clearTimeout(timer);
        stats.closed += 1;
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    stats,
    port,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r(undefined));
      }),
  };
}

/** @param {number[]} xs @param {number} p */
function q(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))] ?? 0;
}

const plain = referencePolicy();
plain.max_total_attempts = 6;
for (const r of plain.routes) r.max_attempts = 3;
const hedged = structuredClone(plain);
/** @type {import("../dist/index.js").HedgeSection} */
const section = {
  cancelled_cost: "reserve",
  cost_share_percent: 50,
  delay_ms: DELAY_MS,
  effects: "none",
  max_hedges: 1,
  routes: ["external-fallback"],
};
hedged.hedge = section;
const compiledPlain = rl.compilePolicy(plain);
const compiledHedged = rl.compilePolicy(hedged);

const srv = await tailServer();
/** @type {Record<string, {lat: number[], attempts: number, cost: number, seen: number}>} */
const out = { plain: { lat: [], attempts: 0, cost: 0, seen: 0 }, hedged: { lat: [], attempts: 0, cost: 0, seen: 0 } };
let call = 0;
/** @param {string} route @param {number} ordinal @param {AbortSignal} signal */
const get = async (route, ordinal, signal) => {
  const headers = { "idempotency-key": KEY, "x-bench-call": String(call), "x-bench-ordinal": String(ordinal) };
  const r = await fetch(`http://127.0.0.1:${srv.port}/${route}`, { signal, headers });
  return r.ok && (await r.json()).ok === true;
};
try {
  for (let i = 0; i < 2 * CALLS; i++) {
    const mode = i % 2 === 0 ? "plain" : "hedged";
    call = Math.floor(i / 2);
    const before = srv.stats.requests;
    let receipt;
    if (mode === "plain") {
      receipt = (await rl.runWithPolicy(compiledPlain, (step, signal) => get(step.routeId, step.ordinal, signal), { idempotencyKey: KEY })).receipt;
    } else {
      receipt = (await rl.runHedged(compiledHedged, (a) => get(a.routeId, a.ordinal, a.signal), { idempotencyKey: KEY })).receipt;
      await new Promise((r) => setTimeout(r, 2)); // let an aborted request reach the server's count
    }
    const o = /** @type {{lat: number[], attempts: number, cost: number, seen: number}} */ (out[mode]);
    o.lat.push(receipt.finished_at_ms);
    o.attempts += receipt.attempt_count;
    o.cost += receipt.total_cost;
    o.seen += srv.stats.requests - before;
  }
} finally {
  await srv.close();
}

/** @param {{lat: number[], attempts: number, cost: number, seen: number}} o */
const figures = (o) => ({ p50: q(o.lat, 0.5), p90: q(o.lat, 0.9), p99: q(o.lat, 0.99), attempts: o.attempts / CALLS, seen: o.seen / CALLS, cost: o.cost / CALLS });
const p = figures(/** @type {any} */ (out.plain));
const h = figures(/** @type {any} */ (out.hedged));
/** @param {number} a @param {number} b */
const ratio = (a, b) => (a / Math.max(b, 1e-9)).toFixed(2);
const text = [
  `Node ${process.version}, ${CALLS} calls per mode, interleaved; server latency 93 % ${FAST_MS} ms, 5 % ${SLOW_MS} ms, 2 % ${TAIL_MS} ms on both routes, the same draws for call i in both modes; hedge after ${DELAY_MS} ms on the fallback.`,
  "",
  "| | p50 | p90 | p99 | attempts per call | requests the server saw per call | cost per call |",
  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  `| \`runWithPolicy\` (no hedging) | ${p.p50} ms | ${p.p90} ms | ${p.p99} ms | ${p.attempts.toFixed(2)} | ${p.seen.toFixed(2)} | ${p.cost.toFixed(0)} |`,
  `| \`runHedged\` | ${h.p50} ms | ${h.p90} ms | ${h.p99} ms | ${h.attempts.toFixed(2)} | ${h.seen.toFixed(2)} | ${h.cost.toFixed(0)} |`,
  `| ratio (hedged / plain) | ${ratio(h.p50, p.p50)} | ${ratio(h.p90, p.p90)} | ${ratio(h.p99, p.p99)} | ${ratio(h.attempts, p.attempts)} | ${ratio(h.seen, p.seen)} | ${ratio(h.cost, p.cost)} |`,
].join("\n");
console.log(text);
if (WRITE !== "") {
  const file = path.resolve(WRITE);
  const doc = fs.readFileSync(file, "utf8");
  const begin = "<!-- wasm-hedge:begin -->";
  const end = "<!-- wasm-hedge:end -->";
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${file}: markers ${begin} ... ${end} not found`);
  fs.writeFileSync(file, `${doc.slice(0, a + begin.length)}\n${text}\n${doc.slice(b)}`);
  console.log(`wrote ${path.relative(process.cwd(), file)} between ${begin} and ${end}`);
}
