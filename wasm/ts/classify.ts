/**
 * Turning what a dispatch threw into an outcome.
 *
 * In order: an explicit outcome carried on the error (`AttemptError`, or any
 * object with a valid `outcome`); a caller-supplied classifier; the attempt's
 * own deadline firing (timeout before response); an HTTP status with headers
 * (openai's `APIError` and most HTTP client errors) through the core's
 * `classifyHttp`. Anything else is unrecognized: the driver records it as
 * indeterminate and never retries it.
 */

import { classifyHttp } from "./core.js";
import { DecodeError } from "./errors.js";
import type {
  HttpObservation,
  IndeterminateKind,
  NonRetryableKind,
  Outcome,
  RetryableKind,
  TransportError,
} from "./types.js";

const RETRYABLE: ReadonlySet<string> = new Set<RetryableKind>(["timeout_before_response", "rate_limited", "unavailable"]);
const NON_RETRYABLE: ReadonlySet<string> = new Set<NonRetryableKind>([
  "rejected",
  "policy_denied",
  "invalid_request",
  "protocol_violation",
  "invalid_output",
]);
const INDETERMINATE: ReadonlySet<string> = new Set<IndeterminateKind>([
  "unknown_provider_acceptance",
  "stream_interrupted_after_output",
]);

/** Whether `x` is an outcome document the core accepts. */
export function isOutcome(x: unknown): x is Outcome {
  if (typeof x !== "object" || x === null) return false;
  const o = x as Record<string, unknown>;
  const keys = Object.keys(o);
  switch (o["class"]) {
    case "success":
      return keys.length === 1;
    case "retryable": {
      const hint = o["retry_after_ms"];
      const hintOk = hint === undefined || (Number.isSafeInteger(hint) && (hint as number) >= 0);
      const extra = keys.filter((k) => k !== "class" && k !== "kind" && k !== "retry_after_ms");
      return typeof o["kind"] === "string" && RETRYABLE.has(o["kind"]) && hintOk && extra.length === 0;
    }
    case "non_retryable":
      return keys.length === 2 && typeof o["kind"] === "string" && NON_RETRYABLE.has(o["kind"]);
    case "indeterminate":
      return keys.length === 2 && typeof o["kind"] === "string" && INDETERMINATE.has(o["kind"]);
    default:
      return false;
  }
}

/** An error that says exactly what happened to the attempt. Throw it from `dispatch`. */
export class AttemptError extends Error {
  readonly outcome: Outcome;

  /** Throws `DecodeError` `invalid_value` when `outcome` is not an outcome document. */
  constructor(outcome: Outcome, message?: string, options?: { cause?: unknown }) {
    if (!isOutcome(outcome)) {
      throw new DecodeError("invalid_value", "invalid_value at /outcome: not an outcome document", { path: "/outcome" });
    }
    super(message ?? describe(outcome), options);
    this.name = "AttemptError";
    this.outcome = outcome;
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

/** What a classifier knows besides the error. */
export interface ClassifyContext {
  /** Wall clock, Unix ms (resolves HTTP-date Retry-After hints). */
  nowUnixMs: number;
  /** The policy's cap on Retry-After hints, ms. */
  retryAfterCapMs: number;
  /** Whether the attempt's own deadline signal fired. */
  deadlineExceeded: boolean;
}

/** A classifier for errors of a particular client: an outcome, or `undefined` to pass. */
export type Classifier = (error: unknown, context: ClassifyContext) => Outcome | undefined;

function headerOf(headers: unknown, name: string): string | undefined {
  if (typeof headers !== "object" || headers === null) return undefined;
  const h = headers as { get?: unknown };
  if (typeof h.get === "function") {
    const v: unknown = (h.get as (n: string) => unknown).call(headers, name);
    return typeof v === "string" ? v : undefined;
  }
  if (Array.isArray(headers)) {
    for (const pair of headers as unknown[]) {
      if (Array.isArray(pair) && typeof pair[0] === "string" && pair[0].toLowerCase() === name && typeof pair[1] === "string") {
        return pair[1];
      }
    }
    return undefined;
  }
  for (const [k, v] of Object.entries(headers as Record<string, unknown>)) {
    if (k.toLowerCase() === name) {
      if (typeof v === "string") return v;
      if (Array.isArray(v) && typeof v[0] === "string") return v[0];
    }
  }
  return undefined;
}

/** The Retry-After headers of a response-like object, as `[name, value]` pairs. */
export function retryAfterHeaders(headers: unknown): [string, string][] {
  const out: [string, string][] = [];
  for (const name of ["retry-after-ms", "retry-after"]) {
    const v = headerOf(headers, name);
    if (v !== undefined) out.push([name, v]);
  }
  return out;
}

/** An HTTP observation from an error carrying `status` (and `headers`), or `undefined`. */
export function httpObservationOf(error: unknown, context: ClassifyContext): HttpObservation | undefined {
  if (typeof error !== "object" || error === null) return undefined;
  const e = error as { status?: unknown; statusCode?: unknown; headers?: unknown; response?: { status?: unknown; headers?: unknown } };
  const status = typeof e.status === "number" ? e.status : typeof e.statusCode === "number" ? e.statusCode : e.response?.status;
  if (typeof status !== "number" || !Number.isSafeInteger(status) || status < 0) return undefined;
  return {
    headers: retryAfterHeaders(e.headers ?? e.response?.headers),
    now_unix_ms: context.nowUnixMs,
    retry_after_cap_ms: context.retryAfterCapMs,
    status,
  };
}

/** The outcome of a transport failure with no response, through the core. */
export function transportOutcome(kind: TransportError, context: ClassifyContext): Outcome {
  return classifyHttp({ now_unix_ms: context.nowUnixMs, retry_after_cap_ms: context.retryAfterCapMs, transport_error: kind });
}

/** The driver's classification of a thrown error; `undefined` when unrecognized. */
export function classifyError(error: unknown, context: ClassifyContext, custom?: Classifier): Outcome | undefined {
  if (typeof error === "object" && error !== null && "outcome" in error) {
    const o = (error as { outcome: unknown }).outcome;
    if (isOutcome(o)) return o;
  }
  if (custom !== undefined) {
    try {
      const o = custom(error, context);
      if (o !== undefined && isOutcome(o)) return o;
    } catch {
      // A classifier that throws passes, like one that returns undefined.
    }
  }
  if (context.deadlineExceeded) {
    return { class: "retryable", kind: "timeout_before_response" };
  }
  return httpOutcome(error, context);
}

/**
 * The outcome of an error carrying an HTTP status (and headers), or
 * `undefined` when it carries none or an unusable one. An error is never a
 * success, whatever status it carries.
 */
export function httpOutcome(error: unknown, context: ClassifyContext): Outcome | undefined {
  const obs = httpObservationOf(error, context);
  if (obs === undefined) return undefined;
  try {
    const o = classifyHttp(obs);
    return o.class === "success" ? undefined : o;
  } catch {
    return undefined;
  }
}
