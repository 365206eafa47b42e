//! Admission limits: attempts in flight and request / token rates per route
//! release (and, when the policy names them, per tenant and principal),
//! shared across runs in a `retryledger.admission.v1` snapshot.
//!
//! Integers only. The request bucket holds `request_burst` requests and
//! refills `requests_per_second`; the token bucket holds `token_bound` tokens
//! and refills `tokens_per_second`. Levels are in milli-units, so a rate of
//! `r` per second refills `r` milli-units per millisecond. An admission that
//! the buckets cannot cover now reserves its share at the earliest time they
//! will (the bucket's `*_at_epoch_ms` moves into the future: the queue's
//! tail), so a queued dispatch learns its start in the same step, like a
//! backoff. An admission whose earliest start lies beyond `max_queue_ms`
//! after it first asked is refused; so is a token reservation above the
//! bound. A full in-flight cap cannot be planned (it waits for a release):
//! the answer is to ask again [`IN_FLIGHT_POLL_MS`] later, within the same
//! queue bound. Each admission holds one in-flight slot until
//! [`release`], which also settles the reserved tokens with the usage the
//! response reported. With `in_flight_lease_ms`, a full cap whose snapshot
//! saw no admission and no release for that long is presumed to hold the
//! slots of processes that died before releasing: the count starts over. Pure like the breaker: a store only holds the
//! snapshot, and time never goes back for it. With `tenant_weights` the
//! route's request rate is shared fairly by the tenants that call it
//! ([`admit_as`], [`crate::tenant_share`]).

use crate::decode::object;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::tenant_share::{Standing, TenantDues, TenantWeights};

schema_marker!(
    /// `retryledger.admission.v1`
    AdmissionSchema = "retryledger.admission.v1"
);

/// Largest `max_in_flight` and `request_burst`, and largest rate per second.
pub const MAX_LIMIT: u64 = 1_000_000;
/// Largest `token_bound` (and token rate per second).
pub const MAX_TOKENS: u64 = 1_000_000_000_000;
/// Largest `max_queue_ms`: one day.
pub const MAX_QUEUE_MS: u64 = 86_400_000;
/// How long a dispatch held back by a full in-flight cap waits before it
/// asks again, ms.
pub const IN_FLIGHT_POLL_MS: u64 = 20;
/// Milli-units per unit.
const MILLI: u64 = 1_000;

/// A policy's admission limits (the same for every route release). Fields
/// in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// A full in-flight cap unchanged (no admission, no release) for this
    /// long is presumed lost and starts over, ms.
    pub in_flight_lease_ms: Option<u64>,
    /// Attempts in flight at once.
    pub max_in_flight: Option<u64>,
    /// The queue bound: the longest an attempt waits to be admitted, ms.
    pub max_queue_ms: u64,
    /// Scope the limits to this principal (of `tenant`).
    pub principal: Option<Identifier>,
    /// Requests the request bucket holds.
    pub request_burst: Option<u64>,
    /// Requests per second the request bucket refills.
    pub requests_per_second: Option<u64>,
    /// Scope the limits to this tenant.
    pub tenant: Option<Identifier>,
    /// Fair tenant shares of the route's request bucket: the tenants and
    /// their weights ([`crate::tenant_share`]); each call names its tenant.
    pub tenant_weights: Option<TenantWeights>,
    /// Tokens the token bucket holds.
    pub token_bound: Option<u64>,
    /// Tokens per second the token bucket refills.
    pub tokens_per_second: Option<u64>,
}

object!(AdmissionConfig {
    in_flight_lease_ms: opt_u64,
    max_in_flight: opt_u64,
    max_queue_ms: u64,
    principal: opt_doc,
    request_burst: opt_u64,
    requests_per_second: opt_u64,
    tenant: opt_doc,
    tenant_weights: opt_doc,
    token_bound: opt_u64,
    tokens_per_second: opt_u64,
});

