/**
 * A fleet: the store its runs share (breakers per route release, the retry
 * budget per scope), the namespace prefixing every key, and how many
 * compare-and-set conflicts an admission or a record tolerates before it
 * reports `store_conflict`. The drivers (`runWithPolicy`, `runStream`) take
 * one as `fleet` and, for every attempt, admit it before the dispatch and
 * record its breaker after the observation; a host loop of its own calls
 * `admit` and `record` the same way (docs/FLEET.md).
 *
 * Keys: `<namespace>/breaker/<route_release_sha256>` and
 * `<namespace>/budget/<scope>`, each a register holding the snapshot
 * document.
 *
 * With a store that has the multi-key check-and-set (`checkAndSet`: every
 * store of the package), an attempt costs the store one round trip to admit
 * and one to record in the steady state. The fleet keeps, per key, the last
 * text and generation it read or wrote (a bounded cache, dropped whenever
 * the store cannot be reached).
 *
 * 1. admission: the view is built from the cache (read once, in one round
 *    trip, only when a key of the view is not cached), and
 *    `session.admitPreview` answers what the admission would be, the session
 *    unchanged. One check-and-set then carries every key of the view: a
 *    check-only entry for each key not written (first), then each changed
 *    snapshot (the budget first), all expecting the cached generation. When
 *    every entry matched, `session.admit` under the same view commits the
 *    same answer. Otherwise the answer holds every key's current row: the
 *    cache is refreshed from it and the admission made again, with no
 *    separate read (bounded by `maxConflicts`). Writes made before the first
 *    mismatch stay and the next admission builds on them; a budget deposit
 *    is then made twice (bounded by `maxConflicts`), whereas a probe reserved
 *    in a breaker and then abandoned would hold the half-open breaker's
 *    probe slot, hence the budget first;
 * 2. record: the breaker's next snapshot is computed from the cached one and
 *    written with the same check-and-set (one round trip); when another
 *    process wrote first, nothing is written and the answer holds the key's
 *    current document and generation: the cache is refreshed from it and the
 *    outcome recorded again, with no separate read.
 *
 * A store with only `get` and `compareAndSet` is read before every admission
 * and record, and each changed snapshot written with its own compare-and-set
 * (the budget first).
 */

import { RetryledgerError, RunError } from "./errors.js";
import type { Session } from "./session.js";
import { StoreUnavailableError, type CheckAndSetAnswer, type CheckAndSetEntry, type FleetStore, type StoreDocument, type StoreRead, type StoreRow } from "./stores/store.js";
import type { AdmissionSnapshot, AdmitAnswer, BreakerSnapshot, FleetView, Policy, RetryBudgetSnapshot } from "./types.js";

export interface FleetOptions {
  /** Prefix of every key (default `retryledger`). */
  namespace?: string;
  /** Compare-and-set conflicts tolerated per admission or record before `store_conflict` (default 5). */
  maxConflicts?: number;
  /** Wall clock, Unix ms (default `Date.now`). */
  now?: () => number;
  /** Tokens each admission reserves under an admission token bucket (the request's bound). */
  reserveTokens?: number;
  /**
   * The tenant this fleet's calls are made for, under tenant shares (the
   * policy's `fleet.admission.tenant_weights`; docs/FLEET.md, "Fair tenants").
   * The core refuses a policy with shares and no tenant, and a tenant the
   * policy does not list.
   */
  tenant?: string;
}

/** What a fleet did with its store, counted over every run that used it. */
export interface FleetRunSummary {
  /** Admissions answered (dispatch or the fleet's terminal). */
  admissions: number;
  /** Compare-and-set conflicts (each followed by another admission or record, from the store's answer or a fresh read). */
  conflicts: number;
  /** Admissions made with `store_unavailable` (the store threw). */
  unavailable: number;
  /** Breaker records written. */
  records: number;
  /** Breaker records not written because the store threw. */
  recordsLost: number;
  /** Admission slots released (and tokens settled). */
  releases?: number;
}

/** The key of a route release's breaker in a namespace. */
export function breakerKey(namespace: string, routeReleaseSha256: string): string {
  return `${namespace}/breaker/${routeReleaseSha256}`;
}

