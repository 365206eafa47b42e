//! The journal's writer for a host that owns a run ([`Writer`]): the replay
//! of the journal kept between appends, so that each event is checked alone
//! and a continuing session starts from the replay. JSON text in and out,
//! as the module's other journal calls.

use retryledger_core::api;
use retryledger_core::journal::Writer;
use wasm_bindgen::prelude::*;

use crate::{lift, num, Out, WasmSession};

/// The writer of one run's journal, under its owner's lease generation
/// (made by `Compiled.journal_writer`).
#[wasm_bindgen]
pub struct JournalWriter {
    writer: Writer,
}

impl JournalWriter {
    pub(crate) fn new(writer: Writer) -> Self {
        Self { writer }
    }
}

#[wasm_bindgen]
impl JournalWriter {
    /// The next event (JSON) built from `entry` (JSON), checked like any
    /// other; the writer goes on from it.
    pub fn append(&mut self, entry: &str) -> Out<String> {
        lift(api::journal_writer_append(&mut self.writer, entry))
    }

    /// `journal_recover` (JSON) of the journal written so far.
    pub fn recover(&self, reconciliation: Option<String>) -> Out<String> {
        lift(api::journal_writer_recover(
            &self.writer,
            reconciliation.as_deref(),
        ))
    }

    /// Continue `session` (fresh, of the writer's policy) from the journal
    /// written so far.
    pub fn resume(&self, session: &mut WasmSession) -> Out<()> {
        lift(self.writer.resume(&mut session.session))
    }

    /// The seq of the next event.
    pub fn next_seq(&self) -> f64 {
        num(self.writer.replayed().next_seq())
    }
}
