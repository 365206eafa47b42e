//! Fleet admission in a session: admitting each planned attempt under the
//! breakers, budgets, limits and admission a host read from its store, and
//! the writes it hands back.

use std::sync::Arc;

use crate::admission::{self, AdmissionSnapshot};
use crate::breaker::{self, BreakerAdmission};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch};
use crate::fleet::{
    admission_in, breaker_in, budget_admission, budget_in, limits_step, reserved_tokens, tenant_in,
    Admission, BreakerRef, BudgetRef, FleetSnapshots, FleetStop, FleetView, FleetWrites,
    LimitsClock, LimitsRef, LimitsStep, OnStoreUnavailable, Skip, Skips, StopReason, StoreStatus,
};

use super::{Admitted, Pending, Session};

impl Session {
    /// The fleet snapshots every admission so far read.
    pub fn fleet_snapshots(&self) -> &FleetSnapshots {
        &self.snapshots
    }

    /// The snapshots the admission held for the planned attempt names
    /// (what its journal's `dispatched` event carries); `None` when there
    /// is no admission or it names none.
    pub(crate) fn admission_snapshots(&self) -> Option<FleetSnapshots> {
        self.admission().and_then(|a| self.snapshots.named_by(a))
    }

    /// Admit the planned attempt under the fleet view a host read from its
    /// store at `now_epoch_ms` (wall clock), `at_ms` on the run clock. A
    /// route whose breaker refuses is skipped (the plan moves to the next
    /// route by priority, no attempt spent); the first attempt deposits into
    /// the retry budget and every later one withdraws. The answer is the
    /// dispatch to make (also what [`Session::next`] now gives) or the
    /// fleet's terminal (`stop_circuit_open`, `stop_retry_budget`,
    /// `stop_store_unavailable`), and the snapshots to write back. A wait
    /// (`wait_until_epoch_ms`: admission limits full, or a retry short of a
    /// budget with `wait_ms`) writes nothing: admit again then. Calling it
    /// again before the observation (after a compare-and-set conflict, with a
    /// fresh view) replaces the admission. A policy whose routes take their
    /// keys from a key pool is admitted by the run machine only (it selects
    /// the key with the admission): `machine_layer_missing` here.
    pub fn admit(&mut self, at_ms: u64, now_epoch_ms: u64, view: &FleetView) -> Result<Admitted> {
        if let Some(i) = self
            .policy
            .policy
            .routes
            .iter()
            .position(|r| r.key_pool.is_some())
        {
            return Err(Error::at(
                ErrorCode::MachineLayerMissing,
                format!("/routes/{i}/key_pool"),
                "a route's key pool selects its keys in the run machine: drive this policy with the machine",
            ));
        }
        self.admit_pooled(at_ms, now_epoch_ms, view)
    }

    /// Drop the admission held for the planned attempt before anything of
    /// it was written: the run machine waits for a pooled route's key, then
    /// admits again.
    pub(crate) fn forget_admission(&mut self) {
        self.pending = None;
    }

