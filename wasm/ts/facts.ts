/**
 * What a host reads off a thrown error: plain facts (docs/HOSTS.md, "Facts").
 * The core judges them (`judge`, `Session.observe`); nothing here decides an
 * outcome.
 *
 * - `error_types`: the constructor names along the prototype chain (without
 *   `Object`), and the error's `name` when it is not one of them (a
 *   `DOMException`'s `AbortError` / `TimeoutError`), then the same along the
 *   `cause` chain; at most 32.
 * - `error_codes`: string `code` properties along the same chain.
 * - `status`: the first integer in 100..=599 among `status`, `status_code`,
 *   `statusCode`, `response.status`, `response.status_code`.
 * - `headers`: the headers the core reads (`READ_HEADERS`: Retry-After and
 *   rate-limit headers) from `headers` or `response.headers`: a `Headers`
 *   object, anything with `.get`, a plain object or an array of pairs.
 * - `error_body`: for an error status, the response body: a string `body`
 *   (`HttpStatusError`), else JSON of an object `body` or `error` (the
 *   `openai` and `@anthropic-ai/sdk` `APIError`), cut to
 *   `MAX_ERROR_BODY_BYTES` + 1 characters, unpaired surrogates replaced
 *   (docs/PROVIDERS.md).
 * - `outcome`: an `AttemptError`'s outcome, else the classify hook's answer.
 */

import { checkOutcome, prepareFacts, type RawFacts } from "./core.js";
import { MAX_ERROR_BODY_BYTES, MAX_ERROR_NAME_BYTES as MAX_NAME_BYTES, MAX_ERROR_NAMES as MAX_NAMES, READ_HEADERS } from "./tables.js";
import type { Facts, IndeterminateKind, NonRetryableKind, Outcome, RetryableKind } from "./types.js";

/** The most header pairs passed on. */
const MAX_HEADER_PAIRS = 32;

let factsTextOf: (e: AttemptError) => string | undefined;
let preparedOf: (e: AttemptError) => RawFacts | undefined;

/** An error that says exactly what happened to the attempt. Throw it from `dispatch`. */
export class AttemptError extends Error {
  /** The outcome, as the core decoded it. */
  readonly outcome: Outcome;
  /** The facts' JSON for a raised AttemptError, prepared once (the explicit rule decides them alone). */
  readonly #facts: string | undefined;
  /** The same facts decoded by the core, on the first attempt that raised this error. */
  #prepared: RawFacts | undefined;

