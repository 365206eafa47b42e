/**
 * Errors: one `Error` subclass per family of the core's codes, all under
 * `RetryledgerError`. The `code` string is the contract, the same in Rust,
 * TypeScript and Python; the message is for people.
 */

import { ERROR_CODE_FAMILY, type ErrorCode, type ErrorFamily, type DecodeCode, type DriftCode, type HttpCode, type IdempotencyCode, type JournalCode, type PolicyCode, type ReceiptCode, type RunCode } from "./tables.js";
import type { Attempts, Bundle, Receipt, RepairChain, Sealed, Terminal } from "./types.js";

export type {
  DecodeCode,
  DriftCode,
  ErrorCode,
  ErrorFamily,
  HttpCode,
  IdempotencyCode,
  JournalCode,
  PolicyCode,
  ReceiptCode,
  RunCode,
} from "./tables.js";

/** One further error a decoder found in the same pass (`moreErrors`). */
export interface ErrorEntry {
  readonly code: string;
  readonly family: string;
  readonly message: string;
  /** JSON Pointer to the offending field, when known. */
  readonly path: string | undefined;
}

export interface ErrorDetails {
  path?: string | undefined;
  attemptIndex?: number | undefined;
  cause?: unknown;
  moreErrors?: readonly ErrorEntry[] | undefined;
}

/** The base of every error this package throws. */
export class RetryledgerError extends Error {
  /** Stable snake_case code (a core code, or a terminal for a stopped run). */
  readonly code: string;
  /** The family: a core family, or `stopped` for a run that ended without success. */
  readonly family: ErrorFamily | "stopped";
  /** JSON Pointer to the offending field, when known. */
  readonly path: string | undefined;
  /** Index (0-based) of the offending attempt, when known. */
  readonly attemptIndex: number | undefined;
  /**
   * Every further error found in the same pass (decoding a policy, a spec or
   * any document reports all it finds, up to 20 in all), each with its code,
   * message and path; this error's own `code` and message are the first
   * one's. Empty for most errors.
   */
  readonly moreErrors: readonly ErrorEntry[];

  constructor(code: string, family: ErrorFamily | "stopped", message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.code = code;
    this.family = family;
    this.path = details.path;
    this.attemptIndex = details.attemptIndex;
    this.moreErrors = details.moreErrors ?? [];
  }
}

/** The input is not a well-formed document in normal form. */
export class DecodeError extends RetryledgerError {
  declare readonly code: DecodeCode;
  constructor(code: DecodeCode, message: string, details: ErrorDetails = {}) {
    super(code, "decode", message, details);
  }
}

/** The policy breaks a rule checked before any dispatch. */
export class PolicyError extends RetryledgerError {
  declare readonly code: PolicyCode;
  constructor(code: PolicyCode, message: string, details: ErrorDetails = {}) {
    super(code, "policy", message, details);
  }
}

/** An observed attempt is not the planned one. */
export class DriftError extends RetryledgerError {
  declare readonly code: DriftCode;
  constructor(code: DriftCode, message: string, details: ErrorDetails = {}) {
    super(code, "drift", message, details);
  }
}

/** A sealed receipt does not match its replay. */
export class ReceiptError extends RetryledgerError {
  declare readonly code: ReceiptCode;
  constructor(code: ReceiptCode, message: string, details: ErrorDetails = {}) {
    super(code, "receipt", message, details);
  }
}

/** A Retry-After value or HTTP observation is malformed. */
export class HttpError extends RetryledgerError {
  declare readonly code: HttpCode;
  constructor(code: HttpCode, message: string, details: ErrorDetails = {}) {
    super(code, "http", message, details);
  }
}

/** The run cannot be evaluated in its current state. */
export class RunError extends RetryledgerError {
  declare readonly code: RunCode;
  constructor(code: RunCode, message: string, details: ErrorDetails = {}) {
    super(code, "run", message, details);
  }
}

/** A run's journal (or a reconciliation of it) is not one the core can act on. */
export class JournalError extends RetryledgerError {
  declare readonly code: JournalCode;
  constructor(code: JournalCode, message: string, details: ErrorDetails = {}) {
    super(code, "journal", message, details);
  }
}

/** An idempotency record or its retention is inconsistent. */
export class IdempotencyError extends RetryledgerError {
  declare readonly code: IdempotencyCode;
  constructor(code: IdempotencyCode, message: string, details: ErrorDetails = {}) {
    super(code, "idempotency", message, details);
  }
}

