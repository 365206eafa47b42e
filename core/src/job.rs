//! Provider asynchronous jobs: submit once, then poll by the provider's id.
//!
//! A policy with an `async_job` section runs one logical request as a job a
//! provider holds (OpenAI Responses with `background: true`, Anthropic
//! Message Batches). Every planned dispatch then says what it is
//! ([`JobStep`]): a `submit`, or a `poll` of the accepted job.
//!
//! - A submit is judged like any attempt until the provider accepts it: a
//!   retryable failure plans another submit under the usual rules, a
//!   non-retryable one stops, and a submit whose answer was lost (the
//!   connection dropped, or a timeout before the answer: the provider may
//!   have accepted it) stops `stop_indeterminate`: it is never
//!   resubmitted blind. A host that reconciles it by idempotency key records
//!   the answer in the journal's vocabulary (`reconciled`): `succeeded` with
//!   the job's id is an acceptance, `failed_no_effect` permits another
//!   submit, `unknown` stays indeterminate
//!   ([`crate::session::Session::set_reconciled`]).
//! - A submit that succeeded is the acceptance; it must carry the job's id.
//!   After it the run plans only polls of that job, never a second submit.
//!   Poll `n` waits `min(poll_base_ms * 2^(n-1), poll_max_ms)` after the
//!   previous completion, raised to a poll's bounded Retry-After hint; at
//!   most `max_polls` polls, each starting before the deadline.
//! - A poll's answer is a fact the core judges: a job still `queued` or
//!   `in_progress` plans the next poll; `completed` completes the run;
//!   `failed`, `cancelled`, `incomplete` and `expired` stop it
//!   `stop_non_retryable` (a new submit would pay twice). A poll that failed
//!   retryably or lost its answer changes nothing at the provider and plans
//!   the next poll; a non-retryable poll failure (the job is gone) stops.
//!   Polls past the bound stop `stop_total_attempts`; a poll that cannot
//!   start before the deadline stops `stop_deadline`.
//! - Under `cancel_left_running`, a run that would end with the accepted job
//!   still running (the deadline, the poll bound, a caller's cancellation,
//!   any terminal but `completed`) first plans one `cancel` of the job: the
//!   host sends it and records the attempt with its outcome, never retried,
//!   and the run then ends with the terminal that triggered it. The cancel is
//!   the one dispatch that may start at or after the deadline; it reserves no
//!   cost and counts against no attempt bound.
//!
//! Documents hold only the SHA-256 of the provider's job id (hex of the
//! UTF-8 bytes), never the id: the host keeps the id it polls with and
//! reports it, so a poll of another job is `job_id_drift`. The receipt's
//! `job` summary says whether the run ended with the job still running and
//! no confirmed cancel (`left_running`) and, when a cancel was planned, what
//! became of it (`cancel`). Polls and the cancel are attempts (they take
//! global ordinals and the submit's route and route ordinal) but count
//! neither against the route's nor the total attempt bound, and reserve no
//! cost.

use crate::attempt::{Attempt, Reconciled};
use crate::canonical::sha256_hex;
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Terminal};
use crate::ids::{Identifier, Sha256Hex};
use crate::outcome::{Outcome, RetryableKind};
use crate::policy::{Backoff, CompiledPolicy};

/// Most polls a policy may allow.
pub const MAX_POLLS: u64 = 10_000;

/// The policy's `async_job` section. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncJob {
    /// `Some(true)`: a run that would end with the accepted job still
    /// running first plans one `cancel` of it, recorded like any attempt.
    /// Absent otherwise (`false` is refused: one spelling per behaviour,
    /// so a policy without it keeps its digest).
    pub cancel_left_running: Option<bool>,
    /// Most polls after the acceptance, in `1..=`[`MAX_POLLS`].
    pub max_polls: u64,
    /// Delay before the first poll, ms; doubled per poll up to `poll_max_ms`.
    pub poll_base_ms: u64,
    /// Largest delay between two polls, ms.
    pub poll_max_ms: u64,
}

object!(AsyncJob {
    cancel_left_running: opt_doc,
    max_polls: u64,
    poll_base_ms: u64,
    poll_max_ms: u64,
});

