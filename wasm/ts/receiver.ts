/**
 * The receiver's guard: an HTTP endpoint protected by `Idempotency-Key`
 * (docs/RECEIVER.md), with the same answers and the same documents as the
 * Python package's `retryledger.receiver`.
 *
 * A request under a key is claimed through the core's idempotency records
 * (`idempotencyClaim`), the record kept in a register store (`get` /
 * `compareAndSet`: `MemoryStore`, SQLite, PostgreSQL, Redis):
 *
 * - the same key and request after success: the stored response, with
 *   `Idempotent-Replayed: true`; the handler does not run again;
 * - the same key while the first request runs: `409` with `Retry-After`;
 * - the same key and another request: `422` (`idempotency_key_reuse`);
 * - no key where one is required: `400` (`idempotency_key_missing`);
 * - the store cannot be read or written: `503` (`store_unavailable`); the
 *   handler never runs unguarded.
 *
 * `guardIdempotency(handler, options)` wraps a fetch-style handler
 * `(Request) => Promise<Response>`; `retryledger/receiver/express` and
 * `retryledger/receiver/fastify` adapt the same `IdempotencyGuard`.
 */

import { call, idempotencyKeySha256, type RawBindings } from "./core.js";
import { RetryledgerError } from "./errors.js";
import { idempotencyClaim, idempotencyComplete, type Completion, type IdempotencyRecord, type Retention } from "./journal.js";
import { StoreUnavailableError, type FleetStore, type StoreDocument } from "./stores/store.js";

/** The schema of the document a request's digest covers. */
export const REQUEST_SCHEMA = "retryledger.http_request.v1";
/** The schema of a stored response (and of the document its digest covers). */
export const RESPONSE_SCHEMA = "retryledger.http_response.v1";
/** Response headers kept with a stored response by default (lower case). */
export const DEFAULT_KEEP_HEADERS: readonly string[] = ["content-type", "content-language", "location", "etag", "last-modified"];
/** The largest response body kept for a replay by default, bytes. */
export const DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024;
/** The largest idempotency key taken, characters. */
export const MAX_KEY_LENGTH = 255;

/** A request as the guard sees it: `target` is the path and query as received. */
export interface GuardRequest {
  method: string;
  target: string;
  /** A header's value (case-insensitive name), or `null`. */
  header(name: string): string | null;
  body: Uint8Array;
}

/** A response: status, headers (name, value) in order, body bytes. */
export interface GuardResponse {
  status: number;
  headers: Array<[string, string]>;
  body: Uint8Array;
}

/**
 * Thrown by a handler that failed before it changed anything: the record
 * says `failed_no_effect`, and the same request may run again. Any other
 * error (and a response of status 500 or more) leaves the record
 * `indeterminate`: the receiver does not know its own effect, so a retry
 * under the key is refused.
 */
export class NoEffectError extends Error {
  constructor(message = "failed before any effect", options?: { cause?: unknown }) {
    super(message, options);
    this.name = "NoEffectError";
  }
}

/** The guard's options (the same as the Python `IdempotencyGuard`'s). */
export interface GuardOptions {
  /** The register store the records live in. */
  store: FleetStore;
  /** The core's retention: `{ttl_ms, poll_after_ms, expired: "proceed" | "reject"}`, explicit. */
  retention: Retention;
  /** Scope the key by tenant and operation (both or neither). */
  tenant?: string;
  operation?: string;
  /** A request without the key is `400` (default); `false`: it runs unguarded. */
  required?: boolean;
  /** The header carrying the key (default `idempotency-key`). */
  header?: string;
  /** The register key prefix (default `idempotency/`). */
  prefix?: string;
  /** The response headers kept for a replay (lower case). */
  keepHeaders?: readonly string[];
  /** A larger body is recorded by digest only; its replay is `409` `idempotency_response_not_kept`. */
  maxResponseBytes?: number;
  /** The wall clock, Unix ms. */
  nowMs?: () => number;
  /** How many times a lost compare-and-set is read and claimed again before `503` `idempotency_store_contended`. */
  casAttempts?: number;
}

/** A claim that won: run the handler, then `finish` or `fail` with this ticket. */
export interface Ticket {
  key: string;
  generation: number;
  record: IdempotencyRecord;
}

/** What `begin` says: an answer to send now, a ticket to run under, or run unguarded (no key, none required). */
export type Decision = { kind: "answer"; response: GuardResponse } | { kind: "admitted"; ticket: Ticket } | { kind: "unguarded" };

