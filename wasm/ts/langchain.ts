/**
 * The LangChain.js integration (`retryledger/langchain`): a chat model (a
 * `@langchain/core` `BaseChatModel`) whose routes are the chat models of
 * each policy route (`ChatOpenAI`, `ChatAnthropic`, …), for `invoke`,
 * `stream` and bound tools.
 *
 *     const model = new RetryledgerChatModel({ routes: { primary: new ChatOpenAI({ maxRetries: 0 }), fallback: new ChatAnthropic({ maxRetries: 0 }) }, policy, idempotencyKey });
 *     const answer = await model.invoke("hello");
 *     answer.response_metadata.retryledger.receipt_sha256;   // the sealed run
 *
 * Each `invoke` is one logical request: one run of `runWithPolicy`
 * (`stream`: one run of `runStream`), with every option those drivers take.
 * An attempt is one `invoke` (or `stream`) of the route's chat model with
 * the attempt's AbortSignal; nothing here decides.
 *
 * Retry ownership: LangChain chat models retry in their `AsyncCaller`
 * (`maxRetries`, default 6 for `ChatOpenAI`, 2 for `ChatAnthropic`). A route
 * whose `maxRetries` is not 0, or a route wrapped in `withRetry`, is refused
 * with `PolicyError` `retry_owner_not_harness` when the model is built. The
 * model's own `withRetry` and `withFallbacks` are refused with the same code:
 * retries and fallbacks belong to the policy.
 */

import { BaseChatModel, type BaseChatModelCallOptions, type BaseChatModelParams, type BindToolsInput } from "@langchain/core/language_models/chat_models";
import type { BaseLanguageModelInput } from "@langchain/core/language_models/base";
import { AIMessage, AIMessageChunk, HumanMessage, type BaseMessage } from "@langchain/core/messages";
import { ChatGenerationChunk, type ChatResult } from "@langchain/core/outputs";
import type { Runnable } from "@langchain/core/runnables";

import { CompiledPolicy, PolicyTemplate, compiledOf, idempotencyKeySha256, type Input } from "./core.js";
import { runWithPolicy, type RunOptions, type Step } from "./driver.js";
import { DecodeError, PolicyError } from "./errors.js";
import { runStream, type StreamReader, type StreamRunOptions } from "./stream.js";
import type { OutputCheck, RepairDefect } from "./checks.js";
import type { Json, LogicalRequest, Policy, RepairChain, Sealed } from "./types.js";

/** The part of a route chat model this module uses (a `BaseChatModel`). */
export interface RouteChatModel {
  invoke(input: BaseMessage[], options?: Record<string, unknown>): Promise<BaseMessage>;
  stream(input: BaseMessage[], options?: Record<string, unknown>): Promise<AsyncIterable<BaseMessage>>;
  bindTools?(tools: BindToolsInput[], kwargs?: Record<string, unknown>): unknown;
}

/** Call options of `RetryledgerChatModel`: the bound tools, and the call's idempotency key. */
export interface RetryledgerChatCallOptions extends BaseChatModelCallOptions {
  /** Tools bound with `bindTools`, bound in turn to each route's model. */
  tools?: BindToolsInput[];
  /** The idempotency key of this call (else the model's `idempotencyKey`). */
  idempotencyKey?: string;
}

/** The constructor fields of `RetryledgerChatModel`. */
export interface RetryledgerChatModelFields
  extends Omit<RunOptions, "idempotencyKey" | "request" | "repair" | "checks" | "signal">,
    Omit<BaseChatModelParams, "maxRetries"> {
  /** The chat model of each policy route, by route id; each built with `maxRetries: 0`. */
  routes: Readonly<Record<string, RouteChatModel>>;
  /**
   * The policy of a call. A `PolicyTemplate` (compiled once) binds each
   * call's logical request (`chatRequestDocument` of its messages and tools)
   * and idempotency key; a policy binds one logical request (a function of
   * the messages when each call has its own).
   */
  policy: Input<Policy> | CompiledPolicy | PolicyTemplate | ((messages: BaseMessage[]) => Input<Policy> | CompiledPolicy);
  /** The idempotency key of a call, unless the call gives `idempotencyKey`. */
  idempotencyKey?: string | ((messages: BaseMessage[]) => string);
  /** Output checks run on each answer (an `AIMessage`; `messageText` reads its text, `checkOn` applies a check to it). */
  checks?: readonly OutputCheck[];
  /**
   * With a policy that has a `repair` section: the next messages after an
   * answer that failed its checks. `true` uses `repairMessages` (the
   * answer, then a human message naming the defects).
   */
  repair?: true | ((messages: BaseMessage[], output: BaseMessage, defects: RepairDefect[]) => BaseMessage[]);
  /** Options of the stream driver only (`stream`). */
  stream?: Pick<StreamRunOptions<BaseMessage>, "reserveTokens">;
}

