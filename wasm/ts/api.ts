/** Everything the package exports, whichever build of the module is installed. */

import { call, toText, type Input, type RawBindings } from "./core.js";
import { DecodeError } from "./errors.js";
import type {
  AdmissionAdmitResult,
  AdmissionObserveResult,
  AdmissionConfig,
  AdmissionSnapshot,
  BreakerAdmitResult,
  BreakerConfig,
  BreakerSnapshot,
  BudgetWithdrawResult,
  Outcome,
  RetryBudgetConfig,
  RetryBudgetSnapshot,
} from "./types.js";

export {
  CompiledPolicy,
  compilePolicy,
  validatePolicy,
  planNext,
  evaluate,
  seal,
  verifyBundle,
  digest,
  parseRetryAfter,
  classifyHttp,
  judge,
  nextRepair,
  verifyRepairChain,
  checkOutcome,
  requestSha256,
  buildPolicy,
  liftRequest,
  checkSentRequest,
  checkPriceSchedule,
  priceCost,
  canonicalRequest,
  idempotencyKeySha256,
  sha256Hex,
  toText,
  type Input,
  PolicyTemplate,
  compilePolicyTemplate,
} from "./core.js";
export { Session, RETURNED, type Observation } from "./session.js";
export {
  HedgeSession,
  runHedged,
  type HedgeAdmitted,
  type HedgeAttempt,
  type HedgeDispatch,
  type HedgedAttempt,
  type HedgedReceipt,
  type HedgeLoser,
  type HedgeMark,
  type HedgeObserved,
  type HedgeRun,
  type HedgeRunOptions,
  type HedgeSection,
  type HedgeStep,
  type HedgeSummary,
} from "./hedge.js";
export { Fleet, requestTokenBound, freshBreaker, freshBudget, breakerKey, budgetKey, type FleetOptions, type FleetRunSummary } from "./fleet.js";
export { MemoryStore } from "./stores/memory.js";
export {
  keyPoolSelect,
  keyPoolRecord,
  keySha256,
  KeyRing,
  poolConfig,
  runPooled,
  type KeyPoolConfig,
  type KeyPoolSnapshot,
  type PooledKey,
  type PooledOptions,
  type PooledResult,
  type KeyPoolSelectResult,
  type KeyRefusal,
  type KeyState,
  type PoolKey,
} from "./keypool.js";
export {
  StoreUnavailableError,
  type AppendAnswer,
  type AppendLog,
  type FencedAppendAnswer,
  type CheckAndSetAnswer,
  type CheckAndSetEntry,
  type FleetStore,
  type LogEntry,
  type StoreDocument,
  type StoreRead,
  type StoreRow,
  type StoreWrite,
} from "./stores/store.js";
export { AttemptError, factsOf, type Classifier, type FactsOptions } from "./facts.js";
export {
  journalVerify,
  journalRecover,
  journalAppend,
  journalClassify,
  JournalWriter,
  idempotencyClaim,
  idempotencyComplete,
  type Dispatch,
  type JournalEventKind,
  type JournalEvent,
  type JournalEntry,
  type JournalVerified,
  type Reconciliation,
  type ReconciliationAnswer,
  type PendingAttempt,
  type Recovery,
  type Classified,
  type IdempotencyRecord,
  type Retention,
  type ClaimRequest,
  type Completion,
  type Claim,
} from "./journal.js";
export { machineTranscript, type MachineEffect, type MachineEvent, type MachineTranscript } from "./machine.js";
export {
  runJournaled,
  resumeJournaled,
  journalLog,
  leaseKey,
  type JournalStep,
  JournaledRunError,
  JournaledStopError,
  type JournalStore,
  type JournaledOptions,
  type JournaledResult,
  type JournaledEnd,
  type JournaledRunCode,
  type ReconcileAnswer,
  type ReconcileAnswerKind,
  type ReconcileQuestion,
} from "./journaled.js";
export { withPolicy, type Retrying, type WithPolicyOptions, assertNoClientRetries } from "./wrap.js";
export { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
export { HookWarning, type PlannedSleep, type RunHooks } from "./hooks.js";
export {
  ajvCheck,
  checkOn,
  defectsOf,
  outputCheck,
  schemaCheck,
  type CheckAnswer,
  type CompiledValidator,
  type OutputCheck,
  type RepairDefect,
  type SafeParseSchema,
} from "./checks.js";
export type { WithChain } from "./repair.js";
export * from "./tables.js";
export {
  RetryledgerError,
  DecodeError,
  PolicyError,
  DriftError,
  ReceiptError,
  HttpError,
  RunError,
  JournalError,
  IdempotencyError,
  RunStoppedError,
  UnrecognizedDispatchError,
  RunCancelledError,
  type DecodeCode,
  type PolicyCode,
  type DriftCode,
  type ReceiptCode,
  type HttpCode,
  type RunCode,
  type JournalCode,
  type IdempotencyCode,
  type ErrorCode,
  type ErrorFamily,
  type ErrorDetails,
  type StoppedDetails,
} from "./errors.js";
export type * from "./types.js";
export {
  Machine,
  runLoop,
  storeRead,
  storeWrite,
  type CasDoc,
  type DispatchEffect,
  type LoopAdapter,
  type LoopReconcileAnswer,
  type LoopResult,
  type LoopSleep,
  type MachineOptions,
  type StoreRowDoc,
} from "./loop.js";

/** The module's fleet transitions (JSON text in and out). */
interface FleetBindings {
  breaker_admit(config: string, snapshot: string, nowEpochMs: number): string;
  breaker_record(config: string, snapshot: string, probe: boolean, outcome: string, nowEpochMs: number): string;
  budget_deposit(config: string, snapshot: string, nowEpochMs: number): string;
  budget_withdraw(config: string, snapshot: string, nowEpochMs: number): string;
  admission_admit(config: string, snapshot: string, nowEpochMs: number, queuedSinceEpochMs: number, tokens: number, tenant?: string): string;
  admission_release(config: string, snapshot: string, nowEpochMs: number, reserved: number, used?: number): string;
  admission_observe(config: string, snapshot: string, headers: string, nowEpochMs: number): string;
}

const fleetCall = <T>(f: (b: FleetBindings) => T): T => call((b: RawBindings) => f(b as unknown as FleetBindings));

function epochMs(x: unknown): number {
  if (typeof x !== "number") {
    throw new DecodeError("invalid_type", "invalid_type at /now_epoch_ms: `now_epoch_ms` must be a number", { path: "/now_epoch_ms" });
  }
  return x;
}

/**
 * A breaker's admission at a wall-clock time: `{admission, snapshot}`, the
 * admission `admitted` (as a half-open probe or not) or `rejected`, and the
 * next snapshot (write it back when it changed).
 */
export function breakerAdmit(config: Input<BreakerConfig>, snapshot: Input<BreakerSnapshot>, nowEpochMs: number): BreakerAdmitResult {
  const c = toText(config);
  const s = toText(snapshot);
  const now = epochMs(nowEpochMs);
  return JSON.parse(fleetCall((b) => b.breaker_admit(c, s, now))) as BreakerAdmitResult;
}

/** The next breaker snapshot after an admitted attempt's outcome (`probe`: it was admitted as a half-open probe). */
export function breakerRecord(
  config: Input<BreakerConfig>,
  snapshot: Input<BreakerSnapshot>,
  probe: boolean,
  outcome: Input<Outcome>,
  nowEpochMs: number,
): BreakerSnapshot {
  const c = toText(config);
  const s = toText(snapshot);
  const o = toText(outcome);
  if (typeof probe !== "boolean") {
    throw new DecodeError("invalid_type", "invalid_type at /probe: `probe` must be a boolean", { path: "/probe" });
  }
  const now = epochMs(nowEpochMs);
  return JSON.parse(fleetCall((b) => b.breaker_record(c, s, probe, o, now))) as BreakerSnapshot;
}

/** The next budget snapshot after an admitted first attempt deposits its share. */
export function budgetDeposit(config: Input<RetryBudgetConfig>, snapshot: Input<RetryBudgetSnapshot>, nowEpochMs: number): RetryBudgetSnapshot {
  const c = toText(config);
  const s = toText(snapshot);
  const now = epochMs(nowEpochMs);
  return JSON.parse(fleetCall((b) => b.budget_deposit(c, s, now))) as RetryBudgetSnapshot;
}

/** A retry's or fallback's withdrawal: `{granted, snapshot}` (the snapshot unchanged but for the floor's refill when refused). */
export function budgetWithdraw(config: Input<RetryBudgetConfig>, snapshot: Input<RetryBudgetSnapshot>, nowEpochMs: number): BudgetWithdrawResult {
  const c = toText(config);
  const s = toText(snapshot);
  const now = epochMs(nowEpochMs);
  return JSON.parse(fleetCall((b) => b.budget_withdraw(c, s, now))) as BudgetWithdrawResult;
}

function count(name: string, x: unknown): number {
  if (typeof x !== "number") {
    throw new DecodeError("invalid_type", `invalid_type at /${name}: \`${name}\` must be a number`, { path: `/${name}` });
  }
  return x;
}

/**
 * One admission under admission limits at a wall-clock time, for an attempt
 * that first asked at `queuedSinceEpochMs` and reserves `tokens`:
 * `{answer, snapshot}`, the answer `admitted` (with its start), `wait` (the
 * in-flight cap is full: ask again then) or `refused` (the earliest start,
 * if any, lies beyond the queue bound), and the next snapshot.
 */
export function admissionAdmit(
  config: Input<AdmissionConfig>,
  snapshot: Input<AdmissionSnapshot>,
  nowEpochMs: number,
  queuedSinceEpochMs: number,
  tokens = 0,
  tenant?: string,
): AdmissionAdmitResult {
  const c = toText(config);
  const s = toText(snapshot);
  const now = epochMs(nowEpochMs);
  const since = count("queued_since_epoch_ms", queuedSinceEpochMs);
  const t = count("tokens", tokens);
  if (tenant !== undefined && typeof tenant !== "string") throw new TypeError("tenant is a string");
  return JSON.parse(fleetCall((b) => b.admission_admit(c, s, now, since, t, tenant))) as AdmissionAdmitResult;
}

/** An admitted attempt is over: its slot freed and its `reserved` tokens settled with the `used` ones (`undefined`: not reported). */
export function admissionRelease(
  config: Input<AdmissionConfig>,
  snapshot: Input<AdmissionSnapshot>,
  nowEpochMs: number,
  reserved: number,
  used?: number,
): AdmissionSnapshot {
  const c = toText(config);
  const s = toText(snapshot);
  const now = epochMs(nowEpochMs);
  const r = count("reserved", reserved);
  const u = used === undefined ? undefined : count("used", used);
  return JSON.parse(fleetCall((b) => b.admission_release(c, s, now, r, u))) as AdmissionSnapshot;
}

/**
 * A response's rate-limit headers (`[name, value]` pairs, or their JSON
 * text) applied to an admission snapshot: `{snapshot, notes?}` (the
 * snapshot unchanged when no header applies; `notes`: what was ignored).
 */
export function admissionObserve(
  config: Input<AdmissionConfig>,
  snapshot: Input<AdmissionSnapshot>,
  headers: string | ReadonlyArray<readonly [string, string]>,
  nowEpochMs: number,
): AdmissionObserveResult {
  const c = toText(config);
  const s = toText(snapshot);
  const h = typeof headers === "string" ? headers : JSON.stringify(headers);
  const now = epochMs(nowEpochMs);
  return JSON.parse(fleetCall((b) => b.admission_observe(c, s, h, now))) as AdmissionObserveResult;
}

export {
  lowerRequest,
  routeCapabilities,
  type ContentPart,
  type ConversationMessage,
  type ConversationRequest,
  type LowerOptions,
  type Lowered,
  type LoweredRouteRelease,
  type LoweringApi,
  type LoweringNote,
  type LoweringSettings,
  type RouteCapability,
} from "./lowering.js";
