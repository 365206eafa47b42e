// The timeline layout on the lab's bundles, without a browser.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { layoutTimeline } from "../timeline.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const site = process.env.INSPECTOR_DIR ?? path.resolve(here, "..", "..", "target", "inspector");
const lab = JSON.parse(await readFile(path.join(site, "lab.json"), "utf8"));
const bundle = (name) => lab.cases.find((c) => c.name === name).bundle;

test("reference run: two lanes, three bars, two backoff gaps, one Retry-After floor", () => {
  const t = layoutTimeline(bundle("valid_success"), { width: 1000 });
  assert.deepEqual(t.lanes.map((l) => l.routeId), ["private-primary", "external-fallback"]);
  assert.equal(t.bars.length, 3);
  assert.deepEqual(t.bars.map((b) => b.outcomeClass), ["retryable", "retryable", "success"]);
  assert.deepEqual(t.gaps.map((g) => g.notBefore), [1350, 1650]);
  assert.equal(t.hints.length, 1);
  assert.match(t.hints[0].label, /Retry-After 250 ms/);
  assert.ok(t.deadline && t.deadline.ms === 5000);
  // Bars are ordered in time and inside the drawing.
  for (const b of t.bars) assert.ok(b.x >= 0 && b.x + b.width <= 1000);
  assert.ok(t.bars[0].x < t.bars[1].x && t.bars[1].x < t.bars[2].x);
  // The fallback's bar sits in the fallback's lane.
  assert.ok(t.bars[2].y > t.lanes[1].y && t.bars[2].y < t.lanes[1].y + t.lanes[1].height);
});

test("jittered run: one interval per retried attempt, containing its not_before", () => {
  const b = bundle("jitter_replay");
  const t = layoutTimeline(b, { width: 1000 });
  assert.equal(t.jitter.length, 2);
  t.jitter.forEach((band, i) => {
    const gap = t.gaps[i];
    assert.ok(band.x <= gap.x2 + 0.5, "not_before is at or after the interval start (a Retry-After floor may lift it above)");
  });
});

test("a run with no attempts still lays out its lanes", () => {
  const b = structuredClone(bundle("valid_success"));
  b.attempts.attempts = [];
  const t = layoutTimeline(b);
  assert.equal(t.lanes.length, 2);
  assert.equal(t.bars.length, 0);
});

// Streamed runs, from the conformance vectors' sealed stream bundles.
const streamCases = JSON.parse(await readFile(path.resolve(here, "..", "..", "tests", "vectors", "stream.json"), "utf8")).cases;
const streamBundle = (name) => JSON.parse(streamCases.find((c) => c.name === name).input.bundle);

test("a tentative run: the cut attempt's events are marked invalidated, the last attempt's committed", () => {
  const b = streamBundle("stream_verify_sealed");
  const t = layoutTimeline(b, { width: 1000 });
  assert.deepEqual(
    t.streamMarks.map((m) => [m.ordinal, m.delivered, m.status]),
    [
      [1, 2, "invalidated"],
      [2, 3, "committed"],
    ],
  );
  for (const m of t.streamMarks) {
    const bar = t.bars.find((x) => x.ordinal === m.ordinal);
    assert.equal(m.x, bar.x);
    assert.ok(m.y >= bar.y + bar.height);
  }
  assert.match(t.streamMarks[0].label, /sequence 1–2\), invalidated/);
});

test("a resumed run: both attempts of the continuation chain are committed together", () => {
  const t = layoutTimeline(streamBundle("stream_verify_continuation_sealed"));
  assert.deepEqual(
    t.streamMarks.map((m) => [m.ordinal, m.delivered, m.status]),
    [
      [1, 3, "committed"],
      [2, 2, "committed"],
    ],
  );
});

test("a run without a stream has no stream marks", () => {
  assert.deepEqual(layoutTimeline(bundle("valid_success")).streamMarks, []);
});

// Fleet runs, from the conformance vectors' sealed fleet bundles; snapshot
// digests from the npm package's core, as the page computes them.
const fleetCases = JSON.parse(await readFile(path.resolve(here, "..", "..", "tests", "vectors", "fleet.json"), "utf8")).cases;
const fleetBundle = (name) => JSON.parse(fleetCases.find((c) => c.name === name).input.bundle);
const { digest } = await import(path.resolve(here, "..", "..", "wasm", "dist", "index.js"));
const byDigest = (b) =>
  new Map([...(b.fleet_snapshots?.breakers ?? []), ...(b.fleet_snapshots?.budgets ?? [])].map((s) => [digest(s), s]));

