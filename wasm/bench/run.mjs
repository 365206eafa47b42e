// Benchmarks of the npm package, side by side in one run:
//
// * CPU and wall time per logical call of three attempts (two retryable
//   failures, then success; dispatch settles at once; zero real waits) for
//   `runWithPolicy` with the receipt read, p-retry, cockatiel and a bare
//   try/catch loop;
// * the per-event overhead of `runStream` over iterating the same in-memory
//   async stream of small SDK-like events directly (CPU and wall µs per event);
// * fleet protection: the cost per attempt of admission and breaker record
//   against an in-memory store, and with REDIS_URL set, the store round trips
//   per attempt against Redis next to a plain GET/SET pair;
// * the WebAssembly module's size after wasm-opt -Oz, raw and gzip.
//
// `node bench/run.mjs [--write ../docs/BENCHMARKS.md] [--calls N] [--rounds R] [--events N]`
// prints a table and, with --write, replaces the text between
// <!-- wasm:begin --> and <!-- wasm:end --> in that file.
//
// The contenders use only the package's public entry (runWithPolicy,
// CompiledPolicy, AttemptError). The two rows that show where the driver's
// time goes make the driver's own session calls (`observePrepared`,
// `sealAndRelease` from dist/), so they follow a rewrite of those.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";

import { ConstantBackoff, handleAll, retry } from "cockatiel";
import pRetry from "p-retry";

import { AttemptError, CompiledPolicy, Fleet, MemoryStore, RETURNED, runStream, runWithPolicy } from "../dist/index.js";
import { preparedFacts } from "../dist/facts.js";
import { sealAndRelease } from "../dist/session.js";

const here = path.dirname(fileURLToPath(import.meta.url));

// ---- options -------------------------------------------------------------

const args = process.argv.slice(2);
/** @param {string} name */
const option = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const target = option("--write");
/** Calls per batch for the contenders that run without a timer. */
const CALLS = Number(option("--calls") ?? 20_000);
/** Interleaved rounds; every figure is the median over them. */
const ROUNDS = Number(option("--rounds") ?? 7);
/** Provider events per streamed run. */
const EVENTS = Number(option("--events") ?? 10_000);
/** Logical calls per batch with a fleet (in memory; a tenth of them against Redis). */
const FLEET_CALLS = Number(option("--fleet-calls") ?? 5_000);

// ---- the policy: one route, three attempts -------------------------------

const KEY = "bench-key: tenant-1/op-42";

/** The conformance vectors' reference policy, cut to one route of three
 * attempts with the core's smallest backoff (1 ms), which the driver waits on
 * an injected clock: zero real delay. @returns {import("../dist/index.js").Policy} */
function benchPolicy() {
  const file = path.resolve(here, "../../tests/vectors/plan.json");
  const doc = JSON.parse(fs.readFileSync(file, "utf8"));
  const c = doc.cases.find((/** @type {{name: string}} */ x) => x.name === "empty_run_dispatches_primary");
  if (c === undefined) throw new Error(`${file}: reference policy not found`);
  const p = JSON.parse(c.input.policy);
  p.routes = [{ ...p.routes[0], max_attempts: 3 }];
  p.max_total_attempts = 3;
  p.max_total_cost = 1_000_000;
  p.deadline_ms = 600_000;
  p.backoff = { base_ms: 1, max_ms: 1, retry_after_cap_ms: 1 };
  p.idempotency_key_sha256 = createHash("sha256").update(KEY, "utf8").digest("hex");
  return p;
}
const policy = benchPolicy();
const compiled = new CompiledPolicy(policy);

// ---- the contenders --------------------------------------------------------

// The same pre-built failure for every contender, so none pays for stack traces.
const failure = AttemptError.retryable("unavailable");

/** Dispatch: fails twice, then succeeds; settles at once. */
function makeDispatch() {
  let n = 0;
  return async () => {
    n += 1;
    if (n < 3) throw failure;
    return n;
  };
}

/** runWithPolicy on a clock that its sleep advances; reads the receipt. @param {import("../dist/index.js").Policy | CompiledPolicy} p */
function retryledgerCall(p) {
  return async () => {
    let t = 0;
    const run = await runWithPolicy(p, makeDispatch(), {
      idempotencyKey: KEY,
      clock: () => t,
      sleep: async (ms) => {
        t += ms;
      },
    });
    return run.receipt.attempts_sha256;
  };
}

