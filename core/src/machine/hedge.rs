//! The hedge layer of the run machine: more than one attempt in flight.
//!
//! A hedged run is a sequence of rounds (see [`crate::hedge`]): the lead
//! the ordinary plan gives, then, while no result of the round has arrived,
//! hedge k at `lead start + k * delay_ms`. The layer holds the open round
//! and the run of the rounds resolved (`rounds`); its transitions (when to
//! hedge, on which route, which result decides, which attempts lose and
//! what they cost) follow the hedge rules of [`crate::hedge`]. The hedge
//! drivers' [`HedgeSession`] is a handle on this same layer, moved by the
//! same transitions, so a run driven through the machine reaches the
//! receipt the hedge drivers reach on the same events.
//!
//! The protocol, beyond the plain machine's:
//!
//! - [`Effect::Dispatch`] of a hedged run carries `hedge_at_ms` when a
//!   hedge is on offer: the host sends the attempt and answers with the
//!   observation of any attempt in flight (naming its `ordinal`), or with a
//!   `clock` reading at `hedge_at_ms` when nothing answered before it; the
//!   machine then asks for the hedge (admitted first under a fleet).
//! - [`Effect::Await`] waits the same way without sending anything.
//! - [`Effect::CancelAttempts`] names the losers of a decided round; the
//!   host answers [`Event::AttemptCancelled`] for one of them, or its
//!   observation when the result arrived first (a late loser, kept and
//!   never adopted), until none is left.
//!
//! Under a fleet section every lead and every hedge is admitted before it
//! is sent (`read`, then `write`, `store`): a lead deposits into the retry
//! budget when it is the run's first attempt and withdraws otherwise, a
//! hedge withdraws; a lead skips a route whose breaker is open, a hedge is
//! admitted by its route's breaker; a refused hedge is not sent and its
//! round takes no more. Each member's outcome (a cancelled loser's too) is
//! recorded on its route's breaker before it is journaled. Admission
//! limits are refused with a hedge section when the policy is compiled.
//!
//! Under a journal every member of a round is `reserved` + `dispatched` in
//! one append before it is sent, and `observed` (with the round's
//! `decided` once every member is) in one append after its result or its
//! cancellation ([`crate::journal`]'s hedged rounds; `journal`). A new owner resumes
//! an open round by reconciling each member in flight with the receiver,
//! in ordinal order, until the round is decided (the rest are then
//! cancelled as losers) or every member is settled; only
//! `failed_no_effect` lets a later round send again.

use std::sync::Arc;

mod admit;
mod host;
mod journal;
mod rounds;
mod store;
#[cfg(all(test, feature = "lab"))]
#[allow(
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    reason = "a test: a missing value is a failure"
)]
mod tests;

pub use admit::HedgeAdmitted;
#[cfg(feature = "lab")]
pub use host::script;
pub use host::{HedgeObserved, HedgeSession};
pub use rounds::HedgeStep;

use super::fleet;
use super::replay::round::{position, Position};
use super::{Effect, Event, Machine, Observation, Options};
use crate::attempt::{Attempt, Attempts};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Dispatch, Run};
use crate::fleet::{Admission, FleetSnapshots, Generations};
use crate::hedge::HedgeSummary;
use crate::journal::{Answer, AnswerKind, Entry, Pending, Reconciliation, Writer};
use crate::observe::{Facts, Judgement};
use crate::policy::CompiledPolicy;

