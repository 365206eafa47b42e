//! [`HedgeSession`]: the hedge drivers' handle on the machine's hedge layer,
//! its JSON-text boundary for the bindings, and the scripted session the
//! `hedge_session` vectors pin.
//!
//! A hedge driver answers each step itself (it sends, observes and cancels
//! on its own clock) rather than through the machine's effects; the handle
//! moves the layer by the same transitions the machine's events do, so there
//! is one hedged run state, not two.

use std::sync::Arc;

use super::{HedgeAdmitted, HedgeStep, Layer};
use crate::attempt::Attempts;
use crate::breaker::BreakerSnapshot;
#[cfg(feature = "lab")]
use crate::canonical::digest_of;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::error::Result;
#[cfg(feature = "lab")]
use crate::error::{Error, ErrorCode};
use crate::fleet::FleetView;
use crate::observe::{Facts, Judgement};
use crate::policy::CompiledPolicy;
use crate::receipt::{Bundle, Receipt};

/// A hedged run in progress, driven by a host event by event: a handle on
/// the run machine's hedge layer.
#[derive(Debug, Clone)]
pub struct HedgeSession {
    layer: Layer,
}

impl HedgeSession {
    /// Admit a logical request under a policy with a hedge section.
    pub fn start(policy: Arc<CompiledPolicy>) -> Result<Self> {
        Ok(Self {
            layer: Layer::new(policy, super::super::DEFAULT_MAX_POLLS)?,
        })
    }

    /// The compiled policy.
    pub fn policy(&self) -> &CompiledPolicy {
        self.layer.policy()
    }

    /// The attempts of every resolved round.
    pub fn attempts(&self) -> &Attempts {
        self.layer.attempts()
    }

    /// What to do now.
    pub fn next(&self) -> HedgeStep {
        self.layer.next()
    }

    /// The host dispatched the planned lead or hedge `ordinal` at
    /// `started_at_ms`. A start before the plan's `not_before_ms`, a hedge
    /// after a result of its round or one the plan does not offer is an error
    /// and changes nothing.
    pub fn start_attempt(&mut self, ordinal: u64, started_at_ms: u64) -> Result<HedgeStep> {
        self.layer.start_attempt(ordinal, started_at_ms)
    }

    /// The host observed attempt `ordinal` end at `completed_at_ms`: the
    /// core judges the facts and charges `cost` (the reservation when the
    /// host charged nothing). The first deciding result decides the round; a
    /// result after that is a late loser, kept and never adopted.
    pub fn observe(
        &mut self,
        ordinal: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
    ) -> Result<(Judgement, HedgeStep)> {
        self.layer.observe(ordinal, completed_at_ms, cost, facts)
    }

    /// The host cancelled loser `ordinal` at `at_ms`, after the round was
    /// decided; it is charged as the policy's `cancelled_cost` says.
    pub fn cancelled(&mut self, ordinal: u64, at_ms: u64) -> Result<HedgeStep> {
        self.layer.cancelled(ordinal, at_ms)
    }

    /// Mark the run cancelled between rounds at `at_ms` (run clock).
    pub fn cancel(&mut self, at_ms: u64) -> Result<()> {
        self.layer.cancel(at_ms)
    }

    /// Admit the next dispatch (the lead, or the hedge on offer) under the
    /// fleet view a host read at `now_epoch_ms` (wall clock), `at_ms` on the
    /// run clock. A lead deposits into the retry budget when it is the first
    /// attempt and withdraws otherwise; a hedge withdraws. A refused lead
    /// ends the run (`stop_retry_budget`, `stop_store_unavailable`); a
    /// refused hedge is not dispatched and the round takes no more hedges.
    /// A policy with a breaker or admission limits is refused
    /// (`invalid_hedge`): only the run machine settles members on them.
    pub fn admit(
        &mut self,
        at_ms: u64,
        now_epoch_ms: u64,
        view: &FleetView,
    ) -> Result<HedgeAdmitted> {
        self.layer.admit(at_ms, now_epoch_ms, view)
    }

    /// The next snapshot of attempt `ordinal`'s breaker after its outcome,
    /// from the snapshot a host reads now (`now_epoch_ms`, wall clock): a
    /// lead, a hedge and a cancelled loser each count on their route.
    pub fn breaker_after(
        &self,
        ordinal: u64,
        snapshot: &BreakerSnapshot,
        now_epoch_ms: u64,
    ) -> Result<BreakerSnapshot> {
        self.layer.breaker_after(ordinal, snapshot, now_epoch_ms)
    }

    /// The receipt of the finished run; an error while it could still dispatch.
    pub fn receipt(&self) -> Result<Receipt> {
        self.layer.receipt()
    }

    /// The bundle of the finished run: policy, attempts and receipt.
    pub fn seal(&self) -> Result<Bundle> {
        self.layer.seal()
    }
}

