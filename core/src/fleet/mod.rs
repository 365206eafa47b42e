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
