/**
 * The AI SDK integration (`retryledger/ai-sdk`): a language model (the AI
 * SDK's `LanguageModelV3` interface) whose routes are AI SDK provider models
 * (`@ai-sdk/openai`, `@ai-sdk/anthropic`, …), for `generateText`,
 * `streamText`, `generateObject` / structured output and tool calls.
 *
 *     const model = retryledgerModel({ routes: { primary: openai("gpt-4o"), fallback: anthropic("claude-sonnet-4-5") }, policy });
 *     const r = await generateText({ model, prompt, ...harnessOwned({ idempotencyKey: "order-7" }) });
 *     r.providerMetadata?.retryledger?.receipt_sha256;   // the sealed run
 *
 * Each framework call is one logical request: `doGenerate` is one run of
 * `runWithPolicy`, `doStream` one run of `runStream`, with every option
 * those drivers take (fleet, hooks, output checks and repair, price
 * schedule, clock, AbortSignal, telemetry hooks). An attempt is one call of
 * the route model's own `doGenerate` / `doStream` with the attempt's signal
 * and its `Idempotency-Key` header. Nothing here decides: the driver plans,
 * sleeps and judges.
 *
 * Retry ownership. The AI SDK retries above the model (`maxRetries`, default
 * 2) and never tells the model its value, so the call must say it: the
 * adapter runs only a call whose `providerOptions.retryledger.maxRetries`
 * is 0, and refuses any other call with `PolicyError`
 * `retry_owner_not_harness` before any request. `harnessOwned()` gives both
 * settings from one place (`maxRetries: 0` for the AI SDK, the declaration
 * for the adapter). Besides, an error leaving this model is never an
 * `APICallError` the AI SDK would retry: a stopped run is the driver's
 * `RunStoppedError`, carrying the sealed run. The AI SDK provider models do
 * not retry on their own (one fetch per call).
 *
 * The receipt: `providerMetadata.retryledger` of the result (generate) or of
 * the `finish` part (stream) holds `receipt_sha256`, `terminal`, `attempts`
 * and the `receipt` document.
 */

import type {
  LanguageModelV3,
  LanguageModelV3CallOptions,
  LanguageModelV3GenerateResult,
  LanguageModelV3StreamPart,
  LanguageModelV3StreamResult,
  JSONObject,
  JSONValue,
} from "@ai-sdk/provider";

import { CompiledPolicy, PolicyTemplate, compiledOf, idempotencyKeySha256, type Input } from "./core.js";
import { runWithPolicy, type RunOptions, type Step } from "./driver.js";
import { DecodeError, PolicyError } from "./errors.js";
import { runStream, type StreamReader, type StreamRunOptions, type StreamStep } from "./stream.js";
import type { OutputCheck, RepairDefect } from "./checks.js";
import type { Json, LogicalRequest, Policy, RepairChain, Sealed, Usage } from "./types.js";

// ---------------------------------------------------------------- the AI SDK's model interface

/** The AI SDK's call options (`LanguageModelV3CallOptions`). */
export type AISdkCallOptions = LanguageModelV3CallOptions;
/** A stream part (`LanguageModelV3StreamPart`). */
export type AISdkStreamPart = LanguageModelV3StreamPart;
/** What a model's `doGenerate` resolves with (`LanguageModelV3GenerateResult`). */
export type AISdkGenerateResult = LanguageModelV3GenerateResult;
/** What a model's `doStream` resolves with (`LanguageModelV3StreamResult`). */
export type AISdkStreamResult = LanguageModelV3StreamResult;
/** An AI SDK language model (`LanguageModelV3`): the routes, and the model this module builds. */
export type AISdkLanguageModel = LanguageModelV3;

// ---------------------------------------------------------------- options

/** The per-call settings the adapter reads from `providerOptions.retryledger`. */
export interface HarnessCallSettings {
  /** The idempotency key of this logical request (else the model's `idempotencyKey`). */
  idempotencyKey?: string;
}

