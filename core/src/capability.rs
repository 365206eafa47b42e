//! Structured capability contracts: what a request requires, what a route offers.
//!
//! One type serves both sides. A route covers a requirement when, field by
//! field, it offers at least as much: supersets of modalities, sampling
//! controls and streaming events; at least the context, output and response
//! byte bounds; at least the structured-output, tool-call, refusal and
//! release-pin levels; and at most the requirement's regions and retention.
//! The first uncovered field is named, so a route is rejected before any
//! dispatch with the missing capability in the error.

use crate::canonical::Encode;
use crate::decode::{names, object};
use crate::ids::{Identifier, Set};

/// An input or output modality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Modality {
    /// Plain text.
    Text,
    /// Still images (screenshots, photos).
    Image,
    /// Audio.
    Audio,
    /// Video.
    Video,
    /// Opaque files (PDF and similar).
    File,
}

/// Structured output support, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StructuredOutput {
    /// Free text only.
    None,
    /// JSON text, not checked against a schema.
    JsonObject,
    /// Strict JSON schema mode.
    JsonSchema,
    /// Grammar-constrained decoding.
    ConstrainedDecoding,
}

/// A sampling control the caller relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SamplingControl {
    /// A reproducibility seed.
    Seed,
    /// Temperature.
    Temperature,
    /// Nucleus sampling.
    TopP,
    /// Token log-probabilities.
    Logprobs,
    /// Stop sequences.
    StopSequences,
}

/// Tool-call semantics, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ToolCalls {
    /// No tool calls.
    None,
    /// One tool call per turn.
    Single,
    /// Several tool calls per turn.
    Parallel,
}

/// A streaming event the caller relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StreamEvent {
    /// An explicit terminal event ends the stream.
    Terminal,
    /// Usage is reported in the stream.
    Usage,
}

/// How a safety refusal is represented, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// No distinguishable refusal.
    None,
    /// A refusal in the ordinary text.
    InBandText,
    /// A typed refusal field.
    Typed,
}

/// How exactly the route pins its model release, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReleasePin {
    /// A moving name ("latest").
    Floating,
    /// A dated alias the provider may repoint.
    Alias,
    /// An exact, immutable release.
    Exact,
}

/// A capability contract. Fields are declared in canonical (sorted) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Input modalities.
    pub input_modalities: Set<Modality>,
    /// Context window, in tokens.
    pub max_context_tokens: u64,
    /// Output bound, in tokens.
    pub max_output_tokens: u64,
    /// Response size bound, in bytes.
    pub max_response_bytes: u64,
    /// Output modalities.
    pub output_modalities: Set<Modality>,
    /// Refusal representation.
    pub refusal: Refusal,
    /// Regions where the request may be (requirement) or is (route) processed.
    pub regions: Set<Identifier>,
    /// Release pin strength.
    pub release_pin: ReleasePin,
    /// Data retention in days: the most allowed (requirement) or applied (route).
    pub retention_days: u64,
    /// Sampling controls.
    pub sampling_controls: Set<SamplingControl>,
    /// Streaming events.
    pub streaming_events: Set<StreamEvent>,
    /// Structured output level.
    pub structured_output: StructuredOutput,
    /// Tool-call semantics.
    pub tool_calls: ToolCalls,
}

