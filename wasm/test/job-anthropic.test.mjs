// Async jobs (docs/JOBS.md) with the real `@anthropic-ai/sdk` package
// against a loopback Message Batches server: create, retrieve by id,
// results once the batch ended, cancel. The server counts every request.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, policyWith } from "./helpers.mjs";

const BATCH = "msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d";

/**
 * POST /v1/messages/batches answers `submit` in order (`"drop"` drops the
 * connection); GET /v1/messages/batches/{id} answers the processing
 * statuses of `polls` in order (the last repeats); GET .../results answers
 * the request's result of type `result`; POST .../cancel answers canceling.
 * @param {{submit: Array<"drop" | number>, polls: string[], result: string}} script
 */
async function batchesServer(script) {
  const seen = { creates: 0, retrieves: 0, results: 0, cancels: 0 };
  let base = "";
  const batch = (/** @type {string} */ status) => ({
    id: BATCH,
    type: "message_batch",
    processing_status: status,
    request_counts: { processing: status === "ended" ? 0 : 1, succeeded: 0, errored: 0, canceled: 0, expired: 0 },
    created_at: "2026-12-03T10:00:00Z",
    expires_at: "2026-12-04T10:00:00Z",
    ended_at: status === "ended" ? "2026-12-03T10:05:00Z" : null,
    cancel_initiated_at: null,
    archived_at: null,
    results_url: status === "ended" ? `${base}/v1/messages/batches/${BATCH}/results` : null,
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
      if (req.method === "POST" && url === "/v1/messages/batches") {
        const n = seen.creates;
        seen.creates += 1;
        assert.equal(JSON.parse(body).requests.length, 1);
        const reply = script.submit[Math.min(n, script.submit.length - 1)];
        if (reply === undefined || reply === "drop") {
          req.socket.destroy();
          return;
        }
        send(reply, reply === 200 ? batch("in_progress") : { type: "error", error: { type: "overloaded_error", message: "busy" } });
        return;
      }
      if (req.method === "POST" && url === `/v1/messages/batches/${BATCH}/cancel`) {
        seen.cancels += 1;
        send(200, batch("canceling"));
        return;
      }
      if (req.method === "GET" && url.startsWith(`/v1/messages/batches/${BATCH}/results`)) {
        seen.results += 1;
        const result =
          script.result === "succeeded"
            ? { type: "succeeded", message: { id: "msg_1", type: "message", role: "assistant", model: "claude-fake", content: [{ type: "text", text: "Severity 2." }], stop_reason: "end_turn", stop_sequence: null, usage: { input_tokens: 10, output_tokens: 4 } } }
            : { type: script.result, error: { type: "error", error: { type: "invalid_request_error", message: "bad" } } };
        res.writeHead(200, { "content-type": "application/binary" });
        res.end(`${JSON.stringify({ custom_id: "request", result })}\n`);
        return;
      }
      if (req.method === "GET" && url.startsWith(`/v1/messages/batches/${BATCH}`)) {
        const n = seen.retrieves;
        seen.retrieves += 1;
        send(200, batch(/** @type {string} */ (script.polls[Math.min(n, script.polls.length - 1)])));
        return;
      }
      send(404, { type: "error", error: { type: "not_found_error", message: "no such route" } });
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  base = `http://127.0.0.1:${address.port}`;
  return { seen, base, close: () => new Promise((resolve) => server.close(() => resolve(undefined))) };
}

/** @param {number} maxPolls */
function jobPolicy(maxPolls) {
  return policyWith((p) => {
    p.async_job = { max_polls: maxPolls, poll_base_ms: 200, poll_max_ms: 1_000 };
    p.deadline_ms = 20_000;
  });
}

const PARAMS = { model: "claude-fake", max_tokens: 256, messages: [{ role: "user", content: "summarize INC-4471" }] };

test("a message batch: one create, polls until it ended, the request's result returned", async () => {
  const server = await batchesServer({ submit: [200], polls: ["in_progress", "canceling", "ended"], result: "succeeded" });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const run = await rl.runJob(jobPolicy(6), rl.anthropicBatchJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.results, 1);
    assert.deepEqual(time.state.sleeps, [200, 400, 800]);
    assert.equal(run.result.status, "completed");
    assert.equal(/** @type {any} */ (run.result.value).message.content[0].text, "Severity 2.");
    assert.equal(run.receipt.job?.polls, 3);
    assert.ok(!run.sealed.bundle_json.includes(BATCH));
  } finally {
    await server.close();
  }
});

test("a dropped batch create answer is never resubmitted: one POST, stop_indeterminate", async () => {
  const server = await batchesServer({ submit: ["drop", 200], polls: ["ended"], result: "succeeded" });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(6), rl.anthropicBatchJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => e.terminal === "stop_indeterminate",
    );
    assert.equal(server.seen.creates, 1, "exactly one submit reached the provider");
    assert.equal(server.seen.retrieves, 0);
  } finally {
    await server.close();
  }
});