/**
 * Settings for a call through a retryledger model: `maxRetries: 0` for the
 * AI SDK and the same declaration in `providerOptions.retryledger`, which the
 * model checks before any request. Spread into `generateText`,
 * `streamText`, `generateObject` (merge `providerOptions` when the call has
 * its own).
 */
export function harnessOwned(settings: HarnessCallSettings = {}): {
  maxRetries: 0;
  providerOptions: { retryledger: { maxRetries: 0; idempotencyKey?: string } };
} {
  const retryledger: { maxRetries: 0; idempotencyKey?: string } = { maxRetries: 0 };
  if (settings.idempotencyKey !== undefined) retryledger.idempotencyKey = settings.idempotencyKey;
  return { maxRetries: 0, providerOptions: { retryledger } };
}

/** A value fixed at construction, or derived from the call's options. */
export type PerCall<T> = T | ((call: AISdkCallOptions) => T);

/** The options of `retryledgerModel`: the routes, the policy, and every driver option. */
export interface RetryledgerModelOptions
  extends Omit<RunOptions, "idempotencyKey" | "request" | "repair" | "checks" | "signal"> {
  /** The AI SDK model of each policy route, by route id. */
  routes: Readonly<Record<string, AISdkLanguageModel>>;
  /**
   * The policy of a call. A `PolicyTemplate` (compiled once) binds each
   * call's logical request (`aiSdkRequestDocument`) and idempotency key; a
   * policy binds one logical request (a function of the call when calls
   * differ).
   */
  policy: PerCall<Input<Policy> | CompiledPolicy> | PolicyTemplate;
  /** The idempotency key of a call, unless the call gives `providerOptions.retryledger.idempotencyKey`. */
  idempotencyKey?: PerCall<string>;
  /** Output checks run on each generated answer (`aiSdkText` reads its text; `checkOn` applies a check to it). */
  checks?: readonly OutputCheck[];
  /**
   * With a policy that has a `repair` section: the next call after an answer
   * that failed its checks. `true` uses `repairPrompt` (the answer, then a
   * user message naming the defects).
   */
  repair?: true | ((call: AISdkLogicalRequest, output: AISdkGenerateResult, defects: RepairDefect[]) => AISdkLogicalRequest);
  /** Options of the stream driver only (`doStream`). */
  stream?: Pick<StreamRunOptions<AISdkStreamPart>, "reserveTokens">;
  /** Provider name reported to the AI SDK (default `retryledger`). */
  provider?: string;
  /** Model id reported to the AI SDK (default: the route ids joined with `|`). */
  modelId?: string;
}

/** The logical request of a call: its options without the signal, headers and the adapter's own settings. */
export type AISdkLogicalRequest = Omit<LanguageModelV3CallOptions, "abortSignal" | "headers">;

// ---------------------------------------------------------------- helpers

/** The text of a generated answer (its text parts joined), for output checks. */
export function aiSdkText(result: unknown): string {
  const content = (result as { content?: unknown } | null)?.content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((p): p is { type: "text"; text: string } => p?.type === "text" && typeof p.text === "string")
    .map((p) => p.text)
    .join("");
}

/** Usage units of an AI SDK usage block (`LanguageModelV3Usage`), nonzero kinds only. */
export function aiSdkUsageUnits(usage: unknown): Usage | undefined {
  if (usage === null || typeof usage !== "object") return undefined;
  const u = usage as { inputTokens?: unknown; outputTokens?: unknown };
  const num = (v: unknown): number => (typeof v === "number" && Number.isSafeInteger(v) && v > 0 ? v : 0);
  const inp = (u.inputTokens ?? {}) as { total?: unknown; cacheRead?: unknown };
  const out = (u.outputTokens ?? {}) as { total?: unknown; reasoning?: unknown };
  if (typeof inp !== "object" || typeof out !== "object") return undefined;
  const cached = num(inp.cacheRead);
  const reasoning = num(out.reasoning);
  const units: Usage = {};
  const put = (kind: string, n: number): void => {
    if (n > 0) units[kind] = n;
  };
  put("input", num(inp.total) - cached);
  put("cached_input", cached);
  put("output", num(out.total) - reasoning);
  put("reasoning", reasoning);
  return Object.keys(units).length === 0 ? undefined : units;
}

