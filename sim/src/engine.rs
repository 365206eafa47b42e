//! The discrete-event engine: seeded arrivals, routes with capacity and
//! failure schedules, and the five strategies driving logical requests.
//!
//! Time is integer milliseconds from 0. Events at the same millisecond run in
//! a fixed order (a served attempt leaving its route, an attempt's outcome
//! reaching its client, a backoff ending, an arrival) and then in the order
//! they were scheduled, so a run is a pure function of the scenario, the
//! strategy and the seed.
//!
//! An attempt's fate is drawn when it starts: refused at once (503) when the
//! route is in an outage or at capacity, 429 with `retry-after-ms` up to the
//! next one-second window when a rate limit is spent, 503 at the brown-out's
//! ratio; otherwise served for `base + exponential tail` (plus the slow
//! tail's extra share), failing with 503 at an outage's start if one begins
//! while it is in service. A client gives up on an attempt at its attempt
//! timeout (the route still serves it to the end: a timeout frees no
//! capacity).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use retryledger_core::evaluate::{Decision, Terminal};
use retryledger_core::ids::Sha256Hex;
use retryledger_core::observe::{Facts, Signal};
use retryledger_core::{CompiledPolicy, Session};

use crate::error::{Result, SimError};
use crate::ledger::{self, Store};
use crate::record::Recorder;
use crate::rng::Rng;
use crate::scenario::{FailureKind, Process, RouteSpec, Scenario};

/// Wall clock of the simulation's time 0 (Unix ms), for the fleet snapshots.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

/// The strategies, side by side on the same arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// One attempt, no retry.
    NoRetry,
    /// Every layer retries the one below it, at once.
    NaiveLayered,
    /// One owner, capped exponential backoff, no jitter.
    BackoffNoJitter,
    /// One owner, capped exponential backoff, full jitter.
    BackoffFullJitter,
    /// retryledger's Session per logical request, a shared breaker and budget.
    Retryledger,
    /// One attempt and, after the scenario's hedge delay without an answer,
    /// one hedge on the primary; the first success wins (no retry).
    Hedged,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Self; 6] = [
        Self::NoRetry,
        Self::NaiveLayered,
        Self::BackoffNoJitter,
        Self::BackoffFullJitter,
        Self::Retryledger,
        Self::Hedged,
    ];

    /// The strategies a scenario runs: every one, the hedged one only when
    /// the scenario has a `hedge` section.
    pub fn for_scenario(s: &Scenario) -> Vec<Self> {
        Self::ALL
            .into_iter()
            .filter(|st| *st != Self::Hedged || s.hedge.is_some())
            .collect()
    }

    /// The snake_case name (JSON, `--strategy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoRetry => "no_retry",
            Self::NaiveLayered => "naive_layered",
            Self::BackoffNoJitter => "backoff_no_jitter",
            Self::BackoffFullJitter => "backoff_full_jitter",
            Self::Retryledger => "retryledger",
            Self::Hedged => "hedged",
        }
    }

    /// By name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn stream(self) -> u64 {
        match self {
            Self::NoRetry => 11,
            Self::NaiveLayered => 12,
            Self::BackoffNoJitter => 13,
            Self::BackoffFullJitter => 14,
            Self::Retryledger => 15,
            Self::Hedged => 16,
        }
    }
}

/// Arrival times (ms) of the scenario's logical requests: the same for every
/// strategy.
pub fn arrivals(s: &Scenario) -> Vec<u64> {
    let mut rng = Rng::new(s.seed, 1);
    let horizon_us = s.duration_ms.saturating_mul(1_000);
    let mean_gap_us = 1_000_000u64
        .checked_div(s.arrivals.rate_per_s)
        .unwrap_or(1)
        .max(1);
    let mut out = Vec::with_capacity(usize::try_from(s.expected_requests()).unwrap_or(0));
    match s.arrivals.process {
        Process::Poisson => {
            let mut t_us = rng.exp_ms(mean_gap_us);
            while t_us < horizon_us {
                out.push(t_us / 1_000);
                t_us = t_us.saturating_add(rng.exp_ms(mean_gap_us));
            }
        }
        Process::Fixed => {
            for i in 0..s.expected_requests() {
                let t_us = u128::from(i)
                    .saturating_mul(1_000_000)
                    .checked_div(u128::from(s.arrivals.rate_per_s))
                    .unwrap_or(0);
                out.push(u64::try_from(t_us / 1_000).unwrap_or(u64::MAX));
            }
        }
    }
    out
}