test("a fleet run: the attempt admitted after skipping the open primary shows the breaker and budget it was admitted under", () => {
  const b = fleetBundle("fleet_verify_skip");
  const t = layoutTimeline(b, { width: 1000, snapshots: byDigest(b) });
  assert.equal(t.admissions.length, 1);
  const [a] = t.admissions;
  assert.equal(a.skipped, 1);
  assert.match(a.label, /breaker closed, generation 0/);
  assert.match(a.label, /budget deposit \(balance 0\.000 tokens\)/);
  assert.match(a.label, /skipped private-primary \(breaker open\)/);
  assert.equal(t.fleetStop, null);
});

test("a run the retry budget stopped: its stop is laid out", () => {
  const b = fleetBundle("fleet_verify_budget_stop");
  const t = layoutTimeline(b, { snapshots: byDigest(b) });
  assert.equal(t.fleetStop.reason, "retry_budget");
  assert.equal(t.admissions.length, 1);
});

// Hedged runs, from the conformance vectors' sealed hedged bundle.
const hedgeCases = JSON.parse(await readFile(path.resolve(here, "..", "..", "tests", "vectors", "hedge.json"), "utf8")).cases;

test("a hedged run: overlapping attempts, the hedge linked to its lead at its threshold, the loser and the winner marked", () => {
  const b = JSON.parse(hedgeCases.find((c) => c.name === "hedge_bundle_verified").input.bundle);
  const t = layoutTimeline(b, { width: 1000 });
  assert.equal(t.bars.length, 2);
  const [lead, hedge] = t.bars;
  // They overlap in time, on their own lanes.
  assert.ok(hedge.x < lead.x + lead.width, "the hedge starts before the lead ends");
  assert.ok(lead.y < t.lanes[0].y + t.lanes[0].height && hedge.y > t.lanes[1].y);
  assert.equal(hedge.hedges, 1);
  assert.equal(lead.loss, "cancelled");
  assert.match(lead.label, /lost: cancelled/);
  assert.equal(t.hedgeLinks.length, 1);
  assert.equal(t.hedgeLinks[0].lead, 1);
  assert.match(t.hedgeLinks[0].label, /threshold 200 ms/);
  assert.ok(Math.abs(t.hedgeLinks[0].x - hedge.x) < 0.5, "the hedge starts at its threshold");
  assert.equal(t.winner?.ordinal, 2);
  assert.match(t.summary, /winner attempt 2, 1 loser\(s\)/);
  // No backoff gap is drawn into a hedge.
  assert.equal(t.gaps.length, 0);
});

test("a hedge on the lead's own route takes a second row of the lane", () => {
  const b = JSON.parse(hedgeCases.find((c) => c.name === "hedge_bundle_verified").input.bundle);
  for (const a of b.attempts.attempts) a.route_id = "private-primary";
  const t = layoutTimeline(b, { width: 1000 });
  assert.equal(t.bars[0].y + 16, t.bars[1].y, "the overlapping bar sits just below the first");
});

test("an unhedged run has no hedge links and no winner mark", () => {
  const t = layoutTimeline(bundle("valid_success"), { width: 1000 });
  assert.equal(t.hedgeLinks.length, 0);
  assert.equal(t.winner, null);
});

test("async job: each bar says what it was of the job, the table has a job column, the summary the receipt's job", async () => {
  const vectors = JSON.parse(await readFile(path.resolve(here, "..", "..", "tests", "vectors", "job.json"), "utf8"));
  const c = vectors.cases.find((x) => x.name === "job_cancel_at_deadline_accepted");
  const ok = c.expect.ok;
  const t = layoutTimeline({ policy: JSON.parse(c.input.policy), attempts: ok.attempts, receipt: ok.receipt }, { width: 1000 });
  const jobs = ok.attempts.attempts.map((a) => a.job.kind);
  assert.deepEqual(t.bars.map((b) => b.job), jobs);
  assert.equal(jobs[0], "submit");
  assert.equal(jobs[jobs.length - 1], "cancel");
  assert.match(t.bars[0].label, /job submit: queued/);
  assert.match(t.bars[1].label, /job poll 1: in progress/);
  assert.equal(t.jobs, true);
  assert.ok(t.rows.every((r) => r.length === 10));
  assert.equal(t.rows[t.rows.length - 1][9], "cancel");
  assert.match(t.summary, /Job: 1 submit\(s\), 2 poll\(s\), last status in progress, cancel accepted\./);
  assert.doesNotMatch(t.summary, /left running/);
  // A run without an async job has no job column.
  assert.equal(layoutTimeline(bundle("valid_success"), { width: 1000 }).jobs, false);
  assert.ok(layoutTimeline(bundle("valid_success"), { width: 1000 }).rows.every((r) => r.length === 9));
});