impl AsyncJob {
    /// Check the section against the run's deadline.
    /// An async job is not streamed (it is polled).
    pub(crate) fn check(&self, deadline_ms: u64, stream: bool) -> Result<()> {
        let bad = |field: &str, msg: String| {
            Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                format!("/async_job/{field}"),
                msg,
            ))
        };
        if stream {
            return Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                "/async_job",
                "an async job is polled, not streamed".to_owned(),
            ));
        }
        if self.cancel_left_running == Some(false) {
            return bad(
                "cancel_left_running",
                "cancel_left_running is true or absent (absent: the job is not cancelled)"
                    .to_owned(),
            );
        }
        if self.max_polls == 0 || self.max_polls > MAX_POLLS {
            return bad("max_polls", format!("max_polls must be in 1..={MAX_POLLS}"));
        }
        if self.poll_base_ms == 0 || self.poll_base_ms >= deadline_ms {
            return bad(
                "poll_base_ms",
                format!("poll_base_ms must be in 1..deadline_ms ({deadline_ms})"),
            );
        }
        if self.poll_max_ms < self.poll_base_ms || self.poll_max_ms >= deadline_ms {
            return bad(
                "poll_max_ms",
                format!("poll_max_ms must be in poll_base_ms..deadline_ms ({deadline_ms})"),
            );
        }
        Ok(())
    }

    /// Whether a job the run would leave running is cancelled first.
    pub fn cancels_left_running(&self) -> bool {
        self.cancel_left_running == Some(true)
    }

    /// The delay before poll `n` (from 1): `min(base * 2^(n-1), max)`, saturating.
    pub fn poll_delay_ms(&self, n: u64) -> u64 {
        let shift = u32::try_from(n.saturating_sub(1)).ok();
        shift
            .and_then(|s| 1u64.checked_shl(s))
            .and_then(|f| self.poll_base_ms.checked_mul(f))
            .map_or(self.poll_max_ms, |v| v.min(self.poll_max_ms))
    }
}

/// What a dispatch of an async job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Submit the request; the provider answers with a job id.
    Submit,
    /// Retrieve the accepted job by its id.
    Poll,
    /// Cancel the accepted job at the provider (`cancel_left_running`).
    Cancel,
}

names!(JobKind {
    Submit => "submit",
    Poll => "poll",
    Cancel => "cancel",
});

/// What became of the planned cancel of a job left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelResult {
    /// The provider accepted the cancel (the attempt succeeded).
    Accepted,
    /// It did not confirm it (an error, or an answer lost): the attempt's
    /// outcome says which. Never retried.
    Failed,
}

names!(CancelResult {
    Accepted => "accepted",
    Failed => "failed",
});

/// A job's status as the provider reports it (hosts map the provider's
/// words onto these: an Anthropic batch that `ended` is `completed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    /// Accepted, not started.
    Queued,
    /// Running.
    InProgress,
    /// Finished with a result.
    Completed,
    /// Finished without one.
    Failed,
    /// Cancelled at the provider.
    Cancelled,
    /// Finished with a partial result.
    Incomplete,
    /// Expired before it finished.
    Expired,
}

names!(JobStatus {
    Queued => "queued",
    InProgress => "in_progress",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    Incomplete => "incomplete",
    Expired => "expired",
});

impl JobStatus {
    /// The status a host reports by name; another name is `invalid_value`.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .iter()
            .zip(Self::NAMES)
            .find(|(_, n)| **n == name)
            .map(|(s, _)| *s)
            .ok_or_else(|| {
                Error::at(
                    ErrorCode::InvalidValue,
                    "/status",
                    format!("a job status is one of {}", Self::NAMES.join(", ")),
                )
            })
    }

    /// Whether the job is still running (another poll may see it finish).
    pub fn is_running(self) -> bool {
        matches!(self, Self::Queued | Self::InProgress)
    }
}

/// What the planned dispatch of an async job is. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStep {
    /// The accepted job's id digest, for a poll or a cancel.
    pub job_sha256: Option<Sha256Hex>,
    /// Submit, poll or cancel.
    pub kind: JobKind,
    /// The poll's number, from 1, for a poll.
    pub poll: Option<u64>,
}

object!(JobStep {
    job_sha256: opt_doc,
    kind: doc,
    poll: opt_u64,
});

/// What an attempt of an async job was and saw. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// SHA-256 of the provider's job id: the id a submit was answered with,
    /// or the id a poll (or the cancel) asked about.
    pub job_sha256: Option<Sha256Hex>,
    /// Submit, poll or cancel.
    pub kind: JobKind,
    /// The poll's number, from 1, for a poll.
    pub poll: Option<u64>,
    /// The job's status in the provider's answer, when a submit or a poll
    /// succeeded (a cancel records none).
    pub status: Option<JobStatus>,
}

