// A separate process of a fleet under admission limits: runs for `seconds`
// against a shared Redis store, each run's one attempt an HTTP request to a
// loopback server carrying `x-run: <pid>-<n>`. Prints one JSON line: per run
// its id, the wall clock when it was called, its terminal and its admission
// limits, and how many of the first bundles verify.
//
//   node test/fleet-admission-child.mjs '{"target":"redis://…","namespace":"n","seconds":4,"server":"http://…","admission":{…}}'
// Without arguments (as `node --test test/` loads every file here) it does nothing.
import * as rl from "../dist/index.js";
import { KEY } from "./helpers.mjs";
import { fleetPolicy } from "./fleet-helpers.mjs";

if (process.argv[2] === undefined) process.exit(0);
const args = JSON.parse(process.argv[2]);
const { RedisStore } = await import("../dist/stores/redis.js");
const store = new RedisStore({ url: args.target, connectTimeoutMs: 10000, commandTimeoutMs: 10000 });
const fleet = new rl.Fleet(store, { namespace: args.namespace, maxConflicts: 1000 });
const policy = rl.compilePolicy(
  fleetPolicy({ admission: args.admission }, (/** @type {any} */ p) => {
    delete p.fleet.breaker;
    p.deadline_ms = 30000;
  }),
);
const rows = [];
let verified = 0;
try {
  await fleet.view(policy.policy);
  const go = Date.now() + 60000;
  while (!(await import("node:fs")).existsSync(args.go)) {
    if (Date.now() > go) throw new Error("no go signal");
    await new Promise((r) => setTimeout(r, 2));
  }
  const end = performance.now() + args.seconds * 1000;
  for (let n = 1; performance.now() < end; n++) {
    const id = `${process.pid}-${n}`;
    const called = Date.now();
    const dispatch = async () => {
      const response = await fetch(args.server, { headers: { "x-run": id } });
      return await response.text();
    };
    /** @type {import("../dist/index.js").Sealed} */
    let sealed;
    try {
      sealed = (await rl.runWithPolicy(policy, dispatch, { idempotencyKey: KEY, fleet })).sealed;
    } catch (e) {
      if (!(e instanceof rl.RunStoppedError)) throw e;
      sealed = e.sealed;
    }
    const bundle = sealed.bundle;
    rows.push({
      run: id,
      called_epoch_ms: called,
      terminal: sealed.terminal,
      limits: bundle.attempts.attempts[0]?.admission?.limits ?? null,
      receipt_queue_wait_ms: sealed.receipt.fleet?.queue_wait_ms,
    });
    if (n <= 5 && rl.verifyBundle(sealed.bundle_json).kind === "verified") verified++;
  }
} finally {
  policy.free();
  await fleet.close();
}
process.stdout.write(`${JSON.stringify({ rows, verified, stats: fleet.stats })}\n`);
