/**
 * Temporal, workflow side: import this module from workflow code only (the
 * worker side is `retryledger/temporal/worker`). docs/TEMPORAL.md.
 *
 * ```ts
 * import { runAttempts } from "retryledger/temporal";
 * export async function summarize(policy: string, key: string, text: string) {
 *   return runAttempts({ policy, activity: "summarize", idempotencyKey: key, args: [text] });
 * }
 * ```
 *
 * The workflow isolate runs the core itself: this module instantiates the
 * WebAssembly module in the isolate from bytes bundled with the workflow
 * code, so the run machine lives in the workflow and is driven by the host
 * loop (docs/HOST_LOOP.md: sleep on a workflow timer, dispatch as one
 * activity execution), each `next` and `answer` a deterministic call
 * replayed with the history, and no decision needs a local activity. What that takes, and why each is safe:
 *
 * - the module's bytes come with the workflow bundle (`pkg-web/retryledger_wasm_base64.js`,
 *   generated at build time as base64; the isolate has no `fs`, `fetch` or
 *   `atob`), and the worker bundles the workflow code with
 *   `bundlerOptions` from `retryledger/temporal/worker`, which keeps webpack
 *   from turning the glue's default module URL into an asset the isolate
 *   cannot load;
 * - the isolate forbids `FinalizationRegistry` (garbage collection is not
 *   deterministic); where constructing one throws, it is removed before the
 *   glue loads, so the glue's objects are freed explicitly (the helper frees
 *   its session and policy when the run ends) and never by the collector.
 */

import "./temporal-isolate.js";
import type { Duration, RetryPolicy } from "@temporalio/common";
import { ActivityFailure, ApplicationFailure, TimeoutFailure, isCancellation, proxyActivities, sleep } from "@temporalio/workflow";
import { initSync } from "../pkg-web/retryledger_wasm.js";
import * as glue from "../pkg-web/retryledger_wasm.js";
import { CompiledPolicy, checkPriceSchedule, setBindings, toText, type Input, type RawBindings } from "./core.js";
import { DriftError, RetryledgerError } from "./errors.js";
import { factsOf } from "./facts.js";
import { MODULE_BASE64 } from "../pkg-web/retryledger_wasm_base64.js";
import { checkRetryPolicy, type AttemptInput, type AttemptReport, type RunOutput } from "./temporal-common.js";
import { Machine, runLoop, type DispatchEffect, type LoopAdapter, type LoopResult, type MachineOptions } from "./loop.js";
import type { DispatchDecision, Facts, Policy, PriceSchedule } from "./types.js";

export { ONE_ATTEMPT, checkRetryPolicy, type AttemptInput, type AttemptReport, type RunOutput } from "./temporal-common.js";

let loaded = false;

/** Instantiate the core in this isolate once. */
function loadCore(): void {
  if (loaded) return;
  initSync({ module: decodeBase64(MODULE_BASE64) });
  setBindings(glue as unknown as RawBindings);
  loaded = true;
}

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

function decodeBase64(text: string): Uint8Array {
  const table = new Uint8Array(128);
  for (let i = 0; i < ALPHABET.length; i++) table[ALPHABET.charCodeAt(i)] = i;
  const pad = text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0;
  const n = (text.length / 4) * 3 - pad;
  const out = new Uint8Array(n);
  let o = 0;
  for (let i = 0; i < text.length; i += 4) {
    const v =
      ((table[text.charCodeAt(i)] as number) << 18) |
      ((table[text.charCodeAt(i + 1)] as number) << 12) |
      ((table[text.charCodeAt(i + 2)] as number) << 6) |
      (table[text.charCodeAt(i + 3)] as number);
    if (o < n) out[o++] = v >> 16;
    if (o < n) out[o++] = (v >> 8) & 255;
    if (o < n) out[o++] = v & 255;
  }
  return out;
}