object!(JobRecord {
    job_sha256: opt_doc,
    kind: doc,
    poll: opt_u64,
    status: opt_doc,
});

/// The receipt's summary of an async job. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSummary {
    /// What became of the planned cancel (`cancel_left_running`); absent
    /// when none was planned.
    pub cancel: Option<CancelResult>,
    /// The accepted job's id digest; absent when no submit was accepted.
    pub job_sha256: Option<Sha256Hex>,
    /// `true` when the run ended with the accepted job still running and no
    /// cancel the provider accepted: without `cancel_left_running` the
    /// host cancels it at the provider after sealing (unrecorded).
    pub left_running: bool,
    /// Polls made.
    pub polls: u64,
    /// The job's last reported status.
    pub status: Option<JobStatus>,
    /// Submits made.
    pub submits: u64,
}

object!(JobSummary {
    cancel: opt_doc,
    job_sha256: opt_doc,
    left_running: bool,
    polls: u64,
    status: opt_doc,
    submits: u64,
});

/// The SHA-256 of a provider's job id, as documents hold it.
pub fn job_id_digest(id: &str) -> Sha256Hex {
    Sha256Hex::computed(sha256_hex(id.as_bytes()))
}

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

/// Check an attempt's job record against the planned step.
pub(crate) fn check(d: &Dispatch, a: &Attempt, i: usize) -> Result<()> {
    let drift = |code, field: &str, msg: &str| Err(Error::attempt(code, i, field, msg.to_owned()));
    let (Some(step), Some(rec)) = (&d.job, &a.job) else {
        return match (&d.job, &a.job) {
            (Some(_), None) => drift(
                ErrorCode::JobRecordMissing,
                "job",
                "the policy has an async_job section but the attempt records no job step",
            ),
            (None, Some(_)) => drift(
                ErrorCode::JobRecordUnexpected,
                "job",
                "the attempt records a job step the policy has no async_job section for",
            ),
            _ => Ok(()),
        };
    };
    match (step.kind, rec.kind) {
        (JobKind::Poll | JobKind::Cancel, JobKind::Submit) => return Err(resubmit(i)),
        (JobKind::Submit, JobKind::Poll) => {
            return drift(
                ErrorCode::JobKindDrift,
                "job/kind",
                "a poll before the provider accepted a submit",
            )
        }
        (JobKind::Cancel, JobKind::Poll) => {
            return drift(
                ErrorCode::JobKindDrift,
                "job/kind",
                "a poll where the cancel of the job left running is planned",
            )
        }
        (JobKind::Submit | JobKind::Poll, JobKind::Cancel) => {
            return drift(
                ErrorCode::JobKindDrift,
                "job/kind",
                "a cancel the core did not plan: the run had not ended with the job running",
            )
        }
        _ => {}
    }
    if rec.poll != step.poll {
        return drift(
            ErrorCode::JobKindDrift,
            "job/poll",
            "the poll's number is not the planned one",
        );
    }
    let success = a.outcome == Outcome::Success;
    match rec.kind {
        JobKind::Poll | JobKind::Cancel => {
            if rec.job_sha256 != step.job_sha256 {
                return drift(
                    ErrorCode::JobIdDrift,
                    "job/job_sha256",
                    if rec.kind == JobKind::Cancel {
                        "the cancel asked about another job than the accepted one"
                    } else {
                        "the poll asked about another job than the accepted one"
                    },
                );
            }
        }
        JobKind::Submit => {
            if success && rec.job_sha256.is_none() {
                return drift(
                    ErrorCode::JobIdMissing,
                    "job/job_sha256",
                    "an accepted submit records no job id",
                );
            }
            if !success && rec.job_sha256.is_some() {
                return drift(
                    ErrorCode::JobStatusDrift,
                    "job/job_sha256",
                    "a submit the provider did not accept records a job id",
                );
            }
        }
    }
    if rec.kind == JobKind::Cancel && rec.status.is_some() {
        return drift(
            ErrorCode::JobStatusDrift,
            "job/status",
            "a cancel records no job status",
        );
    }
    if success && rec.kind == JobKind::Poll && rec.status.is_none() {
        return drift(
            ErrorCode::JobStatusDrift,
            "job/status",
            "a successful poll records no job status",
        );
    }
    if !success && rec.status.is_some() {
        return drift(
            ErrorCode::JobStatusDrift,
            "job/status",
            "a failed attempt records a job status",
        );
    }
    Ok(())
}

