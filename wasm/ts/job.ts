/**
 * Provider asynchronous jobs (docs/JOBS.md): the documents of the policy's
 * `async_job` section, what a dispatch of a job is, what an attempt
 * records, and the receipt's summary. The core decides every step; a host
 * reports the job id and status it saw with `Session.setJob`. `runJob` is an
 * adapter of the host loop over the run machine's job layer.
 */
import { checkPriceSchedule, CompiledPolicy, compilePolicy, toText, type Input } from "./core.js";
import { AttemptStep, checkedKey, checkFleet, type RunOptions, type RunResult, type Step } from "./driver.js";
import { DecodeError, PolicyError, RunCancelledError, RunStoppedError, UnrecognizedDispatchError } from "./errors.js";
import { AttemptError } from "./facts.js";
import { fleetMachineOptions, loopFleet, loopHooks, type LoopHooks } from "./machine.js";
import {
  Machine,
  raisedFacts,
  Reports,
  runLoop,
  sleepFor,
  type CasDoc,
  type DispatchEffect,
  type LoopAdapter,
  type LoopResult,
  type LoopSleep,
  type MachineOptions,
  type StoreRowDoc,
} from "./loop.js";
import type { Session } from "./session.js";
import type { Attempt, Decision, DispatchDecision, Judgement, Policy, Receipt, Sealed, Sha256Hex, Terminal } from "./types.js";

/** A job's status as the provider reports it (an Anthropic batch that `ended` is `completed`). */
export type JobStatus = "queued" | "in_progress" | "completed" | "failed" | "cancelled" | "incomplete" | "expired";

/** Submit the request, poll the accepted job, or cancel the job the run would leave running. */
export type JobKind = "submit" | "poll" | "cancel";

/** What became of the planned cancel of a job left running. */
export type CancelResult = "accepted" | "failed";

/** The policy's `async_job` section. */
export interface AsyncJob {
  /**
   * A run that would end with the accepted job still running first cancels
   * it, recorded as an attempt (`true`, or absent: not cancelled by the run).
   */
  cancel_left_running?: true;
  max_polls: number;
  poll_base_ms: number;
  poll_max_ms: number;
}

/** What a planned dispatch of a job is. */
export interface JobStep {
  /** The accepted job's id digest, for a poll or the cancel. */
  job_sha256?: Sha256Hex;
  kind: JobKind;
  /** The poll's number, from 1, for a poll. */
  poll?: number;
}

/** What an attempt of a job was and saw. */
export interface JobRecord {
  job_sha256?: Sha256Hex;
  kind: JobKind;
  poll?: number;
  status?: JobStatus;
}

/** The receipt's summary of a job. */
export interface JobSummary {
  /** What became of the planned cancel (`cancel_left_running`); absent when none was planned. */
  cancel?: CancelResult;
  job_sha256?: Sha256Hex;
  /**
   * The run ended with the accepted job still running and no cancel the
   * provider accepted (without `cancel_left_running`, `runJob` then cancels
   * it after sealing, unrecorded).
   */
  left_running: boolean;
  polls: number;
  status?: JobStatus;
  submits: number;
}


/** What a submit or a poll answered: the job's status, and for a submit its id. */
export interface JobAnswer<R> {
  /** The provider's job id (required on a submit's answer). */
  id?: string | undefined;
  /** The job's status in the answer. */
  status: JobStatus;
  /** The provider's answer itself (the run's result when the job completed). */
  value: R;
}

/** The provider calls of an async job. */
export interface JobCalls<R> {
  /** Submit the request once; answer the job's id and status. */
  submit(step: Step, signal: AbortSignal): Promise<JobAnswer<R>> | JobAnswer<R>;
  /** Retrieve the job by its id. */
  poll(id: string, step: Step, signal: AbortSignal): Promise<JobAnswer<R>> | JobAnswer<R>;
  /**
   * Cancel the job at the provider. Under `cancel_left_running` it is the
   * planned `cancel` step (required then; recorded with its outcome, never
   * retried); without it, called after the run ended with `left_running`.
   */
  cancel?(id: string): Promise<unknown> | unknown;
  /**
   * Ask the provider, by the run's idempotency key, what became of a submit
   * whose answer was lost (it raised): `succeeded` with the job's id and
   * status (the job was accepted: polls follow), `failed_no_effect` (nothing
   * was accepted: another submit may follow) or `unknown` (the run stops
   * `stop_indeterminate`). Without it a lost submit answer stops the run.
   */
  reconcile?(step: Step, error: unknown): Promise<JobReconciliation<R>> | JobReconciliation<R>;
}

