/**
 * Registers and append logs in PostgreSQL (`pg`), shared by every process on
 * every machine that reaches the database: the tables `retryledger_register`
 * (key, generation, document) and `retryledger_log` (log, seq, event),
 * created when missing, the same layout as the Python package's store.
 *
 * - a compare-and-set is one statement: `INSERT … ON CONFLICT DO NOTHING`
 *   from generation 0, `UPDATE … WHERE generation = expected` after it; the
 *   row's lock decides between racing writers, so of two processes that
 *   both expect generation 0 exactly one writes;
 * - the multi-key check-and-set is one call of the function
 *   `retryledger_check_and_set_v1` (PL/pgSQL, created with the tables): one
 *   round trip and one transaction, which first takes a transaction
 *   advisory lock per key (in one order, absent keys included), so two of
 *   them on the same keys run one after the other as the Redis script does;
 * - an append is one `INSERT … ON CONFLICT (log, seq) DO NOTHING`: the
 *   primary key refuses a taken number, and the event that holds it is read
 *   back for the answer;
 * - events and documents are `text` columns: stored byte for byte as given
 *   (`jsonb` would reorder keys).
 *
 * Statements go through a `pg.Pool` (the store's own, or yours). A server
 * that cannot be reached, a broken connection or a statement that fails
 * (over `statementTimeoutMs`, too) is `StoreUnavailableError`; nothing is
 * retried behind the caller's back: a write whose answer was lost may have
 * been made, and the caller's next read says.
 */

import pg from "pg";
import {
  APPENDED,
  LEASE_LOST,
  checkLease,
  type FencedAppendAnswer,
  checkAppend,
  checkGeneration,
  checkLog,
  checkSeq,
  decodeDocument,
  encodeDocument,
  seqTaken,
  StoreUnavailableError,
  type AppendAnswer,
  type AppendLog,
  type CheckAndSetAnswer,
  type CheckAndSetEntry,
  type FleetStore,
  type LogEntry,
  type StoreDocument,
  type StoreRead,
  type StoreRow,
  type StoreWrite,
} from "./store.js";

export { StoreUnavailableError } from "./store.js";

/** The tables, created when missing (the same statements as the Python package's). */
export const SCHEMA: readonly string[] = [
  "CREATE TABLE IF NOT EXISTS retryledger_register (key text PRIMARY KEY, generation bigint NOT NULL, document text NOT NULL)",
  "CREATE TABLE IF NOT EXISTS retryledger_log (log text NOT NULL, seq bigint NOT NULL, event text NOT NULL, PRIMARY KEY (log, seq))",
];

/**
 * The multi-key check-and-set (the same function as the Python package's):
 * for keys[i], expected[i] the generation expected and texts[i] the document
 * to write (NULL checks only). Every check-only key is checked first: one
 * differs, nothing is written. Then the documents are written in order, each
 * only when its generation is the one expected (its generation one more),
 * stopping at the first that is not. All written: one row (true, NULL, NULL,
 * NULL); otherwise a row (false, key, generation, document or NULL) for every
 * key, in order, as they now are.
 */
