/**
 * One logical request across providers: one policy whose routes speak
 * different wires (OpenAI, Anthropic, Google), each route dispatched through
 * its own SDK client, in one run (docs/LOWERING.md).
 *
 *     import OpenAI from "openai";
 *     import Anthropic from "@anthropic-ai/sdk";
 *     import { GoogleGenAI } from "@google/genai";
 *     import { runAcrossProviders } from "retryledger/providers";
 *
 *     const run = await runAcrossProviders(request, spec, {
 *       idempotencyKey: "ticket-4411",
 *       clients: {
 *         "openai-primary": new OpenAI({ maxRetries: 0 }),
 *         "anthropic-fallback": new Anthropic({ maxRetries: 0 }),
 *         "gemini-last": new GoogleGenAI({ apiKey }),
 *       },
 *     });
 *     run.result.response;   // the SDK's answer of the route that completed
 *     run.receipt.schedule;  // per attempt: route, outcome, requested and served model
 *
 * `request` is a conversation (`retryledger.request.v1` with `messages`);
 * `spec` a policy spec whose routes' releases carry `lowering` settings.
 * Before any request:
 *
 * - the core builds the policy and leaves out every route that cannot serve
 *   the request (`no_capable_route` when none can; a provider-bound part a
 *   route cannot carry excludes it with `provider_bound_history` unless the
 *   spec's `provider_bound_parts` is `drop`);
 * - the core lowers the request once per remaining route (`lowerRequest`):
 *   the body each route's attempts send, the same on every retry;
 * - every remaining route needs a client (`route_client_missing`, a
 *   `PolicyError`, naming each route without one), the client of its wire
 *   (`openai.*` an `openai` client, `anthropic.messages` an
 *   `@anthropic-ai/sdk` client, `google.generate_content` a `@google/genai`
 *   client; another SDK's client is `DecodeError` `invalid_type` at
 *   `/clients/<route id>`), whose own retries are off
 *   (`retry_owner_not_harness`).
 *
 * Each attempt then sends the route's lowered body through the route's SDK
 * (no SDK retries, the run's signal, the remaining deadline as timeout, the
 * run's Idempotency-Key), records the body's digest (`request_body_sha256`,
 * the lowering's `body_sha256`), and records the model it asked for and the
 * one the answer named (`model.requested`, `model.served`: the answer's
 * `model`, or Gemini's `modelVersion`); an answer that names none leaves the
 * served model unknown, never invented. Errors are judged by the core with
 * the route's provider table, as the single-provider integrations do.
 *
 * This module imports no SDK: it reads the clients' methods.
 */

