// A separate process of a fleet: `runs` runs of the fleet policy against a
// shared store (SQLite file or Redis URL) under one namespace, the primary
// route failing unavailable (or answering when `primaryUp`), the fallback
// answering. Prints one JSON line: the routes dispatched, each run's
// terminal, skipped routes and verdict.
//
//   node test/fleet-child.mjs '{"backend":"sqlite","target":"/tmp/f.db","namespace":"n","runs":1}'
// Without arguments (as `node --test test/` loads every file here) it does nothing.
import * as rl from "../dist/index.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { fleetPolicy } from "./fleet-helpers.mjs";

if (process.argv[2] === undefined) process.exit(0);
const args = JSON.parse(process.argv[2]);
/** @type {import("../dist/index.js").FleetStore} */
let store;
if (args.backend === "sqlite") {
  const { SQLiteStore } = await import("../dist/stores/sqlite.js");
  store = new SQLiteStore(args.target);
} else if (args.backend === "redis") {
  const { RedisStore } = await import("../dist/stores/redis.js");
  // Generous timeouts: eight processes start at once on a loaded machine.
  store = new RedisStore({ url: args.target, connectTimeoutMs: 10000, commandTimeoutMs: 10000 });
} else if (args.backend === "postgres") {
  const { PostgresStore } = await import("../dist/stores/postgres.js");
  store = new PostgresStore({ connectionString: args.target, connectTimeoutMs: 10000, statementTimeoutMs: 10000, max: 1 });
} else {
  throw new Error(`unknown backend ${String(args.backend)}`);
}
const fleet = new rl.Fleet(store, { namespace: args.namespace, maxConflicts: 50 });
const policy = rl.compilePolicy(fleetPolicy({ breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 600000 } }));
const routes = /** @type {string[]} */ ([]);
const runs = [];
try {
  for (let i = 0; i < (args.runs ?? 1); i++) {
    const time = fakeTime();
    /** @param {import("../dist/index.js").Step} step */
    const dispatch = async (step) => {
      routes.push(step.routeId);
      await new Promise((r) => setTimeout(r, 1));
      if (step.routeId === "private-primary" && !args.primaryUp) throw rl.AttemptError.retryable("unavailable");
      return "ok";
    };
    /** @type {import("../dist/index.js").Sealed} */
    let sealed;
    try {
      sealed = (await rl.runWithPolicy(policy, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, fleet })).sealed;
    } catch (e) {
      if (!(e instanceof rl.RunStoppedError)) throw e;
      sealed = e.sealed;
    }
    runs.push({
      terminal: sealed.terminal,
      routes_skipped: sealed.receipt.fleet?.routes_skipped ?? 0,
      verdict: rl.verifyBundle(sealed.bundle_json).kind,
    });
  }
} finally {
  policy.free();
  await fleet.close();
}
process.stdout.write(`${JSON.stringify({ routes, runs, stats: fleet.stats })}\n`);
