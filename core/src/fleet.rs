//! Fleet protection in a run: the policy's `fleet` section (a circuit breaker
//! per route release, a retry budget per scope, what to do when the store is
//! unreachable), the admission each attempt was dispatched under, and the
//! replay of every admission against the snapshots a bundle carries.
//!
//! Before each dispatch a host reads the snapshots of the planned route's
//! breaker and of the budget from its store and asks the session to admit
//! ([`crate::session::Session::admit`]). An open route is skipped without
//! spending an attempt (the plan moves to the next route by priority); when no
//! route admits the run ends `stop_circuit_open`; a retry or fallback the
//! budget does not cover ends it `stop_retry_budget`; an unreachable store
//! ends it `stop_store_unavailable` (`fail_closed`) or is admitted and
//! recorded as such (`fail_open`). Each attempt records the snapshots' digests
//! and the breaker generation it was admitted under; the bundle carries the
//! snapshots, and [`verify_admissions`] re-runs every admission.

use serde_json::Value;

use crate::admission::{self, AdmissionConfig, AdmissionSnapshot, LimitAnswer};
use crate::attempt::Attempts;
use crate::breaker::{self, BreakerAdmission, BreakerConfig, BreakerSnapshot};
use crate::budget::{self, RetryBudgetConfig, RetryBudgetSnapshot};
use crate::canonical::{digest_of, encode_list, Encode, Sink};
use crate::decode::{decode_list, names, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{Identifier, Sha256Hex};
use crate::limits::{MAX_ATTEMPTS, MAX_ROUTES};
use crate::policy::CompiledPolicy;

/// What happens when the store cannot be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreUnavailable {
    /// Stop with `stop_store_unavailable`.
    FailClosed,
    /// Dispatch without the fleet view; the attempt and receipt say so.
    FailOpen,
}

names!(OnStoreUnavailable {
    FailClosed => "fail_closed",
    FailOpen => "fail_open",
});

/// The policy's `fleet` section. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// Admission limits per route release (and tenant, principal).
    pub admission: Option<AdmissionConfig>,
    /// A circuit breaker per route release.
    pub breaker: Option<BreakerConfig>,
    /// What happens when the store is unreachable.
    pub on_store_unavailable: OnStoreUnavailable,
    /// A retry budget shared by every run of its scope.
    pub retry_budget: Option<RetryBudgetConfig>,
}

object!(FleetConfig {
    admission: opt_doc,
    breaker: opt_doc,
    on_store_unavailable: doc,
    retry_budget: opt_doc,
});

impl FleetConfig {
    /// Check the section.
    pub(crate) fn check(&self) -> Result<()> {
        if self.breaker.is_none() && self.retry_budget.is_none() && self.admission.is_none() {
            return Err(Error::at(
                ErrorCode::InvalidBreaker,
                "/fleet",
                "a fleet section needs a breaker, a retry budget, admission limits, or more than one",
            ));
        }
        if let Some(a) = &self.admission {
            a.check("/fleet/admission")?;
        }
        if let Some(b) = &self.breaker {
            b.check("/fleet/breaker")?;
        }
        if let Some(b) = &self.retry_budget {
            b.check("/fleet/retry_budget")?;
        }
        Ok(())
    }
}

/// The breaker an attempt was admitted under. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerRef {
    /// The snapshot's generation.
    pub generation: u64,
    /// Admitted as a half-open probe.
    pub probe: bool,
    /// Digest of the snapshot read.
    pub snapshot_sha256: Sha256Hex,
}

object!(BreakerRef {
    generation: u64,
    probe: bool,
    snapshot_sha256: doc,
});

/// What an admission did to the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetUse {
    /// A first attempt deposited its share.
    Deposit,
    /// A retry or fallback withdrew a token.
    Withdraw,
}

names!(BudgetUse {
    Deposit => "deposit",
    Withdraw => "withdraw",
});

