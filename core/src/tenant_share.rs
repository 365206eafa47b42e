//! Fair tenant shares of a route's admission limits: per-tenant weights over
//! one shared request bucket, kept in the route's `retryledger.admission.v1`
//! snapshot (its `tenants` list), so the store still holds one register per
//! route release.
//!
//! A call names its tenant; the policy lists the tenants and their weights
//! (`tenant_weights`). A tenant is *active* while its share clock
//! (`due_at_epoch_ms`, the time its share has paid for its admissions, the
//! theoretical arrival time of a GCRA) is no more than [`TENANT_IDLE_MS`]
//! behind now. Among the active tenants (the asking one included) of total
//! weight `W`, a tenant of weight `w` is owed `requests_per_second * w / W`
//! requests per second: one every `interval = ceil(1000 * W /
//! (requests_per_second * w))` ms, with a burst of `max(1, request_burst * w
//! / W)` requests (`tolerance = (burst - 1) * interval`).
//!
//! - **Under its share** (`due <= now + tolerance`): admitted like any
//!   admission (the shared buckets may plan a later start within the queue
//!   bound); its clock moves to `max(due, now) + interval`.
//! - **Over its share, capacity idle** (the shared buckets cover the request
//!   now, nothing reserved ahead): the unused share of the others is lent:
//!   admitted now, its clock unchanged.
//! - **Over its share while others want capacity** (the buckets are empty
//!   now or reserved into the future by tenants under their shares): it
//!   reserves nothing and waits until its share or the buckets cover it,
//!   whichever comes first; when that is beyond the queue bound the answer
//!   is a refusal with the reason `tenant_over_share`.
//!
//! So a tenant under its share is never queued behind a tenant over it (a
//! tenant reserves the bucket's future only on its share, at most its
//! tolerance ahead, so the queue ahead of any tenant stays within about one
//! interval of each active tenant), and capacity no active tenant claims
//! goes to whoever asks. A tenant alone is owed the whole rate; asking
//! faster, it waits like any tenant over its share rather than filling the
//! bucket's queue.

use crate::canonical::{encode_list, Encode, Sink};
use crate::decode::{decode_list, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Identifier;

/// Most tenants a policy lists (and a snapshot holds).
pub const MAX_TENANTS: usize = 64;
/// Largest weight.
pub const MAX_WEIGHT: u64 = 1_000;
/// A tenant whose share clock is this far behind now is idle: it leaves the
/// snapshot and its weight no longer divides the rate, ms.
pub const TENANT_IDLE_MS: u64 = 1_000;

/// One tenant's weight. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWeight {
    /// The tenant.
    pub tenant: Identifier,
    /// Its weight, 1..=[`MAX_WEIGHT`].
    pub weight: u64,
}

object!(TenantWeight {
    tenant: doc,
    weight: u64,
});

/// The tenants of a policy's admission limits and their weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWeights(pub Vec<TenantWeight>);

impl Decode for TenantWeights {
    fn decode(v: &serde_json::Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_TENANTS).map(Self)
    }
}

impl Encode for TenantWeights {
    fn encode(&self, sink: &mut dyn Sink) {
        encode_list(self.0.iter(), sink);
    }
}

impl TenantWeights {
    /// Check the list; `at` is its pointer.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |i: usize, field: &str, msg: &str| {
            Err(Error::at(
                ErrorCode::InvalidAdmission,
                format!("{at}/{i}/{field}"),
                msg.to_owned(),
            ))
        };
        if self.0.is_empty() {
            return Err(Error::at(
                ErrorCode::InvalidAdmission,
                at,
                "tenant_weights lists at least one tenant",
            ));
        }
        for (i, w) in self.0.iter().enumerate() {
            if !(1..=MAX_WEIGHT).contains(&w.weight) {
                return bad(i, "weight", "a tenant's weight must be in 1..=1000");
            }
            if self.0.iter().take(i).any(|o| o.tenant == w.tenant) {
                return bad(i, "tenant", "a tenant is listed once");
            }
        }
        Ok(())
    }

    /// A tenant's weight, if listed.
    pub fn weight(&self, tenant: &Identifier) -> Option<u64> {
        self.0
            .iter()
            .find(|w| &w.tenant == tenant)
            .map(|w| w.weight)
    }
}

/// One active tenant's share clock in a route's snapshot. Fields in
/// canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDue {
    /// When its share has paid for its admissions so far, Unix ms.
    pub due_at_epoch_ms: u64,
    /// The tenant.
    pub tenant: Identifier,
}

object!(TenantDue {
    due_at_epoch_ms: u64,
    tenant: doc,
});

/// The active tenants of a route, sorted by tenant (omitted when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDues(pub Vec<TenantDue>);

impl Decode for TenantDues {
    fn decode(v: &serde_json::Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_TENANTS).map(Self)
    }
}

impl Encode for TenantDues {
    fn encode(&self, sink: &mut dyn Sink) {
        encode_list(self.0.iter(), sink);
    }
}

