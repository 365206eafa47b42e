//! One error type for every operation, with a stable snake_case code.
//!
//! The code string is the contract: Rust, JavaScript and Python report the same
//! code for the same input. The family groups codes so that bindings can map
//! them onto exception classes (decode, policy, drift, receipt, http, run).

use std::fmt;

/// The family a code belongs to; bindings raise one exception class per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorFamily {
    /// The input is not a well-formed document in normal form.
    Decode,
    /// The policy breaks a rule checked before any dispatch.
    Policy,
    /// An observed attempt is not the planned one.
    Drift,
    /// A sealed receipt does not match its replay.
    Receipt,
    /// A Retry-After value or HTTP observation is malformed.
    Http,
    /// The run cannot be evaluated in its current state.
    Run,
    /// A run's journal (or a reconciliation of it) is not one the core can act on.
    Journal,
    /// An idempotency record or its retention is inconsistent.
    Idempotency,
}

impl ErrorFamily {
    /// The family's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decode => "decode",
            Self::Policy => "policy",
            Self::Drift => "drift",
            Self::Receipt => "receipt",
            Self::Http => "http",
            Self::Run => "run",
            Self::Journal => "journal",
            Self::Idempotency => "idempotency",
        }
    }
}

macro_rules! codes {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, $family:ident; )*) => {
        /// Every failure the core can report, each with a stable snake_case code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorCode {
            /// All codes, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The stable snake_case code string.
            pub fn as_str(self) -> &'static str {
                match self { $( ErrorCode::$variant => $name, )* }
            }

            /// The family the code belongs to.
            pub fn family(self) -> ErrorFamily {
                match self { $( ErrorCode::$variant => ErrorFamily::$family, )* }
            }
        }
    };
}

