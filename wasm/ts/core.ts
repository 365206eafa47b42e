/**
 * The public surface of the core, in camelCase, over the WebAssembly module.
 *
 * JSON text crosses the boundary: a document given as a string goes to the
 * core untouched (so duplicate keys and every other strictness rule apply to
 * exactly what the caller wrote); a plain object is serialized with
 * `JSON.stringify` first. Results come back as plain objects and numbers.
 */

import { DecodeError, fromWire } from "./errors.js";
import { Session } from "./session.js";
import type {
  Attempts,
  Bundle,
  Decision,
  Document,
  Facts,
  HttpObservation,
  ChainVerdict,
  Judgement,
  RepairChain,
  RepairLink,
  LogicalRequest,
  Outcome,
  PolicySpec,
  PriceSchedule,
  Usage,
  Policy,
  Receipt,
  RetryAfterHeader,
  Route,
  Verdict,
} from "./types.js";

/** The raw exports of the wasm-bindgen module (JSON text in and out; errors thrown as JSON text). */
export interface RawCompiled {
  digest(): string;
  policy_json(): string;
  plan_next(attempts: string): string;
  evaluate(attempts: string): string;
  seal(attempts: string): string;
  session(): RawSession;
  journal_verify(events: string): string;
  journal_recover(events: string, reconciliation: string | undefined): string;
  journal_append(events: string, leaseGeneration: number, entry: string): string;
  journal_classify(events: string, event: string): string;
  journal_writer(events: string, leaseGeneration: number): RawJournalWriter;
  require_clients(routeIds: string[]): void;
  require_fleet(given: boolean): void;
  require_driver(driver: string): void;
  require_job_calls(hasCancel: boolean): void;
  free(): void;
}

/** A policy spec compiled once inside the module (`wasm/src/lib.rs`). */
export interface RawPolicyTemplate {
  bind(request: string, idempotencyKeySha256: string): RawCompiled;
  free(): void;
}

/** The module's writer of a journal (JSON text in and out; `wasm/src/journal.rs`). */
export interface RawJournalWriter {
  append(entry: string): string;
  recover(reconciliation: string | undefined): string;
  resume(session: RawSession): void;
  next_seq(): number;
  free(): void;
}

/**
 * The core's Session inside the module: the planned dispatch as numbers
 * (`undefined` once terminal), an observed attempt as numbers and, when
 * dispatch raised, the facts' JSON; attempts and receipt as JSON on request.
 */
export interface RawSession {
  terminal(): string | undefined;
  /** The terminal's position in `TERMINALS`, or `undefined` while the run can dispatch. */
  terminal_index(): number | undefined;
  route_index(): number | undefined;
  ordinal(): number | undefined;
  route_ordinal(): number | undefined;
  not_before_ms(): number | undefined;
  delay_ms(): number | undefined;
  reserve_cost(): number | undefined;
  retry_after_floor_ms(): number | undefined;
  jitter_min_ms(): number | undefined;
  jitter_max_ms(): number | undefined;
  jitter_sample_ms(): number | undefined;
  /** Without facts: the rule (`returned`); with facts: the judgement's JSON. */
  observe(startedAtMs: number, completedAtMs: number, cost: number | undefined, facts: string | undefined): string;
  /** `observe` with facts decoded beforehand: the rule's position in `RULES`. */
  observe_prepared(startedAtMs: number, completedAtMs: number, cost: number | undefined, facts: RawFacts): number;
  cancel(atMs: number): void;
  attempts_json(): string;
  last_attempt_json(): string | undefined;
  receipt_json(): string;
  receipt_json_hashed(attemptsSha256: string): string;
  /** A run of the same policy with no attempt yet, in this session's memory. */
  restart(): void;
  /** The planned dispatch's numbers into the plan buffer (`false` once terminal). */
  plan(): boolean;
  /** Where `plan` writes, in the module's memory. */
  plan_ptr(): number;
  /** Where `attempts_bytes` and `seal_hashed` wrote. */
  bytes_ptr(): number;
  /** The attempts' canonical JSON (UTF-8) at `bytes_ptr()`: its length. */
  attempts_bytes(): number;
  /**
   * Seal: the receipt's canonical JSON appended after the attempts' bytes,
   * and the receipt as a tape; where to read them goes into the plan buffer.
   */
  seal_hashed(attemptsSha256: string): void;
  free(): void;
}

/** Facts decoded by the core once, for an error raised again and again. */
export interface RawFacts {
  free(): void;
}

