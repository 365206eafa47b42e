// Two separate Node processes race through PostgreSQL, 1,000 times in a row:
// to create the same register key with compare-and-set from generation 0
// (the write that claims an idempotency key): exactly one proceeds, the other
// is refused with generation 1, and the key holds the winner's document; and
// to append the same seq of one log: exactly one is appended, the other
// answers seq_taken with the winner's event. Each round both children wait
// for the same instant of the machine's monotonic clock, then write; the
// rounds whose two writes overlapped in time are counted, and some must have
// (else the test would not be racing).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";

import { PostgresStore } from "../dist/stores/postgres.js";
import { namespace, postgresGate } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const CHILD = path.join(here, "store-race-child.mjs");
const postgres = postgresGate();
const ROUNDS = 1000;
const LEAD_NS = 3_000_000n;

/** @typedef {{ok: boolean, generation?: number, code?: string, existing?: string, start: string, end: string}} Answer */

class Racers {
  /** @param {string} backend @param {string} target */
  constructor(backend, target) {
    this.children = [0, 1].map(() => {
      const child = spawn(process.execPath, [CHILD, backend, target], { stdio: ["pipe", "pipe", "pipe"] });
      let stderr = "";
      child.stderr.on("data", (d) => (stderr += String(d)));
      const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
      return { child, lines, stderr: () => stderr };
    });
  }

  /** @param {{lines: AsyncIterator<string>, stderr: () => string}} c @returns {Promise<any>} */
  async #next(c) {
    const { value, done } = await c.lines.next();
    if (done) throw new Error(`a racer ended: ${c.stderr()}`);
    return JSON.parse(value);
  }

  async ready() {
    for (const c of this.children) assert.deepEqual(await this.#next(c), { ready: true });
  }

  /** @param {[string, string]} commands (`@` stands for the instant both start at) @returns {Promise<Answer[]>} */
  async race(commands) {
    const at = String(process.hrtime.bigint() + LEAD_NS);
    this.children.forEach((c, i) => c.child.stdin.write(`${/** @type {string} */ (commands[i]).replace("@", at)}\n`));
    return Promise.all(this.children.map((c) => this.#next(c)));
  }

  async close() {
    await Promise.all(
      this.children.map(
        (c) =>
          new Promise((resolve, reject) => {
            c.child.on("exit", (code) => (code === 0 ? resolve(undefined) : reject(new Error(`racer exit ${code}: ${c.stderr()}`))));
            c.child.stdin.end();
          }),
      ),
    );
  }
}

/** @param {Answer[]} answers */
function overlapped([a, b]) {
  const [as, ae, bs, be] = [BigInt(/** @type {Answer} */ (a).start), BigInt(/** @type {Answer} */ (a).end), BigInt(/** @type {Answer} */ (b).start), BigInt(/** @type {Answer} */ (b).end)];
  return as < be && bs < ae;
}

test("two processes claim one key through PostgreSQL: exactly one proceeds, 1,000 times in a row", { skip: postgres.skip }, async () => {
  const connectionString = /** @type {string} */ (postgres.url);
  const store = new PostgresStore({ connectionString });
  await store.lastSeq("warm-up"); // the tables exist before the children start
  const racers = new Racers("postgres", connectionString);
  const ns = namespace("claim");
  let overlaps = 0;
  const wins = [0, 0];
  try {
    await racers.ready();
    for (let i = 0; i < ROUNDS; i++) {
      const key = `${ns}/idempotency/${i}`;
      const answers = await racers.race([`cas @ ${key} {"owner":0}`, `cas @ ${key} {"owner":1}`]);
      const oks = answers.map((a) => a.ok);
      assert.deepEqual([...oks].sort(), [false, true], `round ${i}: ${JSON.stringify(answers)}`);
      assert.deepEqual(
        answers.map((a) => a.generation),
        [1, 1],
        `round ${i}`,
      );
      const winner = oks.indexOf(true);
      wins[winner] = /** @type {number} */ (wins[winner]) + 1;
      assert.deepEqual(await store.get(key), { document: { owner: winner }, generation: 1 }, `round ${i}`);
      if (overlapped(answers)) overlaps++;
    }
  } finally {
    await racers.close();
    await store.close();
  }
  console.log(`postgres: ${ROUNDS} rounds, ${overlaps} with overlapping writes, wins ${wins}`);
  assert.ok(overlaps > 0, "the two writes never overlapped: the processes did not race");
});

test("two processes append one seq through PostgreSQL: exactly one is appended, 1,000 times in a row", { skip: postgres.skip }, async () => {
  const connectionString = /** @type {string} */ (postgres.url);
  const store = new PostgresStore({ connectionString });
  await store.lastSeq("warm-up");
  const racers = new Racers("postgres", connectionString);
  const log = `${namespace("append")}/journal`;
  let overlaps = 0;
  try {
    await racers.ready();
    for (let seq = 0; seq < ROUNDS; seq++) {
      const events = [`{"seq":${seq},"worker":0}`, `{"seq":${seq},"worker":1}`];
      const answers = await racers.race([`append @ ${log} ${seq} ${events[0]}`, `append @ ${log} ${seq} ${events[1]}`]);
      const oks = answers.map((a) => a.ok);
      assert.deepEqual([...oks].sort(), [false, true], `seq ${seq}: ${JSON.stringify(answers)}`);
      const winner = oks.indexOf(true);
      const loser = /** @type {Answer} */ (answers[1 - winner]);
      assert.deepEqual([loser.code, loser.existing], ["seq_taken", events[winner]], `seq ${seq}`);
      assert.equal(/** @type {Answer} */ (answers[winner]).code, "appended");
      if (overlapped(answers)) overlaps++;
    }
    const entries = await store.read(log);
    assert.deepEqual(
      entries.map((e) => e.seq),
      Array.from({ length: ROUNDS }, (_, i) => i),
    );
  } finally {
    await racers.close();
    await store.close();
  }
  console.log(`postgres: ${ROUNDS} appends raced, ${overlaps} with overlapping writes`);
  assert.ok(overlaps > 0, "the two appends never overlapped: the processes did not race");
});
