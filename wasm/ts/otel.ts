/**
 * OpenTelemetry for sealed runs: one span per logical run and one child span
 * per attempt, with the semantic-convention attributes and `retryledger.*`,
 * plus counters and duration histograms — all read from the run's documents
 * (bundle and receipt), so telemetry can never disagree with the receipt and
 * never changes a decision.
 *
 * `@opentelemetry/api` (>= 1.3, < 2) is an optional peer dependency: install
 * it to use this entry point (`retryledger/otel`).
 *
 * ```ts
 * import { trace, metrics } from "@opentelemetry/api";
 * import { runTelemetry } from "retryledger/otel";
 * const telemetry = runTelemetry({ tracer: trace.getTracer("app"), meter: metrics.getMeter("app"), operation: "chat",
 *   routes: { "private-primary": { provider: "private", model: "summarizer-7b" } } });
 * const started = Date.now();
 * try { const run = await runWithPolicy(policy, dispatch, options); telemetry.record(run, started); }
 * catch (e) { if (e instanceof RunStoppedError) telemetry.record(e, started); throw e; }
 * ```
 *
 * Attempt spans carry their real start and end (the run clock offset from the
 * run's wall-clock start); they are written when the run is recorded, so an
 * HTTP client's own spans are not nested under them. docs/TELEMETRY.md.
 */

import { SpanKind, SpanStatusCode, context, trace, type Attributes, type Context, type Meter, type Tracer } from "@opentelemetry/api";
import type { Attempt, Bundle, Receipt, ScheduleEntry, Usage } from "./types.js";

/** What a route calls, for the `gen_ai.*` attributes. */
export interface RouteTelemetry {
  /** `gen_ai.provider.name` (e.g. `openai`, `anthropic`, `gcp.gemini`). */
  provider?: string;
  /** `gen_ai.request.model` when the attempt recorded no requested model. */
  model?: string;
}

/** Where the spans and measurements go, and what the routes call. */
export interface TelemetryOptions {
  /** The tracer that writes the run and attempt spans. */
  tracer: Tracer;
  /** The meter for the counters and histograms (none when absent). */
  meter?: Meter | undefined;
  /** `gen_ai.operation.name` (`chat`, `text_completion`, `embeddings`, …). */
  operation?: string | undefined;
  /** Per route id: its provider and model. */
  routes?: Readonly<Record<string, RouteTelemetry>> | undefined;
}

/** A sealed run as the drivers hand it out: a run result, a `RunStoppedError`, or the sealed run itself. */
export interface RecordableRun {
  readonly sealed?: { readonly bundle: Bundle; readonly receipt_sha256: string } | undefined;
  readonly bundle?: Bundle | undefined;
  readonly receipt_sha256?: string | undefined;
}

/** One span as `spansOf` describes it (the same description the Python package computes). */
export interface SpanDescription {
  name: string;
  /** Offset of the start from the run's start, ms. */
  start_ms: number;
  /** Offset of the end from the run's start, ms. */
  end_ms: number;
  attributes: Attributes;
  /** The error's type when the span failed (its status is then ERROR). */
  error?: string;
}

/** The run's span and its attempts' spans, described from its documents. */
export interface RunSpans {
  run: SpanDescription;
  attempts: SpanDescription[];
}

function usageTokens(usage: Usage | undefined): Attributes {
  if (usage === undefined) return {};
  const n = (k: string): number => usage[k] ?? 0;
  const out: Attributes = {};
  if ("input" in usage || "cached_input" in usage) out["gen_ai.usage.input_tokens"] = n("input") + n("cached_input");
  if ("output" in usage || "reasoning" in usage) out["gen_ai.usage.output_tokens"] = n("output") + n("reasoning");
  return out;
}

function spanName(operation: string | undefined, model: string | undefined, fallback: string): string {
  if (operation !== undefined && model !== undefined) return `${operation} ${model}`;
  return operation ?? fallback;
}

