//! Appending: the entry a host asks for, the event the core builds from it
//! ([`append`]), and the [`Writer`] that keeps the replay between appends.

use std::sync::Arc;

use serde_json::Value;

use super::event::{kind_of, need, non_empty, Ending, EventKind, JournalEvent, Payload, Raw, Sent};
use super::recover::{recovered, Reconciliation, Recovery};
use crate::attempt::Attempt;
use crate::canonical::digest_of;
use crate::decode::{At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch};
use crate::fleet::{Admission, FleetSnapshots, FleetStop};
use crate::ids::{Identifier, Sha256Hex};
use crate::machine::replay::{at_event, plan_drift, verify, Expect, Log};
use crate::policy::CompiledPolicy;
use crate::session::Session;

/// What a host asks [`append`] to write next; the core fills in the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one entry per append, passed by reference"
)]
pub enum Entry {
    /// Open the run.
    Created {
        /// Unix ms at run clock 0.
        created_at_epoch_ms: u64,
        /// The run's identifier.
        run_id: Identifier,
    },
    /// Reserve the plan (or, with a fleet, the dispatch its admission gave).
    Reserved {
        /// Set to cancel the run first, when the plan then is the cancel of
        /// the async job it would leave running (`cancel_left_running`).
        cancelled_at_ms: Option<u64>,
        /// The admitted dispatch; absent: the core's plan.
        dispatch: Option<Dispatch>,
    },
    /// The reserved attempt is about to be sent.
    Dispatched {
        /// Its admission (a policy with a fleet section).
        admission: Option<Admission>,
        /// The fleet snapshots its admission names (absent when it names
        /// none).
        snapshots: Option<FleetSnapshots>,
        /// When it is sent (run clock).
        started_at_ms: u64,
    },
    /// What the attempt did.
    Observed {
        /// The attempt.
        attempt: Attempt,
        /// A streamed attempt: the SHA-256 of each delta it received, in
        /// order (empty when none).
        delta_digests: Vec<Sha256Hex>,
    },
    /// The core's decision.
    Decided,
    /// The run's end (a cancellation or a fleet stop, or after a terminal decision).
    Terminal {
        /// Set to cancel the run between attempts.
        cancelled_at_ms: Option<u64>,
        /// Set when the fleet refused the next dispatch.
        fleet_stop: Option<FleetStop>,
        /// The fleet snapshots that refusal names (absent when none).
        snapshots: Option<FleetSnapshots>,
    },
}

impl Decode for Entry {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = kind_of(v, at)?;
        let (req, opt): (&[&'static str], &[&'static str]) = match kind {
            EventKind::Created => (&["created_at_epoch_ms", "kind", "run_id"], &[]),
            EventKind::Reserved => (&["kind"], &["cancelled_at_ms", "dispatch"]),
            EventKind::Dispatched => (&["kind", "started_at_ms"], &["admission", "snapshots"]),
            EventKind::Observed => (&["attempt", "kind"], &["delta_digests"]),
            EventKind::Decided => (&["kind"], &[]),
            EventKind::Terminal => (&["kind"], &["cancelled_at_ms", "fleet_stop", "snapshots"]),
        };
        let r = Raw::read(v, at, req, opt)?;
        Ok(match kind {
            EventKind::Created => Entry::Created {
                created_at_epoch_ms: need(r.created_at_epoch_ms, at)?,
                run_id: need(r.run_id, at)?,
            },
            EventKind::Reserved => Entry::Reserved {
                cancelled_at_ms: r.cancelled_at_ms,
                dispatch: r.dispatch,
            },
            EventKind::Dispatched => Entry::Dispatched {
                admission: r.admission,
                snapshots: r.snapshots,
                started_at_ms: need(r.started_at_ms, at)?,
            },
            EventKind::Observed => Entry::Observed {
                attempt: need(r.attempt, at)?,
                delta_digests: non_empty(r.delta_digests, at)?,
            },
            EventKind::Decided => Entry::Decided,
            EventKind::Terminal => Entry::Terminal {
                cancelled_at_ms: r.cancelled_at_ms,
                fleet_stop: r.fleet_stop,
                snapshots: r.snapshots,
            },
        })
    }
}

/// Build the next event of a verified journal under `lease_generation`,
/// with its `seq` and `prev_sha256`; it is checked like any other event
/// before it is returned, so a host appends only what [`verify`] accepts.
pub fn append(
    cp: &CompiledPolicy,
    events: &[JournalEvent],
    lease_generation: u64,
    entry: &Entry,
) -> Result<JournalEvent> {
    let mut r = verify(cp, events)?;
    built(cp, &mut r, lease_generation, entry, None)
}

