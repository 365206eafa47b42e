//! The sync driver's loop (`retryledger.run`) in the extension: the order of
//! the host contract (plan, wait until `not_before_ms`, dispatch, observe,
//! until a terminal) with the clock, the sleep, the dispatch and the host's
//! hooks called as the Python driver gives them. Every decision is still the
//! core's; what this loop saves is the crossing into the module and the
//! interpreted loop around it on every attempt.
//!
//! It is the same sequence as the async driver's (`run_async`, in Python,
//! which awaits its dispatch and sleep); the driver vectors
//! (`python/tests/test_drivers_vectors.py`) replay both.

use pyo3::exceptions::PyException;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyTuple, PyType};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use retryledger_core::{Decision, Terminal};

use crate::{facts_arg, integer, PyFacts, PySession};

/// The sync loop with what every run of it uses: the `Step` class a
/// dispatch receives, the `AttemptError` class whose facts a raise carries,
/// and the facts of a returned answer with no output check.
#[pyclass(frozen, module = "retryledger._core")]
pub(crate) struct SyncLoop {
    step: Py<PyType>,
    attempt_error: Py<PyType>,
    returned: Py<PyFacts>,
}

/// A run-clock reading as the core's integer ms: Python's `int()` of it,
/// checked like any integer the core takes (`integer`'s codes).
fn whole(x: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if let Ok(f) = x.cast::<PyFloat>() {
        let v = f.value();
        // In range: the truncation `int()` makes.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        if (0.0..=MAX_SAFE_INTEGER as f64).contains(&v) {
            return Ok(v as u64);
        }
    }
    let int = x.py().get_type::<PyInt>().call1((x,))?;
    integer(&int, name)
}

/// One run of the loop: what the driver gave it, read by every attempt.
struct Drive<'a, 'py> {
    py: Python<'py>,
    host: &'a Bound<'py, PyAny>,
    session: &'a Bound<'py, PySession>,
    dispatch: &'a Bound<'py, PyAny>,
    clock: &'a Bound<'py, PyAny>,
    sleep: &'a Bound<'py, PyAny>,
    /// The clock's reading at the start: the run clock's origin.
    t0: Bound<'py, PyAny>,
    idempotency_key: &'a Bound<'py, PyAny>,
    schedule: &'a Bound<'py, PyAny>,
    uses: Uses,
}

/// The flags of a run's host that change the loop, given once per run.
#[derive(Clone, Copy)]
struct Uses {
    /// `on_decision` or `on_sleep` or `on_terminal` is set.
    hooked: bool,
    /// A fleet admits each attempt (`_Host.admit`).
    admits: bool,
    /// `_Host.after` runs after each observation (fleet record, `on_attempt`).
    after: bool,
    /// Output checks judge what dispatch returns (`_Host.returned`).
    checks: bool,
}

impl Uses {
    /// The host's session and what the host holds that changes the loop.
    fn of<'py>(host: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PySession>, Self)> {
        let py = host.py();
        let session = host
            .getattr(intern!(py, "session"))?
            .cast_into::<PySession>()?;
        let set = |name: &Bound<'py, pyo3::types::PyString>| -> PyResult<bool> {
            Ok(!host.getattr(name)?.is_none())
        };
        let admits = set(intern!(py, "fleet"))?;
        let uses = Self {
            hooked: host.getattr(intern!(py, "hooked"))?.is_truthy()?,
            admits,
            after: admits || set(intern!(py, "on_attempt"))?,
            checks: set(intern!(py, "checks"))?,
        };
        Ok((session, uses))
    }
}

/// How the next attempt starts.
enum Start<'py> {
    /// Its plan, the run clock's reading when it starts (as the clock gave
    /// it, less `t0`) and that reading as a float.
    Dispatch(Bound<'py, PyAny>, Bound<'py, PyAny>, f64),
    /// The terminal (the session's, or the fleet's).
    Terminal(Bound<'py, PyAny>),
}

/// The session's plan, announced to the hooks, slept until its
/// `not_before_ms`, admitted through the fleet when one admits (waiting
/// while the admission limits ask to) and slept until the admitted start.
fn next_start<'py>(
    host: &Bound<'py, PyAny>,
    session: &Bound<'py, PySession>,
    uses: Uses,
    clock: &Bound<'py, PyAny>,
    t0: &Bound<'py, PyAny>,
    sleep: &Bound<'py, PyAny>,
) -> PyResult<Start<'py>> {
    let py = host.py();
    let planned = |session: &Bound<'py, PySession>| -> PyResult<(Bound<'py, PyAny>, Option<u64>)> {
        let mut this = session.try_borrow_mut()?;
        let plan = this.next(py)?.into_bound(py);
        let not_before = match this.session.next() {
            Decision::Dispatch(d) => Some(d.not_before_ms),
            Decision::Terminal { .. } => None,
        };
        Ok((plan, not_before))
    };
    let (mut plan, mut not_before) = planned(session)?;
    if uses.hooked {
        host.call_method1(intern!(py, "decided"), (&plan,))?;
    }
    let Some(mut until) = not_before else {
        return Ok(Start::Terminal(plan));
    };
    let mut now = clock.call0()?.sub(t0)?;
    let mut at: f64 = now.extract()?;
    let mut admitted = !uses.admits;
    loop {
        #[allow(clippy::cast_precision_loss)]
        let until_f = until as f64;
        if uses.hooked && at < until_f {
            host.call_method1(intern!(py, "sleeping"), (&plan, &now))?;
        }
        while at < until_f {
            sleep.call1((until.into_pyobject(py)?.sub(&now)?,))?;
            now = clock.call0()?.sub(t0)?;
            at = now.extract()?;
        }
        if admitted {
            return Ok(Start::Dispatch(plan, now, at));
        }
        // Admitted through the fleet: perhaps on a later route, or the fleet's terminal.
        let wait: f64 = host
            .call_method1(intern!(py, "admit"), (&now,))?
            .get_item(1)?
            .extract()?;
        (plan, not_before) = planned(session)?;
        let Some(next) = not_before else {
            return Ok(Start::Terminal(plan));
        };
        until = next;
        if wait > 0.0 {
            sleep.call1((wait,))?;
            now = clock.call0()?.sub(t0)?;
            at = now.extract()?;
        } else {
            admitted = true;
        }
    }
}

