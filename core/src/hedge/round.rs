//! Rounds: the plan of each hedge, and the check, accounting and decision
//! of a round, shared by the replay and the live session.

use crate::attempt::{Attempt, Attempts};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Dispatch, Run, Terminal};
use crate::fleet::{BudgetUse, OnStoreUnavailable};
use crate::ids::Identifier;
use crate::policy::CompiledPolicy;

use super::{decides, priority_of, section, CancelledCost, HedgeSummary, Loser, Loss};

/// The plan of hedge `k` (from 1) of a round whose members so far are
/// `plans`, the lead starting at `lead_start`: `Err` says why there is none.
pub(crate) fn plan_hedge(
    cp: &CompiledPolicy,
    run: &Run,
    hedge_reserved: u64,
    plans: &[Dispatch],
    lead_start: u64,
) -> std::result::Result<Dispatch, String> {
    let h = cp
        .policy
        .hedge
        .as_ref()
        .ok_or("the policy has no hedge section")?;
    let p = &cp.policy;
    let k = u64::try_from(plans.len()).unwrap_or(u64::MAX);
    if k > h.max_hedges {
        return Err(format!("at most {} hedges per attempt", h.max_hedges));
    }
    let count = run.count().saturating_add(k);
    if count >= p.max_total_attempts {
        return Err(format!(
            "the total attempt budget {} is spent",
            p.max_total_attempts
        ));
    }
    let at = k
        .checked_mul(h.delay_ms)
        .and_then(|d| lead_start.checked_add(d))
        .ok_or("the hedge threshold overflows")?;
    if at >= p.deadline_ms {
        return Err(format!("the threshold {at} is not before the deadline"));
    }
    let used = |priority: usize, route: &Identifier| {
        let in_round = plans.iter().filter(|d| &d.route_id == route).count();
        run.used_on(priority)
            .saturating_add(u64::try_from(in_round).unwrap_or(u64::MAX))
    };
    let (route, used) = h
        .routes
        .iter()
        .filter_map(|id| {
            let priority = priority_of(cp, id);
            let route = cp.route_at(priority)?;
            let n = used(priority, id);
            (n < route.max_attempts).then_some((route, n))
        })
        .next()
        .ok_or("no hedge route has attempts left")?;
    let in_flight = plans
        .iter()
        .map(|d| d.reserve_cost)
        .fold(0u64, u64::saturating_add);
    let reserved = run
        .spent()
        .saturating_add(in_flight)
        .saturating_add(route.reserve_cost);
    if reserved > p.max_total_cost {
        return Err(format!(
            "reserving {reserved} exceeds max_total_cost {}",
            p.max_total_cost
        ));
    }
    let share = p.max_total_cost.saturating_mul(h.cost_share_percent) / 100;
    let hedges = hedge_reserved.saturating_add(route.reserve_cost);
    if hedges > share {
        return Err(format!(
            "hedges reserving {hedges} exceed their share {share}"
        ));
    }
    Ok(Dispatch {
        continuation: None,
        deadline_ms: p.deadline_ms,
        delay_ms: k.saturating_mul(h.delay_ms),
        idempotency_key_sha256: p.idempotency_key_sha256.clone(),
        jitter_max_ms: None,
        jitter_min_ms: None,
        jitter_sample_ms: None,
        job: None,
        logical_request_sha256: p.logical_request_sha256.clone(),
        not_before_ms: at,
        ordinal: run.count().saturating_add(k).saturating_add(1),
        reserve_cost: route.reserve_cost,
        retry_after_floor_ms: 0,
        route_id: route.route_id.clone(),
        route_ordinal: used.saturating_add(1),
        route_release_sha256: route.route_release_sha256.clone(),
    })
}

/// A hedge's admission under the policy's fleet section: it withdraws from
/// the retry budget, is admitted by its route's breaker and takes a slot of
/// its route's admission limits, skipping nothing (or was admitted without
/// the store under `fail_open`).
fn check_hedge_admission(cp: &CompiledPolicy, a: &Attempt, i: usize) -> Result<()> {
    let drift = |code, msg: &str| Err(Error::attempt(code, i, "admission", msg.to_owned()));
    match (&cp.policy.fleet, &a.admission) {
        (None, None) => Ok(()),
        (Some(_), None) => drift(
            ErrorCode::AdmissionMissing,
            "the policy has a fleet section but the hedge records no admission",
        ),
        (None, Some(_)) => drift(
            ErrorCode::AdmissionUnexpected,
            "the hedge records an admission the policy has no fleet for",
        ),
        (Some(f), Some(adm)) => {
            let ok = if adm.store.is_some() {
                f.on_store_unavailable == OnStoreUnavailable::FailOpen
                    && adm.budget.is_none()
                    && adm.breaker.is_none()
            } else {
                let budget = match (&f.retry_budget, &adm.budget) {
                    (None, None) => true,
                    (Some(_), Some(b)) => b.kind == BudgetUse::Withdraw,
                    _ => false,
                };
                budget
                    && f.breaker.is_some() == adm.breaker.is_some()
                    && f.admission.is_some() == adm.limits.is_some()
            };
            if ok && adm.skipped.is_none() {
                Ok(())
            } else {
                drift(
                    ErrorCode::AdmissionDrift,
                    "a hedge withdraws from the retry budget and reads nothing else",
                )
            }
        }
    }
}

