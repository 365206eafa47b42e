// What a journal costs per attempt in Node, next to a bare INSERT + COMMIT on
// the same database (the same as python/benches/bench_journal.py): the
// reference run (three attempts) with runJournaled against an in-memory
// store (every event a fenced append, the lease checked in the same write),
// SQLite (better-sqlite3; WAL, synchronous NORMAL and FULL, a file
// under target/) and PostgreSQL (pg; DATABASE_URL, fsync on), a dispatch that
// answers at once and a clock that does not sleep; next to it the same run
// with runWithPolicy (no journal) and a bare INSERT of a ~300-byte row in its
// own transaction. Medians of R rounds of N runs, interleaved.
//
//   node bench/journal.mjs [--runs N] [--rounds R] [--write ../docs/BENCHMARKS.md]
//
// --write replaces the text between <!-- wasm-journal:begin --> and
// <!-- wasm-journal:end --> in that file (printed either way).
import fs from "node:fs";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import pg from "pg";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { KEY, referencePolicy } from "../test/helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
/** @param {string} name @param {string} fallback */
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? /** @type {string} */ (args[i + 1]) : fallback;
};
const RUNS = Number(arg("--runs", "20"));
const ROUNDS = Number(arg("--rounds", "5"));
const WRITE = arg("--write", "");
const BODY = "x".repeat(300);
const ATTEMPTS = 3;
const policy = rl.compilePolicy(referencePolicy());

/** @param {rl.JournalStep | rl.Step} step */
function dispatch(step) {
  if (step.ordinal === 3) {
    step.charge(step.reserveCost);
    return "ok";
  }
  step.charge(0);
  if (step.ordinal === 1) throw rl.AttemptError.retryable("rate_limited", 250);
  throw rl.AttemptError.retryable("unavailable");
}

function clockAt(/** @type {number} */ start) {
  let now = start;
  return { clock: () => now, sleep: async (/** @type {number} */ ms) => void (now += ms) };
}

/** @typedef {[string, () => Promise<unknown> | unknown, number]} Op */

/** @param {rl.JournalStore} store @param {(() => unknown) | undefined} bare @returns {Op[]} */
function contenders(store, bare) {
  const tag = randomUUID().slice(0, 12);
  let n = 0;
  /** @type {Op[]} */
  const ops = [
    [
      "journaled",
      async () => {
        const { clock, sleep } = clockAt(1_780_000_000_000);
        const r = await rl.runJournaled(policy, dispatch, { idempotencyKey: KEY, store, runId: `bench-${tag}-${n++}`, clock, sleep });
        if (r.terminal !== "completed") throw new Error(r.terminal);
      },
      ATTEMPTS,
    ],
    [
      "plain",
      async () => {
        const { clock, sleep } = clockAt(0);
        const r = await rl.runWithPolicy(policy, dispatch, { idempotencyKey: KEY, clock, sleep });
        if (r.sealed.terminal !== "completed") throw new Error(r.sealed.terminal);
      },
      ATTEMPTS,
    ],
  ];
  if (bare !== undefined) ops.push(["bare", bare, 1]);
  return ops;
}

/** @param {number[]} xs */
function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? /** @type {number} */ (s[m]) : (/** @type {number} */ (s[m - 1]) + /** @type {number} */ (s[m])) / 2;
}

/** @param {Op[]} ops @param {number} n @returns {Promise<Record<string, number>>} µs per attempt (per insert) */
async function measure(ops, n) {
  for (const [, op] of ops) for (let i = 0; i < 3; i++) await op();
  /** @type {Record<string, number[]>} */
  const walls = Object.fromEntries(ops.map(([name]) => [name, []]));
  for (let r = 0; r < ROUNDS; r++) {
    const k = r % ops.length;
    for (const [name, op, per] of [...ops.slice(k), ...ops.slice(0, k)]) {
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await op();
      /** @type {number[]} */ (walls[name]).push(((performance.now() - t0) * 1000) / n / per);
    }
  }
  return Object.fromEntries(Object.entries(walls).map(([k, v]) => [k, median(v)]));
}

