//! A live run machine ([`api::LiveMachine`]): the host loop asks for the
//! outstanding effect and answers it with an event, JSON text both ways
//! (docs/HOST_LOOP.md). Nothing is decided here.

use pyo3::exceptions::PyException;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};
use retryledger_core::api;
use retryledger_core::machine::{Effect, Event, Observation};

use std::sync::Arc;

use crate::drive::whole;
use crate::{integer, lift, text, Compiled, PyDispatch, PyFacts, PySession};

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

    /// The sync pump's fast path (docs/HOST_LOOP.md): the machine's sleeps
    /// and plain dispatches carried out in this thread, each attempt's
    /// observation answered with no JSON when its facts were decoded
    /// beforehand (an `AttemptError`'s, or a returned answer) and it
    /// reported nothing else; otherwise the adapter's `observation` gives
    /// the event's fields. `(True, value)` once the machine is done (`value`
    /// what the last attempt returned), `(False, None)` when another
    /// effect is outstanding: the generator pump goes on from it. The
    /// adapter's `step_for(plan, started_at_ms)` makes each attempt's step
    /// and `last_error` is set to what an attempt raised.
    #[allow(clippy::too_many_arguments)]
    fn pump_plain<'py>(
        &mut self,
        py: Python<'py>,
        adapter: &Bound<'py, PyAny>,
        dispatch: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
        t0: &Bound<'py, PyAny>,
        sleep: &Bound<'py, PyAny>,
        attempt_error: &Bound<'py, PyType>,
    ) -> PyResult<(bool, Py<PyAny>)> {
        let mut last = 0u64;
        // The run clock's reading as the clock gave it, less `t0`, and as
        // the core's integer ms (never lower than a reading before it).
        let read = |last: &mut u64| -> PyResult<(u64, Bound<'py, PyAny>)> {
            let reading = clock.call0()?.sub(t0)?;
            let t = if reading.lt(0)? {
                0
            } else {
                whole(&reading, "now_ms")?
            };
            *last = (*last).max(t);
            Ok((*last, reading))
        };
        let now = |last: &mut u64| -> PyResult<u64> { read(last).map(|(t, _)| t) };
        let mut value: Py<PyAny> = py.None();
        loop {
            let effect = self.inner.machine().next();
            match effect {
                Effect::Done { .. } => return Ok((true, value)),
                Effect::Sleep { until_ms } => {
                    let until = *until_ms;
                    let (mut t, mut reading) = read(&mut last)?;
                    while t < until {
                        // `until - (clock() - t0)` as Python computes it: an
                        // int clock sleeps ints, a float clock floats.
                        sleep.call1((until.into_pyobject(py)?.sub(&reading)?,))?;
                        (t, reading) = read(&mut last)?;
                    }
                    lift(self.inner.answer(Event::Clock { now_ms: t }))?;
                }
                Effect::Dispatch {
                    dispatch: d,
                    started_at_ms,
                    hedge_at_ms: None,
                    key: None,
                } if d.continuation.is_none() && d.job.is_none() => {
                    let started = *started_at_ms;
                    let plan = Py::new(py, PyDispatch { d: d.clone() })?;
                    let step = adapter.call_method1(intern!(py, "step_for"), (plan, started))?;
                    let (ok, reply) = match dispatch.call1((&step,)) {
                        Ok(v) => (true, v),
                        Err(e) if e.is_instance_of::<PyException>(py) => {
                            let exc = e.into_value(py).into_bound(py).into_any();
                            adapter.setattr(intern!(py, "last_error"), &exc)?;
                            (false, exc)
                        }
                        Err(e) => return Err(e),
                    };
                    let completed = now(&mut last)?.max(started);
                    let quiet = |name: &Bound<'py, pyo3::types::PyString>| -> PyResult<bool> {
                        Ok(step.getattr(name)?.is_none())
                    };
                    let plain = quiet(intern!(py, "_units"))?
                        && quiet(intern!(py, "_body_sha256"))?
                        && quiet(intern!(py, "_model"))?
                        && quiet(intern!(py, "_tokens"))?
                        && quiet(intern!(py, "_refused"))?;
                    let facts = if !plain {
                        None
                    } else if ok {
                        Some(None)
                    } else if reply.get_type().is(attempt_error) {
                        let f = reply.getattr(intern!(py, "_facts"))?;
                        Some(Some(f.cast::<PyFacts>()?.get().inner.clone()))
                    } else {
                        None
                    };
                    if ok {
                        adapter.setattr(intern!(py, "last_error"), py.None())?;
                    }
                    match facts {
                        Some(facts) => {
                            let cost = step.getattr(intern!(py, "_cost"))?;
                            let cost = if cost.is_none() {
                                None
                            } else {
                                Some(integer(&cost, "cost")?)
                            };
                            let observation = Observation {
                                completed_at_ms: completed,
                                cost,
                                facts,
                                ..Observation::default()
                            };
                            lift(self.inner.answer(Event::Observed(Box::new(observation))))?;
                        }
                        None => {
                            let kind = PyDict::new(py);
                            kind.set_item("kind", "dispatch")?;
                            let fields = adapter
                                .call_method1(intern!(py, "observation"), (kind, ok, &reply))?;
                            fields.set_item("kind", "observed")?;
                            fields.set_item("completed_at_ms", completed)?;
                            let json = py.import("json")?.call_method1("dumps", (fields,))?;
                            lift(self.inner.answer_json(&text(&json)?))?;
                        }
                    }
                    value = if ok { reply.unbind() } else { py.None() };
                }
                _ => return Ok((false, py.None())),
            }
        }
    }

    /// The rule the last observation was judged by, or `None` before one.
    fn judged_by(&self) -> Option<&'static str> {
        self.inner.machine().judgement().map(|j| j.rule.as_str())
    }

    /// The finished run's session (a run that is not hedged), sealed as a
    /// session's: the one sealed run of the plain drivers.
    fn take_session(
        &mut self,
        py: Python<'_>,
        compiled: Py<Compiled>,
    ) -> PyResult<Option<PySession>> {
        let _ = py;
        Ok(self.inner.take_session().map(|session| PySession {
            session,
            policy: compiled,
            next: None,
        }))
    }
}