/// The budget an attempt was admitted under. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRef {
    /// Deposit or withdraw.
    pub kind: BudgetUse,
    /// Digest of the snapshot read.
    pub snapshot_sha256: Sha256Hex,
}

object!(BudgetRef {
    kind: doc,
    snapshot_sha256: doc,
});

/// The admission limits an attempt was admitted under (or a stop refused
/// by). Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsRef {
    /// From the first ask to the admitted start (a stop: to the refusal), ms.
    pub queue_wait_ms: u64,
    /// Digest of the admission snapshot read.
    pub snapshot_sha256: Sha256Hex,
    /// The admitted start (a stop: the earliest, none when never), Unix ms.
    pub start_epoch_ms: Option<u64>,
    /// Tokens reserved (with a token bucket).
    pub tokens: Option<u64>,
}

object!(LimitsRef {
    queue_wait_ms: u64,
    snapshot_sha256: doc,
    start_epoch_ms: opt_u64,
    tokens: opt_u64,
});

/// A route skipped because its breaker refused. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// The route skipped.
    pub route_id: Identifier,
    /// Digest of its breaker snapshot read.
    pub snapshot_sha256: Sha256Hex,
}

object!(Skip {
    route_id: doc,
    snapshot_sha256: doc,
});

/// Routes skipped before an admission, in the order they were tried.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Skips(pub Vec<Skip>);

impl Decode for Skips {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_ROUTES).map(Self)
    }
}

impl Encode for Skips {
    fn encode(&self, sink: &mut dyn Sink) {
        encode_list(self.0.iter(), sink);
    }
}

/// The store could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreStatus {
    /// Unreachable, or failing.
    Unavailable,
}

names!(StoreStatus {
    Unavailable => "unavailable",
});

/// What an attempt was admitted under. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Wall clock of the admission, Unix ms.
    pub admitted_at_epoch_ms: u64,
    /// The breaker of the attempt's route.
    pub breaker: Option<BreakerRef>,
    /// The retry budget.
    pub budget: Option<BudgetRef>,
    /// The admission limits.
    pub limits: Option<LimitsRef>,
    /// Routes skipped before it (open breakers).
    pub skipped: Option<Skips>,
    /// Set when the store was unavailable and the policy fails open.
    pub store: Option<StoreStatus>,
}

object!(Admission {
    admitted_at_epoch_ms: u64,
    breaker: opt_doc,
    budget: opt_doc,
    limits: opt_doc,
    skipped: opt_doc,
    store: opt_doc,
});

/// Why the fleet stopped a run before a dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The admission limits do not admit within the queue bound, or not
    /// early enough to leave room before the deadline.
    Admission,
    /// No route's breaker admits.
    CircuitOpen,
    /// A retry or fallback the budget does not cover.
    RetryBudget,
    /// The store is unavailable and the policy fails closed.
    StoreUnavailable,
}

names!(StopReason {
    Admission => "admission",
    CircuitOpen => "circuit_open",
    RetryBudget => "retry_budget",
    StoreUnavailable => "store_unavailable",
});

/// The fleet's refusal of the next dispatch (on the attempts document).
/// Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetStop {
    /// Wall clock of the refusal, Unix ms.
    pub at_epoch_ms: u64,
    /// Run clock of the refusal, ms.
    pub at_ms: u64,
    /// The budget snapshot that refused (retry_budget).
    pub budget: Option<BudgetRef>,
    /// The admission snapshot that refused (admission).
    pub limits: Option<LimitsRef>,
    /// Why.
    pub reason: StopReason,
    /// Routes skipped (circuit_open: every route left).
    pub skipped: Option<Skips>,
}

object!(FleetStop {
    at_epoch_ms: u64,
    at_ms: u64,
    budget: opt_doc,
    limits: opt_doc,
    reason: doc,
    skipped: opt_doc,
});

