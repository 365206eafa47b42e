//! A run's job state, replayed from its attempts: the accepted job, its
//! polls and the cancel a run plans for a job it would leave running.

use crate::attempt::{Attempt, Reconciled};
use crate::error::{Error, ErrorCode};
use crate::evaluate::{Decision, Dispatch, Terminal};
use crate::ids::{Identifier, Sha256Hex};
use crate::outcome::{Outcome, RetryableKind};
use crate::policy::CompiledPolicy;

use super::{resubmit, CancelResult, JobKind, JobStatus, JobStep, JobSummary};

/// A run's job state, replayed from its attempts.
#[derive(Debug, Clone)]
pub(crate) struct JobState {
    /// What a planned cancel carries, under `cancel_left_running`.
    cancels: Option<CancelPlan>,
    accepted: Option<Sha256Hex>,
    /// The accepted submit's route, route ordinal and release: polls and
    /// the cancel go there.
    route: Option<(Identifier, u64, Sha256Hex)>,
    polls: u64,
    submits: u64,
    status: Option<JobStatus>,
    /// The poll bound ended the run.
    bound: bool,
    /// The terminal a planned cancel stands for (the run ends with it once
    /// the cancel is recorded).
    cancel_for: Option<Terminal>,
    /// What became of the cancel, once recorded.
    cancel: Option<CancelResult>,
}

/// The policy's part of a planned cancel.
#[derive(Debug, Clone)]
struct CancelPlan {
    deadline_ms: u64,
    idempotency_key_sha256: Sha256Hex,
    logical_request_sha256: Sha256Hex,
}

impl JobState {
    /// The state before the first submit.
    pub(crate) fn new(cp: &CompiledPolicy) -> Self {
        let p = &cp.policy;
        let cancels = p
            .async_job
            .as_ref()
            .filter(|j| j.cancels_left_running())
            .map(|_| CancelPlan {
                deadline_ms: p.deadline_ms,
                idempotency_key_sha256: p.idempotency_key_sha256.clone(),
                logical_request_sha256: p.logical_request_sha256.clone(),
            });
        Self {
            cancels,
            accepted: None,
            route: None,
            polls: 0,
            submits: 0,
            status: None,
            bound: false,
            cancel_for: None,
            cancel: None,
        }
    }

    /// The step the next dispatch takes (a submit until the acceptance).
    pub(crate) fn step(&self) -> JobStep {
        if self.cancel_for.is_some() {
            return JobStep {
                job_sha256: self.accepted.clone(),
                kind: JobKind::Cancel,
                poll: None,
            };
        }
        match &self.accepted {
            None => JobStep {
                job_sha256: None,
                kind: JobKind::Submit,
                poll: None,
            },
            Some(job) => JobStep {
                job_sha256: Some(job.clone()),
                kind: JobKind::Poll,
                poll: Some(self.polls.saturating_add(1)),
            },
        }
    }

    /// The drift error for an attempt observed after the terminal, when the
    /// job explains it: a poll past the bound, or a submit after acceptance.
    pub(crate) fn after_terminal(&self, a: &Attempt, i: usize) -> Option<Error> {
        let kind = a.job.as_ref()?.kind;
        if kind == JobKind::Cancel {
            let msg = if self.cancel.is_some() {
                "a second cancel: the job is cancelled once"
            } else {
                "a cancel the core did not plan (the policy has no cancel_left_running, or the job was not left running)"
            };
            return Some(Error::attempt(ErrorCode::JobKindDrift, i, "job/kind", msg));
        }
        if kind == JobKind::Poll && self.cancel.is_some() {
            return Some(Error::attempt(
                ErrorCode::JobKindDrift,
                i,
                "job/kind",
                "a poll after the job's cancel",
            ));
        }
        if kind == JobKind::Poll && self.bound {
            return Some(Error::attempt(
                ErrorCode::JobPollBound,
                i,
                "job/poll",
                "a poll past the policy's max_polls",
            ));
        }
        if kind == JobKind::Submit && self.accepted.is_some() {
            return Some(resubmit(i));
        }
        None
    }

