// runHedged against a real loopback HTTP server whose latency has a heavy
// tail: every fifth request on the primary route sleeps SLOW_MS, the others
// answer in a few ms; the fallback (the hedge route, independent capacity)
// answers in FALLBACK_MS. The same calls run without hedging (runWithPolicy,
// the policy without its hedge section) and with it. Checked: the run
// clock's p99 falls below the tail the server imposes on every unhedged slow
// call; physical attempts (the server's count) stay within 1 + max_hedges
// per call and match the receipts' counts; every cancelled loser is charged
// its route's reserve (cancelled_cost "reserve") and its connection was
// closed before the server answered.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import * as rl from "../dist/index.js";
import { KEY, referencePolicy } from "./helpers.mjs";

const SLOW_MS = 400;
const FAST_MS = 4;
const FALLBACK_MS = 12;
const HEDGE_DELAY_MS = 50;
const CALLS = 30;

/** A loopback server with a heavy-tailed primary route. */
async function tailServer() {
  /** @type {{route: string, n: number, key: string | undefined, aborted: boolean, answered: boolean}[]} */
  const log = [];
  /** @type {Record<string, number>} */
  const counts = {};
  const server = http.createServer((req, res) => {
    const route = (req.url ?? "/").split("/")[1] ?? "";
    const n = counts[route] ?? 0;
    counts[route] = n + 1;
    const entry = { route, n, key: /** @type {string | undefined} */ (req.headers["idempotency-key"]), aborted: false, answered: false };
    log.push(entry);
    const delay = route === "private-primary" ? (n % 5 === 4 ? SLOW_MS : FAST_MS) : FALLBACK_MS;
    const timer = setTimeout(() => {
      entry.answered = true;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ route, n }));
    }, delay);
    res.on("close", () => {
      if (!entry.answered) {
        clearTimeout(timer);
        entry.aborted = true;
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return { log, port, close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r(undefined)); }) };
}

function hedgedPolicy() {
  const p = referencePolicy();
  p.max_total_attempts = 6;
  for (const r of p.routes) r.max_attempts = 3;
  /** @type {import("../dist/index.js").HedgeSection} */
  const section = {
    cancelled_cost: "reserve",
    cost_share_percent: 50,
    delay_ms: HEDGE_DELAY_MS,
    effects: "none",
    max_hedges: 1,
    routes: ["external-fallback"],
  };
  p.hedge = section;
  return p;
}

/** @param {number[]} xs @param {number} q */
function quantile(xs, q) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
}