/**
 * The spans of a sealed run, described from its bundle and receipt digest:
 * what `record` writes. Pure: the same documents give the same description.
 */
export function spansOf(bundle: Bundle, receiptSha256: string, options: Omit<TelemetryOptions, "tracer" | "meter"> = {}): RunSpans {
  const receipt: Receipt = bundle.receipt;
  const routes = options.routes ?? {};
  const operation = options.operation;
  const schedule = new Map<number, ScheduleEntry>(receipt.schedule.map((s) => [s.ordinal, s]));
  const attempts = bundle.attempts.attempts.map((a: Attempt): SpanDescription => {
    const s = schedule.get(a.ordinal);
    const route = routes[a.route_id] ?? {};
    const attributes: Attributes = {
      "retryledger.route_id": a.route_id,
      "retryledger.ordinal": a.ordinal,
      "retryledger.route_ordinal": a.route_ordinal,
      "retryledger.route_release_sha256": a.route_release_sha256,
      "retryledger.outcome.class": a.outcome.class,
      "retryledger.cost": a.cost,
    };
    if (a.ordinal > 1) attributes["http.request.resend_count"] = a.ordinal - 1;
    if (operation !== undefined) attributes["gen_ai.operation.name"] = operation;
    if (route.provider !== undefined) attributes["gen_ai.provider.name"] = route.provider;
    // The model the attempt recorded asking for (else the route's), and the one the answer named.
    const requested = a.model?.requested ?? route.model;
    if (requested !== undefined) attributes["gen_ai.request.model"] = requested;
    if (a.model?.served !== undefined) attributes["gen_ai.response.model"] = a.model.served;
    Object.assign(attributes, usageTokens(a.usage));
    if (s !== undefined) {
      attributes["retryledger.delay_ms"] = s.delay_ms;
      attributes["retryledger.not_before_ms"] = s.not_before_ms;
      attributes["retryledger.retry_after_floor_ms"] = s.retry_after_floor_ms;
    }
    if (a.outcome.class !== "success") attributes["retryledger.outcome.kind"] = a.outcome.kind;
    const breaker = a.admission?.breaker;
    if (breaker !== undefined) {
      attributes["retryledger.breaker.generation"] = breaker.generation;
      attributes["retryledger.breaker.probe"] = breaker.probe;
    }
    if (a.reconciled !== undefined) attributes["retryledger.reconciled"] = a.reconciled;
    const span: SpanDescription = {
      name: spanName(operation, requested, "retryledger.attempt"),
      start_ms: a.started_at_ms,
      end_ms: a.completed_at_ms,
      attributes,
    };
    if (a.outcome.class !== "success") {
      span.error = a.outcome.kind;
      attributes["error.type"] = a.outcome.kind;
    }
    return span;
  });
  const final = receipt.final_route_id === undefined ? undefined : routes[receipt.final_route_id];
  // The last attempt's models, when it recorded them.
  const last = bundle.attempts.attempts[bundle.attempts.attempts.length - 1]?.model;
  const finalModel = last?.requested ?? final?.model;
  const run: SpanDescription = {
    name: spanName(operation, finalModel, "retryledger.run"),
    start_ms: 0,
    end_ms: receipt.finished_at_ms,
    attributes: {
      "retryledger.terminal": receipt.terminal,
      "retryledger.attempt_count": receipt.attempt_count,
      "retryledger.fallback_used": receipt.fallback_used,
      "retryledger.total_cost": receipt.total_cost,
      "retryledger.policy_sha256": receipt.policy_sha256,
      "retryledger.attempts_sha256": receipt.attempts_sha256,
      "retryledger.receipt_sha256": receiptSha256,
    },
  };
  if (operation !== undefined) run.attributes["gen_ai.operation.name"] = operation;
  if (receipt.final_route_id !== undefined) run.attributes["retryledger.final_route_id"] = receipt.final_route_id;
  if (final?.provider !== undefined) run.attributes["gen_ai.provider.name"] = final.provider;
  if (finalModel !== undefined) run.attributes["gen_ai.request.model"] = finalModel;
  if (last?.served !== undefined) run.attributes["gen_ai.response.model"] = last.served;
  if (receipt.terminal !== "completed") {
    run.error = receipt.terminal;
    run.attributes["error.type"] = receipt.terminal;
  }
  return { run, attempts };
}

