// Journal-backed runs in one process: the same bundle as runWithPolicy, the
// durable order of events, takeover, reconciliation, the coded refusals.
import { test } from "node:test";
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, referencePolicy } from "./helpers.mjs";

const T0 = 1_780_000_000_000;
const here = path.dirname(fileURLToPath(import.meta.url));

/** @param {{advance: (ms: number) => void}} time @param {Record<number, number>} statuses @param {number[]} sent */
function scripted(time, statuses, sent) {
  return async (/** @type {{ordinal: number, reserveCost: number, charge: (c: number) => void}} */ step) => {
    sent.push(step.ordinal);
    time.advance(100);
    const status = statuses[step.ordinal];
    if (status === 200) {
      step.charge(step.reserveCost);
      return "ok";
    }
    step.charge(0);
    if (status === 429) throw rl.AttemptError.retryable("rate_limited", 250);
    throw rl.AttemptError.retryable("unavailable");
  };
}

function crashing() {
  return async () => {
    throw new Error("the process dies with the attempt in flight");
  };
}

test("a journaled run seals runWithPolicy's bundle, every event appended in order", async () => {
  const policy = rl.compilePolicy(referencePolicy());
  const statuses = { 1: 429, 2: 503, 3: 200 };
  let time = fakeTime();
  const plain = await rl.runWithPolicy(policy, scripted(time, statuses, []), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  time = fakeTime();
  time.state.now = T0;
  const store = new rl.MemoryStore();
  /** @type {string[]} */
  const kinds = [];
  const result = await rl.runJournaled(policy, scripted(time, statuses, []), {
    idempotencyKey: KEY,
    store,
    runId: "r-1",
    clock: time.clock,
    sleep: time.sleep,
    onAppend: (e) => {
      kinds.push(e.kind);
    },
  });
  assert.equal(JSON.stringify(result.bundle), plain.sealed.bundle_json);
  assert.equal(result.receiptSha256, plain.sealed.receipt_sha256);
  assert.equal(result.result, "ok");
  assert.deepEqual(kinds, ["created", "decided", ...Array(3).fill(["reserved", "dispatched", "observed", "decided"]).flat(), "terminal"]);
  assert.equal(rl.journalVerify(policy, result.events).terminal, "completed");
  await assert.rejects(
    rl.runJournaled(policy, scripted(time, statuses, []), { idempotencyKey: KEY, store, runId: "r-1", clock: time.clock }),
    (e) => e instanceof rl.JournaledRunError && e.code === "run_exists",
  );
  const again = await rl.resumeJournaled(policy, scripted(time, statuses, []), { idempotencyKey: KEY, store, runId: "r-1", clock: time.clock });
  assert.equal(again.receiptSha256, result.receiptSha256);
  assert.equal(again.leaseGeneration, 2);
  assert.equal(store.read(rl.journalLog("r-1")).length, 15);
});

test("the dispatched event is durable before the call", async () => {
  const store = new rl.MemoryStore();
  const time = fakeTime();
  time.state.now = T0;
  /** @type {string[]} */
  const seen = [];
  await rl.runJournaled(
    referencePolicy(),
    () => {
      const held = store.read(rl.journalLog("r-2"));
      seen.push(held[held.length - 1]?.text ?? "");
      return "ok";
    },
    { idempotencyKey: KEY, store, runId: "r-2", clock: time.clock, sleep: time.sleep },
  );
  assert.match(seen[0] ?? "", /"kind":"dispatched"/);
});

test("an attempt in doubt is reconciled, never resent: unknown stops, failed_no_effect dispatches again", async () => {
  const policy = rl.compilePolicy(referencePolicy());
  for (const [answer, terminal, sentAfter] of /** @type {const} */ ([
    ["in_progress", "stop_indeterminate", []],
    ["failed_no_effect", "completed", [2]],
  ])) {
    const store = new rl.MemoryStore();
    const time = fakeTime();
    time.state.now = T0;
    const runId = `r-doubt-${answer}`;
    let thrown = false;
    try {
      // The call never returns: a journal left with `dispatched` and no observation.
      await rl.runJournaled(policy, crashing(), {
        idempotencyKey: KEY,
        store,
        runId,
        clock: time.clock,
        sleep: time.sleep,
        onAppend: (e) => {
          if (e.kind === "dispatched") throw new Error("crash");
        },
      });
    } catch (e) {
      thrown = /** @type {Error} */ (e).message === "crash";
    }
    assert.ok(thrown);
    await assert.rejects(
      rl.resumeJournaled(policy, crashing(), { idempotencyKey: KEY, store, runId, clock: time.clock, sleep: time.sleep }),
      (e) => e instanceof rl.JournaledRunError && e.code === "reconcile_missing",
    );
    /** @type {number[]} */
    const sent = [];
    /** @type {rl.ReconcileQuestion[]} */
    const asked = [];
    const options = {
      idempotencyKey: KEY,
      store,
      runId,
      clock: time.clock,
      sleep: time.sleep,
      maxPolls: 3,
      reconcile: (/** @type {rl.ReconcileQuestion} */ q) => {
        asked.push(q);
        return answer === "failed_no_effect" ? { answer, cost: 0 } : answer;
      },
    };
    let end;
    try {
      end = await rl.resumeJournaled(policy, scripted(time, { 2: 200 }, sent), options);
    } catch (e) {
      assert.ok(e instanceof rl.JournaledStopError);
      end = e;
    }
    assert.equal(end.terminal, terminal);
    assert.deepEqual(end.reconciled, [1]);
    assert.deepEqual(sent, sentAfter);
    assert.equal(asked[0]?.idempotency_key, KEY);
    assert.equal(asked.length, answer === "in_progress" ? 3 : 1);
  }
});

test("an owner whose lease moved stops without writing", async () => {
  const store = new rl.MemoryStore();
  const time = fakeTime();
  time.state.now = T0;
  await assert.rejects(
    rl.runJournaled(
      referencePolicy(),
      () => {
        const { generation } = store.get(rl.leaseKey("r-5"));
        assert.ok(store.compareAndSet(rl.leaseKey("r-5"), generation, { lease_generation: generation + 1 }).ok);
        return "ok";
      },
      { idempotencyKey: KEY, store, runId: "r-5", clock: time.clock, sleep: time.sleep },
    ),
    (e) => e instanceof rl.JournaledRunError && e.code === "lease_lost" && e.seq === 4 && e.event?.kind === "observed",
  );
  assert.equal(store.read(rl.journalLog("r-5")).length, 4);
});

test("resume of nothing, a tampered journal, bad options: coded errors", async () => {
  const store = new rl.MemoryStore();
  await assert.rejects(
    rl.resumeJournaled(referencePolicy(), () => "ok", { idempotencyKey: KEY, store, runId: "absent" }),
    (e) => e instanceof rl.JournaledRunError && e.code === "run_not_found",
  );
  assert.equal(store.get(rl.leaseKey("absent")).generation, 0, "nothing written");
  store.append(rl.journalLog("bad"), 0, '{"kind":"created"}');
  await assert.rejects(rl.resumeJournaled(referencePolicy(), () => "ok", { idempotencyKey: KEY, store, runId: "bad" }), (e) => e instanceof rl.RetryledgerError && e.code === "missing_field");
  await assert.rejects(rl.runJournaled(referencePolicy(), () => "ok", { idempotencyKey: "another", store, runId: "k" }), (e) => e instanceof rl.DriftError && e.code === "idempotency_key_drift");
  await assert.rejects(
    rl.resumeJournaled(referencePolicy(), () => "ok", { idempotencyKey: KEY, store, runId: "k", maxPolls: 0 }),
    (e) => e instanceof rl.DecodeError && e.code === "invalid_value" && e.path === "/max_polls",
  );
});

/** @param {string} file The first policy a vectors file holds. */
function vectorPolicy(file) {
  const doc = JSON.parse(fs.readFileSync(path.resolve(here, `../../tests/vectors/${file}`), "utf8"));
  return JSON.parse(doc.cases.find((/** @type {any} */ c) => c.input.policy !== undefined).input.policy);
}

test("usage and the request body are recorded by the core's session and survive a takeover", async () => {
  // The policy and schedule of price.json's first case (their release digests match).
  const price = JSON.parse(fs.readFileSync(path.resolve(here, "../../tests/vectors/price.json"), "utf8")).cases[0].input;
  const policy = JSON.parse(price.policy);
  const schedule = JSON.parse(price.schedule);
  const store = new rl.MemoryStore();
  const time = fakeTime();
  time.state.now = T0;
  const body = '{"input":"summarize"}';
  const usage = { input: 1000, output: 500 };
  const options = { idempotencyKey: KEY, store, runId: "u-1", clock: time.clock, sleep: time.sleep, priceSchedule: schedule };
  await assert.rejects(
    rl.runJournaled(policy, async (step) => {
      step.requestBody(body);
      step.usage(usage);
      time.advance(50);
      throw rl.AttemptError.retryable("unavailable");
    }, {
      ...options,
      // The process dies once attempt 2's dispatch is durable: in doubt, never observed.
      onAppend: (e) => {
        if (e.kind === "dispatched" && e.ordinal === 2) throw new Error("crash");
      },
    }),
    /crash/,
  );
  const result = await rl.resumeJournaled(policy, async (step) => {
    step.requestBody(body);
    step.usage(usage);
    return "ok";
  }, { ...options, reconcile: () => ({ answer: "failed_no_effect", cost: 0 }) });
  const attempts = result.bundle.attempts.attempts;
  assert.deepEqual(attempts.map((a) => a.ordinal), [1, 2, 3]);
  assert.deepEqual(result.reconciled, [2]);
  for (const a of [attempts[0], attempts[2]]) {
    assert.ok(a !== undefined);
    assert.deepEqual(a.usage, usage);
    assert.equal(a.cost, rl.priceCost(schedule, a.route_release_sha256, usage));
    assert.equal(a.request_body_sha256, crypto.createHash("sha256").update(body).digest("hex"));
  }
  assert.equal(attempts[1]?.request_body_sha256, undefined); // reconciled: the receiver's answer, not a send
  assert.deepEqual(result.bundle.price_schedule, schedule);
  assert.equal(rl.verifyBundle(result.bundle).kind, "verified");

  // Another body on a retry of the route is the core's drift, as in runWithPolicy.
  await assert.rejects(
    rl.runJournaled(policy, async (step) => {
      step.requestBody(step.ordinal === 1 ? body : `${body} `);
      throw rl.AttemptError.retryable("unavailable");
    }, { idempotencyKey: KEY, store: new rl.MemoryStore(), runId: "u-2", clock: time.clock, sleep: time.sleep }),
    (e) => e instanceof rl.RetryledgerError && e.code === "request_body_drift",
  );
});

test("a policy a journal cannot carry is refused by the core before anything is written", async () => {
  for (const [file, code] of /** @type {const} */ ([["fleet.json", "admission_missing"], ["stream.json", "invalid_stream_contract"], ["job.json", "invalid_async_job"]])) {
    const store = new rl.MemoryStore();
    await assert.rejects(
      rl.runJournaled(vectorPolicy(file), async () => "ok", { idempotencyKey: KEY, store, runId: "p-1" }),
      (e) => e instanceof rl.RetryledgerError && e.code === code,
      file,
    );
    assert.deepEqual(await store.read("journal/p-1", 0), []);
    assert.equal((await store.get("lease/p-1")).generation, 0);
  }
});

for (const entry of ["resumeJournaled", "runJournaled"]) {
  test(`${entry}: a run claimed but never created is taken over and started from the beginning`, async () => {
    // Its owner died between the lease claim and `created`: nothing was sent.
    const policy = rl.compilePolicy(referencePolicy());
    const statuses = { 1: 429, 2: 503, 3: 200 };
    let time = fakeTime();
    time.state.now = T0;
    const base = await rl.runJournaled(policy, scripted(time, statuses, []), { idempotencyKey: KEY, store: new rl.MemoryStore(), runId: "base", clock: time.clock, sleep: time.sleep });
    const store = new rl.MemoryStore();
    assert.ok(store.compareAndSet(rl.leaseKey("r-claimed"), 0, { run_id: "r-claimed", lease_generation: 1 }).ok);
    time = fakeTime();
    time.state.now = T0;
    /** @type {number[]} */
    const sent = [];
    const options = { idempotencyKey: KEY, store, runId: "r-claimed", clock: time.clock, sleep: time.sleep };
    const result = await (entry === "resumeJournaled" ? rl.resumeJournaled : rl.runJournaled)(policy, scripted(time, statuses, sent), options);
    assert.equal(result.terminal, "completed");
    assert.deepEqual(sent, [1, 2, 3]);
    assert.equal(result.leaseGeneration, 2);
    assert.equal(store.get(rl.leaseKey("r-claimed")).generation, 2);
    assert.equal(result.events[0]?.kind, "created");
    assert.equal(result.events[0]?.lease_generation, 2);
    assert.equal(result.receiptSha256, base.receiptSha256);
    assert.equal(rl.journalVerify(policy, result.events).terminal, "completed");
    // The run now exists: a second runJournaled is refused as before.
    await assert.rejects(
      rl.runJournaled(policy, scripted(time, statuses, []), { idempotencyKey: KEY, store, runId: "r-claimed", clock: time.clock }),
      (e) => e instanceof rl.JournaledRunError && e.code === "run_exists",
    );
  });
}

test("a slow owner whose claimed run was taken over is fenced at its created", async () => {
  const policy = rl.compilePolicy(referencePolicy());
  const store = new rl.MemoryStore();
  const time = fakeTime();
  time.state.now = T0;
  let once = true;
  // The store, but another owner takes the run over (and finishes it)
  // between the first owner's look at the empty journal and its `created`.
  const slow = new Proxy(store, {
    get(target, name) {
      if (name === "read") {
        return async (/** @type {string} */ log, /** @type {number} */ from) => {
          const held = target.read(log, from);
          if (once) {
            once = false;
            await rl.runJournaled(policy, scripted(time, { 1: 200 }, []), { idempotencyKey: KEY, store, runId: "r-slow", clock: time.clock, sleep: time.sleep });
          }
          return held;
        };
      }
      const v = Reflect.get(target, name, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  await assert.rejects(
    rl.runJournaled(policy, scripted(time, { 1: 200 }, []), { idempotencyKey: KEY, store: slow, runId: "r-slow", clock: time.clock, sleep: time.sleep }),
    (e) => e instanceof rl.JournaledRunError && e.code === "lease_lost" && e.seq === 0,
  );
  const held = store.read(rl.journalLog("r-slow")).map((e) => JSON.parse(e.text));
  assert.equal(held[0]?.lease_generation, 2);
  assert.equal(held.at(-1)?.kind, "terminal");
});