/// The next event of the journal `r` replays, with `r` advanced by it (on
/// error `r` is unchanged); an error about the event is reported under
/// `/entry`, or `/entries/<k>` for the entry at `k` of a batch.
fn built(
    cp: &CompiledPolicy,
    r: &mut Log,
    lease_generation: u64,
    entry: &Entry,
    batch: Option<usize>,
) -> Result<JournalEvent> {
    let i = usize::try_from(r.tip.len).unwrap_or(usize::MAX);
    build(cp, r, i, lease_generation, entry).map_err(|mut e| {
        if let Some(p) = e.path.take() {
            let prefix = format!("/events/{i}");
            e.path = Some(match (p.strip_prefix(&prefix), batch) {
                (Some(rest), None) => format!("/entry{rest}"),
                (Some(rest), Some(k)) => format!("/entries/{k}{rest}"),
                (None, _) => p,
            });
        }
        e
    })
}

fn build(
    cp: &CompiledPolicy,
    r: &mut Log,
    i: usize,
    lease_generation: u64,
    entry: &Entry,
) -> Result<JournalEvent> {
    let no_plan = || plan_drift(i, "kind", "the run has no planned dispatch here");
    let payload = match entry {
        Entry::Created {
            created_at_epoch_ms,
            ..
        } => Payload::Created {
            created_at_epoch_ms: *created_at_epoch_ms,
            policy_sha256: Sha256Hex::computed(cp.policy_sha256.clone()),
        },
        Entry::Reserved {
            cancelled_at_ms,
            dispatch,
        } => {
            let cancelled = match cancelled_at_ms {
                Some(at) => {
                    let mut run = r.run.clone();
                    run.cancel(*at)
                        .map_err(|e| at_event(e, i, "/cancelled_at_ms"))?;
                    Some(run)
                }
                None => None,
            };
            let run = cancelled.as_ref().unwrap_or(&r.run);
            Payload::Reserved {
                cancelled_at_ms: *cancelled_at_ms,
                dispatch: match (dispatch, run.next()) {
                    (Some(d), _) => d.clone(),
                    (None, Decision::Dispatch(d)) => d.clone(),
                    (None, Decision::Terminal { .. }) => return Err(no_plan()),
                },
            }
        }
        Entry::Dispatched {
            admission,
            snapshots,
            started_at_ms,
        } => {
            let d = match &r.tip.expect {
                Expect::Reserved(d) => d,
                Expect::Round(round) if round.pending().is_some() => {
                    round.pending().ok_or_else(no_plan)?
                }
                _ => {
                    return Err(Error::at(
                        ErrorCode::JournalOutOfOrder,
                        format!("/events/{i}/kind"),
                        "a `dispatched` event follows a `reserved` one",
                    ))
                }
            };
            Payload::Dispatched(Sent {
                admission: admission.clone(),
                idempotency_key_sha256: d.idempotency_key_sha256.clone(),
                not_before_ms: d.not_before_ms,
                ordinal: d.ordinal,
                route_id: d.route_id.clone(),
                route_release_sha256: d.route_release_sha256.clone(),
                snapshots: snapshots.clone(),
                started_at_ms: *started_at_ms,
            })
        }
        Entry::Observed {
            attempt,
            delta_digests,
        } => Payload::Observed {
            attempt: attempt.clone(),
            delta_digests: delta_digests.clone(),
        },
        Entry::Decided => Payload::Decided {
            decision: r.run.next().clone(),
        },
        Entry::Terminal {
            cancelled_at_ms,
            fleet_stop,
            snapshots,
        } => {
            let mut run = r.run.clone();
            let mut attempts = r.attempts.clone();
            // A cancellation the journal already holds (a job's cancel was
            // reserved under it) is not made again.
            let held = cancelled_at_ms.is_some() && attempts.cancelled_at_ms == *cancelled_at_ms;
            if let (Some(at), false) = (cancelled_at_ms, held) {
                run.cancel(*at)
                    .map_err(|e| at_event(e, i, "/cancelled_at_ms"))?;
                attempts.cancelled_at_ms = Some(*at);
            }
            if let Some(stop) = fleet_stop {
                run.fleet_stop(cp, stop)
                    .map_err(|e| at_event(e, i, "/fleet_stop"))?;
                attempts.fleet_stop = Some(stop.clone());
            }
            let Some(terminal) = run.terminal() else {
                return Err(Error::at(
                    ErrorCode::JournalOutOfOrder,
                    format!("/events/{i}/kind"),
                    "the run may still dispatch: it ends by a terminal decision, a cancellation or a fleet stop",
                ));
            };
            let attempts_sha256 = digest_of(&attempts);
            let receipt = run.receipt(cp, attempts_sha256.clone())?;
            Payload::Terminal(Ending {
                attempts_sha256: Sha256Hex::computed(attempts_sha256),
                cancelled_at_ms: *cancelled_at_ms,
                fleet_stop: fleet_stop.clone(),
                receipt_sha256: Sha256Hex::computed(digest_of(&receipt)),
                snapshots: snapshots.clone(),
                terminal,
            })
        }
    };
    let run_id = match (entry, &r.tip.run_id) {
        (Entry::Created { run_id, .. }, _) => run_id.clone(),
        (_, Some(run_id)) => run_id.clone(),
        (_, None) => {
            return Err(Error::at(
                ErrorCode::JournalOutOfOrder,
                "/events/0/kind",
                "a journal starts with a `created` event",
            ))
        }
    };
    let event = JournalEvent {
        lease_generation,
        payload,
        prev_sha256: Sha256Hex::computed(r.head_sha256()),
        run_id,
        seq: r.tip.len,
    };
    r.step(cp, &event, i)?;
    Ok(event)
}

