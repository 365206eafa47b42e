/**
 * `runWithPolicy`: the single retry owner of one logical request.
 *
 * The driver plans with the core, waits until `not_before_ms` (no timer when
 * the wait is 0), calls `dispatch(step, signal)` once per planned attempt with
 * the same idempotency key and a signal that fires at the run's deadline,
 * classifies what dispatch returned or threw (an unrecognized error is
 * recorded as indeterminate and never retried), and seals the run. Time is
 * the run clock: integer milliseconds since the driver started, read from an
 * injectable clock.
 */

import { CompiledPolicy, call as guardCall, type Input, type RawRun } from "./core.js";
import { classifyError, type Classifier } from "./classify.js";
import {
  DecodeError,
  DriftError,
  RunCancelledError,
  RunStoppedError,
  UnrecognizedDispatchError,
} from "./errors.js";
import type { Attempt, Attempts, Bundle, DispatchDecision, Outcome, Policy, Receipt } from "./types.js";

/** A module call whose thrown JSON text becomes a typed error. */
function guard<R>(f: () => R): R {
  return guardCall(f);
}

/** One planned attempt, as dispatch sees it. */
export interface Step {
  /** Global ordinal, from 1. */
  readonly ordinal: number;
  /** The route to call. */
  readonly routeId: string;
  /** Ordinal on this route, from 1. */
  readonly routeOrdinal: number;
  /** The exact route release the policy names. */
  readonly routeReleaseSha256: string;
  /** The caller's idempotency key; send it on every attempt. */
  readonly idempotencyKey: string;
  /** Milliseconds left before the run's deadline when this attempt started. */
  readonly remainingMs: number;
  /** The run's deadline on the run clock, ms. */
  readonly deadlineMs: number;
  /** When the attempt started on the run clock, ms. */
  readonly startedAtMs: number;
  /** The worst-case cost reserved for this attempt. */
  readonly reserveCost: number;
  /** The core's full decision for this attempt. */
  readonly decision: DispatchDecision;
  /** Record actual cost (an integer; calls add up); an attempt never charged costs `reserveCost`. */
  charge(cost: number): void;
}

/** The caller's attempt: resolve with the result, or throw what went wrong. */
export type DispatchFn<T> = (step: Step, signal: AbortSignal) => Promise<T> | T;

export interface RunOptions {
  /** The raw idempotency key; its SHA-256 must be the policy's `idempotency_key_sha256`. */
  idempotencyKey: string;
  /** Stops the run: between attempts (`stop_cancelled`) or during one (that attempt is indeterminate). */
  signal?: AbortSignal;
  /** Monotonic milliseconds (default `performance.now`); the run clock starts at its first reading. */
  clock?: () => number;
  /** Wait `ms` milliseconds, returning early when `signal` aborts (default: a timer). */
  sleep?: (ms: number, signal: AbortSignal | undefined) => Promise<void>;
  /** Wall clock in Unix ms, for HTTP-date Retry-After hints (default `Date.now`). */
  wallClock?: () => number;
  /** Classifies errors of a particular client (see `openaiClassifier`) before the generic rules. */
  classify?: Classifier;
  /** Called with every attempt as it is recorded. */
  onAttempt?: (attempt: Attempt) => void;
}

/** A completed run: dispatch's result and the sealed bundle. */
export interface RunResult<T> {
  result: T;
  bundle: Bundle;
  receipt: Receipt;
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

const defaultClock = (): number => performance.now();

function defaultSleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function deadlineReason(): Error {
  const e = new Error("the run's deadline passed during the attempt");
  e.name = "TimeoutError";
  return e;
}

const SUCCESS: Outcome = { class: "success" };
const UNKNOWN: Outcome = { class: "indeterminate", kind: "unknown_provider_acceptance" };

/**
 * Run one logical request under a policy. Resolves with `{result, bundle,
 * receipt}` when the run completes; rejects with a `RunStoppedError` (or its
 * subclasses `UnrecognizedDispatchError`, `RunCancelledError`) carrying the
 * bundle otherwise. Throws `DecodeError`/`PolicyError` for a bad policy and
 * `DriftError` `idempotency_key_drift` for a key that is not the policy's,
 * before any dispatch.
 */
export async function runWithPolicy<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: DispatchFn<T>,
  options: RunOptions,
): Promise<RunResult<T>> {
  if (policy instanceof CompiledPolicy) return drive(policy, dispatch, options);
  const compiled = new CompiledPolicy(policy);
  try {
    return await drive(compiled, dispatch, options);
  } finally {
    compiled.free();
  }
}

