/**
 * The host loop: the one loop of the package over the core's run machine
 * (docs/HOST_LOOP.md).
 *
 * The machine (docs/COMPOSITION.md) says what to do next as an effect; the
 * loop carries it out through its `LoopAdapter` (`dispatch`, `sleep`, `read`,
 * `write`, `append`, `reconcile`) and answers the machine with the event the
 * answer makes. The loop decides nothing: it moves facts and time. A driver
 * is an adapter (what it dispatches, how it sleeps, which store and journal
 * it writes to) and the result shape it returns.
 *
 * Every effect is handled in `carryOut` alone, so a new effect of the
 * machine is a new branch there and a new adapter method; an effect of a
 * kind this loop does not know is the coded `DecodeError` `invalid_value` at
 * `/kind`. More than one attempt may be in flight (a hedged run's `dispatch`
 * and `await`, answered by whichever settles first or by the clock when a
 * hedge falls due; its `cancel_attempts`); an async job's `poll` and
 * `cancel` are sent like a dispatch.
 */

import { call, CompiledPolicy, judge, priceCost, toText, type Input, type RawBindings, type RawCompiled } from "./core.js";
import { DecodeError, HttpError } from "./errors.js";
import { factsText, minimalFacts, type FactsOptions } from "./facts.js";
import type { LoopSleepDoc, MachineEffect, MachineEvent } from "./machine.js";
import { StoreUnavailableError, type FleetStore, type StoreDocument } from "./stores/store.js";
import type { Bundle, Facts, Receipt } from "./types.js";

/** The module's live machine (JSON text in and out; `wasm/src/machine.rs`). */
interface RawMachine {
  next(): string;
  done(): boolean;
  answer(event: string): string;
  observed(): string | undefined;
  planned(): string | undefined;
  now_ms(): number;
  seal(): string;
  sealed(): string;
  free(): void;
}

interface MachineBindings {
  LiveMachine: {
    start(policy: string, options: string): RawMachine;
    resume(policy: string, options: string, journal: string): RawMachine;
    start_compiled(policy: RawCompiled, options: string): RawMachine;
    resume_compiled(policy: RawCompiled, options: string, journal: string): RawMachine;
  };
}

const machineCall = <T>(f: (b: MachineBindings) => T): T => call((b: RawBindings) => f(b as unknown as MachineBindings));

/** The options of a start or a resume (docs/COMPOSITION.md). */
export interface MachineOptions {
  /** Unix ms at run clock 0. */
  origin_epoch_ms: number;
  /** The run clock now, ms (a resume). */
  now_ms?: number;
  /** Journal the run (a start), or the journal's owner (a resume). */
  journal?: { run_id: string; lease_generation: number };
  price_schedule?: object;
  reserve_tokens?: number;
  max_polls?: number;
  max_conflicts?: number;
  /** The key digest a session used before: a pooled route keeps it while it is usable. */
  key_affinity?: string;
  /** The host delivers a stream: a policy without a stream contract is refused (`invalid_stream_contract`). */
  stream?: boolean;
  /** The call's tenant under tenant shares (ignored by a policy without them). */
  tenant?: string;
}

/**
 * A run of the core's machine: `next()` is the outstanding effect, `answer`
 * answers it with an event and gives the next one, `seal()` is the finished
 * run's bundle. A refused event throws the core's coded error and leaves the
 * same effect outstanding.
 */
export class Machine {
  readonly #raw: RawMachine;

  private constructor(raw: RawMachine) {
    this.#raw = raw;
  }

  /** A run of `policy` (a document, its JSON text, or compiled once for many runs) under `options`. */
  static start(policy: Input<object> | CompiledPolicy, options: Input<MachineOptions>): Machine {
    const o = toText(options);
    if (policy instanceof CompiledPolicy) {
      return new Machine(policy.callRaw((raw) => machineCall((b) => b.LiveMachine.start_compiled(raw, o))));
    }
    const p = toText(policy);
    return new Machine(machineCall((b) => b.LiveMachine.start(p, o)));
  }

