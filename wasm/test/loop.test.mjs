// The host loop over the core's run machine (runLoop, Machine): a plain run
// reaches the receipt runWithPolicy reaches on the same outcomes; a fleet run
// and a journaled run replay to the same digests through machineTranscript; a
// journaled run crashed after any append resumes to a verified end; refusals
// are coded.
import { test } from "node:test";
import assert from "node:assert/strict";

import * as rl from "../dist/index.js";
import { KEY, fakeTime, referencePolicy } from "./helpers.mjs";
import { fleetPolicy } from "./fleet-helpers.mjs";

const { AttemptError, DecodeError, Machine, MemoryStore, machineTranscript, runLoop, runWithPolicy, storeRead, storeWrite, verifyBundle, journalVerify } = rl;

const EPOCH = 1_780_000_000_000;

/**
 * An adapter on a fake clock: each attempt takes 100 ms and fails as the
 * script says (`null`: returns "ok").
 * @param {(string | null)[]} script
 * @param {{store?: import("../dist/index.js").FleetStore, log?: object[], crashAfter?: number}} [with_]
 */
function scripted(script, with_ = {}) {
  const time = fakeTime();
  const faults = [...script];
  /** @type {number[]} */
  const sent = [];
  /** @type {string[]} */
  const hooks = [];
  const log = with_.log;
  /** @type {import("../dist/index.js").LoopAdapter<string>} */
  const adapter = {
    nowMs: () => time.state.now,
    sleep: (ms) => time.sleep(ms),
    dispatch: (effect) => {
      sent.push(/** @type {number} */ (effect.dispatch["ordinal"]));
      time.advance(100);
      const fault = faults.shift() ?? null;
      if (fault !== null) throw AttemptError.retryable(/** @type {any} */ (fault));
      return "ok";
    },
    observation: (_effect, ok, reply) => (ok ? {} : { facts: { result: "raised", outcome: /** @type {any} */ (reply).outcome } }),
    onDecision: (d) => hooks.push(`decision:${String(d["kind"])}`),
    onSleep: (s) => hooks.push(`sleep:${s.ms}`),
    onAttempt: (a, j) => hooks.push(`attempt:${String(a["ordinal"])}:${String(j["rule"])}`),
    onTerminal: (r) => hooks.push(`terminal:${r.terminal}`),
  };
  if (with_.store !== undefined) {
    const store = with_.store;
    adapter.read = (keys) => storeRead(store, "retryledger", keys);
    adapter.write = (writes) => storeWrite(store, "retryledger", writes);
  }
  if (log !== undefined) {
    adapter.append = (events) => {
      const crashAfter = with_.crashAfter;
      if (crashAfter !== undefined && log.length + events.length > crashAfter) {
        log.push(...events.slice(0, Math.max(0, crashAfter - log.length)));
        throw new Error("crashed");
      }
      log.push(...events);
      return true;
    };
    adapter.reconcile = () => ({ answer: "failed_no_effect" });
  }
  return { adapter, time, sent, hooks };
}

/** A machine that keeps every event it was answered with. @param {import("../dist/index.js").Machine} m */
function recording(m) {
  /** @type {import("../dist/index.js").MachineEvent[]} */
  const events = [];
  const answer = m.answer.bind(m);
  m.answer = (e) => {
    events.push(e);
    return answer(e);
  };
  return { machine: m, events };
}

/** @param {(string | null)[]} script */
async function plainDriver(script) {
  const time = fakeTime();
  const faults = [...script];
  try {
    return await runWithPolicy(
      referencePolicy(),
      () => {
        time.advance(100);
        const fault = faults.shift() ?? null;
        if (fault !== null) throw AttemptError.retryable(/** @type {any} */ (fault));
        return "ok";
      },
      { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep },
    );
  } catch (e) {
    return /** @type {any} */ (e);
  }
}

for (const script of [[null], ["rate_limited", null], ["unavailable", "unavailable", null], ["unavailable", "unavailable", "unavailable", "unavailable"]]) {
  test(`a plain run reaches runWithPolicy's receipt (${script.join(",")})`, async () => {
    const { adapter, sent, hooks } = scripted(script);
    const result = await runLoop(Machine.start(referencePolicy(), { origin_epoch_ms: EPOCH }), adapter);
    const expected = await plainDriver(script);
    assert.equal(result.terminal, expected.sealed.terminal);
    assert.equal(result.receipt_sha256, expected.sealed.receipt_sha256);
    assert.deepEqual(result.receipt, expected.sealed.receipt);
    assert.equal(verifyBundle(result.bundle).kind, "verified");
    assert.equal(result.value, result.terminal === "completed" ? "ok" : undefined);
    const attempts = result.bundle.attempts.attempts.length;
    assert.deepEqual(sent, Array.from({ length: attempts }, (_, i) => i + 1));
    assert.equal(hooks.at(-1), `terminal:${result.terminal}`);
    assert.equal(hooks.filter((h) => h.startsWith("attempt:")).length, attempts);
  });
}