/// Whether a dispatch is admitted by a fleet section: every attempt but a
/// job's polls and its cancel, which ask about a job the provider already
/// holds (no retry to budget, no route to skip: they go where the submit
/// was accepted).
pub fn admitted_step(d: &Dispatch) -> bool {
    d.job.as_ref().is_none_or(|s| s.kind == JobKind::Submit)
}

/// The bounded Retry-After floor of a poll's hint.
pub(crate) fn poll_floor(backoff: &Backoff, hint: Option<u64>) -> u64 {
    crate::schedule::retry_after_floor_ms(backoff, hint)
}

fn resubmit(i: usize) -> Error {
    Error::attempt(
        ErrorCode::JobResubmit,
        i,
        "job/kind",
        "a second submit after the provider accepted the job: only polls follow an acceptance",
    )
}

/// A reconciliation answer a host reports by name (`succeeded`,
/// `failed_no_effect`, `unknown`); another name is `invalid_value`.
pub fn reconciled_named(name: &str) -> Result<Reconciled> {
    // `succeeded_stream_lost` is the core's own reading of a streamed
    // attempt's answer, never a receiver's.
    let named = || {
        Reconciled::ALL
            .iter()
            .zip(Reconciled::NAMES)
            .filter(|(r, _)| **r != Reconciled::SucceededStreamLost)
    };
    named()
        .find(|(_, n)| **n == name)
        .map(|(r, _)| *r)
        .ok_or_else(|| {
            let names: Vec<&str> = named().map(|(_, n)| *n).collect();
            Error::at(
                ErrorCode::InvalidValue,
                "/reconciled",
                format!("a reconciliation answer is one of {}", names.join(", ")),
            )
        })
}

/// The record of a planned step from what the host reported (an id digest
/// and a status); a poll or cancel that reports no id asked about the
/// planned job.
pub(crate) fn record_of(
    step: &JobStep,
    noted: Option<(Option<Sha256Hex>, Option<JobStatus>)>,
) -> JobRecord {
    let (id, status) = noted.unwrap_or((None, None));
    let job_sha256 = match step.kind {
        JobKind::Poll | JobKind::Cancel => id.or_else(|| step.job_sha256.clone()),
        JobKind::Submit => id,
    };
    JobRecord {
        job_sha256,
        kind: step.kind,
        poll: step.poll,
        status,
    }
}

#[cfg(all(test, feature = "lab"))]
#[allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]
mod tests {
    //! `cancel_left_running` over every short script of answers: the flag
    //! changes no terminal, plans at most one cancel (the last attempt),
    //! exactly when the run would leave the job running, and only that
    //! cancel may start at or after the deadline.
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::*;
    use crate::evaluate::{plan_next, Decision};
    use crate::session::Session;
    use crate::{compile, verify_bundle};

    const DEADLINE: u64 = 2_000;

    fn policy(cancel: bool) -> Arc<CompiledPolicy> {
        let mut p = crate::lab::reference_policy();
        p["async_job"] = json!({"max_polls": 3, "poll_base_ms": 200, "poll_max_ms": 600});
        if cancel {
            p["async_job"]["cancel_left_running"] = json!(true);
        }
        p["deadline_ms"] = json!(DEADLINE);
        Arc::new(compile(crate::decode::from_value(p).unwrap()).unwrap())
    }

    /// An answer by index: (duration, facts, status); `None` is the caller's
    /// cancellation between attempts.
    fn answer(k: usize) -> Option<(u64, &'static str, Option<JobStatus>)> {
        let ok = r#"{"result":"returned"}"#;
        let unavailable = r#"{"error_types":["APIStatusError"],"result":"raised","status":503}"#;
        match k {
            0 => Some((50, ok, Some(JobStatus::Queued))),
            1 => Some((700, ok, Some(JobStatus::InProgress))),
            2 => Some((50, ok, Some(JobStatus::Completed))),
            3 => Some((50, unavailable, None)),
            4 => Some((1_500, ok, Some(JobStatus::InProgress))),
            _ => None,
        }
    }

