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
 *
 * Usage: when the run has a price schedule (`priceSchedule` in the run
 * options) and the value `call` returns carries an SDK `usage` block, the
 * attempt is charged what it used (`step.usage`), in these units:
 *
 * | unit           | chat completions                                      | responses API                                       |
 * |----------------|-------------------------------------------------------|-----------------------------------------------------|
 * | `input`        | `prompt_tokens - prompt_tokens_details.cached_tokens` | `input_tokens - input_tokens_details.cached_tokens` |
 * | `cached_input` | `prompt_tokens_details.cached_tokens`                 | `input_tokens_details.cached_tokens`                |
 * | `output`       | `completion_tokens - completion_tokens_details.reasoning_tokens` | `output_tokens - output_tokens_details.reasoning_tokens` |
 * | `reasoning`    | `completion_tokens_details.reasoning_tokens`          | `output_tokens_details.reasoning_tokens`            |
 *
 * Only kinds with a nonzero count are reported, so a schedule need not price
 * `reasoning` for a model that never reports it; a nonzero count of a kind the
 * route release does not price is `usage_unpriced`, thrown from the attempt
 * (never a silent zero). `call` must then not report the same usage itself
 * (it would be charged twice). A result without `usage` (a stream, a value
 * `call` built) is not charged here: the attempt keeps its reservation unless
 * `call` charges it.
 */

import { AttemptError } from "./facts.js";
import { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, type Input } from "./core.js";
import type { Policy, Usage } from "./types.js";

function count(usage: Record<string, unknown>, field: string, detail?: string): number {
  let v: unknown = usage[field];
  let name = field;
  if (detail !== undefined) {
    v = v === null || typeof v !== "object" ? undefined : (v as Record<string, unknown>)[detail];
    name = `${field}.${detail}`;
  }
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number") throw new TypeError(`usage.${name} is not a number`);
  return v;
}

/**
 * The units of an openai SDK result's `usage` (chat completions or responses
 * API; see the module comment), only kinds with a nonzero count; `undefined`
 * when the result carries no usage.
 */
export function openaiUsageUnits(result: unknown): Usage | undefined {
  if (result === null || typeof result !== "object") return undefined;
  const usage: unknown = (result as { usage?: unknown }).usage;
  if (usage === null || typeof usage !== "object") return undefined;
  const u = usage as Record<string, unknown>;
  let inputAll: number, cached: number, outputAll: number, reasoning: number;
  if (u.prompt_tokens !== undefined || u.completion_tokens !== undefined) {
    inputAll = count(u, "prompt_tokens");
    cached = count(u, "prompt_tokens_details", "cached_tokens");
    outputAll = count(u, "completion_tokens");
    reasoning = count(u, "completion_tokens_details", "reasoning_tokens");
  } else if (u.input_tokens !== undefined || u.output_tokens !== undefined) {
    inputAll = count(u, "input_tokens");
    cached = count(u, "input_tokens_details", "cached_tokens");
    outputAll = count(u, "output_tokens");
    reasoning = count(u, "output_tokens_details", "reasoning_tokens");
  } else {
    return undefined;
  }
  const units: Usage = {};
  const put = (kind: string, n: number): void => {
    if (n !== 0) units[kind] = n;
  };
  put("input", inputAll - cached);
  put("cached_input", cached);
  put("output", outputAll - reasoning);
  put("reasoning", reasoning);
  return units;
}

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
    const result = await call(client, options, step);
    if (step.priced) {
      const units = openaiUsageUnits(result);
      if (units !== undefined) step.usage(units);
    }
    return result;
  };
}

/**
 * `runWithPolicy` over `openai` clients. Before any
 * request it refuses a client whose `maxRetries` is not 0 and a policy route
 * without a client (and, with `priceSchedule`, a schedule that does not fit
 * the policy). With `priceSchedule` each SDK result's usage is charged.
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