export const CHECK_AND_SET_FUNCTION = `
CREATE OR REPLACE FUNCTION retryledger_check_and_set_v1(keys text[], expected bigint[], texts text[])
RETURNS TABLE (r_ok boolean, r_key text, r_generation bigint, r_document text)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
  n integer := coalesce(array_length(keys, 1), 0);
  g bigint;
  done boolean := true;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('retryledger register'), h.h)
    FROM (SELECT DISTINCT hashtext(u.k) AS h FROM unnest(keys) AS u(k) ORDER BY 1) AS h;
  FOR i IN 1..n LOOP
    IF texts[i] IS NULL THEN
      SELECT r.generation INTO g FROM retryledger_register AS r WHERE r.key = keys[i];
      IF coalesce(g, 0) <> expected[i] THEN
        done := false;
        EXIT;
      END IF;
    END IF;
  END LOOP;
  IF done THEN
    FOR i IN 1..n LOOP
      CONTINUE WHEN texts[i] IS NULL;
      IF expected[i] = 0 THEN
        INSERT INTO retryledger_register AS r (key, generation, document) VALUES (keys[i], 1, texts[i])
          ON CONFLICT ON CONSTRAINT retryledger_register_pkey DO NOTHING;
      ELSE
        UPDATE retryledger_register AS r SET generation = r.generation + 1, document = texts[i]
          WHERE r.key = keys[i] AND r.generation = expected[i];
      END IF;
      IF NOT FOUND THEN
        done := false;
        EXIT;
      END IF;
    END LOOP;
  END IF;
  IF done THEN
    RETURN QUERY SELECT true, NULL::text, NULL::bigint, NULL::text;
  ELSE
    RETURN QUERY SELECT false, u.k, coalesce(r.generation, 0::bigint), r.document
      FROM unnest(keys) WITH ORDINALITY AS u(k, i)
      LEFT JOIN retryledger_register AS r ON r.key = u.k
      ORDER BY u.i;
  END IF;
END
$fn$
`;

// Creating the tables and the function is serialized across processes (two
// sessions creating the same table at once collide in the catalog).
const SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('retryledger schema'))";

const Q = {
  selectMany: { name: "retryledger_select_many", text: "SELECT key, generation, document FROM retryledger_register WHERE key = ANY($1::text[])" },
  selectGeneration: { name: "retryledger_select_generation", text: "SELECT generation FROM retryledger_register WHERE key = $1" },
  create: {
    name: "retryledger_create",
    text: "INSERT INTO retryledger_register (key, generation, document) VALUES ($1, 1, $2) ON CONFLICT (key) DO NOTHING",
  },
  update: {
    name: "retryledger_update",
    text: "UPDATE retryledger_register SET generation = generation + 1, document = $1 WHERE key = $2 AND generation = $3",
  },
  checkAndSet: { name: "retryledger_check_and_set", text: "SELECT * FROM retryledger_check_and_set_v1($1::text[], $2::bigint[], $3::text[])" },
  append: {
    name: "retryledger_append",
    text: "INSERT INTO retryledger_log (log, seq, event) VALUES ($1, $2, $3) ON CONFLICT (log, seq) DO NOTHING",
  },
  // The lease row is locked FOR SHARE: a takeover's UPDATE waits for this
  // append's commit, and an append after the takeover re-reads the new
  // generation and inserts nothing.
  appendFenced: {
    name: "retryledger_append_fenced",
    text:
      "WITH lease AS (SELECT 1 FROM retryledger_register WHERE key = $4 AND generation = $5 FOR SHARE) " +
      "INSERT INTO retryledger_log (log, seq, event) SELECT $1, $2, $3 FROM lease ON CONFLICT (log, seq) DO NOTHING",
  },
  fencedWhy: {
    name: "retryledger_fenced_why",
    text:
      "SELECT (SELECT generation FROM retryledger_register WHERE key = $1) AS generation, " +
      "(SELECT event FROM retryledger_log WHERE log = $2 AND seq = $3) AS event",
  },
  event: { name: "retryledger_event", text: "SELECT event FROM retryledger_log WHERE log = $1 AND seq = $2" },
  read: { name: "retryledger_read", text: "SELECT seq, event FROM retryledger_log WHERE log = $1 AND seq >= $2 ORDER BY seq" },
  last: { name: "retryledger_last", text: "SELECT max(seq) AS last FROM retryledger_log WHERE log = $1" },
} as const;