/// Where the hedge layer is.
#[derive(Debug, Clone)]
enum Stage {
    /// Look at the round's next step.
    Plan,
    /// Waiting for the read of an admission.
    Reading { reads: fleet::Reads, conflicts: u64 },
    /// Waiting for the admission's writes; `before` is the layer as it
    /// was before the admission, decided again after a conflict.
    Writing {
        conflicts: u64,
        count: u64,
        before: Box<Layer>,
    },
    /// Waiting for the read of member `ordinal`'s breaker, to record its
    /// outcome there.
    Settling {
        reads: fleet::Reads,
        ordinal: u64,
        conflicts: u64,
    },
    /// Waiting for the write of that breaker's record.
    SettleWriting {
        ordinal: u64,
        conflicts: u64,
        count: u64,
    },
    /// A cancellation while the admitted lead holds a slot of the
    /// admission limits: waiting for the read to free it.
    Releasing {
        reads: fleet::Reads,
        at_ms: u64,
        conflicts: u64,
    },
    /// Waiting for the write that frees it.
    ReleaseWriting {
        at_ms: u64,
        conflicts: u64,
        count: u64,
    },
    /// Waiting for the clock to reach a lead's planned start.
    Sleeping,
    /// Waiting for a result of an attempt in flight (or the hedge due).
    Waiting { hedge_at_ms: Option<u64> },
    /// Waiting for the losers of a decided round.
    Cancelling { ordinals: Vec<u64> },
    /// A journal to open: `created` + `decided`.
    Open,
    /// A resumed journal whose next event is `decided`.
    Decide,
    /// Waiting for an append; then go on.
    Appending(After),
    /// Asking the receiver about a member in doubt.
    Reconciling {
        attempt: Pending,
        reconciliation: Reconciliation,
        not_before_ms: u64,
        poll: u64,
        asked: bool,
    },
    /// The run is over.
    Done,
    /// The owner lost the run.
    Failed,
}

/// What follows a durable append.
#[derive(Debug, Clone)]
enum After {
    /// Look at the round's next step.
    Plan,
    /// Send this member (its `reserved` + `dispatched` are durable).
    Send(Box<Dispatch>),
    /// The terminal is written.
    Done,
}

/// A hedged run's state inside the machine: the rounds (what the hedge
/// rules decided so far, `rounds`) and where the layer is in its protocol.
#[derive(Debug, Clone)]
pub(super) struct Layer {
    policy: Arc<CompiledPolicy>,
    /// The attempts of every resolved round.
    attempts: Attempts,
    /// The run of every resolved round.
    run: Run,
    summary: HedgeSummary,
    /// The round in flight.
    round: Option<rounds::Round>,
    /// An admission of the next dispatch (lead or hedge), until it starts.
    admitted: Option<(u64, Admission)>,
    /// The next lead as admitted (moved on by routes a breaker skipped).
    lead: Option<Dispatch>,
    /// When the next lead first asked the admission limits (wall clock).
    queued_since: Option<u64>,
    snapshots: FleetSnapshots,
    /// The generation of every budget snapshot read.
    seen: Generations,
    stage: Stage,
    judgement: Option<Judgement>,
    /// The ordinal of the last attempt observed (its judgement is `judgement`).
    observed: Option<u64>,
    /// A resumed round's members in flight: nobody waits for their result,
    /// the receiver is asked.
    in_doubt: Vec<u64>,
    /// A resumed lead whose `reserved` is written: its `dispatched` alone.
    reserved: bool,
    /// Asks of the receiver per member in doubt.
    max_polls: u64,
    /// The admitted lead's planned start before the admission limits moved
    /// it (the journal reserves the core's plan).
    planned_nb: Option<u64>,
    /// What settling the member just observed needs: its response's
    /// headers and the tokens it used.
    settle: (Vec<(String, String)>, Option<u64>),
}

impl Layer {
    /// The layer of a hedged policy (none for another policy). The journal
    /// and priced usage do not compose with hedging yet: refused here.
    pub(super) fn of(
        cp: &Arc<CompiledPolicy>,
        options: &Options,
        journal: Option<&Writer>,
    ) -> Result<Option<Box<Self>>> {
        if cp.policy.hedge.is_none() {
            return Ok(None);
        }
        if options.price_schedule.is_some() {
            return Err(Error::at(
                ErrorCode::MachineLayerMissing,
                "/price_schedule",
                "a hedged run priced by usage is not yet a layer of the run machine",
            ));
        }
        let mut layer = Self::new(
            Arc::clone(cp),
            options.max_polls.unwrap_or(super::DEFAULT_MAX_POLLS),
        )?;
        let Some(writer) = journal else {
            return Ok(Some(Box::new(layer)));
        };
        let replayed = writer.replayed();
        let (run, attempts) = replayed.clone().into_run();
        // The snapshots the journaled admissions read, sealed with the run.
        layer.snapshots = replayed.snapshots().clone();
        layer.stage = match position(replayed)? {
            Position::Start => Stage::Open,
            Position::Decide => Stage::Decide,
            Position::Plan { reserved } => {
                layer.reserved = reserved;
                Stage::Plan
            }
            Position::Round(round) => {
                layer.in_doubt = round.in_flight().map(|m| m.plan.ordinal).collect();
                layer.resume_from(run, attempts, Some(round));
                return Ok(Some(Box::new(layer)));
            }
            Position::Done => Stage::Done,
        };
        if replayed.next_seq() > 0 {
            layer.resume_from(run, attempts, None);
        }
        Ok(Some(Box::new(layer)))
    }

