//! The core's [`HedgeSession`]: a hedged run, event by event, JSON text in
//! and out (the Python `retryledger.hedge.HedgeSession` wraps it).

use pyo3::prelude::*;
use retryledger_core::hedge::HedgeSession;

use crate::{integer, lift, text};

/// A hedged run in progress.
#[pyclass(name = "HedgeSession", module = "retryledger._core")]
pub struct PyHedgeSession {
    inner: HedgeSession,
}

fn opt_integer(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<u64>> {
    match obj.filter(|o| !o.is_none()) {
        Some(o) => Ok(Some(integer(o, name)?)),
        None => Ok(None),
    }
}

#[pymethods]
impl PyHedgeSession {
    /// Start a hedged run of a policy (JSON text) with a hedge section.
    #[new]
    fn new(policy: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: lift(HedgeSession::start_json(&text(policy)?))?,
        })
    }

    /// What to do now, as JSON.
    fn next_json(&self) -> String {
        self.inner.next_json()
    }

    /// The planned lead or the hedge on offer went out at `started_at_ms`.
    fn start_attempt(
        &mut self,
        ordinal: &Bound<'_, PyAny>,
        started_at_ms: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let n = integer(ordinal, "ordinal")?;
        let at = integer(started_at_ms, "started_at_ms")?;
        lift(self.inner.start_attempt_json(n, at))
    }

    /// Attempt `ordinal` ended at `completed_at_ms` with these facts (JSON).
    #[pyo3(signature = (ordinal, completed_at_ms, cost, facts))]
    fn observe(
        &mut self,
        ordinal: &Bound<'_, PyAny>,
        completed_at_ms: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        facts: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let n = integer(ordinal, "ordinal")?;
        let at = integer(completed_at_ms, "completed_at_ms")?;
        let cost = opt_integer(cost, "cost")?;
        lift(self.inner.observe_json(n, at, cost, &text(facts)?))
    }

    /// Loser `ordinal` was cancelled at `at_ms`.
    fn cancelled(
        &mut self,
        ordinal: &Bound<'_, PyAny>,
        at_ms: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let n = integer(ordinal, "ordinal")?;
        let at = integer(at_ms, "at_ms")?;
        lift(self.inner.cancelled_json(n, at))
    }

    /// Admit the dispatch on offer under a fleet view (JSON).
    fn admit(
        &mut self,
        at_ms: &Bound<'_, PyAny>,
        now_epoch_ms: &Bound<'_, PyAny>,
        view: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let at = integer(at_ms, "at_ms")?;
        let now = integer(now_epoch_ms, "now_epoch_ms")?;
        lift(self.inner.admit_json(at, now, &text(view)?))
    }

    /// The caller cancelled the run between rounds at `at_ms`.
    fn cancel(&mut self, at_ms: &Bound<'_, PyAny>) -> PyResult<()> {
        let at = integer(at_ms, "at_ms")?;
        lift(self.inner.cancel(at))
    }

    /// The attempts of every resolved round, as JSON.
    fn attempts_json(&self) -> String {
        self.inner.attempts_json()
    }

    /// The receipt, as JSON.
    fn receipt_json(&self) -> PyResult<String> {
        lift(self.inner.receipt_json())
    }

    /// The sealed bundle, as JSON.
    fn bundle_json(&self) -> PyResult<String> {
        lift(self.inner.bundle_json())
    }
}