/** The key of a route release's admission limits in a namespace (`scoped`: `/tenant` or `/tenant/principal`). */
export function admissionKey(namespace: string, routeReleaseSha256: string, scoped = ""): string {
  return `${namespace}/admission/${routeReleaseSha256}${scoped}`;
}

/** The key of a scope's retry budget in a namespace. */
export function budgetKey(namespace: string, scope: string): string {
  return `${namespace}/budget/${scope}`;
}

/** A closed breaker with no history, for a route release the store holds nothing for. */
export function freshBreaker(routeReleaseSha256: string, nowEpochMs: number): BreakerSnapshot {
  return {
    consecutive_failures: 0,
    generation: 0,
    probe_successes: 0,
    probes_in_flight: 0,
    route_release_sha256: routeReleaseSha256,
    schema: "retryledger.breaker.v1",
    state: "closed",
    updated_at_epoch_ms: nowEpochMs,
    window_failures: 0,
    window_start_epoch_ms: nowEpochMs,
    window_total: 0,
  };
}

/** An empty retry budget, for a scope the store holds nothing for. */
export function freshBudget(scope: string, nowEpochMs: number): RetryBudgetSnapshot {
  return {
    balance_milli: 0,
    deposits: 0,
    generation: 0,
    schema: "retryledger.retry_budget.v1",
    scope,
    updated_at_epoch_ms: nowEpochMs,
    withdrawals: 0,
  };
}

const UNAVAILABLE = '{"breakers":{},"store_unavailable":true}';
/** How many keys the cache of a fleet holds before it starts over. */
const CACHE_MAX = 4096;
const ABSENT: StoreRow = Object.freeze({ text: null, generation: 0 }) as StoreRow;

/** What a policy's fleet section asks of the store: its breakers' releases and the keys of the view (breakers, then the budget). */
interface Shape {
  releases: string[];
  breaker: boolean;
  keys: string[];
  /** The releases of the admission keys (after the breakers and the budget), and the key's tail after the release. */
  limits: string[];
  scoped: string;
  tokens: boolean;
  reserveTokens: number | undefined;
  /** The call's tenant, when the limits have tenant shares. */
  tenant: string | undefined;
}

/** A snapshot an admission writes: the check-and-set entry, and the document for a store with compare-and-set only. */
interface Write extends CheckAndSetEntry {
  text: string;
  document: StoreDocument;
}

export class Fleet {
  readonly store: FleetStore;
  readonly namespace: string;
  readonly maxConflicts: number;
  readonly #now: () => number;
  readonly reserveTokens: number | undefined;
  readonly tenant: string | undefined;
  readonly #shapes = new WeakMap<Policy, Shape>();
  /** Per key, the last text and store generation read or written. */
  readonly #cache = new Map<string, StoreRow>();
  /** The last error the store threw (the reason of the latest `store_unavailable`). */
  lastStoreError: unknown = undefined;
  readonly stats: FleetRunSummary = { admissions: 0, conflicts: 0, unavailable: 0, records: 0, recordsLost: 0 };

  constructor(store: FleetStore, options: FleetOptions = {}) {
    if (store === null || typeof store !== "object" || typeof store.get !== "function" || typeof store.compareAndSet !== "function") {
      throw new TypeError("a fleet needs a store with get and compareAndSet");
    }
    const namespace = options.namespace ?? "retryledger";
    if (typeof namespace !== "string" || namespace === "") throw new TypeError("a fleet needs a non-empty namespace");
    const maxConflicts = options.maxConflicts ?? 5;
    if (!Number.isSafeInteger(maxConflicts) || maxConflicts < 1) throw new RangeError("maxConflicts is a positive integer");
    this.store = store;
    this.namespace = namespace;
    this.maxConflicts = maxConflicts;
    this.#now = options.now ?? Date.now;
    const reserve = options.reserveTokens;
    if (reserve !== undefined && (!Number.isSafeInteger(reserve) || reserve < 0)) throw new RangeError("reserveTokens is a non-negative integer");
    this.reserveTokens = reserve;
    const tenant = options.tenant;
    if (tenant !== undefined && (typeof tenant !== "string" || tenant === "")) throw new TypeError("tenant is a non-empty string");
    this.tenant = tenant;
  }

  admissionKey(routeReleaseSha256: string, scoped = ""): string {
    return admissionKey(this.namespace, routeReleaseSha256, scoped);
  }

