//! The fleet store's side of a hedged run: admitting the dispatch on offer
//! (a lead or a hedge) and recording each member's outcome on its route's
//! breaker.

use super::super::fleet::{self, Cas};
use super::super::{Effect, Machine};
use super::{offered_ordinal, Stage};
use crate::error::{Error, ErrorCode, Result};

impl Machine {
    /// Record member `ordinal`'s outcome on its route's breaker (a policy
    /// with one), then journal it.
    pub(super) fn hedge_settle(&mut self, ordinal: u64, conflicts: u64) -> Result<()> {
        let breaker = self
            .policy
            .policy
            .fleet
            .as_ref()
            .filter(|f| f.breaker.is_some())
            .cloned();
        let release = self
            .layer()?
            .session
            .attempt_of_ordinal(ordinal)
            .map(|a| a.route_release_sha256.clone());
        let (Some(f), Some(release)) = (breaker, release) else {
            return self.journal_observed(ordinal);
        };
        let reads = fleet::Reads::settlement(&f, &release);
        self.effect = Effect::Read { keys: reads.keys() };
        self.layer()?.stage = Stage::Settling {
            reads,
            ordinal,
            conflicts,
        };
        Ok(())
    }

    pub(super) fn hedge_settled(
        &mut self,
        mut reads: fleet::Reads,
        ordinal: u64,
        conflicts: u64,
        rows: &[super::super::Row],
    ) -> Result<()> {
        let Some(f) = self.policy.policy.fleet.clone() else {
            return self.journal_observed(ordinal);
        };
        let Some(cfg) = &f.breaker else {
            return self.journal_observed(ordinal);
        };
        let view = reads.view(rows, self.reserve_tokens)?;
        let now_epoch = self.epoch(self.now_ms);
        let layer = self.layer()?;
        let Some(release) = layer
            .session
            .attempt_of_ordinal(ordinal)
            .map(|a| a.route_release_sha256.clone())
        else {
            return self.journal_observed(ordinal);
        };
        let s = crate::fleet::breaker_in(cfg, &view, &release, now_epoch)?;
        let next = layer.session.breaker_after(ordinal, &s, now_epoch)?;
        let writes = reads.writes(
            &f,
            crate::fleet::FleetWrites {
                breakers: vec![next],
                ..crate::fleet::FleetWrites::default()
            },
        );
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        layer.stage = Stage::SettleWriting {
            ordinal,
            conflicts,
            count,
        };
        self.effect = Effect::Write { writes };
        Ok(())
    }

    pub(super) fn hedge_read(&mut self, conflicts: u64) {
        let reads = self.admission_reads();
        self.effect = Effect::Read { keys: reads.keys() };
        if let Some(layer) = self.hedge.as_deref_mut() {
            layer.stage = Stage::Reading { reads, conflicts };
        }
    }

    /// Admit the offered dispatch under what the store answered.
    pub(super) fn hedge_admit(
        &mut self,
        mut reads: fleet::Reads,
        conflicts: u64,
        rows: &[super::super::Row],
        unavailable: bool,
    ) -> Result<()> {
        let Some(cfg) = self.policy.policy.fleet.clone() else {
            return Err(Error::new(
                ErrorCode::AdmissionUnexpected,
                "a read under a policy without a fleet section",
            ));
        };
        let view = if unavailable {
            crate::fleet::FleetView {
                store_unavailable: true,
                ..crate::fleet::FleetView::default()
            }
        } else {
            reads.view(rows, self.reserve_tokens)?
        };
        let now_ms = self.now_ms;
        let now_epoch = self.epoch(now_ms);
        let layer = self.layer()?;
        let offered = offered_ordinal(&layer.session.next());
        let before = Box::new(layer.session.clone());
        let admitted = layer.session.admit_layered(now_ms, now_epoch, &view)?;
        // Still on offer after the admission: admitted (a refused lead ends
        // the run, a refused hedge is no longer offered).
        layer.admitted = offered.filter(|o| offered_ordinal(&admitted.step) == Some(*o));
        let writes: Vec<Cas> = reads.writes(&cfg, admitted.writes);
        if writes.is_empty() {
            layer.stage = Stage::Plan;
            return self.hedge_advance();
        }
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        layer.stage = Stage::Writing {
            conflicts,
            count,
            before,
        };
        self.effect = Effect::Write { writes };
        Ok(())
    }
}
