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
 * `terminal`. `runHedged` hosts it: concurrent dispatch, an AbortSignal per
 * attempt, the losers aborted; every decision is the core's.
 */

import { call, CompiledPolicy, compiledOf, toText, type Input } from "./core.js";
import { checkedKey } from "./driver.js";
import { factsOf, type Classifier } from "./facts.js";
import type { Attempt, Attempts, Bundle, DispatchDecision, Facts, FleetView, FleetWrites, Judgement, Policy, Receipt, Terminal } from "./types.js";

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
  /** Aborted when the attempt loses its round, or at the run's deadline. */
  signal: AbortSignal;
  /** The planned dispatch. */
  dispatch: HedgeDispatch;
}

/** Options of `runHedged`. */
export interface HedgeRunOptions {
  /** The raw idempotency key; its digest must be the policy's `idempotency_key_sha256`. */
  idempotencyKey: string;
  /** The key's scope, when the policy's key digest is scoped. */
  keyScope?: { tenant: string; operation: string } | undefined;
  /** The run clock, ms since admission (default: `performance.now()` from the call). */
  now?: (() => number) | undefined;
  /** The caller's classify hook for raised errors. */
  classify?: Classifier | undefined;
}

/** The result of `runHedged`. */
export interface HedgeRun<T> {
  /** The winner's value; `undefined` unless the run completed. */
  result: T | undefined;
  terminal: Terminal;
  receipt: HedgedReceipt;
  bundle: Bundle;
  bundle_json: string;
  /** Physical attempts dispatched. */
  attempts: number;
}

interface Settled<T> {
  ordinal: number;
  at: number;
  ok: boolean;
  value?: T;
  error?: unknown;
}

/**
 * Run one logical request under a policy with a hedge section: the lead at
 * its earliest start, a hedge at each threshold the core offers unless a
 * result arrived first, the first valid success kept, the losers aborted
 * (a loser that answered anyway is reported late). Errors of the dispatch
 * function are judged by the core like the plain driver's.
 */
export async function runHedged<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: (attempt: HedgeAttempt) => Promise<T>,
  options: HedgeRunOptions,
): Promise<HedgeRun<T>> {
  const t0 = performance.now();
  const now = options.now ?? (() => Math.floor(performance.now() - t0));
  const compiled = compiledOf(policy);
  const key = checkedKey(compiled, options?.idempotencyKey, options?.keyScope);
  const session = new HedgeSession(compiled);
  const deadline = compiled.policy.deadline_ms;
  const controllers = new Map<number, AbortController>();
  const deadlineTimers = new Map<number, ReturnType<typeof setTimeout>>();
  const values = new Map<number, T>();
  const queue: Settled<T>[] = [];
  const aborted = new Set<number>();
  let wake: (() => void) | undefined;
  let count = 0;

  const launch = (d: HedgeDispatch, hedges: number | undefined): void => {
    const controller = new AbortController();
    controllers.set(d.ordinal, controller);
    count += 1;
    const untilDeadline = setTimeout(() => controller.abort(), Math.max(0, deadline - now()));
    deadlineTimers.set(d.ordinal, untilDeadline);
    const attempt: HedgeAttempt = {
      ordinal: d.ordinal,
      routeId: d.route_id,
      idempotencyKey: key,
      hedges,
      remainingMs: Math.max(0, deadline - now()),
      signal: controller.signal,
      dispatch: d,
    };
    const settle = (s: Omit<Settled<T>, "at" | "ordinal">): void => {
      clearTimeout(untilDeadline);
      if (aborted.has(d.ordinal)) return; // reported cancelled already
      queue.push({ ordinal: d.ordinal, at: now(), ...s });
      wake?.();
    };
    Promise.resolve()
      .then(() => dispatch(attempt))
      .then(
        (value) => settle({ ok: true, value }),
        (error: unknown) => settle({ ok: false, error }),
      );
  };

  const waitFor = async (until: number | undefined): Promise<void> => {
    if (queue.length > 0) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await new Promise<void>((resolve) => {
      wake = resolve;
      if (until !== undefined) timer = setTimeout(resolve, Math.max(0, until - now()));
    });
    wake = undefined;
    if (timer !== undefined) clearTimeout(timer);
  };

  const report = (s: Settled<T>): HedgeStep => {
    if (s.ok) {
      values.set(s.ordinal, s.value as T);
      return session.observe(s.ordinal, s.at, { result: "returned" }).step;
    }
    const facts = factsOf(s.error, { classify: options.classify, nowUnixMs: Date.now() });
    return session.observe(s.ordinal, s.at, facts).step;
  };

  let lead = 0;
  try {
    let step = session.next();
    for (;;) {
      if (step.kind === "terminal") break;
      if (step.kind === "dispatch") {
        const d = step.dispatch;
        const wait = d.not_before_ms - now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        lead = d.ordinal;
        step = session.startAttempt(d.ordinal, Math.max(now(), d.not_before_ms));
        launch(d, undefined);
        continue;
      }
      if (step.kind === "await") {
        const hedge = step.hedge;
        await waitFor(hedge?.not_before_ms);
        const s = queue.shift();
        if (s !== undefined) {
          step = report(s);
          continue;
        }
        if (hedge !== undefined && now() >= hedge.not_before_ms) {
          step = session.startAttempt(hedge.ordinal, now());
          launch(hedge, lead);
        }
        continue;
      }
      // cancel: a loser whose answer already arrived is reported late; the
      // others are aborted and reported cancelled at once (a dispatch that
      // ignores its signal cannot hold the run; what it returns is dropped).
      const late = queue.findIndex((s) => step.kind === "cancel" && step.ordinals.includes(s.ordinal));
      if (late >= 0) {
        const [s] = queue.splice(late, 1);
        if (s !== undefined) step = report(s);
        continue;
      }
      for (const o of step.ordinals) {
        aborted.add(o);
        controllers.get(o)?.abort();
        clearTimeout(deadlineTimers.get(o));
        step = session.cancelled(o, now());
      }
    }
    const { bundle, bundle_json } = session.seal();
    const receipt = bundle.receipt as HedgedReceipt;
    const winner = receipt.hedge?.winner_ordinal;
    return {
      result: winner === undefined ? undefined : values.get(winner),
      terminal: step.terminal,
      receipt,
      bundle,
      bundle_json,
      attempts: count,
    };
  } finally {
    session.free();
  }
}