/// What the fleet did to a run (in the receipt). Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetSummary {
    /// Attempts admitted without the store (`fail_open`).
    pub admitted_without_store: u64,
    /// Attempts admitted as half-open probes.
    pub probes: u64,
    /// Queue wait of every attempt, ms (with admission limits).
    pub queue_wait_ms: Option<u64>,
    /// Routes skipped because their breaker refused.
    pub routes_skipped: u64,
    /// Attempts that withdrew from the retry budget.
    pub withdrawals: u64,
}

object!(FleetSummary {
    admitted_without_store: u64,
    probes: u64,
    queue_wait_ms: opt_u64,
    routes_skipped: u64,
    withdrawals: u64,
});

/// The snapshots a bundle carries: every one an admission read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetSnapshots {
    /// Admission snapshots (omitted when none).
    pub admissions: Vec<AdmissionSnapshot>,
    /// Breaker snapshots.
    pub breakers: Vec<BreakerSnapshot>,
    /// Retry budget snapshots.
    pub budgets: Vec<RetryBudgetSnapshot>,
}

impl Decode for FleetSnapshots {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let admissions = f.opt_with("admissions", |v, at| decode_list(v, at, MAX_ATTEMPTS));
        let breakers = f.req_with("breakers", |v, at| decode_list(v, at, MAX_ATTEMPTS));
        let budgets = f.req_with("budgets", |v, at| decode_list(v, at, MAX_ATTEMPTS));
        f.end()?;
        let (Some(breakers), Some(budgets)) = (breakers, budgets) else {
            return Err(f.incomplete());
        };
        Ok(Self {
            admissions: admissions.unwrap_or_default(),
            breakers,
            budgets,
        })
    }
}

impl Encode for FleetSnapshots {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut w = crate::canonical::ObjectWriter::new(sink);
        if !self.admissions.is_empty() {
            w.list("admissions", &self.admissions);
        }
        w.list("breakers", &self.breakers)
            .list("budgets", &self.budgets)
            .end();
    }
}

impl FleetSnapshots {
    /// Keep a breaker snapshot (once); its digest.
    pub(crate) fn keep_breaker(&mut self, s: &BreakerSnapshot) -> Sha256Hex {
        let d = Sha256Hex::computed(digest_of(s));
        if !self.breakers.iter().any(|b| b == s) {
            self.breakers.push(s.clone());
        }
        d
    }

    /// Keep a budget snapshot (once); its digest.
    pub(crate) fn keep_budget(&mut self, s: &RetryBudgetSnapshot) -> Sha256Hex {
        let d = Sha256Hex::computed(digest_of(s));
        if !self.budgets.iter().any(|b| b == s) {
            self.budgets.push(s.clone());
        }
        d
    }

    /// Keep an admission snapshot (once); its digest.
    pub(crate) fn keep_admission(&mut self, s: &AdmissionSnapshot) -> Sha256Hex {
        let d = Sha256Hex::computed(digest_of(s));
        if !self.admissions.iter().any(|b| b == s) {
            self.admissions.push(s.clone());
        }
        d
    }

    fn admission(&self, d: &Sha256Hex) -> Option<&AdmissionSnapshot> {
        self.admissions.iter().find(|s| digest_of(*s) == d.as_str())
    }

    fn breaker(&self, d: &Sha256Hex) -> Option<&BreakerSnapshot> {
        self.breakers.iter().find(|s| digest_of(*s) == d.as_str())
    }

    fn budget(&self, d: &Sha256Hex) -> Option<&RetryBudgetSnapshot> {
        self.budgets.iter().find(|s| digest_of(*s) == d.as_str())
    }
}

/// What a host read from its store before a dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetView {
    /// Admission snapshots of the policy's routes, each under the key (route
    /// release) the host read it with; a route the store holds nothing for
    /// gets full buckets and nothing in flight.
    pub admission: Vec<(Sha256Hex, AdmissionSnapshot)>,
    /// Breaker snapshots of the policy's routes, each under the key (route
    /// release) the host read it with, in any order; a route the store holds
    /// nothing for gets a fresh closed breaker.
    pub breakers: Vec<(Sha256Hex, BreakerSnapshot)>,
    /// The budget snapshot (a fresh empty one when absent).
    pub budget: Option<RetryBudgetSnapshot>,
    /// Tokens the attempt reserves (its request's bound), with a token bucket.
    pub reserve_tokens: Option<u64>,
    /// The store could not be read.
    pub store_unavailable: bool,
}

