/**
 * Journal-backed runs: a run whose every step is an event of its journal in a
 * store's append log, so that a new process can take it over after a crash
 * (docs/JOURNAL.md, "Running with a journal").
 *
 * `runJournaled` opens a run: it claims the run's lease (generation 1),
 * appends `created` and `decided`, then for every attempt `reserved` and
 * `dispatched` (awaited in the store *before* `dispatch` is called), then
 * `observed` and `decided`, and `terminal` with the receipt's digest.
 * `resumeJournaled` is what a new owner calls: it raises the lease generation
 * by compare-and-set, reads and verifies the journal, and asks the core what
 * to do (`journalRecover`). An attempt dispatched without an observation is
 * never sent again blind: the new owner calls `reconcile`, which asks the
 * receiver by idempotency key, on the core's bounded poll schedule; only
 * `failed_no_effect` lets the plan dispatch again.
 *
 * Every step is decided by the core from the journal alone (one loop serves
 * both functions), so a resumed run ends in the same bundle shape as
 * `runWithPolicy`: policy, attempts and receipt.
 *
 * Ownership is a register (`lease/<runId>` by default) whose store generation
 * is the lease generation. Every append is fenced by it: the package's stores
 * check the register in the append's own transaction (`appendFenced`; a
 * store without it is read first). When it moved, the owner stops with
 * `JournaledRunError` `lease_lost` without writing. An append whose `seq` is taken stops the same way, with the core's
 * classification of the refused event (`journalClassify`) as `evidence`;
 * nothing in the journal is ever overwritten.
 */

import { CompiledPolicy, compiledOf, checkPriceSchedule, toText, type Input } from "./core.js";
import { AttemptStep, checkFleet, type Step } from "./driver.js";
import { DecodeError, DriftError, RetryledgerError } from "./errors.js";
import type { Classifier } from "./facts.js";
import type { Fleet } from "./fleet.js";
import type { RunHooks } from "./hooks.js";
import { journalClassify, type JournalEvent, type PendingAttempt } from "./journal.js";
import { Machine, Reports, raisedFacts, runLoop, type CasDoc, type DispatchEffect, type LoopAdapter, type LoopReconcileAnswer, type LoopResult, type LoopSleep, type MachineOptions, type StoreRowDoc } from "./loop.js";
import { fleetMachineOptions, loopFleet, loopHooks } from "./machine.js";
import { LEASE_LOST, type AppendLog, type FencedAppendAnswer, type FleetStore } from "./stores/store.js";
import type { Session } from "./session.js";
import type { Bundle, DispatchDecision, Policy, PriceSchedule, Receipt, Terminal } from "./types.js";

/** What a journaled run writes to: a register (the lease) and an append log (the journal). */
export type JournalStore = FleetStore & AppendLog;

/** The answers a `reconcile` function may give. */
export type ReconcileAnswerKind = "succeeded" | "failed_no_effect" | "in_progress" | "unknown";

/** What `reconcile` answers: the receiver's answer, or it with a settled cost and the value the receiver holds. */
export type ReconcileAnswer = ReconcileAnswerKind | { answer: ReconcileAnswerKind; cost?: number; value?: unknown };

/** The attempt in doubt, with the raw idempotency key to ask the receiver by. */
export type ReconcileQuestion = PendingAttempt & { idempotency_key: string };

/**
 * One attempt of a journaled run, as dispatch sees it: the same `Step` as
 * `runWithPolicy` gives (the planned dispatch, the raw key, `charge`,
 * `usage`, `requestBody`), backed by the core's session resumed from the
 * journal.
 */
export type JournalStep = Step;

/** The codes of `JournaledRunError`: the host's, the same in both packages. */
export type JournaledRunCode = "lease_lost" | "run_exists" | "run_not_found" | "reconcile_missing";

