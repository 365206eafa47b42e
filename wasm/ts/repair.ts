/**
 * Bounded repair: the runs of a request and its repairs (docs/REPAIR.md).
 *
 * `runWithPolicy(policy, dispatch, {repair})` lands here. Each run of the
 * chain is an ordinary run of the driver, under the policy the core derives
 * for it (`nextRepair`: the repair's request and key digests, the deadline
 * and the cost left). After a run that stopped on invalid output,
 * `repair(output, defects)` builds the next logical request; the core
 * decides whether a repair may follow at all. Nothing here decides a budget.
 */

import { defectsOf, type OutputCheck } from "./checks.js";
import { CompiledPolicy, nextRepair, repairStep, requestSha256, type Input } from "./core.js";
import { DecodeError, DriftError, RetryledgerError, RunStoppedError } from "./errors.js";
import type { DispatchFn, RunOptions, RunResult, Step } from "./driver.js";
import type { OutputVerdict as Verdict, Policy, RepairChain, RepairLink } from "./types.js";

/** No repair may follow (the core's answer): the run's own error stands. */
const NO_REPAIR = new Set(["repair_not_allowed", "repair_over_budget", "repair_after_terminal", "repair_same_request", "repair_chain_drift"]);

/** A result or error of a repaired run: the chain so far. */
export interface WithChain {
  chain?: RepairChain;
}

/** @internal */
export async function runRepaired<T>(
  policy: Input<Policy> | CompiledPolicy,
  dispatch: DispatchFn<T>,
  options: RunOptions,
): Promise<RunResult<T> & WithChain> {
  const { runWithPolicy } = await import("./driver.js");
  const repair = options.repair as NonNullable<RunOptions["repair"]>;
  const clock = options.clock ?? ((): number => performance.now());
  const t0 = clock();
  const elapsed = (): number => Math.max(0, Math.floor(clock() - t0));
  const rootKey = options.idempotencyKey;
  const links: RepairLink[] = [];
  const document = (): RepairChain => ({ links: [...links], schema: "retryledger.repair_chain.v1" });
  // The last answer the checks saw and their verdicts.
  let output: unknown;
  let verdicts: Verdict[] = [];
  const checks: OutputCheck[] = (options.checks ?? []).map((c, i) => ({
    validator: c.validator,
    kind: c.kind,
    check(out: unknown): Verdict {
      if (i === 0) verdicts = [];
      const v = c.check(out);
      output = out;
      verdicts.push(v);
      return v;
    },
  }));
  let current: Input<Policy> | CompiledPolicy = policy;
  let key = rootKey;
  let request = options.request;
  let ordinal = 0;
  let started = 0;
  const add = (bundle: RepairLink["bundle"]): void => {
    const link: RepairLink = { bundle, started_at_ms: started };
    if (ordinal > 0) {
      link.parent_request_sha256 = (links.at(-1) as RepairLink).bundle.policy.logical_request_sha256;
      link.repair_ordinal = ordinal;
    }
    links.push(link);
  };
  for (;;) {
    const req = request;
    const n = ordinal;
    const withRequest: DispatchFn<T> = (step: Step, signal: AbortSignal) => {
      const s = step as Step & { request: unknown; repairOrdinal: number };
      s.request = req;
      s.repairOrdinal = n;
      return dispatch(step, signal);
    };
    // The caller's options (its clock only if it gave one: the default clock arms the deadline timer).
    const { repair: _repair, request: _request, ...rest } = options;
    void _repair;
    void _request;
    const runOptions: RunOptions = { ...rest, idempotencyKey: key, checks };
    let result: RunResult<T>;
    try {
      result = await runWithPolicy(current, withRequest, runOptions);
    } catch (e) {
      if (!(e instanceof RunStoppedError)) throw e;
      const stopped = e as RunStoppedError<T> & WithChain;
      add(stopped.bundle);
      stopped.chain = document();
      // The core says whether a repair may follow the run's end, and under which key.
      const step = repairStep(links, rootKey, options.keyScope);
      if (step === null) throw stopped;
      let next: unknown;
      let digest: string;
      try {
        next = await repair(output, defectsOf(verdicts));
        digest = requestSha256(next as Parameters<typeof requestSha256>[0]);
      } catch (cause) {
        const why =
          cause instanceof RetryledgerError
            ? `the repair function returned a request that cannot be canonicalized: ${cause.message}`
            : `the repair function failed: ${cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause)}`;
        const error = new DecodeError("repair_function_failed", why, { path: "/repair", cause }) as DecodeError & WithChain;
        error.chain = document();
        throw error;
      }
      const at = elapsed();
      let derived: Policy;
      try {
        derived = nextRepair(links, digest, step.idempotency_key_sha256, at);
      } catch (no) {
        if (no instanceof DriftError && NO_REPAIR.has(no.code)) {
          stopped.repairRefused = no;
          throw stopped;
        }
        throw no;
      }
      current = derived;
      key = step.idempotency_key;
      request = next;
      ordinal = step.repair_ordinal;
      started = at;
      continue;
    }
    add(result.bundle);
    const done = result as RunResult<T> & WithChain;
    Object.defineProperty(done, "chain", { value: document(), enumerable: true });
    return done;
  }
}
