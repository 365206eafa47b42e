/**
 * Integration for plain `fetch` (Node's undici, browsers, any WHATWG fetch).
 *
 * `fetch` has no retries of its own, so the driver is the only retry owner.
 * A response that is not 2xx becomes an `HttpStatusError` carrying its
 * `status`, `headers` (the `Headers` object), `response` and the first
 * `MAX_ERROR_BODY_BYTES` + 1 bytes of its body as `body`; the driver reads
 * the status, the `retry-after-ms` / `retry-after` and rate-limit headers and
 * the body off it and the core's HTTP rules (and, for a route that names its
 * provider family, its provider tables: docs/PROVIDERS.md) judge them (429 rate limited with its hint, 5xx
 * unavailable except 501/505, 408 a timeout before response, 400/404/422
 * invalid requests, 403 policy denied, 409 with Retry-After `in_progress` (the
 * keyed request still runs at the receiver: asked again on the same route),
 * other 4xx rejected). A network failure
 * is fetch's own error (undici: `TypeError: fetch failed` whose `cause` has a
 * `code` such as `ECONNREFUSED`); the driver reads the codes along the cause
 * chain and the core's code table judges them (a connection never made is
 * unavailable, one broken after sending unknown acceptance). This module maps
 * no error itself.
 */

import { AttemptError } from "./facts.js";
import { recordBody } from "./sending.js";
import { MAX_ERROR_BODY_BYTES } from "./tables.js";
import { checkRouteClients, runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
import { CompiledPolicy, compiledOf, type Input } from "./core.js";
import type { Policy } from "./types.js";

/**
 * A response whose status is not 2xx. `fetchDispatch` reads the first
 * `MAX_ERROR_BODY_BYTES` + 1 bytes of its body into `body` (and cancels the
 * rest); `checkResponse` leaves the body unread (`error.response.text()` reads it).
 */
export class HttpStatusError extends Error {
  /** The response's HTTP status. */
  readonly status: number;
  /** The response's headers. */
  readonly headers: Headers;
  /** The response itself. */
  readonly response: Response;
  /** The start of the response's body as text, when it was read. */
  readonly body: string | undefined;

  constructor(response: Response, message?: string, options?: { cause?: unknown; body?: string | undefined }) {
    const text = response.statusText === "" ? "" : ` ${response.statusText}`;
    const from = response.url === "" ? "" : ` from ${response.url}`;
    super(message ?? `HTTP ${response.status}${text}${from}`, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "HttpStatusError";
    this.status = response.status;
    this.headers = response.headers;
    this.response = response;
    this.body = options?.body;
  }
}

/** At most `MAX_ERROR_BODY_BYTES` + 1 bytes of a response's body, decoded as UTF-8; the rest is cancelled. */
export async function readErrorBody(response: Response): Promise<string | undefined> {
  if (response.body === null) return undefined;
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size <= MAX_ERROR_BODY_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.byteLength;
    }
  } catch {
    // A body that breaks while read: what arrived is the body.
  } finally {
    reader.cancel().catch(() => undefined);
  }
  const bytes = new Uint8Array(Math.min(size, MAX_ERROR_BODY_BYTES + 1));
  let at = 0;
  for (const c of chunks) {
    if (at >= bytes.length) break;
    const part = c.subarray(0, bytes.length - at);
    bytes.set(part, at);
    at += part.byteLength;
  }
  return new TextDecoder().decode(bytes);
}

/** Returns `response` when its status is 2xx; throws `HttpStatusError` otherwise. */
export function checkResponse(response: Response): Response {
  if (response.status >= 200 && response.status <= 299) return response;
  throw new HttpStatusError(response);
}

/** What a fetch function gets for one attempt: the run's signal, the remaining time, the Idempotency-Key header. */
export interface FetchRequestOptions {
  /** Fires at the run's deadline or when the caller's signal fires: pass it to `fetch`. */
  signal: AbortSignal;
  /** Milliseconds left before the run's deadline. */
  timeout: number;
  /** The run's idempotency key (the same on every attempt). */
  idempotencyKey: string;
  /** `{"Idempotency-Key": idempotencyKey}`: send it with the request. */
  headers: Record<string, string>;
}

/** Makes one request and returns its `Response` (any status: the helper checks it). */
export type FetchCall = (options: FetchRequestOptions, step: Step) => Promise<Response>;

/** A URL to `fetch`, or a function that makes the request. */
export type FetchTarget = string | URL | FetchCall;

