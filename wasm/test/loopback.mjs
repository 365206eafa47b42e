// Shared by the integration tests: a scripted HTTP server on 127.0.0.1 (a
// real node:http server on an ephemeral port) that records every request it
// receives, and the address of a port where nothing listens.
import http from "node:http";

/**
 * @typedef {{status: number, headers?: Record<string, string>, body?: unknown}} Reply
 * @typedef {{route: string, path: string, arrivedAt: number, respondedAt: number, status: number, idempotencyKey: string | undefined, retryAfterMs: number, body: string}} Seen
 */

/** The wait a reply asks for, in ms: `retry-after-ms`, else `retry-after` in seconds, else 0. @param {Record<string, string>} headers */
function hintMs(headers) {
  const ms = headers["retry-after-ms"];
  if (ms !== undefined) return Number(ms);
  const s = headers["retry-after"];
  return s === undefined ? 0 : Number(s) * 1000;
}

/**
 * A server that answers each route (the first path segment) from its script,
 * in order; the last reply repeats. Routes not in the script get a 404.
 * @param {Record<string, Reply[]>} script
 */
export async function scriptedServer(script) {
  /** @type {Seen[]} */
  const seen = [];
  /** @type {Map<string, number>} */
  const counts = new Map();
  const server = http.createServer((req, res) => {
    const arrivedAt = performance.now();
    let body = "";
    req.on("data", (chunk) => {
      body += chunk;
    });
    req.on("end", () => {
      const path = req.url ?? "/";
      const route = path.split("/")[1] ?? "";
      const replies = script[route];
      const n = counts.get(route) ?? 0;
      counts.set(route, n + 1);
      /** @type {Reply} */
      const reply = replies === undefined || replies.length === 0 ? { status: 404, body: { error: "no such route" } } : /** @type {Reply} */ (replies[Math.min(n, replies.length - 1)]);
      const headers = { "content-type": "application/json", ...(reply.headers ?? {}) };
      const key = req.headers["idempotency-key"];
      // Stamped before sending: the client cannot see the response earlier.
      const respondedAt = performance.now();
      seen.push({
        route,
        path,
        arrivedAt,
        respondedAt,
        status: reply.status,
        idempotencyKey: Array.isArray(key) ? key.join(",") : key,
        retryAfterMs: hintMs(reply.headers ?? {}),
        body,
      });
      res.writeHead(reply.status, headers);
      res.end(JSON.stringify(reply.body ?? {}));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  const base = `http://127.0.0.1:${address.port}`;
  return {
    seen,
    base,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve(undefined));
        server.closeAllConnections();
      }),
  };
}

/** The base URL of a loopback port that was just closed: connecting to it is refused. */
export async function closedPort() {
  const server = await scriptedServer({});
  await server.close();
  return server.base;
}

/**
 * Asserts that every request came no earlier after the previous response than
 * that response's Retry-After hint; returns the gaps in ms.
 * @param {Seen[]} seen
 * @param {(ok: boolean, message: string) => void} check
 */
export function gapsAfterHints(seen, check) {
  /** @type {number[]} */
  const gaps = [];
  for (let i = 1; i < seen.length; i += 1) {
    const prev = /** @type {Seen} */ (seen[i - 1]);
    const cur = /** @type {Seen} */ (seen[i]);
    const gap = cur.arrivedAt - prev.respondedAt;
    check(gap >= prev.retryAfterMs, `request ${i + 1} came ${gap.toFixed(1)} ms after a Retry-After of ${prev.retryAfterMs} ms`);
    gaps.push(gap);
  }
  return gaps;
}
