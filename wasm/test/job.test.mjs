// Async jobs (docs/JOBS.md) with the real `openai` package against a
// loopback Responses server: `background: true` create, retrieve by id,
// cancel. The server counts every request; a fake clock records each wait.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";

import OpenAI from "openai";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, policyWith } from "./helpers.mjs";

const JOB = "resp_68af3c2e9b1a8190";

/**
 * A Responses server: POST /v1/responses answers `submit` in order (or
 * drops the connection for `"drop"`), GET /v1/responses/{id} answers the
 * statuses of `polls` in order (the last repeats; retrieve number `holdPoll`
 * is never answered: `holding` resolves when it arrived), POST .../cancel
 * answers `cancelled` (or the error status `cancel`).
 * @param {{submit: Array<"drop" | {status: number, body?: unknown}>, polls: string[], cancel?: number, holdPoll?: number}} script
 */
async function responsesServer(script) {
  /** @type {() => void} */
  let held = () => undefined;
  const holding = new Promise((resolve) => {
    held = () => resolve(undefined);
  });
  const seen = {
    creates: 0,
    retrieves: 0,
    cancels: 0,
    lookups: 0,
    ids: /** @type {string[]} */ ([]),
    cancelled: /** @type {string[]} */ ([]),
    keys: /** @type {Array<string | undefined>} */ ([]),
  };
  const response = (/** @type {string} */ status) => ({
    id: JOB,
    object: "response",
    created_at: 1_700_000_000,
    status,
    background: true,
    model: "gpt-fake",
    output: status === "completed" ? [{ type: "message", id: "msg_1", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Severity 2.", annotations: [] }] }] : [],
  });
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => {
      body += c;
    });
    req.on("end", () => {
      const url = req.url ?? "/";
      const send = (/** @type {number} */ status, /** @type {unknown} */ payload) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(payload));
      };
      if (req.method === "POST" && url === "/v1/responses") {
        const n = seen.creates;
        seen.creates += 1;
        const k = req.headers["idempotency-key"];
        seen.keys.push(Array.isArray(k) ? k.join(",") : k);
        assert.equal(JSON.parse(body).background, true);
        const reply = script.submit[Math.min(n, script.submit.length - 1)];
        if (reply === undefined || reply === "drop") {
          // The request arrived; the answer is lost.
          req.socket.destroy();
          return;
        }
        send(reply.status, reply.body ?? response("queued"));
        return;
      }
      const cancel = url.match(/^\/v1\/responses\/([^/]+)\/cancel$/);
      if (req.method === "POST" && cancel !== null) {
        seen.cancels += 1;
        seen.cancelled.push(String(cancel[1]));
        if (script.cancel !== undefined) send(script.cancel, { error: { message: "cannot cancel", type: "invalid_request_error" } });
        else send(200, response("cancelled"));
        return;
      }
      // The test's own lookup by idempotency key (what a reconcile hook asks).
      const lookup = url.match(/^\/lookup\?key=(.+)$/);
      if (req.method === "GET" && lookup !== null) {
        seen.lookups += 1;
        const known = seen.keys.includes(decodeURIComponent(String(lookup[1])));
        send(known ? 200 : 404, known ? response("in_progress") : { error: { message: "no such job" } });
        return;
      }
      const get = url.match(/^\/v1\/responses\/([^/?]+)/);
      if (req.method === "GET" && get !== null) {
        const n = seen.retrieves;
        seen.retrieves += 1;
        seen.ids.push(String(get[1]));
        if (script.holdPoll === n + 1) {
          // Held until the client goes away: the answer is never sent.
          held();
          return;
        }
        send(200, response(/** @type {string} */ (script.polls[Math.min(n, script.polls.length - 1)])));
        return;
      }
      send(404, { error: { message: "no such route" } });
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  return {
    seen,
    holding,
    base: `http://127.0.0.1:${address.port}/v1`,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve(undefined));
        server.closeAllConnections();
      }),
  };
}

/** The reference policy as an async job. @param {number} maxPolls */
function jobPolicy(maxPolls) {
  return policyWith((p) => {
    p.async_job = { max_polls: maxPolls, poll_base_ms: 200, poll_max_ms: 1_000 };
    p.deadline_ms = 20_000;
  });
}

const PARAMS = { model: "gpt-fake", input: "summarize INC-4471" };