async function bareCall() {
  const dispatch = makeDispatch();
  let last;
  for (let attempt = 0; attempt < 3; attempt += 1) {
    try {
      return await dispatch();
    } catch (e) {
      last = e;
    }
  }
  throw last;
}

const P_RETRY_OPTIONS = { retries: 2, minTimeout: 0, factor: 1, randomize: false };
async function pRetryCall() {
  const dispatch = makeDispatch();
  return pRetry(() => dispatch(), P_RETRY_OPTIONS);
}

/** The failure's facts as the driver hands them to the core. */
const prepared = (() => {
  const f = preparedFacts(failure);
  if (f === undefined) throw new Error("bench: the failure has no prepared facts");
  return f;
})();

/**
 * The driver's session calls alone, for the same three attempts: each
 * decision, each outcome recorded as the driver records it; then the
 * session freed (`seal = false`), or sealed as the driver seals it with the
 * receipt read. The difference is what sealing and the receipt cost, if
 * anything a little less: a sealed session's memory serves the next one,
 * while a freed one's next session is allocated afresh.
 * @param {boolean} seal
 */
function sessionCall(seal) {
  return async () => {
    const s = compiled.session();
    for (let i = 0; i < 3; i += 1) {
      const d = s.next();
      if (d.kind !== "dispatch") throw new Error("bench: the session stopped early");
      const t = d.not_before_ms;
      if (i < 2) s.observePrepared(t, t, undefined, prepared, failure.outcome);
      else s.observe({ started_at_ms: t, completed_at_ms: t, facts: RETURNED });
    }
    if (!seal) {
      s.free();
      return 0;
    }
    return sealAndRelease(s).receipt.attempts_sha256;
  };
}

const cockatiel = retry(handleAll, { maxAttempts: 2, backoff: new ConstantBackoff(0) });
async function cockatielCall() {
  const dispatch = makeDispatch();
  return cockatiel.execute(() => dispatch());
}

/**
 * @typedef {{ id: string, label: string, calls: number, call: () => Promise<unknown> }} Contender
 * @type {Contender[]}
 */
const contenders = [
  {
    id: "retryledger",
    label: "`runWithPolicy`, `CompiledPolicy` reused, `receipt.attempts_sha256` read",
    calls: CALLS,
    call: retryledgerCall(compiled),
  },
  {
    id: "retryledgerUncompiled",
    label: "`runWithPolicy`, policy given as an object (its JSON text looked up, compiled once), receipt read",
    calls: Math.max(500, Math.floor(CALLS / 4)),
    call: retryledgerCall(policy),
  },
  {
    id: "pRetry",
    label: `p-retry \`{retries: 2, minTimeout: 0, factor: 1, randomize: false}\``,
    calls: CALLS,
    call: pRetryCall,
  },
  {
    id: "cockatiel",
    label: "cockatiel `retry(handleAll, {maxAttempts: 2, backoff: new ConstantBackoff(0)})`",
    // It awaits a real timer between attempts (Node clamps 0 ms to 1 ms): fewer calls.
    calls: Math.max(50, Math.floor(CALLS / 100)),
    call: cockatielCall,
  },
  { id: "bare", label: "bare try/catch loop, 3 attempts", calls: CALLS, call: bareCall },
  {
    id: "sessionOpen",
    label: "where the time goes: the driver's session calls alone (`next`, the 3 outcomes recorded), not sealed",
    calls: CALLS,
    call: sessionCall(false),
  },
  {
    id: "sessionSealed",
    label: "where the time goes: the same, sealed as the driver seals, `receipt.attempts_sha256` read",
    calls: CALLS,
    call: sessionCall(true),
  },
];

// ---- measurement -----------------------------------------------------------

/** CPU (user + system, every thread of the process) and wall µs per call over one batch. @param {Contender} c */
async function batch(c) {
  const cpu0 = process.cpuUsage();
  const wall0 = performance.now();
  for (let i = 0; i < c.calls; i += 1) await c.call();
  const wall = (performance.now() - wall0) * 1000;
  const cpu = process.cpuUsage(cpu0);
  return { cpu: (cpu.user + cpu.system) / c.calls, wall: wall / c.calls };
}

