//! Hedging: a bounded duplicate of the same logical request after a latency
//! threshold, one winner, every attempt accounted.
//!
//! A policy's `hedge` section says after how long without a result
//! (`delay_ms`) a duplicate goes out, how many may overlap one planned
//! attempt (`max_hedges`), which routes a hedge may use (idempotent ones
//! only), what share of the cost budget hedges may reserve, what a
//! cancelled loser is charged, and that the operation has no external
//! effects. [`crate::policy::compile`] rejects anything else before the
//! first dispatch.
//!
//! A hedged run is a sequence of rounds. Each round opens with the attempt
//! the ordinary plan gives (the lead). While no result of the round has
//! arrived, hedge k of the lead may start at `lead.started_at_ms + k *
//! delay_ms`, on the first hedge route with attempts left, if the total
//! attempts, the cost reservation (spent cost plus every reservation in
//! flight), the hedge share and the deadline allow it. Each hedge records
//! the ordinal it hedges (`hedge.hedges_ordinal`). The first success, the
//! first non-retryable or indeterminate outcome, or the first completion at
//! the deadline decides the round; the attempts still in flight are then
//! losers: cancelled (`hedge.loss` `cancelled`, charged as the policy says)
//! or answered after the commit (`late`: the outcome is kept and never
//! adopted). A round of retryable failures only is decided by the plan after
//! its last failure, as a single failure would be.
//!
//! Replay (`replay`) checks each round with the same rules: a second
//! commit, a hedge before its threshold, after a result or beyond a bound,
//! a loss mark that does not fit, a cancelled loser charged otherwise, each
//! has its own code. A live hedged run is a layer of the run machine
//! ([`crate::machine`]): it answers "dispatch", "await (and hedge at T
//! unless a result arrives first)", "cancel these" or the terminal, and
//! resolves each round by the replay's own rules. [`HedgeSession`], which
//! the hedge drivers hold, is a handle on that layer. This module keeps the
//! section, the marks and summaries the documents carry, and the rules.

mod round;

#[cfg(feature = "lab")]
pub use crate::machine::hedge_script as script;
pub use crate::machine::{HedgeAdmitted, HedgeObserved, HedgeSession, HedgeStep};

pub(crate) use round::{plan_hedge, replay, resolve_round};

use crate::attempt::Attempt;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Identifier;
use crate::limits::MAX_ROUTES;
use crate::outcome::Outcome;
use crate::policy::{CompiledPolicy, Policy};

/// Whether the hedged operation has effects outside the receiver's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effects {
    /// Only the reply: a duplicate has no visible effect before the winner commits.
    None,
    /// External effects (a write, a message, a payment): never hedged.
    External,
}

names!(Effects {
    None => "none",
    External => "external",
});

/// What a cancelled loser is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelledCost {
    /// Its route's worst-case `reserve_cost` (the receiver may have done the work).
    Reserve,
    /// Nothing.
    Zero,
}

names!(CancelledCost {
    Reserve => "reserve",
    Zero => "zero",
});

/// The policy's `hedge` section. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeSection {
    /// What a cancelled loser costs.
    pub cancelled_cost: CancelledCost,
    /// Percent (1..=100) of `max_total_cost` that hedges may reserve in all.
    pub cost_share_percent: u64,
    /// Time without a result before hedge k goes out: `k * delay_ms` after
    /// the lead's start, ms (at least 1).
    pub delay_ms: u64,
    /// Whether the operation has external effects (`none` to hedge).
    pub effects: Effects,
    /// Hedges that may overlap one lead attempt (at least 1).
    pub max_hedges: u64,
    /// Routes a hedge may use, in order of preference (each idempotent).
    pub routes: Vec<Identifier>,
}

object!(HedgeSection {
    cancelled_cost: doc,
    cost_share_percent: u64,
    delay_ms: u64,
    effects: doc,
    max_hedges: u64,
    routes: list(MAX_ROUTES),
});