const encoder = new TextEncoder();

/** The core's receiver functions (the `Idempotency-Key` rule and the two digests). */
interface ReceiverBindings {
  check_idempotency_header(raw: string): void;
  http_request_sha256(method: string, target: string, body: Uint8Array): string;
  http_response_sha256(status: number, headers: string, body: Uint8Array): string;
}

const receiverCall = <T>(f: (b: ReceiverBindings) => T): T => call((b: RawBindings) => f(b as unknown as ReceiverBindings));

/**
 * Throws `IdempotencyError` (`idempotency_key_invalid`) unless `raw` is an
 * `Idempotency-Key` header value the guard takes: 1 to `MAX_KEY_LENGTH`
 * printable ASCII characters (the core's rule).
 */
export function checkIdempotencyHeader(raw: string): void {
  receiverCall((b) => b.check_idempotency_header(raw));
}

/**
 * The request digest a claim compares: SHA-256 of the canonical JSON of
 * `{body_sha256, method, schema: "retryledger.http_request.v1", target}`
 * (the method in upper case, the path and query as received, the SHA-256 of
 * the body's bytes). Headers are not part of it.
 */
export function httpRequestSha256(method: string, target: string, body: Uint8Array): string {
  return receiverCall((b) => b.http_request_sha256(method, target, body));
}

/**
 * The result digest a record holds: SHA-256 of the canonical JSON of
 * `{body_sha256, headers, schema: "retryledger.http_response.v1", status}`,
 * the kept headers as `[name, value]` pairs (lower-case names). A response
 * too large to keep is still recorded by it. Throws `DecodeError`
 * (`invalid_value`) for a status outside 100..999 or a name not in lower case.
 */
export function httpResponseSha256(status: number, headers: ReadonlyArray<readonly [string, string]>, body: Uint8Array): string {
  return receiverCall((b) => b.http_response_sha256(status, JSON.stringify(headers), body));
}

function coded(status: number, code: string, message: string, headers: Array<[string, string]> = []): GuardResponse {
  return { status, headers: [["content-type", "application/json"], ...headers], body: encoder.encode(JSON.stringify({ code, message })) };
}