impl TenantDues {
    /// Check the list against the policy's tenants; `at` is its pointer.
    pub fn check(&self, weights: Option<&TenantWeights>, at: &str) -> Result<()> {
        let bad = |path: String, msg: &str| {
            Err(Error::at(ErrorCode::InvalidSnapshot, path, msg.to_owned()))
        };
        let Some(weights) = weights else {
            return bad(
                at.to_owned(),
                "tenant shares without tenant_weights in the limits",
            );
        };
        if self.0.is_empty() {
            return bad(at.to_owned(), "an empty tenants list is omitted");
        }
        for (i, d) in self.0.iter().enumerate() {
            if weights.weight(&d.tenant).is_none() {
                return bad(
                    format!("{at}/{i}/tenant"),
                    "a tenant the limits do not list",
                );
            }
            if i > 0
                && self
                    .0
                    .get(i.saturating_sub(1))
                    .is_some_and(|p| p.tenant >= d.tenant)
            {
                return bad(
                    format!("{at}/{i}/tenant"),
                    "tenants are sorted by name, each once",
                );
            }
        }
        Ok(())
    }
}

/// `a / b` rounded up (`u64::MAX` for `b` 0).
fn ceil_div(a: u64, b: u64) -> u64 {
    match (a.checked_div(b), a.checked_rem(b)) {
        (Some(q), Some(0)) => q,
        (Some(q), Some(_)) => q.saturating_add(1),
        _ => u64::MAX,
    }
}

/// Where a tenant stands at `now` under a route's shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Its share clock (now when it was idle).
    pub due_at_epoch_ms: u64,
    /// Ms between two requests of its share.
    pub interval_ms: u64,
    /// How far ahead of now its clock may be and still be under its share.
    pub tolerance_ms: u64,
    /// The active tenants, the asking one included, sorted.
    pub active: Vec<TenantDue>,
}

impl Standing {
    /// The standing of `tenant` (listed in `weights`) at `now`, in a route
    /// whose snapshot lists `dues`, with a request bucket of `rate` per
    /// second and `burst` requests.
    pub fn of(
        weights: &TenantWeights,
        dues: Option<&TenantDues>,
        tenant: &Identifier,
        now: u64,
        rate: u64,
        burst: u64,
    ) -> Self {
        let mut active: Vec<TenantDue> = dues
            .map(|d| d.0.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|d| d.due_at_epoch_ms.saturating_add(TENANT_IDLE_MS) >= now)
            .cloned()
            .collect();
        let due = match active.iter().find(|d| &d.tenant == tenant) {
            Some(d) => d.due_at_epoch_ms,
            None => {
                active.push(TenantDue {
                    due_at_epoch_ms: now,
                    tenant: tenant.clone(),
                });
                active.sort_by(|a, b| a.tenant.cmp(&b.tenant));
                now
            }
        };
        let total: u64 = active
            .iter()
            .map(|d| weights.weight(&d.tenant).unwrap_or(1))
            .fold(0, u64::saturating_add);
        let w = weights.weight(tenant).unwrap_or(1).max(1);
        let interval_ms = ceil_div(total.saturating_mul(1_000), rate.saturating_mul(w)).max(1);
        let share_burst = burst
            .saturating_mul(w)
            .checked_div(total)
            .unwrap_or(1)
            .max(1);
        Self {
            due_at_epoch_ms: due,
            interval_ms,
            tolerance_ms: share_burst.saturating_sub(1).saturating_mul(interval_ms),
            active,
        }
    }

    /// Whether the tenant is under its share at `now`.
    pub fn under(&self, now: u64) -> bool {
        self.due_at_epoch_ms <= now.saturating_add(self.tolerance_ms)
    }

    /// When its share covers a request again, Unix ms.
    pub fn covered_at(&self) -> u64 {
        self.due_at_epoch_ms.saturating_sub(self.tolerance_ms)
    }

