// runStream: scripted in-memory provider streams on a fake clock. In every
// case the events the consumer received are the sealed bundle's event log,
// one to one, and the bundle replays as verified.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import * as rl from "../dist/index.js";
import { KEY, policyWith } from "./helpers.mjs";

const { runStream, verifyBundle, RunStoppedError, RunCancelledError } = rl;

class APIConnectionError extends Error {}

/** @param {import("../dist/index.js").StreamMode} mode @param {Record<string, number>} [extra] */
function streamPolicy(mode, extra = {}) {
  return policyWith((p) => {
    p.stream = { mode, max_response_bytes: 64, ...extra };
  });
}

/**
 * A fake clock whose timers fire when the process is otherwise idle: the
 * clock then jumps to the earliest pending timer. Provider events scripted
 * with `advance` move it too (and fire timers that fall due).
 */
function fakeTime() {
  const state = { now: 0 };
  /** @type {{due: number, resolve: () => void}[]} */
  let waiters = [];
  let scheduled = false;
  const fireDue = () => {
    const due = waiters.filter((w) => w.due <= state.now);
    waiters = waiters.filter((w) => w.due > state.now);
    for (const w of due) w.resolve();
  };
  const tick = () => {
    scheduled = false;
    if (waiters.length === 0) return;
    const next = Math.min(...waiters.map((w) => w.due));
    if (next > state.now) state.now = next;
    fireDue();
    schedule();
  };
  const schedule = () => {
    if (!scheduled && waiters.length > 0) {
      scheduled = true;
      setImmediate(tick);
    }
  };
  return {
    state,
    clock: () => state.now,
    /** @param {number} ms @param {AbortSignal | undefined} signal */
    sleep: (ms, signal) =>
      new Promise((resolve) => {
        if (signal?.aborted) return resolve(undefined);
        const w = { due: state.now + ms, resolve: () => resolve(undefined) };
        waiters.push(w);
        signal?.addEventListener(
          "abort",
          () => {
            waiters = waiters.filter((x) => x !== w);
            resolve(undefined);
          },
          { once: true },
        );
        schedule();
      }),
    /** @param {number} ms */
    advance: (ms) => {
      state.now += ms;
      fireDue();
    },
  };
}

/**
 * One scripted attempt: `events` (each after `gap` ms), then `error` (thrown),
 * `stall` (wait forever, ignoring the signal), or a normal end. `openError`
 * throws before the stream opens.
 * @typedef {{events?: unknown[], gap?: number, error?: unknown, stall?: boolean, openError?: unknown}} Script
 */

/** @param {ReturnType<typeof fakeTime>} time @param {Script[]} script */
function scripted(time, script) {
  /** @type {any[]} */
  const steps = [];
  /** @type {AbortSignal[]} */
  const signals = [];
  /** @type {string[]} */
  const trace = [];
  const closed = /** @type {number[]} */ ([]);
  /** @param {any} step @param {AbortSignal} signal */
  const dispatch = async (step, signal) => {
    steps.push(step);
    signals.push(signal);
    const n = steps.length;
    const s = script[n - 1];
    if (s === undefined) throw new Error("dispatched beyond the script");
    time.advance(5);
    if (s.openError !== undefined) throw s.openError;
    return (async function* () {
      try {
        for (const ev of s.events ?? []) {
          time.advance(s.gap ?? 10);
          trace.push(`provider ${n}`);
          yield ev;
        }
        if (s.stall === true) await new Promise(() => {});
        if (s.error !== undefined) throw s.error;
      } finally {
        closed.push(n);
      }
    })();
  };
  return { steps, signals, trace, closed, dispatch };
}

/** Iterate a run to its end: the events, and the error it ended with. @param {any} run @param {string[]} [trace] */
async function collect(run, trace) {
  const events = [];
  let error;
  try {
    for await (const ev of run) {
      trace?.push(`consumer ${ev.sequence}`);
      events.push(ev);
    }
  } catch (e) {
    error = e;
  }
  return { events, error };
}

/**
 * A run started with runStream; read after iteration, when it is sealed.
 * @param {Parameters<typeof runStream>} args @returns {any}
 */