test("a background response: one create, polls at the planned times, the completed response returned", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress", "in_progress", "completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const run = await rl.runJob(jobPolicy(6), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.retrieves, 3);
    assert.deepEqual(server.seen.ids, [JOB, JOB, JOB]);
    assert.deepEqual(server.seen.keys, [KEY]);
    // Poll n waits min(200 * 2^(n-1), 1000) after the previous completion.
    assert.deepEqual(time.state.sleeps, [200, 400, 800]);
    assert.equal(run.result.status, "completed");
    assert.equal(/** @type {{output_text: string}} */ (run.result.value).output_text, "Severity 2.");
    const job = run.receipt.job;
    assert.ok(job !== undefined);
    assert.equal(job.submits, 1);
    assert.equal(job.polls, 3);
    assert.equal(job.left_running, false);
    assert.equal(job.job_sha256, createHash("sha256").update(JOB, "utf8").digest("hex"));
    const attempts = run.bundle.attempts.attempts;
    assert.deepEqual(attempts.map((a) => a.job?.kind), ["submit", "poll", "poll", "poll"]);
    assert.deepEqual(attempts.map((a) => a.started_at_ms), [0, 200, 600, 1400]);
    // The raw id is never in the documents.
    assert.ok(!run.sealed.bundle_json.includes(JOB));
    assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
  } finally {
    await server.close();
  }
});

test("a dropped connection after the create is never resubmitted: one POST, stop_indeterminate", async () => {
  const server = await responsesServer({ submit: ["drop", { status: 200 }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(6), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => {
        assert.ok(e instanceof rl.RunStoppedError);
        assert.equal(e.terminal, "stop_indeterminate");
        assert.equal(e.receipt.job?.submits, 1);
        assert.equal(e.receipt.job?.left_running, false);
        return true;
      },
    );
    assert.equal(server.seen.creates, 1, "exactly one submit reached the provider");
    assert.equal(server.seen.retrieves, 0);
  } finally {
    await server.close();
  }
});

test("a rate-limited create is retried (the provider refused it), then polled", async () => {
  const server = await responsesServer({
    submit: [{ status: 429, body: { error: { message: "slow down", type: "rate_limit_exceeded" } } }, { status: 200 }],
    polls: ["completed"],
  });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const run = await rl.runJob(jobPolicy(6), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal(server.seen.creates, 2);
    assert.equal(server.seen.retrieves, 1);
    assert.deepEqual(server.seen.keys, [KEY, KEY]);
    assert.equal(run.receipt.job?.submits, 2);
  } finally {
    await server.close();
  }
});

test("polls stop at max_polls; the job left running is cancelled", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(3), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => {
        assert.equal(e.terminal, "stop_total_attempts");
        assert.equal(e.receipt.job.polls, 3);
        assert.equal(e.receipt.job.left_running, true);
        return true;
      },
    );
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.retrieves, 3);
    assert.equal(server.seen.cancels, 1);
    assert.deepEqual(time.state.sleeps, [200, 400, 800]);
  } finally {
    await server.close();
  }
});

test("a client with its own retries is refused before any request", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base });
    assert.throws(() => rl.openaiResponsesJob(client, PARAMS), (/** @type {any} */ e) => e.code === "retry_owner_not_harness");
    assert.equal(server.seen.creates, 0);
  } finally {
    await server.close();
  }
});

test("a dropped create answer reconciled by idempotency key: the accepted job is polled, never resubmitted", async () => {
  const server = await responsesServer({ submit: ["drop", { status: 200 }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const calls = {
      ...rl.openaiResponsesJob(client, PARAMS),
      reconcile: async (/** @type {import("../dist/index.js").Step} */ step) => {
        const r = await fetch(`${server.base.replace(/\/v1$/, "")}/lookup?key=${encodeURIComponent(step.idempotencyKey)}`);
        if (r.status === 404) return /** @type {const} */ ({ answer: "failed_no_effect" });
        const body = /** @type {{id: string, status: "in_progress"}} */ (await r.json());
        return /** @type {const} */ ({ answer: "succeeded", id: body.id, status: body.status, value: body });
      },
    };
    const run = await rl.runJob(jobPolicy(6), calls, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal(server.seen.creates, 1, "exactly one submit reached the provider");
    assert.equal(server.seen.lookups, 1);
    assert.equal(server.seen.retrieves, 1);
    assert.equal(run.receipt.terminal, "completed");
    assert.equal(run.bundle.attempts.attempts[0]?.reconciled, "succeeded");
    assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
  } finally {
    await server.close();
  }
});

test("runJob refuses a policy without an async_job section before any request", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    await assert.rejects(
      rl.runJob(policyWith(() => undefined), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY }),
      (/** @type {any} */ e) => e.code === "invalid_async_job",
    );
    assert.equal(server.seen.creates, 0);
  } finally {
    await server.close();
  }
});