/** How the helper fetches a URL target and reads a 2xx response. */
export interface FetchOptions<T> {
  /**
   * The request for a URL target (method, body, headers, ...), or a function
   * of the step that builds it. The helper adds the `Idempotency-Key` header
   * and the run's signal (an `init.signal` is replaced: pass yours as
   * `RunOptions.signal`). Give a body that can be sent again (a string or
   * bytes, not a stream), or build it per step. A string or bytes body is
   * recorded on the attempt as its SHA-256 (`step.requestBody`), so a retry
   * that sends another body is `request_body_drift`.
   */
  init?: RequestInit | ((step: Step) => RequestInit) | undefined;
  /** Reads a 2xx response into the run's result (default: the `Response` itself). */
  read?: ((response: Response, step: Step) => Promise<T> | T) | undefined;
  /** The fetch function for URL targets (default: `globalThis.fetch`). */
  fetch?: ((input: string | URL, init: RequestInit) => Promise<Response>) | undefined;
}

function isSingle(targets: unknown): targets is FetchTarget {
  return typeof targets === "string" || typeof targets === "function" || targets instanceof URL;
}

function fetchUrl(url: string | URL, options: FetchRequestOptions, step: Step, given: FetchOptions<unknown>): Promise<Response> {
  const base = typeof given.init === "function" ? given.init(step) : (given.init ?? {});
  const headers = new Headers(base.headers);
  headers.set("Idempotency-Key", options.idempotencyKey);
  const doFetch = given.fetch ?? ((input: string | URL, init: RequestInit) => globalThis.fetch(input, init));
  recordBody(step, base.body);
  return doFetch(url, { ...base, headers, signal: options.signal });
}

/**
 * A dispatch function over `fetch`: one target per route id (or one for every
 * route). A URL target is fetched with `options.init`, the `Idempotency-Key`
 * header and the run's signal; a function target gets them to make its own
 * request. A response that is not 2xx is thrown as `HttpStatusError` with the
 * start of its body; a 2xx
 * one goes to `options.read` (default: the run's result is the `Response`).
 */
export function fetchDispatch(targets: FetchTarget | Readonly<Record<string, FetchTarget>>, options?: FetchOptions<Response> & { read?: undefined }): DispatchFn<Response>;
export function fetchDispatch<T>(targets: FetchTarget | Readonly<Record<string, FetchTarget>>, options: FetchOptions<T> & { read: (response: Response, step: Step) => Promise<T> | T }): DispatchFn<T>;
export function fetchDispatch<T>(targets: FetchTarget | Readonly<Record<string, FetchTarget>>, options: FetchOptions<T> = {}): DispatchFn<T> {
  const byRoute = isSingle(targets) ? undefined : targets;
  const given = options as FetchOptions<unknown>;
  return async (step, signal) => {
    const target = byRoute === undefined ? (targets as FetchTarget) : Object.hasOwn(byRoute, step.routeId) ? byRoute[step.routeId] : undefined;
    if (target === undefined) {
      throw AttemptError.nonRetryable("invalid_request", { cause: new Error(`no fetch target for route ${step.routeId}`) });
    }
    const request: FetchRequestOptions = {
      signal,
      timeout: Math.max(1, step.remainingMs),
      idempotencyKey: step.idempotencyKey,
      headers: { "Idempotency-Key": step.idempotencyKey },
    };
    const response = typeof target === "function" ? await target(request, step) : await fetchUrl(target, request, step, given);
    step.rateLimitHeaders?.(response);
    if (response.status < 200 || response.status > 299) {
      throw new HttpStatusError(response, undefined, { body: await readErrorBody(response) });
    }
    return options.read === undefined ? (response as T) : options.read(response, step);
  };
}

/**
 * `runWithPolicy` over `fetch`. Before any request it refuses a policy route
 * without a target.
 */
export function runWithFetch(
  policy: Input<Policy> | CompiledPolicy,
  targets: FetchTarget | Readonly<Record<string, FetchTarget>>,
  options: RunOptions,
  fetchOptions?: FetchOptions<Response> & { read?: undefined },
): Promise<RunResult<Response>>;
export function runWithFetch<T>(
  policy: Input<Policy> | CompiledPolicy,
  targets: FetchTarget | Readonly<Record<string, FetchTarget>>,
  options: RunOptions,
  fetchOptions: FetchOptions<T> & { read: (response: Response, step: Step) => Promise<T> | T },
): Promise<RunResult<T>>;
export async function runWithFetch<T>(
  policy: Input<Policy> | CompiledPolicy,
  targets: FetchTarget | Readonly<Record<string, FetchTarget>>,
  options: RunOptions,
  fetchOptions: FetchOptions<T> = {},
): Promise<RunResult<T>> {
  const dispatch = fetchDispatch(targets, fetchOptions as FetchOptions<T> & { read: (response: Response, step: Step) => T });
  const compiled = compiledOf(policy);
  if (!isSingle(targets)) {
    checkRouteClients(compiled, targets, "fetch target");
  }
  return runWithPolicy(compiled, dispatch, options);
}
