//! The run state machine: replay observed attempts against the plan, decide
//! the next dispatch or the terminal, and build the receipt.
//!
//! Per observed attempt, in order: it must be the planned attempt (else a
//! drift error); `completed_at_ms >= deadline_ms` ends the run with
//! `stop_deadline` even on success; spent cost above the maximum ends it with
//! `stop_cost_budget`; then the outcome decides. Before each dispatch, in
//! order: total attempts, route exhaustion, cost reservation, deadline. The
//! one exception: the planned cancel of an async job the run would leave
//! running ([`crate::job`]) may start at or after the deadline, and its
//! decision is the terminal that planned it.
//!
//! A retryable `in_progress` answer (a 409 with a hint to a keyed request:
//! the receiver still runs the first request) is asked again on the same
//! route, whatever its per-route bound, never on another route; at most
//! [`MAX_IN_PROGRESS`] such answers in a row, and when no ask fits (that
//! bound, total attempts, cost, deadline) the run stops `stop_indeterminate`.
//! The run never leaves that route afterwards: a later retryable failure
//! that cannot be retried on it (its bound, total attempts, cost, deadline)
//! stops `stop_indeterminate` as well.

use crate::attempt::{Attempt, Attempts};
use serde_json::Value;

use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{decode_tag, names, pick, At, Decode, Fields};
use crate::error::Result;
use crate::fleet::FleetSummary;
use crate::ids::{Identifier, Sha256Hex};
use crate::job::{JobKind, JobState, JobStep};
use crate::outcome::Outcome;
use crate::policy::CompiledPolicy;
use crate::receipt::{Receipt, ScheduleEntry};
use crate::schedule::{Delay, JitterDraw};
use crate::stream::{Continuation, StreamAction, Streaming};

mod judge;
mod keys;
mod plan;
mod seal;

/// Most `in_progress` answers in a row in one run. After this many, the
/// run stops `stop_indeterminate`: the first request's effect is unknown, as
/// after a reconciliation whose polls ran out (the journaled drivers ask 5
/// times by default). The run's total attempts, cost reservation and deadline
/// bound the asks as well; whichever ends them, the terminal is
/// `stop_indeterminate`.
pub const MAX_IN_PROGRESS: u64 = 5;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// Success on the primary or a compatible fallback, before the deadline.
    Completed,
    /// A non-retryable failure; no fallback.
    StopNonRetryable,
    /// An indeterminate outcome; reconcile, never retry.
    StopIndeterminate,
    /// The total attempt budget is spent.
    StopTotalAttempts,
    /// Every route's attempt budget is spent.
    StopRouteExhausted,
    /// Spent cost exceeds, or the next reservation would exceed, the maximum.
    StopCostBudget,
    /// An attempt completed at or after the deadline, or the next could not start before it.
    StopDeadline,
    /// The caller cancelled the run between attempts.
    StopCancelled,
    /// No route's circuit breaker admits.
    StopCircuitOpen,
    /// A retry or fallback the fleet retry budget does not cover.
    StopRetryBudget,
    /// The fleet store is unavailable and the policy fails closed.
    StopStoreUnavailable,
    /// A Retry-After hint above the policy's cap, under `stop` (or
    /// `skip_route` with no route left).
    StopRetryAfter,
    /// The fleet's admission limits do not admit the next dispatch within
    /// the queue bound, or early enough to leave room before the deadline.
    StopAdmission,
    /// The planned route's key pool has no usable key: every key was
    /// refused (401, 403), or none clears before the deadline.
    StopNoUsableKey,
}

names!(Terminal {
    Completed => "completed",
    StopNonRetryable => "stop_non_retryable",
    StopIndeterminate => "stop_indeterminate",
    StopTotalAttempts => "stop_total_attempts",
    StopRouteExhausted => "stop_route_exhausted",
    StopCostBudget => "stop_cost_budget",
    StopDeadline => "stop_deadline",
    StopCancelled => "stop_cancelled",
    StopCircuitOpen => "stop_circuit_open",
    StopRetryBudget => "stop_retry_budget",
    StopStoreUnavailable => "stop_store_unavailable",
    StopRetryAfter => "stop_retry_after",
    StopAdmission => "stop_admission",
    StopNoUsableKey => "stop_no_usable_key",
});

