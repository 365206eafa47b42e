//! Streaming: the policy's stream contract, what a host saw of a stream, the
//! stream record of an attempt, the events the consumer received, and their
//! replay.
//!
//! A stream contract (`stream` in the policy) says what happens to output
//! that reached the consumer before an attempt failed:
//!
//! - `buffer`: nothing reaches the consumer until the attempt succeeded, so a
//!   failure is judged as usual;
//! - `tentative`: events reach the consumer as they arrive, marked tentative;
//!   a failed attempt's events are invalidated (an `invalidate` event the
//!   consumer must honour) before any event of a later attempt, which may
//!   retry or fall back;
//! - `continuation`: like `tentative`, but a retryable failure after output
//!   resumes the same provider response (its id, after the last sequence
//!   number seen) on the same route; the resumed events continue the output;
//! - `restart`: a failure after output stops `stop_indeterminate`
//!   (`stream_interrupted_after_output`) after invalidating the events; the
//!   caller restarts explicitly.
//!
//! The run commits exactly once, when it completes: one `commit` event over
//! the chain of attempts whose events are pending (one attempt, or an attempt
//! and its continuations). Output of two attempts that are not a continuation
//! chain is never committed together. Each delta event carries the SHA-256 of
//! the delta's text; each attempt records the digest of its deltas' digests,
//! so the receipt binds what was delivered, and [`verify_events`] replays the
//! event log of a bundle against its attempts.

use serde_json::Value;

use crate::canonical::{Encode, Sink};
use crate::decode::{decode_list, names, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::{MAX_STREAM_EVENTS, MAX_STREAM_RESPONSE_BYTES};

mod run;
mod verify;

pub(crate) use run::{log_of, raw_of, record_of, EventLog, Streaming};
pub use verify::verify_events;

schema_marker!(
    /// `retryledger.stream_event.v1`
    StreamEventSchema = "retryledger.stream_event.v1"
);

/// What happens to output delivered before a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// Deliver nothing until the attempt succeeded.
    Buffer,
    /// Deliver tentatively; invalidate a failed attempt's events, then go on.
    Tentative,
    /// Deliver tentatively; resume the same provider response after a failure.
    Continuation,
    /// Deliver tentatively; stop indeterminate after a failure with output.
    Restart,
}

names!(StreamMode {
    Buffer => "buffer",
    Tentative => "tentative",
    Continuation => "continuation",
    Restart => "restart",
});

impl StreamMode {
    /// Whether events reach the consumer as they arrive.
    pub fn is_live(self) -> bool {
        self != Self::Buffer
    }
}

/// The policy's `stream` section. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamContract {
    /// Longest wait for a stream's first event, ms (inside the run's deadline).
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest wait between two events, ms (inside the run's deadline).
    pub idle_timeout_ms: Option<u64>,
    /// Most bytes of delta text one attempt may deliver; also the bound on a
    /// host's buffer and on any single event.
    pub max_response_bytes: u64,
    /// What happens to delivered output when an attempt fails.
    pub mode: StreamMode,
}

object!(StreamContract {
    first_byte_timeout_ms: opt_u64,
    idle_timeout_ms: opt_u64,
    max_response_bytes: u64,
    mode: doc,
});

impl StreamContract {
    /// Check the contract against the run's deadline.
    pub(crate) fn check(&self, deadline_ms: u64) -> Result<()> {
        let bad = |field: &str, msg: String| {
            Err(Error::at(
                ErrorCode::InvalidStreamContract,
                format!("/stream/{field}"),
                msg,
            ))
        };
        if self.max_response_bytes == 0 || self.max_response_bytes > MAX_STREAM_RESPONSE_BYTES {
            return bad(
                "max_response_bytes",
                format!("max_response_bytes must be in 1..={MAX_STREAM_RESPONSE_BYTES}"),
            );
        }
        for (field, v) in [
            ("first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ] {
            if let Some(v) = v {
                if v == 0 || v > deadline_ms {
                    return bad(
                        field,
                        format!("{field} must be in 1..=deadline_ms ({deadline_ms})"),
                    );
                }
            }
        }
        Ok(())
    }
}

/// A broken stream protocol a host detected; the attempt is a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A frame that is not a valid event.
    MalformedEvent,
    /// One event larger than the response limit.
    EventTooLarge,
    /// The attempt's delta text exceeded `max_response_bytes`.
    ResponseTooLarge,
    /// A sequence number that did not increase.
    SequenceBack,
    /// A resumed stream that did not start right after `starting_after`.
    SequenceGap,
    /// A usage event with impossible counts.
    ImpossibleUsage,
}