import { CompiledPolicy, buildPolicy, idempotencyKeySha256, sha256Hex, type Input } from "./core.js";
import { AttemptStep, runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { DecodeError } from "./errors.js";
import { lowerRequest, type ConversationRequest, type LoweredRouteRelease, type Lowered, type LoweringApi } from "./lowering.js";
import { anthropicDispatch, assertNoSdkRetries as assertNoAnthropicRetries, type AnthropicClientLike } from "./anthropic.js";
import {
  googleGenAIDispatch,
  googleGenAIStreamReader,
  googleGenAIUsageUnits,
  assertNoSdkRetries as assertNoGoogleRetries,
  type GoogleGenAIClientLike,
  type GoogleGenAIRequestOptions,
} from "./google-genai.js";
import { openaiDispatch, openaiStreamDispatch, openaiStreamReader, assertNoSdkRetries as assertNoOpenAIRetries, type OpenAIClientLike } from "./openai.js";
import { anthropicStreamDispatch, anthropicStreamReader } from "./anthropic.js";
import { runStream, type StreamDispatchFn, type StreamReader, type StreamRun, type StreamRunOptions, type StreamStep } from "./stream.js";
import type { LogicalRequest, PolicySpec, RouteSpec } from "./types.js";

/** An `openai` client: what this module calls. */
export interface OpenAIProviderClient extends OpenAIClientLike {
  chat: { completions: { create(params: object, options?: object): unknown } };
  responses: { create(params: object, options?: object): unknown };
}

/** An `@anthropic-ai/sdk` client: what this module calls. */
export interface AnthropicProviderClient extends AnthropicClientLike {
  messages: { create(params: object, options?: object): unknown };
}

/** A `@google/genai` client: what this module calls. */
export interface GoogleProviderClient extends GoogleGenAIClientLike {
  models: { generateContent(params: object): Promise<unknown>; generateContentStream(params: object): Promise<AsyncIterable<unknown>> };
}

/** Any integrated SDK client. */
export type ProviderClient = OpenAIProviderClient | AnthropicProviderClient | GoogleProviderClient;

/** The answer of the attempt that completed the run. */
export interface ProviderAnswer {
  /** The route that answered. */
  routeId: string;
  /** Its wire. */
  api: LoweringApi;
  /** The model the lowered request named. */
  requestedModel: string;
  /** The model the answer named; `undefined` when it named none. */
  servedModel: string | undefined;
  /** The SDK's answer, as it returned it. */
  response: unknown;
}

/**
 * `runWithPolicy`'s options (but `repair`: a repair is another logical
 * request, which this driver has not lowered), and the client of every route.
 */
export interface CrossProviderOptions extends Omit<RunOptions, "repair"> {
  /** Route id → the route's SDK client (its own retries off). */
  clients: Readonly<Record<string, ProviderClient>>;
}

/** What a run across providers sends: per route, the lowered request. */
export interface CrossProviderPlan {
  /** The policy the core built from the request and the spec (incapable routes left out). */
  policy: CompiledPolicy;
  /** Route id → the request lowered for the route's release. */
  lowered: Readonly<Record<string, Lowered>>;
}

const routeSpecOf = (spec: PolicySpec, routeId: string): RouteSpec | undefined => spec.routes.find((r) => r.route_id === routeId);

function parsed<T>(doc: Input<T>): T {
  return (typeof doc === "string" ? JSON.parse(doc) : doc) as T;
}

/**
 * The policy and the per-route lowered requests of a run across providers,
 * all computed by the core before any dispatch (see the module comment).
 * Without `idempotency_key_sha256` in the spec, the key's digest (scoped by
 * `keyScope`) is written into it.
 */
export function planAcrossProviders(
  request: Input<ConversationRequest>,
  spec: Input<PolicySpec>,
  key?: { idempotencyKey: string; keyScope?: { tenant: string; operation: string } | undefined },
): CrossProviderPlan {
  const s = { ...parsed(spec) };
  if (s.idempotency_key_sha256 === undefined && key !== undefined) {
    s.idempotency_key_sha256 = key.keyScope === undefined ? sha256Hex(key.idempotencyKey) : idempotencyKeySha256(key.idempotencyKey, key.keyScope);
  }
  const policy = buildPolicy(request as unknown as Input<LogicalRequest>, s);
  const options = s.provider_bound_parts === undefined ? {} : { provider_bound_parts: s.provider_bound_parts };
  const lowered: Record<string, Lowered> = {};
  for (const route of policy.policy.routes) {
    const r = routeSpecOf(s, route.route_id);
    const release = r !== undefined && "release" in r ? r.release : undefined;
    if (release === undefined || release.lowering === undefined) {
      // A route given by provider and model has no release document to carry lowering settings.
      const at = r === undefined ? "/routes" : `/routes/${s.routes.indexOf(r)}/release/lowering`;
      throw new DecodeError(
        "missing_field",
        `missing_field at ${at}: route ${route.route_id} has no lowering settings: give its release \`lowering\` (its wire and what it takes) to send it the lowered request`,
        { path: at },
      );
    }
    lowered[route.route_id] = lowerRequest(request, release as LoweredRouteRelease, options);
  }
  return { policy, lowered };
}

const hasMethod = (o: unknown, ...path: string[]): boolean => {
  let v: unknown = o;
  for (const p of path) {
    if (v === null || (typeof v !== "object" && typeof v !== "function")) return false;
    v = (v as Record<string, unknown>)[p];
  }
  return typeof v === "function";
};

/** The client a wire needs, checked (its own retries off) before any dispatch. */
function checkedClient(api: LoweringApi, routeId: string, client: unknown): void {
  const name = `the client of route ${routeId}`;
  const wrong = (needs: string): DecodeError =>
    new DecodeError("invalid_type", `invalid_type at /clients/${routeId}: route ${routeId} speaks ${api}; its client has no ${needs}`, {
      path: `/clients/${routeId}`,
    });
  switch (api) {
    case "openai.chat_completions":
      if (!hasMethod(client, "chat", "completions", "create")) throw wrong("chat.completions.create (an openai client)");
      assertNoOpenAIRetries(client as OpenAIClientLike, name);
      return;
    case "openai.responses":
      if (!hasMethod(client, "responses", "create")) throw wrong("responses.create (an openai client)");
      assertNoOpenAIRetries(client as OpenAIClientLike, name);
      return;
    case "anthropic.messages":
      if (!hasMethod(client, "messages", "create")) throw wrong("messages.create (an @anthropic-ai/sdk client)");
      assertNoAnthropicRetries(client as AnthropicClientLike, name);
      return;
    case "google.generate_content":
      if (!hasMethod(client, "models", "generateContent")) throw wrong("models.generateContent (a @google/genai client)");
      assertNoGoogleRetries(client as GoogleGenAIClientLike, name);
      return;
  }
}

/** The model an SDK answer names (`model`, Gemini's `modelVersion`), or `undefined`. */
export function servedModelOf(api: LoweringApi, response: unknown): string | undefined {
  if (response === null || typeof response !== "object") return undefined;
  const v = (response as Record<string, unknown>)[api === "google.generate_content" ? "modelVersion" : "model"];
  return typeof v === "string" && v !== "" ? v : undefined;
}

/** Record the lowered body's digest on the attempt (after the SDK's fetch recorded its bytes: the lowering's digest is the attempt's). */
function recordBody(step: Step, lowered: Lowered): void {
  if (step instanceof AttemptStep) step.requestBodySha256(lowered.body_sha256);
}

/**
 * `generateContent`'s parameters for a lowered body: the SDK builds the URL,
 * headers and errors; the body it sends is the lowered REST body whole (its
 * own conversion of the parameters would add fields the lowering did not
 * make, such as an empty `generationConfig`).
 */
function googleParams(lowered: Lowered, options: GoogleGenAIRequestOptions, signal: AbortSignal): object {
  const text = JSON.stringify(lowered.body);
  const send = options.fetch;
  const fetch = (input: RequestInfo | URL, init?: RequestInit): Promise<Response> =>
    send(input, init?.body === undefined || init.body === null ? init : { ...init, body: text });
  return { model: lowered.model, contents: lowered.body["contents"], config: { abortSignal: signal, httpOptions: { ...options, fetch } } };
}

/** One attempt's SDK call for a route, by its wire: the answer, with the served model recorded. */
function routeDispatch(routeId: string, client: ProviderClient, lowered: Lowered): DispatchFn<ProviderAnswer> {
  const answer = (step: Step, response: unknown): ProviderAnswer => {
    const served = servedModelOf(lowered.api, response);
    step.model?.(lowered.model, served);
    return { routeId, api: lowered.api, requestedModel: lowered.model, servedModel: served, response };
  };
  const sent = async <T>(step: Step, send: () => Promise<T>): Promise<T> => {
    // Asked for now; the served model once an answer names it.
    step.model?.(lowered.model);
    try {
      return await send();
    } finally {
      recordBody(step, lowered);
    }
  };
  switch (lowered.api) {
    case "openai.chat_completions":
    case "openai.responses": {
      const chat = lowered.api === "openai.chat_completions";
      const d = openaiDispatch(client as OpenAIProviderClient, (c, options, step) =>
        sent(step, async () => answer(step, await (chat ? c.chat.completions.create(lowered.body, options) : c.responses.create(lowered.body, options)))),
      );
      return (step, signal) => d(step, signal);
    }
    case "anthropic.messages": {
      const d = anthropicDispatch(client as AnthropicProviderClient, (c, options, step) =>
        sent(step, async () => answer(step, await c.messages.create(lowered.body, options))),
      );
      return (step, signal) => d(step, signal);
    }
    case "google.generate_content": {
      const d = googleGenAIDispatch(client as GoogleProviderClient, (c, options, step, signal) =>
        sent(step, async () => {
          const response = await c.models.generateContent(googleParams(lowered, options, signal));
          if (step.priced) {
            // Usage that cannot be read is unknown: the attempt keeps its reservation.
            let units: ReturnType<typeof googleGenAIUsageUnits>;
            try {
              units = googleGenAIUsageUnits(response);
            } catch {
              units = undefined;
            }
            if (units !== undefined) step.usage(units);
          }
          return answer(step, response);
        }),
      );
      return (step, signal) => d(step, signal);
    }
  }
}

/**
 * The dispatch of a run across providers: each route's attempts go through
 * its client with its lowered body. Refuses, before any dispatch, a route
 * without a client (`route_client_missing`) or with a client of another
 * wire, and a client whose own retries are on.
 */
export function crossProviderDispatch(plan: CrossProviderPlan, clients: Readonly<Record<string, ProviderClient>>): DispatchFn<ProviderAnswer> {
  if (clients === null || typeof clients !== "object") throw new TypeError("clients must be a record of route id → SDK client");
  const ids = Object.keys(clients).filter((id) => Object.hasOwn(clients, id) && clients[id] !== undefined && clients[id] !== null);
  plan.policy.requireClients(ids);
  const byRoute: Record<string, DispatchFn<ProviderAnswer>> = {};
  for (const route of plan.policy.policy.routes) {
    const lowered = plan.lowered[route.route_id];
    if (lowered === undefined) throw new TypeError(`the plan has no lowered request for route ${route.route_id}`);
    const client = clients[route.route_id] as ProviderClient;
    checkedClient(lowered.api, route.route_id, client);
    byRoute[route.route_id] = routeDispatch(route.route_id, client, lowered);
  }
  return (step, signal) => (byRoute[step.routeId] as DispatchFn<ProviderAnswer>)(step, signal);
}

/**
 * Run one conversation across providers: the core builds the policy from
 * `request` and `spec` and lowers the request per route, every route's
 * client is checked, then `runWithPolicy` runs it (see the module comment).
 * Resolves with the completing route's `ProviderAnswer`; rejects like
 * `runWithPolicy`.
 */
export async function runAcrossProviders(
  request: Input<ConversationRequest>,
  spec: Input<PolicySpec>,
  options: CrossProviderOptions,
): Promise<RunResult<ProviderAnswer>> {
  const { clients, ...run } = options;
  if ((options as RunOptions).repair !== undefined) {
    throw new DecodeError("invalid_value", "invalid_value at /repair: a run across providers sends the one request it lowered; a repair is another request", {
      path: "/repair",
    });
  }
  const plan = planAcrossProviders(request, spec, { idempotencyKey: options.idempotencyKey, keyScope: options.keyScope });
  const dispatch = crossProviderDispatch(plan, clients);
  return runWithPolicy(plan.policy, dispatch, { ...run, request: run.request ?? parsed(request) });
}

// ---------------------------------------------------------------- streaming

/** Which reader reads an event: set by the dispatch of the route that yielded it. */
const readerOf = new WeakMap<object, StreamReader<unknown>>();

const read = <R>(event: unknown, f: (r: StreamReader<unknown>, e: unknown) => R, otherwise: R): R => {
  const r = typeof event === "object" && event !== null ? readerOf.get(event) : undefined;
  return r === undefined ? otherwise : f(r, event);
};

/**
 * Reads the events of a streamed run across providers: each event with the
 * reader of the wire whose SDK yielded it (`openaiStreamReader`,
 * `anthropicStreamReader`, `googleGenAIStreamReader`).
 */
export const crossProviderStreamReader: StreamReader<unknown> = {
  text: (e) => read(e, (r, x) => r.text(x), ""),
  sequence: (e) => read(e, (r, x) => r.sequence?.(x), undefined),
  responseId: (e) => read(e, (r, x) => r.responseId?.(x), undefined),
  terminal: (e) => read(e, (r, x) => r.terminal?.(x) ?? false, false),
  usage: (e) => read(e, (r, x) => r.usage?.(x), undefined),
};

/** The model a stream event names: a chat chunk's or Responses event's `model`, Anthropic's `message_start`. */
function eventModel(event: object): string | undefined {
  const e = event as { model?: unknown; modelVersion?: unknown; message?: { model?: unknown } | null; response?: { model?: unknown } | null };
  const m = e.model ?? e.modelVersion ?? e.message?.model ?? e.response?.model;
  return typeof m === "string" && m !== "" ? m : undefined;
}

async function* tagged(events: AsyncIterable<unknown>, reader: StreamReader<unknown>, step: StreamStep, requested: string): AsyncGenerator<unknown> {
  let served: string | undefined;
  for await (const e of events) {
    if (typeof e === "object" && e !== null) {
      readerOf.set(e, reader);
      const m = served === undefined ? eventModel(e) : undefined;
      if (m !== undefined) {
        served = m;
        step.model?.(requested, served);
      }
    }
    yield e;
  }
}

/**
 * The stream dispatch of a run across providers: each route's attempts
 * stream through its client with its lowered body and `stream: true` (chat
 * completions also ask for the usage chunk), recording the lowering's body
 * digest, the requested model and the served model the first event names
 * (Gemini: `generateContentStream`, read with `googleGenAIStreamReader`).
 */
export function crossProviderStreamDispatch(plan: CrossProviderPlan, clients: Readonly<Record<string, ProviderClient>>): StreamDispatchFn<unknown> {
  if (clients === null || typeof clients !== "object") throw new TypeError("clients must be a record of route id → SDK client");
  const ids = Object.keys(clients).filter((id) => Object.hasOwn(clients, id) && clients[id] !== undefined && clients[id] !== null);
  plan.policy.requireClients(ids);
  const byRoute: Record<string, StreamDispatchFn<unknown>> = {};
  for (const route of plan.policy.policy.routes) {
    const lowered = plan.lowered[route.route_id];
    if (lowered === undefined) throw new TypeError(`the plan has no lowered request for route ${route.route_id}`);
    const client = clients[route.route_id] as ProviderClient;
    checkedClient(lowered.api, route.route_id, client);
    const open = async (step: StreamStep, events: () => Promise<unknown>, reader: StreamReader<unknown>): Promise<AsyncIterable<unknown>> => {
      step.model?.(lowered.model);
      try {
        return tagged((await events()) as AsyncIterable<unknown>, reader, step, lowered.model);
      } finally {
        recordBody(step, lowered);
      }
    };
    switch (lowered.api) {
      case "openai.chat_completions":
      case "openai.responses": {
        const chat = lowered.api === "openai.chat_completions";
        byRoute[route.route_id] = openaiStreamDispatch(client as OpenAIProviderClient, (c, options, step) =>
          open(
            step,
            async () =>
              chat
                ? c.chat.completions.create({ ...lowered.body, stream: true, stream_options: { include_usage: true } }, options)
                : c.responses.create({ ...lowered.body, stream: true }, options),
            openaiStreamReader,
          ),
        );
        break;
      }
      case "anthropic.messages":
        byRoute[route.route_id] = anthropicStreamDispatch(client as AnthropicProviderClient, (c, options, step) =>
          open(step, async () => c.messages.create({ ...lowered.body, stream: true }, options), anthropicStreamReader),
        );
        break;
      case "google.generate_content":
        byRoute[route.route_id] = googleGenAIDispatch(client as GoogleProviderClient, (c, options, step, signal) =>
          open(step as StreamStep, async () => c.models.generateContentStream(googleParams(lowered, options, signal)), googleGenAIStreamReader),
        );
        break;
    }
  }
  return (step, signal) => (byRoute[step.routeId] as StreamDispatchFn<unknown>)(step, signal);
}

/**
 * A streamed conversation across providers: `runAcrossProviders` for a
 * spec with a `stream` contract (docs/STREAMING.md). The consumer iterates
 * the run's events; under `tentative`, an attempt cut after its first events
 * is invalidated (one `invalidate` event) and the next route's events
 * follow, each read with its own wire's reader.
 */
export function runStreamAcrossProviders(
  request: Input<ConversationRequest>,
  spec: Input<PolicySpec>,
  options: Omit<StreamRunOptions<unknown>, "reader"> & { clients: Readonly<Record<string, ProviderClient>> },
): StreamRun<unknown> {
  const { clients, ...run } = options;
  const plan = planAcrossProviders(request, spec, { idempotencyKey: options.idempotencyKey, keyScope: options.keyScope });
  const dispatch = crossProviderStreamDispatch(plan, clients);
  return runStream(plan.policy, dispatch, { ...run, reader: crossProviderStreamReader });
}
