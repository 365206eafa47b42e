//! The run machine: one sans-I/O state machine for a whole run, effects out
//! and events in.
//!
//! A host asks [`Machine::next`] for the effect to carry out and answers it
//! with one [`Event`]; it never decides what comes next. The effects:
//!
//! - [`Effect::Append`]: make these journal events durable, in one write
//!   (all or none), before going on. Events always written together come in
//!   one append: `created` + `decided`, `reserved` + `dispatched` before the
//!   call, `observed` + `decided` after it.
//! - [`Effect::Read`]: read these registers of the fleet store.
//! - [`Effect::Write`]: compare-and-set these documents, in order, stopping
//!   at the first that fails.
//! - [`Effect::Sleep`]: wait until the run clock reaches `until_ms`.
//! - [`Effect::Dispatch`]: send the attempt, then say what was observed.
//!   A hedged run may send another before the first is answered: each
//!   observation names its attempt, [`Effect::Await`] waits for one of
//!   those in flight and [`Effect::CancelAttempts`] cancels a decided
//!   round's losers (the hedge layer, `hedge`).
//! - [`Effect::Poll`], [`Effect::Cancel`]: poll the accepted async job, or
//!   cancel the one a run would leave running (`job`).
//! - [`Effect::Reconcile`]: ask the receiver what became of an attempt in
//!   doubt, by its idempotency key.
//! - [`Effect::Done`]: the run is over; [`Machine::seal`] gives its bundle.
//!
//! Sections are layers of this one loop: without a fleet section nothing is
//! read or written; without a journal nothing is appended; a stream contract
//! changes what an observation carries. The decisions are the
//! [`crate::Session`]'s, so a run driven through the machine reaches the
//! receipt the plain drivers reach on the same outcomes, and a journaled
//! run's events are the ones [`crate::journal::verify`] accepts.
//!
//! Every answer is checked before anything changes: an event that does not
//! answer the outstanding effect is `unexpected_event`, a clock reading
//! earlier than one before it is `clock_backwards`, and a refusal of the
//! core (drift, a snapshot of another key, a journal the replay refuses)
//! keeps its own code. After an error the machine is as it was, and the
//! same effect is still outstanding — except a refused append, after which
//! the owner has lost its run (`journal_stale_lease`) and the machine stays
//! failed.

#[cfg(feature = "lab")]
pub mod arbitrary;
mod codec;
pub mod fleet;
mod hedge;
mod job;
mod protocol;
pub mod replay;
#[cfg(feature = "lab")]
pub mod script;
mod store;
mod stream;

use std::sync::Arc;

use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Terminal};
use crate::ids::Identifier;
use crate::journal::{
    Answer, AnswerKind, Entry, JournalEvent, Pending, Reconciliation, ReconciliationSchema,
    Recovery, Writer,
};
use crate::observe::{Facts, Judgement};
use crate::policy::CompiledPolicy;
use crate::price::PriceSchedule;
use crate::receipt::Bundle;
use crate::session::Session;

pub use fleet::{Cas, Register, Row};
pub use protocol::{
    Effect, Event, JournalOptions, Observation, Options, DEFAULT_MAX_CONFLICTS, DEFAULT_MAX_POLLS,
};

/// What follows a write or an append once it is durable.
#[derive(Debug, Clone)]
enum Then {
    /// Look at the session's next decision.
    Plan,
    /// The attempt is admitted: wait for its time, reserve it, send it.
    Ready,
    /// The reserved attempt is journaled: send it.
    Send,
    /// The attempt is settled in the fleet store: journal it.
    Log,
    /// The cancelled run's held slot is freed: cancel it.
    Cancel(u64),
    /// An adopted attempt is journaled: continue the session from the journal.
    Resync,
    /// The terminal is written.
    Done,
}

/// Why a read was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadFor {
    Admission,
    Settlement,
    Release(u64),
}

