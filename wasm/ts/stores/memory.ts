/**
 * Registers and append logs in this process's memory: shared by every run
 * (and worker) of the process that holds the same `MemoryStore`; gone when
 * it exits.
 */

import {
  APPENDED,
  LEASE_LOST,
  checkLease,
  type FencedAppendAnswer,
  checkAppend,
  checkLog,
  checkSeq,
  seqTaken,
  type AppendAnswer,
  type AppendLog,
  type LogEntry,
  checkGeneration,
  decodeDocument,
  encodeDocument,
  type CheckAndSetAnswer,
  type CheckAndSetEntry,
  type FleetStore,
  type StoreDocument,
  type StoreRead,
  type StoreRow,
  type StoreWrite,
} from "./store.js";

export {
  StoreUnavailableError,
  type AppendAnswer,
  type AppendLog,
  type LogEntry,
  type CheckAndSetAnswer,
  type CheckAndSetEntry,
  type FleetStore,
  type StoreDocument,
  type StoreRead,
  type StoreRow,
  type StoreWrite,
} from "./store.js";

/** An in-memory register store and append log (documents kept as JSON text, so each read is a fresh copy). */
export class MemoryStore implements FleetStore, AppendLog {
  readonly #registers = new Map<string, { text: string; generation: number }>();
  readonly #logs = new Map<string, Map<number, string>>();

  /** `append` only while the register `leaseKey` is at `leaseGeneration` (see `AppendLog.appendFenced`). */
  appendFenced(log: string, seq: number, text: string, leaseKey: string, leaseGeneration: number): FencedAppendAnswer {
    checkAppend(log, seq, text);
    checkLease(leaseGeneration);
    if ((this.#registers.get(leaseKey)?.generation ?? 0) !== leaseGeneration) return LEASE_LOST;
    return this.append(log, seq, text);
  }

  /** Store the event under `seq` when it is free (see `AppendLog.append`). */
  append(log: string, seq: number, text: string): AppendAnswer {
    checkAppend(log, seq, text);
    let events = this.#logs.get(log);
    if (events === undefined) {
      events = new Map();
      this.#logs.set(log, events);
    }
    const existing = events.get(seq);
    if (existing !== undefined) return seqTaken(existing);
    events.set(seq, text);
    return APPENDED;
  }

  /** The events from `fromSeq` on, in `seq` order. */
  read(log: string, fromSeq = 0): LogEntry[] {
    checkLog(log);
    checkSeq(fromSeq, "fromSeq");
    const events = this.#logs.get(log);
    if (events === undefined) return [];
    return [...events.keys()]
      .filter((seq) => seq >= fromSeq)
      .sort((a, b) => a - b)
      .map((seq) => ({ seq, text: events.get(seq) as string }));
  }

  /** The highest `seq` held (`null`: the log is empty). */
  lastSeq(log: string): number | null {
    checkLog(log);
    const events = this.#logs.get(log);
    if (events === undefined || events.size === 0) return null;
    let last = -1;
    for (const seq of events.keys()) if (seq > last) last = seq;
    return last;
  }

  get(key: string): StoreRead {
    const r = this.#registers.get(key);
    return r === undefined ? { document: null, generation: 0 } : { document: decodeDocument(r.text), generation: r.generation };
  }

  getMany(keys: readonly string[]): StoreRead[] {
    return keys.map((k) => this.get(k));
  }

  compareAndSet(key: string, expectedGeneration: number, document: StoreDocument): StoreWrite {
    const expected = checkGeneration(expectedGeneration);
    const text = encodeDocument(document);
    const current = this.#registers.get(key)?.generation ?? 0;
    if (current !== expected) return { ok: false, generation: current };
    this.#registers.set(key, { text, generation: current + 1 });
    return { ok: true, generation: current + 1 };
  }

  getManyRaw(keys: readonly string[]): StoreRow[] {
    return keys.map((k) => {
      const r = this.#registers.get(k);
      return r === undefined ? { text: null, generation: 0 } : { text: r.text, generation: r.generation };
    });
  }

  /** The multi-key check-and-set (see `FleetStore.checkAndSet`); texts are stored as given. */
  checkAndSet(entries: readonly CheckAndSetEntry[]): CheckAndSetAnswer {
    const registers = this.#registers;
    const generation = (key: string): number => registers.get(key)?.generation ?? 0;
    for (const e of entries) checkGeneration(e.expectedGeneration);
    const current = (): CheckAndSetAnswer => ({ ok: false, rows: this.getManyRaw(entries.map((e) => e.key)) });
    for (const e of entries) {
      if (e.text === null && generation(e.key) !== e.expectedGeneration) return current();
    }
    for (const e of entries) {
      if (e.text === null) continue;
      if (generation(e.key) !== e.expectedGeneration) return current();
      registers.set(e.key, { text: e.text, generation: e.expectedGeneration + 1 });
    }
    return { ok: true, rows: [] };
  }

  /** The keys held, sorted. */
  keys(): string[] {
    return [...this.#registers.keys()].sort();
  }

  close(): void {}
}