/** @param {number[]} xs */
function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? /** @type {number} */ (s[m]) : (/** @type {number} */ (s[m - 1]) + /** @type {number} */ (s[m])) / 2;
}

// Each contender answers correctly and is warmed up before any round counts.
for (const c of contenders) {
  const got = await c.call();
  if (got === undefined) throw new Error(`${c.id}: no result`);
  await batch(c);
}
/** @type {Map<string, {cpu: number[], wall: number[]}>} */
const samples = new Map(contenders.map((c) => [c.id, { cpu: [], wall: [] }]));
for (let r = 0; r < ROUNDS; r += 1) {
  // Rotate the order each round, so that a burst of load on the shared machine hits all alike.
  for (let k = 0; k < contenders.length; k += 1) {
    const c = /** @type {Contender} */ (contenders[(r + k) % contenders.length]);
    const s = await batch(c);
    const acc = /** @type {{cpu: number[], wall: number[]}} */ (samples.get(c.id));
    acc.cpu.push(s.cpu);
    acc.wall.push(s.wall);
  }
}
/** @type {Record<string, {cpu: number, wall: number}>} */
const fig = {};
for (const [id, s] of samples) fig[id] = { cpu: median(s.cpu), wall: median(s.wall) };
/** @param {string} id */
const get = (id) => /** @type {{cpu: number, wall: number}} */ (fig[id]);
const led = get("retryledger");
const pr = get("pRetry");
const ratio = led.cpu / pr.cpu;
const TARGET = 1.0;
/** What sealing the run and reading its receipt cost: the two session rows' difference. */
const seal = get("sessionSealed").cpu - get("sessionOpen").cpu;

// ---- streaming: per-event overhead ------------------------------------------

// One streamed run of EVENTS chat-completion-like chunks (the text a few
// bytes each, the last chunk with a finish_reason), in tentative mode on the
// real clock (one watchdog timer per attempt, armed for the deadline), next
// to a `for await` over the same async generator. Both consumers read each
// event's text. The runStream figure includes the run's fixed costs (session,
// observe with EVENTS delta digests, seal) spread over its events.
/** @type {import("../dist/index.js").Policy} */
const streamPolicy = { ...policy, stream: { mode: "tentative", max_response_bytes: 16 * 1024 * 1024 } };
const streamCompiled = new CompiledPolicy(streamPolicy);
const chunks = Array.from({ length: EVENTS }, (_, i) => ({
  id: "chatcmpl-bench",
  object: "chat.completion.chunk",
  choices: [{ index: 0, delta: { content: `tok${i % 10} ` }, finish_reason: i === EVENTS - 1 ? "stop" : null }],
}));
async function* provider() {
  for (const c of chunks) yield c;
}
/** @type {import("../dist/index.js").StreamReader<(typeof chunks)[number]>} */
const benchReader = {
  text: (e) => e.choices[0]?.delta.content ?? "",
  terminal: (e) => e.choices[0]?.finish_reason !== null,
};

async function directStream() {
  let n = 0;
  for await (const ev of provider()) n += (ev.choices[0]?.delta.content ?? "").length;
  return n;
}

async function runStreamed() {
  let n = 0;
  const run = runStream(streamCompiled, () => provider(), { idempotencyKey: KEY, reader: benchReader });
  for await (const ev of run) if (ev.kind === "delta") n += (ev.text ?? "").length;
  if (run.terminal !== "completed") throw new Error(`stream run ended ${run.terminal}`);
  return n;
}

// The core's share: one Session judging an attempt of the same EVENTS delta
// texts (each crosses into the module and is hashed there).
const benchDeltas = chunks.map((c) => c.choices[0]?.delta.content ?? "");
const benchBytes = benchDeltas.reduce((a, d) => a + Buffer.byteLength(d, "utf8"), 0);
async function coreOnly() {
  const session = streamCompiled.session();
  const j = session.observe({
    started_at_ms: 0,
    completed_at_ms: 1,
    facts: { result: "returned", stream: { bytes: benchBytes, events: EVENTS, terminal_event: true, usage_event: false } },
    deltas: benchDeltas,
  });
  if (j.stream !== "commit") throw new Error(`core: ${j.stream}`);
  session.free();
  return 1;
}