/// Where the machine is; the waiting stages hold what the answer needs.
#[derive(Debug, Clone)]
enum Stage {
    /// A journal to open: `created` + `decided`.
    Open,
    /// A resumed journal whose next event is `decided`.
    Decide,
    /// Look at the session's next decision.
    Plan,
    /// Admitted (or without a fleet): sleep, journal, dispatch.
    Ready,
    /// Send the attempt.
    Send,
    /// Journal the observed attempt.
    Log,
    /// Waiting for an append.
    Appending(Then),
    /// Waiting for a read.
    Reading {
        reads: fleet::Reads,
        why: ReadFor,
        conflicts: u64,
    },
    /// Waiting for writes.
    Writing {
        reads: fleet::Reads,
        why: ReadFor,
        conflicts: u64,
        count: u64,
        then: Then,
    },
    /// Waiting for a clock reading.
    Sleeping(Then),
    /// Waiting for an observation.
    InFlight { started_at_ms: u64 },
    /// Asking the receiver.
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

/// What settling an attempt in the fleet store needs from its observation.
#[derive(Debug, Clone, Default)]
struct Settle {
    headers: Vec<(String, String)>,
    used_tokens: Option<u64>,
    /// A streamed attempt's delta digests, journaled with it.
    deltas: Vec<crate::ids::Sha256Hex>,
}

/// A run in progress: the one loop every host drives.
#[derive(Debug, Clone)]
pub struct Machine {
    policy: Arc<CompiledPolicy>,
    schedule: Option<Arc<PriceSchedule>>,
    session: Session,
    journal: Option<(Writer, Identifier)>,
    origin_epoch_ms: u64,
    now_ms: u64,
    reserve_tokens: Option<u64>,
    max_conflicts: u64,
    /// A resumed run whose `reserved` event is written: the next append is
    /// `dispatched` alone.
    reserved: bool,
    /// The planned attempt's earliest start before its admission (the
    /// admission limits may start it later; the journal reserves the plan).
    planned_not_before_ms: Option<u64>,
    /// The fleet store's registers this run reads, built once.
    keys: fleet::Keys,
    stage: Stage,
    effect: Effect,
    /// Shared so that keeping it for a refused answer costs no copy.
    settle: Arc<Settle>,
    judgement: Option<Judgement>,
    /// A hedged run: the layer that keeps more than one attempt in flight.
    hedge: Option<Box<hedge::Layer>>,
}

fn unexpected(event: &Event, effect: &Effect) -> Error {
    let asked = match effect {
        Effect::Append { .. } => "append",
        Effect::Read { .. } => "read",
        Effect::Write { .. } => "write",
        Effect::Sleep { .. } => "sleep",
        Effect::Dispatch { .. } => "dispatch",
        Effect::Poll { .. } => "poll",
        Effect::Cancel { .. } => "cancel",
        Effect::Await { .. } => "await",
        Effect::CancelAttempts { .. } => "cancel_attempts",
        Effect::Reconcile { .. } => "reconcile",
        Effect::Done { .. } => "done",
    };
    Error::at(
        ErrorCode::UnexpectedEvent,
        "/kind",
        format!(
            "`{}` does not answer the outstanding `{asked}` effect",
            event.name()
        ),
    )
}

impl Machine {
    /// Start a run of `policy`: nothing dispatched yet.
    pub fn start(policy: Arc<CompiledPolicy>, options: Options) -> Result<Self> {
        check_layers(&policy)?;
        let mut session = Session::start(Arc::clone(&policy));
        if let Some(s) = &options.price_schedule {
            session.set_price_schedule(Arc::clone(s))?;
        }
        let journal = match &options.journal {
            Some(j) => Some((
                Writer::new(Arc::clone(&policy), &[], j.lease_generation)?,
                j.run_id.clone(),
            )),
            None => None,
        };
        let stage = if journal.is_some() {
            Stage::Open
        } else {
            Stage::Plan
        };
        Self::with(policy, session, journal, &options, (stage, false))
    }

