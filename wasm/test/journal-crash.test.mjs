// Crash tests of journal-backed runs with real processes (the same as
// python/tests/test_journal_crash.py): a worker process runs the reference run
// and a fallback run with a journal on SQLite and on PostgreSQL and is killed
// with SIGKILL after every journal prefix in turn (and after each attempt's
// answer, before its observation); a new process resumes the run. The fake
// receiver records every attempt by idempotency key and ordinal and answers
// reconciliation by what it recorded. Counted over every crash: resubmissions
// of a dispatched attempt (0) and stale appends the store accepted from a
// fenced owner (0); a run whose crash left nothing to reconcile ends with the
// uncrashed run's receipt digest.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { PostgresStore } from "../dist/stores/postgres.js";
import { referencePolicy } from "./helpers.mjs";
import { postgresGate } from "./fleet-helpers.mjs";
import { Receiver } from "./journal-receiver.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const child = path.join(here, "journal-child.mjs");
const postgres = postgresGate();
const policy = rl.compilePolicy(referencePolicy());

/**
 * @param {Record<string, unknown>} args @param {Record<string, string>} [env]
 * @returns {Promise<{code: number | null, signal: NodeJS.Signals | null, out: any}>}
 */
function runChild(args, env = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [child, JSON.stringify(args)], { cwd: path.dirname(here), env: { ...process.env, ...env } });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    p.on("error", reject);
    p.on("close", (code, signal) => {
      if (code === 0) resolve({ code, signal, out: JSON.parse(stdout) });
      else if (signal === "SIGKILL") resolve({ code, signal, out: undefined });
      else reject(new Error(`child exited ${code} ${signal}: ${stderr}`));
    });
  });
}

/** @param {string} backend */
function target(backend) {
  if (backend === "sqlite") {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "retryledger-journal-"));
    process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
    return path.join(dir, "journal.db");
  }
  return /** @type {string} */ (postgres.url);
}

/** @param {string} backend @param {string} t */
function openStore(backend, t) {
  return backend === "sqlite" ? new SQLiteStore(t) : new PostgresStore({ connectionString: t, max: 2 });
}

/** @param {any} store @param {string} runId */
async function events(store, runId) {
  return (await store.read(rl.journalLog(runId), 0)).map((/** @type {{text: string}} */ e) => JSON.parse(e.text));
}

/** Run `f` over `items`, `n` at a time. @template T @param {T[]} items @param {number} n @param {(x: T) => Promise<void>} f */
async function pool(items, n, f) {
  let next = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next < items.length) await f(/** @type {T} */ (items[next++]));
    }),
  );
}