export interface RawBindings {
  validate_policy(policy: string): string;
  plan_next(policy: string, attempts: string): string;
  evaluate(policy: string, attempts: string): string;
  verify_bundle(bundle: string): string;
  digest(document: string): string;
  parse_retry_after(header: string, value: string, nowUnixMs: number, capMs: number): number;
  classify_http(observation: string): string;
  judge(facts: string): string;
  next_repair(links: string, requestSha256: string, idempotencyKeySha256: string, startedAtMs: number): string;
  repair_step(links: string, rootKey: string, tenant: string | undefined, operation: string | undefined): string;
  verify_repair_chain(chain: string): string;
  request_sha256(request: string): string;
  build_policy(request: string, spec: string): string;
  lift_request(call: string, params: string): string;
  check_sent_request(request: string, urlPath: string, body: string): void;
  check_price_schedule(policy: string, schedule: string): string;
  price_cost(schedule: string, routeReleaseSha256: string, usage: string): number;
  canonical_request(request: string): string;
  idempotency_key_sha256(key: string, tenant: string | undefined, operation: string | undefined): string;
  check_outcome(outcome: string): string;
  sha256_hex(text: string): string;
  sha256_bytes_hex(bytes: Uint8Array): string;
  module_memory(): WebAssembly.Memory;
  tape_key(id: number): string | undefined;
  tape_str(id: number): string | undefined;
  tape_json(ops: Float64Array, text: string): string;
  Compiled: { compile(policy: string): RawCompiled };
  PolicyTemplate: { compile(spec: string): RawPolicyTemplate };
  Facts: { decode(facts: string): RawFacts; returned(): RawFacts };
}

let raw: RawBindings | undefined;

/**
 * A native SHA-256 as lowercase hex of a string's UTF-8 bytes or of bytes,
 * where the platform has one that is synchronous (Node's `node:crypto`);
 * sealing then hashes the core's canonical attempts bytes natively, where
 * the module wrote them. Unset in browsers.
 */
export let hostSha256: ((data: string | Uint8Array) => string) | undefined;

/** Set the native SHA-256 (the Node entry point does). */
export function setHostSha256(f: ((data: string | Uint8Array) => string) | undefined): void {
  hostSha256 = f;
}

let memory: WebAssembly.Memory | undefined;
let u8: Uint8Array = new Uint8Array(0);
let f64: Float64Array = new Float64Array(0);

/** Install the module's exports (done by the Node entry at load, by the web entry's `init()`). */
export function setBindings(bindings: RawBindings): void {
  raw = bindings;
  memory = bindings.module_memory();
  u8 = new Uint8Array(0);
  f64 = new Float64Array(0);
  tapeKeys.length = 0;
  tapeStrs.length = 0;
  rootShape = new Shape([], true);
  shapes = 0;
  returned = undefined;
}

/** The facts of a dispatch that returned, made by the module once. */
let returned: RawFacts | undefined;

/** The facts of a dispatch that returned, as the module holds them (for `observe_prepared`). */
export function returnedFacts(): RawFacts {
  return (returned ??= bindings().Facts.returned());
}

/** Object keys the module has sent (by number), for `fromTape`. */
const tapeKeys: string[] = [];
/** String values the module has numbered (by number), for `fromTape`. */
const tapeStrs: string[] = [];

/** Makes an object of one shape from its values, at `at` of a value stack. */
type Make = (values: readonly unknown[], at: number) => Record<string, unknown>;

/** Shapes kept at most (a document has a few; past them, objects are made key by key). */
const MAX_SHAPES = 1024;
/** Shapes kept so far. */
let shapes = 0;

/**
 * An object's keys so far, in tape order: a node of the tree of the key
 * sequences the tapes' objects have had, walked key by key (numbered keys
 * only). The objects of a shape met before (a receipt's schedule entries,
 * the receipt itself on the next run) are made by one object literal with
 * the shape's keys in that order, a function made once per shape, rather
 * than property by property: every object still gets its keys in the tape's
 * order, as plain data properties.
 */
class Shape {
  readonly keys: readonly string[];
  /** Whether the shape is in the tree (every key numbered, and room left). */
  readonly #kept: boolean;
  #lastId = -1;
  #last: Shape | undefined;
  #next: Map<number, Shape> | undefined;
  #make: Make | undefined;
  #seen = 0;

  constructor(keys: readonly string[], kept: boolean) {
    this.keys = keys;
    this.#kept = kept;
  }

