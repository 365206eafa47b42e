//! The machine's log replayed: a journal prefix checked event by event
//! against the run it records ([`Log`]), and [`verify`].
//!
//! The journal is the run machine's log of answered effects. Replaying it
//! rebuilds the run the machine was in (its attempts, its decisions, where
//! its protocol stands) and refuses every event the machine would not have
//! written, with a coded error; [`crate::machine::Machine::resume`] goes on
//! from that state, and the machine's writer ([`crate::journal::Writer`])
//! advances the same replay by each event it appends.

use super::round::Round;
use crate::attempt::{Attempt, Attempts};
use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Run, Terminal};
use crate::fleet::FleetSnapshots;
use crate::ids::{Identifier, Sha256Hex};
use crate::journal::{Ending, EventKind, JournalEvent, Payload, Sent, GENESIS_SHA256};
use crate::policy::CompiledPolicy;

/// What the replay expects next.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per replay, replaced in place at every event"
)]
pub(crate) enum Expect {
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
    /// A hedged round in flight: a hedge's `reserved` or `dispatched`, or
    /// a member's `observed` (`round`).
    Round(Box<Round>),
    /// After `terminal`: nothing.
    Done,
}

/// The machine's log replayed: the run a verified journal prefix records.
#[derive(Debug, Clone)]
pub struct Log {
    pub(crate) run: Run,
    pub(crate) attempts: Attempts,
    /// Each attempt's delta digests, as its `observed` event lists them.
    pub(crate) deltas: Vec<Vec<Sha256Hex>>,
    /// The fleet snapshots the `dispatched` events carry, each once.
    pub(crate) snapshots: FleetSnapshots,
    pub(crate) tip: Tip,
}

/// Where a replayed journal ends: what may come next, and what the next
/// event's `seq`, chain and lease are checked against. It holds nothing
/// that grows with the journal, so a batch of appends can put it back
/// ([`crate::journal::Writer::append_all`]).
#[derive(Debug, Clone)]
pub(crate) struct Tip {
    pub(crate) expect: Expect,
    pub(crate) run_id: Option<Identifier>,
    pub(crate) lease_generation: u64,
    /// The digest of the last event ([`GENESIS_SHA256`] when empty),
    /// computed once when the event is replayed.
    pub(crate) head_sha256: String,
    pub(crate) last_kind: Option<EventKind>,
    pub(crate) len: u64,
    pub(crate) created_at_epoch_ms: Option<u64>,
    pub(crate) receipt_sha256: Option<Sha256Hex>,
}

/// The error of an attempt check, moved from `/attempts/<k>` to the event's attempt.
pub(crate) fn at_event(mut e: Error, i: usize, inner: &str) -> Error {
    let path = e.path.take().unwrap_or_default();
    let rest = match path.strip_prefix("/attempts/") {
        Some(r) => r.find('/').map_or("", |k| r.get(k..).unwrap_or("")),
        None => path.as_str(),
    };
    e.path = Some(format!("/events/{i}{inner}{rest}"));
    e
}

pub(crate) fn plan_drift(i: usize, field: &str, msg: impl Into<String>) -> Error {
    Error::at(
        ErrorCode::JournalPlanDrift,
        format!("/events/{i}/{field}"),
        msg,
    )
}

impl Log {
    /// An empty journal.
    pub fn new(cp: &CompiledPolicy) -> Self {
        Self {
            run: Run::new(cp),
            attempts: Attempts::default(),
            deltas: Vec::new(),
            snapshots: FleetSnapshots::default(),
            tip: Tip {
                expect: Expect::Start,
                run_id: None,
                lease_generation: 0,
                head_sha256: GENESIS_SHA256.to_owned(),
                last_kind: None,
                len: 0,
                created_at_epoch_ms: None,
                receipt_sha256: None,
            },
        }
    }

    /// The next free `seq`.
    pub fn next_seq(&self) -> u64 {
        self.tip.len
    }

    /// The highest lease generation so far (0 when empty).
    pub fn lease_generation(&self) -> u64 {
        self.tip.lease_generation
    }