  /** The run `journal` holds, taken over as the owner `options.journal` names. */
  static resume(policy: Input<object> | CompiledPolicy, options: Input<MachineOptions>, journal: Input<readonly object[]>): Machine {
    const o = toText(options);
    const j = toText(journal);
    if (policy instanceof CompiledPolicy) {
      return new Machine(policy.callRaw((raw) => machineCall((b) => b.LiveMachine.resume_compiled(raw, o, j))));
    }
    const p = toText(policy);
    return new Machine(machineCall((b) => b.LiveMachine.resume(p, o, j)));
  }

  /** The outstanding effect. */
  next(): MachineEffect {
    return JSON.parse(this.#raw.next()) as MachineEffect;
  }

  /** Answer the outstanding effect: the next effect. */
  answer(event: MachineEvent): MachineEffect {
    const e = JSON.stringify(event);
    return JSON.parse(call(() => this.#raw.answer(e))) as MachineEffect;
  }

  /** The last attempt recorded and its judgement. */
  observed(): { attempt: Record<string, unknown>; judgement: Record<string, unknown> } | undefined {
    const text = this.#raw.observed();
    return text === undefined ? undefined : (JSON.parse(text) as { attempt: Record<string, unknown>; judgement: Record<string, unknown> });
  }

  /** The attempt the machine plans next (its dispatch), when one is: what a wait is for. */
  planned(): Record<string, unknown> | undefined {
    const text = this.#raw.planned();
    return text === undefined ? undefined : (JSON.parse(text) as Record<string, unknown>);
  }

  /** The run clock as the machine last read it, ms. */
  get nowMs(): number {
    return this.#raw.now_ms();
  }

  /** The finished run's bundle. */
  seal(): Bundle {
    return JSON.parse(call(() => this.#raw.seal())) as Bundle;
  }

  /** The finished run's bundle, its receipt's digest and the bundle's canonical JSON. */
  sealed(): { bundle: Bundle; receipt_sha256: string; bundle_json: string } {
    const text = call(() => this.#raw.sealed());
    // `{"bundle":<bundle>,"receipt_sha256":"<64 hex>"}`, canonical.
    const bundle_json = text.slice('{"bundle":'.length, text.length - ',"receipt_sha256":"'.length - 64 - 2);
    const both = JSON.parse(text) as { bundle: Bundle; receipt_sha256: string };
    return { ...both, bundle_json };
  }

  /** Free the module's memory of the run. */
  free(): void {
    this.#raw.free();
  }
}

/** What one run through the loop gives every driver. */
export interface LoopResult<T> {
  /** The value of the attempt that completed the run (or what the receiver held for an adopted one). */
  readonly value: T | undefined;
  readonly receipt: Receipt;
  readonly receipt_sha256: string;
  readonly bundle: Bundle;
  /** The bundle's canonical JSON (what `verifyBundle` reads). */
  readonly bundle_json: string;
  /** How the run ended. */
  readonly terminal: string;
}

/** A planned attempt, as the machine's `dispatch` effect names it (or an async job's `poll` or `cancel`). */
export type DispatchEffect = MachineEffect & { kind: "dispatch" | "poll" | "cancel"; dispatch: Record<string, unknown>; started_at_ms: number };

/**
 * What a driver supplies: the I/O of each effect, the run clock and the
 * hooks. A method a driver leaves out makes the effect that needs it a coded
 * error, never a silent skip.
 */
export interface LoopAdapter<T> {
  /** The run clock, ms. */
  nowMs(): number;
  /** Whether the caller cancelled the run (checked before each wait). */
  cancelled?(): boolean;
  /** Send the attempt: its value, or throw. */
  dispatch(effect: DispatchEffect): Promise<T> | T;
  /**
   * The plain facts of what the attempt returned (`ok`) or threw: the
   * `observed` event's fields but `kind` and `completed_at_ms`.
   */
  observation(effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown>;
  /** Wait `ms` milliseconds of the run clock (returning early when `wake` aborts: an attempt answered first). */
  sleep(ms: number, wake?: AbortSignal): Promise<void> | void;
  /** A hedged run: abort attempt `ordinal`, a loser of its round (what it gives later is dropped). */
  cancelAttempt?(ordinal: number): void;
  /**
   * Whether the caller cancelled before the attempt planned now is sent (a
   * run without a journal: the machine then cancels the run, nothing sent).
   */
  cancelledBeforeSend?(): boolean;
  /** One row `{document?, generation}` per key; throw `StoreUnavailableError` when unreachable. */
  read?(keys: string[]): Promise<StoreRowDoc[]> | StoreRowDoc[];
  /** Compare-and-set in order, stopping at the first refused: how many were written. */
  write?(writes: CasDoc[]): Promise<number> | number;
  /** Make the events durable, all in order: `false` when the store refused them. */
  append?(events: Record<string, unknown>[]): Promise<boolean> | boolean;
  /** Ask the receiver about an attempt in doubt. */
  reconcile?(attempt: Record<string, unknown>, poll: number): Promise<LoopReconcileAnswer<T>> | LoopReconcileAnswer<T>;
  onDecision?(decision: Record<string, unknown>): void;
  onSleep?(sleep: LoopSleep): void;
  onAttempt?(attempt: Record<string, unknown>, judgement: Record<string, unknown>): void;
  onTerminal?(receipt: Receipt): void;
}

/** A wait of the run clock, and the attempt it waits for (absent for a wait that is not before one, e.g. a reconciliation's). */
export type LoopSleep = LoopSleepDoc;

/** A fleet register as read. */
export interface StoreRowDoc {
  document?: StoreDocument;
  generation: number;
}

/** A compare-and-set the machine asks for. */
export interface CasDoc {
  key: string;
  expected_generation: number;
  document: StoreDocument;
}

/** The receiver's answer about an attempt in doubt. */
export interface LoopReconcileAnswer<T> {
  answer: "succeeded" | "failed_no_effect" | "in_progress" | "unknown";
  cost?: number;
  value?: T;
}

function missing(what: string, path: string, message: string): DecodeError {
  return new DecodeError("missing_field", `missing_field at ${path}: the host loop cannot ${what}: ${message}`, { path });
}

const NOTHING = Symbol("nothing");

/** The effects a decision of the core is: an attempt to send (an async job's poll and cancel too), or the end. */
const DECIDED: ReadonlySet<string> = new Set(["dispatch", "poll", "cancel", "done"]);

function decisionOf(effect: MachineEffect): Record<string, unknown> {
  if (effect.kind === "done") return { kind: "terminal", terminal: effect["terminal"] };
  return { ...(effect["dispatch"] as Record<string, unknown>), kind: "dispatch" };
}

/** An attempt sent and not yet answered for, then what it gave. */
interface Settled {
  readonly effect: DispatchEffect;
  readonly ordinal: number;
  /** The run clock when it settled. */
  readonly at: number;
  readonly ok: boolean;
  readonly reply: unknown;
}

/**
 * The attempts in flight: sent, not yet observed or cancelled. A plain run
 * has at most one; a hedged run more (docs/HEDGING.md). What settles waits
 * in `queue` until the machine is answered with it; a dropped attempt (a
 * loser the machine cancelled) is never answered for.
 */
class Flights<T> {
  readonly queue: Settled[] = [];
  readonly flying = new Set<number>();
  #wake: (() => void) | undefined;

  constructor(readonly adapter: LoopAdapter<T>) {}

  launch(effect: DispatchEffect): void {
    const ordinal = effect.dispatch["ordinal"] as number;
    this.flying.add(ordinal);
    const settle = (ok: boolean, reply: unknown): void => {
      if (!this.flying.delete(ordinal)) return; // dropped: cancelled already
      this.queue.push({ effect, ordinal, at: this.adapter.nowMs(), ok, reply });
      this.#wake?.();
    };
    let sent: Promise<T>;
    try {
      sent = Promise.resolve(this.adapter.dispatch(effect));
    } catch (e) {
      sent = Promise.reject(e);
    }
    sent.then(
      (value) => settle(true, value),
      (error: unknown) => settle(false, error),
    );
  }

  /** Attempt `ordinal` is cancelled: whatever it gives later is dropped. */
  drop(ordinal: number): void {
    if (this.flying.delete(ordinal)) this.adapter.cancelAttempt?.(ordinal);
  }

  /**
   * The next settled attempt, or `undefined` once the run clock reaches
   * `until` with none settled (never while the caller has cancelled: then
   * only the attempts' own answers end the wait).
   */
  async next(until: number | undefined): Promise<Settled | undefined> {
    let yielded = false;
    for (;;) {
      const s = this.queue.shift();
      if (s !== undefined) return s;
      const cancelled = this.adapter.cancelled?.() === true;
      const timed = until !== undefined && !cancelled;
      const now = this.adapter.nowMs();
      if (timed && now >= until) return undefined;
      if (this.flying.size === 0) throw missing("wait", "/in_flight", "the machine waits for an attempt this loop never sent");
      if (timed && !yielded) {
        // An attempt that has its answer already settles before the wait
        // starts (on an injected clock, the wait would move the clock first).
        yielded = true;
        await yieldToHost();
        continue;
      }
      const woken = new AbortController();
      const waits: Promise<unknown>[] = [new Promise<void>((resolve) => (this.#wake = resolve))];
      if (timed) waits.push(Promise.resolve(this.adapter.sleep(until - now, woken.signal)));
      await Promise.race(waits);
      this.#wake = undefined;
      woken.abort();
    }
  }
}

/** Let the host run what is ready (settled promises, I/O callbacks) before a timed wait. */
function yieldToHost(): Promise<void> {
  const immediate = (globalThis as { setImmediate?: (f: () => void) => unknown }).setImmediate;
  return new Promise((resolve) => (immediate !== undefined ? immediate(resolve) : setTimeout(resolve, 0)));
}

/** Drive `machine` to its end through `adapter`: the one loop of the package. */
export async function runLoop<T>(machine: Machine, adapter: LoopAdapter<T>): Promise<LoopResult<T>> {
  let value: T | undefined;
  const flights = new Flights(adapter);
  try {
    let effect = machine.next();
    if (DECIDED.has(effect.kind)) adapter.onDecision?.(decisionOf(effect));
    while (effect.kind !== "done") {
      const [event, got] = await carryOut(machine, adapter, flights, effect);
      if (got !== NOTHING) value = got as T;
      effect = machine.answer(event);
      if (event.kind === "observed" && adapter.onAttempt !== undefined) {
        const seen = machine.observed();
        if (seen !== undefined) adapter.onAttempt(seen.attempt, seen.judgement);
      }
      if (DECIDED.has(effect.kind)) adapter.onDecision?.(decisionOf(effect));
    }
  } finally {
    for (const ordinal of [...flights.flying]) flights.drop(ordinal);
  }
  const { bundle, receipt_sha256, bundle_json } = machine.sealed();
  const receipt = bundle.receipt;
  adapter.onTerminal?.(receipt);
  const terminal = receipt.terminal;
  return { value: terminal === "completed" ? value : undefined, receipt, receipt_sha256, bundle, bundle_json, terminal };
}

/** The `observed` event of a settled attempt: its facts as the adapter reads them, its ordinal and when it ended. */
function observedOf<T>(machine: Machine, adapter: LoopAdapter<T>, s: Settled): MachineEvent {
  const fields = adapter.observation(s.effect, s.ok, s.reply);
  const completed = Math.max(s.at, s.effect.started_at_ms, machine.nowMs);
  return { ...fields, kind: "observed", ordinal: s.ordinal, completed_at_ms: completed } as MachineEvent;
}

/** The answer to a dispatch or an await: the next attempt to settle, or the clock when a hedge fell due first. */
async function settledOrDue<T>(machine: Machine, adapter: LoopAdapter<T>, flights: Flights<T>, until: number | undefined): Promise<[MachineEvent, unknown]> {
  const s = await flights.next(until);
  if (s === undefined) return [{ kind: "clock", now_ms: Math.max(adapter.nowMs(), machine.nowMs) }, NOTHING];
  return [observedOf(machine, adapter, s), s.ok ? s.reply : NOTHING];
}

/** The event that answers `effect`, and the value a dispatch or a reconciliation gave: every effect's I/O, in one place. */
async function carryOut<T>(machine: Machine, adapter: LoopAdapter<T>, flights: Flights<T>, effect: MachineEffect): Promise<[MachineEvent, unknown]> {
  switch (effect.kind) {
    case "sleep": {
      const until = effect["until_ms"] as number;
      let now = adapter.nowMs();
      const cancelled = (): boolean => adapter.cancelled?.() === true;
      if (now < until && !cancelled() && adapter.onSleep !== undefined) {
        const sleep: LoopSleep = { from_ms: now, until_ms: until, ms: until - now };
        const planned = machine.planned();
        if (planned !== undefined) sleep.dispatch = planned;
        adapter.onSleep(sleep);
      }
      while (now < until && !cancelled()) {
        await adapter.sleep(until - now);
        now = adapter.nowMs();
      }
      if (cancelled()) return [{ kind: "cancelled", at_ms: now }, NOTHING];
      return [{ kind: "clock", now_ms: now }, NOTHING];
    }
    case "dispatch":
    case "poll": {
      // Not sent yet: a caller's cancellation the adapter reports now stops the run here.
      if (adapter.cancelledBeforeSend?.() === true) return [{ kind: "cancelled", at_ms: Math.max(adapter.nowMs(), machine.nowMs) }, NOTHING];
      flights.launch(effect as DispatchEffect);
      return settledOrDue(machine, adapter, flights, effect["hedge_at_ms"] as number | undefined);
    }
    case "cancel":
      // The planned cancel of a job left running: sent whatever the caller did.
      flights.launch(effect as DispatchEffect);
      return settledOrDue(machine, adapter, flights, undefined);
    case "await":
      return settledOrDue(machine, adapter, flights, effect["hedge_at_ms"] as number | undefined);
    case "cancel_attempts": {
      // A loser whose answer arrived already is answered for (late, never
      // the run's value); else the first is cancelled now.
      const losers = effect["ordinals"] as number[];
      const late = flights.queue.findIndex((s) => losers.includes(s.ordinal));
      if (late >= 0) {
        const [s] = flights.queue.splice(late, 1);
        return [observedOf(machine, adapter, s as Settled), NOTHING];
      }
      const ordinal = losers[0] as number;
      flights.drop(ordinal);
      return [{ kind: "attempt_cancelled", ordinal, at_ms: Math.max(adapter.nowMs(), machine.nowMs) }, NOTHING];
    }
    case "read": {
      if (adapter.read === undefined) throw missing("read", "/fleet", "the policy has a fleet section: pass a fleet store");
      try {
        const rows = await adapter.read([...(effect["keys"] as string[])]);
        return [{ kind: "read", now_ms: adapter.nowMs(), rows }, NOTHING];
      } catch (e) {
        if (e instanceof StoreUnavailableError) return [{ kind: "store_unavailable", now_ms: adapter.nowMs() }, NOTHING];
        throw e;
      }
    }
    case "write": {
      if (adapter.write === undefined) throw missing("write", "/fleet", "the policy has a fleet section: pass a fleet store");
      const written = await adapter.write([...(effect["writes"] as CasDoc[])]);
      return [{ kind: "written", written }, NOTHING];
    }
    case "append": {
      if (adapter.append === undefined) throw missing("append", "/journal", "the run is journaled: pass a journal store");
      const ok = await adapter.append([...(effect["events"] as Record<string, unknown>[])]);
      return [{ kind: ok ? "appended" : "append_refused" }, NOTHING];
    }
    case "reconcile": {
      if (adapter.reconcile === undefined) {
        throw missing("reconcile", "/reconcile", "an attempt was dispatched without an observation: pass reconcile");
      }
      const at = adapter.nowMs();
      const answer = await adapter.reconcile({ ...(effect["attempt"] as Record<string, unknown>) }, effect["poll"] as number);
      const event: MachineEvent = { kind: "reconciled", answer: answer.answer, at_ms: at };
      if (answer.cost !== undefined) event["cost"] = answer.cost;
      return [event, answer.answer === "succeeded" && "value" in answer ? answer.value : NOTHING];
    }
    default:
      throw new DecodeError("invalid_value", `invalid_value at /kind: the host loop does not know the effect \`${String(effect.kind)}\``, {
        path: "/kind",
      });
  }
}

/** Wait `ms` milliseconds, ending early when `signal` aborts: the drivers' default `sleep`. */
export function sleepFor(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted === true) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A fleet read from a register store (`get`): one row per key, under `namespace`. */
export async function storeRead(store: FleetStore, namespace: string, keys: readonly string[]): Promise<StoreRowDoc[]> {
  const rows: StoreRowDoc[] = [];
  for (const key of keys) {
    const { document, generation } = await store.get(`${namespace}/${key}`);
    rows.push(document === null ? { generation } : { document, generation });
  }
  return rows;
}

/** A fleet write to a register store (`compareAndSet`), in order, up to the first refused. */
export async function storeWrite(store: FleetStore, namespace: string, writes: readonly CasDoc[]): Promise<number> {
  let written = 0;
  for (const w of writes) {
    const { ok } = await store.compareAndSet(`${namespace}/${w.key}`, w.expected_generation, w.document);
    if (!ok) break;
    written += 1;
  }
  return written;
}

/**
 * What one attempt of a machine-planned run reports through its step
 * (`AttemptStep` takes it in place of a session): usage, checked by the core
 * against the schedule as it is reported, and the request body's digest,
 * both carried in the `observed` event.
 */
export class Reports {
  usage: Record<string, number> | undefined;
  requestBodySha256: string | undefined;
  readonly #schedule: string | undefined;
  readonly #release: string;

  constructor(schedule: string | undefined, routeReleaseSha256: string) {
    this.#schedule = schedule;
    this.#release = routeReleaseSha256;
  }

  addUsage(units: Input<Record<string, number>>): number {
    const given = (typeof units === "string" ? JSON.parse(units) : units) as Record<string, number>;
    const merged: Record<string, number> = { ...this.usage };
    for (const [kind, n] of Object.entries(given)) merged[kind] = kind in merged && typeof n === "number" ? (merged[kind] as number) + n : n;
    // The core prices it now: usage it refuses throws here, nothing kept.
    const cost = priceCost(this.#schedule ?? "", this.#release, merged);
    this.usage = merged;
    return cost;
  }

  setRequestBodySha256(digest: string): void {
    this.requestBodySha256 = digest;
  }

  /** An async job: the job id and status the answer reported (the core keeps only the id's SHA-256). */
  setJob(id: string | undefined, status: string | undefined): void {
    this.job = { id, status };
  }

  /** An async job's submit whose answer was lost: the receiver's answer, asked by idempotency key. */
  setReconciled(answer: string): void {
    this.reconciled = answer;
  }

  job: { id: string | undefined; status: string | undefined } | undefined;
  reconciled: string | undefined;

  /** The `observed` event's fields these reports add. */
  fields(into: Record<string, unknown>): Record<string, unknown> {
    if (this.usage !== undefined) into["usage"] = this.usage;
    if (this.requestBodySha256 !== undefined) into["request_body_sha256"] = this.requestBodySha256;
    if (this.job?.id !== undefined) into["job_id"] = this.job.id;
    if (this.job?.status !== undefined) into["job_status"] = this.job.status;
    if (this.reconciled !== undefined) into["reconciled"] = this.reconciled;
    return into;
  }
}

/**
 * The facts of what a dispatch threw, as JSON: an `AttemptError`'s, or the
 * plain facts extracted from the error; facts the core refuses (a header
 * value it cannot decode, a hint too long to parse) are replaced by the ones
 * that are certain, so an odd error never breaks the run.
 */
export function raisedFacts(error: unknown, options: FactsOptions): Facts {
  const text = factsText(error, options);
  try {
    judge(text);
    return JSON.parse(text) as Facts;
  } catch (e) {
    if (!(e instanceof DecodeError || e instanceof HttpError)) throw e;
    return JSON.parse(minimalFacts(options)) as Facts;
  }
}