/**
 * A journaled run cannot go on as asked: `lease_lost` (another owner took the
 * run over; nothing was written), `run_exists` (`runJournaled` on a run whose
 * journal holds events), `run_not_found` (`resumeJournaled` of a run with
 * neither a lease nor a journal event), `reconcile_missing` (an attempt waits for reconciliation and no
 * `reconcile` was given).
 */
export class JournaledRunError extends RetryledgerError {
  declare readonly code: JournaledRunCode;
  /** `lease_lost`: the seq this owner was about to append. */
  readonly seq: number | undefined;
  /** `lease_lost`: the event this owner was about to append. */
  readonly event: JournalEvent | undefined;
  /** `lease_lost` by a taken seq: the core's classification of the refused event. */
  readonly evidence: ReturnType<typeof journalClassify> | undefined;

  constructor(code: JournaledRunCode, message: string, details: { seq?: number; event?: JournalEvent; evidence?: ReturnType<typeof journalClassify>; path?: string } = {}) {
    super(code, "journal", message, { path: details.path ?? (code === "lease_lost" ? "/lease_generation" : code === "reconcile_missing" ? "/reconcile" : "/run_id") });
    this.seq = details.seq;
    this.event = details.event;
    this.evidence = details.evidence;
  }
}

/** The sealed end of a journaled run. */
export interface JournaledEnd {
  readonly runId: string;
  readonly leaseGeneration: number;
  readonly events: readonly JournalEvent[];
  /** Policy, attempts and receipt, as `runWithPolicy` seals them. */
  readonly bundle: Bundle;
  readonly receipt: Receipt;
  readonly receiptSha256: string;
  /** The receipt's digest under the name of the one result shape of every driver (so `otel.record` takes the run). */
  readonly receipt_sha256: string;
  /** The bundle as canonical JSON (what `verifyBundle` and `npx retryledger verify` read). */
  readonly bundle_json: string;
  readonly terminal: Terminal;
  /** The ordinals of the attempts whose outcome came from the receiver. */
  readonly reconciled: readonly number[];
}

/** A completed journaled run: dispatch's result (or what `reconcile` said the receiver holds for an adopted attempt). */
export interface JournaledResult<T> extends JournaledEnd {
  readonly result: T | undefined;
  /** The same as `result` (the one result shape of every driver). */
  readonly value: T | undefined;
}

/** A journaled run that ended without success; `code` is its terminal. */
export class JournaledStopError extends RetryledgerError implements JournaledEnd {
  declare readonly code: Terminal;
  readonly runId: string;
  readonly leaseGeneration: number;
  readonly events: readonly JournalEvent[];
  readonly bundle: Bundle;
  readonly receipt: Receipt;
  readonly receiptSha256: string;
  readonly receipt_sha256: string;
  readonly bundle_json: string;
  readonly terminal: Terminal;
  readonly reconciled: readonly number[];

  constructor(end: JournaledEnd) {
    const n = end.bundle.attempts.attempts.length;
    super(end.terminal, "stopped", `run ${end.runId} ended with ${end.terminal} after ${n} attempt${n === 1 ? "" : "s"}`);
    this.runId = end.runId;
    this.leaseGeneration = end.leaseGeneration;
    this.events = end.events;
    this.bundle = end.bundle;
    this.receipt = end.receipt;
    this.receiptSha256 = end.receiptSha256;
    this.receipt_sha256 = end.receipt_sha256;
    this.bundle_json = end.bundle_json;
    this.terminal = end.terminal;
    this.reconciled = end.reconciled;
  }
}

