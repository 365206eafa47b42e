// A child process of the store race test: one store client, driven line by
// line on stdin, one answer line of JSON on stdout per command.
//
//   node test/store-race-child.mjs <postgres|sqlite> <target>
//
// Commands (the time is process.hrtime.bigint(), the machine's monotonic
// clock, the same in every process; the child waits for it, so both racers
// start together):
//
//   cas <at_ns> <key> <document JSON>     compareAndSet(key, 0, document)
//   append <at_ns> <log> <seq> <event>    append(log, seq, event)
//
// Answer: {ok, generation | code, existing, start, end} (start and end in ns, as strings).
import readline from "node:readline";

import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";

// `node --test test/` runs every module under test/: without arguments this one has nothing to do.
if (process.argv[2] === undefined) process.exit(0);
const [backend, target] = process.argv.slice(2);
const store =
  backend === "postgres"
    ? new PostgresStore({ connectionString: /** @type {string} */ (target), max: 1 })
    : new SQLiteStore(/** @type {string} */ (target));

/** @param {string} rest @param {number} n @returns {string[]} the first n-1 words and the rest */
function words(rest, n) {
  const out = [];
  let s = rest;
  for (let i = 0; i < n - 1; i++) {
    const at = s.indexOf(" ");
    out.push(s.slice(0, at));
    s = s.slice(at + 1);
  }
  out.push(s);
  return out;
}

await store.lastSeq("warm-up"); // connect (and create the tables) before the first round
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
for await (const line of readline.createInterface({ input: process.stdin })) {
  const [command, at, rest] = words(line, 3);
  const target = BigInt(/** @type {string} */ (at));
  while (process.hrtime.bigint() < target);
  /** @type {Record<string, unknown>} */
  let answer;
  let start;
  if (command === "cas") {
    const [key, document] = words(/** @type {string} */ (rest), 2);
    start = process.hrtime.bigint();
    answer = { ...(await store.compareAndSet(/** @type {string} */ (key), 0, JSON.parse(/** @type {string} */ (document)))) };
  } else if (command === "append") {
    const [log, seq, event] = words(/** @type {string} */ (rest), 3);
    start = process.hrtime.bigint();
    answer = { ...(await store.append(/** @type {string} */ (log), Number(seq), /** @type {string} */ (event))) };
  } else {
    throw new Error(`unknown command ${command}`);
  }
  const end = process.hrtime.bigint();
  process.stdout.write(`${JSON.stringify({ ...answer, start: String(start), end: String(end) })}\n`);
}
await store.close();