    pub(super) fn judgement(&self) -> Option<&Judgement> {
        self.judgement.as_ref()
    }

    /// The lead planned next, when the run waits for one (no round in flight).
    pub(super) fn planned(&self) -> Option<Dispatch> {
        match self.next() {
            HedgeStep::Dispatch(d) => Some(d),
            _ => None,
        }
    }

    /// The last attempt observed, as recorded, and its judgement.
    pub(super) fn observed(&self) -> Option<(&Attempt, &Judgement)> {
        let attempt = self.attempt(self.observed?)?;
        Some((attempt, self.judgement.as_ref()?))
    }
}

/// The ordinal an observation answers: the one it names, or the only one
/// in flight.
fn answered(obs: &Observation, in_flight: &[u64]) -> Result<u64> {
    match (obs.ordinal, in_flight) {
        (Some(n), _) if in_flight.contains(&n) => Ok(n),
        (Some(n), _) => Err(Error::at(
            ErrorCode::OrdinalDrift,
            "/ordinal",
            format!("ordinal {n} is not in flight (in flight: {in_flight:?})"),
        )),
        (None, [n]) => Ok(*n),
        (None, _) => Err(Error::at(
            ErrorCode::MissingField,
            "/ordinal",
            "more than one attempt is in flight: the observation names its ordinal",
        )),
    }
}

fn in_flight(step: &HedgeStep) -> Vec<u64> {
    match step {
        HedgeStep::Await { in_flight, .. } => in_flight.clone(),
        HedgeStep::Cancel { ordinals, .. } => ordinals.clone(),
        HedgeStep::Dispatch(_) | HedgeStep::Terminal { .. } => Vec::new(),
    }
}

impl Machine {
    fn layer(&mut self) -> Result<&mut Layer> {
        self.hedge
            .as_deref_mut()
            .ok_or_else(|| Error::new(ErrorCode::InvalidHedge, "the run is not hedged"))
    }

    /// The attempts of a hedged run's resolved rounds.
    pub fn hedge_attempts(&self) -> Option<&Attempts> {
        self.hedge.as_deref().map(Layer::attempts)
    }

    /// Whether the run is hedged (its observations name their ordinal).
    pub fn is_hedged(&self) -> bool {
        self.hedge.is_some()
    }

    /// Answer the outstanding effect of a hedged run: on an error nothing
    /// changed and the same effect is outstanding.
    pub(super) fn hedge_answer(&mut self, event: Event) -> Result<&Effect> {
        let before = (self.hedge.clone(), self.now_ms, self.effect.clone());
        match self.hedge_step(event) {
            Ok(()) => Ok(&self.effect),
            Err(e) => {
                // A refused append loses the run: the machine stays failed.
                if !matches!(self.hedge.as_deref().map(|h| &h.stage), Some(Stage::Failed)) {
                    (self.hedge, self.now_ms, self.effect) = before;
                }
                Err(e)
            }
        }
    }

