// Key pools: one provider's API keys, each with its own health
// (`retryledger.key_pool.v1`, one register per pool; docs/FLEET.md).

import { call, compiledOf, toText, type CompiledPolicy, type Input, type RawBindings } from "./core.js";
import { AttemptStep, type Step } from "./driver.js";
import { DecodeError, DriftError, PolicyError } from "./errors.js";
import type { Classifier } from "./facts.js";
import { Machine, Reports, raisedFacts, runLoop, storeRead, storeWrite, type CasDoc, type DispatchEffect, type LoopAdapter, type LoopResult, type MachineOptions, type StoreRowDoc } from "./loop.js";
import type { Session } from "./session.js";
import type { FleetStore } from "./stores/store.js";
import type { DispatchDecision, Outcome, Policy, Sha256Hex } from "./types.js";

/** One key of a pool: the SHA-256 of its secret and the account whose quota it draws on. */
export interface PoolKey {
  account?: string;
  key_sha256: Sha256Hex;
}

/** A pool's configuration. */
export interface KeyPoolConfig {
  /** How long a rate-limited key cools when the answer gave no hint, ms. */
  cool_ms: number;
  /** How long a refused key (401, 403) stays disabled, ms; absent: until the configuration changes. */
  disable_ms?: number;
  keys: PoolKey[];
  /** The pool's name: its register is `key_pool/<name>`. */
  name: string;
  /** How long a key whose quota cannot clear is parked, ms. */
  park_ms: number;
}

/** Why the provider refused a pool key: `unauthorized` (401) or `forbidden` (403). */
export type KeyRefusal = "unauthorized" | "forbidden";

/** One key's state in a pool snapshot. */
export interface KeyState {
  key_sha256: Sha256Hex;
  last_limited_at_epoch_ms?: number;
  last_used_at_epoch_ms?: number;
  /** Why a disabled key was refused: `unauthorized` (401) or `forbidden` (403). */
  reason?: KeyRefusal;
  state: "healthy" | "cooling" | "parked" | "disabled";
  until_epoch_ms?: number;
}

/** A pool's state across runs. */
export interface KeyPoolSnapshot {
  config_sha256: Sha256Hex;
  generation: number;
  keys: KeyState[];
  name: string;
  schema: "retryledger.key_pool.v1";
  updated_at_epoch_ms: number;
}

/** `keyPoolSelect`'s answer: the key to use (or how long to wait) and the snapshot to write back. */
export interface KeyPoolSelectResult {
  selection:
    | { kind: "key"; key_sha256: Sha256Hex; affinity?: "kept" | "moved" }
    | { kind: "wait"; until_epoch_ms: number }
    | { kind: "no_usable_key" };
  snapshot: KeyPoolSnapshot;
}

interface KeyPoolBindings {
  key_pool_select(config: string, snapshot: string | undefined, nowEpochMs: number, affinity: string | undefined): string;
  key_pool_record(
    config: string,
    snapshot: string | undefined,
    keySha256: string,
    outcome: string,
    nowEpochMs: number,
    status: number | undefined,
  ): string;
  key_sha256(secret: string): string;
}

const poolCall = <T>(f: (b: KeyPoolBindings) => T): T => call((b: RawBindings) => f(b as unknown as KeyPoolBindings));

function number(name: string, x: unknown): number {
  if (typeof x !== "number") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a number`, { path: `/${name}` });
  }
  return x;
}

function text(name: string, x: unknown): string {
  if (typeof x !== "string") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a string`, { path: `/${name}` });
  }
  return x;
}

/**
 * Which key of a pool the next attempt uses at a wall-clock time
 * (`snapshot` null or undefined: the store holds none yet): the least
 * recently limited usable key, then the least recently used; with
 * `affinity` (the key digest a session used before) the session keeps its
 * key while it is usable. Write the snapshot back with compare-and-set.
 */
export function keyPoolSelect(
  config: Input<KeyPoolConfig>,
  snapshot: Input<KeyPoolSnapshot> | null | undefined,
  nowEpochMs: number,
  affinity?: string,
): KeyPoolSelectResult {
  const c = toText(config);
  const s = snapshot == null ? undefined : toText(snapshot);
  const now = number("now_epoch_ms", nowEpochMs);
  const a = affinity === undefined ? undefined : text("affinity", affinity);
  return JSON.parse(poolCall((b) => b.key_pool_select(c, s, now, a))) as KeyPoolSelectResult;
}

