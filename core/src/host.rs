//! What a host driver offers a run, checked against the policy before any
//! dispatch: the refusals a host would otherwise write itself.
//!
//! Two rules, each one function the TypeScript and Python drivers call
//! (docs/ERRORS.md, "Refused by the drivers"; docs/COMPOSITION.md, "What a
//! driver carries"):
//!
//! - [`CompiledPolicy::require_fleet`]: a policy with a fleet section runs
//!   only with a fleet (`admission_missing`), and a fleet given to a policy
//!   without one is refused too (`admission_unexpected`): a fleet that would
//!   admit nothing is a mistake the caller should see, not a protection the
//!   caller thinks it has.
//! - [`CompiledPolicy::require_driver`]: a driver that needs a section, or
//!   whose I/O cannot carry one (or one stream mode), refuses the policy
//!   with the code and for the reason the table [`DRIVER_RULES`] gives.

use crate::error::{Error, ErrorCode, Result};
use crate::policy::CompiledPolicy;
use crate::stream::StreamMode;

/// A host driver with a rule of [`DRIVER_RULES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The Temporal workflow helper: the machine runs in workflow code,
    /// each attempt is one activity execution that reports once it ended.
    Workflow,
    /// The async job drivers (`runJob`, `run_job`, `run_job_async`).
    Job,
    /// The stream drivers (`runStream`, `run_stream`, `run_stream_async`).
    Stream,
    /// The journaled drivers (`runJournaled`, `resumeJournaled`;
    /// `run_journaled`, `resume` and their async forms).
    Journaled,
    /// The Vercel AI SDK model (`retryledger/ai-sdk`).
    AiSdk,
    /// The LangChain chat model's `stream` (`retryledger.langchain`).
    LangChain,
    /// The Pydantic AI model's streamed request (`retryledger.pydantic_ai`).
    PydanticAi,
}

/// Every driver, in the order of [`Driver::parse`]'s names.
const DRIVERS: &[Driver] = &[
    Driver::Workflow,
    Driver::Job,
    Driver::Stream,
    Driver::Journaled,
    Driver::AiSdk,
    Driver::LangChain,
    Driver::PydanticAi,
];

impl Driver {
    /// The driver's name as the bindings pass it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workflow => "workflow",
            Self::Job => "job",
            Self::Stream => "stream",
            Self::Journaled => "journaled",
            Self::AiSdk => "ai_sdk",
            Self::LangChain => "langchain",
            Self::PydanticAi => "pydantic_ai",
        }
    }

    /// The driver named `name`, or `invalid_value` at `/driver`.
    pub fn parse(name: &str) -> Result<Self> {
        DRIVERS
            .iter()
            .copied()
            .find(|d| d.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = DRIVERS.iter().map(|d| d.as_str()).collect();
                Error::at(
                    ErrorCode::InvalidValue,
                    "/driver",
                    format!(
                        "unknown driver `{name}`: expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// A section of a policy a driver needs or refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// `fleet`.
    Fleet,
    /// `stream`.
    Stream,
    /// `async_job`.
    AsyncJob,
}

impl Section {
    /// The section's field name in the policy document.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fleet => "fleet",
            Self::Stream => "stream",
            Self::AsyncJob => "async_job",
        }
    }
}

/// What a rule of [`DRIVER_RULES`] says of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The driver needs the section: a policy without it is refused.
    Needs(Section),
    /// The driver cannot carry the section: a policy with it is refused.
    Refuses(Section),
    /// The driver cannot carry these stream modes.
    RefusesModes(&'static [StreamMode]),
}

/// One rule of a driver: what it needs or refuses, the code of the
/// refusal and why (one sentence, printed in docs/COMPOSITION.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverRule {
    /// The driver.
    pub driver: Driver,
    /// What the driver needs or refuses.
    pub rule: Rule,
    /// The code of the refusal.
    pub code: ErrorCode,
    /// Why, in one sentence.
    pub reason: &'static str,
}

impl DriverRule {
    /// What the rule is about, as docs/COMPOSITION.md prints it.
    pub fn subject(&self) -> String {
        match self.rule {
            Rule::Needs(s) => format!("needs `{}`", s.as_str()),
            Rule::Refuses(s) => format!("refuses `{}`", s.as_str()),
            Rule::RefusesModes(modes) => {
                let names: Vec<String> =
                    modes.iter().map(|m| format!("`{}`", m.as_str())).collect();
                format!("refuses stream mode {}", names.join(", "))
            }
        }
    }

    /// The JSON Pointer of the refusal.
    fn path(&self) -> String {
        match self.rule {
            Rule::Needs(s) | Rule::Refuses(s) => format!("/{}", s.as_str()),
            Rule::RefusesModes(_) => "/stream/mode".to_owned(),
        }
    }
}

