/**
 * A testing kit for suites that run code under retryledger: a fake clock
 * under which a minute of backoff takes no wall time, and a seeded fault
 * injector that wraps a dispatch function or a `fetch` and injects 429s (with
 * any hint form), 5xx, 529, timeouts, connection resets and slow answers, by
 * script or by rate.
 *
 * Every injected failure carries the `retryledger-injected-fault` header, so
 * the core marks its attempt `injected_fault` and the receipt counts
 * `injected_faults`: a receipt of a run with injected faults can never pass
 * for production evidence. Nothing here decides anything: the injected errors
 * and responses go through the same facts and the same core rules as real
 * ones. docs/TESTING.md.
 */

import type { DispatchFn, Step } from "./driver.js";

/** The header every injected failure carries (the core's `INJECTED_FAULT_HEADER`). */
export const INJECTED_FAULT_HEADER = "retryledger-injected-fault";

/** A clock for `runWithPolicy`'s `clock` and `sleep`: time moves only when slept or advanced. */
export class FakeClock {
  /** Milliseconds since the clock was made. */
  now = 0;
  /** Every sleep asked for, ms. */
  readonly sleeps: number[] = [];

  /** The `clock` option. */
  readonly clock = (): number => this.now;

  /** The `sleep` option: returns at once, the clock moved on (a fired signal ends it). */
  readonly sleep = (ms: number, signal?: AbortSignal): Promise<void> => {
    if (signal?.aborted === true) return Promise.reject(signal.reason);
    this.sleeps.push(ms);
    this.now += ms;
    return Promise.resolve();
  };

  /** Move the clock on, as an attempt that takes `ms` would. */
  advance(ms: number): void {
    this.now += ms;
  }
}

/** One fault to inject. */
export type Fault =
  | { kind: "rate_limited"; retryAfter?: string; retryAfterMs?: number; status?: number }
  | { kind: "unavailable"; status?: number; retryAfterMs?: number }
  | { kind: "overloaded" }
  | { kind: "timeout" }
  | { kind: "reset" }
  | { kind: "slow"; ms: number };

/** The kinds a rate may name. */
export type RatedFault = "rate_limited" | "unavailable" | "overloaded" | "timeout" | "reset";

/** What to inject: per attempt in order (`null`: the real call), or at random by rate. */
export interface FaultPlan {
  /** Faults for the first calls, in order; `null` lets a call through. Calls past the script use `rates`. */
  script?: readonly (Fault | null)[];
  /** The chance (0..1, adding up to at most 1) of each fault on a call past the script. */
  rates?: Partial<Record<RatedFault, number>>;
  /** Seed of the rates' draws (default 1): the same seed, the same faults. */
  seed?: number;
  /** A fake clock that a `slow` fault (and every injected failure, by `latencyMs`) advances. */
  clock?: FakeClock;
  /** How long an injected failure takes on `clock`, ms (default 0). */
  latencyMs?: number;
}

/** A fault plan that cannot be used: a rate outside 0..1, rates adding up to more than 1, a bad seed. */
export class FaultPlanError extends RangeError {
  readonly code = "invalid_fault_plan";
  constructor(message: string) {
    super(`invalid_fault_plan: ${message}`);
    this.name = "FaultPlanError";
  }
}

/** An injected failure: status and headers (or a connection error's code) like a real one's. */
export class InjectedFault extends Error {
  /** The HTTP status, for an HTTP failure. */
  readonly status: number | undefined;
  /** Its headers, the injected-fault header among them. */
  readonly headers: Record<string, string>;
  /** The connection error's code (`ECONNRESET`, `ETIMEDOUT`), for a connection failure. */
  readonly code: string | undefined;
  /** What was injected. */
  readonly fault: Fault;

  constructor(fault: Fault, status: number | undefined, headers: Record<string, string>, code?: string) {
    super(`injected fault: ${fault.kind}${status === undefined ? "" : ` (HTTP ${status})`}${code === undefined ? "" : ` (${code})`}`);
    this.name = "InjectedFault";
    this.status = status;
    this.headers = headers;
    this.code = code;
    this.fault = fault;
  }
}

const RATED: readonly RatedFault[] = ["rate_limited", "unavailable", "overloaded", "timeout", "reset"];

