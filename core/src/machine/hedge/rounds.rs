//! The round state of the hedge layer and its transitions: which attempt
//! is on offer (the lead, or the hedge due), what a start, an observation or
//! a loser's cancellation does to the open round, and how a decided round is
//! resolved into the run by the hedge rules ([`crate::hedge`]'s `plan_hedge`
//! and `resolve_round`). The machine's events and the hedge drivers'
//! [`super::HedgeSession`] both move the layer by these transitions alone.

use crate::attempt::{Attempt, Attempts, AttemptsSchema};
use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch, Run, Terminal};
use crate::fleet::{Admission, FleetSnapshots, Generations};
use crate::hedge::{
    decides, plan_hedge, resolve_round, section, CancelledCost, HedgeMark, HedgeSummary, Loss,
};
use crate::observe::{judge_at, Facts, Judgement};
use crate::outcome::{IndeterminateKind, Outcome};
use crate::policy::CompiledPolicy;
use crate::receipt::{Bundle, Receipt};

use std::sync::Arc;

use super::{Layer, Stage};

/// What a host does next in a hedged run: the open round seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a step is answered once per event and passed by reference"
)]
pub enum HedgeStep {
    /// Dispatch the round's lead no earlier than its `not_before_ms`.
    Dispatch(Dispatch),
    /// Wait for a result of the attempts in flight; when `hedge` is set,
    /// dispatch it at its `not_before_ms` unless a result arrives first.
    Await {
        /// The next hedge, when one is allowed.
        hedge: Option<Dispatch>,
        /// Ordinals in flight.
        in_flight: Vec<u64>,
    },
    /// The round is decided: cancel these attempts and report each.
    Cancel {
        /// The attempt that decided the round.
        decided_by: u64,
        /// Ordinals to cancel.
        ordinals: Vec<u64>,
    },
    /// The run is over.
    Terminal {
        /// How it ended.
        terminal: Terminal,
    },
}

impl Encode for HedgeStep {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Dispatch(d) => {
                o.doc("dispatch", d).str("kind", "dispatch");
            }
            Self::Await { hedge, in_flight } => {
                o.opt_doc("hedge", hedge.as_ref())
                    .list(
                        "in_flight",
                        &in_flight.iter().map(|n| U(*n)).collect::<Vec<_>>(),
                    )
                    .str("kind", "await");
            }
            Self::Cancel {
                decided_by,
                ordinals,
            } => {
                o.u64("decided_by", *decided_by).str("kind", "cancel").list(
                    "ordinals",
                    &ordinals.iter().map(|n| U(*n)).collect::<Vec<_>>(),
                );
            }
            Self::Terminal { terminal } => {
                o.str("kind", "terminal").doc("terminal", terminal);
            }
        }
        o.end();
    }
}

/// An integer as a list item.
struct U(u64);

impl Encode for U {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.u64(self.0);
    }
}

/// One attempt of the open round.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) plan: Dispatch,
    pub(super) started_at_ms: u64,
    pub(super) admission: Option<Admission>,
    pub(super) attempt: Option<Attempt>,
}

/// The round in flight.
#[derive(Debug, Clone, Default)]
pub(super) struct Round {
    pub(super) members: Vec<Member>,
    /// A result arrived (or the fleet refused a hedge): no more hedges.
    pub(super) closed: bool,
    /// The fleet refused a hedge of this round.
    pub(super) refused: bool,
    /// The ordinal that decided the round and when.
    pub(super) decided: Option<(u64, u64)>,
}

impl Layer {
    /// A hedged run of `policy` with nothing dispatched yet, asking the
    /// receiver at most `max_polls` times about a member in doubt.
    pub(super) fn new(policy: Arc<CompiledPolicy>, max_polls: u64) -> Result<Self> {
        section(&policy)?;
        let mut run = Run::new(&policy);
        run.set_hedge(HedgeSummary::default());
        Ok(Self {
            policy,
            attempts: Attempts {
                attempts: Vec::new(),
                cancelled_at_ms: None,
                fleet_stop: None,
                schema: AttemptsSchema,
            },
            run,
            summary: HedgeSummary::default(),
            round: None,
            admitted: None,
            lead: None,
            queued_since: None,
            snapshots: FleetSnapshots::default(),
            seen: Generations::default(),
            stage: Stage::Plan,
            judgement: None,
            observed: None,
            in_doubt: Vec::new(),
            reserved: false,
            max_polls,
            planned_nb: None,
            settle: (Vec::new(), None),
        })
    }