impl AdmissionConfig {
    /// Check the configuration; `at` is its JSON Pointer in the policy.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |field: &str, msg: &str| {
            Err(Error::at(
                ErrorCode::InvalidAdmission,
                format!("{at}/{field}"),
                msg.to_owned(),
            ))
        };
        let in_range = |v: Option<u64>, max: u64| v.is_none_or(|v| (1..=max).contains(&v));
        if !in_range(self.max_in_flight, MAX_LIMIT) {
            return bad("max_in_flight", "max_in_flight must be in 1..=1000000");
        }
        if !in_range(self.in_flight_lease_ms, MAX_QUEUE_MS) {
            return bad(
                "in_flight_lease_ms",
                "in_flight_lease_ms must be in 1..=86400000",
            );
        }
        if self.in_flight_lease_ms.is_some() && self.max_in_flight.is_none() {
            return bad(
                "in_flight_lease_ms",
                "an in-flight lease needs max_in_flight",
            );
        }
        if self.max_queue_ms == 0 || self.max_queue_ms > MAX_QUEUE_MS {
            return bad(
                "max_queue_ms",
                "the queue bound max_queue_ms must be in 1..=86400000",
            );
        }
        if !in_range(self.requests_per_second, MAX_LIMIT) {
            return bad(
                "requests_per_second",
                "requests_per_second must be in 1..=1000000",
            );
        }
        if !in_range(self.request_burst, MAX_LIMIT) {
            return bad("request_burst", "request_burst must be in 1..=1000000");
        }
        if self.requests_per_second.is_some() != self.request_burst.is_some() {
            return bad(
                "request_burst",
                "requests_per_second and request_burst go together",
            );
        }
        if !in_range(self.tokens_per_second, MAX_TOKENS) {
            return bad(
                "tokens_per_second",
                "tokens_per_second must be in 1..=1000000000000",
            );
        }
        if !in_range(self.token_bound, MAX_TOKENS) {
            return bad("token_bound", "token_bound must be in 1..=1000000000000");
        }
        if self.tokens_per_second.is_some() && self.token_bound.is_none() {
            return bad("token_bound", "a token rate needs a token bound");
        }
        if self.token_bound.is_some() && self.tokens_per_second.is_none() {
            return bad("tokens_per_second", "a token bound needs a token rate");
        }
        if self.principal.is_some() && self.tenant.is_none() {
            return bad("principal", "a principal is scoped within a tenant");
        }
        if let Some(w) = &self.tenant_weights {
            w.check(&format!("{at}/tenant_weights"))?;
            if self.tenant.is_some() {
                return bad(
                    "tenant_weights",
                    "tenant shares divide one route's limits: the call names its tenant, the limits name none",
                );
            }
            if self.requests_per_second.is_none() {
                return bad(
                    "tenant_weights",
                    "tenant shares divide the request rate: requests_per_second is needed",
                );
            }
        }
        if self.max_in_flight.is_none()
            && self.requests_per_second.is_none()
            && self.tokens_per_second.is_none()
        {
            return bad(
                "max_in_flight",
                "admission needs max_in_flight, a request rate or a token rate",
            );
        }
        Ok(())
    }

    /// Whether admissions reserve tokens (a token bucket is set).
    pub fn counts_tokens(&self) -> bool {
        self.token_bound.is_some()
    }

    fn request_bucket(&self) -> Option<(u64, u64)> {
        Some((
            self.requests_per_second?,
            self.request_burst?.saturating_mul(MILLI),
        ))
    }

    fn token_bucket(&self) -> Option<(u64, u64)> {
        Some((
            self.tokens_per_second?,
            self.token_bound?.saturating_mul(MILLI),
        ))
    }
}

/// The admission state of one route release (and tenant, principal).
/// Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    /// Raised on every change.
    pub generation: u64,
    /// Attempts admitted and not yet released.
    pub in_flight: u64,
    /// The principal of the key, when the policy scopes by one.
    pub principal: Option<Identifier>,
    /// The request bucket's level at `requests_at_epoch_ms`, milli-requests.
    pub request_level_milli: u64,
    /// When the request bucket had that level (later than now: reserved up
    /// to then), Unix ms.
    pub requests_at_epoch_ms: u64,
    /// The route release of the key.
    pub route_release_sha256: Sha256Hex,
    /// `retryledger.admission.v1`
    pub schema: AdmissionSchema,
    /// The tenant of the key, when the policy scopes by one.
    pub tenant: Option<Identifier>,
    /// The active tenants' share clocks, under tenant shares (omitted when
    /// none).
    pub tenants: Option<TenantDues>,
    /// The token bucket's level at `tokens_at_epoch_ms`, milli-tokens.
    pub token_level_milli: u64,
    /// When the token bucket had that level, Unix ms.
    pub tokens_at_epoch_ms: u64,
    /// The latest time it saw, Unix ms.
    pub updated_at_epoch_ms: u64,
}