/** The JSON object the WebAssembly module throws (the core's `error_json`). */
interface WireError {
  code: string;
  family: string;
  message: string;
  path?: string;
  attempt_index?: number;
  more_errors?: { code: string; family: string; message: string; path?: string }[];
}

function isWireError(x: unknown): x is WireError {
  if (typeof x !== "object" || x === null) return false;
  const o = x as Record<string, unknown>;
  return typeof o["code"] === "string" && typeof o["family"] === "string" && typeof o["message"] === "string";
}

/** The typed error for the JSON text the module threw. */
export function fromWire(text: string): RetryledgerError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (!isWireError(parsed)) {
    return new RetryledgerError("internal", "run", `unexpected error from the WebAssembly core: ${text.slice(0, 200)}`);
  }
  const details: ErrorDetails = { path: parsed.path, attemptIndex: parsed.attempt_index };
  if (Array.isArray(parsed.more_errors)) {
    details.moreErrors = parsed.more_errors.map((e) => Object.freeze({ code: e.code, family: e.family, message: e.message, path: e.path }));
  }
  const message = parsed.path === undefined ? `${parsed.code}: ${parsed.message}` : `${parsed.code} at ${parsed.path}: ${parsed.message}`;
  // The family of a known code is the core's table's; the wire's otherwise.
  const family: string = Object.hasOwn(ERROR_CODE_FAMILY, parsed.code) ? ERROR_CODE_FAMILY[parsed.code as ErrorCode] : parsed.family;
  switch (family) {
    case "decode":
      return new DecodeError(parsed.code as DecodeCode, message, details);
    case "policy":
      return new PolicyError(parsed.code as PolicyCode, message, details);
    case "drift":
      return new DriftError(parsed.code as DriftCode, message, details);
    case "receipt":
      return new ReceiptError(parsed.code as ReceiptCode, message, details);
    case "http":
      return new HttpError(parsed.code as HttpCode, message, details);
    case "journal":
      return new JournalError(parsed.code as JournalCode, message, details);
    case "idempotency":
      return new IdempotencyError(parsed.code as IdempotencyCode, message, details);
    default:
      return new RunError(parsed.code as RunCode, message, details);
  }
}

/** What a stopped run carries. */
export interface StoppedDetails<T = unknown> {
  /** The sealed run. */
  sealed: Sealed;
  /** The last error dispatch threw (or the signal's reason for a cancelled run), if any. */
  cause?: unknown;
  /** The value the last attempt returned, when it succeeded too late (`stop_deadline`). */
  result?: T;
}

/**
 * The driver's rejection: the run reached a terminal other than `completed`.
 * `code` and `terminal` are the terminal; `bundle` replays the run; `sealed`
 * has its digest and canonical JSON.
 */
export class RunStoppedError<T = unknown> extends RetryledgerError {
  declare readonly code: Terminal;
  readonly terminal: Terminal;
  readonly sealed: Sealed;
  readonly receipt: Receipt;
  readonly result: T | undefined;
  /** Under repair: the `retryledger.repair_chain.v1` of the request and its repairs so far, this run last (docs/REPAIR.md). */
  chain?: RepairChain;
  /** Under repair: why no further repair followed, when the core refused one (`repair_over_budget`, …). */
  repairRefused?: RetryledgerError;

  constructor(message: string, details: StoppedDetails<T>) {
    const terminal = details.sealed.terminal;
    super(terminal, "stopped", message, { cause: details.cause });
    this.terminal = terminal;
    this.sealed = details.sealed;
    this.receipt = details.sealed.receipt;
    this.result = details.result;
  }

  /** The bundle of policy, attempts and receipt (built when first read). */
  get bundle(): Bundle {
    return this.sealed.bundle;
  }

  /** The attempts document. */
  get attempts(): Attempts {
    return this.sealed.bundle.attempts;
  }
}

/**
 * Dispatch threw an error the core did not recognize (rule `unrecognized`).
 * It was recorded as `indeterminate` / `unknown_provider_acceptance` (never
 * retried); `cause` is the original error.
 */
export class UnrecognizedDispatchError<T = unknown> extends RunStoppedError<T> {}

/**
 * The caller's AbortSignal stopped the run: between attempts (`stop_cancelled`)
 * or during a dispatch (that attempt is indeterminate: `stop_indeterminate`).
 * `cause` is the signal's reason.
 */
export class RunCancelledError<T = unknown> extends RunStoppedError<T> {}