  /** The shape with `key` (numbered `id`, or -1 for a key not numbered) added. */
  child(id: number, key: string): Shape {
    if (id === this.#lastId && this.#last !== undefined) return this.#last;
    let next = this.#next?.get(id);
    if (next === undefined) {
      const kept = this.#kept && id >= 0 && shapes < MAX_SHAPES;
      next = new Shape([...this.keys, key], kept);
      if (!kept) return next;
      shapes += 1;
      (this.#next ??= new Map()).set(id, next);
    }
    this.#lastId = id;
    this.#last = next;
    return next;
  }

  /** An object of this shape from the values at `at`. */
  make(values: readonly unknown[], at: number): Record<string, unknown> {
    const make = this.#make;
    if (make !== undefined) return make(values, at);
    // Key by key until the shape is met again (a shape met once needs no function).
    if (this.#kept && ++this.#seen >= 2) this.#make = literalOf(this.keys);
    return byKeys(this.keys, values, at);
  }
}

function byKeys(keys: readonly string[], values: readonly unknown[], at: number): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (let j = 0; j < keys.length; j++) o[keys[j] as string] = values[at + j];
  return o;
}

/**
 * A function returning `{k0: values[at], k1: values[at + 1], …}`: an object
 * literal whose keys are the shape's, each written as its JSON string
 * literal. Key by key where code cannot be made from text (a host that
 * forbids it) or where a literal would not make a plain data property
 * (`__proto__`).
 */
function literalOf(keys: readonly string[]): Make {
  const slow: Make = (values, at) => byKeys(keys, values, at);
  if (keys.includes("__proto__")) return slow;
  const fields = keys.map((k, j) => `${JSON.stringify(k)}:v[a+${String(j)}]`).join(",");
  try {
    return new Function("v", "a", `"use strict";return{${fields}};`) as Make;
  } catch {
    return slow;
  }
}

/** The root of the shape tree (the empty object); a new one with the key numbers (`setBindings`). */
let rootShape = new Shape([], true);

/** `fromTape`'s value stack: the values of the objects and arrays open. */
const tapeValues: unknown[] = [];
/** The enclosing containers' shapes (`undefined`: an array) and where their values start. */
const tapeShapes: (Shape | undefined)[] = [];
const tapeStarts: number[] = [];

/**
 * A document from the tape the module wrote (`wasm/src/tape.rs`): plain
 * objects, arrays, numbers, booleans and strings, in the core's encoding
 * order. `ops` is the module's memory as 64-bit floats, the tape at
 * `[start, start + count)`; `text` is the tape's string bytes decoded, which
 * its offsets index (UTF-16 units). An open container's values wait on a
 * stack; the container is made when it closes (an object by its shape).
 */
export function fromTape(ops: Float64Array, start: number, count: number, text: string): unknown {
  const values = tapeValues;
  let sp = 0;
  let high = 0;
  let depth = 0;
  let shape: Shape | undefined;
  let at = 0;
  let done: unknown;
  const end = start + count;
  try {
    for (let i = start; i < end; ) {
      const op = (ops[i++] as number) | 0;
      let value: unknown;
      switch (op) {
        case 0: // {
        case 2: // [
          tapeShapes[depth] = shape;
          tapeStarts[depth] = at;
          depth += 1;
          shape = op === 0 ? rootShape : undefined;
          at = sp;
          continue;
        case 1: // }
        case 3: // ]
          if (sp > high) high = sp;
          value = shape === undefined ? values.slice(at, sp) : shape.make(values, at);
          sp = at;
          depth -= 1;
          shape = tapeShapes[depth];
          at = tapeStarts[depth] as number;
          break;
        case 4: {
          // a key sent before (asked for by its number if this side missed it)
          const id = (ops[i++] as number) | 0;
          const key = (tapeKeys[id] ??= bindings().tape_key(id) as string);
          shape = (shape as Shape).child(id, key);
          continue;
        }
        case 5: {
          // a key sent for the first time
          const id = (ops[i] as number) | 0;
          const key = text.slice((ops[i + 1] as number) | 0, (ops[i + 2] as number) | 0);
          tapeKeys[id] = key;
          shape = (shape as Shape).child(id, key);
          i += 3;
          continue;
        }
        case 6: // a key not numbered
          shape = (shape as Shape).child(-1, text.slice((ops[i] as number) | 0, (ops[i + 1] as number) | 0));
          i += 2;
          continue;
        case 7:
          value = ops[i++];
          break;
        case 8:
          value = true;
          break;
        case 9:
          value = false;
          break;
        case 10:
          value = text.slice((ops[i] as number) | 0, (ops[i + 1] as number) | 0);
          i += 2;
          break;
        case 11: {
          // a string sent before (asked for by its number if this side missed it)
          const id = (ops[i++] as number) | 0;
          value = tapeStrs[id] ??= bindings().tape_str(id) as string;
          break;
        }
        case 12: {
          // a string numbered now
          const s = text.slice((ops[i + 1] as number) | 0, (ops[i + 2] as number) | 0);
          tapeStrs[(ops[i] as number) | 0] = s;
          value = s;
          i += 3;
          break;
        }
        default:
          throw new Error(`retryledger: tape operation ${String(op)} unknown`);
      }
      if (depth === 0) done = value;
      else values[sp++] = value;
    }
  } finally {
    // The stacks keep nothing of this document.
    if (sp > high) high = sp;
    values.fill(undefined, 0, high);
    for (let j = 0; j < depth; j++) tapeShapes[j] = undefined;
  }
  return done;
}

/** The module's memory as bytes (a new view once the memory has grown: the old one is then detached, of length 0). */
export function moduleBytes(): Uint8Array {
  if (u8.byteLength === 0) u8 = new Uint8Array((memory as WebAssembly.Memory).buffer);
  return u8;
}

/** The module's memory as 64-bit floats (a new view once the memory has grown). */
export function moduleFloats(): Float64Array {
  if (f64.byteLength === 0) f64 = new Float64Array((memory as WebAssembly.Memory).buffer);
  return f64;
}

function bindings(): RawBindings {
  if (raw === undefined) {
    throw new Error("retryledger: the WebAssembly module is not initialized; in a browser, `await init()` first");
  }
  return raw;
}

/** Run a raw call, turning the module's thrown JSON text into a typed error. */
export function call<T>(f: (b: RawBindings) => T): T {
  const b = bindings();
  try {
    return f(b);
  } catch (e) {
    if (typeof e === "string") throw fromWire(e);
    throw e;
  }
}

/** A document as the caller gave it: a plain object, or its JSON text. */
export type Input<T> = T | string;

/** JSON text of a document given as an object or as text. */
/** UTF-8 length of a string (lone surrogates count as U+FFFD, as the encoder writes them). */
export function utf8Length(s: string): number {
  const n = s.length;
  let bytes = n;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    if (c < 0x800) bytes += 1;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < n && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      bytes += 2; // a pair: 4 bytes for 2 code units
      i++;
    } else bytes += 2;
  }
  return bytes;
}

