//! A run in progress, advanced one observed attempt at a time.
//!
//! Hosts (the TypeScript and Python drivers) hold a [`Session`]: it keeps the
//! compiled policy, the attempts so far and the replay state, so recording an
//! attempt costs one step of the state machine rather than a replay of the
//! whole run. The attempt is built from the planned dispatch, so the host only
//! reports what it observed (times, cost, outcome) and cannot drift the route,
//! ordinals, digests or jitter sample. Every decision is the one
//! [`crate::plan_next()`] and [`crate::evaluate()`] give for the same attempts.

use std::sync::Arc;

use crate::attempt::{Attempt, Attempts, AttemptsSchema};
use crate::canonical::digest_of;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Run};
use crate::fleet::{Admission, FleetSnapshots, FleetWrites, Generations};
use crate::ids::{Identifier, Sha256Hex};
use crate::observe::{Facts, Judgement};
use crate::outcome::Outcome;
use crate::policy::CompiledPolicy;
use crate::price::{check_schedule, cost as price_cost, PriceSchedule, Units};
use crate::receipt::{Bundle, Receipt};
use crate::stream::{EventLog, StreamAction, StreamEvents, StreamFacts};

mod fleet;
mod resume;
mod stream;

pub(crate) use fleet::breaker_step;

/// A run in progress.
#[derive(Debug, Clone)]
pub struct Session {
    policy: Arc<CompiledPolicy>,
    policy_sha256: Sha256Hex,
    attempts: Attempts,
    run: Run,
    log: EventLog,
    pending: Option<Pending>,
    snapshots: FleetSnapshots,
    /// The generation of every snapshot read, per key (release or scope).
    seen: Generations,
    /// The price schedule usage is charged under, with its digest.
    schedule: Option<(Arc<PriceSchedule>, Sha256Hex)>,
    /// What the host reported of the attempt in flight besides its facts.
    notes: Notes,
    /// When the planned attempt first asked the admission limits, Unix ms.
    queued_since: Option<u64>,
}

/// Reports about the attempt in flight, kept until it is recorded.
#[derive(Debug, Clone, Default)]
struct Notes {
    usage: Option<Units>,
    /// The HTTP status the attempt in flight answered with: a 401 or 403 to
    /// a pool key refuses the key ([`crate::keypool`]).
    status: Option<u64>,
    request_body_sha256: Option<Sha256Hex>,
    /// The failed output check that decided the attempt in flight.
    output_check: Option<crate::output::OutputCheckRecord>,
    /// The job id digest and status the host reported (an async job).
    job: Option<(Option<Sha256Hex>, Option<crate::job::JobStatus>)>,
    /// The receiver's answer when the host reconciled the attempt by
    /// idempotency key (an async job's lost submit answer).
    reconciled: Option<crate::attempt::Reconciled>,
    /// The requested and served model the host reported.
    model: Option<crate::attempt::ModelRecord>,
}

/// What a host said an attempt cost: charged by hand, or nothing (the
/// reservation, unless usage prices it).
#[derive(Debug, Clone, Copy)]
enum Charge {
    Charged(u64),
    Reserved(u64),
}

/// An admission waiting for its attempt's observation.
#[derive(Debug, Clone)]
struct Pending {
    admission: Admission,
    decision: Decision,
}

/// The answer of [`Session::admit`]: the decision (the dispatch on the route
/// admitted, or the fleet's terminal) and the snapshots to write back; or,
/// when the admission limits' in-flight cap is full or a retry is short of a
/// budget that waits, when to ask again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// What to do.
    pub decision: Decision,
    /// Snapshots that changed; write each with compare-and-set.
    pub writes: FleetWrites,
    /// Nothing admitted yet: admit again at this wall clock, Unix ms (the
    /// decision is the plan, not yet admitted, and nothing is written).
    pub wait_until_epoch_ms: Option<u64>,
}

/// `{"decision": …, "wait_until_epoch_ms"?: …, "writes": …}`.
impl crate::canonical::Encode for Admitted {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        crate::canonical::ObjectWriter::new(sink)
            .doc("decision", &self.decision)
            .opt_u64("wait_until_epoch_ms", self.wait_until_epoch_ms)
            .doc("writes", &self.writes)
            .end();
    }
}

