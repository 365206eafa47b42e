/**
 * The documents of retryledger, exactly as the core reads and writes them:
 * snake_case fields, integers only (each in 0..=2^53-1), optional fields
 * omitted (never `null`). Every document names its `schema`.
 */

import type {
  HintSource,
  IndeterminateKind,
  NonRetryableKind,
  Note,
  OutcomeClass,
  ProviderFamily,
  RetryableKind,
  Rule,
  Signal,
  Terminal,
} from "./tables.js";

export type { HintSource, IndeterminateKind, NonRetryableKind, Note, OutcomeClass, ProviderFamily, ReadHeader, RetryableKind, Rule, Signal, Terminal } from "./tables.js";

/** Lowercase hex SHA-256: 64 characters of 0-9a-f. */
export type Sha256Hex = string;
/** 1 to 128 bytes of `A-Z a-z 0-9 . _ - : / @ +`. */
export type Identifier = string;

// ---------------------------------------------------------------- capabilities

export type Modality = "text" | "image" | "audio" | "video" | "file";
export type StructuredOutput = "none" | "json_object" | "json_schema" | "constrained_decoding";
export type SamplingControl = "seed" | "temperature" | "top_p" | "logprobs" | "stop_sequences";
export type ToolCalls = "none" | "single" | "parallel";
export type StreamEvent = "terminal" | "usage";
export type Refusal = "none" | "in_band_text" | "typed";
export type ReleasePin = "floating" | "alias" | "exact";

/** A capability contract: what a request requires, or what a route offers. Sets are arrays of unique items. */
export interface Capabilities {
  input_modalities: Modality[];
  max_context_tokens: number;
  max_output_tokens: number;
  max_response_bytes: number;
  output_modalities: Modality[];
  refusal: Refusal;
  regions: Identifier[];
  release_pin: ReleasePin;
  retention_days: number;
  sampling_controls: SamplingControl[];
  streaming_events: StreamEvent[];
  structured_output: StructuredOutput;
  tool_calls: ToolCalls;
}

// ---------------------------------------------------------------- policy

/** Who owns retries; only `harness` passes validation. */
export type RetryOwner = "harness" | "adapter" | "transport_sdk";
/** Where request data may go, narrowest first. */
export type DataBoundary = "local_process" | "private_service" | "external_provider";

export interface Backoff {
  /** Delay after a route's first failed attempt (doubles per attempt), ms. */
  base_ms: number;
  /** Cap on the exponential term, ms. */
  max_ms: number;
  /** Cap on a server's Retry-After hint, ms. */
  retry_after_cap_ms: number;
  /** What a hint above the cap does (absent: `clamp`). */
  retry_after_over_cap?: "clamp" | "skip_route" | "stop";
  /** What a `quota_exhausted` answer does (absent: `stop`); `skip_route` plans the next route at once. */
  quota_exhausted?: "stop" | "skip_route";
}

/** Replayable jitter, tagged by `mode`. */
export type Jitter =
  | { mode: "none" }
  | { mode: "full"; scheduler_release: Identifier; seed: number }
  | { mode: "equal"; scheduler_release: Identifier; seed: number }
  | { mode: "decorrelated"; scheduler_release: Identifier; seed: number };

export interface Route {
  behavior_class_sha256: Sha256Hex;
  capabilities: Capabilities;
  data_boundary: DataBoundary;
  max_attempts: number;
  priority: number;
  /** The provider family whose error table and hint sources apply (docs/PROVIDERS.md). */
  provider_family?: ProviderFamily;
  reserve_cost: number;
  route_id: Identifier;
  route_release_sha256: Sha256Hex;
  supports_idempotency: boolean;
}

/** `retryledger.policy.v1` */
export interface Policy {
  allowed_degraded_behavior_classes?: Sha256Hex[];
  /** A request a provider runs as a job (docs/JOBS.md). */
  async_job?: import("./job.js").AsyncJob;
  backoff: Backoff;
  behavior_class_sha256: Sha256Hex;
  cost_unit: Identifier;
  deadline_ms: number;
  idempotency_key_sha256: Sha256Hex;
  jitter: Jitter;
  logical_request_sha256: Sha256Hex;
  max_data_boundary: DataBoundary;
  max_total_attempts: number;
  max_total_cost: number;
  /** Bounded semantic repair after an `invalid_output` stop (docs/REPAIR.md). */
  repair?: RepairPolicy;
  requirements: Capabilities;
  retry_owner: RetryOwner;
  routes: Route[];
  schema: "retryledger.policy.v1";
  /** Fleet protection: breakers per route release, a retry budget per scope. */
  fleet?: FleetConfig;
  /** Hedging: a bounded duplicate after a latency threshold (docs/HEDGING.md). */
  hedge?: import("./hedge.js").HedgeSection;
  /** The stream contract, when the run streams. */
  stream?: StreamContract;
}

