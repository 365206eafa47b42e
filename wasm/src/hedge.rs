//! The core's [`HedgeSession`]: a hedged run, event by event, JSON text in
//! and out (the TypeScript `HedgeSession` in `ts/hedge.ts` wraps it).

use retryledger_core::hedge::HedgeSession;
use wasm_bindgen::prelude::*;

use crate::{lift, safe_integer, Out};

/// A hedged run in progress.
#[wasm_bindgen(js_name = HedgeSession)]
pub struct WasmHedgeSession {
    inner: HedgeSession,
}

#[wasm_bindgen(js_class = HedgeSession)]
impl WasmHedgeSession {
    /// Start a hedged run of a policy (JSON text) with a hedge section.
    pub fn start(policy: &str) -> Out<WasmHedgeSession> {
        Ok(Self {
            inner: lift(HedgeSession::start_json(policy))?,
        })
    }

    /// What to do now, as JSON.
    pub fn next_json(&self) -> String {
        self.inner.next_json()
    }

    /// The planned lead or the hedge on offer went out at `started_at_ms`.
    pub fn start_attempt(&mut self, ordinal: f64, started_at_ms: f64) -> Out<String> {
        let n = lift(safe_integer(ordinal, "ordinal"))?;
        let at = lift(safe_integer(started_at_ms, "started_at_ms"))?;
        lift(self.inner.start_attempt_json(n, at))
    }

    /// Attempt `ordinal` ended at `completed_at_ms` with these facts (JSON).
    pub fn observe(
        &mut self,
        ordinal: f64,
        completed_at_ms: f64,
        cost: Option<f64>,
        facts: &str,
    ) -> Out<String> {
        let n = lift(safe_integer(ordinal, "ordinal"))?;
        let at = lift(safe_integer(completed_at_ms, "completed_at_ms"))?;
        let cost = match cost {
            Some(c) => Some(lift(safe_integer(c, "cost"))?),
            None => None,
        };
        lift(self.inner.observe_json(n, at, cost, facts))
    }

    /// Loser `ordinal` was cancelled at `at_ms`.
    pub fn cancelled(&mut self, ordinal: f64, at_ms: f64) -> Out<String> {
        let n = lift(safe_integer(ordinal, "ordinal"))?;
        let at = lift(safe_integer(at_ms, "at_ms"))?;
        lift(self.inner.cancelled_json(n, at))
    }

    /// Admit the dispatch on offer under a fleet view (JSON).
    pub fn admit(&mut self, at_ms: f64, now_epoch_ms: f64, view: &str) -> Out<String> {
        let at = lift(safe_integer(at_ms, "at_ms"))?;
        let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
        lift(self.inner.admit_json(at, now, view))
    }

    /// The caller cancelled the run between rounds at `at_ms`.
    pub fn cancel(&mut self, at_ms: f64) -> Out<()> {
        let at = lift(safe_integer(at_ms, "at_ms"))?;
        lift(self.inner.cancel(at))
    }

    /// The attempts of every resolved round, as JSON.
    pub fn attempts_json(&self) -> String {
        self.inner.attempts_json()
    }

    /// The receipt, as JSON.
    pub fn receipt_json(&self) -> Out<String> {
        lift(self.inner.receipt_json())
    }

    /// The sealed bundle, as JSON.
    pub fn bundle_json(&self) -> Out<String> {
        lift(self.inner.bundle_json())
    }
}