impl Session {
    /// Admit a logical request: no attempt yet, the first dispatch planned.
    pub fn start(policy: Arc<CompiledPolicy>) -> Self {
        let run = Run::new(&policy);
        let attempts = Attempts {
            attempts: Vec::new(),
            cancelled_at_ms: None,
            fleet_stop: None,
            schema: AttemptsSchema,
        };
        Self {
            policy_sha256: Sha256Hex::computed(policy.policy_sha256.clone()),
            policy,
            attempts,
            run,
            log: EventLog::default(),
            pending: None,
            snapshots: FleetSnapshots::default(),
            seen: Generations::default(),
            schedule: None,
            notes: Notes::default(),
            queued_since: None,
        }
    }

    /// Price the run's usage with `schedule`, checked against the policy
    /// (the same cost unit, every route's release priced). Only before the
    /// first attempt; the receipt then binds the schedule's digest and the
    /// bundle carries it.
    pub fn set_price_schedule(&mut self, schedule: Arc<PriceSchedule>) -> Result<()> {
        if !self.attempts.attempts.is_empty() {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/price_schedule",
                "a price schedule is set before the first attempt",
            ));
        }
        check_schedule(&self.policy.policy, &schedule)?;
        let digest = Sha256Hex::computed(digest_of(schedule.as_ref()));
        self.schedule = Some((schedule, digest));
        Ok(())
    }

    /// The run's price schedule, when it has one.
    pub fn price_schedule(&self) -> Option<&PriceSchedule> {
        self.schedule.as_ref().map(|(s, _)| s.as_ref())
    }

    /// The digest of the run's price schedule, when it has one.
    pub fn price_schedule_sha256(&self) -> Option<&Sha256Hex> {
        self.schedule.as_ref().map(|(_, d)| d)
    }

    /// Report usage of the attempt in flight (units by kind; several reports
    /// add up). The attempt then records its raw usage and costs what the
    /// run's price schedule charges for it, so it must not also be charged
    /// by hand (`charge_with_usage` at record time). Checked at once: a run
    /// without a schedule is `price_schedule_missing_release`, a kind the
    /// release does not price `usage_unpriced`, an overflow
    /// `arithmetic_overflow`; the report is then not kept.
    pub fn add_usage(&mut self, usage: &Units) -> Result<u64> {
        let Decision::Dispatch(d) = self.next() else {
            return Err(Error::at(
                ErrorCode::AttemptAfterTerminal,
                "/usage",
                "no attempt is in flight: the run has reached a terminal",
            ));
        };
        let Some((schedule, _)) = &self.schedule else {
            return Err(Error::at(
                ErrorCode::PriceScheduleMissingRelease,
                "/price_schedule",
                "the run has no price schedule to price usage with",
            ));
        };
        let total = match &self.notes.usage {
            Some(u) => u.plus(usage)?,
            None => usage.clone(),
        };
        let priced = price_cost(schedule, &d.route_release_sha256, &total)?;
        self.notes.usage = Some(total);
        Ok(priced)
    }

    /// Report what the attempt in flight was of an async job: the
    /// provider's job id (the id a submit was answered with, or the id a
    /// poll asked about; the core keeps only its SHA-256) and the job status
    /// the answer reported. A poll that reports no id polled the planned job.
    pub fn set_job(&mut self, id: Option<&str>, status: Option<crate::job::JobStatus>) {
        self.notes.job = Some((id.map(crate::job::job_id_digest), status));
    }

    /// Report that the host reconciled the attempt in flight by idempotency
    /// key (an async job's submit whose answer was lost: docs/JOBS.md): the
    /// receiver's answer, in the journal's vocabulary, becomes the attempt's
    /// outcome (`succeeded` an acceptance, with the job id reported by
    /// [`Session::set_job`]; `failed_no_effect` permits another submit;
    /// `unknown` stays indeterminate), whatever the facts say.
    pub fn set_reconciled(&mut self, answer: crate::attempt::Reconciled) {
        self.notes.reconciled = Some(answer);
    }

    /// Report the digest of the request body sent on the attempt in flight
    /// (after lowering to its route). Every later attempt on the same route
    /// must send the same body (replay: `request_body_drift`).
    pub fn set_request_body_sha256(&mut self, digest: Sha256Hex) {
        self.notes.request_body_sha256 = Some(digest);
    }

    /// Report the model the attempt in flight asked for (`requested`: the
    /// lowered request's model) and the one the provider's response named
    /// (`served`). A side the host does not know stays `None`: recorded as
    /// unknown, never invented. Both `None` records nothing.
    pub fn set_model(&mut self, requested: Option<Identifier>, served: Option<Identifier>) {
        self.notes.model = (requested.is_some() || served.is_some())
            .then_some(crate::attempt::ModelRecord { requested, served });
    }

    /// The admission held for the planned attempt (a fleet admitted it and
    /// it is not yet observed).
    pub fn admission(&self) -> Option<&Admission> {
        self.pending.as_ref().map(|p| &p.admission)
    }

    /// Drop what the host reported of the attempt in flight (usage, body,
    /// job, reconciliation) when its observation was refused.
    pub(crate) fn clear_notes(&mut self) {
        self.notes = Notes::default();
    }

    /// The compiled policy.
    pub fn policy(&self) -> &CompiledPolicy {
        &self.policy
    }

    /// The attempts observed so far.
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The next decision: the planned dispatch (after an admission, on the
    /// route it admitted), or the terminal.
    pub fn next(&self) -> &Decision {
        match &self.pending {
            Some(p) => &p.decision,
            None => self.run.next(),
        }
    }

    /// Record what the planned attempt did. Drift (an early start, a
    /// completion before the start, an attempt after the terminal) is an
    /// error and leaves the session unchanged. A streamed run records its
    /// attempts with [`Session::observe_stream`].
    pub fn record(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: u64,
        outcome: Outcome,
    ) -> Result<&Decision> {
        self.push(
            started_at_ms,
            completed_at_ms,
            Charge::Charged(cost),
            outcome,
            None,
            false,
        )?;
        Ok(self.run.next())
    }

    fn push(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Charge,
        outcome: Outcome,
        stream: Option<(Option<&StreamFacts>, Vec<crate::stream::Digest>, u64)>,
        injected: bool,
    ) -> Result<StreamAction> {
        let index = self.attempts.attempts.len();
        let Decision::Dispatch(d) = self.next() else {
            return Err(Error::attempt(
                ErrorCode::AttemptAfterTerminal,
                index,
                "ordinal",
                "the run has already reached a terminal",
            ));
        };
        let admission = match (&self.policy.policy.fleet, &self.pending) {
            (None, _) => None,
            // A job's polls and its cancel are not admitted.
            (Some(_), _) if !crate::job::admitted_step(d) => None,
            (Some(_), Some(p)) => Some(p.admission.clone()),
            (Some(_), None) => {
                return Err(Error::attempt(
                    ErrorCode::AdmissionMissing,
                    index,
                    "admission",
                    "the policy has a fleet section: admit the attempt before dispatching it",
                ))
            }
        };
        let (record, deltas) = match stream {
            Some((facts, deltas, bytes)) => (
                Some(crate::stream::record_of(
                    facts,
                    &deltas,
                    bytes,
                    d.continuation.as_ref(),
                )),
                deltas,
            ),
            None => (None, Vec::new()),
        };
        let cost = match (&self.notes.usage, &self.schedule, cost) {
            (None, _, Charge::Charged(c) | Charge::Reserved(c)) => c,
            (Some(_), _, Charge::Charged(_)) => return Err(Error::attempt(
                ErrorCode::ChargeWithUsage,
                index,
                "cost",
                "the attempt reported usage and was charged by hand: its cost is one or the other",
            )),
            (Some(u), Some((schedule, _)), Charge::Reserved(_)) => {
                price_cost(schedule, &d.route_release_sha256, u)
                    .map_err(|e| Error::attempt(e.code, index, "usage", e.message))?
            }
            (Some(_), None, Charge::Reserved(_)) => {
                return Err(Error::attempt(
                    ErrorCode::PriceScheduleMissingRelease,
                    index,
                    "usage",
                    "the run has no price schedule to price usage with",
                ))
            }
        };
        // A reconciled attempt's outcome is the one its answer stands for.
        let outcome = self.notes.reconciled.map_or(outcome, |r| r.outcome());
        let keyed = admission.as_ref().is_some_and(|a| a.key.is_some());
        let key_refused = (keyed && matches!(outcome, Outcome::NonRetryable { .. }))
            .then(|| {
                let status = self.notes.status.and_then(|s| u16::try_from(s).ok());
                crate::keypool::KeyRefusal::of_status(status)
            })
            .flatten();
        let attempt = Attempt {
            admission,
            key_refused,
            injected_fault: injected.then_some(true),
            job: d
                .job
                .as_ref()
                .map(|step| crate::job::record_of(step, self.notes.job.clone())),
            output_check: self.notes.output_check.clone(),
            reconciled: self.notes.reconciled,
            request_body_sha256: self.notes.request_body_sha256.clone(),
            model: self.notes.model.clone(),
            stream: record,
            usage: self.notes.usage.clone(),
            ..d.attempt(started_at_ms, completed_at_ms, cost, outcome)
        };
        let planned = self.run.check(&self.policy, &attempt, index)?;
        // `observe` fails only before it changes anything (a cost overflow).
        self.run.observe(&self.policy, &attempt, planned, index)?;
        let action = self.run.last_action();
        if let Some(contract) = &self.policy.policy.stream {
            let listed = attempt.stream.as_ref().map(|r| &r.deltas_sha256);
            self.log
                .append(contract.mode, attempt.ordinal, deltas, listed, action);
        }
        self.attempts.attempts.push(attempt);
        self.pending = None;
        self.notes = Notes::default();
        self.queued_since = None;
        Ok(action)
    }

    /// Record the planned attempt from what the host observed: the core
    /// judges the [`Facts`] ([`crate::observe`]), charges `cost` (the
    /// planned `reserve_cost` when the host charged nothing) and records the
    /// attempt. The judgement says which rule decided, so a host can report
    /// an unrecognized error. Drift leaves the session unchanged.
    pub fn observe(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
    ) -> Result<Judgement> {
        self.observe_stream::<&str>(started_at_ms, completed_at_ms, cost, facts, &[])
    }
    /// Mark the run cancelled between attempts at `at_ms` (run clock).
    pub fn cancel(&mut self, at_ms: u64) -> Result<()> {
        self.run.cancel(at_ms)?;
        self.pending = None;
        self.queued_since = None;
        self.attempts.cancelled_at_ms = Some(at_ms);
        let ordinal = self.attempts.attempts.last().map_or(0, |a| a.ordinal);
        self.log.close(ordinal, self.run.last_action());
        Ok(())
    }

    /// The receipt of the finished run; an error while it could still dispatch.
    pub fn receipt(&self) -> Result<Receipt> {
        self.bind(self.run.receipt(&self.policy, digest_of(&self.attempts)))
    }

    fn bind(&self, receipt: Result<Receipt>) -> Result<Receipt> {
        let mut receipt = receipt?;
        receipt.price_schedule_sha256 = self.price_schedule_sha256().cloned();
        Ok(receipt)
    }

    /// The receipt, for a host whose platform hashes natively (Node's
    /// OpenSSL is several times faster than SHA-256 in WebAssembly): the
    /// host hashes the canonical attempts text this session gives
    /// ([`crate::canonical::canonical_json`] of [`Session::attempts`]) and
    /// passes the lowercase hex digest. Only the hash primitive moves; what
    /// is hashed and everything else in the receipt stay the core's. A
    /// malformed digest is `invalid_digest`.
    pub fn receipt_with_attempts_sha256(&self, attempts_sha256: &str) -> Result<Receipt> {
        let hex = crate::ids::Sha256Hex::parse(attempts_sha256)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/attempts_sha256", m))?;
        self.bind(self.run.receipt(&self.policy, hex.as_str().to_owned()))
    }

    /// [`Session::receipt_with_attempts_sha256`] encoded into `sink` (the
    /// same encoding events, so the same canonical bytes), straight from the
    /// session: no owned receipt is built. Errors as that method's, and then
    /// nothing is encoded.
    pub fn encode_receipt_with_attempts_sha256(
        &self,
        attempts_sha256: &str,
        sink: &mut dyn crate::canonical::Sink,
    ) -> Result<()> {
        let hex = crate::ids::Sha256Hex::parse(attempts_sha256)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/attempts_sha256", m))?;
        self.run
            .encode_receipt(&self.policy, &hex, self.price_schedule_sha256(), sink)
    }

    /// The bundle of the finished run: policy, attempts and receipt.
    pub fn seal(&self) -> Result<Bundle> {
        let receipt = self.receipt()?;
        let mut bundle = Bundle::new(self.policy.policy.clone(), self.attempts.clone(), receipt);
        if self.policy.policy.stream.is_some() {
            bundle.stream_events = Some(StreamEvents(self.stream_events()));
        }
        if self.policy.policy.fleet.is_some() {
            bundle.fleet_snapshots = Some(self.snapshots.clone());
        }
        bundle.price_schedule = self.schedule.as_ref().map(|(s, _)| s.as_ref().clone());
        Ok(bundle)
    }
}

#[cfg(all(test, feature = "lab"))]
mod tests;