test("a response status outside the documented set is a protocol violation, never retried", async () => {
  const server = await responsesServer({ submit: [{ status: 200, body: { id: JOB, object: "response", status: "paused", output: [] } }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(6), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => e.terminal === "stop_non_retryable" && e.sealed.bundle.attempts.attempts[0].outcome.kind === "protocol_violation",
    );
    assert.equal(server.seen.creates, 1);
  } finally {
    await server.close();
  }
});

test("a poll that cannot start before the deadline stops the run; the job left running is cancelled", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const policy = policyWith((p) => {
      p.async_job = { max_polls: 10, poll_base_ms: 200, poll_max_ms: 1_000 };
      p.deadline_ms = 1_500;
    });
    await assert.rejects(
      rl.runJob(policy, rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => e.terminal === "stop_deadline" && e.receipt.job.left_running === true,
    );
    // Polls at 200, 600 and 1400; the fourth would start at 2400, past the deadline.
    assert.deepEqual(time.state.sleeps, [200, 400, 800]);
    assert.equal(server.seen.retrieves, 3);
    assert.equal(server.seen.cancels, 1);
  } finally {
    await server.close();
  }
});

/** A job policy whose run cancels the job it would leave running. @param {number} maxPolls @param {number} deadline */
function cancellingPolicy(maxPolls, deadline) {
  return policyWith((p) => {
    p.async_job = { cancel_left_running: true, max_polls: maxPolls, poll_base_ms: 200, poll_max_ms: 1_000 };
    p.deadline_ms = deadline;
  });
}

test("cancel_left_running: the deadline passes during a poll; the planned cancel is sent once and recorded", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const openai = rl.openaiResponsesJob(client, PARAMS);
    // The third poll takes 500 ms on the run clock: it completes at 1900, past the deadline.
    const calls = {
      ...openai,
      poll: async (/** @type {string} */ id, /** @type {rl.Step} */ step, /** @type {AbortSignal} */ signal) => {
        const answer = await openai.poll(id, step, signal);
        if (step.decision.job?.poll === 3) time.advance(500);
        return answer;
      },
    };
    /** @type {any} */
    let error;
    await assert.rejects(rl.runJob(cancellingPolicy(10, 1_500), calls, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
      error = e;
      return true;
    });
    assert.ok(error instanceof rl.RunStoppedError);
    assert.equal(error.terminal, "stop_deadline");
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.retrieves, 3);
    assert.equal(server.seen.cancels, 1, "exactly one cancel reached the provider");
    assert.deepEqual(server.seen.cancelled, [JOB]);
    const attempts = error.sealed.bundle.attempts.attempts;
    assert.deepEqual(attempts.map((/** @type {any} */ a) => a.job?.kind), ["submit", "poll", "poll", "poll", "cancel"]);
    const cancel = attempts.at(-1);
    assert.ok(cancel !== undefined && cancel.job !== undefined);
    assert.deepEqual(cancel.outcome, { class: "success" });
    assert.equal(cancel.job.job_sha256, createHash("sha256").update(JOB, "utf8").digest("hex"));
    // The one dispatch that may start at or after the deadline.
    assert.equal(cancel.started_at_ms, 1_900);
    assert.ok(cancel.started_at_ms >= error.sealed.bundle.policy.deadline_ms);
    const job = error.receipt.job;
    assert.ok(job !== undefined);
    assert.equal(job.cancel, "accepted");
    assert.equal(job.left_running, false);
    assert.equal(error.receipt.terminal, "stop_deadline");
    // The rejection's result is still the job's last answer, not the cancel's.
    assert.equal(error.result.status, "in_progress");
    assert.equal(rl.verifyBundle(error.sealed.bundle_json).kind, "verified");
  } finally {
    await server.close();
  }
});

test("cancel_left_running: a refused cancel after the poll bound is recorded failed and never retried", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"], cancel: 400 });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(cancellingPolicy(3, 20_000), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => {
        assert.equal(e.terminal, "stop_total_attempts");
        const attempts = e.sealed.bundle.attempts.attempts;
        assert.equal(attempts.at(-1).job.kind, "cancel");
        assert.equal(attempts.at(-1).outcome.class, "non_retryable");
        assert.equal(e.receipt.job.cancel, "failed");
        assert.equal(e.receipt.job.left_running, true);
        return true;
      },
    );
    assert.equal(server.seen.cancels, 1, "the refused cancel is neither retried nor sent again after sealing");
    assert.equal(server.seen.retrieves, 3);
  } finally {
    await server.close();
  }
});

test("cancel_left_running: refused before any request without calls.cancel", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["completed"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const { cancel: _cancel, ...withoutCancel } = rl.openaiResponsesJob(client, PARAMS);
    await assert.rejects(
      rl.runJob(cancellingPolicy(3, 20_000), /** @type {any} */ (withoutCancel), { idempotencyKey: KEY }),
      (/** @type {any} */ e) => e.code === "invalid_async_job" && e.path === "/async_job/cancel_left_running",
    );
    assert.equal(server.seen.creates, 0);
  } finally {
    await server.close();
  }
});

