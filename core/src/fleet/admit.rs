//! The admission steps a run takes under a fleet view: breaker, retry
//! budget and limits, each read from the snapshots the view holds.

use crate::admission::{self, AdmissionConfig, AdmissionSnapshot, LimitAnswer};
use crate::breaker::{BreakerConfig, BreakerSnapshot};
use crate::budget::{self, RetryBudgetConfig, RetryBudgetSnapshot};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{Identifier, Sha256Hex};

use super::{
    Admission, BudgetRef, BudgetUse, FleetSnapshots, FleetView, FleetWrites, LimitsRef, Refusal,
};

/// The breaker snapshot of a release in a view, or a fresh one; checked.
pub(crate) fn breaker_in(
    cfg: &BreakerConfig,
    view: &FleetView,
    release: &Sha256Hex,
    now: u64,
) -> Result<BreakerSnapshot> {
    match view.breakers.iter().find(|(key, _)| key == release) {
        Some((key, s)) => {
            // The path is made only for an error (the check runs per admission).
            s.check(cfg, release, "")
                .map_err(|e| e.under(&format!("/breakers/{}", key.as_str())))?;
            Ok(s.clone())
        }
        None => Ok(BreakerSnapshot::fresh(release.clone(), now)),
    }
}

/// The admission snapshot of a release in a view, or a fresh one; checked.
pub(crate) fn admission_in(
    cfg: &AdmissionConfig,
    view: &FleetView,
    release: &Sha256Hex,
    now: u64,
) -> Result<AdmissionSnapshot> {
    match view.admission.iter().find(|(key, _)| key == release) {
        Some((key, s)) => {
            s.check(cfg, release, "")
                .map_err(|e| e.under(&format!("/admission/{}", key.as_str())))?;
            Ok(s.clone())
        }
        None => Ok(AdmissionSnapshot::fresh(cfg, release.clone(), now)),
    }
}

/// The tokens a view reserves: present exactly when the limits have a token bucket.
pub(crate) fn reserved_tokens(cfg: &AdmissionConfig, view: &FleetView) -> Result<Option<u64>> {
    match (cfg.counts_tokens(), view.reserve_tokens) {
        (true, Some(t)) => Ok(Some(t)),
        (false, None) => Ok(None),
        (true, None) => Err(Error::at(
            ErrorCode::InvalidValue,
            "/reserve_tokens",
            "the admission limits have a token bucket: the view says how many tokens the attempt reserves",
        )),
        (false, Some(_)) => Err(Error::at(
            ErrorCode::InvalidValue,
            "/reserve_tokens",
            "tokens reserved without a token bucket in the admission limits",
        )),
    }
}

/// The tenant a view names: present exactly when the limits have tenant
/// shares, and one they list.
pub(crate) fn tenant_in(cfg: &AdmissionConfig, view: &FleetView) -> Result<Option<Identifier>> {
    match (&cfg.tenant_weights, &view.tenant) {
        (Some(w), Some(t)) if w.weight(t).is_some() => Ok(Some(t.clone())),
        (Some(_), Some(t)) => Err(Error::at(
            ErrorCode::InvalidValue,
            "/tenant",
            format!("tenant `{t}` is not in the admission limits' tenant_weights"),
        )),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::at(
            ErrorCode::InvalidValue,
            "/tenant",
            "the admission limits have tenant shares: the view names the call's tenant",
        )),
        (None, Some(_)) => Err(Error::at(
            ErrorCode::InvalidValue,
            "/tenant",
            "a tenant named without tenant_weights in the admission limits",
        )),
    }
}

/// When an admission under limits is asked: the run clock and wall clock
/// now, when the planned attempt first asked (wall clock), and the deadline
/// (run clock).
pub(crate) struct LimitsClock {
    pub(crate) at_ms: u64,
    pub(crate) now_epoch_ms: u64,
    pub(crate) since_epoch_ms: u64,
    pub(crate) deadline_ms: u64,
}