const started = (...args) => runStream(...args);

const sha = (/** @type {string} */ t) => createHash("sha256").update(t, "utf8").digest("hex");

/**
 * The yielded events are the sealed log one to one (or its prefix when the
 * consumer left early), delta digests included; the bundle verifies.
 * @param {any} sealed @param {any[]} events @param {boolean} [prefix]
 */
function checkLog(sealed, events, prefix = false) {
  assert.ok(sealed !== undefined, "the run is sealed");
  const log = sealed.bundle.stream_events;
  assert.ok(Array.isArray(log), "the bundle carries stream_events");
  const mine = events.map((e) => [e.kind, e.status, e.attempt, e.sequence]);
  const theirs = log.map((/** @type {any} */ e) => [e.kind, e.status, e.attempt_ordinal, e.sequence]);
  assert.deepEqual(mine, prefix ? theirs.slice(0, mine.length) : theirs);
  events.forEach((e, i) => {
    if (e.kind === "delta") assert.equal(sha(e.text), log[i].delta_sha256);
  });
  const verdict = verifyBundle(sealed.bundle_json);
  assert.equal(verdict.kind, "verified", JSON.stringify(verdict));
  assert.deepEqual(JSON.parse(sealed.bundle_json), sealed.bundle);
}

const kinds = (/** @type {any[]} */ events) => events.map((e) => `${e.kind}:${e.attempt}`);
const WORDS = ["The incident", " began at 09:14", " UTC."];
const cut = () => new APIConnectionError("terminated");

for (const mode of /** @type {const} */ (["buffer", "tentative", "continuation", "restart"])) {
  test(`${mode}: a clean stream commits once`, async () => {
    const time = fakeTime();
    const { dispatch, trace, steps } = scripted(time, [{ events: WORDS }]);
    const run = started(streamPolicy(mode), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    const { events, error } = await collect(run, trace);
    assert.equal(error, undefined);
    assert.equal(steps.length, 1);
    assert.equal(steps[0].continuation, undefined);
    const status = mode === "buffer" ? "committed" : "tentative";
    assert.deepEqual(
      events.map((e) => [e.kind, e.status, e.sequence, e.text]),
      [...WORDS.map((w, i) => ["delta", status, i + 1, w]), ["commit", "committed", 4, undefined]],
    );
    assert.deepEqual(events.slice(0, 3).map((e) => e.data), WORDS);
    if (mode === "buffer") {
      // Nothing reached the consumer before the provider's stream ended.
      assert.deepEqual(trace, ["provider 1", "provider 1", "provider 1", "consumer 1", "consumer 2", "consumer 3", "consumer 4"]);
    } else {
      assert.deepEqual(trace, ["provider 1", "consumer 1", "provider 1", "consumer 2", "provider 1", "consumer 3", "consumer 4"]);
    }
    assert.equal(run.terminal, "completed");
    assert.equal(run.receipt.stream.committed_events, 3);
    assert.equal(run.bundle.attempts.attempts[0].stream.events, 3);
    checkLog(run.sealed, events);
  });

  test(`${mode}: a cut before any output is retried invisibly`, async () => {
    const time = fakeTime();
    const { dispatch, steps } = scripted(time, [{ events: [], error: cut() }, { events: WORDS }]);
    const run = started(streamPolicy(mode), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    const { events, error } = await collect(run);
    assert.equal(error, undefined);
    assert.equal(steps.length, 2);
    assert.deepEqual(kinds(events), ["delta:2", "delta:2", "delta:2", "commit:2"]);
    assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "retryable", kind: "unavailable" });
    checkLog(run.sealed, events);
  });
}

test("deltas that split a surrogate pair between them, and non-ASCII text, are recorded and hashed exactly", async () => {
  const time = fakeTime();
  // "😀" split across two deltas (high surrogate, then low); "é" and "✓" whole.
  const words = ["caf\u00e9 \ud83d", "\ude00 ok \u2713"];
  const { dispatch } = scripted(time, [{ events: words }]);
  const run = started(streamPolicy("tentative"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "commit:1"]);
  checkLog(run.sealed, events);
  assert.equal(run.bundle.attempts.attempts[0].stream.bytes, words.reduce((n, w) => n + Buffer.byteLength(w), 0));
});

