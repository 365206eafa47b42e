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

use crate::admission::{AdmissionConfig, AdmissionSnapshot};
use crate::breaker::{BreakerConfig, BreakerSnapshot};
use crate::budget::{RetryBudgetConfig, RetryBudgetSnapshot};
use crate::canonical::{digest_of, encode_list, Encode, Sink};
use crate::decode::{decode_list, names, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{Identifier, Sha256Hex};
use crate::limits::{MAX_ATTEMPTS, MAX_ROUTES};

mod admit;
mod verify;

pub(crate) use admit::{
    admission_in, breaker_after_attempt, breaker_in, budget_admission, budget_in, limits_step,
    reserved_tokens, tenant_in, Generations, LimitsClock, LimitsStep,
};
pub use verify::verify_admissions;
pub(crate) use verify::{check_carried, check_stop_carried};

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
    /// Key pools a route may name (`key_pool`): one provider's API keys,
    /// each with its own health ([`crate::keypool`]).
    pub key_pools: Option<crate::keypool::KeyPools>,
    /// What happens when the store is unreachable.
    pub on_store_unavailable: OnStoreUnavailable,
    /// A retry budget shared by every run of its scope.
    pub retry_budget: Option<RetryBudgetConfig>,
}

object!(FleetConfig {
    admission: opt_doc,
    breaker: opt_doc,
    key_pools: opt_doc,
    on_store_unavailable: doc,
    retry_budget: opt_doc,
});

