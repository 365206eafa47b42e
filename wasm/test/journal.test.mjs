// Durable runs through the package's public functions: a journal written
// with journalAppend, a crash after the dispatch, recovery by a new owner
// under a higher lease generation, the fenced owner's late append, and the
// error classes of the journal and idempotency families.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { referencePolicy } from "./helpers.mjs";

const RUN = "run-journal-test";

/**
 * The event at `i` (it must be there).
 * @param {import("../dist/index.js").JournalEvent[]} events @param {number} i
 * @returns {import("../dist/index.js").JournalEvent}
 */
function at(events, i) {
  const e = events[i];
  assert.ok(e !== undefined, `no event ${i}`);
  return e;
}

/**
 * Write created, decided, reserved, dispatched under `generation`.
 * @param {import("../dist/index.js").Policy} policy @param {number} generation
 */
function crashedAfterDispatch(policy, generation) {
  /** @type {import("../dist/index.js").JournalEvent[]} */
  const events = [];
  /** @param {import("../dist/index.js").JournalEntry} entry */
  const push = (entry) => events.push(rl.journalAppend(policy, events, generation, entry));
  push({ kind: "created", run_id: RUN, created_at_epoch_ms: 1_780_000_000_000 });
  push({ kind: "decided" });
  push({ kind: "reserved" });
  push({ kind: "dispatched", started_at_ms: 0 });
  return events;
}

test("a dispatched attempt is reconciled, never resubmitted, and adopted by the new owner", () => {
  const policy = referencePolicy();
  const events = crashedAfterDispatch(policy, 1);
  assert.equal(at(events, 0).prev_sha256, "0".repeat(64));
  assert.equal(at(events, 1).prev_sha256, rl.digest(JSON.stringify(at(events, 0))));
  const ask = rl.journalRecover(policy, events);
  assert.equal(ask.kind, "reconcile");
  assert.equal(ask.attempt.ordinal, 1);
  /** @type {import("../dist/index.js").Reconciliation} */
  const answers = { schema: "retryledger.reconciliation.v1", ordinal: 1, max_polls: 3, answers: [{ answer: "in_progress", at_ms: 300 }] };
  const poll = rl.journalRecover(policy, events, answers);
  assert.equal(poll.kind, "reconcile");
  assert.equal(poll.not_before_ms, 400);
  answers.answers.push({ answer: "succeeded", at_ms: 450 });
  const adopt = rl.journalRecover(policy, events, answers);
  assert.equal(adopt.kind, "adopt");
  assert.equal(adopt.attempt.reconciled, "succeeded");
  const taken = [...events];
  /** @type {import("../dist/index.js").JournalEntry[]} */
  const entries = [{ kind: "observed", attempt: adopt.attempt }, { kind: "decided" }, { kind: "terminal" }];
  for (const entry of entries) {
    taken.push(rl.journalAppend(policy, taken, 2, entry));
  }
  const verified = rl.journalVerify(policy, taken);
  assert.equal(verified.terminal, "completed");
  assert.equal(verified.lease_generation, 2);
  assert.equal(rl.journalRecover(policy, taken).kind, "done");
  // The old owner's late observation is evidence; its append is refused.
  const late = /** @type {import("../dist/index.js").JournalEvent} */ ({ ...at(taken, 4), lease_generation: 1 });
  assert.deepEqual(rl.journalClassify(policy, taken, late), { kind: "evidence", lease_generation: 2, reason: "stale_lease", seq: 4 });
  assert.throws(
    () => rl.journalAppend(policy, taken.slice(0, 5), 1, { kind: "decided" }),
    (e) => e instanceof rl.JournalError && e.code === "journal_stale_lease" && e.path === "/entry/lease_generation",
  );
});

test("a tampered chain is a JournalError with its path", () => {
  const policy = referencePolicy();
  const events = crashedAfterDispatch(policy, 1);
  events[2] = /** @type {import("../dist/index.js").JournalEvent} */ ({ ...at(events, 2), prev_sha256: "ab".repeat(32) });
  assert.throws(
    () => rl.journalVerify(policy, events),
    (e) => e instanceof rl.JournalError && e instanceof rl.RetryledgerError && e.family === "journal" && e.code === "journal_chain_broken" && e.path === "/events/2/prev_sha256",
  );
});

test("idempotency records: claim, complete, replay, and IdempotencyError", () => {
  /** @type {import("../dist/index.js").Retention} */
  const retention = { expired: "reject", poll_after_ms: 500, ttl_ms: 60_000 };
  const key = rl.idempotencyKeySha256("k-1", { tenant: "t", operation: "op" });
  const request = { idempotency_key_sha256: key, request_sha256: rl.sha256Hex("body") };
  const claimed = rl.idempotencyClaim(retention, null, request, 1_000);
  assert.equal(claimed.kind, "proceed");
  assert.deepEqual(rl.idempotencyClaim(retention, claimed.record, request, 1_100), { kind: "poll", poll_at_epoch_ms: 1_600, retry_after_ms: 500 });
  const done = rl.idempotencyComplete(retention, claimed.record, { ...request, status: "succeeded", result_sha256: rl.sha256Hex("result") }, 2_000);
  assert.deepEqual(rl.idempotencyClaim(retention, done, request, 3_000), { kind: "replay", result_sha256: rl.sha256Hex("result") });
  const other = { ...request, request_sha256: rl.sha256Hex("another body") };
  assert.deepEqual(rl.idempotencyClaim(retention, done, other, 3_000), { kind: "rejected", reason: "key_reuse" });
  assert.throws(
    () => rl.idempotencyComplete(retention, done, { ...request, status: "failed_no_effect" }, 3_000),
    (e) => e instanceof rl.IdempotencyError && e.code === "idempotency_not_in_progress",
  );
  assert.throws(() => rl.idempotencyClaim(retention, null, request, -1), (e) => e instanceof rl.DecodeError && e.code === "integer_out_of_range");
});