    fn hedge_step(&mut self, event: Event) -> Result<()> {
        let stage = self.layer()?.stage.clone();
        match (stage, event) {
            (Stage::Reading { reads, conflicts }, Event::Read { now_ms, rows }) => {
                self.clock(now_ms)?;
                self.hedge_admit(reads, conflicts, &rows, false)
            }
            (Stage::Reading { reads, conflicts }, Event::StoreUnavailable { now_ms }) => {
                self.clock(now_ms)?;
                self.hedge_admit(reads, conflicts, &[], true)
            }
            (
                Stage::Writing {
                    conflicts,
                    count,
                    before,
                    ..
                },
                Event::Written { written },
            ) => {
                let Some(conflicts) = self.unwritten(written, count, conflicts)? else {
                    self.layer()?.stage = Stage::Plan;
                    return self.hedge_advance();
                };
                // Read again and decide again from the layer as it was.
                *self.layer()? = *before;
                self.hedge_read(conflicts);
                Ok(())
            }
            (Stage::Sleeping, Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.layer()?.stage = Stage::Plan;
                self.hedge_advance()
            }
            (Stage::Sleeping, Event::Cancelled { at_ms }) => {
                self.clock(at_ms)?;
                self.hedge_cancel(at_ms, 0)
            }
            (
                Stage::Releasing {
                    reads,
                    at_ms,
                    conflicts,
                },
                Event::Read { now_ms, rows },
            ) => {
                self.clock(now_ms)?;
                self.hedge_released(reads, at_ms, conflicts, &rows)
            }
            (Stage::Releasing { at_ms, .. }, Event::StoreUnavailable { now_ms }) => {
                self.clock(now_ms)?;
                self.hedge_cancelled(at_ms)
            }
            (
                Stage::ReleaseWriting {
                    at_ms,
                    conflicts,
                    count,
                },
                Event::Written { written },
            ) => {
                let Some(conflicts) = self.unwritten(written, count, conflicts)? else {
                    return self.hedge_cancelled(at_ms);
                };
                self.hedge_cancel(at_ms, conflicts)
            }
            (
                Stage::Waiting {
                    hedge_at_ms: Some(due),
                },
                Event::Clock { now_ms },
            ) => {
                if now_ms < due {
                    return Err(Error::at(
                        ErrorCode::HedgeBeforeThreshold,
                        "/now_ms",
                        format!("the clock reads {now_ms}: the hedge is due at {due}"),
                    ));
                }
                self.clock(now_ms)?;
                self.layer()?.stage = Stage::Plan;
                self.hedge_advance()
            }
            (Stage::Waiting { .. }, Event::Observed(obs)) => {
                let flying = in_flight(&self.layer()?.next());
                let ordinal = answered(&obs, &flying)?;
                self.hedge_observe(ordinal, &obs)
            }
            (Stage::Cancelling { ordinals }, Event::Observed(obs)) => {
                let ordinal = answered(&obs, &ordinals)?;
                self.hedge_observe(ordinal, &obs)
            }
            (Stage::Cancelling { ordinals }, Event::AttemptCancelled { ordinal, at_ms }) => {
                if !ordinals.contains(&ordinal) {
                    return Err(Error::at(
                        ErrorCode::OrdinalDrift,
                        "/ordinal",
                        format!("ordinal {ordinal} is not a loser in flight ({ordinals:?})"),
                    ));
                }
                self.clock(at_ms)?;
                let layer = self.layer()?;
                layer.cancelled(ordinal, at_ms)?;
                layer.settle = (Vec::new(), None);
                layer.in_doubt.retain(|n| *n != ordinal);
                self.hedge_settle(ordinal, 0)
            }
            (
                Stage::Settling {
                    reads,
                    ordinal,
                    conflicts,
                },
                Event::Read { now_ms, rows },
            ) => {
                self.clock(now_ms)?;
                self.hedge_settled(reads, ordinal, conflicts, &rows)
            }
            (Stage::Settling { ordinal, .. }, Event::StoreUnavailable { now_ms }) => {
                // Nothing to settle against: the snapshots stay as they are.
                self.clock(now_ms)?;
                self.journal_observed(ordinal)
            }
            (
                Stage::SettleWriting {
                    ordinal,
                    conflicts,
                    count,
                    ..
                },
                Event::Written { written },
            ) => {
                let Some(conflicts) = self.unwritten(written, count, conflicts)? else {
                    return self.journal_observed(ordinal);
                };
                self.hedge_settle(ordinal, conflicts)
            }
            (Stage::Appending(after), Event::Appended) => {
                self.layer()?.stage = Stage::Plan;
                match after {
                    After::Plan => self.hedge_advance(),
                    After::Done => {
                        self.layer()?.stage = Stage::Done;
                        self.hedge_advance()
                    }
                    After::Send(d) => self.send(*d),
                }
            }
            (Stage::Appending(_), Event::AppendRefused) => {
                self.layer()?.stage = Stage::Failed;
                Err(Error::at(
                    ErrorCode::JournalStaleLease,
                    "/kind",
                    "the store refused the append: another owner holds the run",
                ))
            }
            (Stage::Reconciling { asked: false, .. }, Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.hedge_advance()
            }
            (
                Stage::Reconciling {
                    attempt,
                    mut reconciliation,
                    asked: true,
                    ..
                },
                Event::Reconciled {
                    answer,
                    at_ms,
                    cost,
                    job_id: _,
                },
            ) => {
                self.clock(at_ms)?;
                reconciliation.answers.push(Answer {
                    job_sha256: None,
                    answer,
                    at_ms,
                    cost: cost.filter(|_| answer != AnswerKind::InProgress),
                });
                self.hedge_reconciled(attempt, reconciliation)
            }
            (_, event) => Err(super::unexpected(&event, &self.effect)),
        }
    }

