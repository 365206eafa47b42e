/**
 * Durable runs and idempotency records: thin typed wrappers over the core's
 * pure transitions (docs/JOURNAL.md). A host reads its store, asks the core,
 * and writes the answer back: an event appended at its `seq` (the append
 * fails when the seq is taken), a record written by compare-and-set.
 *
 * - `journalAppend` builds the next event of a run's journal (its `seq`,
 *   `prev_sha256` and the core's part of the payload) from an entry;
 * - `journalVerify` replays a journal against the policy;
 * - `journalRecover` says what a new owner does: `resume`, `reconcile` (ask
 *   the receiver by idempotency key), `adopt` (the receiver's settled
 *   answer as the attempt's observation) or `done`;
 * - `journalClassify` tells a fenced owner's late append (evidence) from a
 *   valid one;
 * - `JournalWriter` is the owner's writer of one run's journal: it keeps the
 *   replay between appends, so each event is checked alone (`journalAppend`
 *   replays the whole journal every time);
 * - `idempotencyClaim` / `idempotencyComplete`: the receiver's record per
 *   scoped key.
 */

import { call, CompiledPolicy, compiledOf, toText, type Input, type RawBindings, type RawCompiled, type RawJournalWriter } from "./core.js";
import { DecodeError } from "./errors.js";
import type { Session } from "./session.js";
import type { Admission, Attempt, Decision, DispatchDecision, FleetSnapshots, FleetStop, Identifier, Policy, Sha256Hex, Terminal } from "./types.js";

/** A planned dispatch, as a `reserved` event holds it (a dispatch decision without its `kind`). */
export type Dispatch = Omit<DispatchDecision, "kind">;

/** The kinds of journal events, in the order a run writes them. */
export type JournalEventKind = "created" | "reserved" | "dispatched" | "observed" | "decided" | "terminal";

interface EventBase {
  lease_generation: number;
  prev_sha256: Sha256Hex;
  run_id: Identifier;
  schema: "retryledger.journal_event.v1";
  seq: number;
}

/** `retryledger.journal_event.v1`, tagged by `kind`. */
export type JournalEvent =
  | (EventBase & { kind: "created"; created_at_epoch_ms: number; policy_sha256: Sha256Hex })
  | (EventBase & { kind: "reserved"; dispatch: Dispatch })
  | (EventBase & {
      kind: "dispatched";
      admission?: Admission;
      idempotency_key_sha256: Sha256Hex;
      not_before_ms: number;
      ordinal: number;
      route_id: Identifier;
      route_release_sha256: Sha256Hex;
      /** The fleet snapshots its admission names (absent when it names none). */
      snapshots?: FleetSnapshots;
      started_at_ms: number;
    })
  | (EventBase & { kind: "observed"; attempt: Attempt })
  | (EventBase & { kind: "decided"; decision: Decision })
  | (EventBase & {
      kind: "terminal";
      attempts_sha256: Sha256Hex;
      cancelled_at_ms?: number;
      fleet_stop?: FleetStop;
      receipt_sha256: Sha256Hex;
      /** The fleet snapshots its `fleet_stop` names (absent when it names none). */
      snapshots?: FleetSnapshots;
      terminal: Terminal;
    });

/** What a host asks `journalAppend` to write; the core fills in the rest. */
export type JournalEntry =
  | { kind: "created"; created_at_epoch_ms: number; run_id: Identifier }
  | { kind: "reserved"; dispatch?: Dispatch }
  | { kind: "dispatched"; admission?: Admission; snapshots?: FleetSnapshots; started_at_ms: number }
  | { kind: "observed"; attempt: Attempt }
  | { kind: "decided" }
  | { kind: "terminal"; cancelled_at_ms?: number; fleet_stop?: FleetStop; snapshots?: FleetSnapshots };

/** What `journalVerify` found. */
export interface JournalVerified {
  attempts: number;
  created_at_epoch_ms?: number;
  /** The `prev_sha256` of the next event. */
  head_sha256: Sha256Hex;
  last_kind?: JournalEventKind;
  lease_generation: number;
  next_seq: number;
  run_id?: Identifier;
  terminal?: Terminal;
}

/** A receiver's answer for an attempt in doubt, at a time on the run clock. */
export interface ReconciliationAnswer {
  answer: "succeeded" | "failed_no_effect" | "in_progress" | "unknown";
  at_ms: number;
  /** The cost to charge (a settled answer; default the reserved cost). */
  cost?: number;
}

/** `retryledger.reconciliation.v1`: the answers so far for the dispatched attempt. */
export interface Reconciliation {
  answers: ReconciliationAnswer[];
  /** How many times the receiver may be asked, 1..=100. */
  max_polls: number;
  ordinal: number;
  schema: "retryledger.reconciliation.v1";
}