test("an overloaded create is retried; an errored request result stops non-retryable without a new submit", async () => {
  const server = await batchesServer({ submit: [529, 200], polls: ["ended"], result: "errored" });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(6), rl.anthropicBatchJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => {
        assert.equal(e.terminal, "stop_non_retryable");
        assert.equal(e.receipt.job.status, "failed");
        assert.equal(e.receipt.job.submits, 2);
        return true;
      },
    );
    assert.equal(server.seen.creates, 2);
    assert.equal(server.seen.cancels, 0);
  } finally {
    await server.close();
  }
});

test("the poll bound cancels the batch left running", async () => {
  const server = await batchesServer({ submit: [200], polls: ["in_progress"], result: "succeeded" });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    await assert.rejects(
      rl.runJob(jobPolicy(2), rl.anthropicBatchJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }),
      (/** @type {any} */ e) => e.terminal === "stop_total_attempts" && e.receipt.job.left_running === true,
    );
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.retrieves, 2);
    assert.equal(server.seen.cancels, 1);
  } finally {
    await server.close();
  }
});

test("an Anthropic client with its own retries is refused before any request", () => {
  const client = new Anthropic({ apiKey: "test-key", baseURL: "http://127.0.0.1:9" });
  assert.throws(() => rl.anthropicBatchJob(client, PARAMS), (/** @type {any} */ e) => e.code === "retry_owner_not_harness");
});

test("cancel_left_running: a batch still in progress at the poll bound is cancelled once, recorded as the last attempt", async () => {
  const server = await batchesServer({ submit: [200], polls: ["in_progress"], result: "succeeded" });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: server.base, maxRetries: 0 });
    const time = fakeTime();
    const policy = policyWith((p) => {
      p.async_job = { cancel_left_running: true, max_polls: 2, poll_base_ms: 200, poll_max_ms: 1_000 };
      p.deadline_ms = 20_000;
    });
    await assert.rejects(rl.runJob(policy, rl.anthropicBatchJob(client, PARAMS), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (/** @type {any} */ e) => {
      assert.equal(e.terminal, "stop_total_attempts");
      const attempts = e.sealed.bundle.attempts.attempts;
      assert.deepEqual(attempts.map((/** @type {any} */ a) => a.job.kind), ["submit", "poll", "poll", "cancel"]);
      assert.equal(attempts.at(-1).outcome.class, "success");
      assert.equal(e.receipt.job.cancel, "accepted");
      assert.equal(e.receipt.job.left_running, false);
      assert.equal(rl.verifyBundle(e.sealed.bundle_json).kind, "verified");
      return true;
    });
    assert.equal(server.seen.creates, 1);
    assert.equal(server.seen.retrieves, 2);
    assert.equal(server.seen.cancels, 1, "exactly one cancel reached the provider");
  } finally {
    await server.close();
  }
});
