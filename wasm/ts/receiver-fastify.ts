/**
 * `retryledger/receiver/fastify`: the receiver's guard as a Fastify plugin
 * (docs/RECEIVER.md). Fastify itself is an optional peer dependency: the
 * plugin only uses its hooks.
 *
 * ```ts
 * await app.register(idempotencyFastify, { store, retention });
 * ```
 *
 * Hooks: `preParsing` keeps the raw body's bytes (the digest covers them;
 * the parser gets the same bytes), `preHandler` claims the key (and
 * answers at once when the claim says so), `onError` marks a thrown error
 * (`NoEffectError`: `failed_no_effect`, any other: `indeterminate`), and
 * `onSend` records the response before it goes out. The plugin applies to
 * the instance it is registered on and its children (it skips Fastify's
 * encapsulation). `methods` (default POST, PUT, PATCH, DELETE) are guarded.
 */

import "./index.js";

import { Readable } from "node:stream";

import { IdempotencyGuard, NoEffectError, type GuardOptions, type Ticket } from "./receiver.js";

export { IdempotencyGuard, NoEffectError, type GuardOptions } from "./receiver.js";

/** The plugin's options: a guard (or the options to make one), and the methods it guards. */
export type FastifyGuardOptions = (GuardOptions | { guard: IdempotencyGuard }) & { methods?: readonly string[] };

/** What the plugin uses of a Fastify request. */
interface RequestLike {
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
}

/** What the plugin uses of a Fastify reply. */
interface ReplyLike {
  statusCode: number;
  code(status: number): ReplyLike;
  header(name: string, value: string): ReplyLike;
  getHeaders(): Record<string, unknown>;
  send(payload?: unknown): ReplyLike;
}

/** What the plugin uses of a Fastify instance. */
interface InstanceLike {
  // A method (not a property) so Fastify's overloaded, typed `addHook` is accepted.
  addHook(name: string, hook: (...args: any[]) => unknown): unknown; // eslint-disable-line @typescript-eslint/no-explicit-any
}

interface State {
  body?: Uint8Array;
  ticket?: Ticket | undefined;
  failed?: { noEffect: boolean };
}

const STATE = Symbol.for("retryledger.receiver.fastify");

function state(request: RequestLike): State {
  const r = request as RequestLike & { [STATE]?: State };
  return (r[STATE] ??= {});
}

async function drain(stream: AsyncIterable<unknown>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk)));
  return Buffer.concat(chunks);
}

/** The Fastify plugin: register it with the guard's options. */
export async function idempotencyFastify(instance: InstanceLike, options: FastifyGuardOptions): Promise<void> {
  const guard = "guard" in options ? options.guard : new IdempotencyGuard(options);
  const methods = new Set((options.methods ?? ["POST", "PUT", "PATCH", "DELETE"]).map((m) => m.toUpperCase()));
  const guarded = (request: RequestLike): boolean => methods.has(request.method.toUpperCase());

  instance.addHook("preParsing", async (request: RequestLike, _reply: ReplyLike, payload: Readable & { receivedEncodedLength?: number }) => {
    if (!guarded(request)) return payload;
    const body = await drain(payload);
    state(request).body = new Uint8Array(body);
    const again = Readable.from([body]) as Readable & { receivedEncodedLength?: number };
    again.receivedEncodedLength = body.length;
    return again;
  });

  instance.addHook("preHandler", async (request: RequestLike, reply: ReplyLike) => {
    if (!guarded(request)) return;
    const s = state(request);
    const decision = await guard.begin({
      method: request.method,
      target: request.url,
      header: (name) => {
        const v = request.headers[name.toLowerCase()];
        return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
      },
      body: s.body ?? new Uint8Array(),
    });
    if (decision.kind === "answer") {
      reply.code(decision.response.status);
      for (const [k, v] of decision.response.headers) reply.header(k, v);
      reply.send(Buffer.from(decision.response.body));
      return reply;
    }
    if (decision.kind === "admitted") s.ticket = decision.ticket;
    return;
  });

  instance.addHook("onError", async (request: RequestLike, _reply: ReplyLike, error: unknown) => {
    const s = state(request);
    if (s.ticket !== undefined) s.failed = { noEffect: error instanceof NoEffectError };
  });

  instance.addHook("onSend", async (request: RequestLike, reply: ReplyLike, payload: unknown) => {
    const s = state(request);
    const ticket = s.ticket;
    if (ticket === undefined) return payload;
    s.ticket = undefined;
    if (s.failed !== undefined) {
      const code = await guard.fail(ticket, s.failed.noEffect);
      if (code !== null) reply.header("idempotency-record-error", code);
      return payload;
    }
    const body =
      payload === null || payload === undefined
        ? Buffer.alloc(0)
        : typeof payload === "string"
          ? Buffer.from(payload)
          : Buffer.isBuffer(payload)
            ? payload
            : await drain(payload as AsyncIterable<unknown>);
    const headers: Array<[string, string]> = [];
    for (const [k, v] of Object.entries(reply.getHeaders())) {
      if (v === undefined || k === "content-length") continue;
      for (const one of Array.isArray(v) ? v : [v]) headers.push([k, String(one)]);
    }
    const done = await guard.finish(ticket, { status: reply.statusCode, headers, body: new Uint8Array(body) });
    for (const [k, v] of done.headers.slice(headers.length)) reply.header(k, v);
    return body;
  });
}

// Register on the instance itself, not an encapsulated child (what the fastify-plugin package does).
(idempotencyFastify as unknown as Record<symbol, unknown>)[Symbol.for("skip-override")] = true;