export function toText(doc: unknown): string {
  if (typeof doc === "string") return doc;
  let text: string | undefined;
  try {
    text = JSON.stringify(doc);
  } catch (e) {
    throw new DecodeError("invalid_type", `invalid_type: the document cannot be serialized as JSON (${String(e)})`, {
      path: "",
      cause: e,
    });
  }
  if (text === undefined) {
    throw new DecodeError("invalid_type", "invalid_type: a document is a JSON object or its JSON text", { path: "" });
  }
  return text;
}

function requireString(x: unknown, name: string): string {
  if (typeof x !== "string") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a string`, { path: `/${name}` });
  }
  return x;
}

function requireNumber(x: unknown, name: string): number {
  if (typeof x !== "number") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a number`, { path: `/${name}` });
  }
  return x;
}

function deepFreeze<T>(x: T): T {
  if (typeof x === "object" && x !== null) {
    for (const v of Object.values(x)) deepFreeze(v);
    Object.freeze(x);
  }
  return x;
}

/** Finished sessions a compiled policy keeps for reuse. */
const MAX_SPARE_SESSIONS = 4;

/** A policy validated and digested once; plan, evaluate and seal every step of a run against it. */
export class CompiledPolicy {
  /** The policy digest (lowercase hex SHA-256 of its canonical JSON). */
  readonly digest: string;
  readonly #raw: RawCompiled;
  #policyJson: string | undefined;
  #policy: Readonly<Policy> | undefined;
  #routes: readonly Route[] | undefined;
  #checkedKey: string | undefined;
  /** Finished sessions kept for the next runs (their module memory reused). */
  readonly #spare: RawSession[] = [];

  /**
   * Decode and validate a policy; throws `DecodeError` or `PolicyError`.
   * (`bound` is a policy the module already compiled: a template's bind.)
   */
  constructor(policy: Input<Policy>, bound?: { raw: RawCompiled; policyJson?: string }) {
    if (bound !== undefined) {
      this.#raw = bound.raw;
      this.#policyJson = bound.policyJson;
    } else {
      const text = toText(policy);
      this.#raw = call((b) => b.Compiled.compile(text));
    }
    this.digest = this.#raw.digest();
  }