    /// Send member `d` now (its journal events, if any, are durable).
    fn send(&mut self, d: Dispatch) -> Result<()> {
        let now = self.now_ms;
        let layer = self.layer()?;
        let next = layer.start_attempt(d.ordinal, now)?;
        let hedge_at_ms = due(&next);
        layer.stage = Stage::Waiting { hedge_at_ms };
        self.effect = Effect::Dispatch {
            dispatch: d,
            started_at_ms: now,
            hedge_at_ms,
            key: None,
            stream: None,
        };
        Ok(())
    }

    fn hedge_observe(&mut self, ordinal: u64, obs: &Observation) -> Result<()> {
        if obs.completed_at_ms < self.now_ms {
            return Err(Error::at(
                ErrorCode::ClockBackwards,
                "/completed_at_ms",
                format!(
                    "completed at {} before the run clock's {}",
                    obs.completed_at_ms, self.now_ms
                ),
            ));
        }
        let unsupported = if obs.usage.is_some() {
            Some("/usage")
        } else if !obs.deltas.is_empty() {
            Some("/deltas")
        } else {
            None
        };
        if let Some(at) = unsupported {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                at,
                "a hedged attempt is charged by `cost` (or its reservation) and is not streamed",
            ));
        }
        if obs.model.is_some() {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/model",
                "a hedged attempt does not record its model yet: leave `model` out",
            ));
        }
        let mut facts = obs.facts.clone().unwrap_or_else(Facts::returned);
        if facts.now_unix_ms == 0 {
            facts.now_unix_ms = self.epoch(obs.completed_at_ms);
        }
        let layer = self.layer()?;
        let (judgement, _) = layer.observe(ordinal, obs.completed_at_ms, obs.cost, &facts)?;
        layer.judgement = Some(judgement);
        layer.observed = Some(ordinal);
        layer.stage = Stage::Plan;
        layer.settle = (facts.headers.clone(), obs.used_tokens);
        self.now_ms = obs.completed_at_ms;
        self.hedge_settle(ordinal, 0)
    }

    /// The next effect of a hedged run, through every stage that needs no
    /// answer.
    pub(super) fn hedge_advance(&mut self) -> Result<()> {
        let stage = self.layer()?.stage.clone();
        match stage {
            Stage::Open => {
                let Some((_, run_id)) = &self.journal else {
                    self.layer()?.stage = Stage::Plan;
                    return self.hedge_advance();
                };
                let created = Entry::Created {
                    created_at_epoch_ms: self.origin_epoch_ms,
                    run_id: run_id.clone(),
                };
                self.hedge_append(&[created, Entry::Decided], After::Plan)
            }
            Stage::Decide => self.hedge_append(&[Entry::Decided], After::Plan),
            Stage::Plan => self.hedge_plan(),
            Stage::Reconciling {
                attempt,
                reconciliation,
                not_before_ms,
                poll,
                asked: false,
            } => {
                let wait = self.now_ms < not_before_ms;
                self.effect = if wait {
                    Effect::Sleep {
                        until_ms: not_before_ms,
                    }
                } else {
                    Effect::Reconcile {
                        attempt: attempt.clone(),
                        poll,
                    }
                };
                self.layer()?.stage = Stage::Reconciling {
                    attempt,
                    reconciliation,
                    not_before_ms,
                    poll,
                    asked: !wait,
                };
                Ok(())
            }
            Stage::Done => match self.layer()?.next() {
                HedgeStep::Terminal { terminal } => {
                    self.effect = Effect::Done { terminal };
                    Ok(())
                }
                _ => Err(Error::new(
                    ErrorCode::RunNotTerminal,
                    "the journal ended a run the hedge layer would continue",
                )),
            },
            _ => Ok(()),
        }
    }

    /// The round's next step as an effect.
    fn hedge_plan(&mut self) -> Result<()> {
        let fleet = self.policy.policy.fleet.is_some();
        let journaled = self.journal.is_some();
        let now = self.now_ms;
        let layer = self.layer()?;
        let step = layer.next();
        // The dispatch on offer, when it is time to send it.
        let send = match &step {
            HedgeStep::Dispatch(d) if now >= d.not_before_ms => Some(d.clone()),
            HedgeStep::Await { hedge: Some(h), .. } if now >= h.not_before_ms => Some(h.clone()),
            _ => None,
        };
        let admitted = layer.admitted.as_ref().map(|(n, _)| *n);
        let unadmitted = |o: u64| fleet && admitted != Some(o);
        if let HedgeStep::Dispatch(d) = &step {
            // A lead is admitted before its wait, as in a plain run.
            if unadmitted(d.ordinal) {
                self.hedge_read(0);
                return Ok(());
            }
        }
        if let Some(d) = &send {
            if unadmitted(d.ordinal) {
                self.hedge_read(0);
                return Ok(());
            }
        }
        // A resumed round: its members in flight are asked about, never
        // waited for.
        let doubt = match &step {
            HedgeStep::Await { in_flight, .. } => in_flight
                .iter()
                .find(|n| layer.in_doubt.contains(n))
                .copied(),
            _ => None,
        };
        if doubt.is_some() {
            return self.hedge_reconcile();
        }
        let effect = match (step, send) {
            (step, Some(d)) if journaled => {
                let admission = layer.admitted_for(d.ordinal).cloned();
                let dispatched = Entry::Dispatched {
                    snapshots: admission.as_ref().and_then(|a| layer.snapshots.named_by(a)),
                    admission,
                    started_at_ms: now,
                };
                // A lead is reserved as the core planned it (moved by any
                // skipped route); a later start the limits gave is its
                // dispatch's.
                let mut planned = d.clone();
                if let (HedgeStep::Dispatch(_), Some(nb)) = (&step, layer.planned_nb.take()) {
                    planned.not_before_ms = nb;
                }
                let entries = if std::mem::take(&mut layer.reserved) {
                    vec![dispatched]
                } else {
                    vec![
                        Entry::Reserved {
                            dispatch: Some(planned),
                            cancelled_at_ms: None,
                        },
                        dispatched,
                    ]
                };
                return self.hedge_append(&entries, After::Send(Box::new(d)));
            }
            (_, Some(d)) => return self.send(d),
            (HedgeStep::Terminal { .. }, None) if journaled => {
                let attempts = layer.attempts();
                let entry = Entry::Terminal {
                    cancelled_at_ms: attempts.cancelled_at_ms,
                    snapshots: attempts
                        .fleet_stop
                        .as_ref()
                        .and_then(|s| layer.snapshots.named_by_stop(s)),
                    fleet_stop: attempts.fleet_stop.clone(),
                };
                return self.hedge_append(&[entry], After::Done);
            }
            (HedgeStep::Terminal { terminal }, None) => {
                layer.stage = Stage::Done;
                Effect::Done { terminal }
            }
            (
                HedgeStep::Cancel {
                    decided_by,
                    ordinals,
                },
                None,
            ) => {
                layer.stage = Stage::Cancelling {
                    ordinals: ordinals.clone(),
                };
                Effect::CancelAttempts {
                    decided_by,
                    ordinals,
                }
            }
            (HedgeStep::Dispatch(d), None) => {
                layer.stage = Stage::Sleeping;
                Effect::Sleep {
                    until_ms: d.not_before_ms,
                }
            }
            (HedgeStep::Await { hedge, in_flight }, None) => {
                let hedge_at_ms = hedge.map(|h| h.not_before_ms);
                layer.stage = Stage::Waiting { hedge_at_ms };
                Effect::Await {
                    in_flight,
                    hedge_at_ms,
                }
            }
        };
        self.effect = effect;
        Ok(())
    }
}

/// When the next hedge is due, after `step`.
fn due(step: &HedgeStep) -> Option<u64> {
    match step {
        HedgeStep::Await { hedge: Some(h), .. } => Some(h.not_before_ms),
        _ => None,
    }
}
