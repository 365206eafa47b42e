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

use crate::attempt::Reconciled;
use crate::canonical::sha256_hex;
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Dispatch;
use crate::ids::Sha256Hex;
use crate::policy::Backoff;

mod check;
mod state;

pub(crate) use check::check;
pub(crate) use state::JobState;

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
mod tests;