/// The next attempt to dispatch, and not before when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// For a streamed run: the provider response this attempt resumes.
    pub continuation: Option<Continuation>,
    /// The run's absolute deadline, ms.
    pub deadline_ms: u64,
    /// The delay from the previous completion, ms (0 for the first attempt).
    pub delay_ms: u64,
    /// Digest of the idempotency key to send.
    pub idempotency_key_sha256: Sha256Hex,
    /// Jitter interval upper end, when jitter is on.
    pub jitter_max_ms: Option<u64>,
    /// Jitter interval lower end, when jitter is on.
    pub jitter_min_ms: Option<u64>,
    /// The jitter sample to record on the attempt, when jitter is on.
    pub jitter_sample_ms: Option<u64>,
    /// For an async job: a submit, or a poll of the accepted job ([`crate::job`]).
    pub job: Option<JobStep>,
    /// Digest of the logical request to send.
    pub logical_request_sha256: Sha256Hex,
    /// Earliest start, ms.
    pub not_before_ms: u64,
    /// Global ordinal, from 1.
    pub ordinal: u64,
    /// Cost reserved for this attempt.
    pub reserve_cost: u64,
    /// The bounded Retry-After floor that applied, ms.
    pub retry_after_floor_ms: u64,
    /// Route to use.
    pub route_id: Identifier,
    /// Ordinal on the route, from 1.
    pub route_ordinal: u64,
    /// Route release to use.
    pub route_release_sha256: Sha256Hex,
}

impl Dispatch {
    /// The attempt that carries out this dispatch: its identity (ordinal,
    /// route, release, request, key, jitter sample) from the plan, its
    /// timing, cost and outcome as observed, every optional record absent.
    pub fn attempt(
        &self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: u64,
        outcome: Outcome,
    ) -> Attempt {
        Attempt {
            admission: None,
            completed_at_ms,
            cost,
            hedge: None,
            idempotency_key_sha256: self.idempotency_key_sha256.clone(),
            injected_fault: None,
            jitter_sample_ms: self.jitter_sample_ms,
            job: None,
            key_refused: None,
            logical_request_sha256: self.logical_request_sha256.clone(),
            model: None,
            ordinal: self.ordinal,
            outcome,
            output_check: None,
            reconciled: None,
            request_body_sha256: None,
            route_id: self.route_id.clone(),
            route_ordinal: self.route_ordinal,
            route_release_sha256: self.route_release_sha256.clone(),
            started_at_ms,
            stream: None,
            usage: None,
        }
    }

    fn jitter(&self) -> Option<JitterDraw> {
        match (
            self.jitter_min_ms,
            self.jitter_max_ms,
            self.jitter_sample_ms,
        ) {
            (Some(min_ms), Some(max_ms), Some(sample_ms)) => Some(JitterDraw {
                min_ms,
                max_ms,
                sample_ms,
            }),
            _ => None,
        }
    }
}

/// What to do next: dispatch an attempt, or the run's terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a decision is held once per run and passed by reference; boxing the dispatch costs an allocation per attempt"
)]
pub enum Decision {
    /// Dispatch this attempt no earlier than `not_before_ms`.
    Dispatch(Dispatch),
    /// The run is over.
    Terminal {
        /// How it ended.
        terminal: Terminal,
    },
}

