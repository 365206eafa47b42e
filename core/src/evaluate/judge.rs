//! Judging each observed attempt: the drift checks against the planned
//! dispatch, then deadline, cost, the outcome and the stream contract; and
//! a cancellation between attempts.

use super::{Decision, Dispatch, Run, Terminal};
use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::BudgetUse;
use crate::job::JobKind;
use crate::outcome::{NonRetryableKind, Outcome, RetryableKind};
use crate::policy::{CompiledPolicy, QuotaExhausted};
use crate::receipt::ScheduleEntry;
use crate::stream::Continuation;

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
    pub(crate) fn check(&self, cp: &CompiledPolicy, a: &Attempt, i: usize) -> Result<Dispatch> {
        Self::check_key_refused(a, i)?;
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
        self.note_refusal(cp, a, priority);
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
            key_refused: a.key_refused,
            key_sha256: a
                .admission
                .as_ref()
                .and_then(|adm| adm.key.as_ref())
                .map(|k| k.key_sha256.clone()),
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
                Outcome::NonRetryable { .. } if a.key_refused.is_some() => {
                    self.plan_next_key(cp, priority, route_ordinal, a.completed_at_ms)
                }
                Outcome::NonRetryable {
                    kind: NonRetryableKind::QuotaExhausted,
                } if p.backoff.quota_exhausted == Some(QuotaExhausted::SkipRoute) => {
                    self.plan_past_quota(cp, priority, route_ordinal, a.completed_at_ms)
                }
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
}