export interface JournaledOptions extends RunHooks {
  /** The raw idempotency key; its digest must be the policy's. */
  idempotencyKey: string;
  /** The key's scope, when the policy's key digest is scoped. */
  keyScope?: { tenant: string; operation: string };
  /** The register and append log the journal and the lease live in. */
  store: JournalStore;
  /** The run's identifier (the journal's `run_id`). */
  runId: string;
  /** Asks the receiver what became of an attempt, by idempotency key (required to resume an attempt in doubt). */
  reconcile?: (attempt: ReconcileQuestion) => ReconcileAnswer | Promise<ReconcileAnswer>;
  /** The caller's classify hook, as for `runWithPolicy`. */
  classify?: Classifier;
  /** The wall clock, Unix ms (default `Date.now`): the `created` event holds the run clock's origin on it. */
  clock?: () => number;
  /** Wait `ms` milliseconds (default: a timer). */
  sleep?: (ms: number) => Promise<void>;
  /** Called after every event appended durably. */
  onAppend?: (event: JournalEvent) => void | Promise<void>;
  /** Most reconciliation questions about one attempt (1 to 100, default 5). */
  maxPolls?: number;
  /** The log's name (default `journal/<runId>`). */
  log?: string;
  /** The lease register's key (default `lease/<runId>`). */
  lease?: string;
  /**
   * Prices the usage a step reports (`step.usage`), as for `runWithPolicy`;
   * a resumed run must be given the same one.
   */
  priceSchedule?: Input<PriceSchedule>;
  /**
   * The fleet the run belongs to (required when the policy has a `fleet`
   * section): every attempt is admitted first, as `runWithPolicy` does. The
   * journal holds each attempt's admission; a resumed run admits again
   * under the fleet it is given (the same tenant under tenant shares).
   */
  fleet?: Fleet | undefined;
}

/** The default log name of a run's journal. */
export const journalLog = (runId: string): string => `journal/${runId}`;
/** The default register key of a run's lease. */
export const leaseKey = (runId: string): string => `lease/${runId}`;

const ANSWERS: readonly string[] = ["succeeded", "failed_no_effect", "in_progress", "unknown"];

const defaultSleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * One owner of a run, as the host loop's adapter: its lease generation, the
 * journal as read, the durable append (lease check, append, refusal
 * classified), the run clock on the journal's origin, and the caller's
 * dispatch, sleep and reconcile.
 */
class Owner<T> implements LoopAdapter<T> {
  origin = 0;
  #step: AttemptStep | undefined;
  #reports: Reports | undefined;

  constructor(
    readonly policy: CompiledPolicy,
    readonly store: JournalStore,
    readonly runId: string,
    readonly log: string,
    readonly lease: string,
    readonly generation: number,
    readonly events: JournalEvent[],
    readonly onAppend: ((event: JournalEvent) => void | Promise<void>) | undefined,
    /** The run's price schedule as JSON text, checked against the policy. */
    readonly schedule: string | undefined,
    readonly loop: Loop<T>,
  ) {
    Object.assign(this, loopFleet(loop.fleet), loopHooks(loop.hooks));
  }

  read?: (keys: string[]) => Promise<StoreRowDoc[]>;
  write?: (writes: CasDoc[]) => Promise<number>;
  onDecision?: (decision: Record<string, unknown>) => void;
  onSleep?: (sleep: LoopSleep) => void;
  onAttempt?: (attempt: Record<string, unknown>, judgement: Record<string, unknown>) => void;
  onTerminal?: (receipt: Receipt) => void;

  /** The run machine of this owner: started on an empty journal (its run clock's origin is now), else resumed from the journal. */
  machine(): Machine {
    const options: MachineOptions = {
      origin_epoch_ms: 0,
      journal: { run_id: this.runId, lease_generation: this.generation },
      max_polls: this.loop.maxPolls,
      ...fleetMachineOptions(this.loop.fleet),
    };
    if (this.schedule !== undefined) options.price_schedule = JSON.parse(this.schedule) as object;
    const first = this.events[0];
    if (first === undefined) {
      this.origin = Math.max(0, Math.floor(this.loop.clock()));
      return Machine.start(this.policy, { ...options, origin_epoch_ms: this.origin });
    }
    // The run clock's origin is the journal's; a journal without one is refused by the core's verification.
    const origin = (first as { created_at_epoch_ms?: unknown }).created_at_epoch_ms;
    this.origin = typeof origin === "number" && Number.isSafeInteger(origin) && origin >= 0 ? origin : 0;
    return Machine.resume(this.policy, { ...options, origin_epoch_ms: this.origin, now_ms: this.nowMs() }, this.events);
  }