/** The module's outcome index by kind (each kind belongs to one class); success is 0. */
const OUTCOME_CLASS_INDEX: ReadonlyMap<string, readonly [string, number]> = new Map(
  [
    "retryable/timeout_before_response",
    "retryable/rate_limited",
    "retryable/unavailable",
    "non_retryable/rejected",
    "non_retryable/policy_denied",
    "non_retryable/invalid_request",
    "non_retryable/protocol_violation",
    "non_retryable/invalid_output",
    "indeterminate/unknown_provider_acceptance",
    "indeterminate/stream_interrupted_after_output",
  ].map((k, i): [string, readonly [string, number]] => {
    const [cls = "", kind = ""] = k.split("/");
    return [kind, [cls, i + 1]];
  }),
);

/** The module's index of an outcome; anything unknown counts as indeterminate/unknown_provider_acceptance (9). */
function outcomeIndex(outcome: Outcome): number {
  if (outcome.class === "success") return 0;
  const entry = OUTCOME_CLASS_INDEX.get(outcome.kind);
  return entry !== undefined && entry[0] === outcome.class ? entry[1] : 9;
}

/** Longest delay a host timer takes (2^31 - 1 ms); a deadline further away needs no timer. */
const MAX_TIMER_MS = 2_147_483_647;

/** Read the module's planned dispatch as the core's decision document. */
function decisionOf(run: RawRun, compiled: CompiledPolicy): DispatchDecision {
  const p = compiled.policy;
  const route = compiled.routesByPriority[run.priority()];
  if (route === undefined) throw new Error("retryledger: the planned route is not in the policy");
  const d: DispatchDecision = {
    kind: "dispatch",
    deadline_ms: p.deadline_ms,
    delay_ms: run.delay_ms(),
    idempotency_key_sha256: p.idempotency_key_sha256,
    logical_request_sha256: p.logical_request_sha256,
    not_before_ms: run.not_before_ms(),
    ordinal: run.ordinal(),
    reserve_cost: run.reserve_cost(),
    retry_after_floor_ms: run.retry_after_floor_ms(),
    route_id: route.route_id,
    route_ordinal: run.route_ordinal(),
    route_release_sha256: route.route_release_sha256,
  };
  if (p.jitter.mode !== "none") {
    // The first dispatch has no draw: the module says -1 for "absent".
    const sample = run.jitter_sample_ms();
    if (sample >= 0) {
      d.jitter_max_ms = run.jitter_max_ms();
      d.jitter_min_ms = run.jitter_min_ms();
      d.jitter_sample_ms = sample;
    }
  }
  return d;
}

