/**
 * `runStream`: `runWithPolicy` for a dispatch that returns a stream of
 * provider events (docs/STREAMING.md), as an adapter of the host loop
 * (docs/HOST_LOOP.md).
 *
 * The machine plans each attempt; its `dispatch` effect carries the
 * attempt's stream plan (deliver live or buffered, how many events without
 * text to hold back until the first text, when the first event is due, the
 * idle limit and the byte bound). The adapter calls `dispatch(step, signal)`
 * for an async iterable of provider events, reads each event with the
 * `reader` (its text, sequence number, response id, terminal flag and
 * usage), detects protocol violations and timeouts, and answers the machine
 * with the attempt's stream facts and delta texts. The consumer iterates the
 * run and receives exactly the events of the run's event log
 * (`retryledger.stream_event.v1`), in order: `delta` events (tentative as
 * they arrive in the live modes, committed after the commit under `buffer`),
 * one `commit` when the run completes, an `invalidate` whenever pending
 * output is void. The provider stream is read only as fast as the consumer
 * takes its events.
 *
 * Timeouts use one lazy watchdog per attempt: a single timer (the injected
 * `sleep`) armed for the earliest limit (the first event, idle since the
 * last event, the run's deadline) and re-armed from the last event's time
 * when it wakes early; each event only records its arrival time. On expiry
 * the dispatch's AbortSignal fires, the provider stream is closed without
 * waiting for it, and the pending read is abandoned, so a stream that
 * ignores the signal cannot hang the run.
 */

import { CompiledPolicy, compiledOf, checkPriceSchedule, judge, toText, utf8Length, type Input } from "./core.js";
import { factsOf, type Classifier } from "./facts.js";
import { AttemptStep, checkedKey, checkFleet, type Step } from "./driver.js";
import type { Fleet } from "./fleet.js";
import { DecodeError, HttpError, RunCancelledError, RunStoppedError, UnrecognizedDispatchError } from "./errors.js";
import type { Session } from "./session.js";
import type { RunHooks } from "./hooks.js";
import { loopHooks } from "./machine.js";
import { Machine, Reports, runLoop, sleepFor, storeRead, storeWrite, type CasDoc, type DispatchEffect, type LoopAdapter, type LoopSleep, type MachineOptions, type StoreRowDoc } from "./loop.js";
import type {
  Attempt,
  Bundle,
  Continuation,
  DispatchDecision,
  Facts,
  Judgement,
  Policy,
  PriceSchedule,
  Receipt,
  Sealed,
  StreamEventKind,
  StreamEventStatus,
  StreamFacts,
  StreamViolation,
  Terminal,
  Usage,
} from "./types.js";

/** How the driver reads a provider event. */
export interface StreamReader<E> {
  /** The event's delta text (`""` for an event without text). */
  text(event: E): string;
  /** The provider's sequence number, when it numbers its events. */
  sequence?(event: E): number | undefined;
  /** The provider's response id, when the event names it. */
  responseId?(event: E): string | undefined;
  /** Whether this is the provider's terminal event (without `terminal`: the stream's normal end is). */
  terminal?(event: E): boolean;
  /**
   * The usage the event reports (units by kind), if any. Reports of one
   * attempt are merged by kind, a later count replacing an earlier one; with
   * a price schedule the attempt is charged the merged usage at its end.
   */
  usage?(event: E): Usage | undefined;
}

/** One planned attempt of a streamed run, as dispatch sees it. */
export interface StreamStep extends Step {
  /** The planned resumption of an earlier attempt's provider response, or `undefined` for a new response. */
  readonly continuation: Continuation | undefined;
}

/** The caller's streamed attempt: (a promise of) an async iterable of provider events. */
export type StreamDispatchFn<E> = (
  step: StreamStep,
  signal: AbortSignal,
) => Promise<AsyncIterable<E> | Iterable<E>> | AsyncIterable<E> | Iterable<E>;