  nowMs(): number {
    return Math.max(0, Math.floor(this.loop.clock() - this.origin));
  }

  sleep(ms: number): Promise<void> {
    return this.loop.sleep(ms);
  }

  dispatch(effect: DispatchEffect): Promise<T> | T {
    const decision = { ...effect.dispatch, kind: "dispatch" } as unknown as DispatchDecision;
    this.#reports = new Reports(this.schedule, decision.route_release_sha256);
    this.#step = new AttemptStep(decision, this.loop.key, effect.started_at_ms, this.#reports as unknown as Session, this.schedule !== undefined);
    return this.loop.dispatch(this.#step);
  }

  observation(_effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown> {
    const step = this.#step as AttemptStep;
    step.open = false;
    const fields: Record<string, unknown> = {};
    if (!ok) fields["facts"] = raisedFacts(reply, { classify: this.loop.classify, outputDelivered: step.delivered, nowUnixMs: this.loop.clock() });
    if (step.charged !== undefined) fields["cost"] = step.charged;
    return (this.#reports as Reports).fields(fields);
  }

  async reconcile(attempt: Record<string, unknown>): Promise<LoopReconcileAnswer<T>> {
    if (this.loop.reconcile === undefined) {
      throw new JournaledRunError("reconcile_missing", "an attempt was dispatched without an observation: pass `reconcile` to ask the receiver");
    }
    const { answer, cost, value } = answerOf(await this.loop.reconcile({ ...(attempt as unknown as PendingAttempt), idempotency_key: this.loop.key }));
    const given: LoopReconcileAnswer<T> = { answer, value: value as T };
    if (cost !== undefined && answer !== "in_progress") given.cost = cost;
    return given;
  }

  async append(events: Record<string, unknown>[]): Promise<boolean> {
    for (const event of events) await this.#append(event as unknown as JournalEvent);
    return true;
  }

  async #append(event: JournalEvent): Promise<void> {
    const text = JSON.stringify(event);
    const seq = event.seq;
    let answer: FencedAppendAnswer;
    if (this.store.appendFenced !== undefined) {
      // The lease is checked in the append's own transaction.
      answer = await this.store.appendFenced(this.log, seq, text, this.lease, this.generation);
    } else {
      // A store without it: the lease read, then the append (a late owner
      // may still slip one event in between; docs/JOURNAL.md).
      const { generation } = await this.store.get(this.lease);
      answer = generation !== this.generation ? LEASE_LOST : await this.store.append(this.log, seq, text);
    }
    if (answer.code === "lease_lost") {
      throw new JournaledRunError("lease_lost", `the lease of ${this.runId} has moved past generation ${this.generation}`, { seq, event });
    }
    if (!answer.ok) {
      const held = await readEvents(this.store, this.log);
      const evidence = journalClassify(this.policy, held, event);
      throw new JournaledRunError("lease_lost", `seq ${seq} of ${this.runId} is taken by another owner's event`, { seq, event, evidence });
    }
    this.events.push(event);
    if (this.onAppend !== undefined) await this.onAppend(event);
  }
}

async function readEvents(store: AppendLog, log: string): Promise<JournalEvent[]> {
  return (await store.read(log, 0)).map((e) => JSON.parse(e.text) as JournalEvent);
}

function answerOf(given: unknown): { answer: ReconcileAnswerKind; cost: number | undefined; value: unknown } {
  const obj = typeof given === "string" ? { answer: given } : given;
  if (typeof obj !== "object" || obj === null) throw new DecodeError("invalid_type", "reconcile answers a string or an object with `answer`", { path: "/answer" });
  const { answer, cost, value } = obj as { answer?: unknown; cost?: unknown; value?: unknown };
  if (typeof answer !== "string" || !ANSWERS.includes(answer)) {
    throw new DecodeError("invalid_value", `reconcile answers one of ${ANSWERS.join(", ")}, got ${String(answer)}`, { path: "/answer" });
  }
  if (cost !== undefined && (typeof cost !== "number" || !Number.isSafeInteger(cost) || cost < 0)) {
    throw new DecodeError("invalid_value", "a reconciled cost is a non-negative integer", { path: "/cost" });
  }
  return { answer: answer as ReconcileAnswerKind, cost: cost as number | undefined, value };
}

interface Loop<T> {
  dispatch: (step: JournalStep) => Promise<T> | T;
  key: string;
  reconcile: JournaledOptions["reconcile"];
  classify: Classifier | undefined;
  clock: () => number;
  sleep: (ms: number) => Promise<void>;
  maxPolls: number;
  fleet: Fleet | undefined;
  hooks: RunHooks;
}

/** The run through the host loop, as both entry points end it. */
async function drive<T>(owner: Owner<T>): Promise<JournaledResult<T>> {
  const machine = owner.machine();
  let run: LoopResult<T>;
  try {
    run = await runLoop(machine, owner);
  } finally {
    machine.free();
  }
  const bundle = run.bundle;
  const sealed: JournaledEnd = {
    runId: owner.runId,
    leaseGeneration: owner.generation,
    events: [...owner.events],
    bundle,
    receipt: run.receipt,
    receiptSha256: run.receipt_sha256,
    receipt_sha256: run.receipt_sha256,
    bundle_json: run.bundle_json,
    terminal: run.terminal as Terminal,
    reconciled: bundle.attempts.attempts.filter((a) => (a as { reconciled?: string }).reconciled !== undefined).map((a) => a.ordinal),
  };
  if (sealed.terminal !== "completed") throw new JournaledStopError(sealed);
  return { ...sealed, result: run.value, value: run.value };
}

function prepare(policy: Input<Policy> | CompiledPolicy, options: JournaledOptions): CompiledPolicy {
  const compiled = compiledOf(policy);
  if (!compiled.acceptsKey(options.idempotencyKey, options.keyScope)) {
    throw new DriftError("idempotency_key_drift", "the idempotency key's digest differs from the policy's idempotency_key_sha256", { path: "/idempotency_key_sha256" });
  }
  // Before anything is claimed or written: what this driver carries and
  // the fleet a fleet section needs, as the core says.
  compiled.requireDriver("journaled");
  checkFleet(compiled, options.fleet);
  const polls = options.maxPolls ?? 5;
  if (!Number.isSafeInteger(polls) || polls < 1 || polls > 100) throw new DecodeError("invalid_value", "maxPolls is an integer in 1..=100", { path: "/max_polls" });
  const store = options.store as unknown as Record<string, unknown>;
  for (const m of ["get", "compareAndSet", "append", "read"]) {
    if (typeof store?.[m] !== "function") throw new DecodeError("invalid_type", "`store` is a register and append log (retryledger's stores)", { path: "/store" });
  }
  return compiled;
}

/** The price schedule as JSON text, once the core has checked it against the policy. */
function scheduleOf(compiled: CompiledPolicy, options: JournaledOptions): string | undefined {
  if (options.priceSchedule === undefined) return undefined;
  const text = toText(options.priceSchedule);
  checkPriceSchedule(compiled.policy, text);
  return text;
}

function loopOf<T>(dispatch: (step: JournalStep) => Promise<T> | T, options: JournaledOptions): Loop<T> {
  return {
    dispatch,
    key: options.idempotencyKey,
    reconcile: options.reconcile,
    classify: options.classify,
    clock: options.clock ?? (options.fleet !== undefined ? (): number => (options.fleet as Fleet).now() : Date.now),
    sleep: options.sleep ?? defaultSleep,
    maxPolls: options.maxPolls ?? 5,
    fleet: options.fleet,
    hooks: options,
  };
}

/** The lease taken over by compare-and-set from generation `current`: the new generation. */
async function raiseLease(store: JournaledOptions["store"], runId: string, lease: string, current: number): Promise<number> {
  const generation = current + 1;
  const taken = await store.compareAndSet(lease, current, { run_id: runId, lease_generation: generation });
  if (!taken.ok) throw new JournaledRunError("lease_lost", `another owner took ${runId} over first (lease generation ${taken.generation})`, { seq: 0 });
  return generation;
}

/**
 * Run one logical request with its journal in `options.store`: the result
 * and sealed run, or `JournaledStopError`. The lease register must be absent
 * and the log empty (`JournaledRunError` `run_exists` otherwise), except a
 * lease whose journal is empty (its owner died between the claim and
 * `created`; nothing was sent): that run is taken over (the lease generation
 * raised) and started here.
 */
export async function runJournaled<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: (step: JournalStep) => Promise<T> | T,
  options: JournaledOptions,
): Promise<JournaledResult<T>> {
  const compiled = prepare(policy, options);
  const { store, runId } = options;
  const log = options.log ?? journalLog(runId);
  const lease = options.lease ?? leaseKey(runId);
  const loop = loopOf(dispatch, options);
  const exists = (): JournaledRunError => new JournaledRunError("run_exists", `the journal ${log} already holds events: resumeJournaled takes a run over`);
  let generation = 1;
  const claimed = await store.compareAndSet(lease, 0, { run_id: runId, lease_generation: generation });
  if (!claimed.ok) {
    // Claimed before. An owner that died after its claim and before
    // `created` sent nothing: its run is taken over and started here.
    if ((await store.read(log, 0)).length > 0) throw exists();
    generation = await raiseLease(store, runId, lease, claimed.generation);
  }
  if ((await store.read(log, 0)).length > 0) throw exists();
  // The run machine opens the journal (`created` and `decided`).
  return drive(new Owner(compiled, store, runId, log, lease, generation, [], options.onAppend, scheduleOf(compiled, options), loop));
}

/**
 * Take a run over and finish it: raise the lease generation by
 * compare-and-set, read and verify the journal (an unverified one is the
 * core's coded `JournalError`), then go on as the core says. An attempt
 * dispatched without an observation is reconciled through
 * `options.reconcile`, never resent blind. A finished run is sealed again
 * from its journal, nothing appended. A run whose lease exists but whose
 * journal is empty (its owner died between the claim and `created`: nothing
 * was sent) is started from the beginning, as the core's recovery of an
 * empty journal says. A run with neither a lease nor a journal is
 * `run_not_found`, nothing written.
 */
export async function resumeJournaled<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: (step: JournalStep) => Promise<T> | T,
  options: JournaledOptions,
): Promise<JournaledResult<T>> {
  const compiled = prepare(policy, options);
  const { store, runId } = options;
  const log = options.log ?? journalLog(runId);
  const lease = options.lease ?? leaseKey(runId);
  const loop = loopOf(dispatch, options);
  const { generation: current } = await store.get(lease);
  if (current === 0 && (await store.read(log, 0)).length === 0) {
    // Neither claimed nor journaled: nothing to take over (and no lease written).
    throw new JournaledRunError("run_not_found", `the run ${runId} has neither a lease nor a journal`);
  }
  const generation = await raiseLease(store, runId, lease, current);
  const events = await readEvents(store, log);
  // The run machine verifies the journal before anything is written, and
  // starts the run of an empty one.
  return drive(new Owner(compiled, store, runId, log, lease, generation, events, options.onAppend, scheduleOf(compiled, options), loop));
}