    /// [`Session::admit`] for the run machine, which selects a pooled
    /// route's key with the admission.
    pub(crate) fn admit_pooled(
        &mut self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<Admitted> {
        let policy = Arc::clone(&self.policy);
        let Some(fleet) = policy.policy.fleet.as_ref() else {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "the policy has no fleet section",
            ));
        };
        let Decision::Dispatch(planned) = self.run.next().clone() else {
            return Err(Error::new(
                ErrorCode::AttemptAfterTerminal,
                "the run has already reached a terminal",
            ));
        };
        self.pending = None;
        let mut writes = FleetWrites::default();
        let mut admission = Admission {
            admitted_at_epoch_ms: now_epoch_ms,
            breaker: None,
            budget: None,
            key: None,
            limits: None,
            skipped: None,
            store: None,
        };
        if view.store_unavailable {
            if fleet.on_store_unavailable == OnStoreUnavailable::FailOpen {
                admission.store = Some(StoreStatus::Unavailable);
                return Ok(self.hold(admission, planned, writes));
            }
            return self.stop(
                at_ms,
                now_epoch_ms,
                StopReason::StoreUnavailable,
                Vec::new(),
                (None, None),
            );
        }
        let mut plan = planned;
        let mut skips = Vec::new();
        if let Some(cfg) = &fleet.breaker {
            loop {
                let step = breaker_step(
                    cfg,
                    view,
                    (&plan.route_release_sha256, &plan.route_id),
                    now_epoch_ms,
                    (&mut self.seen, &mut self.snapshots),
                    &mut writes,
                )?;
                match step {
                    Ok(admitted) => {
                        admission.breaker = Some(admitted);
                        break;
                    }
                    Err(skip) => {
                        skips.push(skip);
                        match self.run.skip_route(&self.policy, &plan) {
                            Some(p) => plan = p,
                            None => {
                                return self.stop(
                                    at_ms,
                                    now_epoch_ms,
                                    StopReason::CircuitOpen,
                                    skips,
                                    (None, None),
                                )
                            }
                        }
                    }
                }
            }
        }
        let mut limits_write = None;
        if let Some(cfg) = &fleet.admission {
            let s = admission_in(cfg, view, &plan.route_release_sha256, now_epoch_ms)?;
            self.seen.saw(
                &format!("admission/{}", s.key()),
                s.generation,
                "/admission",
            )?;
            let digest = self.snapshots.keep_admission(&s);
            let tokens = reserved_tokens(cfg, view)?;
            let tenant = tenant_in(cfg, view)?;
            let since = *self.queued_since.get_or_insert(now_epoch_ms);
            let clock = LimitsClock {
                at_ms,
                now_epoch_ms,
                since_epoch_ms: since,
                deadline_ms: plan.deadline_ms,
            };
            match limits_step(cfg, &s, digest, tokens, tenant.as_ref(), &clock) {
                LimitsStep::Admitted {
                    limits,
                    write,
                    start_at_ms,
                } => {
                    plan.not_before_ms = plan.not_before_ms.max(start_at_ms);
                    admission.limits = Some(limits);
                    limits_write = Some(write);
                }
                LimitsStep::Wait(until) => {
                    return Ok(Admitted {
                        decision: Decision::Dispatch(plan),
                        writes: FleetWrites::default(),
                        wait_until_epoch_ms: Some(until),
                    });
                }
                LimitsStep::Stop(limits) => {
                    return self.stop(
                        at_ms,
                        now_epoch_ms,
                        StopReason::Admission,
                        skips,
                        (None, Some(limits)),
                    );
                }
            }
        }
        if let Some(cfg) = &fleet.retry_budget {
            let s = budget_in(cfg, view, now_epoch_ms)?;
            let refused = budget_admission(
                cfg,
                &s,
                &mut self.seen,
                &mut self.snapshots,
                plan.ordinal,
                now_epoch_ms,
                &mut writes,
                &mut admission,
            )?;
            if let Some(used) = refused {
                // A budget that waits: nothing written, ask again after
                // `wait_ms` while that leaves room before the deadline.
                if let Some(until) = cfg.waits(at_ms, plan.deadline_ms) {
                    let wait = until.saturating_sub(at_ms);
                    return Ok(Admitted {
                        decision: Decision::Dispatch(plan),
                        writes: FleetWrites::default(),
                        wait_until_epoch_ms: Some(now_epoch_ms.saturating_add(wait)),
                    });
                }
                return self.stop(
                    at_ms,
                    now_epoch_ms,
                    StopReason::RetryBudget,
                    skips,
                    (Some(used), None),
                );
            }
        }
        if !skips.is_empty() {
            admission.skipped = Some(Skips(skips));
        }
        writes.admission.extend(limits_write);
        Ok(self.hold(admission, plan, writes))
    }

    /// What [`Session::admit`] would answer under `view`, without changing
    /// the session: a host that admits optimistically (from snapshots it
    /// cached) previews the admission, checks and writes in one
    /// compare-and-set of every key the admission read, and only then admits
    /// for real under the same view (the same answer).
    pub fn admit_preview(
        &self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<Admitted> {
        self.clone().admit(at_ms, now_epoch_ms, view)
    }

    /// Hold an admission until its attempt is observed. The snapshots it
    /// proposes to write are not counted as seen: a host may find its
    /// compare-and-set refused and admit again under the store's state.
    pub(super) fn hold(
        &mut self,
        admission: Admission,
        plan: Dispatch,
        writes: FleetWrites,
    ) -> Admitted {
        let decision = Decision::Dispatch(plan);
        self.pending = Some(Pending {
            admission,
            decision: decision.clone(),
        });
        Admitted {
            decision,
            writes,
            wait_until_epoch_ms: None,
        }
    }

    /// Record the key of the route's pool the admitted attempt is sent
    /// with (the run machine selects it with the admission).
    pub(crate) fn set_admission_key(&mut self, key: crate::keypool::KeyRef) {
        if let Some(p) = self.pending.as_mut() {
            p.admission.key = Some(key);
        }
    }

    /// End the run before the admitted attempt is sent: the planned
    /// route's pool `pool` has no usable key (`stop_no_usable_key`). The
    /// routes the admission skipped are the stop's.
    pub(crate) fn stop_no_usable_key(
        &mut self,
        at_ms: u64,
        at_epoch_ms: u64,
        pool: crate::ids::Identifier,
    ) -> Result<()> {
        let skips = self
            .pending
            .take()
            .and_then(|p| p.admission.skipped)
            .map_or_else(Vec::new, |s| s.0);
        self.stop_with(
            at_ms,
            at_epoch_ms,
            StopReason::NoUsableKey,
            skips,
            (None, None, Some(pool)),
        )
        .map(|_| ())
    }

    fn stop(
        &mut self,
        at_ms: u64,
        at_epoch_ms: u64,
        reason: StopReason,
        skips: Vec<Skip>,
        (budget, limits): (Option<BudgetRef>, Option<LimitsRef>),
    ) -> Result<Admitted> {
        self.stop_with(at_ms, at_epoch_ms, reason, skips, (budget, limits, None))
    }

    fn stop_with(
        &mut self,
        at_ms: u64,
        at_epoch_ms: u64,
        reason: StopReason,
        skips: Vec<Skip>,
        (budget, limits, key_pool): (
            Option<BudgetRef>,
            Option<LimitsRef>,
            Option<crate::ids::Identifier>,
        ),
    ) -> Result<Admitted> {
        let stop = FleetStop {
            at_epoch_ms,
            at_ms,
            budget,
            key_pool,
            limits,
            reason,
            skipped: (!skips.is_empty()).then_some(Skips(skips)),
        };
        self.run.fleet_stop(&self.policy, &stop)?;
        self.attempts.fleet_stop = Some(stop);
        let ordinal = self.attempts.attempts.last().map_or(0, |a| a.ordinal);
        self.log.close(ordinal, self.run.last_action());
        self.queued_since = None;
        Ok(Admitted {
            decision: self.run.next().clone(),
            writes: FleetWrites::default(),
            wait_until_epoch_ms: None,
        })
    }

    /// The next snapshot of the last attempt's breaker after its outcome,
    /// from the snapshot the host reads now (`now_epoch_ms`, wall clock).
    pub fn breaker_after(
        &self,
        snapshot: &crate::breaker::BreakerSnapshot,
        now_epoch_ms: u64,
    ) -> Result<crate::breaker::BreakerSnapshot> {
        let Some(a) = self.attempts.attempts.last() else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                "no attempt has been observed",
            ));
        };
        crate::fleet::breaker_after_attempt(&self.policy, &self.seen, a, snapshot, now_epoch_ms)
    }

    /// The next admission snapshot of an admitted attempt's key once the
    /// attempt is over (answered, failed, cancelled, or admitted and never
    /// dispatched): its in-flight slot freed and its reserved tokens settled
    /// with `used_tokens` (the usage the response reported; none: the
    /// reservation stands), from the snapshot the host reads now. The
    /// attempt is the one admitted and not yet observed, else the last
    /// observed one.
    pub fn admission_release(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
    ) -> Result<AdmissionSnapshot> {
        let cfg = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
            .ok_or_else(|| {
                Error::at(
                    ErrorCode::AdmissionUnexpected,
                    "/fleet/admission",
                    "the policy has no admission limits",
                )
            })?;
        let held = match (&self.pending, self.attempts.attempts.last()) {
            (Some(p), _) => match &p.decision {
                Decision::Dispatch(d) => Some((&p.admission, &d.route_release_sha256)),
                Decision::Terminal { .. } => None,
            },
            (None, Some(a)) => a
                .admission
                .as_ref()
                .map(|adm| (adm, &a.route_release_sha256)),
            (None, None) => None,
        };
        let Some((limits, release)) =
            held.and_then(|(adm, release)| adm.limits.as_ref().map(|l| (l, release)))
        else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                "no attempt was admitted under the admission limits",
            ));
        };
        snapshot.check(cfg, release, "")?;
        Ok(admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            used_tokens,
        ))
    }

    /// [`Session::admission_release`], then the rate-limit headers the
    /// attempt's response carried (success or failure; `[name, value]`
    /// pairs) applied to the released snapshot ([`admission::observe`]): a
    /// lower `remaining` lowers the route's bucket, and an exhausted one
    /// with a reset empties it until the reset, for every run sharing the
    /// store. One snapshot to write, as after a plain release.
    pub fn admission_release_seen(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
        headers: &[(String, String)],
    ) -> Result<AdmissionSnapshot> {
        let released = self.admission_release(snapshot, now_epoch_ms, used_tokens)?;
        match self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        {
            Some(cfg) if !headers.is_empty() => {
                Ok(admission::observe(cfg, &released, headers, now_epoch_ms).0)
            }
            _ => Ok(released),
        }
    }
}

