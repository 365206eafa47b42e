//! Hedged rounds in the journal: more than one attempt dispatched before
//! the first is observed.
//!
//! Under a policy with a hedge section a round is journaled as
//!
//! ```text
//! reserved, dispatched (the lead), (reserved, dispatched)* (its hedges),
//! observed* (each member, in the order its result or its cancellation came),
//! decided (once every member is observed)
//! ```
//!
//! Each hedge's `reserved` is checked against the hedge plan (the same
//! threshold, route, bounds and shares as [`crate::hedge`]), each
//! `observed` against the member dispatched with that ordinal, and the
//! round, once every member is observed, by the hedge replay's own rules
//! (one decider, losers marked and charged as the policy says).

use super::log::{at_event, plan_drift};
use crate::attempt::{Attempt, Attempts};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Dispatch, Run};
use crate::hedge::{decides, plan_hedge, resolve_round, HedgeMark, Loss};
use crate::journal::Sent;
use crate::policy::CompiledPolicy;

/// One member of an open round: its plan, what was sent, what was observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The plan it was reserved under.
    pub(crate) plan: Dispatch,
    /// What was sent; absent while only reserved.
    pub(crate) sent: Option<Sent>,
    /// Its observation, once written.
    pub(crate) attempt: Option<Attempt>,
}

/// A round whose members are not all observed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// The lead first, then its hedges, in ordinal order.
    pub(crate) members: Vec<Member>,
}

impl Round {
    /// The round a lead's `dispatched` opens.
    pub(super) fn open(plan: Dispatch, sent: Sent) -> Self {
        Self {
            members: vec![Member {
                plan,
                sent: Some(sent),
                attempt: None,
            }],
        }
    }

    /// The member reserved and not yet sent.
    pub(crate) fn pending(&self) -> Option<&Dispatch> {
        self.members
            .last()
            .filter(|m| m.sent.is_none())
            .map(|m| &m.plan)
    }