test("a fleet run replays to the same effects and digests", async () => {
  const policy = fleetPolicy();
  const store = new MemoryStore();
  const { adapter } = scripted(["unavailable", "unavailable", null], { store });
  const { machine, events } = recording(Machine.start(policy, { origin_epoch_ms: EPOCH }));
  const result = await runLoop(machine, adapter);
  assert.equal(result.terminal, "completed");
  assert.equal(verifyBundle(result.bundle).kind, "verified");
  const release = result.bundle.attempts.attempts[0]?.route_release_sha256;
  const { document, generation } = await store.get(`retryledger/breaker/${String(release)}`);
  assert.equal(/** @type {any} */ (document)?.state, "open");
  assert.ok(generation > 0);
  const replay = machineTranscript(policy, { origin_epoch_ms: EPOCH }, undefined, events);
  assert.equal(replay.error, undefined);
  assert.equal(replay.receipt_sha256, result.receipt_sha256);
  const kinds = new Set(replay.effects.map((e) => e.kind));
  for (const k of ["read", "write", "sleep", "dispatch", "done"]) assert.ok(kinds.has(/** @type {any} */ (k)), k);
});

/** @param {ReturnType<typeof scripted>} s @param {object[]} [events] */
function journaled(s, events) {
  const policy = referencePolicy();
  if (events === undefined) {
    return runLoop(Machine.start(policy, { origin_epoch_ms: EPOCH, journal: { run_id: "run-1", lease_generation: 1 } }), s.adapter);
  }
  const options = { origin_epoch_ms: EPOCH, now_ms: s.time.state.now, journal: { run_id: "run-1", lease_generation: 2 } };
  return runLoop(Machine.resume(policy, options, events), s.adapter);
}

test("a journaled run writes a journal that verifies, its terminal the receipt's digest", async () => {
  /** @type {any[]} */
  const log = [];
  const result = await journaled(scripted(["rate_limited", null], { log }));
  assert.equal(result.terminal, "completed");
  const verdict = /** @type {any} */ (journalVerify(referencePolicy(), log));
  assert.equal(verdict.terminal, "completed");
  assert.equal(verdict.next_seq, log.length);
  assert.equal(log.at(-1).receipt_sha256, result.receipt_sha256);
});

test("a journaled run crashed after any append resumes to a verified end", async () => {
  /** @type {any[]} */
  const whole = [];
  await journaled(scripted(["rate_limited", null], { log: whole }));
  for (let n = 0; n < whole.length; n++) {
    /** @type {any[]} */
    const log = [];
    const first = scripted(["rate_limited", null], { log, crashAfter: n });
    await assert.rejects(journaled(first), /crashed/);
    assert.equal(log.length, n);
    const done = log.filter((e) => e.kind === "observed").length;
    const second = scripted(["rate_limited", null].slice(done), { log });
    second.time.state.now = first.time.state.now;
    const result = await journaled(second, [...log]);
    assert.equal(result.terminal, "completed", `crash after ${n}`);
    assert.equal(/** @type {any} */ (journalVerify(referencePolicy(), log)).terminal, "completed");
    assert.ok(first.sent.length + second.sent.length <= 3);
  }
});

test("an unknown effect is a coded error", async () => {
  const odd = /** @type {any} */ ({ next: () => ({ kind: "teleport" }) });
  await assert.rejects(runLoop(odd, scripted([]).adapter), (e) => e instanceof DecodeError && e.code === "invalid_value" && e.path === "/kind");
});

test("a refused event is the core's coded error and the effect stays outstanding", () => {
  const m = Machine.start(referencePolicy(), { origin_epoch_ms: EPOCH });
  assert.equal(m.next().kind, "dispatch");
  assert.throws(() => m.answer({ kind: "clock", now_ms: 5 }), (e) => /** @type {any} */ (e).code === "unexpected_event");
  assert.equal(m.next().kind, "dispatch");
  m.free();
});

test("a fleet policy without a store is a coded error", async () => {
  await assert.rejects(
    runLoop(Machine.start(fleetPolicy(), { origin_epoch_ms: EPOCH }), scripted([null]).adapter),
    (e) => e instanceof DecodeError && e.code === "missing_field" && e.path === "/fleet",
  );
});