test("hedging cuts the p99 of a heavy-tailed server, within the attempt bound, losers charged and closed", async () => {
  const srv = await tailServer();
  try {
    const hedged = hedgedPolicy();
    const plain = hedgedPolicy();
    delete plain.hedge;
    const reserve = Object.fromEntries(hedged.routes.map((r) => [r.route_id, r.reserve_cost]));
    /** @param {string} route @param {AbortSignal} signal */
    const get = async (route, signal) => {
      const r = await fetch(`http://127.0.0.1:${srv.port}/${route}`, { signal, headers: { "idempotency-key": KEY } });
      return /** @type {{route: string, n: number}} */ (await r.json());
    };

    const plainLatency = [];
    for (let i = 0; i < CALLS; i++) {
      const run = await rl.runWithPolicy(plain, (step, signal) => get(step.routeId, signal), { idempotencyKey: KEY });
      assert.equal(run.receipt.terminal, "completed");
      plainLatency.push(run.receipt.finished_at_ms);
    }
    const plainRequests = srv.log.length;
    assert.equal(plainRequests, CALLS, "without hedging, one request per call");

    const hedgedLatency = [];
    let attempts = 0;
    let cancelledLosers = 0;
    for (let i = 0; i < CALLS; i++) {
      const run = await rl.runHedged(
        hedged,
        (a) => {
          assert.equal(a.idempotencyKey, KEY);
          return get(a.routeId, a.signal);
        },
        { idempotencyKey: KEY },
      );
      assert.equal(run.terminal, "completed");
      const receipt = run.receipt;
      const summary = receipt.hedge;
      assert.ok(summary !== undefined);
      // The value returned is the winner's.
      const winner = run.bundle.attempts.attempts.find((a) => a.ordinal === summary.winner_ordinal);
      assert.ok(winner !== undefined);
      assert.equal(run.result?.route, winner.route_id);
      // Physical attempts: within the bound, as many as dispatched.
      assert.ok(receipt.attempt_count <= 1 + (hedged.hedge?.max_hedges ?? 0));
      assert.equal(receipt.attempt_count, run.attempts);
      attempts += receipt.attempt_count;
      // A hedge never starts before its threshold.
      const [lead, hedge] = receipt.schedule;
      if (lead !== undefined && hedge !== undefined) assert.ok(hedge.started_at_ms - lead.started_at_ms >= HEDGE_DELAY_MS);
      // Losers are charged as the policy says; every cost is in the total.
      for (const l of summary.losers) {
        const a = run.bundle.attempts.attempts.find((x) => x.ordinal === l.ordinal);
        assert.ok(a !== undefined);
        if (l.reason === "cancelled") {
          assert.equal(l.cost, reserve[a.route_id]);
          cancelledLosers += 1;
        }
      }
      assert.equal(summary.loser_cost, summary.losers.reduce((s, l) => s + l.cost, 0));
      assert.equal(receipt.total_cost, receipt.schedule.reduce((s, e) => s + e.cost, 0));
      assert.deepEqual(rl.verifyBundle(run.bundle_json).kind, "verified");
      hedgedLatency.push(receipt.finished_at_ms);
    }
    const hedgedLog = srv.log.slice(plainRequests);
    // Every request the server saw is an attempt a receipt counts; a hedge
    // cancelled before its request went out is counted (and charged) but unseen.
    assert.ok(hedgedLog.length <= attempts && hedgedLog.length >= attempts - cancelledLosers);
    assert.ok(hedgedLog.every((e) => e.key === KEY), "every attempt carried the same idempotency key");
    const slowLeads = hedgedLog.filter((e) => e.route === "private-primary" && e.n % 5 === 4).length;
    assert.ok(slowLeads > 0);
    assert.ok(cancelledLosers >= slowLeads, "every slow lead lost to its hedge and was cancelled");
    // The server learns of the last abort a moment after the client: wait for its close events.
    for (let i = 0; i < 200 && hedgedLog.filter((e) => e.aborted).length < slowLeads; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    const aborted = hedgedLog.filter((e) => e.aborted).length;
    assert.ok(aborted >= slowLeads && aborted <= cancelledLosers, `server saw ${aborted} closed, ${cancelledLosers} cancelled`);
    // The tail falls: every unhedged slow call waited the server's SLOW_MS,
    // while the hedged calls' p99 is below the plain calls' on the same draws
    // (how far below is the bench's figure: a shared machine may stall a call).
    const plainP99 = quantile(plainLatency, 0.99) ?? 0;
    assert.ok(plainP99 >= SLOW_MS);
    const p99 = quantile(hedgedLatency, 0.99) ?? Infinity;
    assert.ok(p99 < plainP99, `hedged p99 ${p99} ms, plain ${plainP99} ms`);
  } finally {
    await srv.close();
  }
});

test("runHedged refuses a key whose digest is not the policy's, before any dispatch", async () => {
  let calls = 0;
  await assert.rejects(
    rl.runHedged(hedgedPolicy(), async () => { calls += 1; }, { idempotencyKey: "another key" }),
    (e) => e instanceof rl.DriftError && e.code === "idempotency_key_drift",
  );
  assert.equal(calls, 0);
});

test("a hedge policy with external effects is refused before any dispatch", () => {
  const p = hedgedPolicy();
  if (p.hedge !== undefined) p.hedge.effects = "external";
  assert.throws(() => new rl.HedgeSession(p), (e) => e instanceof rl.PolicyError && e.code === "hedge_external_effects");
});

test("a lead that ignores its AbortSignal cannot hold the run: it is reported cancelled and what it returns later is dropped", async () => {
  const p = hedgedPolicy();
  if (p.hedge !== undefined) p.hedge.delay_ms = 20;
  /** @type {(v: string) => void} */
  let releaseLead = () => {};
  const run = await rl.runHedged(
    p,
    (a) =>
      a.hedges === undefined
        ? new Promise((resolve) => {
            releaseLead = resolve;
          })
        : Promise.resolve(`hedge of ${a.hedges}`),
    { idempotencyKey: KEY },
  );
  assert.equal(run.terminal, "completed");
  assert.equal(run.result, "hedge of 1");
  assert.deepEqual(run.receipt.hedge?.losers.map((l) => [l.ordinal, l.reason]), [[1, "cancelled"]]);
  releaseLead("too late");
  assert.equal(rl.verifyBundle(run.bundle_json).kind, "verified");
});
