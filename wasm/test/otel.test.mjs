// OpenTelemetry from sealed runs: the run span and one child span per
// attempt, with the semantic-convention and retryledger.* attributes, and the
// counters and histograms, written to the SDK's in-memory exporters.
import { test } from "node:test";
import assert from "node:assert/strict";

import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { SpanStatusCode } from "@opentelemetry/api";

import * as rl from "../dist/index.js";
import { runTelemetry, spansOf } from "../dist/otel.js";
import { KEY, fakeTime, referencePolicy } from "./helpers.mjs";

const ROUTES = {
  "private-primary": { provider: "private", model: "summarizer-7b" },
  "external-fallback": { provider: "openai", model: "gpt-4.1-mini" },
};

function setup() {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 3_600_000 });
  const meters = new MeterProvider({ readers: [reader] });
  const telemetry = runTelemetry({ tracer: provider.getTracer("test"), meter: meters.getMeter("test"), operation: "chat", routes: ROUTES });
  return { exporter, reader, metricExporter, telemetry };
}

/** @param {ReturnType<typeof fakeTime>} time @param {{ms: number, error?: unknown, value?: unknown, usage?: Record<string, number>}[]} script */
function scripted(time, script) {
  let n = 0;
  /** @param {import("../dist/index.js").Step} step */
  return async (step) => {
    const s = script[n++];
    if (s === undefined) throw new Error("dispatched beyond the script");
    time.advance(s.ms);
    if (s.error !== undefined) throw s.error;
    return s.value;
  };
}

test("the reference run (two failures on the primary, success on the fallback): a run span and three attempt spans with their attributes", async () => {
  const { exporter, telemetry } = setup();
  const time = fakeTime();
  const dispatch = scripted(time, [
    { ms: 1100, error: rl.AttemptError.retryable("rate_limited", 250) },
    { ms: 100, error: rl.AttemptError.retryable("unavailable") },
    { ms: 750, value: "summary" },
  ]);
  const run = await rl.runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep });
  const t0 = 1_764_000_000_000;
  telemetry.record(run, t0);
  const spans = exporter.getFinishedSpans();
  assert.equal(spans.length, 4);
  const runSpan = spans.find((s) => s.name === "chat gpt-4.1-mini" && s.attributes["retryledger.terminal"] !== undefined);
  assert.ok(runSpan !== undefined);
  const attempts = spans.filter((s) => s !== runSpan);
  // Children of the run span, in order, at their real offsets.
  for (const a of attempts) assert.equal(a.parentSpanContext?.spanId, runSpan.spanContext().spanId);
  const ms = (/** @type {[number, number]} */ hr) => hr[0] * 1000 + hr[1] / 1e6;
  assert.deepEqual(
    attempts.map((a) => [ms(a.startTime) - t0, ms(a.endTime) - t0]),
    run.bundle.attempts.attempts.map((a) => [a.started_at_ms, a.completed_at_ms]),
  );
  assert.deepEqual(attempts.map((a) => a.name), ["chat summarizer-7b", "chat summarizer-7b", "chat gpt-4.1-mini"]);
  const schedule = run.receipt.schedule;
  assert.deepEqual(
    attempts.map((a) => a.attributes),
    [
      {
        "retryledger.route_id": "private-primary", "retryledger.ordinal": 1, "retryledger.route_ordinal": 1,
        "retryledger.route_release_sha256": run.bundle.policy.routes[0]?.route_release_sha256,
        "retryledger.outcome.class": "retryable", "retryledger.outcome.kind": "rate_limited", "retryledger.cost": 1500,
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "private", "gen_ai.request.model": "summarizer-7b",
        "retryledger.delay_ms": 0, "retryledger.not_before_ms": 0, "retryledger.retry_after_floor_ms": 0,
        "error.type": "rate_limited",
      },
      {
        "retryledger.route_id": "private-primary", "retryledger.ordinal": 2, "retryledger.route_ordinal": 2,
        "retryledger.route_release_sha256": run.bundle.policy.routes[0]?.route_release_sha256,
        "retryledger.outcome.class": "retryable", "retryledger.outcome.kind": "unavailable", "retryledger.cost": 1500,
        "http.request.resend_count": 1,
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "private", "gen_ai.request.model": "summarizer-7b",
        "retryledger.delay_ms": schedule[1]?.delay_ms, "retryledger.not_before_ms": schedule[1]?.not_before_ms,
        "retryledger.retry_after_floor_ms": 250,
        "error.type": "unavailable",
      },
      {
        "retryledger.route_id": "external-fallback", "retryledger.ordinal": 3, "retryledger.route_ordinal": 1,
        "retryledger.route_release_sha256": run.bundle.policy.routes[1]?.route_release_sha256,
        "retryledger.outcome.class": "success", "retryledger.cost": 3000,
        "http.request.resend_count": 2,
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4.1-mini",
        "retryledger.delay_ms": schedule[2]?.delay_ms, "retryledger.not_before_ms": schedule[2]?.not_before_ms,
        "retryledger.retry_after_floor_ms": schedule[2]?.retry_after_floor_ms,
      },
    ],
  );
  assert.deepEqual(attempts.map((a) => a.status.code), [SpanStatusCode.ERROR, SpanStatusCode.ERROR, SpanStatusCode.UNSET]);
  assert.deepEqual(runSpan.attributes, {
    "retryledger.terminal": "completed",
    "retryledger.attempt_count": 3,
    "retryledger.fallback_used": true,
    "retryledger.total_cost": run.receipt.total_cost,
    "retryledger.policy_sha256": run.receipt.policy_sha256,
    "retryledger.attempts_sha256": run.receipt.attempts_sha256,
    "retryledger.receipt_sha256": run.sealed.receipt_sha256,
    "gen_ai.operation.name": "chat",
    "retryledger.final_route_id": "external-fallback",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4.1-mini",
  });
  assert.equal(ms(runSpan.endTime) - t0, run.receipt.finished_at_ms);
});