/**
 * An AI SDK `APICallError` (or any error with a `statusCode` and
 * `responseHeaders`) as the facts the core reads: `status`, `headers`,
 * `body`; the original is the `cause`, so its name and codes are read too.
 */
export class ProviderCallError extends Error {
  readonly status: number | undefined;
  readonly headers: Record<string, string> | undefined;
  readonly body: string | undefined;
  constructor(cause: { message?: unknown; statusCode?: unknown; responseHeaders?: unknown; responseBody?: unknown }) {
    super(typeof cause.message === "string" ? cause.message : "provider call failed", { cause });
    this.name = "ProviderCallError";
    this.status = typeof cause.statusCode === "number" ? cause.statusCode : undefined;
    const h = cause.responseHeaders;
    this.headers = h !== null && typeof h === "object" ? (h as Record<string, string>) : undefined;
    this.body = typeof cause.responseBody === "string" ? cause.responseBody : undefined;
  }
}

/**
 * An error from a route model, as the facts the core reads: an
 * `APICallError` with an error status becomes a `ProviderCallError`; one
 * with a success status (a response that broke while it was read) is judged
 * by its cause, the transport's own error.
 */
function providerFacts(error: unknown): unknown {
  if (error !== null && typeof error === "object" && typeof (error as { statusCode?: unknown }).statusCode === "number") {
    const e = error as ConstructorParameters<typeof ProviderCallError>[0] & { statusCode: number; cause?: unknown };
    if (e.statusCode >= 200 && e.statusCode <= 299 && e.cause !== undefined) return e.cause;
    return new ProviderCallError(e);
  }
  return error;
}

/** Whether an error is an `APICallError` of a response with a success status (its body broke while it was read). */
function successStatus(error: unknown): boolean {
  const status = (error as { statusCode?: unknown } | null)?.statusCode;
  return typeof status === "number" && status >= 200 && status <= 299;
}

/** The parts of a route's stream; an error it raises is rethrown as the facts the core reads (`providerFacts`). */
async function* factsStream(stream: ReadableStream<AISdkStreamPart>): AsyncGenerator<AISdkStreamPart> {
  try {
    yield* stream as unknown as AsyncIterable<AISdkStreamPart>;
  } catch (e) {
    throw providerFacts(e);
  }
}

/** A stream that opened and broke before its first part. */
async function* brokenStream(error: unknown): AsyncGenerator<AISdkStreamPart> {
  yield* [];
  throw error;
}

/** The logical request document (`retryledger.request.v1`) of a call, for repair. */
export function aiSdkRequestDocument(call: AISdkLogicalRequest): LogicalRequest {
  const { prompt, tools, toolChoice, responseFormat, seed, providerOptions: _o, ...sampling } = call;
  const json = (v: unknown): Json => JSON.parse(JSON.stringify(v)) as Json;
  const doc: LogicalRequest = { schema: "retryledger.request.v1", operation: "ai_sdk.language_model", input: json(prompt) };
  if (tools !== undefined) doc.tools = json({ tools, tool_choice: toolChoice ?? null });
  if (responseFormat !== undefined) doc.output_contract = json(responseFormat);
  const s = json(sampling) as { [key: string]: Json };
  if (Object.keys(s).length > 0) doc.sampling = s;
  if (typeof seed === "number" && Number.isSafeInteger(seed) && seed >= 0) doc.seed = seed;
  return doc;
}

