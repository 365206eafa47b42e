// Fleets across processes: two processes sharing a breaker through SQLite
// and through Redis; 8 processes through an outage of the primary route;
// a Redis server killed and restarted mid-run (fail_closed and fail_open).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import net from "node:net";
import path from "node:path";
import fs from "node:fs";
import os from "node:os";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import * as rl from "../dist/index.js";
import { RedisStore } from "../dist/stores/redis.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy, namespace, postgresGate, redisGate, tempDbPath } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const child = path.join(here, "fleet-child.mjs");
const run = promisify(execFile);
const redis = redisGate();
const postgres = postgresGate();

/**
 * @typedef {{routes: string[], runs: {terminal: string, routes_skipped: number, verdict: string}[], stats: import("../dist/index.js").FleetRunSummary}} ChildReport
 * @param {Record<string, unknown>} args @returns {Promise<ChildReport>}
 */
async function fleetProcess(args) {
  const { stdout } = await run(process.execPath, [child, JSON.stringify(args)], { cwd: path.dirname(here), timeout: 60000 });
  return JSON.parse(stdout);
}

/** @param {string} backend @param {string} target */
async function twoProcesses(backend, target) {
  const ns = namespace(`two-${backend}`);
  const a = await fleetProcess({ backend, target, namespace: ns, runs: 1 });
  assert.deepEqual(a.routes, ["private-primary", "private-primary", "external-fallback"]);
  assert.deepEqual(a.runs, [{ terminal: "completed", routes_skipped: 0, verdict: "verified" }]);
  // Another process, the primary healthy again: the breaker it reads is the first process's, open.
  const b = await fleetProcess({ backend, target, namespace: ns, runs: 1, primaryUp: true });
  assert.deepEqual(b.routes, ["external-fallback"]);
  assert.deepEqual(b.runs, [{ terminal: "completed", routes_skipped: 1, verdict: "verified" }]);
  // A third process under another namespace shares nothing.
  const c = await fleetProcess({ backend, target, namespace: namespace("other"), runs: 1, primaryUp: true });
  assert.deepEqual(c.routes, ["private-primary"]);
}

/** @param {string} backend @param {string} target */
async function outage(backend, target) {
  const ns = namespace(`outage-${backend}`);
  const reports = await Promise.all(Array.from({ length: 8 }, () => fleetProcess({ backend, target, namespace: ns, runs: 5 })));
  const runs = reports.flatMap((r) => r.runs);
  const routes = reports.flatMap((r) => r.routes);
  assert.equal(runs.length, 40);
  assert.ok(
    runs.every((r) => r.terminal === "completed" && r.verdict === "verified"),
    JSON.stringify(reports.map((r) => [r.runs, r.stats])),
  );
  const primary = routes.filter((r) => r === "private-primary").length;
  // Without the fleet: 80 primary calls (2 per run). With it: once 2 failures are
  // recorded the breaker is open for every process; before that each process had
  // at most one attempt in flight.
  assert.ok(primary <= 2 + 8, `primary dispatched ${primary} times across 8 processes`);
  assert.ok(runs.filter((r) => r.routes_skipped > 0).length >= 40 - 8, "nearly every run skipped the open primary");
  return primary;
}

test("two processes share a breaker through SQLite", async () => {
  await twoProcesses("sqlite", tempDbPath());
});

test("two processes share a breaker through Redis", { skip: redis.skip }, async () => {
  await twoProcesses("redis", /** @type {string} */ (redis.url));
});

test("two processes share a breaker through PostgreSQL", { skip: postgres.skip }, async () => {
  await twoProcesses("postgres", /** @type {string} */ (postgres.url));
});

test("8 processes through an outage of the primary, sharing SQLite: the primary called at most 10 times in 40 runs", async () => {
  await outage("sqlite", tempDbPath());
});

test("8 processes through an outage of the primary, sharing Redis: the primary called at most 10 times in 40 runs", { skip: redis.skip }, async () => {
  await outage("redis", /** @type {string} */ (redis.url));
});

test("8 processes through an outage of the primary, sharing PostgreSQL: the primary called at most 10 times in 40 runs", { skip: postgres.skip }, async () => {
  await outage("postgres", /** @type {string} */ (postgres.url));
});