/** @param {string} dir @param {"NORMAL" | "FULL"} synchronous @param {number} n */
async function sqlitePart(dir, synchronous, n) {
  const file = path.join(dir, `journal-${synchronous.toLowerCase()}.db`);
  for (const suffix of ["", "-wal", "-shm"]) fs.rmSync(`${file}${suffix}`, { force: true });
  const store = new SQLiteStore(file, { synchronous });
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  db.pragma(`synchronous = ${synchronous}`);
  db.exec("CREATE TABLE bench_bare (id INTEGER PRIMARY KEY, body TEXT NOT NULL)");
  const insert = db.prepare("INSERT INTO bench_bare (body) VALUES (?)");
  try {
    return await measure(contenders(store, () => insert.run(BODY)), n);
  } finally {
    db.close();
    store.close();
  }
}

let serverVersion = "?";
/** @param {string} url @param {number} n */
async function postgresPart(url, n) {
  const store = new PostgresStore({ connectionString: url, max: 1 });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query("CREATE TABLE IF NOT EXISTS retryledger_bench_journal_bare_node (id bigserial PRIMARY KEY, body text NOT NULL)");
  const bare = () => client.query({ name: "bare", text: "INSERT INTO retryledger_bench_journal_bare_node (body) VALUES ($1)", values: [BODY] });
  try {
    return await measure(contenders(store, bare), n);
  } finally {
    await client.query("DROP TABLE retryledger_bench_journal_bare_node");
    serverVersion = String((await client.query("SHOW server_version")).rows[0]?.server_version ?? "?").split(" ")[0] ?? "?";
    await client.end();
    await store.close();
  }
}

const dir = path.resolve(here, "../../target/bench-journal-node");
fs.mkdirSync(dir, { recursive: true });
/** @type {[string, Record<string, number>][]} */
const results = [
  ["in memory (`MemoryStore`)", await measure(contenders(new rl.MemoryStore(), undefined), RUNS * 5)],
  ["SQLite WAL, `synchronous=NORMAL`", await sqlitePart(dir, "NORMAL", RUNS * 5)],
  ["SQLite WAL, `synchronous=FULL`", await sqlitePart(dir, "FULL", RUNS)],
];
const url = process.env.DATABASE_URL;
if (url) {
  const figures = await postgresPart(url, RUNS);
  results.push([`PostgreSQL ${serverVersion}`, figures]);
}
fs.rmSync(dir, { recursive: true, force: true });
const require = (await import("node:module")).createRequire(import.meta.url);
const versions = `better-sqlite3 ${require("better-sqlite3/package.json").version}, pg ${require("pg/package.json").version}`;
/** @param {number} us */
const fmt = (us) => `${us.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 })} µs`;
/** @param {string} label @param {(f: Record<string, number>) => string} cell */
const row = (label, cell) => `| ${label} | ${results.map(([, f]) => cell(f)).join(" | ")} |`;
const lines = [
  `Node ${process.version}, ${versions}; \`wasm/bench/journal.mjs\`, the reference run (${ATTEMPTS} attempts), median of ${ROUNDS} interleaved rounds of ${RUNS.toLocaleString("en-US")} runs (${(RUNS * 5).toLocaleString("en-US")} in memory and for \`synchronous=NORMAL\`), every store call awaited.${url ? "" : " PostgreSQL: not measured (no `DATABASE_URL`; run under `tests/servers/with-postgres.sh`)."}`,
  "",
  `| per attempt (wall) | ${results.map(([name]) => name).join(" | ")} |`,
  `| --- |${" ---: |".repeat(results.length)}`,
  row("journaled run (`runJournaled`)", (f) => fmt(/** @type {number} */ (f.journaled))),
  row("plain run (`runWithPolicy`, no journal)", (f) => fmt(/** @type {number} */ (f.plain))),
  row("**the journal's cost** (the difference)", (f) => {
    const cost = /** @type {number} */ (f.journaled) - /** @type {number} */ (f.plain);
    return `**${fmt(cost)}**${f.bare === undefined ? "" : ` (**${(cost / f.bare).toFixed(1)}×** a bare insert)`}`;
  }),
  row("bare `INSERT` + `COMMIT` (one ~300-byte row, per insert)", (f) => (f.bare === undefined ? "–" : fmt(f.bare))),
];
const text = lines.join("\n");
console.log(text);
if (WRITE !== "") {
  const file = path.resolve(WRITE);
  const doc = fs.readFileSync(file, "utf8");
  const begin = "<!-- wasm-journal:begin -->";
  const end = "<!-- wasm-journal:end -->";
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${file}: markers ${begin} ... ${end} not found`);
  fs.writeFileSync(file, `${doc.slice(0, a + begin.length)}\n${text}\n${doc.slice(b)}`);
  console.log(`wrote ${path.relative(process.cwd(), file)} between ${begin} and ${end}`);
}
