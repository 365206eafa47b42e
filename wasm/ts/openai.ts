/**
 * Integration for the `openai` npm package.
 *
 * The driver must be the only layer that retries: an SDK that retries on its
 * own multiplies attempts (three harness attempts of three SDK requests each
 * are nine requests for one logical call). So every client must be built
 * with `maxRetries: 0`, and each call also passes `maxRetries: 0`.
 *
 * The SDK's errors are judged by the core like any other (its tables know
 * `APIConnectionError`, `APIConnectionTimeoutError`, `APIUserAbortError`,
 * `APIResponseValidationError` and the connection codes of their causes; an
 * `APIError`'s `status` and `retry-after-ms` / `retry-after` headers go
 * through the core's HTTP rules): `RateLimitError` (429) is rate limited with
 * its hint, 5xx unavailable except 501/505, 408 and a connection timeout a
 * timeout before response, a connection never made (refused, DNS) unavailable
 * and one broken after sending unknown acceptance.
 * This module does not import `openai`; it reads the errors' fields.
 */

import { AttemptError } from "./facts.js";
import { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, type Input } from "./core.js";
import type { Policy } from "./types.js";

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
 * `runWithPolicy` over `openai` clients. Before any
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
    return await runWithPolicy(compiled, dispatch, options);
  } finally {
    if (compiled !== policy) compiled.free();
  }
}
