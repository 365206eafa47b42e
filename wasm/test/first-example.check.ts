// Type-checks the READMEs' first example (README.md, wasm/README.md):
// readme-first.test.mjs checks these lines are the example's after its imports.
import OpenAI from "openai";
import { compilePolicyTemplate, idempotencyKeySha256, liftRequest, verifyBundle } from "../dist/index.js";
import { runWithOpenAI } from "../dist/openai.js";

export async function firstExample(): Promise<void> {
// example:begin
const baseUrl = process.env.LLM_BASE_URL ?? "http://127.0.0.1:8080";
const routes = [ // the primary first, then the fallback; prices in micro-USD per million tokens
  { route_id: "primary", provider: "openai", model: "gpt-4.1-mini",
    base_url: `${baseUrl}/primary/v1`, price: { input: 400_000, output: 1_600_000 } },
  { route_id: "fallback", provider: "openai", model: "gpt-4.1-nano",
    base_url: `${baseUrl}/fallback/v1`, price: { input: 100_000, output: 400_000 } },
];
// backoff, deadline, budgets, capabilities from the preset: docs/PRESETS.md
const template = compilePolicyTemplate({ schema: "retryledger.policy_spec.v1", preset: "interactive", routes });
const clients = Object.fromEntries(routes.map((r) => [r.route_id,   // one retry owner: the SDK's own retries off
  new OpenAI({ baseURL: r.base_url, apiKey: process.env.OPENAI_API_KEY ?? "sk-test", maxRetries: 0 })]));
const models: Record<string, string> = Object.fromEntries(routes.map((r) => [r.route_id, r.model]));

const messages = [{ role: "user" as const, content: "Summarize the incident." }];
const request = liftRequest("openai.chat.completions", { model: "gpt-4.1-mini", messages });
const policy = template.bind(request, idempotencyKeySha256("incident-42")); // once per call
const run = await runWithOpenAI(policy, clients,
  (client, options, step) => client.chat.completions.create({ model: models[step.routeId] ?? "", messages }, options),
  { idempotencyKey: "incident-42" });
console.log(run.result.choices[0]?.message.content, run.receipt.terminal, run.receipt.fallback_used);
console.log(verifyBundle(run.bundle).kind); // "verified": anyone can replay the receipt
// example:end
}
