//! Sealing a finished run: its terminal and the receipt it records.

use super::{Run, Terminal};
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;
use crate::policy::CompiledPolicy;
use crate::receipt::{Receipt, ReceiptSchema, RouteCount};
use crate::stream::Streaming;

impl Run {
    /// The terminal a receipt records; an error while the run could still dispatch.
    fn receipt_terminal(&self) -> Result<Terminal> {
        self.terminal().ok_or_else(|| {
            Error::new(
                ErrorCode::RunNotTerminal,
                "the run has not reached a terminal; plan_next gives the next dispatch",
            )
        })
    }

    /// The receipt of the run so far; an error while it could still dispatch.
    /// `attempts_sha256` is the digest of the attempts document replayed.
    pub(crate) fn receipt(&self, cp: &CompiledPolicy, attempts_sha256: String) -> Result<Receipt> {
        let terminal = self.receipt_terminal()?;
        let p = &cp.policy;
        let final_route = self.final_priority.and_then(|i| cp.route_at(i));
        Ok(Receipt {
            attempt_count: self.count,
            attempts_sha256: Sha256Hex::computed(attempts_sha256),
            behavior_class_sha256: p.behavior_class_sha256.clone(),
            capability_contract_sha256: Sha256Hex::computed(cp.capability_contract_sha256.clone()),
            degraded: terminal == Terminal::Completed
                && final_route.is_some_and(|r| cp.is_degraded(r)),
            fallback_used: self.fallback_used,
            fleet: self.fleet.clone(),
            hedge: self.hedge.clone(),
            final_route_id: final_route.map(|r| r.route_id.clone()),
            finished_at_ms: self.finished_at_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            injected_faults: (self.injected > 0).then_some(self.injected),
            job: self.job.as_ref().map(|j| j.summary(terminal)),
            logical_request_sha256: p.logical_request_sha256.clone(),
            policy_sha256: Sha256Hex::computed(cp.policy_sha256.clone()),
            price_schedule_sha256: None,
            route_attempts: cp
                .routes()
                .zip(self.per_route.iter())
                .map(|(r, n)| RouteCount {
                    attempts: *n,
                    route_id: r.route_id.clone(),
                })
                .collect(),
            schedule: self.schedule.clone(),
            schema: ReceiptSchema,
            stream: self.streaming.as_ref().map(Streaming::summary),
            terminal,
            total_cost: self.spent,
        })
    }

    /// [`Run::receipt`] encoded into `sink` straight from the run, with
    /// the digest of the price schedule that priced it: the same encoding
    /// events as the receipt's (so the same canonical bytes), without an
    /// owned receipt built first (no string copied). An error, and nothing
    /// encoded, while the run could still dispatch.
    pub(crate) fn encode_receipt(
        &self,
        cp: &CompiledPolicy,
        attempts_sha256: &Sha256Hex,
        price_schedule_sha256: Option<&Sha256Hex>,
        sink: &mut dyn Sink,
    ) -> Result<()> {
        let terminal = self.receipt_terminal()?;
        let p = &cp.policy;
        let final_route = self.final_priority.and_then(|i| cp.route_at(i));
        let degraded =
            terminal == Terminal::Completed && final_route.is_some_and(|r| cp.is_degraded(r));
        let job = self.job.as_ref().map(|j| j.summary(terminal));
        let stream = self.streaming.as_ref().map(Streaming::summary);
        // Keys in the order of `Receipt`'s encoding (crate::receipt).
        ObjectWriter::new(sink)
            .u64("attempt_count", self.count)
            .doc("attempts_sha256", attempts_sha256)
            .doc("behavior_class_sha256", &p.behavior_class_sha256)
            .str("capability_contract_sha256", &cp.capability_contract_sha256)
            .bool("degraded", degraded)
            .bool("fallback_used", self.fallback_used)
            .opt_doc("final_route_id", final_route.map(|r| &r.route_id))
            .u64("finished_at_ms", self.finished_at_ms)
            .opt_doc("fleet", self.fleet.as_ref())
            .opt_doc("hedge", self.hedge.as_ref())
            .doc("idempotency_key_sha256", &p.idempotency_key_sha256)
            .opt_u64(
                "injected_faults",
                (self.injected > 0).then_some(self.injected),
            )
            .opt_doc("job", job.as_ref())
            .doc("logical_request_sha256", &p.logical_request_sha256)
            .str("policy_sha256", &cp.policy_sha256)
            .opt_doc("price_schedule_sha256", price_schedule_sha256)
            .doc("route_attempts", &RouteAttempts(cp, &self.per_route))
            .list("schedule", &self.schedule)
            .doc("schema", &ReceiptSchema)
            .opt_doc("stream", stream.as_ref())
            .doc("terminal", &terminal)
            .u64("total_cost", self.spent)
            .end();
        Ok(())
    }
}

/// A receipt's `route_attempts` read from the run: the attempts per route,
/// in priority order, encoded as the receipt's [`RouteCount`]s are.
struct RouteAttempts<'a>(&'a CompiledPolicy, &'a [u64]);

impl Encode for RouteAttempts<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.begin_array();
        for (r, n) in self.0.routes().zip(self.1.iter()) {
            ObjectWriter::new(sink)
                .u64("attempts", *n)
                .doc("route_id", &r.route_id)
                .end();
        }
        sink.end_array();
    }
}
