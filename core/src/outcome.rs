//! Observed outcomes, exactly as the control plane classifies them.
//!
//! Success completes the run. Retryable failures may be followed by another
//! attempt if every bound allows it. Non-retryable failures stop: another
//! provider does not repair them. Indeterminate outcomes stop for
//! reconciliation and are never retried.

use serde_json::Value;

use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{decode_tag, names, pick, At, Decode, Fields};
use crate::error::Result;

/// Failures that policy may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryableKind {
    /// No response arrived before the attempt timeout.
    TimeoutBeforeResponse,
    /// The receiver asked to slow down (HTTP 429).
    RateLimited,
    /// The receiver is unavailable (HTTP 5xx, connection refused).
    Unavailable,
    /// The receiver still runs the first request under this idempotency key
    /// (HTTP 409 with a `Retry-After` or `retry-after-ms` hint): ask again on
    /// the same route with the same key and body, never on another route
    /// ([`crate::evaluate::MAX_IN_PROGRESS`] bounds the asks).
    InProgress,
}

/// Failures no other attempt repairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// An account or per-day quota that cannot clear within the run
    /// (a provider's error body says so: [`crate::provider`]).
    QuotaExhausted,
}

/// Where a retry hint came from, in the order of precedence
/// ([`crate::provider`]): the first source that gives a valid hint wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintSource {
    /// The `retry-after-ms` header.
    RetryAfterMs,
    /// The `Retry-After` header (delay-seconds or an HTTP-date).
    RetryAfter,
    /// The error body's `google.rpc.RetryInfo` `retryDelay`.
    RetryInfo,
    /// A rate-limit reset header whose matching `remaining` is 0
    /// (`x-ratelimit-reset-*`, `anthropic-ratelimit-*-reset`, `RateLimit`).
    RateLimitReset,
}

names!(HintSource {
    RetryAfterMs => "retry-after-ms",
    RetryAfter => "retry-after",
    RetryInfo => "retry_info",
    RateLimitReset => "ratelimit_reset",
});

/// Outcomes whose effect is unknown; they need reconciliation, not retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndeterminateKind {
    /// The receiver may or may not have accepted the work.
    UnknownProviderAcceptance,
    /// A stream broke after output reached the caller.
    StreamInterruptedAfterOutput,
}

/// An observed outcome, tagged by `class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The attempt produced a validated result.
    Success,
    /// A retryable failure, with the server's delay hint if it sent one.
    Retryable {
        /// What failed.
        kind: RetryableKind,
        /// The server's Retry-After hint in ms, unbounded as observed.
        retry_after_ms: Option<u64>,
        /// Which source gave the hint, when the core read it
        /// ([`crate::provider`]); absent on outcomes a host states itself.
        retry_after_source: Option<HintSource>,
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

names!(RetryableKind {
    TimeoutBeforeResponse => "timeout_before_response",
    RateLimited => "rate_limited",
    Unavailable => "unavailable",
    InProgress => "in_progress",
});

names!(NonRetryableKind {
    Rejected => "rejected",
    PolicyDenied => "policy_denied",
    InvalidRequest => "invalid_request",
    ProtocolViolation => "protocol_violation",
    InvalidOutput => "invalid_output",
    QuotaExhausted => "quota_exhausted",
});

names!(IndeterminateKind {
    UnknownProviderAcceptance => "unknown_provider_acceptance",
    StreamInterruptedAfterOutput => "stream_interrupted_after_output",
});

names!(OutcomeClass {
    Success => "success",
    Retryable => "retryable",
    NonRetryable => "non_retryable",
    Indeterminate => "indeterminate",
});

/// An outcome is an object tagged by `class`. A bad tag is reported at
/// `class`; everything else inside the object is reported at the object.
impl Decode for Outcome {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let class = pick(
            OutcomeClass::ALL,
            decode_tag(v, at, "class", OutcomeClass::NAMES)?,
            at,
        )?;
        let mut f = Fields::open(v, at)?.variant("class");
        let outcome = match class {
            OutcomeClass::Success => {
                f.end()?;
                return Ok(Self::Success);
            }
            OutcomeClass::Retryable => {
                let kind = f.req("kind");
                let retry_after_ms = f.opt("retry_after_ms");
                let retry_after_source = f.opt("retry_after_source");
                f.end()?;
                let Some(kind) = kind else {
                    return Err(f.incomplete());
                };
                if retry_after_source.is_some() && retry_after_ms.is_none() {
                    return Err(At::Key(at, "retry_after_source").error(
                        crate::error::ErrorCode::InvalidValue,
                        "a hint source without `retry_after_ms`",
                    ));
                }
                Self::Retryable {
                    kind,
                    retry_after_ms,
                    retry_after_source,
                }
            }
            OutcomeClass::NonRetryable => {
                let kind = f.req("kind");
                f.end()?;
                let Some(kind) = kind else {
                    return Err(f.incomplete());
                };
                Self::NonRetryable { kind }
            }
            OutcomeClass::Indeterminate => {
                let kind = f.req("kind");
                f.end()?;
                let Some(kind) = kind else {
                    return Err(f.incomplete());
                };
                Self::Indeterminate { kind }
            }
        };
        Ok(outcome)
    }
}

impl Encode for Outcome {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.str("class", self.class().as_str());
        match self {
            Self::Success => {}
            Self::Retryable {
                kind,
                retry_after_ms,
                retry_after_source,
            } => {
                o.doc("kind", kind)
                    .opt_u64("retry_after_ms", *retry_after_ms)
                    .opt_doc("retry_after_source", retry_after_source.as_ref());
            }
            Self::NonRetryable { kind } => {
                o.doc("kind", kind);
            }
            Self::Indeterminate { kind } => {
                o.doc("kind", kind);
            }
        }
        o.end();
    }
}

/// The outcome family, as a plain string tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
            Self::Retryable { kind, .. } => kind.as_str(),
            Self::NonRetryable { kind } => kind.as_str(),
            Self::Indeterminate { kind } => kind.as_str(),
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
