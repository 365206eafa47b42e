//! The machine's protocol: the effects it asks of a host, the events a
//! host answers with, and the options of a start or a resume.

use std::sync::Arc;

use crate::evaluate::{Dispatch, Terminal};
use crate::ids::{Identifier, Sha256Hex};
use crate::job::JobStatus;
use crate::journal::{AnswerKind, JournalEvent, Pending};
use crate::keypool::KeyChoice;
use crate::observe::Facts;
use crate::price::{PriceSchedule, Units};

use super::fleet::{Cas, Row};

/// Compare-and-set conflicts met in a row before a store write is given up
/// (`store_conflict`), when the options do not say.
pub const DEFAULT_MAX_CONFLICTS: u64 = 4;
/// Times the receiver is asked about an attempt in doubt, when the options
/// do not say.
pub const DEFAULT_MAX_POLLS: u64 = 5;

/// What the host does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Make these events durable in one write, then answer
    /// [`Event::Appended`] (or [`Event::AppendRefused`] when the store
    /// refused it: the lease moved on or the `seq` is taken).
    Append {
        /// The events, in `seq` order.
        events: Vec<JournalEvent>,
    },
    /// Read these registers and answer [`Event::Read`] with one row per key
    /// in order (or [`Event::StoreUnavailable`]).
    Read {
        /// The keys.
        keys: Vec<String>,
    },
    /// Compare-and-set these documents in order, stopping at the first
    /// refused, and answer [`Event::Written`] with how many were written.
    Write {
        /// The writes.
        writes: Vec<Cas>,
    },
    /// Wait until the run clock reaches `until_ms`, then answer
    /// [`Event::Clock`] (or [`Event::Cancelled`]).
    Sleep {
        /// The run clock to wait for, ms.
        until_ms: u64,
    },
    /// Send the attempt now and answer [`Event::Observed`]. In a hedged
    /// run the attempt stays in flight with the others: the answer is the
    /// observation of any attempt in flight (naming its `ordinal`), or,
    /// when `hedge_at_ms` is set and nothing answered before it, an
    /// [`Event::Clock`] reading at `hedge_at_ms` (a hedge is due).
    Dispatch {
        /// The attempt to send.
        dispatch: Dispatch,
        /// Its start on the run clock.
        started_at_ms: u64,
        /// A hedged run: when the next hedge is due unless a result
        /// arrives first.
        hedge_at_ms: Option<u64>,
        /// A route with a key pool: the key to send it with, by digest
        /// (the host holds the secret).
        key: Option<KeyChoice>,
        /// A stream contract: how the host reads and delivers the stream.
        stream: Option<super::stream::Plan>,
    },
    /// A hedged run: wait for the observation of any attempt in flight
    /// ([`Event::Observed`] naming its `ordinal`), or, when `hedge_at_ms`
    /// is set, an [`Event::Clock`] reading at `hedge_at_ms`.
    Await {
        /// The ordinals in flight.
        in_flight: Vec<u64>,
        /// When the next hedge is due unless a result arrives first.
        hedge_at_ms: Option<u64>,
    },
    /// A hedged round is decided: cancel these attempts, answering
    /// [`Event::AttemptCancelled`] for one of them (or its
    /// [`Event::Observed`] when its result arrived first: a late loser,
    /// kept and never adopted). Asked again until none is left.
    CancelAttempts {
        /// The ordinal whose result decided the round.
        decided_by: u64,
        /// The ordinals still in flight.
        ordinals: Vec<u64>,
    },
    /// Poll the accepted async job (the dispatch's `job` step names it and
    /// the poll's number) now, and answer [`Event::Observed`] with the
    /// job's status.
    Poll {
        /// The poll, as planned.
        dispatch: Dispatch,
        /// Its start on the run clock.
        started_at_ms: u64,
    },
    /// Cancel the accepted async job at the provider now (the run would
    /// leave it running: `cancel_left_running`), and answer
    /// [`Event::Observed`].
    Cancel {
        /// The cancel, as planned.
        dispatch: Dispatch,
        /// Its start on the run clock.
        started_at_ms: u64,
    },
    /// Ask the receiver what became of this attempt and answer
    /// [`Event::Reconciled`].
    Reconcile {
        /// The attempt, as the receiver knows it.
        attempt: Pending,
        /// Which ask this is, from 1.
        poll: u64,
    },
    /// The run is over.
    Done {
        /// How it ended.
        terminal: Terminal,
    },
}

