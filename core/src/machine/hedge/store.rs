//! The fleet store's side of a hedged run: admitting the dispatch on offer
//! (a lead or a hedge), recording each member's outcome on its route's
//! breaker and freeing its slot of the admission limits.

use super::super::fleet::{self, Cas};
use super::super::{Effect, Machine};
use super::{Layer, Stage};
use crate::admission::{self, AdmissionSnapshot};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;

impl Machine {
    /// Record member `ordinal`'s outcome on its route's breaker and free
    /// its slot of the admission limits (a policy with them), then journal
    /// it.
    pub(super) fn hedge_settle(&mut self, ordinal: u64, conflicts: u64) -> Result<()> {
        let fleet = self.policy.policy.fleet.clone();
        let attempt = self.layer()?.attempt_of_ordinal(ordinal).cloned();
        let (Some(f), Some(a)) = (fleet, attempt) else {
            return self.journal_observed(ordinal);
        };
        let holds = a.admission.as_ref().is_some_and(|adm| adm.limits.is_some());
        if f.breaker.is_none() && !holds {
            return self.journal_observed(ordinal);
        }
        let reads = self.keys.settlement(&a.route_release_sha256, false);
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
        let view = reads.view(rows, self.reserve_tokens, self.tenant.as_ref())?;
        let now_epoch = self.epoch(self.now_ms);
        let layer = self.layer()?;
        let Some(a) = layer.attempt_of_ordinal(ordinal).cloned() else {
            return self.journal_observed(ordinal);
        };
        let mut writes = crate::fleet::FleetWrites::default();
        if let Some(cfg) = &f.breaker {
            let s = crate::fleet::breaker_in(cfg, &view, &a.route_release_sha256, now_epoch)?;
            writes
                .breakers
                .push(layer.breaker_after(ordinal, &s, now_epoch)?);
        }
        if let Some(cfg) = &f.admission {
            if a.admission.as_ref().is_some_and(|adm| adm.limits.is_some()) {
                let s = crate::fleet::admission_in(cfg, &view, &a.route_release_sha256, now_epoch)?;
                let (headers, used) = &layer.settle;
                if let Some(released) =
                    layer.admission_release_of(ordinal, &s, now_epoch, *used, headers)?
                {
                    writes.admission.push(released);
                }
            }
        }
        let writes = reads.writes(&f, writes);
        if writes.is_empty() {
            return self.journal_observed(ordinal);
        }
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        layer.stage = Stage::SettleWriting {
            ordinal,
            conflicts,
            count,
        };
        self.effect = Effect::Write { writes };
        Ok(())
    }

    /// The run is cancelled while waiting: free the slot the admitted lead
    /// holds (a policy with admission limits), then end the run.
    pub(super) fn hedge_cancel(&mut self, at_ms: u64, conflicts: u64) -> Result<()> {
        let fleet = self.policy.policy.fleet.clone();
        let held = self.layer()?.held_slot();
        let (Some(_), Some(release)) = (fleet, held) else {
            return self.hedge_cancelled(at_ms);
        };
        let reads = self.keys.settlement(&release, true);
        self.effect = Effect::Read { keys: reads.keys() };
        self.layer()?.stage = Stage::Releasing {
            reads,
            at_ms,
            conflicts,
        };
        Ok(())
    }

    pub(super) fn hedge_released(
        &mut self,
        mut reads: fleet::Reads,
        at_ms: u64,
        conflicts: u64,
        rows: &[super::super::Row],
    ) -> Result<()> {
        let Some(f) = self.policy.policy.fleet.clone() else {
            return self.hedge_cancelled(at_ms);
        };
        let (Some(cfg), Some(release)) = (&f.admission, self.layer()?.held_slot()) else {
            return self.hedge_cancelled(at_ms);
        };
        let view = reads.view(rows, self.reserve_tokens, self.tenant.as_ref())?;
        let now_epoch = self.epoch(self.now_ms);
        let layer = self.layer()?;
        let s = crate::fleet::admission_in(cfg, &view, &release, now_epoch)?;
        let mut writes = crate::fleet::FleetWrites::default();
        writes.admission.extend(layer.release_held(&s, now_epoch)?);
        let writes = reads.writes(&f, writes);
        if writes.is_empty() {
            return self.hedge_cancelled(at_ms);
        }
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        layer.stage = Stage::ReleaseWriting {
            at_ms,
            conflicts,
            count,
        };
        self.effect = Effect::Write { writes };
        Ok(())
    }