/** mulberry32: a small seeded generator, uniform in [0, 1). */
function generator(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

function checkPlan(plan: FaultPlan): void {
  let total = 0;
  for (const [kind, rate] of Object.entries(plan.rates ?? {})) {
    if (!RATED.includes(kind as RatedFault)) throw new FaultPlanError(`unknown fault kind ${JSON.stringify(kind)}`);
    if (typeof rate !== "number" || !(rate >= 0 && rate <= 1)) throw new FaultPlanError(`rate of ${kind} is ${String(rate)}, not in 0..1`);
    total += rate;
  }
  if (total > 1) throw new FaultPlanError(`rates add up to ${total}, more than 1`);
  if (plan.seed !== undefined && !Number.isSafeInteger(plan.seed)) throw new FaultPlanError("seed is not an integer");
  if (plan.latencyMs !== undefined && !(Number.isSafeInteger(plan.latencyMs) && plan.latencyMs >= 0)) {
    throw new FaultPlanError("latencyMs is not a non-negative integer");
  }
  for (const f of plan.script ?? []) {
    if (f !== null && f.kind === "slow" && !(Number.isSafeInteger(f.ms) && f.ms >= 0)) throw new FaultPlanError("a slow fault's ms is not a non-negative integer");
  }
}

/** Chooses the fault of each call, by script then by rate. */
class Chooser {
  readonly #plan: FaultPlan;
  readonly #draw: () => number;
  calls = 0;
  injected = 0;

  constructor(plan: FaultPlan) {
    checkPlan(plan);
    this.#plan = plan;
    this.#draw = generator(plan.seed ?? 1);
  }

  next(): Fault | null {
    const i = this.calls++;
    const script = this.#plan.script ?? [];
    if (i < script.length) return script[i] ?? null;
    const rates = this.#plan.rates;
    if (rates === undefined) return null;
    let x = this.#draw();
    for (const kind of RATED) {
      const r = rates[kind] ?? 0;
      if (x < r) return { kind } as Fault;
      x -= r;
    }
    return null;
  }
}

/** The failure a fault stands for (a slow fault is none). */
function failureOf(fault: Fault): InjectedFault | undefined {
  const mark = { [INJECTED_FAULT_HEADER]: fault.kind };
  switch (fault.kind) {
    case "rate_limited": {
      const headers: Record<string, string> = { ...mark };
      if (fault.retryAfter !== undefined) headers["retry-after"] = fault.retryAfter;
      if (fault.retryAfterMs !== undefined) headers["retry-after-ms"] = String(fault.retryAfterMs);
      return new InjectedFault(fault, fault.status ?? 429, headers);
    }
    case "unavailable": {
      const headers: Record<string, string> = { ...mark };
      if (fault.retryAfterMs !== undefined) headers["retry-after-ms"] = String(fault.retryAfterMs);
      return new InjectedFault(fault, fault.status ?? 503, headers);
    }
    case "overloaded":
      return new InjectedFault(fault, 529, mark);
    case "timeout":
      return new InjectedFault(fault, undefined, mark, "ETIMEDOUT");
    case "reset":
      return new InjectedFault(fault, undefined, mark, "ECONNRESET");
    case "slow":
      return undefined;
  }
}

/** A dispatch function with faults injected before the real one runs; counts what it injected. */
export type FaultyDispatch<T> = DispatchFn<T> & { readonly injected: () => number };

/**
 * `dispatch` with faults injected by `plan`: a failing fault throws an
 * `InjectedFault` instead of calling `dispatch` (after `latencyMs` on the
 * plan's clock); a `slow` fault advances the clock by its `ms`, then calls
 * `dispatch`. Throws `FaultPlanError` for a plan that cannot be used.
 */
export function injectFaults<T>(dispatch: DispatchFn<T>, plan: FaultPlan): FaultyDispatch<T> {
  const chooser = new Chooser(plan);
  const wrapped = (async (step: Step, signal: AbortSignal): Promise<T> => {
    const fault = chooser.next();
    if (fault !== null) {
      const failure = failureOf(fault);
      if (failure !== undefined) {
        chooser.injected += 1;
        plan.clock?.advance(plan.latencyMs ?? 0);
        throw failure;
      }
      if (fault.kind === "slow") plan.clock?.advance(fault.ms);
    }
    return dispatch(step, signal);
  }) as FaultyDispatch<T>;
  Object.defineProperty(wrapped, "injected", { value: () => chooser.injected });
  return wrapped;
}

type Fetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/**
 * A `fetch` with faults injected by `plan` (for the `fetch` integration or an
 * SDK client's `fetch` option): an HTTP fault answers a `Response` with its
 * status and headers without calling `fetch`; a connection fault rejects as
 * undici does (`TypeError: fetch failed` whose `cause` has the code) with the
 * injected-fault header on the error.
 */
export function faultyFetch(fetch: Fetch, plan: FaultPlan): Fetch & { readonly injected: () => number } {
  const chooser = new Chooser(plan);
  const wrapped = (async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const fault = chooser.next();
    if (fault !== null) {
      const failure = failureOf(fault);
      if (failure !== undefined) {
        chooser.injected += 1;
        plan.clock?.advance(plan.latencyMs ?? 0);
        if (failure.status !== undefined) {
          return new Response(JSON.stringify({ error: { message: failure.message, type: fault.kind } }), {
            status: failure.status,
            headers: { "content-type": "application/json", ...failure.headers },
          });
        }
        const error = new TypeError("fetch failed", { cause: { code: failure.code } });
        Object.defineProperty(error, "headers", { value: failure.headers });
        throw error;
      }
      if (fault.kind === "slow") plan.clock?.advance(fault.ms);
    }
    return fetch(input, init);
  }) as Fetch & { readonly injected: () => number };
  Object.defineProperty(wrapped, "injected", { value: () => chooser.injected });
  return wrapped;
}