export interface StreamRunOptions<E> extends RunHooks {
  /** The raw idempotency key; its digest must be the policy's `idempotency_key_sha256`. */
  idempotencyKey: string;
  /** The key's scope, when the policy's key digest is scoped. */
  keyScope?: { tenant: string; operation: string };
  /** Stops the run: between attempts (`stop_cancelled`) or during one (that attempt is cancelled). */
  signal?: AbortSignal;
  /** The run clock, ms since the run began (takes precedence over `clock`). */
  now?: () => number;
  /** Monotonic milliseconds (default `performance.now`); the run clock starts at its first reading. */
  clock?: () => number;
  /** Wait `ms` milliseconds, returning early when `signal` aborts (default: a timer); also the watchdog's timer. */
  sleep?: (ms: number, signal: AbortSignal | undefined) => Promise<void>;
  /** Wall clock in Unix ms, for HTTP-date Retry-After hints (default `Date.now`). */
  wallClock?: () => number;
  /** The caller's classify hook for errors raised by dispatch or the stream. */
  classify?: Classifier;
  /** Called with every attempt as the core recorded it, and the core's judgement of it. */
  onAttempt?: (attempt: Attempt, judgement: Judgement) => void;
  /** Prices per route release; with it the usage events the reader reports are charged. */
  priceSchedule?: Input<PriceSchedule>;
  /** How to read a provider event (default: the event is its text, the stream's end its terminal event). */
  reader?: StreamReader<E>;
  /** The fleet the run belongs to (required when the policy has a `fleet` section), as in `runWithPolicy`. */
  fleet?: Fleet;
  /** The tokens each attempt reserves under a token bucket, as in `runWithPolicy`. */
  reserveTokens?: number;
}

/** One event the consumer receives; the same as the run's event log, one to one. */
export interface StreamRunEvent<E> {
  readonly kind: StreamEventKind;
  readonly status: StreamEventStatus;
  /** The attempt's ordinal (a commit or invalidate: the last attempt of the chain it closes). */
  readonly attempt: number;
  /** Position in the consumer's stream, from 1. */
  readonly sequence: number;
  /** A delta: the provider event. */
  readonly data?: E;
  /** A delta: its text. */
  readonly text?: string;
}

/** A streamed run: iterate it once; afterwards it holds the sealed run. */
export interface StreamRun<E> extends AsyncIterable<StreamRunEvent<E>> {
  /** The sealed run, once the run ended (completed, stopped or abandoned by the consumer). */
  readonly sealed: Sealed | undefined;
  readonly bundle: Bundle | undefined;
  readonly receipt: Receipt | undefined;
  readonly terminal: Terminal | undefined;
}

/** A broken stream protocol the driver detected (`violation`); the attempt is a protocol violation. */
export class StreamProtocolError extends Error {
  readonly violation: StreamViolation;
  constructor(violation: StreamViolation, message?: string) {
    super(message ?? `stream protocol violation: ${violation}`);
    this.name = "StreamProtocolError";
    this.violation = violation;
  }
}

const MAX_TIMER_MS = 2_147_483_647;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
/** The core's bound on a run's event log. */
const MAX_STREAM_EVENTS = 100_000;

/** How the machine says to read one streamed attempt (the `stream` of its `dispatch` effect). */
interface StreamPlan {
  deliver: "live" | "buffer";
  hold_without_text: number;
  max_response_bytes: number;
  first_event_by_ms?: number;
  idle_timeout_ms?: number;
}

const textReader: StreamReader<unknown> = { text: (e) => (typeof e === "string" ? e : "") };

function validUsage(u: unknown): u is Usage {
  if (typeof u !== "object" || u === null) return false;
  for (const v of Object.values(u)) if (!Number.isSafeInteger(v) || (v as number) < 0) return false;
  return true;
}

/** One planned attempt of a streamed run: the driver's step and the planned continuation. */
class StreamAttemptStep extends AttemptStep implements StreamStep {
  readonly continuation: Continuation | undefined;

  constructor(decision: DispatchDecision, key: string, startedAt: number, reports: Reports, priced: boolean) {
    super(decision, key, startedAt, reports as unknown as Session, priced);
    this.continuation = decision.continuation;
  }
}

const FIRED: unique symbol = Symbol("fired");
type Fired = typeof FIRED;
type Stop = "timeout" | "cancelled" | "abandoned";

/** An attempt in flight: its abort controller, its watchdog and what fired. */
class InFlight {
  readonly controller = new AbortController();
  readonly watch = new AbortController();
  /** The watchdog's current timer, and when it is due. */
  nap: AbortController | undefined;
  napDue = Infinity;
  stop: Stop | undefined;
  /** Run-clock time of the last provider event (the attempt's start before the first). */
  lastAt: number;
  events = 0;
  readonly fired: Promise<Fired>;
  #wake!: (f: Fired) => void;
  /** The pending read's resolver: `fire` settles it, so a read the stream never answers is abandoned. */
  #reading: ((r: IteratorResult<unknown> | Fired) => void) | undefined;