    /// End the run cancelled at `at_ms` (its slot, if any, freed).
    pub(super) fn hedge_cancelled(&mut self, at_ms: u64) -> Result<()> {
        let layer = self.layer()?;
        layer.cancel(at_ms)?;
        layer.admitted = None;
        layer.stage = Stage::Plan;
        self.hedge_advance()
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
            reads.view(rows, self.reserve_tokens, self.tenant.as_ref())?
        };
        let now_ms = self.now_ms;
        let now_epoch = self.epoch(now_ms);
        let layer = self.layer()?;
        let step = layer.next();
        let before = Box::new(layer.clone());
        let admitted = layer.admit_layered(now_ms, now_epoch, &view)?;
        if let Some(until) = admitted.wait_until_epoch_ms {
            // The admission limits are full: ask again then.
            layer.stage = Stage::Sleeping;
            self.effect = Effect::Sleep {
                until_ms: until.saturating_sub(self.origin_epoch_ms),
            };
            return Ok(());
        }
        if let crate::hedge::HedgeStep::Dispatch(d) = &step {
            layer.planned_nb = Some(d.not_before_ms);
        }
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

impl Layer {
    /// The next snapshot of attempt `ordinal`'s breaker after its outcome,
    /// from the snapshot a host reads now (`now_epoch_ms`, wall clock): a
    /// lead, a hedge and a cancelled loser each count on their route.
    pub(super) fn breaker_after(
        &self,
        ordinal: u64,
        snapshot: &crate::breaker::BreakerSnapshot,
        now_epoch_ms: u64,
    ) -> Result<crate::breaker::BreakerSnapshot> {
        let Some(a) = self.attempt_of_ordinal(ordinal) else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                format!("attempt {ordinal} has not been observed"),
            ));
        };
        crate::fleet::breaker_after_attempt(&self.policy, &self.seen, a, snapshot, now_epoch_ms)
    }
}

impl Layer {
    /// The admission limits' snapshot of attempt `ordinal`'s key once it is
    /// over (answered or cancelled): its slot freed, its reserved tokens
    /// settled with `used_tokens`, then the rate-limit `headers` its
    /// response carried applied. `None` when it holds no slot.
    pub(super) fn admission_release_of(
        &self,
        ordinal: u64,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
        headers: &[(String, String)],
    ) -> Result<Option<AdmissionSnapshot>> {
        let Some(cfg) = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        else {
            return Ok(None);
        };
        let Some(a) = self.attempt_of_ordinal(ordinal) else {
            return Ok(None);
        };
        let Some(limits) = a.admission.as_ref().and_then(|adm| adm.limits.as_ref()) else {
            return Ok(None);
        };
        snapshot.check(cfg, &a.route_release_sha256, "")?;
        let released = admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            used_tokens,
        );
        Ok(Some(if headers.is_empty() {
            released
        } else {
            admission::observe(cfg, &released, headers, now_epoch_ms).0
        }))
    }

    /// The route release whose admission-limits slot the admitted lead
    /// holds before it is sent (a cancellation frees it).
    pub(super) fn held_slot(&self) -> Option<Sha256Hex> {
        let (n, adm) = self.admitted.as_ref()?;
        adm.limits.as_ref()?;
        self.lead
            .as_ref()
            .filter(|l| l.ordinal == *n)
            .map(|l| l.route_release_sha256.clone())
    }

    /// The snapshot with the held lead's slot freed (nothing was sent).
    pub(super) fn release_held(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
    ) -> Result<Option<AdmissionSnapshot>> {
        let Some(cfg) = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        else {
            return Ok(None);
        };
        let Some((_, adm)) = &self.admitted else {
            return Ok(None);
        };
        let (Some(limits), Some(release)) = (adm.limits.as_ref(), self.held_slot()) else {
            return Ok(None);
        };
        snapshot.check(cfg, &release, "")?;
        Ok(Some(admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            None,
        )))
    }
}