/// Check one round (`round[0]` is the lead, the rest its hedges, in ordinal
/// order, `base` the lead's index), account every member and decide.
pub(crate) fn resolve_round(
    cp: &CompiledPolicy,
    run: &mut Run,
    round: &[Attempt],
    base: usize,
    summary: &mut HedgeSummary,
) -> Result<()> {
    let h = section(cp)?;
    let Some(lead) = round.first() else {
        return Ok(());
    };
    let at = |k: usize| base.saturating_add(k);
    if lead
        .hedge
        .as_ref()
        .is_some_and(|m| m.hedges_ordinal.is_some())
    {
        return Err(Error::attempt(
            ErrorCode::HedgeLossDrift,
            base,
            "hedge/hedges_ordinal",
            "a hedge follows the lead it hedges",
        ));
    }
    let mut plans = vec![run.check(cp, lead, base)?];
    let mut hedge_reserved = run.hedge_reserved();
    for (k, a) in round.iter().enumerate().skip(1) {
        let i = at(k);
        let plan = plan_hedge(cp, run, hedge_reserved, &plans, lead.started_at_ms)
            .map_err(|why| Error::attempt(ErrorCode::HedgeOverBudget, i, "hedge", why))?;
        if a.started_at_ms < plan.not_before_ms {
            return Err(Error::attempt(
                ErrorCode::HedgeBeforeThreshold,
                i,
                "started_at_ms",
                format!(
                    "hedge started at {}, before its threshold {}",
                    a.started_at_ms, plan.not_before_ms
                ),
            ));
        }
        if let Some(m) = round
            .iter()
            .take(k)
            .find(|m| m.completed_at_ms < a.started_at_ms)
        {
            return Err(Error::attempt(
                ErrorCode::HedgeAfterResult,
                i,
                "started_at_ms",
                format!(
                    "hedge started at {} after ordinal {} answered at {}",
                    a.started_at_ms, m.ordinal, m.completed_at_ms
                ),
            ));
        }
        check_hedge_admission(cp, a, i)?;
        let plan = run.check_planned(cp, a, plan, i)?;
        hedge_reserved = hedge_reserved.saturating_add(plan.reserve_cost);
        plans.push(plan);
    }
    // The decider: the first unmarked deciding result; at most one.
    let unmarked = |a: &Attempt| a.hedge.as_ref().is_none_or(|m| m.loss.is_none());
    let mut decider: Option<usize> = None;
    let mut by_completion: Vec<(usize, &Attempt)> = round.iter().enumerate().collect();
    by_completion.sort_by_key(|(_, a)| (a.completed_at_ms, a.ordinal));
    for (k, a) in by_completion {
        if !unmarked(a) || !decides(cp, a) {
            continue;
        }
        if let Some(d) = decider.and_then(|d| round.get(d)) {
            return Err(Error::attempt(
                ErrorCode::HedgeSecondCommit,
                at(k),
                "hedge/loss",
                format!(
                    "ordinal {} had already decided the round at {}",
                    d.ordinal, d.completed_at_ms
                ),
            ));
        }
        decider = Some(k);
    }
    let commit_at = decider
        .and_then(|d| round.get(d))
        .map(|d| d.completed_at_ms);
    for (k, a) in round.iter().enumerate() {
        let i = at(k);
        let loss = a.hedge.as_ref().and_then(|m| m.loss);
        if a.hedge
            .as_ref()
            .is_some_and(|m| m.loss.is_none() && m.hedges_ordinal.is_none())
        {
            return Err(Error::attempt(
                ErrorCode::HedgeLossDrift,
                i,
                "hedge",
                "an empty hedge mark is omitted",
            ));
        }
        if k > 0 && a.hedge.as_ref().and_then(|m| m.hedges_ordinal) != Some(lead.ordinal) {
            return Err(Error::attempt(
                ErrorCode::HedgeLossDrift,
                i,
                "hedge/hedges_ordinal",
                "a hedge names its lead",
            ));
        }
        match (loss, commit_at) {
            (Some(_), None) => {
                return Err(Error::attempt(
                    ErrorCode::HedgeLossDrift,
                    i,
                    "hedge/loss",
                    "a loser in a round nothing decided",
                ))
            }
            (Some(_), Some(c)) if a.completed_at_ms < c => {
                return Err(Error::attempt(
                    ErrorCode::HedgeLossDrift,
                    i,
                    "hedge/loss",
                    format!(
                        "a loser completed at {}, before the round was decided at {c}",
                        a.completed_at_ms
                    ),
                ))
            }
            (None, Some(c)) if a.completed_at_ms > c => {
                return Err(Error::attempt(
                    ErrorCode::HedgeLossDrift,
                    i,
                    "hedge/loss",
                    format!("in flight when the round was decided at {c}, but not marked a loser"),
                ))
            }
            (Some(Loss::Cancelled), Some(_)) => {
                let want = match h.cancelled_cost {
                    CancelledCost::Reserve => plans.get(k).map_or(0, |d| d.reserve_cost),
                    CancelledCost::Zero => 0,
                };
                if a.cost != want {
                    return Err(Error::attempt(
                        ErrorCode::HedgeChargeDrift,
                        i,
                        "cost",
                        format!(
                            "a cancelled loser costs {want} under `{}`, not {}",
                            h.cancelled_cost.as_str(),
                            a.cost
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    for (k, (a, d)) in round.iter().zip(plans.iter()).enumerate() {
        run.account(cp, a, d, at(k))?;
    }
    let finished = round.iter().map(|a| a.completed_at_ms).max().unwrap_or(0);
    let lead_priority = priority_of(cp, &lead.route_id);
    match decider.and_then(|d| round.get(d).map(|a| (d, a))) {
        Some((d, winner)) => {
            let route_ordinal = plans.get(d).map_or(1, |p| p.route_ordinal);
            let priority = priority_of(cp, &winner.route_id);
            run.decide(cp, winner, priority, route_ordinal);
            run.settle_round(priority, finished);
        }
        None => {
            // Every member failed retryably: the plan after the last failure,
            // continuing the lead's route.
            let last = round
                .iter()
                .max_by_key(|a| (a.completed_at_ms, a.ordinal))
                .unwrap_or(lead);
            let route_ordinal = run.used_on(lead_priority);
            run.decide(cp, last, lead_priority, route_ordinal);
            run.settle_round(priority_of(cp, &last.route_id), finished);
            run.realign_next(cp);
        }
    }
    // The summary.
    for (a, d) in round.iter().zip(plans.iter()).skip(1) {
        summary.hedges = summary.hedges.saturating_add(1);
        summary.hedge_cost = summary.hedge_cost.saturating_add(a.cost);
        run.add_hedge_reserved(d.reserve_cost);
    }
    for a in round {
        if let Some(reason) = a.hedge.as_ref().and_then(|m| m.loss) {
            summary.loser_cost = summary.loser_cost.saturating_add(a.cost);
            summary.losers.push(Loser {
                cost: a.cost,
                ordinal: a.ordinal,
                reason,
            });
        }
    }
    if run.terminal() == Some(Terminal::Completed) {
        summary.winner_ordinal = decider.and_then(|d| round.get(d)).map(|a| a.ordinal);
    }
    run.set_hedge(summary.clone());
    Ok(())
}

/// Replay a hedged run: round by round, each by [`resolve_round`].
pub(crate) fn replay(cp: &CompiledPolicy, attempts: &Attempts) -> Result<Run> {
    let mut run = Run::new(cp);
    let mut summary = HedgeSummary::default();
    run.set_hedge(summary.clone());
    let list = &attempts.attempts;
    let mut i = 0;
    while let Some(lead) = list.get(i) {
        let len = list
            .iter()
            .skip(i.saturating_add(1))
            .take_while(|a| a.hedge.as_ref().and_then(|m| m.hedges_ordinal) == Some(lead.ordinal))
            .count();
        let end = i.saturating_add(1).saturating_add(len);
        let round = list.get(i..end).unwrap_or(&[]);
        resolve_round(cp, &mut run, round, i, &mut summary)?;
        i = end;
    }
    if let Some(at) = attempts.cancelled_at_ms {
        run.cancel(at)?;
    }
    if let Some(stop) = &attempts.fleet_stop {
        run.fleet_stop(cp, stop)?;
    }
    Ok(run)
}