  static {
    factsTextOf = (e) => e.#facts;
    preparedOf = (e) => {
      if (e.#prepared === undefined && e.#facts !== undefined) e.#prepared = prepareFacts(e.#facts);
      return e.#prepared;
    };
  }

  /** The core decodes `outcome` strictly: throws `DecodeError` when it is not an outcome document. */
  constructor(outcome: Outcome, message?: string, options?: { cause?: unknown }) {
    const canonical = checkOutcome(outcome);
    const decoded = Object.freeze(JSON.parse(canonical) as Outcome);
    super(message ?? describe(decoded), options);
    this.name = "AttemptError";
    this.outcome = decoded;
    // A raised error is never a success: the core ignores an explicit success and reads the rest.
    this.#facts = decoded.class === "success" ? undefined : `{"outcome":${canonical},"result":"raised"}`;
  }

  /** A retryable failure, with the server's Retry-After hint in ms if it sent one. */
  static retryable(kind: RetryableKind, retryAfterMs?: number, options?: { cause?: unknown }): AttemptError {
    const outcome: Outcome =
      retryAfterMs === undefined ? { class: "retryable", kind } : { class: "retryable", kind, retry_after_ms: retryAfterMs };
    return new AttemptError(outcome, undefined, options);
  }

  /** A failure no other attempt repairs. */
  static nonRetryable(kind: NonRetryableKind, options?: { cause?: unknown }): AttemptError {
    return new AttemptError({ class: "non_retryable", kind }, undefined, options);
  }

  /** An outcome whose effect is unknown; stops the run for reconciliation. */
  static indeterminate(kind: IndeterminateKind, options?: { cause?: unknown }): AttemptError {
    return new AttemptError({ class: "indeterminate", kind }, undefined, options);
  }
}

function describe(o: Outcome): string {
  return o.class === "success" ? "success" : `${o.class}: ${o.kind}`;
}

/** The caller's classify hook: an outcome for an error it knows (it becomes `facts.outcome`), or `undefined`. */
export type Classifier = (error: unknown) => Outcome | undefined;

/** What the host knows about an attempt besides the error. */
export interface FactsOptions {
  /** The caller's classify hook (not asked about an `AttemptError`, nor when the caller cancelled). */
  classify?: Classifier | undefined;
  /** Response bytes reached the caller before the failure (`step.outputDelivered()`). */
  outputDelivered?: boolean | undefined;
  /** The caller cancelled while the attempt was in flight. */
  cancelled?: boolean | undefined;
  /** Wall clock, Unix ms. */
  nowUnixMs?: number | undefined;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether the core accepts `x` as a name: a string of 1 to 256 UTF-8 bytes, well-formed. */
function isName(x: unknown): x is string {
  if (typeof x !== "string" || x === "") return false;
  if (x.length > MAX_NAME_BYTES) return false;
  if (x.length * 3 > MAX_NAME_BYTES && new TextEncoder().encode(x).length > MAX_NAME_BYTES) return false;
  return !LONE_SURROGATE.test(x);
}

function push(list: string[], name: unknown): void {
  if (list.length < MAX_NAMES && isName(name)) list.push(name);
}

const hasOwn = (o: object, k: PropertyKey): boolean => Object.prototype.hasOwnProperty.call(o, k);

/** Class names and codes along the error's prototype chain and `cause` chain. */
function namesOf(error: unknown, types: string[], codes: string[]): void {
  const seen: unknown[] = [];
  let e: unknown = error;
  while (typeof e === "object" && e !== null && !seen.includes(e) && seen.length < MAX_NAMES) {
    seen.push(e);
    const first = types.length;
    for (let p: unknown = Object.getPrototypeOf(e); typeof p === "object" && p !== null && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
      const ctor: unknown = hasOwn(p, "constructor") ? (p as { constructor: unknown }).constructor : undefined;
      if (typeof ctor === "function") push(types, ctor.name);
    }
    const name: unknown = (e as { name?: unknown }).name;
    if (typeof name === "string" && !types.includes(name, first)) push(types, name);
    push(codes, (e as { code?: unknown }).code);
    e = (e as { cause?: unknown }).cause;
  }
}

function statusOf(error: object): number | undefined {
  const e = error as { status?: unknown; status_code?: unknown; statusCode?: unknown; response?: unknown };
  const response = typeof e.response === "object" && e.response !== null ? (e.response as { status?: unknown; status_code?: unknown }) : undefined;
  for (const s of [e.status, e.status_code, e.statusCode, response?.status, response?.status_code]) {
    if (typeof s === "number" && Number.isInteger(s) && s >= 100 && s <= 599) return s;
  }
  return undefined;
}

const READ: ReadonlySet<string> = new Set(READ_HEADERS);

const LONE_SURROGATES = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** At most `MAX_ERROR_BODY_BYTES` + 1 characters (a longer body stays oversize for the core), well-formed. */
function bounded(text: string): string {
  return text.slice(0, MAX_ERROR_BODY_BYTES + 1).replace(LONE_SURROGATES, "\uFFFD");
}

/** The error response's body as text: a string `body`, else JSON of an object `body` or `error`. */
function bodyOf(error: object): string | undefined {
  const e = error as { body?: unknown; error?: unknown };
  for (const b of [e.body, e.error]) {
    if (typeof b === "string" && b !== "") return bounded(b);
    if (typeof b === "object" && b !== null && !(b instanceof Error)) {
      try {
        const text = JSON.stringify(b);
        if (typeof text === "string") return bounded(text);
      } catch {
        // A cycle or a getter that throws: no body.
      }
    }
  }
  return undefined;
}

function headerValue(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (Array.isArray(v) && typeof v[0] === "string") return v[0];
  return undefined;
}

/** The headers the core reads, as `[name, value]` pairs, from any common header holder. */
function headersOf(error: object): [string, string][] {
  const e = error as { headers?: unknown; response?: unknown };
  let h: unknown = e.headers;
  if ((typeof h !== "object" || h === null) && typeof e.response === "object" && e.response !== null) {
    h = (e.response as { headers?: unknown }).headers;
  }
  const out: [string, string][] = [];
  if (typeof h !== "object" || h === null) return out;
  const add = (name: unknown, value: unknown): void => {
    if (typeof name !== "string" || out.length >= MAX_HEADER_PAIRS || !READ.has(name.toLowerCase())) return;
    const v = headerValue(value);
    if (v !== undefined) out.push([name, v]);
  };
  if (Array.isArray(h)) {
    for (const pair of h as unknown[]) if (Array.isArray(pair)) add(pair[0], pair[1]);
  } else if (typeof (h as { get?: unknown }).get === "function") {
    if (typeof (h as { entries?: unknown }).entries === "function" && !(typeof Headers !== "undefined" && h instanceof Headers)) {
      // A Map (case-sensitive keys): read every entry.
      for (const pair of (h as { entries(): Iterable<unknown> }).entries()) if (Array.isArray(pair)) add(pair[0], pair[1]);
    } else {
      const get = (h as { get(n: string): unknown }).get.bind(h);
      for (const name of READ_HEADERS) add(name, get(name));
    }
  } else {
    for (const [k, v] of Object.entries(h)) add(k, v);
  }
  return out;
}

/** Whether a header is one of the rate-limit headers the admission buckets read. */
function isRateLimit(name: string): boolean {
  const n = name.toLowerCase();
  return n.startsWith("x-ratelimit-") || n.startsWith("anthropic-ratelimit-") || n === "ratelimit" || n === "ratelimit-policy";
}

/**
 * The rate-limit headers (`x-ratelimit-*`, `anthropic-ratelimit-*`,
 * `RateLimit`, `RateLimit-Policy`) of anything that holds headers: a fetch
 * `Response`, an SDK error, `{headers}` or `{response: {headers}}`; `[]`
 * when it holds none. The driver hands them to the fleet's admission
 * release, which applies them in the core.
 */
export function rateLimitHeadersOf(holder: unknown): [string, string][] {
  if (typeof holder !== "object" || holder === null) return [];
  try {
    return headersOf(holder).filter(([name]) => isRateLimit(name));
  } catch {
    return [];
  }
}

/**
 * The facts of a thrown error, as the driver reports them to the core
 * (docs/HOSTS.md, "Facts"). `judge(factsOf(error))` is what the driver's
 * core would decide for it.
 */
export function factsOf(error: unknown, options: FactsOptions = {}): Facts {
  const facts: Facts = { result: "raised" };
  let outcome: Outcome | undefined = error instanceof AttemptError ? error.outcome : undefined;
  const classify = options.classify;
  if (outcome === undefined && classify !== undefined && options.cancelled !== true) {
    try {
      const given = classify(error);
      if (given !== undefined) {
        checkOutcome(given);
        outcome = given;
      }
    } catch {
      // A hook that throws, or answers with something that is not an outcome, gives no answer.
    }
  }
  if (outcome !== undefined) facts.outcome = outcome;
  if (typeof error === "object" && error !== null) {
    try {
      const types: string[] = [];
      const codes: string[] = [];
      namesOf(error, types, codes);
      if (types.length > 0) facts.error_types = types;
      if (codes.length > 0) facts.error_codes = codes;
      const status = statusOf(error);
      if (status !== undefined) facts.status = status;
      const headers = headersOf(error);
      if (headers.length > 0) facts.headers = headers;
      if (status !== undefined && (status < 200 || status > 299)) {
        const body = bodyOf(error);
        if (body !== undefined) facts.error_body = body;
      }
    } catch {
      // An error whose properties throw when read: report what was read.
    }
  }
  if (options.outputDelivered === true) facts.response_bytes_received = true;
  if (options.cancelled === true) facts.cancelled = true;
  const now = options.nowUnixMs;
  if (typeof now === "number" && Number.isFinite(now) && now > 0) facts.now_unix_ms = Math.min(Math.floor(now), Number.MAX_SAFE_INTEGER);
  return facts;
}

/**
 * The facts of a raised `AttemptError` decoded by the core (once per error),
 * or `undefined` when the error is something else or carries a success (then
 * the facts go to the core as JSON). The core decides them by the explicit
 * rule alone, so the error's other properties need not be read.
 */
export function preparedFacts(error: unknown): RawFacts | undefined {
  return error instanceof AttemptError ? preparedOf(error) : undefined;
}

/** The facts' JSON text for the driver: an `AttemptError`'s prepared text, or `factsOf` serialized. */
export function factsText(error: unknown, options: FactsOptions): string {
  if (error instanceof AttemptError) {
    const text = factsTextOf(error);
    if (text !== undefined) return text;
  }
  return JSON.stringify(factsOf(error, options));
}

/** The facts that are certain when the others cannot be reported (a name the core refuses). */
export function minimalFacts(options: FactsOptions): string {
  const facts: Facts = { result: "raised" };
  if (options.outputDelivered === true) facts.response_bytes_received = true;
  if (options.cancelled === true) facts.cancelled = true;
  return JSON.stringify(facts);
}