codes! {
    /// The input exceeds [`crate::limits::MAX_INPUT_BYTES`].
    InputTooLarge => "input_too_large", Decode;
    /// The input is not JSON.
    InvalidJson => "invalid_json", Decode;
    /// Arrays and objects nest deeper than [`crate::limits::MAX_DEPTH`].
    NestingTooDeep => "nesting_too_deep", Decode;
    /// An object repeats a key.
    DuplicateKey => "duplicate_key", Decode;
    /// A `null` appears; optional fields are omitted instead.
    NullValue => "null_value", Decode;
    /// A number with a fraction or exponent appears; documents hold integers only.
    FloatValue => "float_value", Decode;
    /// An integer is negative or above 2^53 - 1.
    IntegerOutOfRange => "integer_out_of_range", Decode;
    /// A string is longer than its bound.
    StringTooLong => "string_too_long", Decode;
    /// An array has more items than its bound.
    TooManyItems => "too_many_items", Decode;
    /// An object has a field its type does not define.
    UnknownField => "unknown_field", Decode;
    /// A required field is absent.
    MissingField => "missing_field", Decode;
    /// A value has the wrong JSON type.
    InvalidType => "invalid_type", Decode;
    /// A value is of the right type but not an allowed value.
    InvalidValue => "invalid_value", Decode;
    /// The `schema` field names another document type or version.
    SchemaMismatch => "schema_mismatch", Decode;
    /// A digest is not 64 lowercase hex characters.
    InvalidDigest => "invalid_digest", Decode;
    /// An identifier is empty or holds characters outside the allowed set.
    InvalidIdentifier => "invalid_identifier", Decode;
    /// A set-valued array repeats an item.
    DuplicateSetItem => "duplicate_set_item", Decode;
    /// An output check whose verdict is not one (`pass` with defects,
    /// `defects` without any, an unknown check kind or verdict).
    OutputVerdictInvalid => "output_verdict_invalid", Decode;
    /// An output check with more defects, or longer ones, than its bounds.
    OutputDefectsOverBound => "output_defects_over_bound", Decode;
    /// A repair function failed (it raised, or returned a request that cannot be canonicalized).
    RepairFunctionFailed => "repair_function_failed", Decode;

    /// The retry owner is not the harness.
    RetryOwnerNotHarness => "retry_owner_not_harness", Policy;
    /// The policy has no route.
    NoRoutes => "no_routes", Policy;
    /// Two routes share a priority.
    DuplicatePriority => "duplicate_priority", Policy;
    /// Route priorities are not 0, 1, 2, ... without gaps.
    PriorityNotContiguous => "priority_not_contiguous", Policy;
    /// Two routes share a route id.
    DuplicateRouteId => "duplicate_route_id", Policy;
    /// Two routes share a release digest.
    DuplicateRouteRelease => "duplicate_route_release", Policy;
    /// A route lacks a capability the request requires.
    CapabilityMissing => "capability_missing", Policy;
    /// A route's behavior class is neither the required one nor an allowed degraded one.
    BehaviorClassMismatch => "behavior_class_mismatch", Policy;
    /// A route's data boundary exceeds the policy maximum.
    DataBoundaryExceeded => "data_boundary_exceeded", Policy;
    /// A route does not support idempotency.
    IdempotencyUnsupported => "idempotency_unsupported", Policy;
    /// A per-route attempt bound is 0 or above the limit.
    RouteAttemptsUnbounded => "route_attempts_unbounded", Policy;
    /// A run-wide budget (attempts, deadline) is 0 or above the limit.
    BudgetUnbounded => "budget_unbounded", Policy;
    /// The backoff parameters are inconsistent (base 0 or maximum below base).
    InvalidBackoff => "invalid_backoff", Policy;
    /// A price schedule has no prices for a route release the policy names.
    PriceScheduleMissingRelease => "price_schedule_missing_release", Policy;
    /// A price schedule's cost unit is not the policy's.
    CostUnitMismatch => "cost_unit_mismatch", Policy;
    /// Usage names a unit the route release's prices do not price.
    UsageUnpriced => "usage_unpriced", Policy;
    /// Usage reported for an attempt whose cost was also charged by hand:
    /// an attempt's cost is either charged or priced from usage.
    ChargeWithUsage => "charge_with_usage", Policy;
    /// A stream contract out of bounds.
    InvalidStreamContract => "invalid_stream_contract", Policy;
    /// An `async_job` section out of bounds, or beside a stream or fleet section.
    InvalidAsyncJob => "invalid_async_job", Policy;
    /// A breaker configuration out of bounds (or a fleet section with neither part).
    InvalidBreaker => "invalid_breaker", Policy;
    /// A retry budget configuration out of bounds.
    InvalidRetryBudget => "invalid_retry_budget", Policy;
    /// Admission limits out of bounds: a limit or queue bound of 0, a token
    /// rate without a token bound (or a bound without a rate).
    InvalidAdmission => "invalid_admission", Policy;
    /// The hedge section is malformed: a delay of 0 or past the deadline,
    /// no hedges, no or unknown routes, a cost share outside 1..=100, or a
    /// contract hedging cannot keep (a stream, breakers, admission limits).
    InvalidHedge => "invalid_hedge", Policy;
    /// A hedge route does not honour the idempotency key.
    HedgeRouteNotIdempotent => "hedge_route_not_idempotent", Policy;
    /// The hedged operation declares external effects.
    HedgeExternalEffects => "hedge_external_effects", Policy;
    /// More hedges per attempt than the total attempt budget holds.
    HedgeExceedsAttempts => "hedge_exceeds_attempts", Policy;
    /// A key pool's configuration is invalid (no key, a key twice, a hold
    /// out of range).
    InvalidKeyPool => "invalid_key_pool", Policy;
    /// A key pool was told about a key it does not hold.
    KeyNotInPool => "key_not_in_pool", Policy;
    /// No route of the policy can serve the logical request (its tools,
    /// structured output, images, context in tokens or provider-bound
    /// history), so nothing is dispatched.
    NoCapableRoute => "no_capable_route", Policy;
    /// The request's history holds a part bound to another provider family
    /// (a thinking block with its signature, a reasoning item) that the
    /// route cannot carry, and the policy does not allow dropping it.
    ProviderBoundHistory => "provider_bound_history", Policy;
    /// A route of the policy has no client in the host's mapping of route
    /// ids to SDK clients, so the run would fail at its dispatch: refused
    /// before any dispatch.
    RouteClientMissing => "route_client_missing", Policy;

    /// An attempt is observed after the run reached a terminal.
    AttemptAfterTerminal => "attempt_after_terminal", Drift;
    /// The attempt's route is not the planned route.
    RouteDrift => "route_drift", Drift;
    /// The attempt's route release is not the planned release.
    ReleaseDrift => "release_drift", Drift;
    /// The attempt's global ordinal is not the planned one.
    OrdinalDrift => "ordinal_drift", Drift;
    /// The attempt's per-route ordinal is not the planned one.
    RouteOrdinalDrift => "route_ordinal_drift", Drift;
    /// The attempt carries another logical request digest.
    LogicalRequestDrift => "logical_request_drift", Drift;
    /// The attempt carries another idempotency key digest.
    IdempotencyKeyDrift => "idempotency_key_drift", Drift;
    /// The attempt started before its earliest start.
    EarlyStart => "early_start", Drift;
    /// The attempt completed before it started.
    CompletedBeforeStarted => "completed_before_started", Drift;
    /// A jittered attempt does not record its sample.
    JitterSampleMissing => "jitter_sample_missing", Drift;
    /// An attempt records a jitter sample where none was drawn.
    JitterSampleUnexpected => "jitter_sample_unexpected", Drift;
    /// The recorded jitter sample lies outside its interval.
    JitterOutOfInterval => "jitter_out_of_interval", Drift;
    /// The recorded jitter sample is not the seeded draw.
    JitterSampleDrift => "jitter_sample_drift", Drift;
    /// The run was marked cancelled before its last attempt completed, or after a terminal.
    CancelDrift => "cancel_drift", Drift;
    /// A sum or product left the integer range.
    ArithmeticOverflow => "arithmetic_overflow", Drift;
    /// The policy streams but the attempt records no stream.
    StreamRecordMissing => "stream_record_missing", Drift;
    /// The attempt records a stream the policy does not have.
    StreamRecordUnexpected => "stream_record_unexpected", Drift;
    /// The attempt's continuation is not the planned one.
    ContinuationDrift => "continuation_drift", Drift;
    /// Output of two attempts that are not one continuation chain, joined.
    StreamSplice => "stream_splice", Drift;
    /// A commit (or a success) without the provider's terminal event.
    StreamCommitBeforeTerminal => "stream_commit_before_terminal", Drift;
    /// A delta of an attempt after its events were invalidated.
    StreamDeltaAfterInvalidate => "stream_delta_after_invalidate", Drift;
    /// Delivered deltas that do not hash to what the attempt recorded.
    StreamDeltasMismatch => "stream_deltas_mismatch", Drift;
    /// A stream event that differs from the log the attempts imply.
    StreamEventDrift => "stream_event_drift", Drift;
    /// The policy has an `async_job` section but the attempt records no job step.
    JobRecordMissing => "job_record_missing", Drift;
    /// The attempt records a job step the policy has no `async_job` section for.
    JobRecordUnexpected => "job_record_unexpected", Drift;
    /// A second submit after the provider accepted the job.
    JobResubmit => "job_resubmit", Drift;
    /// A poll where a submit is planned, or a poll number not the planned one.
    JobKindDrift => "job_kind_drift", Drift;
    /// A poll of another job than the accepted one.
    JobIdDrift => "job_id_drift", Drift;
    /// An accepted submit without the provider's job id.
    JobIdMissing => "job_id_missing", Drift;
    /// A job status or id that does not fit the attempt's outcome.
    JobStatusDrift => "job_status_drift", Drift;
    /// A poll past the policy's `max_polls`.
    JobPollBound => "job_poll_bound", Drift;
    /// The policy has a fleet section but the attempt records no admission.
    AdmissionMissing => "admission_missing", Drift;
    /// The attempt records an admission the policy has no fleet for.
    AdmissionUnexpected => "admission_unexpected", Drift;
    /// An admission (or a fleet stop) its snapshots do not give.
    AdmissionDrift => "admission_drift", Drift;
    /// An admission reads a snapshot the bundle does not carry.
    SnapshotMissing => "snapshot_missing", Drift;
    /// An attempt sent another request body than the earlier attempts on its route.
    RequestBodyDrift => "request_body_drift", Drift;
    /// An attempt's cost is not what its usage costs under the bundle's price schedule.
    UsageCostDrift => "usage_cost_drift", Drift;
    /// An attempt records usage but the bundle carries no price schedule.
    PriceScheduleMissing => "price_schedule_missing", Drift;
    /// A breaker or budget snapshot that is inconsistent in itself.
    InvalidSnapshot => "invalid_snapshot", Drift;
    /// A snapshot under another key (route release or scope) than asked for.
    SnapshotKeyMismatch => "snapshot_key_mismatch", Drift;
    /// A retry budget snapshot whose balance is over its cap.
    BudgetOverCap => "budget_over_cap", Drift;
    /// A snapshot older (a lower generation) than one already seen.
    GenerationRegressed => "generation_regressed", Drift;
    /// A reconciled attempt whose outcome is not the one its answer stands for.
    ReconciliationDrift => "reconciliation_drift", Drift;
    /// A round of hedged attempts decided twice (a second commit).
    HedgeSecondCommit => "hedge_second_commit", Drift;
    /// A hedge started before its threshold (the lead's start plus k delays).
    HedgeBeforeThreshold => "hedge_before_threshold", Drift;
    /// A hedge beyond the policy's bounds (hedges per round, attempts, the
    /// route's attempts, the cost reservation, the hedge share, the deadline).
    HedgeOverBudget => "hedge_over_budget", Drift;
    /// A hedge started after a result of its round had arrived.
    HedgeAfterResult => "hedge_after_result", Drift;
    /// A loss mark that does not fit the round: a loser that completed
    /// before the commit, an attempt in flight at the commit left unmarked,
    /// a hedge that is not next to its lead.
    HedgeLossDrift => "hedge_loss_drift", Drift;
    /// A cancelled loser charged otherwise than the policy says.
    HedgeChargeDrift => "hedge_charge_drift", Drift;
    /// An attempt's recorded output check does not stand for its outcome.
    OutputCheckDrift => "output_check_drift", Drift;
    /// A repair beyond the policy's `max_repairs` or its share of the cost budget.
    RepairOverBudget => "repair_over_budget", Drift;
    /// A repair after a run whose terminal is not an `invalid_output` stop.
    RepairAfterTerminal => "repair_after_terminal", Drift;
    /// A repair whose logical request is its parent's.
    RepairSameRequest => "repair_same_request", Drift;
    /// A repair link that is not the next one of its chain (parent, ordinal, policy).
    RepairChainDrift => "repair_chain_drift", Drift;
    /// A repair under a policy without a `repair` section.
    RepairNotAllowed => "repair_not_allowed", Drift;
    /// An SDK call about to be sent lifts to another logical request than the
    /// one its policy binds (another prompt, tools or sampling): refused
    /// before it is sent.
    RequestDrift => "request_drift", Drift;

    /// A sealed receipt differs from the replayed one.
    ReceiptMismatch => "receipt_mismatch", Receipt;

    /// A Retry-After value is not a delay, an HTTP-date or a millisecond count.
    RetryAfterInvalid => "retry_after_invalid", Http;
    /// A Retry-After value is longer than [`crate::limits::MAX_RETRY_AFTER_BYTES`].
    RetryAfterOverlong => "retry_after_overlong", Http;
    /// An HTTP status is outside 100..=599.
    InvalidStatus => "invalid_status", Http;

    /// `evaluate` was asked for a receipt of a run that has not reached a terminal.
    RunNotTerminal => "run_not_terminal", Run;
    /// A store write kept conflicting after its bounded retries.
    StoreConflict => "store_conflict", Run;
    /// The reason a run ended `stop_admission` (on its fleet stop's
    /// `limits.refusal`): its tenant was over its share of the route's
    /// admission limits while other tenants wanted the capacity, and
    /// neither its share nor the buckets covered it within the queue bound
    /// or before the deadline.
    TenantOverShare => "tenant_over_share", Run;
    /// An event that does not answer the run machine's outstanding effect.
    UnexpectedEvent => "unexpected_event", Run;
    /// A clock reading earlier than one the run machine was already given.
    ClockBackwards => "clock_backwards", Run;
    /// A policy section that is not yet a layer of the run machine.
    MachineLayerMissing => "machine_layer_missing", Run;

    /// An event's `prev_sha256` is not the digest of the event before it (or the genesis value).
    JournalChainBroken => "journal_chain_broken", Journal;
    /// An event's `seq` skips ahead of the next free one.
    JournalSeqGap => "journal_seq_gap", Journal;
    /// An event's `seq` repeats one already taken.
    JournalSeqRepeat => "journal_seq_repeat", Journal;
    /// An event under a lower lease generation than the one before it: a fenced (stale) owner.
    JournalStaleLease => "journal_stale_lease", Journal;
    /// An event that disagrees with the core's plan for the run.
    JournalPlanDrift => "journal_plan_drift", Journal;
    /// An event of another run.
    JournalWrongRun => "journal_wrong_run", Journal;
    /// An event kind the journal does not define.
    JournalUnknownKind => "journal_unknown_kind", Journal;
    /// An event kind that cannot come at this point of the run.
    JournalOutOfOrder => "journal_out_of_order", Journal;
    /// An event after the run's `terminal` event.
    JournalAfterTerminal => "journal_after_terminal", Journal;
    /// The `created` event names another policy.
    JournalPolicyMismatch => "journal_policy_mismatch", Journal;
    /// Reconciliation answers where no dispatch waits for one, or for another attempt.
    ReconciliationUnexpected => "reconciliation_unexpected", Journal;
    /// A reconciliation answer after the answers had settled.
    ReconciliationAfterSettled => "reconciliation_after_settled", Journal;
    /// A receiver asked before the poll schedule allows.
    PollTooEarly => "poll_too_early", Journal;
    /// More reconciliation answers than the poll bound allows.
    PollLimitExceeded => "poll_limit_exceeded", Journal;

    /// An idempotency record kept under another scoped key than the request's.
    IdempotencyScopeMismatch => "idempotency_scope_mismatch", Idempotency;
    /// An idempotency record inconsistent in itself (times, status and result).
    IdempotencyRecordInvalid => "idempotency_record_invalid", Idempotency;
    /// A retention policy out of bounds.
    IdempotencyRetentionInvalid => "idempotency_retention_invalid", Idempotency;
    /// A completion of a record that is not in progress.
    IdempotencyNotInProgress => "idempotency_not_in_progress", Idempotency;
    /// A completion by a request other than the one that claimed the key.
    IdempotencyRequestMismatch => "idempotency_request_mismatch", Idempotency;
    /// An `Idempotency-Key` header value outside the rule (1 to 255
    /// printable ASCII characters).
    IdempotencyKeyInvalid => "idempotency_key_invalid", Idempotency;
}

