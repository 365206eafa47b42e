//! Circuit breakers: one snapshot per route release, shared across runs.
//!
//! A breaker is closed until the configured failure evidence (a number of
//! consecutive unhealthy outcomes, or a failure ratio over a minimum volume
//! inside a window); then open for `open_ms`; then half-open, admitting at most
//! `half_open_probes` probes in flight. Probes' successes (as many as
//! `half_open_probes`) close it; a probe's failure reopens it. Only outcomes
//! that say the route is unhealthy count: a timeout before a response,
//! unavailable, rate limited. A caller's invalid request never opens a
//! breaker. Probes left unanswered for `open_ms` after the latest one was
//! admitted are presumed lost and their slots released. Each state change raises the generation, so a store's
//! compare-and-set and a replay can tell snapshots apart.
//!
//! Everything here is pure: [`admit`] and [`record`] take a snapshot and the
//! wall clock (Unix ms) and give the next snapshot; a store only holds it.
//! Time never goes back for a breaker: a clock behind the snapshot's
//! `updated_at_epoch_ms` (another process's skew) counts as that time.

use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Sha256Hex};
use crate::outcome::{Outcome, RetryableKind};

schema_marker!(
    /// `retryledger.breaker.v1`
    BreakerSchema = "retryledger.breaker.v1"
);

/// Largest `half_open_probes`.
pub const MAX_PROBES: u64 = 1_000;

/// A policy's breaker configuration (the same for every route). Fields in
/// canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Open after this many consecutive unhealthy outcomes.
    pub consecutive_failures: Option<u64>,
    /// Open when unhealthy outcomes reach this share (per mille) of the
    /// window's outcomes, once the window holds `minimum_volume` of them.
    pub failure_ratio_permille: Option<u64>,
    /// Probes admitted at once when half-open; as many successes close it.
    pub half_open_probes: u64,
    /// The ratio's minimum number of outcomes in the window.
    pub minimum_volume: Option<u64>,
    /// How long the breaker stays open before probing, ms.
    pub open_ms: u64,
    /// The ratio's window, ms.
    pub window_ms: Option<u64>,
}

object!(BreakerConfig {
    consecutive_failures: opt_u64,
    failure_ratio_permille: opt_u64,
    half_open_probes: u64,
    minimum_volume: opt_u64,
    open_ms: u64,
    window_ms: opt_u64,
});

impl BreakerConfig {
    /// Check the configuration; `at` is its JSON Pointer in the policy.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |field: &str, msg: &str| {
            Err(Error::at(
                ErrorCode::InvalidBreaker,
                format!("{at}/{field}"),
                msg.to_owned(),
            ))
        };
        if self.open_ms == 0 {
            return bad("open_ms", "open_ms must be at least 1");
        }
        if self.half_open_probes == 0 || self.half_open_probes > MAX_PROBES {
            return bad("half_open_probes", "half_open_probes must be in 1..=1000");
        }
        if self.consecutive_failures == Some(0) {
            return bad(
                "consecutive_failures",
                "consecutive_failures must be at least 1",
            );
        }
        match (
            self.failure_ratio_permille,
            self.minimum_volume,
            self.window_ms,
        ) {
            (None, None, None) => {
                if self.consecutive_failures.is_none() {
                    return bad(
                        "consecutive_failures",
                        "a breaker needs consecutive_failures or a failure ratio (failure_ratio_permille, minimum_volume, window_ms)",
                    );
                }
            }
            (Some(r), Some(v), Some(w)) => {
                if r == 0 || r > 1_000 {
                    return bad(
                        "failure_ratio_permille",
                        "failure_ratio_permille must be in 1..=1000",
                    );
                }
                if v == 0 {
                    return bad("minimum_volume", "minimum_volume must be at least 1");
                }
                if w == 0 {
                    return bad("window_ms", "window_ms must be at least 1");
                }
            }
            _ => {
                return bad(
                    "failure_ratio_permille",
                    "failure_ratio_permille, minimum_volume and window_ms go together",
                )
            }
        }
        Ok(())
    }
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Admitting.
    Closed,
    /// Refusing until `opened_at_epoch_ms + open_ms`.
    Open,
    /// Admitting a bounded number of probes.
    HalfOpen,
}

