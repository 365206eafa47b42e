// README's TypeScript example, type-checked (tsconfig.check.json) against the declarations.
import { compilePolicy, runWithPolicy, AttemptError } from "../dist/index.js";

declare const policyJson: string;
declare const idempotencyKey: string;
declare function callModel(
  routeId: string,
  options: { idempotencyKey: string; signal: AbortSignal },
): Promise<{ status: number; retryAfterMs?: number; costMicroUsd: number; text: string }>;

export async function example(): Promise<void> {
  const policy = compilePolicy(policyJson);              // every rule checked once, before any dispatch
  const { result, receipt } = await runWithPolicy(policy, async (step, signal) => {
    const reply = await callModel(step.routeId, { idempotencyKey: step.idempotencyKey, signal });
    if (reply.status === 429) throw AttemptError.retryable("rate_limited", reply.retryAfterMs);
    step.charge(reply.costMicroUsd);                     // else the attempt costs its reserve
    return reply.text;
  }, { idempotencyKey });                                // waits until not_before; RunStoppedError carries the bundle
  console.log(result, receipt.terminal, receipt.attempts_sha256);
}