/// What the client sees of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Success,
    Unavailable,
    RateLimited(u64),
    Timeout,
}

/// Most layers a naive strategy may have (the scenario allows up to 6).
const MAX_LAYERS: usize = 6;

/// Event kinds, in the order they run within one millisecond.
const RELEASE: u8 = 0;
const COMPLETE: u8 = 1;
const WAKE: u8 = 2;
const ARRIVAL: u8 = 3;
/// The hedged strategy: a hedge's outcome reaching its client, and the
/// hedge delay ending.
const COMPLETE_HEDGE: u8 = 4;
const HEDGE: u8 = 5;

/// (time, kind, sequence, argument).
type Event = Reverse<(u64, u8, u64, u32)>;

struct Route<'s> {
    spec: &'s RouteSpec,
    in_service: u64,
    window: u64,
    window_count: u64,
}

/// One logical request in flight.
#[derive(Default)]
struct Req {
    arrival: u64,
    attempts: u32,
    cost: u64,
    counters: [u64; MAX_LAYERS],
    started: u64,
    route: usize,
    seen: Option<Seen>,
    attempt_cost: u64,
    admitted: bool,
    session: Option<Box<Session>>,
    /// The hedged strategy: the hedge's outcome, attempts still in flight,
    /// whether the request has its answer.
    hedge_seen: Option<Seen>,
    in_flight: u8,
    done: bool,
}

struct Engine<'s> {
    s: &'s Scenario,
    strategy: Strategy,
    rng: Rng,
    queue: BinaryHeap<Event>,
    seq: u64,
    routes: Vec<Route<'s>>,
    slots: Vec<Req>,
    free: Vec<u32>,
    rec: Recorder,
    policies: Vec<Arc<CompiledPolicy>>,
    releases: Vec<Sha256Hex>,
    store: Store,
}

/// Simulate one strategy over the scenario's arrivals: its record.
pub fn run(s: &Scenario, strategy: Strategy, arrivals: &[u64]) -> Result<Recorder> {
    let (policies, releases) = if strategy == Strategy::Retryledger {
        ledger::policies(s)?
    } else {
        (Vec::new(), Vec::new())
    };
    let mut e = Engine {
        s,
        strategy,
        rng: Rng::new(s.seed, strategy.stream()),
        queue: BinaryHeap::new(),
        seq: 0,
        routes: s
            .routes
            .iter()
            .map(|spec| Route {
                spec,
                in_service: 0,
                window: 0,
                window_count: 0,
            })
            .collect(),
        slots: Vec::new(),
        free: Vec::new(),
        rec: Recorder::new(s, u64::try_from(arrivals.len()).unwrap_or(u64::MAX)),
        policies,
        releases,
        store: Store::default(),
    };
    if let Some(first) = arrivals.first() {
        e.push(*first, ARRIVAL, 0);
    }
    while let Some(Reverse((now, kind, _, arg))) = e.queue.pop() {
        match kind {
            RELEASE => {
                if let Some(r) = e.routes.get_mut(arg as usize) {
                    r.in_service = r.in_service.saturating_sub(1);
                }
            }
            COMPLETE => e.complete(now, arg)?,
            COMPLETE_HEDGE => e.hedge_complete(now, arg)?,
            HEDGE => e.hedge(now, arg)?,
            WAKE => e.wake(now, arg)?,
            _ => {
                let i = arg as usize;
                if let Some(next) = arrivals.get(i.saturating_add(1)) {
                    e.push(*next, ARRIVAL, arg.saturating_add(1));
                }
                e.arrive(now, arg)?;
            }
        }
    }
    Ok(e.rec)
}

fn core(e: &retryledger_core::Error) -> SimError {
    SimError::core(e)
}

