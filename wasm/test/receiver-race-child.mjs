// A child process of the receiver race test: one receiver guard over a
// PostgreSQL store, driven line by line on stdin, one answer line of JSON on
// stdout per command.
//
//   node test/receiver-race-child.mjs <database url> <register prefix>
//
// Command (the time is process.hrtime.bigint(), the machine's monotonic
// clock, the same in every process; the child waits for it, so both racers
// start together):
//
//   claim <at_ns> <idempotency key> <body>
//
// The child runs the guard's claim path (read the record, the core's claim,
// compare-and-set) for `POST /orders` with that key and body, and answers
// {admitted, status, code, firstReadEmpty, cas: [ok, ...], start, end} (start
// and end in ns, as strings); an admitted request is left in progress.
import readline from "node:readline";

import { PostgresStore } from "../dist/stores/postgres.js";
import { IdempotencyGuard } from "../dist/receiver-node.js";

// `node --test test/` runs every module under test/: without arguments this one has nothing to do.
if (process.argv[2] === undefined) process.exit(0);
const [url, prefix] = /** @type {[string, string]} */ (process.argv.slice(2));
const inner = new PostgresStore({ connectionString: url, max: 1 });

/** @type {number[]} */
const reads = [];
/** @type {boolean[]} */
const cas = [];
const store = {
  /** @param {string} key */
  async get(key) {
    const read = await inner.get(key);
    reads.push(read.generation);
    return read;
  },
  /** @param {string} key @param {number} expected @param {import("../dist/index.js").StoreDocument} document */
  async compareAndSet(key, expected, document) {
    const w = await inner.compareAndSet(key, expected, document);
    cas.push(w.ok);
    return w;
  },
};
const guard = new IdempotencyGuard({ store, retention: { expired: "reject", poll_after_ms: 1000, ttl_ms: 600000 }, prefix });
const encoder = new TextEncoder();

await inner.get(`${prefix}warm-up`); // connect before the first round
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
for await (const line of readline.createInterface({ input: process.stdin })) {
  const [command, at, key, ...rest] = line.split(" ");
  if (command !== "claim") throw new Error(`unknown command ${command}`);
  const body = encoder.encode(rest.join(" "));
  reads.length = 0;
  cas.length = 0;
  const target = BigInt(/** @type {string} */ (at));
  while (process.hrtime.bigint() < target);
  const start = process.hrtime.bigint();
  const decision = await guard.begin({ method: "POST", target: "/orders", header: (n) => (n === "idempotency-key" ? /** @type {string} */ (key) : null), body });
  const end = process.hrtime.bigint();
  const answer = decision.kind === "answer" ? decision.response : null;
  process.stdout.write(
    `${JSON.stringify({
      admitted: decision.kind === "admitted",
      status: answer === null ? null : answer.status,
      code: answer === null ? null : JSON.parse(new TextDecoder().decode(answer.body)).code,
      firstReadEmpty: reads[0] === 0,
      cas: [...cas],
      start: String(start),
      end: String(end),
    })}\n`,
  );
}
await inner.close();
