/**
 * Integration for the `@anthropic-ai/sdk` npm package.
 *
 * The driver must be the only layer that retries: an SDK that retries on its
 * own multiplies attempts (three harness attempts of three SDK requests each
 * are nine requests for one logical call). So every client must be built
 * with `maxRetries: 0`, and each call also passes `maxRetries: 0`.
 *
 * The SDK's errors are judged by the core like any other, from the facts the
 * driver reads off them (this module maps no error): `APIConnectionError`,
 * `APIConnectionTimeoutError` and `APIUserAbortError` are in the core's class
 * table, and the connection codes of an `APIConnectionError`'s cause
 * (`ECONNREFUSED`, DNS, `ECONNRESET`) in its code table; an `APIError`'s
 * `status` and `retry-after-ms` / `retry-after` headers go through the core's
 * HTTP rules: `RateLimitError` (429) is rate limited with its hint, 5xx
 * (`InternalServerError`, `OverloadedError` 529) unavailable except 501/505,
 * 408 and a connection timeout a timeout before response, a connection never
 * made unavailable and one broken after sending unknown acceptance. The
 * driver passes the `APIError`'s `error` (the response body) and the
 * `anthropic-ratelimit-*` headers: for a route that names its provider family
 * (`anthropic`), the core's provider table and reset headers apply
 * (docs/PROVIDERS.md).
 * This module does not import `@anthropic-ai/sdk`; it reads the client's
 * `maxRetries` and the `usage` of what `call` returns.
 *
 * Usage: when the run has a price schedule (`priceSchedule` in the run
 * options) and the value `call` returns carries a Messages API `usage` block,
 * the attempt is charged what it used (`step.usage`) in these units:
 * `input` = `usage.input_tokens`, `cached_input` =
 * `usage.cache_read_input_tokens`, `cache_creation_input` =
 * `usage.cache_creation_input_tokens`, `output` = `usage.output_tokens` (the
 * API's `input_tokens` leaves cache reads and writes out). Only kinds with a
 * nonzero count are reported; a nonzero count of a kind the route release does
 * not price is `usage_unpriced`, thrown from the attempt (never a silent
 * zero), so a schedule that does not price `cache_creation_input` refuses a
 * message that wrote the cache. `call` must then not report the same usage itself (it would
 * be charged twice). A result without `usage` (a stream, a value `call`
 * built) is not charged here: the attempt keeps its reservation unless `call`
 * charges it.
 */

import { answerChecks, anthropicAnswerParts, type AnswerCheckOptions, type OutputCheck } from "./checks.js";
import { AttemptError } from "./facts.js";
import { reportTokens, sendingClient } from "./sending.js";
import { checkRouteClients, runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, compiledOf, type Input } from "./core.js";
import { runStream, type StreamDispatchFn, type StreamReader, type StreamRun, type StreamRunOptions, type StreamStep } from "./stream.js";
import type { Policy, Usage } from "./types.js";

/** The part of an `Anthropic` client this module looks at. */
export interface AnthropicClientLike {
  maxRetries: number;
}

/** Request options passed to every SDK call: no SDK retries, the run's signal and timeout, the Idempotency-Key header. */
export interface AnthropicRequestOptions {
  maxRetries: 0;
  signal: AbortSignal;
  timeout: number;
  headers: Record<string, string>;
}

