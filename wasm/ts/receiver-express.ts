/**
 * `retryledger/receiver/express`: the receiver's guard as Express middleware
 * (docs/RECEIVER.md). Express itself is an optional peer dependency: this
 * module only touches Node's own request and response objects.
 *
 * ```ts
 * app.post("/orders", idempotencyExpress({ store, retention }), createOrder);
 * app.use(idempotencyExpressErrors()); // after the routes: a thrown NoEffectError records failed_no_effect
 * ```
 *
 * The body: `req.rawBody` (a Buffer, e.g. set by `express.json({verify})`),
 * else `req.body` when it is a Buffer (`express.raw()`), else the guard
 * reads the request stream itself and sets `req.body` to the Buffer. A body
 * already parsed into an object without `rawBody` cannot be digested: `500`
 * `idempotency_body_unavailable`, and the handler does not run.
 */

import "./index.js";

import type { IncomingMessage, ServerResponse } from "node:http";

import { IdempotencyGuard, NoEffectError, type GuardOptions, type GuardResponse, type Ticket } from "./receiver.js";

export { IdempotencyGuard, NoEffectError, type GuardOptions } from "./receiver.js";

type Next = (err?: unknown) => void;
type Request = IncomingMessage & { originalUrl?: string; body?: unknown; rawBody?: unknown };

const TICKET = Symbol.for("retryledger.receiver.ticket");
const FAILED = Symbol.for("retryledger.receiver.failed");

interface Marked {
  [TICKET]?: Ticket;
  [FAILED]?: { noEffect: boolean };
}

async function readBody(req: Request): Promise<Uint8Array | null> {
  if (Buffer.isBuffer(req.rawBody)) return new Uint8Array(req.rawBody);
  if (Buffer.isBuffer(req.body)) return new Uint8Array(req.body);
  if (req.body !== undefined && req.body !== null && !(typeof req.body === "object" && Object.keys(req.body).length === 0)) return null;
  if (req.readableEnded) return null;
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk)));
  const body = Buffer.concat(chunks);
  req.body = body;
  return new Uint8Array(body);
}

function send(res: ServerResponse, response: GuardResponse, end: (chunk: Uint8Array) => void): void {
  res.statusCode = response.status;
  for (const [k, v] of response.headers) res.setHeader(k, v);
  res.setHeader("content-length", String(response.body.length));
  end(response.body);
}

/** Express middleware guarding the routes after it by `Idempotency-Key`. */
export function idempotencyExpress(
  options: GuardOptions | { guard: IdempotencyGuard },
): (req: IncomingMessage, res: ServerResponse, next: Next) => void {
  const guard = "guard" in options ? options.guard : new IdempotencyGuard(options);
  return (request, res, next) => {
    const req = request as Request;
    void (async () => {
      const body = await readBody(req);
      if (body === null) {
        const message = "the request body was parsed before the guard without rawBody: it cannot be digested";
        const payload = new TextEncoder().encode(JSON.stringify({ code: "idempotency_body_unavailable", message }));
        send(res, { status: 500, headers: [["content-type", "application/json"]], body: payload }, (b) => res.end(b));
        return;
      }
      const decision = await guard.begin({
        method: req.method ?? "GET",
        target: req.originalUrl ?? req.url ?? "/",
        header: (name) => {
          const v = req.headers[name.toLowerCase()];
          return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
        },
        body,
      });
      if (decision.kind === "answer") {
        send(res, decision.response, (b) => res.end(b));
        return;
      }
      if (decision.kind === "unguarded") {
        next();
        return;
      }
      const ticket = decision.ticket;
      (req as Marked)[TICKET] = ticket;
      capture(res, async (status, headers, captured) => {
        const failed = (req as Marked)[FAILED];
        if (failed !== undefined) {
          const code = await guard.fail(ticket, failed.noEffect);
          return code === null ? [] : [["idempotency-record-error", code]];
        }
        const done = await guard.finish(ticket, { status, headers, body: captured });
        return done.headers.slice(headers.length);
      });
      next();
    })().catch(next);
  };
}

/**
 * Error middleware, mounted after the routes: marks the guarded request's
 * failure (`failed_no_effect` for a `NoEffectError`, else `indeterminate`)
 * before Express answers it, then hands the error on.
 */
export function idempotencyExpressErrors(): (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void {
  return (err, req, _res, next) => {
    const marked = req as Marked;
    if (marked[TICKET] !== undefined) marked[FAILED] = { noEffect: err instanceof NoEffectError };
    next(err);
  };
}

/**
 * Buffer what the route writes; when it ends, `record` runs first (its
 * extra headers are added), then the response goes out in one piece.
 */
function capture(
  res: ServerResponse,
  record: (status: number, headers: Array<[string, string]>, body: Uint8Array) => Promise<Array<[string, string]>>,
): void {
  const chunks: Buffer[] = [];
  const originalEnd = res.end.bind(res);
  const originalWriteHead = res.writeHead.bind(res);
  const toBuffer = (chunk: unknown, encoding?: unknown): Buffer =>
    Buffer.isBuffer(chunk)
      ? chunk
      : chunk instanceof Uint8Array
        ? Buffer.from(chunk)
        : Buffer.from(String(chunk), typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
  res.writeHead = ((status: number, ...rest: unknown[]) => {
    res.statusCode = status;
    const headers = rest.find((x) => typeof x === "object" && x !== null);
    if (headers !== undefined) {
      for (const [k, v] of Object.entries(headers as Record<string, string | string[] | number>)) res.setHeader(k, v);
    }
    return res;
  }) as typeof res.writeHead;
  res.write = ((chunk: unknown, encoding?: unknown, cb?: unknown) => {
    chunks.push(toBuffer(chunk, encoding));
    const callback = typeof encoding === "function" ? encoding : cb;
    if (typeof callback === "function") queueMicrotask(() => (callback as () => void)());
    return true;
  }) as typeof res.write;
  res.end = ((chunk?: unknown, encoding?: unknown, cb?: unknown) => {
    if (chunk !== undefined && chunk !== null && typeof chunk !== "function") chunks.push(toBuffer(chunk, encoding));
    const body = Buffer.concat(chunks);
    const headers: Array<[string, string]> = [];
    for (const [k, v] of Object.entries(res.getHeaders())) {
      if (v === undefined) continue;
      for (const one of Array.isArray(v) ? v : [v]) headers.push([k, String(one)]);
    }
    void record(res.statusCode, headers, new Uint8Array(body))
      .catch((e: unknown): Array<[string, string]> => {
        const code = typeof e === "object" && e !== null && typeof (e as { code?: unknown }).code === "string" ? (e as { code: string }).code : "internal";
        return [["idempotency-record-error", code]];
      })
      .then((extra) => {
        for (const [k, v] of extra) res.setHeader(k, v);
        res.writeHead = originalWriteHead;
        res.setHeader("content-length", String(body.length));
        const callback = [chunk, encoding, cb].find((x) => typeof x === "function") as (() => void) | undefined;
        if (callback === undefined) originalEnd(body);
        else originalEnd(body, callback);
      });
    return res;
  }) as typeof res.end;
}