/** The attempt in doubt, as the receiver knows it. */
export interface PendingAttempt {
  idempotency_key_sha256: Sha256Hex;
  ordinal: number;
  route_id: Identifier;
  route_release_sha256: Sha256Hex;
  started_at_ms: number;
}

/** What `journalRecover` says, tagged by `kind`. */
export type Recovery =
  | { kind: "done"; receipt_sha256: Sha256Hex; terminal: Terminal }
  | { kind: "resume"; dispatch?: Dispatch; next: JournalEventKind; next_seq: number }
  | { kind: "reconcile"; attempt: PendingAttempt; max_polls?: number; not_before_ms: number; poll: number }
  | { kind: "adopt"; attempt: Attempt; decision: Decision };

/** What `journalClassify` says of an offered event. */
export interface Classified {
  kind: "append" | "duplicate" | "evidence";
  /** The journal's highest lease generation. */
  lease_generation: number;
  reason?: "stale_lease" | "seq_taken";
  seq: number;
}

/** `retryledger.idempotency_record.v1`: one scoped key's record. */
export interface IdempotencyRecord {
  created_at_epoch_ms: number;
  expires_at_epoch_ms: number;
  idempotency_key_sha256: Sha256Hex;
  request_sha256: Sha256Hex;
  result_sha256?: Sha256Hex;
  schema: "retryledger.idempotency_record.v1";
  status: "in_progress" | "succeeded" | "failed_no_effect" | "indeterminate";
  updated_at_epoch_ms: number;
}

/** How long records answer for their key, and what an expired one means. */
export interface Retention {
  expired: "proceed" | "reject";
  poll_after_ms: number;
  ttl_ms: number;
}

/** A request arriving under a key. */
export interface ClaimRequest {
  idempotency_key_sha256: Sha256Hex;
  request_sha256: Sha256Hex;
}

/** The end of a claimed request. */
export interface Completion {
  idempotency_key_sha256: Sha256Hex;
  request_sha256: Sha256Hex;
  result_sha256?: Sha256Hex;
  status: "succeeded" | "failed_no_effect" | "indeterminate";
}

/** What `idempotencyClaim` says, tagged by `kind`. */
export type Claim =
  | { kind: "proceed"; record: IdempotencyRecord }
  | { kind: "replay"; result_sha256: Sha256Hex }
  | { kind: "poll"; poll_at_epoch_ms: number; retry_after_ms: number }
  | { kind: "rejected"; reason: "key_reuse" | "key_expired" | "indeterminate" };

/** The module's journal and idempotency transitions (JSON text in and out). */
interface JournalBindings {
  journal_verify(policy: string, events: string): string;
  journal_recover(policy: string, events: string, reconciliation: string | undefined): string;
  journal_append(policy: string, events: string, leaseGeneration: number, entry: string): string;
  journal_classify(policy: string, events: string, event: string): string;
  idempotency_claim(retention: string, record: string | undefined, request: string, nowEpochMs: number): string;
  idempotency_complete(retention: string, record: string, completion: string, nowEpochMs: number): string;
}

const journalCall = <T>(f: (b: JournalBindings) => T): T => call((b: RawBindings) => f(b as unknown as JournalBindings));

