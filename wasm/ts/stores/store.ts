/**
 * What a store is: a register per key holding a JSON document and the
 * store's own generation (a version counter, 0 for a key it does not hold),
 * written only by compare-and-set (`FleetStore`); and an append log per
 * name, numbered events each written once (`AppendLog`), what a durable
 * journal is written to. Stores hold documents; every transition is the
 * core's. The conformance scenarios every backend runs are
 * `tests/stores/register.json` and `tests/stores/log.json`.
 */

/** A JSON object as a store holds it. */
export type StoreDocument = { [key: string]: unknown };

/** `get`'s answer: the document (`null` when absent) and the key's generation (0 when absent). */
export interface StoreRead {
  document: StoreDocument | null;
  generation: number;
}

/** `compareAndSet`'s answer: written (`ok`, the new generation) or refused (the current generation). */
export interface StoreWrite {
  ok: boolean;
  generation: number;
}

/** A key's current state as JSON text: the document's text (`null` when absent) and the key's generation (0 when absent). */
export interface StoreRow {
  text: string | null;
  generation: number;
}

/**
 * One entry of a multi-key check-and-set: the key, the generation expected,
 * and the JSON text of the document to write (`null`: check only).
 */
export interface CheckAndSetEntry {
  key: string;
  expectedGeneration: number;
  text: string | null;
}

/** `checkAndSet`'s answer: every write made (`ok`, `rows` empty), or the current state of every key, in order. */
export interface CheckAndSetAnswer {
  ok: boolean;
  rows: StoreRow[];
}

/**
 * A register store. Methods may answer synchronously or with a promise. A
 * store that cannot be reached throws (preferably `StoreUnavailableError`);
 * the fleet then admits under `store_unavailable` and the policy decides.
 */
export interface FleetStore {
  /** The document under `key` and its generation. */
  get(key: string): StoreRead | Promise<StoreRead>;
  /**
   * Write `document` under `key` when its generation is `expectedGeneration`
   * (0: the key is absent): `{ok: true, generation: expected + 1}`; else
   * nothing changes: `{ok: false, generation: current}`.
   */
  compareAndSet(key: string, expectedGeneration: number, document: StoreDocument): StoreWrite | Promise<StoreWrite>;
  /** Several keys at once (one round trip where the backend allows it), in order. */
  getMany?(keys: readonly string[]): StoreRead[] | Promise<StoreRead[]>;
  /** `getMany` with each document as its stored JSON text (spares a decode and an encode per document). */
  getManyRaw?(keys: readonly string[]): StoreRow[] | Promise<StoreRow[]>;
  /**
   * The multi-key check-and-set, atomically: every check-only entry (`text`
   * `null`) is checked first, and when one key's generation is not the one
   * expected nothing is written; then each `text` is written in order, only
   * when its key's generation is the one expected (the generation one more),
   * stopping at the first key whose generation is not. All written: `{ok:
   * true, rows: []}`; otherwise `{ok: false, rows}` with the current text and
   * generation of every key, in order (the writes made before the one that
   * stopped stay). A fleet whose store has it admits an attempt in two round
   * trips and records its outcome in one.
   */
  checkAndSet?(entries: readonly CheckAndSetEntry[]): CheckAndSetAnswer | Promise<CheckAndSetAnswer>;
  /** Release connections. */
  close?(): void | Promise<void>;
}

/** The store could not be read or written (unreachable, timed out, failing). */
export class StoreUnavailableError extends Error {
  /** The stable code, the same in both packages. */
  readonly code = "store_unavailable";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "StoreUnavailableError";
  }
}

/**
 * `append`'s answer: the event stored, or its `seq` taken, with the event
 * that holds it (a refused late event can be kept as evidence next to it).
 */
export type AppendAnswer = { ok: true; code: "appended" } | { ok: false; code: "seq_taken"; existing: string };

/** One event of a log: its number and its JSON text as appended. */
export interface LogEntry {
  seq: number;
  text: string;
}

/**
 * An append log. Every store of this package is one too. Methods may answer
 * synchronously or with a promise. A taken `seq` is an answer, never an
 * exception; a store that cannot be reached throws `StoreUnavailableError`.
 * A store does not require the numbers to follow one another: gaps and the
 * events' order are the journal's to check. Logs and registers are apart (a
 * log and a register may share a name).
 */
