/**
 * Temporal, worker side: the attempt activity wrapper and the bundler
 * options the worker bundles workflow code with (docs/TEMPORAL.md).
 *
 * ```ts
 * import { attemptActivity, bundlerOptions } from "retryledger/temporal/worker";
 * const activities = { summarize: attemptActivity((step, signal, text: string) => callTheProvider(step, signal, text)) };
 * await Worker.create({ connection, taskQueue, workflowsPath, activities, bundlerOptions });
 * ```
 */

import { Context } from "@temporalio/activity";
import type { BundleOptions } from "@temporalio/worker";
import "./index.js";
import { bodySha256 } from "./core.js";
import { PolicyError } from "./errors.js";
import { factsText, type Classifier } from "./facts.js";
import { addedCount, chargeWithUsage, type Step } from "./driver.js";
import type { AttemptInput, AttemptReport } from "./temporal-common.js";
import type { DispatchDecision, Usage } from "./types.js";

export { ONE_ATTEMPT, checkRetryPolicy, type AttemptInput, type AttemptReport, type RunOutput } from "./temporal-common.js";

type WebpackConfig = Parameters<NonNullable<BundleOptions["webpackConfigHook"]>>[0];

/**
 * The workflow bundle's webpack configuration with retryledger's glue
 * parsed without URL assets: its default module URL (`new URL(...,
 * import.meta.url)`, used only by the browser's asynchronous `init`) would
 * otherwise become an asset the isolate cannot load. `retryledger/temporal`
 * instantiates the module from bytes bundled as base64 instead.
 */
export function webpackConfigHook(config: WebpackConfig): WebpackConfig {
  const module = (config.module ??= {});
  const rules = (module.rules ??= []);
  rules.push({ test: /[\\/]pkg-web[\\/]retryledger_wasm\.js$/, parser: { url: false } });
  return config;
}

/** `Worker.create({ ..., bundlerOptions })` for workflow code that imports `retryledger/temporal`. */
export const bundlerOptions: NonNullable<Parameters<typeof import("@temporalio/worker").Worker.create>[0]["bundlerOptions"]> = {
  webpackConfigHook,
};

/** One planned attempt as the activity receives it: the drivers' `Step`. */
export class ActivityStep implements Step {
  readonly ordinal: number;
  readonly routeId: string;
  readonly routeOrdinal: number;
  readonly routeReleaseSha256: string;
  readonly idempotencyKey: string;
  readonly remainingMs: number;
  readonly deadlineMs: number;
  readonly startedAtMs: number;
  readonly reserveCost: number;
  readonly decision: DispatchDecision;
  readonly priced: boolean;
  charged: number | undefined = undefined;
  units: Record<string, number> | undefined = undefined;
  bodySha256: string | undefined = undefined;
  delivered = false;
  tokens: number | undefined = undefined;
  /** A Temporal run is never a repair: no logical request is carried, ordinal 0. */
  readonly request: unknown = undefined;
  readonly repairOrdinal = 0;

  constructor(input: AttemptInput) {
    const d = input.decision;
    this.decision = d;
    this.ordinal = d.ordinal;
    this.routeId = d.route_id;
    this.routeOrdinal = d.route_ordinal;
    this.routeReleaseSha256 = d.route_release_sha256;
    this.idempotencyKey = input.idempotencyKey;
    this.startedAtMs = input.startedAtMs;
    this.deadlineMs = d.deadline_ms;
    this.remainingMs = Math.max(0, d.deadline_ms - input.startedAtMs);
    this.reserveCost = d.reserve_cost;
    this.priced = input.priced;
  }

  charge(cost: number): void {
    if (this.units !== undefined) throw chargeWithUsage();
    this.charged = addedCount("charge", "a cost is", this.charged, cost);
  }

  usage(units: Usage): void {
    if (!this.priced) {
      throw new PolicyError(
        "price_schedule_missing_release",
        "price_schedule_missing_release: the run has no price schedule; give priceSchedule to report usage",
        { path: "/priceSchedule" },
      );
    }
    if (this.charged !== undefined) throw chargeWithUsage();
    const merged = { ...(this.units ?? {}) };
    for (const [kind, count] of Object.entries(units as Record<string, number>)) merged[kind] = (merged[kind] ?? 0) + count;
    this.units = merged;
  }

  tokensUsed(tokens: number): void {
    this.tokens = addedCount("tokensUsed", "tokens are", this.tokens, tokens);
  }

  requestBody(body: string | Uint8Array): void {
    this.bodySha256 = bodySha256(body);
  }

  outputDelivered(): void {
    this.delivered = true;
  }

  /** The activity's report of this attempt. */
  report(facts: string, value?: unknown): AttemptReport {
    const r: AttemptReport = { facts };
    if (value !== undefined) r.value = value;
    if (this.charged !== undefined) r.cost = this.charged;
    if (this.units !== undefined) r.usage = this.units;
    if (this.bodySha256 !== undefined) r.requestBodySha256 = this.bodySha256;
    return r;
  }
}

const RETURNED_TEXT = JSON.stringify({ result: "returned" });

/**
 * An attempt activity from a dispatch function (`fn(step, signal, ...args)`,
 * the plain driver's dispatch with the workflow's `args` after it): it runs
 * `fn` once and resolves with the facts of what happened, never rejecting
 * for the attempt's own failure, so Temporal never retries it; the core
 * judges the facts in the workflow. `classify` is the drivers' hook.
 */
export function attemptActivity<A extends unknown[], T>(
  fn: (step: Step, signal: AbortSignal, ...args: A) => Promise<T> | T,
  options: { classify?: Classifier } = {},
): (input: AttemptInput) => Promise<AttemptReport> {
  return async (input: AttemptInput): Promise<AttemptReport> => {
    const step = new ActivityStep(input);
    const signal = Context.current().cancellationSignal;
    try {
      const value = await fn(step, signal, ...(input.args as A));
      return step.report(RETURNED_TEXT, value);
    } catch (e) {
      const facts = factsText(e, {
        classify: options.classify,
        outputDelivered: step.delivered,
        cancelled: signal.aborted,
        nowUnixMs: Date.now(),
      });
      return step.report(facts);
    }
  };
}