    /// The members sent and not yet observed.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(|m| m.sent.is_some() && m.attempt.is_none())
    }

    /// The hedge mark of member `ordinal` observed now: the lead it
    /// hedges, and `late` when the round was already decided.
    pub(crate) fn mark_of(&self, cp: &CompiledPolicy, ordinal: u64) -> Option<HedgeMark> {
        let lead = self.members.first().map(|m| m.plan.ordinal)?;
        let decided = self.members.iter().any(|m| {
            m.attempt.as_ref().is_some_and(|a| {
                a.hedge.as_ref().is_none_or(|h| h.loss.is_none()) && decides(cp, a)
            })
        });
        let hedges_ordinal = (ordinal != lead).then_some(lead);
        let loss = decided.then_some(Loss::Late);
        (hedges_ordinal.is_some() || loss.is_some()).then_some(HedgeMark {
            hedges_ordinal,
            loss,
        })
    }

    /// A hedge's `reserved`: the plan of the next hedge, while nothing of
    /// the round has been observed.
    pub(super) fn reserve(
        &self,
        cp: &CompiledPolicy,
        run: &Run,
        dispatch: &Dispatch,
        i: usize,
    ) -> Result<Self> {
        if self.pending().is_some() || self.members.iter().any(|m| m.attempt.is_some()) {
            return Err(Error::at(
                ErrorCode::HedgeAfterResult,
                format!("/events/{i}/kind"),
                "a hedge is reserved only while no result of its round is observed and none waits to be sent",
            ));
        }
        let plans: Vec<Dispatch> = self.members.iter().map(|m| m.plan.clone()).collect();
        let lead_start = self
            .members
            .first()
            .and_then(|m| m.sent.as_ref())
            .map_or(0, |s| s.started_at_ms);
        let reserved = plans
            .iter()
            .skip(1)
            .map(|d| d.reserve_cost)
            .fold(run.hedge_reserved(), u64::saturating_add);
        let plan = plan_hedge(cp, run, reserved, &plans, lead_start).map_err(|why| {
            Error::at(
                ErrorCode::HedgeOverBudget,
                format!("/events/{i}/dispatch"),
                why,
            )
        })?;
        if &plan != dispatch {
            return Err(plan_drift(
                i,
                "dispatch",
                "the reserved hedge is not the core's hedge plan",
            ));
        }
        let mut next = self.clone();
        next.members.push(Member {
            plan,
            sent: None,
            attempt: None,
        });
        Ok(next)
    }

    /// A hedge's `dispatched` (checked by the caller against its plan).
    pub(super) fn send(&self, sent: &Sent) -> Self {
        let mut next = self.clone();
        if let Some(m) = next.members.last_mut() {
            m.sent = Some(sent.clone());
        }
        next
    }

    /// A member's `observed`: the round with it recorded, and whether the
    /// round is now complete.
    pub(crate) fn observe(&self, a: &Attempt, i: usize) -> Result<(Self, bool)> {
        if self.pending().is_some() {
            return Err(Error::at(
                ErrorCode::JournalOutOfOrder,
                format!("/events/{i}/kind"),
                "a reserved hedge is dispatched before any result of its round is written",
            ));
        }
        let mut next = self.clone();
        let Some(m) = next
            .members
            .iter_mut()
            .find(|m| m.attempt.is_none() && m.plan.ordinal == a.ordinal)
        else {
            return Err(plan_drift(
                i,
                "attempt/ordinal",
                format!("ordinal {} is not in flight in its round", a.ordinal),
            ));
        };
        let Some(sent) = &m.sent else {
            return Err(plan_drift(
                i,
                "attempt/ordinal",
                "observed before it was sent",
            ));
        };
        let same = [
            ("admission", a.admission == sent.admission),
            (
                "idempotency_key_sha256",
                a.idempotency_key_sha256 == sent.idempotency_key_sha256,
            ),
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
        m.attempt = Some(a.clone());
        let complete = next.members.iter().all(|m| m.attempt.is_some());
        Ok((next, complete))
    }

    /// Resolve a complete round into `run` and `attempts` (on copies,
    /// committed when the round is accepted).
    pub(crate) fn resolve(
        &self,
        cp: &CompiledPolicy,
        run: &mut Run,
        attempts: &mut Attempts,
        i: usize,
    ) -> Result<()> {
        let list: Vec<Attempt> = self
            .members
            .iter()
            .filter_map(|m| m.attempt.clone())
            .collect();
        let base = attempts.attempts.len();
        let mut r = run.clone();
        let mut summary = r.hedge_summary().cloned().unwrap_or_default();
        resolve_round(cp, &mut r, &list, base, &mut summary)
            .map_err(|e| at_event(e, i, "/attempt"))?;
        *run = r;
        attempts.attempts.extend(list);
        Ok(())
    }
}

/// Where a verified journal of a hedged run stands, for the owner that
/// takes it over.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Position<'a> {
    /// Nothing written: open the run.
    Start,
    /// The next event is a `decided`.
    Decide,
    /// The next dispatch is planned; `reserved` when its `reserved` event
    /// is written (it was never sent).
    Plan {
        /// The lead is reserved and not dispatched.
        reserved: bool,
    },
    /// A round is open: these members were sent and are not observed.
    Round(&'a Round),
    /// The run's `terminal` is written.
    Done,
}

/// Where the journal `r` replays stands.
pub(crate) fn position(r: &super::Log) -> Result<Position<'_>> {
    use super::log::Expect;
    Ok(match &r.tip.expect {
        Expect::Start => Position::Start,
        Expect::FirstDecision | Expect::Observed => Position::Decide,
        Expect::Planned | Expect::Ended => Position::Plan { reserved: false },
        Expect::Reserved(_) => Position::Plan { reserved: true },
        Expect::Round(round) if round.pending().is_none() => Position::Round(round),
        Expect::Round(_) | Expect::Dispatched(..) => {
            return Err(Error::at(
                ErrorCode::JournalOutOfOrder,
                "/events",
                "a hedged journal ends with a hedge reserved and not dispatched: its owner writes both in one append",
            ))
        }
        Expect::Done => Position::Done,
    })
}
