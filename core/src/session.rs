//! A run in progress, advanced one observed attempt at a time.
//!
//! Hosts (the TypeScript and Python drivers) hold a [`Session`]: it keeps the
//! compiled policy, the attempts so far and the replay state, so recording an
//! attempt costs one step of the state machine rather than a replay of the
//! whole run. The attempt is built from the planned dispatch, so the host only
//! reports what it observed (times, cost, outcome) and cannot drift the route,
//! ordinals, digests or jitter sample. Every decision is the one
//! [`crate::plan_next()`] and [`crate::evaluate()`] give for the same attempts.

use std::sync::Arc;

use crate::admission::{self, AdmissionSnapshot};
use crate::attempt::{Attempt, Attempts, AttemptsSchema};
use crate::breaker::{self, BreakerAdmission};
use crate::canonical::digest_of;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Run};
use crate::fleet::{
    admission_in, breaker_in, budget_admission, budget_in, limits_step, reserved_tokens, Admission,
    BreakerRef, BudgetRef, FleetSnapshots, FleetStop, FleetView, FleetWrites, Generations,
    LimitsClock, LimitsRef, LimitsStep, OnStoreUnavailable, Skip, Skips, StopReason, StoreStatus,
};
use crate::ids::{Identifier, Sha256Hex};
use crate::observe::{judge_at, Facts, Judgement};
use crate::outcome::Outcome;
use crate::policy::CompiledPolicy;
use crate::price::{check_schedule, cost as price_cost, PriceSchedule, Units};
use crate::receipt::{Bundle, Receipt};
use crate::stream::{delta_digest, EventLog, StreamAction, StreamEvent, StreamEvents, StreamFacts};

/// A run in progress.
#[derive(Debug, Clone)]
pub struct Session {
    policy: Arc<CompiledPolicy>,
    policy_sha256: Sha256Hex,
    attempts: Attempts,
    run: Run,
    log: EventLog,
    pending: Option<Pending>,
    snapshots: FleetSnapshots,
    /// The generation of every snapshot read, per key (release or scope).
    seen: Generations,
    /// The price schedule usage is charged under, with its digest.
    schedule: Option<(Arc<PriceSchedule>, Sha256Hex)>,
    /// What the host reported of the attempt in flight besides its facts.
    notes: Notes,
    /// When the planned attempt first asked the admission limits, Unix ms.
    queued_since: Option<u64>,
}

/// Reports about the attempt in flight, kept until it is recorded.
#[derive(Debug, Clone, Default)]
struct Notes {
    usage: Option<Units>,
    request_body_sha256: Option<Sha256Hex>,
    /// The failed output check that decided the attempt in flight.
    output_check: Option<crate::output::OutputCheckRecord>,
    /// The job id digest and status the host reported (an async job).
    job: Option<(Option<Sha256Hex>, Option<crate::job::JobStatus>)>,
    /// The receiver's answer when the host reconciled the attempt by
    /// idempotency key (an async job's lost submit answer).
    reconciled: Option<crate::attempt::Reconciled>,
    /// The requested and served model the host reported.
    model: Option<crate::attempt::ModelRecord>,
}

/// What a host said an attempt cost: charged by hand, or nothing (the
/// reservation, unless usage prices it).
#[derive(Debug, Clone, Copy)]
enum Charge {
    Charged(u64),
    Reserved(u64),
}

/// An admission waiting for its attempt's observation.
#[derive(Debug, Clone)]
struct Pending {
    admission: Admission,
    decision: Decision,
}

/// The answer of [`Session::admit`]: the decision (the dispatch on the route
/// admitted, or the fleet's terminal) and the snapshots to write back; or,
/// when the admission limits' in-flight cap is full or a retry is short of a
/// budget that waits, when to ask again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// What to do.
    pub decision: Decision,
    /// Snapshots that changed; write each with compare-and-set.
    pub writes: FleetWrites,
    /// Nothing admitted yet: admit again at this wall clock, Unix ms (the
    /// decision is the plan, not yet admitted, and nothing is written).
    pub wait_until_epoch_ms: Option<u64>,
}

/// `{"decision": …, "wait_until_epoch_ms"?: …, "writes": …}`.
impl crate::canonical::Encode for Admitted {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        crate::canonical::ObjectWriter::new(sink)
            .doc("decision", &self.decision)
            .opt_u64("wait_until_epoch_ms", self.wait_until_epoch_ms)
            .doc("writes", &self.writes)
            .end();
    }
}

impl Session {
    /// Admit a logical request: no attempt yet, the first dispatch planned.
    pub fn start(policy: Arc<CompiledPolicy>) -> Self {
        let run = Run::new(&policy);
        let attempts = Attempts {
            attempts: Vec::new(),
            cancelled_at_ms: None,
            fleet_stop: None,
            schema: AttemptsSchema,
        };
        Self {
            policy_sha256: Sha256Hex::computed(policy.policy_sha256.clone()),
            policy,
            attempts,
            run,
            log: EventLog::default(),
            pending: None,
            snapshots: FleetSnapshots::default(),
            seen: Generations::default(),
            schedule: None,
            notes: Notes::default(),
            queued_since: None,
        }
    }

