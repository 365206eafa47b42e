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
 */
export async function scriptedRun(policy, key, base, attempts) {
  const out = await runAttempts({
    policy,
    activity: "loopbackAttempt",
    idempotencyKey: key,
    args: [base],
    startToCloseTimeout: "20s",
    ...(attempts === null ? {} : { retry: { maximumAttempts: attempts } }),
  });
  /** @type {any} */
  const sinks = proxySinks();
  sinks.probe.sealed(workflowInfo().workflowId, out.receiptSha256);
  return out;
}
