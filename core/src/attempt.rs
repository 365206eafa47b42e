//! The attempts document: every physical attempt of one logical request, as observed.

use crate::decode::names;
use crate::decode::object;
use crate::fleet::{Admission, FleetStop};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::MAX_ATTEMPTS;
use crate::outcome::Outcome;
use crate::price::Units;
use crate::stream::StreamRecord;

schema_marker!(
    /// `retryledger.attempts.v1`
    AttemptsSchema = "retryledger.attempts.v1"
);

/// The receiver's settled answer for an attempt whose outcome a crashed
/// host never recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The receiver completed it: its result is the attempt's (`success`).
    Succeeded,
    /// The receiver verified it had no effect (`retryable`
    /// `timeout_before_response`): only this permits another dispatch.
    FailedNoEffect,
    /// The receiver cannot say, or stayed in progress past the poll bound
    /// (`indeterminate` `unknown_provider_acceptance`): never resubmitted.
    Unknown,
    /// The receiver completed a streamed attempt whose events the journal
    /// does not hold (its owner was cut mid-stream): the run cannot commit
    /// output it never recorded, nor send it again (`indeterminate`
    /// `stream_interrupted_after_output`).
    SucceededStreamLost,
}

/// Which model an attempt asked for (`requested`, the route's lowered
/// `model`) and which the provider reported serving (`served`, from its
/// response); a side the host did not learn is absent, never invented. At
/// least one is present. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRecord {
    /// The model the request named.
    pub requested: Option<Identifier>,
    /// The model the provider reported.
    pub served: Option<Identifier>,
}

impl crate::decode::Decode for ModelRecord {
    fn decode(v: &serde_json::Value, at: &crate::decode::At<'_>) -> crate::error::Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let requested = f.opt("requested");
        let served = f.opt("served");
        f.end()?;
        if requested.is_none() && served.is_none() {
            return Err(at.error(
                crate::error::ErrorCode::MissingField,
                "a model record names the requested or the served model",
            ));
        }
        Ok(Self { requested, served })
    }
}

impl crate::canonical::Encode for ModelRecord {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        crate::canonical::ObjectWriter::new(sink)
            .opt_doc("requested", self.requested.as_ref())
            .opt_doc("served", self.served.as_ref())
            .end();
    }
}

names!(Reconciled {
    Succeeded => "succeeded",
    FailedNoEffect => "failed_no_effect",
    Unknown => "unknown",
    SucceededStreamLost => "succeeded_stream_lost",
});

impl Reconciled {
    /// The outcome the answer stands for.
    pub fn outcome(self) -> Outcome {
        use crate::outcome::{IndeterminateKind, RetryableKind};
        match self {
            Self::Succeeded => Outcome::Success,
            Self::FailedNoEffect => Outcome::Retryable {
                kind: RetryableKind::TimeoutBeforeResponse,
                retry_after_ms: None,
                retry_after_source: None,
            },
            Self::Unknown => Outcome::Indeterminate {
                kind: IndeterminateKind::UnknownProviderAcceptance,
            },
            Self::SucceededStreamLost => Outcome::Indeterminate {
                kind: IndeterminateKind::StreamInterruptedAfterOutput,
            },
        }
    }
}

/// One physical attempt. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// What the fleet admitted it under, when the policy has a fleet section.
    pub admission: Option<Admission>,
    /// When the outcome was observed (run clock, ms).
    pub completed_at_ms: u64,
    /// Actual cost charged, in the policy's unit.
    pub cost: u64,
    /// Its place in a hedged round ([`crate::hedge`]): the lead it hedges,
    /// how it lost; absent otherwise, so existing digests are unchanged.
    pub hedge: Option<crate::hedge::HedgeMark>,
    /// Digest of the idempotency key sent.
    pub idempotency_key_sha256: Sha256Hex,
    /// `true` when a testing fault injector made this failure (the response
    /// carried [`crate::observe::INJECTED_FAULT_HEADER`]); absent otherwise.
    pub injected_fault: Option<bool>,
    /// The jitter sample that set this attempt's earliest start, when jitter is on.
    pub jitter_sample_ms: Option<u64>,
    /// What the attempt was of an async job (submit or poll, the job's id
    /// digest, its reported status), when the policy has an `async_job` section.
    pub job: Option<crate::job::JobRecord>,
    /// Set when the provider refused the pool key the attempt was sent
    /// with (`unauthorized`: 401, `forbidden`: 403): the run goes on with
    /// another key of the pool ([`crate::keypool`]); absent otherwise, so
    /// existing digests are unchanged.
    pub key_refused: Option<crate::keypool::KeyRefusal>,
    /// Digest of the logical request sent.
    pub logical_request_sha256: Sha256Hex,
    /// The model the attempt asked for and the one the provider reported
    /// serving; absent when the host reported neither, so existing digests
    /// are unchanged.
    pub model: Option<ModelRecord>,
    /// Global ordinal, from 1.
    pub ordinal: u64,
    /// The observed outcome.
    pub outcome: Outcome,
    /// The failed output check that decided the outcome
    /// ([`crate::output`]); absent otherwise, so existing digests are unchanged.
    pub output_check: Option<crate::output::OutputCheckRecord>,
    /// How a recovered run learned the outcome from the receiver by
    /// idempotency key ([`crate::journal`]); absent for an attempt observed
    /// directly, so existing digests are unchanged.
    pub reconciled: Option<Reconciled>,
    /// Digest of the request body the host sent on this attempt (after
    /// lowering to the route), when the host reports it.
    pub request_body_sha256: Option<Sha256Hex>,
    /// The route dispatched to.
    pub route_id: Identifier,
    /// Ordinal on this route, from 1.
    pub route_ordinal: u64,
    /// The route release dispatched to.
    pub route_release_sha256: Sha256Hex,
    /// When the attempt was dispatched (run clock, ms).
    pub started_at_ms: u64,
    /// What the attempt streamed, when the policy has a stream contract.
    pub stream: Option<StreamRecord>,
    /// Raw usage the provider reported (units by kind); the attempt's cost is
    /// then what the run's price schedule charges for it.
    pub usage: Option<Units>,
}

/// The attempts document. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts {
    /// Attempts in dispatch order.
    pub attempts: Vec<Attempt>,
    /// Set when the caller cancelled the run between attempts (run clock, ms).
    pub cancelled_at_ms: Option<u64>,
    /// Set when the fleet refused the next dispatch.
    pub fleet_stop: Option<FleetStop>,
    /// `retryledger.attempts.v1`
    pub schema: AttemptsSchema,
}

object!(Attempt {
    admission: opt_doc,
    completed_at_ms: u64,
    cost: u64,
    hedge: opt_doc,
    idempotency_key_sha256: doc,
    injected_fault: opt_doc,
    jitter_sample_ms: opt_u64,
    job: opt_doc,
    key_refused: opt_doc,
    logical_request_sha256: doc,
    model: opt_doc,
    ordinal: u64,
    outcome: doc,
    output_check: opt_doc,
    reconciled: opt_doc,
    request_body_sha256: opt_doc,
    route_id: doc,
    route_ordinal: u64,
    route_release_sha256: doc,
    started_at_ms: u64,
    stream: opt_doc,
    usage: opt_doc,
});

object!(Attempts {
    attempts: list(MAX_ATTEMPTS),
    cancelled_at_ms: opt_u64,
    fleet_stop: opt_doc,
    schema: doc,
});
