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
//! [`verify`] replays the events through the same run state machine as
//! [`crate::evaluate()`] and refuses anything else with a coded error.
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

use std::sync::Arc;

use serde_json::Value;

use crate::attempt::{Attempt, Attempts, Reconciled};
use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, decode_tag, names, object, pick, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Run, Terminal};
use crate::fleet::{Admission, FleetStop};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::MAX_ATTEMPTS;
use crate::policy::CompiledPolicy;
use crate::session::Session;

schema_marker!(
    /// `retryledger.journal_event.v1`
    JournalEventSchema = "retryledger.journal_event.v1"
);
schema_marker!(
    /// `retryledger.reconciliation.v1`
    ReconciliationSchema = "retryledger.reconciliation.v1"
);

/// The `prev_sha256` of the event at seq 0.
pub const GENESIS_SHA256: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Most events in one journal: four per attempt and three more.
pub const MAX_EVENTS: usize = 4 * MAX_ATTEMPTS + 3;
/// Largest `max_polls` of a reconciliation.
pub const MAX_POLLS: u64 = 100;

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
        /// The plan, as [`crate::plan_next()`] gives it (after any admission).
        dispatch: Dispatch,
    },
    /// `dispatched`: the attempt sent.
    Dispatched(Sent),
    /// `observed`: the attempt as observed (or reconciled).
    Observed {
        /// The attempt, as in `retryledger.attempts.v1`.
        attempt: Attempt,
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
    /// Digest of the previous event ([`GENESIS_SHA256`] at seq 0).
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
}

fn write_sorted(sink: &mut dyn Sink, mut fields: Vec<(&'static str, Val<'_>)>) {
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let mut o = ObjectWriter::new(sink);
    for (k, v) in fields {
        match v {
            Val::U64(n) => o.u64(k, n),
            Val::Doc(d) => o.doc(k, d),
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
            Payload::Reserved { dispatch } => f.push(("dispatch", Val::Doc(dispatch))),
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
                f.push(("started_at_ms", Val::U64(s.started_at_ms)));
            }
            Payload::Observed { attempt } => f.push(("attempt", Val::Doc(attempt))),
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
                f.push(("terminal", Val::Doc(&e.terminal)));
            }
        }
        write_sorted(sink, f);
    }
}