// ---------------------------------------------------------------- outcomes

export interface SuccessOutcome {
  class: "success";
}
export interface RetryableOutcome {
  class: "retryable";
  kind: RetryableKind;
  /** The server's Retry-After hint in ms, unbounded as observed. */
  retry_after_ms?: number;
  /** Which source gave the hint, when the core read it (docs/PROVIDERS.md). */
  retry_after_source?: HintSource;
}
export interface NonRetryableOutcome {
  class: "non_retryable";
  kind: NonRetryableKind;
}
export interface IndeterminateOutcome {
  class: "indeterminate";
  kind: IndeterminateKind;
}
/** An observed outcome, tagged by `class`. */
export type Outcome = SuccessOutcome | RetryableOutcome | NonRetryableOutcome | IndeterminateOutcome;

// ---------------------------------------------------------------- attempts

export interface Attempt {
  /** What the attempt was admitted under, when the policy has a fleet section. */
  admission?: Admission;
  completed_at_ms: number;
  cost: number;
  idempotency_key_sha256: Sha256Hex;
  /** `true` when a testing fault injector made this failure (docs/TESTING.md). */
  injected_fault?: boolean;
  jitter_sample_ms?: number;
  /** What the attempt was of an async job (docs/JOBS.md). */
  job?: import("./job.js").JobRecord;
  /** The provider refused the pool key the attempt was sent with (401 `unauthorized`, 403 `forbidden`): the run went on with another key. */
  key_refused?: import("./keypool.js").KeyRefusal;
  logical_request_sha256: Sha256Hex;
  /** The model the attempt asked for and the one the provider reported; a side not learned is absent (docs/LOWERING.md). */
  model?: ModelRecord;
  ordinal: number;
  outcome: Outcome;
  /** The failed output check that decided the outcome (docs/REPAIR.md). */
  output_check?: OutputCheckRecord;
  /** How a recovered run learned the outcome from the receiver (absent when observed directly). */
  reconciled?: Reconciled;
  /** Digest of the request body the attempt sent (after lowering to its route), when the host reported it. */
  request_body_sha256?: Sha256Hex;
  route_id: Identifier;
  route_ordinal: number;
  route_release_sha256: Sha256Hex;
  started_at_ms: number;
  /** The attempt's stream record, in a streamed run. */
  stream?: StreamRecord;
  /** Raw usage the provider reported; the attempt's cost is then what the run's price schedule charges for it. */
  usage?: Usage;
}

/** Which model an attempt asked for and which the provider reported serving; at least one is present. */
export interface ModelRecord {
  requested?: Identifier;
  served?: Identifier;
}

/**
 * A receiver's settled answer for an attempt a crashed host never observed;
 * `succeeded_stream_lost` is the core's reading of a `succeeded` streamed
 * attempt whose events the journal does not hold (never committed).
 */
export type Reconciled = "succeeded" | "failed_no_effect" | "unknown" | "succeeded_stream_lost";

/** `retryledger.attempts.v1` */
export interface Attempts {
  attempts: Attempt[];
  cancelled_at_ms?: number;
  /** The fleet's refusal of the next dispatch, when it ended the run. */
  fleet_stop?: FleetStop;
  schema: "retryledger.attempts.v1";
}

// ---------------------------------------------------------------- decisions

/** Dispatch this attempt no earlier than `not_before_ms`. */
export interface DispatchDecision {
  kind: "dispatch";
  /** A streamed run resuming a provider response: dispatch resumes it instead of creating one. */
  continuation?: Continuation;
  deadline_ms: number;
  delay_ms: number;
  idempotency_key_sha256: Sha256Hex;
  jitter_max_ms?: number;
  jitter_min_ms?: number;
  jitter_sample_ms?: number;
  /** For an async job: a submit, a poll of the accepted job, or its planned cancel (docs/JOBS.md). */
  job?: import("./job.js").JobStep;
  logical_request_sha256: Sha256Hex;
  not_before_ms: number;
  ordinal: number;
  reserve_cost: number;
  retry_after_floor_ms: number;
  route_id: Identifier;
  route_ordinal: number;
  route_release_sha256: Sha256Hex;
}