for (const backend of ["sqlite", "postgres"]) {
  for (const script of ["reference", "fallback"]) {
    test(`every prefix of the ${script} run on ${backend} is recovered without resubmission`, { skip: backend === "postgres" ? postgres.skip : undefined }, async () => {
      const t = target(backend);
      const store = openStore(backend, t);
      const receiver = await new Receiver().start();
      const tag = randomUUID().slice(0, 8);
      const tally = { crashes: 0, resubmissions: 0, reconciled: 0, sameReceipt: 0 };
      try {
        const baseId = `crash-${script}-${tag}-base`;
        receiver.scripts.set(baseId, script);
        const base = (await runChild({ mode: "run", backend, target: t, runId: baseId, url: receiver.url })).out;
        assert.equal(base.terminal, "completed");
        const total = (await events(store, baseId)).length;
        const attempts = JSON.parse(base.bundle).attempts.attempts.length;
        assert.equal(total, 4 * attempts + 3);
        /** @type {[string, number][]} */
        const crashes = [
          ...Array.from({ length: total }, (_, k) => /** @type {[string, number]} */ (["JOURNAL_KILL_AFTER_SEQ", k])),
          ...Array.from({ length: attempts }, (_, i) => /** @type {[string, number]} */ (["JOURNAL_KILL_AFTER_CALL", i + 1])),
        ];
        await pool(crashes, 4, async ([name, at]) => {
          const runId = `crash-${script}-${tag}-${name.slice(12).toLowerCase()}-${at}`;
          receiver.scripts.set(runId, script);
          const killed = await runChild({ mode: "run", backend, target: t, runId, url: receiver.url }, { [name]: String(at) });
          assert.equal(killed.signal, "SIGKILL");
          if (name === "JOURNAL_KILL_AFTER_SEQ") assert.equal((await events(store, runId)).length, at + 1);
          tally.crashes += 1;
          const resumed = (await runChild({ mode: "resume", backend, target: t, runId, url: receiver.url })).out;
          assert.equal(resumed.lease_generation, 2);
          const served = receiver.received(runId);
          for (const s of served.values()) tally.resubmissions += s.length - 1;
          assert.ok([...served.values()].every((s) => s.length === 1), JSON.stringify([...served]));
          assert.equal(rl.verifyBundle(resumed.bundle).kind, "verified");
          assert.equal(rl.journalVerify(policy, await events(store, runId)).terminal, resumed.terminal);
          const list = JSON.parse(resumed.bundle).attempts.attempts;
          const ordinals = new Set(list.map((/** @type {{ordinal: number}} */ a) => a.ordinal));
          for (const o of served.keys()) assert.ok(ordinals.has(o));
          for (const a of list) {
            if (a.reconciled !== "failed_no_effect") assert.ok(served.has(a.ordinal), JSON.stringify(a));
            if (a.reconciled !== undefined) {
              tally.reconciled += 1;
              const truth = JSON.stringify(served.get(a.ordinal)) === "[200]" ? "succeeded" : "failed_no_effect";
              assert.equal(a.reconciled, truth);
              if (truth === "succeeded") assert.equal(resumed.terminal, "completed");
            }
          }
          if (resumed.reconciled.length === 0) {
            assert.equal(resumed.receipt_sha256, base.receipt_sha256);
            tally.sameReceipt += 1;
          }
        });
        console.log(
          `journal crash test (node, ${backend}, ${script} run): ${tally.crashes} crashes (${total} prefixes + ${attempts} lost answers), ` +
            `${tally.resubmissions} resubmissions, ${tally.reconciled} reconciled attempts, ${tally.sameReceipt} with the uncrashed receipt`,
        );
        assert.equal(tally.crashes, total + attempts);
        assert.equal(tally.resubmissions, 0);
        // Every lost answer, at least, is settled by asking the receiver.
        assert.ok(tally.reconciled >= attempts, `${tally.reconciled} reconciled`);
        assert.ok(tally.sameReceipt >= total - attempts);
      } finally {
        await receiver.stop();
        await store.close?.();
      }
    });
  }

  test(`a run killed between its lease claim and created on ${backend} is finished`, { skip: backend === "postgres" ? postgres.skip : undefined }, async () => {
    // Nothing was sent: resumeJournaled starts the run from the beginning
    // (the lease taken over), and so does runJournaled under the same run id;
    // each ends with the uncrashed run's receipt, every attempt sent once.
    const t = target(backend);
    const store = openStore(backend, t);
    const receiver = await new Receiver().start();
    const tag = randomUUID().slice(0, 8);
    try {
      const baseId = `claimed-${tag}-base`;
      receiver.scripts.set(baseId, "reference");
      const base = (await runChild({ mode: "run", backend, target: t, runId: baseId, url: receiver.url })).out;
      assert.equal(base.terminal, "completed");
      for (const mode of ["resume", "run"]) {
        const runId = `claimed-${tag}-${mode}`;
        receiver.scripts.set(runId, "reference");
        const killed = await runChild({ mode: "run", backend, target: t, runId, url: receiver.url }, { JOURNAL_KILL_AFTER_CLAIM: "1" });
        assert.equal(killed.signal, "SIGKILL");
        assert.deepEqual(await events(store, runId), []);
        assert.equal((await store.get(rl.leaseKey(runId))).generation, 1); // claimed, never created
        assert.equal(receiver.received(runId).size, 0);
        const finished = (await runChild({ mode, backend, target: t, runId, url: receiver.url })).out;
        assert.equal(finished.terminal, "completed");
        assert.equal(finished.lease_generation, 2);
        assert.equal(finished.receipt_sha256, base.receipt_sha256);
        const held = await events(store, runId);
        assert.equal(held[0].kind, "created");
        assert.equal(held[0].lease_generation, 2);
        assert.equal(rl.journalVerify(policy, held).terminal, "completed");
        assert.ok([...receiver.received(runId).values()].every((s) => s.length === 1));
      }
    } finally {
      await receiver.stop();
      await store.close?.();
    }
  });

  test(`a fenced owner on ${backend} is refused`, { skip: backend === "postgres" ? postgres.skip : undefined }, async () => {
    const t = target(backend);
    const store = openStore(backend, t);
    const receiver = await new Receiver().start();
    let accepted = 0;
    try {
      for (const [script, ordinal] of /** @type {[string, number][]} */ ([
        ["reference", 3],
        ["fallback", 2],
      ])) {
        const runId = `fenced-${script}-${randomUUID().slice(0, 8)}`;
        receiver.scripts.set(runId, script);
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "retryledger-fenced-"));
        try {
          const old = runChild({ mode: "run", backend, target: t, runId, url: receiver.url }, { JOURNAL_PAUSE_AFTER_CALL: String(ordinal), JOURNAL_PAUSE_DIR: dir });
          const until = Date.now() + 60000;
          while (!fs.existsSync(path.join(dir, "paused"))) {
            assert.ok(Date.now() < until, "the old owner never paused");
            await new Promise((r) => setTimeout(r, 20));
          }
          const resumed = (await runChild({ mode: "resume", backend, target: t, runId, url: receiver.url })).out;
          const before = (await store.read(rl.journalLog(runId), 0)).map((/** @type {{text: string}} */ e) => e.text);
          fs.writeFileSync(path.join(dir, "go"), "1");
          const late = (await old).out;
          assert.equal(late.code, "lease_lost");
          assert.equal(late.evidence, null); // the lease check stopped it before the store
          assert.equal(late.raw_append_ok, false); // and the store refuses its seq anyway
          if (late.raw_append_ok) accepted += 1;
          assert.equal(late.classified.kind, "evidence");
          assert.equal(late.classified.reason, "stale_lease");
          assert.deepEqual(
            (await store.read(rl.journalLog(runId), 0)).map((/** @type {{text: string}} */ e) => e.text),
            before,
          );
          assert.deepEqual(resumed.reconciled, [ordinal]);
          assert.deepEqual(receiver.received(runId).get(ordinal), [script === "reference" ? 200 : 503]);
        } finally {
          fs.rmSync(dir, { recursive: true, force: true });
        }
      }
      console.log(`journal fencing test (node, ${backend}): 2 late owners, ${accepted} stale appends accepted`);
      assert.equal(accepted, 0);
    } finally {
      await receiver.stop();
      await store.close?.();
    }
  });
}