#[pymethods]
impl SyncLoop {
    #[new]
    fn new(
        step: Bound<'_, PyType>,
        attempt_error: Bound<'_, PyType>,
        returned: Bound<'_, PyFacts>,
    ) -> Self {
        Self {
            step: step.unbind(),
            attempt_error: attempt_error.unbind(),
            returned: returned.unbind(),
        }
    }

    /// Drive the host's session to its terminal: `(value,)` when an attempt
    /// completed the run, `None` when it stopped (the host's `judgement` and
    /// `last_error` say why). `host` is the driver's `_Host`; what it holds
    /// (hooks, a fleet, `on_attempt`, output checks) says which of its
    /// methods the loop calls. An exception that is not an `Exception`
    /// (`KeyboardInterrupt`, ...) propagates as it is.
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        host: &Bound<'py, PyAny>,
        dispatch: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
        sleep: &Bound<'py, PyAny>,
        idempotency_key: &Bound<'py, PyAny>,
        schedule: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let (session, uses) = Uses::of(host)?;
        let drive = Drive {
            py,
            host,
            session: &session,
            dispatch,
            clock,
            sleep,
            t0: clock.call0()?,
            idempotency_key,
            schedule,
            uses,
        };
        let mut judgement = None;
        let done = self.attempts(&drive, &mut judgement);
        if let Some(j) = judgement {
            host.setattr(intern!(py, "judgement"), j)?;
        }
        done
    }

    /// The next attempt of the host's session as the loop starts it (the
    /// sync stream driver's): `(plan, now)` with the run clock's reading
    /// when it starts, or `(terminal, now)` when the run or the fleet ends.
    fn next_attempt<'py>(
        &self,
        py: Python<'py>,
        host: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
        t0: &Bound<'py, PyAny>,
        sleep: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (session, uses) = Uses::of(host)?;
        match next_start(host, &session, uses, clock, t0, sleep)? {
            Start::Dispatch(plan, now, _) => Ok((plan, now)),
            Start::Terminal(plan) => Ok((plan, 0.0f64.into_pyobject(py)?.into_any())),
        }
    }
}

impl SyncLoop {
    /// The attempts of the run, each planned, waited for, dispatched and
    /// observed; the last judgement left in `judgement`.
    fn attempts<'py>(
        &self,
        drive: &Drive<'_, 'py>,
        judgement: &mut Option<Py<PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Drive {
            py,
            host,
            session,
            dispatch,
            clock,
            sleep,
            ref t0,
            idempotency_key,
            schedule,
            uses,
        } = *drive;
        loop {
            let Start::Dispatch(plan, now, at) = next_start(host, session, uses, clock, t0, sleep)?
            else {
                return Ok(None);
            };
            let started = if at > 0.0 {
                whole(&now, "started_at_ms")?
            } else {
                0
            };
            let step =
                self.step
                    .bind(py)
                    .call1((&plan, idempotency_key, started, schedule, session))?;
            // As the Python drivers read them: a raise's facts before its
            // completion time, a returned answer's checks after it.
            let elapsed =
                || -> PyResult<u64> { whole(&clock.call0()?.sub(t0)?, "completed_at_ms") };
            let (facts, completed, value) = match dispatch.call1((&step,)) {
                Ok(value) => {
                    let completed = elapsed()?;
                    let facts = if uses.checks {
                        host.call_method1(intern!(py, "returned"), (&value,))?
                    } else {
                        self.returned.bind(py).clone().into_any()
                    };
                    (facts, completed, Some(value))
                }
                Err(e) if e.is_instance_of::<PyException>(py) => {
                    let exc = e.into_value(py).into_bound(py).into_any();
                    host.setattr(intern!(py, "last_error"), &exc)?;
                    let facts = if exc.get_type().is(self.attempt_error.bind(py)) {
                        exc.getattr(intern!(py, "_facts"))?
                    } else {
                        host.call_method1(intern!(py, "facts"), (&step, &exc))?
                    };
                    (facts, elapsed()?, None)
                }
                Err(e) => return Err(e),
            };
            let cost = step.getattr(intern!(py, "_cost"))?;
            let cost = if cost.is_none() {
                None
            } else {
                Some(integer(&cost, "cost")?)
            };
            let facts = facts_arg(Some(&facts))?;
            let (judged, completed_run) = {
                let mut this = session.try_borrow_mut()?;
                let judged =
                    this.observed(py, started, completed.max(started), cost, facts, &[])?;
                let completed_run = matches!(
                    this.session.next(),
                    Decision::Terminal {
                        terminal: Terminal::Completed
                    }
                );
                (judged.into_bound(py).into_any(), completed_run)
            };
            if uses.after {
                host.call_method1(intern!(py, "after"), (&step, &judged))?;
            }
            *judgement = Some(judged.unbind());
            if let (Some(value), true) = (value, completed_run) {
                // The last error's traceback holds no frame of this loop, but
                // the host keeps no error past a completed run.
                host.setattr(intern!(py, "last_error"), py.None())?;
                return Ok(Some(PyTuple::new(py, [value])?));
            }
        }
    }
}
