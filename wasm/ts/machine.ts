/**
 * The run machine of the core (docs/COMPOSITION.md): one sans-I/O loop for a
 * whole run, effects out and events in. A host asks for the next effect
 * (`append`, `read`, `write`, `sleep`, `dispatch`, `await`,
 * `cancel_attempts`, `poll`, `cancel`, `reconcile`, `done`) and answers it
 * with one event; the fleet, the journal, streams, async jobs, output checks
 * and hedging are layers of it (a hedged run keeps more than one attempt in
 * flight: its observations name their `ordinal`, and a decided round's
 * losers are answered `attempt_cancelled`).
 *
 * `machineTranscript` replays a recorded sequence of events: the effects the
 * machine asked for, where it ended, and the first event it refused.
 */

import { call, toText, type Input, type RawBindings } from "./core.js";
import { callHook, copied, type PlannedSleep, type RunHooks } from "./hooks.js";
import type { Fleet } from "./fleet.js";
import { storeRead, storeWrite, type CasDoc, type MachineOptions, type StoreRowDoc } from "./loop.js";
import type { Attempt, Decision, Judgement, Receipt } from "./types.js";

/** An effect the machine asks of its host, tagged by `kind`. */
export type MachineEffect = {
  kind: "append" | "read" | "write" | "sleep" | "dispatch" | "await" | "cancel_attempts" | "poll" | "cancel" | "reconcile" | "done";
} & Record<string, unknown>;

/** An event a host answers an effect with, tagged by `kind`. */
export type MachineEvent = {
  kind:
    | "appended"
    | "append_refused"
    | "read"
    | "store_unavailable"
    | "written"
    | "clock"
    | "observed"
    | "reconciled"
    | "cancelled"
    | "attempt_cancelled";
} & Record<string, unknown>;

/** What a replay of events found. */
export interface MachineTranscript {
  /** The effect outstanding before each event, then after the last. */
  effects: MachineEffect[];
  /** How the run ended, once the machine is done. */
  terminal?: string;
  /** The sealed receipt's digest, once done. */
  receipt_sha256?: string;
  /** The sealed bundle's digest, once done. */
  bundle_sha256?: string;
  /** The first event refused (`event`: its index; `null` at the start). */
  error?: { code: string; event: number | null; path?: string };
}

/** The module's machine calls (JSON text in and out). */
interface MachineBindings {
  machine_transcript(policy: string, options: string, journal: string | undefined, events: string): string;
}

/**
 * The machine started under `options` (or, with `journal`, resumed from its
 * events) and fed `events`. Malformed input throws a coded error; a refused
 * event is part of the answer.
 */
export function machineTranscript(
  policy: Input<object>,
  options: Input<object>,
  journal: Input<readonly object[]> | undefined,
  events: Input<readonly MachineEvent[]>,
): MachineTranscript {
  const p = toText(policy);
  const o = toText(options);
  const j = journal === undefined ? undefined : toText(journal);
  const e = toText(events);
  return JSON.parse(call((b: RawBindings) => (b as unknown as MachineBindings).machine_transcript(p, o, j, e))) as MachineTranscript;
}

/** A wait of the run clock as the host loop reports it, and the attempt it waits for (absent for another wait). */
export interface LoopSleepDoc {
  from_ms: number;
  until_ms: number;
  ms: number;
  dispatch?: Record<string, unknown>;
}

/** A driver's `PlannedSleep` of a wait before a planned attempt (none for another wait, e.g. a reconciliation's). */
export function plannedSleepOf(s: LoopSleepDoc): PlannedSleep | undefined {
  const d = s.dispatch as { ordinal: number; route_id: string } | undefined;
  if (d === undefined) return undefined;
  return { ordinal: d.ordinal, route_id: d.route_id, at_ms: s.from_ms, not_before_ms: s.until_ms, sleep_ms: s.ms };
}

/** The host loop's hook methods of a driver (`LoopAdapter`'s). */
export interface LoopHooks {
  onDecision?(decision: Record<string, unknown>): void;
  onSleep?(sleep: LoopSleepDoc): void;
  onAttempt?(attempt: Record<string, unknown>, judgement: Record<string, unknown>): void;
  onTerminal?(receipt: Receipt): void;
}

/**
 * The loop's hooks of a caller's `RunHooks`, as every driver on the loop
 * calls them: copies of the documents, a wait before an attempt as its
 * `PlannedSleep` (no call for another wait), what a hook throws a `HookWarning`.
 */
export function loopHooks(hooks: RunHooks): LoopHooks {
  const { onDecision, onSleep, onAttempt, onTerminal } = hooks;
  const out: LoopHooks = {};
  if (onDecision !== undefined) out.onDecision = (d) => callHook("onDecision", onDecision, copied(d) as unknown as Decision);
  if (onSleep !== undefined) {
    out.onSleep = (s) => {
      const planned = plannedSleepOf(s);
      if (planned !== undefined) callHook("onSleep", onSleep, planned);
    };
  }
  if (onAttempt !== undefined) {
    out.onAttempt = (a, j) => callHook("onAttempt", onAttempt, copied(a) as unknown as Attempt, copied(j) as unknown as Judgement);
  }
  if (onTerminal !== undefined) out.onTerminal = (r) => callHook("onTerminal", onTerminal, copied(r));
  return out;
}

/** The fleet store's register I/O of a loop adapter, under the fleet's namespace. */
export interface LoopFleet {
  read(keys: string[]): Promise<StoreRowDoc[]>;
  write(writes: CasDoc[]): Promise<number>;
}

/** A loop adapter's `read` and `write` through `fleet` (none without a fleet: the loop's coded refusal then). */
export function loopFleet(fleet: Fleet | undefined): Partial<LoopFleet> {
  if (fleet === undefined) return {};
  return {
    read: (keys) => storeRead(fleet.store, fleet.namespace, keys),
    write: (writes) => storeWrite(fleet.store, fleet.namespace, writes),
  };
}

/** The run machine's options a fleet sets: its conflict bound, its token reservation and the call's tenant. */
export function fleetMachineOptions(fleet: Fleet | undefined): Pick<MachineOptions, "max_conflicts" | "reserve_tokens" | "tenant"> {
  if (fleet === undefined) return {};
  const out: Pick<MachineOptions, "max_conflicts" | "reserve_tokens" | "tenant"> = { max_conflicts: fleet.maxConflicts };
  if (fleet.reserveTokens !== undefined) out.reserve_tokens = fleet.reserveTokens;
  if (fleet.tenant !== undefined) out.tenant = fleet.tenant;
  return out;
}
