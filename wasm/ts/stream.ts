/**
 * `runStream`: `runWithPolicy` for a dispatch that returns a stream of
 * provider events (docs/STREAMING.md).
 *
 * The driver asks the Session for the next decision, waits until
 * `not_before_ms`, calls `dispatch(step, signal)` for an async iterable of
 * provider events, reads each event with the `reader` (its text, sequence
 * number, response id, terminal flag and usage), detects protocol violations
 * and timeouts itself, and has the Session judge the attempt with its stream
 * facts and delta texts. The consumer iterates the run and receives exactly
 * the events of the run's event log (`retryledger.stream_event.v1`), in
 * order: `delta` events (tentative as they arrive in the live modes,
 * committed after the commit decision under `buffer`), one `commit` when the
 * run completes, an `invalidate` whenever pending output is void.
 *
 * Timeouts use one lazy watchdog per attempt: a single timer (the injected
 * `sleep`) armed for the earliest limit (first byte, idle since the last
 * event, the run's deadline) and re-armed from the last event's time when it
 * wakes early; each event only records its arrival time. On expiry the
 * dispatch's AbortSignal fires, the provider stream is closed without
 * waiting for it, and the pending read is abandoned, so a stream that ignores
 * the signal cannot hang the run.
 */

import { CompiledPolicy, compiledOf, checkPriceSchedule, toText, utf8Length, type Input } from "./core.js";
import { factsOf, type Classifier } from "./facts.js";
import { AttemptStep, checkedKey, checkFleet, type Step } from "./driver.js";
import type { Fleet } from "./fleet.js";
import {
  DecodeError,
  HttpError,
  RunCancelledError,
  RunStoppedError,
  UnrecognizedDispatchError,
} from "./errors.js";
import { sealAndRelease, type Session } from "./session.js";
import { callHook, copied, plannedSleep, type RunHooks } from "./hooks.js";
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

const MAX_SAFE = Number.MAX_SAFE_INTEGER;
const MAX_TIMER_MS = 2_147_483_647;
/** The core's bound on a run's event log. */
const MAX_STREAM_EVENTS = 100_000;

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

const textReader: StreamReader<unknown> = { text: (e) => (typeof e === "string" ? e : "") };

function validUsage(u: unknown): u is Usage {
  if (typeof u !== "object" || u === null) return false;
  for (const v of Object.values(u)) if (!Number.isSafeInteger(v) || (v as number) < 0) return false;
  return true;
}

/** One planned attempt of a streamed run: the driver's step and the planned continuation. */
class StreamAttemptStep extends AttemptStep implements StreamStep {
  readonly continuation: Continuation | undefined;