/** CPU and wall µs per event over one run. @param {() => Promise<number>} f */
async function perEvent(f) {
  const cpu0 = process.cpuUsage();
  const wall0 = performance.now();
  await f();
  const wall = (performance.now() - wall0) * 1000;
  const cpu = process.cpuUsage(cpu0);
  return { cpu: (cpu.user + cpu.system) / EVENTS, wall: wall / EVENTS };
}

if ((await directStream()) !== (await runStreamed())) throw new Error("the streamed run read other text");
for (let i = 0; i < 3; i += 1) {
  await perEvent(directStream);
  await perEvent(runStreamed);
}
/** @type {Record<"direct" | "driven" | "core", {cpu: number[], wall: number[]}>} */
const streamSamples = { direct: { cpu: [], wall: [] }, driven: { cpu: [], wall: [] }, core: { cpu: [], wall: [] } };
const streamRuns = { direct: directStream, driven: runStreamed, core: coreOnly };
for (let r = 0; r < ROUNDS * 3; r += 1) {
  const names = /** @type {const} */ (["direct", "driven", "core"]);
  for (let k = 0; k < names.length; k += 1) {
    const which = /** @type {(typeof names)[number]} */ (names[(r + k) % names.length]);
    const s = await perEvent(streamRuns[which]);
    streamSamples[which].cpu.push(s.cpu);
    streamSamples[which].wall.push(s.wall);
  }
}
/** @param {"direct" | "driven" | "core"} which */
const streamFig = (which) => ({ cpu: median(streamSamples[which].cpu), wall: median(streamSamples[which].wall) });
const sDirect = streamFig("direct");
const sDriven = streamFig("driven");
const sCore = streamFig("core");
const overhead = { cpu: sDriven.cpu - sDirect.cpu, wall: sDriven.wall - sDirect.wall };
const STREAM_TARGET = 2.0;

// ---- fleet: admission and breaker record per attempt ------------------------

// The same three-attempt call under a fleet section (a breaker that the two
// failures do not open, a retry budget that covers both retries), against a
// MemoryStore; and, with REDIS_URL, against Redis, counting the store's round
// trips (a pipelined read of several keys is one).
const fleetCompiled = new CompiledPolicy({
  ...policy,
  fleet: {
    breaker: { consecutive_failures: 100, half_open_probes: 1, open_ms: 1000 },
    on_store_unavailable: "fail_closed",
    retry_budget: { scope: "bench", ratio_permille: 10_000, floor_per_second: 1000, max_tokens: 1000 },
  },
});

/**
 * A store wrapper counting calls (each one round trip to a remote store).
 * `plain`: only `get`, `getMany` and `compareAndSet` (the path of a store
 * without the multi-key check-and-set: a read before every write, one
 * compare-and-set per snapshot); else `getManyRaw` and `checkAndSet` too,
 * as the package's stores have them.
 * @param {import("../dist/index.js").FleetStore} inner @param {boolean} [plain]
 */
function counted(inner, plain = false) {
  const n = { trips: 0 };
  /** @type {import("../dist/index.js").FleetStore} */
  const store = {
    get: (k) => (n.trips++, inner.get(k)),
    compareAndSet: (k, g, d) => (n.trips++, inner.compareAndSet(k, g, d)),
    getMany: (keys) => (n.trips++, inner.getMany ? inner.getMany(keys) : Promise.all(keys.map((k) => inner.get(k)))),
  };
  if (!plain) {
    const { getManyRaw, checkAndSet } = inner;
    if (getManyRaw === undefined || checkAndSet === undefined) throw new Error("fleet bench: the store has no checkAndSet");
    store.getManyRaw = (keys) => (n.trips++, getManyRaw.call(inner, keys));
    store.checkAndSet = (entries) => (n.trips++, checkAndSet.call(inner, entries));
  }
  return { store, n };
}

/** @param {import("../dist/index.js").Fleet | undefined} fleet @param {CompiledPolicy} p */
function fleetCall(fleet, p) {
  return async () => {
    let t = 0;
    const options = { idempotencyKey: KEY, clock: () => t, sleep: async (/** @type {number} */ ms) => void (t += ms) };
    const run = await runWithPolicy(p, makeDispatch(), fleet === undefined ? options : { ...options, fleet });
    if (run.receipt.attempt_count !== 3) throw new Error("fleet bench: not three attempts");
    return run.receipt.attempts_sha256;
  };
}

