/**
 * What an SDK client sends during one attempt: the `openai` and
 * `@anthropic-ai/sdk` integrations give each attempt a copy of the route's
 * client (`withOptions`) whose `fetch` records the SHA-256 of the request
 * body it sends on the step (`step.requestBody`), then calls the client's
 * own `fetch` and records the rate-limit headers of the response it gets
 * (`step.rateLimitHeaders`, success or failure). A client without `withOptions` and `fetch` (a stand-in) is
 * used as it is, and a body that is neither a string nor bytes (a stream, a
 * form) is not recorded.
 */

import type { Step } from "./driver.js";

type FetchLike = (input: unknown, init?: { body?: unknown }) => Promise<unknown>;

interface Copyable {
  fetch?: unknown;
  withOptions?: unknown;
}

/**
 * Report the tokens a returned value's usage says (the sum of its units:
 * input, cached input, output, reasoning) with `step.tokensUsed`, so the
 * admission release settles the attempt's token reservation; a value
 * without readable usage reports nothing (the reservation stands).
 */
export function reportTokens(step: Step, value: unknown, units: (value: unknown) => Record<string, number> | undefined): void {
  let u: Record<string, number> | undefined;
  try {
    u = units(value);
  } catch {
    return;
  }
  if (u === undefined) return;
  let total = 0;
  for (const v of Object.values(u)) if (Number.isSafeInteger(v) && v > 0) total += v;
  if (Number.isSafeInteger(total)) step.tokensUsed(total);
}

/** Record `body` on `step` when it is a string or bytes. */
export function recordBody(step: Step, body: unknown): void {
  if (typeof body === "string" || body instanceof Uint8Array) step.requestBody(body);
  else if (body instanceof ArrayBuffer) step.requestBody(new Uint8Array(body));
}

/** The path of a fetch target (a URL, its text, or a Request). */
function pathOf(input: unknown): string | undefined {
  const href = typeof input === "string" ? input : input instanceof URL ? input.href : (input as { url?: unknown } | null)?.url;
  if (typeof href !== "string") return undefined;
  try {
    return new URL(href).pathname;
  } catch {
    return undefined;
  }
}

/**
 * Check the call about to be sent against the request the policy binds
 * (`step.checkSent`: `request_drift` throws, and nothing is sent).
 */
export function checkSent(step: Step, input: unknown, body: unknown): void {
  const path = pathOf(input);
  if (path === undefined || step.checkSent === undefined) return;
  if (typeof body === "string" || body instanceof Uint8Array) step.checkSent(path, body);
  else if (body instanceof ArrayBuffer) step.checkSent(path, new Uint8Array(body));
}

/** `client` for one attempt: a copy whose `fetch` records the body it sends on `step`. */
export function sendingClient<C>(client: C, step: Step): C {
  const c = client as C & Copyable;
  const own = c.fetch;
  const copy = c.withOptions;
  if (typeof own !== "function" || typeof copy !== "function") return client;
  const send = own as FetchLike;
  const fetch: FetchLike = async (input, init) => {
    recordBody(step, init?.body);
    checkSent(step, input, init?.body);
    const response = await send.call(undefined, input, init);
    step.rateLimitHeaders?.(response);
    return response;
  };
  return (copy as (options: { fetch: FetchLike }) => C).call(client, { fetch });
}
