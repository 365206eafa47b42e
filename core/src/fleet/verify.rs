//! Replaying a run's recorded admissions against its plan.

use crate::admission::{self, AdmissionConfig, LimitAnswer};
use crate::attempt::Attempts;
use crate::breaker::{self, BreakerAdmission, BreakerConfig};
use crate::budget;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;
use crate::policy::CompiledPolicy;

use super::{
    Admission, BudgetUse, FleetSnapshots, FleetStop, LimitsRef, Named, Refusal, Skip, StopReason,
};

fn drift(i: Option<usize>, path: String, msg: String) -> Error {
    let mut e = Error::at(ErrorCode::AdmissionDrift, path, msg);
    e.attempt_index = i;
    e
}

/// Check one skip: the snapshot is in the bundle, is the route's, and refuses.
fn check_skip(
    cp: &CompiledPolicy,
    cfg: &BreakerConfig,
    snapshots: &FleetSnapshots,
    skip: &Skip,
    at_epoch_ms: u64,
    i: Option<usize>,
    at: &str,
) -> Result<()> {
    let Some(route) = cp.routes().find(|r| r.route_id == skip.route_id) else {
        return Err(drift(
            i,
            format!("{at}/route_id"),
            format!("no route `{}`", skip.route_id),
        ));
    };
    let Some(s) = snapshots.breaker(&skip.snapshot_sha256) else {
        return Err(missing(i, format!("{at}/snapshot_sha256")));
    };
    s.check(cfg, &route.route_release_sha256, at)?;
    if let (BreakerAdmission::Admitted { .. }, _) = breaker::admit(cfg, s, at_epoch_ms) {
        return Err(drift(
            i,
            format!("{at}/route_id"),
            format!(
                "route `{}` was skipped, but its breaker snapshot admits at {at_epoch_ms}",
                skip.route_id
            ),
        ));
    }
    Ok(())
}

/// Check an attempt's (or a stop's) admission limits against the snapshot
/// the bundle carries: re-run the admission and compare its answer.
fn check_limits(
    cfg: &AdmissionConfig,
    snapshots: &FleetSnapshots,
    limits: &LimitsRef,
    release: &Sha256Hex,
    now: u64,
    stop: Option<(u64, u64)>,
    (i, at): (Option<usize>, &str),
) -> Result<()> {
    let Some(s) = snapshots.admission(&limits.snapshot_sha256) else {
        return Err(missing(i, format!("{at}/snapshot_sha256")));
    };
    s.check(cfg, release, at)?;
    if cfg.counts_tokens() != limits.tokens.is_some() {
        return Err(drift(
            i,
            format!("{at}/tokens"),
            "an admission records its tokens exactly when the limits have a token bucket".into(),
        ));
    }
    if cfg.tenant_weights.is_some() != limits.tenant.is_some()
        || limits.tenant.as_ref().is_some_and(|t| {
            cfg.tenant_weights
                .as_ref()
                .is_some_and(|w| w.weight(t).is_none())
        })
    {
        return Err(drift(
            i,
            format!("{at}/tenant"),
            "an admission records a listed tenant exactly when the limits have tenant shares"
                .into(),
        ));
    }
    let tokens = limits.tokens.unwrap_or(0);
    let tenant = limits.tenant.as_ref();
    let over = Some(Refusal::TenantOverShare);
    let fits = match stop {
        None => {
            let start = limits.start_epoch_ms.unwrap_or(0);
            let since = start.saturating_sub(limits.queue_wait_ms);
            admission::admit_as(cfg, s, now, since, tokens, tenant).0
                == LimitAnswer::Admitted {
                    start_epoch_ms: start,
                }
                && since <= now
                && limits.refusal.is_none()
        }
        Some((at_ms, deadline_ms)) => {
            let since = now.saturating_sub(limits.queue_wait_ms);
            let room = |t: u64| at_ms.saturating_add(t.saturating_sub(now)) < deadline_ms;
            match admission::admit_as(cfg, s, now, since, tokens, tenant).0 {
                LimitAnswer::Admitted { start_epoch_ms: t }
                | LimitAnswer::Wait { until_epoch_ms: t } => {
                    !room(t) && limits.start_epoch_ms == Some(t) && limits.refusal.is_none()
                }
                LimitAnswer::OverShare { until_epoch_ms: t } => {
                    !room(t) && limits.start_epoch_ms == Some(t) && limits.refusal == over
                }
                LimitAnswer::RefusedOverShare {
                    earliest_epoch_ms: t,
                } => limits.start_epoch_ms == Some(t) && limits.refusal == over,
                LimitAnswer::Refused { earliest_epoch_ms } => {
                    limits.start_epoch_ms == earliest_epoch_ms && limits.refusal.is_none()
                }
            }
        }
    };
    if !fits {
        return Err(drift(
            i,
            format!("{at}/start_epoch_ms"),
            "the admission snapshot does not give this admission (start, queue wait or refusal)"
                .into(),
        ));
    }
    Ok(())
}