/** Throws `retry_owner_not_harness` unless the route's own retries are off. */
export function assertNoChatModelRetries(route: unknown, name = "route"): void {
  const r = route as { caller?: { maxRetries?: unknown }; maxRetries?: unknown; maxAttemptNumber?: unknown } | null;
  const wrapped = r?.maxAttemptNumber;
  if (typeof wrapped === "number" && wrapped > 1) {
    throw new PolicyError("retry_owner_not_harness", `retry_owner_not_harness: ${name} is wrapped in withRetry (${wrapped} attempts); the harness is the only retry owner`, {
      path: `/routes/${name}`,
    });
  }
  const n = r?.caller?.maxRetries ?? r?.maxRetries;
  if (n !== 0) {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: ${name} has maxRetries ${String(n)}; build it with maxRetries: 0 so that the harness is the only retry owner`,
      { path: `/routes/${name}/maxRetries` },
    );
  }
}

/**
 * Throws `retry_owner_not_harness` when a compiled LangGraph graph would
 * retry a node that calls a retryledger model: a node's `retryPolicy` (or
 * the graph's) with `maxAttempts` above 1 (LangGraph's default for a policy
 * without it is 3). `nodes` names the nodes that call the model (default:
 * every node). Call it once on the compiled graph, before any run.
 */
export function assertNoGraphRetries(graph: unknown, nodes?: readonly string[]): void {
  const g = graph as { retryPolicy?: { maxAttempts?: unknown }; nodes?: Record<string, { retryPolicy?: { maxAttempts?: unknown } }> } | null;
  if (g === null || typeof g !== "object" || g.nodes === null || typeof g.nodes !== "object") {
    throw new DecodeError("invalid_type", "invalid_type: assertNoGraphRetries needs a compiled LangGraph graph (with `nodes`)", { path: "/nodes" });
  }
  const names = nodes ?? Object.keys(g.nodes).filter((n) => n !== "__start__" && n !== "__end__");
  for (const name of names) {
    const policy = g.nodes[name]?.retryPolicy ?? g.retryPolicy;
    if (policy === undefined) continue;
    const max = policy.maxAttempts ?? 3;
    if (typeof max !== "number" || max > 1) {
      throw new PolicyError(
        "retry_owner_not_harness",
        `retry_owner_not_harness: the graph retries node ${name} (retryPolicy.maxAttempts ${String(max)}); leave its retryPolicy unset or at maxAttempts 1 so that the harness is the only retry owner`,
        { path: `/nodes/${name}/retryPolicy` },
      );
    }
  }
}

/** The receipt as plain JSON metadata. */
function receiptMetadata(sealed: Sealed, chain?: RepairChain): Record<string, unknown> {
  const meta: Record<string, unknown> = {
    receipt_sha256: sealed.receipt_sha256,
    terminal: sealed.terminal,
    attempts: sealed.bundle.attempts.attempts.length,
    receipt: JSON.parse(JSON.stringify(sealed.receipt)) as unknown,
  };
  if (chain !== undefined) {
    // Under repair: the runs of the chain, and the attempts of all of them (the requests sent for the call).
    meta.runs = chain.links.length;
    meta.chain_attempts = chain.links.reduce((n, link) => n + link.bundle.attempts.attempts.length, 0);
  }
  return meta;
}

/** The text of a message's content. */
export function messageText(message: unknown): string {
  const content = (message as { content?: unknown } | null)?.content;
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.map((p: unknown) => (typeof p === "string" ? p : typeof (p as { text?: unknown })?.text === "string" ? (p as { text: string }).text : "")).join("");
}

/** The default repair: the messages, the answer, then a human message naming the defects. */
export function repairMessages(messages: BaseMessage[], output: BaseMessage, defects: RepairDefect[]): BaseMessage[] {
  const said = defects.map((d) => `- ${d.validator}: ${d.message ?? d.kind}`).join("\n");
  return [...messages, output, new HumanMessage(`The answer above did not pass its checks:\n${said}\nAnswer again, fixing them.`)];
}

/** The logical request document (`retryledger.request.v1`) of a call's messages and tools, for repair. */
export function chatRequestDocument(messages: BaseMessage[], tools: unknown): LogicalRequest {
  const json = (v: unknown): Json => JSON.parse(JSON.stringify(v ?? null)) as Json;
  const input = messages.map((m) => {
    const calls = (m as { tool_calls?: unknown }).tool_calls;
    return json({ role: m.getType(), content: m.content, ...(Array.isArray(calls) && calls.length > 0 ? { tool_calls: calls } : {}) });
  });
  const doc: LogicalRequest = { schema: "retryledger.request.v1", operation: "langchain.chat", input };
  if (tools !== undefined) doc.tools = json(tools);
  return doc;
}

/** Reads route message chunks: text is the content's text, a tool-call chunk's arguments count as output too. */
export const messageChunkReader: StreamReader<BaseMessage> = {
  text(chunk) {
    const t = messageText(chunk);
    if (t !== "") return t;
    const calls = (chunk as { tool_call_chunks?: Array<{ args?: unknown }> }).tool_call_chunks;
    return Array.isArray(calls) ? calls.map((c) => (typeof c.args === "string" ? c.args : "")).join("") : "";
  },
};

/**
 * The call options of one attempt on its route's chat model: the attempt's
 * signal and its `Idempotency-Key` header (`headers` for `ChatAnthropic`,
 * `options.headers`, the request options, for `ChatOpenAI`).
 */
function attemptOptions(step: Step, signal: AbortSignal): Record<string, unknown> {
  const headers = { "Idempotency-Key": step.idempotencyKey };
  return { signal, headers, options: { headers } };
}

/** The fields that are the driver's options. */
const RUN_OPTION_KEYS = [
  "keyScope",
  "clock",
  "sleep",
  "wallClock",
  "classify",
  "onAttempt",
  "onDecision",
  "onSleep",
  "onTerminal",
  "priceSchedule",
  "fleet",
  "reserveTokens",
  "checks",
] as const;

/** A LangChain chat model over the policy's routes; see the module comment. */
export class RetryledgerChatModel extends BaseChatModel<RetryledgerChatCallOptions> {
  readonly routes: Readonly<Record<string, RouteChatModel>>;
  readonly #fields: RetryledgerChatModelFields;
  readonly #fixed: CompiledPolicy | undefined;

  static override lc_name(): string {
    return "RetryledgerChatModel";
  }

  constructor(fields: RetryledgerChatModelFields) {
    if (fields === null || typeof fields !== "object" || fields.routes === null || typeof fields.routes !== "object") {
      throw new DecodeError("missing_field", "missing_field at /routes: RetryledgerChatModel needs `routes`, chat models by route id", { path: "/routes" });
    }
    super({ ...fields, maxRetries: 0 });
    for (const [id, route] of Object.entries(fields.routes)) {
      if (route === null || typeof route !== "object" || typeof (route as { invoke?: unknown }).invoke !== "function") {
        throw new DecodeError("invalid_type", `invalid_type at /routes/${id}: not a chat model`, { path: `/routes/${id}` });
      }
      assertNoChatModelRetries(route, id);
    }
    this.routes = fields.routes;
    this.#fields = fields;
    this.#fixed =
      typeof fields.policy === "function" || fields.policy instanceof PolicyTemplate ? undefined : compiledOf(fields.policy);
    if (this.#fixed !== undefined) this.#checkRoutes(this.#fixed);
  }

  override _llmType(): string {
    return "retryledger";
  }

  override bindTools(tools: BindToolsInput[], kwargs?: Partial<RetryledgerChatCallOptions>): Runnable<BaseLanguageModelInput, AIMessageChunk, RetryledgerChatCallOptions> {
    return this.withConfig({ tools, ...(kwargs ?? {}) } as Partial<RetryledgerChatCallOptions>);
  }

  /** Refused: the policy owns retries (`retry_owner_not_harness`). */
  override withRetry(..._fields: unknown[]): never {
    throw new PolicyError("retry_owner_not_harness", "retry_owner_not_harness: withRetry over a RetryledgerChatModel stacks retries; its policy is the only retry owner", {
      path: "/withRetry",
    });
  }

  /** Refused: the policy owns fallbacks (its routes), `retry_owner_not_harness`. */
  override withFallbacks(..._fields: unknown[]): never {
    throw new PolicyError("retry_owner_not_harness", "retry_owner_not_harness: withFallbacks over a RetryledgerChatModel stacks fallbacks; put the fallback in the policy's routes", {
      path: "/withFallbacks",
    });
  }

  #checkRoutes(compiled: CompiledPolicy): void {
    const missing = compiled.policy.routes.map((r) => r.route_id).filter((id) => !Object.hasOwn(this.routes, id));
    if (missing.length > 0) {
      throw new DecodeError("missing_field", `missing_field at /routes: no chat model for route(s) ${missing.join(", ")}`, { path: `/routes/${missing[0] ?? ""}` });
    }
  }

  #prepare(messages: BaseMessage[], options: this["ParsedCallOptions"]): { compiled: CompiledPolicy; key: string } {
    const k = this.#fields.idempotencyKey;
    const key = options.idempotencyKey ?? (typeof k === "function" ? k(messages) : k);
    if (typeof key !== "string") {
      throw new DecodeError("missing_field", "missing_field at /idempotencyKey: give `idempotencyKey` to the model or per call", { path: "/idempotencyKey" });
    }
    let compiled = this.#fixed;
    if (compiled === undefined) {
      const policy = this.#fields.policy;
      compiled =
        policy instanceof PolicyTemplate
          ? policy.bind(chatRequestDocument(messages, options.tools), idempotencyKeySha256(key, this.#fields.keyScope))
          : compiledOf((policy as (m: BaseMessage[]) => Input<Policy> | CompiledPolicy)(messages));
      this.#checkRoutes(compiled);
    }
    return { compiled, key };
  }

  /** The route's model for one attempt, with the call's tools bound to it. */
  #route(step: Step, options: this["ParsedCallOptions"]): RouteChatModel {
    const route = this.routes[step.routeId] as RouteChatModel;
    const tools = options.tools;
    if (tools === undefined || tools.length === 0) return route;
    if (typeof route.bindTools !== "function") {
      throw new DecodeError("invalid_type", `invalid_type at /routes/${step.routeId}: the route's chat model cannot bind tools`, { path: `/routes/${step.routeId}` });
    }
    return route.bindTools(tools, options.tool_choice === undefined ? {} : { tool_choice: options.tool_choice }) as RouteChatModel;
  }

  /** The driver's options among the fields (the rest are LangChain's). */
  #runOptions(): Omit<RunOptions, "idempotencyKey"> {
    const fields = this.#fields as unknown as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const k of RUN_OPTION_KEYS) if (fields[k] !== undefined) out[k] = fields[k];
    return out as Omit<RunOptions, "idempotencyKey">;
  }

  async _generate(messages: BaseMessage[], options: this["ParsedCallOptions"]): Promise<ChatResult> {
    const { compiled, key } = this.#prepare(messages, options);
    const repair = this.#fields.repair;
    // Under repair each run of the chain sends its own messages (runs are sequential: the last ones built).
    let current = messages;
    const repairFn =
      repair === undefined
        ? undefined
        : (output: unknown, defects: RepairDefect[]): LogicalRequest => {
            current = (repair === true ? repairMessages : repair)(current, output as BaseMessage, defects);
            return chatRequestDocument(current, options.tools);
          };
    const run = await runWithPolicy<BaseMessage>(
      compiled,
      (step, signal) => this.#route(step, options).invoke(step.repairOrdinal === 0 ? messages : current, attemptOptions(step, signal)),
      {
        ...this.#runOptions(),
        idempotencyKey: key,
        ...(options.signal === undefined ? {} : { signal: options.signal }),
        ...(repairFn === undefined ? {} : { repair: repairFn, request: chatRequestDocument(messages, options.tools) }),
      },
    );
    const meta = receiptMetadata(run.sealed, run.chain);
    const m = run.result as AIMessage;
    const message = new AIMessage({
      content: m.content,
      tool_calls: m.tool_calls ?? [],
      ...(m.usage_metadata === undefined ? {} : { usage_metadata: m.usage_metadata }),
      ...(m.id === undefined ? {} : { id: m.id }),
      additional_kwargs: m.additional_kwargs,
      response_metadata: { ...m.response_metadata, retryledger: meta },
    });
    return { generations: [{ text: messageText(message), message }], llmOutput: { retryledger: meta } };
  }

  override async *_streamResponseChunks(messages: BaseMessage[], options: this["ParsedCallOptions"]): AsyncGenerator<ChatGenerationChunk> {
    const { compiled, key } = this.#prepare(messages, options);
    const run = runStream<BaseMessage>(compiled, (step, signal) => this.#route(step, options).stream(messages, attemptOptions(step, signal)), {
      ...this.#runOptions(),
      ...(this.#fields.stream ?? {}),
      idempotencyKey: key,
      reader: messageChunkReader,
      ...(options.signal === undefined ? {} : { signal: options.signal }),
    });
    for await (const ev of run) {
      if (ev.kind !== "delta" || ev.data === undefined) continue;
      const chunk = ev.data as AIMessageChunk;
      yield new ChatGenerationChunk({ text: messageText(chunk), message: chunk });
    }
    const sealed = run.sealed;
    if (sealed !== undefined) {
      yield new ChatGenerationChunk({ text: "", message: new AIMessageChunk({ content: "", response_metadata: { retryledger: receiptMetadata(sealed) } }) });
    }
  }
}
