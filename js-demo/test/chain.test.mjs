// The journal view's layout (chain.js) on the journal vectors, without a
// browser. Digests here are computed from the JSON alone (sorted keys, no
// whitespace: RFC 8785 for these integer-only events, then SHA-256), as
// docs/JOURNAL.md says anyone can.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { analyseJournal, eventIndex, GENESIS } from "../chain.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const vectors = JSON.parse(readFileSync(path.resolve(here, "..", "..", "tests", "vectors", "journal.json"), "utf8")).cases;
const events = (name) => JSON.parse(vectors.find((c) => c.name === name).input.events);
const expectOf = (name) => vectors.find((c) => c.name === name).expect;

const canonical = (v) =>
  Array.isArray(v) ? `[${v.map(canonical).join(",")}]` : v && typeof v === "object" ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}` : JSON.stringify(v);
const digest = (v) => createHash("sha256").update(canonical(v)).digest("hex");
const layout = (name, error = null) => {
  const ev = events(name);
  return analyseJournal(ev, ev.map(digest), error);
};

test("the reference journal: every link holds, from genesis, under one generation", () => {
  const t = layout("verify_reference_journal");
  assert.equal(t.rows.length, 15);
  assert.equal(t.rows[0].prev, GENESIS);
  assert.deepEqual(t.brokenLinks, []);
  assert.deepEqual(t.generations.map((g) => [g.generation, g.fromSeq, g.toSeq]), [[1, 0, 14]]);
  assert.deepEqual(t.reconciled, []);
  assert.deepEqual(t.inDoubt, []);
  // The head the core reports is the digest of the last event.
  assert.equal(t.rows[14].sha, expectOf("verify_reference_journal").ok.head_sha256);
});

test("the recovered journal: generation 2 takes over at seq 12 and settles attempt 3 by reconciliation", () => {
  const t = layout("verify_recovered_journal");
  assert.deepEqual(t.brokenLinks, []);
  assert.deepEqual(t.generations.map((g) => [g.generation, g.fromSeq, g.toSeq, g.lease]), [
    [1, 0, 11, "first"],
    [2, 12, 14, "takeover"],
  ]);
  assert.equal(t.reconciled.length, 1);
  assert.deepEqual(
    { ...t.reconciled[0], outcome: t.reconciled[0].outcome },
    { seq: 12, ordinal: 3, routeId: "external-fallback", reconciled: "succeeded", outcome: "success", startedAt: 1650, completedAt: 2400, cost: 3000, sentUnder: 1, settledUnder: 2 },
  );
  assert.equal(t.rows[14].sha, expectOf("verify_recovered_journal").ok.head_sha256);
});

test("a broken chain: the link at the event the core names is the one broken", () => {
  const err = expectOf("verify_broken_chain").error;
  const t = layout("verify_broken_chain", err);
  assert.equal(eventIndex(err.path), 5);
  assert.deepEqual(t.brokenLinks, [5]);
  assert.equal(t.rows[5].error.code, "journal_chain_broken");
});

test("a lower lease generation is marked stale at its event", () => {
  const err = expectOf("verify_lower_lease_generation").error;
  const t = layout("verify_lower_lease_generation", err);
  assert.deepEqual(t.rows.filter((r) => r.lease === "stale").map((r) => r.index), [eventIndex(err.path)]);
});

test("a crash after a dispatch leaves the attempt in doubt", () => {
  const t = layout("recover_reference_prefix_12_after_dispatched");
  assert.deepEqual(t.inDoubt.map((d) => [d.ordinal, d.routeId, d.startedAt]), [[3, "external-fallback", 1650]]);
});

test("anything in the events array is laid out without throwing", () => {
  const t = analyseJournal([null, 42, "x", { kind: "nonsense", seq: 3 }, []], [null, null, null, null, null]);
  assert.equal(t.rows.length, 5);
  assert.equal(t.rows[0].link, "missing");
});
