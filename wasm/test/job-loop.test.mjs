// runJob on the host loop: the run hooks see the job's attempts (the plain
// driver's hook documents), a caller's cancellation before the submit is
// sent stops the run with nothing sent, and a job run's result is the one
// shape otel.record takes.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, policyWith } from "./helpers.mjs";

function jobPolicy() {
  return policyWith((p) => {
    p.async_job = { cancel_left_running: true, max_polls: 4, poll_base_ms: 200, poll_max_ms: 1_000 };
    p.deadline_ms = 20_000;
  });
}

/** Calls that accept the job, then answer `in_progress` once and `completed`. @param {string[]} sent */
function calls(sent) {
  const statuses = ["in_progress", "completed"];
  return {
    submit: () => {
      sent.push("submit");
      return { id: "job-1", status: /** @type {const} */ ("queued"), value: "accepted" };
    },
    poll: (/** @type {string} */ id) => {
      sent.push(`poll:${id}`);
      const status = /** @type {any} */ (statuses.shift() ?? "completed");
      return { status, value: status === "completed" ? "the answer" : "running" };
    },
    cancel: (/** @type {string} */ id) => {
      sent.push(`cancel:${id}`);
    },
  };
}

test("the hooks see each decision, each wait (PlannedSleep), each attempt and the receipt of a job", async () => {
  const time = fakeTime();
  /** @type {string[]} */
  const seen = [];
  /** @type {string[]} */
  const sent = [];
  const run = await rl.runJob(jobPolicy(), calls(sent), {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
    onDecision: (d) => seen.push(d.kind === "dispatch" ? `decision:${d.ordinal}:${d.job?.kind}` : `decision:${d.terminal}`),
    onSleep: (s) => seen.push(`sleep:${s.ordinal}:${s.route_id}:${s.sleep_ms === s.not_before_ms - s.at_ms}`),
    onAttempt: (a, j) => seen.push(`attempt:${a.ordinal}:${a.job?.status}:${j.rule}`),
    onTerminal: (r) => seen.push(`terminal:${r.terminal}`),
  });
  assert.equal(run.result.value, "the answer");
  assert.deepEqual(sent, ["submit", "poll:job-1", "poll:job-1"]);
  const route = run.bundle.attempts.attempts[0]?.route_id;
  assert.deepEqual(seen, [
    "decision:1:submit",
    "attempt:1:queued:returned",
    `sleep:2:${route}:true`,
    "decision:2:poll",
    "attempt:2:in_progress:returned",
    `sleep:3:${route}:true`,
    "decision:3:poll",
    "attempt:3:completed:returned",
    "decision:completed",
    "terminal:completed",
  ]);
  assert.equal(run.sealed.receipt_sha256, rl.digest(run.receipt));
  assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
});

test("a caller's cancellation before the submit is sent stops the run cancelled, nothing sent", async () => {
  const controller = new AbortController();
  controller.abort();
  /** @type {string[]} */
  const sent = [];
  await assert.rejects(rl.runJob(jobPolicy(), calls(sent), { idempotencyKey: KEY, signal: controller.signal }), (e) => {
    assert.ok(e instanceof rl.RunCancelledError);
    assert.equal(e.terminal, "stop_cancelled");
    assert.equal(e.receipt.attempt_count, 0);
    return true;
  });
  assert.deepEqual(sent, []);
});
