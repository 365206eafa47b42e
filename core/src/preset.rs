//! Presets: the documented defaults of a short policy spec.
//!
//! A spec that names a `preset` (`interactive` or `batch`) may leave out
//! everything that has nothing to do with retrying: the capabilities of a
//! text chat model (required and offered), a private data boundary, the
//! `micro_usd` cost unit, a behavior class, the backoff, the deadline and the
//! attempt and cost budgets. [`crate::builder::build_policy`] writes every
//! default into the built policy, so the policy digest, and with it every
//! receipt, binds the values that were used. The tables here are printed in
//! `docs/PRESETS.md`; a change to one is a change of the policies it builds.

use crate::capability::{
    Capabilities, Modality, Refusal, ReleasePin, SamplingControl, StreamEvent, StructuredOutput,
    ToolCalls,
};
use crate::decode::names;
use crate::ids::Identifier;
use crate::policy::{Backoff, DataBoundary};

/// A named set of defaults for a policy spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// A person is waiting: a short deadline, two attempts per route.
    Interactive,
    /// Nobody is waiting: a long deadline, patient backoff, more attempts.
    Batch,
}

names!(Preset {
    Interactive => "interactive",
    Batch => "batch",
});

/// The behavior class every route of a preset spec carries unless it names one.
pub const BEHAVIOR_CLASS: &str = "text-chat@1";

/// The cost unit of a preset spec.
pub const COST_UNIT: &str = "micro_usd";

/// The data boundary of a preset spec (its routes and its maximum): a
/// service of the same organization. A route to an external provider says so.
pub const DATA_BOUNDARY: DataBoundary = DataBoundary::PrivateService;

impl Preset {
    /// Backoff: base, cap and the cap on a server's Retry-After hint (ms).
    pub fn backoff(self) -> Backoff {
        let (base_ms, max_ms, retry_after_cap_ms) = match self {
            Preset::Interactive => (250, 2_000, 5_000),
            Preset::Batch => (1_000, 30_000, 60_000),
        };
        Backoff {
            base_ms,
            max_ms,
            retry_after_cap_ms,
            retry_after_over_cap: None,
            quota_exhausted: None,
        }
    }

    /// The deadline of the whole logical request, ms after admission.
    pub fn deadline_ms(self) -> u64 {
        match self {
            Preset::Interactive => 30_000,
            Preset::Batch => 600_000,
        }
    }

    /// Attempts per route.
    pub fn route_attempts(self) -> u64 {
        match self {
            Preset::Interactive => 2,
            Preset::Batch => 4,
        }
    }
}

/// What a text chat model offers, and what a preset spec's request requires:
/// text in and out, a 128,000-token context, 4,096 output tokens, a 1 MiB
/// response, an in-band refusal, a model alias, 30 days of retention.
pub fn text_chat() -> Capabilities {
    Capabilities {
        input_modalities: [Modality::Text].into_iter().collect(),
        max_context_tokens: 128_000,
        max_output_tokens: 4_096,
        max_response_bytes: 1_048_576,
        output_modalities: [Modality::Text].into_iter().collect(),
        refusal: Refusal::InBandText,
        regions: std::iter::empty::<Identifier>().collect(),
        release_pin: ReleasePin::Alias,
        retention_days: 30,
        sampling_controls: [SamplingControl::Temperature, SamplingControl::TopP]
            .into_iter()
            .collect(),
        streaming_events: [StreamEvent::Terminal].into_iter().collect(),
        structured_output: StructuredOutput::None,
        tool_calls: ToolCalls::None,
    }
}