/** The run is over. */
export interface TerminalDecision {
  kind: "terminal";
  terminal: Terminal;
}

/** What `planNext` says: dispatch an attempt, or the run's terminal. Tagged by `kind`. */
export type Decision = DispatchDecision | TerminalDecision;

// ---------------------------------------------------------------- receipts

export interface RouteCount {
  attempts: number;
  route_id: Identifier;
}

export interface ScheduleEntry {
  completed_at_ms: number;
  cost: number;
  delay_ms: number;
  jitter_max_ms?: number;
  jitter_min_ms?: number;
  jitter_sample_ms?: number;
  /** The provider refused the attempt's pool key (401 `unauthorized`, 403 `forbidden`). */
  key_refused?: import("./keypool.js").KeyRefusal;
  /** The digest of the pool key the attempt was sent with (never the secret); absent without a pool. */
  key_sha256?: Sha256Hex;
  /** The model asked for and the one served, when the host reported them. */
  model?: ModelRecord;
  not_before_ms: number;
  ordinal: number;
  /** `success` or the failure kind. */
  outcome: "success" | RetryableKind | NonRetryableKind | IndeterminateKind;
  outcome_class: OutcomeClass;
  /** How a recovered run learned the outcome from the receiver (absent when observed directly). */
  reconciled?: Reconciled;
  retry_after_floor_ms: number;
  route_id: Identifier;
  route_ordinal: number;
  started_at_ms: number;
}

/** `retryledger.receipt.v1` */
export interface Receipt {
  attempt_count: number;
  attempts_sha256: Sha256Hex;
  behavior_class_sha256: Sha256Hex;
  capability_contract_sha256: Sha256Hex;
  degraded: boolean;
  fallback_used: boolean;
  final_route_id?: Identifier;
  finished_at_ms: number;
  /** What the fleet did to the run, when the policy has a fleet section. */
  fleet?: FleetSummary;
  idempotency_key_sha256: Sha256Hex;
  /** Attempts whose failure a testing fault injector made; absent when none was. */
  injected_faults?: number;
  /** The async job's summary, when the policy has an `async_job` section. */
  job?: import("./job.js").JobSummary;
  logical_request_sha256: Sha256Hex;
  policy_sha256: Sha256Hex;
  /** Digest of the run's price schedule, when it had one. */
  price_schedule_sha256?: Sha256Hex;
  route_attempts: RouteCount[];
  schedule: ScheduleEntry[];
  schema: "retryledger.receipt.v1";
  /** What the consumer received, in a streamed run. */
  stream?: StreamSummary;
  terminal: Terminal;
  total_cost: number;
}

/** `retryledger.bundle.v1`: everything needed to replay a run. */
export interface Bundle {
  attempts: Attempts;
  /** Every fleet snapshot an admission read, when the policy has a fleet section. */
  fleet_snapshots?: FleetSnapshots;
  policy: Policy;
  /** The price schedule that priced the run's usage, when it had one. */
  price_schedule?: PriceSchedule;
  receipt: Receipt;
  schema: "retryledger.bundle.v1";
  /** The consumer's event log, in a streamed run. */
  stream_events?: StreamLogEntry[];
}

/** The receipt is exactly the replay of the policy and attempts. */
export interface VerifiedVerdict {
  kind: "verified";
  attempts_sha256: Sha256Hex;
  policy_sha256: Sha256Hex;
  receipt_sha256: Sha256Hex;
  terminal: Terminal;
}

/** The first difference between the sealed run and its replay. */
export interface DriftVerdict {
  kind: "drift";
  attempt_index?: number;
  code: string;
  message: string;
  /** JSON Pointer into the bundle. */
  path: string;
}

/** What `verifyBundle` says, tagged by `kind`. */
export type Verdict = VerifiedVerdict | DriftVerdict;

/** Any document with a digest. */
export type Document = Policy | Attempts | Receipt | Bundle | PriceSchedule;

// ---------------------------------------------------------------- HTTP

export type TransportError = "connect_failed" | "timeout" | "connection_reset";

