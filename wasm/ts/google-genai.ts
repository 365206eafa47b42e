/**
 * Integration for the `@google/genai` npm package.
 *
 * A `GoogleGenAI` client retries when it is built with
 * `httpOptions.retryOptions` (up to `attempts` requests per call, 5 when
 * `attempts` is unset), so under a harness that also retries one logical
 * call multiplies. Every client is checked before any request: one whose
 * retry options allow more than one attempt, or whose options cannot be read,
 * is refused with `PolicyError` `retry_owner_not_harness`.
 *
 * Each attempt's `call` gets `options`, the `httpOptions` of one request:
 * the run's `Idempotency-Key` header, the remaining deadline as `timeout`
 * (ms), and a `fetch` that keeps the headers of an error response. Pass it as
 * the call's `config.httpOptions` (without `retryOptions`), and `signal` as
 * `config.abortSignal`.
 *
 * The SDK's `ApiError` carries the status and the response body as its
 * message (JSON text); the dispatch adds the body and the response headers
 * to the error as plain facts (`body`, `headers`) and the core judges them:
 * for a route that names its provider family `google`, the provider table
 * reads Gemini's error envelope (docs/PROVIDERS.md), so a per-day
 * `RESOURCE_EXHAUSTED` QuotaFailure stops the run (`quota_exhausted`) and a
 * per-minute one waits the body's `RetryInfo` `retryDelay`. Connection
 * errors are fetch's own and judged by the core's code table. This module
 * does not import `@google/genai`; it reads the client's options.
 */

import { AttemptError } from "./facts.js";
import { reportTokens } from "./sending.js";
import { checkRouteClients, runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, compiledOf, type Input } from "./core.js";
import type { StreamReader } from "./stream.js";
import type { Policy, Usage } from "./types.js";

/** The part of a `GoogleGenAI` client this module looks at. */
export interface GoogleGenAIClientLike {
  models: unknown;
}

