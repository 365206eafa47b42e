// Two separate Node processes race 1,000 times in a row through PostgreSQL
// for one idempotency key, each through the receiver guard's claim path
// (read the record, the core's claim, compare-and-set): exactly one proceeds
// each round, the other answers 409 in progress, and the key's register was
// written once. Each round both children wait for the same instant of the
// machine's monotonic clock. The test counts the rounds whose two claims
// overlapped in time (most must) and those where both read an empty register
// and both tried the compare-and-set (some must: there the store alone decided).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";

import { idempotencyKeySha256 } from "../dist/index.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { namespace, postgresGate } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const CHILD = path.join(here, "receiver-race-child.mjs");
const postgres = postgresGate();
const ROUNDS = 1000;
const LEAD_NS = 3_000_000n;

/** @typedef {{admitted: boolean, status: number | null, code: string | null, firstReadEmpty: boolean, cas: boolean[], start: string, end: string}} Answer */

test("two processes claim one idempotency key through the guard on PostgreSQL: exactly one proceeds, 1,000 times in a row", { skip: postgres.skip }, async () => {
  const url = /** @type {string} */ (postgres.url);
  const prefix = `${namespace("receiver-race")}/idempotency/`;
  const store = new PostgresStore({ connectionString: url });
  await store.get(`${prefix}setup`); // the tables exist before the children start
  const children = [0, 1].map(() => {
    const child = spawn(process.execPath, [CHILD, url, prefix], { stdio: ["pipe", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += String(d)));
    const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    return { child, lines, stderr: () => stderr };
  });
  /** @param {typeof children[number]} c @returns {Promise<any>} */
  const next = async (c) => {
    const { value, done } = await c.lines.next();
    if (done) throw new Error(`a racer ended: ${c.stderr()}`);
    return JSON.parse(value);
  };
  let overlaps = 0;
  let contested = 0;
  const wins = [0, 0];
  try {
    for (const c of children) assert.deepEqual(await next(c), { ready: true });
    for (let i = 0; i < ROUNDS; i++) {
      const key = `order-${i}`;
      const at = String(process.hrtime.bigint() + LEAD_NS);
      for (const c of children) c.child.stdin.write(`claim ${at} ${key} {"sku":"A-1","round":${i}}\n`);
      /** @type {Answer[]} */
      const answers = await Promise.all(children.map(next));
      const admitted = answers.map((a) => a.admitted);
      assert.deepEqual([...admitted].sort(), [false, true], `round ${i}: ${JSON.stringify(answers)}`);
      const winner = admitted.indexOf(true);
      const loser = /** @type {Answer} */ (answers[1 - winner]);
      assert.deepEqual([loser.status, loser.code], [409, "idempotency_in_progress"], `round ${i}: ${JSON.stringify(answers)}`);
      assert.deepEqual(/** @type {Answer} */ (answers[winner]).cas, [true], `round ${i}`);
      wins[winner] = /** @type {number} */ (wins[winner]) + 1;
      const { document, generation } = await store.get(`${prefix}${idempotencyKeySha256(key)}`);
      assert.equal(generation, 1, `round ${i}`);
      assert.equal(document?.status, "in_progress", `round ${i}`);
      const [a, b] = /** @type {[Answer, Answer]} */ (answers);
      if (BigInt(a.start) < BigInt(b.end) && BigInt(b.start) < BigInt(a.end)) overlaps++;
      if (a.firstReadEmpty && b.firstReadEmpty) {
        contested++;
        assert.equal(loser.cas[0], false, `round ${i}: ${JSON.stringify(answers)}`);
      }
    }
  } finally {
    await Promise.all(
      children.map(
        (c) =>
          new Promise((resolve, reject) => {
            c.child.on("exit", (code) => (code === 0 ? resolve(undefined) : reject(new Error(`racer exit ${code}: ${c.stderr()}`))));
            c.child.stdin.end();
          }),
      ),
    );
    await store.close();
  }
  console.log(`receiver race: ${ROUNDS} rounds, ${overlaps} overlapping, ${contested} both read empty, wins ${wins}`);
  assert.ok(overlaps > ROUNDS / 2, `only ${overlaps} of ${ROUNDS} rounds overlapped: the processes did not race`);
  assert.ok(contested > 0, "no round had both claims read an empty register");
});