/** One HTTP attempt as the host observed it; the input of `classifyHttp`. */
export interface HttpObservation {
  /** Response headers as `[name, value]` pairs (names case-insensitive), at most 256. */
  headers?: [string, string][];
  /** Wall clock at observation, Unix ms (resolves HTTP-date hints). */
  now_unix_ms?: number;
  /** Whether any response body bytes reached the caller. */
  response_bytes_received?: boolean;
  /** Cap applied to a Retry-After hint, ms (default 2^53-1). */
  retry_after_cap_ms?: number;
  /** The response status, when one arrived. */
  status?: number;
  /** A transport failure, when one happened. */
  transport_error?: TransportError;
}

/** The header a Retry-After hint came in. */
export type RetryAfterHeader = "retry-after" | "retry-after-ms";

// ---------------------------------------------------------------- requests

/** Any JSON value (the inside of a logical request). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/**
 * The logical request (`retryledger.request.v1`): what the host means to ask,
 * before any route lowers it. Its digest is the policy's `logical_request_sha256`.
 */
export interface LogicalRequest {
  schema: "retryledger.request.v1";
  /** The operation, for example `chat.completions` or `responses`. */
  operation: string;
  /** The input: messages or the prompt. */
  input: Json;
  tools?: Json;
  output_contract?: Json;
  /** Sampling parameters (temperature, top_p, max tokens, ...). */
  sampling?: { [key: string]: Json };
  /** A seed, an integer in 0..=2^53-1. */
  seed?: number;
  /** Input and output modalities. */
  modalities?: { [key: string]: Json };
}

/** A route release (`retryledger.route_release.v1`): its digest is a route's `route_release_sha256`. */
export interface RouteRelease {
  schema: "retryledger.route_release.v1";
  provider: string;
  /** The provider family whose error table the route's failures are read by (docs/PROVIDERS.md). */
  provider_family?: ProviderFamily;
  endpoint: string;
  model: string;
  release_pin: string;
  /** How a conversation request is lowered for this release (docs/LOWERING.md); absent, it is not. */
  lowering?: import("./lowering.js").LoweringSettings;
}

/** A behavior class (`retryledger.behavior_class.v1`): its digest is a `behavior_class_sha256`. */
export interface BehaviorClass {
  schema: "retryledger.behavior_class.v1";
  name: string;
}

/** One route of a policy spec; its priority is its place in the list. */
/** A route's prices per million tokens, in the spec's cost unit (its reserve is the worst case). */
export interface TokenPrice {
  input: number;
  output: number;
}

/** The defaults a spec names (docs/PRESETS.md). */
export type Preset = "interactive" | "batch";

/** The fields of a route of a spec, its release aside. */
interface RouteSpecFields {
  /** Default under a preset: `provider/model`. */
  route_id?: string;
  /** The spec's behavior class when absent. */
  behavior_class?: BehaviorClass;
  /** Default under a preset: a text chat model's. */
  capabilities?: Capabilities;
  /** Default under a preset: `private_service`. */
  data_boundary?: DataBoundary;
  /** Default under a preset: 2 (`interactive`) or 4 (`batch`). */
  max_attempts?: number;
  /** Or `price`: the worst case of the route's context and output bounds. */
  reserve_cost?: number;
  price?: TokenPrice;
  /** Default under a preset: true. */
  supports_idempotency?: boolean;
}

/**
 * One route of a spec, its priority its place in the list: its release as a
 * catalog document, or by provider, model and base URL. Without a preset,
 * every field but `behavior_class` and `price` is required.
 */
export type RouteSpec = RouteSpecFields &
  (
    | { release: RouteRelease }
    | {
        provider: string;
        model: string;
        base_url: string;
        /** The model when absent. */
        release_pin?: string;
        /** The provider's when it names a family. */
        provider_family?: ProviderFamily;
      }
  );

/**
 * A policy spec (`retryledger.policy_spec.v1`): a policy with catalog
 * documents in place of digests. With a `preset` only `routes` (and, for
 * `buildPolicy`, `idempotency_key_sha256`) is needed; every default is written
 * into the built policy (docs/PRESETS.md).
 */