/// An error with a stable code, a human message and, where known, a JSON Pointer
/// (RFC 6901) to the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The stable code.
    pub code: ErrorCode,
    /// A human-readable message; not part of the contract.
    pub message: String,
    /// JSON Pointer to the offending field, e.g. `/attempts/1/started_at_ms`.
    pub path: Option<String>,
    /// Index of the offending attempt (0-based) for drift errors.
    pub attempt_index: Option<usize>,
    /// Every further error a decoder found in the same pass (at most
    /// [`MAX_ERRORS`] in all, this one first); empty for most errors.
    pub more: Vec<Error>,
}

/// The most errors one decoding pass reports (the headline one and up to
/// `MAX_ERRORS - 1` in [`Error::more`]).
pub const MAX_ERRORS: usize = 20;

impl Error {
    /// An error without a path.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            path: None,
            attempt_index: None,
            more: Vec::new(),
        }
    }

    /// An error at a JSON Pointer.
    pub fn at(code: ErrorCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            path: Some(path.into()),
            attempt_index: None,
            more: Vec::new(),
        }
    }

    /// A drift error about one attempt's field.
    pub fn attempt(code: ErrorCode, index: usize, field: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            path: Some(format!("/attempts/{index}/{field}")),
            attempt_index: Some(index),
            more: Vec::new(),
        }
    }

    /// One error of `errors` (in the order found, at most [`MAX_ERRORS`]):
    /// the first, with the rest in [`Error::more`]; `None` when empty.
    pub fn gather(errors: Vec<Error>) -> Option<Self> {
        let mut flat = Vec::new();
        for mut e in errors {
            let more = std::mem::take(&mut e.more);
            flat.push(e);
            flat.extend(more);
            if flat.len() >= MAX_ERRORS {
                break;
            }
        }
        flat.truncate(MAX_ERRORS);
        let mut all = flat.into_iter();
        let mut first = all.next()?;
        first.more = all.collect();
        Some(first)
    }

    /// The same error with its path placed under `prefix` (a JSON Pointer).
    pub fn under(mut self, prefix: &str) -> Self {
        self.path = Some(match self.path {
            Some(p) => format!("{prefix}{p}"),
            None => prefix.to_owned(),
        });
        self.more = std::mem::take(&mut self.more)
            .into_iter()
            .map(|e| e.under(prefix))
            .collect();
        self
    }

    /// The family of the code.
    pub fn family(&self) -> ErrorFamily {
        self.code.family()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{} at {}: {}", self.code.as_str(), p, self.message),
            None => write!(f, "{}: {}", self.code.as_str(), self.message),
        }
    }
}

impl std::error::Error for Error {}

/// Result with the core's error.
pub type Result<T> = std::result::Result<T, Error>;