object!(AdmissionSnapshot {
    generation: u64,
    in_flight: u64,
    principal: opt_doc,
    request_level_milli: u64,
    requests_at_epoch_ms: u64,
    route_release_sha256: doc,
    schema: doc,
    tenant: opt_doc,
    tenants: opt_doc,
    token_level_milli: u64,
    tokens_at_epoch_ms: u64,
    updated_at_epoch_ms: u64,
});

impl AdmissionSnapshot {
    /// Full buckets and nothing in flight, for a key the store does not hold.
    pub fn fresh(cfg: &AdmissionConfig, release: Sha256Hex, now_epoch_ms: u64) -> Self {
        Self {
            generation: 0,
            in_flight: 0,
            principal: cfg.principal.clone(),
            request_level_milli: cfg.request_bucket().map_or(0, |(_, cap)| cap),
            requests_at_epoch_ms: now_epoch_ms,
            route_release_sha256: release,
            schema: AdmissionSchema,
            tenant: cfg.tenant.clone(),
            tenants: None,
            token_level_milli: cfg.token_bucket().map_or(0, |(_, cap)| cap),
            tokens_at_epoch_ms: now_epoch_ms,
            updated_at_epoch_ms: now_epoch_ms,
        }
    }

    /// The store key's tail: the release, then tenant and principal when set.
    pub fn key(&self) -> String {
        key_of(
            &self.route_release_sha256,
            self.tenant.as_ref(),
            self.principal.as_ref(),
        )
    }

    /// Check the snapshot against its configuration and key; `at` is its pointer.
    pub fn check(&self, cfg: &AdmissionConfig, release: &Sha256Hex, at: &str) -> Result<()> {
        if &self.route_release_sha256 != release
            || self.tenant != cfg.tenant
            || self.principal != cfg.principal
        {
            return Err(Error::at(
                ErrorCode::SnapshotKeyMismatch,
                format!("{at}/route_release_sha256"),
                "the snapshot is another route release's (or tenant's, or principal's) admission",
            ));
        }
        let over = |level: u64, bucket: Option<(u64, u64)>| level > bucket.map_or(0, |(_, c)| c);
        if over(self.request_level_milli, cfg.request_bucket()) {
            return Err(Error::at(
                ErrorCode::InvalidSnapshot,
                format!("{at}/request_level_milli"),
                "the request bucket is over its burst",
            ));
        }
        if over(self.token_level_milli, cfg.token_bucket()) {
            return Err(Error::at(
                ErrorCode::InvalidSnapshot,
                format!("{at}/token_level_milli"),
                "the token bucket is over its bound",
            ));
        }
        if let Some(t) = &self.tenants {
            t.check(cfg.tenant_weights.as_ref(), &format!("{at}/tenants"))?;
        }
        Ok(())
    }
}

/// The store key's tail of a release under a configuration's scope.
pub fn key_of(
    release: &Sha256Hex,
    tenant: Option<&Identifier>,
    principal: Option<&Identifier>,
) -> String {
    let mut key = release.as_str().to_owned();
    for part in [tenant, principal].into_iter().flatten() {
        key.push('/');
        key.push_str(part.as_str());
    }
    key
}

/// What an admission answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitAnswer {
    /// Admitted; dispatch at `start_epoch_ms` (now, or the reserved start).
    Admitted {
        /// The earliest start the buckets reserved, Unix ms.
        start_epoch_ms: u64,
    },
    /// The in-flight cap is full: ask again at `until_epoch_ms`.
    Wait {
        /// When to ask again, Unix ms.
        until_epoch_ms: u64,
    },
    /// Not within the queue bound: `earliest_epoch_ms` is the earliest start
    /// (none: never, a reservation above the token bound).
    Refused {
        /// The earliest start, Unix ms, if any.
        earliest_epoch_ms: Option<u64>,
    },
    /// The tenant is over its share while others want the capacity: ask
    /// again at `until_epoch_ms` (its share, or the buckets, cover it then).
    OverShare {
        /// When to ask again, Unix ms.
        until_epoch_ms: u64,
    },
    /// The tenant is over its share and neither its share nor the buckets
    /// cover it within the queue bound (reason `tenant_over_share`).
    RefusedOverShare {
        /// When it would be covered, Unix ms.
        earliest_epoch_ms: u64,
    },
}