names!(BreakerState {
    Closed => "closed",
    Open => "open",
    HalfOpen => "half_open",
});

/// The breaker of one route release. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerSnapshot {
    /// Consecutive unhealthy outcomes (closed).
    pub consecutive_failures: u64,
    /// Raised on every state change.
    pub generation: u64,
    /// When it opened (open).
    pub opened_at_epoch_ms: Option<u64>,
    /// Parked until then: a run under `retry_after_over_cap: skip_route` saw
    /// a wait longer than its cap on this route, so no run dispatches to it
    /// before the server asked ([`park`]). Absent when not parked.
    pub parked_until_epoch_ms: Option<u64>,
    /// When the latest probe was admitted (half-open). Probes unanswered
    /// for `open_ms` after it are presumed lost (a crashed host), so a
    /// breaker never stays half-open for ever.
    pub probe_started_at_epoch_ms: Option<u64>,
    /// Successful probes so far (half-open).
    pub probe_successes: u64,
    /// Probes admitted and not yet recorded (half-open).
    pub probes_in_flight: u64,
    /// The route release this breaker guards (its key).
    pub route_release_sha256: Sha256Hex,
    /// `retryledger.breaker.v1`
    pub schema: BreakerSchema,
    /// Closed, open or half-open.
    pub state: BreakerState,
    /// The latest time it saw, Unix ms.
    pub updated_at_epoch_ms: u64,
    /// Unhealthy outcomes in the window.
    pub window_failures: u64,
    /// When the window began, Unix ms.
    pub window_start_epoch_ms: u64,
    /// Counted outcomes in the window.
    pub window_total: u64,
}

object!(BreakerSnapshot {
    consecutive_failures: u64,
    generation: u64,
    opened_at_epoch_ms: opt_u64,
    parked_until_epoch_ms: opt_u64,
    probe_started_at_epoch_ms: opt_u64,
    probe_successes: u64,
    probes_in_flight: u64,
    route_release_sha256: doc,
    schema: doc,
    state: doc,
    updated_at_epoch_ms: u64,
    window_failures: u64,
    window_start_epoch_ms: u64,
    window_total: u64,
});

/// What an outcome says about the route's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The route answered.
    Healthy,
    /// The route is unhealthy (timeout before response, unavailable, rate limited).
    Unhealthy,
    /// Says nothing about the route (the caller's invalid request, an
    /// indeterminate outcome, a refusal by policy, a request in progress).
    Neutral,
}

names!(Health {
    Healthy => "healthy",
    Unhealthy => "unhealthy",
    Neutral => "neutral",
});

impl Health {
    /// What an observed outcome says about its route.
    pub fn of(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Success => Self::Healthy,
            Outcome::Retryable {
                kind:
                    RetryableKind::TimeoutBeforeResponse
                    | RetryableKind::Unavailable
                    | RetryableKind::RateLimited,
                ..
            } => Self::Unhealthy,
            // A receiver still running the first request is working.
            Outcome::Retryable {
                kind: RetryableKind::InProgress,
                ..
            }
            | Outcome::NonRetryable { .. }
            | Outcome::Indeterminate { .. } => Self::Neutral,
        }
    }
}

/// The answer of [`admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerAdmission {
    /// Dispatch; as a half-open probe when `probe`.
    Admitted {
        /// The attempt is a probe: its outcome decides the half-open breaker.
        probe: bool,
    },
    /// Skip the route until `retry_at_epoch_ms` (open), or until a probe
    /// finishes (half-open with every probe in flight).
    Rejected {
        /// The earliest time it may admit again (open); absent when half-open.
        retry_at_epoch_ms: Option<u64>,
    },
}

impl crate::canonical::Encode for BreakerAdmission {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        let mut o = crate::canonical::ObjectWriter::new(sink);
        match self {
            Self::Admitted { probe } => {
                o.str("kind", "admitted").bool("probe", *probe);
            }
            Self::Rejected { retry_at_epoch_ms } => {
                o.str("kind", "rejected")
                    .opt_u64("retry_at_epoch_ms", *retry_at_epoch_ms);
            }
        }
        o.end();
    }
}