names!(Violation {
    MalformedEvent => "malformed_event",
    EventTooLarge => "event_too_large",
    ResponseTooLarge => "response_too_large",
    SequenceBack => "sequence_back",
    SequenceGap => "sequence_gap",
    ImpossibleUsage => "impossible_usage",
});

/// What a host saw of one stream that opened (the dispatch returned a
/// stream). Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFacts {
    /// Bytes of the delivered events' delta text (UTF-8).
    pub bytes: u64,
    /// Provider events delivered (under `buffer`: received); a host holds a
    /// fresh attempt's events without text until its first event with text
    /// and does not report held events it never delivered.
    pub events: u64,
    /// The provider's sequence number of the last delivered event, when it numbers them.
    pub last_sequence: Option<u64>,
    /// The policy's stream mode (a session fills it in).
    pub mode: Option<StreamMode>,
    /// The provider's response id, when it sent one.
    pub response_id: Option<Identifier>,
    /// The provider's terminal event arrived.
    pub terminal_event: bool,
    /// A usage event arrived.
    pub usage_event: bool,
    /// A protocol violation the host detected.
    pub violation: Option<Violation>,
}

object!(StreamFacts {
    bytes: u64,
    events: u64,
    last_sequence: opt_u64,
    mode: opt_doc,
    response_id: opt_doc,
    terminal_event: bool,
    usage_event: bool,
    violation: opt_doc,
});

impl StreamFacts {
    /// Whether events reached the consumer before the attempt ended.
    pub fn delivered_live(&self) -> bool {
        self.events > 0 && self.mode.is_none_or(StreamMode::is_live)
    }
}

/// The stream record of one attempt. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// Bytes of delta text received (UTF-8).
    pub bytes: u64,
    /// The attempt this one resumes (a continuation).
    pub continues_ordinal: Option<u64>,
    /// SHA-256 of the deltas' digests (32 raw bytes each) concatenated in order.
    pub deltas_sha256: Sha256Hex,
    /// Events received from the provider.
    pub events: u64,
    /// The provider's sequence number of the last event.
    pub last_sequence: Option<u64>,
    /// The provider's response id.
    pub response_id: Option<Identifier>,
    /// For a continuation: the provider sequence number it resumed after.
    pub starting_after: Option<u64>,
    /// The provider's terminal event arrived.
    pub terminal_event: bool,
    /// A usage event arrived.
    pub usage_event: bool,
    /// A protocol violation the host detected.
    pub violation: Option<Violation>,
}

object!(StreamRecord {
    bytes: u64,
    continues_ordinal: opt_u64,
    deltas_sha256: doc,
    events: u64,
    last_sequence: opt_u64,
    response_id: opt_doc,
    starting_after: opt_u64,
    terminal_event: bool,
    usage_event: bool,
    violation: opt_doc,
});

/// A planned continuation: resume a provider response. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The attempt whose response is resumed.
    pub continues_ordinal: u64,
    /// The provider's response id.
    pub response_id: Identifier,
    /// Resume after this provider sequence number.
    pub starting_after: u64,
}

object!(Continuation {
    continues_ordinal: u64,
    response_id: doc,
    starting_after: u64,
});

/// What a host does with the consumer's events after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamAction {
    /// Nothing: no output is pending, or none reached the consumer.
    None,
    /// The run completed: commit the pending events (under `buffer`, deliver
    /// the buffered events first).
    Commit,
    /// The pending events are void: send an `invalidate` before anything else.
    Invalidate,
    /// The next attempt resumes this response; the pending events stay.
    Continue,
}

names!(StreamAction {
    None => "none",
    Commit => "commit",
    Invalidate => "invalidate",
    Continue => "continue",
});