impl<'s> Engine<'s> {
    fn push(&mut self, at: u64, kind: u8, arg: u32) {
        self.seq = self.seq.saturating_add(1);
        self.queue.push(Reverse((at, kind, self.seq, arg)));
    }

    fn slot(&mut self, slot: u32) -> Result<&mut Req> {
        self.slots
            .get_mut(slot as usize)
            .ok_or_else(|| SimError::new("internal", "", format!("no slot {slot}")))
    }

    fn arrive(&mut self, now: u64, index: u32) -> Result<()> {
        self.rec.admitted(now);
        let req = Req {
            arrival: now,
            counters: [1; MAX_LAYERS],
            ..Req::default()
        };
        let slot = match self.free.pop() {
            Some(i) => {
                if let Some(r) = self.slots.get_mut(i as usize) {
                    // Keep the finished request's session box: a fresh one
                    // is a large allocation per logical request.
                    let kept = r.session.take();
                    *r = Req {
                        session: kept,
                        ..req
                    };
                }
                i
            }
            None => {
                self.slots.push(req);
                u32::try_from(self.slots.len().saturating_sub(1))
                    .map_err(|_| SimError::new("too_many_requests", "", "too many in flight"))?
            }
        };
        if self.strategy == Strategy::Retryledger {
            let clients = self.s.clients.count.max(1);
            let client = u64::from(index).checked_rem(clients).unwrap_or(0);
            let policy = self
                .policies
                .get(usize::try_from(client).unwrap_or(0))
                .cloned()
                .ok_or_else(|| SimError::new("internal", "", "no policy for the client"))?;
            let r = self.slot(slot)?;
            match r.session.as_mut() {
                Some(b) => **b = Session::start(policy),
                None => r.session = Some(Box::new(Session::start(policy))),
            }
            return self.ledger_next(now, slot);
        }
        let give_up = now.saturating_add(self.s.clients.attempt_timeout_ms);
        if self.strategy == Strategy::Hedged {
            let delay = self.s.hedge.as_ref().map_or(u64::MAX, |h| h.delay_ms);
            self.slot(slot)?.in_flight = 1;
            self.push(now.saturating_add(delay), HEDGE, slot);
        }
        self.start(now, slot, 0, give_up)
    }

    /// The hedge delay ended: hedge the first attempt if it is still unanswered.
    fn hedge(&mut self, now: u64, slot: u32) -> Result<()> {
        let delay = self.s.hedge.as_ref().map_or(u64::MAX, |h| h.delay_ms);
        let r = self.slot(slot)?;
        // The first attempt answered, or the slot went to a later request.
        if r.done || r.seen.is_none() || r.arrival.saturating_add(delay) != now {
            return Ok(());
        }
        r.in_flight = r.in_flight.saturating_add(1);
        self.rec.offered(now, 0);
        let give_up = now.saturating_add(self.s.clients.attempt_timeout_ms);
        let (done_at, seen, cost) = self.fate(now, 0, give_up);
        let r = self.slot(slot)?;
        r.attempts = r.attempts.saturating_add(1);
        r.cost = r.cost.saturating_add(cost);
        r.hedge_seen = Some(seen);
        self.push(done_at, COMPLETE_HEDGE, slot);
        Ok(())
    }

    /// One of a hedged request's attempts answered: the first success wins;
    /// a failure waits for the other attempt while it is in flight. The slot
    /// is freed when neither is.
    fn hedged_answer(&mut self, now: u64, slot: u32, seen: Seen) -> Result<()> {
        let r = self.slot(slot)?;
        r.in_flight = r.in_flight.saturating_sub(1);
        let (done, left) = (r.done, r.in_flight);
        if done {
            if left == 0 {
                self.free.push(slot);
            }
            return Ok(());
        }
        if seen == Seen::Success || left == 0 {
            self.slot(slot)?.done = true;
            let r = self.slot(slot)?;
            let (arrival, attempts, cost) = (r.arrival, r.attempts, r.cost);
            let deadline = arrival.saturating_add(self.s.clients.deadline_ms);
            self.rec.finished(
                arrival,
                now,
                seen == Seen::Success,
                now >= deadline,
                attempts,
                cost,
            );
            if left == 0 {
                self.free.push(slot);
            }
        }
        Ok(())
    }