/** A free loopback port. @returns {Promise<number>} */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const a = /** @type {net.AddressInfo} */ (srv.address());
      srv.close(() => resolve(a.port));
    });
  });
}

/**
 * A Redis server of this test's own on `port` (the shared one is left alone),
 * ready when the promise resolves.
 * @param {number} port @param {string} dir
 */
async function startRedis(port, dir) {
  const p = spawn("redis-server", ["--bind", "127.0.0.1", "--port", String(port), "--dir", dir, "--save", "", "--appendonly", "no"], {
    stdio: "ignore",
  });
  const exited = new Promise((resolve) => p.once("exit", resolve));
  for (let i = 0; i < 200; i++) {
    const up = await new Promise((resolve) => {
      const s = net.connect(port, "127.0.0.1");
      s.once("connect", () => {
        s.end();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
    if (up) break;
    await new Promise((r) => setTimeout(r, 25));
  }
  return {
    stop: async () => {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill("SIGKILL");
        await exited;
      }
    },
  };
}

test("Redis killed mid-run and restarted: fail_closed stops at the next admission; fail_open dispatches without the store, then uses it again", { skip: redis.skip, timeout: 60000 }, async () => {
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "retryledger-redis-"));
  let server = await startRedis(port, dir);
  const store = new RedisStore({ url: `redis://127.0.0.1:${port}`, commandTimeoutMs: 500, connectTimeoutMs: 500 });
  try {
    // fail_closed: attempt 1 admitted with the store; the server dies during it.
    const closedFleet = new rl.Fleet(store, { namespace: namespace("kill-closed") });
    const time = fakeTime();
    let calls = 0;
    const err = await rl
      .runWithPolicy(
        fleetPolicy(),
        async () => {
          calls++;
          await server.stop();
          throw rl.AttemptError.retryable("unavailable");
        },
        { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet: closedFleet },
      )
      .catch((e) => e);
    assert.ok(err instanceof rl.RunStoppedError, String(err));
    assert.equal(err.terminal, "stop_store_unavailable");
    assert.equal(calls, 1);
    assert.equal(err.attempts.attempts[0]?.admission?.store, undefined, "the first attempt was admitted with the store");
    assert.equal(err.attempts.fleet_stop?.reason, "store_unavailable");
    assert.equal(closedFleet.stats.recordsLost, 1, "the outcome could not be recorded");
    assert.equal(rl.verifyBundle(err.sealed.bundle_json).kind, "verified");

    // fail_open: the server is down at the start; restarted during attempt 2.
    const openFleet = new rl.Fleet(store, { namespace: namespace("kill-open") });
    const time2 = fakeTime();
    /** @type {string[]} */
    const routes = [];
    const ok = await rl.runWithPolicy(
      fleetPolicy({ on_store_unavailable: "fail_open", breaker: { consecutive_failures: 5, half_open_probes: 1, open_ms: 60000 } }),
      async (step) => {
        routes.push(step.routeId);
        if (routes.length === 1) {
          server = await startRedis(port, dir);
          // The client reconnects in the background; the next admission waits for it within its timeout.
          throw rl.AttemptError.retryable("unavailable");
        }
        return "ok";
      },
      { idempotencyKey: KEY, clock: time2.clock, sleep: time2.sleep, fleet: openFleet },
    );
    assert.equal(ok.receipt.terminal, "completed");
    assert.equal(ok.receipt.attempt_count, 2);
    const [first, second] = ok.bundle.attempts.attempts;
    assert.equal(first?.admission?.store, "unavailable");
    assert.equal(second?.admission?.store, undefined, "the second attempt was admitted with the store again");
    assert.ok(second?.admission?.breaker !== undefined);
    assert.equal(ok.receipt.fleet?.admitted_without_store, 1);
    assert.equal(rl.verifyBundle(ok.sealed.bundle_json).kind, "verified");
    const primary = ok.bundle.policy.routes[0]?.route_release_sha256 ?? "";
    const stored = await store.get(openFleet.breakerKey(primary));
    assert.ok(stored.generation >= 1, "outcomes are recorded in the restarted server");
  } finally {
    await store.close();
    await server.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
