/**
 * `runWithPolicy`: the single retry owner of one logical request, a host of
 * the core's Session (docs/HOSTS.md).
 *
 * The driver asks the Session for the next decision, waits until
 * `not_before_ms` (no sleep when the wait is 0), calls `dispatch(step,
 * signal)` once per planned attempt with the same idempotency key, extracts
 * plain facts from what dispatch returned or threw, and has the Session judge
 * and record them; the core decides every outcome (an unrecognized error is
 * indeterminate and never retried) and when the run ends. Time is the run
 * clock: integer milliseconds since the driver started, read from an
 * injectable clock.
 */

import { CompiledPolicy, bodySha256, checkPriceSchedule, compiledOf, toText, type Input } from "./core.js";
import { AttemptError, factsText, minimalFacts, preparedFacts, rateLimitHeadersOf, type Classifier, type FactsOptions } from "./facts.js";
import {
  DecodeError,
  DriftError,
  HttpError,
  PolicyError,
  RunCancelledError,
  RunStoppedError,
  UnrecognizedDispatchError,
} from "./errors.js";
import type { Fleet } from "./fleet.js";
import { callHook, copied, plannedSleep, type RunHooks } from "./hooks.js";
import type { OutputCheck, RepairDefect } from "./checks.js";
import type { JobStatus } from "./job.js";
import { RETURNED, sealAndRelease, type Session } from "./session.js";
import type { Attempt, Bundle, DispatchDecision, Facts, Judgement, RepairChain, Policy, PriceSchedule, Receipt, Reconciled, Sealed, Usage } from "./types.js";

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
  /** Whether the run has a price schedule, so that `usage` can price what the attempt used. */
  readonly priced: boolean;
  /**
   * Record raw usage (units by kind: `input`, `output`, `cached_input`,
   * `reasoning`, …; reports add up): the attempt records it, and its cost is
   * what that usage costs on `routeReleaseSha256` under the run's price
   * schedule, priced by the core. An attempt's cost is either charged or
   * priced from usage: `charge` and `usage` on one attempt throw `PolicyError`
   * `charge_with_usage`. Throws the core's coded error for bad usage
   * (`usage_unpriced`, `integer_out_of_range`, `float_value`,
   * `arithmetic_overflow`; nothing is recorded then), and `PolicyError`
   * `price_schedule_missing_release` when the run has no price schedule.
   */
  usage(units: Usage): void;
  /**
   * Report the tokens this attempt used (reports add up), for a policy whose
   * admission limits have a token bucket: when the attempt's admission slot
   * is released its reservation is settled with them (unused tokens go back
   * to the bucket, more than reserved are taken from it). Without a report
   * the reservation stands.
   */
  tokensUsed(tokens: number): void;
  /**
   * Record the rate-limit headers of this attempt's response (success or
   * failure): a fetch `Response`, a `Headers`, `[name, value]` pairs, or
   * anything with `headers`. Under admission limits the release after the
   * attempt applies them to the route's buckets in the core (a lower
   * `remaining` lowers a bucket; an exhausted one with a reset empties it
   * until the reset, for every run of the fleet). The integrations call it
   * for you; a failure's headers are read from the error otherwise.
   */
  rateLimitHeaders?(holder: unknown): void;
  /**
   * Record the request body this attempt sent, after lowering to its route
   * (a string's UTF-8 bytes, or the bytes): the attempt records its SHA-256,
   * and every retry on the same route must send the same body (replay:
   * `request_body_drift`). The integrations call it for you where they see
   * the body.
   */
  requestBody(body: string | Uint8Array): void;
  /**
   * Record the model this attempt asked for and the one the provider's
   * answer named (docs/LOWERING.md, "Which model answered"): the receipt
   * names both per attempt. A side not learned is `undefined` and stays
   * unknown; a served name that is not an identifier is recorded as unknown
   * too. Reports replace each other. The cross-provider driver calls it for
   * you.
   */
  model?(requested: string | undefined, served?: string): void;
  /**
   * Check an SDK call this attempt is about to send (its URL path and JSON
   * body) against the logical request the policy's template bound: a call
   * that lifts to another request throws `DriftError` `request_drift`
   * before it is sent, and the run stops with it (nothing sent). The
   * `openai` and `@anthropic-ai/sdk` integrations and `withPolicy` given
   * `clients` call it for you.
   */
  checkSent?(urlPath: string, body: string | Uint8Array): void;
  /** Say that response bytes reached the caller: a failure after it is never retried (output is never joined). */
  outputDelivered(): void;
  /** Under repair: the logical request this run sends (`undefined` on the root run unless `request` was given). */
  readonly request: unknown;
  /** Under repair: 0 on the root run, then 1, 2, … (docs/REPAIR.md). */
  readonly repairOrdinal: number;
  /**
   * For an async job (docs/JOBS.md): the provider's job id this attempt was
   * answered with or asked about (the core keeps only its SHA-256) and the
   * job status the answer reported. `runJob` calls it for you.
   */
  job?(id: string | undefined, status: JobStatus | undefined): void;
  /**
   * For an async job: the receiver's answer when the attempt was reconciled
   * by idempotency key after its answer was lost (`succeeded`,
   * `failed_no_effect`, `unknown`); the attempt's outcome is the answer's.
   */
  reconciled?(answer: Reconciled): void;
}

