// Price schedules in the driver: `priceSchedule` is checked against the policy
// before any dispatch, `step.usage(units)` charges the core's price, and the
// openai and anthropic integrations charge an SDK result's usage themselves.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import { createHash } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { openaiUsageUnits, runWithOpenAI } from "../dist/openai.js";
import { anthropicUsageUnits, runWithAnthropic } from "../dist/anthropic.js";
import { KEY, fakeTime } from "./helpers.mjs";
import { scriptedServer } from "./loopback.mjs";

/** @typedef {import("../dist/index.js").Step} Step */
/** @typedef {import("../dist/index.js").Policy} Policy */
/** @typedef {import("../dist/index.js").PriceSchedule} PriceSchedule */
/** @typedef {import("./loopback.mjs").Reply} Reply */

const here = path.dirname(fileURLToPath(import.meta.url));

/** The policy and schedule of price.json's first case (their release digests match). */
function priceCase() {
  const doc = JSON.parse(fs.readFileSync(path.resolve(here, "../../tests/vectors/price.json"), "utf8"));
  const c = doc.cases[0];
  /** @type {Policy} */
  const policy = JSON.parse(c.input.policy);
  /** @type {PriceSchedule} */
  const schedule = JSON.parse(c.input.schedule);
  /** @type {string} the digest the vector expects `check_price_schedule` to answer */
  const expected = c.expect.ok;
  return { policy, schedule, expected };
}

const { policy: POLICY, schedule: SCHEDULE, expected: SCHEDULE_SHA256 } = priceCase();
const PRIMARY = /** @type {string} */ (POLICY.routes[0]?.route_release_sha256);
const FALLBACK = /** @type {string} */ (POLICY.routes[1]?.route_release_sha256);

/** @param {Policy} policy */
function costs(policy) {
  return policy.routes.map((r) => r.reserve_cost);
}

/** The coded error `fn` throws. @param {() => unknown} fn @returns {rl.RetryledgerError} */
function thrown(fn) {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof rl.RetryledgerError, String(e));
    return e;
  }
  assert.fail("no error thrown");
}

test("the policy and schedule of price.json fit: checkPriceSchedule gives the vector's digest", () => {
  assert.equal(rl.checkPriceSchedule(POLICY, SCHEDULE), SCHEDULE_SHA256);
  assert.equal(SCHEDULE_SHA256, rl.digest(SCHEDULE));
  assert.deepEqual(costs(POLICY), [1500, 3000]);
});

test("reported usage is charged exactly the core's price; an attempt that reports none keeps its reservation", async () => {
  const time = fakeTime();
  const usage = { input: 1234, output: 567 };
  /** @type {Step[]} */
  const steps = [];
  /** @param {Step} step */
  const dispatch = async (step) => {
    steps.push(step);
    time.advance(10);
    assert.equal(step.priced, true);
    if (steps.length === 1) throw rl.AttemptError.retryable("unavailable");
    step.usage(usage);
    return "summary";
  };
  const run = await rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, priceSchedule: SCHEDULE });
  assert.equal(run.result, "summary");
  const expected = rl.priceCost(SCHEDULE, PRIMARY, usage);
  // ceil(1234 * 50000 / 10^6) + ceil(567 * 200000 / 10^6) = 62 + 114
  assert.equal(expected, 176);
  assert.deepEqual(
    run.bundle.attempts.attempts.map((a) => a.cost),
    [1500, expected],
  );
  assert.equal(run.receipt.total_cost, 1500 + expected);
});

test("usage reports add up and are recorded raw; a hand charge on the same attempt is charge_with_usage; the schedule may be given as text", async () => {
  const time = fakeTime();
  /** @type {string[]} */
  const refused = [];
  /** @param {Step} step */
  const dispatch = (step) => {
    step.usage({ input: 1000 });
    step.usage({ output: 1 });
    try {
      step.charge(7);
    } catch (e) {
      assert.ok(e instanceof rl.PolicyError, String(e));
      refused.push(e.code);
    }
    return "ok";
  };
  const run = await rl.runWithPolicy(POLICY, dispatch, {
    idempotencyKey: KEY,
    clock: time.clock,
    sleep: time.sleep,
    priceSchedule: JSON.stringify(SCHEDULE),
  });
  assert.deepEqual(refused, ["charge_with_usage"]);
  const [attempt] = run.bundle.attempts.attempts;
  assert.deepEqual(attempt?.usage, { input: 1000, output: 1 });
  assert.equal(attempt?.cost, 50 + 1);
  // The receipt binds the schedule, the bundle carries it, and replay prices it again.
  assert.equal(run.receipt.price_schedule_sha256, rl.digest(SCHEDULE));
  assert.deepEqual(run.bundle.price_schedule, SCHEDULE);
  assert.equal(rl.digest(JSON.stringify(run.bundle)), rl.digest(run.sealed.bundle_json));
  assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
});

