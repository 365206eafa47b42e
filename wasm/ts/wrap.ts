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
 * binds one logical request. Every guarantee of `runWithPolicy` holds.
 */

import { CompiledPolicy, compiledOf, type Input } from "./core.js";
import { runWithPolicy, type RunOptions, type RunResult, type Step } from "./driver.js";
import type { Policy } from "./types.js";

/** `runWithPolicy`'s options, with the key given or derived from the arguments. */
export type WithPolicyOptions<A extends unknown[]> = Omit<RunOptions, "idempotencyKey"> & {
  idempotencyKey: string | ((...args: A) => string);
};

/** A function under a policy: call it for the value, `.run` for the whole `RunResult`. */
export type Retrying<A extends unknown[], T> = ((...args: A) => Promise<T>) & {
  run(...args: A): Promise<RunResult<T>>;
};

/** Wrap `fn` so that every call is one run under `policy`. */
export function withPolicy<A extends unknown[], T>(
  policy: Input<Policy> | CompiledPolicy | ((...args: A) => Input<Policy> | CompiledPolicy),
  fn: (step: Step, signal: AbortSignal, ...args: A) => Promise<T> | T,
  options: WithPolicyOptions<A>,
): Retrying<A, T> {
  if (typeof fn !== "function") throw new TypeError("withPolicy needs a function to wrap");
  // A fixed policy is validated once, here, before any call.
  const fixed = typeof policy === "function" ? undefined : compiledOf(policy);
  const { idempotencyKey, ...rest } = options;
  const run = async (...args: A): Promise<RunResult<T>> => {
    const key = typeof idempotencyKey === "function" ? idempotencyKey(...args) : idempotencyKey;
    const p = fixed ?? (policy as (...args: A) => Input<Policy> | CompiledPolicy)(...args);
    return runWithPolicy(p, (step, signal) => fn(step, signal, ...args), { ...rest, idempotencyKey: key });
  };
  const call = async (...args: A): Promise<T> => (await run(...args)).result;
  return Object.assign(call, { run });
}
