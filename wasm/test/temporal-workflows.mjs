// The Temporal tests' workflow code, bundled for the workflow isolate
// (retryledger/temporal runs the core there). node --test imports it too: it
// only defines functions.
import { proxySinks, workflowInfo } from "@temporalio/workflow";
import { runAttempts } from "../dist/temporal.js";

export { retryledgerRun } from "../dist/temporal.js";

/**
 * One logical request; `attempts` is the activity retry policy's maximum
 * attempts (`null`: the helper's own, one).
 * @param {string} policy @param {string} key @param {string} base @param {number | null} attempts
 * @param {number} [timeoutS] each attempt's start-to-close timeout, seconds
 */
export async function scriptedRun(policy, key, base, attempts, timeoutS = 20) {
  const out = await runAttempts({
    policy,
    activity: "loopbackAttempt",
    idempotencyKey: key,
    args: [base],
    startToCloseTimeout: timeoutS * 1000,
    ...(attempts === null ? {} : { retry: { maximumAttempts: attempts } }),
  });
  /** @type {any} */
  const sinks = proxySinks();
  sinks.probe.sealed(workflowInfo().workflowId, out.receiptSha256);
  return out;
}