export interface PolicySpec {
  schema: "retryledger.policy_spec.v1";
  preset?: Preset;
  allowed_degraded_behavior_classes?: BehaviorClass[];
  backoff?: Backoff;
  behavior_class?: BehaviorClass;
  cost_unit?: string;
  deadline_ms?: number;
  /** From `idempotencyKeySha256(key, scope)`: never the raw key. Left out of a template's spec. */
  idempotency_key_sha256?: string;
  jitter?: Jitter;
  max_data_boundary?: DataBoundary;
  max_total_attempts?: number;
  max_total_cost?: number;
  requirements?: Capabilities;
  routes: RouteSpec[];
  /** The stream contract, for a streamed request (docs/STREAMING.md). */
  stream?: StreamContract;
  /** Fleet protection: breakers, retry budget (docs/FLEET.md). */
  fleet?: FleetConfig;
  /** A provider-bound part a route cannot carry: `refuse` the route (`provider_bound_history`, the default) or `drop` the part. */
  provider_bound_parts?: "refuse" | "drop";
}

/** Units by kind (`input`, `output`, `cached_input`, `reasoning`, …): usage, or prices per million units. */
export type Usage = { [kind: string]: number };

/** A price schedule (`retryledger.price_schedule.v1`): integer prices per million units, per route release. */
export interface PriceSchedule {
  schema: "retryledger.price_schedule.v1";
  /** The policy's `cost_unit`. */
  cost_unit: string;
  releases: { route_release_sha256: string; prices_per_million: Usage }[];
}

// ---------------------------------------------------------------- observing

/**
 * What a host observed of one attempt (docs/HOSTS.md, "Facts"); the core
 * judges it. Only `result` is required.
 */
export interface Facts {
  /** The caller cancelled while the attempt was in flight. */
  cancelled?: boolean;
  /** The attempt completed at or after the run's deadline (a session works this out itself). */
  deadline_passed?: boolean;
  /** The error response's body as text, at most `MAX_ERROR_BODY_BYTES` + 1 characters (docs/PROVIDERS.md). */
  error_body?: string;
  /** `code` strings of the error and its causes, at most 32. */
  error_codes?: string[];
  /** Class names of the error (most specific first), then of its causes, at most 32. */
  error_types?: string[];
  /** The response headers the core reads (`READ_HEADERS`), as `[name, value]` pairs. */
  headers?: [string, string][];
  /** Wall clock, Unix ms (resolves HTTP-date Retry-After hints). */
  now_unix_ms?: number;
  /** An outcome the error carries explicitly, or the classify hook's answer. */
  outcome?: Outcome;
  /** For a dispatch that returned: the verdict of each output check the host ran (docs/REPAIR.md). */
  output_checks?: OutputVerdict[];
  /** The provider family whose tables apply; a session takes it from the planned route. */
  provider_family?: ProviderFamily;
  /** Response bytes reached the caller before the failure. */
  response_bytes_received?: boolean;
  /** Whether dispatch returned a value or raised. */
  result: "returned" | "raised";
  /** The HTTP status the error carries (100..=599). */
  status?: number;
  /** What the host saw of the stream, when dispatch opened one. */
  stream?: StreamFacts;
  /** A transport signal the host itself observed. */
  transport_error?: Signal;
}

/** The core's judgement of one attempt: its outcome and the rule that decided it. */
export interface Judgement {
  /** What a provider-aware reading ignored, and why (docs/PROVIDERS.md); absent when nothing was. */
  notes?: Note[];
  outcome: Outcome;
  rule: Rule;
  /** In a streamed run: what the host does with the consumer's events. */
  stream?: StreamAction;
}

/** A sealed run: what `Session.seal()` returns and what the driver's results and errors carry. */
export interface Sealed {
  /** How the run ended. */
  readonly terminal: Terminal;
  /** The receipt. */
  readonly receipt: Receipt;
  /** Lowercase hex SHA-256 of the receipt's canonical JSON. */
  readonly receipt_sha256: Sha256Hex;
  /** Policy, attempts and receipt: everything `verifyBundle` replays. */
  readonly bundle: Bundle;
  /** The bundle's canonical JSON text. */
  readonly bundle_json: string;
}

// ---------------------------------------------------------------- streaming

/** What happens to output delivered before a failure. */
export type StreamMode = "buffer" | "tentative" | "continuation" | "restart";

/** The policy's `stream` section. */
export interface StreamContract {
  /** Longest wait for a stream's first event, ms (inside the run's deadline). */
  first_byte_timeout_ms?: number;
  /** Longest wait between two events, ms (inside the run's deadline). */
  idle_timeout_ms?: number;
  /** Most bytes of delta text one attempt may deliver (also the bound on any single event). */
  max_response_bytes: number;
  mode: StreamMode;
}