/// The kind tag of a flat tagged object; an unknown kind is `journal_unknown_kind`.
fn kind_of(v: &Value, at: &At<'_>) -> Result<EventKind> {
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
struct Raw {
    admission: Option<Admission>,
    attempt: Option<Attempt>,
    attempts_sha256: Option<Sha256Hex>,
    cancelled_at_ms: Option<u64>,
    created_at_epoch_ms: Option<u64>,
    decision: Option<Decision>,
    dispatch: Option<Dispatch>,
    fleet_stop: Option<FleetStop>,
    idempotency_key_sha256: Option<Sha256Hex>,
    lease_generation: Option<u64>,
    not_before_ms: Option<u64>,
    ordinal: Option<u64>,
    policy_sha256: Option<Sha256Hex>,
    prev_sha256: Option<Sha256Hex>,
    receipt_sha256: Option<Sha256Hex>,
    route_id: Option<Identifier>,
    route_release_sha256: Option<Sha256Hex>,
    run_id: Option<Identifier>,
    seq: Option<u64>,
    started_at_ms: Option<u64>,
    terminal: Option<Terminal>,
}

impl Raw {
    /// Read the fields named in `required` and `optional` (besides `kind`
    /// and `schema`, which the caller checks).
    fn read(
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
fn need<T>(x: Option<T>, at: &At<'_>) -> Result<T> {
    x.ok_or_else(|| at.error(ErrorCode::MissingField, "missing field"))
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
            EventKind::Reserved => (&["dispatch"], &[]),
            EventKind::Dispatched => (
                &[
                    "idempotency_key_sha256",
                    "not_before_ms",
                    "ordinal",
                    "route_id",
                    "route_release_sha256",
                    "started_at_ms",
                ],
                &["admission"],
            ),
            EventKind::Observed => (&["attempt"], &[]),
            EventKind::Decided => (&["decision"], &[]),
            EventKind::Terminal => (
                &["attempts_sha256", "receipt_sha256", "terminal"],
                &["cancelled_at_ms", "fleet_stop"],
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
                dispatch: need(r.dispatch, at)?,
            },
            EventKind::Dispatched => Payload::Dispatched(Sent {
                admission: r.admission,
                idempotency_key_sha256: need(r.idempotency_key_sha256, at)?,
                not_before_ms: need(r.not_before_ms, at)?,
                ordinal: need(r.ordinal, at)?,
                route_id: need(r.route_id, at)?,
                route_release_sha256: need(r.route_release_sha256, at)?,
                started_at_ms: need(r.started_at_ms, at)?,
            }),
            EventKind::Observed => Payload::Observed {
                attempt: need(r.attempt, at)?,
            },
            EventKind::Decided => Payload::Decided {
                decision: need(r.decision, at)?,
            },
            EventKind::Terminal => Payload::Terminal(Ending {
                attempts_sha256: need(r.attempts_sha256, at)?,
                cancelled_at_ms: r.cancelled_at_ms,
                fleet_stop: r.fleet_stop,
                receipt_sha256: need(r.receipt_sha256, at)?,
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

/// What the replay expects next.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per replay, replaced in place at every event"
)]
enum Expect {
    /// Nothing yet: `created`.
    Start,
    /// After `created`: the first `decided`.
    FirstDecision,
    /// After `decided` with a dispatch: `reserved`, or a `terminal` that
    /// cancels or records a fleet stop.
    Planned,
    /// After `decided` with a terminal: `terminal`.
    Ended,
    /// After `reserved`: `dispatched`, or a `terminal` that cancels.
    Reserved(Dispatch),
    /// After `dispatched`: `observed` (or reconciliation).
    Dispatched(Dispatch, Sent),
    /// After `observed`: `decided`.
    Observed,
    /// After `terminal`: nothing.
    Done,
}

/// The replay of a verified journal prefix.
#[derive(Debug, Clone)]
pub struct Replayed {
    run: Run,
    attempts: Attempts,
    expect: Expect,
    run_id: Option<Identifier>,
    lease_generation: u64,
    head: Option<JournalEvent>,
    len: u64,
    created_at_epoch_ms: Option<u64>,
    receipt_sha256: Option<Sha256Hex>,
}

/// The error of an attempt check, moved from `/attempts/<k>` to the event's attempt.
fn at_event(mut e: Error, i: usize, inner: &str) -> Error {
    let path = e.path.take().unwrap_or_default();
    let rest = match path.strip_prefix("/attempts/") {
        Some(r) => r.find('/').map_or("", |k| r.get(k..).unwrap_or("")),
        None => path.as_str(),
    };
    e.path = Some(format!("/events/{i}{inner}{rest}"));
    e
}

fn plan_drift(i: usize, field: &str, msg: impl Into<String>) -> Error {
    Error::at(
        ErrorCode::JournalPlanDrift,
        format!("/events/{i}/{field}"),
        msg,
    )
}

impl Replayed {
    /// An empty journal.
    pub fn new(cp: &CompiledPolicy) -> Self {
        Self {
            run: Run::new(cp),
            attempts: Attempts::default(),
            expect: Expect::Start,
            run_id: None,
            lease_generation: 0,
            head: None,
            len: 0,
            created_at_epoch_ms: None,
            receipt_sha256: None,
        }
    }

    /// The next free `seq`.
    pub fn next_seq(&self) -> u64 {
        self.len
    }

    /// The highest lease generation so far (0 when empty).
    pub fn lease_generation(&self) -> u64 {
        self.lease_generation
    }

    /// The attempts the journal holds.
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The replayed run and its attempts, for a session that continues it.
    pub(crate) fn into_run(self) -> (Run, Attempts) {
        (self.run, self.attempts)
    }

    /// The `prev_sha256` of the next event.
    pub fn head_sha256(&self) -> String {
        self.head
            .as_ref()
            .map_or_else(|| GENESIS_SHA256.to_owned(), digest_of)
    }

    /// The kind of the next event to append when nothing outside the core
    /// is needed to write it, or the choices a host has.
    fn next_kind(&self) -> Option<EventKind> {
        match self.expect {
            Expect::Start => Some(EventKind::Created),
            Expect::FirstDecision | Expect::Observed => Some(EventKind::Decided),
            Expect::Planned => Some(EventKind::Reserved),
            Expect::Ended => Some(EventKind::Terminal),
            Expect::Reserved(_) => Some(EventKind::Dispatched),
            Expect::Dispatched(..) => Some(EventKind::Observed),
            Expect::Done => None,
        }
    }

    /// Check one event at index `i` against the replay and advance it.
    /// On error the replay is unchanged.
    pub fn apply(&mut self, cp: &CompiledPolicy, e: &JournalEvent, i: usize) -> Result<()> {
        let mut next = self.clone();
        next.step(cp, e, i)?;
        *self = next;
        Ok(())
    }

    fn step(&mut self, cp: &CompiledPolicy, e: &JournalEvent, i: usize) -> Result<()> {
        if e.seq != self.len {
            let (code, msg) = if e.seq < self.len {
                (ErrorCode::JournalSeqRepeat, "is already taken")
            } else {
                (ErrorCode::JournalSeqGap, "skips ahead")
            };
            return Err(Error::at(
                code,
                format!("/events/{i}/seq"),
                format!("seq {} {msg}: the next free seq is {}", e.seq, self.len),
            ));
        }
        if let Some(run) = &self.run_id {
            if &e.run_id != run {
                return Err(Error::at(
                    ErrorCode::JournalWrongRun,
                    format!("/events/{i}/run_id"),
                    format!("an event of run `{}` in the journal of `{run}`", e.run_id),
                ));
            }
        }
        let prev = self.head_sha256();
        if e.prev_sha256.as_str() != prev {
            return Err(Error::at(
                ErrorCode::JournalChainBroken,
                format!("/events/{i}/prev_sha256"),
                format!("prev_sha256 is not the digest of the event before it ({prev})"),
            ));
        }
        if e.lease_generation < self.lease_generation {
            return Err(Error::at(
                ErrorCode::JournalStaleLease,
                format!("/events/{i}/lease_generation"),
                format!(
                    "lease generation {} after {}: the owner was fenced",
                    e.lease_generation, self.lease_generation
                ),
            ));
        }
        let kind = e.payload.kind();
        let out_of_order = || {
            Error::at(
                ErrorCode::JournalOutOfOrder,
                format!("/events/{i}/kind"),
                format!("a `{}` event cannot come here", kind.as_str()),
            )
        };
        let expect = std::mem::replace(&mut self.expect, Expect::Done);
        self.expect = match (expect, &e.payload) {
            (Expect::Done, _) => {
                return Err(Error::at(
                    ErrorCode::JournalAfterTerminal,
                    format!("/events/{i}/kind"),
                    "the run's terminal event was already written",
                ))
            }
            (
                Expect::Start,
                Payload::Created {
                    created_at_epoch_ms,
                    policy_sha256,
                },
            ) => {
                if policy_sha256.as_str() != cp.policy_sha256 {
                    return Err(Error::at(
                        ErrorCode::JournalPolicyMismatch,
                        format!("/events/{i}/policy_sha256"),
                        "the journal's run is under another policy",
                    ));
                }
                self.created_at_epoch_ms = Some(*created_at_epoch_ms);
                self.run_id = Some(e.run_id.clone());
                Expect::FirstDecision
            }
            (Expect::FirstDecision | Expect::Observed, Payload::Decided { decision }) => {
                if decision != self.run.next() {
                    return Err(plan_drift(
                        i,
                        "decision",
                        "the decision is not the core's for the events before it",
                    ));
                }
                match decision {
                    Decision::Dispatch(_) => Expect::Planned,
                    Decision::Terminal { .. } => Expect::Ended,
                }
            }
            (Expect::Planned, Payload::Reserved { dispatch }) => {
                self.check_reserved(cp, dispatch, i)?;
                Expect::Reserved(dispatch.clone())
            }
            (Expect::Reserved(planned), Payload::Dispatched(sent)) => {
                check_sent(cp, &planned, sent, i)?;
                Expect::Dispatched(planned, sent.clone())
            }
            (Expect::Dispatched(planned, sent), Payload::Observed { attempt }) => {
                self.check_observed(cp, &planned, &sent, attempt, i)?;
                Expect::Observed
            }
            (
                ex @ (Expect::Planned | Expect::Reserved(_) | Expect::Ended),
                Payload::Terminal(end),
            ) => {
                self.check_terminal(cp, &ex, end, i)?;
                Expect::Done
            }
            _ => return Err(out_of_order()),
        };
        self.lease_generation = e.lease_generation;
        self.len = self.len.saturating_add(1);
        self.head = Some(e.clone());
        Ok(())
    }

    /// A reservation is the plan, or (a fleet's breaker skipped routes) the
    /// plan moved on by skips.
    fn check_reserved(&self, cp: &CompiledPolicy, dispatch: &Dispatch, i: usize) -> Result<()> {
        let Decision::Dispatch(mut plan) = self.run.next().clone() else {
            return Err(plan_drift(i, "dispatch", "the run has ended"));
        };
        let skips = cp
            .policy
            .fleet
            .as_ref()
            .is_some_and(|f| f.breaker.is_some());
        loop {
            if &plan == dispatch {
                return Ok(());
            }
            match skips.then(|| self.run.skip_route(cp, &plan)).flatten() {
                Some(p) => plan = p,
                None => {
                    return Err(plan_drift(
                        i,
                        "dispatch",
                        "the reserved dispatch is not the core's plan",
                    ))
                }
            }
        }
    }

    fn check_observed(
        &mut self,
        cp: &CompiledPolicy,
        planned: &Dispatch,
        sent: &Sent,
        a: &Attempt,
        i: usize,
    ) -> Result<()> {
        let same = [
            ("admission", a.admission == sent.admission),
            (
                "idempotency_key_sha256",
                a.idempotency_key_sha256 == sent.idempotency_key_sha256,
            ),
            ("ordinal", a.ordinal == sent.ordinal),
            ("route_id", a.route_id == sent.route_id),
            (
                "route_release_sha256",
                a.route_release_sha256 == sent.route_release_sha256,
            ),
            ("started_at_ms", a.started_at_ms == sent.started_at_ms),
        ];
        if let Some((field, _)) = same.iter().find(|(_, ok)| !ok) {
            return Err(plan_drift(
                i,
                &format!("attempt/{field}"),
                "the observed attempt is not the one dispatched",
            ));
        }
        let index = self.attempts.attempts.len();
        let d = self
            .run
            .check(cp, a, index)
            .map_err(|e| at_event(e, i, "/attempt"))?;
        if &d != planned {
            return Err(plan_drift(
                i,
                "attempt",
                "the observed attempt's admission implies another plan than the one reserved",
            ));
        }
        self.run
            .observe(cp, a, d, index)
            .map_err(|e| at_event(e, i, "/attempt"))?;
        self.attempts.attempts.push(a.clone());
        Ok(())
    }

    fn check_terminal(
        &mut self,
        cp: &CompiledPolicy,
        expect: &Expect,
        end: &Ending,
        i: usize,
    ) -> Result<()> {
        match (expect, end.cancelled_at_ms, &end.fleet_stop) {
            (_, Some(_), Some(_)) => {
                return Err(plan_drift(
                    i,
                    "fleet_stop",
                    "a run ends by cancellation or by a fleet stop, not both",
                ))
            }
            (Expect::Planned | Expect::Reserved(_), Some(at), None) => {
                self.run
                    .cancel(at)
                    .map_err(|e| at_event(e, i, "/cancelled_at_ms"))?;
                self.attempts.cancelled_at_ms = Some(at);
            }
            (Expect::Planned, None, Some(stop)) => {
                self.run
                    .fleet_stop(cp, stop)
                    .map_err(|e| at_event(e, i, "/fleet_stop"))?;
                self.attempts.fleet_stop = Some(stop.clone());
            }
            (Expect::Ended, None, None) => {}
            _ => {
                return Err(Error::at(
                    ErrorCode::JournalOutOfOrder,
                    format!("/events/{i}/kind"),
                    "a run that may still dispatch ends only by cancellation (before the dispatch) or a fleet stop (before the reservation)",
                ))
            }
        }
        let Some(terminal) = self.run.terminal() else {
            return Err(plan_drift(i, "terminal", "the run has not ended"));
        };
        if terminal != end.terminal {
            return Err(plan_drift(
                i,
                "terminal",
                format!("the run ended with {}", terminal.as_str()),
            ));
        }
        let attempts_sha256 = digest_of(&self.attempts);
        if end.attempts_sha256.as_str() != attempts_sha256 {
            return Err(plan_drift(
                i,
                "attempts_sha256",
                "not the digest of the journal's attempts",
            ));
        }
        let receipt = self.run.receipt(cp, attempts_sha256)?;
        let receipt_sha256 = digest_of(&receipt);
        if end.receipt_sha256.as_str() != receipt_sha256 {
            return Err(plan_drift(
                i,
                "receipt_sha256",
                "not the digest of the journal's receipt",
            ));
        }
        self.receipt_sha256 = Some(Sha256Hex::computed(receipt_sha256));
        Ok(())
    }
}

/// The `dispatched` event must send the reserved attempt, not before its time,
/// with an admission exactly when the policy has a fleet.
fn check_sent(cp: &CompiledPolicy, planned: &Dispatch, s: &Sent, i: usize) -> Result<()> {
    let same = [
        (
            "idempotency_key_sha256",
            s.idempotency_key_sha256 == planned.idempotency_key_sha256,
        ),
        ("not_before_ms", s.not_before_ms == planned.not_before_ms),
        ("ordinal", s.ordinal == planned.ordinal),
        ("route_id", s.route_id == planned.route_id),
        (
            "route_release_sha256",
            s.route_release_sha256 == planned.route_release_sha256,
        ),
    ];
    if let Some((field, _)) = same.iter().find(|(_, ok)| !ok) {
        return Err(plan_drift(
            i,
            field,
            "the dispatched attempt is not the one reserved",
        ));
    }
    if s.started_at_ms < s.not_before_ms {
        return Err(Error::at(
            ErrorCode::EarlyStart,
            format!("/events/{i}/started_at_ms"),
            format!(
                "started at {} before not_before {}",
                s.started_at_ms, s.not_before_ms
            ),
        ));
    }
    match (&cp.policy.fleet, &s.admission) {
        (Some(_), None) => Err(Error::at(
            ErrorCode::AdmissionMissing,
            format!("/events/{i}/admission"),
            "the policy has a fleet section: the dispatched event records its admission",
        )),
        (None, Some(_)) => Err(Error::at(
            ErrorCode::AdmissionUnexpected,
            format!("/events/{i}/admission"),
            "an admission the policy has no fleet for",
        )),
        _ => Ok(()),
    }
}

/// Verify a journal against a compiled policy: the replay of every event.
pub fn verify(cp: &CompiledPolicy, events: &[JournalEvent]) -> Result<Replayed> {
    let mut r = Replayed::new(cp);
    for (i, e) in events.iter().enumerate() {
        r.step(cp, e, i)?;
    }
    Ok(r)
}

/// What [`verify`] found, as the `journal_verify` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Attempts the journal holds.
    pub attempts: u64,
    /// Unix ms of the run clock's origin, once `created` is written.
    pub created_at_epoch_ms: Option<u64>,
    /// The `prev_sha256` of the next event.
    pub head_sha256: String,
    /// The kind of the last event, when there is one.
    pub last_kind: Option<EventKind>,
    /// The highest lease generation (0 when empty).
    pub lease_generation: u64,
    /// The next free seq.
    pub next_seq: u64,
    /// The run, once `created` is written.
    pub run_id: Option<Identifier>,
    /// How the run ended, once `terminal` is written.
    pub terminal: Option<Terminal>,
}

impl Replayed {
    /// The summary of the replay.
    pub fn summary(&self) -> Verified {
        Verified {
            attempts: u64::try_from(self.attempts.attempts.len()).unwrap_or(u64::MAX),
            created_at_epoch_ms: self.created_at_epoch_ms,
            head_sha256: self.head_sha256(),
            last_kind: self.head.as_ref().map(|e| e.payload.kind()),
            lease_generation: self.lease_generation,
            next_seq: self.len,
            run_id: self.run_id.clone(),
            terminal: matches!(self.expect, Expect::Done)
                .then(|| self.run.terminal())
                .flatten(),
        }
    }
}

impl Encode for Verified {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .u64("attempts", self.attempts)
            .opt_u64("created_at_epoch_ms", self.created_at_epoch_ms)
            .str("head_sha256", &self.head_sha256)
            .opt_doc("last_kind", self.last_kind.as_ref())
            .u64("lease_generation", self.lease_generation)
            .u64("next_seq", self.next_seq)
            .opt_doc("run_id", self.run_id.as_ref())
            .opt_doc("terminal", self.terminal.as_ref())
            .end();
    }
}

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
}

object!(Answer {
    answer: doc,
    at_ms: u64,
    cost: opt_u64,
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
fn recovered(
    cp: &CompiledPolicy,
    r: &Replayed,
    reconciliation: Option<&Reconciliation>,
) -> Result<Recovery> {
    let (planned, sent) = match &r.expect {
        Expect::Dispatched(planned, sent) => (planned, sent),
        _ => {
            if reconciliation.is_some() {
                return Err(Error::at(
                    ErrorCode::ReconciliationUnexpected,
                    "/reconciliation/ordinal",
                    "no dispatched attempt waits for an observation",
                ));
            }
            return Ok(match (&r.expect, r.next_kind()) {
                (Expect::Done, _) | (_, None) => Recovery::Done {
                    receipt_sha256: r
                        .receipt_sha256
                        .clone()
                        .unwrap_or_else(|| Sha256Hex::computed(GENESIS_SHA256.to_owned())),
                    terminal: r.run.terminal().unwrap_or(Terminal::StopIndeterminate),
                },
                (Expect::Reserved(d), Some(next)) => Recovery::Resume {
                    dispatch: Some(d.clone()),
                    next,
                    next_seq: r.len,
                },
                (Expect::Planned, Some(next)) => Recovery::Resume {
                    dispatch: match r.run.next() {
                        Decision::Dispatch(d) => Some(d.clone()),
                        Decision::Terminal { .. } => None,
                    },
                    next,
                    next_seq: r.len,
                },
                (_, Some(next)) => Recovery::Resume {
                    dispatch: None,
                    next,
                    next_seq: r.len,
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
    let mut settled: Option<(Reconciled, u64, Option<u64>)> = None;
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
            AnswerKind::Succeeded => settled = Some((Reconciled::Succeeded, a.at_ms, a.cost)),
            AnswerKind::FailedNoEffect => {
                settled = Some((Reconciled::FailedNoEffect, a.at_ms, a.cost))
            }
            AnswerKind::Unknown => settled = Some((Reconciled::Unknown, a.at_ms, a.cost)),
        }
    }
    let settled = match settled {
        Some(s) => s,
        None if polls > 0 && (polls >= rec.max_polls || due >= deadline) => {
            // Still in progress at the poll bound or the deadline: unknown.
            (Reconciled::Unknown, last_at, None)
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
    let (answer, completed_at_ms, cost) = settled;
    let attempt = Attempt {
        admission: sent.admission.clone(),
        // The owner that sent it did not live to say what it sent.
        reconciled: Some(answer),
        ..planned.attempt(
            sent.started_at_ms,
            completed_at_ms,
            cost.unwrap_or(planned.reserve_cost),
            answer.outcome(),
        )
    };
    let mut run = r.run.clone();
    let index = r.attempts.attempts.len();
    let d = run.check(cp, &attempt, index)?;
    run.observe(cp, &attempt, d, index)?;
    Ok(Recovery::Adopt {
        attempt,
        decision: run.next().clone(),
    })
}

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
        /// The admitted dispatch; absent: the core's plan.
        dispatch: Option<Dispatch>,
    },
    /// The reserved attempt is about to be sent.
    Dispatched {
        /// Its admission (a policy with a fleet section).
        admission: Option<Admission>,
        /// When it is sent (run clock).
        started_at_ms: u64,
    },
    /// What the attempt did.
    Observed {
        /// The attempt.
        attempt: Attempt,
    },
    /// The core's decision.
    Decided,
    /// The run's end (a cancellation or a fleet stop, or after a terminal decision).
    Terminal {
        /// Set to cancel the run between attempts.
        cancelled_at_ms: Option<u64>,
        /// Set when the fleet refused the next dispatch.
        fleet_stop: Option<FleetStop>,
    },
}

impl Decode for Entry {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = kind_of(v, at)?;
        let (req, opt): (&[&'static str], &[&'static str]) = match kind {
            EventKind::Created => (&["created_at_epoch_ms", "kind", "run_id"], &[]),
            EventKind::Reserved => (&["kind"], &["dispatch"]),
            EventKind::Dispatched => (&["kind", "started_at_ms"], &["admission"]),
            EventKind::Observed => (&["attempt", "kind"], &[]),
            EventKind::Decided => (&["kind"], &[]),
            EventKind::Terminal => (&["kind"], &["cancelled_at_ms", "fleet_stop"]),
        };
        let r = Raw::read(v, at, req, opt)?;
        Ok(match kind {
            EventKind::Created => Entry::Created {
                created_at_epoch_ms: need(r.created_at_epoch_ms, at)?,
                run_id: need(r.run_id, at)?,
            },
            EventKind::Reserved => Entry::Reserved {
                dispatch: r.dispatch,
            },
            EventKind::Dispatched => Entry::Dispatched {
                admission: r.admission,
                started_at_ms: need(r.started_at_ms, at)?,
            },
            EventKind::Observed => Entry::Observed {
                attempt: need(r.attempt, at)?,
            },
            EventKind::Decided => Entry::Decided,
            EventKind::Terminal => Entry::Terminal {
                cancelled_at_ms: r.cancelled_at_ms,
                fleet_stop: r.fleet_stop,
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
    let r = verify(cp, events)?;
    Ok(built(cp, r, lease_generation, entry)?.0)
}

/// The next event of the journal `r` replays, and the replay advanced by
/// it; an error about the event is reported under `/entry`.
fn built(
    cp: &CompiledPolicy,
    r: Replayed,
    lease_generation: u64,
    entry: &Entry,
) -> Result<(JournalEvent, Replayed)> {
    let i = usize::try_from(r.len).unwrap_or(usize::MAX);
    let prefix = format!("/events/{i}");
    build(cp, r, i, lease_generation, entry).map_err(|mut e| {
        if let Some(p) = e.path.take() {
            e.path = Some(match p.strip_prefix(&prefix) {
                Some(rest) => format!("/entry{rest}"),
                None => p,
            });
        }
        e
    })
}

fn build(
    cp: &CompiledPolicy,
    r: Replayed,
    i: usize,
    lease_generation: u64,
    entry: &Entry,
) -> Result<(JournalEvent, Replayed)> {
    let no_plan = || plan_drift(i, "kind", "the run has no planned dispatch here");
    let payload = match entry {
        Entry::Created {
            created_at_epoch_ms,
            ..
        } => Payload::Created {
            created_at_epoch_ms: *created_at_epoch_ms,
            policy_sha256: Sha256Hex::computed(cp.policy_sha256.clone()),
        },
        Entry::Reserved { dispatch } => Payload::Reserved {
            dispatch: match (dispatch, r.run.next()) {
                (Some(d), _) => d.clone(),
                (None, Decision::Dispatch(d)) => d.clone(),
                (None, Decision::Terminal { .. }) => return Err(no_plan()),
            },
        },
        Entry::Dispatched {
            admission,
            started_at_ms,
        } => {
            let Expect::Reserved(d) = &r.expect else {
                return Err(Error::at(
                    ErrorCode::JournalOutOfOrder,
                    format!("/events/{i}/kind"),
                    "a `dispatched` event follows a `reserved` one",
                ));
            };
            Payload::Dispatched(Sent {
                admission: admission.clone(),
                idempotency_key_sha256: d.idempotency_key_sha256.clone(),
                not_before_ms: d.not_before_ms,
                ordinal: d.ordinal,
                route_id: d.route_id.clone(),
                route_release_sha256: d.route_release_sha256.clone(),
                started_at_ms: *started_at_ms,
            })
        }
        Entry::Observed { attempt } => Payload::Observed {
            attempt: attempt.clone(),
        },
        Entry::Decided => Payload::Decided {
            decision: r.run.next().clone(),
        },
        Entry::Terminal {
            cancelled_at_ms,
            fleet_stop,
        } => {
            let mut run = r.run.clone();
            let mut attempts = r.attempts.clone();
            if let Some(at) = cancelled_at_ms {
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
                terminal,
            })
        }
    };
    let run_id = match (entry, &r.run_id) {
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
        seq: r.len,
    };
    let mut check = r;
    check.step(cp, &event, i)?;
    Ok((event, check))
}

/// The journal of a run as its owner writes it: the replay of what it holds,
/// kept between appends and advanced by each event built, so that an append
/// checks the one new event (not the whole journal again, as [`append`]
/// does), and a recovery or a session continuing the run starts from the
/// replay rather than from the journal's events.
///
/// An event is built and the replay advanced before the host writes it; an
/// owner whose store refuses a write has lost its run (its lease or the
/// `seq`) and does not append through this writer again.
#[derive(Debug, Clone)]
pub struct Writer {
    cp: Arc<CompiledPolicy>,
    replayed: Replayed,
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
    /// ([`append`]), and advance the replay by it.
    pub fn append(&mut self, entry: &Entry) -> Result<JournalEvent> {
        let (event, next) = built(
            &self.cp,
            self.replayed.clone(),
            self.lease_generation,
            entry,
        )?;
        self.replayed = next;
        Ok(event)
    }

    /// What the owner does next ([`recover`] of the journal written so far).
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
    pub fn replayed(&self) -> &Replayed {
        &self.replayed
    }

    /// The lease generation it appends under.
    pub fn lease_generation(&self) -> u64 {
        self.lease_generation
    }
}

/// What an event offered for a journal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It extends the journal validly: append it.
    Append,
    /// The journal already holds exactly this event (a repeated write).
    Duplicate,
    /// Written by a fenced owner (a lower lease generation than the
    /// journal's), or for a seq already taken by another event: keep it as
    /// evidence; it never changes a decision.
    Evidence {
        /// `stale_lease` or `seq_taken`.
        reason: EvidenceReason,
    },
}

/// Why an offered event is evidence only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceReason {
    /// Its owner was fenced: a newer lease generation wrote since.
    StaleLease,
    /// Another event holds its seq.
    SeqTaken,
}

names!(EvidenceReason {
    StaleLease => "stale_lease",
    SeqTaken => "seq_taken",
});

/// `{"kind", "reason"?, "lease_generation", "seq"}`: the offer's class, the
/// journal's lease generation and the offered event's seq.
pub struct Classified {
    /// The class.
    pub offer: Offer,
    /// The journal's highest lease generation.
    pub lease_generation: u64,
    /// The offered event's seq.
    pub seq: u64,
}

impl Encode for Classified {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        let kind = match self.offer {
            Offer::Append => "append",
            Offer::Duplicate => "duplicate",
            Offer::Evidence { .. } => "evidence",
        };
        o.str("kind", kind)
            .u64("lease_generation", self.lease_generation);
        if let Offer::Evidence { reason } = self.offer {
            o.doc("reason", &reason);
        }
        o.u64("seq", self.seq).end();
    }
}

/// Classify an event offered for a verified journal (a late append of an
/// old owner, a retried write): append, duplicate, or evidence. An event of
/// another run or past the next free seq is an error.
pub fn classify_append(
    cp: &CompiledPolicy,
    events: &[JournalEvent],
    event: &JournalEvent,
) -> Result<Classified> {
    let r = verify(cp, events)?;
    if let Some(run) = &r.run_id {
        if &event.run_id != run {
            return Err(Error::at(
                ErrorCode::JournalWrongRun,
                "/event/run_id",
                format!("an event of run `{}` offered to `{run}`", event.run_id),
            ));
        }
    }
    let out = |offer| Classified {
        offer,
        lease_generation: r.lease_generation,
        seq: event.seq,
    };
    let held = usize::try_from(event.seq).ok().and_then(|s| events.get(s));
    if let Some(existing) = held {
        if existing == event {
            return Ok(out(Offer::Duplicate));
        }
        let reason = if event.lease_generation < r.lease_generation {
            EvidenceReason::StaleLease
        } else {
            EvidenceReason::SeqTaken
        };
        return Ok(out(Offer::Evidence { reason }));
    }
    if event.seq > r.len {
        return Err(Error::at(
            ErrorCode::JournalSeqGap,
            "/event/seq",
            format!("seq {} skips ahead of {}", event.seq, r.len),
        ));
    }
    if event.lease_generation < r.lease_generation {
        return Ok(out(Offer::Evidence {
            reason: EvidenceReason::StaleLease,
        }));
    }
    let mut check = r.clone();
    check.step(cp, event, events.len()).map_err(|mut e| {
        // The offered event is the input's `/event`.
        let i = events.len();
        if let Some(p) = e.path.take() {
            let prefix = format!("/events/{i}");
            e.path = Some(match p.strip_prefix(&prefix) {
                Some(rest) => format!("/event{rest}"),
                None => p.clone(),
            });
        }
        e
    })?;
    Ok(out(Offer::Append))
}