    /// Run `script` (answer indexes; the cancel step answers `cancel_ok`),
    /// padded with completions, to its sealed bundle and its decisions.
    fn run(cancel: bool, script: &[usize], cancel_ok: bool) -> (crate::Bundle, Vec<Decision>) {
        let cp = policy(cancel);
        let mut s = Session::start(cp.clone());
        let mut decisions = vec![s.next().clone()];
        let mut now = 0u64;
        let mut next = script.iter().copied().chain(std::iter::repeat(2));
        while let Decision::Dispatch(d) = s.next().clone() {
            let start = d.not_before_ms.max(now);
            let (duration, facts, status) = if d.job.as_ref().unwrap().kind == JobKind::Cancel {
                let facts = if cancel_ok {
                    r#"{"result":"returned"}"#
                } else {
                    r#"{"error_types":["APIStatusError"],"result":"raised","status":409}"#
                };
                (20, facts, None)
            } else {
                match answer(next.next().unwrap()) {
                    Some(a) => a,
                    None => {
                        s.cancel(now).unwrap();
                        decisions.push(s.next().clone());
                        continue;
                    }
                }
            };
            now = start + duration;
            // A submit reports the id only when the provider accepted it.
            let submit = d.job.as_ref().unwrap().kind == JobKind::Submit;
            let id = (!submit || status.is_some()).then_some("resp_exhaustive");
            s.set_job(id, status);
            let facts = crate::decode::from_str(facts).unwrap();
            s.observe(start, now, None, &facts).unwrap();
            assert_eq!(s.next(), &plan_next(&cp, s.attempts()).unwrap());
            decisions.push(s.next().clone());
        }
        (s.seal().unwrap(), decisions)
    }

    fn scripts(len: usize) -> Vec<Vec<usize>> {
        (0..len).fold(vec![vec![]], |acc, _| {
            acc.iter()
                .flat_map(|s| {
                    (0..6).map(move |k| {
                        let mut s = s.clone();
                        s.push(k);
                        s
                    })
                })
                .chain(acc.iter().cloned())
                .collect()
        })
    }

    #[test]
    fn the_cancel_of_a_job_left_running_is_planned_once_and_recorded() {
        let mut cancels = 0;
        for script in scripts(4) {
            for cancel_ok in [true, false] {
                let (plain, _) = run(false, &script, cancel_ok);
                let (b, decisions) = run(true, &script, cancel_ok);
                let plain_job = plain.receipt.job.clone().unwrap();
                let job = b.receipt.job.clone().unwrap();
                assert_eq!(b.receipt.terminal, plain.receipt.terminal, "{script:?}");
                assert_eq!(plain_job.cancel, None);
                let recorded: Vec<_> = b
                    .attempts
                    .attempts
                    .iter()
                    .filter(|a| a.job.as_ref().unwrap().kind == JobKind::Cancel)
                    .collect();
                // A cancel exactly when the plain run left the job running.
                assert_eq!(
                    recorded.len(),
                    usize::from(plain_job.left_running),
                    "{script:?}"
                );
                assert_eq!(job.cancel.is_some(), plain_job.left_running);
                if let Some(c) = recorded.first() {
                    cancels += 1;
                    assert_eq!(Some(*c), b.attempts.attempts.last());
                    let want = if cancel_ok {
                        CancelResult::Accepted
                    } else {
                        CancelResult::Failed
                    };
                    assert_eq!(job.cancel, Some(want));
                    assert_eq!(job.left_running, !cancel_ok);
                    assert_eq!(c.job.as_ref().unwrap().job_sha256, job.job_sha256);
                }
                // Only the cancel may start at or after the deadline.
                for d in &decisions {
                    if let Decision::Dispatch(d) = d {
                        let is_cancel = d.job.as_ref().unwrap().kind == JobKind::Cancel;
                        assert!(is_cancel || d.not_before_ms < DEADLINE, "{script:?}");
                        if is_cancel {
                            assert_eq!(d.reserve_cost, 0);
                        }
                    }
                }
                assert!(verify_bundle(&b).is_ok(), "{script:?}");
            }
        }
        assert!(cancels > 100, "the scripts reach the cancel: {cancels}");
    }

    #[test]
    fn a_cancel_past_the_deadline_is_planned_at_the_last_completion() {
        // A poll that completes past the deadline, the job still running.
        let (b, decisions) = run(true, &[4, 1], true);
        let last = b.attempts.attempts.last().unwrap();
        assert_eq!(last.job.as_ref().unwrap().kind, JobKind::Cancel);
        let before = &b.attempts.attempts[b.attempts.attempts.len() - 2];
        assert!(before.completed_at_ms >= DEADLINE);
        assert_eq!(last.started_at_ms, before.completed_at_ms);
        assert_eq!(b.receipt.terminal, Terminal::StopDeadline);
        let doc: Value = crate::canonical::to_value(&b.receipt);
        assert_eq!(doc["job"]["cancel"], "accepted");
        assert!(matches!(decisions.last(), Some(Decision::Terminal { .. })));
    }
}