/** What a reconciliation of a lost submit answer found. */
export type JobReconciliation<R> =
  | { answer: "succeeded"; id: string; status: JobStatus; value: R }
  | { answer: "failed_no_effect" | "unknown" };

/** A dispatch signal that never fires: the planned cancel's (sent whatever the caller did). */
let quiet: AbortSignal | undefined;

/**
 * An async job as the host loop's adapter: each `dispatch`, `poll` and
 * `cancel` effect is the provider call it names, with the job id the
 * submit's answer gave; what each answered (the job id and status, a lost
 * submit's reconciliation) goes back in the observation, and the core
 * decides what comes next.
 */
class JobRun<R> implements LoopAdapter<JobAnswer<R>> {
  readonly #t0: number;
  readonly #clock: () => number;
  readonly #controller: AbortController | undefined;
  #step: AttemptStep | undefined;
  #reports: Reports | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  jobId: string | undefined;
  last: JobAnswer<R> | undefined;
  lastError: unknown;
  lastRule: unknown;
  succeeded = false;
  cancelled_ = false;

  constructor(
    readonly compiled: CompiledPolicy,
    readonly key: string,
    readonly calls: JobCalls<R>,
    readonly options: RunOptions,
    readonly schedule: string | undefined,
  ) {
    this.#clock = options.clock ?? ((): number => performance.now());
    this.#t0 = this.#clock();
    // One signal serves every attempt: it fires at the run's deadline or when the caller's does.
    this.#controller = new AbortController();
    const signal = options.signal;
    if (signal !== undefined) {
      const onAbort = (): void => this.#controller?.abort(signal.reason);
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    }
    // Under a fleet section the submit is admitted against the fleet's store
    // (the machine's `read` and `write`); polls and the cancel are not.
    Object.assign(this, loopFleet(options.fleet));
    const { onAttempt, ...hooks } = loopHooks(options);
    this.#onAttempt = onAttempt;
    Object.assign(this, hooks);
  }

  read?: (keys: string[]) => Promise<StoreRowDoc[]>;
  write?: (writes: CasDoc[]) => Promise<number>;
  readonly #onAttempt: LoopHooks["onAttempt"];
  onDecision?: NonNullable<LoopHooks["onDecision"]>;
  onSleep?: NonNullable<LoopHooks["onSleep"]>;
  onTerminal?: NonNullable<LoopHooks["onTerminal"]>;

  onAttempt(attempt: Record<string, unknown>, judgement: Record<string, unknown>): void {
    this.lastRule = judgement["rule"];
    this.#onAttempt?.(attempt, judgement);
  }

