//! The fleet store's side of a run: what the machine does with a read
//! (admit, settle an attempt, free a held slot) and a cancellation that
//! holds an admission slot.

use super::fleet::{self, Cas, Row};
use super::{keypool, Effect, Machine, ReadFor, Stage, Then};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Decision;
use crate::fleet::{FleetView, FleetWrites};

impl Machine {
    pub(super) fn on_read(
        &mut self,
        mut reads: fleet::Reads,
        why: ReadFor,
        conflicts: u64,
        rows: &[Row],
        unavailable: bool,
    ) -> Result<()> {
        let Some(fleet) = self.session.policy().policy.fleet.clone() else {
            return Err(Error::new(
                ErrorCode::AdmissionUnexpected,
                "a read under a policy without a fleet section",
            ));
        };
        let view = if unavailable {
            FleetView {
                store_unavailable: true,
                ..FleetView::default()
            }
        } else {
            reads.view(rows, self.reserve_tokens, self.tenant.as_ref())?
        };
        let now_epoch = self.epoch(self.now_ms);
        match why {
            ReadFor::Admission => {
                let admitted = self.session.admit_pooled(self.now_ms, now_epoch, &view)?;
                if let Some(until) = admitted.wait_until_epoch_ms {
                    self.effect = Effect::Sleep {
                        until_ms: until.saturating_sub(self.origin_epoch_ms),
                    };
                    self.stage = Stage::Sleeping(Then::Plan);
                    return Ok(());
                }
                let pool = match self.select_key(&reads, now_epoch, unavailable)? {
                    keypool::Pick::None => None,
                    keypool::Pick::Key(key, write) => {
                        self.session.set_admission_key(key);
                        write
                    }
                    keypool::Pick::Wait(until) => return self.wait_for_key(until),
                    keypool::Pick::NoKey(pool) => return self.no_usable_key(pool, now_epoch),
                };
                let writes = reads.writes_with_pool(&fleet, admitted.writes, pool);
                self.write(reads, why, conflicts, writes, Then::Plan)
            }
            ReadFor::Settlement | ReadFor::Release(_) if unavailable => {
                // Nothing to settle against: the snapshots stay as they are.
                let then = match why {
                    ReadFor::Release(at) => Then::Cancel(at),
                    _ => Then::Log,
                };
                self.then(then)
            }
            ReadFor::Settlement => {
                let writes = self.settlement(&reads, &fleet, &view, now_epoch, false)?;
                self.write(reads, why, conflicts, writes, Then::Log)
            }
            ReadFor::Release(at) => {
                let writes = self.settlement(&reads, &fleet, &view, now_epoch, true)?;
                self.write(reads, why, conflicts, writes, Then::Cancel(at))
            }
        }
    }

    /// The key of the admitted attempt, when its route takes one from a
    /// pool (nothing when the admission ended the run).
    fn select_key(
        &mut self,
        reads: &fleet::Reads,
        now_epoch: u64,
        unavailable: bool,
    ) -> Result<keypool::Pick> {
        let Decision::Dispatch(d) = self.session.next() else {
            return Ok(keypool::Pick::None);
        };
        let release = d.route_release_sha256.clone();
        let start_epoch = self.epoch(d.not_before_ms.max(self.now_ms));
        let policy = std::sync::Arc::clone(&self.policy);
        // The keys this run saw refused (a store read under fail_open holds
        // no record of them).
        let refused: Vec<_> = self
            .session
            .attempts()
            .attempts
            .iter()
            .filter_map(|a| {
                let key = a.admission.as_ref()?.key.clone()?;
                Some((key, a.key_refused?))
            })
            .collect();
        self.pools.select(
            &policy,
            &release,
            reads,
            (now_epoch, start_epoch),
            (unavailable, &refused),
        )
    }

    /// No key of the admitted route's pool is usable before `until` (Unix
    /// ms): sleep until then and admit again (nothing was written), unless
    /// that is at or past the deadline (`stop_no_usable_key`).
    fn wait_for_key(&mut self, until: u64) -> Result<()> {
        let until_ms = until.saturating_sub(self.origin_epoch_ms);
        if until_ms >= self.policy.policy.deadline_ms {
            let release = self.planned()?.route_release_sha256;
            let Some(cfg) = keypool::pool_named(&self.policy, &release) else {
                return Err(Error::new(
                    ErrorCode::AdmissionUnexpected,
                    "a wait for a key on a route without a key pool",
                ));
            };
            let pool = cfg.name.clone();
            return self.no_usable_key(pool, self.epoch(self.now_ms));
        }
        self.session.forget_admission();
        self.effect = Effect::Sleep { until_ms };
        self.stage = Stage::Sleeping(Then::Plan);
        Ok(())
    }

    /// The admitted route's pool `pool` has no usable key: the run ends
    /// sealed, `stop_no_usable_key` (nothing of the admission is written).
    fn no_usable_key(&mut self, pool: crate::ids::Identifier, now_epoch: u64) -> Result<()> {
        self.session
            .stop_no_usable_key(self.now_ms, now_epoch, pool)?;
        self.then(Then::Plan)
    }

    /// The writes that settle the last attempt (its breaker's record, its
    /// admission slot freed), or free the slot of the admission held.
    fn settlement(
        &self,
        reads: &fleet::Reads,
        fleet: &crate::fleet::FleetConfig,
        view: &FleetView,
        now_epoch: u64,
        release_only: bool,
    ) -> Result<Vec<Cas>> {
        let last = self.session.attempts().attempts.last();
        let release = if release_only {
            self.planned()?.route_release_sha256
        } else {
            match last {
                Some(a) => a.route_release_sha256.clone(),
                None => return Ok(Vec::new()),
            }
        };
        let pool = match (last, release_only) {
            (Some(a), false) => self.pools.record(
                &self.policy,
                reads,
                &a.outcome,
                self.settle.status,
                now_epoch,
            )?,
            _ => None,
        };
        let mut writes = FleetWrites::default();
        if let (Some(cfg), false) = (&fleet.breaker, release_only) {
            let s = crate::fleet::breaker_in(cfg, view, &release, now_epoch)?;
            writes
                .breakers
                .push(self.session.breaker_after(&s, now_epoch)?);
        }
        if let Some(cfg) = &fleet.admission {
            let held = if release_only {
                self.session.admission()
            } else {
                self.session
                    .attempts()
                    .attempts
                    .last()
                    .and_then(|a| a.admission.as_ref())
            };
            if held.is_some_and(|a| a.limits.is_some()) {
                let s = crate::fleet::admission_in(cfg, view, &release, now_epoch)?;
                writes.admission.push(self.session.admission_release_seen(
                    &s,
                    now_epoch,
                    self.settle.used_tokens,
                    &self.settle.headers,
                )?);
            }
        }
        Ok(reads.writes_with_pool(fleet, writes, pool))
    }

    pub(super) fn cancel(&mut self, at_ms: u64) -> Result<()> {
        let holds_slot = self.session.admission().is_some_and(|a| a.limits.is_some());
        if holds_slot && self.session.policy().policy.fleet.is_some() {
            let release = self.planned()?.route_release_sha256;
            let reads = self.keys.settlement(&release, true);
            self.read(reads, ReadFor::Release(at_ms), 0);
            return Ok(());
        }
        self.then(Then::Cancel(at_ms))
    }
}