function base64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function unbase64(text: string): Uint8Array {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

class Lost extends Error {}

/** Guards an endpoint by `Idempotency-Key`, whatever the framework (see the module's documentation). */
export class IdempotencyGuard {
  readonly store: FleetStore;
  readonly retention: Retention;
  readonly required: boolean;
  readonly header: string;
  readonly prefix: string;
  readonly keepHeaders: readonly string[];
  readonly maxResponseBytes: number;
  readonly casAttempts: number;
  readonly #scope: { tenant: string; operation: string } | undefined;
  readonly #now: () => number;

  constructor(options: GuardOptions) {
    if ((options.tenant === undefined) !== (options.operation === undefined)) {
      throw new TypeError("tenant and operation scope a key together: give both or neither");
    }
    this.store = options.store;
    this.retention = options.retention;
    this.required = options.required ?? true;
    this.header = (options.header ?? "idempotency-key").toLowerCase();
    this.prefix = options.prefix ?? "idempotency/";
    this.keepHeaders = (options.keepHeaders ?? DEFAULT_KEEP_HEADERS).map((h) => h.toLowerCase());
    this.maxResponseBytes = options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
    this.casAttempts = options.casAttempts ?? 4;
    if (!(this.casAttempts >= 1)) throw new TypeError("casAttempts must be at least 1");
    this.#scope = options.tenant !== undefined && options.operation !== undefined ? { tenant: options.tenant, operation: options.operation } : undefined;
    this.#now = options.nowMs ?? (() => Date.now());
  }

  /** The scoped digest of a raw key (the record's key). */
  keySha256(key: string): string {
    return idempotencyKeySha256(key, this.#scope);
  }

  /** The register that holds the record of a scoped key digest. */
  recordKey(keySha256: string): string {
    return `${this.prefix}${keySha256}`;
  }

  /** The register that holds the stored response of a scoped key digest. */
  responseKey(keySha256: string): string {
    return `${this.prefix}${keySha256}/response`;
  }

  /** Claim the request's key. */
  async begin(request: GuardRequest): Promise<Decision> {
    const raw = request.header(this.header);
    if (raw === null) {
      if (this.required) return { kind: "answer", response: coded(400, "idempotency_key_missing", `the ${this.header} header is required`) };
      return { kind: "unguarded" };
    }
    try {
      checkIdempotencyHeader(raw);
    } catch (e) {
      if (e instanceof RetryledgerError) return { kind: "answer", response: coded(400, e.code, e.message) };
      throw e;
    }
    const claimRequest = {
      idempotency_key_sha256: this.keySha256(raw),
      request_sha256: httpRequestSha256(request.method, request.target, request.body),
    };
    try {
      return await this.#claim(claimRequest);
    } catch (e) {
      if (e instanceof StoreUnavailableError) {
        return { kind: "answer", response: coded(503, "store_unavailable", `the idempotency store is unavailable: ${e.message}`) };
      }
      if (e instanceof RetryledgerError) {
        return { kind: "answer", response: coded(500, e.code, `the stored idempotency record is refused: ${e.message}`) };
      }
      throw e;
    }
  }

  async #claim(request: { idempotency_key_sha256: string; request_sha256: string }): Promise<Decision> {
    const key = this.recordKey(request.idempotency_key_sha256);
    for (let i = 0; i < this.casAttempts; i++) {
      const { document, generation } = await this.store.get(key);
      const claim = idempotencyClaim(this.retention, document as IdempotencyRecord | null, request, this.#now());
      switch (claim.kind) {
        case "proceed": {
          const w = await this.store.compareAndSet(key, generation, claim.record as unknown as StoreDocument);
          if (w.ok) return { kind: "admitted", ticket: { key, generation: generation + 1, record: claim.record } };
          continue; // another request won: answer as the claim on the fresh record says
        }
        case "replay":
          return { kind: "answer", response: await this.#replay(request.idempotency_key_sha256, claim.result_sha256) };
        case "poll": {
          const seconds = Math.max(1, Math.ceil(claim.retry_after_ms / 1000));
          return {
            kind: "answer",
            response: coded(409, "idempotency_in_progress", "a request under this key is in progress", [["retry-after", String(seconds)]]),
          };
        }
        case "rejected":
          if (claim.reason === "key_reuse") {
            return { kind: "answer", response: coded(422, "idempotency_key_reuse", "the key was used with another request") };
          }
          if (claim.reason === "key_expired") {
            return { kind: "answer", response: coded(422, "idempotency_key_expired", "the key's record expired and the key stays spent") };
          }
          return {
            kind: "answer",
            response: coded(409, "idempotency_indeterminate", "the request under this key ended without knowing its effect; it is not run again"),
          };
      }
    }
    return { kind: "answer", response: coded(503, "idempotency_store_contended", "the record kept changing under the claim", [["retry-after", "1"]]) };
  }

  async #replay(keySha256: string, resultSha256: string): Promise<GuardResponse> {
    const { document } = await this.store.get(this.responseKey(keySha256));
    const replayed: [string, string] = ["idempotent-replayed", "true"];
    if (document !== null && document.schema === RESPONSE_SCHEMA) {
      const stored = document as { body_base64: string; headers: Array<[string, string]>; status: number };
      const body = unbase64(stored.body_base64);
      if (httpResponseSha256(stored.status, stored.headers, body) === resultSha256) {
        return { status: stored.status, headers: [...stored.headers.map(([k, v]): [string, string] => [k, v]), replayed], body };
      }
    }
    return coded(409, "idempotency_response_not_kept", "the request under this key succeeded; its response was not kept (larger than the bound)", [
      replayed,
      ["idempotency-result-sha256", resultSha256],
    ]);
  }

  /**
   * Record the handler's response and return what to send: the response,
   * with `Idempotency-Record-Error: <code>` when the record could not be
   * written. A status of 500 or more is recorded `indeterminate` (not
   * replayed).
   */
  async finish(ticket: Ticket, response: GuardResponse): Promise<GuardResponse> {
    if (response.status >= 500) {
      const code = await this.fail(ticket, false);
      return code === null ? response : withHeader(response, ["idempotency-record-error", code]);
    }
    const kept = response.headers.filter(([k]) => this.keepHeaders.includes(k.toLowerCase())).map(([k, v]): [string, string] => [k.toLowerCase(), v]);
    const result = httpResponseSha256(response.status, kept, response.body);
    try {
      if (response.body.length <= this.maxResponseBytes) await this.#writeResponse(ticket, response, kept, result);
      await this.#complete(ticket, "succeeded", result);
    } catch (e) {
      if (e instanceof StoreUnavailableError) return withHeader(response, ["idempotency-record-error", "store_unavailable"]);
      if (e instanceof Lost) return withHeader(response, ["idempotency-record-error", "idempotency_record_lost"]);
      throw e;
    }
    return response;
  }

  /** Record a handler that failed: `failed_no_effect` when it says nothing happened, else `indeterminate`. An error code when the record could not be written, else `null`. */
  async fail(ticket: Ticket, noEffect: boolean): Promise<string | null> {
    try {
      await this.#complete(ticket, noEffect ? "failed_no_effect" : "indeterminate", undefined);
    } catch (e) {
      if (e instanceof StoreUnavailableError) return "store_unavailable";
      if (e instanceof Lost) return "idempotency_record_lost";
      throw e;
    }
    return null;
  }

  async #writeResponse(ticket: Ticket, response: GuardResponse, kept: Array<[string, string]>, result: string): Promise<void> {
    const document = { body_base64: base64(response.body), headers: kept, result_sha256: result, schema: RESPONSE_SCHEMA, status: response.status };
    const key = this.responseKey(ticket.record.idempotency_key_sha256);
    for (let i = 0; i < this.casAttempts; i++) {
      const { generation } = await this.store.get(key);
      if ((await this.store.compareAndSet(key, generation, document)).ok) return;
    }
    throw new Lost();
  }

  async #complete(ticket: Ticket, status: Completion["status"], result: string | undefined): Promise<void> {
    const completion: Completion = {
      idempotency_key_sha256: ticket.record.idempotency_key_sha256,
      request_sha256: ticket.record.request_sha256,
      status,
      ...(result === undefined ? {} : { result_sha256: result }),
    };
    const final = idempotencyComplete(this.retention, ticket.record, completion, this.#now());
    const w = await this.store.compareAndSet(ticket.key, ticket.generation, final as unknown as StoreDocument);
    if (!w.ok) throw new Lost(); // the record changed under the claim (it expired and was claimed again)
  }
}

function withHeader(response: GuardResponse, header: [string, string]): GuardResponse {
  return { ...response, headers: [...response.headers, header] };
}

const NULL_BODY = new Set([101, 204, 205, 304]);

/** A `GuardResponse` as a fetch `Response`. */
export function toFetchResponse(response: GuardResponse): Response {
  const headers = new Headers();
  for (const [k, v] of response.headers) headers.append(k, v);
  return new Response(NULL_BODY.has(response.status) ? null : new Uint8Array(response.body), { status: response.status, headers });
}

/** The guard's options for a fetch-style handler: a guard, or the options to make one. */
export type FetchGuardOptions = GuardOptions | { guard: IdempotencyGuard };

/**
 * Wrap a fetch-style handler `(Request) => Promise<Response>` (Deno, Bun,
 * workers, Hono, Next.js route handlers, …). The request body is read
 * before the claim and handed on as a fresh `Request`; the response is
 * buffered and recorded before it is sent. A handler that throws records
 * `indeterminate` (`failed_no_effect` for `NoEffectError`) and the error
 * propagates.
 */
export function guardIdempotency(
  handler: (request: Request) => Response | Promise<Response>,
  options: FetchGuardOptions,
): (request: Request) => Promise<Response> {
  const guard = "guard" in options ? options.guard : new IdempotencyGuard(options);
  return async (request: Request): Promise<Response> => {
    const body = new Uint8Array(await request.arrayBuffer());
    const url = new URL(request.url);
    const decision = await guard.begin({
      method: request.method,
      target: url.pathname + url.search,
      header: (name) => request.headers.get(name),
      body,
    });
    if (decision.kind === "answer") return toFetchResponse(decision.response);
    const init: RequestInit = { method: request.method, headers: request.headers, signal: request.signal };
    if (request.method !== "GET" && request.method !== "HEAD") init.body = body;
    const fresh = new Request(request.url, init);
    if (decision.kind === "unguarded") return handler(fresh);
    let response: Response;
    try {
      response = await handler(fresh);
    } catch (e) {
      await guard.fail(decision.ticket, e instanceof NoEffectError);
      throw e;
    }
    const headers: Array<[string, string]> = [];
    response.headers.forEach((v, k) => headers.push([k, v]));
    const captured: GuardResponse = { status: response.status, headers, body: new Uint8Array(await response.arrayBuffer()) };
    return toFetchResponse(await guard.finish(decision.ticket, captured));
  };
}
