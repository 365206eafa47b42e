/**
 * What the workflow side (`retryledger/temporal`) and the worker side
 * (`retryledger/temporal/worker`) share: the documents between workflow and
 * activity, and the check of the activity retry policy. No core, no Node
 * built-in: safe in the workflow isolate.
 */

import type { RetryPolicy } from "@temporalio/common";
import { PolicyError } from "./errors.js";
import type { Bundle, DispatchDecision, Receipt } from "./types.js";

/** The only activity retry policy attempts run under. */
export const ONE_ATTEMPT: Readonly<RetryPolicy> = Object.freeze({ maximumAttempts: 1 });

/**
 * The activity retry policy to dispatch attempts under: `undefined` is
 * {@link ONE_ATTEMPT}; a policy of exactly one attempt is kept; any other
 * (Temporal's default, `{}`, retries without limit) throws `PolicyError`
 * `retry_owner_not_harness`: the engine would retry attempts the core never saw.
 */
export function checkRetryPolicy(retry: RetryPolicy | undefined): RetryPolicy {
  if (retry === undefined) return { ...ONE_ATTEMPT };
  const n = retry.maximumAttempts;
  if (n !== 1) {
    const what = n === undefined || n === 0 ? "without limit" : `up to ${String(n)} times`;
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness at /retry/maximumAttempts: the activity retry policy retries ${what}; retries must be owned by the harness, set maximumAttempts: 1 (one activity execution per planned attempt)`,
      { path: "/retry/maximumAttempts" },
    );
  }
  return retry;
}

/** What the workflow hands the activity of one attempt. */
export interface AttemptInput {
  /** The planned dispatch, as the core decided it. */
  decision: DispatchDecision;
  /** The raw idempotency key (its digest is the policy's). */
  idempotencyKey: string;
  /** When the attempt started on the run clock, ms. */
  startedAtMs: number;
  /** The caller's arguments for the attempt. */
  args: unknown[];
  /** Whether the run has a price schedule (`step.usage` works). */
  priced: boolean;
}

/** What the activity reports of its attempt: facts only. */
export interface AttemptReport {
  /** The facts as JSON text (`retryledger` `Facts`). */
  facts: string;
  /** The value the attempt returned (on `result: "returned"`). */
  value?: unknown;
  /** A cost charged by hand. */
  cost?: number;
  /** Raw usage (kind -> units), priced by the core in the workflow. */
  usage?: Record<string, number>;
  /** SHA-256 of the request body the attempt sent. */
  requestBodySha256?: string;
}

/**
 * The workflow's result: the sealed run, in the one result shape of every
 * driver (value, receipt, `receipt_sha256`, bundle), so `otel.record` and the
 * inspector take it. Plain JSON: it crosses Temporal's data converter.
 */
export interface RunOutput {
  /** How the run ended (`completed`, `stop_route_exhausted`, ...). */
  terminal: string;
  /** The sealed receipt. */
  receipt: Receipt;
  /** SHA-256 of the receipt's canonical JSON. */
  receipt_sha256: string;
  /** The bundle (policy, attempts, receipt). */
  bundle: Bundle;
  /** The bundle as canonical JSON (what `verifyBundle` reads). */
  bundle_json: string;
  /** `receipt_sha256`, under its earlier name. */
  receiptSha256: string;
  /** `bundle_json`, under its earlier name. */
  bundleJson: string;
  /** The successful attempt's value, for a completed run. */
  value?: unknown;
}