/** Records sealed runs as spans and measurements. */
export interface RunTelemetry {
  /**
   * Write the run's spans (and measurements) for a run result, a
   * `RunStoppedError` or a sealed run. `startedAtUnixMs` is the wall clock
   * when the run started (default: now minus the run's `finished_at_ms`,
   * right for a run recorded as it ends). The run span is a child of the
   * active context's span. Returns the description written.
   */
  record(run: RecordableRun, startedAtUnixMs?: number, parent?: Context): RunSpans;
}

function partsOf(run: RecordableRun): { bundle: Bundle; receiptSha256: string } {
  const sealed = run.sealed;
  if (sealed !== undefined) return { bundle: sealed.bundle, receiptSha256: sealed.receipt_sha256 };
  if (run.bundle !== undefined && run.receipt_sha256 !== undefined) return { bundle: run.bundle, receiptSha256: run.receipt_sha256 };
  throw new TypeError("record() takes a run result, a RunStoppedError or a sealed run");
}

/** Telemetry for sealed runs (see the module comment). */
export function runTelemetry(options: TelemetryOptions): RunTelemetry {
  const { tracer, meter } = options;
  const attemptsCounter = meter?.createCounter("retryledger.attempts", { description: "Physical attempts, by route and outcome", unit: "{attempt}" });
  const runsCounter = meter?.createCounter("retryledger.runs", { description: "Logical runs, by terminal", unit: "{run}" });
  const runDuration = meter?.createHistogram("retryledger.run.duration", { description: "Duration of a logical run", unit: "s" });
  const attemptDuration = meter?.createHistogram("retryledger.attempt.duration", { description: "Duration of one attempt", unit: "s" });
  return {
    record(run: RecordableRun, startedAtUnixMs?: number, parent?: Context): RunSpans {
      const { bundle, receiptSha256 } = partsOf(run);
      const spans = spansOf(bundle, receiptSha256, options);
      const t0 = startedAtUnixMs ?? Date.now() - spans.run.end_ms;
      const at = (ms: number): number => t0 + ms;
      const runSpan = tracer.startSpan(spans.run.name, { kind: SpanKind.INTERNAL, startTime: at(spans.run.start_ms), attributes: spans.run.attributes }, parent ?? context.active());
      if (spans.run.error !== undefined) runSpan.setStatus({ code: SpanStatusCode.ERROR, message: spans.run.error });
      const inRun = trace.setSpan(parent ?? context.active(), runSpan);
      for (const a of spans.attempts) {
        const span = tracer.startSpan(a.name, { kind: SpanKind.CLIENT, startTime: at(a.start_ms), attributes: a.attributes }, inRun);
        if (a.error !== undefined) span.setStatus({ code: SpanStatusCode.ERROR, message: a.error });
        span.end(at(a.end_ms));
        const labels: Attributes = {
          "retryledger.route_id": a.attributes["retryledger.route_id"],
          "retryledger.outcome.class": a.attributes["retryledger.outcome.class"],
        };
        if (a.error !== undefined) labels["error.type"] = a.error;
        attemptsCounter?.add(1, labels);
        attemptDuration?.record((a.end_ms - a.start_ms) / 1000, labels);
      }
      runSpan.end(at(spans.run.end_ms));
      const terminal: Attributes = { "retryledger.terminal": spans.run.attributes["retryledger.terminal"] };
      runsCounter?.add(1, terminal);
      runDuration?.record(spans.run.end_ms / 1000, terminal);
      return spans;
    },
  };
}
