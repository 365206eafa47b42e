//! Fleet admission of a hedged run: the lead and each hedge admitted under
//! the retry budget, breakers and admission limits a host read from its
//! store.

use std::sync::Arc;

use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{
    admission_in, budget_admission, budget_in, limits_step, reserved_tokens, tenant_in, Admission,
    BudgetRef, FleetStop, FleetView, FleetWrites, LimitsClock, LimitsRef, LimitsStep,
    OnStoreUnavailable, Skip, Skips, StopReason, StoreStatus,
};
use crate::session::breaker_step;

use crate::canonical::{Encode, ObjectWriter, Sink};

use super::{HedgeStep, Layer};

impl Layer {
    /// Admit the next dispatch (the lead, or the hedge on offer) under the
    /// fleet view a host read at `now_epoch_ms` (wall clock), `at_ms` on the
    /// run clock. A lead deposits into the retry budget when it is the first
    /// attempt and withdraws otherwise; a hedge withdraws. A refused lead
    /// ends the run (`stop_retry_budget`, `stop_store_unavailable`); a
    /// refused hedge is not dispatched and the round takes no more hedges.
    ///
    /// A policy with a breaker is refused here: its hedges are admitted and
    /// settled on their routes' breakers by the run machine's hedge layer
    /// through its events, which the hedge drivers do not drive yet.
    pub(super) fn admit(
        &mut self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<HedgeAdmitted> {
        let fleet = self.policy.policy.fleet.as_ref();
        let layered = if fleet.is_some_and(|f| f.breaker.is_some()) {
            Some("/fleet/breaker")
        } else if fleet.is_some_and(|f| f.admission.is_some()) {
            Some("/fleet/admission")
        } else {
            None
        };
        if let Some(at) = layered {
            return Err(Error::at(
                ErrorCode::InvalidHedge,
                at,
                "a hedged run under a breaker or admission limits is driven by the run machine, which settles each member on them",
            ));
        }
        self.admit_layered(at_ms, now_epoch_ms, view)
    }

    /// [`Layer::admit`] for the run machine, breakers included.
    pub(super) fn admit_layered(
        &mut self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<HedgeAdmitted> {
        let policy = Arc::clone(&self.policy);
        let Some(fleet) = policy.policy.fleet.as_ref() else {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "the policy has no fleet section",
            ));
        };
        // A lead is admitted from the plan (a breaker may move it on).
        self.lead = None;
        let (mut plan, is_hedge) = match self.next() {
            HedgeStep::Dispatch(d) => (d, false),
            HedgeStep::Await { hedge: Some(d), .. } => (d, true),
            _ => {
                return Err(Error::new(
                    ErrorCode::AttemptAfterTerminal,
                    "nothing is on offer to admit",
                ))
            }
        };
        self.admitted = None;
        let mut writes = FleetWrites::default();
        let mut skips: Vec<Skip> = Vec::new();
        let mut limits_write = None;
        let mut admission = Admission {
            key: None,
            admitted_at_epoch_ms: now_epoch_ms,
            breaker: None,
            budget: None,
            limits: None,
            skipped: None,
            store: None,
        };
        let refused = |s: &mut Self,
                       reason: StopReason,
                       (budget, limits): (Option<BudgetRef>, Option<LimitsRef>),
                       skips: Vec<Skip>|
         -> Result<HedgeAdmitted> {
            if is_hedge {
                if let Some(r) = s.round.as_mut() {
                    r.closed = true;
                    r.refused = true;
                }
                return Ok(HedgeAdmitted {
                    step: s.next(),
                    writes: FleetWrites::default(),
                    wait_until_epoch_ms: None,
                });
            }
            let stop = FleetStop {
                key_pool: None,
                at_epoch_ms: now_epoch_ms,
                at_ms,
                budget,
                limits,
                reason,
                skipped: (!skips.is_empty()).then_some(Skips(skips)),
            };
            s.run.fleet_stop(&s.policy, &stop)?;
            s.attempts.fleet_stop = Some(stop);
            s.lead = None;
            s.queued_since = None;
            Ok(HedgeAdmitted {
                step: s.next(),
                writes: FleetWrites::default(),
                wait_until_epoch_ms: None,
            })
        };
        if view.store_unavailable {
            if fleet.on_store_unavailable == OnStoreUnavailable::FailOpen {
                admission.store = Some(StoreStatus::Unavailable);
            } else {
                return refused(self, StopReason::StoreUnavailable, (None, None), Vec::new());
            }
        } else {
            // A breaker: a lead skips an open route as a plain attempt does
            // (the run stops `stop_circuit_open` when none admits); a hedge
            // whose route does not admit is not sent.
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
                        Err(_) if is_hedge => {
                            return refused(
                                self,
                                StopReason::CircuitOpen,
                                (None, None),
                                Vec::new(),
                            );
                        }
                        Err(skip) => {
                            skips.push(skip);
                            match self.run.skip_route(&self.policy, &plan) {
                                Some(p) => plan = p,
                                None => {
                                    return refused(
                                        self,
                                        StopReason::CircuitOpen,
                                        (None, None),
                                        skips,
                                    )
                                }
                            }
                        }
                    }
                }
            }
            // Admission limits: a lead waits or queues as a plain attempt
            // does; a hedge takes a slot now or is not sent.
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
                let since = if is_hedge {
                    now_epoch_ms
                } else {
                    *self.queued_since.get_or_insert(now_epoch_ms)
                };
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
                    } if !is_hedge || start_at_ms <= at_ms => {
                        plan.not_before_ms = plan.not_before_ms.max(start_at_ms);
                        admission.limits = Some(limits);
                        limits_write = Some(write);
                    }
                    LimitsStep::Admitted { .. } | LimitsStep::Wait(_) | LimitsStep::Stop(_)
                        if is_hedge =>
                    {
                        return refused(self, StopReason::Admission, (None, None), Vec::new());
                    }
                    LimitsStep::Wait(until) => {
                        return Ok(HedgeAdmitted {
                            step: self.next(),
                            writes: FleetWrites::default(),
                            wait_until_epoch_ms: Some(until),
                        });
                    }
                    LimitsStep::Stop(limits) | LimitsStep::Admitted { limits, .. } => {
                        return refused(self, StopReason::Admission, (None, Some(limits)), skips);
                    }
                }
            }
            if let Some(cfg) = &fleet.retry_budget {
                let s = budget_in(cfg, view, now_epoch_ms)?;
                let short = budget_admission(
                    cfg,
                    &s,
                    &mut self.seen,
                    &mut self.snapshots,
                    plan.ordinal,
                    now_epoch_ms,
                    &mut writes,
                    &mut admission,
                )?;
                if let Some(used) = short {
                    return refused(self, StopReason::RetryBudget, (Some(used), None), skips);
                }
            }
        }
        if !skips.is_empty() {
            admission.skipped = Some(Skips(skips));
        }
        writes.admission.extend(limits_write);
        if !is_hedge {
            // The lead as admitted (moved on by any skipped route).
            self.lead = Some(plan.clone());
        }
        self.admitted = Some((plan.ordinal, admission));
        Ok(HedgeAdmitted {
            step: self.next(),
            writes,
            wait_until_epoch_ms: None,
        })
    }
}

/// The answer of [`super::HedgeSession::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeAdmitted {
    /// What to do now (a refused hedge is no longer offered).
    pub step: HedgeStep,
    /// Snapshots to write back with compare-and-set.
    pub writes: FleetWrites,
    /// The admission limits are full: admit the lead again at this wall
    /// clock (the run machine's hedge layer; absent otherwise).
    pub wait_until_epoch_ms: Option<u64>,
}

impl Encode for HedgeAdmitted {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("step", &self.step)
            .opt_u64("wait_until_epoch_ms", self.wait_until_epoch_ms)
            .doc("writes", &self.writes)
            .end();
    }
}