    /// The compiled policy.
    pub(super) fn policy(&self) -> &CompiledPolicy {
        &self.policy
    }

    /// The attempts of every resolved round.
    pub(super) fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// Attempt `ordinal` as recorded once observed or cancelled: in the
    /// round in flight or in a resolved one.
    pub(super) fn attempt(&self, ordinal: u64) -> Option<&Attempt> {
        self.round
            .as_ref()
            .and_then(|r| r.members.iter().find(|m| m.plan.ordinal == ordinal))
            .and_then(|m| m.attempt.as_ref())
            .or_else(|| self.attempts.attempts.iter().find(|a| a.ordinal == ordinal))
    }

    fn next_hedge(&self, round: &Round) -> Option<Dispatch> {
        if round.closed || round.decided.is_some() {
            return None;
        }
        let lead = round.members.first()?;
        let plans: Vec<Dispatch> = round.members.iter().map(|m| m.plan.clone()).collect();
        plan_hedge(
            &self.policy,
            &self.run,
            reserved_with(&self.run, &plans),
            &plans,
            lead.started_at_ms,
        )
        .ok()
    }

    /// What to do now.
    pub(super) fn next(&self) -> HedgeStep {
        let Some(round) = &self.round else {
            if let (Some(l), Decision::Dispatch(_)) = (&self.lead, self.run.next()) {
                return HedgeStep::Dispatch(l.clone());
            }
            return match self.run.next() {
                Decision::Dispatch(d) => HedgeStep::Dispatch(d.clone()),
                Decision::Terminal { terminal } => HedgeStep::Terminal {
                    terminal: *terminal,
                },
            };
        };
        let in_flight: Vec<u64> = round
            .members
            .iter()
            .filter(|m| m.attempt.is_none())
            .map(|m| m.plan.ordinal)
            .collect();
        match round.decided {
            Some((by, _)) => HedgeStep::Cancel {
                decided_by: by,
                ordinals: in_flight,
            },
            None => HedgeStep::Await {
                hedge: self.next_hedge(round),
                in_flight,
            },
        }
    }

    /// The host dispatched the planned lead or hedge `ordinal` at
    /// `started_at_ms`. A start before the plan's `not_before_ms`, a hedge
    /// after a result of its round or one the plan does not offer is an error
    /// and changes nothing.
    pub(super) fn start_attempt(&mut self, ordinal: u64, started_at_ms: u64) -> Result<HedgeStep> {
        let index = self.attempts.attempts.len();
        let (plan, is_hedge) = match &self.round {
            None => match self.run.next() {
                Decision::Dispatch(d) => (self.lead.clone().unwrap_or_else(|| d.clone()), false),
                Decision::Terminal { terminal } => {
                    return Err(Error::new(
                        ErrorCode::AttemptAfterTerminal,
                        format!("the run has already ended with {}", terminal.as_str()),
                    ))
                }
            },
            Some(round) => {
                let k = round.members.len();
                if round.refused && round.decided.is_none() {
                    return Err(Error::attempt(
                        ErrorCode::HedgeOverBudget,
                        index.saturating_add(k),
                        "hedge",
                        "the fleet refused this round's hedge",
                    ));
                }
                if round.closed || round.decided.is_some() {
                    return Err(Error::attempt(
                        ErrorCode::HedgeAfterResult,
                        index.saturating_add(k),
                        "started_at_ms",
                        "a result of the round has arrived: no hedge now",
                    ));
                }
                let plans: Vec<Dispatch> = round.members.iter().map(|m| m.plan.clone()).collect();
                let lead_start = round.members.first().map_or(0, |m| m.started_at_ms);
                let plan = plan_hedge(
                    &self.policy,
                    &self.run,
                    reserved_with(&self.run, &plans),
                    &plans,
                    lead_start,
                )
                .map_err(|why| {
                    Error::attempt(
                        ErrorCode::HedgeOverBudget,
                        index.saturating_add(k),
                        "hedge",
                        why,
                    )
                })?;
                (plan, true)
            }
        };
        let at = index.saturating_add(self.round.as_ref().map_or(0, |r| r.members.len()));
        if plan.ordinal != ordinal {
            return Err(Error::attempt(
                ErrorCode::OrdinalDrift,
                at,
                "ordinal",
                format!("planned ordinal {}, started {ordinal}", plan.ordinal),
            ));
        }
        if started_at_ms < plan.not_before_ms {
            let code = if is_hedge {
                ErrorCode::HedgeBeforeThreshold
            } else {
                ErrorCode::EarlyStart
            };
            return Err(Error::attempt(
                code,
                at,
                "started_at_ms",
                format!("started at {started_at_ms} before {}", plan.not_before_ms),
            ));
        }
        let admission = match (&self.policy.policy.fleet, self.admitted.take()) {
            (None, _) => None,
            (Some(_), Some((n, adm))) if n == ordinal => Some(adm),
            (Some(_), other) => {
                self.admitted = other;
                return Err(Error::attempt(
                    ErrorCode::AdmissionMissing,
                    at,
                    "admission",
                    "the policy has a fleet section: admit the attempt before dispatching it",
                ));
            }
        };
        let member = Member {
            plan,
            started_at_ms,
            admission,
            attempt: None,
        };
        self.round
            .get_or_insert_with(Round::default)
            .members
            .push(member);
        if !is_hedge {
            self.lead = None;
            self.queued_since = None;
        }
        Ok(self.next())
    }