/// Every rule of a driver, in the order they are checked.
pub const DRIVER_RULES: &[DriverRule] = &[
    DriverRule {
        driver: Driver::Workflow,
        rule: Rule::Refuses(Section::Fleet),
        code: ErrorCode::AdmissionMissing,
        reason: "workflow code reaches no fleet store (a store read is I/O the workflow's replay cannot repeat), so its attempts cannot be admitted; run a fleet policy with a driver inside an activity",
    },
    DriverRule {
        driver: Driver::Workflow,
        rule: Rule::Refuses(Section::Stream),
        code: ErrorCode::StreamRecordMissing,
        reason: "an attempt activity reports once it has ended, so no stream record or delivered event reaches the machine while the attempt runs; stream with runStream / run_stream outside a workflow",
    },
    DriverRule {
        driver: Driver::Workflow,
        rule: Rule::Refuses(Section::AsyncJob),
        code: ErrorCode::InvalidAsyncJob,
        reason: "an attempt activity reports no job id or job status, so the machine could not poll the accepted job; run a job with runJob / run_job",
    },
    DriverRule {
        driver: Driver::Job,
        rule: Rule::Needs(Section::AsyncJob),
        code: ErrorCode::InvalidAsyncJob,
        reason: "a job is submitted once and then polled by its id as the async_job section plans; run any other policy with runWithPolicy / run",
    },
    DriverRule {
        driver: Driver::Stream,
        rule: Rule::Needs(Section::Stream),
        code: ErrorCode::InvalidStreamContract,
        reason: "a streamed run delivers, withdraws and bounds its events as the stream contract says (its mode and byte bound); add a stream section to stream a run",
    },
    DriverRule {
        driver: Driver::Journaled,
        rule: Rule::Refuses(Section::Stream),
        code: ErrorCode::InvalidStreamContract,
        reason: "a journaled attempt's dispatch returns one value, so no stream record or delivered event reaches the machine; stream with runStream / run_stream",
    },
    DriverRule {
        driver: Driver::Journaled,
        rule: Rule::Refuses(Section::AsyncJob),
        code: ErrorCode::InvalidAsyncJob,
        reason: "a journaled attempt's dispatch reports no job id or job status, so the machine could not poll the accepted job; run a job with runJob / run_job",
    },
    DriverRule {
        driver: Driver::AiSdk,
        rule: Rule::RefusesModes(&[StreamMode::Tentative, StreamMode::Continuation]),
        code: ErrorCode::InvalidStreamContract,
        reason: "the AI SDK has no way to withdraw a part it was given or to resume a response; use buffer or restart",
    },
    DriverRule {
        driver: Driver::LangChain,
        rule: Rule::RefusesModes(&[StreamMode::Tentative, StreamMode::Continuation]),
        code: ErrorCode::InvalidStreamContract,
        reason: "a LangChain stream cannot take back delivered chunks or resume a response; use buffer or restart",
    },
    DriverRule {
        driver: Driver::PydanticAi,
        rule: Rule::RefusesModes(&[StreamMode::Continuation]),
        code: ErrorCode::InvalidStreamContract,
        reason: "a Pydantic AI response is not resumed across attempts; use buffer, tentative or restart",
    },
];

impl CompiledPolicy {
    /// Whether the policy has `section`.
    fn has_section(&self, section: Section) -> bool {
        let p = &self.policy;
        match section {
            Section::Fleet => p.fleet.is_some(),
            Section::Stream => p.stream.is_some(),
            Section::AsyncJob => p.async_job.is_some(),
        }
    }

    /// Whether the policy breaks `rule`.
    fn breaks(&self, rule: Rule) -> bool {
        match rule {
            Rule::Needs(s) => !self.has_section(s),
            Rule::Refuses(s) => self.has_section(s),
            Rule::RefusesModes(modes) => self
                .policy
                .stream
                .as_ref()
                .is_some_and(|c| modes.contains(&c.mode)),
        }
    }

    /// Refuse, before any dispatch, a fleet that does not fit the policy:
    /// `given` says whether the caller passed one. A fleet section without
    /// a fleet is `admission_missing`; a fleet without a fleet section is
    /// `admission_unexpected` (it would admit nothing). Both at `/fleet`.
    pub fn require_fleet(&self, given: bool) -> Result<()> {
        match (self.policy.fleet.is_some(), given) {
            (true, false) => Err(Error::at(
                ErrorCode::AdmissionMissing,
                "/fleet",
                "the policy has a fleet section: pass a fleet (`fleet`) to admit each attempt",
            )),
            (false, true) => Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "a fleet was given but the policy has no fleet section, so it would admit nothing: add a fleet section to the policy or drop the fleet",
            )),
            _ => Ok(()),
        }
    }

    /// Refuse, before any dispatch, an async job whose calls cannot do what
    /// the policy plans: under `cancel_left_running` the run may plan the
    /// cancel of the job it leaves running, so the job driver needs a
    /// cancel call (`has_cancel`); `invalid_async_job` at
    /// `/async_job/cancel_left_running` otherwise.
    pub fn require_job_calls(&self, has_cancel: bool) -> Result<()> {
        let planned = self
            .policy
            .async_job
            .as_ref()
            .is_some_and(|j| j.cancel_left_running == Some(true));
        if planned && !has_cancel {
            return Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                "/async_job/cancel_left_running",
                "the run plans the cancel of a job left running: calls.cancel is required",
            ));
        }
        Ok(())
    }

    /// Refuse, before any dispatch, a policy `driver` cannot run: the first
    /// rule of [`DRIVER_RULES`] for it that the policy breaks, its code at
    /// its section (`/stream/mode` for a stream mode) with its reason.
    pub fn require_driver(&self, driver: Driver) -> Result<()> {
        let broken = DRIVER_RULES
            .iter()
            .find(|r| r.driver == driver && self.breaks(r.rule));
        match broken {
            None => Ok(()),
            Some(r) => Err(Error::at(
                r.code,
                r.path(),
                format!(
                    "the {} driver {}: {}",
                    driver.as_str(),
                    r.subject(),
                    r.reason
                ),
            )),
        }
    }
}