/** A broken stream protocol the host detected. */
export type StreamViolation =
  | "malformed_event"
  | "event_too_large"
  | "response_too_large"
  | "sequence_back"
  | "sequence_gap"
  | "impossible_usage";

/** What a host saw of one stream that opened. */
export interface StreamFacts {
  /** UTF-8 bytes of all delta texts. */
  bytes: number;
  /** Provider events received (one delta text each, `""` for events without text). */
  events: number;
  last_sequence?: number;
  /** Filled in by the session. */
  mode?: StreamMode;
  response_id?: Identifier;
  terminal_event: boolean;
  usage_event: boolean;
  violation?: StreamViolation;
}

/** The stream record of one attempt. */
export interface StreamRecord {
  bytes: number;
  continues_ordinal?: number;
  deltas_sha256: Sha256Hex;
  events: number;
  last_sequence?: number;
  response_id?: Identifier;
  starting_after?: number;
  terminal_event: boolean;
  usage_event: boolean;
  violation?: StreamViolation;
}

/** A planned continuation: resume a provider response. */
export interface Continuation {
  continues_ordinal: number;
  response_id: Identifier;
  starting_after: number;
}

/** What a host does with the consumer's events after an attempt. */
export type StreamAction = "none" | "commit" | "invalidate" | "continue";

export type StreamEventKind = "delta" | "commit" | "invalidate";
export type StreamEventStatus = "tentative" | "committed" | "invalidated";

/** One event of the consumer's log (`retryledger.stream_event.v1`). */
export interface StreamLogEntry {
  attempt_ordinal: number;
  committed_sha256?: Sha256Hex;
  delta_sha256?: Sha256Hex;
  kind: StreamEventKind;
  policy_sha256: Sha256Hex;
  schema: "retryledger.stream_event.v1";
  sequence: number;
  status: StreamEventStatus;
}

/** What the receipt says of a streamed run. */
export interface StreamSummary {
  committed_events: number;
  delivered_events: number;
  invalidated_events: number;
  mode: StreamMode;
  resumed_attempts: number;
}

// ---------------------------------------------------------------- fleet

/** A policy's circuit breaker (the same for every route release). */
export interface BreakerConfig {
  /** Open after this many consecutive unhealthy outcomes. */
  consecutive_failures?: number;
  /** Open when unhealthy outcomes reach this share (per mille) of the window's outcomes. */
  failure_ratio_permille?: number;
  /** Probes admitted at once when half-open; as many successes close it. */
  half_open_probes: number;
  /** The ratio's minimum number of outcomes in the window. */
  minimum_volume?: number;
  /** How long the breaker stays open before probing, ms. */
  open_ms: number;
  /** The ratio's window, ms. */
  window_ms?: number;
}

export type BreakerState = "closed" | "open" | "half_open";

/** `retryledger.breaker.v1`: the breaker of one route release. */
export interface BreakerSnapshot {
  consecutive_failures: number;
  /** Raised on every state change. */
  generation: number;
  /** When it opened (open). */
  opened_at_epoch_ms?: number;
  /** Parked until then: a run under `retry_after_over_cap: "skip_route"` saw a wait longer than its cap on this route; no run dispatches to it before. */
  parked_until_epoch_ms?: number;
  /** When the latest half-open probe was admitted (half-open with probes in flight); unanswered for `open_ms`, their slots are released. */
  probe_started_at_epoch_ms?: number;
  probe_successes: number;
  probes_in_flight: number;
  /** The route release it guards (its key). */
  route_release_sha256: Sha256Hex;
  schema: "retryledger.breaker.v1";
  state: BreakerState;
  /** The latest time it saw, Unix ms. */
  updated_at_epoch_ms: number;
  window_failures: number;
  window_start_epoch_ms: number;
  window_total: number;
}

/** A policy's retry budget. */
export interface RetryBudgetConfig {
  /** Tokens per second added whatever the traffic. */
  floor_per_second: number;
  /** The balance's cap, in tokens. */
  max_tokens: number;
  /** Milli-tokens each first attempt deposits. */
  ratio_permille: number;
  /** Runs under one scope share the budget. */
  scope: Identifier;
}

/** `retryledger.retry_budget.v1`: the retry budget of one scope. */
export interface RetryBudgetSnapshot {
  /** The balance, milli-tokens. */
  balance_milli: number;
  deposits: number;
  /** Raised on every change. */
  generation: number;
  schema: "retryledger.retry_budget.v1";
  scope: Identifier;
  /** The latest time it saw, Unix ms. */
  updated_at_epoch_ms: number;
  withdrawals: number;
}