    pub(super) fn member(&self, ordinal: u64) -> Result<(usize, &Member)> {
        let index = self.attempts.attempts.len();
        self.round
            .as_ref()
            .and_then(|r| {
                r.members
                    .iter()
                    .enumerate()
                    .find(|(_, m)| m.plan.ordinal == ordinal && m.attempt.is_none())
            })
            .map(|(k, m)| (index.saturating_add(k), m))
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::OrdinalDrift,
                    format!("ordinal {ordinal} is not in flight"),
                )
            })
    }

    fn attempt_of(
        &self,
        m: &Member,
        completed_at_ms: u64,
        cost: u64,
        outcome: Outcome,
        loss: Option<Loss>,
    ) -> Attempt {
        let lead = self
            .round
            .as_ref()
            .and_then(|r| r.members.first())
            .map_or(0, |l| l.plan.ordinal);
        let hedges_ordinal = (m.plan.ordinal != lead).then_some(lead);
        let mark = (hedges_ordinal.is_some() || loss.is_some()).then_some(HedgeMark {
            hedges_ordinal,
            loss,
        });
        Attempt {
            admission: m.admission.clone(),
            hedge: mark,
            ..m.plan
                .attempt(m.started_at_ms, completed_at_ms, cost, outcome)
        }
    }

    /// The host observed attempt `ordinal` end at `completed_at_ms`: the
    /// core judges the facts and charges `cost` (the reservation when the
    /// host charged nothing). The first deciding result decides the round; a
    /// result after that is a late loser, kept and never adopted.
    pub(super) fn observe(
        &mut self,
        ordinal: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
    ) -> Result<(Judgement, HedgeStep)> {
        let (i, m) = self.member(ordinal)?;
        if completed_at_ms < m.started_at_ms {
            return Err(Error::attempt(
                ErrorCode::CompletedBeforeStarted,
                i,
                "completed_at_ms",
                format!(
                    "completed at {completed_at_ms} before start {}",
                    m.started_at_ms
                ),
            ));
        }
        let family = self
            .policy
            .policy
            .routes
            .iter()
            .find(|r| r.route_id == m.plan.route_id)
            .and_then(|r| r.provider_family);
        let judged = Facts {
            provider_family: family.or(facts.provider_family),
            ..facts.clone()
        };
        let judgement = judge_at(&judged, completed_at_ms >= self.policy.policy.deadline_ms)?;
        let decided = self.round.as_ref().and_then(|r| r.decided);
        if let Some((_, c)) = decided {
            if completed_at_ms < c {
                return Err(Error::attempt(
                    ErrorCode::HedgeLossDrift,
                    i,
                    "completed_at_ms",
                    format!("a late result at {completed_at_ms}, before the commit at {c}"),
                ));
            }
        }
        let loss = decided.map(|_| Loss::Late);
        let attempt = self.attempt_of(
            m,
            completed_at_ms,
            cost.unwrap_or(m.plan.reserve_cost),
            judgement.outcome,
            loss,
        );
        let decides_now = loss.is_none() && decides(&self.policy, &attempt);
        self.settle(
            ordinal,
            attempt,
            decides_now.then_some((ordinal, completed_at_ms)),
        )?;
        Ok((judgement, self.next()))
    }

    /// The host cancelled loser `ordinal` at `at_ms`, after the round was
    /// decided; it is charged as the policy's `cancelled_cost` says.
    pub(super) fn cancelled(&mut self, ordinal: u64, at_ms: u64) -> Result<HedgeStep> {
        let h = section(&self.policy)?;
        let (i, m) = self.member(ordinal)?;
        let Some((_, c)) = self.round.as_ref().and_then(|r| r.decided) else {
            return Err(Error::attempt(
                ErrorCode::HedgeLossDrift,
                i,
                "hedge/loss",
                "only an attempt in flight when its round is decided is cancelled",
            ));
        };
        if at_ms < c || at_ms < m.started_at_ms {
            return Err(Error::attempt(
                ErrorCode::HedgeLossDrift,
                i,
                "completed_at_ms",
                format!("cancelled at {at_ms}, before the commit at {c} or the start"),
            ));
        }
        let cost = match h.cancelled_cost {
            CancelledCost::Reserve => m.plan.reserve_cost,
            CancelledCost::Zero => 0,
        };
        let outcome = Outcome::Indeterminate {
            kind: IndeterminateKind::UnknownProviderAcceptance,
        };
        let attempt = self.attempt_of(m, at_ms, cost, outcome, Some(Loss::Cancelled));
        self.settle(ordinal, attempt, None)?;
        Ok(self.next())
    }

    pub(super) fn settle(
        &mut self,
        ordinal: u64,
        attempt: Attempt,
        decides: Option<(u64, u64)>,
    ) -> Result<()> {
        let Some(round) = self.round.as_mut() else {
            return Err(Error::new(ErrorCode::OrdinalDrift, "no round is in flight"));
        };
        // A hedge admitted and not started is not started now: its admission goes.
        self.admitted = None;
        let mut next = round.clone();
        if let Some(m) = next.members.iter_mut().find(|m| m.plan.ordinal == ordinal) {
            m.attempt = Some(attempt);
        }
        next.closed = true;
        if next.decided.is_none() {
            next.decided = decides;
        }
        if next.members.iter().all(|m| m.attempt.is_some()) {
            let list: Vec<Attempt> = next
                .members
                .iter()
                .filter_map(|m| m.attempt.clone())
                .collect();
            let base = self.attempts.attempts.len();
            let mut run = self.run.clone();
            let mut summary = self.summary.clone();
            resolve_round(&self.policy, &mut run, &list, base, &mut summary)?;
            self.run = run;
            self.summary = summary;
            self.attempts.attempts.extend(list);
            self.round = None;
        } else {
            *round = next;
        }
        Ok(())
    }

    /// Mark the run cancelled between rounds at `at_ms` (run clock).
    pub(super) fn cancel(&mut self, at_ms: u64) -> Result<()> {
        if self.round.is_some() {
            return Err(Error::at(
                ErrorCode::CancelDrift,
                "/cancelled_at_ms",
                "attempts are in flight: cancel them (their round decides) before the run",
            ));
        }
        self.run.cancel(at_ms)?;
        self.attempts.cancelled_at_ms = Some(at_ms);
        self.lead = None;
        Ok(())
    }

    /// The receipt of the finished run; an error while it could still dispatch.
    pub(super) fn receipt(&self) -> Result<Receipt> {
        if self.round.is_some() {
            return Err(Error::new(
                ErrorCode::RunNotTerminal,
                "a round is in flight",
            ));
        }
        self.run.receipt(&self.policy, digest_of(&self.attempts))
    }

    /// The bundle of the finished run: policy, attempts and receipt.
    pub(in crate::machine) fn seal(&self) -> Result<Bundle> {
        let receipt = self.receipt()?;
        let mut bundle = Bundle::new(self.policy.policy.clone(), self.attempts.clone(), receipt);
        if self.policy.policy.fleet.is_some() {
            bundle.fleet_snapshots = Some(self.snapshots.clone());
        }
        Ok(bundle)
    }
}

/// What the hedges of the run reserved, with those of the open round.
fn reserved_with(run: &Run, plans: &[Dispatch]) -> u64 {
    plans
        .iter()
        .skip(1)
        .map(|d| d.reserve_cost)
        .fold(run.hedge_reserved(), u64::saturating_add)
}
