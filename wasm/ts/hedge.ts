/**
 * Hedging (docs/HEDGING.md): a bounded duplicate of the same logical request
 * after a latency threshold, one winner, every attempt accounted.
 *
 * `HedgeSession` is the core's hedged state machine, event by event: the same
 * methods and plain values as the Python binding's `HedgeSession`. Its
 * answer is always what to do now: `dispatch` (the round's lead, not before
 * `not_before_ms`), `await` (the attempts in flight; when `hedge` is set,
 * dispatch it at its `not_before_ms` unless a result arrives first),
 * `cancel` (the round is decided: abort these and report each) or
 * `terminal`. `runHedged` is an adapter of the host loop (docs/HOST_LOOP.md)
 * over the run machine's hedge layer: concurrent dispatch, an AbortSignal per
 * attempt, the losers aborted; every decision is the core's.
 */

import { call, CompiledPolicy, compiledOf, toText, type Input } from "./core.js";
import { checkedKey, checkFleet } from "./driver.js";
import type { Classifier } from "./facts.js";
import type { Fleet } from "./fleet.js";
import { fleetMachineOptions, loopFleet, loopHooks } from "./machine.js";
import type { RunHooks } from "./hooks.js";
import {
  Machine,
  raisedFacts,
  runLoop,
  type CasDoc,
  type DispatchEffect,
  type LoopAdapter,
  type LoopSleep,
  type MachineOptions,
  type StoreRowDoc,
} from "./loop.js";
import type { Attempt, Attempts, Bundle, Decision, DispatchDecision, Facts, FleetView, FleetWrites, Judgement, Policy, Receipt, Terminal } from "./types.js";

/** The policy's `hedge` section (docs/HEDGING.md). */
export interface HedgeSection {
  cancelled_cost: "reserve" | "zero";
  cost_share_percent: number;
  delay_ms: number;
  effects: "none" | "external";
  max_hedges: number;
  routes: string[];
}

/** The planned attempt (a lead or a hedge), as `planNext`'s dispatch without its `kind`. */
export type HedgeDispatch = Omit<DispatchDecision, "kind">;

/** What a host does next in a hedged run. */
export type HedgeStep =
  | { kind: "dispatch"; dispatch: HedgeDispatch }
  | { kind: "await"; hedge?: HedgeDispatch; in_flight: number[] }
  | { kind: "cancel"; decided_by: number; ordinals: number[] }
  | { kind: "terminal"; terminal: Terminal };

/** An observation's answer. */
export interface HedgeObserved {
  judgement: Judgement;
  step: HedgeStep;
}

/** An admission's answer under a fleet section. */
export interface HedgeAdmitted {
  step: HedgeStep;
  writes: FleetWrites;
}

/** One loser of a round, in the receipt. */
export interface HedgeLoser {
  cost: number;
  ordinal: number;
  reason: "cancelled" | "late";
}

/** What hedging did to a run (the receipt's `hedge`). */
export interface HedgeSummary {
  hedge_cost: number;
  hedges: number;
  loser_cost: number;
  losers: HedgeLoser[];
  winner_ordinal?: number;
}

/** An attempt's place in a hedged round (the attempt's `hedge`). */
export interface HedgeMark {
  hedges_ordinal?: number;
  loss?: "cancelled" | "late";
}

/** A receipt of a hedged run. */
export type HedgedReceipt = Receipt & { hedge?: HedgeSummary };
/** An attempt of a hedged run. */
export type HedgedAttempt = Attempt & { hedge?: HedgeMark };

interface RawHedgeSession {
  next_json(): string;
  start_attempt(ordinal: number, startedAtMs: number): string;
  observe(ordinal: number, completedAtMs: number, cost: number | undefined, facts: string): string;
  cancelled(ordinal: number, atMs: number): string;
  admit(atMs: number, nowEpochMs: number, view: string): string;
  cancel(atMs: number): void;
  attempts_json(): string;
  receipt_json(): string;
  bundle_json(): string;
  free(): void;
}