/// A route's breaker asked to admit an attempt on `release`: the snapshot
/// read from `view` (its generation checked against `seen`, the snapshot
/// kept for the bundle), the breaker's answer, and its next snapshot queued
/// in `writes` when it changed. Admitted: the attempt's breaker reference;
/// rejected: the skip the run records.
pub(crate) fn breaker_step(
    cfg: &crate::breaker::BreakerConfig,
    view: &FleetView,
    (release, route_id): (&crate::ids::Sha256Hex, &crate::ids::Identifier),
    now_epoch_ms: u64,
    (seen, snapshots): (
        &mut crate::fleet::Generations,
        &mut crate::fleet::FleetSnapshots,
    ),
    writes: &mut FleetWrites,
) -> Result<std::result::Result<BreakerRef, Skip>> {
    let s = breaker_in(cfg, view, release, now_epoch_ms)?;
    seen.saw(s.route_release_sha256.as_str(), s.generation, "/breakers")?;
    let digest = snapshots.keep_breaker(&s);
    let (answer, next) = breaker::admit(cfg, &s, now_epoch_ms);
    if changed(&next, &s) {
        writes.breakers.push(next);
    }
    Ok(match answer {
        BreakerAdmission::Admitted { probe } => Ok(BreakerRef {
            generation: s.generation,
            probe,
            snapshot_sha256: digest,
        }),
        BreakerAdmission::Rejected { .. } => Err(Skip {
            route_id: route_id.clone(),
            snapshot_sha256: digest,
        }),
    })
}