/// `{release: snapshot, …}`: each snapshot under the key it was read with.
fn by_release<T>(
    v: &Value,
    at: &At<'_>,
    what: &str,
    one: fn(&Value, &At<'_>) -> Result<T>,
) -> Result<Vec<(Sha256Hex, T)>> {
    let Value::Object(map) = v else {
        return Err(at.error(
            ErrorCode::InvalidType,
            format!("expected an object of {what} snapshots by route release"),
        ));
    };
    if map.len() > MAX_ROUTES {
        return Err(at.error(
            ErrorCode::TooManyItems,
            format!("at most {MAX_ROUTES} {what} snapshots"),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, snapshot) in map {
        let here = At::Key(at, key);
        let release = Sha256Hex::parse(key).map_err(|m| here.error(ErrorCode::InvalidDigest, m))?;
        out.push((release, one(snapshot, &here)?));
    }
    Ok(out)
}

/// A view is `{"breakers": {release: snapshot, …}, "budget"?: snapshot,
/// "store_unavailable"?: bool}`: each breaker under the key it was read with.
impl Decode for FleetView {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let admission = f.opt_with("admission", |v, at| {
            by_release(v, at, "admission", AdmissionSnapshot::decode)
        });
        let breakers = f.opt_with("breakers", |v, at| {
            by_release(v, at, "breaker", BreakerSnapshot::decode)
        });
        let budget = f.opt("budget");
        let reserve_tokens = f.opt("reserve_tokens");
        let store_unavailable: Option<bool> = f.opt("store_unavailable");
        f.end()?;
        Ok(Self {
            admission: admission.unwrap_or_default(),
            breakers: breakers.unwrap_or_default(),
            budget,
            reserve_tokens,
            store_unavailable: store_unavailable.unwrap_or(false),
        })
    }
}

/// The snapshots a host writes back (compare-and-set) after an admission:
/// only those that changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetWrites {
    /// Admission snapshots to write (omitted when none).
    pub admission: Vec<AdmissionSnapshot>,
    /// Breaker snapshots to write.
    pub breakers: Vec<BreakerSnapshot>,
    /// The budget snapshot to write.
    pub budget: Option<RetryBudgetSnapshot>,
}

impl Encode for FleetWrites {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut w = crate::canonical::ObjectWriter::new(sink);
        if !self.admission.is_empty() {
            w.list("admission", &self.admission);
        }
        w.list("breakers", &self.breakers)
            .opt_doc("budget", self.budget.as_ref())
            .end();
    }
}