export interface PostgresStoreOptions {
  /** `postgresql://user@host:port/db`; absent: the `PG*` environment variables (as `pg` reads them). Ignored with `pool`. */
  connectionString?: string;
  /** A pool of your own (its options are yours; it is not ended by `close`). */
  pool?: pg.Pool;
  /** Connections of the store's own pool (default 4). */
  max?: number;
  /** How long a connection attempt waits, ms (default 2000). */
  connectTimeoutMs?: number;
  /** How long a statement may run, a lock wait included, ms (default 5000). */
  statementTimeoutMs?: number;
  /** `false` leaves the tables and the function to the database's owner (default `true`: created when missing). */
  create?: boolean;
}

type Text = string | null;

export class PostgresStore implements FleetStore, AppendLog {
  readonly pool: pg.Pool;
  readonly #owned: boolean;
  readonly #create: boolean;
  #schema: Promise<void> | null = null;

  constructor(options: PostgresStoreOptions = {}) {
    this.#create = options.create ?? true;
    if (options.pool !== undefined) {
      this.pool = options.pool;
      this.#owned = false;
    } else {
      const connectTimeoutMs = options.connectTimeoutMs ?? 2000;
      const statementTimeoutMs = options.statementTimeoutMs ?? 5000;
      const config: pg.PoolConfig = {
        max: options.max ?? 4,
        connectionTimeoutMillis: connectTimeoutMs,
        statement_timeout: statementTimeoutMs,
        // A connection that stops answering mid-statement fails instead of hanging.
        query_timeout: statementTimeoutMs + connectTimeoutMs,
      };
      if (options.connectionString !== undefined) config.connectionString = options.connectionString;
      this.pool = new pg.Pool(config);
      // An idle connection the server ends is dropped from the pool; the next statement opens another.
      this.pool.on("error", () => {});
      this.#owned = true;
    }
  }