/// `a / b` rounded up (`u64::MAX` for `b` 0).
fn ceil_div(a: u64, b: u64) -> u64 {
    match (a.checked_div(b), a.checked_rem(b)) {
        (Some(q), Some(0)) => q,
        (Some(q), Some(_)) => q.saturating_add(1),
        _ => u64::MAX,
    }
}

/// Take `need` milli-units from a bucket of `rate` per second (milli-units
/// per ms) and `cap` milli-units, at level `level` at `at`: the earliest
/// start, and the bucket's level and time after the reservation.
fn take(rate: u64, cap: u64, level: u64, at: u64, now: u64, need: u64) -> (u64, u64, u64) {
    let t = now.max(at);
    let level = level
        .saturating_add(t.saturating_sub(at).saturating_mul(rate))
        .min(cap);
    if level >= need {
        return (t, level.saturating_sub(need), t);
    }
    let wait = ceil_div(need.saturating_sub(level), rate);
    let start = t.saturating_add(wait);
    let after = level
        .saturating_add(wait.saturating_mul(rate))
        .min(cap)
        .saturating_sub(need);
    (start, after, start)
}

/// Admit one attempt at `now_epoch_ms`, first asked at
/// `queued_since_epoch_ms`, reserving `tokens` (the request's bound; 0
/// without a token bucket): the answer, and the next snapshot (unchanged
/// unless admitted).
pub fn admit(
    cfg: &AdmissionConfig,
    snapshot: &AdmissionSnapshot,
    now_epoch_ms: u64,
    queued_since_epoch_ms: u64,
    tokens: u64,
) -> (LimitAnswer, AdmissionSnapshot) {
    admit_as(
        cfg,
        snapshot,
        now_epoch_ms,
        queued_since_epoch_ms,
        tokens,
        None,
    )
}

/// [`admit`] for a call of `tenant` under tenant shares
/// ([`crate::tenant_share`]): under its share it is admitted as by
/// [`admit`] and its share clock moves; over its share it is admitted only
/// when the buckets cover it now (lent capacity), and otherwise waits
/// ([`LimitAnswer::OverShare`]) or is refused
/// ([`LimitAnswer::RefusedOverShare`]) past the queue bound. Without
/// tenant shares (or without a tenant) it is [`admit`].
pub fn admit_as(
    cfg: &AdmissionConfig,
    snapshot: &AdmissionSnapshot,
    now_epoch_ms: u64,
    queued_since_epoch_ms: u64,
    tokens: u64,
    tenant: Option<&Identifier>,
) -> (LimitAnswer, AdmissionSnapshot) {
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    let since = queued_since_epoch_ms.min(now);
    let latest = since.saturating_add(cfg.max_queue_ms);
    let unchanged = snapshot.clone();
    if cfg.token_bound.is_some_and(|b| tokens > b) {
        return (
            LimitAnswer::Refused {
                earliest_epoch_ms: None,
            },
            unchanged,
        );
    }
    let mut in_flight = snapshot.in_flight;
    let full = cfg.max_in_flight.is_some_and(|m| in_flight >= m);
    if full
        && cfg
            .in_flight_lease_ms
            .is_some_and(|lease| now.saturating_sub(snapshot.updated_at_epoch_ms) >= lease)
    {
        // Nothing admitted or released for a whole lease while full: the
        // holders are presumed gone.
        in_flight = 0;
    }
    if cfg.max_in_flight.is_some_and(|m| in_flight >= m) {
        let until = now.saturating_add(IN_FLIGHT_POLL_MS);
        let answer = if until > latest {
            LimitAnswer::Refused {
                earliest_epoch_ms: Some(until),
            }
        } else {
            LimitAnswer::Wait {
                until_epoch_ms: until,
            }
        };
        return (answer, unchanged);
    }
    let mut next = snapshot.clone();
    // A bucket the limits do not configure still holds a server's reset
    // ([`observe`]): nothing starts before it.
    let mut start = now;
    if cfg.request_bucket().is_none() {
        start = start.max(snapshot.requests_at_epoch_ms);
    }
    if cfg.token_bucket().is_none() {
        start = start.max(snapshot.tokens_at_epoch_ms);
    }
    if let Some((rate, cap)) = cfg.request_bucket() {
        let (s, level, at) = take(
            rate,
            cap,
            snapshot.request_level_milli,
            snapshot.requests_at_epoch_ms,
            now,
            MILLI,
        );
        start = start.max(s);
        next.request_level_milli = level;
        next.requests_at_epoch_ms = at;
    }
    if let Some((rate, cap)) = cfg.token_bucket() {
        let (s, level, at) = take(
            rate,
            cap,
            snapshot.token_level_milli,
            snapshot.tokens_at_epoch_ms,
            now,
            tokens.saturating_mul(MILLI),
        );
        start = start.max(s);
        next.token_level_milli = level;
        next.tokens_at_epoch_ms = at;
    }
    let shares = match (&cfg.tenant_weights, tenant, cfg.request_bucket()) {
        (Some(w), Some(t), Some((rate, _))) => Some((
            t,
            Standing::of(
                w,
                snapshot.tenants.as_ref(),
                t,
                now,
                rate,
                cfg.request_burst.unwrap_or(1),
            ),
        )),
        _ => None,
    };
    if let Some((t, standing)) = &shares {
        let under = standing.under(now);
        if !under && start > now {
            // Over its share while the buckets are taken: reserve nothing.
            let until = standing.covered_at().min(start);
            let answer = if until > latest {
                LimitAnswer::RefusedOverShare {
                    earliest_epoch_ms: until,
                }
            } else {
                LimitAnswer::OverShare {
                    until_epoch_ms: until,
                }
            };
            return (answer, unchanged);
        }
        if start <= latest {
            next.tenants = Some(standing.after(t, now, under));
        }
    }
    if start > latest {
        return (
            LimitAnswer::Refused {
                earliest_epoch_ms: Some(start),
            },
            unchanged,
        );
    }
    next.in_flight = in_flight.saturating_add(1);
    next.generation = next.generation.saturating_add(1);
    next.updated_at_epoch_ms = now;
    (
        LimitAnswer::Admitted {
            start_epoch_ms: start,
        },
        next,
    )
}

