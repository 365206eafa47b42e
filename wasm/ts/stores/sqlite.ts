/**
 * Registers in a SQLite file (`better-sqlite3`), shared by every process on
 * the machine that opens the same file: the table `retryledger_register`
 * (key, generation, document), the same layout as the Python package's
 * store. A compare-and-set is one `BEGIN IMMEDIATE` transaction (the write
 * lock is taken before the generation is read); the journal is WAL and a
 * busy timeout bounds the wait for another writer. SQLite errors (a busy
 * timeout, an unreadable file) are `StoreUnavailableError`.
 */

import Database from "better-sqlite3";
import {
  checkGeneration,
  decodeDocument,
  encodeDocument,
  StoreUnavailableError,
  type CheckAndSetAnswer,
  type CheckAndSetEntry,
  type FleetStore,
  type StoreDocument,
  type StoreRead,
  type StoreRow,
  type StoreWrite,
} from "./store.js";

export { StoreUnavailableError } from "./store.js";

const SCHEMA = "CREATE TABLE IF NOT EXISTS retryledger_register (key TEXT PRIMARY KEY NOT NULL, generation INTEGER NOT NULL, document TEXT NOT NULL)";

export interface SQLiteStoreOptions {
  /** How long a write waits for another process's lock, ms (default 5000). */
  busyTimeoutMs?: number;
}

type Row = { generation: number; document: string };
type KeyedRow = Row & { key: string };

export class SQLiteStore implements FleetStore {
  readonly path: string;
  readonly #db: Database.Database;
  readonly #get: Database.Statement<[string], Row>;
  readonly #gen: Database.Statement<[string], { generation: number }>;
  readonly #put: Database.Statement<[string, number, string]>;
  readonly #cas: (key: string, expected: number, text: string) => StoreWrite;
  readonly #checkAndSet: (entries: readonly CheckAndSetEntry[]) => CheckAndSetAnswer;
  /** `SELECT … WHERE key IN (?, …)` by number of keys. */
  readonly #selects = new Map<number, Database.Statement<string[], KeyedRow>>();

  /** Open (creating when absent) the SQLite file at `path`. */
  constructor(path: string, options: SQLiteStoreOptions = {}) {
    this.path = path;
    const timeout = options.busyTimeoutMs ?? 5000;
    try {
      const db = new Database(path, { timeout });
      db.pragma("journal_mode = WAL");
      db.exec(SCHEMA);
      this.#db = db;
      this.#get = db.prepare<[string], Row>("SELECT generation, document FROM retryledger_register WHERE key = ?");
      this.#gen = db.prepare<[string], { generation: number }>("SELECT generation FROM retryledger_register WHERE key = ?");
      this.#put = db.prepare<[string, number, string]>(
        "INSERT INTO retryledger_register (key, generation, document) VALUES (?, ?, ?) " +
          "ON CONFLICT(key) DO UPDATE SET generation = excluded.generation, document = excluded.document",
      );
      const tx = db.transaction((key: string, expected: number, text: string): StoreWrite => {
        const current = this.#gen.get(key)?.generation ?? 0;
        if (current !== expected) return { ok: false, generation: current };
        this.#put.run(key, current + 1, text);
        return { ok: true, generation: current + 1 };
      });
      this.#cas = (key, expected, text) => tx.immediate(key, expected, text);
      // The write lock is taken before any generation is read; the writes
      // made before a conflict are committed (see FleetStore.checkAndSet).
      const multi = db.transaction((entries: readonly CheckAndSetEntry[]): CheckAndSetAnswer => {
        const rows = this.#rows(entries.map((e) => e.key));
        if (entries.some((e, i) => e.text === null && (rows[i] as StoreRow).generation !== e.expectedGeneration)) return { ok: false, rows };
        for (let i = 0; i < entries.length; i++) {
          const e = entries[i] as CheckAndSetEntry;
          if (e.text === null) continue;
          if ((rows[i] as StoreRow).generation !== e.expectedGeneration) return { ok: false, rows };
          this.#put.run(e.key, e.expectedGeneration + 1, e.text);
          rows[i] = { text: e.text, generation: e.expectedGeneration + 1 };
        }
        return { ok: true, rows: [] };
      });
      this.#checkAndSet = (entries) => multi.immediate(entries);
    } catch (e) {
      throw unavailable(path, e);
    }
  }

  get(key: string): StoreRead {
    let row: Row | undefined;
    try {
      row = this.#get.get(key);
    } catch (e) {
      throw unavailable(this.path, e);
    }
    return row === undefined ? { document: null, generation: 0 } : { document: decodeDocument(row.document), generation: row.generation };
  }

  getMany(keys: readonly string[]): StoreRead[] {
    return keys.map((k) => this.get(k));
  }

  /** The text and generation of several keys, in one statement. */
  #rows(keys: readonly string[]): StoreRow[] {
    if (keys.length === 0) return [];
    let select = this.#selects.get(keys.length);
    if (select === undefined) {
      select = this.#db.prepare<string[], KeyedRow>(
        `SELECT key, generation, document FROM retryledger_register WHERE key IN (${keys.map(() => "?").join(",")})`,
      );
      this.#selects.set(keys.length, select);
    }
    const found = new Map<string, StoreRow>();
    for (const row of select.all(...keys)) found.set(row.key, { text: row.document, generation: row.generation });
    return keys.map((k) => found.get(k) ?? { text: null, generation: 0 });
  }

  getManyRaw(keys: readonly string[]): StoreRow[] {
    try {
      return this.#rows(keys);
    } catch (e) {
      throw unavailable(this.path, e);
    }
  }

  /** The multi-key check-and-set (see `FleetStore.checkAndSet`): one `BEGIN IMMEDIATE` transaction. */
  checkAndSet(entries: readonly CheckAndSetEntry[]): CheckAndSetAnswer {
    for (const e of entries) checkGeneration(e.expectedGeneration);
    try {
      return this.#checkAndSet(entries);
    } catch (e) {
      throw unavailable(this.path, e);
    }
  }

  compareAndSet(key: string, expectedGeneration: number, document: StoreDocument): StoreWrite {
    const expected = checkGeneration(expectedGeneration);
    const text = encodeDocument(document);
    try {
      return this.#cas(key, expected, text);
    } catch (e) {
      throw unavailable(this.path, e);
    }
  }

  close(): void {
    if (this.#db.open) this.#db.close();
  }
}

function unavailable(path: string, e: unknown): StoreUnavailableError {
  return new StoreUnavailableError(`sqlite store ${path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
}
