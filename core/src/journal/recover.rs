//! What a new owner does with a verified journal: resume, reconcile an
//! attempt in doubt on a bounded poll schedule, adopt a settled answer, or
//! report the run done.

use super::event::{EventKind, JournalEvent};
use super::{GENESIS_SHA256, MAX_POLLS};
use crate::attempt::{Attempt, Reconciled};
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Terminal};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::machine::replay::{verify, Expect, Log};
use crate::policy::CompiledPolicy;

schema_marker!(
    /// `retryledger.reconciliation.v1`
    ReconciliationSchema = "retryledger.reconciliation.v1"
);

/// A receiver's answer to "what became of the request under this key?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// It completed: adopt its result as the attempt's observation.
    Succeeded,
    /// It verifiably had no effect: the plan may dispatch again.
    FailedNoEffect,
    /// Still running: poll again on the schedule.
    InProgress,
    /// The receiver cannot say: the run ends indeterminate.
    Unknown,
}

names!(AnswerKind {
    Succeeded => "succeeded",
    FailedNoEffect => "failed_no_effect",
    InProgress => "in_progress",
    Unknown => "unknown",
});

/// One answer, at a time on the run clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// What the receiver said.
    pub answer: AnswerKind,
    /// When it said it (run clock, ms).
    pub at_ms: u64,
    /// The cost to charge for the attempt (a settled answer; default the
    /// reserved cost).
    pub cost: Option<u64>,
    /// An async job's submit that `succeeded`: the SHA-256 of the job id
    /// the receiver reported (the acceptance's).
    pub job_sha256: Option<Sha256Hex>,
}

object!(Answer {
    answer: doc,
    at_ms: u64,
    cost: opt_u64,
    job_sha256: opt_doc,
});

/// The answers a host got for the dispatched attempt, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation {
    /// The answers so far.
    pub answers: Vec<Answer>,
    /// How many times the receiver may be asked (1..=[`MAX_POLLS`]).
    pub max_polls: u64,
    /// The attempt asked about.
    pub ordinal: u64,
    /// `retryledger.reconciliation.v1`
    pub schema: ReconciliationSchema,
}

object!(Reconciliation {
    answers: list(usize::try_from(MAX_POLLS).unwrap_or(usize::MAX)),
    max_polls: u64,
    ordinal: u64,
    schema: doc,
});

/// The attempt to reconcile, as the receiver knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The key to ask by.
    pub idempotency_key_sha256: Sha256Hex,
    /// The attempt's ordinal.
    pub ordinal: u64,
    /// The route it went to.
    pub route_id: Identifier,
    /// The route release.
    pub route_release_sha256: Sha256Hex,
    /// When it was sent.
    pub started_at_ms: u64,
}

object!(Pending {
    idempotency_key_sha256: doc,
    ordinal: u64,
    route_id: doc,
    route_release_sha256: doc,
    started_at_ms: u64,
});

/// The answer of [`recover`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one answer per recovery, returned by value"
)]
pub enum Recovery {
    /// The terminal is written.
    Done {
        /// Digest of the receipt.
        receipt_sha256: Sha256Hex,
        /// How the run ended.
        terminal: Terminal,
    },
    /// Append the next event (`next`); for `reserved` and `dispatched`, the
    /// dispatch to make (a reserved attempt was never sent).
    Resume {
        /// The plan, when the next event reserves or dispatches it.
        dispatch: Option<Dispatch>,
        /// The kind of the next event.
        next: EventKind,
        /// Its seq.
        next_seq: u64,
    },
    /// Ask the receiver by idempotency key, not before `not_before_ms`.
    Reconcile {
        /// The attempt.
        attempt: Pending,
        /// The poll bound, once the host has given it with its answers.
        max_polls: Option<u64>,
        /// The earliest time to ask (run clock).
        not_before_ms: u64,
        /// Which ask this is, from 1.
        poll: u64,
    },
    /// The reconciliation settled: append `attempt` as the `observed` event
    /// (then `decision` as `decided`).
    Adopt {
        /// The attempt, its `reconciled` field set.
        attempt: Attempt,
        /// The decision after it.
        decision: Decision,
    },
}