/// An admitted attempt is over (answered, failed, cancelled, or never
/// dispatched): free its in-flight slot and settle its reserved tokens with
/// the `used` tokens the response reported (unused ones go back to the
/// bucket, up to its bound; more than reserved are taken from it, down to
/// empty). Without a report the reservation stands.
pub fn release(
    cfg: &AdmissionConfig,
    snapshot: &AdmissionSnapshot,
    now_epoch_ms: u64,
    reserved: u64,
    used: Option<u64>,
) -> AdmissionSnapshot {
    let mut next = snapshot.clone();
    next.in_flight = next.in_flight.saturating_sub(1);
    if let (Some((_, cap)), Some(used)) = (cfg.token_bucket(), used) {
        let back = reserved.saturating_sub(used).saturating_mul(MILLI);
        let more = used.saturating_sub(reserved).saturating_mul(MILLI);
        next.token_level_milli = next
            .token_level_milli
            .saturating_add(back)
            .min(cap)
            .saturating_sub(more);
    }
    next.generation = next.generation.saturating_add(1);
    next.updated_at_epoch_ms = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    next
}

/// Lower one bucket (`bucket`: its rate and cap, none when the limits do
/// not configure it) at level `level` at `at` by what the server said of
/// the capacity at `now`: its level and time after.
fn lower(
    bucket: Option<(u64, u64)>,
    level: u64,
    at: u64,
    now: u64,
    said: &crate::provider::Capacity,
) -> (u64, u64) {
    let (mut level, mut at) = (level, at);
    if let (Some(remaining), Some((rate, cap))) = (said.remaining, bucket) {
        if at <= now {
            let current = level
                .saturating_add(now.saturating_sub(at).saturating_mul(rate))
                .min(cap);
            let server = remaining.saturating_mul(MILLI);
            if server < current {
                (level, at) = (server, now);
            }
        }
    }
    if let Some(reset) = said.reset_ms {
        let until = now.saturating_add(reset);
        if until > at {
            (level, at) = (0, until);
        }
    }
    (level, at)
}