/// Whether a snapshot changed beyond its clock (only then is it written back).
pub(crate) fn changed(
    next: &crate::breaker::BreakerSnapshot,
    read: &crate::breaker::BreakerSnapshot,
) -> bool {
    // Every field but the schema and the clock, without copying the
    // snapshot. The destructuring names every field, so a new one cannot be
    // left out of the comparison.
    let crate::breaker::BreakerSnapshot {
        consecutive_failures,
        generation,
        opened_at_epoch_ms,
        parked_until_epoch_ms,
        probe_started_at_epoch_ms,
        probe_successes,
        probes_in_flight,
        route_release_sha256,
        schema: _,
        state,
        updated_at_epoch_ms: _,
        window_failures,
        window_start_epoch_ms,
        window_total,
    } = next;
    *state != read.state
        || *generation != read.generation
        || *consecutive_failures != read.consecutive_failures
        || *opened_at_epoch_ms != read.opened_at_epoch_ms
        || *parked_until_epoch_ms != read.parked_until_epoch_ms
        || *probe_started_at_epoch_ms != read.probe_started_at_epoch_ms
        || *probe_successes != read.probe_successes
        || *probes_in_flight != read.probes_in_flight
        || *window_failures != read.window_failures
        || *window_start_epoch_ms != read.window_start_epoch_ms
        || *window_total != read.window_total
        || *route_release_sha256 != read.route_release_sha256
}