async function drive<T>(compiled: CompiledPolicy, dispatch: DispatchFn<T>, options: RunOptions): Promise<RunResult<T>> {
  if (typeof dispatch !== "function") throw new TypeError("dispatch must be a function");
  const key: unknown = options?.idempotencyKey;
  if (typeof key !== "string") {
    throw new DecodeError("missing_field", "missing_field at /idempotencyKey: the run needs the raw idempotency key", {
      path: "/idempotencyKey",
    });
  }
  if (!compiled.acceptsKey(key)) {
    throw new DriftError(
      "idempotency_key_drift",
      "idempotency_key_drift at /idempotency_key_sha256: SHA-256 of the idempotency key is not the policy's idempotency_key_sha256",
      { path: "/idempotency_key_sha256" },
    );
  }
  const clock = options.clock ?? defaultClock;
  const sleep = options.sleep ?? defaultSleep;
  const wallClock = options.wallClock ?? Date.now;
  const signal = options.signal;
  const capMs = compiled.policy.backoff.retry_after_cap_ms;
  const deadlineMs = compiled.policy.deadline_ms;

  const t0 = clock();
  let last = 0;
  const now = (): number => {
    const t = Math.floor(clock() - t0);
    if (t > last && t <= MAX_SAFE) last = t;
    return last;
  };

  // One signal for every attempt of the run: it fires at the run's deadline
  // (one host timer per run) or when the caller's signal fires.
  const controller = new AbortController();
  let deadlineExceeded = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const onAbort = (): void => controller.abort(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });

  const run = compiled.startRun();
  const attempts: Attempts = { attempts: [], schema: "retryledger.attempts.v1" };
  let lastError: unknown;
  let lastResult: T | undefined;
  let succeeded = false;
  let unrecognized = false;
  let cancelled = false;
  let cancelReason: unknown;
  let receiptText: string;

  try {
    for (;;) {
      if (run.terminal() !== 0) break;
      const notBefore = run.not_before_ms();
      let t = now();
      while (t < notBefore && !signal?.aborted) {
        await sleep(notBefore - t, signal);
        t = now();
      }
      if (signal?.aborted) {
        cancelled = true;
        cancelReason = signal.reason;
        const at = now();
        guard(() => run.cancel(at));
        attempts.cancelled_at_ms = at;
        continue;
      }

      const decision = decisionOf(run, compiled);
      const startedAt = t;
      const remaining = deadlineMs - startedAt;
      if (remaining <= 0) {
        deadlineExceeded = true;
        controller.abort(deadlineReason());
      } else if (timer === undefined && remaining <= MAX_TIMER_MS && !controller.signal.aborted) {
        timer = setTimeout(() => {
          deadlineExceeded = true;
          controller.abort(deadlineReason());
        }, remaining);
      }

      let charged: number | undefined;
      let open = true;
      const step: Step = {
        ordinal: decision.ordinal,
        routeId: decision.route_id,
        routeOrdinal: decision.route_ordinal,
        routeReleaseSha256: decision.route_release_sha256,
        idempotencyKey: key,
        remainingMs: Math.max(0, remaining),
        deadlineMs,
        startedAtMs: startedAt,
        reserveCost: decision.reserve_cost,
        decision,
        charge(cost: number): void {
          if (!open) throw new Error("charge() after the attempt completed");
          const total = (charged ?? 0) + cost;
          if (!Number.isSafeInteger(cost) || cost < 0 || !Number.isSafeInteger(total)) {
            throw new RangeError(`charge(${String(cost)}): a cost is an integer and the attempt's total stays in 0..=2^53-1`);
          }
          charged = total;
        },
      };

      let outcome: Outcome;
      try {
        lastResult = await dispatch(step, controller.signal);
        outcome = SUCCESS;
        succeeded = true;
        lastError = undefined;
      } catch (e) {
        succeeded = false;
        lastResult = undefined;
        lastError = e;
        if (signal?.aborted) {
          cancelled = true;
          cancelReason = signal.reason;
          outcome = UNKNOWN;
        } else {
          const classified = classifyError(e, { nowUnixMs: wallClock(), retryAfterCapMs: capMs, deadlineExceeded }, options.classify);
          unrecognized = classified === undefined;
          outcome = classified ?? UNKNOWN;
        }
      } finally {
        open = false;
      }

      const attempt: Attempt = {
        completed_at_ms: now(),
        cost: charged ?? decision.reserve_cost,
        idempotency_key_sha256: decision.idempotency_key_sha256,
        logical_request_sha256: decision.logical_request_sha256,
        ordinal: decision.ordinal,
        outcome,
        route_id: decision.route_id,
        route_ordinal: decision.route_ordinal,
        route_release_sha256: decision.route_release_sha256,
        started_at_ms: startedAt,
      };
      if (decision.jitter_sample_ms !== undefined) attempt.jitter_sample_ms = decision.jitter_sample_ms;
      const index = outcomeIndex(outcome);
      const hint = outcome.class === "retryable" ? (outcome.retry_after_ms ?? -1) : -1;
      guard(() => run.record(attempt.started_at_ms, attempt.completed_at_ms, attempt.cost, index, hint));
      attempts.attempts.push(attempt);
      options.onAttempt?.(attempt);
    }
    receiptText = guard(() => run.receipt_json());
  } finally {
    if (timer !== undefined) clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
    run.free();
  }

  const receipt = JSON.parse(receiptText) as Receipt;
  const bundle: Bundle = { attempts, policy: compiled.policy as Policy, receipt, schema: "retryledger.bundle.v1" };
  const terminal = receipt.terminal;
  if (terminal === "completed") {
    return { result: lastResult as T, bundle, receipt };
  }
  const n = receipt.attempt_count;
  const because = lastError === undefined ? "" : `; last error: ${errorText(lastError)}`;
  const message = `run stopped with ${terminal} after ${n} attempt${n === 1 ? "" : "s"}${because}`;
  if (cancelled) throw new RunCancelledError<T>(message, { bundle, cause: cancelReason });
  if (unrecognized) throw new UnrecognizedDispatchError<T>(message, { bundle, cause: lastError });
  const details = succeeded ? { bundle, cause: lastError, result: lastResult as T } : { bundle, cause: lastError };
  throw new RunStoppedError<T>(message, details);
}

function errorText(e: unknown): string {
  const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
