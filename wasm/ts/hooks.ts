/**
 * Run hooks: what a driver shows the caller as the run goes, always the
 * core's plain documents (a decision, a planned sleep, an attempt and its
 * judgement, the sealed receipt). A hook never changes the run: what it
 * throws (or the promise it returns rejects with) is reported as a
 * `HookWarning` with code `hook_failed` through `process.emitWarning`
 * (`console.warn` where there is no `process`), and the run goes on.
 */

import type { Attempt, Decision, Judgement, Receipt } from "./types.js";

/** The wait a driver is about to make before a planned attempt (run clock, ms). */
export interface PlannedSleep {
  /** The attempt it waits for. */
  ordinal: number;
  route_id: string;
  /** When the wait starts. */
  at_ms: number;
  /** The attempt's `not_before_ms`. */
  not_before_ms: number;
  /** `not_before_ms - at_ms`. */
  sleep_ms: number;
}

/** The hooks of a run (each optional). */
export interface RunHooks {
  /** Each recorded attempt, as in the attempts document, and the core's judgement of it. */
  onAttempt?: (attempt: Attempt, judgement: Judgement) => unknown;
  /** Each decision of the core: a dispatch, and at the end the terminal. */
  onDecision?: (decision: Decision) => unknown;
  /** Before each wait for a planned attempt's `not_before_ms`. */
  onSleep?: (sleep: PlannedSleep) => unknown;
  /** Once, with the sealed receipt, when the run ends (completed, stopped or cancelled). */
  onTerminal?: (receipt: Receipt) => unknown;
}

/** A hook threw: reported, and the run went on unchanged. */
export class HookWarning extends Error {
  readonly code = "hook_failed";
  /** The hook's name (`onAttempt`, `onDecision`, `onSleep`, `onTerminal`). */
  readonly hook: string;
  /** What it threw. */
  readonly error: unknown;

  constructor(hook: string, error: unknown) {
    const what = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    super(`hook_failed: ${hook} threw ${what}`);
    this.name = "HookWarning";
    this.hook = hook;
    this.error = error;
  }
}

function warn(warning: HookWarning): void {
  const proc = (globalThis as { process?: { emitWarning?: (w: Error) => void } }).process;
  if (typeof proc?.emitWarning === "function") proc.emitWarning(warning);
  else console.warn(warning.message);
}

/** Call a hook; what it throws or rejects with becomes a `HookWarning`. */
export function callHook<A extends unknown[]>(name: string, hook: (...args: A) => unknown, ...args: A): void {
  try {
    const out = hook(...args);
    if (out !== null && typeof out === "object" && typeof (out as PromiseLike<unknown>).then === "function") {
      (out as PromiseLike<unknown>).then(undefined, (e: unknown) => warn(new HookWarning(name, e)));
    }
  } catch (e) {
    warn(new HookWarning(name, e));
  }
}

/** The planned sleep before `decision` at run time `at`. */
export function plannedSleep(decision: { ordinal: number; route_id: string; not_before_ms: number }, at: number): PlannedSleep {
  return {
    ordinal: decision.ordinal,
    route_id: decision.route_id,
    at_ms: at,
    not_before_ms: decision.not_before_ms,
    sleep_ms: Math.max(0, decision.not_before_ms - at),
  };
}

/** A copy of a document for a hook, so that nothing it does reaches the run. */
export function copied<D>(document: D): D {
  return JSON.parse(JSON.stringify(document)) as D;
}