/// The kind of a stream event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Output from the provider.
    Delta,
    /// The pending output is final.
    Commit,
    /// The pending output is void.
    Invalidate,
}

names!(EventKind {
    Delta => "delta",
    Commit => "commit",
    Invalidate => "invalidate",
});

/// The validation state of an event when the consumer received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    /// Delivered before the attempt was judged.
    Tentative,
    /// Final.
    Committed,
    /// Void.
    Invalidated,
}

names!(EventStatus {
    Tentative => "tentative",
    Committed => "committed",
    Invalidated => "invalidated",
});

/// One event the consumer received. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvent {
    /// The attempt it belongs to (for a commit or invalidate: the last
    /// attempt of the chain it closes).
    pub attempt_ordinal: u64,
    /// For a commit: SHA-256 of the committed deltas' digests (32 raw bytes
    /// each) concatenated in order.
    pub committed_sha256: Option<Sha256Hex>,
    /// For a delta: SHA-256 of its text (UTF-8).
    pub delta_sha256: Option<Sha256Hex>,
    /// Delta, commit or invalidate.
    pub kind: EventKind,
    /// The run's policy digest (the run identity).
    pub policy_sha256: Sha256Hex,
    /// `retryledger.stream_event.v1`
    pub schema: StreamEventSchema,
    /// Position in the consumer's stream, from 1.
    pub sequence: u64,
    /// Tentative, committed or invalidated.
    pub status: EventStatus,
}

object!(StreamEvent {
    attempt_ordinal: u64,
    committed_sha256: opt_doc,
    delta_sha256: opt_doc,
    kind: doc,
    policy_sha256: doc,
    schema: doc,
    sequence: u64,
    status: doc,
});

/// The event log of a run, as a bundle carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamEvents(pub Vec<StreamEvent>);

impl Decode for StreamEvents {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_STREAM_EVENTS).map(Self)
    }
}

impl Encode for StreamEvents {
    fn encode(&self, sink: &mut dyn Sink) {
        crate::canonical::encode_list(self.0.iter(), sink);
    }
}

/// What the receipt says of a streamed run. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// Delta events committed.
    pub committed_events: u64,
    /// Delta events that reached the consumer.
    pub delivered_events: u64,
    /// Delta events invalidated.
    pub invalidated_events: u64,
    /// The stream mode.
    pub mode: StreamMode,
    /// Attempts that resumed a provider response.
    pub resumed_attempts: u64,
}

object!(StreamSummary {
    committed_events: u64,
    delivered_events: u64,
    invalidated_events: u64,
    mode: doc,
    resumed_attempts: u64,
});

/// A delta's digest: the raw SHA-256 of its text (hex only when written).
pub type Digest = [u8; 32];

fn hex64(d: &Digest) -> [u8; 64] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (pair, b) in out.chunks_exact_mut(2).zip(d.iter()) {
        if let ([hi, lo], Some(h), Some(l)) = (
            pair,
            HEX.get(usize::from(b >> 4)),
            HEX.get(usize::from(b & 0xf)),
        ) {
            *hi = *h;
            *lo = *l;
        }
    }
    out
}

fn hex_of(d: &Digest) -> Sha256Hex {
    Sha256Hex::computed(String::from_utf8_lossy(&hex64(d)).into_owned())
}

/// SHA-256 of digests in order: of their 32 raw bytes each, concatenated
/// (no digest at all: SHA-256 of nothing).
fn digest_raw_list(digests: &[Digest]) -> Sha256Hex {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    for d in digests {
        h.update(d);
    }
    Sha256Hex::computed(crate::canonical::hex(&h.finalize()))
}

/// `digest_raw_list` of digests written as hex: SHA-256 of their raw bytes
/// concatenated in order.
pub fn digest_list<'a>(digests: impl IntoIterator<Item = &'a Sha256Hex>) -> Sha256Hex {
    let raw: Vec<Digest> = digests.into_iter().map(raw_of).collect();
    digest_raw_list(&raw)
}

/// The digest of one delta's text.
pub fn delta_digest(text: &[u8]) -> Digest {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(text).into()
}
