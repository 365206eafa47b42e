//! The run machine: a transcript of a scripted run and the live machine
//! a host loop drives.

use crate::canonical::digest_of;
use crate::decode::from_str;
use crate::error::Result;
use crate::policy::CompiledPolicy;

use super::journal::journal_events;
use super::{compile_policy, out};

/// The run machine ([`crate::machine`]) started under `options_json` (or,
/// with `journal_json`, resumed from it) and fed the events of
/// `events_json`: the effects it asked for and where it ended
/// ([`crate::machine::replay::transcript`]). Only malformed input is an
/// error; a refused event is part of the answer.
pub fn machine_transcript(
    policy_json: &str,
    options_json: &str,
    journal_json: Option<&str>,
    events_json: &str,
) -> Result<String> {
    let cp = std::sync::Arc::new(compile_policy(policy_json)?);
    let options: crate::machine::Options = crate::decode::from_str(options_json)?;
    let journal = journal_json.map(journal_events).transpose()?;
    let events: crate::machine::replay::Events = crate::decode::from_str(events_json)?;
    let t = crate::machine::replay::transcript(
        &cp,
        options,
        journal.as_ref().map(|j| j.0.as_slice()),
        &events.0,
    );
    Ok(crate::canonical::to_jcs(&t))
}

/// A live run machine for the bindings ([`crate::machine::Machine`]):
/// JSON text in and out, so each binding is a few lines of glue. The host
/// loop asks [`LiveMachine::next_json`] for the outstanding effect, carries
/// it out and answers with [`LiveMachine::answer_json`]; nothing is decided
/// outside the core.
#[derive(Debug, Clone)]
pub struct LiveMachine {
    machine: crate::machine::Machine,
}

impl LiveMachine {
    /// Start a run of `policy_json` under `options_json` (the options
    /// document of [`machine_transcript`]).
    pub fn start(policy_json: &str, options_json: &str) -> Result<Self> {
        let cp = std::sync::Arc::new(compile_policy(policy_json).map_err(|e| e.under("/policy"))?);
        Self::start_compiled(cp, options_json)
    }

    /// [`LiveMachine::start`] of a policy compiled once for many runs.
    pub fn start_compiled(cp: std::sync::Arc<CompiledPolicy>, options_json: &str) -> Result<Self> {
        let options: crate::machine::Options =
            from_str(options_json).map_err(|e| e.under("/options"))?;
        Ok(Self {
            machine: crate::machine::Machine::start(cp, options)?,
        })
    }

    /// Take over the run `journal_json` holds (a JSON array of journal
    /// events) as the owner named in `options_json`'s `journal`.
    pub fn resume(policy_json: &str, options_json: &str, journal_json: &str) -> Result<Self> {
        let cp = std::sync::Arc::new(compile_policy(policy_json).map_err(|e| e.under("/policy"))?);
        Self::resume_compiled(cp, options_json, journal_json)
    }

    /// [`LiveMachine::resume`] of a policy compiled once for many runs.
    pub fn resume_compiled(
        cp: std::sync::Arc<CompiledPolicy>,
        options_json: &str,
        journal_json: &str,
    ) -> Result<Self> {
        let options: crate::machine::Options =
            from_str(options_json).map_err(|e| e.under("/options"))?;
        let journal = journal_events(journal_json)?;
        Ok(Self {
            machine: crate::machine::Machine::resume(cp, &journal.0, options)?,
        })
    }

    /// The outstanding effect as JSON (tagged by `kind`).
    pub fn next_json(&self) -> String {
        out(self.machine.next())
    }

    /// Whether the run is over (the outstanding effect is `done`).
    pub fn is_done(&self) -> bool {
        self.machine.next().is_done()
    }

    /// Answer the outstanding effect with an event (JSON tagged by `kind`):
    /// the next effect as JSON. A refused event is the core's coded error
    /// and leaves the same effect outstanding (but after a refused append).
    pub fn answer_json(&mut self, event_json: &str) -> Result<String> {
        let event: crate::machine::Event = from_str(event_json).map_err(|e| e.under("/event"))?;
        self.machine.answer(event).map(out)
    }

    /// The last attempt recorded and how its observation was judged:
    /// `{"attempt", "judgement"}` as JSON, or `None` before the first.
    pub fn observed_json(&self) -> Option<String> {
        let (attempt, judgement) = self.machine.observed()?;
        let mut text = String::from("{\"attempt\":");
        text.push_str(&out(attempt));
        text.push_str(",\"judgement\":");
        text.push_str(&out(judgement));
        text.push('}');
        Some(text)
    }

    /// The attempt the machine plans next (its dispatch) as JSON, or `None`
    /// when none is planned (the run is over, or a hedged round is in
    /// flight): what a host's hook says a wait is for.
    pub fn planned_json(&self) -> Option<String> {
        self.machine.planned_dispatch().map(|d| out(&d))
    }

    /// The run clock as the machine last read it, ms.
    pub fn now_ms(&self) -> u64 {
        self.machine.now_ms()
    }

    /// The sealed bundle of the finished run as JSON
    /// (`run_not_terminal` before it is over).
    pub fn seal_json(&self) -> Result<String> {
        self.machine.seal().map(|b| out(&b))
    }

    /// The sealed run: `{"bundle", "receipt_sha256"}` as JSON.
    pub fn sealed_json(&self) -> Result<String> {
        let bundle = self.machine.seal()?;
        let mut text = String::from("{\"bundle\":");
        text.push_str(&out(&bundle));
        text.push_str(",\"receipt_sha256\":\"");
        text.push_str(&digest_of(&bundle.receipt));
        text.push_str("\"}");
        Ok(text)
    }
}