    /// The active tenants after an admission at `now` (`charged`: on its
    /// share, which moves its clock by one interval; else lent).
    pub fn after(&self, tenant: &Identifier, now: u64, charged: bool) -> TenantDues {
        let mut active = self.active.clone();
        if charged {
            for d in active.iter_mut().filter(|d| &d.tenant == tenant) {
                d.due_at_epoch_ms = d.due_at_epoch_ms.max(now).saturating_add(self.interval_ms);
            }
        }
        TenantDues(active)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn id(s: &str) -> Identifier {
        Identifier::parse(s).unwrap()
    }

    fn weights() -> TenantWeights {
        TenantWeights(vec![
            TenantWeight {
                tenant: id("a"),
                weight: 1,
            },
            TenantWeight {
                tenant: id("b"),
                weight: 3,
            },
        ])
    }

    #[test]
    fn shares_divide_the_rate_among_active_tenants_by_weight() {
        let w = weights();
        // Alone: the whole rate, 20 per second.
        let s = Standing::of(&w, None, &id("a"), 1_000, 20, 1);
        assert_eq!((s.interval_ms, s.tolerance_ms), (50, 0));
        assert!(s.under(1_000));
        let dues = s.after(&id("a"), 1_000, true);
        assert_eq!(dues.0[0].due_at_epoch_ms, 1_050);
        // With b active, a is owed a quarter: one every 200 ms.
        let both = TenantDues(vec![
            dues.0[0].clone(),
            TenantDue {
                due_at_epoch_ms: 1_000,
                tenant: id("b"),
            },
        ]);
        let s = Standing::of(&w, Some(&both), &id("a"), 1_010, 20, 1);
        assert_eq!(s.interval_ms, 200);
        assert_eq!(s.active.len(), 2);
        assert!(!s.under(1_010));
        assert_eq!(s.covered_at(), 1_050);
        // b idle for more than TENANT_IDLE_MS: a alone again.
        let s = Standing::of(&w, Some(&both), &id("a"), 2_001, 20, 1);
        assert_eq!((s.interval_ms, s.active.len()), (50, 1));
    }

    /// A route of 20 requests per second (burst 1) shared by four tenants
    /// of weight 1 for 10 s: three ask exactly their share (one every 200
    /// ms, a wait asked again at its time), the fourth every millisecond.
    /// Each quiet tenant is admitted at least 95 % of its share, the noisy
    /// one gets what is left, and the starts never exceed the bucket.
    #[test]
    fn a_noisy_tenant_starves_no_tenant_under_its_share() {
        use crate::admission::{admit_as, AdmissionConfig, AdmissionSnapshot, LimitAnswer};
        use crate::ids::Sha256Hex;
        let names = ["noisy", "q1", "q2", "q3"];
        let cfg = AdmissionConfig {
            in_flight_lease_ms: None,
            max_in_flight: None,
            max_queue_ms: 500,
            principal: None,
            request_burst: Some(1),
            requests_per_second: Some(20),
            tenant: None,
            tenant_weights: Some(TenantWeights(
                names
                    .iter()
                    .map(|n| TenantWeight {
                        tenant: id(n),
                        weight: 1,
                    })
                    .collect(),
            )),
            token_bound: None,
            tokens_per_second: None,
        };
        let mut snap =
            AdmissionSnapshot::fresh(&cfg, Sha256Hex::parse(&"ab".repeat(32)).unwrap(), 0);
        // Per tenant: the next ask (ms), when it first asked, starts admitted.
        let mut next = [0u64, 0, 70, 140];
        let mut since = next;
        let mut starts: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
        let mut refused = [0u64; 4];
        for now in 0..10_000u64 {
            for (i, name) in names.iter().enumerate() {
                if next[i] != now {
                    continue;
                }
                let t = id(name);
                let (answer, after) = admit_as(&cfg, &snap, now, since[i], 0, Some(&t));
                let period = if i == 0 { 1 } else { 200 };
                match answer {
                    LimitAnswer::Admitted { start_epoch_ms } => {
                        starts[i].push(start_epoch_ms);
                        snap = after;
                        next[i] = (since[i] + period).max(now + 1);
                        since[i] = next[i];
                    }
                    LimitAnswer::Wait { until_epoch_ms }
                    | LimitAnswer::OverShare { until_epoch_ms } => {
                        next[i] = if i == 0 { now + 1 } else { until_epoch_ms };
                        if i == 0 {
                            since[i] = next[i];
                        }
                    }
                    LimitAnswer::Refused { .. } | LimitAnswer::RefusedOverShare { .. } => {
                        refused[i] += 1;
                        next[i] = (since[i] + period).max(now + 1);
                        since[i] = next[i];
                    }
                }
            }
        }
        for (i, s) in starts.iter().enumerate().skip(1) {
            assert!(
                s.len() >= 48,
                "{}: {} starts, refused {}",
                names[i],
                s.len(),
                refused[i]
            );
        }
        assert!(starts[0].len() >= 40, "noisy: {}", starts[0].len());
        let mut all: Vec<u64> = starts.concat();
        all.sort_unstable();
        // At most 1 + 20 per second in any window.
        for (k, t) in all.iter().enumerate() {
            let within = all[k..].iter().take_while(|u| **u < t + 1_000).count() as u64;
            assert!(within <= 21, "{within} starts in the second from {t}");
        }
    }

    #[test]
    fn bad_weights_have_codes() {
        let e = TenantWeights(vec![]).check("/w").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidAdmission);
        let mut w = weights();
        w.0[1].tenant = id("a");
        assert_eq!(
            w.check("/w").unwrap_err().path.as_deref(),
            Some("/w/1/tenant")
        );
        let mut w = weights();
        w.0[0].weight = 0;
        assert_eq!(
            w.check("/w").unwrap_err().path.as_deref(),
            Some("/w/0/weight")
        );
    }
}
