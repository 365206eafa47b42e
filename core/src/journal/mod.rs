//! Durable runs: the journal of one run, its verification, and recovery.
//!
//! A host that crashes between sending a request and recording its answer
//! does not know whether the receiver accepted it. The journal is an append
//! log of `retryledger.journal_event.v1` documents, one run per log:
//!
//! ```text
//! created, decided, (reserved, dispatched, observed, decided)*, terminal
//! ```
//!
//! `created` binds the policy digest; `decided` holds the core's decision;
//! `reserved` the planned dispatch; `dispatched` is written durably *before*
//! the host calls out; `observed` holds the attempt; `terminal` the digests
//! of the attempts and the receipt. Every event carries `seq` (0, 1, 2, …),
//! the `lease_generation` of the owner that wrote it (never lower than the
//! event before it) and `prev_sha256`, the digest of the event before it
//! ([`GENESIS_SHA256`] for seq 0): a hash chain.
//!
//! The journal is the run machine's log: [`verify`] replays the events
//! through the machine's replay ([`crate::machine::replay::Log`], over the
//! same run as [`crate::evaluate()`]) and refuses anything else with a coded
//! error.
//! [`recover`] answers what a new owner does with a verified prefix:
//! `resume` (append the next event; a `reserved` attempt was never sent),
//! `reconcile` (an attempt was dispatched without an observation: ask the
//! receiver by idempotency key, on a bounded poll schedule), `adopt` (the
//! receiver's settled answer becomes that attempt's observation) or `done`.
//! Only `failed_no_effect` lets the plan dispatch again; `unknown` (or a
//! receiver still in progress past the poll bound or the deadline) ends the
//! run `stop_indeterminate`. [`append`] builds the next event with its chain
//! and `seq`, and [`classify_append`] tells a late append of a fenced owner
//! (kept as evidence, never a decision) from a valid one.
//!
//! Everything here is pure: a store only holds the events.
//!
//! The module is split by concern: `event` (the documents, their encoding
//! and decoding), `recover` (reconciliation and [`recover`]), `writer`
//! ([`Entry`], [`append`] and [`Writer`]) and `classify`
//! ([`classify_append`]). The replay itself is the machine's
//! ([`crate::machine::replay`]).

use crate::limits::MAX_ATTEMPTS;

mod classify;
mod event;
mod recover;
mod writer;

pub use crate::machine::replay::{verify, Verified};
pub use classify::{classify_append, Classified, EvidenceReason, Offer};
pub use event::{Ending, EventKind, Journal, JournalEvent, JournalEventSchema, Payload, Sent};
pub use recover::{
    poll_delay, recover, Answer, AnswerKind, Pending, Reconciliation, ReconciliationSchema,
    Recovery,
};
pub use writer::{append, Entry, Writer};

/// The `prev_sha256` of the event at seq 0.
pub const GENESIS_SHA256: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Most events in one journal: four per attempt and three more.
pub const MAX_EVENTS: usize = 4 * MAX_ATTEMPTS + 3;
/// Largest `max_polls` of a reconciliation.
pub const MAX_POLLS: u64 = 100;
