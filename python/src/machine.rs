//! A live run machine ([`api::LiveMachine`]): the host loop asks for the
//! outstanding effect and answers it with an event, JSON text both ways
//! (docs/HOST_LOOP.md). Nothing is decided here.

use pyo3::prelude::*;
use retryledger_core::api;

use std::sync::Arc;

use crate::{lift, text, Compiled};

/// A policy as its JSON text, or compiled once (`Compiled`) for many runs.
fn started(
    policy: &Bound<'_, PyAny>,
    text_of: impl FnOnce(&str) -> retryledger_core::Result<api::LiveMachine>,
    compiled: impl FnOnce(
        Arc<retryledger_core::CompiledPolicy>,
    ) -> retryledger_core::Result<api::LiveMachine>,
) -> PyResult<PyMachine> {
    let inner = match policy.cast::<Compiled>() {
        Ok(c) => lift(compiled(Arc::clone(&c.get().inner)))?,
        Err(_) => lift(text_of(&text(policy)?))?,
    };
    Ok(PyMachine { inner })
}

/// One run of the core's machine, driven by the package's host loop.
#[pyclass(name = "Machine", module = "retryledger._core")]
pub(crate) struct PyMachine {
    inner: api::LiveMachine,
}

#[pymethods]
impl PyMachine {
    /// Start a run of `policy` (JSON text or `Compiled`) under `options` (JSON text).
    #[staticmethod]
    fn start(policy: &Bound<'_, PyAny>, options: &Bound<'_, PyAny>) -> PyResult<Self> {
        let options = text(options)?;
        started(
            policy,
            |p| api::LiveMachine::start(p, &options),
            |cp| api::LiveMachine::start_compiled(cp, &options),
        )
    }

    /// Take over the run `journal` (a JSON array of events) holds.
    #[staticmethod]
    fn resume(
        policy: &Bound<'_, PyAny>,
        options: &Bound<'_, PyAny>,
        journal: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let options = text(options)?;
        let journal = text(journal)?;
        started(
            policy,
            |p| api::LiveMachine::resume(p, &options, &journal),
            |cp| api::LiveMachine::resume_compiled(cp, &options, &journal),
        )
    }

    /// The outstanding effect as JSON.
    fn next(&self) -> String {
        self.inner.next_json()
    }

    /// Whether the run is over.
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// Answer the outstanding effect with an event (JSON): the next effect.
    fn answer(&mut self, event: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(self.inner.answer_json(&text(event)?))
    }

    /// The last attempt and its judgement as JSON, once one is recorded.
    fn observed(&self) -> Option<String> {
        self.inner.observed_json()
    }

    /// The attempt planned next as JSON, when one is (what a wait is for).
    fn planned(&self) -> Option<String> {
        self.inner.planned_json()
    }

    /// The run clock as last read, ms.
    #[getter]
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    /// The sealed bundle as JSON.
    fn seal(&self) -> PyResult<String> {
        lift(self.inner.seal_json())
    }

    /// The sealed run, `{"bundle", "receipt_sha256"}`, as JSON.
    fn sealed(&self) -> PyResult<String> {
        lift(self.inner.sealed_json())
    }
}