    /// The attempts the journal holds.
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The replayed run and its attempts, for a session that continues it.
    pub(crate) fn into_run(self) -> (Run, Attempts) {
        (self.run, self.attempts)
    }

    /// The fleet snapshots the journal's admissions named, each once: what
    /// a run continuing it seals with the bundle of its attempts so far.
    pub(crate) fn snapshots(&self) -> &FleetSnapshots {
        &self.snapshots
    }

    /// The stream action the replay took after each attempt (and a cancellation).
    pub(crate) fn stream_actions(&self) -> &[crate::stream::StreamAction] {
        self.run.stream_actions()
    }

    /// Each attempt's delta digests as its `observed` event lists them
    /// (empty when it lists none), for a streamed run's event log.
    pub(crate) fn delta_digests(&self) -> &[Vec<Sha256Hex>] {
        &self.deltas
    }

    /// The `prev_sha256` of the next event.
    pub fn head_sha256(&self) -> String {
        self.tip.head_sha256.clone()
    }

    /// The kind of the next event to append when nothing outside the core
    /// is needed to write it, or the choices a host has.
    pub(crate) fn next_kind(&self) -> Option<EventKind> {
        match self.tip.expect {
            Expect::Start => Some(EventKind::Created),
            Expect::FirstDecision | Expect::Observed => Some(EventKind::Decided),
            Expect::Planned => Some(EventKind::Reserved),
            Expect::Ended => Some(EventKind::Terminal),
            Expect::Reserved(_) => Some(EventKind::Dispatched),
            Expect::Dispatched(..) | Expect::Round(_) => Some(EventKind::Observed),
            Expect::Done => None,
        }
    }

    /// Check one event at index `i` against the replay and advance it.
    /// On error the replay is unchanged.
    pub fn apply(&mut self, cp: &CompiledPolicy, e: &JournalEvent, i: usize) -> Result<()> {
        self.step(cp, e, i)
    }

