// The cross-provider entry point takes the real SDK clients as they are
// (type-checked by tsconfig.check.json; cross-provider.test.mjs runs them).
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import type { ConversationRequest, PolicySpec } from "../dist/index.js";
import { runAcrossProviders, runStreamAcrossProviders, type ProviderAnswer } from "../dist/providers.js";

declare const request: ConversationRequest;
declare const spec: PolicySpec;

export async function example(): Promise<ProviderAnswer> {
  const clients = {
    "openai-primary": new OpenAI({ apiKey: "k", maxRetries: 0 }),
    "anthropic-fallback": new Anthropic({ apiKey: "k", maxRetries: 0 }),
    "gemini-last": new GoogleGenAI({ apiKey: "k" }),
  };
  const run = await runAcrossProviders(request, spec, { idempotencyKey: "ticket-4411", clients });
  const served: string | undefined = run.receipt.schedule[0]?.model?.served;
  void served;
  for await (const event of runStreamAcrossProviders(request, spec, { idempotencyKey: "ticket-4412", clients })) void event.kind;
  return run.result;
}
