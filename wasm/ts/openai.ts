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
 * and one broken after sending unknown acceptance. The driver passes the
 * `APIError`'s `error` object as the error body: for a route that names its
 * provider family (`openai`), the core's provider table reads it, so
 * `insufficient_quota` stops the run (`quota_exhausted`, docs/PROVIDERS.md).
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

import { answerChecks, openaiAnswerParts, type AnswerCheckOptions, type OutputCheck } from "./checks.js";
import { AttemptError } from "./facts.js";
import { reportTokens, sendingClient } from "./sending.js";
import { checkRouteClients, runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { PolicyError } from "./errors.js";
import { CompiledPolicy, compiledOf, type Input } from "./core.js";
import { runHedged, type HedgeAttempt, type HedgeRun, type HedgeRunOptions } from "./hedge.js";
import { runStream, type StreamDispatchFn, type StreamReader, type StreamRun, type StreamRunOptions, type StreamStep } from "./stream.js";
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
    const result = await call(sendingClient(client, step), options, step);
    if (step.priced) {
      const units = openaiUsageUnits(result);
      if (units !== undefined) step.usage(units);
    }
    reportTokens(step, result, openaiUsageUnits);
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
  const compiled = compiledOf(policy);
  if (typeof (clients as { maxRetries?: unknown }).maxRetries !== "number") {
    checkRouteClients(compiled, clients, "openai client");
  }
  return runWithPolicy(compiled, dispatch, options);
}

/**
 * `runHedged` over `openai` clients, for a policy with a `hedge` section
 * (docs/HEDGING.md): the lead and each hedge the core offers go to their
 * route's client with `maxRetries: 0`, the attempt's AbortSignal (a loser is
 * aborted), the remaining deadline as timeout and the same Idempotency-Key.
 * Before any request it refuses a client whose `maxRetries` is not 0 and a
 * policy route without a client.
 */
export async function runHedgedWithOpenAI<C extends OpenAIClientLike, T>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: (client: C, options: OpenAIRequestOptions, attempt: HedgeAttempt) => Promise<T>,
  options: HedgeRunOptions,
): Promise<HedgeRun<T>> {
  const single = typeof (clients as { maxRetries?: unknown }).maxRetries === "number";
  const byRoute = single ? undefined : (clients as Readonly<Record<string, C>>);
  const compiled = compiledOf(policy);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
    checkRouteClients(compiled, byRoute, "openai client");
  }
  return runHedged(
    compiled,
    (a) => {
      const client = byRoute === undefined ? (clients as C) : (byRoute[a.routeId] as C);
      const requestOptions: OpenAIRequestOptions = {
        maxRetries: 0,
        signal: a.signal,
        timeout: Math.max(1, a.remainingMs),
        idempotencyKey: a.idempotencyKey,
        headers: { "Idempotency-Key": a.idempotencyKey },
      };
      return call(client, requestOptions, a);
    },
    options,
  );
}

// ---------------------------------------------------------------- streaming

/**
 * An error event inside an OpenAI stream the SDK yields as an event rather
 * than raising (the Responses API's `error` and `response.failed`): raised
 * by the reader with the event's `code` and `type`, so that the facts carry
 * them.
 */
export class OpenAIStreamError extends Error {
  readonly code: string | undefined;
  readonly type: string | undefined;
  readonly event: unknown;
  constructor(event: unknown, code: unknown, message: unknown) {
    super(typeof message === "string" && message !== "" ? message : "error event in the stream");
    this.name = "OpenAIStreamError";
    this.code = typeof code === "string" ? code : undefined;
    this.type = typeof (event as { type?: unknown })?.type === "string" ? ((event as { type: string }).type) : undefined;
    this.event = event;
  }
}

type Ev = Record<string, unknown> & {
  type?: unknown;
  delta?: unknown;
  sequence_number?: unknown;
  response?: { id?: unknown; error?: { code?: unknown; message?: unknown } | null } | null;
  choices?: { delta?: { content?: unknown } | null; finish_reason?: unknown }[];
  id?: unknown;
  object?: unknown;
};

/** Usage the reader reports: `openaiUsageUnits`, or impossible counts when the block is not numbers. */
function streamUsage(holder: unknown): Usage | undefined {
  try {
    return openaiUsageUnits(holder);
  } catch {
    return { output: Number.NaN };
  }
}

/**
 * Reads the events of an `openai` stream, chat completions (`stream: true`)
 * and the Responses API alike:
 *
 * - text: a chat chunk's `choices[0].delta.content`; a Responses
 *   `response.output_text.delta`'s `delta`; `""` for any other event;
 * - sequence: the Responses events' `sequence_number` (chat chunks have none);
 * - response id: the Responses `response.id` (`response.created`), a chat chunk's `id`;
 * - terminal: `response.completed` (or `response.incomplete`); for chat, a
 *   chunk with a `finish_reason` (the SDK consumes `[DONE]` and ends the
 *   iteration without showing it; a stream cut before it raises);
 * - usage: a chat chunk's `usage` (`stream_options: {include_usage: true}`),
 *   the `usage` of `response.completed`, in `openaiUsageUnits`' units.
 *
 * A Responses `error` or `response.failed` event raises `OpenAIStreamError`
 * with the event's code.
 */