impl Encode for Recovery {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Done {
                receipt_sha256,
                terminal,
            } => {
                o.str("kind", "done")
                    .doc("receipt_sha256", receipt_sha256)
                    .doc("terminal", terminal);
            }
            Self::Resume {
                dispatch,
                next,
                next_seq,
            } => {
                o.opt_doc("dispatch", dispatch.as_ref())
                    .str("kind", "resume")
                    .doc("next", next)
                    .u64("next_seq", *next_seq);
            }
            Self::Reconcile {
                attempt,
                max_polls,
                not_before_ms,
                poll,
            } => {
                o.doc("attempt", attempt)
                    .str("kind", "reconcile")
                    .opt_u64("max_polls", *max_polls)
                    .u64("not_before_ms", *not_before_ms)
                    .u64("poll", *poll);
            }
            Self::Adopt { attempt, decision } => {
                o.doc("attempt", attempt)
                    .doc("decision", decision)
                    .str("kind", "adopt");
            }
        }
        o.end();
    }
}

/// The delay before ask `k + 1` after the `k`-th answer was in progress:
/// the policy's capped exponential backoff, `min(base_ms * 2^(k-1), max_ms)`.
pub fn poll_delay(cp: &CompiledPolicy, k: u64) -> u64 {
    let b = &cp.policy.backoff;
    let shift = u32::try_from(k.saturating_sub(1)).unwrap_or(u32::MAX);
    let exp = if shift >= 63 {
        u64::MAX
    } else {
        b.base_ms.saturating_mul(1_u64 << shift)
    };
    exp.min(b.max_ms)
}

/// What a new owner does with a journal: verify it, then resume,
/// reconcile, adopt a settled reconciliation, or report the run done.
/// Reconciliation answers are only accepted while an attempt waits for one.
pub fn recover(
    cp: &CompiledPolicy,
    events: &[JournalEvent],
    reconciliation: Option<&Reconciliation>,
) -> Result<Recovery> {
    recovered(cp, &verify(cp, events)?, reconciliation)
}