/** Throws `PolicyError` `retry_owner_not_harness` unless the client's `maxRetries` is 0. */
export function assertNoSdkRetries(client: AnthropicClientLike, name = "client"): void {
  const n = (client as { maxRetries?: unknown } | null | undefined)?.maxRetries;
  if (n !== 0) {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: ${name} has maxRetries ${String(n)}; build it with maxRetries: 0 so that the harness is the only retry owner`,
      { path: "/maxRetries" },
    );
  }
}

function count(usage: Record<string, unknown>, field: string): number {
  const v = usage[field];
  if (v === undefined || v === null) return 0;
  if (typeof v !== "number") throw new TypeError(`usage.${field} is not a number`);
  return v;
}

/**
 * The units of a Messages API result's `usage` (see the module comment), only
 * kinds with a nonzero count; `undefined` when the result carries no usage.
 */
export function anthropicUsageUnits(result: unknown): Usage | undefined {
  if (result === null || typeof result !== "object") return undefined;
  const usage: unknown = (result as { usage?: unknown }).usage;
  if (usage === null || typeof usage !== "object") return undefined;
  const u = usage as Record<string, unknown>;
  if (u.input_tokens === undefined && u.output_tokens === undefined) return undefined;
  const units: Usage = {};
  const put = (kind: string, n: number): void => {
    if (n !== 0) units[kind] = n;
  };
  put("input", count(u, "input_tokens"));
  put("cached_input", count(u, "cache_read_input_tokens"));
  // Cache writes are not in input_tokens: their own kind, so they are never left uncharged.
  put("cache_creation_input", count(u, "cache_creation_input_tokens"));
  put("output", count(u, "output_tokens"));
  return units;
}

function isSingle(clients: unknown): boolean {
  return typeof (clients as { maxRetries?: unknown }).maxRetries === "number";
}

/**
 * A dispatch function over `@anthropic-ai/sdk` clients, one per route id (or
 * one for every route). Refuses, before any dispatch, a client whose
 * `maxRetries` is not 0. `call` makes one SDK request (`messages.create`)
 * with the options it is given.
 */
export function anthropicDispatch<C extends AnthropicClientLike, T>(
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: AnthropicRequestOptions, step: Step) => Promise<T>,
): DispatchFn<T> {
  const byRoute = isSingle(clients) ? undefined : (clients as Readonly<Record<string, C>>);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
  }
  return async (step, signal) => {
    const client = byRoute === undefined ? (clients as C) : Object.hasOwn(byRoute, step.routeId) ? byRoute[step.routeId] : undefined;
    if (client === undefined) {
      throw AttemptError.nonRetryable("invalid_request", { cause: new Error(`no anthropic client for route ${step.routeId}`) });
    }
    const options: AnthropicRequestOptions = {
      maxRetries: 0,
      signal,
      timeout: Math.max(1, step.remainingMs),
      headers: { "Idempotency-Key": step.idempotencyKey },
    };
    const result = await call(sendingClient(client, step), options, step);
    if (step.priced) {
      const units = anthropicUsageUnits(result);
      if (units !== undefined) step.usage(units);
    }
    reportTokens(step, result, anthropicUsageUnits);
    return result;
  };
}

/**
 * `runWithPolicy` over `@anthropic-ai/sdk` clients. Before any request it
 * refuses a client whose `maxRetries` is not 0 and a policy route without a
 * client (and, with `priceSchedule`, a schedule that does not fit the
 * policy). With `priceSchedule` each SDK result's usage is charged.
 */
export async function runWithAnthropic<C extends AnthropicClientLike, T>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: AnthropicRequestOptions, step: Step) => Promise<T>,
  options: RunOptions,
): Promise<RunResult<T>> {
  const dispatch = anthropicDispatch(clients, call);
  const compiled = compiledOf(policy);
  if (!isSingle(clients)) {
    checkRouteClients(compiled, clients, "anthropic client");
  }
  return runWithPolicy(compiled, dispatch, options);
}

// ---------------------------------------------------------------- streaming

type AnthropicEvent = {
  type?: unknown;
  message?: { id?: unknown; usage?: unknown } | null;
  delta?: { type?: unknown; text?: unknown } | null;
  usage?: unknown;
};

/** Usage the reader reports: `anthropicUsageUnits`, or impossible counts when the block is not numbers. */
function streamUsage(holder: unknown): Usage | undefined {
  try {
    return anthropicUsageUnits(holder);
  } catch {
    return { output: Number.NaN };
  }
}

/**
 * Reads the events of `messages.create({stream: true})`: text from
 * `content_block_delta` (`text_delta`), the message id from
 * `message_start`, `message_stop` as the terminal event, usage from
 * `message_start` (input, cache reads and writes) and `message_delta`
 * (cumulative output), in `anthropicUsageUnits`' units. An `error` event
 * inside the stream is raised by the SDK as an `APIError` whose `type` (e.g.
 * `overloaded_error`) the facts carry.
 */
export const anthropicStreamReader: StreamReader<unknown> = {
  text(event) {
    const e = event as AnthropicEvent;
    if (e.type !== "content_block_delta") return "";
    const d = e.delta;
    return d?.type === "text_delta" && typeof d.text === "string" ? d.text : "";
  },
  responseId(event) {
    const e = event as AnthropicEvent;
    const id = e.type === "message_start" ? e.message?.id : undefined;
    return typeof id === "string" ? id : undefined;
  },
  terminal(event) {
    return (event as AnthropicEvent).type === "message_stop";
  },
  usage(event) {
    const e = event as AnthropicEvent;
    if (e.type === "message_start") return streamUsage(e.message);
    if (e.type === "message_delta" && e.usage !== undefined && e.usage !== null) return streamUsage(e);
    return undefined;
  },
};

/** A streamed SDK call: (a promise of) the SDK's stream of events. */
export type AnthropicStreamCall<C, E> = (
  client: C,
  options: AnthropicRequestOptions,
  step: StreamStep,
) => Promise<AsyncIterable<E>> | AsyncIterable<E>;

/** `messages.create({...params, stream: true}, options)`. */
export function anthropicMessagesStream<E = unknown>(
  params: Record<string, unknown>,
): AnthropicStreamCall<{ messages: { create(params: object, options?: object): unknown } }, E> {
  return (client, options) => client.messages.create({ ...params, stream: true }, options) as Promise<AsyncIterable<E>>;
}

/**
 * A stream dispatch over `@anthropic-ai/sdk` clients, one per route id (or
 * one for every route): no SDK retries, the attempt's signal, the run's
 * remaining time as `timeout`, the Idempotency-Key header. Refuses, before
 * any dispatch, a client whose `maxRetries` is not 0.
 */
export function anthropicStreamDispatch<C extends AnthropicClientLike, E>(
  clients: C | Readonly<Record<string, C>>,
  call: AnthropicStreamCall<C, E>,
): StreamDispatchFn<E> {
  const byRoute = isSingle(clients) ? undefined : (clients as Readonly<Record<string, C>>);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
  }
  return (step, signal) => {
    const client = byRoute === undefined ? (clients as C) : Object.hasOwn(byRoute, step.routeId) ? byRoute[step.routeId] : undefined;
    if (client === undefined) {
      throw AttemptError.nonRetryable("invalid_request", { cause: new Error(`no anthropic client for route ${step.routeId}`) });
    }
    const options: AnthropicRequestOptions = {
      maxRetries: 0,
      signal,
      timeout: Math.max(1, step.remainingMs),
      headers: { "Idempotency-Key": step.idempotencyKey },
    };
    return call(sendingClient(client, step), options, step);
  };
}

/**
 * `runStream` over `@anthropic-ai/sdk` clients, reading events with
 * `anthropicStreamReader` unless `options.reader` says otherwise. Before any
 * request it refuses a client whose `maxRetries` is not 0 and a policy route
 * without a client. With `priceSchedule` the stream's usage is charged.
 */
export function runStreamWithAnthropic<C extends AnthropicClientLike, E = unknown>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: AnthropicStreamCall<C, E>,
  options: StreamRunOptions<E>,
): StreamRun<E> {
  const dispatch = anthropicStreamDispatch(clients, call);
  const compiled = compiledOf(policy);
  if (!isSingle(clients)) {
    checkRouteClients(compiled, clients, "anthropic client");
  }
  return runStream(compiled, dispatch, { ...options, reader: options.reader ?? (anthropicStreamReader as StreamReader<E>) });
}

// ---------------------------------------------------------------- output checks

/**
 * The built-in output checks of anthropic answers, for `checks` (docs/REPAIR.md):
 * `refusal` (policy_denied: never a fallback), `truncated`, `empty`, with
 * `json: true` `unparsable_json` (a JSON output was asked for), then
 * `validators` (`outputCheck`, `schemaCheck`) run on the answer's text.
 */
export function anthropicAnswerChecks(options: AnswerCheckOptions = {}): OutputCheck[] {
  return answerChecks("anthropic", anthropicAnswerParts, options);
}
