//! The async job layer of the run machine: a job's submit is dispatched
//! like any attempt; once the provider accepted it, the run asks the host
//! to [`Effect::Poll`] it at the schedule [`crate::job`] plans, and, when a
//! run would leave it running under `cancel_left_running` (a caller's
//! cancellation included), to [`Effect::Cancel`] it. Each is answered with
//! an observation that carries the job id and the status the provider
//! reported.
//!
//! - Output checks run on the job's final result only: the answer whose
//!   status is `completed`. The checks a host reports with a submit, a
//!   poll of a job still running, or the cancel are not judged.
//! - Under a fleet section the submit is admitted like any attempt; polls
//!   and the cancel ask about a job the provider already holds, on the
//!   submit's route, and are not admitted (nothing to retry, no route to
//!   skip).
//! - Under a journal the accepted submit's `observed` event holds the job
//!   id's SHA-256, so a resumed run polls that job and never submits
//!   again. A poll cut by a crash had no effect at the provider (it reads
//!   the job): the machine settles it `failed_no_effect` itself and polls
//!   again. A submit or a cancel cut by a crash is reconciled with the
//!   receiver; a submit reconciled `succeeded` carries the job id the
//!   receiver reported (`job_id` of the `reconciled` event).

use super::{Effect, Observation};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch};
use crate::job::{JobKind, JobStatus};
use crate::journal::{Answer, AnswerKind};
use crate::observe::Facts;
use crate::session::Session;

/// The effect that sends a planned dispatch: a poll or a cancel of the
/// accepted job, or any other attempt.
pub(super) fn effect(dispatch: Dispatch, started_at_ms: u64) -> Effect {
    match dispatch.job.as_ref().map(|s| s.kind) {
        Some(JobKind::Poll) => Effect::Poll {
            dispatch,
            started_at_ms,
        },
        Some(JobKind::Cancel) => Effect::Cancel {
            dispatch,
            started_at_ms,
        },
        Some(JobKind::Submit) | None => Effect::Dispatch {
            dispatch,
            started_at_ms,
            hedge_at_ms: None,
            key: None,
            stream: None,
        },
    }
}

/// Note what an observation says of the job in the session, and drop the
/// output checks of an answer that is not the job's final result.
pub(super) fn note(session: &mut Session, obs: &Observation, facts: &mut Facts) -> Result<()> {
    let step = match session.next() {
        Decision::Dispatch(d) => d.job.clone(),
        Decision::Terminal { .. } => None,
    };
    let reported = obs.job_id.is_some() || obs.job_status.is_some();
    let Some(step) = step else {
        if obs.reconciled.is_some() {
            return Err(Error::at(
                ErrorCode::JobRecordUnexpected,
                "/reconciled",
                "a reconciliation for an attempt that is not a job's submit",
            ));
        }
        if reported {
            return Err(Error::at(
                ErrorCode::JobRecordUnexpected,
                "/job_status",
                "a job id or status for an attempt that is not a job's",
            ));
        }
        return Ok(());
    };
    if obs.job_id.as_deref() == Some("") {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/job_id",
            "a job id is not empty",
        ));
    }
    let final_result = step.kind != JobKind::Cancel && obs.job_status == Some(JobStatus::Completed);
    let mut status = obs.job_status;
    if !final_result {
        facts.output_checks.clear();
    } else if crate::output::judge_checks(&facts.output_checks).is_some() {
        // The final result failed its check: the answer is judged by it,
        // and a failed attempt records no job status.
        status = None;
    }
    if let Some(answer) = obs.reconciled {
        if step.kind != JobKind::Submit {
            return Err(Error::at(
                ErrorCode::JobRecordUnexpected,
                "/reconciled",
                "only a job's submit is reconciled in the run: a poll or a cancel is not",
            ));
        }
        session.set_reconciled(answer);
    }
    if reported {
        session.set_job(obs.job_id.as_deref(), status);
    }
    Ok(())
}

/// The cancellation a reservation journals first: the caller's, when the
/// planned dispatch is the cancel of the job it would leave running and the
/// run has no attempt since (a cancel planned by the deadline or the poll
/// bound follows the decision that planned it, and journals none).
pub(super) fn cancelled_first(session: &Session, planned: &Dispatch) -> Option<u64> {
    let cancel = planned
        .job
        .as_ref()
        .is_some_and(|s| s.kind == JobKind::Cancel);
    cancel.then(|| session.attempts().cancelled_at_ms).flatten()
}

/// The answer the machine gives itself for a job's poll in doubt: a poll
/// reads the job and changes nothing at the provider, so it had no effect
/// and the next poll may be sent. `None` for any other attempt.
pub(super) fn settled_in_doubt(session: &Session, now_ms: u64) -> Option<Answer> {
    let Decision::Dispatch(d) = session.next() else {
        return None;
    };
    let poll = d.job.as_ref().is_some_and(|s| s.kind == JobKind::Poll);
    poll.then_some(Answer {
        answer: AnswerKind::FailedNoEffect,
        at_ms: now_ms,
        cost: None,
        job_sha256: None,
    })
}
