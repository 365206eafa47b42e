/**
 * The core's Session: a run of one policy, advanced one observed attempt at a
 * time. The same interface as the Python binding's (docs/HOSTS.md): `next()`
 * is the decision, `observe(...)` has the core judge the facts and record the
 * attempt, `cancel(at_ms)` stops between attempts, `seal()` is the sealed run.
 * Plain values only: no sentinel numbers, no positional tuples.
 */

import {
  call,
  fromTape,
  hostSha256,
  moduleBytes,
  moduleFloats,
  returnedFacts,
  sha256Hex,
  toText,
  utf8Length,
  type CompiledPolicy,
  type Input,
  type RawFacts,
  type RawSession,
} from "./core.js";
import type { JournalEvent } from "./journal.js";
import type { JobStatus, JobStep } from "./job.js";
import type {
  AdmissionSnapshot,
  AdmitAnswer,
  Attempt,
  BreakerSnapshot,
  FleetSnapshots,
  FleetView,
  Attempts,
  Bundle,
  Decision,
  DispatchDecision,
  Facts,
  Judgement,
  Outcome,
  Policy,
  PriceSchedule,
  Receipt,
  Reconciled,
  Sealed,
  StreamLogEntry,
  Terminal,
  Usage,
} from "./types.js";
import { RULES, TERMINALS } from "./tables.js";

/** The raw session's streaming methods (the module's `Session` has them). */
interface RawStreaming {
  observe_stream(startedAtMs: number, completedAtMs: number, cost: number | undefined, facts: string, deltas: string[]): string;
  observe_stream_joined(startedAtMs: number, completedAtMs: number, cost: number | undefined, facts: string, joined: string, lengths: Uint32Array): string;
  continuation_json(): string | undefined;
  stream_events_json(): string | undefined;
}

const streaming = (r: RawSession): RawStreaming => r as unknown as RawStreaming;

/** The raw session's pricing and request body methods (the module's `Session` has them). */
interface RawReports {
  set_price_schedule(schedule: string): string;
  add_usage(usage: string): number;
  set_request_body_sha256(digest: string): void;
  set_model(requested: string | undefined, served: string | undefined): void;
  set_job(id: string | undefined, status: string | undefined): void;
  job_json(): string | undefined;
  set_reconciled(answer: string): void;
  resume_journal(events: string): void;
}

const reportsOf = (r: RawSession): RawReports => r as unknown as RawReports;

/** The raw session's fleet methods (the module's `Session` has them). */
interface RawFleet {
  admit(atMs: number, nowEpochMs: number, view: string): string;
  admit_preview(atMs: number, nowEpochMs: number, view: string): string;
  breaker_after(snapshot: string, nowEpochMs: number): string;
  admission_release(snapshot: string, nowEpochMs: number, usedTokens?: number, headers?: string): string;
  fleet_snapshots_json(): string | undefined;
}

const fleetOf = (r: RawSession): RawFleet => r as unknown as RawFleet;

/** The facts of a dispatch that returned a value (the one fact object that crosses no JSON). */
export const RETURNED: Readonly<Facts> = Object.freeze({ result: "returned" });

const RETURNED_JUDGEMENT: Readonly<Judgement> = Object.freeze({
  outcome: Object.freeze({ class: "success" }),
  rule: "returned",
});

/** One attempt as a host observed it, for `Session.observe`. */
export interface Observation {
  /** When the attempt started, run clock, ms. */
  started_at_ms: number;
  /** When it completed, run clock, ms. */
  completed_at_ms: number;
  /** What it cost (the planned `reserve_cost` when absent). */
  cost?: number | undefined;
  /** What the host observed (an object or its JSON text). */
  facts: Input<Facts>;
  /**
   * In a streamed run: the text of every provider event the attempt
   * received, in order (`""` for an event without text). Their count and
   * UTF-8 bytes must match `facts.stream`.
   */
  deltas?: readonly string[] | undefined;
  /**
   * Each delta's UTF-8 byte length, when the host already counted them
   * (saves counting again; the core checks they split the text on character
   * boundaries and add up).
   */
  delta_bytes?: readonly number[] | undefined;
}