/// What a host observed of one dispatched attempt.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Which attempt this answers (its `ordinal`); required when more than
    /// one attempt is in flight (a hedged run), absent otherwise.
    pub ordinal: Option<u64>,
    /// When it completed (run clock, ms).
    pub completed_at_ms: u64,
    /// What it was charged by hand; absent: the reservation, or what its
    /// usage costs under the run's price schedule.
    pub cost: Option<u64>,
    /// A streamed attempt: the text of each event it delivered, in order.
    pub deltas: Vec<String>,
    /// The plain facts the host extracted.
    pub facts: Option<Facts>,
    /// An async job: the provider's job id (a submit's acceptance, or the
    /// job a poll asked about); the core keeps only its SHA-256.
    pub job_id: Option<String>,
    /// An async job: the job's status in the provider's answer.
    pub job_status: Option<JobStatus>,
    /// An async job's submit whose answer was lost: what the receiver
    /// answered when the host asked it by idempotency key in the same run
    /// (the attempt's outcome is the answer's: docs/JOBS.md).
    pub reconciled: Option<crate::attempt::Reconciled>,
    /// The model the attempt asked for and the one the provider reported
    /// (a side not learned is absent, never invented).
    pub model: Option<crate::attempt::ModelRecord>,
    /// The SHA-256 of the request body sent (after lowering to its route).
    pub request_body_sha256: Option<Sha256Hex>,
    /// The usage the response reported, priced by the run's schedule.
    pub usage: Option<Units>,
    /// The tokens the attempt used, settled against its admission's
    /// reservation (admission limits with a token bucket).
    pub used_tokens: Option<u64>,
}

/// What the host answers an effect with.
#[derive(Debug, Clone)]
pub enum Event {
    /// The append is durable.
    Appended,
    /// The store refused the append: the owner has lost the run.
    AppendRefused,
    /// What the store holds for each key read, in order.
    Read {
        /// The run clock when read, ms.
        now_ms: u64,
        /// One row per key.
        rows: Vec<Row>,
    },
    /// The store could not be read.
    StoreUnavailable {
        /// The run clock, ms.
        now_ms: u64,
    },
    /// How many of the writes, in order, were written.
    Written {
        /// The count; fewer than asked: the next one conflicted.
        written: u64,
    },
    /// A clock reading after a sleep.
    Clock {
        /// The run clock, ms.
        now_ms: u64,
    },
    /// What the dispatched attempt did.
    Observed(Box<Observation>),
    /// What the receiver answered about the attempt in doubt.
    Reconciled {
        /// Its answer.
        answer: AnswerKind,
        /// When it answered (run clock, ms).
        at_ms: u64,
        /// The cost to charge (a settled answer).
        cost: Option<u64>,
        /// An async job's submit that succeeded: the job id the receiver
        /// reported.
        job_id: Option<String>,
    },
    /// The caller cancelled the run (between attempts).
    Cancelled {
        /// When (run clock, ms).
        at_ms: u64,
    },
    /// A hedged round's loser was cancelled, as [`Effect::CancelAttempts`]
    /// asked.
    AttemptCancelled {
        /// The loser's ordinal.
        ordinal: u64,
        /// When it was cancelled (run clock, ms).
        at_ms: u64,
    },
}

impl Event {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Appended => "appended",
            Self::AppendRefused => "append_refused",
            Self::Read { .. } => "read",
            Self::StoreUnavailable { .. } => "store_unavailable",
            Self::Written { .. } => "written",
            Self::Clock { .. } => "clock",
            Self::Observed(_) => "observed",
            Self::Reconciled { .. } => "reconciled",
            Self::Cancelled { .. } => "cancelled",
            Self::AttemptCancelled { .. } => "attempt_cancelled",
        }
    }
}

/// A journal the machine appends to: the run's id and the lease generation
/// its owner holds.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// The run's identifier.
    pub run_id: Identifier,
    /// The lease generation the owner appends under.
    pub lease_generation: u64,
}

/// How a run is started or resumed.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Unix ms at run clock 0 (a journal's `created_at_epoch_ms`): the fleet
    /// documents' wall clock is this plus the run clock.
    pub origin_epoch_ms: u64,
    /// The run clock now, ms (0 at a start; the reading at a resume).
    pub now_ms: u64,
    /// Journal the run (a start) or the journal's owner (a resume).
    pub journal: Option<JournalOptions>,
    /// The price schedule usage is charged under.
    pub price_schedule: Option<Arc<PriceSchedule>>,
    /// The tokens an attempt reserves (admission limits with a token bucket).
    pub reserve_tokens: Option<u64>,
    /// Asks of the receiver about an attempt in doubt (default
    /// [`DEFAULT_MAX_POLLS`]).
    pub max_polls: Option<u64>,
    /// Compare-and-set conflicts in a row before `store_conflict` (default
    /// [`DEFAULT_MAX_CONFLICTS`]).
    pub max_conflicts: Option<u64>,
    /// The key a session used before (prompt caching): a pooled route keeps
    /// it while it is usable.
    pub key_affinity: Option<Sha256Hex>,
    /// The host delivers a stream: a policy without a stream contract is
    /// refused (`invalid_stream_contract` at `/stream`).
    pub stream: bool,
    /// The call's tenant under tenant shares (`fleet.admission.tenant_weights`,
    /// docs/FLEET.md "Fair tenants"): its admissions are made on its share.
    /// Ignored by a policy without shares, as the drivers' `Fleet` does.
    pub tenant: Option<Identifier>,
}