/// The rate-limit headers a response carried (success or failure) seen at
/// `now_epoch_ms`, applied to the snapshot of its route's key: a
/// `remaining` below a bucket's level now lowers the bucket to it (never
/// raises it, and leaves a bucket reserved into the future alone); a
/// `remaining` of 0 with a reset empties the bucket until the reset (level
/// 0 at `now + reset`, never earlier than the snapshot already reserved),
/// also for a bucket the limits do not configure, so no admission starts on
/// the key before the server said capacity returns. Requests: OpenAI's
/// `x-ratelimit-*-requests`, Anthropic's `anthropic-ratelimit-requests-*`
/// and the IETF `RateLimit` items; tokens: `x-ratelimit-*-tokens` and
/// Anthropic's token, input-token and output-token headers
/// ([`crate::provider::rate_limits`]). Garbage, a reset in the past or
/// beyond [`crate::provider::MAX_HINT_MS`] is ignored and returned as a
/// note. When nothing applies the snapshot comes back unchanged (the same
/// digest); otherwise its generation rises.
pub fn observe(
    cfg: &AdmissionConfig,
    snapshot: &AdmissionSnapshot,
    headers: &[(String, String)],
    now_epoch_ms: u64,
) -> (AdmissionSnapshot, Vec<crate::provider::Note>) {
    let said = crate::provider::rate_limits(headers, now_epoch_ms);
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    let mut next = snapshot.clone();
    (next.request_level_milli, next.requests_at_epoch_ms) = lower(
        cfg.request_bucket(),
        snapshot.request_level_milli,
        snapshot.requests_at_epoch_ms,
        now,
        &said.requests,
    );
    (next.token_level_milli, next.tokens_at_epoch_ms) = lower(
        cfg.token_bucket(),
        snapshot.token_level_milli,
        snapshot.tokens_at_epoch_ms,
        now,
        &said.tokens,
    );
    if next != *snapshot {
        next.generation = next.generation.saturating_add(1);
        next.updated_at_epoch_ms = now;
    }
    (next, said.notes)
}

/// Response headers as `[name, value]` pairs (at most
/// [`crate::limits::MAX_HEADERS`]), as the hosts pass them to [`observe`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeenHeaders(pub Vec<(String, String)>);