impl BreakerSnapshot {
    /// A closed breaker that has seen nothing, for a key the store does not hold.
    pub fn fresh(route_release_sha256: Sha256Hex, now_epoch_ms: u64) -> Self {
        Self {
            consecutive_failures: 0,
            generation: 0,
            opened_at_epoch_ms: None,
            parked_until_epoch_ms: None,
            probe_started_at_epoch_ms: None,
            probe_successes: 0,
            probes_in_flight: 0,
            route_release_sha256,
            schema: BreakerSchema,
            state: BreakerState::Closed,
            updated_at_epoch_ms: now_epoch_ms,
            window_failures: 0,
            window_start_epoch_ms: now_epoch_ms,
            window_total: 0,
        }
    }

    /// Check the snapshot's own consistency and its key; `at` is its pointer.
    pub fn check(&self, cfg: &BreakerConfig, release: &Sha256Hex, at: &str) -> Result<()> {
        let bad = |code: ErrorCode, field: &str, msg: &str| {
            Err(Error::at(code, format!("{at}/{field}"), msg.to_owned()))
        };
        if &self.route_release_sha256 != release {
            return bad(
                ErrorCode::SnapshotKeyMismatch,
                "route_release_sha256",
                "the snapshot is another route release's breaker",
            );
        }
        let open = self.state == BreakerState::Open;
        if open != self.opened_at_epoch_ms.is_some() {
            return bad(
                ErrorCode::InvalidSnapshot,
                "opened_at_epoch_ms",
                "an open breaker, and only an open one, has opened_at_epoch_ms",
            );
        }
        if self.state != BreakerState::HalfOpen
            && (self.probes_in_flight > 0
                || self.probe_successes > 0
                || self.probe_started_at_epoch_ms.is_some())
        {
            return bad(
                ErrorCode::InvalidSnapshot,
                "probes_in_flight",
                "only a half-open breaker has probes",
            );
        }
        if self.probes_in_flight > cfg.half_open_probes
            || self.probe_successes >= cfg.half_open_probes
        {
            return bad(
                ErrorCode::InvalidSnapshot,
                "probes_in_flight",
                "more probes than half_open_probes allows",
            );
        }
        if self.window_failures > self.window_total {
            return bad(
                ErrorCode::InvalidSnapshot,
                "window_failures",
                "more failures than outcomes in the window",
            );
        }
        if self.window_start_epoch_ms > self.updated_at_epoch_ms {
            return bad(
                ErrorCode::InvalidSnapshot,
                "window_start_epoch_ms",
                "the window starts after the snapshot's time",
            );
        }
        Ok(())
    }

    fn reset_counts(&mut self, now: u64) {
        self.consecutive_failures = 0;
        self.window_failures = 0;
        self.window_total = 0;
        self.window_start_epoch_ms = now;
        self.probe_successes = 0;
        self.probes_in_flight = 0;
        self.probe_started_at_epoch_ms = None;
    }

    fn enter(&mut self, state: BreakerState, now: u64) {
        self.state = state;
        self.generation = self.generation.saturating_add(1);
        self.opened_at_epoch_ms = (state == BreakerState::Open).then_some(now);
        self.reset_counts(now);
    }
}

/// Admit an attempt on the route at `now_epoch_ms`: the answer and the next snapshot.
pub fn admit(
    cfg: &BreakerConfig,
    snapshot: &BreakerSnapshot,
    now_epoch_ms: u64,
) -> (BreakerAdmission, BreakerSnapshot) {
    let mut next = snapshot.clone();
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    next.updated_at_epoch_ms = now;
    match next.parked_until_epoch_ms {
        Some(until) if now < until => {
            return (
                BreakerAdmission::Rejected {
                    retry_at_epoch_ms: Some(until),
                },
                next,
            );
        }
        Some(_) => next.parked_until_epoch_ms = None,
        None => {}
    }
    if next.state == BreakerState::Open {
        let until = next
            .opened_at_epoch_ms
            .unwrap_or(now)
            .saturating_add(cfg.open_ms);
        if now < until {
            return (
                BreakerAdmission::Rejected {
                    retry_at_epoch_ms: Some(until),
                },
                next,
            );
        }
        next.enter(BreakerState::HalfOpen, now);
    }
    // Every probe slot taken, none answered for open_ms: the probes are
    // presumed lost (their hosts crashed or could not record) and released.
    let lost = next.state == BreakerState::HalfOpen
        && next.probes_in_flight >= cfg.half_open_probes
        && next
            .probe_started_at_epoch_ms
            .is_some_and(|t| now >= t.saturating_add(cfg.open_ms));
    if lost {
        next.probes_in_flight = 0;
        next.generation = next.generation.saturating_add(1);
    }
    match next.state {
        BreakerState::Closed => (BreakerAdmission::Admitted { probe: false }, next),
        BreakerState::HalfOpen if next.probes_in_flight < cfg.half_open_probes => {
            next.probes_in_flight = next.probes_in_flight.saturating_add(1);
            next.probe_started_at_epoch_ms = Some(now);
            (BreakerAdmission::Admitted { probe: true }, next)
        }
        BreakerState::HalfOpen | BreakerState::Open => (
            BreakerAdmission::Rejected {
                retry_at_epoch_ms: None,
            },
            next,
        ),
    }
}