/** The default repair: the call's prompt, the answer, then a user message naming the defects. */
export function repairPrompt(call: AISdkLogicalRequest, output: AISdkGenerateResult, defects: RepairDefect[]): AISdkLogicalRequest {
  const said = defects.map((d) => `- ${d.validator}: ${d.message ?? d.kind}`).join("\n");
  return {
    ...call,
    prompt: [
      ...call.prompt,
      { role: "assistant", content: [{ type: "text", text: aiSdkText(output) }] },
      { role: "user", content: [{ type: "text", text: `The answer above did not pass its checks:\n${said}\nAnswer again, fixing them.` }] },
    ],
  };
}

/** Whether the call declares that the AI SDK's retries are off; throws `retry_owner_not_harness` otherwise. */
function checkOwner(call: AISdkCallOptions): HarnessCallSettings {
  const own = call.providerOptions?.retryledger;
  const n = own?.maxRetries;
  if (n !== 0) {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: the call does not say that the AI SDK's maxRetries is 0 (providerOptions.retryledger.maxRetries is ${String(n)}); ` +
        "call with ...harnessOwned() so that the harness is the only retry owner",
      { path: "/providerOptions/retryledger/maxRetries" },
    );
  }
  const key = own?.idempotencyKey;
  if (key !== undefined && typeof key !== "string") {
    throw new DecodeError("invalid_type", "invalid_type at /providerOptions/retryledger/idempotencyKey: the key must be a string", {
      path: "/providerOptions/retryledger/idempotencyKey",
    });
  }
  return key === undefined ? {} : { idempotencyKey: key };
}

function perCall<T>(value: PerCall<T>, call: AISdkCallOptions): T {
  return typeof value === "function" ? (value as (call: AISdkCallOptions) => T)(call) : value;
}

/** The call's options without the adapter's own provider options and without the signal and headers. */
function logical(call: AISdkCallOptions): AISdkLogicalRequest {
  const { abortSignal: _s, headers: _h, providerOptions, ...rest } = call;
  const out: AISdkLogicalRequest = { ...rest };
  if (providerOptions !== undefined) {
    const { retryledger: _r, ...others } = providerOptions;
    if (Object.keys(others).length > 0) out.providerOptions = others;
  }
  const loose = out as Record<string, unknown>;
  for (const k of Object.keys(loose)) if (loose[k] === undefined) delete loose[k];
  return out;
}

/** The receipt as provider metadata (JSON values only). */
export function receiptMetadata(sealed: Sealed, chain?: RepairChain): JSONObject {
  const meta: JSONObject = {
    receipt_sha256: sealed.receipt_sha256,
    terminal: sealed.terminal,
    attempts: sealed.bundle.attempts.attempts.length,
    receipt: JSON.parse(JSON.stringify(sealed.receipt)) as JSONValue,
  };
  if (chain !== undefined) {
    // Under repair: the runs of the chain, and the attempts of all of them (the requests sent for the call).
    meta.runs = chain.links.length;
    meta.chain_attempts = chain.links.reduce((n, link) => n + link.bundle.attempts.attempts.length, 0);
  }
  return meta;
}

// ---------------------------------------------------------------- the model

/** A retryledger model: an AI SDK language model over the routes; `lastSealed` is the last run's sealed run. */
export interface RetryledgerLanguageModel extends AISdkLanguageModel {
  readonly routes: Readonly<Record<string, AISdkLanguageModel>>;
}

/**
 * An AI SDK language model whose every call is one run under the policy
 * over `routes` (route id → AI SDK provider model). Refuses, when built, a
 * policy route without a model; refuses, per call and before any request, a
 * call that does not declare the AI SDK's retries off
 * (`retry_owner_not_harness`).
 */
