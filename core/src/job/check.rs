//! Checking an attempt's job record against the planned step.

use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Dispatch;
use crate::outcome::Outcome;

use super::{resubmit, JobKind};

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