  constructor(decision: DispatchDecision, key: string, startedAt: number, session: Session, priced: boolean) {
    super(decision, key, startedAt, session, priced);
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

  /**
   * The stream's next event, or `FIRED` once the attempt's watchdog or the
   * caller's signal fired (one promise per read; nothing accumulates on
   * `fired`).
   */
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
  const run: Run<E> = new Run<E>(drive(compiled, dispatch, options, key, schedule, (s) => (run.sealed = s)));
  return run;
}

async function* drive<E>(
  compiled: CompiledPolicy,
  dispatch: StreamDispatchFn<E>,
  options: StreamRunOptions<E>,
  key: string,
  schedule: string | undefined,
  setSealed: (s: Sealed) => void,
): AsyncGenerator<StreamRunEvent<E>> {
  const contract = compiled.policy.stream!;
  const live = contract.mode !== "buffer";
  const maxBytes = contract.max_response_bytes;
  const firstByteMs = contract.first_byte_timeout_ms;
  const idleMs = contract.idle_timeout_ms;
  const deadlineMs = compiled.policy.deadline_ms;
  const reader = (options.reader ?? textReader) as StreamReader<E>;
  const readText = reader.text.bind(reader);
  const readSequence = reader.sequence?.bind(reader);
  const readResponseId = reader.responseId?.bind(reader);
  const readTerminal = reader.terminal?.bind(reader);
  const readUsage = reader.usage?.bind(reader);
  const clock = options.clock ?? defaultClock;
  const sleep = options.sleep ?? defaultSleep;
  const wallClock = options.wallClock ?? Date.now;
  const classify = options.classify;
  const onAttempt = options.onAttempt;
  const { onDecision, onSleep, onTerminal } = options;
  const signal = options.signal;
  const fleet = options.fleet;

  const t0 = clock();
  let last = 0;
  const now = (): number => {
    const t = Math.floor(clock() - t0);
    if (t > last && t <= MAX_SAFE) last = t;
    return last;
  };

  let current: InFlight | undefined;
  const onAbort = (): void => current?.fire("cancelled", signal?.reason);
  signal?.addEventListener("abort", onAbort);

  /** The watchdog of one attempt: one timer at a time, re-armed from the last event when it wakes early. */
  const watch = async (f: InFlight): Promise<void> => {
    const ws = f.watch.signal;
    while (!ws.aborted) {
      const limit = f.events === 0 ? firstByteMs : idleMs;
      const due = limit === undefined ? deadlineMs : Math.min(deadlineMs, f.lastAt + limit);
      const t = now();
      if (t >= due) {
        f.fire("timeout", timeoutReason());
        return;
      }
      const nap = new AbortController();
      f.nap = nap;
      f.napDue = due;
      await sleep(Math.min(due - t, MAX_TIMER_MS), nap.signal);
    }
  };

  const session: Session = compiled.session();
  if (schedule !== undefined) session.setPriceSchedule(schedule);
  let sequence = 0; // events yielded (the log's length)
  let pending = 0; // live deltas neither committed nor invalidated
  let lastOrdinal = 0;
  let lastError: unknown;
  let lastRule: string | undefined;
  let cancelled = false;
  let cancelReason: unknown;
  let sealed: Sealed | undefined;
  let finished = false;
  let failed = false;
  // The attempt in flight, for a consumer that leaves mid-attempt.
  let flight: { step: StreamAttemptStep; it: AsyncIterator<E> | undefined; facts: () => StreamFacts | undefined; texts: string[]; lens: number[] } | undefined;

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
      let slotHeld = false;
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
        slotHeld = answer.wait_until_epoch_ms === undefined;
        decision = session.next() as DispatchDecision;
        notBefore = decision.not_before_ms;
        t = now();
        while (t < notBefore && !signal?.aborted) {
          await sleep(notBefore - t, signal);
          t = now();
        }
      }
      if (signal?.aborted) {
        cancelled = true;
        cancelReason = signal.reason;
        // Admitted and never dispatched: its admission slot is released.
        if (fleet !== undefined && slotHeld) await fleet.release(session, decision.route_release_sha256).catch(() => undefined);
        session.cancel(now());
        if (pending > 0) {
          pending = 0;
          yield { kind: "invalidate", status: "invalidated", attempt: lastOrdinal, sequence: ++sequence };
        }
        continue;
      }

      const startedAt = t;
      const step = new StreamAttemptStep(decision, key, startedAt, session, schedule !== undefined);
      const ordinal = step.ordinal;
      lastOrdinal = ordinal;
      const cont = step.continuation;
      const f = new InFlight(startedAt);
      current = f;
      if (signal?.aborted) f.fire("cancelled", signal.reason);
      else void watch(f);

      const texts: string[] = [];
      const lens: number[] = []; // each text's UTF-8 bytes, counted once
      const buffered: E[] = [];
      // Live, a fresh attempt holds its events without text (a role chunk,
      // `response.created`, `message_start`) until its first event with text:
      // a stream cut before any output then reaches the consumer not at all.
      const held: E[] = [];
      let holding = live && cont === undefined;
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
      const streamFacts = (): StreamFacts | undefined => {
        if (!opened) return undefined;
        const s: StreamFacts = { bytes, events: texts.length, terminal_event: terminal, usage_event: usageSeen };
        if (deliveredSeq !== undefined) s.last_sequence = deliveredSeq;
        if (responseId !== undefined) s.response_id = responseId;
        if (violation !== undefined) s.violation = violation;
        return s;
      };
      flight = { step, it: undefined, facts: streamFacts, texts, lens };

