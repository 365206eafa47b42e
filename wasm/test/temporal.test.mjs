// retryledger/temporal against a real Temporal dev server
// (tests/servers/with-temporal.sh): the core runs in the workflow isolate,
// each attempt is one activity execution making a real HTTP call to a
// counting loopback server, and the run waits on durable timers.
//
// - 429 twice then success: the same receipt digest as the plain driver given
//   the same answers at the same run-clock times, the same request count; the
//   workflow replayed from its history (Worker.runReplayHistory) seals the
//   same digest;
// - a worker process killed with SIGKILL while the run waits out a
//   Retry-After on a workflow timer: a new worker process finishes the run,
//   the loopback server sees exactly as many requests as the plain run;
// - an activity retry policy of more than one attempt (Temporal's default
//   retries without limit) is refused with retry_owner_not_harness before any request.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { randomUUID } from "node:crypto";
import { Client, Connection, WorkflowFailedError } from "@temporalio/client";
import { ApplicationFailure } from "@temporalio/common";
import { DefaultLogger, NativeConnection, Runtime, Worker, bundleWorkflowCode } from "@temporalio/worker";

import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import * as rl from "../dist/index.js";
import { runTelemetry } from "../dist/otel.js";
import { ActivityStep, bundlerOptions, checkRetryPolicy } from "../dist/temporal-worker.js";
import { KEY, policyWith } from "./helpers.mjs";
import { scriptedServer } from "./loopback.mjs";
import { activities, callLoopback } from "./temporal-activities.mjs";

// The refused workflows are logged as warnings: only errors are shown.
Runtime.install({ logger: new DefaultLogger("ERROR") });

/** The dev server's address, or the reason the tests are skipped (a failure under make). */
function temporalGate() {
  const address = process.env.TEMPORAL_ADDRESS;
  if (address !== undefined && address !== "") return { address, skip: false };
  if (process.env.MAKELEVEL !== undefined) {
    throw new Error("TEMPORAL_ADDRESS is not set: run the wasm tests under tests/servers/with-temporal.sh (make does)");
  }
  return { address: "", skip: "TEMPORAL_ADDRESS is not set (run under tests/servers/with-temporal.sh)" };
}
const gate = temporalGate();

/** The reference policy with a fleet section (a breaker). */
function fleetPolicyText() {
  return JSON.stringify(
    policyWith((p) => {
      p.fleet = { breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 1_000 }, on_store_unavailable: "fail_closed" };
    }),
  );
}

/** The reference policy with an async_job section. */
function jobPolicyText() {
  return JSON.stringify(
    policyWith((p) => {
      p.async_job = { max_polls: 3, poll_base_ms: 100, poll_max_ms: 1_000 };
    }),
  );
}

/** Three attempts on the primary route, a two-minute deadline, hints up to a minute. */
function policyText() {
  return JSON.stringify(
    rl.compilePolicy(
      policyWith((p) => {
        p.deadline_ms = 120_000;
        p.backoff = { base_ms: 100, max_ms: 1000, retry_after_cap_ms: 60_000 };
        /** @type {any} */ (p.routes[0]).max_attempts = 3;
        p.max_total_attempts = 5;
      }),
    ).policy,
  );
}

/** A policy of the stream vectors with a stream contract, for this suite's key. */
function streamPolicyText() {
  const cases = JSON.parse(readFileSync(new URL("../../tests/vectors/stream.json", import.meta.url), "utf8")).cases;
  const policy = JSON.parse(cases.find((/** @type {any} */ c) => c.op === "stream_session").input.policy);
  assert.ok(policy.stream !== undefined);
  policy.idempotency_key_sha256 = policyWith(() => undefined).idempotency_key_sha256;
  return JSON.stringify(policy);
}

/** @param {{status: number, headers?: Record<string, string>}[]} primary */
function server(primary) {
  return scriptedServer({ "private-primary": primary, "external-fallback": [{ status: 200 }] });
}

/** @type {string | undefined} */
let bundleCode;
async function workflowBundle() {
  bundleCode ??= (
    await bundleWorkflowCode({
      workflowsPath: new URL("./temporal-workflows.mjs", import.meta.url).pathname,
      ...bundlerOptions,
      logger: quietLogger(),
    })
  ).code;
  return { code: bundleCode };
}

function quietLogger() {
  const none = () => undefined;
  return { log: none, trace: none, debug: none, info: none, warn: none, error: none };
}

