//! The attempts document: every physical attempt of one logical request, as observed.

use serde_json::Value;

use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, At, Decode, Fields};
use crate::error::Result;
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::MAX_ATTEMPTS;
use crate::outcome::Outcome;

schema_marker!(
    /// `retryledger.attempts.v1`
    AttemptsSchema = "retryledger.attempts.v1"
);

/// One physical attempt. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When the outcome was observed (run clock, ms).
    pub completed_at_ms: u64,
    /// Actual cost charged, in the policy's unit.
    pub cost: u64,
    /// Digest of the idempotency key sent.
    pub idempotency_key_sha256: Sha256Hex,
    /// The jitter sample that set this attempt's earliest start, when jitter is on.
    pub jitter_sample_ms: Option<u64>,
    /// Digest of the logical request sent.
    pub logical_request_sha256: Sha256Hex,
    /// Global ordinal, from 1.
    pub ordinal: u64,
    /// The observed outcome.
    pub outcome: Outcome,
    /// The route dispatched to.
    pub route_id: Identifier,
    /// Ordinal on this route, from 1.
    pub route_ordinal: u64,
    /// The route release dispatched to.
    pub route_release_sha256: Sha256Hex,
    /// When the attempt was dispatched (run clock, ms).
    pub started_at_ms: u64,
}

/// The attempts document. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts {
    /// Attempts in dispatch order.
    pub attempts: Vec<Attempt>,
    /// Set when the caller cancelled the run between attempts (run clock, ms).
    pub cancelled_at_ms: Option<u64>,
    /// `retryledger.attempts.v1`
    pub schema: AttemptsSchema,
}

impl Decode for Attempt {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let completed_at_ms = f.req("completed_at_ms");
        let cost = f.req("cost");
        let idempotency_key_sha256 = f.req("idempotency_key_sha256");
        let jitter_sample_ms = f.opt("jitter_sample_ms");
        let logical_request_sha256 = f.req("logical_request_sha256");
        let ordinal = f.req("ordinal");
        let outcome = f.req("outcome");
        let route_id = f.req("route_id");
        let route_ordinal = f.req("route_ordinal");
        let route_release_sha256 = f.req("route_release_sha256");
        let started_at_ms = f.req("started_at_ms");
        f.end()?;
        let (
            Some(completed_at_ms),
            Some(cost),
            Some(idempotency_key_sha256),
            Some(logical_request_sha256),
            Some(ordinal),
            Some(outcome),
            Some(route_id),
            Some(route_ordinal),
            Some(route_release_sha256),
            Some(started_at_ms),
        ) = (
            completed_at_ms,
            cost,
            idempotency_key_sha256,
            logical_request_sha256,
            ordinal,
            outcome,
            route_id,
            route_ordinal,
            route_release_sha256,
            started_at_ms,
        )
        else {
            return Err(f.incomplete());
        };
        Ok(Self {
            completed_at_ms,
            cost,
            idempotency_key_sha256,
            jitter_sample_ms,
            logical_request_sha256,
            ordinal,
            outcome,
            route_id,
            route_ordinal,
            route_release_sha256,
            started_at_ms,
        })
    }
}

impl Encode for Attempt {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .u64("completed_at_ms", self.completed_at_ms)
            .u64("cost", self.cost)
            .doc("idempotency_key_sha256", &self.idempotency_key_sha256)
            .opt_u64("jitter_sample_ms", self.jitter_sample_ms)
            .doc("logical_request_sha256", &self.logical_request_sha256)
            .u64("ordinal", self.ordinal)
            .doc("outcome", &self.outcome)
            .doc("route_id", &self.route_id)
            .u64("route_ordinal", self.route_ordinal)
            .doc("route_release_sha256", &self.route_release_sha256)
            .u64("started_at_ms", self.started_at_ms)
            .end();
    }
}

impl Decode for Attempts {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let attempts = f.req_with("attempts", |v, at| decode_list(v, at, MAX_ATTEMPTS));
        let cancelled_at_ms = f.opt("cancelled_at_ms");
        let schema = f.req("schema");
        f.end()?;
        let (Some(attempts), Some(schema)) = (attempts, schema) else {
            return Err(f.incomplete());
        };
        Ok(Self {
            attempts,
            cancelled_at_ms,
            schema,
        })
    }
}

impl Encode for Attempts {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .list("attempts", &self.attempts)
            .opt_u64("cancelled_at_ms", self.cancelled_at_ms)
            .doc("schema", &self.schema)
            .end();
    }
}