/// What the admission limits say of a planned dispatch.
pub(crate) enum LimitsStep {
    /// Admitted: what the attempt records, the snapshot to write, and the
    /// run-clock time the dispatch may start.
    Admitted {
        limits: LimitsRef,
        write: AdmissionSnapshot,
        start_at_ms: u64,
    },
    /// The in-flight cap is full: ask again at this wall clock.
    Wait(u64),
    /// Not within the queue bound or before the deadline: the refusal.
    Stop(LimitsRef),
}

/// The admission limits' answer for a planned dispatch under snapshot `s`
/// (its digest `digest`): admitted (at once or at a planned start that
/// leaves room before the deadline), wait, or stop.
pub(crate) fn limits_step(
    cfg: &AdmissionConfig,
    s: &AdmissionSnapshot,
    digest: Sha256Hex,
    tokens: Option<u64>,
    tenant: Option<&Identifier>,
    clock: &LimitsClock,
) -> LimitsStep {
    let now = clock.now_epoch_ms;
    let since = clock.since_epoch_ms;
    let (answer, next) = admission::admit_as(cfg, s, now, since, tokens.unwrap_or(0), tenant);
    // The run-clock time of a wall-clock instant, and whether it leaves room
    // before the deadline.
    let run_at = |t: u64| clock.at_ms.saturating_add(t.saturating_sub(now));
    let room = |t: u64| run_at(t) < clock.deadline_ms;
    let refused = |start: Option<u64>, refusal: Option<Refusal>| {
        LimitsStep::Stop(LimitsRef {
            queue_wait_ms: now.saturating_sub(since),
            refusal,
            snapshot_sha256: digest.clone(),
            start_epoch_ms: start,
            tenant: tenant.cloned(),
            tokens,
        })
    };
    match answer {
        LimitAnswer::Admitted { start_epoch_ms } if room(start_epoch_ms) => LimitsStep::Admitted {
            limits: LimitsRef {
                queue_wait_ms: start_epoch_ms.max(now).saturating_sub(since),
                refusal: None,
                snapshot_sha256: digest.clone(),
                start_epoch_ms: Some(start_epoch_ms),
                tenant: tenant.cloned(),
                tokens,
            },
            write: next,
            start_at_ms: run_at(start_epoch_ms),
        },
        LimitAnswer::Wait { until_epoch_ms } | LimitAnswer::OverShare { until_epoch_ms }
            if room(until_epoch_ms) =>
        {
            LimitsStep::Wait(until_epoch_ms)
        }
        LimitAnswer::Admitted { start_epoch_ms: t } | LimitAnswer::Wait { until_epoch_ms: t } => {
            refused(Some(t), None)
        }
        LimitAnswer::OverShare { until_epoch_ms: t }
        | LimitAnswer::RefusedOverShare {
            earliest_epoch_ms: t,
        } => refused(Some(t), Some(Refusal::TenantOverShare)),
        LimitAnswer::Refused { earliest_epoch_ms } => refused(earliest_epoch_ms, None),
    }
}

/// The generation of every snapshot a run read, by key (a route release, a
/// budget scope): a snapshot read again may not be older than one this run
/// already read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Generations(Vec<(String, u64)>);

impl Generations {
    /// An error (`generation_regressed` at `{at}/generation`) when
    /// `generation` is below one read for `key` before.
    pub(crate) fn check(&self, key: &str, generation: u64, at: &str) -> Result<()> {
        match self.0.iter().find(|(k, _)| k == key) {
            Some((_, g)) if *g > generation => Err(Error::at(
                ErrorCode::GenerationRegressed,
                format!("{at}/generation"),
                format!("generation {generation} after {g} was seen"),
            )),
            _ => Ok(()),
        }
    }

    /// [`Generations::check`], then `generation` is the one read for `key`.
    pub(crate) fn saw(&mut self, key: &str, generation: u64, at: &str) -> Result<()> {
        self.check(key, generation, at)?;
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, g)) => *g = generation,
            None => self.0.push((key.to_owned(), generation)),
        }
        Ok(())
    }
}