/** The caller's attempt: resolve with the result, or throw what went wrong. */
export type DispatchFn<T> = (step: Step, signal: AbortSignal) => Promise<T> | T;

export interface RunOptions extends RunHooks {
  /** The raw idempotency key; its digest must be the policy's `idempotency_key_sha256`. */
  idempotencyKey: string;
  /** The key's scope, when the policy's key digest is scoped (`idempotencyKeySha256(key, {tenant, operation})`). */
  keyScope?: { tenant: string; operation: string };
  /** Stops the run: between attempts (`stop_cancelled`) or during one (that attempt is indeterminate). */
  signal?: AbortSignal;
  /** Monotonic milliseconds (default `performance.now`); the run clock starts at its first reading. */
  clock?: () => number;
  /** Wait `ms` milliseconds, returning early when `signal` aborts (default: a timer). */
  sleep?: (ms: number, signal: AbortSignal | undefined) => Promise<void>;
  /** Wall clock in Unix ms, for HTTP-date Retry-After hints (default `Date.now`). */
  wallClock?: () => number;
  /** The caller's classify hook: an outcome for an error it knows (the core records it as explicit), or `undefined`. */
  classify?: Classifier;
  /** Called with every attempt as the core recorded it, and the core's judgement of it. */
  onAttempt?: (attempt: Attempt, judgement: Judgement) => void;
  /**
   * Prices per route release (`retryledger.price_schedule.v1`), checked
   * against the policy before any dispatch (`checkPriceSchedule`); with it
   * `step.usage(units)` charges what an attempt used.
   */
  priceSchedule?: Input<PriceSchedule>;
  /**
   * The fleet the run belongs to (required when the policy has a `fleet`
   * section): every attempt is admitted against its store before dispatch
   * (breakers, retry budget) and its outcome recorded on its route's
   * breaker after the observation.
   */
  fleet?: Fleet;
  /**
   * The tokens each attempt of this run reserves under the admission
   * limits' token bucket (the request's bound: its output limit plus its
   * input); overrides the fleet's `reserveTokens`. Settled with the tokens
   * the attempt reports (`step.tokensUsed`) when its slot is released.
   */
  reserveTokens?: number;
  /**
   * Output checks run on what dispatch returned (`outputCheck`,
   * `schemaCheck`, the integrations' `answerChecks`); the core judges their
   * verdicts: a refusal is `policy_denied`, any other failed check
   * `invalid_output` (docs/REPAIR.md).
   */
  checks?: readonly OutputCheck[];
  /**
   * With a policy that has a `repair` section: after a run that stopped on
   * invalid output, build the next logical request from the output and the
   * defects. Each repair runs under its own key (`<key>:repair:<n>`) and the
   * policy the core derives (the deadline and cost left); the result, or the
   * error, carries the `chain`.
   */
  repair?: (output: unknown, defects: RepairDefect[]) => unknown;
  /** The root run's logical request (what `step.request` is on it). */
  request?: unknown;
}