/// [`recover`] from the replay of a verified journal.
pub(super) fn recovered(
    cp: &CompiledPolicy,
    r: &Log,
    reconciliation: Option<&Reconciliation>,
) -> Result<Recovery> {
    let in_round = match &r.tip.expect {
        Expect::Round(round) if round.pending().is_none() => round
            .in_flight()
            .next()
            .and_then(|m| m.sent.as_ref().map(|s| (&m.plan, s, Some(round.as_ref())))),
        _ => None,
    };
    let (planned, sent, round) = match (&r.tip.expect, in_round) {
        (_, Some(found)) => found,
        (Expect::Dispatched(planned, sent), None) => (planned, sent, None),
        _ => {
            if reconciliation.is_some() {
                return Err(Error::at(
                    ErrorCode::ReconciliationUnexpected,
                    "/reconciliation/ordinal",
                    "no dispatched attempt waits for an observation",
                ));
            }
            return Ok(match (&r.tip.expect, r.next_kind()) {
                (Expect::Done, _) | (_, None) => Recovery::Done {
                    receipt_sha256: r
                        .tip
                        .receipt_sha256
                        .clone()
                        .unwrap_or_else(|| Sha256Hex::computed(GENESIS_SHA256.to_owned())),
                    terminal: r.run.terminal().unwrap_or(Terminal::StopIndeterminate),
                },
                (Expect::Round(round), Some(_)) => Recovery::Resume {
                    dispatch: round.pending().cloned(),
                    next: EventKind::Dispatched,
                    next_seq: r.tip.len,
                },
                (Expect::Reserved(d), Some(next)) => Recovery::Resume {
                    dispatch: Some(d.clone()),
                    next,
                    next_seq: r.tip.len,
                },
                (Expect::Planned, Some(next)) => Recovery::Resume {
                    dispatch: match r.run.next() {
                        Decision::Dispatch(d) => Some(d.clone()),
                        Decision::Terminal { .. } => None,
                    },
                    next,
                    next_seq: r.tip.len,
                },
                (_, Some(next)) => Recovery::Resume {
                    dispatch: None,
                    next,
                    next_seq: r.tip.len,
                },
            });
        }
    };
    let pending = Pending {
        idempotency_key_sha256: sent.idempotency_key_sha256.clone(),
        ordinal: sent.ordinal,
        route_id: sent.route_id.clone(),
        route_release_sha256: sent.route_release_sha256.clone(),
        started_at_ms: sent.started_at_ms,
    };
    let Some(rec) = reconciliation else {
        return Ok(Recovery::Reconcile {
            attempt: pending,
            max_polls: None,
            not_before_ms: sent.started_at_ms,
            poll: 1,
        });
    };
    if rec.ordinal != sent.ordinal {
        return Err(Error::at(
            ErrorCode::ReconciliationUnexpected,
            "/reconciliation/ordinal",
            format!("attempt {} waits for reconciliation", sent.ordinal),
        ));
    }
    if rec.max_polls == 0 || rec.max_polls > MAX_POLLS {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/reconciliation/max_polls",
            format!("max_polls must be in 1..={MAX_POLLS}"),
        ));
    }
    let deadline = cp.policy.deadline_ms;
    let mut due = sent.started_at_ms;
    let mut polls = 0_u64;
    let mut settled: Option<(Reconciled, u64, Option<u64>, Option<Sha256Hex>)> = None;
    let mut last_at = sent.started_at_ms;
    for (k, a) in rec.answers.iter().enumerate() {
        let at = |f: &str| format!("/reconciliation/answers/{k}/{f}");
        if settled.is_some() {
            return Err(Error::at(
                ErrorCode::ReconciliationAfterSettled,
                at("answer"),
                "the answers had already settled",
            ));
        }
        if polls >= rec.max_polls {
            return Err(Error::at(
                ErrorCode::PollLimitExceeded,
                format!("/reconciliation/answers/{k}"),
                format!("more than max_polls ({}) answers", rec.max_polls),
            ));
        }
        if a.at_ms < due {
            return Err(Error::at(
                ErrorCode::PollTooEarly,
                at("at_ms"),
                format!(
                    "asked at {}, the schedule allows {due} at the earliest",
                    a.at_ms
                ),
            ));
        }
        polls = polls.saturating_add(1);
        last_at = a.at_ms;
        match a.answer {
            AnswerKind::InProgress => {
                if a.cost.is_some() {
                    return Err(Error::at(
                        ErrorCode::InvalidValue,
                        at("cost"),
                        "an answer still in progress charges nothing yet",
                    ));
                }
                due = a.at_ms.saturating_add(poll_delay(cp, polls));
            }
            AnswerKind::Succeeded => {
                settled = Some((Reconciled::Succeeded, a.at_ms, a.cost, a.job_sha256.clone()))
            }
            AnswerKind::FailedNoEffect => {
                settled = Some((Reconciled::FailedNoEffect, a.at_ms, a.cost, None))
            }
            AnswerKind::Unknown => settled = Some((Reconciled::Unknown, a.at_ms, a.cost, None)),
        }
    }
    let settled = match settled {
        Some(s) => s,
        None if polls > 0 && (polls >= rec.max_polls || due >= deadline) => {
            // Still in progress at the poll bound or the deadline: unknown.
            (Reconciled::Unknown, last_at, None, None)
        }
        None => {
            return Ok(Recovery::Reconcile {
                attempt: pending,
                max_polls: Some(rec.max_polls),
                not_before_ms: due,
                poll: polls.saturating_add(1),
            })
        }
    };
    let (answer, completed_at_ms, cost, job_sha256) = settled;
    // A streamed attempt cut with its owner: the journal holds none of its
    // events, so its record is empty, and a success cannot be committed.
    let stream = cp
        .policy
        .stream
        .as_ref()
        .map(|_| crate::stream::record_of(None, &[], 0, planned.continuation.as_ref()));
    let answer = match (answer, &stream) {
        (Reconciled::Succeeded, Some(_)) => Reconciled::SucceededStreamLost,
        (a, _) => a,
    };
    let attempt = Attempt {
        admission: sent.admission.clone(),
        // The owner that sent it did not live to say what it sent.
        reconciled: Some(answer),
        stream,
        // An async job's step: a submit's acceptance carries the job id
        // the receiver reported; a poll or the cancel asked about the
        // accepted job.
        job: planned
            .job
            .as_ref()
            .map(|step| crate::job::record_of(step, Some((job_sha256, None)))),
        hedge: round.and_then(|rd| rd.mark_of(cp, sent.ordinal)),
        ..planned.attempt(
            sent.started_at_ms,
            completed_at_ms,
            cost.unwrap_or(planned.reserve_cost),
            answer.outcome(),
        )
    };
    let mut run = r.run.clone();
    if let Some(rd) = round {
        // A member of a hedged round: the round's decision once every
        // member is observed, the run's plan until then.
        let (next, complete) = rd.observe(&attempt, 0)?;
        if complete {
            let mut attempts = r.attempts.clone();
            next.resolve(cp, &mut run, &mut attempts, 0)?;
        }
        return Ok(Recovery::Adopt {
            attempt,
            decision: run.next().clone(),
        });
    }
    let index = r.attempts.attempts.len();
    let d = run.check(cp, &attempt, index)?;
    run.observe(cp, &attempt, d, index)?;
    Ok(Recovery::Adopt {
        attempt,
        decision: run.next().clone(),
    })
}
