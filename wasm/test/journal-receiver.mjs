// A fake receiver for the journal crash tests: a loopback HTTP server that
// records every attempt it receives by idempotency key and ordinal, answers it
// by the run's script, and answers reconciliation by what it recorded (the
// same as python/tests/journal_receiver.py):
//
//   POST /attempt (Idempotency-Key, X-Run, X-Ordinal, X-Route, X-Route-Ordinal)
//       -> the script's status for (route, route ordinal): 200, 429 or 503
//   GET /status?run=..&ordinal=.. (Idempotency-Key)
//       -> {"answer"}: an attempt served with 200 is `in_progress` at the first
//          question, then `succeeded`; one refused or never received is
//          `failed_no_effect`
import http from "node:http";

/** @type {Record<string, Record<string, number>>} What the receiver answers, by "route#route ordinal". */
export const SCRIPTS = {
  // The reference run: the primary is rate limited, then unavailable; the fallback serves.
  reference: { "private-primary#1": 429, "private-primary#2": 503, "external-fallback#1": 200, "external-fallback#2": 200 },
  // A fallback run: the primary fails twice, the fallback once, then serves.
  fallback: { "private-primary#1": 503, "private-primary#2": 503, "external-fallback#1": 503, "external-fallback#2": 200 },
};

export class Receiver {
  constructor() {
    /** @type {Map<string, string>} run -> script */
    this.scripts = new Map();
    /** @type {Map<string, number[]>} "run|key|ordinal" -> statuses served */
    this.served = new Map();
    /** @type {Map<string, number>} "run|key|ordinal" -> questions asked */
    this.asked = new Map();
    this.server = http.createServer((req, res) => {
      const reply = (/** @type {number} */ status, /** @type {unknown} */ body) => {
        const data = JSON.stringify(body);
        res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(data) });
        res.end(data);
      };
      const h = (/** @type {string} */ name) => String(req.headers[name] ?? "");
      if (req.method === "POST") {
        req.resume();
        req.on("end", () => {
          const run = h("x-run");
          const k = `${run}|${h("idempotency-key")}|${h("x-ordinal")}`;
          const script = SCRIPTS[this.scripts.get(run) ?? ""] ?? {};
          const status = script[`${h("x-route")}#${h("x-route-ordinal")}`] ?? 500;
          this.served.set(k, [...(this.served.get(k) ?? []), status]);
          reply(status, { ordinal: Number(h("x-ordinal")) });
        });
        return;
      }
      const q = new URL(req.url ?? "/", "http://x").searchParams;
      const k = `${q.get("run")}|${h("idempotency-key")}|${q.get("ordinal")}`;
      const asked = (this.asked.get(k) ?? 0) + 1;
      this.asked.set(k, asked);
      const served = this.served.get(k) ?? [];
      const answer = served.length > 0 && served[served.length - 1] === 200 ? (asked === 1 ? "in_progress" : "succeeded") : "failed_no_effect";
      reply(200, { answer });
    });
    this.url = "";
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", () => resolve(undefined)));
    const address = /** @type {import("node:net").AddressInfo} */ (this.server.address());
    this.url = `http://127.0.0.1:${address.port}`;
    return this;
  }

  async stop() {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(() => resolve(undefined)));
  }

  /** ordinal -> statuses served, for one run. @param {string} run @returns {Map<number, number[]>} */
  received(run) {
    const out = new Map();
    for (const [k, v] of this.served) {
      const [r, , o] = k.split("|");
      if (r === run) out.set(Number(o), [...v]);
    }
    return out;
  }
}