fn names<T: Encode>(items: &[&T]) -> String {
    items
        .iter()
        .map(|x| level(*x))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A name or identifier as written in a document, without its quotes.
fn level<T: Encode + ?Sized>(x: &T) -> String {
    crate::canonical::canonical_json(x)
        .trim_matches('"')
        .to_owned()
}

impl Capabilities {
    /// The weakest contract: no modality, sampling control, streaming event
    /// or region; every bound 0; every level at its floor. A requirement
    /// built from it asks for nothing until a field is raised (a
    /// requirement's `retention_days` is the most it allows, so raise that
    /// one to the maximum).
    pub fn floor() -> Self {
        let empty = || std::iter::empty().collect();
        Self {
            input_modalities: empty(),
            max_context_tokens: 0,
            max_output_tokens: 0,
            max_response_bytes: 0,
            output_modalities: empty(),
            refusal: Refusal::None,
            regions: std::iter::empty().collect(),
            release_pin: ReleasePin::Floating,
            retention_days: 0,
            sampling_controls: std::iter::empty().collect(),
            streaming_events: std::iter::empty().collect(),
            structured_output: StructuredOutput::None,
            tool_calls: ToolCalls::None,
        }
    }

    /// The first field in which `self` (a route's offer) fails to cover
    /// `required`, as (field name, explanation); `None` when it covers all.
    pub fn uncovered(&self, required: &Capabilities) -> Option<(&'static str, String)> {
        let r = required;
        if !self.input_modalities.is_superset(&r.input_modalities) {
            let m = self.input_modalities.missing_from(&r.input_modalities);
            return Some((
                "input_modalities",
                format!("lacks input modality {}", names(&m)),
            ));
        }
        if self.max_context_tokens < r.max_context_tokens {
            return Some((
                "max_context_tokens",
                format!(
                    "context {} < required {}",
                    self.max_context_tokens, r.max_context_tokens
                ),
            ));
        }
        if self.max_output_tokens < r.max_output_tokens {
            return Some((
                "max_output_tokens",
                format!(
                    "output bound {} < required {}",
                    self.max_output_tokens, r.max_output_tokens
                ),
            ));
        }
        if self.max_response_bytes < r.max_response_bytes {
            return Some((
                "max_response_bytes",
                format!(
                    "response bytes {} < required {}",
                    self.max_response_bytes, r.max_response_bytes
                ),
            ));
        }
        if !self.output_modalities.is_superset(&r.output_modalities) {
            let m = self.output_modalities.missing_from(&r.output_modalities);
            return Some((
                "output_modalities",
                format!("lacks output modality {}", names(&m)),
            ));
        }
        if self.refusal < r.refusal {
            return Some((
                "refusal",
                format!(
                    "refusal `{}` below required `{}`",
                    level(&self.refusal),
                    level(&r.refusal)
                ),
            ));
        }
        if !r.regions.is_superset(&self.regions) {
            let m = r.regions.missing_from(&self.regions);
            return Some((
                "regions",
                format!("processes in region {} outside the allowed set", names(&m)),
            ));
        }
        if self.release_pin < r.release_pin {
            return Some((
                "release_pin",
                format!(
                    "release pin `{}` weaker than required `{}`",
                    level(&self.release_pin),
                    level(&r.release_pin)
                ),
            ));
        }
        if self.retention_days > r.retention_days {
            return Some((
                "retention_days",
                format!(
                    "retains {} days > allowed {}",
                    self.retention_days, r.retention_days
                ),
            ));
        }
        if !self.sampling_controls.is_superset(&r.sampling_controls) {
            let m = self.sampling_controls.missing_from(&r.sampling_controls);
            return Some((
                "sampling_controls",
                format!("lacks sampling control {}", names(&m)),
            ));
        }
        if !self.streaming_events.is_superset(&r.streaming_events) {
            let m = self.streaming_events.missing_from(&r.streaming_events);
            return Some((
                "streaming_events",
                format!("lacks streaming event {}", names(&m)),
            ));
        }
        if self.structured_output < r.structured_output {
            return Some((
                "structured_output",
                format!(
                    "structured output `{}` below required `{}`",
                    level(&self.structured_output),
                    level(&r.structured_output)
                ),
            ));
        }
        if self.tool_calls < r.tool_calls {
            return Some((
                "tool_calls",
                format!(
                    "tool calls `{}` below required `{}`",
                    level(&self.tool_calls),
                    level(&r.tool_calls)
                ),
            ));
        }
        None
    }
}

names!(Modality {
    Text => "text",
    Image => "image",
    Audio => "audio",
    Video => "video",
    File => "file",
});

names!(StructuredOutput {
    None => "none",
    JsonObject => "json_object",
    JsonSchema => "json_schema",
    ConstrainedDecoding => "constrained_decoding",
});

names!(SamplingControl {
    Seed => "seed",
    Temperature => "temperature",
    TopP => "top_p",
    Logprobs => "logprobs",
    StopSequences => "stop_sequences",
});

names!(ToolCalls {
    None => "none",
    Single => "single",
    Parallel => "parallel",
});

names!(StreamEvent {
    Terminal => "terminal",
    Usage => "usage",
});

names!(Refusal {
    None => "none",
    InBandText => "in_band_text",
    Typed => "typed",
});

names!(ReleasePin {
    Floating => "floating",
    Alias => "alias",
    Exact => "exact",
});

object!(Capabilities {
    input_modalities: doc,
    max_context_tokens: u64,
    max_output_tokens: u64,
    max_response_bytes: u64,
    output_modalities: doc,
    refusal: doc,
    regions: doc,
    release_pin: doc,
    retention_days: u64,
    sampling_controls: doc,
    streaming_events: doc,
    structured_output: doc,
    tool_calls: doc,
});
