// What a store write costs in Node, next to a bare INSERT + COMMIT on the same
// database: for SQLite (better-sqlite3; WAL, synchronous NORMAL and FULL, a
// file under target/) and PostgreSQL (pg; DATABASE_URL, e.g. under
// tests/servers/with-postgres.sh, fsync on), the wall time per operation of a
// compare-and-set claiming a new key (generation 0), a compare-and-set of the
// next generation of one key, a log append of the next seq (a ~300-byte
// event), and a bare INSERT of a row of the same size in its own transaction
// through the same driver. Medians of R rounds of N operations, the four
// interleaved in a rotating order; the ratio is to the bare insert.
//
//   node bench/stores.mjs [--ops N] [--rounds R] [--write ../docs/BENCHMARKS.md]
//
// --write replaces the text between <!-- wasm-stores:begin --> and
// <!-- wasm-stores:end --> in that file (printed either way).
import fs from "node:fs";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import pg from "pg";

import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
/** @param {string} name @param {string} fallback */
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? /** @type {string} */ (args[i + 1]) : fallback;
};
const OPS = Number(arg("--ops", "200"));
const ROUNDS = Number(arg("--rounds", "5"));
const WRITE = arg("--write", "");
const BODY = "x".repeat(240);

/** @param {number} seq */
const event = (seq) => JSON.stringify({ kind: "dispatched", lease_generation: 1, prev_sha256: "0".repeat(64), seq, pad: BODY.slice(0, 140) });

/** @typedef {() => unknown} Op */

/**
 * @param {import("../dist/index.js").FleetStore & import("../dist/index.js").AppendLog} store
 * @param {Op} bare
 * @returns {[string, Op][]}
 */
function contenders(store, bare) {
  const run = randomUUID();
  const doc = { body: BODY };
  let claims = 0;
  let generation = 0;
  let seq = 0;
  return [
    ["bare", bare],
    [
      "claim",
      async () => {
        const w = await store.compareAndSet(`${run}/claim/${claims++}`, 0, doc);
        if (!w.ok) throw new Error("claim refused");
      },
    ],
    [
      "cas",
      async () => {
        const w = await store.compareAndSet(`${run}/register`, generation, doc);
        if (!w.ok) throw new Error("cas refused");
        generation = w.generation;
      },
    ],
    [
      "append",
      async () => {
        const a = await store.append(`${run}/journal`, seq, event(seq));
        if (!a.ok) throw new Error("append refused");
        seq++;
      },
    ],
  ];
}

/** @param {number[]} xs */
function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? /** @type {number} */ (s[m]) : (/** @type {number} */ (s[m - 1]) + /** @type {number} */ (s[m])) / 2;
}

/** @param {[string, Op][]} ops @param {number} n @returns {Promise<Record<string, number>>} µs per operation */
async function measure(ops, n) {
  for (const [, op] of ops) for (let i = 0; i < 5; i++) await op();
  /** @type {Record<string, number[]>} */
  const walls = Object.fromEntries(ops.map(([name]) => [name, []]));
  for (let r = 0; r < ROUNDS; r++) {
    const k = r % ops.length;
    for (const [name, op] of [...ops.slice(k), ...ops.slice(0, k)]) {
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await op();
      /** @type {number[]} */ (walls[name]).push(((performance.now() - t0) * 1000) / n);
    }
  }
  return Object.fromEntries(Object.entries(walls).map(([k, v]) => [k, median(v)]));
}

/** @param {string} dir @param {"NORMAL" | "FULL"} synchronous @param {number} n */
async function sqlitePart(dir, synchronous, n) {
  const file = path.join(dir, `stores-${synchronous.toLowerCase()}.db`);
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

/** @param {string} url @param {number} n */
async function postgresPart(url, n) {
  const store = new PostgresStore({ connectionString: url, max: 1 });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query("CREATE TABLE IF NOT EXISTS retryledger_bench_bare_node (id bigserial PRIMARY KEY, body text NOT NULL)");
  const bare = () => client.query({ name: "bare", text: "INSERT INTO retryledger_bench_bare_node (body) VALUES ($1)", values: [BODY] });
  try {
    return await measure(contenders(store, bare), n);
  } finally {
    await client.query("DROP TABLE retryledger_bench_bare_node");
    const version = (await client.query("SHOW server_version")).rows[0]?.server_version;
    await client.end();
    await store.close();
    serverVersion = String(version ?? "?").split(" ")[0] ?? "?";
  }
}
let serverVersion = "?";

const ROWS = [
  ["claim", "register compare-and-set, a new key (generation 0: a claim)"],
  ["cas", "register compare-and-set, the next generation of one key"],
  ["append", "log append, the next `seq` (a ~300-byte event)"],
  ["bare", "bare `INSERT` + `COMMIT` (autocommit, same row size)"],
];

const dir = path.resolve(here, "../../target/bench-stores-node");
fs.mkdirSync(dir, { recursive: true });
/** @type {[string, Record<string, number>][]} */
const results = [
  ["SQLite WAL, `synchronous=NORMAL`", await sqlitePart(dir, "NORMAL", OPS * 5)],
  ["SQLite WAL, `synchronous=FULL`", await sqlitePart(dir, "FULL", OPS)],
];
const url = process.env.DATABASE_URL;
if (url) {
  const figures = await postgresPart(url, OPS);
  results.push([`PostgreSQL ${serverVersion}`, figures]);
}
fs.rmSync(dir, { recursive: true, force: true });
const require = (await import("node:module")).createRequire(import.meta.url);
const versions = `better-sqlite3 ${require("better-sqlite3/package.json").version}, pg ${require("pg/package.json").version}`;
const lines = [
  `Node ${process.version}, ${versions}; \`wasm/bench/stores.mjs\`, median of ${ROUNDS} interleaved rounds of ${OPS.toLocaleString("en-US")} operations (${(OPS * 5).toLocaleString("en-US")} for \`synchronous=NORMAL\`), each awaited before the next; the ratio is to the bare insert on the same database.${url ? "" : " PostgreSQL: not measured (no `DATABASE_URL`; run under `tests/servers/with-postgres.sh`)."}`,
  "",
  `| per operation (wall) | ${results.map(([name]) => name).join(" | ")} |`,
  `| --- |${" ---: |".repeat(results.length)}`,
  ...ROWS.map(([key, label]) => {
    const cells = results.map(([, f]) => {
      const us = /** @type {number} */ (f[/** @type {string} */ (key)]);
      const fmt = us.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
      return key === "bare" ? `${fmt} µs` : `${fmt} µs (**${(us / /** @type {number} */ (f.bare)).toFixed(2)}×**)`;
    });
    return `| ${label} | ${cells.join(" | ")} |`;
  }),
];
const text = lines.join("\n");
console.log(text);
if (WRITE !== "") {
  const file = path.resolve(WRITE);
  const doc = fs.readFileSync(file, "utf8");
  const begin = "<!-- wasm-stores:begin -->";
  const end = "<!-- wasm-stores:end -->";
  const a = doc.indexOf(begin);
  const b = doc.indexOf(end);
  if (a < 0 || b < a) throw new Error(`${file}: markers ${begin} ... ${end} not found`);
  fs.writeFileSync(file, `${doc.slice(0, a + begin.length)}\n${text}\n${doc.slice(b)}`);
  console.log(`wrote ${path.relative(process.cwd(), file)} between ${begin} and ${end}`);
}