    /// Price the run's usage with `schedule`, checked against the policy
    /// (the same cost unit, every route's release priced). Only before the
    /// first attempt; the receipt then binds the schedule's digest and the
    /// bundle carries it.
    pub fn set_price_schedule(&mut self, schedule: Arc<PriceSchedule>) -> Result<()> {
        if !self.attempts.attempts.is_empty() {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/price_schedule",
                "a price schedule is set before the first attempt",
            ));
        }
        check_schedule(&self.policy.policy, &schedule)?;
        let digest = Sha256Hex::computed(digest_of(schedule.as_ref()));
        self.schedule = Some((schedule, digest));
        Ok(())
    }

    /// The run's price schedule, when it has one.
    pub fn price_schedule(&self) -> Option<&PriceSchedule> {
        self.schedule.as_ref().map(|(s, _)| s.as_ref())
    }

    /// The digest of the run's price schedule, when it has one.
    pub fn price_schedule_sha256(&self) -> Option<&Sha256Hex> {
        self.schedule.as_ref().map(|(_, d)| d)
    }

    /// Report usage of the attempt in flight (units by kind; several reports
    /// add up). The attempt then records its raw usage and costs what the
    /// run's price schedule charges for it, so it must not also be charged
    /// by hand (`charge_with_usage` at record time). Checked at once: a run
    /// without a schedule is `price_schedule_missing_release`, a kind the
    /// release does not price `usage_unpriced`, an overflow
    /// `arithmetic_overflow`; the report is then not kept.
    pub fn add_usage(&mut self, usage: &Units) -> Result<u64> {
        let Decision::Dispatch(d) = self.next() else {
            return Err(Error::at(
                ErrorCode::AttemptAfterTerminal,
                "/usage",
                "no attempt is in flight: the run has reached a terminal",
            ));
        };
        let Some((schedule, _)) = &self.schedule else {
            return Err(Error::at(
                ErrorCode::PriceScheduleMissingRelease,
                "/price_schedule",
                "the run has no price schedule to price usage with",
            ));
        };
        let total = match &self.notes.usage {
            Some(u) => u.plus(usage)?,
            None => usage.clone(),
        };
        let priced = price_cost(schedule, &d.route_release_sha256, &total)?;
        self.notes.usage = Some(total);
        Ok(priced)
    }

    /// Report what the attempt in flight was of an async job: the
    /// provider's job id (the id a submit was answered with, or the id a
    /// poll asked about; the core keeps only its SHA-256) and the job status
    /// the answer reported. A poll that reports no id polled the planned job.
    pub fn set_job(&mut self, id: Option<&str>, status: Option<crate::job::JobStatus>) {
        self.notes.job = Some((id.map(crate::job::job_id_digest), status));
    }

    /// Report that the host reconciled the attempt in flight by idempotency
    /// key (an async job's submit whose answer was lost: docs/JOBS.md): the
    /// receiver's answer, in the journal's vocabulary, becomes the attempt's
    /// outcome (`succeeded` an acceptance, with the job id reported by
    /// [`Session::set_job`]; `failed_no_effect` permits another submit;
    /// `unknown` stays indeterminate), whatever the facts say.
    pub fn set_reconciled(&mut self, answer: crate::attempt::Reconciled) {
        self.notes.reconciled = Some(answer);
    }

    /// Report the digest of the request body sent on the attempt in flight
    /// (after lowering to its route). Every later attempt on the same route
    /// must send the same body (replay: `request_body_drift`).
    pub fn set_request_body_sha256(&mut self, digest: Sha256Hex) {
        self.notes.request_body_sha256 = Some(digest);
    }

    /// Report the model the attempt in flight asked for (`requested`: the
    /// lowered request's model) and the one the provider's response named
    /// (`served`). A side the host does not know stays `None`: recorded as
    /// unknown, never invented. Both `None` records nothing.
    pub fn set_model(&mut self, requested: Option<Identifier>, served: Option<Identifier>) {
        self.notes.model = (requested.is_some() || served.is_some())
            .then_some(crate::attempt::ModelRecord { requested, served });
    }

    /// The admission held for the planned attempt (a fleet admitted it and
    /// it is not yet observed).
    pub fn admission(&self) -> Option<&Admission> {
        self.pending.as_ref().map(|p| &p.admission)
    }

    /// Drop what the host reported of the attempt in flight (usage, body,
    /// job, reconciliation) when its observation was refused.
    pub(crate) fn clear_notes(&mut self) {
        self.notes = Notes::default();
    }

    /// The compiled policy.
    pub fn policy(&self) -> &CompiledPolicy {
        &self.policy
    }

    /// The attempts observed so far.
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The next decision: the planned dispatch (after an admission, on the
    /// route it admitted), or the terminal.
    pub fn next(&self) -> &Decision {
        match &self.pending {
            Some(p) => &p.decision,
            None => self.run.next(),
        }
    }

    /// Record what the planned attempt did. Drift (an early start, a
    /// completion before the start, an attempt after the terminal) is an
    /// error and leaves the session unchanged. A streamed run records its
    /// attempts with [`Session::observe_stream`].
    pub fn record(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: u64,
        outcome: Outcome,
    ) -> Result<&Decision> {
        self.push(
            started_at_ms,
            completed_at_ms,
            Charge::Charged(cost),
            outcome,
            None,
            false,
        )?;
        Ok(self.run.next())
    }

    fn push(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Charge,
        outcome: Outcome,
        stream: Option<(Option<&StreamFacts>, Vec<crate::stream::Digest>, u64)>,
        injected: bool,
    ) -> Result<StreamAction> {
        let index = self.attempts.attempts.len();
        let Decision::Dispatch(d) = self.next() else {
            return Err(Error::attempt(
                ErrorCode::AttemptAfterTerminal,
                index,
                "ordinal",
                "the run has already reached a terminal",
            ));
        };
        let admission = match (&self.policy.policy.fleet, &self.pending) {
            (None, _) => None,
            // A job's polls and its cancel are not admitted.
            (Some(_), _) if !crate::job::admitted_step(d) => None,
            (Some(_), Some(p)) => Some(p.admission.clone()),
            (Some(_), None) => {
                return Err(Error::attempt(
                    ErrorCode::AdmissionMissing,
                    index,
                    "admission",
                    "the policy has a fleet section: admit the attempt before dispatching it",
                ))
            }
        };
        let (record, deltas) = match stream {
            Some((facts, deltas, bytes)) => (
                Some(crate::stream::record_of(
                    facts,
                    &deltas,
                    bytes,
                    d.continuation.as_ref(),
                )),
                deltas,
            ),
            None => (None, Vec::new()),
        };
        let cost = match (&self.notes.usage, &self.schedule, cost) {
            (None, _, Charge::Charged(c) | Charge::Reserved(c)) => c,
            (Some(_), _, Charge::Charged(_)) => return Err(Error::attempt(
                ErrorCode::ChargeWithUsage,
                index,
                "cost",
                "the attempt reported usage and was charged by hand: its cost is one or the other",
            )),
            (Some(u), Some((schedule, _)), Charge::Reserved(_)) => {
                price_cost(schedule, &d.route_release_sha256, u)
                    .map_err(|e| Error::attempt(e.code, index, "usage", e.message))?
            }
            (Some(_), None, Charge::Reserved(_)) => {
                return Err(Error::attempt(
                    ErrorCode::PriceScheduleMissingRelease,
                    index,
                    "usage",
                    "the run has no price schedule to price usage with",
                ))
            }
        };
        // A reconciled attempt's outcome is the one its answer stands for.
        let outcome = self.notes.reconciled.map_or(outcome, |r| r.outcome());
        let attempt = Attempt {
            admission,
            injected_fault: injected.then_some(true),
            job: d
                .job
                .as_ref()
                .map(|step| crate::job::record_of(step, self.notes.job.clone())),
            output_check: self.notes.output_check.clone(),
            reconciled: self.notes.reconciled,
            request_body_sha256: self.notes.request_body_sha256.clone(),
            model: self.notes.model.clone(),
            stream: record,
            usage: self.notes.usage.clone(),
            ..d.attempt(started_at_ms, completed_at_ms, cost, outcome)
        };
        let planned = self.run.check(&self.policy, &attempt, index)?;
        // `observe` fails only before it changes anything (a cost overflow).
        self.run.observe(&self.policy, &attempt, planned, index)?;
        let action = self.run.last_action();
        if let Some(contract) = &self.policy.policy.stream {
            let listed = attempt.stream.as_ref().map(|r| &r.deltas_sha256);
            self.log
                .append(contract.mode, attempt.ordinal, deltas, listed, action);
        }
        self.attempts.attempts.push(attempt);
        self.pending = None;
        self.notes = Notes::default();
        self.queued_since = None;
        Ok(action)
    }

    /// Record the planned attempt from what the host observed: the core
    /// judges the [`Facts`] ([`crate::observe`]), charges `cost` (the
    /// planned `reserve_cost` when the host charged nothing) and records the
    /// attempt. The judgement says which rule decided, so a host can report
    /// an unrecognized error. Drift leaves the session unchanged.
    pub fn observe(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
    ) -> Result<Judgement> {
        self.observe_stream::<&str>(started_at_ms, completed_at_ms, cost, facts, &[])
    }

    /// [`Session::observe`] for a streamed run: `deltas` are the texts of
    /// the events the attempt received, in order (their count and UTF-8
    /// bytes must match `facts.stream`). The session fills in the stream
    /// mode, records the attempt's stream, appends the consumer's events to
    /// the run's log and says in the judgement what the host does with them:
    /// `commit`, `invalidate`, `continue` (the next dispatch resumes this
    /// response) or `none`.
    pub fn observe_stream<S: AsRef<str>>(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
        deltas: &[S],
    ) -> Result<Judgement> {
        let index = self.attempts.attempts.len();
        let (deadline_ms, reserve_cost) = match self.run.next() {
            Decision::Dispatch(d) => (d.deadline_ms, d.reserve_cost),
            Decision::Terminal { .. } => (u64::MAX, 0),
        };
        // The route the attempt went to (after an admission, the one it admitted).
        let family = match self.next() {
            Decision::Dispatch(d) => self
                .policy
                .policy
                .routes
                .iter()
                .find(|r| r.route_id == d.route_id)
                .and_then(|r| r.provider_family),
            Decision::Terminal { .. } => None,
        };
        let mode = self.policy.policy.stream.as_ref().map(|s| s.mode);
        let bad = |field: &str, msg: String| {
            Err(Error::attempt(ErrorCode::InvalidValue, index, field, msg))
        };
        let mut stream_facts = facts.stream.clone();
        let bytes: u64 = deltas
            .iter()
            .map(|d| u64::try_from(d.as_ref().len()).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        let events = u64::try_from(deltas.len()).unwrap_or(u64::MAX);
        match (mode, stream_facts.as_mut()) {
            (None, Some(_)) => {
                return Err(Error::attempt(
                    ErrorCode::StreamRecordUnexpected,
                    index,
                    "stream",
                    "the facts describe a stream the policy does not have",
                ))
            }
            (None, None) if events > 0 => {
                return bad(
                    "stream",
                    "deltas for a policy without a stream contract".into(),
                )
            }
            (Some(_), None) if events > 0 => {
                return bad("stream/events", "deltas without stream facts".into())
            }
            (Some(m), Some(s)) => {
                if s.mode.is_some_and(|given| given != m) {
                    return bad(
                        "stream/mode",
                        format!("the policy's stream mode is {}", m.as_str()),
                    );
                }
                s.mode = Some(m);
                if s.events != events {
                    return bad(
                        "stream/events",
                        format!("{} events reported, {events} deltas given", s.events),
                    );
                }
                if s.bytes != bytes {
                    return bad(
                        "stream/bytes",
                        format!("{} bytes reported, the deltas hold {bytes}", s.bytes),
                    );
                }
            }
            _ => {}
        }
        let judged = Facts {
            provider_family: family.or(facts.provider_family),
            stream: stream_facts,
            ..facts.clone()
        };
        let mut judgement = judge_at(&judged, completed_at_ms >= deadline_ms)?;
        self.notes.output_check = if judgement.rule == crate::observe::Rule::OutputCheck {
            crate::output::judge_checks(&judged.output_checks).map(|(_, record)| record)
        } else {
            None
        };
        let stream = mode.map(|_| {
            let digests = deltas
                .iter()
                .map(|d| delta_digest(d.as_ref().as_bytes()))
                .collect();
            (judged.stream.as_ref(), digests, bytes)
        });
        let action = self.push(
            started_at_ms,
            completed_at_ms,
            cost.map_or(Charge::Reserved(reserve_cost), Charge::Charged),
            judgement.outcome,
            stream,
            crate::observe::injected(facts),
        );
        // A drift leaves the session as it was: no check held for a later attempt.
        if action.is_err() {
            self.notes.output_check = None;
        }
        let action = action?;
        if mode.is_some() {
            judgement.stream = Some(action);
        }
        Ok(judgement)
    }

    /// The fleet snapshots every admission so far read.
    pub fn fleet_snapshots(&self) -> &FleetSnapshots {
        &self.snapshots
    }

    /// The events the consumer received so far (a streamed run), as documents.
    pub fn stream_events(&self) -> Vec<StreamEvent> {
        self.log.events(&self.policy_sha256)
    }

    /// How many events the consumer received so far.
    pub fn stream_event_count(&self) -> usize {
        self.log.len()
    }

    /// Admit the planned attempt under the fleet view a host read from its
    /// store at `now_epoch_ms` (wall clock), `at_ms` on the run clock. A
    /// route whose breaker refuses is skipped (the plan moves to the next
    /// route by priority, no attempt spent); the first attempt deposits into
    /// the retry budget and every later one withdraws. The answer is the
    /// dispatch to make (also what [`Session::next`] now gives) or the
    /// fleet's terminal (`stop_circuit_open`, `stop_retry_budget`,
    /// `stop_store_unavailable`), and the snapshots to write back. A wait
    /// (`wait_until_epoch_ms`: admission limits full, or a retry short of a
    /// budget with `wait_ms`) writes nothing: admit again then. Calling it
    /// again before the observation (after a compare-and-set conflict, with a
    /// fresh view) replaces the admission.
    pub fn admit(&mut self, at_ms: u64, now_epoch_ms: u64, view: &FleetView) -> Result<Admitted> {
        let policy = Arc::clone(&self.policy);
        let Some(fleet) = policy.policy.fleet.as_ref() else {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "the policy has no fleet section",
            ));
        };
        let Decision::Dispatch(planned) = self.run.next().clone() else {
            return Err(Error::new(
                ErrorCode::AttemptAfterTerminal,
                "the run has already reached a terminal",
            ));
        };
        self.pending = None;
        let mut writes = FleetWrites::default();
        let mut admission = Admission {
            admitted_at_epoch_ms: now_epoch_ms,
            breaker: None,
            budget: None,
            limits: None,
            skipped: None,
            store: None,
        };
        if view.store_unavailable {
            if fleet.on_store_unavailable == OnStoreUnavailable::FailOpen {
                admission.store = Some(StoreStatus::Unavailable);
                return Ok(self.hold(admission, planned, writes));
            }
            return self.stop(
                at_ms,
                now_epoch_ms,
                StopReason::StoreUnavailable,
                Vec::new(),
                (None, None),
            );
        }
        let mut plan = planned;
        let mut skips = Vec::new();
        if let Some(cfg) = &fleet.breaker {
            loop {
                let s = breaker_in(cfg, view, &plan.route_release_sha256, now_epoch_ms)?;
                self.seen
                    .saw(s.route_release_sha256.as_str(), s.generation, "/breakers")?;
                let digest = self.snapshots.keep_breaker(&s);
                let (answer, next) = breaker::admit(cfg, &s, now_epoch_ms);
                match answer {
                    BreakerAdmission::Admitted { probe } => {
                        admission.breaker = Some(BreakerRef {
                            generation: s.generation,
                            probe,
                            snapshot_sha256: digest,
                        });
                        if changed(&next, &s) {
                            writes.breakers.push(next);
                        }
                        break;
                    }
                    BreakerAdmission::Rejected { .. } => {
                        if changed(&next, &s) {
                            writes.breakers.push(next);
                        }
                        skips.push(Skip {
                            route_id: plan.route_id.clone(),
                            snapshot_sha256: digest,
                        });
                        match self.run.skip_route(&self.policy, &plan) {
                            Some(p) => plan = p,
                            None => {
                                return self.stop(
                                    at_ms,
                                    now_epoch_ms,
                                    StopReason::CircuitOpen,
                                    skips,
                                    (None, None),
                                )
                            }
                        }
                    }
                }
            }
        }
        let mut limits_write = None;
        if let Some(cfg) = &fleet.admission {
            let s = admission_in(cfg, view, &plan.route_release_sha256, now_epoch_ms)?;
            self.seen.saw(
                &format!("admission/{}", s.key()),
                s.generation,
                "/admission",
            )?;
            let digest = self.snapshots.keep_admission(&s);
            let tokens = reserved_tokens(cfg, view)?;
            let since = *self.queued_since.get_or_insert(now_epoch_ms);
            let clock = LimitsClock {
                at_ms,
                now_epoch_ms,
                since_epoch_ms: since,
                deadline_ms: plan.deadline_ms,
            };
            match limits_step(cfg, &s, digest, tokens, &clock) {
                LimitsStep::Admitted {
                    limits,
                    write,
                    start_at_ms,
                } => {
                    plan.not_before_ms = plan.not_before_ms.max(start_at_ms);
                    admission.limits = Some(limits);
                    limits_write = Some(write);
                }
                LimitsStep::Wait(until) => {
                    return Ok(Admitted {
                        decision: Decision::Dispatch(plan),
                        writes: FleetWrites::default(),
                        wait_until_epoch_ms: Some(until),
                    });
                }
                LimitsStep::Stop(limits) => {
                    return self.stop(
                        at_ms,
                        now_epoch_ms,
                        StopReason::Admission,
                        skips,
                        (None, Some(limits)),
                    );
                }
            }
        }
        if let Some(cfg) = &fleet.retry_budget {
            let s = budget_in(cfg, view, now_epoch_ms)?;
            let refused = budget_admission(
                cfg,
                &s,
                &mut self.seen,
                &mut self.snapshots,
                plan.ordinal,
                now_epoch_ms,
                &mut writes,
                &mut admission,
            )?;
            if let Some(used) = refused {
                // A budget that waits: nothing written, ask again after
                // `wait_ms` while that leaves room before the deadline.
                if let Some(until) = cfg.waits(at_ms, plan.deadline_ms) {
                    let wait = until.saturating_sub(at_ms);
                    return Ok(Admitted {
                        decision: Decision::Dispatch(plan),
                        writes: FleetWrites::default(),
                        wait_until_epoch_ms: Some(now_epoch_ms.saturating_add(wait)),
                    });
                }
                return self.stop(
                    at_ms,
                    now_epoch_ms,
                    StopReason::RetryBudget,
                    skips,
                    (Some(used), None),
                );
            }
        }
        if !skips.is_empty() {
            admission.skipped = Some(Skips(skips));
        }
        writes.admission.extend(limits_write);
        Ok(self.hold(admission, plan, writes))
    }

    /// What [`Session::admit`] would answer under `view`, without changing
    /// the session: a host that admits optimistically (from snapshots it
    /// cached) previews the admission, checks and writes in one
    /// compare-and-set of every key the admission read, and only then admits
    /// for real under the same view (the same answer).
    pub fn admit_preview(
        &self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<Admitted> {
        self.clone().admit(at_ms, now_epoch_ms, view)
    }

    /// Hold an admission until its attempt is observed. The snapshots it
    /// proposes to write are not counted as seen: a host may find its
    /// compare-and-set refused and admit again under the store's state.
    fn hold(&mut self, admission: Admission, plan: Dispatch, writes: FleetWrites) -> Admitted {
        let decision = Decision::Dispatch(plan);
        self.pending = Some(Pending {
            admission,
            decision: decision.clone(),
        });
        Admitted {
            decision,
            writes,
            wait_until_epoch_ms: None,
        }
    }

    fn stop(
        &mut self,
        at_ms: u64,
        at_epoch_ms: u64,
        reason: StopReason,
        skips: Vec<Skip>,
        (budget, limits): (Option<BudgetRef>, Option<LimitsRef>),
    ) -> Result<Admitted> {
        let stop = FleetStop {
            at_epoch_ms,
            at_ms,
            budget,
            limits,
            reason,
            skipped: (!skips.is_empty()).then_some(Skips(skips)),
        };
        self.run.fleet_stop(&self.policy, &stop)?;
        self.attempts.fleet_stop = Some(stop);
        let ordinal = self.attempts.attempts.last().map_or(0, |a| a.ordinal);
        self.log.close(ordinal, self.run.last_action());
        self.queued_since = None;
        Ok(Admitted {
            decision: self.run.next().clone(),
            writes: FleetWrites::default(),
            wait_until_epoch_ms: None,
        })
    }

    /// The next snapshot of the last attempt's breaker after its outcome,
    /// from the snapshot the host reads now (`now_epoch_ms`, wall clock).
    pub fn breaker_after(
        &self,
        snapshot: &crate::breaker::BreakerSnapshot,
        now_epoch_ms: u64,
    ) -> Result<crate::breaker::BreakerSnapshot> {
        let cfg = self
            .policy
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
        let Some(a) = self.attempts.attempts.last() else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                "no attempt has been observed",
            ));
        };
        snapshot.check(cfg, &a.route_release_sha256, "")?;
        self.seen
            .check(a.route_release_sha256.as_str(), snapshot.generation, "")?;
        let probe = a
            .admission
            .as_ref()
            .and_then(|adm| adm.breaker.as_ref())
            .is_some_and(|b| b.probe);
        let recorded = breaker::record(
            cfg,
            snapshot,
            probe,
            breaker::Health::of(&a.outcome),
            now_epoch_ms,
        );
        // A wait longer than the cap under skip_route: the route is left by
        // this run and parked for every run until the server's time.
        let backoff = &self.policy.policy.backoff;
        if backoff.retry_after_over_cap == Some(crate::policy::OverCap::SkipRoute) {
            if let Some(hint) = a.outcome.retry_after_ms() {
                if hint > backoff.retry_after_cap_ms {
                    let until = now_epoch_ms.saturating_add(hint);
                    return Ok(breaker::park(&recorded, until, now_epoch_ms));
                }
            }
        }
        Ok(recorded)
    }

    /// The next admission snapshot of an admitted attempt's key once the
    /// attempt is over (answered, failed, cancelled, or admitted and never
    /// dispatched): its in-flight slot freed and its reserved tokens settled
    /// with `used_tokens` (the usage the response reported; none: the
    /// reservation stands), from the snapshot the host reads now. The
    /// attempt is the one admitted and not yet observed, else the last
    /// observed one.
    pub fn admission_release(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
    ) -> Result<AdmissionSnapshot> {
        let cfg = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
            .ok_or_else(|| {
                Error::at(
                    ErrorCode::AdmissionUnexpected,
                    "/fleet/admission",
                    "the policy has no admission limits",
                )
            })?;
        let held = match (&self.pending, self.attempts.attempts.last()) {
            (Some(p), _) => match &p.decision {
                Decision::Dispatch(d) => Some((&p.admission, &d.route_release_sha256)),
                Decision::Terminal { .. } => None,
            },
            (None, Some(a)) => a
                .admission
                .as_ref()
                .map(|adm| (adm, &a.route_release_sha256)),
            (None, None) => None,
        };
        let Some((limits, release)) =
            held.and_then(|(adm, release)| adm.limits.as_ref().map(|l| (l, release)))
        else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                "no attempt was admitted under the admission limits",
            ));
        };
        snapshot.check(cfg, release, "")?;
        Ok(admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            used_tokens,
        ))
    }

    /// [`Session::admission_release`], then the rate-limit headers the
    /// attempt's response carried (success or failure; `[name, value]`
    /// pairs) applied to the released snapshot ([`admission::observe`]): a
    /// lower `remaining` lowers the route's bucket, and an exhausted one
    /// with a reset empties it until the reset, for every run sharing the
    /// store. One snapshot to write, as after a plain release.
    pub fn admission_release_seen(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
        headers: &[(String, String)],
    ) -> Result<AdmissionSnapshot> {
        let released = self.admission_release(snapshot, now_epoch_ms, used_tokens)?;
        match self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        {
            Some(cfg) if !headers.is_empty() => {
                Ok(admission::observe(cfg, &released, headers, now_epoch_ms).0)
            }
            _ => Ok(released),
        }
    }

    /// Continue the run a verified journal holds: its attempts (reconciled
    /// ones included), its cancellation and its decisions, replayed by
    /// [`crate::journal::verify`], so the host observes the next attempt
    /// through this session like any other and seals from it. Only a fresh
    /// session resumes (a price schedule may be set first). A journal is
    /// kept for runs without a fleet section (a session's host admits
    /// nothing on resume: `admission_unexpected`; the run machine,
    /// [`crate::machine`], resumes a fleet run and admits its next attempt
    /// again) and without a stream contract (its event log is not in the
    /// journal: `invalid_stream_contract`).
    pub fn resume_journal(&mut self, events: &[crate::journal::JournalEvent]) -> Result<()> {
        self.check_resumable(false)?;
        let replayed = crate::journal::verify(&self.policy, events)?;
        self.continue_replay(replayed);
        Ok(())
    }

    /// [`Session::resume_journal`] from the replay a journal's writer keeps
    /// (made under this session's policy: [`crate::journal::Writer::resume`]).
    pub(crate) fn resume_replayed(&mut self, replayed: crate::journal::Replayed) -> Result<()> {
        self.check_resumable(false)?;
        self.continue_replay(replayed);
        Ok(())
    }

    /// [`Session::resume_replayed`] for the run machine, which admits a
    /// resumed run's next attempt under its fleet section.
    pub(crate) fn resume_admitting(&mut self, replayed: crate::journal::Replayed) -> Result<()> {
        self.check_resumable(true)?;
        let log = match &self.policy.policy.stream {
            Some(contract) => Some(crate::stream::log_of(contract.mode, &replayed)?),
            None => None,
        };
        self.continue_replay(replayed);
        if let Some(log) = log {
            self.log = log;
        }
        Ok(())
    }

    /// Only a fresh session of a policy a journal can hold resumes one (a
    /// fleet section only when the resumed run admits again).
    fn check_resumable(&self, admits: bool) -> Result<()> {
        if !self.attempts.attempts.is_empty()
            || self.attempts.cancelled_at_ms.is_some()
            || self.pending.is_some()
        {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/events",
                "only a session with no attempt yet resumes a journal",
            ));
        }
        if self.policy.policy.fleet.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "a journal does not hold the fleet's snapshots: a session resumes no fleet run (the run machine does, admitting again)",
            ));
        }
        if self.policy.policy.stream.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::InvalidStreamContract,
                "/stream",
                "a session does not rebuild a stream's event log from a journal: the run machine resumes a streamed run",
            ));
        }
        if self.policy.policy.async_job.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                "/async_job",
                "a session does not resume a job from a journal: the run machine resumes a journaled job",
            ));
        }
        Ok(())
    }

    fn continue_replay(&mut self, replayed: crate::journal::Replayed) {
        let (run, attempts) = replayed.into_run();
        self.run = run;
        self.attempts = attempts;
        self.notes = Notes::default();
    }

    /// Mark the run cancelled between attempts at `at_ms` (run clock).
    pub fn cancel(&mut self, at_ms: u64) -> Result<()> {
        self.run.cancel(at_ms)?;
        self.pending = None;
        self.queued_since = None;
        self.attempts.cancelled_at_ms = Some(at_ms);
        let ordinal = self.attempts.attempts.last().map_or(0, |a| a.ordinal);
        self.log.close(ordinal, self.run.last_action());
        Ok(())
    }

    /// The receipt of the finished run; an error while it could still dispatch.
    pub fn receipt(&self) -> Result<Receipt> {
        self.bind(self.run.receipt(&self.policy, digest_of(&self.attempts)))
    }

    fn bind(&self, receipt: Result<Receipt>) -> Result<Receipt> {
        let mut receipt = receipt?;
        receipt.price_schedule_sha256 = self.price_schedule_sha256().cloned();
        Ok(receipt)
    }

    /// The receipt, for a host whose platform hashes natively (Node's
    /// OpenSSL is several times faster than SHA-256 in WebAssembly): the
    /// host hashes the canonical attempts text this session gives
    /// ([`crate::canonical::canonical_json`] of [`Session::attempts`]) and
    /// passes the lowercase hex digest. Only the hash primitive moves; what
    /// is hashed and everything else in the receipt stay the core's. A
    /// malformed digest is `invalid_digest`.
    pub fn receipt_with_attempts_sha256(&self, attempts_sha256: &str) -> Result<Receipt> {
        let hex = crate::ids::Sha256Hex::parse(attempts_sha256)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/attempts_sha256", m))?;
        self.bind(self.run.receipt(&self.policy, hex.as_str().to_owned()))
    }

    /// [`Session::receipt_with_attempts_sha256`] encoded into `sink` (the
    /// same encoding events, so the same canonical bytes), straight from the
    /// session: no owned receipt is built. Errors as that method's, and then
    /// nothing is encoded.
    pub fn encode_receipt_with_attempts_sha256(
        &self,
        attempts_sha256: &str,
        sink: &mut dyn crate::canonical::Sink,
    ) -> Result<()> {
        let hex = crate::ids::Sha256Hex::parse(attempts_sha256)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/attempts_sha256", m))?;
        self.run
            .encode_receipt(&self.policy, &hex, self.price_schedule_sha256(), sink)
    }

    /// The bundle of the finished run: policy, attempts and receipt.
    pub fn seal(&self) -> Result<Bundle> {
        let receipt = self.receipt()?;
        let mut bundle = Bundle::new(self.policy.policy.clone(), self.attempts.clone(), receipt);
        if self.policy.policy.stream.is_some() {
            bundle.stream_events = Some(StreamEvents(self.stream_events()));
        }
        if self.policy.policy.fleet.is_some() {
            bundle.fleet_snapshots = Some(self.snapshots.clone());
        }
        bundle.price_schedule = self.schedule.as_ref().map(|(s, _)| s.as_ref().clone());
        Ok(bundle)
    }
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::lab;
    use crate::{compile, evaluate, plan_next};

    #[test]
    fn a_session_reaches_the_reference_receipt_step_by_step() {
        let bundle = lab::reference_bundle().unwrap();
        let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
        let mut session = Session::start(policy.clone());
        for a in &bundle.attempts.attempts {
            assert_eq!(
                session.next(),
                &plan_next(&policy, session.attempts()).unwrap()
            );
            session
                .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
                .unwrap();
        }
        assert_eq!(session.attempts(), &bundle.attempts);
        assert_eq!(session.receipt().unwrap(), bundle.receipt);
        assert_eq!(session.seal().unwrap(), bundle);
    }

    #[test]
    fn a_host_digest_of_the_attempts_gives_the_same_receipt() {
        let bundle = lab::reference_bundle().unwrap();
        let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
        let mut session = Session::start(policy);
        for a in &bundle.attempts.attempts {
            session
                .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
                .unwrap();
        }
        let text = crate::canonical::canonical_json(session.attempts());
        let hex = crate::canonical::sha256_hex(text.as_bytes());
        assert_eq!(
            session.receipt_with_attempts_sha256(&hex).unwrap(),
            bundle.receipt
        );
        let e = session.receipt_with_attempts_sha256("ABC").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidDigest);
    }

    /// A document encoded by a function (for the encoders that write from a session or run).
    struct Encoded<F: Fn(&mut dyn crate::canonical::Sink)>(F);

    impl<F: Fn(&mut dyn crate::canonical::Sink)> crate::canonical::Encode for Encoded<F> {
        fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
            (self.0)(sink);
        }
    }

    /// A sink that records whether anything was written to it.
    #[derive(Default)]
    struct Untouched(bool);

    impl crate::canonical::Sink for Untouched {
        fn begin_object(&mut self) {
            self.0 = true;
        }
        fn key(&mut self, _: &str) {
            self.0 = true;
        }
        fn end_object(&mut self) {
            self.0 = true;
        }
        fn begin_array(&mut self) {
            self.0 = true;
        }
        fn end_array(&mut self) {
            self.0 = true;
        }
        fn u64(&mut self, _: u64) {
            self.0 = true;
        }
        fn bool(&mut self, _: bool) {
            self.0 = true;
        }
        fn str(&mut self, _: &str) {
            self.0 = true;
        }
    }

    #[test]
    fn the_receipt_encoded_from_the_session_is_the_receipt() {
        let bundle = lab::reference_bundle().unwrap();
        let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
        let mut session = Session::start(policy);
        let hex = "ab".repeat(32);
        let mut sink = Untouched::default();
        let e = session
            .encode_receipt_with_attempts_sha256(&hex, &mut sink)
            .unwrap_err();
        assert_eq!((e.code, sink.0), (ErrorCode::RunNotTerminal, false));
        for a in &bundle.attempts.attempts {
            session
                .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
                .unwrap();
        }
        let e = session
            .encode_receipt_with_attempts_sha256("ABC", &mut sink)
            .unwrap_err();
        assert_eq!((e.code, sink.0), (ErrorCode::InvalidDigest, false));
        let encoded = crate::canonical::canonical_json(&Encoded(|s| {
            session
                .encode_receipt_with_attempts_sha256(&hex, s)
                .unwrap();
        }));
        let owned = session.receipt_with_attempts_sha256(&hex).unwrap();
        assert_eq!(encoded, crate::canonical::canonical_json(&owned));
    }

    /// Every run the conformance vectors hold (a policy and its attempts,
    /// replayed to a terminal: fleets, jobs, streams, hedges, injected
    /// faults): the receipt encoded from the run has the owned receipt's
    /// canonical bytes, with and without a price schedule's digest.
    #[test]
    fn the_receipt_encoded_from_a_run_is_the_receipt_for_every_vector() {
        fn walk(v: &serde_json::Value, found: &mut Vec<(String, String)>) {
            let text = |x: &serde_json::Value| match x {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            match v {
                serde_json::Value::Object(m) => {
                    if let (Some(p), Some(a)) = (m.get("policy"), m.get("attempts")) {
                        found.push((text(p), text(a)));
                    }
                    m.values().for_each(|x| walk(x, found));
                }
                serde_json::Value::Array(xs) => xs.iter().for_each(|x| walk(x, found)),
                // A document given as its text (a bundle to verify).
                serde_json::Value::String(s) if s.starts_with('{') => {
                    if let Ok(doc) = serde_json::from_str::<serde_json::Value>(s) {
                        walk(&doc, found);
                    }
                }
                _ => {}
            }
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let doc: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                walk(&doc, &mut found);
            }
        }
        let digest = Sha256Hex::computed("cd".repeat(32));
        let mut compared = 0;
        let parts = ["fleet", "hedge", "job", "stream", "injected_faults"];
        let mut covered = [false; 5];
        for (policy, attempts) in &found {
            let Ok(cp) = crate::api::compile_policy(policy) else {
                continue;
            };
            let Ok(attempts) = crate::api::decode_attempts(attempts) else {
                continue;
            };
            let Ok(run) = crate::evaluate::replay(&cp, &attempts) else {
                continue;
            };
            let Ok(mut owned) = run.receipt(&cp, digest.as_str().to_owned()) else {
                continue;
            };
            for price in [None, Some(Sha256Hex::computed("ef".repeat(32)))] {
                owned.price_schedule_sha256 = price.clone();
                let encoded = crate::canonical::canonical_json(&Encoded(|s| {
                    run.encode_receipt(&cp, &digest, price.as_ref(), s).unwrap();
                }));
                assert_eq!(encoded, crate::canonical::canonical_json(&owned));
            }
            compared += 1;
            let has = [
                owned.fleet.is_some(),
                owned.hedge.is_some(),
                owned.job.is_some(),
                owned.stream.is_some(),
                owned.injected_faults.is_some(),
            ];
            for (seen, h) in covered.iter_mut().zip(has) {
                *seen |= h;
            }
        }
        assert!(compared >= 50, "only {compared} runs compared");
        assert_eq!(covered, [true; 5], "{parts:?}: not every part met");
    }

    #[test]
    fn drift_leaves_the_session_unchanged() {
        let bundle = lab::reference_bundle().unwrap();
        let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
        let mut session = Session::start(policy.clone());
        let a = &bundle.attempts.attempts[0];
        session
            .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
            .unwrap();
        let before = session.next().clone();
        let e = session
            .record(1_300, 1_400, 0, Outcome::Success)
            .unwrap_err();
        assert_eq!((e.code, e.attempt_index), (ErrorCode::EarlyStart, Some(1)));
        let e = session
            .record(1_400, 1_399, 0, Outcome::Success)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CompletedBeforeStarted);
        assert_eq!(session.next(), &before);
        assert_eq!(session.attempts().attempts.len(), 1);
        assert_eq!(
            session.receipt().unwrap_err().code,
            ErrorCode::RunNotTerminal
        );
        session.cancel(1_200).unwrap();
        let receipt = session.receipt().unwrap();
        assert_eq!(receipt, evaluate(&policy, session.attempts()).unwrap());
        assert_eq!(receipt.terminal.as_str(), "stop_cancelled");
        assert_eq!(
            session.cancel(1_300).unwrap_err().code,
            ErrorCode::CancelDrift
        );
        let e = session
            .record(1_400, 1_500, 0, Outcome::Success)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::AttemptAfterTerminal);
    }
}