/** @type {Array<[string, string]>} */
const sealedSeen = [];
const sinks = { probe: { sealed: { fn: (/** @type {any} */ _info, /** @type {string} */ id, /** @type {string} */ digest) => void sealedSeen.push([id, digest]), callDuringReplay: true } } };

const queue = () => `retryledger-tests-${randomUUID().slice(0, 12)}`;

async function connect() {
  const client = new Client({ connection: await Connection.connect({ address: gate.address }) });
  return client;
}

/**
 * The plain driver on the same script and run-clock times as the workflow's
 * attempts: its receipt digest and how many requests its server saw.
 * @param {string} policy @param {{status: number, headers?: Record<string, string>}[]} script @param {any[]} attempts
 */
async function plainRun(policy, script, attempts) {
  const srv = await server(script);
  try {
    const spans = attempts.map((a) => [a.started_at_ms, a.completed_at_ms]);
    let now = 0;
    let index = 0;
    const run = await rl.runWithPolicy(
      policy,
      async (step) => {
        const [started, completed] = /** @type {[number, number]} */ (spans[index]);
        assert.equal(step.startedAtMs, started);
        index += 1;
        try {
          return await callLoopback(step, srv.base);
        } finally {
          now = completed;
        }
      },
      {
        idempotencyKey: KEY,
        clock: () => now,
        sleep: async (ms) => {
          now = Math.max(now + Math.ceil(ms), /** @type {[number, number]} */ (spans[index])[0]);
        },
      },
    );
    return { digest: run.sealed.receipt_sha256, count: srv.seen.length };
  } finally {
    await srv.close();
  }
}

/** Replay the workflow from its history in this process: the digest it seals. @param {Client} client @param {string} id */
async function replayedDigest(client, id) {
  const history = await client.workflow.getHandle(id).fetchHistory();
  const before = sealedSeen.length;
  await Worker.runReplayHistory({ workflowBundle: await workflowBundle(), sinks }, history, id);
  const replays = sealedSeen.slice(before).filter(([w]) => w === id);
  assert.equal(replays.length, 1);
  return /** @type {[string, string]} */ (replays[0])[1];
}

async function inProcessWorker(/** @type {string} */ taskQueue) {
  const connection = await NativeConnection.connect({ address: gate.address });
  const worker = await Worker.create({ connection, taskQueue, workflowBundle: await workflowBundle(), activities, sinks });
  return { worker, connection };
}

const SCRIPT_429_TWICE = [{ status: 429, headers: { "retry-after": "1" } }, { status: 429, headers: { "retry-after": "1" } }, { status: 200 }];

test("Temporal: 429 twice then 200 is the plain driver's run, and replays to the same digest", { skip: gate.skip }, async () => {
  const client = await connect();
  const taskQueue = queue();
  const policy = policyText();
  const srv = await server(SCRIPT_429_TWICE);
  const { worker, connection } = await inProcessWorker(taskQueue);
  const id = `w-${randomUUID()}`;
  /** @type {import("../dist/temporal.js").RunOutput} */
  let out;
  try {
    out = await worker.runUntil(client.workflow.execute("scriptedRun", { taskQueue, workflowId: id, args: [policy, KEY, srv.base, null] }));
  } finally {
    await srv.close();
    await connection.close();
  }
  assert.equal(out.terminal, "completed");
  assert.deepEqual(out.value, {});
  assert.equal(srv.seen.length, 3);
  assert.deepEqual(new Set(srv.seen.map((s) => s.idempotencyKey)), new Set([KEY]));
  assert.equal(rl.verifyBundle(out.bundleJson).kind, "verified");
  const bundle = JSON.parse(out.bundleJson);
  const attempts = bundle.attempts.attempts;
  assert.deepEqual(attempts.map((/** @type {any} */ a) => a.outcome.class), ["retryable", "retryable", "success"]);
  for (let i = 1; i < attempts.length; i++) assert.ok(attempts[i].started_at_ms - attempts[i - 1].completed_at_ms >= 1000);
  assert.equal(rl.digest(bundle.receipt), out.receiptSha256);

  const plain = await plainRun(policy, SCRIPT_429_TWICE, attempts);
  assert.equal(plain.digest, out.receiptSha256);
  assert.equal(plain.count, srv.seen.length);
  assert.equal(await replayedDigest(client, id), out.receiptSha256);
  console.log(`temporal (ts): 429 twice then 200: ${srv.seen.length} requests, receipt ${out.receiptSha256.slice(0, 12)}, plain driver and replay equal`);
  await client.connection.close();
});

