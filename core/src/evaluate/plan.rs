//! Planning the next dispatch: route choice, the pre-dispatch checks, fleet
//! admission and the retry schedule after each judged attempt.

use super::{Decision, Dispatch, Run, Terminal, MAX_IN_PROGRESS};
use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{BudgetUse, FleetStop, OnStoreUnavailable, StopReason};
use crate::job::JobState;
use crate::policy::{CompiledPolicy, OverCap};
use crate::schedule::{next_delay, Delay};

impl Run {
    /// The pre-dispatch checks that follow the route choice: cost reservation, then deadline.
    pub(super) fn admit(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        not_before: u64,
        delay: Delay,
    ) -> Decision {
        let p = &cp.policy;
        let jitter = delay.jitter;
        let Some(route) = cp.route_at(priority) else {
            return Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            };
        };
        let reserved = self.spent.checked_add(route.reserve_cost);
        if reserved.is_none_or(|r| r > p.max_total_cost) {
            return Decision::Terminal {
                terminal: Terminal::StopCostBudget,
            };
        }
        if not_before >= p.deadline_ms {
            return Decision::Terminal {
                terminal: Terminal::StopDeadline,
            };
        }
        Decision::Dispatch(Dispatch {
            continuation: None,
            deadline_ms: p.deadline_ms,
            delay_ms: delay.delay_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            jitter_max_ms: jitter.map(|j| j.max_ms),
            jitter_min_ms: jitter.map(|j| j.min_ms),
            jitter_sample_ms: jitter.map(|j| j.sample_ms),
            job: self.job.as_ref().map(JobState::step),
            logical_request_sha256: p.logical_request_sha256.clone(),
            not_before_ms: not_before,
            ordinal: self.count.saturating_add(1),
            reserve_cost: route.reserve_cost,
            retry_after_floor_ms: delay.retry_after_floor_ms,
            route_id: route.route_id.clone(),
            route_ordinal,
            route_release_sha256: route.route_release_sha256.clone(),
        })
    }

    /// Plan after a retryable failure of `route_ordinal` on `priority`, completed at `completed`.
    pub(super) fn plan_after(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        if self.count >= p.max_total_attempts {
            return Decision::Terminal {
                terminal: Terminal::StopTotalAttempts,
            };
        }
        let used = self.used_on(priority);
        let bound = cp.route_at(priority).map_or(0, |r| r.max_attempts);
        // A hint above the cap: clamp it (below), stop, or leave the route.
        let over_cap = hint.is_some_and(|h| h > p.backoff.retry_after_cap_ms);
        let mode = p.backoff.retry_after_over_cap.unwrap_or(OverCap::Clamp);
        let leave = over_cap && mode == OverCap::SkipRoute;
        if over_cap && mode == OverCap::Stop {
            return Decision::Terminal {
                terminal: Terminal::StopRetryAfter,
            };
        }
        let (next_priority, next_ordinal) = if used < bound && !leave {
            (priority, route_ordinal.saturating_add(1))
        } else {
            (priority.saturating_add(1), 1)
        };
        // A route that answered `in_progress` holds the effect: never leave
        // it (`decide` makes the terminal `stop_indeterminate`).
        if self.pinned.is_some_and(|p| p != next_priority) {
            return Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            };
        }
        if cp.route_at(next_priority).is_none() {
            return Decision::Terminal {
                terminal: if leave {
                    Terminal::StopRetryAfter
                } else {
                    Terminal::StopRouteExhausted
                },
            };
        }
        // The hint is the failed route's: another route waits the backoff only.
        let hint = if leave { None } else { hint };
        self.plan_on(
            cp,
            (next_priority, next_ordinal),
            route_ordinal,
            completed,
            hint,
        )
    }

    /// Plan after a `quota_exhausted` answer on `priority` (its
    /// `route_ordinal`-th attempt, completed at `completed`) under
    /// `quota_exhausted: skip_route`: the route's account cannot serve the
    /// request within the run, so the next route by priority is planned at
    /// once (backoff only); with none left, `stop_non_retryable`.
    pub(super) fn plan_past_quota(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
    ) -> Decision {
        let terminal = |terminal| Decision::Terminal { terminal };
        if self.count >= cp.policy.max_total_attempts {
            return terminal(Terminal::StopTotalAttempts);
        }
        let next = priority.saturating_add(1);
        // A route that answered `in_progress` holds an effect whose fate
        // the run does not know: never leave it.
        if self.pinned.is_some_and(|p| p != next) {
            return terminal(Terminal::StopIndeterminate);
        }
        if cp.route_at(next).is_none() {
            return terminal(Terminal::StopNonRetryable);
        }
        self.plan_on(cp, (next, 1), route_ordinal, completed, None)
    }

    /// The dispatch of `(priority, ordinal)` after the failed attempt
    /// `route_ordinal` completed at `completed`, waiting the backoff (raised
    /// to `hint` when the next attempt is on the same route).
    fn plan_on(
        &self,
        cp: &CompiledPolicy,
        (next_priority, next_ordinal): (usize, u64),
        route_ordinal: u64,
        completed: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        let latest_delay = p.deadline_ms.saturating_sub(1).saturating_sub(completed);
        let d = next_delay(
            &p.backoff,
            &p.jitter,
            route_ordinal,
            hint,
            self.last_sample,
            self.count.saturating_add(1),
            latest_delay,
        );
        let not_before = completed.saturating_add(d.delay_ms);
        self.admit(cp, next_priority, next_ordinal, not_before, d)
    }

    /// Plan after an `in_progress` answer to `route_ordinal` on `priority`,
    /// completed at `completed`: ask again on the same route with the same
    /// key and body (another route's receiver would run the effect a second
    /// time), its per-route bound notwithstanding, after the backoff raised
    /// to the hint (clamped to the cap under every over-cap mode). When the
    /// ask does not fit ([`MAX_IN_PROGRESS`] answers in a row, total
    /// attempts, cost reservation, deadline) the effect's fate is unknown:
    /// `stop_indeterminate`.
    pub(super) fn plan_in_progress(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        let unknown = Decision::Terminal {
            terminal: Terminal::StopIndeterminate,
        };
        if self.in_progress >= MAX_IN_PROGRESS || self.count >= p.max_total_attempts {
            return unknown;
        }
        let latest_delay = p.deadline_ms.saturating_sub(1).saturating_sub(completed);
        let d = next_delay(
            &p.backoff,
            &p.jitter,
            route_ordinal,
            hint,
            self.last_sample,
            self.count.saturating_add(1),
            latest_delay,
        );
        let not_before = completed.saturating_add(d.delay_ms);
        match self.admit(cp, priority, route_ordinal.saturating_add(1), not_before, d) {
            Decision::Terminal { .. } => unknown,
            ask => ask,
        }
    }

    /// The next poll of an accepted job, after attempt `a` (the acceptance
    /// or the previous poll) on its route: `delay` after its completion,
    /// raised to the bounded hint; the deadline still applies.
    pub(super) fn plan_poll(
        &self,
        cp: &CompiledPolicy,
        a: &Attempt,
        job: &JobState,
        delay: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        let floor = crate::job::poll_floor(&p.backoff, hint);
        let delay_ms = delay.max(floor);
        let not_before = a.completed_at_ms.saturating_add(delay_ms);
        if not_before >= p.deadline_ms {
            return Decision::Terminal {
                terminal: Terminal::StopDeadline,
            };
        }
        Decision::Dispatch(Dispatch {
            continuation: None,
            deadline_ms: p.deadline_ms,
            delay_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            jitter_max_ms: None,
            jitter_min_ms: None,
            jitter_sample_ms: None,
            job: Some(job.step()),
            logical_request_sha256: p.logical_request_sha256.clone(),
            not_before_ms: not_before,
            ordinal: self.count.saturating_add(1),
            reserve_cost: 0,
            retry_after_floor_ms: floor,
            route_id: a.route_id.clone(),
            route_ordinal: a.route_ordinal,
            route_release_sha256: a.route_release_sha256.clone(),
        })
    }

    /// The planned dispatch on the next route by priority that still has
    /// attempts, when the planned route is skipped (its breaker refused).
    /// Never after an `in_progress` answer: the run stays on its route.
    pub(crate) fn skip_route(&self, cp: &CompiledPolicy, d: &Dispatch) -> Option<Dispatch> {
        if self.pinned.is_some() {
            return None;
        }
        let from = cp.routes().position(|r| r.route_id == d.route_id)?;
        let (priority, used) = cp
            .routes()
            .enumerate()
            .skip(from.saturating_add(1))
            .map(|(p, r)| (p, self.used_on(p), r))
            .find(|(_, used, r)| *used < r.max_attempts)
            .map(|(p, used, _)| (p, used))?;
        let delay = Delay {
            delay_ms: d.delay_ms,
            retry_after_floor_ms: d.retry_after_floor_ms,
            jitter: d.jitter(),
        };
        match self.admit(cp, priority, used.saturating_add(1), d.not_before_ms, delay) {
            Decision::Dispatch(moved) => Some(Dispatch {
                continuation: None,
                ..moved
            }),
            Decision::Terminal { .. } => None,
        }
    }

    /// The dispatch an attempt's admission implies: the plan after its
    /// skipped routes. The admission must fit the policy's fleet section.
    pub(super) fn admitted(
        &self,
        cp: &CompiledPolicy,
        d: Dispatch,
        a: &Attempt,
        i: usize,
    ) -> Result<Dispatch> {
        let drift =
            |code, field: &str, msg: &str| Err(Error::attempt(code, i, field, msg.to_owned()));
        let admits = crate::job::admitted_step(&d);
        let (fleet, adm) = match (&cp.policy.fleet, &a.admission) {
            (None, None) => return Ok(d),
            // A job's polls and its cancel are not admitted.
            (Some(_), None) if !admits => return Ok(d),
            (Some(_), Some(_)) if !admits => {
                return drift(
                    ErrorCode::AdmissionUnexpected,
                    "admission",
                    "a job's poll or cancel is not admitted by the fleet",
                )
            }
            (Some(_), None) => {
                return drift(
                    ErrorCode::AdmissionMissing,
                    "admission",
                    "the policy has a fleet section but the attempt records no admission",
                )
            }
            (None, Some(_)) => {
                return drift(
                    ErrorCode::AdmissionUnexpected,
                    "admission",
                    "the attempt records an admission the policy has no fleet for",
                )
            }
            (Some(f), Some(adm)) => (f, adm),
        };
        if adm.store.is_some() {
            if fleet.on_store_unavailable != OnStoreUnavailable::FailOpen
                || adm.breaker.is_some()
                || adm.budget.is_some()
                || adm.limits.is_some()
                || adm.skipped.is_some()
            {
                return drift(
                    ErrorCode::AdmissionDrift,
                    "admission/store",
                    "only a fail_open policy admits without its store, and then reads no snapshot",
                );
            }
            self.check_key(cp, fleet, &d, adm, i)?;
            return Ok(d);
        }
        let mut plan = d;
        for skip in adm.skipped.iter().flat_map(|s| s.0.iter()) {
            if fleet.breaker.is_none() || skip.route_id != plan.route_id {
                return drift(
                    ErrorCode::AdmissionDrift,
                    "admission/skipped",
                    "a skipped route is not the planned one",
                );
            }
            plan = match self.skip_route(cp, &plan) {
                Some(p) => p,
                None => {
                    return drift(
                        ErrorCode::AdmissionDrift,
                        "admission/skipped",
                        "no route is left after the skipped ones: the run should have stopped",
                    )
                }
            };
        }
        if fleet.admission.is_some() != adm.limits.is_some()
            || adm
                .limits
                .as_ref()
                .is_some_and(|l| l.start_epoch_ms.is_none())
        {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/limits",
                "an admission reads the admission limits exactly when the policy has them, and records its start",
            );
        }
        if fleet.breaker.is_some() != adm.breaker.is_some() {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/breaker",
                "an admission reads the breaker exactly when the policy has one",
            );
        }
        let want = if plan.ordinal == 1 {
            BudgetUse::Deposit
        } else {
            BudgetUse::Withdraw
        };
        let budget_ok = match (&fleet.retry_budget, &adm.budget) {
            (None, None) => true,
            (Some(_), Some(b)) => b.kind == want,
            _ => false,
        };
        if !budget_ok {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/budget",
                "a first attempt deposits into the retry budget and every later one withdraws",
            );
        }
        self.check_key(cp, fleet, &plan, adm, i)?;
        Ok(plan)
    }

    /// The fleet refused the next dispatch at `stop.at_ms` (run clock).
    pub(crate) fn fleet_stop(&mut self, cp: &CompiledPolicy, stop: &FleetStop) -> Result<()> {
        let bad = |msg: &str| {
            Err(Error::at(
                ErrorCode::AdmissionDrift,
                "/fleet_stop",
                msg.to_owned(),
            ))
        };
        let Some(fleet) = &cp.policy.fleet else {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet_stop",
                "a fleet stop under a policy without a fleet section",
            ));
        };
        let Decision::Dispatch(d) = &self.next else {
            return bad("the run had already ended");
        };
        if stop.at_ms < self.finished_at_ms {
            return bad("the fleet stop comes before the last completion");
        }
        let mut plan = d.clone();
        let skips: &[crate::fleet::Skip] = stop.skipped.as_ref().map_or(&[], |s| &s.0);
        let mut exhausted = false;
        for (k, skip) in skips.iter().enumerate() {
            if fleet.breaker.is_none() || skip.route_id != plan.route_id || exhausted {
                return bad("a skipped route is not the planned one");
            }
            match self.skip_route(cp, &plan) {
                Some(p) => plan = p,
                None => exhausted = k.saturating_add(1) == skips.len(),
            }
        }
        if stop.key_pool.is_some() != (stop.reason == StopReason::NoUsableKey) {
            return bad("a fleet stop names a key pool exactly when no key of it is usable");
        }
        let terminal = match stop.reason {
            StopReason::NoUsableKey if !exhausted && self.names_pool(cp, &plan, stop) => {
                Terminal::StopNoUsableKey
            }
            StopReason::NoUsableKey => {
                return bad("only the planned route's key pool can have no usable key")
            }
            StopReason::CircuitOpen if exhausted => Terminal::StopCircuitOpen,
            StopReason::CircuitOpen => return bad("a route is left that was not tried"),
            StopReason::RetryBudget
                if fleet.retry_budget.is_some() && plan.ordinal > 1 && stop.budget.is_some() =>
            {
                Terminal::StopRetryBudget
            }
            StopReason::RetryBudget => {
                return bad("only a retry or fallback can be short of the retry budget")
            }
            StopReason::StoreUnavailable
                if fleet.on_store_unavailable == OnStoreUnavailable::FailClosed
                    && skips.is_empty() =>
            {
                Terminal::StopStoreUnavailable
            }
            StopReason::StoreUnavailable => {
                return bad("only a fail_closed policy stops for its store")
            }
            StopReason::Admission if fleet.admission.is_some() && stop.limits.is_some() => {
                Terminal::StopAdmission
            }
            StopReason::Admission => {
                return bad(
                    "only a policy with admission limits stops for them, and records the snapshot",
                )
            }
        };
        if let Some(f) = self.fleet.as_mut() {
            f.routes_skipped = f
                .routes_skipped
                .saturating_add(u64::try_from(skips.len()).unwrap_or(0));
        }
        self.finished_at_ms = stop.at_ms;
        self.next = Decision::Terminal { terminal };
        if let Some(st) = self.streaming.as_mut() {
            let action = st.settle(Some(terminal), false);
            self.actions.push(action);
        }
        Ok(())
    }

    /// The next dispatch on a route hedges used: its per-route ordinal
    /// counts them, and a route they exhausted passes to the next one.
    pub(crate) fn realign_next(&mut self, cp: &CompiledPolicy) {
        let Decision::Dispatch(d) = &self.next else {
            return;
        };
        let Some(priority) = cp.routes().position(|r| r.route_id == d.route_id) else {
            return;
        };
        let used = self.used_on(priority);
        let bound = cp.route_at(priority).map_or(0, |r| r.max_attempts);
        // A run that saw `in_progress` stays on its route.
        if used < bound || self.pinned.is_some() {
            if let Decision::Dispatch(d) = &mut self.next {
                d.route_ordinal = used.saturating_add(1);
            }
            return;
        }
        let moved = self.skip_route(cp, d);
        self.next = match moved {
            Some(m) => Decision::Dispatch(m),
            None => Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            },
        };
    }
}