/** Median CPU and wall µs per call over ROUNDS batches of `calls`. @param {() => Promise<unknown>} call @param {number} calls */
async function medianOf(call, calls) {
  await batch({ id: "", label: "", calls: Math.max(1, calls >> 3), call });
  const cpu = [];
  const wall = [];
  for (let r = 0; r < ROUNDS; r += 1) {
    const s = await batch({ id: "", label: "", calls, call });
    cpu.push(s.cpu);
    wall.push(s.wall);
  }
  return { cpu: median(cpu), wall: median(wall) };
}

/**
 * Median CPU and wall µs per attempt (with the fleet − without, / 3) and the
 * store round trips per attempt, over ROUNDS batches of `calls`.
 * @param {import("../dist/index.js").FleetStore} inner @param {boolean} plain @param {string} ns @param {number} calls
 */
async function fleetMeasure(inner, plain, ns, calls) {
  const c = counted(inner, plain);
  const fleet = new Fleet(c.store, { namespace: ns });
  const m = await medianOf(fleetCall(fleet, fleetCompiled), calls);
  const made = Math.max(1, calls >> 3) + ROUNDS * calls;
  return { cpu: (m.cpu - fNone.cpu) / 3, wall: (m.wall - fNone.wall) / 3, trips: c.n.trips / (made * 3) };
}

const fNone = await medianOf(fleetCall(undefined, compiled), FLEET_CALLS);
const fMem = await fleetMeasure(new MemoryStore(), false, "bench", FLEET_CALLS);
const fMemPlain = await fleetMeasure(new MemoryStore(), true, "bench-plain", FLEET_CALLS);

/** @type {{fleet: {cpu: number, wall: number, trips: number}, plain: {cpu: number, wall: number, trips: number}, getset: {cpu: number, wall: number}} | undefined} */
let fRedis;
const redisUrl = process.env.REDIS_URL;
if (redisUrl !== undefined && redisUrl !== "") {
  const { RedisStore } = await import("../dist/stores/redis.js");
  const redisStore = new RedisStore({ url: redisUrl });
  const n = Math.max(1, FLEET_CALLS >> 4);
  const fleet = await fleetMeasure(redisStore, false, `bench-${process.pid}`, n);
  const plain = await fleetMeasure(redisStore, true, `bench-plain-${process.pid}`, n);
  const client = redisStore.client;
  const getset = await medianOf(async () => {
    await client.get(`bench-${process.pid}/plain`);
    await client.set(`bench-${process.pid}/plain`, "x");
    return 1;
  }, n * 3);
  fRedis = { fleet, plain, getset };
  await redisStore.close();
}

// ---- module sizes ------------------------------------------------------------

/** @param {string} dir */
function sizes(dir) {
  const wasm = fs.readFileSync(path.resolve(here, `../${dir}/retryledger_wasm_bg.wasm`));
  return { raw: wasm.length, gz: zlib.gzipSync(wasm, { level: 9 }).length };
}
const optLevel = process.env.WASM_OPT_LEVEL ?? "2";
const altLevel = process.env.WASM_ALT_OPT_LEVEL ?? (optLevel === "z" ? "2" : "z");
const big = sizes("pkg-node");
// pkg-size and pkg-web exist once `make bench-wasm` has built them.
const small = fs.existsSync(path.resolve(here, "../pkg-size")) ? sizes("pkg-size") : undefined;
const webGlue = path.resolve(here, "../pkg-web/retryledger_wasm.js");
const glue = fs.existsSync(webGlue) ? fs.statSync(webGlue).size : undefined;

// ---- report ------------------------------------------------------------------

const kb = (/** @type {number} */ n) => `${(n / 1024).toFixed(1)} KiB`;
const bytes = (/** @type {number} */ n) => `${n.toLocaleString("en-US")} B (${kb(n)})`;
const us = (/** @type {number} */ x) => `${x.toFixed(2)} µs`;
const callsOf = (/** @type {string} */ id) => contenders.find((c) => c.id === id)?.calls ?? 0;
const pkgVersion = (/** @type {string} */ name) =>
  JSON.parse(fs.readFileSync(path.resolve(here, `../node_modules/${name}/package.json`), "utf8")).version;