export interface AppendLog {
  /**
   * Store `text` (the JSON text of an object) under `seq` exactly as given,
   * byte for byte (a journal's hash chain covers those bytes), when `seq`
   * is free: `{ok: true, code: "appended"}`; else nothing changes: `{ok:
   * false, code: "seq_taken", existing}`.
   */
  append(log: string, seq: number, text: string): AppendAnswer | Promise<AppendAnswer>;
  /** The events whose `seq` is at least `fromSeq` (default 0), in `seq` order. */
  read(log: string, fromSeq?: number): LogEntry[] | Promise<LogEntry[]>;
  /** The highest `seq` held, `null` for an empty log. */
  lastSeq(log: string): number | null | Promise<number | null>;
  /**
   * `append` in the same transaction as a check that the register
   * `leaseKey` is at generation `leaseGeneration` (1 or more: a held lease);
   * when it is not, nothing is written: `{ok: false, code: "lease_lost"}`.
   * A journaled run appends this way when its store has it (memory, SQLite
   * and PostgreSQL do), so an owner whose lease was taken over cannot slip
   * one more event in.
   */
  appendFenced?(log: string, seq: number, text: string, leaseKey: string, leaseGeneration: number): FencedAppendAnswer | Promise<FencedAppendAnswer>;
}

/** `appendFenced`'s answer: `append`'s, or the lease moved. */
export type FencedAppendAnswer = AppendAnswer | { ok: false; code: "lease_lost" };

/** `appendFenced`'s answer when the lease register moved. */
export const LEASE_LOST: FencedAppendAnswer = Object.freeze({ ok: false, code: "lease_lost" }) as FencedAppendAnswer;

/** A held lease's generation: an integer in `1..MAX_SEQ`. */
export function checkLease(g: unknown): number {
  if (typeof g !== "number" || !Number.isSafeInteger(g) || g < 1) {
    throw new TypeError(`leaseGeneration must be an integer in 1..${MAX_SEQ} (a lease is held from generation 1), got ${String(g)}`);
  }
  return g;
}

/** `append`'s answer when the event is stored. */
export const APPENDED: AppendAnswer = Object.freeze({ ok: true, code: "appended" }) as AppendAnswer;

/** `append`'s answer when `seq` is taken. */
export function seqTaken(existing: string): AppendAnswer {
  return { ok: false, code: "seq_taken", existing };
}

/** The largest `seq` a log takes: the largest integer both packages hold exactly. */
export const MAX_SEQ = Number.MAX_SAFE_INTEGER;

/** A log's name: a non-empty string. */
export function checkLog(log: unknown): string {
  if (typeof log !== "string" || log === "") throw new TypeError("a log's name is a non-empty string");
  return log;
}

/** A `seq` (or `fromSeq`): an integer in `0..MAX_SEQ`. */
export function checkSeq(seq: unknown, name = "seq"): number {
  if (typeof seq !== "number" || !Number.isSafeInteger(seq) || seq < 0) {
    throw new TypeError(`${name} must be an integer in 0..${MAX_SEQ}, got ${String(seq)}`);
  }
  return seq;
}

/** What every store refuses before it is touched: a bad name, a bad `seq`, an event that is not the JSON text of an object. */
export function checkAppend(log: unknown, seq: unknown, text: unknown): void {
  checkLog(log);
  checkSeq(seq);
  if (typeof text !== "string") throw new TypeError(`an event is the JSON text of an object (a string), got ${typeof text}`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new TypeError(`an event is the JSON text of an object: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new TypeError("an event is the JSON text of an object");
}

/** A generation as a store answers it: a non-negative safe integer. */
export function checkGeneration(g: unknown, name = "expectedGeneration"): number {
  if (typeof g !== "number" || !Number.isSafeInteger(g) || g < 0) {
    throw new TypeError(`${name} must be a non-negative safe integer, got ${String(g)}`);
  }
  return g;
}

/** A document's stored text (JSON of a plain object). */
export function encodeDocument(document: StoreDocument): string {
  if (typeof document !== "object" || document === null || Array.isArray(document)) {
    throw new TypeError("a stored document is a JSON object");
  }
  return JSON.stringify(document);
}

/** A stored text back to its document. */
export function decodeDocument(text: string): StoreDocument {
  return JSON.parse(text) as StoreDocument;
}