    /// Check one event at index `i` and advance the replay by it, in place:
    /// everything that can refuse the event is checked before anything
    /// changes, so on error the replay is unchanged. Its cost does not grow
    /// with the journal, except at the `terminal` event (once per run),
    /// which digests the attempts and the receipt.
    pub(crate) fn step(&mut self, cp: &CompiledPolicy, e: &JournalEvent, i: usize) -> Result<()> {
        let tip = &self.tip;
        if e.seq != tip.len {
            let (code, msg) = if e.seq < tip.len {
                (ErrorCode::JournalSeqRepeat, "is already taken")
            } else {
                (ErrorCode::JournalSeqGap, "skips ahead")
            };
            return Err(Error::at(
                code,
                format!("/events/{i}/seq"),
                format!("seq {} {msg}: the next free seq is {}", e.seq, tip.len),
            ));
        }
        if let Some(run) = &tip.run_id {
            if &e.run_id != run {
                return Err(Error::at(
                    ErrorCode::JournalWrongRun,
                    format!("/events/{i}/run_id"),
                    format!("an event of run `{}` in the journal of `{run}`", e.run_id),
                ));
            }
        }
        if e.prev_sha256.as_str() != tip.head_sha256 {
            return Err(Error::at(
                ErrorCode::JournalChainBroken,
                format!("/events/{i}/prev_sha256"),
                format!(
                    "prev_sha256 is not the digest of the event before it ({})",
                    tip.head_sha256
                ),
            ));
        }
        if e.lease_generation < tip.lease_generation {
            return Err(Error::at(
                ErrorCode::JournalStaleLease,
                format!("/events/{i}/lease_generation"),
                format!(
                    "lease generation {} after {}: the owner was fenced",
                    e.lease_generation, tip.lease_generation
                ),
            ));
        }
        let kind = e.payload.kind();
        let Self {
            run,
            attempts,
            deltas,
            snapshots,
            tip,
        } = self;
        let mut receipt_sha256 = None;
        let expect = match (&tip.expect, &e.payload) {
            (Expect::Done, _) => {
                return Err(Error::at(
                    ErrorCode::JournalAfterTerminal,
                    format!("/events/{i}/kind"),
                    "the run's terminal event was already written",
                ))
            }
            (Expect::Start, Payload::Created { policy_sha256, .. }) => {
                if policy_sha256.as_str() != cp.policy_sha256 {
                    return Err(Error::at(
                        ErrorCode::JournalPolicyMismatch,
                        format!("/events/{i}/policy_sha256"),
                        "the journal's run is under another policy",
                    ));
                }
                Expect::FirstDecision
            }
            (Expect::FirstDecision | Expect::Observed, Payload::Decided { decision }) => {
                if decision != run.next() {
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
            (
                Expect::Planned,
                Payload::Reserved {
                    cancelled_at_ms,
                    dispatch,
                },
            ) => {
                match cancelled_at_ms {
                    None => check_reserved(run, cp, dispatch, i)?,
                    Some(at) => {
                        let cancelled = cancel_then_reserve(run, cp, *at, dispatch, i)?;
                        *run = cancelled;
                        attempts.cancelled_at_ms = Some(*at);
                    }
                }
                Expect::Reserved(dispatch.clone())
            }
            (Expect::Reserved(planned), Payload::Dispatched(sent)) => {
                check_sent(cp, planned, sent, i)?;
                if cp.policy.hedge.is_some() {
                    Expect::Round(Box::new(Round::open(planned.clone(), sent.clone())))
                } else {
                    Expect::Dispatched(planned.clone(), sent.clone())
                }
            }
            (
                Expect::Round(round),
                Payload::Reserved {
                    dispatch,
                    cancelled_at_ms: None,
                },
            ) => Expect::Round(Box::new(round.reserve(cp, run, dispatch, i)?)),
            (Expect::Round(round), Payload::Dispatched(sent)) => {
                let Some(planned) = round.pending() else {
                    return Err(Error::at(
                        ErrorCode::JournalOutOfOrder,
                        format!("/events/{i}/kind"),
                        "a `dispatched` event follows a `reserved` one",
                    ));
                };
                check_sent(cp, planned, sent, i)?;
                Expect::Round(Box::new(round.send(sent)))
            }
            (
                Expect::Round(round),
                Payload::Observed {
                    attempt,
                    delta_digests,
                },
            ) => {
                if !delta_digests.is_empty() {
                    return Err(Error::at(
                        ErrorCode::StreamRecordUnexpected,
                        format!("/events/{i}/delta_digests"),
                        "a hedged attempt records no stream deltas",
                    ));
                }
                let (next, complete) = round.observe(attempt, i)?;
                if complete {
                    next.resolve(cp, run, attempts, i)?;
                    Expect::Observed
                } else {
                    Expect::Round(Box::new(next))
                }
            }
            (
                Expect::Dispatched(planned, sent),
                Payload::Observed {
                    attempt,
                    delta_digests,
                },
            ) => {
                check_deltas(attempt, delta_digests, i)?;
                observe(run, attempts, cp, planned, sent, attempt, i)?;
                deltas.push(delta_digests.clone());
                Expect::Observed
            }
            (
                ex @ (Expect::Planned | Expect::Reserved(_) | Expect::Ended),
                Payload::Terminal(end),
            ) => {
                receipt_sha256 = Some(end_run(run, attempts, snapshots, cp, ex, end, i)?);
                Expect::Done
            }
            _ => {
                return Err(Error::at(
                    ErrorCode::JournalOutOfOrder,
                    format!("/events/{i}/kind"),
                    format!("a `{}` event cannot come here", kind.as_str()),
                ))
            }
        };
        // Checked: nothing below can fail.
        match &e.payload {
            Payload::Dispatched(Sent {
                snapshots: Some(carried),
                ..
            })
            | Payload::Terminal(Ending {
                snapshots: Some(carried),
                ..
            }) => snapshots.keep_all(carried),
            _ => {}
        }
        if let Payload::Created {
            created_at_epoch_ms,
            ..
        } = &e.payload
        {
            tip.created_at_epoch_ms = Some(*created_at_epoch_ms);
            tip.run_id = Some(e.run_id.clone());
        }
        if receipt_sha256.is_some() {
            tip.receipt_sha256 = receipt_sha256;
        }
        tip.expect = expect;
        tip.lease_generation = e.lease_generation;
        tip.len = tip.len.saturating_add(1);
        tip.head_sha256 = digest_of(e);
        tip.last_kind = Some(kind);
        Ok(())
    }
}

/// A reservation under a cancellation: the run cancelled at `at` plans the
/// cancel of the async job it would leave running, and that is the
/// dispatch reserved. The cancelled run, checked (the run is unchanged).
fn cancel_then_reserve(
    run: &Run,
    cp: &CompiledPolicy,
    at: u64,
    dispatch: &Dispatch,
    i: usize,
) -> Result<Run> {
    let mut cancelled = run.clone();
    cancelled
        .cancel(at)
        .map_err(|e| at_event(e, i, "/cancelled_at_ms"))?;
    let is_cancel = dispatch
        .job
        .as_ref()
        .is_some_and(|s| s.kind == crate::job::JobKind::Cancel);
    if !is_cancel {
        return Err(plan_drift(
            i,
            "cancelled_at_ms",
            "a cancellation is journaled with a reservation only when it plans the cancel of a job left running",
        ));
    }
    check_reserved(&cancelled, cp, dispatch, i)?;
    Ok(cancelled)
}

/// A reservation is the plan, or (a fleet's breaker skipped routes) the
/// plan moved on by skips.
fn check_reserved(run: &Run, cp: &CompiledPolicy, dispatch: &Dispatch, i: usize) -> Result<()> {
    let Decision::Dispatch(mut plan) = run.next().clone() else {
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
        match skips.then(|| run.skip_route(cp, &plan)).flatten() {
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

/// An `observed` event's delta digests are those its attempt's stream
/// record hashes: as many as its events, and their list digest its
/// `deltas_sha256`. An attempt without a stream lists none.
fn check_deltas(a: &Attempt, digests: &[Sha256Hex], i: usize) -> Result<()> {
    if digests.is_empty() {
        return Ok(());
    }
    let Some(s) = &a.stream else {
        return Err(Error::at(
            ErrorCode::StreamRecordUnexpected,
            format!("/events/{i}/delta_digests"),
            "delta digests for an attempt that records no stream",
        ));
    };
    let count = u64::try_from(digests.len()).unwrap_or(u64::MAX);
    if count != s.events || crate::stream::digest_list(digests) != s.deltas_sha256 {
        return Err(Error::at(
            ErrorCode::StreamDeltasMismatch,
            format!("/events/{i}/delta_digests"),
            format!(
                "{count} delta digests that do not hash to the attempt's {} recorded deltas",
                s.events
            ),
        ));
    }
    Ok(())
}

/// Check the observed attempt against the one dispatched and the run's
/// plan, then advance the run by it. `Run::check` changes nothing and
/// `Run::observe` refuses only before it changes anything, so on error the
/// run and the attempts are unchanged.
fn observe(
    run: &mut Run,
    attempts: &mut Attempts,
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
    let index = attempts.attempts.len();
    let d = run
        .check(cp, a, index)
        .map_err(|e| at_event(e, i, "/attempt"))?;
    if &d != planned {
        return Err(plan_drift(
            i,
            "attempt",
            "the observed attempt's admission implies another plan than the one reserved",
        ));
    }
    run.observe(cp, a, d, index)
        .map_err(|e| at_event(e, i, "/attempt"))?;
    attempts.attempts.push(a.clone());
    Ok(())
}

/// Check the `terminal` event's end of the run and give its receipt
/// digest; a cancellation or a fleet stop ends the run and its attempts
/// (on copies, committed once everything is checked: once per run).
#[allow(clippy::too_many_arguments)]
fn end_run(
    run: &mut Run,
    attempts: &mut Attempts,
    kept: &FleetSnapshots,
    cp: &CompiledPolicy,
    expect: &Expect,
    end: &Ending,
    i: usize,
) -> Result<Sha256Hex> {
    let ended: Option<(Run, Attempts)> = match (expect, end.cancelled_at_ms, &end.fleet_stop) {
        (_, Some(_), Some(_)) => {
            return Err(plan_drift(
                i,
                "fleet_stop",
                "a run ends by cancellation or by a fleet stop, not both",
            ))
        }
        (Expect::Planned | Expect::Reserved(_), Some(at), None) => {
            let mut r = run.clone();
            r.cancel(at)
                .map_err(|e| at_event(e, i, "/cancelled_at_ms"))?;
            let mut a = attempts.clone();
            a.cancelled_at_ms = Some(at);
            Some((r, a))
        }
        (Expect::Planned, None, Some(stop)) => {
            let mut r = run.clone();
            r.fleet_stop(cp, stop)
                .map_err(|e| at_event(e, i, "/fleet_stop"))?;
            let mut a = attempts.clone();
            a.fleet_stop = Some(stop.clone());
            Some((r, a))
        }
        (Expect::Ended, None, None) => None,
        // A cancellation the journal already holds (a job's cancel was
        // reserved under it).
        (Expect::Ended, Some(at), None) if attempts.cancelled_at_ms == Some(at) => None,
        _ => {
            return Err(Error::at(
                ErrorCode::JournalOutOfOrder,
                format!("/events/{i}/kind"),
                "a run that may still dispatch ends only by cancellation (before the dispatch) or a fleet stop (before the reservation)",
            ))
        }
    };
    let (r, a) = ended.as_ref().map_or((&*run, &*attempts), |(r, a)| (r, a));
    crate::fleet::check_stop_carried(cp, a, kept, end.snapshots.as_ref(), &format!("/events/{i}"))?;
    let Some(terminal) = r.terminal() else {
        return Err(plan_drift(i, "terminal", "the run has not ended"));
    };
    if terminal != end.terminal {
        return Err(plan_drift(
            i,
            "terminal",
            format!("the run ended with {}", terminal.as_str()),
        ));
    }
    let attempts_sha256 = digest_of(a);
    if end.attempts_sha256.as_str() != attempts_sha256 {
        return Err(plan_drift(
            i,
            "attempts_sha256",
            "not the digest of the journal's attempts",
        ));
    }
    let receipt = r.receipt(cp, attempts_sha256)?;
    let receipt_sha256 = digest_of(&receipt);
    if end.receipt_sha256.as_str() != receipt_sha256 {
        return Err(plan_drift(
            i,
            "receipt_sha256",
            "not the digest of the journal's receipt",
        ));
    }
    if let Some((r, a)) = ended {
        *run = r;
        *attempts = a;
    }
    Ok(Sha256Hex::computed(receipt_sha256))
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
    let admitted = match (&cp.policy.fleet, &s.admission) {
        // A job's polls and its cancel are not admitted.
        (Some(_), None) if !crate::job::admitted_step(planned) => Ok(()),
        (Some(_), Some(_)) if !crate::job::admitted_step(planned) => Err(Error::at(
            ErrorCode::AdmissionUnexpected,
            format!("/events/{i}/admission"),
            "a job's poll or cancel is not admitted by the fleet",
        )),
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
    };
    admitted?;
    crate::fleet::check_carried(
        cp,
        s.admission.as_ref(),
        &planned.route_release_sha256,
        s.snapshots.as_ref(),
        &format!("/events/{i}"),
    )
}

/// Verify a journal against a compiled policy: the replay of every event.
pub fn verify(cp: &CompiledPolicy, events: &[JournalEvent]) -> Result<Log> {
    let mut r = Log::new(cp);
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

impl Log {
    /// The summary of the replay.
    pub fn summary(&self) -> Verified {
        Verified {
            attempts: u64::try_from(self.attempts.attempts.len()).unwrap_or(u64::MAX),
            created_at_epoch_ms: self.tip.created_at_epoch_ms,
            head_sha256: self.head_sha256(),
            last_kind: self.tip.last_kind,
            lease_generation: self.tip.lease_generation,
            next_seq: self.tip.len,
            run_id: self.tip.run_id.clone(),
            terminal: matches!(self.tip.expect, Expect::Done)
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