fn missing(i: Option<usize>, path: String) -> Error {
    let mut e = Error::at(
        ErrorCode::SnapshotMissing,
        path,
        "the bundle does not carry the snapshot this admission read",
    );
    e.attempt_index = i;
    e
}

/// The dispatch a fleet stop was for: the plan before the stop, after the
/// routes it skipped.
fn planned_for_stop(
    cp: &CompiledPolicy,
    attempts: &Attempts,
    stop: &FleetStop,
) -> Option<crate::evaluate::Dispatch> {
    let before = Attempts {
        fleet_stop: None,
        ..attempts.clone()
    };
    let run = crate::evaluate::replay(cp, &before).ok()?;
    let crate::evaluate::Decision::Dispatch(mut d) = run.next().clone() else {
        return None;
    };
    for _ in stop.skipped.iter().flat_map(|s| s.0.iter()) {
        d = run.skip_route(cp, &d)?;
    }
    Some(d)
}

/// Replay one admission of an attempt on `release` against `snapshots`
/// (errors at `at`, for the attempt at index `i` when it is one).
fn check_admission(
    cp: &CompiledPolicy,
    adm: &Admission,
    release: &Sha256Hex,
    snapshots: &FleetSnapshots,
    i: Option<usize>,
    at: &str,
) -> Result<()> {
    let Some(fleet) = &cp.policy.fleet else {
        return Ok(());
    };
    let now = adm.admitted_at_epoch_ms;
    if adm.store.is_some() {
        return Ok(());
    }
    if let (Some(cfg), Some(l)) = (&fleet.admission, &adm.limits) {
        check_limits(
            cfg,
            snapshots,
            l,
            release,
            now,
            None,
            (i, &format!("{at}/limits")),
        )?;
    }
    if let Some(cfg) = &fleet.breaker {
        for (k, skip) in adm.skipped.iter().flat_map(|s| s.0.iter()).enumerate() {
            check_skip(
                cp,
                cfg,
                snapshots,
                skip,
                now,
                i,
                &format!("{at}/skipped/{k}"),
            )?;
        }
        if let Some(b) = &adm.breaker {
            let Some(s) = snapshots.breaker(&b.snapshot_sha256) else {
                return Err(missing(i, format!("{at}/breaker/snapshot_sha256")));
            };
            s.check(cfg, release, &format!("{at}/breaker"))?;
            let (answer, _) = breaker::admit(cfg, s, now);
            if answer != (BreakerAdmission::Admitted { probe: b.probe })
                || s.generation != b.generation
            {
                return Err(drift(
                    i,
                    format!("{at}/breaker"),
                    "the breaker snapshot does not give this admission".into(),
                ));
            }
        }
    }
    if let (Some(cfg), Some(b)) = (&fleet.retry_budget, &adm.budget) {
        let Some(s) = snapshots.budget(&b.snapshot_sha256) else {
            return Err(missing(i, format!("{at}/budget/snapshot_sha256")));
        };
        s.check(cfg, &format!("{at}/budget"))?;
        if b.kind == BudgetUse::Withdraw && !budget::withdraw(cfg, s, now).0 {
            return Err(drift(
                i,
                format!("{at}/budget"),
                "the budget snapshot does not cover this withdrawal".into(),
            ));
        }
    }
    Ok(())
}

/// Check the snapshots a journal's `dispatched` event at `at` carries for
/// its admission of an attempt on `release`: exactly those the admission
/// names (its skipped routes' breakers then its route's, each once, its
/// budget, its admission limits; omitted when it names none), and the
/// admission replays under them as a bundle's does.
pub(crate) fn check_carried(
    cp: &CompiledPolicy,
    adm: Option<&Admission>,
    release: &Sha256Hex,
    carried: Option<&FleetSnapshots>,
    at: &str,
) -> Result<()> {
    let named = adm.map(Named::of).unwrap_or_default();
    match (adm, carried_as_named(named, carried, at)?) {
        (Some(adm), Some(carried)) => {
            check_admission(cp, adm, release, carried, None, &format!("{at}/admission"))
        }
        _ => Ok(()),
    }
}