/**
 * What a caller's cancellation under cancel_left_running leaves: exactly one
 * cancel request, the planned cancel recorded as the last attempt after the
 * cancellation, `cancel: "accepted"`, a verified bundle.
 * @param {Awaited<ReturnType<typeof responsesServer>>} server
 * @param {any} error
 * @param {string[]} kinds the attempts' job kinds
 */
function checkCallerCancelled(server, error, kinds) {
  assert.ok(error instanceof rl.RunCancelledError);
  assert.equal(error.terminal, "stop_cancelled");
  assert.equal(server.seen.creates, 1);
  assert.equal(server.seen.cancels, 1, "exactly one cancel reached the provider");
  assert.deepEqual(server.seen.cancelled, [JOB]);
  const attempts = error.sealed.bundle.attempts;
  assert.deepEqual(attempts.attempts.map((/** @type {any} */ a) => a.job?.kind), kinds);
  const cancel = attempts.attempts.at(-1);
  assert.ok(cancel !== undefined && cancel.job !== undefined);
  assert.deepEqual(cancel.outcome, { class: "success" });
  assert.equal(cancel.job.job_sha256, createHash("sha256").update(JOB, "utf8").digest("hex"));
  assert.ok(typeof attempts.cancelled_at_ms === "number");
  assert.ok(cancel.started_at_ms >= attempts.cancelled_at_ms);
  const job = error.receipt.job;
  assert.ok(job !== undefined);
  assert.equal(job.cancel, "accepted");
  assert.equal(job.left_running, false);
  assert.equal(rl.verifyBundle(error.sealed.bundle_json).kind, "verified");
}

test("cancel_left_running: the caller aborts while a poll waits; the planned cancel is sent once and recorded", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const controller = new AbortController();
    // The caller aborts during the wait before the second poll.
    const sleep = async (/** @type {number} */ ms) => {
      if (time.state.sleeps.length === 1) controller.abort(new Error("the caller gave up"));
      await time.sleep(ms);
    };
    /** @type {any} */
    let error;
    await assert.rejects(
      rl.runJob(cancellingPolicy(10, 20_000), rl.openaiResponsesJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep, signal: controller.signal }),
      (e) => {
        error = e;
        return true;
      },
    );
    assert.equal(server.seen.retrieves, 1, "no poll after the abort");
    checkCallerCancelled(server, error, ["submit", "poll", "cancel"]);
    assert.equal(error.receipt.job.polls, 1);
  } finally {
    await server.close();
  }
});

test("cancel_left_running: the caller aborts while a poll is in flight; the planned cancel is sent once and recorded", async () => {
  const server = await responsesServer({ submit: [{ status: 200 }], polls: ["in_progress"], holdPoll: 2 });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const controller = new AbortController();
    void server.holding.then(() => controller.abort(new Error("the caller gave up")));
    /** @type {any} */
    let error;
    await assert.rejects(
      rl.runJob(cancellingPolicy(10, 20_000), rl.openaiResponsesJob(client, PARAMS), {
        idempotencyKey: KEY,
        clock: time.clock,
        sleep: time.sleep,
        signal: controller.signal,
      }),
      (e) => {
        error = e;
        return true;
      },
    );
    assert.equal(server.seen.retrieves, 2);
    checkCallerCancelled(server, error, ["submit", "poll", "poll", "cancel"]);
    // The aborted poll is recorded cancelled (indeterminate), the cancel after it succeeded.
    const aborted = error.sealed.bundle.attempts.attempts[2];
    assert.equal(aborted.job.poll, 2);
    assert.equal(aborted.outcome.class, "indeterminate");
  } finally {
    await server.close();
  }
});

test("cancel_left_running: after the caller's abort the planned cancel step gets a signal that has not fired", async () => {
  const time = fakeTime();
  const controller = new AbortController();
  /** @type {Array<[string | undefined, boolean]>} */
  const seen = [];
  await assert.rejects(
    rl.runWithPolicy(
      cancellingPolicy(10, 20_000),
      (step, signal) => {
        const kind = step.decision.job?.kind;
        seen.push([kind, signal.aborted]);
        if (kind === "submit") {
          step.job?.(JOB, "queued");
          // The caller aborts once the job was accepted.
          controller.abort();
        } else {
          step.job?.(JOB, undefined);
        }
        return "answer";
      },
      { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, signal: controller.signal },
    ),
    (/** @type {any} */ e) => {
      assert.ok(e instanceof rl.RunCancelledError);
      assert.equal(e.receipt.job?.cancel, "accepted");
      return true;
    },
  );
  assert.deepEqual(seen, [
    ["submit", false],
    ["cancel", false],
  ]);
});
