//! The journal's documents: event kinds and payloads, their canonical
//! encoding and their strict decoding.

use serde_json::Value;

use super::MAX_EVENTS;
use crate::attempt::Attempt;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, decode_tag, names, pick, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Terminal};
use crate::fleet::{Admission, FleetSnapshots, FleetStop};
use crate::ids::{schema_marker, Identifier, Sha256Hex};

schema_marker!(
    /// `retryledger.journal_event.v1`
    JournalEventSchema = "retryledger.journal_event.v1"
);

/// The kind of a journal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The run was admitted under a policy.
    Created,
    /// The planned attempt's cost is reserved; it has not been sent.
    Reserved,
    /// The attempt is about to be sent: durable before any I/O.
    Dispatched,
    /// The attempt's outcome.
    Observed,
    /// The core's decision after the previous event.
    Decided,
    /// The run's end: the digests of its attempts and receipt.
    Terminal,
}

names!(EventKind {
    Created => "created",
    Reserved => "reserved",
    Dispatched => "dispatched",
    Observed => "observed",
    Decided => "decided",
    Terminal => "terminal",
});

/// A `dispatched` event's attempt: what was sent, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// What the fleet admitted it under (a policy with a fleet section).
    pub admission: Option<Admission>,
    /// The idempotency key digest sent.
    pub idempotency_key_sha256: Sha256Hex,
    /// The planned earliest start.
    pub not_before_ms: u64,
    /// The attempt's global ordinal.
    pub ordinal: u64,
    /// The route.
    pub route_id: Identifier,
    /// The route release.
    pub route_release_sha256: Sha256Hex,
    /// The fleet snapshots its admission names (its skipped routes'
    /// breakers then its route's, its budget, its admission limits), so a
    /// run resumed from the journal seals a bundle that carries them;
    /// absent when the admission names none (no fleet section, or
    /// admitted without the store).
    pub snapshots: Option<FleetSnapshots>,
    /// When it was sent (run clock).
    pub started_at_ms: u64,
}

/// A `terminal` event's record of the run's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// Digest of the attempts document.
    pub attempts_sha256: Sha256Hex,
    /// Set when the run was cancelled between attempts.
    pub cancelled_at_ms: Option<u64>,
    /// Set when the fleet refused the next dispatch.
    pub fleet_stop: Option<FleetStop>,
    /// Digest of the receipt.
    pub receipt_sha256: Sha256Hex,
    /// The fleet snapshots its `fleet_stop` names (absent when it names
    /// none), so a run resumed from the journal seals them.
    pub snapshots: Option<FleetSnapshots>,
    /// How the run ended.
    pub terminal: Terminal,
}

/// What an event says, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "events are held in a list once per run; boxing costs an allocation per event"
)]
pub enum Payload {
    /// `created`: the policy and the wall clock of the run clock's origin.
    Created {
        /// Unix ms at run clock 0, so a new owner can read the run clock.
        created_at_epoch_ms: u64,
        /// The policy's digest.
        policy_sha256: Sha256Hex,
    },
    /// `reserved`: the planned dispatch.
    Reserved {
        /// Set when the caller cancelled the run at this time and the plan is
        /// the cancel of the async job it would leave running
        /// (`cancel_left_running`): the cancellation is journaled here,
        /// before that cancel is sent.
        cancelled_at_ms: Option<u64>,
        /// The plan, as [`crate::plan_next()`] gives it (after any admission).
        dispatch: Dispatch,
    },
    /// `dispatched`: the attempt sent.
    Dispatched(Sent),
    /// `observed`: the attempt as observed (or reconciled).
    Observed {
        /// The attempt, as in `retryledger.attempts.v1`.
        attempt: Attempt,
        /// A streamed attempt: the SHA-256 of each delta it received, in
        /// order (they hash to its record's `deltas_sha256`), so a resumed
        /// run rebuilds the consumer's event log. Empty (the field omitted)
        /// when it received none.
        delta_digests: Vec<Sha256Hex>,
    },
    /// `decided`: the core's decision.
    Decided {
        /// Dispatch or terminal.
        decision: Decision,
    },
    /// `terminal`: the run's end.
    Terminal(Ending),
}