  constructor(startedAt: number) {
    this.lastAt = startedAt;
    this.fired = new Promise<Fired>((resolve) => {
      this.#wake = resolve;
    });
  }

  fire(stop: Stop, reason: unknown): void {
    if (this.stop !== undefined) return;
    this.stop = stop;
    this.end();
    this.controller.abort(reason);
    this.#wake(FIRED);
    this.#reading?.(FIRED);
  }

  /** The stream's next event, or `FIRED` once the watchdog, the caller's signal or the consumer stopped the attempt. */
  read<E>(it: AsyncIterator<E>): Promise<IteratorResult<E> | Fired> {
    return new Promise<IteratorResult<E> | Fired>((resolve, reject) => {
      if (this.stop !== undefined) {
        resolve(FIRED);
        return;
      }
      this.#reading = resolve as (r: IteratorResult<unknown> | Fired) => void;
      it.next().then(resolve, reject);
    });
  }

  end(): void {
    this.watch.abort();
    this.nap?.abort();
  }
}

/** Close a provider iterator without waiting for it (it may never answer). */
function closeQuietly(it: AsyncIterator<unknown> | undefined): void {
  if (it === undefined || typeof it.return !== "function") return;
  try {
    const p = it.return() as unknown;
    if (typeof (p as Promise<unknown> | undefined)?.then === "function") (p as Promise<unknown>).then(undefined, () => undefined);
  } catch {
    // A stream that throws while closing is closed as far as the run is concerned.
  }
}

function timeoutReason(): Error {
  return new DOMException("the stream's time limit passed", "TimeoutError");
}

/** The error's type or code names the SDKs attach to in-stream error events (`error.type`, `error.error.type`). */
function errorTypeCodes(error: unknown, facts: Facts): void {
  if (typeof error !== "object" || error === null) return;
  try {
    const e = error as { type?: unknown; error?: { type?: unknown; error?: { type?: unknown } } };
    const names = [e.type, e.error?.type, e.error?.error?.type];
    for (const n of names) {
      if (typeof n !== "string" || n === "" || n.length > 128) continue;
      const codes = (facts.error_codes ??= []);
      if (!codes.includes(n) && codes.length < 32) codes.push(n);
    }
  } catch {
    // Properties that throw when read: nothing more to report.
  }
}

/**
 * Facts the core refuses (a response id that is not an identifier, a header
 * value it cannot decode) are replaced by the ones that are certain, so an
 * odd provider never breaks the run.
 */
function certainFacts(facts: Facts): Facts {
  try {
    judge(JSON.stringify(facts));
    return facts;
  } catch (e) {
    if (!(e instanceof DecodeError || e instanceof HttpError)) throw e;
  }
  const certain: Facts = { result: facts.result };
  if (facts.cancelled === true) certain.cancelled = true;
  if (facts.response_bytes_received === true) certain.response_bytes_received = true;
  if (facts.transport_error !== undefined) certain.transport_error = facts.transport_error;
  if (facts.stream !== undefined) {
    const { response_id: _, ...stream } = facts.stream;
    certain.stream = stream;
  }
  return certain;
}

const END: unique symbol = Symbol("end");

/**
 * The consumer's events between the loop and the consumer. `deliver` waits
 * until the consumer has taken the event and asked for the next one (the
 * provider stream is read no faster than that); `post` queues an event
 * without waiting. Once the consumer has left, events are dropped.
 */
class Outbox<E> {
  readonly #queue: StreamRunEvent<E>[] = [];
  #taker: ((ev: StreamRunEvent<E> | typeof END) => void) | undefined;
  #waiter: (() => void) | undefined;
  #ended = false;
  left = false;
  /** Events of the consumer's stream so far (the log's length). */
  sequence = 0;

  post(ev: Omit<StreamRunEvent<E>, "sequence">): void {
    if (this.left) return;
    const full = { ...ev, sequence: ++this.sequence } as StreamRunEvent<E>;
    const taker = this.#taker;
    this.#taker = undefined;
    if (taker !== undefined) taker(full);
    else this.#queue.push(full);
  }