test("a charge excludes usage on the same attempt", async () => {
  /** @type {string[]} */
  const refused = [];
  /** @param {Step} step */
  const dispatch = (step) => {
    step.charge(7);
    try {
      step.usage({ input: 1 });
    } catch (e) {
      assert.ok(e instanceof rl.PolicyError, String(e));
      refused.push(e.code);
    }
    return "ok";
  };
  const run = await rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, priceSchedule: SCHEDULE });
  assert.deepEqual(refused, ["charge_with_usage"]);
  assert.equal(run.bundle.attempts.attempts[0]?.cost, 7);
  assert.equal(run.bundle.attempts.attempts[0]?.usage, undefined);
});

test("a request body is recorded per attempt and must not change on a retry of its route", async () => {
  const time = fakeTime();
  const body = JSON.stringify({ model: "m", input: "hi" });
  /** @param {string} sent @returns {(step: Step) => string} */
  const sending = (sent) => (step) => {
    step.requestBody(step.ordinal === 1 ? body : sent);
    if (step.ordinal === 1) throw rl.AttemptError.retryable("unavailable");
    return "ok";
  };
  const run = await rl.runWithPolicy(POLICY, sending(body), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const digest = createHash("sha256").update(body).digest("hex");
  assert.deepEqual(
    run.bundle.attempts.attempts.map((a) => a.request_body_sha256),
    [digest, digest],
  );
  assert.equal(rl.verifyBundle(run.sealed.bundle_json).kind, "verified");
  // Bytes hash as bytes.
  const bytes = new TextEncoder().encode(body);
  const again = await rl.runWithPolicy(POLICY, (step) => (step.requestBody(bytes), "ok"), { idempotencyKey: KEY });
  assert.equal(again.bundle.attempts.attempts[0]?.request_body_sha256, digest);
  await assert.rejects(rl.runWithPolicy(POLICY, sending(body + " "), { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }), (e) => {
    assert.ok(e instanceof rl.DriftError, String(e));
    assert.equal(e.code, "request_body_drift");
    return true;
  });
});

test("a schedule missing a route's release, or in another cost unit, is refused before any dispatch", async () => {
  let dispatched = 0;
  const dispatch = () => {
    dispatched += 1;
    return "never";
  };
  /** @type {PriceSchedule} */
  const missing = { ...SCHEDULE, releases: SCHEDULE.releases.filter((r) => r.route_release_sha256 !== FALLBACK) };
  await assert.rejects(rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, priceSchedule: missing }), (e) => {
    assert.ok(e instanceof rl.PolicyError, String(e));
    assert.equal(e.code, "price_schedule_missing_release");
    return true;
  });
  /** @type {PriceSchedule} */
  const otherUnit = { ...SCHEDULE, cost_unit: "micro_eur" };
  await assert.rejects(rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, priceSchedule: otherUnit }), (e) => {
    assert.ok(e instanceof rl.PolicyError, String(e));
    assert.equal(e.code, "cost_unit_mismatch");
    return true;
  });
  assert.equal(dispatched, 0);
});

test("bad usage throws the core's coded error from step.usage; nothing is charged, the reservation stays", async () => {
  const time = fakeTime();
  /** @type {string[]} */
  const codes = [];
  /** @param {Step} step */
  const dispatch = (step) => {
    // The primary release prices input and output only.
    codes.push(thrown(() => step.usage({ reasoning: 5 })).code);
    codes.push(thrown(() => step.usage({ input: -1 })).code);
    codes.push(thrown(() => step.usage({ input: 1.5 })).code);
    return "ok";
  };
  const run = await rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep, priceSchedule: SCHEDULE });
  assert.deepEqual(codes, ["usage_unpriced", "integer_out_of_range", "float_value"]);
  assert.deepEqual(
    run.bundle.attempts.attempts.map((a) => a.cost),
    [1500],
  );
});

test("usage without a price schedule throws price_schedule_missing_release", async () => {
  const time = fakeTime();
  /** @type {rl.RetryledgerError | undefined} */
  let error;
  /** @param {Step} step */
  const dispatch = (step) => {
    assert.equal(step.priced, false);
    error = thrown(() => step.usage({ input: 1 }));
    return "ok";
  };
  const run = await rl.runWithPolicy(POLICY, dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  assert.ok(error instanceof rl.PolicyError);
  assert.equal(error.code, "price_schedule_missing_release");
  assert.match(error.message, /no price schedule/);
  assert.deepEqual(
    run.bundle.attempts.attempts.map((a) => a.cost),
    [1500],
  );
});

test("openai usage units: chat completions and the responses API, cached and reasoning split out, zero kinds left out", () => {
  assert.deepEqual(
    openaiUsageUnits({
      usage: {
        prompt_tokens: 1000,
        completion_tokens: 300,
        prompt_tokens_details: { cached_tokens: 200 },
        completion_tokens_details: { reasoning_tokens: 100 },
      },
    }),
    { input: 800, cached_input: 200, output: 200, reasoning: 100 },
  );
  assert.deepEqual(
    openaiUsageUnits({ usage: { prompt_tokens: 10, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 0 } } }),
    { input: 10, output: 5 },
  );
  assert.deepEqual(
    openaiUsageUnits({
      usage: { input_tokens: 50, output_tokens: 40, input_tokens_details: { cached_tokens: 50 }, output_tokens_details: { reasoning_tokens: 30 } },
    }),
    { cached_input: 50, output: 10, reasoning: 30 },
  );
  assert.equal(openaiUsageUnits("text"), undefined);
  assert.equal(openaiUsageUnits({ usage: null }), undefined);
  assert.deepEqual(anthropicUsageUnits({ usage: { input_tokens: 7, output_tokens: 3, cache_read_input_tokens: 4 } }), {
    input: 7,
    cached_input: 4,
    output: 3,
  });
  assert.deepEqual(anthropicUsageUnits({ usage: { input_tokens: 7, output_tokens: 0, cache_read_input_tokens: null } }), { input: 7 });
  assert.equal(anthropicUsageUnits({}), undefined);
});

