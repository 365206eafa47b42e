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
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{BudgetUse, FleetStop, FleetSummary, OnStoreUnavailable, StopReason};
use crate::ids::{Identifier, Sha256Hex};
use crate::job::{JobKind, JobState, JobStep};
use crate::outcome::{Outcome, RetryableKind};
use crate::policy::{CompiledPolicy, OverCap};
use crate::receipt::{Receipt, ReceiptSchema, RouteCount, ScheduleEntry};
use crate::schedule::{next_delay, Delay, JitterDraw};
use crate::stream::{Continuation, StreamAction, Streaming};

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
}

/// Whether an attempt's request body is compared with its route's first: it
/// sends its own request (a continuation resumes another's) and was observed
/// by the owner that sent it (a reconciled attempt's sender did not live to
/// say what it sent).
fn sends_request(a: &Attempt) -> bool {
    a.reconciled.is_none()
        && a.job.as_ref().is_none_or(|j| j.kind == JobKind::Submit)
        && a.stream
            .as_ref()
            .is_none_or(|s| s.continues_ordinal.is_none())
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

    /// The pre-dispatch checks that follow the route choice: cost reservation, then deadline.
    fn admit(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        not_before: u64,
        delay: Delay,
    ) -> Decision {
        let p = &cp.policy;
        let jitter = delay.jitter;
        let Some(route) = cp.route_at(priority) else {
            return Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            };
        };
        let reserved = self.spent.checked_add(route.reserve_cost);
        if reserved.is_none_or(|r| r > p.max_total_cost) {
            return Decision::Terminal {
                terminal: Terminal::StopCostBudget,
            };
        }
        if not_before >= p.deadline_ms {
            return Decision::Terminal {
                terminal: Terminal::StopDeadline,
            };
        }
        Decision::Dispatch(Dispatch {
            continuation: None,
            deadline_ms: p.deadline_ms,
            delay_ms: delay.delay_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            jitter_max_ms: jitter.map(|j| j.max_ms),
            jitter_min_ms: jitter.map(|j| j.min_ms),
            jitter_sample_ms: jitter.map(|j| j.sample_ms),
            job: self.job.as_ref().map(JobState::step),
            logical_request_sha256: p.logical_request_sha256.clone(),
            not_before_ms: not_before,
            ordinal: self.count.saturating_add(1),
            reserve_cost: route.reserve_cost,
            retry_after_floor_ms: delay.retry_after_floor_ms,
            route_id: route.route_id.clone(),
            route_ordinal,
            route_release_sha256: route.route_release_sha256.clone(),
        })
    }

    /// Plan after a retryable failure of `route_ordinal` on `priority`, completed at `completed`.
    fn plan_after(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        if self.count >= p.max_total_attempts {
            return Decision::Terminal {
                terminal: Terminal::StopTotalAttempts,
            };
        }
        let used = self.per_route.get(priority).copied().unwrap_or(0);
        let bound = cp.route_at(priority).map_or(0, |r| r.max_attempts);
        // A hint above the cap: clamp it (below), stop, or leave the route.
        let over_cap = hint.is_some_and(|h| h > p.backoff.retry_after_cap_ms);
        let mode = p.backoff.retry_after_over_cap.unwrap_or(OverCap::Clamp);
        let leave = over_cap && mode == OverCap::SkipRoute;
        if over_cap && mode == OverCap::Stop {
            return Decision::Terminal {
                terminal: Terminal::StopRetryAfter,
            };
        }
        let (next_priority, next_ordinal) = if used < bound && !leave {
            (priority, route_ordinal.saturating_add(1))
        } else {
            (priority.saturating_add(1), 1)
        };
        // A route that answered `in_progress` holds the effect: never leave
        // it (`decide` makes the terminal `stop_indeterminate`).
        if self.pinned.is_some_and(|p| p != next_priority) {
            return Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            };
        }
        if cp.route_at(next_priority).is_none() {
            return Decision::Terminal {
                terminal: if leave {
                    Terminal::StopRetryAfter
                } else {
                    Terminal::StopRouteExhausted
                },
            };
        }
        // The hint is the failed route's: another route waits the backoff only.
        let hint = if leave { None } else { hint };
        let latest_delay = p.deadline_ms.saturating_sub(1).saturating_sub(completed);
        let d = next_delay(
            &p.backoff,
            &p.jitter,
            route_ordinal,
            hint,
            self.last_sample,
            self.count.saturating_add(1),
            latest_delay,
        );
        let not_before = completed.saturating_add(d.delay_ms);
        self.admit(cp, next_priority, next_ordinal, not_before, d)
    }

    /// Plan after an `in_progress` answer to `route_ordinal` on `priority`,
    /// completed at `completed`: ask again on the same route with the same
    /// key and body (another route's receiver would run the effect a second
    /// time), its per-route bound notwithstanding, after the backoff raised
    /// to the hint (clamped to the cap under every over-cap mode). When the
    /// ask does not fit ([`MAX_IN_PROGRESS`] answers in a row, total
    /// attempts, cost reservation, deadline) the effect's fate is unknown:
    /// `stop_indeterminate`.
    fn plan_in_progress(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        let unknown = Decision::Terminal {
            terminal: Terminal::StopIndeterminate,
        };
        if self.in_progress >= MAX_IN_PROGRESS || self.count >= p.max_total_attempts {
            return unknown;
        }
        let latest_delay = p.deadline_ms.saturating_sub(1).saturating_sub(completed);
        let d = next_delay(
            &p.backoff,
            &p.jitter,
            route_ordinal,
            hint,
            self.last_sample,
            self.count.saturating_add(1),
            latest_delay,
        );
        let not_before = completed.saturating_add(d.delay_ms);
        match self.admit(cp, priority, route_ordinal.saturating_add(1), not_before, d) {
            Decision::Terminal { .. } => unknown,
            ask => ask,
        }
    }

    /// The next poll of an accepted job, after attempt `a` (the acceptance
    /// or the previous poll) on its route: `delay` after its completion,
    /// raised to the bounded hint; the deadline still applies.
    fn plan_poll(
        &self,
        cp: &CompiledPolicy,
        a: &Attempt,
        job: &JobState,
        delay: u64,
        hint: Option<u64>,
    ) -> Decision {
        let p = &cp.policy;
        let floor = crate::job::poll_floor(&p.backoff, hint);
        let delay_ms = delay.max(floor);
        let not_before = a.completed_at_ms.saturating_add(delay_ms);
        if not_before >= p.deadline_ms {
            return Decision::Terminal {
                terminal: Terminal::StopDeadline,
            };
        }
        Decision::Dispatch(Dispatch {
            continuation: None,
            deadline_ms: p.deadline_ms,
            delay_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            jitter_max_ms: None,
            jitter_min_ms: None,
            jitter_sample_ms: None,
            job: Some(job.step()),
            logical_request_sha256: p.logical_request_sha256.clone(),
            not_before_ms: not_before,
            ordinal: self.count.saturating_add(1),
            reserve_cost: 0,
            retry_after_floor_ms: floor,
            route_id: a.route_id.clone(),
            route_ordinal: a.route_ordinal,
            route_release_sha256: a.route_release_sha256.clone(),
        })
    }

    /// The planned dispatch on the next route by priority that still has
    /// attempts, when the planned route is skipped (its breaker refused).
    /// Never after an `in_progress` answer: the run stays on its route.
    pub(crate) fn skip_route(&self, cp: &CompiledPolicy, d: &Dispatch) -> Option<Dispatch> {
        if self.pinned.is_some() {
            return None;
        }
        let from = cp.routes().position(|r| r.route_id == d.route_id)?;
        let (priority, used) = cp
            .routes()
            .enumerate()
            .skip(from.saturating_add(1))
            .map(|(p, r)| (p, self.per_route.get(p).copied().unwrap_or(0), r))
            .find(|(_, used, r)| *used < r.max_attempts)
            .map(|(p, used, _)| (p, used))?;
        let delay = Delay {
            delay_ms: d.delay_ms,
            retry_after_floor_ms: d.retry_after_floor_ms,
            jitter: d.jitter(),
        };
        match self.admit(cp, priority, used.saturating_add(1), d.not_before_ms, delay) {
            Decision::Dispatch(moved) => Some(Dispatch {
                continuation: None,
                ..moved
            }),
            Decision::Terminal { .. } => None,
        }
    }

    /// The dispatch an attempt's admission implies: the plan after its
    /// skipped routes. The admission must fit the policy's fleet section.
    fn admitted(
        &self,
        cp: &CompiledPolicy,
        d: Dispatch,
        a: &Attempt,
        i: usize,
    ) -> Result<Dispatch> {
        let drift =
            |code, field: &str, msg: &str| Err(Error::attempt(code, i, field, msg.to_owned()));
        let admits = crate::job::admitted_step(&d);
        let (fleet, adm) = match (&cp.policy.fleet, &a.admission) {
            (None, None) => return Ok(d),
            // A job's polls and its cancel are not admitted.
            (Some(_), None) if !admits => return Ok(d),
            (Some(_), Some(_)) if !admits => {
                return drift(
                    ErrorCode::AdmissionUnexpected,
                    "admission",
                    "a job's poll or cancel is not admitted by the fleet",
                )
            }
            (Some(_), None) => {
                return drift(
                    ErrorCode::AdmissionMissing,
                    "admission",
                    "the policy has a fleet section but the attempt records no admission",
                )
            }
            (None, Some(_)) => {
                return drift(
                    ErrorCode::AdmissionUnexpected,
                    "admission",
                    "the attempt records an admission the policy has no fleet for",
                )
            }
            (Some(f), Some(adm)) => (f, adm),
        };
        if adm.store.is_some() {
            if fleet.on_store_unavailable != OnStoreUnavailable::FailOpen
                || adm.breaker.is_some()
                || adm.budget.is_some()
                || adm.limits.is_some()
                || adm.skipped.is_some()
            {
                return drift(
                    ErrorCode::AdmissionDrift,
                    "admission/store",
                    "only a fail_open policy admits without its store, and then reads no snapshot",
                );
            }
            return Ok(d);
        }
        let mut plan = d;
        for skip in adm.skipped.iter().flat_map(|s| s.0.iter()) {
            if fleet.breaker.is_none() || skip.route_id != plan.route_id {
                return drift(
                    ErrorCode::AdmissionDrift,
                    "admission/skipped",
                    "a skipped route is not the planned one",
                );
            }
            plan = match self.skip_route(cp, &plan) {
                Some(p) => p,
                None => {
                    return drift(
                        ErrorCode::AdmissionDrift,
                        "admission/skipped",
                        "no route is left after the skipped ones: the run should have stopped",
                    )
                }
            };
        }
        if fleet.admission.is_some() != adm.limits.is_some()
            || adm
                .limits
                .as_ref()
                .is_some_and(|l| l.start_epoch_ms.is_none())
        {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/limits",
                "an admission reads the admission limits exactly when the policy has them, and records its start",
            );
        }
        if fleet.breaker.is_some() != adm.breaker.is_some() {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/breaker",
                "an admission reads the breaker exactly when the policy has one",
            );
        }
        let want = if plan.ordinal == 1 {
            BudgetUse::Deposit
        } else {
            BudgetUse::Withdraw
        };
        let budget_ok = match (&fleet.retry_budget, &adm.budget) {
            (None, None) => true,
            (Some(_), Some(b)) => b.kind == want,
            _ => false,
        };
        if !budget_ok {
            return drift(
                ErrorCode::AdmissionDrift,
                "admission/budget",
                "a first attempt deposits into the retry budget and every later one withdraws",
            );
        }
        Ok(plan)
    }

    /// The fleet refused the next dispatch at `stop.at_ms` (run clock).
    pub(crate) fn fleet_stop(&mut self, cp: &CompiledPolicy, stop: &FleetStop) -> Result<()> {
        let bad = |msg: &str| {
            Err(Error::at(
                ErrorCode::AdmissionDrift,
                "/fleet_stop",
                msg.to_owned(),
            ))
        };
        let Some(fleet) = &cp.policy.fleet else {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet_stop",
                "a fleet stop under a policy without a fleet section",
            ));
        };
        let Decision::Dispatch(d) = &self.next else {
            return bad("the run had already ended");
        };
        if stop.at_ms < self.finished_at_ms {
            return bad("the fleet stop comes before the last completion");
        }
        let mut plan = d.clone();
        let skips: &[crate::fleet::Skip] = stop.skipped.as_ref().map_or(&[], |s| &s.0);
        let mut exhausted = false;
        for (k, skip) in skips.iter().enumerate() {
            if fleet.breaker.is_none() || skip.route_id != plan.route_id || exhausted {
                return bad("a skipped route is not the planned one");
            }
            match self.skip_route(cp, &plan) {
                Some(p) => plan = p,
                None => exhausted = k.saturating_add(1) == skips.len(),
            }
        }
        let terminal = match stop.reason {
            StopReason::CircuitOpen if exhausted => Terminal::StopCircuitOpen,
            StopReason::CircuitOpen => return bad("a route is left that was not tried"),
            StopReason::RetryBudget
                if fleet.retry_budget.is_some() && plan.ordinal > 1 && stop.budget.is_some() =>
            {
                Terminal::StopRetryBudget
            }
            StopReason::RetryBudget => {
                return bad("only a retry or fallback can be short of the retry budget")
            }
            StopReason::StoreUnavailable
                if fleet.on_store_unavailable == OnStoreUnavailable::FailClosed
                    && skips.is_empty() =>
            {
                Terminal::StopStoreUnavailable
            }
            StopReason::StoreUnavailable => {
                return bad("only a fail_closed policy stops for its store")
            }
            StopReason::Admission if fleet.admission.is_some() && stop.limits.is_some() => {
                Terminal::StopAdmission
            }
            StopReason::Admission => {
                return bad(
                    "only a policy with admission limits stops for them, and records the snapshot",
                )
            }
        };
        if let Some(f) = self.fleet.as_mut() {
            f.routes_skipped = f
                .routes_skipped
                .saturating_add(u64::try_from(skips.len()).unwrap_or(0));
        }
        self.finished_at_ms = stop.at_ms;
        self.next = Decision::Terminal { terminal };
        if let Some(st) = self.streaming.as_mut() {
            let action = st.settle(Some(terminal), false);
            self.actions.push(action);
        }
        Ok(())
    }

    pub(crate) fn check(&self, cp: &CompiledPolicy, a: &Attempt, i: usize) -> Result<Dispatch> {
        let d: Dispatch = match &self.next {
            Decision::Dispatch(d) => self.admitted(cp, d.clone(), a, i)?,
            Decision::Terminal { terminal } => {
                if let Some(e) = self.job.as_ref().and_then(|j| j.after_terminal(a, i)) {
                    return Err(e);
                }
                return Err(Error::attempt(
                    ErrorCode::AttemptAfterTerminal,
                    i,
                    "ordinal",
                    format!(
                        "attempt observed after the run ended with {}",
                        terminal.as_str()
                    ),
                ));
            }
        };
        self.check_planned(cp, a, d, i)
    }

    /// The checks of an attempt against a given plan (the next dispatch,
    /// or a hedge [`crate::hedge`] planned).
    pub(crate) fn check_planned(
        &self,
        cp: &CompiledPolicy,
        a: &Attempt,
        d: Dispatch,
        i: usize,
    ) -> Result<Dispatch> {
        let drift = |code, field: &str, msg: String| Err(Error::attempt(code, i, field, msg));
        if a.route_id != d.route_id {
            return drift(
                ErrorCode::RouteDrift,
                "route_id",
                format!("planned route `{}`, observed `{}`", d.route_id, a.route_id),
            );
        }
        if a.route_release_sha256 != d.route_release_sha256 {
            return drift(
                ErrorCode::ReleaseDrift,
                "route_release_sha256",
                "route release differs from the planned release".into(),
            );
        }
        if a.ordinal != d.ordinal {
            return drift(
                ErrorCode::OrdinalDrift,
                "ordinal",
                format!("planned ordinal {}, observed {}", d.ordinal, a.ordinal),
            );
        }
        if a.route_ordinal != d.route_ordinal {
            return drift(
                ErrorCode::RouteOrdinalDrift,
                "route_ordinal",
                format!(
                    "planned route ordinal {}, observed {}",
                    d.route_ordinal, a.route_ordinal
                ),
            );
        }
        if a.logical_request_sha256 != d.logical_request_sha256 {
            return drift(
                ErrorCode::LogicalRequestDrift,
                "logical_request_sha256",
                "attempt belongs to another logical request".into(),
            );
        }
        if a.idempotency_key_sha256 != d.idempotency_key_sha256 {
            return drift(
                ErrorCode::IdempotencyKeyDrift,
                "idempotency_key_sha256",
                "attempt carries another idempotency key".into(),
            );
        }
        match (d.jitter(), a.jitter_sample_ms) {
            (None, None) => {}
            (Some(_), None) => {
                return drift(
                    ErrorCode::JitterSampleMissing,
                    "jitter_sample_ms",
                    "jitter is on but the attempt records no sample".into(),
                )
            }
            (None, Some(_)) => {
                return drift(
                    ErrorCode::JitterSampleUnexpected,
                    "jitter_sample_ms",
                    "the attempt records a sample where none was drawn".into(),
                )
            }
            (Some(j), Some(s)) => {
                if s < j.min_ms || s > j.max_ms {
                    return drift(
                        ErrorCode::JitterOutOfInterval,
                        "jitter_sample_ms",
                        format!("sample {s} outside [{}, {}]", j.min_ms, j.max_ms),
                    );
                }
                if s != j.sample_ms {
                    return drift(
                        ErrorCode::JitterSampleDrift,
                        "jitter_sample_ms",
                        format!("sample {s} is not the seeded draw {}", j.sample_ms),
                    );
                }
            }
        }
        match (&self.streaming, &a.stream) {
            (Some(_), None) => {
                return drift(
                    ErrorCode::StreamRecordMissing,
                    "stream",
                    "the policy streams but the attempt records no stream".into(),
                )
            }
            (None, Some(_)) => {
                return drift(
                    ErrorCode::StreamRecordUnexpected,
                    "stream",
                    "the attempt records a stream the policy does not have".into(),
                )
            }
            (Some(_), Some(s)) => {
                let planned = d.continuation.as_ref();
                if s.continues_ordinal != planned.map(|c| c.continues_ordinal)
                    || s.starting_after != planned.map(|c| c.starting_after)
                {
                    return drift(
                        ErrorCode::ContinuationDrift,
                        "stream/continues_ordinal",
                        "the attempt's continuation is not the planned one".into(),
                    );
                }
                if a.outcome == Outcome::Success && !s.terminal_event {
                    return drift(
                        ErrorCode::StreamCommitBeforeTerminal,
                        "stream/terminal_event",
                        "a streamed attempt succeeded without the provider's terminal event".into(),
                    );
                }
            }
            (None, None) => {}
        }
        crate::job::check(&d, a, i)?;
        if sends_request(a) {
            let priority = cp.routes().position(|r| r.route_id == a.route_id);
            if let Some(Some(first)) = priority.and_then(|p| self.bodies.get(p)) {
                if first != &a.request_body_sha256 {
                    return drift(
                        ErrorCode::RequestBodyDrift,
                        "request_body_sha256",
                        "the attempt sent another request body than the first attempt on its route"
                            .into(),
                    );
                }
            }
        }
        if a.started_at_ms < d.not_before_ms {
            return drift(
                ErrorCode::EarlyStart,
                "started_at_ms",
                format!(
                    "started at {} before not_before {}",
                    a.started_at_ms, d.not_before_ms
                ),
            );
        }
        if a.reconciled.is_some_and(|r| r.outcome() != a.outcome) {
            return drift(
                ErrorCode::ReconciliationDrift,
                "reconciled",
                "a reconciled attempt's outcome is the one its answer stands for".into(),
            );
        }
        if a.output_check
            .as_ref()
            .is_some_and(|c| crate::output::outcome_of(c.kind) != a.outcome)
        {
            return drift(
                ErrorCode::OutputCheckDrift,
                "output_check",
                "an attempt's output check stands for its outcome (crate::output::OUTPUT_CHECKS)"
                    .into(),
            );
        }
        if a.completed_at_ms < a.started_at_ms {
            return drift(
                ErrorCode::CompletedBeforeStarted,
                "completed_at_ms",
                format!(
                    "completed at {} before start {}",
                    a.completed_at_ms, a.started_at_ms
                ),
            );
        }
        Ok(d)
    }

    pub(crate) fn observe(
        &mut self,
        cp: &CompiledPolicy,
        a: &Attempt,
        d: Dispatch,
        i: usize,
    ) -> Result<()> {
        let priority = self.account(cp, a, &d, i)?;
        self.decide(cp, a, priority, d.route_ordinal);
        Ok(())
    }

    /// Count an observed attempt (cost, route, schedule, fleet) without
    /// deciding; its route's priority.
    pub(crate) fn account(
        &mut self,
        cp: &CompiledPolicy,
        a: &Attempt,
        d: &Dispatch,
        i: usize,
    ) -> Result<usize> {
        let priority = cp
            .routes()
            .position(|r| r.route_id == a.route_id)
            .unwrap_or(0);
        self.spent = self.spent.checked_add(a.cost).ok_or_else(|| {
            Error::attempt(
                ErrorCode::ArithmeticOverflow,
                i,
                "cost",
                "total cost overflows",
            )
        })?;
        // Polls and the cancel of a job count against no route's bound.
        let job_step = a.job.as_ref().is_some_and(|j| j.kind != JobKind::Submit);
        if let Some(slot) = self.per_route.get_mut(priority).filter(|_| !job_step) {
            *slot = slot.saturating_add(1);
        }
        if a.injected_fault == Some(true) {
            self.injected = self.injected.saturating_add(1);
        }
        if sends_request(a) {
            if let Some(slot @ None) = self.bodies.get_mut(priority) {
                *slot = Some(a.request_body_sha256.clone());
            }
        }
        self.count = self.count.saturating_add(1);
        if d.jitter_sample_ms.is_some() {
            self.last_sample = d.jitter_sample_ms;
        }
        self.fallback_used |= priority > 0;
        if let (Some(f), Some(adm)) = (self.fleet.as_mut(), &a.admission) {
            if adm.store.is_some() {
                f.admitted_without_store = f.admitted_without_store.saturating_add(1);
            }
            if adm.breaker.as_ref().is_some_and(|b| b.probe) {
                f.probes = f.probes.saturating_add(1);
            }
            if let (Some(total), Some(l)) = (f.queue_wait_ms.as_mut(), &adm.limits) {
                *total = total.saturating_add(l.queue_wait_ms);
            }
            let skipped = adm.skipped.as_ref().map_or(0, |s| s.0.len());
            f.routes_skipped = f
                .routes_skipped
                .saturating_add(u64::try_from(skipped).unwrap_or(0));
            if adm
                .budget
                .as_ref()
                .is_some_and(|b| b.kind == BudgetUse::Withdraw)
            {
                f.withdrawals = f.withdrawals.saturating_add(1);
            }
        }
        self.final_priority = Some(priority);
        self.finished_at_ms = a.completed_at_ms;
        self.schedule.push(ScheduleEntry {
            completed_at_ms: a.completed_at_ms,
            cost: a.cost,
            delay_ms: d.delay_ms,
            jitter_max_ms: d.jitter_max_ms,
            jitter_min_ms: d.jitter_min_ms,
            jitter_sample_ms: d.jitter_sample_ms,
            model: a.model.clone(),
            not_before_ms: d.not_before_ms,
            ordinal: d.ordinal,
            outcome: a.outcome.kind_name().to_owned(),
            outcome_class: a.outcome.class(),
            reconciled: a.reconciled,
            retry_after_floor_ms: d.retry_after_floor_ms,
            route_id: d.route_id.clone(),
            route_ordinal: d.route_ordinal,
            started_at_ms: a.started_at_ms,
        });
        Ok(priority)
    }

    /// Decide after the attempt `a` on the route at `priority` (its
    /// per-route ordinal `route_ordinal`): the terminal or the next plan.
    pub(crate) fn decide(
        &mut self,
        cp: &CompiledPolicy,
        a: &Attempt,
        priority: usize,
        route_ordinal: u64,
    ) {
        let p = &cp.policy;
        let stop = |terminal| Decision::Terminal { terminal };
        let mut job = self.job.take();
        // The job accounts every attempt; the deadline and cost still come first.
        let judged_job = job.as_mut().and_then(|j| {
            j.observe(cp, a, |s, delay, hint| {
                self.plan_poll(cp, a, s, delay, hint)
            })
        });
        self.job = job;
        // The cancel of a job left running ends the run with the terminal
        // that planned it, whenever it completes.
        let cancel = a.job.as_ref().is_some_and(|j| j.kind == JobKind::Cancel);
        let in_progress = matches!(
            a.outcome,
            Outcome::Retryable {
                kind: RetryableKind::InProgress,
                ..
            }
        );
        self.in_progress = if in_progress {
            self.in_progress.saturating_add(1)
        } else {
            0
        };
        if in_progress && self.pinned.is_none() {
            self.pinned = Some(priority);
        }
        self.next = match judged_job {
            Some(next) if cancel => next,
            _ if a.completed_at_ms >= p.deadline_ms => stop(Terminal::StopDeadline),
            _ if self.spent > p.max_total_cost => stop(Terminal::StopCostBudget),
            Some(next) => next,
            None => match a.outcome {
                Outcome::Success => stop(Terminal::Completed),
                Outcome::NonRetryable { .. } => stop(Terminal::StopNonRetryable),
                Outcome::Indeterminate { .. } => stop(Terminal::StopIndeterminate),
                Outcome::Retryable {
                    kind: RetryableKind::InProgress,
                    retry_after_ms,
                    ..
                } => self.plan_in_progress(
                    cp,
                    priority,
                    route_ordinal,
                    a.completed_at_ms,
                    retry_after_ms,
                ),
                Outcome::Retryable { retry_after_ms, .. } => {
                    match self.plan_after(
                        cp,
                        priority,
                        route_ordinal,
                        a.completed_at_ms,
                        retry_after_ms,
                    ) {
                        // The route that answered `in_progress` holds an
                        // effect whose fate the run does not know.
                        Decision::Terminal { .. } if self.pinned.is_some() => {
                            stop(Terminal::StopIndeterminate)
                        }
                        next => next,
                    }
                }
            },
        };
        self.cancel_left_running(a.completed_at_ms);
        if self.terminal() == Some(Terminal::Completed) {
            if let Some(h) = self.hedge.as_mut() {
                h.winner_ordinal = Some(a.ordinal);
            }
        }
        self.settle_stream(a);
    }

    /// Under `cancel_left_running`: a terminal that would leave the accepted
    /// job running becomes the planned cancel at `at` ([`crate::job`]).
    fn cancel_left_running(&mut self, at: u64) {
        let Decision::Terminal { terminal } = self.next else {
            return;
        };
        let ordinal = self.count.saturating_add(1);
        if let Some(d) = self
            .job
            .as_mut()
            .and_then(|j| j.plan_cancel(terminal, at, ordinal))
        {
            self.next = Decision::Dispatch(d);
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

    /// Attempts so far on the route at `priority`.
    pub(crate) fn used_on(&self, priority: usize) -> u64 {
        self.per_route.get(priority).copied().unwrap_or(0)
    }

    /// After a hedged round: the route of the attempt that decided it and
    /// the round's last completion (a loser may end after the winner).
    pub(crate) fn settle_round(&mut self, final_priority: usize, finished_at_ms: u64) {
        self.final_priority = Some(final_priority);
        self.finished_at_ms = self.finished_at_ms.max(finished_at_ms);
    }

    /// The next dispatch on a route hedges used: its per-route ordinal
    /// counts them, and a route they exhausted passes to the next one.
    pub(crate) fn realign_next(&mut self, cp: &CompiledPolicy) {
        let Decision::Dispatch(d) = &self.next else {
            return;
        };
        let Some(priority) = cp.routes().position(|r| r.route_id == d.route_id) else {
            return;
        };
        let used = self.used_on(priority);
        let bound = cp.route_at(priority).map_or(0, |r| r.max_attempts);
        // A run that saw `in_progress` stays on its route.
        if used < bound || self.pinned.is_some() {
            if let Decision::Dispatch(d) = &mut self.next {
                d.route_ordinal = used.saturating_add(1);
            }
            return;
        }
        let moved = self.skip_route(cp, d);
        self.next = match moved {
            Some(m) => Decision::Dispatch(m),
            None => Decision::Terminal {
                terminal: Terminal::StopRouteExhausted,
            },
        };
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

    /// The stream side of an observed attempt: account its events, plan a
    /// continuation when the contract allows one, and record the action.
    fn settle_stream(&mut self, a: &Attempt) {
        let (Some(st), Some(record)) = (self.streaming.as_mut(), a.stream.as_ref()) else {
            return;
        };
        let terminal = match &self.next {
            Decision::Terminal { terminal } => Some(*terminal),
            Decision::Dispatch(_) => None,
        };
        st.deliver(a.ordinal, record, terminal == Some(Terminal::Completed));
        let mut continues = false;
        if let Decision::Dispatch(d) = &mut self.next {
            if st.may_continue(record, &a.outcome) && d.route_id == a.route_id {
                if let (Some(response_id), Some(starting_after)) =
                    (record.response_id.clone(), record.last_sequence)
                {
                    d.continuation = Some(Continuation {
                        continues_ordinal: a.ordinal,
                        response_id,
                        starting_after,
                    });
                    continues = true;
                }
            }
        }
        let action = st.settle(terminal, continues);
        self.actions.push(action);
    }

    /// The stream action after each observed attempt, then after a cancellation.
    pub(crate) fn stream_actions(&self) -> &[StreamAction] {
        &self.actions
    }

    /// The action the last step took, for a session's event log.
    pub(crate) fn last_action(&self) -> StreamAction {
        self.actions.last().copied().unwrap_or(StreamAction::None)
    }

    /// Mark the run cancelled between attempts at `at` (run clock, ms).
    /// Under `cancel_left_running`, with the accepted job still running, the
    /// next dispatch is then the job's cancel.
    pub(crate) fn cancel(&mut self, at: u64) -> Result<()> {
        if let Some(t) = self.terminal() {
            return Err(Error::at(
                ErrorCode::CancelDrift,
                "/cancelled_at_ms",
                format!("the run had already ended with {}", t.as_str()),
            ));
        }
        if self
            .job
            .as_ref()
            .is_some_and(crate::job::JobState::cancel_planned)
        {
            return Err(Error::at(
                ErrorCode::CancelDrift,
                "/cancelled_at_ms",
                "the run has ended: the cancel of the job it left running is planned and comes next",
            ));
        }
        if at < self.finished_at_ms {
            return Err(Error::at(
                ErrorCode::CancelDrift,
                "/cancelled_at_ms",
                format!(
                    "cancelled at {at}, before the last completion {}",
                    self.finished_at_ms
                ),
            ));
        }
        self.finished_at_ms = at;
        self.next = Decision::Terminal {
            terminal: Terminal::StopCancelled,
        };
        if let Some(st) = self.streaming.as_mut() {
            let action = st.settle(Some(Terminal::StopCancelled), false);
            self.actions.push(action);
        }
        self.cancel_left_running(at);
        Ok(())
    }

    /// The terminal a receipt records; an error while the run could still dispatch.
    fn receipt_terminal(&self) -> Result<Terminal> {
        self.terminal().ok_or_else(|| {
            Error::new(
                ErrorCode::RunNotTerminal,
                "the run has not reached a terminal; plan_next gives the next dispatch",
            )
        })
    }

    /// The receipt of the run so far; an error while it could still dispatch.
    /// `attempts_sha256` is the digest of the attempts document replayed.
    pub(crate) fn receipt(&self, cp: &CompiledPolicy, attempts_sha256: String) -> Result<Receipt> {
        let terminal = self.receipt_terminal()?;
        let p = &cp.policy;
        let final_route = self.final_priority.and_then(|i| cp.route_at(i));
        Ok(Receipt {
            attempt_count: self.count,
            attempts_sha256: Sha256Hex::computed(attempts_sha256),
            behavior_class_sha256: p.behavior_class_sha256.clone(),
            capability_contract_sha256: Sha256Hex::computed(cp.capability_contract_sha256.clone()),
            degraded: terminal == Terminal::Completed
                && final_route.is_some_and(|r| cp.is_degraded(r)),
            fallback_used: self.fallback_used,
            fleet: self.fleet.clone(),
            hedge: self.hedge.clone(),
            final_route_id: final_route.map(|r| r.route_id.clone()),
            finished_at_ms: self.finished_at_ms,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            injected_faults: (self.injected > 0).then_some(self.injected),
            job: self.job.as_ref().map(|j| j.summary(terminal)),
            logical_request_sha256: p.logical_request_sha256.clone(),
            policy_sha256: Sha256Hex::computed(cp.policy_sha256.clone()),
            price_schedule_sha256: None,
            route_attempts: cp
                .routes()
                .zip(self.per_route.iter())
                .map(|(r, n)| RouteCount {
                    attempts: *n,
                    route_id: r.route_id.clone(),
                })
                .collect(),
            schedule: self.schedule.clone(),
            schema: ReceiptSchema,
            stream: self.streaming.as_ref().map(Streaming::summary),
            terminal,
            total_cost: self.spent,
        })
    }

    /// [`Run::receipt`] encoded into `sink` straight from the run, with
    /// the digest of the price schedule that priced it: the same encoding
    /// events as the receipt's (so the same canonical bytes), without an
    /// owned receipt built first (no string copied). An error, and nothing
    /// encoded, while the run could still dispatch.
    pub(crate) fn encode_receipt(
        &self,
        cp: &CompiledPolicy,
        attempts_sha256: &Sha256Hex,
        price_schedule_sha256: Option<&Sha256Hex>,
        sink: &mut dyn Sink,
    ) -> Result<()> {
        let terminal = self.receipt_terminal()?;
        let p = &cp.policy;
        let final_route = self.final_priority.and_then(|i| cp.route_at(i));
        let degraded =
            terminal == Terminal::Completed && final_route.is_some_and(|r| cp.is_degraded(r));
        let job = self.job.as_ref().map(|j| j.summary(terminal));
        let stream = self.streaming.as_ref().map(Streaming::summary);
        // Keys in the order of `Receipt`'s encoding (crate::receipt).
        ObjectWriter::new(sink)
            .u64("attempt_count", self.count)
            .doc("attempts_sha256", attempts_sha256)
            .doc("behavior_class_sha256", &p.behavior_class_sha256)
            .str("capability_contract_sha256", &cp.capability_contract_sha256)
            .bool("degraded", degraded)
            .bool("fallback_used", self.fallback_used)
            .opt_doc("final_route_id", final_route.map(|r| &r.route_id))
            .u64("finished_at_ms", self.finished_at_ms)
            .opt_doc("fleet", self.fleet.as_ref())
            .opt_doc("hedge", self.hedge.as_ref())
            .doc("idempotency_key_sha256", &p.idempotency_key_sha256)
            .opt_u64(
                "injected_faults",
                (self.injected > 0).then_some(self.injected),
            )
            .opt_doc("job", job.as_ref())
            .doc("logical_request_sha256", &p.logical_request_sha256)
            .str("policy_sha256", &cp.policy_sha256)
            .opt_doc("price_schedule_sha256", price_schedule_sha256)
            .doc("route_attempts", &RouteAttempts(cp, &self.per_route))
            .list("schedule", &self.schedule)
            .doc("schema", &ReceiptSchema)
            .opt_doc("stream", stream.as_ref())
            .doc("terminal", &terminal)
            .u64("total_cost", self.spent)
            .end();
        Ok(())
    }
}

/// A receipt's `route_attempts` read from the run: the attempts per route,
/// in priority order, encoded as the receipt's [`RouteCount`]s are.
struct RouteAttempts<'a>(&'a CompiledPolicy, &'a [u64]);

impl Encode for RouteAttempts<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.begin_array();
        for (r, n) in self.0.routes().zip(self.1.iter()) {
            ObjectWriter::new(sink)
                .u64("attempts", *n)
                .doc("route_id", &r.route_id)
                .end();
        }
        sink.end_array();
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