/** What a run does when its store cannot be reached. */
export type OnStoreUnavailable = "fail_closed" | "fail_open";

/** The policy's `fleet` section. */
/** Admission limits per route release (and tenant, principal): docs/FLEET.md. */
export interface AdmissionConfig {
  /** A full in-flight cap unchanged (no admission, no release) for this long is presumed lost and starts over, ms. */
  in_flight_lease_ms?: number;
  max_in_flight?: number;
  /** The queue bound: the longest an attempt waits to be admitted, ms. */
  max_queue_ms: number;
  principal?: Identifier;
  request_burst?: number;
  requests_per_second?: number;
  tenant?: Identifier;
  /** Fair tenant shares of the route's request rate: each call names its tenant (docs/FLEET.md, "Fair tenants"). */
  tenant_weights?: TenantWeight[];
  token_bound?: number;
  tokens_per_second?: number;
}

/** One tenant's weight under tenant shares (1..=1000). */
export interface TenantWeight {
  tenant: Identifier;
  weight: number;
}

/** An active tenant's share clock in a route's admission snapshot. */
export interface TenantDue {
  due_at_epoch_ms: number;
  tenant: Identifier;
}

/** Why admission limits refused a tenant (or hold it back): over its share while others want the capacity. */
export type AdmissionRefusal = "tenant_over_share";

/** `retryledger.admission.v1`: the admission state of one key. */
export interface AdmissionSnapshot {
  generation: number;
  in_flight: number;
  principal?: Identifier;
  request_level_milli: number;
  requests_at_epoch_ms: number;
  route_release_sha256: Sha256Hex;
  schema: "retryledger.admission.v1";
  tenant?: Identifier;
  /** The active tenants' share clocks, under tenant shares. */
  tenants?: TenantDue[];
  token_level_milli: number;
  tokens_at_epoch_ms: number;
  updated_at_epoch_ms: number;
}

/** `admissionAdmit`'s answer. */
export interface AdmissionAdmitResult {
  answer:
    | { kind: "admitted"; start_epoch_ms: number }
    | { kind: "wait"; reason?: AdmissionRefusal; until_epoch_ms: number }
    | { kind: "refused"; earliest_epoch_ms?: number; reason?: AdmissionRefusal };
  snapshot: AdmissionSnapshot;
}

/** `admissionObserve`'s answer: the snapshot a response's rate-limit headers leave, and what was ignored. */
export interface AdmissionObserveResult {
  notes?: string[];
  snapshot: AdmissionSnapshot;
}

/** The admission limits an attempt was admitted under (or a stop refused by). */
export interface LimitsRef {
  queue_wait_ms: number;
  /** A stop's reason beyond the queue bound. */
  refusal?: AdmissionRefusal;
  snapshot_sha256: Sha256Hex;
  start_epoch_ms?: number;
  /** The call's tenant, under tenant shares. */
  tenant?: Identifier;
  tokens?: number;
}

export interface FleetConfig {
  admission?: AdmissionConfig;
  breaker?: BreakerConfig;
  on_store_unavailable: OnStoreUnavailable;
  retry_budget?: RetryBudgetConfig;
}

/** What a host read from its store before a dispatch (`Session.admit`'s view). */
export interface FleetView {
  /** Admission snapshots by the route release each was read under. */
  admission?: { [route_release_sha256: string]: AdmissionSnapshot };
  /** Tokens the attempt reserves, with a token bucket. */
  reserve_tokens?: number;
  /** Breaker snapshots by the route release each was read under. */
  breakers: { [route_release_sha256: string]: BreakerSnapshot };
  /** The budget snapshot, when the store holds one. */
  budget?: RetryBudgetSnapshot;
  /** The store could not be read. */
  store_unavailable?: true;
  /** The call's tenant, under tenant shares. */
  tenant?: Identifier;
}

/** The snapshots to write back with compare-and-set after an admission (only those that changed). */
export interface FleetWrites {
  admission?: AdmissionSnapshot[];
  breakers: BreakerSnapshot[];
  budget?: RetryBudgetSnapshot;
}

/** `Session.admit`'s answer. */
export interface AdmitAnswer {
  /** The dispatch admitted (perhaps on a later route), or the fleet's terminal. */
  decision: Decision;
  /** The in-flight cap is full: nothing admitted, admit again then (Unix ms). */
  wait_until_epoch_ms?: number;
  writes: FleetWrites;
}