/**
 * A policy with a fleet section needs a fleet (`admission_missing`), and a
 * fleet given to a policy without one is refused (`admission_unexpected`):
 * the core's rule, checked before any dispatch.
 * @internal
 */
export function checkFleet(compiled: CompiledPolicy, fleet: Fleet | undefined): void {
  compiled.requireFleet(fleet !== undefined);
}

/** A completed run: dispatch's result and the sealed run. */
export interface RunResult<T> {
  readonly result: T;
  readonly receipt: Receipt;
  /** Policy, attempts and receipt (built when first read). */
  readonly bundle: Bundle;
  /** The sealed run: receipt digest and canonical bundle JSON too. */
  readonly sealed: Sealed;
  /** Under repair: the `retryledger.repair_chain.v1` of the request and its repairs, this run last (docs/REPAIR.md). */
  readonly chain?: RepairChain;
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
  return new DOMException("the run's deadline passed during the attempt", "TimeoutError");
}

/** The signal dispatch gets when nothing can fire it (an injected clock and no caller signal). */
let quiet: AbortSignal | undefined;

/** Longest delay a host timer takes (2^31 - 1 ms); a deadline further away needs no timer. */
const MAX_TIMER_MS = 2_147_483_647;

/** One planned attempt, as dispatch sees it. */
/** One planned attempt: what the dispatch is told, and what it reports (streams extend it). */
export class AttemptStep implements Step {
  readonly ordinal: number;
  readonly routeId: string;
  readonly routeOrdinal: number;
  readonly routeReleaseSha256: string;
  readonly idempotencyKey: string;
  readonly remainingMs: number;
  readonly deadlineMs: number;
  readonly startedAtMs: number;
  readonly reserveCost: number;
  readonly decision: DispatchDecision;
  request: unknown = undefined;
  repairOrdinal = 0;
  charged: number | undefined = undefined;
  /** Tokens the attempt reported using (`tokensUsed`). */
  tokens: number | undefined = undefined;
  /** The rate-limit headers of the attempt's response (`rateLimitHeaders`). */
  rateLimits: [string, string][] | undefined = undefined;
  delivered = false;
  open = true;

  readonly priced: boolean;
  readonly #session: Session;
  #usage = false;

  constructor(decision: DispatchDecision, key: string, startedAt: number, session: Session, priced: boolean) {
    this.ordinal = decision.ordinal;
    this.routeId = decision.route_id;
    this.routeOrdinal = decision.route_ordinal;
    this.routeReleaseSha256 = decision.route_release_sha256;
    this.idempotencyKey = key;
    this.remainingMs = Math.max(0, decision.deadline_ms - startedAt);
    this.deadlineMs = decision.deadline_ms;
    this.startedAtMs = startedAt;
    this.reserveCost = decision.reserve_cost;
    this.decision = decision;
    this.priced = priced;
    this.#session = session;
  }