    fn hedge_complete(&mut self, now: u64, slot: u32) -> Result<()> {
        let seen = self
            .slot(slot)?
            .hedge_seen
            .take()
            .unwrap_or(Seen::Unavailable);
        self.hedged_answer(now, slot, seen)
    }

    /// Start an attempt of `slot` on route `route` now; its outcome reaches
    /// the client at a COMPLETE event.
    fn start(&mut self, now: u64, slot: u32, route: usize, give_up_at: u64) -> Result<()> {
        self.rec.offered(now, route);
        let (done_at, seen, cost) = self.fate(now, route, give_up_at);
        let r = self.slot(slot)?;
        r.attempts = r.attempts.saturating_add(1);
        r.started = now;
        r.route = route;
        r.seen = Some(seen);
        r.attempt_cost = cost;
        r.cost = r.cost.saturating_add(cost);
        self.push(done_at, COMPLETE, slot);
        Ok(())
    }

    /// Draw the attempt's fate at its start: when the client hears, what, and its cost.
    fn fate(&mut self, now: u64, route: usize, give_up_at: u64) -> (u64, Seen, u64) {
        let rng = &mut self.rng;
        let Some(r) = self.routes.get_mut(route) else {
            return (now, Seen::Unavailable, 0);
        };
        let spec = r.spec;
        let refused = now.saturating_add(spec.reject_ms).min(give_up_at.max(now));
        let active = |f: &&crate::scenario::Failure| f.from_ms <= now && now < f.until_ms;
        let mut slow = 0;
        for f in spec.failures.iter().filter(active) {
            match f.kind {
                FailureKind::Outage => return (refused, Seen::Unavailable, 0),
                FailureKind::SlowTail {
                    slow_permille,
                    slow_ms,
                } => {
                    if rng.chance_permille(slow_permille) {
                        slow = slow_ms;
                    }
                }
                FailureKind::Brownout { .. } | FailureKind::RateLimit { .. } => {}
            }
        }
        if r.in_service >= spec.capacity {
            return (refused, Seen::Unavailable, 0);
        }
        for f in spec.failures.iter().filter(active) {
            match f.kind {
                FailureKind::RateLimit { per_second } => {
                    let window = now / 1_000;
                    if window != r.window {
                        r.window = window;
                        r.window_count = 0;
                    }
                    if r.window_count >= per_second {
                        let wait = window
                            .saturating_add(1)
                            .saturating_mul(1_000)
                            .saturating_sub(now);
                        return (refused, Seen::RateLimited(wait), 0);
                    }
                    r.window_count = r.window_count.saturating_add(1);
                }
                FailureKind::Brownout { failure_permille } => {
                    if rng.chance_permille(failure_permille) {
                        return (refused, Seen::Unavailable, 0);
                    }
                }
                FailureKind::Outage | FailureKind::SlowTail { .. } => {}
            }
        }
        let latency = spec
            .latency
            .base_ms
            .saturating_add(rng.exp_ms(spec.latency.tail_mean_ms))
            .saturating_add(slow);
        let mut end = now.saturating_add(latency).max(now.saturating_add(1));
        let mut seen = Seen::Success;
        // An outage that opens while the attempt is in service fails it then.
        if let Some(kill) = spec
            .failures
            .iter()
            .filter(|f| f.kind == FailureKind::Outage && f.from_ms > now && f.from_ms < end)
            .map(|f| f.from_ms)
            .min()
        {
            end = kill;
            seen = Seen::Unavailable;
        }
        r.in_service = r.in_service.saturating_add(1);
        let route_arg = u32::try_from(route).unwrap_or(0);
        self.seq = self.seq.saturating_add(1);
        self.queue
            .push(Reverse((end, RELEASE, self.seq, route_arg)));
        if give_up_at < end {
            return (give_up_at.max(now), Seen::Timeout, spec.cost);
        }
        let cost = if seen == Seen::Success { spec.cost } else { 0 };
        (end, seen, cost)
    }

