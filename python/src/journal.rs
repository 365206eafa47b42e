//! The journal's writer for a host that owns a run ([`Writer`]): the replay
//! of the journal kept between appends, so that each event is checked alone
//! and a continuing session starts from the replay. JSON text in and out,
//! as the module's other journal calls.

use std::sync::Arc;

use pyo3::prelude::*;
use retryledger_core::api;
use retryledger_core::journal::Writer;

use crate::{integer, lift, opt_text, text, Compiled, PySession};

/// The writer of one run's journal, under its owner's lease generation.
#[pyclass(name = "JournalWriter", module = "retryledger._core")]
pub(crate) struct PyJournalWriter {
    writer: Writer,
}

#[pymethods]
impl PyJournalWriter {
    /// The writer of the journal `events` (JSON text) of `policy`, verified
    /// (the first event the replay refuses raises), appending under
    /// `lease_generation`.
    #[new]
    fn new(
        policy: &Bound<'_, Compiled>,
        events: &Bound<'_, PyAny>,
        lease_generation: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let generation = integer(lease_generation, "lease_generation")?;
        let writer = lift(api::journal_writer(
            Arc::clone(&policy.get().inner),
            &text(events)?,
            generation,
        ))?;
        Ok(Self { writer })
    }

    /// The next event (JSON) built from `entry` (JSON), checked like any
    /// other; the writer goes on from it.
    fn append(&mut self, entry: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::journal_writer_append(&mut self.writer, &text(entry)?))
    }

    /// `journal_recover` (JSON) of the journal written so far.
    #[pyo3(signature = (reconciliation=None))]
    fn recover(&self, reconciliation: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        let rec = opt_text(reconciliation)?;
        lift(api::journal_writer_recover(&self.writer, rec.as_deref()))
    }

    /// Continue `session` (fresh, of the writer's policy) from the journal
    /// written so far.
    fn resume(&self, session: &Bound<'_, PySession>) -> PyResult<()> {
        let mut session = session.try_borrow_mut()?;
        lift(self.writer.resume(&mut session.session))?;
        session.next = None;
        Ok(())
    }

    /// The seq of the next event.
    #[getter]
    fn next_seq(&self) -> u64 {
        self.writer.replayed().next_seq()
    }
}
