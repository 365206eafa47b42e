//! A live run machine ([`api::LiveMachine`]): the host loop asks for the
//! outstanding effect and answers it with an event, JSON text both ways
//! (docs/HOST_LOOP.md). Nothing is decided here.

use retryledger_core::api;
use wasm_bindgen::prelude::*;

use std::sync::Arc;

use crate::{lift, num, Compiled, Out};

/// One run of the core's machine, driven by the package's host loop.
#[wasm_bindgen(js_name = LiveMachine)]
pub struct WasmMachine {
    inner: api::LiveMachine,
}

#[wasm_bindgen(js_class = LiveMachine)]
impl WasmMachine {
    /// Start a run of `policy` under `options` (JSON documents).
    pub fn start(policy: &str, options: &str) -> Out<WasmMachine> {
        Ok(Self {
            inner: lift(api::LiveMachine::start(policy, options))?,
        })
    }

    /// Take over the run `journal` (a JSON array of events) holds.
    pub fn resume(policy: &str, options: &str, journal: &str) -> Out<WasmMachine> {
        Ok(Self {
            inner: lift(api::LiveMachine::resume(policy, options, journal))?,
        })
    }

    /// Start a run of a policy compiled once for many runs.
    pub fn start_compiled(policy: &Compiled, options: &str) -> Out<WasmMachine> {
        Ok(Self {
            inner: lift(api::LiveMachine::start_compiled(
                Arc::clone(&policy.inner),
                options,
            ))?,
        })
    }

    /// Take over a run of a policy compiled once for many runs.
    pub fn resume_compiled(policy: &Compiled, options: &str, journal: &str) -> Out<WasmMachine> {
        Ok(Self {
            inner: lift(api::LiveMachine::resume_compiled(
                Arc::clone(&policy.inner),
                options,
                journal,
            ))?,
        })
    }

    /// The outstanding effect as JSON.
    pub fn next(&self) -> String {
        self.inner.next_json()
    }

    /// Whether the run is over.
    pub fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// Answer the outstanding effect with an event (JSON): the next effect.
    pub fn answer(&mut self, event: &str) -> Out<String> {
        lift(self.inner.answer_json(event))
    }

    /// The last attempt and its judgement as JSON, once one is recorded.
    pub fn observed(&self) -> Option<String> {
        self.inner.observed_json()
    }

    /// The attempt planned next as JSON, when one is (what a wait is for).
    pub fn planned(&self) -> Option<String> {
        self.inner.planned_json()
    }

    /// The run clock as last read, ms.
    pub fn now_ms(&self) -> f64 {
        num(self.inner.now_ms())
    }

    /// The sealed bundle as JSON.
    pub fn seal(&self) -> Out<String> {
        lift(self.inner.seal_json())
    }

    /// The sealed run, `{"bundle", "receipt_sha256"}`, as JSON.
    pub fn sealed(&self) -> Out<String> {
        lift(self.inner.sealed_json())
    }
}