impl Dispatch {
    /// The fields in RFC 8785 order, with the decision's `kind` tag among them.
    fn write(&self, kind: Option<&str>, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.opt_doc("continuation", self.continuation.as_ref())
            .u64("deadline_ms", self.deadline_ms)
            .u64("delay_ms", self.delay_ms)
            .doc("idempotency_key_sha256", &self.idempotency_key_sha256)
            .opt_u64("jitter_max_ms", self.jitter_max_ms)
            .opt_u64("jitter_min_ms", self.jitter_min_ms)
            .opt_u64("jitter_sample_ms", self.jitter_sample_ms)
            .opt_doc("job", self.job.as_ref());
        if let Some(kind) = kind {
            o.str("kind", kind);
        }
        o.doc("logical_request_sha256", &self.logical_request_sha256)
            .u64("not_before_ms", self.not_before_ms)
            .u64("ordinal", self.ordinal)
            .u64("reserve_cost", self.reserve_cost)
            .u64("retry_after_floor_ms", self.retry_after_floor_ms)
            .doc("route_id", &self.route_id)
            .u64("route_ordinal", self.route_ordinal)
            .doc("route_release_sha256", &self.route_release_sha256)
            .end();
    }
}

impl Encode for Dispatch {
    fn encode(&self, sink: &mut dyn Sink) {
        self.write(None, sink);
    }
}

/// A decision is an object tagged by `kind`, its keys in RFC 8785 order.
impl Encode for Decision {
    fn encode(&self, sink: &mut dyn Sink) {
        match self {
            Self::Dispatch(d) => d.write(Some("dispatch"), sink),
            Self::Terminal { terminal } => {
                ObjectWriter::new(sink)
                    .str("kind", "terminal")
                    .doc("terminal", terminal)
                    .end();
            }
        }
    }
}

/// The kinds of [`Decision`], as its `kind` tag names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecisionKind {
    Dispatch,
    Terminal,
}

names!(DecisionKind {
    Dispatch => "dispatch",
    Terminal => "terminal",
});

/// A decision is an object tagged by `kind`; a bad tag is reported at
/// `kind`, everything else inside the object at the object.
impl Decode for Decision {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = pick(
            DecisionKind::ALL,
            decode_tag(v, at, "kind", DecisionKind::NAMES)?,
            at,
        )?;
        let mut f = Fields::open(v, at)?.variant("kind");
        if kind == DecisionKind::Terminal {
            let terminal = f.req("terminal");
            f.end()?;
            let Some(terminal) = terminal else {
                return Err(f.incomplete());
            };
            return Ok(Self::Terminal { terminal });
        }
        Ok(Self::Dispatch(dispatch_fields(&mut f)?))
    }
}

/// The fields of a dispatch, read in order (the `kind` tag, if any, is the caller's).
fn dispatch_fields(f: &mut Fields<'_>) -> Result<Dispatch> {
    let continuation: Option<Continuation> = f.opt("continuation");
    let deadline_ms = f.req("deadline_ms");
    let delay_ms = f.req("delay_ms");
    let idempotency_key_sha256 = f.req("idempotency_key_sha256");
    let jitter_max_ms = f.opt("jitter_max_ms");
    let jitter_min_ms = f.opt("jitter_min_ms");
    let jitter_sample_ms = f.opt("jitter_sample_ms");
    let job = f.opt("job");
    let logical_request_sha256 = f.req("logical_request_sha256");
    let not_before_ms = f.req("not_before_ms");
    let ordinal = f.req("ordinal");
    let reserve_cost = f.req("reserve_cost");
    let retry_after_floor_ms = f.req("retry_after_floor_ms");
    let route_id = f.req("route_id");
    let route_ordinal = f.req("route_ordinal");
    let route_release_sha256 = f.req("route_release_sha256");
    f.end()?;
    let (
        Some(deadline_ms),
        Some(delay_ms),
        Some(idempotency_key_sha256),
        Some(logical_request_sha256),
        Some(not_before_ms),
        Some(ordinal),
        Some(reserve_cost),
        Some(retry_after_floor_ms),
        Some(route_id),
        Some(route_ordinal),
        Some(route_release_sha256),
    ) = (
        deadline_ms,
        delay_ms,
        idempotency_key_sha256,
        logical_request_sha256,
        not_before_ms,
        ordinal,
        reserve_cost,
        retry_after_floor_ms,
        route_id,
        route_ordinal,
        route_release_sha256,
    )
    else {
        return Err(f.incomplete());
    };
    Ok(Dispatch {
        continuation,
        deadline_ms,
        delay_ms,
        idempotency_key_sha256,
        jitter_max_ms,
        jitter_min_ms,
        jitter_sample_ms,
        job,
        logical_request_sha256,
        not_before_ms,
        ordinal,
        reserve_cost,
        retry_after_floor_ms,
        route_id,
        route_ordinal,
        route_release_sha256,
    })
}