  /** The tables and the function, created once (again after a failure). */
  #ready(): Promise<void> {
    if (!this.#create) return Promise.resolve();
    if (this.#schema === null) {
      this.#schema = (async () => {
        const client = await this.pool.connect();
        try {
          await client.query("BEGIN");
          await client.query(SCHEMA_LOCK);
          for (const statement of SCHEMA) await client.query(statement);
          await client.query(CHECK_AND_SET_FUNCTION);
          await client.query("COMMIT");
          client.release();
        } catch (e) {
          // The connection is not given back: its transaction may be open.
          client.release(e instanceof Error ? e : true);
          throw e;
        }
      })();
      this.#schema.catch(() => {
        this.#schema = null;
      });
    }
    return this.#schema;
  }

  async #query<R extends pg.QueryResultRow>(q: { name: string; text: string }, values: unknown[]): Promise<pg.QueryResult<R>> {
    try {
      await this.#ready();
      return await this.pool.query<R>({ name: q.name, text: q.text, values });
    } catch (e) {
      throw unavailable(e);
    }
  }

  async get(key: string): Promise<StoreRead> {
    const [row] = await this.getManyRaw([key]);
    return read(row as StoreRow);
  }

  /** Several keys in one statement. */
  async getMany(keys: readonly string[]): Promise<StoreRead[]> {
    return (await this.getManyRaw(keys)).map(read);
  }

  /** `getMany` as stored JSON text, in one statement. */
  async getManyRaw(keys: readonly string[]): Promise<StoreRow[]> {
    const result = await this.#query<{ key: string; generation: string; document: string }>(Q.selectMany, [[...keys]]);
    const found = new Map<string, StoreRow>();
    for (const r of result.rows) found.set(r.key, { text: r.document, generation: Number(r.generation) });
    return keys.map((k) => found.get(k) ?? { text: null, generation: 0 });
  }

  /** One statement; when it writes nothing, one more reads the generation. */
  async compareAndSet(key: string, expectedGeneration: number, document: StoreDocument): Promise<StoreWrite> {
    const expected = checkGeneration(expectedGeneration);
    const text = encodeDocument(document);
    const written = expected === 0 ? await this.#query(Q.create, [key, text]) : await this.#query(Q.update, [text, key, expected]);
    if (written.rowCount === 1) return { ok: true, generation: expected + 1 };
    const current = await this.#query<{ generation: string }>(Q.selectGeneration, [key]);
    const row = current.rows[0];
    return { ok: false, generation: row === undefined ? 0 : Number(row.generation) };
  }

  /** The multi-key check-and-set (see `FleetStore.checkAndSet`): one call of `retryledger_check_and_set_v1`, one round trip, one transaction. */
  async checkAndSet(entries: readonly CheckAndSetEntry[]): Promise<CheckAndSetAnswer> {
    const keys: string[] = [];
    const expected: number[] = [];
    const texts: Text[] = [];
    for (const e of entries) {
      keys.push(e.key);
      expected.push(checkGeneration(e.expectedGeneration));
      texts.push(e.text);
    }
    const result = await this.#query<{ r_ok: boolean; r_generation: string | null; r_document: Text }>(Q.checkAndSet, [keys, expected, texts]);
    const first = result.rows[0];
    if (first !== undefined && first.r_ok) return { ok: true, rows: [] };
    return { ok: false, rows: result.rows.map((r) => ({ text: r.r_document, generation: Number(r.r_generation ?? 0) })) };
  }

  /** `append` only while the register `leaseKey` is at `leaseGeneration`: one statement that locks the lease row and inserts; when nothing was inserted, one more tells a taken `seq` from a lost lease (see `AppendLog.appendFenced`). */
  async appendFenced(log: string, seq: number, text: string, leaseKey: string, leaseGeneration: number): Promise<FencedAppendAnswer> {
    checkAppend(log, seq, text);
    checkLease(leaseGeneration);
    const inserted = await this.#query(Q.appendFenced, [log, seq, text, leaseKey, leaseGeneration]);
    if (inserted.rowCount === 1) return APPENDED;
    // Why nothing was written: the lease moved (first), or the seq is taken.
    const why = await this.#query<{ generation: string | null; event: string | null }>(Q.fencedWhy, [leaseKey, log, seq]);
    const row = why.rows[0];
    if (row === undefined || row.generation === null || Number(row.generation) !== leaseGeneration || row.event === null) return LEASE_LOST;
    return seqTaken(row.event);
  }

  /** Store the event under `seq` when it is free (see `AppendLog.append`): one `INSERT`; when the number is taken, one more reads the event that holds it. */
  async append(log: string, seq: number, text: string): Promise<AppendAnswer> {
    checkAppend(log, seq, text);
    const inserted = await this.#query(Q.append, [log, seq, text]);
    if (inserted.rowCount === 1) return APPENDED;
    const held = await this.#query<{ event: string }>(Q.event, [log, seq]);
    const row = held.rows[0];
    if (row === undefined) throw new StoreUnavailableError(`postgres store: seq ${seq} of ${log} refused and not found`);
    return seqTaken(row.event);
  }

  /** The events from `fromSeq` on, in `seq` order. */
  async read(log: string, fromSeq = 0): Promise<LogEntry[]> {
    checkLog(log);
    checkSeq(fromSeq, "fromSeq");
    const result = await this.#query<{ seq: string; event: string }>(Q.read, [log, fromSeq]);
    return result.rows.map((r) => ({ seq: Number(r.seq), text: r.event }));
  }

  /** The highest `seq` held (`null`: the log is empty). */
  async lastSeq(log: string): Promise<number | null> {
    checkLog(log);
    const result = await this.#query<{ last: string | null }>(Q.last, [log]);
    const last = result.rows[0]?.last ?? null;
    return last === null ? null : Number(last);
  }

  /** End the pool (only one this store made). */
  async close(): Promise<void> {
    if (this.#owned) await this.pool.end();
  }
}

function read(r: StoreRow): StoreRead {
  return r.text === null ? { document: null, generation: 0 } : { document: decodeDocument(r.text), generation: r.generation };
}

function unavailable(e: unknown): StoreUnavailableError {
  if (e instanceof StoreUnavailableError) return e;
  return new StoreUnavailableError(`postgres store: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
}