impl FleetConfig {
    /// Check the section.
    pub(crate) fn check(&self) -> Result<()> {
        if self.breaker.is_none()
            && self.retry_budget.is_none()
            && self.admission.is_none()
            && self.key_pools.is_none()
        {
            return Err(Error::at(
                ErrorCode::InvalidBreaker,
                "/fleet",
                "a fleet section needs a breaker, a retry budget, admission limits, key pools, or more than one",
            ));
        }
        if let Some(p) = &self.key_pools {
            p.check("/fleet/key_pools")?;
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

/// Why admission limits refused, when it is more than the queue bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The tenant is over its share while others want the capacity
    /// ([`crate::tenant_share`]; the code [`ErrorCode::TenantOverShare`]).
    TenantOverShare,
}

names!(Refusal {
    TenantOverShare => "tenant_over_share",
});

/// The admission limits an attempt was admitted under (or a stop refused
/// by). Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsRef {
    /// From the first ask to the admitted start (a stop: to the refusal), ms.
    pub queue_wait_ms: u64,
    /// A stop's reason beyond the queue bound (`tenant_over_share`).
    pub refusal: Option<Refusal>,
    /// Digest of the admission snapshot read.
    pub snapshot_sha256: Sha256Hex,
    /// The admitted start (a stop: the earliest, none when never), Unix ms.
    pub start_epoch_ms: Option<u64>,
    /// The call's tenant, under tenant shares.
    pub tenant: Option<Identifier>,
    /// Tokens reserved (with a token bucket).
    pub tokens: Option<u64>,
}

object!(LimitsRef {
    queue_wait_ms: u64,
    refusal: opt_doc,
    snapshot_sha256: doc,
    start_epoch_ms: opt_u64,
    tenant: opt_doc,
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
    /// The key of its route's key pool it was sent with (a digest, never
    /// the secret); absent when the route names no pool, so existing
    /// digests are unchanged.
    pub key: Option<crate::keypool::KeyRef>,
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
    key: opt_doc,
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
    /// The planned route's key pool has no usable key: every key is
    /// disabled, or the first to clear does so at or after the deadline.
    NoUsableKey,
}

names!(StopReason {
    Admission => "admission",
    CircuitOpen => "circuit_open",
    RetryBudget => "retry_budget",
    StoreUnavailable => "store_unavailable",
    NoUsableKey => "no_usable_key",
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
    /// The key pool that had no usable key (no_usable_key).
    pub key_pool: Option<Identifier>,
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
    key_pool: opt_doc,
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
///
/// A run keeps each snapshot once, with its digest (computed once, when the
/// snapshot is first kept): an admission under a snapshot already kept
/// hashes nothing. The digests are a cache of what the run hashed, each
/// beside a copy of the snapshot it is the digest of, so a list changed
/// after the fact is hashed again rather than trusted; a decoded document
/// has none, and its look-ups hash what it carries.
#[derive(Debug, Clone, Default)]
pub struct FleetSnapshots {
    /// Admission snapshots (omitted when none).
    pub admissions: Vec<AdmissionSnapshot>,
    /// Breaker snapshots.
    pub breakers: Vec<BreakerSnapshot>,
    /// Retry budget snapshots.
    pub budgets: Vec<RetryBudgetSnapshot>,
    /// Each snapshot hashed, with its digest.
    digests: Kept,
}

/// The snapshots a run hashed, with their digests, list by list.
#[derive(Debug, Clone, Default)]
struct Kept {
    admissions: Vec<(AdmissionSnapshot, Sha256Hex)>,
    breakers: Vec<(BreakerSnapshot, Sha256Hex)>,
    budgets: Vec<(RetryBudgetSnapshot, Sha256Hex)>,
}

/// The documents alone: two values carrying the same snapshots are equal
/// whatever digests either has cached.
impl PartialEq for FleetSnapshots {
    fn eq(&self, other: &Self) -> bool {
        self.admissions == other.admissions
            && self.breakers == other.breakers
            && self.budgets == other.budgets
    }
}

impl Eq for FleetSnapshots {}

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
            digests: Kept::default(),
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

/// The digest of `s`: the one hashed before for an equal snapshot, else
/// computed now.
fn digest_in<T: Encode + PartialEq>(kept: &[(T, Sha256Hex)], s: &T) -> Sha256Hex {
    kept.iter()
        .find(|(k, _)| k == s)
        .map_or_else(|| Sha256Hex::computed(digest_of(s)), |(_, d)| d.clone())
}

/// Keep `s` in `list` once; its digest, hashed only when no equal snapshot
/// was (`digest` when the caller has it).
fn keep<T: Encode + PartialEq + Clone>(
    list: &mut Vec<T>,
    kept: &mut Vec<(T, Sha256Hex)>,
    s: &T,
    digest: Option<Sha256Hex>,
) -> Sha256Hex {
    let known = kept.iter().find(|(k, _)| k == s).map(|(_, d)| d.clone());
    let d = match (known, digest) {
        (Some(d), _) => d,
        (None, digest) => {
            let d = digest.unwrap_or_else(|| Sha256Hex::computed(digest_of(s)));
            kept.push((s.clone(), d.clone()));
            d
        }
    };
    if !list.iter().any(|k| k == s) {
        list.push(s.clone());
    }
    d
}

/// The snapshot of `list` whose digest is `d`.
fn find<'a, T: Encode + PartialEq>(
    list: &'a [T],
    kept: &[(T, Sha256Hex)],
    d: &Sha256Hex,
) -> Option<&'a T> {
    list.iter().find(|s| digest_in(kept, *s) == *d)
}

impl FleetSnapshots {
    /// Keep a breaker snapshot (once); its digest.
    pub(crate) fn keep_breaker(&mut self, s: &BreakerSnapshot) -> Sha256Hex {
        keep(&mut self.breakers, &mut self.digests.breakers, s, None)
    }

    /// Keep a budget snapshot (once); its digest.
    pub(crate) fn keep_budget(&mut self, s: &RetryBudgetSnapshot) -> Sha256Hex {
        keep(&mut self.budgets, &mut self.digests.budgets, s, None)
    }

    /// Keep an admission snapshot (once); its digest.
    pub(crate) fn keep_admission(&mut self, s: &AdmissionSnapshot) -> Sha256Hex {
        keep(&mut self.admissions, &mut self.digests.admissions, s, None)
    }

    /// Keep every snapshot of `other` (each once), with the digests it
    /// has hashed.
    pub(crate) fn keep_all(&mut self, other: &Self) {
        for s in &other.breakers {
            let d = digest_in(&other.digests.breakers, s);
            keep(&mut self.breakers, &mut self.digests.breakers, s, Some(d));
        }
        for s in &other.budgets {
            let d = digest_in(&other.digests.budgets, s);
            keep(&mut self.budgets, &mut self.digests.budgets, s, Some(d));
        }
        for s in &other.admissions {
            let d = digest_in(&other.digests.admissions, s);
            keep(
                &mut self.admissions,
                &mut self.digests.admissions,
                s,
                Some(d),
            );
        }
    }

    /// The snapshots `admission` names, from those kept: its skipped
    /// routes' breakers then its route's (each once), its budget, its
    /// admission limits — what a journal's `dispatched` event of its
    /// attempt carries. `None` when it names none (admitted without the
    /// store, or by no layer that reads one); a snapshot not kept here is
    /// left out (the journal then refuses the event, `snapshot_missing`).
    pub fn named_by(&self, admission: &Admission) -> Option<Self> {
        self.picked(Named::of(admission))
    }

    /// The snapshots a fleet stop names, from those kept: its skipped
    /// routes' breakers (each once), its budget, its admission limits —
    /// what the journal's `terminal` event carries. `None` when it names
    /// none.
    pub fn named_by_stop(&self, stop: &FleetStop) -> Option<Self> {
        self.picked(Named::of_stop(stop))
    }

    fn picked(&self, named: Named) -> Option<Self> {
        if named.is_empty() {
            return None;
        }
        let mut out = Self::default();
        for d in &named.breakers {
            if let Some(s) = self.breaker(d) {
                keep(
                    &mut out.breakers,
                    &mut out.digests.breakers,
                    s,
                    Some(d.clone()),
                );
            }
        }
        for d in &named.budgets {
            if let Some(s) = self.budget(d) {
                keep(
                    &mut out.budgets,
                    &mut out.digests.budgets,
                    s,
                    Some(d.clone()),
                );
            }
        }
        for d in &named.admissions {
            if let Some(s) = self.admission(d) {
                keep(
                    &mut out.admissions,
                    &mut out.digests.admissions,
                    s,
                    Some(d.clone()),
                );
            }
        }
        Some(out)
    }

    /// The digest of every snapshot carried, list by list.
    fn digests(&self) -> Named {
        Named {
            breakers: self
                .breakers
                .iter()
                .map(|s| digest_in(&self.digests.breakers, s))
                .collect(),
            budgets: self
                .budgets
                .iter()
                .map(|s| digest_in(&self.digests.budgets, s))
                .collect(),
            admissions: self
                .admissions
                .iter()
                .map(|s| digest_in(&self.digests.admissions, s))
                .collect(),
        }
    }

    fn admission(&self, d: &Sha256Hex) -> Option<&AdmissionSnapshot> {
        find(&self.admissions, &self.digests.admissions, d)
    }

    fn breaker(&self, d: &Sha256Hex) -> Option<&BreakerSnapshot> {
        find(&self.breakers, &self.digests.breakers, d)
    }

    fn budget(&self, d: &Sha256Hex) -> Option<&RetryBudgetSnapshot> {
        find(&self.budgets, &self.digests.budgets, d)
    }
}

/// The snapshot digests an admission names, list by list, each once, in
/// the order it names them.
#[derive(Debug, Default, PartialEq, Eq)]
struct Named {
    breakers: Vec<Sha256Hex>,
    budgets: Vec<Sha256Hex>,
    admissions: Vec<Sha256Hex>,
}

impl Named {
    fn of(a: &Admission) -> Self {
        let mut n = Self::default();
        if a.store.is_some() {
            return n;
        }
        let skipped = a.skipped.iter().flat_map(|s| s.0.iter());
        for d in skipped
            .map(|s| &s.snapshot_sha256)
            .chain(a.breaker.as_ref().map(|b| &b.snapshot_sha256))
        {
            if !n.breakers.contains(d) {
                n.breakers.push(d.clone());
            }
        }
        n.budgets
            .extend(a.budget.as_ref().map(|b| b.snapshot_sha256.clone()));
        n.admissions
            .extend(a.limits.as_ref().map(|l| l.snapshot_sha256.clone()));
        n
    }

    fn of_stop(stop: &FleetStop) -> Self {
        let mut n = Self::default();
        for s in stop.skipped.iter().flat_map(|s| s.0.iter()) {
            if !n.breakers.contains(&s.snapshot_sha256) {
                n.breakers.push(s.snapshot_sha256.clone());
            }
        }
        n.budgets
            .extend(stop.budget.as_ref().map(|b| b.snapshot_sha256.clone()));
        n.admissions
            .extend(stop.limits.as_ref().map(|l| l.snapshot_sha256.clone()));
        n
    }

    fn is_empty(&self) -> bool {
        self.breakers.is_empty() && self.budgets.is_empty() && self.admissions.is_empty()
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
    /// The call's tenant, under tenant shares.
    pub tenant: Option<Identifier>,
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
        let tenant = f.opt("tenant");
        f.end()?;
        Ok(Self {
            admission: admission.unwrap_or_default(),
            breakers: breakers.unwrap_or_default(),
            budget,
            reserve_tokens,
            store_unavailable: store_unavailable.unwrap_or(false),
            tenant,
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