/// The breaker snapshot of a release in a view, or a fresh one; checked.
pub(crate) fn breaker_in(
    cfg: &BreakerConfig,
    view: &FleetView,
    release: &Sha256Hex,
    now: u64,
) -> Result<BreakerSnapshot> {
    match view.breakers.iter().find(|(key, _)| key == release) {
        Some((key, s)) => {
            s.check(cfg, release, &format!("/breakers/{}", key.as_str()))?;
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
            s.check(cfg, release, &format!("/admission/{}", key.as_str()))?;
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
    clock: &LimitsClock,
) -> LimitsStep {
    let now = clock.now_epoch_ms;
    let since = clock.since_epoch_ms;
    let (answer, next) = admission::admit(cfg, s, now, since, tokens.unwrap_or(0));
    // The run-clock time of a wall-clock instant, and whether it leaves room
    // before the deadline.
    let run_at = |t: u64| clock.at_ms.saturating_add(t.saturating_sub(now));
    let room = |t: u64| run_at(t) < clock.deadline_ms;
    let refused = |start: Option<u64>| {
        LimitsStep::Stop(LimitsRef {
            queue_wait_ms: now.saturating_sub(since),
            snapshot_sha256: digest.clone(),
            start_epoch_ms: start,
            tokens,
        })
    };
    match answer {
        LimitAnswer::Admitted { start_epoch_ms } if room(start_epoch_ms) => LimitsStep::Admitted {
            limits: LimitsRef {
                queue_wait_ms: start_epoch_ms.max(now).saturating_sub(since),
                snapshot_sha256: digest.clone(),
                start_epoch_ms: Some(start_epoch_ms),
                tokens,
            },
            write: next,
            start_at_ms: run_at(start_epoch_ms),
        },
        LimitAnswer::Wait { until_epoch_ms } if room(until_epoch_ms) => {
            LimitsStep::Wait(until_epoch_ms)
        }
        LimitAnswer::Admitted { start_epoch_ms: t } | LimitAnswer::Wait { until_epoch_ms: t } => {
            refused(Some(t))
        }
        LimitAnswer::Refused { earliest_epoch_ms } => refused(earliest_epoch_ms),
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
    let tokens = limits.tokens.unwrap_or(0);
    let fits = match stop {
        None => {
            let start = limits.start_epoch_ms.unwrap_or(0);
            let since = start.saturating_sub(limits.queue_wait_ms);
            admission::admit(cfg, s, now, since, tokens).0
                == LimitAnswer::Admitted {
                    start_epoch_ms: start,
                }
                && since <= now
        }
        Some((at_ms, deadline_ms)) => {
            let since = now.saturating_sub(limits.queue_wait_ms);
            let room = |t: u64| at_ms.saturating_add(t.saturating_sub(now)) < deadline_ms;
            match admission::admit(cfg, s, now, since, tokens).0 {
                LimitAnswer::Admitted { start_epoch_ms: t }
                | LimitAnswer::Wait { until_epoch_ms: t } => {
                    !room(t) && limits.start_epoch_ms == Some(t)
                }
                LimitAnswer::Refused { earliest_epoch_ms } => {
                    limits.start_epoch_ms == earliest_epoch_ms
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
        let now = adm.admitted_at_epoch_ms;
        if adm.store.is_some() {
            continue;
        }
        if let (Some(cfg), Some(l)) = (&fleet.admission, &adm.limits) {
            check_limits(
                cfg,
                snapshots,
                l,
                &a.route_release_sha256,
                now,
                None,
                (Some(i), &format!("{at}/limits")),
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
                    Some(i),
                    &format!("{at}/skipped/{k}"),
                )?;
            }
            if let Some(b) = &adm.breaker {
                let Some(s) = snapshots.breaker(&b.snapshot_sha256) else {
                    return Err(missing(Some(i), format!("{at}/breaker/snapshot_sha256")));
                };
                s.check(cfg, &a.route_release_sha256, &format!("{at}/breaker"))?;
                let (answer, _) = breaker::admit(cfg, s, now);
                if answer != (BreakerAdmission::Admitted { probe: b.probe })
                    || s.generation != b.generation
                {
                    return Err(drift(
                        Some(i),
                        format!("{at}/breaker"),
                        "the breaker snapshot does not give this admission".into(),
                    ));
                }
            }
        }
        if let (Some(cfg), Some(b)) = (&fleet.retry_budget, &adm.budget) {
            let Some(s) = snapshots.budget(&b.snapshot_sha256) else {
                return Err(missing(Some(i), format!("{at}/budget/snapshot_sha256")));
            };
            s.check(cfg, &format!("{at}/budget"))?;
            if b.kind == BudgetUse::Withdraw && !budget::withdraw(cfg, s, now).0 {
                return Err(drift(
                    Some(i),
                    format!("{at}/budget"),
                    "the budget snapshot does not cover this withdrawal".into(),
                ));
            }
        }
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