/// The journal of a run as its owner writes it: the replay of what it holds,
/// kept between appends and advanced in place by each event built, so that
/// an append checks the one new event (not the whole journal again, as
/// [`append`] does) at a cost that does not grow with the journal, and a
/// recovery or a session continuing the run starts from the replay rather
/// than from the journal's events.
///
/// An event is built and the replay advanced before the host writes it; an
/// owner whose store refuses a write has lost its run (its lease or the
/// `seq`) and does not append through this writer again.
#[derive(Debug, Clone)]
pub struct Writer {
    cp: Arc<CompiledPolicy>,
    replayed: Log,
    lease_generation: u64,
}

impl Writer {
    /// The writer of a journal of `cp` verified (the first event the replay
    /// refuses is the error), appending under `lease_generation`.
    pub fn new(
        cp: Arc<CompiledPolicy>,
        events: &[JournalEvent],
        lease_generation: u64,
    ) -> Result<Self> {
        let replayed = verify(&cp, events)?;
        Ok(Self {
            cp,
            replayed,
            lease_generation,
        })
    }

    /// Build the next event from `entry`, checked like any other event
    /// ([`append`]), and advance the replay by it. On error the writer is
    /// unchanged.
    pub fn append(&mut self, entry: &Entry) -> Result<JournalEvent> {
        built(
            &self.cp,
            &mut self.replayed,
            self.lease_generation,
            entry,
            None,
        )
    }

    /// Build the events of `entries` in order, each checked like any other
    /// event against the journal the ones before it leave, and advance the
    /// replay by all of them or by none: on an error (reported under
    /// `/entries/<k>`) the writer is as it was. The events are those
    /// [`Writer::append`] would build one at a time.
    ///
    /// It is for a host that makes events written together durable in one
    /// write: `reserved` with `dispatched`, `observed` with `decided`.
    /// Such a batch costs what its appends cost; a batch that goes on past
    /// an attempt's `decided`, or past a `terminal`, copies the replay once
    /// to put it back on an error.
    pub fn append_all(&mut self, entries: &[Entry]) -> Result<Vec<JournalEvent>> {
        let tip = self.replayed.tip.clone();
        let copied = (0..entries.len())
            .any(|k| !undone_by_tip(entries.get(k..).unwrap_or_default()))
            .then(|| self.replayed.clone());
        let mut events = Vec::with_capacity(entries.len());
        for (k, entry) in entries.iter().enumerate() {
            match built(
                &self.cp,
                &mut self.replayed,
                self.lease_generation,
                entry,
                Some(k),
            ) {
                Ok(event) => events.push(event),
                Err(e) => {
                    match copied {
                        Some(r) => self.replayed = r,
                        None => self.replayed.tip = tip,
                    }
                    return Err(e);
                }
            }
        }
        Ok(events)
    }

    /// What the owner does next ([`recover`](super::recover) of the journal written so far).
    pub fn recover(&self, reconciliation: Option<&Reconciliation>) -> Result<Recovery> {
        recovered(&self.cp, &self.replayed, reconciliation)
    }

    /// Continue `session` (fresh, of the writer's policy; its price schedule
    /// set first when the run has one) from the journal written so far:
    /// [`Session::resume_journal`] without reading the events again.
    pub fn resume(&self, session: &mut Session) -> Result<()> {
        if session.policy().policy_sha256 != self.cp.policy_sha256 {
            return Err(Error::at(
                ErrorCode::JournalPolicyMismatch,
                "/policy_sha256",
                "the session's policy is not the journal's",
            ));
        }
        session.resume_replayed(self.replayed.clone())
    }

    /// The replay of the journal written so far.
    pub fn replayed(&self) -> &Log {
        &self.replayed
    }

    /// The lease generation it appends under.
    pub fn lease_generation(&self) -> u64 {
        self.lease_generation
    }
}

/// Whether a batch's appends from the first of `rest` on can be put back by
/// restoring the replay's tip alone. Only `observed` and `terminal` change
/// the run and its attempts (and a `dispatched` that carries snapshots the
/// replay's snapshots), and an event that is refused changes nothing; so
/// it holds unless one of them is followed by an entry that may be
/// refused. An `observed` followed by its `decided` alone is not: that
/// event is built from the run the observation left (its decision, seq,
/// chain and lease), which is what its check compares.
fn undone_by_tip(rest: &[Entry]) -> bool {
    !matches!(
        rest,
        [
            Entry::Observed { .. }
                | Entry::Terminal { .. }
                | Entry::Dispatched {
                    snapshots: Some(_),
                    ..
                }
                | Entry::Reserved {
                    cancelled_at_ms: Some(_),
                    ..
                },
            _,
            ..
        ]
    ) || matches!(rest, [Entry::Observed { .. }, Entry::Decided])
}
