// The Temporal tests' attempt: a real HTTP call (fetch) to a counting
// loopback server. node --test imports this module too: it only defines functions.
import { attemptActivity } from "../dist/temporal-worker.js";

/** An error status as the drivers read it: status, headers, body. */
export class HttpStatusError extends Error {
  /** @param {number} status @param {Headers} headers @param {string} body */
  constructor(status, headers, body) {
    super(`HTTP ${status}`);
    this.name = "HttpStatusError";
    this.status = status;
    this.headers = headers;
    this.body = body;
  }
}

/**
 * One attempt: POST to the route's path with the idempotency key. A worker
 * started with RETRYLEDGER_TEST_HANG_ORDINAL=n hangs in attempt n before
 * sending anything (a worker to kill in the middle of one).
 * @param {import("../dist/index.js").Step} step @param {string} base
 */
export async function callLoopback(step, base) {
  if (process.env.RETRYLEDGER_TEST_HANG_ORDINAL === String(step.ordinal)) await new Promise((r) => setTimeout(r, 600_000));
  const res = await fetch(`${base}/${step.routeId}`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": step.idempotencyKey },
    body: JSON.stringify({ ordinal: step.ordinal }),
  });
  const text = await res.text();
  if (!res.ok) throw new HttpStatusError(res.status, res.headers, text);
  return JSON.parse(text);
}

export const activities = {
  loopbackAttempt: attemptActivity((step, _signal, /** @type {string} */ base) => callLoopback(step, base)),
};