  deliver(ev: Omit<StreamRunEvent<E>, "sequence">): Promise<void> {
    this.post(ev);
    if (this.left) return Promise.resolve();
    return new Promise((resolve) => (this.#waiter = resolve));
  }

  /** The consumer asks for its next event (`END` once the run ended and every event was taken). */
  take(): Promise<StreamRunEvent<E> | typeof END> {
    const waiter = this.#waiter;
    this.#waiter = undefined;
    waiter?.();
    const ev = this.#queue.shift();
    if (ev !== undefined) return Promise.resolve(ev);
    if (this.#ended) return Promise.resolve(END);
    return new Promise((resolve) => (this.#taker = resolve));
  }

  /** The run ended: the consumer takes what is queued, then `END`. */
  end(): void {
    this.#ended = true;
    const taker = this.#taker;
    this.#taker = undefined;
    taker?.(this.#queue.shift() ?? END);
  }

  /** The consumer stopped reading: nothing more is queued, no delivery waits. */
  leave(): void {
    this.left = true;
    this.#queue.length = 0;
    const waiter = this.#waiter;
    this.#waiter = undefined;
    waiter?.();
  }
}

/** What one streamed attempt read: the observation's facts and delta texts. */
interface Read {
  facts: Facts;
  deltas: string[];
  usage: Usage | undefined;
}

/**
 * A streamed run as the host loop's adapter: each `dispatch` opens the
 * caller's stream and reads it under the machine's stream plan, delivering
 * the consumer's events as it goes; after each observation the core's
 * judgement says whether the pending output is committed or invalidated.
 */
class Streamed<E> implements LoopAdapter<Read> {
  readonly outbox = new Outbox<E>();
  #now: () => number;
  #last = 0;
  #current: InFlight | undefined;
  #step: StreamAttemptStep | undefined;
  #reports: Reports | undefined;
  /** Buffered events of the attempt read last, delivered with its commit. */
  #buffered: { data: E; text: string }[] = [];
  lastError: unknown;
  lastRule: unknown;
  cancelledByCaller = false;
  readonly #reader: StreamReader<E>;
  readonly #onAttempt: ((attempt: Record<string, unknown>, judgement: Record<string, unknown>) => void) | undefined;

  constructor(
    readonly key: string,
    readonly send: StreamDispatchFn<E>,
    readonly options: StreamRunOptions<E>,
    readonly schedule: string | undefined,
  ) {
    this.#now = options.now ?? this.#fromClock();
    this.#reader = (options.reader ?? textReader) as StreamReader<E>;
    const fleet = options.fleet;
    if (fleet !== undefined) {
      this.read = (keys: string[]): Promise<StoreRowDoc[]> => storeRead(fleet.store, fleet.namespace, keys);
      this.write = (writes: CasDoc[]): Promise<number> => storeWrite(fleet.store, fleet.namespace, writes);
    }
    const { onAttempt, onDecision, onSleep, onTerminal } = loopHooks(options);
    this.#onAttempt = onAttempt;
    if (onTerminal !== undefined) this.onTerminal = onTerminal;
    if (onDecision !== undefined || onSleep !== undefined) {
      // A dispatch is announced once: before the wait for it, when there is one.
      const announce = (d: Record<string, unknown>): void => {
        if (d["kind"] === "dispatch") {
          if (d["ordinal"] === this.#announced) return;
          this.#announced = d["ordinal"] as number;
        }
        onDecision?.(d);
      };
      this.onDecision = announce;
      this.onSleep = (s) => {
        if (s.dispatch !== undefined) announce({ ...s.dispatch, kind: "dispatch" });
        onSleep?.(s);
      };
    }
    options.signal?.addEventListener("abort", this.#onAbort);
  }

  #announced = 0;
  /** The model the attempt in flight asked for and the one the provider reported. */
  #model: Record<string, string> | undefined;

  #fromClock(): () => number {
    const clock = this.options.clock ?? ((): number => performance.now());
    const t0 = clock();
    return () => clock() - t0;
  }

  /** The run begins (its first iteration): the run clock starts at 0. */
  begin(): void {
    if (this.options.now === undefined) this.#now = this.#fromClock();
  }
  onDecision?: (decision: Record<string, unknown>) => void;
  onSleep?: (sleep: LoopSleep) => void;
  onTerminal?: (receipt: Receipt) => void;
  /** A policy bound from a template: each SDK call is checked against its request (`request_drift`). */
  checker: Session | undefined;

  read?: (keys: string[]) => Promise<StoreRowDoc[]>;
  write?: (writes: CasDoc[]) => Promise<number>;

  readonly #onAbort = (): void => this.#current?.fire("cancelled", this.options.signal?.reason);

  nowMs(): number {
    const t = Math.floor(this.#now());
    if (t > this.#last && t <= Number.MAX_SAFE_INTEGER) this.#last = t;
    return this.#last;
  }

  /** The caller's signal aborted, or the consumer left. */
  cancelled(): boolean {
    if (this.options.signal?.aborted === true) this.cancelledByCaller = true;
    return this.cancelledByCaller || this.outbox.left;
  }

  cancelledBeforeSend(): boolean {
    return this.cancelled();
  }

  sleep(ms: number, wake?: AbortSignal): Promise<void> {
    const sleep = this.options.sleep ?? sleepFor;
    return sleep(ms, wake ?? this.options.signal);
  }

  /** The consumer stopped reading: the attempt in flight is cancelled. */
  leave(): void {
    this.outbox.leave();
    this.#current?.fire("abandoned", new DOMException("the consumer stopped reading", "AbortError"));
  }

  done(): void {
    this.options.signal?.removeEventListener("abort", this.#onAbort);
    this.checker?.free();
  }

  onAttempt(attempt: Record<string, unknown>, judgement: Record<string, unknown>): void {
    this.lastRule = judgement["rule"];
    this.#onAttempt?.(attempt, judgement);
    const ordinal = attempt["ordinal"] as number;
    switch (judgement["stream"]) {
      case "commit":
        for (const b of this.#buffered) this.outbox.post({ kind: "delta", status: "committed", attempt: ordinal, data: b.data, text: b.text });
        this.outbox.post({ kind: "commit", status: "committed", attempt: ordinal });
        break;
      case "invalidate":
        this.outbox.post({ kind: "invalidate", status: "invalidated", attempt: ordinal });
        break;
      default:
    }
    this.#buffered = [];
  }

  /** The watchdog of one attempt: one timer at a time, re-armed from the last event when it wakes early. */
  async #watch(f: InFlight, plan: StreamPlan, deadline: number): Promise<void> {
    const ws = f.watch.signal;
    const idle = plan.idle_timeout_ms;
    while (!ws.aborted) {
      const due = f.events === 0 ? (plan.first_event_by_ms ?? deadline) : idle === undefined ? deadline : Math.min(deadline, f.lastAt + idle);
      const t = this.nowMs();
      if (t >= due) {
        f.fire("timeout", timeoutReason());
        return;
      }
      const nap = new AbortController();
      f.nap = nap;
      f.napDue = due;
      await (this.options.sleep ?? sleepFor)(Math.min(due - t, MAX_TIMER_MS), nap.signal);
    }
  }

  async dispatch(effect: DispatchEffect): Promise<Read> {
    const plan = effect["stream"] as StreamPlan;
    const decision = { ...effect.dispatch, kind: "dispatch" } as unknown as DispatchDecision;
    const startedAt = effect.started_at_ms;
    const reports = new Reports(this.schedule, decision.route_release_sha256);
    const checker = this.checker;
    if (checker !== undefined) {
      Object.assign(reports, {
        checkSent: (path: string, body: string | Uint8Array): void => checker.checkSent(path, body),
        // The core checks the names (a served name it does not take throws, and is left unknown).
        setModel: (requested: string | undefined, served: string | undefined): void => {
          checker.setModel(requested, served);
          const model: Record<string, string> = {};
          if (requested !== undefined) model["requested"] = requested;
          if (served !== undefined) model["served"] = served;
          this.#model = model;
        },
      });
    }
    this.#model = undefined;
    const step = new StreamAttemptStep(decision, this.key, startedAt, reports, this.schedule !== undefined);
    this.#step = step;
    this.#reports = reports;
    const ordinal = step.ordinal;
    const cont = step.continuation;
    const live = plan.deliver === "live";
    const maxBytes = plan.max_response_bytes;
    const reader = this.#reader;
    const readSequence = reader.sequence?.bind(reader);
    const readResponseId = reader.responseId?.bind(reader);
    const readTerminal = reader.terminal?.bind(reader);
    const readUsage = reader.usage?.bind(reader);
    const outbox = this.outbox;

    const f = new InFlight(startedAt);
    this.#current = f;
    if (this.options.signal?.aborted === true) f.fire("cancelled", this.options.signal.reason);
    else void this.#watch(f, plan, decision.deadline_ms);

    const texts: string[] = [];
    // Events without text held back (as the plan says) until the first text.
    const held: E[] = [];
    let holding = plan.hold_without_text > 0;
    let bytes = 0;
    let lastSeq: number | undefined;
    let deliveredSeq: number | undefined;
    let responseId: string | undefined;
    let terminal = false;
    let usageSeen = false;
    let lastUsage: Usage | undefined;
    let violation: StreamViolation | undefined;
    let opened = false;
    let ended = false;
    let raised = false;
    let error: unknown;
    let it: AsyncIterator<E> | undefined;
    const release = async (): Promise<void> => {
      holding = false;
      for (const h of held) {
        texts.push("");
        await outbox.deliver({ kind: "delta", status: "tentative", attempt: ordinal, data: h, text: "" });
      }
      held.length = 0;
    };

    try {
      let src = this.send(step, f.controller.signal) as unknown;
      if (typeof (src as Promise<unknown> | null)?.then === "function") {
        const p = src as Promise<unknown>;
        src = await Promise.race([p, f.fired]);
        // A stream that opens after the attempt ended is closed at once.
        if (src === FIRED) p.then((late) => closeQuietly(iteratorOf(late)), () => undefined);
      }
      if (src !== FIRED) {
        it = iteratorOf(src);
        if (it === undefined) throw new TypeError("dispatch must return an async iterable of provider events");
        opened = true;
        for (;;) {
          const r = await f.read(it);
          if (r === FIRED || f.stop !== undefined) break;
          if (r.done === true) {
            ended = true;
            break;
          }
          const at = this.nowMs();
          f.lastAt = at;
          // The first event switches from the first-event limit to the idle
          // limit: re-arm the timer when the idle limit ends sooner.
          const idle = plan.idle_timeout_ms;
          if (f.events++ === 0 && idle !== undefined && at + idle < f.napDue) f.nap?.abort();
          const ev = r.value;
          const raw: unknown = reader.text(ev);
          const text = typeof raw === "string" ? raw : "";
          const n = text.length === 0 ? 0 : utf8Length(text);
          if (n > maxBytes) {
            violation = "event_too_large";
            break;
          }
          if (bytes + n > maxBytes || texts.length + held.length >= MAX_STREAM_EVENTS) {
            violation = "response_too_large";
            break;
          }
          if (readSequence !== undefined) {
            const s = readSequence(ev);
            if (s !== undefined) {
              if (lastSeq === undefined) {
                if (cont !== undefined && s !== cont.starting_after + 1) {
                  violation = "sequence_gap";
                  break;
                }
              } else if (!(s > lastSeq)) {
                violation = "sequence_back";
                break;
              }
              if (!Number.isSafeInteger(s) || s < 0) {
                violation = "malformed_event";
                break;
              }
              lastSeq = s;
            }
          }
          if (readUsage !== undefined) {
            const u = readUsage(ev);
            if (u !== undefined) {
              if (!validUsage(u)) {
                violation = "impossible_usage";
                break;
              }
              usageSeen = true;
              // Reports add up by kind, a later count of a kind replacing an earlier one (counts are cumulative).
              lastUsage = lastUsage === undefined ? u : { ...lastUsage, ...u };
            }
          }
          if (readResponseId !== undefined && responseId === undefined) {
            const id = readResponseId(ev);
            if (typeof id === "string" && id !== "") responseId = id;
          }
          if (readTerminal !== undefined && readTerminal(ev) === true) terminal = true;
          if (holding) {
            if (text === "" && held.length < plan.hold_without_text) {
              held.push(ev);
              continue;
            }
            await release();
          }
          texts.push(text);
          bytes += n;
          deliveredSeq = lastSeq;
          if (live) await outbox.deliver({ kind: "delta", status: "tentative", attempt: ordinal, data: ev, text });
          else this.#buffered.push({ data: ev, text });
        }
        // A whole response without any text: its held events are its output.
        if (ended && (terminal || readTerminal === undefined) && held.length > 0) {
          await release();
          deliveredSeq = lastSeq;
        }
      }
    } catch (e) {
      raised = true;
      error = e;
    }
    f.end();
    this.#current = undefined;
    const stop = f.stop;
    // A timeout after the terminal event: the response is whole, close the stream.
    const late = stop === "timeout" && terminal;
    if (stop !== undefined || violation !== undefined || raised) {
      f.controller.abort(stop === undefined ? new DOMException("the stream was closed", "AbortError") : undefined);
      closeQuietly(it);
    }
    if (raised && opened && violation === undefined && error instanceof SyntaxError) violation = "malformed_event";
    if (ended && readTerminal === undefined) terminal = true;

    let facts: Facts;
    if (violation !== undefined) {
      error = new StreamProtocolError(violation);
      facts = factsOf(error);
    } else if (stop === "cancelled" || stop === "abandoned") {
      if (stop === "cancelled") this.cancelledByCaller = true;
      facts = factsOf(error, { cancelled: true, outputDelivered: step.delivered });
    } else if (stop === "timeout" && !late) {
      error = timeoutReason();
      facts = { result: "raised", transport_error: "timeout" };
    } else if (raised) {
      const aborted = this.options.signal?.aborted === true;
      if (aborted) this.cancelledByCaller = true;
      const wall = this.options.wallClock ?? Date.now;
      facts = factsOf(error, { classify: this.options.classify, outputDelivered: step.delivered, cancelled: aborted, nowUnixMs: wall() });
      errorTypeCodes(error, facts);
    } else {
      facts = { result: "returned" };
      error = undefined;
    }
    if (opened) {
      const s: StreamFacts = { bytes, events: texts.length, terminal_event: terminal, usage_event: usageSeen };
      if (deliveredSeq !== undefined) s.last_sequence = deliveredSeq;
      if (responseId !== undefined) s.response_id = responseId;
      if (violation !== undefined) s.violation = violation;
      facts.stream = s;
    }
    this.lastError = error;
    return { facts: certainFacts(facts), deltas: texts, usage: lastUsage };
  }

  observation(_effect: DispatchEffect, _ok: boolean, reply: unknown): Record<string, unknown> {
    const step = this.#step as StreamAttemptStep;
    const reports = this.#reports as Reports;
    // A call the attempt refused to send (`request_drift`) ends the run, whatever the SDK wrapped it in.
    if (this.checker?.refused !== undefined) throw this.checker.refused;
    const { facts, deltas, usage } = reply as Read;
    if (usage !== undefined && this.schedule !== undefined) {
      try {
        reports.addUsage(usage);
      } catch {
        // Usage the schedule cannot price is not charged: the reserve stands.
      }
    }
    // The stream's usage settles the attempt's token reservation (admission limits).
    if (usage !== undefined && step.tokens === undefined) {
      let total = 0;
      for (const v of Object.values(usage)) if (Number.isSafeInteger(v) && v > 0) total += v;
      if (Number.isSafeInteger(total)) step.tokensUsed(total);
    }
    step.open = false;
    const fields: Record<string, unknown> = { facts };
    // A lone surrogate (a pair split between two events) is U+FFFD in the record, as its UTF-8 is.
    if (deltas.length > 0) fields["deltas"] = deltas.map((t) => t.replace(LONE_SURROGATE, "\ufffd"));
    if (step.charged !== undefined) fields["cost"] = step.charged;
    if (step.tokens !== undefined) fields["used_tokens"] = step.tokens;
    if (this.#model !== undefined) fields["model"] = this.#model;
    return reports.fields(fields);
  }
}

class Run<E> implements StreamRun<E> {
  sealed: Sealed | undefined;
  #iter: AsyncGenerator<StreamRunEvent<E>> | undefined;

  constructor(iter: AsyncGenerator<StreamRunEvent<E>>) {
    this.#iter = iter;
  }

  [Symbol.asyncIterator](): AsyncGenerator<StreamRunEvent<E>> {
    const it = this.#iter;
    if (it === undefined) throw new TypeError("a stream run is iterated once");
    this.#iter = undefined;
    return it;
  }

  get bundle(): Bundle | undefined {
    return this.sealed?.bundle;
  }

  get receipt(): Receipt | undefined {
    return this.sealed?.receipt;
  }

  get terminal(): Terminal | undefined {
    return this.sealed?.terminal;
  }
}

/**
 * Run one logical request whose dispatch streams, under a policy with a
 * `stream` section. Returns at once an async iterable of the consumer's
 * events; iterating it runs the request. When the run does not complete, the
 * iteration throws (after yielding the `invalidate` of any pending output)
 * the same errors as `runWithPolicy`: `RunStoppedError`,
 * `UnrecognizedDispatchError`, `RunCancelledError`, each carrying the sealed
 * run. A bad policy, a policy without `stream`, a key that is not the
 * policy's or a price schedule that does not fit throw from `runStream`
 * itself, before any dispatch. A consumer that stops iterating early closes
 * the provider stream; the in-flight attempt is recorded as cancelled and the
 * run is sealed (`.sealed`).
 */
export function runStream<E = string>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: StreamDispatchFn<E>,
  options: StreamRunOptions<E>,
): StreamRun<E> {
  if (typeof dispatch !== "function") throw new TypeError("dispatch must be a function");
  const compiled = compiledOf(policy);
  // A streamed run needs a stream section: the core's rule (invalid_stream_contract otherwise).
  compiled.requireDriver("stream");
  const key = checkedKey(compiled, options?.idempotencyKey, options?.keyScope);
  checkFleet(compiled, options.fleet);
  let schedule: string | undefined;
  if (options.priceSchedule !== undefined) {
    schedule = toText(options.priceSchedule);
    checkPriceSchedule(compiled.policy, schedule);
  }
  const adapter = new Streamed(key, dispatch, options, schedule);
  adapter.checker = compiled.session();
  const fleet = options.fleet;
  const wall = fleet !== undefined ? () => fleet.now() : (options.wallClock ?? Date.now);
  const machineOptions: MachineOptions = { origin_epoch_ms: Math.max(0, Math.floor(wall()) - adapter.nowMs()), stream: true };
  // The caller's run clock (ms since admission) is not re-zeroed: the machine starts at its reading.
  if (options.now !== undefined) machineOptions.now_ms = adapter.nowMs();
  if (schedule !== undefined) machineOptions.price_schedule = JSON.parse(schedule) as object;
  const reserve = options.reserveTokens ?? fleet?.reserveTokens;
  if (reserve !== undefined) machineOptions.reserve_tokens = reserve;
  if (fleet !== undefined) machineOptions.max_conflicts = fleet.maxConflicts;
  // The core refuses a policy without a stream contract here, before any dispatch.
  const machine = Machine.start(compiled, machineOptions);
  const run: Run<E> = new Run<E>(events(compiled, machine, adapter, (s) => (run.sealed = s)));
  return run;
}

async function* events<E>(compiled: CompiledPolicy, machine: Machine, adapter: Streamed<E>, setSealed: (s: Sealed) => void): AsyncGenerator<StreamRunEvent<E>> {
  const outbox = adapter.outbox;
  adapter.begin();
  let sealed: Sealed | undefined;
  let failure: { error: unknown } | undefined;
  const running = runLoop(machine, adapter).then(
    (r) => {
      // One decoded policy serves every run of a compiled policy (as the plain driver's bundles).
      r.bundle.policy = compiled.policy;
      sealed = { terminal: r.terminal as Terminal, receipt: r.receipt, receipt_sha256: r.receipt_sha256, bundle: r.bundle, bundle_json: r.bundle_json };
      setSealed(sealed);
      // What the core logged past the events delivered (a cancellation's invalidate).
      for (const e of r.bundle.stream_events ?? []) {
        if (e.sequence > outbox.sequence) outbox.post({ kind: e.kind, status: e.status, attempt: e.attempt_ordinal });
      }
    },
    (e: unknown) => {
      failure = { error: e };
    },
  );
  const finished = running.finally(() => {
    adapter.done();
    machine.free();
    outbox.end();
  });
  let completed = false;
  try {
    for (;;) {
      const ev = await outbox.take();
      if (ev === END) break;
      yield ev;
    }
    completed = true;
  } finally {
    // The consumer left (break, return) or something threw: the attempt in flight is cancelled and the run sealed.
    if (!completed) adapter.leave();
    await finished;
  }
  if (failure !== undefined) throw failure.error;
  const done = sealed as Sealed;
  const terminal = done.terminal;
  if (terminal === "completed") return;
  const n = done.receipt.attempt_count;
  const lastError = adapter.lastError;
  const because = lastError === undefined ? "" : `; last error: ${errorText(lastError)}`;
  const message = `run stopped with ${terminal} after ${n} attempt${n === 1 ? "" : "s"}${because}`;
  if (adapter.cancelledByCaller) throw new RunCancelledError(message, { sealed: done, cause: adapter.options.signal?.reason });
  if (adapter.lastRule === "unrecognized") throw new UnrecognizedDispatchError(message, { sealed: done, cause: lastError });
  throw new RunStoppedError(message, { sealed: done, cause: lastError });
}

function iteratorOf<E>(src: unknown): AsyncIterator<E> | undefined {
  if (typeof src !== "object" || src === null) return undefined;
  const a = (src as { [Symbol.asyncIterator]?: unknown })[Symbol.asyncIterator];
  if (typeof a === "function") return (a as () => AsyncIterator<E>).call(src);
  const s = (src as { [Symbol.iterator]?: unknown })[Symbol.iterator];
  if (typeof s === "function") {
    const sync = (s as () => Iterator<E>).call(src);
    return {
      next: () => Promise.resolve(sync.next()),
      return: () => Promise.resolve(sync.return?.() ?? { done: true, value: undefined }),
    };
  }
  return undefined;
}

function errorText(e: unknown): string {
  const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}
