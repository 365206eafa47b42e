// runJob under a fleet section: each submit is admitted against the fleet's
// store (its route's breaker, the retry budget) and its outcome settled
// there; polls ask about the accepted job and are not admitted. The same
// runs against the in-memory store and a SQLite file. A fleet and a policy
// that do not fit each other are the core's refusals, before any request.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { SQLiteStore } from "../dist/stores/sqlite.js";
import { KEY, fakeTime, policyWith } from "./helpers.mjs";
import { fleetPolicy, namespace, tempDbPath } from "./fleet-helpers.mjs";

const JOB = { max_polls: 4, poll_base_ms: 200, poll_max_ms: 1_000 };

/** A job policy under a breaker, or (`budget`) under a retry budget alone. */
function jobFleetPolicy(budget = false) {
  const section = budget ? { retry_budget: { floor_per_second: 5, max_tokens: 5, ratio_permille: 500, scope: "jobs" } } : {};
  return fleetPolicy(section, (p) => {
    if (budget) delete (/** @type {any} */ (p.fleet)).breaker;
    p.async_job = { ...JOB };
    p.deadline_ms = 20_000;
  });
}

/**
 * Job calls on a fake clock: a submit on the primary fails unavailable, on
 * the fallback it is accepted; the job is polled once running, then completed.
 * @param {ReturnType<typeof fakeTime>} time @param {string[]} sent
 */
function calls(time, sent) {
  /** @type {string[]} */
  let statuses = [];
  return {
    submit: (/** @type {import("../dist/index.js").Step} */ step) => {
      sent.push(`submit:${step.routeId}`);
      time.advance(10);
      if (step.routeId === "private-primary") throw rl.AttemptError.retryable("unavailable");
      statuses = ["in_progress", "completed"];
      return { id: `job-${sent.length}`, status: /** @type {const} */ ("queued"), value: "accepted" };
    },
    poll: (/** @type {string} */ id) => {
      sent.push(`poll:${id}`);
      time.advance(10);
      const status = /** @type {any} */ (statuses.shift() ?? "completed");
      return { status, value: status === "completed" ? "the answer" : "running" };
    },
  };
}

/** @param {() => import("../dist/index.js").FleetStore} open */
async function breakerOpensThenSkips(open) {
  const policy = jobFleetPolicy();
  const fleet = new rl.Fleet(open(), { namespace: namespace("job-fleet") });
  const time = fakeTime();
  /** @type {string[]} */
  const sent = [];
  const first = await rl.runJob(policy, calls(time, sent), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  assert.equal(first.result.value, "the answer");
  assert.deepEqual(sent, ["submit:private-primary", "submit:private-primary", "submit:external-fallback", "poll:job-3", "poll:job-3"]);
  const attempts = first.bundle.attempts.attempts;
  // Every submit admitted (its snapshot digest recorded); the polls not.
  assert.deepEqual(
    attempts.map((a) => [a.job?.kind, a.admission !== undefined]),
    [["submit", true], ["submit", true], ["submit", true], ["poll", false], ["poll", false]],
  );
  assert.equal(rl.verifyBundle(first.sealed.bundle_json).kind, "verified");
  assert.ok(first.bundle.fleet_snapshots !== undefined);
  // Two failures opened the primary's breaker in the store.
  const primary = policy.routes[0]?.route_release_sha256 ?? "";
  const stored = await fleet.store.get(fleet.breakerKey(primary));
  assert.equal(/** @type {any} */ (stored.document)?.state, "open");

  // The next job skips the open primary without submitting to it.
  sent.length = 0;
  const second = await rl.runJob(policy, calls(time, sent), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet });
  assert.equal(second.result.value, "the answer");
  assert.equal(sent[0], "submit:external-fallback");
  assert.ok(!sent.includes("submit:private-primary"));
  assert.equal(second.receipt.fleet?.routes_skipped, 1);
  assert.equal(second.bundle.attempts.attempts[0]?.admission?.skipped?.[0]?.route_id, "private-primary");
  assert.equal(rl.verifyBundle(second.sealed.bundle_json).kind, "verified");
}

test("runJob under a fleet (in memory): each submit admitted, the breaker opened, the next job skips the route", async () => {
  await breakerOpensThenSkips(() => new rl.MemoryStore());
});

test("runJob under a fleet (SQLite): the same runs against a store file", async () => {
  const store = new SQLiteStore(tempDbPath());
  try {
    await breakerOpensThenSkips(() => store);
  } finally {
    store.close();
  }
});

test("runJob under a retry budget: the first submit's deposit does not cover a resubmit, nothing more is sent", async () => {
  const time = fakeTime();
  const fleet = new rl.Fleet(new rl.MemoryStore(), { namespace: namespace("job-fleet-budget") });
  /** @type {string[]} */
  const sent = [];
  await assert.rejects(
    rl.runJob(jobFleetPolicy(true), calls(time, sent), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet }),
    (e) => {
      assert.ok(e instanceof rl.RunStoppedError);
      assert.equal(e.terminal, "stop_retry_budget");
      assert.equal(rl.verifyBundle(e.sealed.bundle_json).kind, "verified");
      return true;
    },
  );
  assert.deepEqual(sent, ["submit:private-primary"]);
  const budget = await fleet.store.get(fleet.budgetKey("jobs"));
  assert.ok(budget.document !== null, "the retry budget is in the store");
});

test("runJob under a fleet takes the hooks, the clock and a caller's cancellation", async () => {
  const time = fakeTime();
  const fleet = new rl.Fleet(new rl.MemoryStore(), { namespace: namespace("job-fleet-hooks") });
  /** @type {string[]} */
  const seen = [];
  /** @type {string[]} */
  const sent = [];
  const run = await rl.runJob(jobFleetPolicy(), calls(time, sent), {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
    fleet,
    onAttempt: (a, j) => seen.push(`${a.job?.kind}:${a.route_id}:${j.rule}:${a.admission !== undefined}`),
    onTerminal: (r) => seen.push(`terminal:${r.terminal}`),
  });
  assert.equal(run.receipt.terminal, "completed");
  assert.deepEqual(seen.slice(0, 3), ["submit:private-primary:explicit:true", "submit:private-primary:explicit:true", "submit:external-fallback:returned:true"]);
  assert.equal(seen.at(-1), "terminal:completed");

  const controller = new AbortController();
  controller.abort();
  sent.length = 0;
  await assert.rejects(
    rl.runJob(jobFleetPolicy(), calls(time, sent), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet, signal: controller.signal }),
    (e) => e instanceof rl.RunCancelledError && e.terminal === "stop_cancelled",
  );
  assert.deepEqual(sent, []);
});

test("a fleet and a policy that do not fit are the core's refusals, before any request", async () => {
  /** @type {string[]} */
  const sent = [];
  const time = fakeTime();
  await assert.rejects(
    rl.runJob(jobFleetPolicy(), calls(time, sent), { idempotencyKey: KEY }),
    (e) => e instanceof rl.DriftError && e.code === "admission_missing" && e.path === "/fleet",
  );
  const plain = policyWith((p) => {
    p.async_job = { ...JOB };
  });
  await assert.rejects(
    rl.runJob(plain, calls(time, sent), { idempotencyKey: KEY, fleet: new rl.Fleet(new rl.MemoryStore()) }),
    (e) => e instanceof rl.DriftError && e.code === "admission_unexpected" && e.path === "/fleet",
  );
  assert.deepEqual(sent, []);
});