    /// Take over the run a journal holds (its events verified once) as the
    /// owner of `options.journal`'s lease generation: the machine goes on
    /// where the journal stops. An empty journal (a lease claimed, nothing
    /// written, nothing sent) starts the run; an attempt dispatched without
    /// an observation is reconciled with the receiver first.
    pub fn resume(
        policy: Arc<CompiledPolicy>,
        events: &[JournalEvent],
        options: Options,
    ) -> Result<Self> {
        check_layers(&policy)?;
        let Some(j) = &options.journal else {
            return Err(Error::at(
                ErrorCode::MissingField,
                "/journal",
                "a resumed run names its run id and the lease generation it appends under",
            ));
        };
        let writer = Writer::new(Arc::clone(&policy), events, j.lease_generation)?;
        let mut session = Session::start(Arc::clone(&policy));
        if let Some(s) = &options.price_schedule {
            session.set_price_schedule(Arc::clone(s))?;
        }
        session.resume_admitting(writer.replayed().clone())?;
        let max_polls = options.max_polls.unwrap_or(DEFAULT_MAX_POLLS);
        let mut reserved = false;
        let stage = match writer.recover(None)? {
            Recovery::Done { .. } => Stage::Done,
            Recovery::Resume { next, .. } => match next {
                crate::journal::EventKind::Created => Stage::Open,
                crate::journal::EventKind::Decided => Stage::Decide,
                crate::journal::EventKind::Dispatched => {
                    reserved = true;
                    Stage::Plan
                }
                _ => Stage::Plan,
            },
            Recovery::Reconcile {
                attempt,
                not_before_ms,
                poll,
                ..
            } => Stage::Reconciling {
                reconciliation: Reconciliation {
                    answers: Vec::new(),
                    max_polls,
                    ordinal: attempt.ordinal,
                    schema: ReconciliationSchema,
                },
                attempt,
                not_before_ms,
                poll,
                asked: false,
            },
            Recovery::Adopt { .. } => Stage::Plan,
        };
        // `reserved` is known before the first effect is computed: a journal
        // that ends at `reserved` goes on with `dispatched` alone.
        Self::with(
            policy,
            session,
            Some((writer, j.run_id.clone())),
            &options,
            (stage, reserved),
        )
    }