impl crate::decode::Decode for SeenHeaders {
    fn decode(v: &serde_json::Value, at: &crate::decode::At<'_>) -> Result<Self> {
        let pairs =
            crate::decode::decode_list::<crate::http::Header>(v, at, crate::limits::MAX_HEADERS)?;
        Ok(Self(
            pairs
                .into_iter()
                .map(crate::http::Header::into_pair)
                .collect(),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn release_id() -> Sha256Hex {
        Sha256Hex::parse(&"ab".repeat(32)).unwrap()
    }

    fn cfg() -> AdmissionConfig {
        AdmissionConfig {
            in_flight_lease_ms: None,
            max_in_flight: Some(2),
            max_queue_ms: 1_000,
            principal: None,
            request_burst: Some(2),
            requests_per_second: Some(10),
            tenant: None,
            tenant_weights: None,
            token_bound: None,
            tokens_per_second: None,
        }
    }

    #[test]
    fn a_burst_then_a_planned_queue_then_refusal_past_the_bound() {
        let c = AdmissionConfig {
            max_in_flight: None,
            ..cfg()
        };
        let mut s = AdmissionSnapshot::fresh(&c, release_id(), 0);
        let mut starts = Vec::new();
        loop {
            let (a, n) = admit(&c, &s, 0, 0, 0);
            match a {
                LimitAnswer::Admitted { start_epoch_ms } => starts.push(start_epoch_ms),
                LimitAnswer::Refused { earliest_epoch_ms } => {
                    assert_eq!(earliest_epoch_ms, Some(1_100));
                    assert_eq!(n, s);
                    break;
                }
                _ => unreachable!(),
            }
            s = n;
        }
        // Two at once, then one every 100 ms up to the 1,000 ms bound.
        assert_eq!(starts[..4], [0, 0, 100, 200]);
        assert_eq!(starts.last(), Some(&1_000));
        assert_eq!(starts.len(), 12);
    }

    #[test]
    fn in_flight_waits_for_a_release_and_tokens_settle() {
        let c = AdmissionConfig {
            token_bound: Some(100),
            tokens_per_second: Some(100),
            ..cfg()
        };
        let s = AdmissionSnapshot::fresh(&c, release_id(), 0);
        let (_, s) = admit(&c, &s, 0, 0, 60);
        let (a, s) = admit(&c, &s, 0, 0, 30);
        assert_eq!(a, LimitAnswer::Admitted { start_epoch_ms: 0 });
        assert_eq!(s.token_level_milli, 10_000);
        let (a, same) = admit(&c, &s, 5, 0, 10);
        assert_eq!(a, LimitAnswer::Wait { until_epoch_ms: 25 });
        assert_eq!(same, s);
        let s = release(&c, &s, 10, 60, Some(20));
        assert_eq!((s.in_flight, s.token_level_milli), (1, 50_000));
        let (a, _) = admit(&c, &s, 10, 0, 101);
        assert_eq!(
            a,
            LimitAnswer::Refused {
                earliest_epoch_ms: None
            }
        );
        // 90 tokens with 50 left at 0 ms and 1 refilled by 10 ms: 39 more
        // at 100 per second, 390 ms later.
        let (a, n) = admit(&c, &s, 10, 0, 90);
        assert_eq!(
            a,
            LimitAnswer::Admitted {
                start_epoch_ms: 400
            }
        );
        assert_eq!((n.token_level_milli, n.tokens_at_epoch_ms), (0, 400));
    }

    fn pairs(h: &[(&str, &str)]) -> Vec<(String, String)> {
        h.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_exhausted_route_admits_nothing_before_the_reset() {
        let c = cfg();
        let s = AdmissionSnapshot::fresh(&c, release_id(), 1_000);
        let h = pairs(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "750ms"),
        ]);
        let (seen, notes) = observe(&c, &s, &h, 1_000);
        assert!(notes.is_empty());
        assert_eq!(
            (seen.request_level_milli, seen.requests_at_epoch_ms),
            (0, 1_750)
        );
        let (a, _) = admit(&c, &seen, 1_000, 1_000, 0);
        // Empty at the reset, one request refilled 100 ms later.
        assert_eq!(
            a,
            LimitAnswer::Admitted {
                start_epoch_ms: 1_850
            }
        );
        // Nothing applies: the same document.
        let (same, _) = observe(
            &c,
            &seen,
            &pairs(&[("x-ratelimit-remaining-requests", "9")]),
            1_100,
        );
        assert_eq!(same, seen);
    }

    #[test]
    fn bad_rate_limit_headers_never_panic() {
        let c = AdmissionConfig {
            token_bound: Some(100),
            tokens_per_second: Some(100),
            ..cfg()
        };
        let s = AdmissionSnapshot::fresh(&c, release_id(), 0);
        let values = [
            "",
            "0",
            "-1",
            "1e9",
            "18446744073709551616",
            "\u{0}",
            "6m0s",
            "99999999h",
            "2026-13-40T99:99:99Z",
            "0.s",
            ".5s",
            "1.5",
            "\"x\";r=0;t=",
            "a;r=0;t=99999999999999999999",
        ];
        let names = crate::provider::RATE_LIMIT_HEADERS;
        for (i, name) in names.iter().enumerate() {
            for (j, v) in values.iter().enumerate() {
                let other = names[(i + j) % names.len()];
                let h = pairs(&[(name, v), (other, values[(i * 7 + j) % values.len()])]);
                for now in [0, 1, u64::MAX / 2, u64::MAX] {
                    let (next, _) = observe(&c, &s, &h, now);
                    next.check(&c, &release_id(), "").unwrap();
                }
            }
        }
    }

    #[test]
    fn bad_configurations_have_codes() {
        let bad = |c: AdmissionConfig| c.check("/fleet/admission").unwrap_err();
        let e = bad(AdmissionConfig {
            max_in_flight: Some(0),
            ..cfg()
        });
        assert_eq!(
            (e.code, e.path.as_deref()),
            (
                ErrorCode::InvalidAdmission,
                Some("/fleet/admission/max_in_flight")
            )
        );
        let e = bad(AdmissionConfig {
            max_queue_ms: 0,
            ..cfg()
        });
        assert_eq!(e.path.as_deref(), Some("/fleet/admission/max_queue_ms"));
        let e = bad(AdmissionConfig {
            tokens_per_second: Some(5),
            ..cfg()
        });
        assert_eq!(e.path.as_deref(), Some("/fleet/admission/token_bound"));
        cfg().check("").unwrap();
    }
}
