/**
 * One logical request, lowered per route (docs/LOWERING.md).
 *
 * A logical request with `messages` is provider-neutral. A route release with
 * `lowering` settings names its wire and what the route can take; the core
 * turns the request into that SDK call's parameters, or refuses the route with
 * a coded error (`capability_missing`, `provider_bound_history`) before any
 * dispatch.
 */

import { call, toText, type Input, type RawBindings } from "./core.js";
import type { ProviderFamily } from "./tables.js";
import type { Json, RouteRelease } from "./types.js";

/** The wire a route speaks. */
export type LoweringApi = "openai.chat_completions" | "openai.responses" | "anthropic.messages" | "google.generate_content";

/** A route release's lowering settings (`lowering` on `retryledger.route_release.v1`). */
export interface LoweringSettings {
  api: LoweringApi;
  /** The estimated input plus the output bound sent must fit. */
  context_window_tokens: number;
  /** The output ceiling: a larger request bound is clamped to it. */
  max_output_tokens: number;
  /** What the route supports beyond text; absent is nothing. */
  supports?: Array<"images" | "json_schema" | "tools">;
  /** The most reasoning tokens the route allows; absent, reasoning is not sent. */
  thinking_budget_tokens?: number;
  /** `false`: temperature and top_p are not sent. */
  accepts_temperature?: boolean;
}

/** A content part of a conversation message. */
export type ContentPart =
  | { type: "text"; text: string }
  | { type: "image"; media_type: "image/png" | "image/jpeg" | "image/gif" | "image/webp"; data?: string; url?: string }
  | { type: "tool_call"; id: string; name: string; arguments: { [key: string]: Json } }
  | { type: "tool_result"; tool_call_id: string; content: string; is_error?: boolean }
  | { type: "provider_bound"; family: Exclude<ProviderFamily, "generic">; kind: string; data: { [key: string]: Json } };

/** One message of a conversation. */
export interface ConversationMessage {
  role: "user" | "assistant" | "tool";
  content: ContentPart[];
}

/** A logical request that is a conversation (`retryledger.request.v1` with `messages`). */
export interface ConversationRequest {
  schema: "retryledger.request.v1";
  operation: string;
  system?: string;
  messages: ConversationMessage[];
  tools?: Array<{ name: string; description?: string; parameters: { [key: string]: Json } }>;
  response_format?: { type: "text" } | { type: "json" } | { type: "json_schema"; name: string; schema: { [key: string]: Json } };
  max_output_tokens?: number;
  reasoning?: { effort: "low" | "medium" | "high" } | { budget_tokens: number };
  stop?: string[];
  sampling?: { temperature?: number; top_p?: number };
  seed?: number;
}

/** A route release that carries lowering settings. */
export type LoweredRouteRelease = RouteRelease & { lowering: LoweringSettings };

/** What a provider-bound part a route cannot carry does: refuse the route (default) or drop the part. */
export interface LowerOptions {
  provider_bound_parts?: "refuse" | "drop";
}

/** A change lowering made, at the request's JSON Pointer. */
export interface LoweringNote {
  path: string;
  what: "clamped_to_ceiling" | "dropped_unsupported" | "dropped_provider_bound" | "tool_call_id_rewritten";
}

/** A request lowered for one route. */
export interface Lowered {
  api: LoweringApi;
  /** The SDK call's parameters (for `google`, the REST body; the model is in the URL). */
  body: { [key: string]: Json };
  /** SHA-256 of the body's RFC 8785 form: the attempt's `request_body_sha256`. */
  body_sha256: string;
  model: string;
  /** What was clamped, dropped or rewritten, in request order. */
  notes: LoweringNote[];
}

/** Whether a route can serve a request; when not, the code and the request's pointer. */
export interface RouteCapability {
  route_id: string;
  capable: boolean;
  code?: string;
  path?: string;
}

interface LoweringBindings {
  lower_request(request: string, release: string, options: string): string;
  route_capabilities(request: string, spec: string): string;
}

const lowerCall = <T>(f: (b: LoweringBindings) => T): T => call((b: RawBindings) => f(b as unknown as LoweringBindings));

/**
 * Lower a logical request with `messages` for a route release. Throws
 * `PolicyError` (`capability_missing`, `provider_bound_history`) when the
 * route cannot serve it, `DecodeError` for a malformed request.
 */
export function lowerRequest(
  request: Input<ConversationRequest>,
  release: Input<LoweredRouteRelease>,
  options: Input<LowerOptions> = {},
): Lowered {
  const r = toText(request);
  const rel = toText(release);
  const o = toText(options);
  return JSON.parse(lowerCall((b) => b.lower_request(r, rel, o))) as Lowered;
}

/**
 * For each route of a policy spec, whether it can serve the request;
 * `buildPolicy` leaves out those that cannot and throws `no_capable_route`
 * when none can.
 */
export function routeCapabilities(request: Input<ConversationRequest>, spec: Input<Record<string, unknown>>): { routes: RouteCapability[] } {
  const r = toText(request);
  const s = toText(spec);
  return JSON.parse(lowerCall((b) => b.route_capabilities(r, s))) as { routes: RouteCapability[] };
}