impl HedgeSection {
    /// Check the section against its policy: every rule has its own code.
    pub(crate) fn check(&self, p: &Policy) -> Result<()> {
        let bad = |code, field: &str, msg: String| {
            let path = if field.is_empty() {
                "/hedge".to_owned()
            } else {
                format!("/hedge/{field}")
            };
            Err(Error::at(code, path, msg))
        };
        if self.effects == Effects::External {
            return bad(
                ErrorCode::HedgeExternalEffects,
                "effects",
                "an operation with external effects is never hedged: a duplicate could act twice"
                    .into(),
            );
        }
        if self.delay_ms == 0 || self.delay_ms >= p.deadline_ms {
            return bad(
                ErrorCode::InvalidHedge,
                "delay_ms",
                format!("delay_ms must be in 1..{} (the deadline)", p.deadline_ms),
            );
        }
        if self.max_hedges == 0 {
            return bad(
                ErrorCode::InvalidHedge,
                "max_hedges",
                "max_hedges must be at least 1".into(),
            );
        }
        if self.max_hedges >= p.max_total_attempts {
            return bad(
                ErrorCode::HedgeExceedsAttempts,
                "max_hedges",
                format!(
                    "{} hedges and their lead need more than max_total_attempts {}",
                    self.max_hedges, p.max_total_attempts
                ),
            );
        }
        if self.cost_share_percent == 0 || self.cost_share_percent > 100 {
            return bad(
                ErrorCode::InvalidHedge,
                "cost_share_percent",
                "cost_share_percent must be in 1..=100".into(),
            );
        }
        if self.routes.is_empty() {
            return bad(
                ErrorCode::InvalidHedge,
                "routes",
                "a hedge needs at least one route".into(),
            );
        }
        for (i, id) in self.routes.iter().enumerate() {
            if self.routes.iter().take(i).any(|o| o == id) {
                return bad(
                    ErrorCode::InvalidHedge,
                    &format!("routes/{i}"),
                    format!("route `{id}` is listed twice"),
                );
            }
            let Some(route) = p.routes.iter().find(|r| &r.route_id == id) else {
                return bad(
                    ErrorCode::InvalidHedge,
                    &format!("routes/{i}"),
                    format!("no route `{id}` in the policy"),
                );
            };
            if !route.supports_idempotency {
                return bad(
                    ErrorCode::HedgeRouteNotIdempotent,
                    &format!("routes/{i}"),
                    format!("route `{id}` does not honour the idempotency key: a hedge there could act twice"),
                );
            }
        }
        if p.stream.is_some() {
            return bad(
                ErrorCode::InvalidHedge,
                "",
                "a streamed request is not hedged: output of two attempts is never joined".into(),
            );
        }
        Ok(())
    }
}

/// How an attempt lost its round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Cancelled in flight when another attempt decided the round.
    Cancelled,
    /// Answered after the round was decided: kept, never adopted.
    Late,
}

names!(Loss {
    Cancelled => "cancelled",
    Late => "late",
});

/// An attempt's place in a hedged round. Fields in canonical order; absent
/// on a lead that did not lose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeMark {
    /// The ordinal of the lead this attempt hedges; absent on the lead.
    pub hedges_ordinal: Option<u64>,
    /// How the attempt lost its round; absent when it did not.
    pub loss: Option<Loss>,
}

impl crate::decode::Decode for HedgeMark {
    fn decode(v: &serde_json::Value, at: &crate::decode::At<'_>) -> Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let hedges_ordinal = f.opt("hedges_ordinal");
        let loss = f.opt("loss");
        f.end()?;
        Ok(Self {
            hedges_ordinal,
            loss,
        })
    }
}

impl Encode for HedgeMark {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .opt_u64("hedges_ordinal", self.hedges_ordinal)
            .opt_doc("loss", self.loss.as_ref())
            .end();
    }
}

/// One loser of a round, in the receipt. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loser {
    /// What it was charged.
    pub cost: u64,
    /// Its ordinal.
    pub ordinal: u64,
    /// `cancelled` or `late`.
    pub reason: Loss,
}

object!(Loser {
    cost: u64,
    ordinal: u64,
    reason: doc,
});

/// What hedging did to a run (in the receipt). Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HedgeSummary {
    /// Cost of every hedge attempt.
    pub hedge_cost: u64,
    /// Hedges dispatched.
    pub hedges: u64,
    /// Cost of every loser.
    pub loser_cost: u64,
    /// The attempts in flight when a round was decided, in ordinal order.
    pub losers: Vec<Loser>,
    /// The attempt whose success completed the run.
    pub winner_ordinal: Option<u64>,
}

object!(HedgeSummary {
    hedge_cost: u64,
    hedges: u64,
    loser_cost: u64,
    losers: list(crate::limits::MAX_ATTEMPTS),
    winner_ordinal: opt_u64,
});

pub(crate) fn section(cp: &CompiledPolicy) -> Result<&HedgeSection> {
    cp.policy.hedge.as_ref().ok_or_else(|| {
        Error::at(
            ErrorCode::InvalidHedge,
            "/hedge",
            "the policy has no hedge section",
        )
    })
}

pub(crate) fn priority_of(cp: &CompiledPolicy, route: &Identifier) -> usize {
    cp.routes().position(|r| &r.route_id == route).unwrap_or(0)
}

/// Whether an unmarked outcome decides its round.
pub(crate) fn decides(cp: &CompiledPolicy, a: &Attempt) -> bool {
    a.completed_at_ms >= cp.policy.deadline_ms || !matches!(a.outcome, Outcome::Retryable { .. })
}