/**
 * The pool's next snapshot after the key `keySha256` answered with
 * `outcome` and HTTP `status`: 401 and 403 disable the key until the
 * pool's configuration changes; a rate limit cools it and its account's
 * keys until the hint; an exhausted quota parks them.
 */
export function keyPoolRecord(
  config: Input<KeyPoolConfig>,
  snapshot: Input<KeyPoolSnapshot> | null | undefined,
  keySha256: string,
  outcome: Input<Outcome>,
  nowEpochMs: number,
  status?: number,
): KeyPoolSnapshot {
  const c = toText(config);
  const s = snapshot == null ? undefined : toText(snapshot);
  const k = text("key_sha256", keySha256);
  const o = toText(outcome);
  const now = number("now_epoch_ms", nowEpochMs);
  const st = status === undefined ? undefined : number("status", status);
  return JSON.parse(poolCall((b) => b.key_pool_record(c, s, k, o, now, st))) as KeyPoolSnapshot;
}

/** A pool key's identity: the hex SHA-256 of its secret, the only form of a key any document holds. */
export function keySha256(secret: string): Sha256Hex {
  const s = text("secret", secret);
  return poolCall((b) => b.key_sha256(s)) as Sha256Hex;
}

/**
 * The host's API keys, by the digest the core names them with. The secrets
 * stay here: every document, and this object's JSON, show digests only.
 */
export class KeyRing {
  readonly #byDigest = new Map<string, string>();
  readonly digests: Sha256Hex[] = [];

  constructor(secrets: Iterable<string>) {
    for (const secret of secrets) {
      const digest = keySha256(secret);
      if (!this.#byDigest.has(digest)) this.digests.push(digest);
      this.#byDigest.set(digest, secret);
    }
  }

  /** The secret of a digest; `PolicyError` `key_not_in_pool` when the ring does not hold it. */
  secret(digest: string): string {
    const secret = this.#byDigest.get(digest);
    if (secret === undefined) {
      throw new PolicyError("key_not_in_pool", `the core chose key ${digest}, which the host's key ring does not hold`, { path: "/key/key_sha256" });
    }
    return secret;
  }

  toJSON(): { digests: Sha256Hex[] } {
    return { digests: [...this.digests] };
  }
}

/**
 * A pool's configuration (an entry of the fleet section's `key_pools`) of
 * every key of `ring`: digests only. `accounts` maps a key's digest to the
 * account whose quota it draws on.
 */
export function poolConfig(
  name: string,
  ring: KeyRing,
  options: { coolMs: number; parkMs: number; accounts?: Record<string, string>; disableMs?: number },
): KeyPoolConfig {
  const keys: PoolKey[] = ring.digests.map((d) => {
    const account = options.accounts?.[d];
    return account === undefined ? { key_sha256: d } : { account, key_sha256: d };
  });
  const config: KeyPoolConfig = { cool_ms: options.coolMs, keys, name, park_ms: options.parkMs };
  if (options.disableMs !== undefined) config.disable_ms = options.disableMs;
  return config;
}

/** The key an attempt of a pooled run is sent with (absent on a route without a pool). */
export interface PooledKey {
  /** The secret to send. */
  apiKey: string;
  keySha256: Sha256Hex;
  pool: string;
}

/** How `runPooled` runs. */
export interface PooledOptions {
  /** The raw idempotency key (its digest is the policy's). */
  idempotencyKey: string;
  /** A register store (`get`, `compareAndSet`): the pool's state and the other fleet registers. */
  store: FleetStore;
  /** The host's keys. */
  keys: KeyRing;
  /** The namespace the store's keys go under (default `retryledger`). */
  namespace?: string;
  /** The key digest the caller's session used before (kept while usable). */
  keyAffinity?: string;
  classify?: Classifier;
  /** The wall clock, Unix ms (default `Date.now`). */
  clock?: () => number;
  /** Waits `ms` (default a timer). */
  sleep?: (ms: number) => Promise<void>;
  maxConflicts?: number;
}

/** A pooled run: the loop's result and the digest of the key each attempt was sent with. */
export type PooledResult<T> = LoopResult<T> & { readonly keys: (Sha256Hex | undefined)[] };

class Pooled<T> implements LoopAdapter<T> {
  readonly origin: number;
  readonly sent: (Sha256Hex | undefined)[] = [];
  #step: AttemptStep | undefined;
  #reports: Reports | undefined;