  /** The wall clock, Unix ms (an integer). */
  now(): number {
    return Math.floor(this.#now());
  }

  breakerKey(routeReleaseSha256: string): string {
    return breakerKey(this.namespace, routeReleaseSha256);
  }

  budgetKey(scope: string): string {
    return budgetKey(this.namespace, scope);
  }

  /** The fleet view of a policy as the store holds it now: the breakers of its routes and its budget. */
  async view(policy: Policy): Promise<FleetView> {
    const shape = this.#shape(policy);
    return JSON.parse(viewText(shape, await this.#rows(shape.keys))) as FleetView;
  }

  /** Drop the cached documents (the next record reads its key again). Never needed for correctness: a stale cache costs a conflict. */
  forget(): void {
    this.#cache.clear();
  }

  #shape(policy: Policy): Shape {
    let shape = this.#shapes.get(policy);
    if (shape === undefined) {
      const fleet = policy.fleet;
      const breaker = fleet?.breaker !== undefined;
      const releases: string[] = [];
      if (breaker) {
        for (const r of policy.routes) if (!releases.includes(r.route_release_sha256)) releases.push(r.route_release_sha256);
      }
      const keys = releases.map((r) => this.breakerKey(r));
      const scope = fleet?.retry_budget?.scope;
      if (scope !== undefined) keys.push(this.budgetKey(scope));
      const admission = fleet?.admission;
      const limits: string[] = [];
      if (admission !== undefined) {
        for (const r of policy.routes) if (!limits.includes(r.route_release_sha256)) limits.push(r.route_release_sha256);
      }
      const scoped = [admission?.tenant, admission?.principal].map((p) => (p === undefined ? "" : `/${p}`)).join("");
      for (const r of limits) keys.push(this.admissionKey(r, scoped));
      const tokens = admission?.token_bound !== undefined;
      const tenant = admission?.tenant_weights !== undefined ? this.tenant : undefined;
      shape = { releases, breaker, keys, limits, scoped, tokens, reserveTokens: tokens ? this.reserveTokens : undefined, tenant };
      this.#shapes.set(policy, shape);
    }
    return shape;
  }

  /** The text and generation of `keys`: one `getManyRaw` round trip when the store has it, else `getMany` or `get` each. */
  async #rows(keys: readonly string[]): Promise<StoreRow[]> {
    if (keys.length === 0) return [];
    const store = this.store;
    if (store.getManyRaw !== undefined) return await store.getManyRaw(keys);
    const reads: StoreRead[] = store.getMany !== undefined ? await store.getMany(keys) : await Promise.all(keys.map((k) => store.get(k)));
    return reads.map((r) => (r.document === null ? { text: null, generation: r.generation } : { text: JSON.stringify(r.document), generation: r.generation }));
  }

  /** Cache what the store answered for `keys`. */
  #refresh(keys: readonly string[], rows: readonly StoreRow[]): void {
    const cache = this.#cache;
    if (cache.size + keys.length > CACHE_MAX) cache.clear();
    keys.forEach((k, i) => {
      const r = rows[i];
      if (r !== undefined) cache.set(k, { text: r.text, generation: r.generation });
    });
  }