    fn finish(&mut self, now: u64, slot: u32, success: bool) -> Result<()> {
        let r = self.slot(slot)?;
        let (arrival, attempts, cost) = (r.arrival, r.attempts, r.cost);
        self.free.push(slot);
        let deadline = arrival.saturating_add(self.s.clients.deadline_ms);
        self.rec
            .finished(arrival, now, success, now >= deadline, attempts, cost);
        Ok(())
    }

    fn complete(&mut self, now: u64, slot: u32) -> Result<()> {
        let seen = self.slot(slot)?.seen.take().unwrap_or(Seen::Unavailable);
        match self.strategy {
            Strategy::Retryledger => self.ledger_observe(now, slot, seen),
            Strategy::Hedged => self.hedged_answer(now, slot, seen),
            _ if seen == Seen::Success => self.finish(now, slot, true),
            Strategy::NoRetry => self.finish(now, slot, false),
            Strategy::NaiveLayered => {
                // The innermost layer with a try left retries; the layers
                // inside it start over (an odometer: attempts^count in all).
                let tries = self.s.layers.attempts;
                let layers = usize::try_from(self.s.layers.count)
                    .unwrap_or(1)
                    .min(MAX_LAYERS);
                let r = self.slot(slot)?;
                let mut retried = false;
                for j in (0..layers).rev() {
                    let Some(c) = r.counters.get_mut(j) else {
                        continue;
                    };
                    if *c < tries {
                        *c = c.saturating_add(1);
                        for inner in r.counters.iter_mut().take(layers).skip(j.saturating_add(1)) {
                            *inner = 1;
                        }
                        retried = true;
                        break;
                    }
                }
                if !retried {
                    return self.finish(now, slot, false);
                }
                let delay = self.s.layers.delay_ms;
                if delay == 0 {
                    let give_up = now.saturating_add(self.s.clients.attempt_timeout_ms);
                    self.start(now, slot, 0, give_up)
                } else {
                    self.push(now.saturating_add(delay), WAKE, slot);
                    Ok(())
                }
            }
            Strategy::BackoffNoJitter | Strategy::BackoffFullJitter => {
                let b = &self.s.backoff;
                let r = self.slot(slot)?;
                let (attempts, arrival) = (u64::from(r.attempts), r.arrival);
                if attempts >= b.max_attempts {
                    return self.finish(now, slot, false);
                }
                let shift = u32::try_from(attempts.saturating_sub(1))
                    .unwrap_or(63)
                    .min(63);
                let exp = b
                    .base_ms
                    .checked_mul(1u64 << shift)
                    .map_or(b.max_ms, |v| v.min(b.max_ms));
                let term = if self.strategy == Strategy::BackoffFullJitter {
                    self.rng.between(0, exp)
                } else {
                    exp
                };
                // The SDKs honour a Retry-After hint.
                let hint = match seen {
                    Seen::RateLimited(ms) => ms,
                    _ => 0,
                };
                let at = now.saturating_add(term.max(hint));
                if at >= arrival.saturating_add(self.s.clients.deadline_ms) {
                    return self.finish(now, slot, false);
                }
                self.push(at, WAKE, slot);
                Ok(())
            }
        }
    }

    fn wake(&mut self, now: u64, slot: u32) -> Result<()> {
        if self.strategy == Strategy::Retryledger {
            let r = self.slot(slot)?;
            if r.admitted {
                r.admitted = false;
                let (route, arrival) = (r.route, r.arrival);
                return self.ledger_start(now, slot, route, arrival);
            }
            return self.ledger_admit(now, slot);
        }
        let give_up = now.saturating_add(self.s.clients.attempt_timeout_ms);
        self.start(now, slot, 0, give_up)
    }