/// The retry budget's part of admitting attempt `ordinal` under the view's
/// budget snapshot `s` (its generation checked against those the run read,
/// the snapshot kept for the bundle): the first attempt deposits, every
/// later one withdraws, into `writes` and `admission`. `Some(used)` for a
/// withdrawal the budget does not cover (nothing written then).
#[allow(clippy::too_many_arguments)]
pub(crate) fn budget_admission(
    cfg: &RetryBudgetConfig,
    s: &RetryBudgetSnapshot,
    seen: &mut Generations,
    snapshots: &mut FleetSnapshots,
    ordinal: u64,
    now_epoch_ms: u64,
    writes: &mut FleetWrites,
    admission: &mut Admission,
) -> Result<Option<BudgetRef>> {
    seen.saw(s.scope.as_str(), s.generation, "/budget")?;
    let snapshot_sha256 = snapshots.keep_budget(s);
    let (next, kind) = if ordinal == 1 {
        (budget::deposit(cfg, s, now_epoch_ms), BudgetUse::Deposit)
    } else {
        let (granted, next) = budget::withdraw(cfg, s, now_epoch_ms);
        if !granted {
            return Ok(Some(BudgetRef {
                kind: BudgetUse::Withdraw,
                snapshot_sha256,
            }));
        }
        (next, BudgetUse::Withdraw)
    };
    writes.budget = Some(next);
    admission.budget = Some(BudgetRef {
        kind,
        snapshot_sha256,
    });
    Ok(None)
}

/// The budget snapshot of a view, or a fresh one; checked.
pub(crate) fn budget_in(
    cfg: &RetryBudgetConfig,
    view: &FleetView,
    now: u64,
) -> Result<RetryBudgetSnapshot> {
    match &view.budget {
        Some(s) => {
            s.check(cfg, "/budget")?;
            Ok(s.clone())
        }
        None => Ok(RetryBudgetSnapshot::fresh(cfg.scope.clone(), now)),
    }
}

/// The next snapshot of `attempt`'s breaker after its outcome, from the
/// snapshot a host reads now (`now_epoch_ms`, wall clock), checked against
/// the generations `seen` before. A wait longer than the cap under
/// `retry_after_over_cap: skip_route` parks the route for every run until
/// the server's time (the run leaves it).
pub(crate) fn breaker_after_attempt(
    policy: &crate::policy::CompiledPolicy,
    seen: &Generations,
    attempt: &crate::attempt::Attempt,
    snapshot: &BreakerSnapshot,
    now_epoch_ms: u64,
) -> Result<BreakerSnapshot> {
    let cfg = policy
        .policy
        .fleet
        .as_ref()
        .and_then(|f| f.breaker.as_ref())
        .ok_or_else(|| {
            Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet/breaker",
                "the policy has no breaker",
            )
        })?;
    snapshot.check(cfg, &attempt.route_release_sha256, "")?;
    seen.check(
        attempt.route_release_sha256.as_str(),
        snapshot.generation,
        "",
    )?;
    let probe = attempt
        .admission
        .as_ref()
        .and_then(|adm| adm.breaker.as_ref())
        .is_some_and(|b| b.probe);
    let recorded = crate::breaker::record(
        cfg,
        snapshot,
        probe,
        crate::breaker::Health::of(&attempt.outcome),
        now_epoch_ms,
    );
    let backoff = &policy.policy.backoff;
    if backoff.retry_after_over_cap == Some(crate::policy::OverCap::SkipRoute) {
        if let Some(hint) = attempt.outcome.retry_after_ms() {
            if hint > backoff.retry_after_cap_ms {
                let until = now_epoch_ms.saturating_add(hint);
                return Ok(crate::breaker::park(&recorded, until, now_epoch_ms));
            }
        }
    }
    Ok(recorded)
}