/** @param {string} taskQueue @param {string} bundleFile @param {number} [hangOrdinal] */
async function startWorker(taskQueue, bundleFile, hangOrdinal) {
  const env = { ...process.env };
  delete env.RETRYLEDGER_TEST_HANG_ORDINAL;
  if (hangOrdinal !== undefined) env.RETRYLEDGER_TEST_HANG_ORDINAL = String(hangOrdinal);
  const child = spawn(process.execPath, [new URL("./temporal-worker-child.mjs", import.meta.url).pathname, taskQueue, bundleFile], {
    stdio: ["ignore", "pipe", "inherit"],
    env,
  });
  const lines = createInterface({ input: /** @type {import("node:stream").Readable} */ (child.stdout) });
  const first = await new Promise((resolve, reject) => {
    lines.once("line", resolve);
    child.once("exit", (code) => reject(new Error(`the worker exited with ${String(code)}`)));
  });
  assert.equal(first, "ready");
  return child;
}

/** @param {Client} client @param {string} id */
async function timerStarted(client, id) {
  const history = await client.workflow.getHandle(id).fetchHistory();
  return (history.events ?? []).some((e) => e.timerStartedEventAttributes != null);
}

const SCRIPT_LONG_WAIT = [{ status: 429, headers: { "retry-after": "4" } }, { status: 429, headers: { "retry-after": "1" } }, { status: 200 }];

test("Temporal: a worker killed with SIGKILL during a Retry-After timer is replaced and the run completes", { skip: gate.skip }, async () => {
  const client = await connect();
  const taskQueue = queue();
  const policy = policyText();
  const dir = mkdtempSync(join(tmpdir(), "retryledger-temporal-"));
  const bundleFile = join(dir, "bundle.js");
  writeFileSync(bundleFile, (await workflowBundle()).code);
  const srv = await server(SCRIPT_LONG_WAIT);
  /** @type {import("node:child_process").ChildProcess | undefined} */
  let first = await startWorker(taskQueue, bundleFile);
  /** @type {import("node:child_process").ChildProcess | undefined} */
  let second;
  const id = `w-${randomUUID()}`;
  /** @type {import("../dist/temporal.js").RunOutput} */
  let out;
  try {
    const handle = await client.workflow.start("scriptedRun", { taskQueue, workflowId: id, args: [policy, KEY, srv.base, null] });
    const deadline = Date.now() + 60_000;
    while (!(srv.seen.length === 1 && (await timerStarted(client, id)))) {
      assert.ok(Date.now() < deadline, "the first attempt and its timer did not happen");
      await new Promise((r) => setTimeout(r, 50));
    }
    const exited = new Promise((resolve) => first?.once("exit", (_code, signal) => resolve(signal)));
    first.kill("SIGKILL");
    assert.equal(await exited, "SIGKILL");
    first = undefined;
    // Parked on the server: nothing is sent while no worker runs.
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(srv.seen.length, 1);
    second = await startWorker(taskQueue, bundleFile);
    out = await handle.result();
  } finally {
    await srv.close();
    for (const w of [first, second]) if (w !== undefined && w.exitCode === null && w.signalCode === null) w.kill("SIGKILL");
  }
  assert.equal(out.terminal, "completed");
  assert.equal(srv.seen.length, 3);
  const attempts = JSON.parse(out.bundleJson).attempts.attempts;
  assert.ok(attempts[1].started_at_ms - attempts[0].completed_at_ms >= 4000);
  const plain = await plainRun(policy, SCRIPT_LONG_WAIT, attempts);
  assert.equal(plain.count, srv.seen.length);
  assert.equal(plain.digest, out.receiptSha256);
  assert.equal(await replayedDigest(client, id), out.receiptSha256);
  console.log(`temporal (ts): worker SIGKILLed during a 4 s Retry-After timer, new worker finished: ${srv.seen.length} requests (plain run ${plain.count})`);
  await client.connection.close();
});

test("Temporal: the activity's step checks charges and token reports as the drivers' step does", () => {
  const session = new rl.CompiledPolicy(policyWith(() => undefined)).session();
  const decision = /** @type {import("../dist/index.js").DispatchDecision} */ (session.next());
  session.free();
  const step = new ActivityStep({ decision, idempotencyKey: KEY, startedAtMs: 0, args: [], priced: false });
  for (const bad of [-1, 1.5, Number.NaN, 2 ** 53]) {
    assert.throws(() => step.tokensUsed(bad), RangeError);
    assert.throws(() => step.charge(bad), RangeError);
  }
  step.tokensUsed(7);
  step.tokensUsed(3);
  step.charge(4);
  assert.equal(step.tokens, 10);
  assert.equal(step.charged, 4);
  assert.throws(() => step.tokensUsed(Number.MAX_SAFE_INTEGER), RangeError);
  assert.equal(step.tokens, 10, "a refused report leaves the total as it was");
});