    /// Account an observed attempt. Returns the next decision when the job
    /// decides it (an acceptance, a poll, the cancel), `None` when the usual
    /// outcome rules do (a submit not accepted).
    pub(crate) fn observe(
        &mut self,
        cp: &CompiledPolicy,
        a: &Attempt,
        plan_poll: impl FnOnce(&JobState, u64, Option<u64>) -> Decision,
    ) -> Option<Decision> {
        let rec = a.job.as_ref()?;
        let stop = |terminal| Decision::Terminal { terminal };
        match rec.kind {
            JobKind::Submit => {
                self.submits = self.submits.saturating_add(1);
                // A timeout may have reached the provider: the answer was
                // lost, and only a reconciliation that found no effect
                // permits another submit.
                if let Outcome::Retryable {
                    kind: RetryableKind::TimeoutBeforeResponse,
                    ..
                } = a.outcome
                {
                    if a.reconciled != Some(Reconciled::FailedNoEffect) {
                        return Some(stop(Terminal::StopIndeterminate));
                    }
                }
                if a.outcome != Outcome::Success {
                    return None;
                }
                self.accepted = rec.job_sha256.clone();
                self.route = Some((
                    a.route_id.clone(),
                    a.route_ordinal,
                    a.route_release_sha256.clone(),
                ));
                self.status = rec.status;
            }
            JobKind::Cancel => {
                // Judged as usual, never retried: the run ends with the
                // terminal that planned it.
                self.cancel = Some(if a.outcome == Outcome::Success {
                    CancelResult::Accepted
                } else {
                    CancelResult::Failed
                });
                return Some(stop(self.cancel_for.unwrap_or(Terminal::StopCancelled)));
            }
            JobKind::Poll => {
                self.polls = self.polls.saturating_add(1);
                match &a.outcome {
                    Outcome::Success => self.status = rec.status,
                    Outcome::NonRetryable { .. } => return Some(stop(Terminal::StopNonRetryable)),
                    Outcome::Retryable { retry_after_ms, .. } => {
                        return Some(self.next_poll(cp, *retry_after_ms, plan_poll))
                    }
                    Outcome::Indeterminate { .. } => {
                        return Some(self.next_poll(cp, None, plan_poll))
                    }
                }
            }
        }
        Some(match self.status {
            None => self.next_poll(cp, None, plan_poll),
            Some(s) if s.is_running() => self.next_poll(cp, None, plan_poll),
            Some(JobStatus::Completed) => stop(Terminal::Completed),
            Some(_) => stop(Terminal::StopNonRetryable),
        })
    }

    /// The next poll, or the bound's terminal.
    fn next_poll(
        &mut self,
        cp: &CompiledPolicy,
        hint: Option<u64>,
        plan_poll: impl FnOnce(&JobState, u64, Option<u64>) -> Decision,
    ) -> Decision {
        let Some(job) = &cp.policy.async_job else {
            return Decision::Terminal {
                terminal: Terminal::StopNonRetryable,
            };
        };
        if self.polls >= job.max_polls {
            self.bound = true;
            return Decision::Terminal {
                terminal: Terminal::StopTotalAttempts,
            };
        }
        let delay = job.poll_delay_ms(self.polls.saturating_add(1));
        plan_poll(self, delay, hint)
    }

    /// Whether the run, ending with `terminal`, leaves the accepted job
    /// running (as far as its last reported status says).
    fn leaves_running(&self, terminal: Terminal) -> bool {
        self.accepted.is_some()
            && terminal != Terminal::Completed
            && self.status.is_none_or(JobStatus::is_running)
    }

    /// Under `cancel_left_running`: the cancel the run plans instead of
    /// `terminal` when that terminal would leave the job running (once per
    /// run), at `at` (run clock); `None` otherwise. The one dispatch exempt
    /// from the deadline: it may start at or after it.
    pub(crate) fn plan_cancel(
        &mut self,
        terminal: Terminal,
        at: u64,
        ordinal: u64,
    ) -> Option<Dispatch> {
        let p = self.cancels.clone()?;
        if self.cancel_for.is_some() || self.cancel.is_some() || !self.leaves_running(terminal) {
            return None;
        }
        let (route_id, route_ordinal, route_release_sha256) = self.route.clone()?;
        self.cancel_for = Some(terminal);
        Some(Dispatch {
            continuation: None,
            deadline_ms: p.deadline_ms,
            delay_ms: 0,
            idempotency_key_sha256: p.idempotency_key_sha256.clone(),
            jitter_max_ms: None,
            jitter_min_ms: None,
            jitter_sample_ms: None,
            job: Some(self.step()),
            logical_request_sha256: p.logical_request_sha256.clone(),
            not_before_ms: at,
            ordinal,
            reserve_cost: 0,
            retry_after_floor_ms: 0,
            route_id,
            route_ordinal,
            route_release_sha256,
        })
    }

    /// Whether the next dispatch is the planned cancel (not yet recorded).
    pub(crate) fn cancel_planned(&self) -> bool {
        self.cancel_for.is_some() && self.cancel.is_none()
    }

    /// The receipt's summary once the run ended with `terminal`.
    pub(crate) fn summary(&self, terminal: Terminal) -> JobSummary {
        JobSummary {
            cancel: self.cancel,
            job_sha256: self.accepted.clone(),
            left_running: self.leaves_running(terminal)
                && self.cancel != Some(CancelResult::Accepted),
            polls: self.polls,
            status: self.status,
            submits: self.submits,
        }
    }
}