/** What {@link runAttempts} runs. */
export interface RunAttemptsOptions {
  /** The policy (an object or its JSON text). */
  policy: Input<Policy>;
  /** The name of the attempt activity (made with `attemptActivity`). */
  activity: string;
  /** The raw idempotency key. */
  idempotencyKey: string;
  /** The activity's arguments after its step and signal. */
  args?: unknown[];
  /** Each attempt's start-to-close timeout (default one minute). */
  startToCloseTimeout?: Duration;
  /** Each attempt's heartbeat timeout, if the activity heartbeats. */
  heartbeatTimeout?: Duration;
  /** The activity retry policy: only one attempt is accepted (the default). */
  retry?: RetryPolicy;
  /** The attempts' task queue (default: the workflow's). */
  taskQueue?: string;
  /** A price schedule, checked against the policy before the first dispatch. */
  priceSchedule?: Input<PriceSchedule>;
}

/** A coded error as a workflow failure: not retryable, its type the code. */
function coded(e: unknown): unknown {
  if (e instanceof RetryledgerError) {
    return ApplicationFailure.create({
      type: e.code,
      message: e.message,
      nonRetryable: true,
      details: [{ code: e.code, path: e.path ?? null }],
    });
  }
  return e;
}

/** The facts of an activity execution that did not report (timed out, its worker lost, not found). */
function failureFacts(e: ActivityFailure): Facts {
  const facts: Facts = factsOf(e, { nowUnixMs: Date.now() });
  if (e.cause instanceof TimeoutFailure) facts.transport_error = "timeout";
  return facts;
}

/**
 * Run one logical request from workflow code: plan each attempt with the
 * core, sleep on a workflow timer until its `not_before_ms`, run it as one
 * activity execution under a retry policy of one attempt, record its facts
 * and return the sealed run (the one result shape of every driver: value,
 * receipt, `receipt_sha256`, bundle; `otel.record` takes it). Coded errors
 * before the first dispatch (a retry policy of more than one attempt, a
 * policy or key the core refuses, a section the core says a workflow cannot
 * carry: a fleet, a stream contract, an async job) fail the workflow with an
 * `ApplicationFailure` whose type is the code.
 * A cancelled workflow records its cancellation (between attempts as the
 * run's `cancelled_at_ms`, during one as that attempt's `cancelled` fact)
 * and resolves with its sealed run like any other.
 */
export async function runAttempts(options: RunAttemptsOptions): Promise<RunOutput> {
  let compiled: CompiledPolicy;
  let retry: RetryPolicy;
  let schedule: string | undefined;
  const key = options.idempotencyKey;
  try {
    retry = checkRetryPolicy(options.retry);
    loadCore();
    compiled = new CompiledPolicy(toText(options.policy));
  } catch (e) {
    throw coded(e);
  }
  try {
    if (!compiled.acceptsKey(key)) {
      throw new DriftError(
        "idempotency_key_drift",
        "idempotency_key_drift at /idempotency_key_sha256: the digest of the idempotency key is not the policy's idempotency_key_sha256",
        { path: "/idempotency_key_sha256" },
      );
    }
    // What a workflow's I/O cannot carry (a fleet store, a stream record, a
    // job's id) is the core's refusal (docs/COMPOSITION.md, "What a driver carries").
    compiled.requireDriver("workflow");
    if (options.priceSchedule !== undefined) {
      schedule = toText(options.priceSchedule);
      checkPriceSchedule(compiled.policy, schedule);
    }
  } catch (e) {
    compiled.free();
    throw coded(e);
  }
  const activities = proxyActivities<Record<string, (input: AttemptInput) => Promise<AttemptReport>>>({
    startToCloseTimeout: options.startToCloseTimeout ?? "1 minute",
    retry,
    ...(options.heartbeatTimeout === undefined ? {} : { heartbeatTimeout: options.heartbeatTimeout }),
    ...(options.taskQueue === undefined ? {} : { taskQueue: options.taskQueue }),
  });
  const attempt = activities[options.activity] as (input: AttemptInput) => Promise<AttemptReport>;
  const adapter = new WorkflowRun(attempt, key, options.args ?? [], schedule !== undefined);
  try {
    const machineOptions: MachineOptions = { origin_epoch_ms: adapter.t0 };
    if (schedule !== undefined) machineOptions.price_schedule = JSON.parse(schedule) as object;
    const machine = Machine.start(compiled, machineOptions);
    let run: LoopResult<AttemptReport>;
    try {
      run = await runLoop(machine, adapter);
    } finally {
      machine.free();
    }
    const out: RunOutput = {
      terminal: run.terminal,
      receipt: run.receipt,
      receipt_sha256: run.receipt_sha256,
      bundle: run.bundle,
      bundle_json: run.bundle_json,
      receiptSha256: run.receipt_sha256,
      bundleJson: run.bundle_json,
    };
    if (run.value?.value !== undefined) out.value = run.value.value;
    return out;
  } catch (e) {
    throw coded(e);
  } finally {
    compiled.free();
  }
}