/// Check the snapshots a journal's `terminal` event at `at` carries for
/// its fleet stop, as [`check_carried`] does for an admission: exactly
/// those the stop names, and the stop (of `attempts`, which end with it)
/// replays under them with the snapshots the admissions before it read
/// (`kept`), as a bundle's does.
pub(crate) fn check_stop_carried(
    cp: &CompiledPolicy,
    attempts: &Attempts,
    kept: &FleetSnapshots,
    carried: Option<&FleetSnapshots>,
    at: &str,
) -> Result<()> {
    let named = attempts
        .fleet_stop
        .as_ref()
        .map(Named::of_stop)
        .unwrap_or_default();
    let Some(carried) = carried_as_named(named, carried, at)? else {
        return Ok(());
    };
    let mut all = kept.clone();
    all.keep_all(carried);
    verify_admissions(cp, attempts, &all).map_err(|e| {
        let path = e.path.clone().unwrap_or_default();
        let inner = path.strip_prefix("/attempts").unwrap_or(&path).to_owned();
        Error {
            path: Some(format!("{at}{inner}")),
            attempt_index: None,
            ..e
        }
    })
}

/// `carried` when it is exactly the snapshots `named` (in its order, each
/// once); `None` when nothing is named and nothing carried.
fn carried_as_named<'a>(
    named: Named,
    carried: Option<&'a FleetSnapshots>,
    at: &str,
) -> Result<Option<&'a FleetSnapshots>> {
    let Some(carried) = carried else {
        if named.is_empty() {
            return Ok(None);
        }
        return Err(Error::at(
            ErrorCode::SnapshotMissing,
            format!("{at}/snapshots"),
            "the event does not carry the snapshots its fleet record read",
        ));
    };
    if named.is_empty() {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            format!("{at}/snapshots"),
            "snapshots are omitted when the fleet record names none",
        ));
    }
    let got = carried.digests();
    if got != named {
        let absent = |n: &[Sha256Hex], g: &[Sha256Hex]| n.iter().any(|d| !g.contains(d));
        let code = if absent(&named.breakers, &got.breakers)
            || absent(&named.budgets, &got.budgets)
            || absent(&named.admissions, &got.admissions)
        {
            ErrorCode::SnapshotMissing
        } else {
            ErrorCode::InvalidValue
        };
        return Err(Error::at(
            code,
            format!("{at}/snapshots"),
            "the event carries the snapshots its fleet record names, each once, in the order it names them",
        ));
    }
    Ok(Some(carried))
}

/// Replay every admission of a run against the snapshots its bundle carries.
pub fn verify_admissions(
    cp: &CompiledPolicy,
    attempts: &Attempts,
    snapshots: &FleetSnapshots,
) -> Result<()> {
    let Some(fleet) = &cp.policy.fleet else {
        return Ok(());
    };
    for (i, a) in attempts.attempts.iter().enumerate() {
        let Some(adm) = &a.admission else { continue };
        let at = format!("/attempts/attempts/{i}/admission");
        check_admission(cp, adm, &a.route_release_sha256, snapshots, Some(i), &at)?;
    }
    if let Some(stop) = &attempts.fleet_stop {
        let at = "/attempts/fleet_stop";
        let now = stop.at_epoch_ms;
        if let Some(cfg) = &fleet.breaker {
            for (k, skip) in stop.skipped.iter().flat_map(|s| s.0.iter()).enumerate() {
                check_skip(
                    cp,
                    cfg,
                    snapshots,
                    skip,
                    now,
                    None,
                    &format!("{at}/skipped/{k}"),
                )?;
            }
        }
        if let (Some(cfg), Some(l), StopReason::Admission) =
            (&fleet.admission, &stop.limits, stop.reason)
        {
            let Some(d) = planned_for_stop(cp, attempts, stop) else {
                return Err(drift(
                    None,
                    format!("{at}/limits"),
                    "no planned dispatch for the admission stop".into(),
                ));
            };
            check_limits(
                cfg,
                snapshots,
                l,
                &d.route_release_sha256,
                now,
                Some((stop.at_ms, d.deadline_ms)),
                (None, &format!("{at}/limits")),
            )?;
        }
        if let (Some(cfg), Some(b), StopReason::RetryBudget) =
            (&fleet.retry_budget, &stop.budget, stop.reason)
        {
            let Some(s) = snapshots.budget(&b.snapshot_sha256) else {
                return Err(missing(None, format!("{at}/budget/snapshot_sha256")));
            };
            s.check(cfg, &format!("{at}/budget"))?;
            if budget::withdraw(cfg, s, now).0 {
                return Err(drift(
                    None,
                    format!("{at}/budget"),
                    "the run stopped for its retry budget, but the snapshot covers the withdrawal"
                        .into(),
                ));
            }
            // A budget that waits stops only when the wait would reach the
            // deadline (a hedged run's hedge session stops at once).
            if cfg.wait_ms.is_some() && cp.policy.hedge.is_none() {
                let room = planned_for_stop(cp, attempts, stop)
                    .is_some_and(|d| cfg.waits(stop.at_ms, d.deadline_ms).is_some());
                if room {
                    return Err(drift(
                        None,
                        format!("{at}/at_ms"),
                        "the run stopped for its retry budget, but the budget waits and its wait ends before the deadline"
                            .into(),
                    ));
                }
            }
        }
    }
    Ok(())
}