/// A dispatch alone (the plan a journal's `reserved` event holds): the
/// fields of a `dispatch` decision without its `kind`.
impl Decode for Dispatch {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        dispatch_fields(&mut Fields::open(v, at)?)
    }
}

/// Replay state after some observed attempts. It holds no reference to the
/// policy, so a [`crate::session::Session`] can own both and advance one
/// attempt at a time; every method takes the compiled policy it plans for.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    spent: u64,
    per_route: Vec<u64>,
    count: u64,
    last_sample: Option<u64>,
    next: Decision,
    schedule: Vec<ScheduleEntry>,
    fallback_used: bool,
    final_priority: Option<usize>,
    finished_at_ms: u64,
    streaming: Option<Streaming>,
    /// The stream action after each attempt (and after a cancellation).
    actions: Vec<StreamAction>,
    fleet: Option<FleetSummary>,
    /// Per route (by priority), the request body digest its first attempt
    /// recorded (`Some(None)`: it recorded none); a retry sends the same body.
    bodies: Vec<Option<Option<Sha256Hex>>>,
    /// Attempts whose failure a testing fault injector made.
    injected: u64,
    /// What hedging did, for a policy with a hedge section ([`crate::hedge`]).
    hedge: Option<crate::hedge::HedgeSummary>,
    /// What the run's hedges reserved in all.
    hedge_reserved: u64,
    /// The async job's state, when the policy has an `async_job` section.
    job: Option<JobState>,
    /// The `in_progress` answers in a row of the last attempts.
    in_progress: u64,
    /// The route (by priority) that answered `in_progress`: the run never
    /// leaves it, since its receiver holds the first request's effect.
    pinned: Option<usize>,
    /// Per route (by priority), the attempts whose pool key the provider
    /// refused: counted in `per_route`, not against the route's bound.
    refused: Vec<u64>,
    /// Keys refused in this run that stay disabled for its whole length
    /// (their pool sets no `disable_ms`): never sent again.
    refused_keys: Vec<Sha256Hex>,
}