test("a compiled policy gives the journal calls the same answers as its text", () => {
  const document = referencePolicy();
  const compiled = new rl.CompiledPolicy(document);
  const events = crashedAfterDispatch(document, 1);
  const late = { ...at(events, 3), lease_generation: 0 };
  for (const policy of [document, compiled]) {
    assert.deepEqual(rl.journalVerify(policy, events), rl.journalVerify(document, events));
    assert.deepEqual(rl.journalRecover(policy, events), rl.journalRecover(document, events));
    assert.deepEqual(rl.journalClassify(policy, events, late), rl.journalClassify(document, events, late));
    assert.deepEqual(rl.journalAppend(policy, events.slice(0, 1), 1, { kind: "decided" }), at(events, 1));
  }
  // Refusals are the same through either: an entry out of order, a tampered chain.
  const tampered = events.map((e) => ({ ...e }));
  at(tampered, 2).prev_sha256 = "0".repeat(64);
  /** @param {() => unknown} f */
  const refusal = (f) => {
    try {
      f();
    } catch (e) {
      assert.ok(e instanceof rl.JournalError);
      return [e.code, e.path];
    }
    assert.fail("refused");
  };
  const refused = [document, compiled].map((policy) => [
    refusal(() => rl.journalAppend(policy, events, 1, { kind: "decided" })),
    refusal(() => rl.journalVerify(policy, tampered)),
  ]);
  assert.deepEqual(refused[0], refused[1]);
  assert.equal(refused[0]?.[0]?.[0], "journal_out_of_order");
});

test("a writer builds the events journalAppend builds, recovers and resumes as the stateless calls do", () => {
  const document = referencePolicy();
  const compiled = new rl.CompiledPolicy(document);
  const events = crashedAfterDispatch(document, 1);
  /** @type {import("../dist/index.js").JournalEntry[]} */
  const entries = [
    { kind: "created", run_id: RUN, created_at_epoch_ms: 1_780_000_000_000 },
    { kind: "decided" },
    { kind: "reserved" },
    { kind: "dispatched", started_at_ms: 0 },
  ];
  /** @type {import("../dist/index.js").JournalWriter | undefined} */
  let writer;
  for (let cut = 0; cut <= events.length; cut++) {
    writer?.free();
    writer = new rl.JournalWriter(compiled, events.slice(0, cut), 1);
    assert.equal(writer.nextSeq, cut);
    for (let k = cut; k < events.length; k++) {
      assert.deepEqual(writer.append(/** @type {import("../dist/index.js").JournalEntry} */ (entries[k])), at(events, k));
      assert.deepEqual(writer.recover(), rl.journalRecover(compiled, events.slice(0, k + 1)));
    }
  }
  assert.ok(writer !== undefined);
  assert.equal(writer.nextSeq, events.length);
  // The session it resumes is the one resumeJournal gives.
  const resumed = compiled.session();
  resumed.resumeJournal(events);
  const continued = compiled.session();
  writer.resume(continued);
  assert.deepEqual(continued.attempts, resumed.attempts);
  assert.deepEqual(continued.next(), resumed.next());
  /** @param {() => unknown} f */
  const refusal = (f) => {
    try {
      f();
    } catch (e) {
      assert.ok(e instanceof rl.JournalError || e instanceof rl.DecodeError, String(e));
      return [e.code, e.path];
    }
    assert.fail("refused");
  };
  // An entry out of order: what journalAppend refuses, and the writer is unchanged.
  assert.deepEqual(
    refusal(() => writer?.append({ kind: "decided" })),
    refusal(() => rl.journalAppend(compiled, events, 1, { kind: "decided" })),
  );
  assert.equal(writer.nextSeq, events.length);
  // A lower lease generation, a session of another policy, a broken journal.
  assert.deepEqual(
    refusal(() => new rl.JournalWriter(compiled, events.slice(0, 2), 0).append({ kind: "reserved" })),
    ["journal_stale_lease", "/entry/lease_generation"],
  );
  const other = new rl.CompiledPolicy({ ...document, deadline_ms: 9_000 });
  assert.deepEqual(refusal(() => writer?.resume(other.session())), ["journal_policy_mismatch", "/policy_sha256"]);
  const tampered = events.map((e) => ({ ...e }));
  at(tampered, 2).prev_sha256 = "ab".repeat(32);
  assert.deepEqual(refusal(() => new rl.JournalWriter(compiled, tampered, 1)), ["journal_chain_broken", "/events/2/prev_sha256"]);
  assert.deepEqual(refusal(() => new rl.JournalWriter(compiled, events, -1))?.[0], "integer_out_of_range");
  writer.free();
});