    /// The session's next decision: end, wait until `not_before`, or admit now.
    fn ledger_next(&mut self, now: u64, slot: u32) -> Result<()> {
        let r = self.slot(slot)?;
        let arrival = r.arrival;
        let decision = r.session.as_ref().map(|s| match s.next() {
            Decision::Dispatch(d) => Ok(d.not_before_ms),
            Decision::Terminal { terminal } => Err(*terminal),
        });
        match decision {
            Some(Ok(not_before_ms)) => {
                let at = arrival.saturating_add(not_before_ms);
                if at > now {
                    self.push(at, WAKE, slot);
                    Ok(())
                } else {
                    self.ledger_admit(now, slot)
                }
            }
            Some(Err(terminal)) => {
                self.rec.terminal(terminal.as_str());
                self.finish(now, slot, terminal == Terminal::Completed)
            }
            None => Err(SimError::new("internal", "", "no session")),
        }
    }

    /// Admit the planned attempt under the shared store's view.
    fn ledger_admit(&mut self, now: u64, slot: u32) -> Result<()> {
        let epoch = EPOCH_MS.saturating_add(now);
        let Some(r) = self.slots.get_mut(slot as usize) else {
            return Err(SimError::new("internal", "", "no slot"));
        };
        let arrival = r.arrival;
        let Some(session) = r.session.as_mut() else {
            return Err(SimError::new("internal", "", "no session"));
        };
        let admitted = session
            .admit(now.saturating_sub(arrival), epoch, self.store.view())
            .map_err(|e| core(&e))?;
        self.store.write(admitted.writes);
        // Short of a budget that waits: nothing admitted, ask again then.
        if let Some(until) = admitted.wait_until_epoch_ms {
            let at = until.saturating_sub(EPOCH_MS).max(now.saturating_add(1));
            self.push(at, WAKE, slot);
            return Ok(());
        }
        match admitted.decision {
            Decision::Terminal { terminal } => {
                self.rec.terminal(terminal.as_str());
                self.finish(now, slot, terminal == Terminal::Completed)
            }
            Decision::Dispatch(d) => {
                let route = self
                    .releases
                    .iter()
                    .position(|rel| *rel == d.route_release_sha256)
                    .ok_or_else(|| SimError::new("internal", "", "an unknown route release"))?;
                let at = arrival.saturating_add(d.not_before_ms);
                if at > now {
                    let r = self.slot(slot)?;
                    r.admitted = true;
                    r.route = route;
                    self.push(at, WAKE, slot);
                    return Ok(());
                }
                self.ledger_start(now, slot, route, arrival)
            }
        }
    }

    fn ledger_start(&mut self, now: u64, slot: u32, route: usize, arrival: u64) -> Result<()> {
        let give_up = now
            .saturating_add(self.s.clients.attempt_timeout_ms)
            .min(arrival.saturating_add(self.s.clients.deadline_ms));
        self.start(now, slot, route, give_up)
    }

    /// The core judges what the client saw, the breaker records it, and the
    /// session decides what comes next.
    fn ledger_observe(&mut self, now: u64, slot: u32, seen: Seen) -> Result<()> {
        let epoch = EPOCH_MS.saturating_add(now);
        let mut facts = match seen {
            Seen::Success => Facts::returned(),
            Seen::Unavailable => Facts {
                status: Some(503),
                ..Facts::raised()
            },
            Seen::RateLimited(ms) => Facts {
                status: Some(429),
                headers: vec![("retry-after-ms".to_owned(), ms.to_string())],
                ..Facts::raised()
            },
            Seen::Timeout => Facts {
                transport_error: Some(Signal::Timeout),
                ..Facts::raised()
            },
        };
        facts.now_unix_ms = epoch;
        let Some(r) = self.slots.get_mut(slot as usize) else {
            return Err(SimError::new("internal", "", "no slot"));
        };
        let (arrival, started, cost, route) = (r.arrival, r.started, r.attempt_cost, r.route);
        let Some(session) = r.session.as_mut() else {
            return Err(SimError::new("internal", "", "no session"));
        };
        session
            .observe(
                started.saturating_sub(arrival),
                now.saturating_sub(arrival),
                Some(cost),
                &facts,
            )
            .map_err(|e| core(&e))?;
        if let Some(release) = self.releases.get(route) {
            let current = self.store.breaker(release, epoch);
            let next = session
                .breaker_after(&current, epoch)
                .map_err(|e| core(&e))?;
            self.store.put(next);
        }
        self.ledger_next(now, slot)
    }
}
