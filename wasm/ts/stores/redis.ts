/**
 * Registers and append logs in Redis (`ioredis`), shared by every machine
 * that reaches the server: each key a hash with the document (`d`) and the
 * generation (`g`), the same layout as the Python package's store. A log is
 * one hash under `retryledger:log:<name>` (`LOG_PREFIX`): a field per event
 * (its `seq` in decimal, the event's text as given) and the field `last`
 * (the highest `seq`); an append is one Lua script (`APPEND_SCRIPT`), a read
 * one `HGETALL` (a log is one run's journal: tens of events). A compare-and-set is one
 * Lua script (`CAS_SCRIPT`): it compares the stored generation and sets
 * document and generation atomically. Reads of several keys go in one
 * pipeline. Commands are never queued while disconnected: a store that
 * cannot be reached within the timeouts throws `StoreUnavailableError` at
 * once, and the client reconnects in the background.
 */

import { Redis, type RedisOptions } from "ioredis";
import {
  APPENDED,
  LEASE_LOST,
  checkAppend,
  checkLease,
  checkLog,
  checkSeq,
  seqTaken,
  type AppendAnswer,
  type AppendLog,
  type FencedAppendAnswer,
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

/** KEYS[1] the register, ARGV[1] the expected generation, ARGV[2] the document: `{1, new generation}` or `{0, current}`. */
export const CAS_SCRIPT = `
local g = tonumber(redis.call('HGET', KEYS[1], 'g') or '0')
if g ~= tonumber(ARGV[1]) then
  return {0, g}
end
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'g', g + 1)
return {1, g + 1}
`;

/**
 * The multi-key check-and-set (the same script as the Python package's).
 * KEYS the registers; for KEYS[i], ARGV[2i-1] the expected generation and
 * ARGV[2i] the document to write ('' checks only). Every check-only key is
 * checked first: one differs, nothing is written. Then the documents are
 * written in order, each only when its generation is the one expected (its
 * generation one more), stopping at the first that is not. All written:
 * `{1}`; otherwise `{0, document or nil, generation, ...}` for every key, in
 * order, as they now are.
 */
export const CHECK_AND_SET_SCRIPT = `
local n = #KEYS
local function current()
  local out = {0}
  for j = 1, n do
    local row = redis.call('HMGET', KEYS[j], 'd', 'g')
    out[2 * j] = row[1]
    out[2 * j + 1] = tonumber(row[2] or '0')
  end
  return out
end
for i = 1, n do
  if ARGV[2 * i] == '' and tonumber(redis.call('HGET', KEYS[i], 'g') or '0') ~= tonumber(ARGV[2 * i - 1]) then
    return current()
  end
end
for i = 1, n do
  local d = ARGV[2 * i]
  if d ~= '' then
    local g = tonumber(redis.call('HGET', KEYS[i], 'g') or '0')
    if g ~= tonumber(ARGV[2 * i - 1]) then
      return current()
    end
    redis.call('HSET', KEYS[i], 'd', d, 'g', g + 1)
  end
end
return {1}
`;

/** The Redis key of a log is this prefix and the log's name. */
export const LOG_PREFIX = "retryledger:log:";

/** KEYS[1] the log, ARGV[1] the seq (decimal), ARGV[2] the event's text: `{1}` (stored) or `{0, the event that holds the seq}` (the same script as the Python package's). */
export const APPEND_SCRIPT = `
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return {0, redis.call('HGET', KEYS[1], ARGV[1])}
end
local last = redis.call('HGET', KEYS[1], 'last')
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'last', ARGV[1])
end
return {1}
`;

/**
 * The fenced append: KEYS[1] the log, KEYS[2] the lease register, ARGV[1] the
 * seq (decimal), ARGV[2] the event's text, ARGV[3] the lease generation:
 * `{2}` (the lease moved: nothing written), `{1}` (stored) or `{0, the event
 * that holds the seq}`. One script, so no takeover falls between the lease
 * check and the append (the same script as the Python package's).
 */
export const APPEND_FENCED_SCRIPT = `
if tonumber(redis.call('HGET', KEYS[2], 'g') or '0') ~= tonumber(ARGV[3]) then
  return {2}
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return {0, redis.call('HGET', KEYS[1], ARGV[1])}
end
local last = redis.call('HGET', KEYS[1], 'last')
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'last', ARGV[1])
end
return {1}
`;

export interface RedisStoreOptions {
  /** `redis://host:port/db` (default `redis://127.0.0.1:6379`), when no `client` is given. */
  url?: string;
  /** A client of your own (its options are yours: keep its offline queue off for fast failure). */
  client?: Redis;
  /** Per-command timeout, ms (default 1000). */
  commandTimeoutMs?: number;
  /** Connect timeout, ms (default 1000). */
  connectTimeoutMs?: number;
}

type CasClient = Redis & {
  retryledgerCas(key: string, expected: number, document: string): Promise<[number, number]>;
  retryledgerCheckAndSet(numberOfKeys: number, ...keysThenArgs: (string | number)[]): Promise<(string | number | null)[]>;
  retryledgerAppend(key: string, seq: string, text: string): Promise<[number, string?]>;
  retryledgerAppendFenced(log: string, lease: string, seq: string, text: string, generation: string): Promise<[number, string?]>;
};

export class RedisStore implements FleetStore, AppendLog {
  readonly client: Redis;
  readonly #owned: boolean;
  readonly #connectTimeoutMs: number;

  constructor(options: RedisStoreOptions = {}) {
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 1000;
    if (options.client !== undefined) {
      this.client = options.client;
      this.#owned = false;
    } else {
      const o: RedisOptions = {
        commandTimeout: options.commandTimeoutMs ?? 1000,
        connectTimeout: this.#connectTimeoutMs,
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        retryStrategy: (times) => Math.min(times * 50, 500),
      };
      this.client = new Redis(options.url ?? "redis://127.0.0.1:6379", o);
      // Errors surface on the commands; a client without a listener would print them.
      this.client.on("error", () => {});
      this.#owned = true;
    }
    if (typeof (this.client as unknown as Partial<CasClient>).retryledgerCas !== "function") {
      this.client.defineCommand("retryledgerCas", { numberOfKeys: 1, lua: CAS_SCRIPT });
    }
    if (typeof (this.client as unknown as Partial<CasClient>).retryledgerCheckAndSet !== "function") {
      // The number of keys is the first argument of each call.
      this.client.defineCommand("retryledgerCheckAndSet", { lua: CHECK_AND_SET_SCRIPT });
    }
    if (typeof (this.client as unknown as Partial<CasClient>).retryledgerAppend !== "function") {
      this.client.defineCommand("retryledgerAppend", { numberOfKeys: 1, lua: APPEND_SCRIPT });
    }
    if (typeof (this.client as unknown as Partial<CasClient>).retryledgerAppendFenced !== "function") {
      this.client.defineCommand("retryledgerAppendFenced", { numberOfKeys: 2, lua: APPEND_FENCED_SCRIPT });
    }
  }

  /** Wait for the connection when it is being made (at start, after a restart), at most the connect timeout. */
  async #ready(): Promise<void> {
    const c = this.client;
    if (c.status === "ready") return;
    if (c.status === "end" || c.status === "close") throw new StoreUnavailableError(`redis store: connection ${c.status}`);
    await new Promise<void>((resolve, reject) => {
      const done = (e?: Error): void => {
        clearTimeout(timer);
        c.off("ready", onReady);
        c.off("end", onEnd);
        if (e === undefined) resolve();
        else reject(e);
      };
      const onReady = (): void => done();
      const onEnd = (): void => done(new StoreUnavailableError("redis store: connection ended"));
      const timer = setTimeout(() => done(new StoreUnavailableError(`redis store: not connected after ${this.#connectTimeoutMs} ms (${c.status})`)), this.#connectTimeoutMs);
      c.on("ready", onReady);
      c.on("end", onEnd);
    });
  }

  async get(key: string): Promise<StoreRead> {
    try {
      await this.#ready();
      return read(await this.client.hmget(key, "d", "g"));
    } catch (e) {
      throw unavailable(e);
    }
  }

  async getMany(keys: readonly string[]): Promise<StoreRead[]> {
    try {
      await this.#ready();
      const p = this.client.pipeline();
      for (const k of keys) p.hmget(k, "d", "g");
      const results = (await p.exec()) ?? [];
      return results.map(([err, value]) => {
        if (err) throw err;
        return read(value as (string | null)[]);
      });
    } catch (e) {
      throw unavailable(e);
    }
  }

  /** `getMany` as stored JSON text, in one pipeline. */
  async getManyRaw(keys: readonly string[]): Promise<StoreRow[]> {
    try {
      await this.#ready();
      const p = this.client.pipeline();
      for (const k of keys) p.hmget(k, "d", "g");
      const results = (await p.exec()) ?? [];
      return results.map(([err, value]) => {
        if (err) throw err;
        const [d, g] = value as (string | null)[];
        return row(d ?? null, g ?? null);
      });
    } catch (e) {
      throw unavailable(e);
    }
  }

  /**
   * The multi-key check-and-set (see `FleetStore.checkAndSet`): one Lua
   * script, atomic on the server, one round trip. (Under Redis Cluster the
   * keys must share a hash slot: give the fleet a namespace with a hash tag.)
   */
  async checkAndSet(entries: readonly CheckAndSetEntry[]): Promise<CheckAndSetAnswer> {
    const keys: string[] = [];
    const args: (string | number)[] = [];
    for (const e of entries) {
      keys.push(e.key);
      args.push(checkGeneration(e.expectedGeneration), e.text ?? "");
    }
    let answer: (string | number | null)[];
    try {
      await this.#ready();
      answer = await (this.client as unknown as CasClient).retryledgerCheckAndSet(keys.length, ...keys, ...args);
    } catch (e) {
      throw unavailable(e);
    }
    if (Number(answer[0]) === 1) return { ok: true, rows: [] };
    return { ok: false, rows: keys.map((_, i) => row((answer[1 + 2 * i] ?? null) as string | null, answer[2 + 2 * i] ?? null)) };
  }

  async compareAndSet(key: string, expectedGeneration: number, document: StoreDocument): Promise<StoreWrite> {
    const expected = checkGeneration(expectedGeneration);
    const text = encodeDocument(document);
    try {
      await this.#ready();
      const [ok, generation] = await (this.client as unknown as CasClient).retryledgerCas(key, expected, text);
      return { ok: ok === 1, generation: Number(generation) };
    } catch (e) {
      throw unavailable(e);
    }
  }

  /** Store the event under `seq` when it is free (see `AppendLog.append`): one Lua script. */
  async append(log: string, seq: number, text: string): Promise<AppendAnswer> {
    checkAppend(log, seq, text);
    let answer: [number, string?];
    try {
      await this.#ready();
      answer = await (this.client as unknown as CasClient).retryledgerAppend(LOG_PREFIX + log, String(seq), text);
    } catch (e) {
      throw unavailable(e);
    }
    if (Number(answer[0]) === 1) return APPENDED;
    return seqTaken(String(answer[1]));
  }

  /**
   * `append` only while the register `leaseKey` is at `leaseGeneration` (see
   * `AppendLog.appendFenced`): one Lua script that checks the lease and
   * appends, atomic on the server. (Under Redis Cluster the log and the lease
   * must share a hash slot: give both names a hash tag.)
   */
  async appendFenced(log: string, seq: number, text: string, leaseKey: string, leaseGeneration: number): Promise<FencedAppendAnswer> {
    checkAppend(log, seq, text);
    const generation = checkLease(leaseGeneration);
    let answer: [number, string?];
    try {
      await this.#ready();
      answer = await (this.client as unknown as CasClient).retryledgerAppendFenced(LOG_PREFIX + log, leaseKey, String(seq), text, String(generation));
    } catch (e) {
      throw unavailable(e);
    }
    const code = Number(answer[0]);
    if (code === 2) return LEASE_LOST;
    if (code === 1) return APPENDED;
    return seqTaken(String(answer[1]));
  }

  /** The events from `fromSeq` on, in `seq` order (one `HGETALL`). */
  async read(log: string, fromSeq = 0): Promise<LogEntry[]> {
    checkLog(log);
    checkSeq(fromSeq, "fromSeq");
    let fields: Record<string, string>;
    try {
      await this.#ready();
      fields = await this.client.hgetall(LOG_PREFIX + log);
    } catch (e) {
      throw unavailable(e);
    }
    const entries: LogEntry[] = [];
    for (const [field, text] of Object.entries(fields)) {
      if (field === "last") continue;
      const seq = Number(field);
      if (seq >= fromSeq) entries.push({ seq, text });
    }
    return entries.sort((a, b) => a.seq - b.seq);
  }

  /** The highest `seq` held (`null`: the log is empty). */
  async lastSeq(log: string): Promise<number | null> {
    checkLog(log);
    let last: string | null;
    try {
      await this.#ready();
      last = await this.client.hget(LOG_PREFIX + log, "last");
    } catch (e) {
      throw unavailable(e);
    }
    return last === null ? null : Number(last);
  }

  /** Close the connection (only one this store opened). */
  async close(): Promise<void> {
    if (!this.#owned) return;
    // Not connected: stop reconnecting at once (QUIT would wait for a connection).
    if (this.client.status !== "ready") {
      this.client.disconnect();
      return;
    }
    try {
      await this.client.quit();
    } catch {
      this.client.disconnect();
    }
  }
}

function read(v: (string | null)[]): StoreRead {
  const [d, g] = v;
  if (d === null || d === undefined) return { document: null, generation: 0 };
  return { document: decodeDocument(d), generation: Number(g ?? "0") };
}

function row(d: string | null, g: string | number | null): StoreRow {
  if (d === null) return { text: null, generation: 0 };
  return { text: d, generation: Number(g ?? 0) };
}

function unavailable(e: unknown): StoreUnavailableError {
  if (e instanceof StoreUnavailableError) return e;
  return new StoreUnavailableError(`redis store: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
}