/**
 * Seal a finished session and hand its module memory to the sealed run, which
 * reads the attempts from it when the bundle is first asked for and then
 * frees it (the driver's path: a run whose bundle is never read pays for no
 * attempts JSON). The session is not to be used afterwards.
 */
export let sealAndRelease: (session: Session) => Sealed;

/** A run of a compiled policy in progress; create one with `compiled.session()`. */
export class Session {
  /** The compiled policy this run follows. */
  readonly compiled: CompiledPolicy;
  readonly #raw: RawSession;
  readonly #streams: boolean;
  readonly #fleet: boolean;
  /** The price schedule's canonical JSON, once set. */
  #schedule: string | undefined;
  /** Where the core writes the planned dispatch's numbers, as an index of 64-bit floats. */
  #plan: number | undefined;

  /** @internal Use `compiled.session()`. */
  constructor(compiled: CompiledPolicy, raw: RawSession) {
    this.compiled = compiled;
    this.#raw = raw;
    this.#streams = compiled.policy.stream !== undefined;
    this.#fleet = compiled.policy.fleet !== undefined;
  }

  /**
   * Under a fleet section, admit the planned attempt before dispatching it:
   * `view` is what the host read from its store at `now_epoch_ms` (wall
   * clock, Unix ms), `at_ms` the run clock. The answer's decision is the
   * dispatch to make (an open route skipped: perhaps on a later route; also
   * what `next()` now gives) or the fleet's terminal; its `writes` are the
   * snapshots to write back with compare-and-set. Admitting again before the
   * observation (after a conflict, with a fresh view) replaces the admission.
   */
  admit(at_ms: number, now_epoch_ms: number, view: Input<FleetView>): AdmitAnswer {
    const r = fleetOf(this.#raw);
    const text = toText(view);
    return JSON.parse(call(() => r.admit(at_ms, now_epoch_ms, text))) as AdmitAnswer;
  }

  /**
   * What `admit` would answer under `view`, the session unchanged: for a
   * host that admits from cached snapshots, checks and writes every key the
   * admission reads in one compare-and-set, and then commits the admission
   * with `admit` under the same view (the same answer).
   */
  admitPreview(at_ms: number, now_epoch_ms: number, view: Input<FleetView>): AdmitAnswer {
    const r = fleetOf(this.#raw);
    const text = toText(view);
    return JSON.parse(call(() => r.admit_preview(at_ms, now_epoch_ms, text))) as AdmitAnswer;
  }

  /**
   * After the observation: the last attempt's route breaker with its outcome
   * recorded, from `snapshot` (the breaker as the host reads it now) at
   * `now_epoch_ms`; write it back with compare-and-set.
   */
  breakerAfter(snapshot: Input<BreakerSnapshot>, now_epoch_ms: number): BreakerSnapshot {
    const r = fleetOf(this.#raw);
    const text = toText(snapshot);
    return JSON.parse(call(() => r.breaker_after(text, now_epoch_ms))) as BreakerSnapshot;
  }

  /**
   * The admitted attempt's admission snapshot once it is over (the attempt
   * admitted and not yet observed, else the last one observed), from
   * `snapshot` as the host reads it now: its in-flight slot freed and its
   * reserved tokens settled with `usedTokens` (`undefined`: not reported),
   * then the rate-limit `headers` its response carried (`[name, value]`
   * pairs) applied: a lower `remaining` lowers the route's bucket, an
   * exhausted one with a reset empties it until the reset.
   */
  admissionRelease(
    snapshot: Input<AdmissionSnapshot>,
    now_epoch_ms: number,
    usedTokens?: number,
    headers?: ReadonlyArray<readonly [string, string]>,
  ): AdmissionSnapshot {
    const r = fleetOf(this.#raw);
    const text = toText(snapshot);
    const seen = headers === undefined || headers.length === 0 ? undefined : JSON.stringify(headers);
    return JSON.parse(call(() => r.admission_release(text, now_epoch_ms, usedTokens, seen))) as AdmissionSnapshot;
  }

  /** Every fleet snapshot the admissions read so far, or `undefined` without a fleet section. */
  get fleetSnapshots(): FleetSnapshots | undefined {
    const text = fleetOf(this.#raw).fleet_snapshots_json();
    return text === undefined ? undefined : (JSON.parse(text) as FleetSnapshots);
  }

  /** The decision: `{kind: "dispatch", …}` (exactly `planNext`'s document) or `{kind: "terminal", terminal}`. */
  next(): Decision {
    const r = this.#raw;
    if (!r.plan()) return { kind: "terminal", terminal: TERMINALS[r.terminal_index() as number] as Terminal };
    // The decision's numbers, written by the core in one crossing (PLAN_FIELDS in wasm/src/lib.rs).
    const f = moduleFloats();
    const at = (this.#plan ??= r.plan_ptr() / 8);
    const route = this.compiled.routesByPriority[f[at + 6] as number];
    if (route === undefined) throw new Error("retryledger: the planned route is not in the policy");
    const p = this.compiled.policy;
    // Keys in canonical order, as planNext's document has them.
    const d: DispatchDecision =
      f[at + 7] === 0
        ? {
            deadline_ms: p.deadline_ms,
            delay_ms: f[at + 1] as number,
            idempotency_key_sha256: p.idempotency_key_sha256,
            kind: "dispatch",
            logical_request_sha256: p.logical_request_sha256,
            not_before_ms: f[at] as number,
            ordinal: f[at + 2] as number,
            reserve_cost: f[at + 4] as number,
            retry_after_floor_ms: f[at + 5] as number,
            route_id: route.route_id,
            route_ordinal: f[at + 3] as number,
            route_release_sha256: route.route_release_sha256,
          }
        : {
            deadline_ms: p.deadline_ms,
            delay_ms: f[at + 1] as number,
            idempotency_key_sha256: p.idempotency_key_sha256,
            jitter_max_ms: f[at + 9] as number,
            jitter_min_ms: f[at + 8] as number,
            jitter_sample_ms: f[at + 10] as number,
            kind: "dispatch",
            logical_request_sha256: p.logical_request_sha256,
            not_before_ms: f[at] as number,
            ordinal: f[at + 2] as number,
            reserve_cost: f[at + 4] as number,
            retry_after_floor_ms: f[at + 5] as number,
            route_id: route.route_id,
            route_ordinal: f[at + 3] as number,
            route_release_sha256: route.route_release_sha256,
          };
    if (p.async_job !== undefined) {
      const j = reportsOf(r).job_json();
      // `job` sorts between the jitter fields and `kind`: keys stay in canonical order.
      if (j !== undefined) {
        const job = JSON.parse(j) as JobStep;
        const entries = Object.entries(d);
        const k = entries.findIndex(([key]) => key === "kind");
        entries.splice(k, 0, ["job", job]);
        return Object.fromEntries(entries) as unknown as DispatchDecision;
      }
    }
    if (f[at + 11] === 1) {
      const c = streaming(r).continuation_json();
      // `continuation` sorts first: keys stay in canonical order.
      if (c !== undefined) return { continuation: JSON.parse(c), ...d } as DispatchDecision;
    }
    return d;
  }

  /**
   * Record the planned attempt: the core judges the facts (decoded strictly),
   * charges `cost` (the planned `reserve_cost` when absent) and records it.
   * Returns the judgement. Drift (an early start, a completion before the
   * start, an attempt after the terminal) throws and changes nothing.
   */
  observe(observation: Observation): Judgement {
    const { started_at_ms: started, completed_at_ms: completed, cost, facts, deltas, delta_bytes: counted } = observation;
    const r = this.#raw;
    if (deltas !== undefined || this.#streams || (typeof facts === "object" && facts !== null && facts.stream !== undefined)) {
      const text = toText(facts);
      const list = deltas === undefined ? [] : Array.isArray(deltas) ? (deltas as string[]) : [...deltas];
      // One crossing for the whole attempt: the texts joined, with their
      // UTF-8 lengths. A text ending in a high surrogate could pair with the
      // next one's start once joined: such an attempt crosses text by text.
      const lengths = new Uint32Array(list.length);
      let joinable = true;
      for (let i = 0; i < list.length; i++) {
        const t = list[i] as string;
        const last = t.length === 0 ? 0 : t.charCodeAt(t.length - 1);
        if (last >= 0xd800 && last <= 0xdbff) {
          joinable = false;
          break;
        }
        lengths[i] = counted !== undefined && counted.length === list.length ? (counted[i] as number) : utf8Length(t);
      }
      if (joinable) {
        return JSON.parse(call(() => streaming(r).observe_stream_joined(started, completed, cost, text, list.join(""), lengths))) as Judgement;
      }
      return JSON.parse(call(() => streaming(r).observe_stream(started, completed, cost, text, list))) as Judgement;
    }
    if (facts === RETURNED) {
      const f = returnedFacts();
      call(() => r.observe_prepared(started, completed, cost, f));
      return RETURNED_JUDGEMENT as Judgement;
    }
    const text = toText(facts);
    return JSON.parse(call(() => r.observe(started, completed, cost, text))) as Judgement;
  }

  /**
   * @internal `observe` with facts the core decoded beforehand (an
   * `AttemptError`'s, which carry `outcome`): nothing crosses as JSON.
   */
  observePrepared(started: number, completed: number, cost: number | undefined, facts: RawFacts, outcome: Outcome): Judgement {
    const r = this.#raw;
    const rule = RULES[call(() => r.observe_prepared(started, completed, cost, facts))] as Judgement["rule"];
    return { outcome, rule };
  }

  /**
   * Price the run's usage with `schedule` (`retryledger.price_schedule.v1`),
   * checked against the policy (`cost_unit_mismatch`,
   * `price_schedule_missing_release`, …); only before the first attempt. The
   * receipt then binds the schedule's digest and the bundle carries it.
   */
  setPriceSchedule(schedule: Input<PriceSchedule>): void {
    const r = this.#raw;
    const text = toText(schedule);
    this.#schedule = call(() => reportsOf(r).set_price_schedule(text));
  }

  /**
   * Report usage of the attempt in flight (units by kind; reports add up).
   * The attempt records it raw and costs what the schedule charges for it,
   * so it is not also charged by hand (`charge_with_usage`). Returns what
   * the attempt's usage so far costs. Throws the core's coded error
   * (`price_schedule_missing_release` without a schedule, `usage_unpriced`,
   * `integer_out_of_range`, `arithmetic_overflow`) and keeps nothing then.
   */
  addUsage(usage: Input<Usage>): number {
    const r = this.#raw;
    const text = toText(usage);
    return call(() => reportsOf(r).add_usage(text));
  }

  /**
   * Report the SHA-256 (lowercase hex) of the request body the attempt in
   * flight sent. Every later attempt on the same route must send the same
   * body (replay: `request_body_drift`).
   */
  setRequestBodySha256(digest: string): void {
    const r = this.#raw;
    call(() => reportsOf(r).set_request_body_sha256(digest));
  }

  /**
   * Report the model the attempt in flight asked for (`requested`, the
   * lowered request's model) and the one the provider's response named
   * (`served`); a side not learned is `undefined`, recorded as unknown
   * (docs/LOWERING.md, "Which model answered"). Throws the core's coded
   * error for a name that is not an identifier.
   */
  setModel(requested: string | undefined, served: string | undefined): void {
    const r = this.#raw;
    call(() => reportsOf(r).set_model(requested, served));
  }

  /**
   * Report what the attempt in flight was of an async job (docs/JOBS.md):
   * the provider's job id (the id a submit was answered with, or the id a
   * poll asked about; the core keeps only its SHA-256) and the job status
   * its answer reported.
   */
  setJob(id?: string, status?: JobStatus): void {
    const r = this.#raw;
    call(() => reportsOf(r).set_job(id, status));
  }

  /**
   * Report the receiver's answer for the attempt in flight, reconciled by
   * idempotency key (an async job's submit whose answer was lost:
   * docs/JOBS.md): `succeeded` (an acceptance, with the job id from
   * `setJob`), `failed_no_effect` (another submit may follow) or `unknown`
   * (stays indeterminate); the attempt's outcome is the answer's.
   */
  setReconciled(answer: Reconciled): void {
    const r = this.#raw;
    call(() => reportsOf(r).set_reconciled(answer));
  }

  /**
   * Continue the run a journal holds (its events, or their JSON text): the
   * core verifies it against this session's policy and replays its attempts,
   * reconciled ones included, so the next attempt is observed here like any
   * other. Only a fresh session resumes (a price schedule may be set first);
   * a policy with a fleet section or a stream contract is refused
   * (`admission_unexpected`, `invalid_stream_contract`), a broken journal
   * with its `journal_*` code.
   */
  resumeJournal(events: Input<readonly JournalEvent[]>): void {
    const r = this.#raw;
    const text = toText(events);
    call(() => reportsOf(r).resume_journal(text));
  }

  /** @internal A call on the module's session (a journal writer resuming it). */
  callRaw<T>(f: (raw: RawSession) => T): T {
    const r = this.#raw;
    return call(() => f(r));
  }

  /** Mark the run cancelled between attempts at `at_ms` (run clock). */
  cancel(at_ms: number): void {
    const r = this.#raw;
    call(() => r.cancel(at_ms));
  }

  /** The terminal's name, or `null` while the run can dispatch. */
  get terminal(): Terminal | null {
    return (this.#raw.terminal() as Terminal | undefined) ?? null;
  }

  /** The attempts document so far. */
  get attempts(): Attempts {
    return JSON.parse(this.#raw.attempts_json()) as Attempts;
  }

  /**
   * The consumer's event log so far (`retryledger.stream_event.v1`), or
   * `undefined` when the policy does not stream.
   */
  get streamEvents(): StreamLogEntry[] | undefined {
    const text = streaming(this.#raw).stream_events_json();
    return text === undefined ? undefined : (JSON.parse(text) as StreamLogEntry[]);
  }

  /** @internal The event log's canonical JSON, or `undefined` when the policy does not stream. */
  streamEventsJson(): string | undefined {
    return streaming(this.#raw).stream_events_json();
  }

  /** The last recorded attempt, if any. */
  lastAttempt(): Attempt | undefined {
    const text = this.#raw.last_attempt_json();
    return text === undefined ? undefined : (JSON.parse(text) as Attempt);
  }

  /** The sealed run (`RunError` `run_not_terminal` while it can still dispatch). */
  seal(): Sealed {
    const r = this.#raw;
    const { receipt, receiptJson, attempts } = sealed(r);
    const events = this.#streams ? streaming(r).stream_events_json() : undefined;
    const snapshots = this.#fleet ? fleetOf(r).fleet_snapshots_json() : undefined;
    return new SealedRun(this.compiled, receipt, receiptJson, attempts ?? r.attempts_json(), events, snapshots, this.#schedule);
  }

  static {
    sealAndRelease = (session) => {
      const r = session.#raw;
      const { receipt, receiptJson, attempts } = sealed(r);
      // The fleet snapshots are read now (the session may be freed below).
      const snapshots = session.#fleet ? fleetOf(r).fleet_snapshots_json() : undefined;
      // A streamed run's event log is read with the bundle, from the session kept until then.
      const schedule = session.#schedule;
      if (session.#streams) return new SealedRun(session.compiled, receipt, receiptJson, attempts ?? r, r, snapshots, schedule);
      // The attempts were read: the session's memory serves the policy's next run.
      if (attempts !== undefined) session.compiled.recycle(r);
      return new SealedRun(session.compiled, receipt, receiptJson, attempts ?? r, undefined, snapshots, schedule);
    };
  }

  /** Release the module memory now rather than at garbage collection. */
  free(): void {
    this.#raw.free();
  }
}

const utf8 = new TextDecoder();

/**
 * A copy out of the module's memory (a session's memory serves its next
 * run), kept by a sealed run: where it is in a chunk shared by many runs,
 * since a typed array of its own per run (its backing store), or even a view
 * of its own, costs more than the copy. A chunk is collected once no sealed
 * run keeps a copy in it.
 */
class Kept<A extends Float64Array | Uint8Array> {
  constructor(
    readonly chunk: A,
    readonly start: number,
    readonly length: number,
  ) {}

  /** The copy as a typed array of its own (a view into the chunk). */
  view(): A {
    return this.chunk.subarray(this.start, this.start + this.length) as A;
  }
}

/** A document's tape, kept: its numbers (a copy) and its text, for `tapeJson`. */
interface KeptTape {
  readonly ops: Kept<Float64Array>;
  readonly text: string;
}

/** Chunks that copies out of the module's memory are kept in. */
class Chunks<A extends Float64Array | Uint8Array> {
  #chunk: A;
  #used = 0;

  constructor(
    readonly make: (length: number) => A,
    readonly size: number,
  ) {
    this.#chunk = make(0);
  }

  /** A copy of `source`. */
  keep(source: ArrayLike<number>): Kept<A> {
    const n = source.length;
    if (this.#used + n > this.#chunk.length) {
      this.#chunk = this.make(Math.max(this.size, n));
      this.#used = 0;
    }
    const start = this.#used;
    this.#chunk.set(source, start);
    this.#used += n;
    return new Kept(this.#chunk, start, n);
  }
}

/** Receipt tapes (a few hundred numbers each). */
const tapes = new Chunks((n) => new Float64Array(n), 16_384);
/** Attempts' canonical bytes, decoded when the bundle first needs their text. */
const attemptBytes = new Chunks((n) => new Uint8Array(n), 65_536);

/** What sealing gives: the receipt object, its canonical JSON or kept tape, and the attempts' JSON when read. */
interface SealedParts {
  readonly receipt: Receipt | undefined;
  readonly receiptJson: string | KeptTape;
  /** The attempts' canonical JSON, or its UTF-8 bytes (kept when they were hashed). */
  readonly attempts: string | Kept<Uint8Array> | undefined;
}

/**
 * The receipt (or `undefined`: parse its JSON), the receipt's canonical
 * JSON or the tape the core writes it from, and the attempts' canonical
 * JSON (or bytes) when it was read for hashing. With a native SHA-256 the
 * core writes the attempts' canonical bytes into its memory, they are hashed
 * there (and copied out), and the core writes the receipt built around that
 * digest as a tape (`fromTape`): no JSON text is written or parsed; the
 * receipt's canonical JSON is written by the core from a copy of the tape
 * when first asked for.
 */
function sealed(r: RawSession): SealedParts {
  const hash = hostSha256;
  if (hash === undefined) return { receipt: undefined, receiptJson: call(() => r.receipt_json()), attempts: undefined };
  const n = r.attempts_bytes();
  const at = r.bytes_ptr();
  const bytes = moduleBytes().subarray(at, at + n);
  const hex = hash(bytes);
  const attempts = attemptBytes.keep(bytes);
  call(() => r.seal_hashed(hex));
  // Where the module wrote (`seal_hashed`), from the plan buffer.
  const f = moduleFloats();
  const p = r.plan_ptr() / 8;
  const tapeAt = (f[p + 2] as number) / 8;
  const count = f[p + 3] as number;
  const textAt = f[p + 4] as number;
  const text = utf8.decode(moduleBytes().subarray(textAt, textAt + (f[p + 5] as number)));
  // The tape is read from its kept copy (made anyway), where it is in the chunk.
  const ops = tapes.keep(f.subarray(tapeAt, tapeAt + count));
  const receipt = fromTape(ops.chunk, ops.start, count, text) as Receipt;
  return { receipt, receiptJson: { ops, text }, attempts };
}

/** The canonical JSON of a receipt given as its text or its kept tape. */
function receiptText(receipt: string | KeptTape): string {
  if (typeof receipt === "string") return receipt;
  return call((b) => b.tape_json(receipt.ops.view(), receipt.text));
}

const BUNDLE_SCHEMA = "retryledger.bundle.v1";

/**
 * A sealed run. The receipt is parsed at once; the receipt digest, the bundle
 * and its canonical JSON are computed when first read (from the canonical
 * texts the core returned, so they are byte for byte the core's).
 */
class SealedRun implements Sealed {
  readonly receipt: Receipt;
  readonly #compiled: CompiledPolicy;
  #receipt: string | KeptTape;
  #attempts: string | Kept<Uint8Array> | RawSession;
  #events: string | RawSession | undefined;
  readonly #snapshots: string | undefined;
  readonly #schedule: string | undefined;
  #bundle: Bundle | undefined;
  #sha: string | undefined;

  /**
   * `attempts`: their JSON, or the finished session to read it from once;
   * `events`: in a streamed run, the event log's JSON or the session to read
   * it from once. A session given is freed once everything it holds was read.
   * `snapshots`: under a fleet section, the fleet snapshots' JSON;
   * `schedule`: the run's price schedule's canonical JSON, when it has one.
   */
  constructor(
    compiled: CompiledPolicy,
    receipt: Receipt | undefined,
    receiptJson: string | KeptTape,
    attempts: string | Kept<Uint8Array> | RawSession,
    events: string | RawSession | undefined,
    snapshots: string | undefined,
    schedule: string | undefined,
  ) {
    this.#compiled = compiled;
    this.#snapshots = snapshots;
    this.#schedule = schedule;
    this.#receipt = receiptJson;
    this.#attempts = attempts;
    this.#events = events;
    this.receipt = receipt ?? (JSON.parse(receiptText(receiptJson)) as Receipt);
  }

  /** The receipt's canonical JSON (written from the kept tape the first time). */
  #receiptJson(): string {
    const r = this.#receipt;
    if (typeof r === "string") return r;
    const text = receiptText(r);
    this.#receipt = text;
    return text;
  }

  #attemptsText(): string {
    const a = this.#attempts;
    if (typeof a === "string") return a;
    if (a instanceof Kept) {
      const decoded = utf8.decode(a.view());
      this.#attempts = decoded;
      return decoded;
    }
    const text = a.attempts_json();
    this.#attempts = text;
    this.#release(a);
    return text;
  }

  #eventsText(): string | undefined {
    const e = this.#events;
    if (e === undefined || typeof e === "string") return e;
    const text = streaming(e).stream_events_json();
    this.#events = text;
    this.#release(e);
    return text;
  }

  /** Free a session once neither the attempts nor the events are still to be read from it. */
  #release(r: RawSession): void {
    if (this.#attempts !== r && this.#events !== r) r.free();
  }

  get terminal(): Terminal {
    return this.receipt.terminal;
  }

  get receipt_sha256(): string {
    this.#sha ??= (hostSha256 ?? sha256Hex)(this.#receiptJson());
    return this.#sha;
  }

  get bundle(): Bundle {
    if (this.#bundle === undefined) {
      const attempts = JSON.parse(this.#attemptsText()) as Attempts;
      const policy = this.#compiled.policy as Policy;
      const snapshots = this.#snapshots;
      // Keys in canonical order.
      const b = { attempts } as Bundle;
      if (snapshots !== undefined) b.fleet_snapshots = JSON.parse(snapshots) as FleetSnapshots;
      b.policy = policy;
      if (this.#schedule !== undefined) b.price_schedule = JSON.parse(this.#schedule) as PriceSchedule;
      b.receipt = this.receipt;
      b.schema = BUNDLE_SCHEMA;
      const events = this.#eventsText();
      if (events !== undefined) b.stream_events = JSON.parse(events) as StreamLogEntry[];
      this.#bundle = b;
    }
    return this.#bundle;
  }

  get bundle_json(): string {
    // The canonical JSON of the bundle: its fields in key order, each the core's canonical text.
    const log = this.#eventsText();
    const events = log === undefined ? "" : `,"stream_events":${log}`;
    const snapshots = this.#snapshots === undefined ? "" : `,"fleet_snapshots":${this.#snapshots}`;
    const schedule = this.#schedule === undefined ? "" : `,"price_schedule":${this.#schedule}`;
    return `{"attempts":${this.#attemptsText()}${snapshots},"policy":${this.#compiled.policyJson}${schedule},"receipt":${this.#receiptJson()},"schema":"${BUNDLE_SCHEMA}"${events}}`;
  }

  toJSON(): { receipt: Receipt; receipt_sha256: string; bundle: Bundle; terminal: Terminal } {
    return { receipt: this.receipt, receipt_sha256: this.receipt_sha256, bundle: this.bundle, terminal: this.terminal };
  }
}