const lines = [
  `Node ${process.version}, ${os.cpus()[0]?.model ?? "cpu"} (${os.cpus().length} cores, shared), one run of \`make bench\`; p-retry ${pkgVersion("p-retry")}, cockatiel ${pkgVersion("cockatiel")}.`,
  "",
  `Per logical call of three attempts (two retryable failures, then success; dispatch settles at once; no real wait). CPU is \`process.cpuUsage()\` user + system over a batch of calls (${callsOf("retryledger").toLocaleString("en-US")} calls; ${callsOf("cockatiel")} for cockatiel, ${callsOf("retryledgerUncompiled").toLocaleString("en-US")} for the policy given as an object), wall is \`performance.now()\` over the same batch; each figure is the median of ${ROUNDS} rounds, the contenders interleaved in a rotating order within each round.`,
  "",
  "| contender | CPU per call | wall per call | retryledger CPU ÷ its CPU |",
  "| --- | ---: | ---: | ---: |",
  ...contenders.map((c) => {
    const f = get(c.id);
    return `| ${c.label} | ${us(f.cpu)} | ${us(f.wall)} | ${(led.cpu / f.cpu).toFixed(2)} |`;
  }),
  "",
  `**retryledger CPU / p-retry CPU = ${ratio.toFixed(2)} (target <= ${TARGET.toFixed(2)}): ${ratio <= TARGET ? "holds" : "does not hold"}.** ` +
    `Wall: ${(led.wall / pr.wall).toFixed(2)}. Over the bare loop the driver costs +${us(led.cpu - get("bare").cpu)} CPU per call.`,
  "",
  `Where the time goes (the last two rows): sealing the run and reading its receipt cost ${us(seal)} CPU of the driver's ${us(led.cpu)} ` +
    "(the attempts' canonical JSON written by the module, its SHA-256, the receipt written as a tape and made into the object). " +
    `The rest of the driver, the retry loop with each attempt planned and recorded by the core, costs ${us(led.cpu - seal)}: ` +
    `${((led.cpu - seal) / pr.cpu).toFixed(2)} × p-retry's CPU.`,
  "",
  "p-retry makes no timer call when the delay is 0, so its wall time is its CPU time. cockatiel awaits a timer between attempts even at 0 ms, which Node clamps to 1 ms: its wall time is dominated by that timer, and CPU time is the fair figure for it. The driver waits here on an injected clock (the core's smallest backoff is 1 ms), on which it arms no timer; it records each attempt in the module and seals the receipt (the module writes the attempts' canonical JSON, hashed with Node's SHA-256 where the module wrote it, and the receipt around that digest, encoded straight from the run as a tape in which the policy's strings cross by number, from which the plain object is made; the receipt's canonical JSON, for `receipt_sha256` and `bundle_json`, is written by the module from a copy of that tape when first read, which this loop does not do), which none of the others do.",
  "",
  `Streaming: one run of ${EVENTS.toLocaleString("en-US")} small chat-completion-like events from an in-memory async generator, \`runStream\` (tentative mode, real clock, one watchdog timer per attempt) against a \`for await\` over the same generator; both read each event's text. Per event, median of ${ROUNDS * 3} runs each, alternating; the runStream figure includes the run's fixed costs (session, observe with ${EVENTS.toLocaleString("en-US")} delta digests, seal).`,
  "",
  "| consumer | CPU per event | wall per event |",
  "| --- | ---: | ---: |",
  `| \`for await\` over the provider stream | ${us(sDirect.cpu)} | ${us(sDirect.wall)} |`,
  `| \`runStream\` (delta events, then the commit) | ${us(sDriven.cpu)} | ${us(sDriven.wall)} |`,
  `| overhead of \`runStream\` | ${us(overhead.cpu)} | ${us(overhead.wall)} |`,
  `| of which the core alone: \`Session.observe\` of the same ${EVENTS.toLocaleString("en-US")} deltas | ${us(sCore.cpu)} | ${us(sCore.wall)} |`,
  `| of which the driver in JavaScript (overhead − core) | ${us(overhead.cpu - sCore.cpu)} | ${us(overhead.wall - sCore.wall)} |`,
  "",
  `**Per-event overhead ${us(overhead.cpu)} CPU (target <= ${us(STREAM_TARGET)}): ${overhead.cpu <= STREAM_TARGET ? "holds" : "does not hold"}.** ` +
    "The core's share is the crossing of every delta text into the module and its SHA-256 there (the event log binds each delta); the sealed bundle, whose event log is built when first read, is not read here.",
  "",
  `Fleet protection: the same three-attempt call with a policy \`fleet\` section (a breaker per route release and a retry budget) and \`fleet\` in the run options. With a store that has the multi-key \`checkAndSet\` (every store of the package): before each attempt the core previews the admission under the view the fleet cached, and one check-and-set checks every key of the view and writes the changed snapshots, after which the core commits the admission under the same view (a key not cached is read first; a stale cache is refreshed from the check-and-set's answer and the admission made again); after it, the breaker's next snapshot is computed from the one the fleet cached and written by one check-and-set. A store with only \`get\` and \`compareAndSet\` is read before the record too, and each snapshot written by its own compare-and-set. Median of ${ROUNDS} batches of ${FLEET_CALLS.toLocaleString("en-US")} calls; per attempt = (with the fleet − without) / 3; round trips per attempt counted over every call made.`,
  "",
  "| store | CPU per attempt | wall per attempt | store round trips per attempt |",
  "| --- | ---: | ---: | ---: |",
  `| \`MemoryStore\` (admission + breaker record) | ${us(fMem.cpu)} | ${us(fMem.wall)} | ${fMem.trips.toFixed(2)} calls |`,
  `| \`MemoryStore\`, \`get\`/\`compareAndSet\` only | ${us(fMemPlain.cpu)} | ${us(fMemPlain.wall)} | ${fMemPlain.trips.toFixed(2)} calls |`,
  ...(fRedis === undefined
    ? ["| Redis | not measured (no `REDIS_URL`; run under `tests/servers/with-redis.sh`) | | |"]
    : [
        `| Redis on loopback (\`RedisStore\`, ioredis; ${Math.max(1, FLEET_CALLS >> 4).toLocaleString("en-US")} calls per batch) | ${us(fRedis.fleet.cpu)} | ${us(fRedis.fleet.wall)} | ${fRedis.fleet.trips.toFixed(2)} |`,
        `| Redis on loopback, \`get\`/\`compareAndSet\` only | ${us(fRedis.plain.cpu)} | ${us(fRedis.plain.wall)} | ${fRedis.plain.trips.toFixed(2)} |`,
        `| a plain GET then SET on the same client, for scale | ${us(fRedis.getset.cpu)} | ${us(fRedis.getset.wall)} | 2 |`,
      ]),
  "",
  "WebAssembly module after `wasm-opt -Oz` (binaryen 132 from npm; wasm-pack's own download off):",
  "",
  "| module | raw | gzip -9 |",
  "| --- | ---: | ---: |",
  `| shipped: \`retryledger_wasm_bg.wasm\`, opt-level ${optLevel} (every test runs on it) | ${bytes(big.raw)} | ${bytes(big.gz)} |`,
  ...(small === undefined ? [] : [`| the same at opt-level ${altLevel} (\`WASM_OPT_LEVEL=${altLevel}\`) | ${bytes(small.raw)} | ${bytes(small.gz)} |`]),
  ...(glue === undefined ? [] : [`| \`retryledger_wasm.js\` (web glue) | ${bytes(glue)} | |`]),
  "",
  `Target: at most 150 KB (150,000 B) raw for the shipped module; ${big.raw <= 150_000 ? "met" : `not met (${bytes(big.raw)})`}. The core decodes and encodes documents with its own strict reader and hand-written codec (no serde derives), so what remains is spread out: SHA-256, the allocator, the wasm-bindgen glue, the decoders and error messages; the replay lab is left out of the module. The shipped module is built for the driver's speed target above (a run's cost is mostly the core's); the opt-level ${optLevel === "z" ? altLevel : "z"} build is the small one.`,
];

const text = lines.join("\n");
console.log(text);

if (target !== undefined) {
  const file = path.resolve(process.cwd(), target);
  const doc = fs.readFileSync(file, "utf8");
  const begin = "<!-- wasm:begin -->";
  const end = "<!-- wasm:end -->";
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${file}: markers ${begin} ... ${end} not found`);
  fs.writeFileSync(file, `${doc.slice(0, a + begin.length)}\n${text}\n${doc.slice(b)}`);
  console.log(`wrote ${path.relative(process.cwd(), file)} between ${begin} and ${end}`);
}