export const openaiStreamReader: StreamReader<unknown> = {
  text(event) {
    const e = event as Ev;
    const type = e.type;
    if (typeof type === "string") {
      if (type === "response.output_text.delta") return typeof e.delta === "string" ? e.delta : "";
      if (type === "error") throw new OpenAIStreamError(e, e.code, e.message);
      if (type === "response.failed") throw new OpenAIStreamError(e, e.response?.error?.code, e.response?.error?.message);
      return "";
    }
    const content = e.choices?.[0]?.delta?.content;
    return typeof content === "string" ? content : "";
  },
  sequence(event) {
    const n = (event as Ev).sequence_number;
    return typeof n === "number" ? n : undefined;
  },
  responseId(event) {
    const e = event as Ev;
    const id = typeof e.type === "string" ? e.response?.id : e.object === "chat.completion.chunk" ? e.id : undefined;
    return typeof id === "string" ? id : undefined;
  },
  terminal(event) {
    const e = event as Ev;
    if (typeof e.type === "string") return e.type === "response.completed" || e.type === "response.incomplete";
    const choices = e.choices;
    return Array.isArray(choices) && choices.some((c) => c?.finish_reason !== null && c?.finish_reason !== undefined);
  },
  usage(event) {
    const e = event as Ev;
    if (typeof e.type === "string") return e.type === "response.completed" ? streamUsage(e.response) : undefined;
    return e.usage === null || e.usage === undefined ? undefined : streamUsage(e);
  },
};

/** The parts of a client the stream calls use (an `OpenAI` client has them). */
export interface OpenAIStreamClientLike extends OpenAIClientLike {
  chat: { completions: { create(params: object, options?: object): unknown } };
  responses: { create(params: object, options?: object): unknown; retrieve(id: string, query?: object, options?: object): unknown };
}

/** A streamed SDK call: (a promise of) the SDK's stream of events. */
export type OpenAIStreamCall<C, E> = (
  client: C,
  options: OpenAIRequestOptions,
  step: StreamStep,
) => Promise<AsyncIterable<E>> | AsyncIterable<E>;

/** `chat.completions.create({...params, stream: true}, options)`. */
export function openaiChatStream<E = unknown>(params: Record<string, unknown>): OpenAIStreamCall<Pick<OpenAIStreamClientLike, "chat">, E> {
  return (client, options) => client.chat.completions.create({ ...params, stream: true }, options) as Promise<AsyncIterable<E>>;
}

/**
 * A Responses API stream: `responses.create({...params, stream: true,
 * background: true}, options)` (a background response can be resumed); when
 * the step resumes an earlier attempt's response, `responses.retrieve(id,
 * {stream: true, starting_after}, options)` instead, which continues its
 * events after the last sequence number seen.
 */
export function openaiResponsesStream<E = unknown>(params: Record<string, unknown>): OpenAIStreamCall<Pick<OpenAIStreamClientLike, "responses">, E> {
  return (client, options, step) => {
    const c = step.continuation;
    if (c !== undefined) {
      return client.responses.retrieve(c.response_id, { stream: true, starting_after: c.starting_after }, options) as Promise<AsyncIterable<E>>;
    }
    return client.responses.create({ ...params, stream: true, background: true }, options) as Promise<AsyncIterable<E>>;
  };
}

/**
 * A stream dispatch over `openai` clients, one per route id (or one for
 * every route): each attempt calls `call` with no SDK retries, the attempt's
 * signal, the run's remaining time as `timeout` and the Idempotency-Key
 * header. Refuses, before any dispatch, a client whose `maxRetries` is not 0.
 */
export function openaiStreamDispatch<C extends OpenAIClientLike, E>(
  clients: C | Readonly<Record<string, C>>,
  call: OpenAIStreamCall<C, E>,
): StreamDispatchFn<E> {
  const single = typeof (clients as { maxRetries?: unknown }).maxRetries === "number";
  const byRoute = single ? undefined : (clients as Readonly<Record<string, C>>);
  if (byRoute === undefined) {
    assertNoSdkRetries(clients as C);
  } else {
    for (const [routeId, client] of Object.entries(byRoute)) assertNoSdkRetries(client, `the client of route ${routeId}`);
  }
  return (step, signal) => {
    const client = byRoute === undefined ? (clients as C) : Object.hasOwn(byRoute, step.routeId) ? byRoute[step.routeId] : undefined;
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
    return call(sendingClient(client, step), options, step);
  };
}

/**
 * `runStream` over `openai` clients, reading events with
 * `openaiStreamReader` unless `options.reader` says otherwise. Before any
 * request it refuses a client whose `maxRetries` is not 0 and a policy route
 * without a client. With `priceSchedule` the stream's usage is charged.
 */
export function runStreamWithOpenAI<C extends OpenAIClientLike, E = unknown>(
  policy: Input<Policy> | CompiledPolicy,
  clients: C | Readonly<Record<string, C>>,
  call: OpenAIStreamCall<C, E>,
  options: StreamRunOptions<E>,
): StreamRun<E> {
  const dispatch = openaiStreamDispatch(clients, call);
  const compiled = compiledOf(policy);
  if (typeof (clients as { maxRetries?: unknown }).maxRetries !== "number") {
    checkRouteClients(compiled, clients, "openai client");
  }
  return runStream(compiled, dispatch, { ...options, reader: options.reader ?? (openaiStreamReader as StreamReader<E>) });
}

// ---------------------------------------------------------------- output checks

/**
 * The built-in output checks of openai answers, for `checks` (docs/REPAIR.md):
 * `refusal` (policy_denied: never a fallback), `truncated`, `empty`, with
 * `json: true` `unparsable_json` (a JSON output was asked for), then
 * `validators` (`outputCheck`, `schemaCheck`) run on the answer's text.
 */
export function openaiAnswerChecks(options: AnswerCheckOptions = {}): OutputCheck[] {
  return answerChecks("openai", openaiAnswerParts, options);
}