impl Run {
    pub(crate) fn new(cp: &CompiledPolicy) -> Self {
        let mut run = Run {
            spent: 0,
            per_route: vec![0; cp.policy.routes.len()],
            count: 0,
            last_sample: None,
            next: Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            },
            schedule: Vec::new(),
            fallback_used: false,
            final_priority: None,
            finished_at_ms: 0,
            streaming: cp.policy.stream.as_ref().map(|s| Streaming::new(s.mode)),
            actions: Vec::new(),
            fleet: cp.policy.fleet.as_ref().map(|f| FleetSummary {
                queue_wait_ms: f.admission.as_ref().map(|_| 0),
                ..FleetSummary::default()
            }),
            bodies: vec![None; cp.policy.routes.len()],
            injected: 0,
            hedge: cp
                .policy
                .hedge
                .as_ref()
                .map(|_| crate::hedge::HedgeSummary::default()),
            hedge_reserved: 0,
            job: cp.policy.async_job.as_ref().map(|_| JobState::new(cp)),
            in_progress: 0,
            pinned: None,
            refused: vec![0; cp.policy.routes.len()],
            refused_keys: Vec::new(),
        };
        let first = Delay {
            delay_ms: 0,
            retry_after_floor_ms: 0,
            jitter: None,
        };
        run.next = run.admit(cp, 0, 1, 0, first);
        run
    }

    /// The next decision.
    pub(crate) fn next(&self) -> &Decision {
        &self.next
    }

    pub(crate) fn terminal(&self) -> Option<Terminal> {
        match self.next {
            Decision::Terminal { terminal } => Some(terminal),
            Decision::Dispatch(_) => None,
        }
    }

    /// Attempts so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Cost spent so far.
    pub(crate) fn spent(&self) -> u64 {
        self.spent
    }

    /// Attempts so far on the route at `priority` that count against its
    /// bound (every one but those whose pool key was refused).
    pub(crate) fn used_on(&self, priority: usize) -> u64 {
        let refused = self.refused.get(priority).copied().unwrap_or(0);
        self.per_route
            .get(priority)
            .copied()
            .unwrap_or(0)
            .saturating_sub(refused)
    }

    /// After a hedged round: the route of the attempt that decided it and
    /// the round's last completion (a loser may end after the winner).
    pub(crate) fn settle_round(&mut self, final_priority: usize, finished_at_ms: u64) {
        self.final_priority = Some(final_priority);
        self.finished_at_ms = self.finished_at_ms.max(finished_at_ms);
    }

    /// The hedge summary the receipt carries.
    pub(crate) fn set_hedge(&mut self, summary: crate::hedge::HedgeSummary) {
        self.hedge = Some(summary);
    }

    /// The hedge summary so far (a policy with a hedge section).
    pub(crate) fn hedge_summary(&self) -> Option<&crate::hedge::HedgeSummary> {
        self.hedge.as_ref()
    }

    /// What the run's hedges reserved in all.
    pub(crate) fn hedge_reserved(&self) -> u64 {
        self.hedge_reserved
    }

    /// Count a hedge's reservation.
    pub(crate) fn add_hedge_reserved(&mut self, reserve: u64) {
        self.hedge_reserved = self.hedge_reserved.saturating_add(reserve);
    }

    /// The stream action after each observed attempt, then after a cancellation.
    pub(crate) fn stream_actions(&self) -> &[StreamAction] {
        &self.actions
    }

    /// The action the last step took, for a session's event log.
    pub(crate) fn last_action(&self) -> StreamAction {
        self.actions.last().copied().unwrap_or(StreamAction::None)
    }
}

pub(crate) fn replay(policy: &CompiledPolicy, attempts: &Attempts) -> Result<Run> {
    if policy.policy.hedge.is_some() {
        return crate::hedge::replay(policy, attempts);
    }
    let mut run = Run::new(policy);
    let list = &attempts.attempts;
    // A job's cancel planned by the caller's cancellation comes after it.
    let before_cancel = match (attempts.cancelled_at_ms, list.last()) {
        (Some(_), Some(last)) if last.job.as_ref().is_some_and(|j| j.kind == JobKind::Cancel) => {
            list.len().saturating_sub(1)
        }
        _ => list.len(),
    };
    for (i, a) in list.iter().enumerate().take(before_cancel) {
        let d = run.check(policy, a, i)?;
        run.observe(policy, a, d, i)?;
    }
    if let Some(at) = attempts.cancelled_at_ms {
        run.cancel(at)?;
    }
    for (i, a) in list.iter().enumerate().skip(before_cancel) {
        let d = run.check(policy, a, i)?;
        run.observe(policy, a, d, i)?;
    }
    if let Some(stop) = &attempts.fleet_stop {
        run.fleet_stop(policy, stop)?;
    }
    Ok(run)
}

/// The next step of a run: the planned dispatch, or the terminal.
pub fn plan_next(policy: &CompiledPolicy, attempts: &Attempts) -> Result<Decision> {
    Ok(replay(policy, attempts)?.next)
}

/// The receipt of a finished run. A run that could still dispatch is an error.
pub fn evaluate(policy: &CompiledPolicy, attempts: &Attempts) -> Result<Receipt> {
    replay(policy, attempts)?.receipt(policy, digest_of(attempts))
}