/// Run a scripted hedged session, as the `hedge_session` vectors pin it.
///
/// Each step of `script` is one event a host saw, at its run-clock time:
/// `{"start": ordinal, "at"}` (the lead or the hedge on offer went out),
/// `{"observe": ordinal, "at", "facts", "cost"?}` (its result arrived),
/// `{"cancelled": ordinal, "at"}` (a loser was cancelled) or
/// `{"cancel_run": at}` (the caller cancelled between rounds). The answer:
/// the first step (`next`), each step's answer (`step`, and `judgement` for
/// an observation), the attempts, the receipt, the sealed bundle's digest
/// and its replay's verdict. The first error is the answer instead.
#[cfg(feature = "lab")]
pub fn script(policy_json: &str, script_json: &str) -> Result<serde_json::Value> {
    use crate::canonical::to_value;
    use serde_json::{json, Value};
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let mut session = HedgeSession::start(policy)?;
    let steps: Value = crate::decode::parse_strict(script_json)?;
    let bad = |msg: &str| Error::at(ErrorCode::InvalidValue, "/script", msg.to_owned());
    let first = to_value(&session.next());
    let mut answers = Vec::new();
    for step in steps.as_array().ok_or_else(|| bad("a script is a list"))? {
        let num = |k: &str| step.get(k).and_then(Value::as_u64);
        let at = num("at").unwrap_or(0);
        if let Some(n) = num("start") {
            answers.push(json!({"step": to_value(&session.start_attempt(n, at)?)}));
        } else if let Some(n) = num("observe") {
            let facts: Facts = match step.get("facts") {
                Some(f) => crate::decode::from_value(f.clone())?,
                None => return Err(bad("an observation carries facts")),
            };
            let (judgement, next) = session.observe(n, at, num("cost"), &facts)?;
            answers.push(json!({"judgement": to_value(&judgement), "step": to_value(&next)}));
        } else if let Some(n) = num("cancelled") {
            answers.push(json!({"step": to_value(&session.cancelled(n, at)?)}));
        } else if let Some(at) = num("cancel_run") {
            session.cancel(at)?;
            answers.push(json!({"step": to_value(&session.next())}));
        } else {
            return Err(bad("a step is start, observe, cancelled or cancel_run"));
        }
    }
    let bundle = session.seal()?;
    let verdict = crate::receipt::verify_bundle(&bundle)?;
    Ok(json!({
        "attempts": to_value(&bundle.attempts),
        "bundle_sha256": digest_of(&bundle),
        "next": first,
        "receipt": to_value(&bundle.receipt),
        "steps": answers,
        "verdict": to_value(&verdict),
    }))
}

/// An observation's answer: the judgement and what to do now
/// (`{"judgement", "step"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeObserved {
    /// How the core judged the facts.
    pub judgement: Judgement,
    /// What to do now.
    pub step: HedgeStep,
}

impl Encode for HedgeObserved {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("judgement", &self.judgement)
            .doc("step", &self.step)
            .end();
    }
}

/// The JSON-text boundary of a [`HedgeSession`], for the bindings: every
/// answer is canonical JSON, every error the core's.
impl HedgeSession {
    /// Start a hedged run of a policy given as JSON text.
    pub fn start_json(policy_json: &str) -> Result<Self> {
        Self::start(Arc::new(crate::api::compile_policy(policy_json)?))
    }

    /// [`HedgeSession::next`] as JSON.
    pub fn next_json(&self) -> String {
        crate::canonical::canonical_json(&self.next())
    }

    /// [`HedgeSession::start_attempt`], the step as JSON.
    pub fn start_attempt_json(&mut self, ordinal: u64, started_at_ms: u64) -> Result<String> {
        Ok(crate::canonical::canonical_json(
            &self.start_attempt(ordinal, started_at_ms)?,
        ))
    }

    /// [`HedgeSession::observe`] with the facts as JSON text:
    /// `{"judgement", "step"}` as JSON.
    pub fn observe_json(
        &mut self,
        ordinal: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts_json: &str,
    ) -> Result<String> {
        let facts: Facts = crate::decode::from_str(facts_json)?;
        let (judgement, step) = self.observe(ordinal, completed_at_ms, cost, &facts)?;
        Ok(crate::canonical::canonical_json(&HedgeObserved {
            judgement,
            step,
        }))
    }

    /// [`HedgeSession::cancelled`], the step as JSON.
    pub fn cancelled_json(&mut self, ordinal: u64, at_ms: u64) -> Result<String> {
        Ok(crate::canonical::canonical_json(
            &self.cancelled(ordinal, at_ms)?,
        ))
    }

    /// [`HedgeSession::admit`] with the view as JSON text: `{"step", "writes"}` as JSON.
    pub fn admit_json(&mut self, at_ms: u64, now_epoch_ms: u64, view_json: &str) -> Result<String> {
        let view: FleetView = crate::decode::from_str(view_json)?;
        Ok(crate::canonical::canonical_json(&self.admit(
            at_ms,
            now_epoch_ms,
            &view,
        )?))
    }

    /// The attempts so far as JSON.
    pub fn attempts_json(&self) -> String {
        crate::canonical::canonical_json(self.attempts())
    }

    /// The receipt as JSON.
    pub fn receipt_json(&self) -> Result<String> {
        Ok(crate::canonical::canonical_json(&self.receipt()?))
    }

    /// The sealed bundle as JSON.
    pub fn bundle_json(&self) -> Result<String> {
        Ok(crate::canonical::canonical_json(&self.seal()?))
    }
}