  charge(cost: number): void {
    if (!this.open) throw new Error("charge() after the attempt completed");
    if (this.#usage) throw chargeWithUsage();
    this.charged = addedCount("charge", "a cost is", this.charged, cost);
  }

  tokensUsed(tokens: number): void {
    this.tokens = addedCount("tokensUsed", "tokens are", this.tokens, tokens);
  }

  rateLimitHeaders(holder: unknown): void {
    // A response or an error holds its headers; anything else is the headers.
    const holds = typeof holder === "object" && holder !== null && ("headers" in holder || "response" in holder);
    const pairs = rateLimitHeadersOf(holds ? holder : { headers: holder });
    if (pairs.length > 0) this.rateLimits = pairs;
  }

  usage(units: Usage): void {
    if (!this.open) throw new Error("usage() after the attempt completed");
    if (!this.priced) {
      throw new PolicyError(
        "price_schedule_missing_release",
        "price_schedule_missing_release: the run has no price schedule; pass priceSchedule in the run options to report usage",
        { path: "/priceSchedule" },
      );
    }
    if (this.charged !== undefined) throw chargeWithUsage();
    this.#session.addUsage(units);
    this.#usage = true;
  }

  requestBody(body: string | Uint8Array): void {
    if (!this.open) throw new Error("requestBody() after the attempt completed");
    this.#session.setRequestBodySha256(bodySha256(body));
  }

  model(requested: string | undefined, served?: string): void {
    if (!this.open) throw new Error("model() after the attempt completed");
    if (requested === undefined && served === undefined) return;
    try {
      this.#session.setModel(requested, served);
    } catch (e) {
      // A served name the core does not take is unknown, never invented.
      if (served === undefined || requested === undefined) throw e;
      this.#session.setModel(requested, undefined);
    }
  }

  /**
   * Record the SHA-256 (lowercase hex) of the body this attempt sent, when
   * it is known without the bytes (a lowered request's `body_sha256`).
   */
  requestBodySha256(digest: string): void {
    if (!this.open) throw new Error("requestBodySha256() after the attempt completed");
    this.#session.setRequestBodySha256(digest);
  }

  checkSent(urlPath: string, body: string | Uint8Array): void {
    (this.#session as Partial<Pick<Session, "checkSent">>).checkSent?.(urlPath, body);
  }

  outputDelivered(): void {
    if (!this.open) throw new Error("outputDelivered() after the attempt completed");
    this.delivered = true;
  }

  job(id: string | undefined, status: JobStatus | undefined): void {
    if (!this.open) throw new Error("job() after the attempt completed");
    this.#session.setJob(id, status);
  }

  reconciled(answer: Reconciled): void {
    if (!this.open) throw new Error("reconciled() after the attempt completed");
    this.#session.setReconciled(answer);
  }
}

/**
 * An attempt's running total after adding `n` (`charge`, `tokensUsed`;
 * `what` is "a cost is", "tokens are"):
 * `n` an integer >= 0 and the total at most 2^53-1, a `RangeError` otherwise.
 * @internal Shared by the steps of the drivers and of the Temporal activity.
 */
export function addedCount(method: string, what: string, total: number | undefined, n: number): number {
  const sum = (total ?? 0) + n;
  if (!Number.isSafeInteger(n) || n < 0 || !Number.isSafeInteger(sum)) {
    throw new RangeError(`${method}(${String(n)}): ${what} an integer and the attempt's total stays in 0..=2^53-1`);
  }
  return sum;
}

/** @internal Shared by the steps of the drivers and of the Temporal activity. */
export function chargeWithUsage(): PolicyError {
  return new PolicyError(
    "charge_with_usage",
    "charge_with_usage: an attempt's cost is either charged by hand or priced from its usage, not both",
    { path: "/cost" },
  );
}

/** A completed run; the bundle is built when first read. */
class Completed<T> implements RunResult<T> {
  readonly result: T;
  readonly receipt: Receipt;
  readonly sealed: Sealed;

  constructor(result: T, sealed: Sealed) {
    this.result = result;
    this.sealed = sealed;
    this.receipt = sealed.receipt;
  }

  get bundle(): Bundle {
    return this.sealed.bundle;
  }
}

/**
 * Run one logical request under a policy. Resolves with `{result, receipt,
 * bundle, sealed}` when the run completes; rejects with a `RunStoppedError`
 * (or its subclasses `UnrecognizedDispatchError`, `RunCancelledError`)
 * carrying the sealed run otherwise. Throws `DecodeError`/`PolicyError` for a
 * bad policy and `DriftError` `idempotency_key_drift` for a key that is not
 * the policy's, before any dispatch; with `priceSchedule`, the schedule's
 * `PolicyError` (`price_schedule_missing_release`, `cost_unit_mismatch`, …)
 * before any dispatch too.
 */
export function runWithPolicy<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: DispatchFn<T>,
  options: RunOptions,
): Promise<RunResult<T>> {
  // Not an async function: the run's own promise is the one returned (no
  // second promise resolved with it); what throws before it still rejects.
  let compiled: CompiledPolicy;
  try {
    if (options?.repair !== undefined) {
      return import("./repair.js").then(({ runRepaired }) => runRepaired(policy, dispatch, options));
    }
    compiled = compiledOf(policy);
  } catch (e) {
    return Promise.reject(e as Error);
  }
  return drive(compiled, dispatch, options);
}

/** The facts of an answer whose output checks broke (a check threw, or its verdict is not one): unrecognized, never retried. */
const CHECK_BROKE = Object.freeze({ result: "raised", error_types: ["OutputCheckError"] }) as Facts;

/**
 * Refuse, before any request, a policy with a route that `clients` (by route
 * id) has no entry for: the core's `route_client_missing` (`PolicyError`, at
 * the first such route in priority order); `what` names an entry ("openai
 * client", "fetch target") in the message.
 * @internal Shared by the client integrations.
 */
export function checkRouteClients(compiled: CompiledPolicy, clients: object, what: string): void {
  const held = Object.keys(clients).filter((id) => Object.hasOwn(clients, id) && (clients as Record<string, unknown>)[id] !== undefined);
  try {
    compiled.requireClients(held);
  } catch (e) {
    if (!(e instanceof PolicyError)) throw e;
    const missing = compiled.routesByPriority.map((r) => r.route_id).filter((id) => !held.includes(id));
    throw new PolicyError(e.code, `${e.code} at ${e.path ?? "/routes"}: no ${what} for route(s) ${missing.join(", ")}`, e.path === undefined ? {} : { path: e.path });
  }
}

/**
 * Record a raised attempt: the facts go to the core as JSON. Facts the core
 * refuses (a header value it cannot decode, a hint too long to parse) are
 * replaced by the ones that are certain, so an odd error never breaks the run.
 * @internal Shared by the drivers.
 */
export function observeRaised(session: Session, startedAt: number, completedAt: number, cost: number | undefined, error: unknown, facts: FactsOptions): Judgement {
  // A call the attempt refused to send (request_drift) stops the run with
  // that error, whatever the SDK wrapped it in: nothing was sent.
  if (session.refused !== undefined) throw session.refused;
  const prepared = preparedFacts(error);
  if (prepared !== undefined) {
    return session.observePrepared(startedAt, completedAt, cost, prepared, (error as AttemptError).outcome);
  }
  const observation = { started_at_ms: startedAt, completed_at_ms: completedAt, cost, facts: factsText(error, facts) };
  try {
    return session.observe(observation);
  } catch (e) {
    if (!(e instanceof DecodeError || e instanceof HttpError)) throw e;
    observation.facts = minimalFacts(facts);
    return session.observe(observation);
  }
}

/**
 * The run's raw idempotency key, checked before any dispatch: a string
 * (`DecodeError` `missing_field`) whose digest, with its scope, is the
 * policy's (`DriftError` `idempotency_key_drift`).
 * @internal Shared by the drivers.
 */
export function checkedKey(compiled: CompiledPolicy, key: unknown, scope: { tenant: string; operation: string } | undefined): string {
  if (typeof key !== "string") {
    throw new DecodeError("missing_field", "missing_field at /idempotencyKey: the run needs the raw idempotency key", {
      path: "/idempotencyKey",
    });
  }
  if (!compiled.acceptsKey(key, scope)) {
    throw new DriftError(
      "idempotency_key_drift",
      "idempotency_key_drift at /idempotency_key_sha256: the digest of the idempotency key (and its scope) is not the policy's idempotency_key_sha256",
      { path: "/idempotency_key_sha256" },
    );
  }
  return key;
}

async function drive<T>(compiled: CompiledPolicy, dispatch: DispatchFn<T>, options: RunOptions): Promise<RunResult<T>> {
  if (typeof dispatch !== "function") throw new TypeError("dispatch must be a function");
  const key = checkedKey(compiled, options?.idempotencyKey, options?.keyScope);
  let schedule: string | undefined;
  if (options.priceSchedule !== undefined) {
    schedule = toText(options.priceSchedule);
    checkPriceSchedule(compiled.policy, schedule);
  }
  const priced = schedule !== undefined;
  const injectedClock = options.clock;
  const clock = injectedClock ?? defaultClock;
  const sleep = options.sleep ?? defaultSleep;
  const wallClock = options.wallClock ?? Date.now;
  const classify = options.classify;
  const onAttempt = options.onAttempt;
  const { onDecision, onSleep, onTerminal } = options;
  const signal = options.signal;
  const deadlineMs = compiled.policy.deadline_ms;
  const fleet = options.fleet;
  const checks = options.checks !== undefined && options.checks.length > 0 ? options.checks : undefined;
  checkFleet(compiled, fleet);

  const t0 = clock();
  let last = 0;
  const now = (): number => {
    const t = Math.floor(clock() - t0);
    if (t > last && t <= MAX_SAFE) last = t;
    return last;
  };

  // On the real clock one signal serves every attempt of the run: it fires at
  // the run's deadline (one host timer per run) or when the caller's signal
  // fires. On an injected clock no timer is armed: the core judges an error
  // raised at or after the deadline a timeout, and dispatch gets the caller's
  // signal (or one that never fires).
  let controller: AbortController | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let dispatchSignal: AbortSignal;
  const onAbort = (): void => controller?.abort(signal?.reason);
  if (injectedClock === undefined) {
    controller = new AbortController();
    dispatchSignal = controller.signal;
    if (signal !== undefined) {
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    }
  } else {
    dispatchSignal = signal ?? (quiet ??= new AbortController().signal);
  }

  const session = compiled.session();
  if (schedule !== undefined) session.setPriceSchedule(schedule);
  let lastError: unknown;
  let lastResult: T | undefined;
  let lastRule: string | undefined;
  let succeeded = false;
  let cancelled = false;
  let cancelReason: unknown;
  let sealed: Sealed | undefined;

  try {
    for (;;) {
      let decision = session.next();
      if (onDecision !== undefined) callHook("onDecision", onDecision, copied(decision));
      if (decision.kind === "terminal") break;
      let notBefore = decision.not_before_ms;
      let t = now();
      if (onSleep !== undefined && t < notBefore && !signal?.aborted) callHook("onSleep", onSleep, plannedSleep(decision, t));
      while (t < notBefore && !signal?.aborted) {
        await sleep(notBefore - t, signal);
        t = now();
      }
      // Whether an admission slot is held by a dispatch not yet made.
      let held = false;
      if (fleet !== undefined && !signal?.aborted) {
        // Admitted against the fleet's store: perhaps on a later route, or the fleet's terminal.
        let answer = await fleet.admit(session, t, options.reserveTokens);
        // The admission limits' in-flight cap is full: admit again when they say.
        while (answer.wait_until_epoch_ms !== undefined && !signal?.aborted) {
          await sleep(Math.max(1, answer.wait_until_epoch_ms - fleet.now()), signal);
          t = now();
          answer = await fleet.admit(session, t, options.reserveTokens);
        }
        if (answer.decision.kind === "terminal") continue;
        held = answer.wait_until_epoch_ms === undefined;
        decision = session.next() as DispatchDecision;
        notBefore = decision.not_before_ms;
        t = now();
        while (t < notBefore && !signal?.aborted) {
          await sleep(notBefore - t, signal);
          t = now();
        }
      }
      // The planned cancel of a job left running (docs/JOBS.md): sent even
      // after the caller's cancellation (which may have planned it), with a
      // signal that never fires, and never judged cancelled.
      const jobCancel = decision.job?.kind === "cancel";
      if (signal?.aborted && !jobCancel) {
        cancelled = true;
        cancelReason = signal.reason;
        // Admitted and never dispatched: its admission slot is released.
        if (fleet !== undefined && held) await fleet.release(session, decision.route_release_sha256).catch(() => undefined);
        session.cancel(now());
        continue;
      }

      const startedAt = t;
      if (controller !== undefined && !controller.signal.aborted) {
        const remaining = deadlineMs - startedAt;
        if (remaining <= 0) {
          controller.abort(deadlineReason());
        } else if (timer === undefined && remaining <= MAX_TIMER_MS) {
          const c = controller;
          timer = setTimeout(() => c.abort(deadlineReason()), remaining);
        }
      }

      const step = new AttemptStep(decision, key, startedAt, session, priced);
      let value: T | undefined;
      let error: unknown;
      let raised = false;
      try {
        value = await dispatch(step, jobCancel ? (quiet ??= new AbortController().signal) : dispatchSignal);
      } catch (e) {
        raised = true;
        error = e;
      }
      step.open = false;
      const completedAt = now();
      let judgement: Judgement;
      if (!raised) {
        succeeded = true;
        lastResult = value;
        lastError = undefined;
        if (checks === undefined) {
          judgement = session.observe({ started_at_ms: startedAt, completed_at_ms: completedAt, cost: step.charged, facts: RETURNED });
        } else {
          // The checks' verdicts, decoded by the core; a check that throws or a
          // verdict the core refuses (its coded error) leaves the attempt unrecognized.
          const observation = { started_at_ms: startedAt, completed_at_ms: completedAt, cost: step.charged, facts: CHECK_BROKE };
          try {
            const output_checks = checks.map((c) => c.check(value));
            judgement = session.observe({ ...observation, facts: { result: "returned", output_checks } as Facts });
          } catch (e) {
            lastError = e;
            judgement = session.observe(observation);
          }
        }
      } else {
        succeeded = false;
        lastResult = undefined;
        lastError = error;
        const aborted = !jobCancel && signal?.aborted === true;
        if (aborted) {
          cancelled = true;
          cancelReason = signal?.reason;
        }
        judgement = observeRaised(session, startedAt, completedAt, step.charged, error, {
          classify,
          outputDelivered: step.delivered,
          cancelled: aborted,
          nowUnixMs: wallClock(),
        });
      }
      lastRule = judgement.rule;
      if (fleet !== undefined) {
        const seen = step.rateLimits ?? (raised ? rateLimitHeadersOf(error) : undefined);
        await fleet.record(session, step.routeReleaseSha256, step.tokens, seen);
      }
      if (onAttempt !== undefined) callHook("onAttempt", onAttempt, session.lastAttempt() as Attempt, copied(judgement));
    }
    sealed = sealAndRelease(session);
    if (onTerminal !== undefined) callHook("onTerminal", onTerminal, copied(sealed.receipt));
  } finally {
    if (timer !== undefined) clearTimeout(timer);
    if (controller !== undefined) signal?.removeEventListener("abort", onAbort);
    // Sealed, the session's memory belongs to the sealed run (freed once it has read the attempts).
    if (sealed === undefined) session.free();
  }

  const terminal = sealed.terminal;
  if (terminal === "completed") return new Completed(lastResult as T, sealed);
  const n = sealed.receipt.attempt_count;
  const because = lastError === undefined ? "" : `; last error: ${errorText(lastError)}`;
  const message = `run stopped with ${terminal} after ${n} attempt${n === 1 ? "" : "s"}${because}`;
  if (cancelled) throw new RunCancelledError<T>(message, { sealed, cause: cancelReason });
  if (lastRule === "unrecognized") throw new UnrecognizedDispatchError<T>(message, { sealed, cause: lastError });
  const details = succeeded ? { sealed, cause: lastError, result: lastResult as T } : { sealed, cause: lastError };
  throw new RunStoppedError<T>(message, details);
}

function errorText(e: unknown): string {
  const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