  nowMs(): number {
    return Math.max(0, Math.floor(this.#clock() - this.#t0));
  }

  /** Whether the caller cancelled (the loop asks before each wait and send; once seen, the run ends cancelled). */
  cancelled(): boolean {
    if (this.options.signal?.aborted !== true) return false;
    this.cancelled_ = true;
    return true;
  }

  cancelledBeforeSend(): boolean {
    return this.cancelled();
  }

  sleep(ms: number): Promise<void> {
    const signal = this.options.signal;
    return this.options.sleep !== undefined ? this.options.sleep(ms, signal) : sleepFor(ms, signal);
  }

  /** The attempt's signal: the run's (its deadline, the caller's), or one that never fires for the planned cancel. */
  #signal(effect: DispatchEffect, startedAt: number): AbortSignal {
    if (effect.kind === "cancel") return (quiet ??= new AbortController().signal);
    const c = this.#controller as AbortController;
    const remaining = this.compiled.policy.deadline_ms - startedAt;
    if (!c.signal.aborted) {
      if (remaining <= 0) c.abort(new DOMException("the run's deadline passed during the attempt", "TimeoutError"));
      else if (this.#timer === undefined && remaining <= 2_147_483_647) {
        this.#timer = setTimeout(() => c.abort(new DOMException("the run's deadline passed during the attempt", "TimeoutError")), remaining);
      }
    }
    return c.signal;
  }

  async dispatch(effect: DispatchEffect): Promise<JobAnswer<R>> {
    const decision = { ...effect.dispatch, kind: "dispatch" } as unknown as DispatchDecision;
    const reports = new Reports(this.schedule, decision.route_release_sha256);
    const step = new AttemptStep(decision, this.key, effect.started_at_ms, reports as unknown as Session, this.schedule !== undefined);
    this.#step = step;
    this.#reports = reports;
    const signal = this.#signal(effect, effect.started_at_ms);
    if (effect.kind === "cancel") {
      // The planned cancel of the job the run leaves running: sent once, its
      // outcome recorded; the run's last answer stays the job's.
      const id = this.jobId as string;
      await (this.calls.cancel as (id: string) => unknown)(id);
      reportJob(step, id, undefined);
      return this.last as JobAnswer<R>;
    }
    if (effect.kind === "dispatch") {
      let answer: JobAnswer<R>;
      try {
        answer = await this.calls.submit(step, signal);
      } catch (e) {
        if (this.calls.reconcile === undefined || step.reconciled === undefined) throw e;
        const found = await this.calls.reconcile(step, e);
        step.reconciled(found.answer);
        if (found.answer !== "succeeded") throw e;
        answer = { id: found.id, status: found.status, value: found.value };
      }
      reportJob(step, answer.id, answer.status);
      if (answer.id !== undefined) this.jobId = answer.id;
      this.last = answer;
      return answer;
    }
    // The core plans polls only after an acceptance, which set the id.
    const id = this.jobId as string;
    const answer = await this.calls.poll(id, step, signal);
    reportJob(step, id, answer.status);
    this.last = answer;
    return answer;
  }

  observation(effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown> {
    const step = this.#step as AttemptStep;
    step.open = false;
    const fields: Record<string, unknown> = {};
    if (ok) {
      this.succeeded = true;
      this.lastError = undefined;
      const checks = this.options.checks;
      if (checks !== undefined && effect.kind !== "cancel") {
        try {
          fields["facts"] = { result: "returned", output_checks: checks.map((c) => c.check(reply)) };
        } catch (e) {
          // A check that throws leaves the attempt unrecognized.
          this.lastError = e;
          fields["facts"] = { result: "raised", error_types: ["OutputCheckError"] };
        }
      }
    } else {
      this.succeeded = false;
      this.lastError = reply;
      const aborted = effect.kind !== "cancel" && this.cancelled();
      if (aborted) this.cancelled_ = true;
      const wall = this.options.wallClock ?? Date.now;
      fields["facts"] = raisedFacts(reply, { classify: this.options.classify, outputDelivered: step.delivered, cancelled: aborted, nowUnixMs: wall() });
    }
    if (step.charged !== undefined) fields["cost"] = step.charged;
    if (step.tokens !== undefined) fields["used_tokens"] = step.tokens;
    return (this.#reports as Reports).fields(fields);
  }

  done(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
  }
}

/**
 * Run one logical request as a provider's asynchronous job under a policy
 * with an `async_job` section: submit once, then poll by the job's id when
 * and as often as the core plans (docs/JOBS.md). Resolves with the answer
 * that completed the job; rejects like `runWithPolicy` otherwise. Under
 * the section's `cancel_left_running` the core plans the cancel of a job
 * the run would leave running and `calls.cancel` is that step (its attempt
 * is the run's last); without it, when the run ends with the accepted job
 * still running (the receipt's `job.left_running`), `calls.cancel` cancels
 * it before the rejection, unrecorded. A caller's cancellation (`signal`)
 * of a run whose job is still running is followed by that planned cancel
 * too, sent once; the run then rejects with `RunCancelledError`. Under a
 * fleet section (`options.fleet`, required then) the submit is admitted
 * against the fleet's store like any attempt (its route's breaker, the
 * retry budget, admission limits) and its outcome settled there; polls and
 * the cancel ask about the job the provider holds and are not admitted.
 * The run goes through the host loop over the run machine's job layer
 * (docs/HOST_LOOP.md), with every option of `runWithPolicy` but `repair`.
 */
export async function runJob<R>(
  policy: Input<Policy> | CompiledPolicy,
  calls: JobCalls<R>,
  options: RunOptions,
): Promise<RunResult<JobAnswer<R>>> {
  const compiled = policy instanceof CompiledPolicy ? policy : compilePolicy(policy);
  // A job runs under an async_job section: the core's rule (invalid_async_job otherwise).
  compiled.requireDriver("job");
  if (options.repair !== undefined) {
    throw new DecodeError("invalid_value", "invalid_value at /repair: an async job's run is not repaired", { path: "/repair" });
  }
  // The caller's calls, checked by the core before any request: the run may plan a cancel.
  compiled.requireJobCalls(typeof calls.cancel === "function");
  const key = checkedKey(compiled, options?.idempotencyKey, options?.keyScope);
  checkFleet(compiled, options.fleet);
  let schedule: string | undefined;
  if (options.priceSchedule !== undefined) {
    schedule = toText(options.priceSchedule);
    checkPriceSchedule(compiled.policy, schedule);
  }
  const adapter = new JobRun(compiled, key, calls, options, schedule);
  const fleet = options.fleet;
  // Under a fleet the run's wall clock is the fleet's (its documents' `*_epoch_ms`).
  const wall = fleet !== undefined ? (): number => fleet.now() : (options.wallClock ?? Date.now);
  const machineOptions: MachineOptions = { origin_epoch_ms: Math.max(0, Math.floor(wall()) - adapter.nowMs()) };
  if (schedule !== undefined) machineOptions.price_schedule = JSON.parse(schedule) as object;
  Object.assign(machineOptions, fleetMachineOptions(fleet));
  if (fleet !== undefined && options.reserveTokens !== undefined) machineOptions.reserve_tokens = options.reserveTokens;
  const machine = Machine.start(compiled, machineOptions);
  let run: LoopResult<JobAnswer<R>>;
  try {
    run = await runLoop(machine, adapter);
  } finally {
    adapter.done();
    machine.free();
  }
  const sealed: Sealed = { terminal: run.terminal as Terminal, receipt: run.receipt, receipt_sha256: run.receipt_sha256, bundle: run.bundle, bundle_json: run.bundle_json };
  if (sealed.terminal === "completed") return { result: run.value as JobAnswer<R>, receipt: sealed.receipt, bundle: sealed.bundle, sealed };
  // The core's receipt says the job is left running and no cancel of it was planned: it is cancelled now, unrecorded.
  const job = sealed.receipt.job;
  if (job?.left_running === true && job.cancel === undefined && adapter.jobId !== undefined && calls.cancel !== undefined) {
    await calls.cancel(adapter.jobId);
  }
  const n = sealed.receipt.attempt_count;
  const last = adapter.lastError;
  const text = last instanceof Error ? `${last.name}: ${last.message}` : String(last);
  const because = last === undefined ? "" : `; last error: ${text.length > 200 ? `${text.slice(0, 200)}…` : text}`;
  const message = `run stopped with ${sealed.terminal} after ${n} attempt${n === 1 ? "" : "s"}${because}`;
  if (adapter.cancelled_) throw new RunCancelledError<JobAnswer<R>>(message, { sealed, cause: options.signal?.reason });
  if (adapter.lastRule === "unrecognized") throw new UnrecognizedDispatchError<JobAnswer<R>>(message, { sealed, cause: last });
  const details = adapter.succeeded ? { sealed, cause: last, result: adapter.last as JobAnswer<R> } : { sealed, cause: last };
  throw new RunStoppedError<JobAnswer<R>>(message, details);
}

function reportJob(step: Step, id: string | undefined, status: JobStatus | undefined): void {
  if (step.job === undefined) throw new TypeError("runJob: this step cannot report a job");
  step.job(id, status);
}

/** The OpenAI client's Responses calls an async job uses. */
export interface OpenAIResponsesLike {
  maxRetries: number;
  responses: {
    create(params: Record<string, unknown>, options?: Record<string, unknown>): PromiseLike<unknown>;
    retrieve(id: string, query?: Record<string, unknown>, options?: Record<string, unknown>): PromiseLike<unknown>;
    cancel(id: string, options?: Record<string, unknown>): PromiseLike<unknown>;
  };
}

const OPENAI_STATUS: Record<string, JobStatus> = {
  queued: "queued",
  in_progress: "in_progress",
  completed: "completed",
  failed: "failed",
  cancelled: "cancelled",
  incomplete: "incomplete",
};

/** A provider answer outside its documented shape: a protocol violation, never retried. */
function outsideTheSet(message: string): AttemptError {
  return AttemptError.nonRetryable("protocol_violation", { cause: new TypeError(`retryledger: ${message}`) });
}

function responseStatus(r: unknown): { id: string | undefined; status: JobStatus } {
  const o = (r ?? {}) as { id?: unknown; status?: unknown };
  const status = typeof o.status === "string" ? OPENAI_STATUS[o.status] : undefined;
  if (status === undefined) {
    throw outsideTheSet(`a response status outside the documented set: ${String(o.status)}`);
  }
  return { id: typeof o.id === "string" ? o.id : undefined, status };
}

/**
 * The calls of an OpenAI Responses request run in the background
 * (`background: true`): create, retrieve by id, cancel. The client must be
 * built with `maxRetries: 0` (`PolicyError` `retry_owner_not_harness`
 * otherwise, before any request), and every call passes `maxRetries: 0` and
 * the run's idempotency key.
 */
export function openaiResponsesJob<R = unknown>(client: OpenAIResponsesLike, params: Record<string, unknown>): JobCalls<R> {
  assertNoRetries(client);
  return {
    async submit(step, signal) {
      const r = await client.responses.create({ ...params, background: true }, {
        maxRetries: 0,
        signal,
        timeout: Math.max(1, step.remainingMs),
        idempotencyKey: step.idempotencyKey,
        headers: { "Idempotency-Key": step.idempotencyKey },
      });
      const { id, status } = responseStatus(r);
      return { id, status, value: r as R };
    },
    async poll(id, step, signal) {
      const r = await client.responses.retrieve(id, {}, { maxRetries: 0, signal, timeout: Math.max(1, step.remainingMs) });
      return { status: responseStatus(r).status, value: r as R };
    },
    async cancel(id) {
      return client.responses.cancel(id, { maxRetries: 0 });
    },
  };
}

function assertNoRetries(client: { maxRetries: number }): void {
  if (client?.maxRetries !== 0) {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: the client has maxRetries ${String(client?.maxRetries)}; build it with maxRetries: 0 so that the harness is the only retry owner`,
      { path: "/maxRetries" },
    );
  }
}

/** The Anthropic client's Message Batches calls an async job uses. */
export interface AnthropicBatchesLike {
  maxRetries: number;
  messages: {
    batches: {
      create(params: object, options?: object): PromiseLike<unknown>;
      retrieve(id: string, params?: object, options?: object): PromiseLike<unknown>;
      results(id: string, params?: object, options?: object): PromiseLike<AsyncIterable<unknown>>;
      cancel(id: string, params?: object, options?: object): PromiseLike<unknown>;
    };
  };
}

/** A batch's `processing_status` as a job status (`ended`: its request's result decides). */
function batchStatus(b: unknown): { id: string | undefined; status: JobStatus | "ended" } {
  const o = (b ?? {}) as { id?: unknown; processing_status?: unknown };
  const id = typeof o.id === "string" ? o.id : undefined;
  switch (o.processing_status) {
    case "in_progress":
    case "canceling":
      return { id, status: "in_progress" };
    case "ended":
      return { id, status: "ended" };
    default:
      throw outsideTheSet(`a batch processing_status outside the documented set: ${String(o.processing_status)}`);
  }
}

/** An ended batch request's result type as a job status. */
const RESULT_STATUS: Record<string, JobStatus> = {
  succeeded: "completed",
  errored: "failed",
  canceled: "cancelled",
  expired: "expired",
};

/**
 * The calls of one Anthropic Messages request run as a Message Batch of
 * one request (`custom_id`, default `"request"`): create, retrieve by id
 * (and, once the batch `ended`, its request's result: `succeeded` is
 * `completed`, `errored` `failed`, `canceled` `cancelled`, `expired`
 * `expired`), cancel. The client must be built with `maxRetries: 0`
 * (`PolicyError` `retry_owner_not_harness` otherwise, before any request).
 * A completed job's value is the request's result (`{type: "succeeded",
 * message}`).
 */
export function anthropicBatchJob<R = unknown>(client: AnthropicBatchesLike, params: Record<string, unknown>, customId = "request"): JobCalls<R> {
  assertNoRetries(client);
  const batches = client.messages.batches;
  return {
    async submit(step, signal) {
      const b = await batches.create(
        { requests: [{ custom_id: customId, params }] },
        { maxRetries: 0, signal, timeout: Math.max(1, step.remainingMs), headers: { "Idempotency-Key": step.idempotencyKey } },
      );
      const { id, status } = batchStatus(b);
      // A batch that ended at once is polled for its result.
      return { id, status: status === "ended" ? "in_progress" : status, value: b as R };
    },
    async poll(id, step, signal) {
      const options = { maxRetries: 0, signal, timeout: Math.max(1, step.remainingMs) };
      const b = await batches.retrieve(id, {}, options);
      const { status } = batchStatus(b);
      if (status !== "ended") return { status, value: b as R };
      for await (const line of await batches.results(id, {}, options)) {
        const entry = line as { custom_id?: unknown; result?: { type?: unknown } };
        if (entry.custom_id !== customId) continue;
        const mapped = typeof entry.result?.type === "string" ? RESULT_STATUS[entry.result.type] : undefined;
        if (mapped === undefined) throw outsideTheSet(`a batch result type outside the documented set: ${String(entry.result?.type)}`);
        return { status: mapped, value: entry.result as R };
      }
      throw outsideTheSet(`the ended batch has no result for ${customId}`);
    },
    async cancel(id) {
      return batches.cancel(id, {}, { maxRetries: 0 });
    },
  };
}