    fn with(
        policy: Arc<CompiledPolicy>,
        session: Session,
        journal: Option<(Writer, Identifier)>,
        options: &Options,
        (stage, reserved): (Stage, bool),
    ) -> Result<Self> {
        let max_polls = options.max_polls.unwrap_or(DEFAULT_MAX_POLLS);
        if max_polls == 0 || max_polls > crate::journal::MAX_POLLS {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/max_polls",
                format!("max_polls must be in 1..={}", crate::journal::MAX_POLLS),
            ));
        }
        let hedge = hedge::Layer::of(&policy, options, journal.as_ref().map(|(w, _)| w))?;
        let mut m = Self {
            keys: fleet::Keys::of(&policy),
            hedge,
            policy,
            schedule: options.price_schedule.clone(),
            session,
            journal,
            origin_epoch_ms: options.origin_epoch_ms,
            now_ms: options.now_ms,
            reserve_tokens: options.reserve_tokens,
            max_conflicts: options.max_conflicts.unwrap_or(DEFAULT_MAX_CONFLICTS),
            reserved,
            planned_not_before_ms: None,
            stage,
            effect: Effect::Done {
                terminal: Terminal::StopRouteExhausted,
            },
            settle: Arc::default(),
            judgement: None,
        };
        m.advance()?;
        Ok(m)
    }

    /// The outstanding effect.
    pub fn next(&self) -> &Effect {
        &self.effect
    }

    /// The session the machine drives (attempts, decisions, snapshots
    /// read); a hedged run's is [`Machine::hedge_session`].
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// How the last observation was judged (its rule, and for a stream what
    /// the host does with the consumer's events).
    pub fn judgement(&self) -> Option<&Judgement> {
        if let Some(h) = &self.hedge {
            return h.judgement();
        }
        self.judgement.as_ref()
    }

    /// The run clock as last read, ms.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The bundle of the finished run.
    pub fn seal(&self) -> Result<Bundle> {
        if let Some(h) = &self.hedge {
            return h.seal();
        }
        self.session.seal()
    }

    /// Answer the outstanding effect. On an error nothing changed and the
    /// same effect is outstanding (but after a refused append).
    pub fn answer(&mut self, event: Event) -> Result<&Effect> {
        if self.hedge.is_some() {
            return self.hedge_answer(event);
        }
        let before = (self.stage.clone(), self.now_ms, self.settle.clone());
        match self.step(event) {
            Ok(()) => Ok(&self.effect),
            Err(e) => {
                if !matches!(self.stage, Stage::Failed) {
                    (self.stage, self.now_ms, self.settle) = before;
                }
                Err(e)
            }
        }
    }

    fn clock(&mut self, now_ms: u64) -> Result<()> {
        if now_ms < self.now_ms {
            return Err(Error::at(
                ErrorCode::ClockBackwards,
                "/now_ms",
                format!(
                    "the run clock read {now_ms} after {}: a run clock never goes back",
                    self.now_ms
                ),
            ));
        }
        self.now_ms = now_ms;
        Ok(())
    }

    fn epoch(&self, at_ms: u64) -> u64 {
        self.origin_epoch_ms.saturating_add(at_ms)
    }

    fn step(&mut self, event: Event) -> Result<()> {
        let stage = self.stage.clone();
        match (stage, event) {
            (Stage::Appending(then), Event::Appended) => self.then(then),
            (Stage::Appending(_), Event::AppendRefused) => {
                self.stage = Stage::Failed;
                Err(Error::at(
                    ErrorCode::JournalStaleLease,
                    "/kind",
                    "the store refused the append: another owner holds the run",
                ))
            }
            (
                Stage::Reading {
                    reads,
                    why,
                    conflicts,
                },
                Event::Read { now_ms, rows },
            ) => {
                self.clock(now_ms)?;
                self.on_read(reads, why, conflicts, &rows, false)
            }
            (
                Stage::Reading {
                    reads,
                    why,
                    conflicts,
                },
                Event::StoreUnavailable { now_ms },
            ) => {
                self.clock(now_ms)?;
                self.on_read(reads, why, conflicts, &[], true)
            }
            (
                Stage::Writing {
                    reads,
                    why,
                    conflicts,
                    count,
                    then,
                },
                Event::Written { written },
            ) => {
                if written > count {
                    return Err(Error::at(
                        ErrorCode::InvalidValue,
                        "/written",
                        format!("{written} writes reported of {count} asked"),
                    ));
                }
                if written == count {
                    return self.then(then);
                }
                let conflicts = conflicts.saturating_add(1);
                if conflicts > self.max_conflicts {
                    return Err(Error::at(
                        ErrorCode::StoreConflict,
                        "/written",
                        format!("the store write conflicted {conflicts} times in a row"),
                    ));
                }
                // Read again and decide again under the fresh state.
                let reads = match why {
                    ReadFor::Admission => self.admission_reads(),
                    ReadFor::Settlement | ReadFor::Release(_) => reads,
                };
                self.read(reads, why, conflicts);
                Ok(())
            }
            (Stage::Reconciling { asked: false, .. }, Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.advance()
            }
            (Stage::Sleeping(then), Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.then(then)
            }
            (
                Stage::Sleeping(Then::Plan | Then::Ready)
                | Stage::Reading {
                    why: ReadFor::Admission,
                    ..
                },
                Event::Cancelled { at_ms },
            ) => {
                self.clock(at_ms)?;
                self.cancel(at_ms)
            }
            (Stage::InFlight { started_at_ms }, Event::Observed(obs)) => {
                self.observe(started_at_ms, *obs)
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
                    job_id,
                },
            ) => {
                self.clock(at_ms)?;
                reconciliation.answers.push(Answer {
                    answer,
                    at_ms,
                    cost: cost.filter(|_| answer != AnswerKind::InProgress),
                    job_sha256: job_id.as_deref().map(crate::job::job_id_digest),
                });
                self.reconciled(attempt, reconciliation)
            }
            (_, event) => Err(unexpected(&event, &self.effect)),
        }
    }

    /// Go on to `then`.
    fn then(&mut self, then: Then) -> Result<()> {
        self.stage = match then {
            Then::Plan => Stage::Plan,
            Then::Ready => Stage::Ready,
            Then::Send => Stage::Send,
            Then::Log => Stage::Log,
            Then::Done => Stage::Done,
            Then::Cancel(at) => {
                self.session.cancel(at)?;
                Stage::Plan
            }
            Then::Resync => {
                let Some((writer, _)) = &self.journal else {
                    return Err(Error::new(
                        ErrorCode::JournalOutOfOrder,
                        "an adopted attempt without a journal",
                    ));
                };
                let mut session = Session::start(Arc::clone(&self.policy));
                if let Some(s) = &self.schedule {
                    session.set_price_schedule(Arc::clone(s))?;
                }
                session.resume_admitting(writer.replayed().clone())?;
                self.session = session;
                Stage::Plan
            }
        };
        self.advance()
    }

    fn admission_reads(&self) -> fleet::Reads {
        self.keys.admission()
    }

    fn read(&mut self, reads: fleet::Reads, why: ReadFor, conflicts: u64) {
        self.effect = Effect::Read { keys: reads.keys() };
        self.stage = Stage::Reading {
            reads,
            why,
            conflicts,
        };
    }

    fn write(
        &mut self,
        reads: fleet::Reads,
        why: ReadFor,
        conflicts: u64,
        writes: Vec<Cas>,
        then: Then,
    ) -> Result<()> {
        if writes.is_empty() {
            return self.then(then);
        }
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        self.effect = Effect::Write { writes };
        self.stage = Stage::Writing {
            reads,
            why,
            conflicts,
            count,
            then,
        };
        Ok(())
    }

    fn append(&mut self, entries: &[Entry], then: Then) -> Result<()> {
        let Some((writer, _)) = self.journal.as_mut() else {
            return self.then(then);
        };
        // Every event of the write or none.
        let events = writer.append_all(entries)?;
        self.effect = Effect::Append { events };
        self.stage = Stage::Appending(then);
        Ok(())
    }

    /// The planned dispatch, or an error when the run has ended.
    fn planned(&self) -> Result<Dispatch> {
        match self.session.next() {
            Decision::Dispatch(d) => Ok(d.clone()),
            Decision::Terminal { terminal } => Err(Error::new(
                ErrorCode::AttemptAfterTerminal,
                format!("the run has ended with {}", terminal.as_str()),
            )),
        }
    }

    /// Compute the next effect from the stage, through every stage that
    /// needs no answer.
    fn advance(&mut self) -> Result<()> {
        if self.hedge.is_some() {
            return self.hedge_advance();
        }
        loop {
            match self.stage.clone() {
                Stage::Open => {
                    let Some((_, run_id)) = &self.journal else {
                        self.stage = Stage::Plan;
                        continue;
                    };
                    let created = Entry::Created {
                        created_at_epoch_ms: self.origin_epoch_ms,
                        run_id: run_id.clone(),
                    };
                    return self.append(&[created, Entry::Decided], Then::Plan);
                }
                Stage::Decide => return self.append(&[Entry::Decided], Then::Plan),
                Stage::Plan => {
                    let decision = self.session.next().clone();
                    match decision {
                        Decision::Terminal { .. } => {
                            let attempts = self.session.attempts();
                            let entry = Entry::Terminal {
                                cancelled_at_ms: attempts.cancelled_at_ms,
                                fleet_stop: attempts.fleet_stop.clone(),
                            };
                            if self.journal.is_some() {
                                return self.append(&[entry], Then::Done);
                            }
                            self.stage = Stage::Done;
                        }
                        Decision::Dispatch(d) => {
                            let fleet = self.session.policy().policy.fleet.is_some();
                            let admits = crate::job::admitted_step(&d);
                            if fleet && admits && self.session.admission().is_none() {
                                self.planned_not_before_ms = Some(d.not_before_ms);
                                let reads = self.admission_reads();
                                self.read(reads, ReadFor::Admission, 0);
                                return Ok(());
                            }
                            self.stage = Stage::Ready;
                        }
                    }
                }
                Stage::Ready => {
                    let d = self.planned()?;
                    if self.now_ms < d.not_before_ms {
                        self.effect = Effect::Sleep {
                            until_ms: d.not_before_ms,
                        };
                        self.stage = Stage::Sleeping(Then::Ready);
                        return Ok(());
                    }
                    if self.journal.is_none() {
                        self.stage = Stage::Send;
                        continue;
                    }
                    let dispatched = Entry::Dispatched {
                        admission: self.session.admission().cloned(),
                        started_at_ms: self.now_ms,
                    };
                    if self.reserved {
                        self.reserved = false;
                        return self.append(&[dispatched], Then::Send);
                    }
                    // The plan as the core made it (moved by any skipped
                    // route); a later start the limits gave is the dispatch's.
                    let mut planned = d;
                    if let Some(nb) = self.planned_not_before_ms.take() {
                        planned.not_before_ms = nb;
                    }
                    let reserved = Entry::Reserved {
                        cancelled_at_ms: job::cancelled_first(&self.session, &planned),
                        dispatch: Some(planned),
                    };
                    return self.append(&[reserved, dispatched], Then::Send);
                }
                Stage::Send => {
                    let dispatch = self.planned()?;
                    self.effect = job::effect(dispatch, self.now_ms);
                    self.stage = Stage::InFlight {
                        started_at_ms: self.now_ms,
                    };
                    return Ok(());
                }
                Stage::Log => {
                    let last: Option<Attempt> = self.session.attempts().attempts.last().cloned();
                    match last {
                        Some(attempt) if self.journal.is_some() => {
                            let observed = Entry::Observed {
                                attempt,
                                delta_digests: self.settle.deltas.clone(),
                            };
                            return self.append(&[observed, Entry::Decided], Then::Plan);
                        }
                        _ => self.stage = Stage::Plan,
                    }
                }
                Stage::Reconciling {
                    attempt,
                    not_before_ms,
                    poll,
                    asked: false,
                    reconciliation,
                } => {
                    if self.now_ms < not_before_ms {
                        self.effect = Effect::Sleep {
                            until_ms: not_before_ms,
                        };
                        // Asked once the sleep is over.
                        self.stage = Stage::Reconciling {
                            attempt,
                            not_before_ms,
                            poll,
                            asked: false,
                            reconciliation,
                        };
                        return Ok(());
                    }
                    if let Some(answer) = job::settled_in_doubt(&self.session, self.now_ms) {
                        let mut reconciliation = reconciliation;
                        reconciliation.answers.push(answer);
                        return self.reconciled(attempt, reconciliation);
                    }
                    self.effect = Effect::Reconcile {
                        attempt: attempt.clone(),
                        poll,
                    };
                    self.stage = Stage::Reconciling {
                        attempt,
                        not_before_ms,
                        poll,
                        asked: true,
                        reconciliation,
                    };
                    return Ok(());
                }
                Stage::Done => {
                    let terminal = match self.session.next() {
                        Decision::Terminal { terminal } => *terminal,
                        Decision::Dispatch(_) => {
                            return Err(Error::new(
                                ErrorCode::RunNotTerminal,
                                "the journal ended a run the session would continue",
                            ))
                        }
                    };
                    self.effect = Effect::Done { terminal };
                    return Ok(());
                }
                Stage::Appending(_)
                | Stage::Reading { .. }
                | Stage::Writing { .. }
                | Stage::Sleeping(_)
                | Stage::InFlight { .. }
                | Stage::Reconciling { asked: true, .. }
                | Stage::Failed => return Ok(()),
            }
        }
    }

    fn observe(&mut self, started_at_ms: u64, obs: Observation) -> Result<()> {
        if obs.completed_at_ms < self.now_ms {
            return Err(Error::at(
                ErrorCode::ClockBackwards,
                "/completed_at_ms",
                format!(
                    "completed at {} before the dispatch at {}",
                    obs.completed_at_ms, self.now_ms
                ),
            ));
        }
        let mut facts = obs.facts.clone().unwrap_or_else(Facts::returned);
        if facts.now_unix_ms == 0 {
            facts.now_unix_ms = self.epoch(obs.completed_at_ms);
        }
        job::note(&mut self.session, &obs, &mut facts)?;
        // A refused observation leaves the session as it was: the usage and
        // body reported for it are dropped with it.
        let observed = self.observe_in_session(started_at_ms, &obs, &facts);
        if observed.is_err() {
            self.session.clear_notes();
        }
        let judgement = observed?;
        self.judgement = Some(judgement);
        self.now_ms = obs.completed_at_ms;
        self.settle = Arc::new(Settle {
            headers: facts.headers,
            used_tokens: obs.used_tokens,
            deltas: stream::digests(&self.policy, &obs),
        });
        let release = self
            .session
            .attempts()
            .attempts
            .last()
            .filter(|a| a.admission.is_some())
            .map(|a| a.route_release_sha256.clone());
        // An attempt the fleet did not admit (a job's poll or cancel) is not settled.
        if let Some(release) = release {
            let reads = self.keys.settlement(&release, false);
            if !reads.is_empty() {
                self.read(reads, ReadFor::Settlement, 0);
                return Ok(());
            }
        }
        self.stage = Stage::Log;
        self.advance()
    }

    fn observe_in_session(
        &mut self,
        started_at_ms: u64,
        obs: &Observation,
        facts: &Facts,
    ) -> Result<Judgement> {
        if let Some(u) = &obs.usage {
            self.session.add_usage(u)?;
        }
        if let Some(b) = &obs.request_body_sha256 {
            self.session.set_request_body_sha256(b.clone());
        }
        self.session.observe_stream(
            started_at_ms,
            obs.completed_at_ms,
            obs.cost,
            facts,
            &obs.deltas,
        )
    }

    fn reconciled(&mut self, attempt: Pending, reconciliation: Reconciliation) -> Result<()> {
        let Some((writer, _)) = &self.journal else {
            return Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "a reconciliation without a journal",
            ));
        };
        match writer.recover(Some(&reconciliation))? {
            Recovery::Reconcile {
                not_before_ms,
                poll,
                ..
            } => {
                self.stage = Stage::Reconciling {
                    attempt,
                    reconciliation,
                    not_before_ms,
                    poll,
                    asked: false,
                };
                self.advance()
            }
            Recovery::Adopt { attempt, .. } => {
                let observed = Entry::Observed {
                    attempt,
                    delta_digests: Vec::new(),
                };
                self.append(&[observed, Entry::Decided], Then::Resync)
            }
            Recovery::Resume { .. } | Recovery::Done { .. } => {
                self.stage = Stage::Plan;
                self.advance()
            }
        }
    }
}

/// The sections the machine layers today; the others keep their own
/// drivers until they are layers of it.
fn check_layers(cp: &CompiledPolicy) -> Result<()> {
    let p = &cp.policy;
    let refused = if p.hedge.is_some() && p.async_job.is_some() {
        Some(("/hedge", "a hedged async job"))
    } else {
        None
    };
    match refused {
        Some((at, what)) => Err(Error::at(
            ErrorCode::MachineLayerMissing,
            at,
            format!("{what} is not yet a layer of the run machine: drive it with its own driver"),
        )),
        None => Ok(()),
    }
}

/// A receipt's terminal as the machine's `done` effect names it.
impl Effect {
    /// Whether the run is over.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done { .. })
    }
}
