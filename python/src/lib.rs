//! Python bindings of retryledger-core: the extension module `retryledger._core`.
//!
//! Thin glue over [`retryledger_core::api`]: JSON text in, JSON text out. A
//! failure raises `CoreError` whose single argument is the core's
//! `error_json` (code, family, message, path, attempt index); the pure-Python
//! layer turns it into the exception class of the code's family. Integers are
//! range-checked in Python before they cross, so nothing here can overflow.
//!
//! [`Run`] holds the core's [`Session`] for a driver: the driver records each
//! observation (an [`Outcome`] decoded once, not per attempt) and reads the
//! next dispatch as a tuple; [`Run::seal`] takes the receipt, and the
//! receipt's digest and the bundle's JSON are computed only when asked for.
//! No JSON crosses per attempt.

use std::borrow::Cow;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, digest_of};
use retryledger_core::decode::from_str;
use retryledger_core::error::{Error, ErrorCode};
use retryledger_core::receipt::BundleSchema;
use retryledger_core::{Attempts, CompiledPolicy, Decision, Outcome, Receipt, Session};

create_exception!(
    retryledger._core,
    CoreError,
    PyValueError,
    "A core error; its single argument is the error as JSON (code, family, message, path, attempt_index)."
);

fn raise(e: &Error) -> PyErr {
    CoreError::new_err(api::error_json(e))
}

fn lift<T>(r: retryledger_core::Result<T>) -> PyResult<T> {
    r.map_err(|e| raise(&e))
}

/// JSON text from a Python `str`; anything else is a coded error, never a crash.
fn text<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, str>> {
    let s = obj
        .cast::<PyString>()
        .map_err(|_| raise(&Error::new(ErrorCode::InvalidType, "expected JSON text")))?;
    s.to_cow().map_err(|_| {
        raise(&Error::new(
            ErrorCode::InvalidJson,
            "text is not valid Unicode (unpaired surrogate)",
        ))
    })
}

/// `validate_policy`: the policy digest.
#[pyfunction]
fn validate_policy(policy: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::validate_policy(&text(policy)?))
}

/// `plan_next`: the decision as JSON.
#[pyfunction]
fn plan_next(policy: &Bound<'_, PyAny>, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::plan_next(&text(policy)?, &text(attempts)?))
}

/// `evaluate`: the receipt as JSON.
#[pyfunction]
fn evaluate(policy: &Bound<'_, PyAny>, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::evaluate(&text(policy)?, &text(attempts)?))
}

/// `verify_bundle`: the verdict as JSON.
#[pyfunction]
fn verify_bundle(bundle: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::verify(&text(bundle)?))
}

/// `digest`: the document's SHA-256 as lowercase hex.
#[pyfunction]
fn digest(document: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::digest(&text(document)?))
}

/// `parse_retry_after`: bounded milliseconds.
#[pyfunction]
fn parse_retry_after(
    header: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    now_unix_ms: u64,
    cap_ms: u64,
) -> PyResult<u64> {
    lift(api::parse_retry_after(
        &text(header)?,
        &text(value)?,
        now_unix_ms,
        cap_ms,
    ))
}

/// `classify_http`: the outcome as JSON.
#[pyfunction]
fn classify_http(observation: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::classify_http(&text(observation)?))
}

/// An outcome, decoded strictly once and passed to [`Run::record`] as is.
#[pyclass(frozen, name = "Outcome", module = "retryledger._core")]
struct PyOutcome {
    inner: Outcome,
}

#[pymethods]
impl PyOutcome {
    #[new]
    fn new(outcome: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: lift(from_str::<Outcome>(&text(outcome)?))?,
        })
    }

    /// The outcome as canonical JSON.
    #[getter]
    fn json(&self) -> String {
        canonical_json(&self.inner)
    }
}

/// The replay lab: the report (canonical JSON), its summary table and its case table.
#[pyfunction]
fn lab() -> PyResult<(String, String, String)> {
    lift(api::lab())
}

/// A policy validated and digested once, reused for every plan, evaluation and run.
#[pyclass(frozen, module = "retryledger._core")]
struct Compiled {
    inner: Arc<CompiledPolicy>,
    policy_json: String,
}

#[pymethods]
impl Compiled {
    #[new]
    fn new(policy: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = lift(api::compile_policy(&text(policy)?))?;
        let policy_json = canonical_json(&inner.policy);
        Ok(Self {
            inner: Arc::new(inner),
            policy_json,
        })
    }

    /// The policy digest.
    #[getter]
    fn sha256(&self) -> &str {
        &self.inner.policy_sha256
    }

    /// The digest of the idempotency key every attempt carries.
    #[getter]
    fn idempotency_key_sha256(&self) -> &str {
        self.inner.policy.idempotency_key_sha256.as_str()
    }

    /// The policy as canonical JSON.
    #[getter]
    fn policy_json(&self) -> &str {
        &self.policy_json
    }

    /// `plan_next` against this policy.
    fn plan_next(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::plan_next_compiled(&self.inner, &text(attempts)?))
    }

    /// `evaluate` against this policy.
    fn evaluate(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::evaluate_compiled(&self.inner, &text(attempts)?))
    }

    /// Seal a finished run: the bundle as JSON.
    fn seal(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::seal_compiled(&self.inner, &text(attempts)?))
    }

    /// A new run of this policy, with no attempt yet.
    fn start(slf: Py<Self>, py: Python<'_>) -> Run {
        Run {
            session: Session::start(Arc::clone(&slf.get().inner)),
            policy: slf.clone_ref(py),
        }
    }
}

