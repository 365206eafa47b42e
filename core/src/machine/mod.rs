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

mod advance;
#[cfg(feature = "lab")]
pub mod arbitrary;
mod codec;
pub mod fleet;
mod hedge;
mod job;
mod keypool;
mod protocol;
pub mod replay;
#[cfg(feature = "lab")]
pub mod script;
mod step;
mod store;
mod stream;

use std::sync::Arc;

use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Terminal;
use crate::ids::Identifier;
use crate::journal::{
    JournalEvent, Pending, Reconciliation, ReconciliationSchema, Recovery, Writer,
};
use crate::observe::Judgement;
use crate::policy::CompiledPolicy;
use crate::price::PriceSchedule;
use crate::receipt::Bundle;
use crate::session::Session;

pub use fleet::{Cas, Register, Row};
#[cfg(feature = "lab")]
pub use hedge::script as hedge_script;
pub use hedge::{HedgeAdmitted, HedgeObserved, HedgeSession, HedgeStep};
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
    /// The HTTP status the attempt answered with (a key pool's record).
    status: Option<u64>,
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
    /// The key pool layer: the key of each pooled route's attempt.
    pools: keypool::Layer,
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
            pools: keypool::Layer::new(options.key_affinity.clone()),
        };
        m.advance()?;
        Ok(m)
    }

    /// The outstanding effect.
    pub fn next(&self) -> &Effect {
        &self.effect
    }

    /// The session the machine drives (attempts, decisions, snapshots
    /// read); a hedged run's attempts are [`Machine::hedge_attempts`].
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The attempt the machine plans next (a wait before it, its admission
    /// or its send is what comes), or `None` when none is: the run is over,
    /// or a hedged round is in flight.
    pub fn planned_dispatch(&self) -> Option<crate::evaluate::Dispatch> {
        if let Some(h) = &self.hedge {
            return h.planned();
        }
        match self.session.next() {
            crate::evaluate::Decision::Dispatch(d) => Some(d.clone()),
            crate::evaluate::Decision::Terminal { .. } => None,
        }
    }

    /// The last attempt observed, as recorded, and how it was judged (a
    /// hedged run's too, before its round is resolved).
    pub fn observed(&self) -> Option<(&crate::attempt::Attempt, &Judgement)> {
        if let Some(h) = &self.hedge {
            return h.observed();
        }
        let attempt = self.session.attempts().attempts.last()?;
        Some((attempt, self.judgement.as_ref()?))
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