impl Payload {
    /// The event kind of the payload.
    pub fn kind(&self) -> EventKind {
        match self {
            Self::Created { .. } => EventKind::Created,
            Self::Reserved { .. } => EventKind::Reserved,
            Self::Dispatched(_) => EventKind::Dispatched,
            Self::Observed { .. } => EventKind::Observed,
            Self::Decided { .. } => EventKind::Decided,
            Self::Terminal(_) => EventKind::Terminal,
        }
    }
}

/// One `retryledger.journal_event.v1` document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEvent {
    /// The lease generation of the owner that wrote it.
    pub lease_generation: u64,
    /// What it says.
    pub payload: Payload,
    /// Digest of the previous event ([`GENESIS_SHA256`](super::GENESIS_SHA256) at seq 0).
    pub prev_sha256: Sha256Hex,
    /// The run's identifier (the log's key).
    pub run_id: Identifier,
    /// Position in the log, from 0, without gaps.
    pub seq: u64,
}

/// A field value, for writing the fields of a flat tagged object in key order.
enum Val<'a> {
    U64(u64),
    Doc(&'a dyn Encode),
    Digests(&'a [Sha256Hex]),
}

fn write_sorted(sink: &mut dyn Sink, mut fields: Vec<(&'static str, Val<'_>)>) {
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let mut o = ObjectWriter::new(sink);
    for (k, v) in fields {
        match v {
            Val::U64(n) => o.u64(k, n),
            Val::Doc(d) => o.doc(k, d),
            Val::Digests(d) => o.list(k, d),
        };
    }
    o.end();
}

impl Encode for JournalEvent {
    fn encode(&self, sink: &mut dyn Sink) {
        let kind = self.payload.kind();
        let mut f: Vec<(&'static str, Val<'_>)> = vec![
            ("kind", Val::Doc(&kind)),
            ("lease_generation", Val::U64(self.lease_generation)),
            ("prev_sha256", Val::Doc(&self.prev_sha256)),
            ("run_id", Val::Doc(&self.run_id)),
            ("schema", Val::Doc(&JournalEventSchema)),
            ("seq", Val::U64(self.seq)),
        ];
        match &self.payload {
            Payload::Created {
                created_at_epoch_ms,
                policy_sha256,
            } => {
                f.push(("created_at_epoch_ms", Val::U64(*created_at_epoch_ms)));
                f.push(("policy_sha256", Val::Doc(policy_sha256)));
            }
            Payload::Reserved {
                cancelled_at_ms,
                dispatch,
            } => {
                if let Some(c) = cancelled_at_ms {
                    f.push(("cancelled_at_ms", Val::U64(*c)));
                }
                f.push(("dispatch", Val::Doc(dispatch)));
            }
            Payload::Dispatched(s) => {
                if let Some(a) = &s.admission {
                    f.push(("admission", Val::Doc(a)));
                }
                f.push((
                    "idempotency_key_sha256",
                    Val::Doc(&s.idempotency_key_sha256),
                ));
                f.push(("not_before_ms", Val::U64(s.not_before_ms)));
                f.push(("ordinal", Val::U64(s.ordinal)));
                f.push(("route_id", Val::Doc(&s.route_id)));
                f.push(("route_release_sha256", Val::Doc(&s.route_release_sha256)));
                if let Some(snapshots) = &s.snapshots {
                    f.push(("snapshots", Val::Doc(snapshots)));
                }
                f.push(("started_at_ms", Val::U64(s.started_at_ms)));
            }
            Payload::Observed {
                attempt,
                delta_digests,
            } => {
                f.push(("attempt", Val::Doc(attempt)));
                if !delta_digests.is_empty() {
                    f.push(("delta_digests", Val::Digests(delta_digests)));
                }
            }
            Payload::Decided { decision } => f.push(("decision", Val::Doc(decision))),
            Payload::Terminal(e) => {
                f.push(("attempts_sha256", Val::Doc(&e.attempts_sha256)));
                if let Some(c) = e.cancelled_at_ms {
                    f.push(("cancelled_at_ms", Val::U64(c)));
                }
                if let Some(s) = &e.fleet_stop {
                    f.push(("fleet_stop", Val::Doc(s)));
                }
                f.push(("receipt_sha256", Val::Doc(&e.receipt_sha256)));
                if let Some(snapshots) = &e.snapshots {
                    f.push(("snapshots", Val::Doc(snapshots)));
                }
                f.push(("terminal", Val::Doc(&e.terminal)));
            }
        }
        write_sorted(sink, f);
    }
}

/// The kind tag of a flat tagged object; an unknown kind is `journal_unknown_kind`.
pub(super) fn kind_of(v: &Value, at: &At<'_>) -> Result<EventKind> {
    let i = decode_tag(v, at, "kind", EventKind::NAMES).map_err(|e| {
        if e.code == ErrorCode::InvalidValue {
            Error {
                code: ErrorCode::JournalUnknownKind,
                ..e
            }
        } else {
            e
        }
    })?;
    pick(EventKind::ALL, i, at)
}

/// Every field an event or an entry may have, read in key order (a field
/// not in `allowed` is left for [`Fields::end`] to report as unknown).
#[derive(Default)]
pub(super) struct Raw {
    pub(super) admission: Option<Admission>,
    pub(super) attempt: Option<Attempt>,
    pub(super) attempts_sha256: Option<Sha256Hex>,
    pub(super) cancelled_at_ms: Option<u64>,
    pub(super) created_at_epoch_ms: Option<u64>,
    pub(super) decision: Option<Decision>,
    pub(super) delta_digests: Option<Vec<Sha256Hex>>,
    pub(super) dispatch: Option<Dispatch>,
    pub(super) fleet_stop: Option<FleetStop>,
    pub(super) idempotency_key_sha256: Option<Sha256Hex>,
    pub(super) lease_generation: Option<u64>,
    pub(super) not_before_ms: Option<u64>,
    pub(super) ordinal: Option<u64>,
    pub(super) policy_sha256: Option<Sha256Hex>,
    pub(super) prev_sha256: Option<Sha256Hex>,
    pub(super) receipt_sha256: Option<Sha256Hex>,
    pub(super) route_id: Option<Identifier>,
    pub(super) route_release_sha256: Option<Sha256Hex>,
    pub(super) run_id: Option<Identifier>,
    pub(super) seq: Option<u64>,
    pub(super) snapshots: Option<FleetSnapshots>,
    pub(super) started_at_ms: Option<u64>,
    pub(super) terminal: Option<Terminal>,
}

impl Raw {
    /// Read the fields named in `required` and `optional` (besides `kind`
    /// and `schema`, which the caller checks).
    pub(super) fn read(
        v: &Value,
        at: &At<'_>,
        required: &[&'static str],
        optional: &[&'static str],
    ) -> Result<Self> {
        let mut names: Vec<(&'static str, bool)> = required
            .iter()
            .map(|n| (*n, true))
            .chain(optional.iter().map(|n| (*n, false)))
            .collect();
        names.sort_unstable();
        let mut f = Fields::open(v, at)?;
        let mut r = Raw::default();
        for (name, req) in names {
            macro_rules! get {
                ($slot:ident) => {
                    r.$slot = if req { f.req(name) } else { f.opt(name) }
                };
            }
            match name {
                "admission" => get!(admission),
                "attempt" => get!(attempt),
                "attempts_sha256" => get!(attempts_sha256),
                "cancelled_at_ms" => get!(cancelled_at_ms),
                "created_at_epoch_ms" => get!(created_at_epoch_ms),
                "decision" => get!(decision),
                "delta_digests" => {
                    r.delta_digests = f.opt_with(name, |v, at| {
                        decode_list(v, at, crate::limits::MAX_STREAM_EVENTS)
                    })
                }
                "dispatch" => get!(dispatch),
                "fleet_stop" => get!(fleet_stop),
                "idempotency_key_sha256" => get!(idempotency_key_sha256),
                "lease_generation" => get!(lease_generation),
                "not_before_ms" => get!(not_before_ms),
                "ordinal" => get!(ordinal),
                "policy_sha256" => get!(policy_sha256),
                "prev_sha256" => get!(prev_sha256),
                "receipt_sha256" => get!(receipt_sha256),
                "route_id" => get!(route_id),
                "route_release_sha256" => get!(route_release_sha256),
                "run_id" => get!(run_id),
                "seq" => get!(seq),
                "snapshots" => get!(snapshots),
                "started_at_ms" => get!(started_at_ms),
                "terminal" => get!(terminal),
                "kind" => {
                    let _: Option<String> = f.req(name);
                }
                "schema" => {
                    let _: Option<JournalEventSchema> = f.req(name);
                }
                _ => {}
            }
        }
        f.end()?;
        Ok(r)
    }
}

/// `Some` of a required field [`Raw::read`] found (absence was reported by it).
pub(super) fn need<T>(x: Option<T>, at: &At<'_>) -> Result<T> {
    x.ok_or_else(|| at.error(ErrorCode::MissingField, "missing field"))
}

/// An optional list of delta digests: absent when empty (normal form).
pub(super) fn non_empty(x: Option<Vec<Sha256Hex>>, at: &At<'_>) -> Result<Vec<Sha256Hex>> {
    match x {
        Some(v) if v.is_empty() => Err(at.error(
            ErrorCode::InvalidValue,
            "`delta_digests` is omitted when the attempt received no delta",
        )),
        Some(v) => Ok(v),
        None => Ok(Vec::new()),
    }
}

impl Decode for JournalEvent {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = kind_of(v, at)?;
        const COMMON: [&str; 6] = [
            "kind",
            "lease_generation",
            "prev_sha256",
            "run_id",
            "schema",
            "seq",
        ];
        let (req, opt): (&[&'static str], &[&'static str]) = match kind {
            EventKind::Created => (&["created_at_epoch_ms", "policy_sha256"], &[]),
            EventKind::Reserved => (&["dispatch"], &["cancelled_at_ms"]),
            EventKind::Dispatched => (
                &[
                    "idempotency_key_sha256",
                    "not_before_ms",
                    "ordinal",
                    "route_id",
                    "route_release_sha256",
                    "started_at_ms",
                ],
                &["admission", "snapshots"],
            ),
            EventKind::Observed => (&["attempt"], &["delta_digests"]),
            EventKind::Decided => (&["decision"], &[]),
            EventKind::Terminal => (
                &["attempts_sha256", "receipt_sha256", "terminal"],
                &["cancelled_at_ms", "fleet_stop", "snapshots"],
            ),
        };
        let mut required: Vec<&'static str> = COMMON.to_vec();
        required.extend_from_slice(req);
        let r = Raw::read(v, at, &required, opt)?;
        let payload = match kind {
            EventKind::Created => Payload::Created {
                created_at_epoch_ms: need(r.created_at_epoch_ms, at)?,
                policy_sha256: need(r.policy_sha256, at)?,
            },
            EventKind::Reserved => Payload::Reserved {
                cancelled_at_ms: r.cancelled_at_ms,
                dispatch: need(r.dispatch, at)?,
            },
            EventKind::Dispatched => Payload::Dispatched(Sent {
                admission: r.admission,
                idempotency_key_sha256: need(r.idempotency_key_sha256, at)?,
                not_before_ms: need(r.not_before_ms, at)?,
                ordinal: need(r.ordinal, at)?,
                route_id: need(r.route_id, at)?,
                route_release_sha256: need(r.route_release_sha256, at)?,
                snapshots: r.snapshots,
                started_at_ms: need(r.started_at_ms, at)?,
            }),
            EventKind::Observed => Payload::Observed {
                attempt: need(r.attempt, at)?,
                delta_digests: non_empty(r.delta_digests, at)?,
            },
            EventKind::Decided => Payload::Decided {
                decision: need(r.decision, at)?,
            },
            EventKind::Terminal => Payload::Terminal(Ending {
                attempts_sha256: need(r.attempts_sha256, at)?,
                cancelled_at_ms: r.cancelled_at_ms,
                fleet_stop: r.fleet_stop,
                receipt_sha256: need(r.receipt_sha256, at)?,
                snapshots: r.snapshots,
                terminal: need(r.terminal, at)?,
            }),
        };
        Ok(JournalEvent {
            lease_generation: need(r.lease_generation, at)?,
            payload,
            prev_sha256: need(r.prev_sha256, at)?,
            run_id: need(r.run_id, at)?,
            seq: need(r.seq, at)?,
        })
    }
}

/// A journal: the events of one run, in `seq` order, as a JSON array.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Journal(pub Vec<JournalEvent>);

impl Decode for Journal {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_EVENTS).map(Journal)
    }
}

impl Encode for Journal {
    fn encode(&self, sink: &mut dyn Sink) {
        crate::canonical::encode_list(self.0.iter(), sink);
    }
}