/// The planned dispatch as `(ordinal, route_id, route_ordinal, not_before_ms,
/// reserve_cost, deadline_ms, route_release_sha256)`.
type Plan = (u64, String, u64, u64, u64, u64, String);

fn plan_of(decision: &Decision) -> Option<Plan> {
    match decision {
        Decision::Dispatch(d) => Some((
            d.ordinal,
            d.route_id.as_str().to_owned(),
            d.route_ordinal,
            d.not_before_ms,
            d.reserve_cost,
            d.deadline_ms,
            d.route_release_sha256.as_str().to_owned(),
        )),
        Decision::Terminal { .. } => None,
    }
}

/// One run in progress: the core's [`Session`], advanced one attempt at a time.
#[pyclass(module = "retryledger._core")]
struct Run {
    session: Session,
    policy: Py<Compiled>,
}

#[pymethods]
impl Run {
    /// The planned dispatch, or `None` once the run has reached a terminal.
    fn next(&self) -> Option<Plan> {
        plan_of(self.session.next())
    }

    /// The terminal's name, or `None` while the run can still dispatch.
    #[getter]
    fn terminal(&self) -> Option<&'static str> {
        match self.session.next() {
            Decision::Terminal { terminal } => Some(terminal.as_str()),
            Decision::Dispatch(_) => None,
        }
    }

    /// The next decision as JSON, exactly as `plan_next` gives it.
    #[getter]
    fn decision_json(&self) -> String {
        canonical_json(self.session.next())
    }

    /// Attempts recorded so far.
    #[getter]
    fn attempt_count(&self) -> usize {
        self.session.attempts().attempts.len()
    }

    /// The attempts so far as JSON.
    #[getter]
    fn attempts_json(&self) -> String {
        canonical_json(self.session.attempts())
    }

    /// Record the planned attempt's observation and return the next planned
    /// dispatch (`None` at the terminal). Drift (an early start, a completion
    /// before the start, an attempt after the terminal) is an error and
    /// leaves the run unchanged.
    fn record(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: u64,
        outcome: &PyOutcome,
    ) -> PyResult<Option<Plan>> {
        lift(
            self.session
                .record(started_at_ms, completed_at_ms, cost, outcome.inner)
                .map(plan_of),
        )
    }

    /// Mark the run cancelled between attempts, at `at_ms` on the run clock.
    fn cancel(&mut self, at_ms: u64) -> PyResult<()> {
        lift(self.session.cancel(at_ms))
    }

    /// Seal the finished run: its receipt (with the digests of the policy and
    /// the attempts). The receipt's own digest and the bundle's JSON are
    /// computed when asked for.
    fn seal(&self, py: Python<'_>) -> PyResult<Sealed> {
        Ok(Sealed {
            receipt: lift(self.session.receipt())?,
            attempts: self.session.attempts().clone(),
            policy: self.policy.clone_ref(py),
        })
    }
}

/// A sealed run: policy, attempts and the evaluated receipt.
#[pyclass(frozen, module = "retryledger._core")]
struct Sealed {
    policy: Py<Compiled>,
    attempts: Attempts,
    receipt: Receipt,
}

/// A bundle's canonical JSON from its parts' canonical JSON (fields in sorted order).
fn bundle_text(attempts_json: &str, policy_json: &str, receipt_json: &str) -> String {
    format!(
        "{{\"attempts\":{attempts_json},\"policy\":{policy_json},\"receipt\":{receipt_json},\"schema\":\"{}\"}}",
        BundleSchema::NAME
    )
}

#[pymethods]
impl Sealed {
    /// Lowercase hex SHA-256 of the receipt's canonical JSON.
    #[getter]
    fn receipt_sha256(&self) -> String {
        digest_of(&self.receipt)
    }

    /// How the run ended.
    #[getter]
    fn terminal(&self) -> &'static str {
        self.receipt.terminal.as_str()
    }

    /// The receipt as canonical JSON.
    #[getter]
    fn receipt_json(&self) -> String {
        canonical_json(&self.receipt)
    }

    /// The bundle (attempts, policy, receipt) as canonical JSON.
    #[getter]
    fn bundle_json(&self) -> String {
        bundle_text(
            &canonical_json(&self.attempts),
            &self.policy.get().policy_json,
            &canonical_json(&self.receipt),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_text_is_the_canonical_bundle() -> retryledger_core::Result<()> {
        let bundle = retryledger_core::lab::reference_bundle()?;
        let text = bundle_text(
            &canonical_json(&bundle.attempts),
            &canonical_json(&bundle.policy),
            &canonical_json(&bundle.receipt),
        );
        assert_eq!(text, canonical_json(&bundle));
        Ok(())
    }
}

/// The extension module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add_class::<Compiled>()?;
    m.add_class::<Run>()?;
    m.add_class::<Sealed>()?;
    m.add_class::<PyOutcome>()?;
    m.add_function(wrap_pyfunction!(validate_policy, m)?)?;
    m.add_function(wrap_pyfunction!(plan_next, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(verify_bundle, m)?)?;
    m.add_function(wrap_pyfunction!(digest, m)?)?;
    m.add_function(wrap_pyfunction!(parse_retry_after, m)?)?;
    m.add_function(wrap_pyfunction!(classify_http, m)?)?;
    m.add_function(wrap_pyfunction!(lab, m)?)?;
    Ok(())
}