/** A chat.completion with a usage block. @param {Record<string, unknown>} usage @returns {Reply} */
const completion = (usage) => ({
  status: 200,
  body: {
    id: "chatcmpl-fake",
    object: "chat.completion",
    created: 1,
    model: "fake",
    choices: [{ index: 0, message: { role: "assistant", content: "summary" }, finish_reason: "stop" }],
    usage,
  },
});

test("openai against a loopback server: each completion's usage is charged automatically, a failed attempt keeps its reservation", async () => {
  const provider = await scriptedServer({
    primary: [{ status: 503, headers: { "retry-after-ms": "10" }, body: { error: { message: "overloaded", type: "server_error" } } }],
    fallback: [
      completion({
        prompt_tokens: 1000,
        completion_tokens: 300,
        total_tokens: 1300,
        prompt_tokens_details: { cached_tokens: 200 },
        completion_tokens_details: { reasoning_tokens: 100 },
      }),
    ],
  });
  try {
    const clients = {
      "private-primary": new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/primary`, maxRetries: 0 }),
      "external-fallback": new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/fallback`, maxRetries: 0 }),
    };
    const run = await runWithOpenAI(
      POLICY,
      clients,
      (client, options) => client.chat.completions.create({ model: "fake", messages: [{ role: "user", content: "summarize" }] }, options),
      { idempotencyKey: KEY, priceSchedule: SCHEDULE },
    );
    assert.equal(run.result.choices[0]?.message.content, "summary");
    const expected = rl.priceCost(SCHEDULE, FALLBACK, { input: 800, cached_input: 200, output: 200, reasoning: 100 });
    // ceil(800 * 0.15) + ceil(200 * 0.075) + ceil(200 * 0.6) + ceil(100 * 0.6)
    assert.equal(expected, 120 + 15 + 120 + 60);
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => [a.route_id, a.cost]),
      [
        ["private-primary", 1500],
        ["private-primary", 1500],
        ["external-fallback", expected],
      ],
    );
    assert.equal(provider.seen.length, 3);
  } finally {
    await provider.close();
  }
});

test("openai without a price schedule charges nothing itself: the attempt keeps its reservation", async () => {
  const provider = await scriptedServer({ primary: [completion({ prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 })] });
  try {
    const client = new OpenAI({ apiKey: "test-key", baseURL: `${provider.base}/primary`, maxRetries: 0 });
    const run = await runWithOpenAI(
      POLICY,
      client,
      (c, options) => c.chat.completions.create({ model: "fake", messages: [{ role: "user", content: "summarize" }] }, options),
      { idempotencyKey: KEY },
    );
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => a.cost),
      [1500],
    );
  } finally {
    await provider.close();
  }
});

test("anthropic against a loopback server: the message's usage is charged automatically", async () => {
  const provider = await scriptedServer({
    primary: [
      {
        status: 200,
        body: {
          id: "msg_fake",
          type: "message",
          role: "assistant",
          model: "claude-fake",
          content: [{ type: "text", text: "summary" }],
          stop_reason: "end_turn",
          stop_sequence: null,
          usage: { input_tokens: 1000, output_tokens: 250, cache_read_input_tokens: 0 },
        },
      },
    ],
  });
  try {
    const client = new Anthropic({ apiKey: "test-key", baseURL: `${provider.base}/primary`, maxRetries: 0 });
    const run = await runWithAnthropic(
      POLICY,
      client,
      (c, options) => c.messages.create({ model: "claude-fake", max_tokens: 256, messages: [{ role: "user", content: "summarize" }] }, options),
      { idempotencyKey: KEY, priceSchedule: SCHEDULE },
    );
    const expected = rl.priceCost(SCHEDULE, PRIMARY, { input: 1000, output: 250 });
    assert.equal(expected, 50 + 50);
    assert.deepEqual(
      run.bundle.attempts.attempts.map((a) => a.cost),
      [expected],
    );
  } finally {
    await provider.close();
  }
});

test("anthropic usage units are the Python package's: cache writes are their own kind", () => {
  assert.deepEqual(
    anthropicUsageUnits({ usage: { input_tokens: 10, output_tokens: 5, cache_read_input_tokens: 3, cache_creation_input_tokens: 2 } }),
    { input: 10, cached_input: 3, cache_creation_input: 2, output: 5 },
  );
});