      try {
        let src = dispatch(step, f.controller.signal) as unknown;
        if (typeof (src as Promise<unknown> | null)?.then === "function") {
          const p = src as Promise<unknown>;
          src = await Promise.race([p, f.fired]);
          if (src === FIRED) {
            // A stream that opens after the attempt ended is closed at once.
            p.then((late) => closeQuietly(iteratorOf(late)), () => undefined);
          }
        }
        if (src !== FIRED) {
          it = iteratorOf(src);
          if (it === undefined) throw new TypeError("dispatch must return an async iterable of provider events");
          flight.it = it;
          opened = true;
          for (;;) {
            const r = await f.read(it);
            if (r === FIRED || f.stop !== undefined) break;
            if (r.done === true) {
              ended = true;
              break;
            }
            const at = now();
            f.lastAt = at;
            // The first event switches from the first-byte limit to the idle
            // limit: re-arm the timer when the idle limit ends sooner.
            if (f.events++ === 0 && idleMs !== undefined && at + idleMs < f.napDue) f.nap?.abort();
            const ev = r.value;
            const raw: unknown = readText(ev);
            const text = typeof raw === "string" ? raw : "";
            const n = text.length === 0 ? 0 : utf8Length(text);
            if (n > maxBytes) {
              violation = "event_too_large";
              break;
            }
            if (bytes + n > maxBytes || texts.length >= MAX_STREAM_EVENTS) {
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
            if (holding && text === "") {
              held.push(ev);
              continue;
            }
            if (holding) {
              holding = false;
              for (const h of held) {
                texts.push("");
                lens.push(0);
                pending++;
                yield { kind: "delta", status: "tentative", attempt: ordinal, sequence: ++sequence, data: h, text: "" };
              }
              held.length = 0;
            }
            texts.push(text);
            lens.push(n);
            bytes += n;
            deliveredSeq = lastSeq;
            if (live) {
              pending++;
              yield { kind: "delta", status: "tentative", attempt: ordinal, sequence: ++sequence, data: ev, text };
            } else {
              buffered.push(ev);
            }
          }
          // A whole response without any text: its held events are its output.
          if (ended && (terminal || readTerminal === undefined) && held.length > 0) {
            for (const h of held) {
              texts.push("");
              lens.push(0);
              pending++;
              yield { kind: "delta", status: "tentative", attempt: ordinal, sequence: ++sequence, data: h, text: "" };
            }
            held.length = 0;
            deliveredSeq = lastSeq;
          }
        }
      } catch (e) {
        raised = true;
        error = e;
      }
      f.end();
      current = undefined;
      flight = undefined;
      const stop = f.stop;
      // A timeout after the terminal event: the response is whole, close the stream.
      const late = stop === "timeout" && terminal;
      if (stop !== undefined || violation !== undefined || raised) {
        f.controller.abort(stop === undefined ? new DOMException("the stream was closed", "AbortError") : undefined);
        closeQuietly(it);
      }
      if (raised && opened && violation === undefined && error instanceof SyntaxError) violation = "malformed_event";
      if (ended && readTerminal === undefined) terminal = true;
      if (lastUsage !== undefined && schedule !== undefined) {
        try {
          step.usage(lastUsage);
        } catch {
          // Usage the schedule cannot price is not charged: the reserve stands.
        }
      }
      // The stream's usage settles the attempt's token reservation (admission limits).
      if (lastUsage !== undefined && step.tokens === undefined) {
        let total = 0;
        for (const v of Object.values(lastUsage)) if (Number.isSafeInteger(v) && v > 0) total += v;
        if (Number.isSafeInteger(total)) step.tokensUsed(total);
      }
      step.open = false;
      const completedAt = now();

      let facts: Facts;
      if (violation !== undefined) {
        error = new StreamProtocolError(violation);
        facts = factsOf(error);
      } else if (stop === "cancelled") {
        cancelled = true;
        cancelReason = signal?.reason;
        facts = factsOf(error, { cancelled: true, outputDelivered: step.delivered });
      } else if (stop === "timeout" && !late) {
        error = timeoutReason();
        facts = { result: "raised", transport_error: "timeout" };
      } else if (raised) {
        const aborted = signal?.aborted === true;
        if (aborted) {
          cancelled = true;
          cancelReason = signal?.reason;
        }
        facts = factsOf(error, { classify, outputDelivered: step.delivered, cancelled: aborted, nowUnixMs: wallClock() });
        errorTypeCodes(error, facts);
      } else {
        facts = { result: "returned" };
        error = undefined;
      }
      const sf = streamFacts();
      if (sf !== undefined) facts.stream = sf;
      lastError = error;
      const judgement = observe(session, startedAt, completedAt, step.charged, facts, texts, lens);
      lastRule = judgement.rule;
      if (fleet !== undefined) await fleet.record(session, step.routeReleaseSha256, step.tokens, step.rateLimits);
      if (onAttempt !== undefined) callHook("onAttempt", onAttempt, session.lastAttempt() as Attempt, copied(judgement));

      switch (judgement.stream) {
        case "commit":
          pending = 0;
          for (let i = 0; i < buffered.length; i++) {
            yield { kind: "delta", status: "committed", attempt: ordinal, sequence: ++sequence, data: buffered[i] as E, text: texts[i] as string };
          }
          buffered.length = 0;
          yield { kind: "commit", status: "committed", attempt: ordinal, sequence: ++sequence };
          break;
        case "invalidate":
          pending = 0;
          yield { kind: "invalidate", status: "invalidated", attempt: ordinal, sequence: ++sequence };
          break;
        case "continue":
          break;
        default:
          pending = 0;
      }
    }
    sealed = sealAndRelease(session);
    setSealed(sealed);
    finished = true;
    if (onTerminal !== undefined) callHook("onTerminal", onTerminal, copied(sealed.receipt));
  } catch (e) {
    failed = true;
    throw e;
  } finally {
    signal?.removeEventListener("abort", onAbort);
    const f = current;
    current = undefined;
    if (!finished) {
      // The consumer left (break, return) or something threw: close the
      // provider stream, record the in-flight attempt as cancelled, seal.
      if (f !== undefined) {
        f.fire("abandoned", new DOMException("the consumer stopped reading", "AbortError"));
        closeQuietly(flight?.it);
      }
      if (!failed) {
        try {
          if (flight !== undefined) {
            flight.step.open = false;
            const facts: Facts = { result: "raised", cancelled: true };
            const sf = flight.facts();
            if (sf !== undefined) facts.stream = sf;
            observe(session, flight.step.startedAtMs, now(), flight.step.charged, facts, flight.texts, flight.lens);
            // Its breaker too: a half-open probe left unrecorded would hold its place.
            if (fleet !== undefined) await fleet.record(session, flight.step.routeReleaseSha256, flight.step.tokens, flight.step.rateLimits).catch(() => undefined);
          }
          if (session.terminal === null) session.cancel(now());
          sealed = sealAndRelease(session);
          setSealed(sealed);
          if (onTerminal !== undefined) callHook("onTerminal", onTerminal, copied(sealed.receipt));
        } catch {
          sealed = undefined;
        }
      }
      if (sealed === undefined) session.free();
    }
  }

  const done = sealed as Sealed;
  const terminal = done.terminal;
  if (terminal === "completed") return;
  const n = done.receipt.attempt_count;
  const because = lastError === undefined ? "" : `; last error: ${errorText(lastError)}`;
  const message = `run stopped with ${terminal} after ${n} attempt${n === 1 ? "" : "s"}${because}`;
  if (cancelled) throw new RunCancelledError(message, { sealed: done, cause: cancelReason });
  if (lastRule === "unrecognized") throw new UnrecognizedDispatchError(message, { sealed: done, cause: lastError });
  throw new RunStoppedError(message, { sealed: done, cause: lastError });
}

/**
 * Record an attempt. Facts the core refuses (a response id that is not an
 * identifier, a header value it cannot decode) are replaced by the ones that
 * are certain, so an odd provider never breaks the run.
 */
function observe(session: Session, started: number, completed: number, cost: number | undefined, facts: Facts, deltas: string[], bytes: number[]): Judgement {
  if (session.refused !== undefined) throw session.refused;
  try {
    return session.observe({ started_at_ms: started, completed_at_ms: completed, cost, facts, deltas, delta_bytes: bytes });
  } catch (e) {
    if (!(e instanceof DecodeError || e instanceof HttpError)) throw e;
    const certain: Facts = { result: facts.result };
    if (facts.cancelled === true) certain.cancelled = true;
    if (facts.response_bytes_received === true) certain.response_bytes_received = true;
    if (facts.transport_error !== undefined) certain.transport_error = facts.transport_error;
    if (facts.stream !== undefined) {
      const { response_id: _, ...stream } = facts.stream;
      certain.stream = stream;
    }
    return session.observe({ started_at_ms: started, completed_at_ms: completed, cost, facts: certain, deltas, delta_bytes: bytes });
  }
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