test("a policy given as an object is compiled once per text, as runWithPolicy's: a change between runs is honored", async () => {
  const once = async (/** @type {any} */ policy) => {
    const time = fakeTime();
    const { dispatch } = scripted(time, [{ events: WORDS }]);
    const run = started(policy, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    assert.equal((await collect(run)).error, undefined);
    return run.bundle;
  };
  const policy = streamPolicy("buffer");
  const first = await once(policy);
  // One compiled policy serves both runs (its decoded policy is shared by their bundles).
  assert.equal((await once(policy)).policy, first.policy);
  assert.equal((await once(JSON.stringify(policy))).policy, first.policy);
  policy.deadline_ms += 1;
  const changed = await once(policy);
  assert.notEqual(changed.receipt.policy_sha256, first.receipt.policy_sha256);
  assert.equal(changed.policy.deadline_ms, policy.deadline_ms);
});

test("buffer: a cut after output is retried and nothing of the failed attempt reaches the consumer", async () => {
  const time = fakeTime();
  const { dispatch } = scripted(time, [{ events: WORDS.slice(0, 2), error: cut() }, { events: WORDS }]);
  const run = started(streamPolicy("buffer"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.deepEqual(kinds(events), ["delta:2", "delta:2", "delta:2", "commit:2"]);
  checkLog(run.sealed, events);
});

test("tentative: a cut after output is invalidated before any event of the next attempt", async () => {
  const time = fakeTime();
  const { dispatch, steps } = scripted(time, [{ events: WORDS.slice(0, 2), error: cut() }, { events: WORDS }]);
  /** @type {any[]} */
  const seen = [];
  const run = started(streamPolicy("tentative"), dispatch, {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
    onAttempt: (a, j) => seen.push([a.ordinal, j.rule, j.stream]),
  });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.equal(steps.length, 2);
  assert.equal(steps[1].continuation, undefined);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:1", "delta:2", "delta:2", "delta:2", "commit:2"]);
  assert.deepEqual(
    events.map((e) => e.status),
    ["tentative", "tentative", "invalidated", "tentative", "tentative", "tentative", "committed"],
  );
  assert.deepEqual(seen, [
    [1, "stream_cut", "invalidate"],
    [2, "returned", "commit"],
  ]);
  assert.equal(run.receipt.stream.invalidated_events, 2);
  checkLog(run.sealed, events);
});

test("restart: a cut after output invalidates and stops indeterminate", async () => {
  const time = fakeTime();
  const { dispatch, steps } = scripted(time, [{ events: WORDS.slice(0, 2), error: cut() }, { events: WORDS }]);
  const run = started(streamPolicy("restart"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const { events, error } = await collect(run);
  assert.ok(error instanceof RunStoppedError, String(error));
  assert.ok(error.cause instanceof APIConnectionError);
  assert.equal(error.sealed, run.sealed);
  assert.equal(steps.length, 1);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:1"]);
  assert.equal(run.terminal, "stop_indeterminate");
  assert.deepEqual(run.bundle.attempts.attempts[0].outcome, { class: "indeterminate", kind: "stream_interrupted_after_output" });
  checkLog(run.sealed, events);
});

/** Responses-like events: numbered, naming their response; the last one terminal. */
const numbered = (/** @type {number} */ from, /** @type {string[]} */ texts, /** @type {boolean} */ last) =>
  texts.map((text, i) => ({ seq: from + i, id: "resp_7Qx", text, done: last && i === texts.length - 1 }));
/** @type {import("../dist/index.js").StreamReader<any>} */
const reader = {
  text: (e) => e.text,
  sequence: (e) => e.seq,
  responseId: (e) => e.id,
  terminal: (e) => e.done === true,
  usage: (e) => e.usage,
};

test("continuation: the next attempt resumes the response; no duplicate, no gap, one commit", async () => {
  const time = fakeTime();
  const { dispatch, steps } = scripted(time, [
    { events: numbered(1, ["The incident", " began"], false), error: cut() },
    { events: numbered(3, [" at 09:14", " UTC."], true) },
  ]);
  const run = started(streamPolicy("continuation"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, reader });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.equal(steps.length, 2);
  assert.deepEqual(steps[1].continuation, { continues_ordinal: 1, response_id: "resp_7Qx", starting_after: 2 });
  assert.equal(steps[1].decision.continuation.starting_after, 2);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "delta:2", "delta:2", "commit:2"]);
  assert.deepEqual(events.slice(0, 4).map((e) => e.data.seq), [1, 2, 3, 4]);
  assert.equal(events.slice(0, 4).map((e) => e.text).join(""), "The incident began at 09:14 UTC.");
  assert.equal(run.receipt.stream.resumed_attempts, 1);
  assert.equal(run.bundle.attempts.attempts[1].stream.continues_ordinal, 1);
  checkLog(run.sealed, events);
});

test("continuation: a resumed stream that does not start right after starting_after is a sequence gap", async () => {
  const time = fakeTime();
  const { dispatch } = scripted(time, [
    { events: numbered(1, ["The incident", " began"], false), error: cut() },
    { events: numbered(4, [" 09:14", " UTC."], true) },
  ]);
  const run = started(streamPolicy("continuation"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, reader });
  const { events, error } = await collect(run);
  assert.ok(error instanceof RunStoppedError);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:2"]);
  assert.equal(run.bundle.attempts.attempts[1].stream.violation, "sequence_gap");
  checkLog(run.sealed, events);
});

test("violation: a sequence number going back stops reading and is a protocol violation", async () => {
  const time = fakeTime();
  const evs = [...numbered(1, ["a", "b"], false), { seq: 2, id: "resp_7Qx", text: "c" }, { seq: 3, id: "resp_7Qx", text: "d", done: true }];
  const { dispatch, closed } = scripted(time, [{ events: evs }]);
  const run = started(streamPolicy("tentative"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, reader });
  const { events, error } = await collect(run);
  assert.ok(error instanceof RunStoppedError);
  assert.ok(error.cause instanceof rl.StreamProtocolError);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:1"]);
  const a = run.bundle.attempts.attempts[0];
  assert.equal(a.stream.violation, "sequence_back");
  assert.equal(a.stream.events, 2);
  assert.deepEqual(a.outcome, { class: "non_retryable", kind: "protocol_violation" });
  assert.deepEqual(closed, [1], "the provider stream was closed");
  checkLog(run.sealed, events);
});

test("violation: one event over max_response_bytes, and a response over it", async () => {
  /** @type {[string[], string, number][]} */
  const cases = [
    [["short", "x".repeat(65)], "event_too_large", 1],
    [["x".repeat(40), "y".repeat(20), "z".repeat(10)], "response_too_large", 2],
  ];
  for (const [texts, violation, delivered] of cases) {
    const time = fakeTime();
    const { dispatch } = scripted(time, [{ events: texts }]);
    const run = started(streamPolicy("tentative"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
    const { events, error } = await collect(run);
    assert.ok(error instanceof RunStoppedError);
    assert.deepEqual(kinds(events), [...Array(delivered).fill("delta:1"), "invalidate:1"]);
    const a = run.bundle.attempts.attempts[0];
    assert.equal(a.stream.violation, violation);
    assert.ok(a.stream.bytes <= 64, "never buffered beyond max_response_bytes");
    checkLog(run.sealed, events);
  }
});

test("violation: impossible usage counts", async () => {
  const time = fakeTime();
  const evs = [{ text: "a" }, { text: "", usage: { output: -1 }, done: true }];
  const { dispatch } = scripted(time, [{ events: evs }]);
  const run = started(streamPolicy("buffer"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, reader });
  const { events, error } = await collect(run);
  assert.ok(error instanceof RunStoppedError);
  assert.deepEqual(events, []);
  assert.equal(run.bundle.attempts.attempts[0].stream.violation, "impossible_usage");
  checkLog(run.sealed, events);
});

test("idle timeout: a stalled stream that ignores its signal is aborted by the watchdog, invalidated and retried", async () => {
  const time = fakeTime();
  const { dispatch, signals, steps } = scripted(time, [{ events: WORDS.slice(0, 2), stall: true }, { events: WORDS }]);
  const run = started(streamPolicy("tentative", { idle_timeout_ms: 500, first_byte_timeout_ms: 1000 }), dispatch, {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
  });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.equal(steps.length, 2);
  assert.equal(signals[0]?.aborted, true);
  assert.equal(signals[1]?.aborted, false);
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:1", "delta:2", "delta:2", "delta:2", "commit:2"]);
  const a = run.bundle.attempts.attempts[0];
  // Started at 0, opened at 5, events at 15 and 25: the idle limit ends at 525.
  assert.equal(a.completed_at_ms, 525);
  assert.deepEqual(a.outcome, { class: "retryable", kind: "timeout_before_response" });
  checkLog(run.sealed, events);
});

test("first-byte timeout: a dispatch that never opens its stream is abandoned at the limit", async () => {
  const time = fakeTime();
  let calls = 0;
  const dispatch = async (/** @type {any} */ step) => {
    calls++;
    if (calls === 1) return new Promise(() => {});
    return (async function* () {
      yield* WORDS;
    })();
  };
  const run = started(streamPolicy("tentative", { first_byte_timeout_ms: 300 }), dispatch, {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
  });
  const { events, error } = await collect(run);
  assert.equal(error, undefined);
  assert.deepEqual(kinds(events), ["delta:2", "delta:2", "delta:2", "commit:2"]);
  const a = run.bundle.attempts.attempts[0];
  assert.equal(a.completed_at_ms, 300);
  assert.equal(a.stream.events, 0);
  assert.deepEqual(a.outcome, { class: "retryable", kind: "timeout_before_response" });
  checkLog(run.sealed, events);
});

test("early break: the provider stream is closed, the attempt recorded as cancelled, the run sealed", async () => {
  const time = fakeTime();
  const { dispatch, closed, signals } = scripted(time, [{ events: WORDS }]);
  const run = started(streamPolicy("tentative"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const events = [];
  for await (const ev of run) {
    events.push(ev);
    if (events.length === 2) break;
  }
  assert.deepEqual(closed, [1]);
  assert.equal(signals[0]?.aborted, true);
  assert.equal(run.terminal, "stop_indeterminate");
  const a = run.bundle.attempts.attempts[0];
  assert.equal(a.stream.events, 2);
  assert.deepEqual(a.outcome, { class: "indeterminate", kind: "stream_interrupted_after_output" });
  // The log goes on with the invalidate the consumer did not stay for.
  assert.deepEqual(
    run.bundle.stream_events.map((/** @type {any} */ e) => e.kind),
    ["delta", "delta", "invalidate"],
  );
  checkLog(run.sealed, events, true);
});

test("the caller's signal during an attempt: the stream is aborted, invalidated, and the run ends cancelled", async () => {
  const time = fakeTime();
  const controller = new AbortController();
  const { dispatch } = scripted(time, [{ events: WORDS.slice(0, 2), stall: true }]);
  const run = started(streamPolicy("tentative"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, signal: controller.signal });
  const events = [];
  let error;
  try {
    for await (const ev of run) {
      events.push(ev);
      if (events.length === 2) controller.abort(new Error("user stop"));
    }
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof RunCancelledError, String(error));
  assert.deepEqual(kinds(events), ["delta:1", "delta:1", "invalidate:1"]);
  assert.equal(run.bundle.attempts.attempts[0].outcome.kind, "stream_interrupted_after_output");
  checkLog(run.sealed, events);
});

test("a policy without a stream section and a wrong key are refused before any dispatch", () => {
  const dispatch = () => {
    throw new Error("never");
  };
  assert.throws(() => runStream(policyWith(() => {}), dispatch, { idempotencyKey: KEY }), { code: "invalid_stream_contract" });
  assert.throws(() => runStream(streamPolicy("buffer"), dispatch, { idempotencyKey: "other" }), { code: "idempotency_key_drift" });
});

test("a run is iterated once", async () => {
  const time = fakeTime();
  const { dispatch } = scripted(time, [{ events: WORDS }]);
  const run = started(streamPolicy("buffer"), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  await collect(run);
  assert.throws(() => run[Symbol.asyncIterator](), TypeError);
});