/** The `httpOptions` of one attempt's request. */
export interface GoogleGenAIRequestOptions {
  /** The run's idempotency key as the `Idempotency-Key` header. */
  headers: Record<string, string>;
  /** Milliseconds left before the run's deadline. */
  timeout: number;
  /** `fetch`, keeping the headers of a response that is not 2xx for the error's facts. */
  fetch: (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;
}

/** How many attempts a client's own retry options allow; `undefined` when its options cannot be read. */
function sdkAttempts(client: unknown): number | undefined {
  const c = client as { models?: unknown; apiClient?: { clientOptions?: { httpOptions?: unknown } }; httpOptions?: unknown } | null | undefined;
  if (typeof c !== "object" || c === null || typeof c.models !== "object" || c.models === null) return undefined;
  const options = c.apiClient?.clientOptions?.httpOptions ?? c.httpOptions;
  if (options === undefined) return 1;
  if (typeof options !== "object" || options === null) return undefined;
  const retry = (options as { retryOptions?: unknown }).retryOptions;
  if (retry === undefined || retry === null) return 1;
  const attempts = (retry as { attempts?: unknown }).attempts;
  if (attempts === undefined) return 5;
  return typeof attempts === "number" ? attempts : undefined;
}

/** Throws `PolicyError` `retry_owner_not_harness` unless the client's retry options allow one attempt only. */
export function assertNoSdkRetries(client: GoogleGenAIClientLike, name = "client"): void {
  const attempts = sdkAttempts(client);
  if (attempts === undefined || attempts > 1) {
    const why = attempts === undefined ? "options that cannot be read" : `httpOptions.retryOptions allowing ${attempts} attempts`;
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: ${name} has ${why}; build it without retryOptions so that the harness is the only retry owner`,
      { path: "/httpOptions/retryOptions" },
    );
  }
}

const isSingle = (clients: unknown): boolean => typeof (clients as { models?: unknown }).models === "object";

/**
 * A dispatch function over `@google/genai` clients, one per route id (or one
 * for every route). Refuses, before any dispatch, a client that retries.
 * `call` makes one SDK request with the options it is given.
 */
/**
 * The tokens a `GenerateContentResponse`'s `usageMetadata` reports
 * (`totalTokenCount`) as `{total}`; `undefined` without usage.
 */
export function googleGenAIUsageTokens(result: unknown): Record<string, number> | undefined {
  const usage = (result as { usageMetadata?: { totalTokenCount?: unknown } } | null)?.usageMetadata;
  const total = usage?.totalTokenCount;
  return typeof total === "number" && Number.isSafeInteger(total) ? { total } : undefined;
}

export function googleGenAIDispatch<C extends GoogleGenAIClientLike, T>(
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: GoogleGenAIRequestOptions, step: Step, signal: AbortSignal) => Promise<T>,
): DispatchFn<T> {
  const byRoute = isSingle(clients) ? undefined : (clients as Readonly<Record<string, C>>);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
  }
  return async (step, signal) => {
    const client = byRoute === undefined ? (clients as C) : byRoute[step.routeId];
    if (client === undefined) {
      throw AttemptError.nonRetryable("invalid_request", { cause: new Error(`no google-genai client for route ${step.routeId}`) });
    }
    let failed: Headers | undefined;
    const options: GoogleGenAIRequestOptions = {
      headers: { "Idempotency-Key": step.idempotencyKey },
      timeout: Math.max(1, step.remainingMs),
      fetch: async (input, init) => {
        const response = await globalThis.fetch(input, init);
        if (!response.ok) failed = response.headers;
        step.rateLimitHeaders?.(response);
        return response;
      },
    };
    try {
      const result = await call(client, options, step, signal);
      reportTokens(step, result, googleGenAIUsageTokens);
      return result;
    } catch (e) {
      const error = e as { name?: unknown; status?: unknown; message?: unknown; body?: unknown; headers?: unknown } | null;
      if (error !== null && typeof error === "object" && error.name === "ApiError" && typeof error.status === "number") {
        // Plain facts only: the body the SDK put in the message, the response's headers.
        const message = error.message;
        if (error.body === undefined && typeof message === "string" && message.startsWith("{")) error.body = message;
        if (error.headers === undefined && failed !== undefined) error.headers = failed;
      }
      throw e;
    }
  };
}

/**
 * `runWithPolicy` over `@google/genai` clients. Before any request it refuses
 * a client that retries and a policy route without a client.
 */
export async function runWithGoogleGenAI<C extends GoogleGenAIClientLike, T>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: GoogleGenAIRequestOptions, step: Step, signal: AbortSignal) => Promise<T>,
  options: RunOptions,
): Promise<RunResult<T>> {
  const dispatch = googleGenAIDispatch(clients, call);
  const compiled = compiledOf(policy);
  if (!isSingle(clients)) {
    checkRouteClients(compiled, clients, "google-genai client");
  }
  return runWithPolicy(compiled, dispatch, options);
}

// ---------------------------------------------------------------- usage and streams

type Counts = Record<string, unknown>;

function countOf(usage: Counts, field: string): number | undefined {
  const v = usage[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number") throw new TypeError(`usageMetadata.${field} is not a number`);
  return v;
}

/**
 * The price units of a `GenerateContentResponse`'s `usageMetadata`, only the
 * nonzero ones (the same units as the Python package): `input`
 * (`promptTokenCount - cachedContentTokenCount`), `cached_input`, `output`
 * (`candidatesTokenCount`) and `reasoning` (`thoughtsTokenCount`);
 * `undefined` without usage (no metadata, or neither a prompt nor a
 * candidates count).
 */
export function googleGenAIUsageUnits(result: unknown): Usage | undefined {
  const usage = (result as { usageMetadata?: unknown } | null)?.usageMetadata;
  if (usage === null || typeof usage !== "object") return undefined;
  const u = usage as Counts;
  const prompt = countOf(u, "promptTokenCount");
  const made = countOf(u, "candidatesTokenCount");
  if (prompt === undefined && made === undefined) return undefined;
  const cached = countOf(u, "cachedContentTokenCount") ?? 0;
  const units: Usage = {};
  const put = (kind: string, n: number): void => {
    if (n !== 0) units[kind] = n;
  };
  put("input", (prompt ?? 0) - cached);
  put("cached_input", cached);
  put("output", made ?? 0);
  put("reasoning", countOf(u, "thoughtsTokenCount") ?? 0);
  return units;
}

type Chunk = {
  candidates?: { content?: { parts?: { text?: unknown; thought?: unknown }[] | null } | null; finishReason?: unknown }[] | null;
  responseId?: unknown;
};

/**
 * Reads `generateContentStream` chunks (`GenerateContentResponse`): the text
 * of the first candidate's text parts (thoughts excluded), the `responseId`,
 * a chunk whose first candidate has a `finishReason` as the terminal event,
 * and `usageMetadata` as usage (the last chunk carries the final counts), in
 * `googleGenAIUsageUnits`' units. No sequence numbers: never resumed.
 */
export const googleGenAIStreamReader: StreamReader<unknown> = {
  text(event) {
    const parts = (event as Chunk).candidates?.[0]?.content?.parts ?? [];
    return parts.map((p) => (typeof p?.text === "string" && p.thought !== true ? p.text : "")).join("");
  },
  responseId(event) {
    const id = (event as Chunk).responseId;
    return typeof id === "string" && id !== "" ? id : undefined;
  },
  terminal(event) {
    const first = (event as Chunk).candidates?.[0];
    return first !== undefined && first !== null && first.finishReason !== undefined && first.finishReason !== null;
  },
  usage(event) {
    try {
      return googleGenAIUsageUnits(event);
    } catch {
      return { output: Number.NaN };
    }
  },
};