/// Whether a snapshot changed beyond its clock (only then is it written back).
pub(crate) fn changed(
    next: &crate::breaker::BreakerSnapshot,
    read: &crate::breaker::BreakerSnapshot,
) -> bool {
    // Every field but the schema and the clock, without copying the
    // snapshot. The destructuring names every field, so a new one cannot be
    // left out of the comparison.
    let crate::breaker::BreakerSnapshot {
        consecutive_failures,
        generation,
        opened_at_epoch_ms,
        parked_until_epoch_ms,
        probe_started_at_epoch_ms,
        probe_successes,
        probes_in_flight,
        route_release_sha256,
        schema: _,
        state,
        updated_at_epoch_ms: _,
        window_failures,
        window_start_epoch_ms,
        window_total,
    } = next;
    *state != read.state
        || *generation != read.generation
        || *consecutive_failures != read.consecutive_failures
        || *opened_at_epoch_ms != read.opened_at_epoch_ms
        || *parked_until_epoch_ms != read.parked_until_epoch_ms
        || *probe_started_at_epoch_ms != read.probe_started_at_epoch_ms
        || *probe_successes != read.probe_successes
        || *probes_in_flight != read.probes_in_flight
        || *window_failures != read.window_failures
        || *window_start_epoch_ms != read.window_start_epoch_ms
        || *window_total != read.window_total
        || *route_release_sha256 != read.route_release_sha256
}
