/**
 * Registers in this process's memory: shared by every run (and worker) of
 * the process that holds the same `MemoryStore`; gone when it exits.
 */

import { checkGeneration, decodeDocument, encodeDocument, type FleetStore, type StoreDocument, type StoreRead, type StoreWrite } from "./store.js";

export { StoreUnavailableError, type FleetStore, type StoreDocument, type StoreRead, type StoreWrite } from "./store.js";

/** An in-memory register store (documents kept as JSON text, so each read is a fresh copy). */
export class MemoryStore implements FleetStore {
  readonly #registers = new Map<string, { text: string; generation: number }>();

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

  /** The keys held, sorted. */
  keys(): string[] {
    return [...this.#registers.keys()].sort();
  }

  close(): void {}
}