function integer(name: string, x: unknown): number {
  if (typeof x !== "number") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a number`, { path: `/${name}` });
  }
  return x;
}

/**
 * A journal call against a policy: a compiled one's own module object (the
 * policy is not decoded and validated again), else the policy's text.
 */
function withPolicy<T>(
  policy: Input<Policy> | CompiledPolicy,
  compiled: (raw: RawCompiled) => T,
  text: (b: JournalBindings, policy: string) => T,
): T {
  if (policy instanceof CompiledPolicy) return policy.callRaw(compiled);
  const p = toText(policy);
  return journalCall((b) => text(b, p));
}

/** A journal as text: a JSON array of events, or its text. */
function eventsText(events: Input<readonly JournalEvent[]>): string {
  return toText(events);
}

/** What the replay of a journal against the policy found (or the first event it refuses, thrown). */
export function journalVerify(policy: Input<Policy> | CompiledPolicy, events: Input<readonly JournalEvent[]>): JournalVerified {
  const e = eventsText(events);
  return JSON.parse(withPolicy(policy, (c) => c.journal_verify(e), (b, p) => b.journal_verify(p, e))) as JournalVerified;
}

/**
 * What a new owner does with a journal: `resume` (append `next`), `reconcile`
 * (ask the receiver by idempotency key, not before `not_before_ms`), `adopt`
 * (append the attempt as `observed`) or `done`. Pass the receiver's answers so
 * far while an attempt waits for reconciliation.
 */
export function journalRecover(
  policy: Input<Policy> | CompiledPolicy,
  events: Input<readonly JournalEvent[]>,
  reconciliation?: Input<Reconciliation>,
): Recovery {
  const e = eventsText(events);
  const r = reconciliation === undefined ? undefined : toText(reconciliation);
  return JSON.parse(withPolicy(policy, (c) => c.journal_recover(e, r), (b, p) => b.journal_recover(p, e, r))) as Recovery;
}

/** The next event of a journal under the writer's lease generation; append it at its `seq`. */
export function journalAppend(
  policy: Input<Policy> | CompiledPolicy,
  events: Input<readonly JournalEvent[]>,
  leaseGeneration: number,
  entry: Input<JournalEntry>,
): JournalEvent {
  const e = eventsText(events);
  const g = integer("lease_generation", leaseGeneration);
  const x = toText(entry);
  return JSON.parse(withPolicy(policy, (c) => c.journal_append(e, g, x), (b, p) => b.journal_append(p, e, g, x))) as JournalEvent;
}

/** Whether an event offered to a journal appends, repeats one, or is only evidence (a fenced owner's, or a seq taken). */
export function journalClassify(policy: Input<Policy> | CompiledPolicy, events: Input<readonly JournalEvent[]>, event: Input<JournalEvent>): Classified {
  const e = eventsText(events);
  const x = toText(event);
  return JSON.parse(withPolicy(policy, (c) => c.journal_classify(e, x), (b, p) => b.journal_classify(p, e, x))) as Classified;
}

/**
 * The writer of one run's journal, for the owner that holds its lease
 * (`leaseGeneration`): the journal as read (`events`) is verified once and
 * its replay kept, each `append` checks the new event alone and advances the
 * replay, and `recover` and `resume` start from the replay rather than from
 * the events. An owner whose store refuses a write has lost the run and
 * stops appending through this writer. `free()` releases its module memory.
 */
export class JournalWriter {
  readonly #raw: RawJournalWriter;

  constructor(policy: Input<Policy> | CompiledPolicy, events: Input<readonly JournalEvent[]>, leaseGeneration: number) {
    const compiled = compiledOf(policy);
    const e = eventsText(events);
    const g = integer("lease_generation", leaseGeneration);
    this.#raw = compiled.callRaw((c) => c.journal_writer(e, g));
  }

  /** The next event built from `entry`, as the canonical JSON a store appends at its `seq`. */
  appendJson(entry: Input<JournalEntry>): string {
    const x = toText(entry);
    const raw = this.#raw;
    return call(() => raw.append(x));
  }

  /** `appendJson` as an object. */
  append(entry: Input<JournalEntry>): JournalEvent {
    return JSON.parse(this.appendJson(entry)) as JournalEvent;
  }

  /** `journalRecover` of the journal written so far. */
  recover(reconciliation?: Input<Reconciliation>): Recovery {
    const r = reconciliation === undefined ? undefined : toText(reconciliation);
    const raw = this.#raw;
    return JSON.parse(call(() => raw.recover(r))) as Recovery;
  }

  /**
   * Continue `session` (fresh, of the same policy; a price schedule is set on
   * it first) from the journal written so far: what
   * `session.resumeJournal(events)` does, without reading the events again.
   */
  resume(session: Session): void {
    const raw = this.#raw;
    session.callRaw((s) => raw.resume(s));
  }

  /** The `seq` of the next event. */
  get nextSeq(): number {
    return this.#raw.next_seq();
  }

  /** Release the module memory now rather than at garbage collection. */
  free(): void {
    this.#raw.free();
  }
}

/**
 * A request under its scoped key at a wall-clock time, given the record the
 * store holds (or `null`): `proceed` (write `record` by compare-and-set, then
 * run), `replay`, `poll` or `rejected`.
 */
export function idempotencyClaim(
  retention: Input<Retention>,
  record: Input<IdempotencyRecord> | null,
  request: Input<ClaimRequest>,
  nowEpochMs: number,
): Claim {
  const r = toText(retention);
  const rec = record === null ? undefined : toText(record);
  const q = toText(request);
  const now = integer("now_epoch_ms", nowEpochMs);
  return JSON.parse(journalCall((b) => b.idempotency_claim(r, rec, q, now))) as Claim;
}

/** The claimed record moved to its final status; write it back by compare-and-set. */
export function idempotencyComplete(
  retention: Input<Retention>,
  record: Input<IdempotencyRecord>,
  completion: Input<Completion>,
  nowEpochMs: number,
): IdempotencyRecord {
  const r = toText(retention);
  const rec = toText(record);
  const c = toText(completion);
  const now = integer("now_epoch_ms", nowEpochMs);
  return JSON.parse(journalCall((b) => b.idempotency_complete(r, rec, c, now))) as IdempotencyRecord;
}