  constructor(
    readonly options: PooledOptions,
    readonly call: (step: Step, key: PooledKey | undefined) => Promise<T> | T,
    readonly clock: () => number,
    readonly pause: (ms: number) => Promise<void>,
  ) {
    this.origin = Math.max(0, Math.floor(clock()));
  }

  nowMs(): number {
    return Math.max(0, Math.floor(this.clock() - this.origin));
  }

  sleep(ms: number): Promise<void> {
    return this.pause(ms);
  }

  dispatch(effect: DispatchEffect): Promise<T> | T {
    const chosen = (effect as { key?: { key_sha256: Sha256Hex; pool: string } }).key;
    const key = chosen === undefined ? undefined : { apiKey: this.options.keys.secret(chosen.key_sha256), keySha256: chosen.key_sha256, pool: chosen.pool };
    this.sent.push(key?.keySha256);
    const decision = { ...effect.dispatch, kind: "dispatch" } as unknown as DispatchDecision;
    this.#reports = new Reports(undefined, decision.route_release_sha256);
    this.#step = new AttemptStep(decision, this.options.idempotencyKey, effect.started_at_ms, this.#reports as unknown as Session, false);
    return this.call(this.#step, key);
  }

  observation(_effect: DispatchEffect, ok: boolean, reply: unknown): Record<string, unknown> {
    const step = this.#step as AttemptStep;
    step.open = false;
    const fields: Record<string, unknown> = {};
    if (!ok) fields["facts"] = raisedFacts(reply, { classify: this.options.classify, outputDelivered: step.delivered, nowUnixMs: this.clock() });
    if (step.charged !== undefined) fields["cost"] = step.charged;
    return (this.#reports as Reports).fields(fields);
  }

  read(keys: string[]): Promise<StoreRowDoc[]> {
    return storeRead(this.options.store, this.options.namespace ?? "retryledger", keys);
  }

  write(writes: CasDoc[]): Promise<number> {
    return storeWrite(this.options.store, this.options.namespace ?? "retryledger", writes);
  }
}

/**
 * Run one logical request on the run machine with its fleet state in
 * `options.store`: each attempt on a pooled route is sent with the key the
 * core chose (`dispatch`'s second argument: the secret from `options.keys`).
 * Which key, when, and what an answer does to a key are the core's: a 401
 * or 403 disables the key and the run goes on with another key of the pool;
 * a pool with no usable key (every key refused, or none before the deadline)
 * ends the run sealed, terminal `stop_no_usable_key` (the attempts before it
 * in the bundle, each naming its key by digest); writes that keep
 * conflicting throw `store_conflict`.
 */
export async function runPooled<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: (step: Step, key: PooledKey | undefined) => Promise<T> | T,
  options: PooledOptions,
): Promise<PooledResult<T>> {
  const compiled = compiledOf(policy);
  if (!compiled.acceptsKey(options.idempotencyKey, undefined)) {
    throw new DriftError("idempotency_key_drift", "the idempotency key's digest differs from the policy's idempotency_key_sha256", { path: "/idempotency_key_sha256" });
  }
  const clock = options.clock ?? Date.now;
  const pause = options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  const adapter = new Pooled<T>(options, dispatch, clock, pause);
  const machineOptions: MachineOptions = { origin_epoch_ms: adapter.origin };
  if (options.keyAffinity !== undefined) machineOptions.key_affinity = options.keyAffinity;
  if (options.maxConflicts !== undefined) machineOptions.max_conflicts = options.maxConflicts;
  const machine = Machine.start(compiled, machineOptions);
  try {
    const run = await runLoop(machine, adapter);
    return { ...run, keys: adapter.sent };
  } finally {
    machine.free();
  }
}
