//! Observed outcomes, exactly as the control plane classifies them.
//!
//! Success completes the run. Retryable failures may be followed by another
//! attempt if every bound allows it. Non-retryable failures stop: another
//! provider does not repair them. Indeterminate outcomes stop for
//! reconciliation and are never retried.

use serde::{Deserialize, Serialize};

/// Failures that policy may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryableKind {
    /// No response arrived before the attempt timeout.
    TimeoutBeforeResponse,
    /// The receiver asked to slow down (HTTP 429).
    RateLimited,
    /// The receiver is unavailable (HTTP 5xx, connection refused).
    Unavailable,
}

/// Failures no other attempt repairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NonRetryableKind {
    /// The receiver rejected the request.
    Rejected,
    /// A policy (safety, authorization) denied it.
    PolicyDenied,
    /// The request itself is malformed.
    InvalidRequest,
    /// The response violated the protocol.
    ProtocolViolation,
    /// The output failed validation; repair is a new request, not a retry.
    InvalidOutput,
}

/// Outcomes whose effect is unknown; they need reconciliation, not retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndeterminateKind {
    /// The receiver may or may not have accepted the work.
    UnknownProviderAcceptance,
    /// A stream broke after output reached the caller.
    StreamInterruptedAfterOutput,
}

/// An observed outcome, tagged by `class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "class",
    rename_all = "snake_case",
    deny_unknown_fields,
    from = "OutcomeDoc"
)]
pub enum Outcome {
    /// The attempt produced a validated result.
    Success,
    /// A retryable failure, with the server's delay hint if it sent one.
    Retryable {
        /// What failed.
        kind: RetryableKind,
        /// The server's Retry-After hint in ms, unbounded as observed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// A non-retryable failure.
    NonRetryable {
        /// What failed.
        kind: NonRetryableKind,
    },
    /// An indeterminate outcome.
    Indeterminate {
        /// What is unknown.
        kind: IndeterminateKind,
    },
}

/// The decoded form of [`Outcome`]. serde ignores unknown fields beside the
/// tag of a unit variant, so `success` decodes as an empty struct variant,
/// where `deny_unknown_fields` applies.
#[derive(Deserialize)]
#[serde(tag = "class", rename_all = "snake_case", deny_unknown_fields)]
enum OutcomeDoc {
    Success {},
    Retryable {
        kind: RetryableKind,
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
    NonRetryable {
        kind: NonRetryableKind,
    },
    Indeterminate {
        kind: IndeterminateKind,
    },
}

impl From<OutcomeDoc> for Outcome {
    fn from(doc: OutcomeDoc) -> Self {
        match doc {
            OutcomeDoc::Success {} => Self::Success,
            OutcomeDoc::Retryable {
                kind,
                retry_after_ms,
            } => Self::Retryable {
                kind,
                retry_after_ms,
            },
            OutcomeDoc::NonRetryable { kind } => Self::NonRetryable { kind },
            OutcomeDoc::Indeterminate { kind } => Self::Indeterminate { kind },
        }
    }
}

/// The outcome family, as a plain string tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Success.
    Success,
    /// Retryable failure.
    Retryable,
    /// Non-retryable failure.
    NonRetryable,
    /// Indeterminate outcome.
    Indeterminate,
}

impl Outcome {
    /// The outcome's class.
    pub fn class(&self) -> OutcomeClass {
        match self {
            Self::Success => OutcomeClass::Success,
            Self::Retryable { .. } => OutcomeClass::Retryable,
            Self::NonRetryable { .. } => OutcomeClass::NonRetryable,
            Self::Indeterminate { .. } => OutcomeClass::Indeterminate,
        }
    }

    /// The outcome's kind as its snake_case name (`success` for success).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Retryable { kind, .. } => match kind {
                RetryableKind::TimeoutBeforeResponse => "timeout_before_response",
                RetryableKind::RateLimited => "rate_limited",
                RetryableKind::Unavailable => "unavailable",
            },
            Self::NonRetryable { kind } => match kind {
                NonRetryableKind::Rejected => "rejected",
                NonRetryableKind::PolicyDenied => "policy_denied",
                NonRetryableKind::InvalidRequest => "invalid_request",
                NonRetryableKind::ProtocolViolation => "protocol_violation",
                NonRetryableKind::InvalidOutput => "invalid_output",
            },
            Self::Indeterminate { kind } => match kind {
                IndeterminateKind::UnknownProviderAcceptance => "unknown_provider_acceptance",
                IndeterminateKind::StreamInterruptedAfterOutput => {
                    "stream_interrupted_after_output"
                }
            },
        }
    }

    /// The Retry-After hint, if this is a retryable failure that carried one.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Self::Retryable { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }
}
