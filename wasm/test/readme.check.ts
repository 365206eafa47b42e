// README's TypeScript example, type-checked (tsconfig.check.json) against the
// declarations; readme.test.mjs checks that README.md and wasm/README.md show
// exactly the body below and runs it against a fake client.
import OpenAI from "openai";
import { buildPolicy, compilePolicy, idempotencyKeySha256, liftRequest, runWithPolicy, type PolicySpec, type RouteSpec } from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";

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

declare const spec: Omit<PolicySpec, "routes"> & { routes: (RouteSpec & { route_id: string })[] };
declare const urls: Record<string, string>;

export async function openaiExample(): Promise<void> {
// openai:begin
const params = { model: "gpt-4.1-mini", messages: [{ role: "user" as const, content: "Summarize the incident." }], temperature: 0.2 };
const request = liftRequest("openai.chat.completions", params);  // the model stays out of the digest
const policy = buildPolicy(request, { ...spec, idempotency_key_sha256: idempotencyKeySha256("incident-42") });
const clients = Object.fromEntries(spec.routes.map((r) =>
  [r.route_id, new OpenAI({ baseURL: urls[r.route_id], apiKey: "sk-test", maxRetries: 0 })]));
const run = await runWithOpenAI(policy, clients, (client, options) => client.chat.completions.create(params, options),
  { idempotencyKey: "incident-42" });
console.log(run.sealed.receipt_sha256);
// openai:end
}