test("a run that stops: the run span and its attempt carry error.type and ERROR status; measurements by route, outcome and terminal", async () => {
  const { exporter, reader, metricExporter, telemetry } = setup();
  const time = fakeTime();
  const dispatch = scripted(time, [{ ms: 40, error: rl.AttemptError.nonRetryable("invalid_request") }]);
  const stopped = await rl.runWithPolicy(referencePolicy(), dispatch, { idempotencyKey: KEY, clock: time.clock, sleep: time.sleep }).then(
    () => assert.fail("the run should stop"),
    (e) => e,
  );
  assert.ok(stopped instanceof rl.RunStoppedError);
  telemetry.record(stopped);
  const [attempt, runSpan] = exporter.getFinishedSpans();
  assert.equal(attempt?.attributes["error.type"], "invalid_request");
  assert.equal(attempt?.attributes["http.request.resend_count"], undefined);
  assert.equal(runSpan?.attributes["error.type"], "stop_non_retryable");
  assert.equal(runSpan?.status.code, SpanStatusCode.ERROR);
  await reader.forceFlush();
  const metrics = metricExporter.getMetrics().flatMap((r) => r.scopeMetrics.flatMap((s) => s.metrics));
  const byName = Object.fromEntries(metrics.map((m) => [m.descriptor.name, m]));
  assert.deepEqual(Object.keys(byName).sort(), ["retryledger.attempt.duration", "retryledger.attempts", "retryledger.run.duration", "retryledger.runs"]);
  const attemptsPoint = byName["retryledger.attempts"]?.dataPoints[0];
  assert.equal(attemptsPoint?.value, 1);
  assert.deepEqual(attemptsPoint?.attributes, { "retryledger.route_id": "private-primary", "retryledger.outcome.class": "non_retryable", "error.type": "invalid_request" });
  assert.deepEqual(byName["retryledger.runs"]?.dataPoints[0]?.attributes, { "retryledger.terminal": "stop_non_retryable" });
});

test("usage recorded on an attempt becomes gen_ai.usage.* tokens; the description is the same pure function of the documents", async () => {
  const price = JSON.parse(
    JSON.parse((await import("node:fs")).readFileSync(new URL("../../tests/vectors/price.json", import.meta.url), "utf8")).cases[0].input.schedule,
  );
  const policy = JSON.parse(
    JSON.parse((await import("node:fs")).readFileSync(new URL("../../tests/vectors/price.json", import.meta.url), "utf8")).cases[0].input.policy,
  );
  const run = await rl.runWithPolicy(policy, (step) => (step.usage({ input: 100, output: 30 }), "ok"), {
    idempotencyKey: KEY,
    priceSchedule: price,
  });
  const spans = spansOf(run.bundle, run.sealed.receipt_sha256, { routes: ROUTES });
  assert.equal(spans.attempts[0]?.attributes["gen_ai.usage.input_tokens"], 100);
  assert.equal(spans.attempts[0]?.attributes["gen_ai.usage.output_tokens"], 30);
  // Cached input counts as input, reasoning as output (the semantic conventions' totals).
  const bundle = structuredClone(run.bundle);
  const first = bundle.attempts.attempts[0];
  assert.ok(first !== undefined);
  first.usage = { cached_input: 20, input: 100, output: 30, reasoning: 5 };
  const summed = spansOf(bundle, run.sealed.receipt_sha256, { routes: ROUTES }).attempts[0]?.attributes;
  assert.equal(summed?.["gen_ai.usage.input_tokens"], 120);
  assert.equal(summed?.["gen_ai.usage.output_tokens"], 35);
  assert.equal(spans.run.name, "retryledger.run");
  assert.deepEqual(spansOf(run.bundle, run.sealed.receipt_sha256, { routes: ROUTES }), spans);
});

test("otel.record takes a journaled run, completed or stopped: the one result shape", async () => {
  const { exporter, telemetry } = setup();
  const time = fakeTime();
  const run = await rl.runJournaled(
    referencePolicy(),
    scripted(time, [{ ms: 40, error: rl.AttemptError.retryable("unavailable") }, { ms: 30, value: "ok" }]),
    { idempotencyKey: KEY, store: new rl.MemoryStore(), runId: "otel-1", clock: time.clock, sleep: time.sleep },
  );
  assert.equal(run.receipt_sha256, run.receiptSha256);
  assert.equal(run.value, run.result);
  assert.equal(rl.verifyBundle(run.bundle_json).kind, "verified");
  telemetry.record(run);
  const spans = exporter.getFinishedSpans();
  assert.equal(spans.length, 3);
  const runSpan = spans.find((s) => s.attributes["retryledger.terminal"] !== undefined);
  assert.equal(runSpan?.attributes["retryledger.receipt_sha256"], run.receiptSha256);
  exporter.reset();
  const stopped = await rl
    .runJournaled(referencePolicy(), scripted(time, [{ ms: 10, error: rl.AttemptError.nonRetryable("invalid_request") }]), {
      idempotencyKey: KEY,
      store: new rl.MemoryStore(),
      runId: "otel-2",
      clock: time.clock,
      sleep: time.sleep,
    })
    .then(
      () => assert.fail("the run stops"),
      (e) => e,
    );
  assert.ok(stopped instanceof rl.JournaledStopError);
  telemetry.record(stopped);
  const after = exporter.getFinishedSpans();
  assert.equal(after.length, 2);
  assert.equal(after.find((s) => s.attributes["retryledger.terminal"] !== undefined)?.attributes["error.type"], "stop_non_retryable");
});
