// Key pools: one provider's API keys, each with its own health
// (`retryledger.key_pool.v1`, one register per pool; docs/FLEET.md).

import { call, toText, type Input, type RawBindings } from "./core.js";
import { DecodeError } from "./errors.js";
import type { Outcome, Sha256Hex } from "./types.js";

/** One key of a pool: the SHA-256 of its secret and the account whose quota it draws on. */
export interface PoolKey {
  account?: string;
  key_sha256: Sha256Hex;
}

/** A pool's configuration. */
export interface KeyPoolConfig {
  /** How long a rate-limited key cools when the answer gave no hint, ms. */
  cool_ms: number;
  keys: PoolKey[];
  /** The pool's name: its register is `key_pool/<name>`. */
  name: string;
  /** How long a key whose quota cannot clear is parked, ms. */
  park_ms: number;
}

/** One key's state in a pool snapshot. */
export interface KeyState {
  key_sha256: Sha256Hex;
  last_limited_at_epoch_ms?: number;
  last_used_at_epoch_ms?: number;
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
