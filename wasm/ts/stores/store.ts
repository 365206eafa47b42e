/**
 * What a fleet's store is: a register per key holding a JSON document and
 * the store's own generation (a version counter, 0 for a key it does not
 * hold), written only by compare-and-set. Stores hold documents; every
 * transition is the core's. The conformance scenarios every backend runs are
 * `tests/stores/register.json`.
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
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "StoreUnavailableError";
  }
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
