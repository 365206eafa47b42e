/**
 * Integration for the `openai` npm package.
 *
 * The driver must be the only layer that retries: an SDK that retries on its
 * own multiplies attempts (three harness attempts of three SDK requests each
 * are nine requests for one logical call). So every client must be built
 * with `maxRetries: 0`, and each call also passes `maxRetries: 0`.
 *
 * Errors map to outcomes through the core's `classifyHttp`: `RateLimitError`
 * (429) is rate limited with its `retry-after-ms` / `retry-after` hint;
 * `InternalServerError` (5xx) unavailable, except 501/505; 408 a timeout;
 * `APIConnectionTimeoutError` a timeout before response; `APIConnectionError`
 * unavailable when the connection was never made (refused, DNS) and unknown
 * acceptance otherwise; `BadRequestError`, `NotFoundError`,
 * `UnprocessableEntityError` invalid requests; `PermissionDeniedError` policy
 * denied; `AuthenticationError`, `ConflictError` and other 4xx rejected.
 * This module does not import `openai`; it reads the errors' fields.
 */

import { AttemptError, httpOutcome, transportOutcome, type ClassifyContext } from "./classify.js";
import { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, type Input } from "./core.js";
import type { Outcome, Policy } from "./types.js";

/** The part of an `OpenAI` client this module looks at. */
export interface OpenAIClientLike {
  maxRetries: number;
}

/** Request options passed to every SDK call: no SDK retries, the run's signal, timeout and idempotency key. */
export interface OpenAIRequestOptions {
  maxRetries: 0;
  signal: AbortSignal;
  timeout: number;
  idempotencyKey: string;
  headers: Record<string, string>;
}

/** Throws `PolicyError` `retry_owner_not_harness` unless the client's `maxRetries` is 0. */
export function assertNoSdkRetries(client: OpenAIClientLike, name = "client"): void {
  const n = (client as { maxRetries?: unknown } | null | undefined)?.maxRetries;
  if (n !== 0) {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: ${name} has maxRetries ${String(n)}; build it with maxRetries: 0 so that the harness is the only retry owner`,
      { path: "/maxRetries" },
    );
  }
}

const CONNECT_FAILED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"]);

function causeCode(error: unknown): string | undefined {
  let e: unknown = error;
  for (let depth = 0; depth < 6 && typeof e === "object" && e !== null; depth += 1) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && /^[A-Z_]+$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

function errorName(error: unknown): string | undefined {
  if (typeof error !== "object" || error === null) return undefined;
  const ctor = (error as { constructor?: { name?: unknown } }).constructor;
  return typeof ctor?.name === "string" ? ctor.name : undefined;
}

/**
 * The outcome of an error thrown by the `openai` SDK, or `undefined` when it
 * is not one (the driver then treats it as unrecognized). `APIUserAbortError`
 * is left to the driver, which knows whose signal fired.
 */
export function classifyOpenAIError(error: unknown, context: ClassifyContext): Outcome | undefined {
  const name = errorName(error);
  if (name === "APIUserAbortError") return undefined;
  if (name === "APIConnectionTimeoutError") return transportOutcome("timeout", context);
  if (name === "APIConnectionError") {
    const code = causeCode((error as { cause?: unknown }).cause);
    const kind = code !== undefined && CONNECT_FAILED.has(code) ? "connect_failed" : "connection_reset";
    return transportOutcome(kind, context);
  }
  return httpOutcome(error, context);
}

/** `classifyOpenAIError` as a `classify` option for `runWithPolicy`. */
export const openaiClassifier = classifyOpenAIError;

/**
 * A dispatch function over `openai` clients, one per route id (or one for
 * every route). Refuses, before any dispatch, a client whose `maxRetries` is
 * not 0. `call` makes one SDK request with the options it is given.
 */
export function openaiDispatch<C extends OpenAIClientLike, T>(
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: OpenAIRequestOptions, step: Step) => Promise<T>,
): DispatchFn<T> {
  const single = typeof (clients as { maxRetries?: unknown }).maxRetries === "number";
  const byRoute = single ? undefined : (clients as Readonly<Record<string, C>>);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
  }
  return async (step, signal) => {
    const client = byRoute === undefined ? (clients as C) : byRoute[step.routeId];
    if (client === undefined) {
      throw AttemptError.nonRetryable("invalid_request", { cause: new Error(`no openai client for route ${step.routeId}`) });
    }
    const options: OpenAIRequestOptions = {
      maxRetries: 0,
      signal,
      timeout: Math.max(1, step.remainingMs),
      idempotencyKey: step.idempotencyKey,
      headers: { "Idempotency-Key": step.idempotencyKey },
    };
    return call(client, options, step);
  };
}

/**
 * `runWithPolicy` over `openai` clients with `openaiClassifier`. Before any
 * request it refuses a client whose `maxRetries` is not 0 and a policy route
 * without a client.
 */
export async function runWithOpenAI<C extends OpenAIClientLike, T>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: OpenAIRequestOptions, step: Step) => Promise<T>,
  options: RunOptions,
): Promise<RunResult<T>> {
  const dispatch = openaiDispatch(clients, call);
  const compiled = policy instanceof CompiledPolicy ? policy : new CompiledPolicy(policy);
  try {
    if (typeof (clients as { maxRetries?: unknown }).maxRetries !== "number") {
      const missing = compiled.policy.routes.map((r) => r.route_id).filter((id) => !Object.hasOwn(clients, id));
      if (missing.length > 0) throw new Error(`no openai client for route(s) ${missing.join(", ")}`);
    }
    return await runWithPolicy(compiled, dispatch, { classify: openaiClassifier, ...options });
  } finally {
    if (compiled !== policy) compiled.free();
  }
}