/// Park the route until `until_epoch_ms` (the latest of this and any park
/// already there): [`admit`] refuses it until then, whatever its state. A
/// run that saw a wait longer than its cap under `retry_after_over_cap:
/// skip_route` parks the route for every run ([`crate::Session::breaker_after`]).
pub fn park(snapshot: &BreakerSnapshot, until_epoch_ms: u64, now_epoch_ms: u64) -> BreakerSnapshot {
    let mut next = snapshot.clone();
    next.updated_at_epoch_ms = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    if until_epoch_ms > next.updated_at_epoch_ms {
        next.parked_until_epoch_ms = Some(
            next.parked_until_epoch_ms
                .map_or(until_epoch_ms, |p| p.max(until_epoch_ms)),
        );
    }
    next
}

/// Record an admitted attempt's outcome at `now_epoch_ms`: the next snapshot.
/// `probe` is what [`admit`] said of the attempt.
pub fn record(
    cfg: &BreakerConfig,
    snapshot: &BreakerSnapshot,
    probe: bool,
    health: Health,
    now_epoch_ms: u64,
) -> BreakerSnapshot {
    let mut next = snapshot.clone();
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    next.updated_at_epoch_ms = now;
    if next.parked_until_epoch_ms.is_some_and(|until| until <= now) {
        next.parked_until_epoch_ms = None;
    }
    match next.state {
        BreakerState::HalfOpen if probe => {
            next.probes_in_flight = next.probes_in_flight.saturating_sub(1);
            match health {
                Health::Unhealthy => next.enter(BreakerState::Open, now),
                Health::Healthy => {
                    next.probe_successes = next.probe_successes.saturating_add(1);
                    if next.probe_successes >= cfg.half_open_probes {
                        next.enter(BreakerState::Closed, now);
                    }
                }
                Health::Neutral => {}
            }
        }
        BreakerState::Closed => {
            if let Some(w) = cfg.window_ms {
                if now >= next.window_start_epoch_ms.saturating_add(w) {
                    next.window_failures = 0;
                    next.window_total = 0;
                    next.window_start_epoch_ms = now;
                }
            }
            match health {
                Health::Neutral => {}
                Health::Healthy => {
                    next.consecutive_failures = 0;
                    next.window_total = next.window_total.saturating_add(1);
                }
                Health::Unhealthy => {
                    next.consecutive_failures = next.consecutive_failures.saturating_add(1);
                    next.window_total = next.window_total.saturating_add(1);
                    next.window_failures = next.window_failures.saturating_add(1);
                }
            }
            let consecutive = cfg
                .consecutive_failures
                .is_some_and(|n| next.consecutive_failures >= n);
            let ratio = match (cfg.failure_ratio_permille, cfg.minimum_volume) {
                (Some(r), Some(v)) => {
                    // failures / total >= r / 1000, in u128 (no overflow).
                    next.window_total >= v
                        && u128::from(next.window_failures).saturating_mul(1_000)
                            >= u128::from(r).saturating_mul(u128::from(next.window_total))
                }
                _ => false,
            };
            if health == Health::Unhealthy && (consecutive || ratio) {
                next.enter(BreakerState::Open, now);
            }
        }
        // A late outcome of an attempt admitted before the breaker changed
        // state (or a non-probe while half-open) says nothing new.
        BreakerState::HalfOpen | BreakerState::Open => {}
    }
    next
}