/**
 * A workflow's run as the host loop's adapter: the run clock on the
 * workflow's deterministic time, a wait on a workflow timer, each attempt
 * one activity execution (its report the attempt's facts), and the
 * workflow's cancellation as the caller's.
 */
class WorkflowRun implements LoopAdapter<AttemptReport> {
  readonly t0 = Date.now();
  #cancelled = false;

  constructor(
    readonly attempt: (input: AttemptInput) => Promise<AttemptReport>,
    readonly key: string,
    readonly args: unknown[],
    readonly priced: boolean,
  ) {}

  nowMs(): number {
    return Math.max(0, Date.now() - this.t0);
  }

  cancelled(): boolean {
    return this.#cancelled;
  }

  cancelledBeforeSend(): boolean {
    return this.#cancelled;
  }

  async sleep(ms: number): Promise<void> {
    try {
      await sleep(ms);
    } catch (e) {
      if (!isCancellation(e)) throw e;
      // Cancelled between attempts: the loop answers the wait `cancelled`.
      this.#cancelled = true;
    }
  }

  dispatch(effect: DispatchEffect): Promise<AttemptReport> {
    const decision = { ...effect.dispatch, kind: "dispatch" } as unknown as DispatchDecision;
    return this.attempt({ decision, idempotencyKey: this.key, startedAtMs: effect.started_at_ms, args: this.args, priced: this.priced });
  }

  observation(_effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown> {
    if (!ok) {
      if (isCancellation(reply)) {
        // Cancelled during the attempt: judged as cancelled (never retried).
        this.#cancelled = true;
        return { facts: { cancelled: true, now_unix_ms: Date.now(), result: "raised" } };
      }
      if (reply instanceof ActivityFailure) return { facts: failureFacts(reply) };
      throw reply;
    }
    const report = reply as AttemptReport;
    const fields: Record<string, unknown> = { facts: JSON.parse(report.facts) as Facts };
    if (report.cost !== undefined) fields["cost"] = report.cost;
    if (report.usage !== undefined) fields["usage"] = report.usage;
    if (report.requestBodySha256 !== undefined) fields["request_body_sha256"] = report.requestBodySha256;
    return fields;
  }
}

/** The input of the ready workflow {@link retryledgerRun}. */
export interface RunInput {
  /** The policy (an object or its JSON text). */
  policy: Input<Policy>;
  /** The name of the attempt activity. */
  activity: string;
  /** The raw idempotency key. */
  idempotencyKey: string;
  /** The activity's arguments after its step and signal. */
  args?: unknown[];
  /** Each attempt's start-to-close timeout, ms (default 60000). */
  startToCloseTimeoutMs?: number;
  /** The activity retry policy's maximum attempts; only 1 is accepted (the default). */
  activityMaximumAttempts?: number;
  /** The attempts' task queue (default: the workflow's). */
  taskQueue?: string;
  /** A price schedule, checked against the policy before the first dispatch. */
  priceSchedule?: Input<PriceSchedule>;
}

/** A ready workflow: one logical request under a policy, its attempts run by the activity it names. */
export async function retryledgerRun(input: RunInput): Promise<RunOutput> {
  return runAttempts({
    policy: input.policy,
    activity: input.activity,
    idempotencyKey: input.idempotencyKey,
    args: input.args ?? [],
    startToCloseTimeout: input.startToCloseTimeoutMs ?? 60_000,
    retry: { maximumAttempts: input.activityMaximumAttempts ?? 1 },
    ...(input.taskQueue === undefined ? {} : { taskQueue: input.taskQueue }),
    ...(input.priceSchedule === undefined ? {} : { priceSchedule: input.priceSchedule }),
  });
}
