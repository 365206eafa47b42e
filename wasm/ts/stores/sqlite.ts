/**
 * Registers and append logs in a SQLite file (`better-sqlite3`), shared by
 * every process on the machine that opens the same file: the tables
 * `retryledger_register` (key, generation, document) and `retryledger_log`
 * (log, seq, event), the same layout as the Python package's store. A
 * compare-and-set is one `BEGIN IMMEDIATE` transaction (the write lock is
 * taken before the generation is read), an append one `INSERT` that the
 * primary key `(log, seq)` refuses when the number is taken; the journal is
 * WAL and a busy timeout bounds the wait for another writer. SQLite errors
 * (a busy timeout, an unreadable file) are `StoreUnavailableError`.
 *
 * `synchronous` is SQLite's setting: `NORMAL` (the default, as in the
 * Python package) loses no commit when a process dies and may lose the last
 * ones when the machine does (power, kernel); `FULL` syncs every commit,
 * which survives both at the cost of a sync per commit (docs/BENCHMARKS.md).
 */

import Database from "better-sqlite3";
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
const LOG_SCHEMA =
  "CREATE TABLE IF NOT EXISTS retryledger_log (log TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, PRIMARY KEY (log, seq)) WITHOUT ROWID";

export interface SQLiteStoreOptions {
  /** How long a write waits for another process's lock, ms (default 5000). */
  busyTimeoutMs?: number;
  /** SQLite's `synchronous`: `"NORMAL"` (default) or `"FULL"` (see the module's documentation). */
  synchronous?: "NORMAL" | "FULL";
}

type Row = { generation: number; document: string };
type KeyedRow = Row & { key: string };

export class SQLiteStore implements FleetStore, AppendLog {
  readonly path: string;
  /** `synchronous` as the connection reports it. */
  readonly synchronous: "NORMAL" | "FULL";
  /** The journal mode as the connection reports it (`wal`). */
  readonly journalMode: string;
  readonly #db: Database.Database;
  readonly #append: Database.Statement<[string, number, string]>;
  readonly #event: Database.Statement<[string, number], { event: string }>;
  readonly #read: Database.Statement<[string, number], { seq: number; event: string }>;
  readonly #last: Database.Statement<[string], { last: number | null }>;
  readonly #get: Database.Statement<[string], Row>;
  readonly #gen: Database.Statement<[string], { generation: number }>;
  readonly #put: Database.Statement<[string, number, string]>;
  readonly #cas: (key: string, expected: number, text: string) => StoreWrite;
  readonly #fenced: (log: string, seq: number, text: string, leaseKey: string, lease: number) => FencedAppendAnswer;
  readonly #checkAndSet: (entries: readonly CheckAndSetEntry[]) => CheckAndSetAnswer;
  /** `SELECT … WHERE key IN (?, …)` by number of keys. */
  readonly #selects = new Map<number, Database.Statement<string[], KeyedRow>>();

  /** Open (creating when absent) the SQLite file at `path`. */
  constructor(path: string, options: SQLiteStoreOptions = {}) {
    this.path = path;
    const timeout = options.busyTimeoutMs ?? 5000;
    const synchronous = options.synchronous ?? "NORMAL";
    if (synchronous !== "NORMAL" && synchronous !== "FULL") throw new TypeError(`synchronous must be "NORMAL" or "FULL", got ${String(synchronous)}`);
    try {
      const db = new Database(path, { timeout });
      this.journalMode = String(db.pragma("journal_mode = WAL", { simple: true }));
      db.pragma(`synchronous = ${synchronous}`);
      this.synchronous = db.pragma("synchronous", { simple: true }) === 2 ? "FULL" : "NORMAL";
      db.exec(SCHEMA);
      db.exec(LOG_SCHEMA);
      this.#db = db;
      this.#append = db.prepare<[string, number, string]>("INSERT INTO retryledger_log (log, seq, event) VALUES (?, ?, ?) ON CONFLICT (log, seq) DO NOTHING");
      this.#event = db.prepare<[string, number], { event: string }>("SELECT event FROM retryledger_log WHERE log = ? AND seq = ?");
      this.#read = db.prepare<[string, number], { seq: number; event: string }>("SELECT seq, event FROM retryledger_log WHERE log = ? AND seq >= ? ORDER BY seq");
      this.#last = db.prepare<[string], { last: number | null }>("SELECT max(seq) AS last FROM retryledger_log WHERE log = ?");
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
      // The lease's generation is read under the write lock, then the insert.
      const fenced = db.transaction((log: string, seq: number, text: string, leaseKey: string, lease: number): FencedAppendAnswer => {
        if ((this.#gen.get(leaseKey)?.generation ?? 0) !== lease) return LEASE_LOST;
        if (this.#append.run(log, seq, text).changes === 1) return APPENDED;
        const row = this.#event.get(log, seq);
        if (row === undefined) throw new StoreUnavailableError(`sqlite store ${this.path}: seq ${seq} of ${log} refused and not found`);
        return seqTaken(row.event);
      });
      this.#fenced = (log, seq, text, leaseKey, lease) => fenced.immediate(log, seq, text, leaseKey, lease);
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

  /** `append` only while the register `leaseKey` is at `leaseGeneration`: one `BEGIN IMMEDIATE` transaction (see `AppendLog.appendFenced`). */
  appendFenced(log: string, seq: number, text: string, leaseKey: string, leaseGeneration: number): FencedAppendAnswer {
    checkAppend(log, seq, text);
    checkLease(leaseGeneration);
    try {
      return this.#fenced(log, seq, text, leaseKey, leaseGeneration);
    } catch (e) {
      if (e instanceof StoreUnavailableError) throw e;
      throw unavailable(this.path, e);
    }
  }

  /** Store the event under `seq` when it is free (see `AppendLog.append`): one `INSERT`, refused by the primary key when the number is taken. */
  append(log: string, seq: number, text: string): AppendAnswer {
    checkAppend(log, seq, text);
    let row: { event: string } | undefined;
    try {
      if (this.#append.run(log, seq, text).changes === 1) return APPENDED;
      row = this.#event.get(log, seq);
    } catch (e) {
      throw unavailable(this.path, e);
    }
    if (row === undefined) throw new StoreUnavailableError(`sqlite store ${this.path}: seq ${seq} of ${log} refused and not found`);
    return seqTaken(row.event);
  }

  /** The events from `fromSeq` on, in `seq` order. */
  read(log: string, fromSeq = 0): LogEntry[] {
    checkLog(log);
    checkSeq(fromSeq, "fromSeq");
    try {
      return this.#read.all(log, fromSeq).map((r) => ({ seq: r.seq, text: r.event }));
    } catch (e) {
      throw unavailable(this.path, e);
    }
  }

  /** The highest `seq` held (`null`: the log is empty). */
  lastSeq(log: string): number | null {
    checkLog(log);
    try {
      return this.#last.get(log)?.last ?? null;
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