export interface BreakerRef {
  generation: number;
  probe: boolean;
  snapshot_sha256: Sha256Hex;
}

export interface BudgetRef {
  kind: "deposit" | "withdraw";
  snapshot_sha256: Sha256Hex;
}

/** A route skipped because its breaker refused. */
export interface Skip {
  route_id: Identifier;
  snapshot_sha256: Sha256Hex;
}

/** What an attempt was admitted under (on the attempt). */
export interface Admission {
  admitted_at_epoch_ms: number;
  breaker?: BreakerRef;
  budget?: BudgetRef;
  /** The key of its route's key pool the attempt was sent with, by digest (absent when the route names no pool). */
  key?: { key_sha256: Sha256Hex; pool: Identifier };
  limits?: LimitsRef;
  skipped?: Skip[];
  /** Set when the store was unavailable and the policy fails open. */
  store?: "unavailable";
}

export type FleetStopReason = "admission" | "circuit_open" | "retry_budget" | "store_unavailable" | "no_usable_key";

/** The fleet's refusal of the next dispatch (on the attempts document). */
export interface FleetStop {
  at_epoch_ms: number;
  at_ms: number;
  budget?: BudgetRef;
  /** The key pool with no usable key (`no_usable_key`). */
  key_pool?: Identifier;
  limits?: LimitsRef;
  reason: FleetStopReason;
  skipped?: Skip[];
}

/** What the fleet did to a run (in the receipt). */
export interface FleetSummary {
  admitted_without_store: number;
  probes: number;
  /** Queue wait of every attempt, ms (with admission limits). */
  queue_wait_ms?: number;
  routes_skipped: number;
  withdrawals: number;
}

/** The snapshots a bundle carries: every one an admission read. */
export interface FleetSnapshots {
  admissions?: AdmissionSnapshot[];
  breakers: BreakerSnapshot[];
  budgets: RetryBudgetSnapshot[];
}

/** `breakerAdmit`'s answer. */
export interface BreakerAdmitResult {
  admission: { kind: "admitted"; probe: boolean } | { kind: "rejected"; retry_at_epoch_ms?: number };
  snapshot: BreakerSnapshot;
}

/** `budgetWithdraw`'s answer. */
export interface BudgetWithdrawResult {
  granted: boolean;
  snapshot: RetryBudgetSnapshot;
}

// ---------------------------------------------------------------- output checks and repair

/** What an output check looks at (docs/REPAIR.md). */
export type CheckKind = "refusal" | "truncated" | "empty" | "unparsable_json" | "schema";

/** One defect a validator found. */
export interface Defect {
  message: string;
  path?: string;
}

/** One check's verdict, as a host passes it in the facts' `output_checks`. */
export interface OutputVerdict {
  defects?: Defect[];
  kind: CheckKind;
  validator: string;
  verdict: "pass" | "defects";
}

/** What an attempt records of the failed check that decided its outcome. */
export interface OutputCheckRecord {
  defect_count: number;
  defects_sha256: Sha256Hex;
  kind: CheckKind;
  validator: string;
}

/** The policy's `repair` section. */
export interface RepairPolicy {
  cost_share_percent: number;
  max_repairs: number;
}

/** One run of a repair chain: the root request's (no parent, no ordinal, starts at 0) or a repair's. */
export interface RepairLink {
  bundle: Bundle;
  parent_request_sha256?: Sha256Hex;
  repair_ordinal?: number;
  started_at_ms: number;
}

/** A request and its repairs (`retryledger.repair_chain.v1`). */
export interface RepairChain {
  links: RepairLink[];
  schema: "retryledger.repair_chain.v1";
}

/** One run of a verified chain. */
export interface ChainLinkSummary {
  logical_request_sha256: Sha256Hex;
  parent_request_sha256?: Sha256Hex;
  receipt_sha256: Sha256Hex;
  repair_ordinal?: number;
  started_at_ms: number;
  terminal: Terminal;
  total_cost: number;
}

/** What replaying a chain says. */
export type ChainVerdict =
  | { kind: "verified"; chain_sha256: Sha256Hex; links: ChainLinkSummary[]; repairs: number; terminal: Terminal; total_cost: number }
  | { kind: "drift"; code: string; link_index: number; message: string; path: string };
