// README's TypeScript example, type-checked (tsconfig.check.json) against the
// declarations; readme.test.mjs checks that README.md and wasm/README.md show
// exactly the body below and runs it against a fake client.
import { compilePolicy, runWithPolicy } from "../dist/index.js";

declare const policyJson: string;
declare const idempotencyKey: string;
declare function callModel(
  routeId: string,
  options: { idempotencyKey: string; signal: AbortSignal },
): Promise<{ costMicroUsd: number; text: string }>;

export async function example(): Promise<void> {
// example:begin
const policy = compilePolicy(policyJson);                // every rule checked once, before any dispatch
const { result, receipt } = await runWithPolicy(policy, async (step, signal) => {
  // Throw what the client throws: the core reads its class, status and Retry-After.
  const reply = await callModel(step.routeId, { idempotencyKey: step.idempotencyKey, signal });
  step.charge(reply.costMicroUsd);                       // else the attempt costs its reserve
  return reply.text;
}, { idempotencyKey });                                  // sleeps until not_before; RunStoppedError carries the bundle
console.log(result, receipt.terminal, receipt.attempts_sha256);
// example:end
}