  /** Cache a check-and-set that succeeded: each written key one generation on. */
  #written(entries: readonly CheckAndSetEntry[]): void {
    const cache = this.#cache;
    if (cache.size + entries.length > CACHE_MAX) cache.clear();
    for (const e of entries) if (e.text !== null) cache.set(e.key, { text: e.text, generation: e.expectedGeneration + 1 });
  }

  /**
   * Admit the session's planned attempt at `atMs` (run clock). With a store
   * that has `checkAndSet`: from the cached view, checked and written in one
   * check-and-set (see the module's comment). Otherwise: read the view,
   * `session.admit`, and write back every changed snapshot with its own
   * compare-and-set, the budget first, each expecting the generation read. A
   * conflict admits again (from the store's answer, or a fresh read), at
   * most `maxConflicts` times, then throws `RunError` `store_conflict`. A
   * store that throws: admitted again with `store_unavailable` (the policy
   * fails closed or open); one that answers state older than the run has
   * seen: `generation_regressed`. `reserveTokens`: the tokens this attempt
   * reserves under a token bucket (default: the fleet's `reserveTokens`).
   */
  async admit(session: Session, atMs: number, reserveTokens?: number): Promise<AdmitAnswer> {
    const store = this.store;
    const cached = this.#shape(session.compiled.policy);
    // A run's own reservation (the request's bound) replaces the fleet's.
    const shape = reserveTokens === undefined || !cached.tokens ? cached : { ...cached, reserveTokens: checkReserve(reserveTokens) };
    // The run clock moves on while the store answers: the admission is made
    // at the wall time it reads (`now`) and at the run-clock time of that same
    // moment, so a queued start planned on one clock is the same on the other.
    const called = this.now();
    const runAt = (now: number): number => atMs + Math.max(0, now - called);
    if (store.checkAndSet !== undefined) return this.#admitChecked(session, runAt, shape, store.checkAndSet.bind(store));
    const keys = shape.keys;
    for (let conflicts = 0; ; ) {
      let rows: StoreRow[];
      try {
        rows = await this.#rows(keys);
      } catch (e) {
        return this.#unavailable(session, runAt, e);
      }
      // A store answering state older than the run has seen throws `generation_regressed`.
      const now = this.now();
      const answer = session.admit(runAt(now), now, viewText(shape, rows));
      const entries = this.#admissionWrites(answer, keys, rows);
      let written = true;
      try {
        // Each changed snapshot with its own compare-and-set (none when nothing changed).
        for (const e of entries) {
          if (!(await store.compareAndSet(e.key, e.expectedGeneration, e.document)).ok) {
            written = false;
            break;
          }
        }
      } catch (e) {
        return this.#unavailable(session, runAt, e);
      }
      if (written) {
        this.stats.admissions++;
        return answer;
      }
      this.stats.conflicts++;
      if (++conflicts >= this.maxConflicts) throw conflict(`admission: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  /**
   * The admission with one check-and-set: the view from the cache (read
   * first only for a key not cached), previewed, then every key checked and
   * every changed snapshot written at once; committed under the same view.
   */
  async #admitChecked(
    session: Session,
    runAt: (now: number) => number,
    shape: Shape,
    checkAndSet: (entries: readonly CheckAndSetEntry[]) => CheckAndSetAnswer | Promise<CheckAndSetAnswer>,
  ): Promise<AdmitAnswer> {
    const keys = shape.keys;
    const cache = this.#cache;
    let read = false;
    if (!keys.every((k) => cache.has(k))) {
      try {
        this.#refresh(keys, await this.#rows(keys));
      } catch (e) {
        return this.#unavailable(session, runAt, e);
      }
      read = true;
    }
    for (let conflicts = 0; ; ) {
      const rows = keys.map((k) => cache.get(k) ?? ABSENT);
      const view = viewText(shape, rows);
      const now = this.now();
      let preview: AdmitAnswer;
      try {
        preview = session.admitPreview(runAt(now), now, view);
      } catch (e) {
        if (!regressed(e) || read) throw e;
        // Another run of this process cached an older read (or the cache started over): read the keys once.
        read = true;
        try {
          this.#refresh(keys, await this.#rows(keys));
        } catch (e2) {
          return this.#unavailable(session, runAt, e2);
        }
        continue;
      }
      const writes = this.#admissionWrites(preview, keys, rows);
      const entries: CheckAndSetEntry[] = [];
      // Every key the admission read is checked: check-only entries first, then the writes (the budget first).
      keys.forEach((key, i) => {
        if (!writes.some((w) => w.key === key)) entries.push({ key, expectedGeneration: (rows[i] as StoreRow).generation, text: null });
      });
      for (const w of writes) entries.push({ key: w.key, expectedGeneration: w.expectedGeneration, text: w.text });
      let result: CheckAndSetAnswer = { ok: true, rows: [] };
      if (entries.length > 0) {
        try {
          result = await checkAndSet(entries);
        } catch (e) {
          return this.#unavailable(session, runAt, e);
        }
      }
      if (result.ok) {
        // The same view as the preview: the same answer, now committed.
        const answer = session.admit(runAt(now), now, view);
        this.#written(entries);
        this.stats.admissions++;
        return answer;
      }
      this.stats.conflicts++;
      // The answer holds every key as it now is (with the writes made before the mismatch).
      this.#refresh(entries.map((e) => e.key), result.rows);
      read = true;
      if (++conflicts >= this.maxConflicts) throw conflict(`admission: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  /**
   * The snapshots an admission changed, each expecting the generation read,
   * the budget first: when a breaker write after it conflicts, the budget's
   * stays and the re-admission spends or deposits again (bounded by
   * `maxConflicts`), whereas a probe reserved in a breaker and then
   * abandoned would hold the half-open breaker's probe slot.
   */
  #admissionWrites(answer: AdmitAnswer, keys: readonly string[], rows: readonly StoreRow[]): Write[] {
    const expected = (key: string): number => {
      const i = keys.indexOf(key);
      return i < 0 ? 0 : (rows[i] as StoreRow).generation;
    };
    const { writes } = answer;
    const entries: Write[] = [];
    const add = (key: string, snapshot: BreakerSnapshot | RetryBudgetSnapshot): void => {
      entries.push({ key, expectedGeneration: expected(key), text: JSON.stringify(snapshot), document: snapshot as unknown as StoreDocument });
    };
    if (writes.budget !== undefined) add(this.budgetKey(writes.budget.scope), writes.budget);
    for (const b of writes.breakers) add(this.breakerKey(b.route_release_sha256), b);
    // Admission limits last: an in-flight slot taken and then abandoned would hold it until released.
    for (const a of writes.admission ?? []) {
      const scoped = [a.tenant, a.principal].map((p) => (p === undefined ? "" : `/${p}`)).join("");
      const key = this.admissionKey(a.route_release_sha256, scoped);
      entries.push({ key, expectedGeneration: expected(key), text: JSON.stringify(a), document: a as unknown as StoreDocument });
    }
    return entries;
  }

  #unavailable(session: Session, runAt: (now: number) => number, e: unknown): AdmitAnswer {
    this.lastStoreError = e;
    this.stats.unavailable++;
    this.stats.admissions++;
    // The store may come back without what it held (a restart): read again.
    this.#cache.clear();
    const now = this.now();
    return session.admit(runAt(now), now, UNAVAILABLE);
  }

  #lost(e: unknown): undefined {
    this.lastStoreError = e;
    this.stats.recordsLost++;
    this.#cache.clear();
    return undefined;
  }

  /**
   * After the session observed its attempt: record the outcome on the
   * attempt's route breaker (`session.breakerAfter` of the snapshot the fleet
   * last read or wrote for that key, written with one `checkAndSet`; on a
   * conflict, again from the snapshot the store answered; a store without
   * `checkAndSet`: read, record, compare-and-set; conflicts as in `admit`);
   * `routeReleaseSha256`, the attempt's route release when the host knows
   * it (the core checks it is the last attempt's). Under admission limits
   * it then releases the attempt's slot (`release`, its reserved tokens
   * settled with `usedTokens` when given, and the rate-limit `headers` of the
   * attempt's response applied to its buckets). Returns the breaker snapshot
   * written, or `undefined` when the policy has no breaker or the store
   * threw (`lastStoreError`; the outcome is then lost to the breaker).
   */
  async record(
    session: Session,
    routeReleaseSha256?: string,
    usedTokens?: number,
    headers?: ReadonlyArray<readonly [string, string]>,
  ): Promise<BreakerSnapshot | undefined> {
    const recorded = await this.#recordBreaker(session, routeReleaseSha256);
    const release = routeReleaseSha256 ?? session.lastAttempt()?.route_release_sha256;
    if (release !== undefined) await this.release(session, release, usedTokens, headers);
    return recorded;
  }

  /**
   * Free the in-flight slot of the session's admitted attempt (the one
   * admitted and not yet observed, else the last observed) on
   * `routeReleaseSha256`, settle its reserved tokens with `usedTokens` and
   * apply the rate-limit `headers` its response carried (the same write):
   * `session.admissionRelease` of the cached snapshot, one check-and-set
   * (again from the store's answer on a conflict). `record` calls it after
   * every attempt; a host calls it for an attempt admitted and never
   * dispatched. Returns the snapshot written, or `undefined` when the
   * policy has no admission limits, the attempt was admitted without them,
   * or the store threw (the slot is then held: docs/FLEET.md).
   */
  async release(
    session: Session,
    routeReleaseSha256: string,
    usedTokens?: number,
    headers?: ReadonlyArray<readonly [string, string]>,
  ): Promise<AdmissionSnapshot | undefined> {
    const shape = this.#shape(session.compiled.policy);
    if (shape.limits.length === 0) return undefined;
    const key = this.admissionKey(routeReleaseSha256, shape.scoped);
    const store = this.store;
    const cache = this.#cache;
    for (let conflicts = 0; ; ) {
      try {
        if (store.checkAndSet === undefined || !cache.has(key)) this.#refresh([key], await this.#rows([key]));
      } catch (e) {
        return this.#lost(e);
      }
      const row = cache.get(key) ?? ABSENT;
      if (row.text === null) return undefined;
      let next: AdmissionSnapshot;
      try {
        next = session.admissionRelease(row.text, this.now(), usedTokens, headers);
      } catch (e) {
        if (e instanceof RetryledgerError && e.code === "admission_missing") return undefined;
        throw e;
      }
      const text = JSON.stringify(next);
      let ok: boolean;
      let rows: readonly StoreRow[] = [];
      try {
        if (store.checkAndSet === undefined) {
          ok = (await store.compareAndSet(key, row.generation, next as unknown as StoreDocument)).ok;
        } else {
          const answer = await store.checkAndSet([{ key, expectedGeneration: row.generation, text }]);
          ok = answer.ok;
          rows = answer.rows;
        }
      } catch (e) {
        if (e instanceof RetryledgerError) throw e;
        return this.#lost(e);
      }
      if (ok) {
        this.#written([{ key, expectedGeneration: row.generation, text }]);
        this.stats.releases = (this.stats.releases ?? 0) + 1;
        return next;
      }
      this.stats.conflicts++;
      if (rows.length > 0) this.#refresh([key], rows);
      else cache.delete(key);
      if (++conflicts >= this.maxConflicts) throw conflict(`admission release: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  async #recordBreaker(session: Session, routeReleaseSha256?: string): Promise<BreakerSnapshot | undefined> {
    if (!this.#shape(session.compiled.policy).breaker) return undefined;
    // Recorded even when the attempt was admitted without the store (fail_open): the store may be back.
    const release = routeReleaseSha256 ?? session.lastAttempt()?.route_release_sha256;
    if (release === undefined) return undefined;
    const key = this.breakerKey(release);
    const store = this.store;
    if (store.checkAndSet === undefined) return this.#recordByReads(session, key, release);
    const cache = this.#cache;
    // Read only when the key is not cached, or when the cached snapshot is older than one the run has seen.
    let fromCache = cache.has(key);
    if (!fromCache) {
      try {
        this.#refresh([key], await this.#rows([key]));
      } catch (e) {
        return this.#lost(e);
      }
    }
    for (let conflicts = 0; ; ) {
      const row = cache.get(key) ?? ABSENT;
      const now = this.now();
      let next: BreakerSnapshot;
      try {
        next = session.breakerAfter(row.text ?? freshBreaker(release, now), now);
      } catch (e) {
        if (!regressed(e) || !fromCache) throw e;
        // Another run of this process cached an older read: read the key once.
        fromCache = false;
        try {
          this.#refresh([key], await this.#rows([key]));
        } catch (e2) {
          return this.#lost(e2);
        }
        continue;
      }
      const entries: CheckAndSetEntry[] = [{ key, expectedGeneration: row.generation, text: JSON.stringify(next) }];
      let result: CheckAndSetAnswer;
      try {
        result = await store.checkAndSet(entries);
      } catch (e) {
        if (e instanceof RetryledgerError) throw e;
        return this.#lost(e);
      }
      if (result.ok) {
        this.#written(entries);
        this.stats.records++;
        return next;
      }
      this.stats.conflicts++;
      this.#refresh([key], result.rows);
      fromCache = false;
      if (++conflicts >= this.maxConflicts) throw conflict(`breaker record: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  /** A breaker record with a store that has only `get` and `compareAndSet` (read, record, compare-and-set; read again on a conflict). */
  async #recordByReads(session: Session, key: string, release: string): Promise<BreakerSnapshot | undefined> {
    for (let conflicts = 0; ; ) {
      let written: boolean;
      let next: BreakerSnapshot;
      try {
        const r = await this.store.get(key);
        const now = this.now();
        const current = r.document === null ? freshBreaker(release, now) : (r.document as unknown as BreakerSnapshot);
        next = session.breakerAfter(current, now);
        written = (await this.store.compareAndSet(key, r.generation, next as unknown as StoreDocument)).ok;
      } catch (e) {
        if (e instanceof RetryledgerError) throw e;
        this.lastStoreError = e;
        this.stats.recordsLost++;
        return undefined;
      }
      if (written) {
        this.stats.records++;
        return next;
      }
      this.stats.conflicts++;
      if (++conflicts >= this.maxConflicts) throw conflict(`breaker record: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  /** Close the store's connections. */
  async close(): Promise<void> {
    await this.store.close?.();
  }
}

/** The view as JSON text, from what was read for each key of the shape (breakers, then the budget). */
function viewText(shape: Shape, rows: readonly StoreRow[]): string {
  const parts: string[] = [];
  const limits: string[] = [];
  let budget: string | null = null;
  const n = shape.releases.length;
  const b = shape.keys.length - shape.limits.length;
  rows.forEach((r, i) => {
    if (r.text === null) return;
    if (i < n) parts.push(`${JSON.stringify(shape.releases[i])}:${r.text}`);
    else if (i < b) budget = r.text;
    else limits.push(`${JSON.stringify(shape.limits[i - b])}:${r.text}`);
  });
  const head = shape.limits.length > 0 ? `{"admission":{${limits.join(",")}},` : "{";
  const reserve = shape.tokens && shape.reserveTokens !== undefined ? `,"reserve_tokens":${shape.reserveTokens}` : "";
  const tenant = shape.tenant === undefined ? "" : `,"tenant":${JSON.stringify(shape.tenant)}`;
  return `${head}"breakers":{${parts.join(",")}}${budget === null ? "" : `,"budget":${budget}`}${reserve}${tenant}}`;
}

/** The request fields that bound the tokens a response may make, in the order they are looked for. */
const OUTPUT_BOUNDS = ["max_completion_tokens", "max_output_tokens", "max_tokens", "maxOutputTokens"] as const;

function outputBound(holder: unknown): number | undefined {
  if (typeof holder !== "object" || holder === null) return undefined;
  const h = holder as Record<string, unknown>;
  for (const name of OUTPUT_BOUNDS) {
    const v = h[name];
    if (Number.isSafeInteger(v) && (v as number) >= 0) return v as number;
  }
  return undefined;
}

/**
 * The tokens a request reserves under a token bucket (the run option
 * `reserveTokens`): its output bound (`max_completion_tokens`,
 * `max_output_tokens` or `max_tokens` of an OpenAI or Anthropic request;
 * `config.maxOutputTokens` of a `@google/genai` one) plus its input:
 * `inputTokens` when the caller counted them, else an estimate of one token
 * per 4 characters of the request's JSON (an over-estimate for prose; the
 * release settles the reservation with the usage the response reports).
 * Throws `RangeError` for a request without an output bound.
 */
export function requestTokenBound(params: unknown, inputTokens?: number): number {
  const bound = outputBound(params) ?? outputBound((params as { config?: unknown } | null)?.config);
  if (bound === undefined) {
    throw new RangeError("the request has no output bound (max_completion_tokens, max_output_tokens, max_tokens or config.maxOutputTokens): pass reserveTokens");
  }
  if (inputTokens !== undefined && (!Number.isSafeInteger(inputTokens) || inputTokens < 0)) {
    throw new RangeError("inputTokens is a non-negative integer");
  }
  const input = inputTokens ?? Math.ceil(JSON.stringify(params).length / 4);
  return checkReserve(bound + input);
}

function checkReserve(tokens: number): number {
  if (!Number.isSafeInteger(tokens) || tokens < 0) throw new RangeError("reserveTokens is a non-negative integer");
  return tokens;
}

function regressed(e: unknown): boolean {
  return e instanceof RetryledgerError && e.code === "generation_regressed";
}

function conflict(what: string): RunError {
  return new RunError("store_conflict", `store_conflict: ${what}; another process keeps writing the same snapshot`);
}

export { StoreUnavailableError };