  /** The policy's canonical JSON text. */
  get policyJson(): string {
    return (this.#policyJson ??= this.#raw.policy_json());
  }

  /** The policy, as the core decoded it (deeply frozen; bundles sealed by the driver share it). */
  get policy(): Readonly<Policy> {
    return (this.#policy ??= deepFreeze(JSON.parse(this.policyJson) as Policy));
  }

  /** The routes in priority order. */
  get routesByPriority(): readonly Route[] {
    return (this.#routes ??= Object.freeze([...this.policy.routes].sort((a, b) => a.priority - b.priority)));
  }

  /**
   * Whether the raw idempotency key's digest (bare, or scoped by tenant and
   * operation: `idempotencyKeySha256`) is the policy's `idempotency_key_sha256`.
   */
  acceptsKey(key: string, scope?: { tenant: string; operation: string }): boolean {
    if (scope === undefined && key === this.#checkedKey) return true;
    const digest = scope === undefined ? sha256Hex(key) : idempotencyKeySha256(key, scope);
    if (digest !== this.policy.idempotency_key_sha256) return false;
    if (scope === undefined) this.#checkedKey = key;
    return true;
  }

  /** A run of this policy with no attempt yet: the core's Session (free it when done). */
  session(): Session {
    const spare = this.#spare.pop();
    if (spare !== undefined) {
      spare.restart();
      return new Session(this, spare);
    }
    return new Session(this, call(() => this.#raw.session()));
  }

  /** @internal Keep a finished session for a later run of this policy (freed when enough are kept). */
  recycle(raw: RawSession): void {
    if (this.#spare.length < MAX_SPARE_SESSIONS) this.#spare.push(raw);
    else raw.free();
  }

  /** The next dispatch, or the terminal, after the observed attempts. */
  /**
   * Refuse, before any dispatch, a policy with a route the host has no
   * client for: `routeIds` are the routes that have one. Throws
   * `PolicyError` `route_client_missing` at the first route without one (in
   * priority order), naming every such route.
   */
  requireClients(routeIds: readonly string[]): void {
    const ids = routeIds.map(String);
    this.callRaw((raw) => raw.require_clients(ids));
  }

  /**
   * Refuse, before any dispatch, a fleet that does not fit the policy:
   * `given` is whether the caller passed one. Throws `DriftError`
   * `admission_missing` (a fleet section without a fleet) or
   * `admission_unexpected` (a fleet without a fleet section), at `/fleet`.
   */
  requireFleet(given: boolean): void {
    this.callRaw((raw) => raw.require_fleet(given));
  }

  /**
   * Refuse, before any dispatch, a policy the driver named `driver` cannot
   * run (a section it needs or cannot carry, a stream mode it cannot
   * carry): the core's coded error at `/<section>` or `/stream/mode`
   * (docs/COMPOSITION.md, "What a driver carries").
   */
  requireDriver(driver: "workflow" | "job" | "stream" | "journaled" | "ai_sdk" | "langchain" | "pydantic_ai"): void {
    this.callRaw((raw) => raw.require_driver(driver));
  }

  /**
   * Refuse, before any dispatch, an async job whose calls have no `cancel`
   * under `cancel_left_running` (the run may plan that cancel): `PolicyError`
   * `invalid_async_job` at `/async_job/cancel_left_running`.
   */
  requireJobCalls(hasCancel: boolean): void {
    this.callRaw((raw) => raw.require_job_calls(hasCancel));
  }

  planNext(attempts: Input<Attempts>): Decision {
    const text = toText(attempts);
    return JSON.parse(call(() => this.#raw.plan_next(text))) as Decision;
  }

  /** The receipt of a finished run (`RunError` `run_not_terminal` if it could still dispatch). */
  evaluate(attempts: Input<Attempts>): Receipt {
    const text = toText(attempts);
    return JSON.parse(call(() => this.#raw.evaluate(text))) as Receipt;
  }

  /** Seal a finished run: the bundle of policy, attempts and receipt. */
  seal(attempts: Input<Attempts>): Bundle {
    const text = toText(attempts);
    return JSON.parse(call(() => this.#raw.seal(text))) as Bundle;
  }

  /**
   * @internal A core call against the module's compiled policy (the journal
   * transitions: the policy is not decoded and validated again per call).
   */
  callRaw<T>(f: (raw: RawCompiled) => T): T {
    const raw = this.#raw;
    return call(() => f(raw));
  }

  /** The raw JSON text of `planNext` (canonical key order). */
  planNextText(attempts: Input<Attempts>): string {
    const text = toText(attempts);
    return call(() => this.#raw.plan_next(text));
  }

  /** Release the module memory now rather than at garbage collection. */
  free(): void {
    for (const spare of this.#spare.splice(0)) spare.free();
    this.#raw.free();
  }
}

/** Policies given as objects or text, compiled once by their JSON text (the most recently used kept). */
const compiledByText = new Map<string, CompiledPolicy>();
const MAX_COMPILED_POLICIES = 16;

/**
 * @internal `policy` when compiled; else the compiled policy of a policy
 * given as an object or text: the same text is decoded and validated once (a
 * policy object changed between runs is another text, compiled again). A
 * policy dropped from the cache is left to the garbage collector, since a
 * run may still use it. Every driver and client integration compiles here
 * (the one-shot functions, `planNext`, `evaluate`, ..., compile and free their own).
 */
export function compiledOf(policy: Input<Policy> | CompiledPolicy): CompiledPolicy {
  if (policy instanceof CompiledPolicy) return policy;
  const text = toText(policy);
  let compiled = compiledByText.get(text);
  if (compiled !== undefined) {
    compiledByText.delete(text);
  } else {
    compiled = new CompiledPolicy(text);
    if (compiledByText.size >= MAX_COMPILED_POLICIES) {
      const oldest = compiledByText.keys().next();
      if (oldest.done !== true) compiledByText.delete(oldest.value);
    }
  }
  compiledByText.set(text, compiled);
  return compiled;
}

/** Decode and validate a policy once, for reuse across a run. */
export function compilePolicy(policy: Input<Policy>): CompiledPolicy {
  return new CompiledPolicy(policy);
}

function withPolicy<T>(policy: Input<Policy> | CompiledPolicy, f: (p: CompiledPolicy) => T): T {
  if (policy instanceof CompiledPolicy) return f(policy);
  const compiled = new CompiledPolicy(policy);
  try {
    return f(compiled);
  } finally {
    compiled.free();
  }
}

/** Validate a policy: its digest, or the first rule it breaks (`DecodeError`/`PolicyError`). */
export function validatePolicy(policy: Input<Policy>): string {
  const text = toText(policy);
  return call((b) => b.validate_policy(text));
}

/** What to dispatch next and not before when, or the terminal. */
export function planNext(policy: Input<Policy> | CompiledPolicy, attempts: Input<Attempts>): Decision {
  if (policy instanceof CompiledPolicy) return policy.planNext(attempts);
  const p = toText(policy);
  const a = toText(attempts);
  return JSON.parse(call((b) => b.plan_next(p, a))) as Decision;
}

/** The receipt of a finished run. */
export function evaluate(policy: Input<Policy> | CompiledPolicy, attempts: Input<Attempts>): Receipt {
  if (policy instanceof CompiledPolicy) return policy.evaluate(attempts);
  const p = toText(policy);
  const a = toText(attempts);
  return JSON.parse(call((b) => b.evaluate(p, a))) as Receipt;
}

/** Seal a finished run into a bundle. */
export function seal(policy: Input<Policy> | CompiledPolicy, attempts: Input<Attempts>): Bundle {
  return withPolicy(policy, (p) => p.seal(attempts));
}

/** Replay a bundle: `verified`, or the first drift. A policy that fails validation throws. */
export function verifyBundle(bundle: Input<Bundle>): Verdict {
  const text = toText(bundle);
  return JSON.parse(call((b) => b.verify_bundle(text))) as Verdict;
}

/** Lowercase hex SHA-256 of a document's canonical JSON (after strict decoding into the type its `schema` names). */
export function digest(document: Input<Document>): string {
  const text = toText(document);
  return call((b) => b.digest(text));
}

/**
 * A Retry-After hint in bounded milliseconds: delay-seconds or an HTTP-date
 * (`retry-after`, resolved against `nowUnixMs`) or a millisecond count
 * (`retry-after-ms`), clamped to `capMs`. Garbage throws `HttpError`.
 */
export function parseRetryAfter(header: RetryAfterHeader | string, value: string, nowUnixMs: number, capMs: number): number {
  const h = requireString(header, "header");
  const v = requireString(value, "value");
  const now = requireNumber(nowUnixMs, "now_unix_ms");
  const cap = requireNumber(capMs, "cap_ms");
  return call((b) => b.parse_retry_after(h, v, now, cap));
}

/** A typed outcome from an HTTP status, headers, transport error and whether response bytes arrived. */
export function classifyHttp(observation: Input<HttpObservation>): Outcome {
  const text = toText(observation);
  return JSON.parse(call((b) => b.classify_http(text))) as Outcome;
}

/** Lowercase hex SHA-256 of a string's UTF-8 bytes. */
export function sha256Hex(text: string): string {
  const t = requireString(text, "text");
  return bindings().sha256_hex(t);
}

/**
 * Lowercase hex SHA-256 of a request body as sent: a string's UTF-8 bytes,
 * or the bytes themselves.
 */
export function bodySha256(body: string | Uint8Array): string {
  if (typeof body === "string") return (hostSha256 ?? sha256Hex)(body);
  if (body instanceof Uint8Array) return bindings().sha256_bytes_hex(body);
  throw new TypeError("a request body is a string or a Uint8Array");
}


/** The core's judgement of what a host observed of one attempt (docs/HOSTS.md, "Facts"). */
export function judge(facts: Input<Facts>): Judgement {
  const text = toText(facts);
  return JSON.parse(call((b) => b.judge(text))) as Judgement;
}

/**
 * The policy of the next repair of a chain (docs/REPAIR.md): the root
 * policy with the repair's request and key digests, the deadline left
 * (`deadline_ms - startedAtMs`) and the cost left. Throws `DriftError`
 * `repair_not_allowed`, `repair_over_budget`, `repair_after_terminal`,
 * `repair_same_request` or `repair_chain_drift` when no repair may follow.
 */
export function nextRepair(links: Input<RepairLink[]>, requestSha256: string, idempotencyKeySha256: string, startedAtMs: number): Policy {
  const text = toText(links);
  return JSON.parse(call((b) => b.next_repair(text, requestSha256, idempotencyKeySha256, startedAtMs))) as Policy;
}

/** The repair that may follow a chain's last run: its raw key (`<rootKey>:repair:<n>`), the key's digest and its ordinal. */
export interface RepairStep {
  idempotency_key: string;
  idempotency_key_sha256: string;
  repair_ordinal: number;
}

/**
 * What may follow a chain's last run (docs/REPAIR.md), for a request whose
 * root run sent the raw key `rootKey` (under `scope` when its digest is
 * scoped): the repair that may follow when the last run stopped with
 * invalid output, or `null` when the last run's end stands. Whether that
 * repair is within the policy's bounds is `nextRepair`'s answer.
 */
export function repairStep(links: Input<RepairLink[]>, rootKey: string, scope?: { tenant: string; operation: string }): RepairStep | null {
  const text = toText(links);
  return JSON.parse(call((b) => b.repair_step(text, rootKey, scope?.tenant, scope?.operation))) as RepairStep | null;
}

/** Replay a `retryledger.repair_chain.v1`: every run and every repair's budget (docs/REPAIR.md). */
export function verifyRepairChain(chain: Input<RepairChain>): ChainVerdict {
  const text = toText(chain);
  return JSON.parse(call((b) => b.verify_repair_chain(text))) as ChainVerdict;
}

/**
 * The digest of a logical request (`retryledger.request.v1`): SHA-256 of its
 * RFC 8785 canonical JSON, numbers as ECMAScript writes them. This is the
 * policy's `logical_request_sha256`. Throws `DecodeError` for a request that
 * cannot be canonicalized.
 */
export function requestSha256(request: Input<LogicalRequest>): string {
  const text = toText(request);
  return call((b) => b.request_sha256(text));
}

/**
 * A policy spec compiled once — routes, budgets, sections, every rule
 * checked — and bound per call to its logical request and idempotency key:
 * `bind` gives exactly the document and digest `buildPolicy` gives for the
 * spec with that key, in a few microseconds. The spec leaves out
 * `idempotency_key_sha256`.
 */
export class PolicyTemplate {
  readonly #raw: RawPolicyTemplate;

  /** Compile a spec; throws `DecodeError` or `PolicyError`. */
  constructor(spec: Input<PolicySpec>) {
    const s = toText(spec);
    this.#raw = call((b) => b.PolicyTemplate.compile(s));
  }

  /** The policy of one call: its logical request and the key's digest (`idempotencyKeySha256`). */
  bind(request: Input<LogicalRequest>, idempotencyKeySha256: string): CompiledPolicy {
    const r = toText(request);
    const k = requireString(idempotencyKeySha256, "idempotencyKeySha256");
    const raw = call(() => this.#raw.bind(r, k));
    return new CompiledPolicy("", { raw });
  }

  /** Release the module memory now rather than at garbage collection. */
  free(): void {
    this.#raw.free();
  }
}

/** Compile a policy spec once for many calls (`PolicyTemplate`). */
export function compilePolicyTemplate(spec: Input<PolicySpec>): PolicyTemplate {
  return new PolicyTemplate(spec);
}

/**
 * Build a policy from a logical request and a policy spec
 * (`retryledger.policy_spec.v1`: route releases and behavior classes as
 * catalog documents in place of digests, routes in priority order, budgets):
 * the core computes every digest and validates the result with the same
 * codes as `validatePolicy`. Returns the compiled policy, ready for
 * `runWithPolicy`; its `.policy` is the JSON to store.
 */
export function buildPolicy(request: Input<LogicalRequest>, spec: Input<PolicySpec>): CompiledPolicy {
  const r = toText(request);
  const s = toText(spec);
  return new CompiledPolicy(call((b) => b.build_policy(r, s)));
}

/**
 * Check a price schedule (`retryledger.price_schedule.v1`) against a policy
 * before any dispatch: the same cost unit, every route release priced once.
 * Returns the schedule's digest; throws `PolicyError` otherwise.
 */
export function checkPriceSchedule(policy: Input<Policy>, schedule: Input<PriceSchedule>): string {
  const p = toText(policy);
  const s = toText(schedule);
  return call((b) => b.check_price_schedule(p, s));
}

/**
 * What raw usage (units by kind: `input`, `output`, `cached_input`, …) costs
 * on a route release: the sum of `ceil(units * price / 10^6)`. A kind the
 * release does not price is `usage_unpriced`, never a silent zero.
 */
export function priceCost(schedule: Input<PriceSchedule>, routeReleaseSha256: string, usage: Input<Usage>): number {
  const s = toText(schedule);
  const r = requireString(routeReleaseSha256, "route_release_sha256");
  const u = toText(usage);
  return call((b) => b.price_cost(s, r, u));
}

/**
 * The logical request of an SDK call, from the parameters you would pass it:
 * `call` is `openai.chat.completions`, `openai.responses` or
 * `anthropic.messages`. The core's table sends messages, tools, the output
 * contract, sampling and the seed into the request and keeps the model and
 * transport options out of it; an unknown parameter is `unknown_field`.
 */
export function liftRequest(callName: string, params: Input<Record<string, unknown>>): LogicalRequest {
  const c = requireString(callName, "call");
  const p = toText(params);
  return JSON.parse(call((b) => b.lift_request(c, p))) as LogicalRequest;
}

/**
 * Check an SDK call about to be sent (the URL path and JSON body it sends)
 * against the logical request its policy binds: the body is lifted like
 * `liftRequest` and compared; another request throws `DriftError`
 * `request_drift`. A path no call the core lifts goes to, and a request
 * written by hand (an `operation` no call lifts to), pass. The integrations
 * call it for you (`step.checkSent`).
 */
export function checkSentRequest(request: Input<LogicalRequest>, urlPath: string, body: string): void {
  const r = toText(request);
  const p = requireString(urlPath, "urlPath");
  const b = requireString(body, "body");
  call((m) => m.check_sent_request(r, p, b));
}

/** A logical request's RFC 8785 canonical JSON. */
export function canonicalRequest(request: Input<LogicalRequest>): string {
  const text = toText(request);
  return call((b) => b.canonical_request(text));
}

/**
 * The digest of an idempotency key: `sha256(key)` for a bare key, or the
 * digest of `{key, operation, tenant}` when `scope` names both. The raw key
 * never appears in a document.
 */
export function idempotencyKeySha256(key: string, scope?: { tenant: string; operation: string }): string {
  const k = requireString(key, "key");
  return call((b) => b.idempotency_key_sha256(k, scope?.tenant, scope?.operation));
}

/** An outcome document as the core decodes it (strictly): its canonical JSON text; throws `DecodeError`. */
export function checkOutcome(outcome: Input<Outcome>): string {
  const text = toText(outcome);
  return call((b) => b.check_outcome(text));
}

/** Facts decoded by the core once (throws `DecodeError`). */
export function prepareFacts(facts: string): RawFacts {
  return call((b) => b.Facts.decode(facts));
}
