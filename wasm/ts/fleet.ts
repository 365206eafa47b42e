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
 */

import { RetryledgerError, RunError } from "./errors.js";
import type { Session } from "./session.js";
import { StoreUnavailableError, type FleetStore, type StoreDocument, type StoreRead } from "./stores/store.js";
import type { AdmitAnswer, BreakerSnapshot, FleetView, Policy, RetryBudgetSnapshot } from "./types.js";

export interface FleetOptions {
  /** Prefix of every key (default `retryledger`). */
  namespace?: string;
  /** Compare-and-set conflicts tolerated per admission or record before `store_conflict` (default 5). */
  maxConflicts?: number;
  /** Wall clock, Unix ms (default `Date.now`). */
  now?: () => number;
}

/** What a fleet did with its store, counted over every run that used it. */
export interface FleetRunSummary {
  /** Admissions answered (dispatch or the fleet's terminal). */
  admissions: number;
  /** Compare-and-set conflicts (each followed by a fresh read and admission). */
  conflicts: number;
  /** Admissions made with `store_unavailable` (the store threw). */
  unavailable: number;
  /** Breaker records written. */
  records: number;
  /** Breaker records not written because the store threw. */
  recordsLost: number;
}

/** The key of a route release's breaker in a namespace. */
export function breakerKey(namespace: string, routeReleaseSha256: string): string {
  return `${namespace}/breaker/${routeReleaseSha256}`;
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

const UNAVAILABLE: FleetView = Object.freeze({ breakers: Object.freeze({}), store_unavailable: true }) as FleetView;

/** A view read from the store, with the generation of every key read. */
interface Read {
  view: FleetView;
  generations: Map<string, number>;
}

export class Fleet {
  readonly store: FleetStore;
  readonly namespace: string;
  readonly maxConflicts: number;
  readonly #now: () => number;
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
    return (await this.#read(policy)).view;
  }

  async #read(policy: Policy): Promise<Read> {
    const fleet = policy.fleet;
    const releases: string[] = [];
    if (fleet?.breaker !== undefined) {
      for (const r of policy.routes) if (!releases.includes(r.route_release_sha256)) releases.push(r.route_release_sha256);
    }
    const keys = releases.map((r) => this.breakerKey(r));
    const scope = fleet?.retry_budget?.scope;
    if (scope !== undefined) keys.push(this.budgetKey(scope));
    const store = this.store;
    const reads: StoreRead[] =
      keys.length === 0 ? [] : store.getMany !== undefined ? await store.getMany(keys) : await Promise.all(keys.map((k) => store.get(k)));
    const generations = new Map<string, number>();
    const view: FleetView = { breakers: {} };
    keys.forEach((k, i) => {
      const r = reads[i] as StoreRead;
      generations.set(k, r.generation);
      if (r.document === null) return;
      if (i < releases.length) view.breakers[releases[i] as string] = r.document as unknown as BreakerSnapshot;
      else view.budget = r.document as unknown as RetryBudgetSnapshot;
    });
    return { view, generations };
  }

  /**
   * Admit the session's planned attempt at `atMs` (run clock): read the
   * view, `session.admit`, write back every changed snapshot with
   * compare-and-set (expecting the generation read). A conflict reads and
   * admits again, at most `maxConflicts` times, then throws `RunError`
   * `store_conflict`. A store that throws: admitted again with
   * `store_unavailable` (the policy fails closed or open).
   */
  async admit(session: Session, atMs: number): Promise<AdmitAnswer> {
    const policy = session.compiled.policy;
    for (let conflicts = 0; ; ) {
      let read: Read;
      try {
        read = await this.#read(policy);
      } catch (e) {
        return this.#unavailable(session, atMs, e);
      }
      const answer = session.admit(atMs, this.now(), read.view);
      let conflicted = false;
      try {
        const { writes } = answer;
        for (const b of writes.breakers) {
          if (!(await this.#put(this.breakerKey(b.route_release_sha256), read.generations, b))) {
            conflicted = true;
            break;
          }
        }
        if (!conflicted && writes.budget !== undefined) {
          conflicted = !(await this.#put(this.budgetKey(writes.budget.scope), read.generations, writes.budget));
        }
      } catch (e) {
        return this.#unavailable(session, atMs, e);
      }
      if (!conflicted) {
        this.stats.admissions++;
        return answer;
      }
      this.stats.conflicts++;
      if (++conflicts >= this.maxConflicts) throw conflict(`admission: ${conflicts} compare-and-set conflicts in a row`);
    }
  }

  async #put(key: string, generations: Map<string, number>, snapshot: BreakerSnapshot | RetryBudgetSnapshot): Promise<boolean> {
    const w = await this.store.compareAndSet(key, generations.get(key) ?? 0, snapshot as unknown as StoreDocument);
    return w.ok;
  }

  #unavailable(session: Session, atMs: number, e: unknown): AdmitAnswer {
    this.lastStoreError = e;
    this.stats.unavailable++;
    this.stats.admissions++;
    return session.admit(atMs, this.now(), UNAVAILABLE);
  }

  /**
   * After the session observed its attempt: record the outcome on the
   * attempt's route breaker (read, `session.breakerAfter`, compare-and-set;
   * conflicts as in `admit`); `routeReleaseSha256`, the attempt's route
   * release when the host knows it (the core checks it is the last
   * attempt's). Returns the snapshot written, or `undefined`
   * when the policy has no breaker or the store threw (`lastStoreError`;
   * the outcome is then lost to the breaker).
   */
  async record(session: Session, routeReleaseSha256?: string): Promise<BreakerSnapshot | undefined> {
    if (session.compiled.policy.fleet?.breaker === undefined) return undefined;
    // Recorded even when the attempt was admitted without the store (fail_open): the store may be back.
    const release = routeReleaseSha256 ?? session.lastAttempt()?.route_release_sha256;
    if (release === undefined) return undefined;
    const key = this.breakerKey(release);
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

function conflict(what: string): RunError {
  return new RunError("store_conflict", `store_conflict: ${what}; another process keeps writing the same snapshot`);
}

export { StoreUnavailableError };
