/**
 * `withPolicy`: the driver as a function wrapper, as short as a retry
 * decorator.
 *
 *     const summarize = withPolicy(policy, async (step, signal, text: string) =>
 *       client.chat.completions.create({...}, { signal, headers: { "Idempotency-Key": step.idempotencyKey } }),
 *       { idempotencyKey: "order-7" });
 *     await summarize("...");        // the value; RunStoppedError (with the bundle) otherwise
 *     await summarize.run("...");    // the RunResult: result, receipt, bundle
 *
 * The wrapped function receives the planned `Step` and the attempt's
 * `AbortSignal` first, then the caller's arguments. `policy` and
 * `idempotencyKey` may be functions of the caller's arguments, since a policy
 * binds one logical request. Or `policy` is a `PolicyTemplate`, compiled once
 * at module level: each call binds the logical request `request` gives (a
 * document, or a function of the arguments) and the key's digest (scoped by
 * `keyScope` when given). Every guarantee of `runWithPolicy` holds.
 *
 *     const template = compilePolicyTemplate(spec);   // once
 *     const summarize = withPolicy(template, async (step, signal, text: string) => ..., {
 *       idempotencyKey: (text) => keyOf(text),
 *       request: (text) => ({ schema: "retryledger.request.v1", operation: "chat", input: [text] }),
 *     });
 *
 * `withPolicy` cannot see the SDK clients `fn` calls, so give them:
 * `clients` (one client, an array, or a record by route id) is checked when
 * the function is wrapped and again before each call, and a client whose own
 * retries are on (`openai` or `@anthropic-ai/sdk` with `maxRetries` other than
 * 0, `@google/genai` retry options) is refused with `PolicyError`
 * `retry_owner_not_harness` before any request: retries at two layers
 * multiply, and the receipt would count one attempt where the server saw
 * several. A client whose retries cannot be read is refused too.
 */

import { CompiledPolicy, PolicyTemplate, compiledOf, idempotencyKeySha256, sha256Hex, type Input } from "./core.js";
import { runWithPolicy, type RunOptions, type RunResult, type Step } from "./driver.js";
import type { LogicalRequest, Policy } from "./types.js";
import { PolicyError } from "./errors.js";
import { assertNoSdkRetries as assertNoOpenAIRetries } from "./openai.js";
import { assertNoSdkRetries as assertNoGoogleGenAIRetries } from "./google-genai.js";

/**
 * Throws `PolicyError` `retry_owner_not_harness` unless `client`'s own retries
 * are off, with the check its integration uses.
 */
export function assertNoClientRetries(client: unknown, name = "client"): void {
  if (typeof client === "object" && client !== null && "maxRetries" in client) {
    assertNoOpenAIRetries(client as Parameters<typeof assertNoOpenAIRetries>[0], name);
  } else if (typeof client === "object" && client !== null && typeof (client as { models?: unknown }).models === "object") {
    assertNoGoogleGenAIRetries(client as Parameters<typeof assertNoGoogleGenAIRetries>[0], name);
  } else {
    throw new PolicyError(
      "retry_owner_not_harness",
      `retry_owner_not_harness: cannot tell whether ${name} retries on its own; give clients whose retries can be read (openai, @anthropic-ai/sdk, @google/genai) with their retries off`,
      { path: "/clients" },
    );
  }
}

function checkClients(clients: unknown): void {
  if (clients === undefined) return;
  const entries: [string, unknown][] = Array.isArray(clients)
    ? clients.map((c, i) => [`clients[${i}]`, c])
    : typeof clients === "object" && clients !== null && !("maxRetries" in clients) && typeof (clients as { models?: unknown }).models !== "object"
      ? Object.entries(clients).map(([k, c]) => [`clients.${k}`, c])
      : [["client", clients]];
  for (const [name, client] of entries) assertNoClientRetries(client, name);
}

/** `runWithPolicy`'s options, with the key given or derived from the arguments. */
export type WithPolicyOptions<A extends unknown[]> = Omit<RunOptions, "idempotencyKey" | "request"> & {
  idempotencyKey: string | ((...args: A) => string);
  /** The logical request: required with a `PolicyTemplate`, which binds it per call. */
  request?: unknown;
  /** The SDK clients `fn` calls (one, an array, or a record): refused when their own retries are on. */
  clients?: unknown;
};

/** A function under a policy: call it for the value, `.run` for the whole `RunResult`. */
export type Retrying<A extends unknown[], T> = ((...args: A) => Promise<T>) & {
  run(...args: A): Promise<RunResult<T>>;
};

/** Wrap `fn` so that every call is one run under `policy`. */
export function withPolicy<A extends unknown[], T>(
  policy: Input<Policy> | CompiledPolicy | PolicyTemplate | ((...args: A) => Input<Policy> | CompiledPolicy),
  fn: (step: Step, signal: AbortSignal, ...args: A) => Promise<T> | T,
  options: WithPolicyOptions<A>,
): Retrying<A, T> {
  if (typeof fn !== "function") throw new TypeError("withPolicy needs a function to wrap");
  const template = policy instanceof PolicyTemplate ? policy : undefined;
  // A fixed policy is validated once, here, before any call.
  const fixed =
    template !== undefined || typeof policy === "function" ? undefined : compiledOf(policy as Input<Policy> | CompiledPolicy);
  const { idempotencyKey, request, clients, ...rest } = options;
  checkClients(clients);
  if (template !== undefined && request === undefined) {
    throw new TypeError("withPolicy with a PolicyTemplate needs `request`: the logical request each call binds");
  }
  const run = async (...args: A): Promise<RunResult<T>> => {
    checkClients(clients);
    const key = typeof idempotencyKey === "function" ? idempotencyKey(...args) : idempotencyKey;
    const req = typeof request === "function" ? (request as (...args: A) => unknown)(...args) : request;
    let p: Input<Policy> | CompiledPolicy;
    if (template !== undefined) {
      const scope = rest.keyScope;
      const keySha256 = scope === undefined ? sha256Hex(key) : idempotencyKeySha256(key, scope);
      p = template.bind(req as Input<LogicalRequest>, keySha256);
    } else {
      p = fixed ?? (policy as (...args: A) => Input<Policy> | CompiledPolicy)(...args);
    }
    const opts: RunOptions = { ...rest, idempotencyKey: key };
    if (req !== undefined) opts.request = req;
    return runWithPolicy(p, (step, signal) => fn(step, signal, ...args), opts);
  };
  const call = async (...args: A): Promise<T> => (await run(...args)).result;
  return Object.assign(call, { run });
}