interface RawHedgeBindings {
  HedgeSession: { start(policy: string): RawHedgeSession };
}

/** A hedged run in progress (the policy must have a `hedge` section). */
export class HedgeSession {
  readonly #raw: RawHedgeSession;

  constructor(policy: Input<Policy> | CompiledPolicy) {
    const text = policy instanceof CompiledPolicy ? policy.policyJson : toText(policy);
    this.#raw = call((b) => (b as unknown as RawHedgeBindings).HedgeSession.start(text));
  }

  /** What to do now. */
  next(): HedgeStep {
    return JSON.parse(this.#raw.next_json()) as HedgeStep;
  }

  /** The planned lead, or the hedge on offer, went out at `startedAtMs` (run clock). */
  startAttempt(ordinal: number, startedAtMs: number): HedgeStep {
    return JSON.parse(call(() => this.#raw.start_attempt(ordinal, startedAtMs))) as HedgeStep;
  }

  /** Attempt `ordinal` ended at `completedAtMs`: the core judges the facts and decides. */
  observe(ordinal: number, completedAtMs: number, facts: Input<Facts>, cost?: number): HedgeObserved {
    const text = toText(facts);
    return JSON.parse(call(() => this.#raw.observe(ordinal, completedAtMs, cost, text))) as HedgeObserved;
  }

  /** Loser `ordinal` was cancelled at `atMs` (charged as the policy says). */
  cancelled(ordinal: number, atMs: number): HedgeStep {
    return JSON.parse(call(() => this.#raw.cancelled(ordinal, atMs))) as HedgeStep;
  }

  /** Under a fleet section: admit the lead or the hedge on offer under the view read at `nowEpochMs`. */
  admit(atMs: number, nowEpochMs: number, view: Input<FleetView>): HedgeAdmitted {
    const text = toText(view);
    return JSON.parse(call(() => this.#raw.admit(atMs, nowEpochMs, text))) as HedgeAdmitted;
  }

  /** The caller cancelled the run between rounds at `atMs`. */
  cancel(atMs: number): void {
    call(() => this.#raw.cancel(atMs));
  }

  /** The attempts of every resolved round. */
  get attempts(): Attempts {
    return JSON.parse(this.#raw.attempts_json()) as Attempts;
  }

  /** The receipt of the finished run. */
  receipt(): HedgedReceipt {
    return JSON.parse(call(() => this.#raw.receipt_json())) as HedgedReceipt;
  }

  /** The sealed bundle of the finished run, and its canonical JSON. */
  seal(): { bundle: Bundle; bundle_json: string } {
    const text = call(() => this.#raw.bundle_json());
    return { bundle: JSON.parse(text) as Bundle, bundle_json: text };
  }

  /** Free the module memory now (otherwise when collected). */
  free(): void {
    this.#raw.free();
  }
}

/** What the dispatch function of `runHedged` is given for one attempt. */
export interface HedgeAttempt {
  /** Global ordinal. */
  ordinal: number;
  /** The route to use. */
  routeId: string;
  /** The caller's idempotency key: send it on every attempt (every hedge carries the same). */
  idempotencyKey: string;
  /** The ordinal this attempt hedges (absent on a lead). */
  hedges?: number | undefined;
  /** Milliseconds left before the run's deadline when this attempt started. */
  remainingMs: number;
  /** Aborted when the attempt loses its round, at the run's deadline, or when the caller's signal aborts. */
  signal: AbortSignal;
  /** The planned dispatch. */
  dispatch: HedgeDispatch;
}

/** Options of `runHedged`: the options every driver takes. */
export interface HedgeRunOptions extends RunHooks {
  /** The raw idempotency key; its digest must be the policy's `idempotency_key_sha256`. */
  idempotencyKey: string;
  /** The key's scope, when the policy's key digest is scoped. */
  keyScope?: { tenant: string; operation: string } | undefined;
  /** The run clock, ms since admission (takes precedence over `clock`). */
  now?: (() => number) | undefined;
  /** Monotonic milliseconds (default `performance.now`); the run clock starts at its first reading. */
  clock?: (() => number) | undefined;
  /** Wait `ms` milliseconds, returning early when `signal` aborts (default: a timer). */
  sleep?: ((ms: number, signal: AbortSignal) => Promise<void>) | undefined;
  /** Wall clock in Unix ms, for HTTP-date Retry-After hints (default `Date.now`). */
  wallClock?: (() => number) | undefined;
  /** Stops the run: between rounds (`stop_cancelled`), or aborts the attempts in flight. */
  signal?: AbortSignal | undefined;
  /** The caller's classify hook for raised errors. */
  classify?: Classifier | undefined;
  /** The fleet the run belongs to (required when the policy has a `fleet` section): every lead and hedge is admitted first. */
  fleet?: Fleet | undefined;
}

/** The result of `runHedged`: the one result shape of every driver, and the winner's value as `result`. */
export interface HedgeRun<T> {
  /** The winner's value; `undefined` unless the run completed. */
  value: T | undefined;
  /** The same as `value`. */
  result: T | undefined;
  terminal: Terminal;
  receipt: HedgedReceipt;
  receipt_sha256: string;
  bundle: Bundle;
  bundle_json: string;
  /** Physical attempts dispatched. */
  attempts: number;
}

function pause(ms: number, signals: readonly (AbortSignal | undefined)[]): Promise<void> {
  return new Promise((resolve) => {
    const live = signals.filter((s): s is AbortSignal => s !== undefined);
    if (live.some((s) => s.aborted)) {
      resolve();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      for (const s of live) s.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    for (const s of live) s.addEventListener("abort", done, { once: true });
  });
}

/**
 * A hedged run as the host loop's adapter: the caller's dispatch, one
 * AbortController per attempt (a loser's aborted when the machine cancels
 * it, every one at the run's deadline or the caller's signal), the run
 * clock, the fleet store and the hooks.
 */
class Hedged<T> implements LoopAdapter<T> {
  readonly #controllers = new Map<number, { controller: AbortController; timer: ReturnType<typeof setTimeout> | undefined }>();
  /** The attempts sent and not yet answered for, and the lead of the round they belong to. */
  readonly #open = new Set<number>();
  #lead = 0;
  count = 0;
  readonly #now: () => number;

  constructor(
    readonly compiled: CompiledPolicy,
    readonly key: string,
    readonly send: (attempt: HedgeAttempt) => Promise<T>,
    readonly options: HedgeRunOptions,
  ) {
    if (options.now !== undefined) {
      this.#now = options.now;
    } else {
      const clock = options.clock ?? ((): number => performance.now());
      const t0 = clock();
      this.#now = () => clock() - t0;
    }
    Object.assign(this, loopFleet(options.fleet), loopHooks(options));
  }

  read?: (keys: string[]) => Promise<StoreRowDoc[]>;
  write?: (writes: CasDoc[]) => Promise<number>;
  onDecision?: (decision: Record<string, unknown>) => void;
  onSleep?: (sleep: LoopSleep) => void;
  onAttempt?: (attempt: Record<string, unknown>, judgement: Record<string, unknown>) => void;
  onTerminal?: (receipt: Receipt) => void;

  nowMs(): number {
    return Math.max(0, Math.floor(this.#now()));
  }

  cancelled(): boolean {
    return this.options.signal?.aborted === true;
  }

  sleep(ms: number, wake?: AbortSignal): Promise<void> {
    const signals = [wake, this.options.signal];
    if (this.options.sleep === undefined) return pause(ms, signals);
    const both = new AbortController();
    const stop = (): void => both.abort();
    for (const s of signals) {
      if (s?.aborted === true) stop();
      else s?.addEventListener("abort", stop, { once: true });
    }
    return this.options.sleep(ms, both.signal).finally(() => {
      for (const s of signals) s?.removeEventListener("abort", stop);
    });
  }

  dispatch(effect: DispatchEffect): Promise<T> {
    const d = effect.dispatch as unknown as HedgeDispatch;
    // A dispatch while none of the round is open is the round's lead;
    // otherwise it hedges that lead.
    const hedges = this.#open.size === 0 ? undefined : this.#lead;
    if (hedges === undefined) this.#lead = d.ordinal;
    this.#open.add(d.ordinal);
    this.count += 1;
    const remaining = Math.max(0, this.compiled.policy.deadline_ms - this.nowMs());
    const controller = new AbortController();
    const abort = (): void => controller.abort(this.options.signal?.reason);
    const caller = this.options.signal;
    if (caller?.aborted === true) abort();
    else caller?.addEventListener("abort", abort, { once: true });
    // A deadline beyond a host timer's reach needs no timer.
    const timer = remaining <= 2_147_483_647 ? setTimeout(() => controller.abort(), remaining) : undefined;
    this.#controllers.set(d.ordinal, { controller, timer });
    const attempt: HedgeAttempt = { ordinal: d.ordinal, routeId: d.route_id, idempotencyKey: this.key, hedges, remainingMs: remaining, signal: controller.signal, dispatch: d };
    let sent: Promise<T>;
    try {
      sent = Promise.resolve(this.send(attempt));
    } catch (e) {
      sent = Promise.reject(e);
    }
    return sent.finally(() => {
      clearTimeout(timer);
      caller?.removeEventListener("abort", abort);
    });
  }

  observation(effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown> {
    const ordinal = (effect.dispatch as unknown as HedgeDispatch).ordinal;
    this.#settled(ordinal);
    if (ok) return { facts: { result: "returned" } };
    const wall = this.options.wallClock ?? Date.now;
    return { facts: raisedFacts(reply, { classify: this.options.classify, nowUnixMs: wall(), cancelled: this.cancelled() }) };
  }

  cancelAttempt(ordinal: number): void {
    this.#controllers.get(ordinal)?.controller.abort();
    this.#settled(ordinal);
  }

  #settled(ordinal: number): void {
    this.#open.delete(ordinal);
    const c = this.#controllers.get(ordinal);
    if (c !== undefined) clearTimeout(c.timer);
    this.#controllers.delete(ordinal);
  }
}

/**
 * Run one logical request under a policy with a hedge section: the lead at
 * its earliest start, a hedge at each threshold the core offers unless a
 * result arrived first, the first valid success kept, the losers aborted
 * (a loser that answered anyway is reported late). Errors of the dispatch
 * function are judged by the core like the plain driver's. It runs on the
 * host loop over the run machine's hedge layer (docs/HOST_LOOP.md), with
 * the options and the result shape of every driver.
 */
export async function runHedged<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: (attempt: HedgeAttempt) => Promise<T>,
  options: HedgeRunOptions,
): Promise<HedgeRun<T>> {
  const compiled = compiledOf(policy);
  const key = checkedKey(compiled, options?.idempotencyKey, options?.keyScope);
  checkFleet(compiled, options.fleet);
  const adapter = new Hedged(compiled, key, dispatch, options);
  const wall = options.fleet !== undefined ? () => (options.fleet as Fleet).now() : (options.wallClock ?? Date.now);
  const machineOptions: MachineOptions = { origin_epoch_ms: Math.max(0, Math.floor(wall()) - adapter.nowMs()), ...fleetMachineOptions(options.fleet) };
  const machine = Machine.start(compiled, machineOptions);
  try {
    const run = await runLoop(machine, adapter);
    return {
      value: run.value,
      result: run.value,
      terminal: run.terminal as Terminal,
      receipt: run.receipt as HedgedReceipt,
      receipt_sha256: run.receipt_sha256,
      bundle: run.bundle,
      bundle_json: run.bundle_json,
      attempts: adapter.count,
    };
  } finally {
    machine.free();
  }
}