test("Temporal: an activity retry policy of more than one attempt is refused before any request", { skip: gate.skip }, async () => {
  for (const given of [{}, { maximumAttempts: 0 }, { maximumAttempts: 3 }]) {
    assert.throws(() => checkRetryPolicy(given), (/** @type {any} */ e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness" && e.path === "/retry/maximumAttempts");
  }
  assert.deepEqual(checkRetryPolicy(undefined), { maximumAttempts: 1 });

  const client = await connect();
  const taskQueue = queue();
  const policy = policyText();
  const srv = await server([{ status: 200 }]);
  const { worker, connection } = await inProcessWorker(taskQueue);
  /** @type {number} */
  let refused;
  /** @type {import("../dist/temporal.js").RunOutput} */
  let out;
  try {
    ({ refused, out } = await worker.runUntil(async () => {
      // Temporal's default retry policy (0: unlimited), then three attempts.
      for (const attempts of [0, 3]) {
        await assert.rejects(
          client.workflow.execute("scriptedRun", { taskQueue, workflowId: `w-${randomUUID()}`, args: [policy, KEY, srv.base, attempts] }),
          (/** @type {any} */ e) => e instanceof WorkflowFailedError && e.cause instanceof ApplicationFailure && e.cause.type === "retry_owner_not_harness" && e.cause.nonRetryable === true,
        );
      }
      // The ready workflow refuses the same way.
      await assert.rejects(
        client.workflow.execute("retryledgerRun", {
          taskQueue,
          workflowId: `w-${randomUUID()}`,
          args: [{ policy, activity: "loopbackAttempt", idempotencyKey: KEY, args: [srv.base], activityMaximumAttempts: 0 }],
        }),
        (/** @type {any} */ e) => e instanceof WorkflowFailedError && e.cause instanceof ApplicationFailure && e.cause.type === "retry_owner_not_harness",
      );
      // A policy with a stream contract, before any dispatch too.
      await assert.rejects(
        client.workflow.execute("retryledgerRun", {
          taskQueue,
          workflowId: `w-${randomUUID()}`,
          args: [{ policy: streamPolicyText(), activity: "loopbackAttempt", idempotencyKey: KEY, args: [srv.base] }],
        }),
        (/** @type {any} */ e) => e instanceof WorkflowFailedError && e.cause instanceof ApplicationFailure && e.cause.type === "stream_record_missing",
      );
      // A fleet section and an async job: the core's refusals of a workflow
      // driver (docs/COMPOSITION.md), before any dispatch.
      for (const [refusedPolicy, code] of [
        [fleetPolicyText(), "admission_missing"],
        [jobPolicyText(), "invalid_async_job"],
      ]) {
        await assert.rejects(
          client.workflow.execute("retryledgerRun", {
            taskQueue,
            workflowId: `w-${randomUUID()}`,
            args: [{ policy: refusedPolicy, activity: "loopbackAttempt", idempotencyKey: KEY, args: [srv.base] }],
          }),
          (/** @type {any} */ e) => e instanceof WorkflowFailedError && e.cause instanceof ApplicationFailure && e.cause.type === code && e.cause.nonRetryable === true,
        );
      }
      const refused = srv.seen.length;
      // And runs with one attempt per activity.
      /** @type {import("../dist/temporal.js").RunOutput} */
      const out = await client.workflow.execute("retryledgerRun", {
        taskQueue,
        workflowId: `w-${randomUUID()}`,
        args: [{ policy, activity: "loopbackAttempt", idempotencyKey: KEY, args: [srv.base] }],
      });
      return { refused, out };
    }));
  } finally {
    await srv.close();
    await connection.close();
  }
  assert.equal(refused, 0);
  assert.equal(out.terminal, "completed");
  assert.equal(JSON.parse(out.bundleJson).receipt.attempt_count, 1);
  // The one result shape of every driver (value, receipt, receipt_sha256, bundle): otel.record takes it.
  assert.deepEqual(out.receipt, out.bundle.receipt);
  assert.equal(rl.digest(out.receipt), out.receipt_sha256);
  assert.equal(out.receiptSha256, out.receipt_sha256);
  assert.equal(rl.verifyBundle(out.bundle_json).kind, "verified");
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const spans = runTelemetry({ tracer: provider.getTracer("test") }).record(out);
  assert.equal(spans.run.attributes["retryledger.receipt_sha256"], out.receipt_sha256);
  assert.equal(exporter.getFinishedSpans().filter((s) => s.name === spans.run.name).length, 1);
  await client.connection.close();
});

test("Temporal: a cancelled workflow records the cancellation and resolves with its sealed run", { skip: gate.skip }, async () => {
  const client = await connect();
  const taskQueue = queue();
  const policy = policyText();
  const srv = await server([{ status: 429, headers: { "retry-after": "30" } }, { status: 200 }]);
  const { worker, connection } = await inProcessWorker(taskQueue);
  const id = `w-${randomUUID()}`;
  /** @type {import("../dist/temporal.js").RunOutput} */
  let out;
  try {
    out = await worker.runUntil(async () => {
      const handle = await client.workflow.start("scriptedRun", { taskQueue, workflowId: id, args: [policy, KEY, srv.base, null] });
      const deadline = Date.now() + 60_000;
      while (!(srv.seen.length === 1 && (await timerStarted(client, id)))) {
        assert.ok(Date.now() < deadline, "the first attempt and its timer did not happen");
        await new Promise((r) => setTimeout(r, 50));
      }
      await handle.cancel();
      return /** @type {Promise<import("../dist/temporal.js").RunOutput>} */ (handle.result());
    });
  } finally {
    await srv.close();
    await connection.close();
  }
  assert.equal(out.terminal, "stop_cancelled");
  assert.equal(srv.seen.length, 1);
  assert.equal(rl.verifyBundle(out.bundleJson).kind, "verified");
  const attempts = JSON.parse(out.bundleJson).attempts;
  assert.equal(attempts.attempts.length, 1);
  assert.ok(attempts.cancelled_at_ms >= attempts.attempts[0].completed_at_ms);
  assert.equal(await replayedDigest(client, id), out.receiptSha256);
  await client.connection.close();
});

/** @param {Client} client @param {string} id */
async function activityStarted(client, id) {
  const history = await client.workflow.getHandle(id).fetchHistory();
  return (history.events ?? []).some((e) => e.activityTaskStartedEventAttributes != null);
}

test("Temporal: a worker killed during an attempt times out and the core plans the retry", { skip: gate.skip }, async () => {
  const client = await connect();
  const taskQueue = queue();
  const policy = policyText();
  const dir = mkdtempSync(join(tmpdir(), "retryledger-temporal-"));
  const bundleFile = join(dir, "bundle.js");
  writeFileSync(bundleFile, (await workflowBundle()).code);
  const srv = await server([{ status: 200 }]);
  /** @type {import("node:child_process").ChildProcess | undefined} */
  let first = await startWorker(taskQueue, bundleFile, 1);
  /** @type {import("node:child_process").ChildProcess | undefined} */
  let second;
  const id = `w-${randomUUID()}`;
  /** @type {import("../dist/temporal.js").RunOutput} */
  let out;
  try {
    const handle = await client.workflow.start("scriptedRun", { taskQueue, workflowId: id, args: [policy, KEY, srv.base, null, 3] });
    const deadline = Date.now() + 60_000;
    while (!(await activityStarted(client, id))) {
      assert.ok(Date.now() < deadline, "attempt 1 did not start");
      await new Promise((r) => setTimeout(r, 50));
    }
    const exited = new Promise((resolve) => first?.once("exit", (_code, signal) => resolve(signal)));
    first.kill("SIGKILL");
    assert.equal(await exited, "SIGKILL");
    first = undefined;
    second = await startWorker(taskQueue, bundleFile);
    out = await handle.result();
  } finally {
    await srv.close();
    for (const w of [first, second]) if (w !== undefined && w.exitCode === null && w.signalCode === null) w.kill("SIGKILL");
  }
  assert.equal(out.terminal, "completed");
  assert.equal(srv.seen.length, 1);
  assert.deepEqual(srv.seen.map((s) => s.idempotencyKey), [KEY]);
  const attempts = JSON.parse(out.bundleJson).attempts.attempts;
  assert.deepEqual(attempts.map((/** @type {any} */ a) => a.outcome), [{ class: "retryable", kind: "timeout_before_response" }, { class: "success" }]);
  assert.ok(attempts[0].completed_at_ms - attempts[0].started_at_ms >= 3000);
  assert.equal(rl.verifyBundle(out.bundleJson).kind, "verified");
  assert.equal(await replayedDigest(client, id), out.receiptSha256);
  await client.connection.close();
});