export function retryledgerModel(options: RetryledgerModelOptions): RetryledgerLanguageModel {
  if (options === null || typeof options !== "object" || options.routes === null || typeof options.routes !== "object") {
    throw new DecodeError("missing_field", "missing_field at /routes: retryledgerModel needs `routes`, an object of AI SDK models by route id", { path: "/routes" });
  }
  const routes = options.routes;
  for (const [id, m] of Object.entries(routes)) {
    if (m === null || typeof m !== "object" || typeof m.doGenerate !== "function" || typeof m.doStream !== "function") {
      throw new DecodeError("invalid_type", `invalid_type at /routes/${id}: not an AI SDK language model (doGenerate, doStream)`, { path: `/routes/${id}` });
    }
  }
  const template = options.policy instanceof PolicyTemplate ? options.policy : undefined;
  const fixed =
    template !== undefined || typeof options.policy === "function" ? undefined : compiledOf(options.policy as Input<Policy> | CompiledPolicy);
  if (fixed !== undefined) checkRoutes(fixed, routes);
  const { routes: _r, policy: _p, idempotencyKey, checks, repair, stream: streamOptions, provider, modelId, ...runOptions } = options;

  const prepare = (call: AISdkCallOptions): { compiled: CompiledPolicy; key: string; request: AISdkLogicalRequest } => {
    const own = checkOwner(call);
    const key = own.idempotencyKey ?? (idempotencyKey === undefined ? undefined : perCall(idempotencyKey, call));
    if (typeof key !== "string") {
      throw new DecodeError("missing_field", "missing_field at /idempotencyKey: give `idempotencyKey` to retryledgerModel or per call in harnessOwned({idempotencyKey})", {
        path: "/idempotencyKey",
      });
    }
    const request = logical(call);
    const compiled =
      fixed ??
      (template !== undefined
        ? template.bind(aiSdkRequestDocument(request), idempotencyKeySha256(key, runOptions.keyScope))
        : compiledOf(perCall(options.policy as PerCall<Input<Policy> | CompiledPolicy>, call)));
    if (fixed === undefined) checkRoutes(compiled, routes);
    return { compiled, key, request };
  };

  /** The options one attempt sends to its route model. */
  const attemptCall = (request: AISdkLogicalRequest, call: AISdkCallOptions, step: Step, signal: AbortSignal): AISdkCallOptions => ({
    ...request,
    abortSignal: signal,
    headers: { ...(call.headers ?? {}), "Idempotency-Key": step.idempotencyKey },
  });

  const routeOf = (step: Step): AISdkLanguageModel => routes[step.routeId] as AISdkLanguageModel;

  const model: RetryledgerLanguageModel = {
    specificationVersion: "v3",
    provider: provider ?? "retryledger",
    modelId: modelId ?? Object.keys(routes).join("|"),
    routes,
    supportedUrls: {},
    async doGenerate(call) {
      const { compiled, key, request } = prepare(call);
      // Under repair each run of the chain sends its own call (runs are sequential: the last one built); the documents are what the core digests.
      let current = request;
      const repairFn =
        repair === undefined
          ? undefined
          : (output: unknown, defects: RepairDefect[]): LogicalRequest => {
              current = (repair === true ? repairPrompt : repair)(current, output as AISdkGenerateResult, defects);
              return aiSdkRequestDocument(current);
            };
      const root = repairFn === undefined ? undefined : aiSdkRequestDocument(request);
      const run = await runWithPolicy<AISdkGenerateResult>(
        compiled,
        async (step, signal) => {
          const req = step.repairOrdinal === 0 ? request : current;
          let result: AISdkGenerateResult;
          try {
            result = await routeOf(step).doGenerate(attemptCall(req, call, step, signal));
          } catch (e) {
            throw providerFacts(e);
          }
          if (step.priced) {
            const units = aiSdkUsageUnits(result.usage);
            if (units !== undefined) step.usage(units);
          }
          return result;
        },
        {
          ...runOptions,
          idempotencyKey: key,
          ...(call.abortSignal === undefined ? {} : { signal: call.abortSignal }),
          ...(checks === undefined ? {} : { checks }),
          ...(repairFn === undefined ? {} : { repair: repairFn, request: root }),
        },
      );
      return {
        ...run.result,
        providerMetadata: { ...(run.result.providerMetadata ?? {}), retryledger: receiptMetadata(run.sealed, run.chain) },
      };
    },
    async doStream(call) {
      const { compiled, key, request } = prepare(call);
      const run = runStream<AISdkStreamPart>(
        compiled,
        async (step: StreamStep, signal) => {
          let res: AISdkStreamResult;
          try {
            res = await routeOf(step).doStream(attemptCall(request, call, step, signal));
          } catch (e) {
            // A success status means the response (the stream) had opened when it broke: say so to the driver.
            if (successStatus(e)) return brokenStream(providerFacts(e));
            throw providerFacts(e);
          }
          return factsStream(res.stream);
        },
        {
          ...runOptions,
          ...(streamOptions ?? {}),
          idempotencyKey: key,
          reader: aiSdkStreamReader,
          ...(call.abortSignal === undefined ? {} : { signal: call.abortSignal }),
        },
      );
      const iterator = run[Symbol.asyncIterator]();
      let finish: Extract<AISdkStreamPart, { type: "finish" }> | undefined;
      const stream = new ReadableStream<AISdkStreamPart>({
        async pull(controller) {
          try {
            for (;;) {
              const next = await iterator.next();
              if (next.done) {
                const sealed = run.sealed;
                const meta = sealed === undefined ? {} : { retryledger: receiptMetadata(sealed) };
                const f: Extract<AISdkStreamPart, { type: "finish" }> = finish ?? {
                  type: "finish",
                  finishReason: { unified: "other", raw: undefined },
                  usage: {
                    inputTokens: { total: undefined, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
                    outputTokens: { total: undefined, text: undefined, reasoning: undefined },
                  },
                };
                controller.enqueue({ ...f, providerMetadata: { ...(f.providerMetadata ?? {}), ...meta } });
                controller.close();
                return;
              }
              const ev = next.value;
              if (ev.kind !== "delta" || ev.data === undefined) continue;
              if (ev.data.type === "finish") {
                finish = ev.data;
                continue;
              }
              controller.enqueue(ev.data);
              return;
            }
          } catch (e) {
            // A stopped run is an error part, as the AI SDK's providers report a failed stream (`onError` sees it).
            controller.enqueue({ type: "error", error: e });
            controller.close();
          }
        },
        async cancel() {
          await iterator.return?.();
        },
      });
      return { stream };
    },
  };
  return model;
}

/**
 * Refuse, before any request, a policy route without a model and a stream
 * mode whose delivered parts may later be withdrawn or joined (`tentative`,
 * `continuation`): the AI SDK has no way to take back a part it was given.
 */
function checkRoutes(compiled: CompiledPolicy, routes: Readonly<Record<string, AISdkLanguageModel>>): void {
  // The stream modes the AI SDK cannot carry are the core's rule (invalid_stream_contract).
  compiled.requireDriver("ai_sdk");
  const missing = compiled.policy.routes.map((r) => r.route_id).filter((id) => !Object.hasOwn(routes, id));
  if (missing.length > 0) {
    throw new DecodeError("missing_field", `missing_field at /routes: no AI SDK model for route(s) ${missing.join(", ")}`, { path: `/routes/${missing[0] ?? ""}` });
  }
}

/**
 * Reads AI SDK stream parts: text from `text-delta` (a tool call's input
 * delta and a whole `tool-call` count as output too), the `finish` part is
 * the terminal, its usage the attempt's usage; an `error` part raises its
 * error (as the facts of a provider error).
 */
export const aiSdkStreamReader: StreamReader<AISdkStreamPart> = {
  text(part) {
    switch (part.type) {
      case "text-delta":
      case "reasoning-delta":
      case "tool-input-delta":
        return typeof part.delta === "string" ? part.delta : "";
      case "tool-call":
        return typeof part.input === "string" ? part.input : "";
      case "error":
        throw providerFacts(part.error);
      default:
        return "";
    }
  },
  terminal(part) {
    return part.type === "finish";
  },
  usage(part) {
    return part.type === "finish" ? aiSdkUsageUnits(part.usage) : undefined;
  },
};
