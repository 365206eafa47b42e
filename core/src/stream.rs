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

use crate::attempt::Attempts;
use crate::canonical::{Encode, Sink};
use crate::decode::{decode_list, names, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Terminal;
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::{MAX_SAFE_INTEGER, MAX_STREAM_EVENTS, MAX_STREAM_RESPONSE_BYTES};
use crate::outcome::Outcome;

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

/// The stream side of a run's replay state: the pending chain and the counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Streaming {
    pub(crate) mode: StreamMode,
    /// Pending (delivered, not yet committed or invalidated) events per
    /// attempt of the chain: (ordinal, events).
    pub(crate) pending: Vec<(u64, u64)>,
    delivered: u64,
    committed: u64,
    invalidated: u64,
    resumed: u64,
}

impl Streaming {
    pub(crate) fn new(mode: StreamMode) -> Self {
        Self {
            mode,
            pending: Vec::new(),
            delivered: 0,
            committed: 0,
            invalidated: 0,
            resumed: 0,
        }
    }

    fn pending_events(&self) -> u64 {
        self.pending.iter().map(|(_, n)| *n).sum()
    }

    /// Whether a continuation may follow this attempt: output is pending and
    /// the provider named its response and numbered its events.
    pub(crate) fn may_continue(&self, record: &StreamRecord, outcome: &Outcome) -> bool {
        self.mode == StreamMode::Continuation
            && matches!(outcome, Outcome::Retryable { .. })
            && !record.terminal_event
            && record.violation.is_none()
            && record.response_id.is_some()
            && record.last_sequence.is_some()
            && self.pending_events() > 0
    }

    /// Account an observed attempt's events (before the decision).
    pub(crate) fn deliver(&mut self, ordinal: u64, record: &StreamRecord, completed: bool) {
        if record.continues_ordinal.is_some() {
            self.resumed = self.resumed.saturating_add(1);
        }
        let delivered = if self.mode.is_live() || completed {
            record.events
        } else {
            0
        };
        self.delivered = self.delivered.saturating_add(delivered);
        self.pending.push((ordinal, delivered));
    }

    /// The action once the decision after an attempt is known.
    pub(crate) fn settle(&mut self, terminal: Option<Terminal>, continues: bool) -> StreamAction {
        let pending = self.pending_events();
        if terminal == Some(Terminal::Completed) {
            self.committed = self.committed.saturating_add(pending);
            self.pending.clear();
            return StreamAction::Commit;
        }
        if continues {
            return StreamAction::Continue;
        }
        self.pending.clear();
        if pending == 0 {
            return StreamAction::None;
        }
        self.invalidated = self.invalidated.saturating_add(pending);
        StreamAction::Invalidate
    }

    pub(crate) fn summary(&self) -> StreamSummary {
        StreamSummary {
            committed_events: self.committed,
            delivered_events: self.delivered,
            invalidated_events: self.invalidated,
            mode: self.mode,
            resumed_attempts: self.resumed,
        }
    }
}

/// The record of an attempt from the host's facts and its deltas' digests.
pub(crate) fn record_of(
    facts: Option<&StreamFacts>,
    deltas: &[Digest],
    bytes: u64,
    continuation: Option<&Continuation>,
) -> StreamRecord {
    let f = facts.cloned().unwrap_or(StreamFacts {
        bytes: 0,
        events: 0,
        last_sequence: None,
        mode: None,
        response_id: None,
        terminal_event: false,
        usage_event: false,
        violation: None,
    });
    // A resumed stream need not repeat the response id, and one that broke
    // before its first event is still positioned where it resumed.
    StreamRecord {
        bytes,
        continues_ordinal: continuation.map(|c| c.continues_ordinal),
        deltas_sha256: digest_raw_list(deltas),
        events: u64::try_from(deltas.len()).unwrap_or(MAX_SAFE_INTEGER),
        last_sequence: f.last_sequence.or(continuation.map(|c| c.starting_after)),
        response_id: f
            .response_id
            .or_else(|| continuation.map(|c| c.response_id.clone())),
        starting_after: continuation.map(|c| c.starting_after),
        terminal_event: f.terminal_event,
        usage_event: f.usage_event,
        violation: f.violation,
    }
}

/// One event of the log, compact: documents are written only when asked for.
#[derive(Debug, Clone, Copy)]
struct Entry {
    attempt_ordinal: u64,
    kind: EventKind,
    status: EventStatus,
    /// A delta's digest, or a commit's.
    digest: Option<Digest>,
}

/// Builds the consumer's event log as a session observes attempts.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventLog {
    entries: Vec<Entry>,
    pending: Vec<Digest>,
    /// The pending deltas' list digest, when they are one attempt's (its
    /// record already holds it: the commit need not hash the list again).
    pending_digest: Option<Sha256Hex>,
}

impl EventLog {
    fn push(
        &mut self,
        attempt_ordinal: u64,
        kind: EventKind,
        status: EventStatus,
        digest: Option<Digest>,
    ) {
        self.entries.push(Entry {
            attempt_ordinal,
            kind,
            status,
            digest,
        });
    }

    /// Append an attempt's deltas (as the consumer received them) and the
    /// action that closed it.
    pub(crate) fn append(
        &mut self,
        mode: StreamMode,
        ordinal: u64,
        deltas: Vec<Digest>,
        deltas_sha256: Option<&Sha256Hex>,
        action: StreamAction,
    ) {
        let live = mode.is_live();
        if live || action == StreamAction::Commit {
            let status = if live {
                EventStatus::Tentative
            } else {
                EventStatus::Committed
            };
            self.entries.reserve(deltas.len());
            for d in &deltas {
                self.push(ordinal, EventKind::Delta, status, Some(*d));
            }
            self.pending_digest = match (self.pending.is_empty(), deltas_sha256) {
                (true, Some(d)) => Some(d.clone()),
                _ => None,
            };
            self.pending.extend(deltas);
        }
        self.close(ordinal, action);
    }

    /// Close the pending chain with an action (commit or invalidate).
    pub(crate) fn close(&mut self, ordinal: u64, action: StreamAction) {
        match action {
            StreamAction::Commit => {
                let list = match self.pending_digest.take() {
                    Some(d) => d,
                    None => digest_raw_list(&self.pending),
                };
                let committed = raw_of(&list);
                self.pending.clear();
                self.push(
                    ordinal,
                    EventKind::Commit,
                    EventStatus::Committed,
                    Some(committed),
                );
            }
            StreamAction::Invalidate => {
                self.pending.clear();
                self.pending_digest = None;
                self.push(
                    ordinal,
                    EventKind::Invalidate,
                    EventStatus::Invalidated,
                    None,
                );
            }
            StreamAction::None | StreamAction::Continue => {}
        }
    }

    /// The log a replay implies: each attempt's delivered deltas (given by
    /// index) and the action after it, then the action after a cancellation.
    pub(crate) fn replayed(
        mode: StreamMode,
        attempts: &Attempts,
        actions: &[StreamAction],
        deltas: impl Fn(usize) -> Vec<Digest>,
    ) -> Self {
        let mut log = Self::default();
        for (i, a) in attempts.attempts.iter().enumerate() {
            let action = actions.get(i).copied().unwrap_or(StreamAction::None);
            log.append(mode, a.ordinal, deltas(i), None, action);
        }
        if let Some(&last) = actions.get(attempts.attempts.len()) {
            let ordinal = attempts.attempts.last().map_or(0, |a| a.ordinal);
            log.close(ordinal, last);
        }
        log
    }

    /// How many events the log holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The log's documents.
    pub(crate) fn events(&self, policy_sha256: &Sha256Hex) -> Vec<StreamEvent> {
        self.entries
            .iter()
            .zip(1u64..)
            .map(|(e, sequence)| {
                let digest = e.digest.as_ref().map(hex_of);
                let (delta, committed) = match e.kind {
                    EventKind::Delta => (digest, None),
                    EventKind::Commit => (None, digest),
                    EventKind::Invalidate => (None, None),
                };
                StreamEvent {
                    attempt_ordinal: e.attempt_ordinal,
                    committed_sha256: committed,
                    delta_sha256: delta,
                    kind: e.kind,
                    policy_sha256: policy_sha256.clone(),
                    schema: StreamEventSchema,
                    sequence,
                    status: e.status,
                }
            })
            .collect()
    }
}

/// The consumer's event log a verified journal implies: each attempt's
/// deltas as its `observed` event lists them, and the action the replay took
/// after it. An attempt whose received events the journal does not list (a
/// journal written before the digests were journaled) cannot be resumed:
/// `invalid_stream_contract`.
pub(crate) fn log_of(mode: StreamMode, replayed: &crate::journal::Replayed) -> Result<EventLog> {
    let digests = replayed.delta_digests();
    for (i, a) in replayed.attempts().attempts.iter().enumerate() {
        let received = a.stream.as_ref().map_or(0, |s| s.events);
        let listed = digests.get(i).map_or(0, Vec::len);
        if received > 0 && u64::try_from(listed).unwrap_or(u64::MAX) != received {
            return Err(Error::at(
                ErrorCode::InvalidStreamContract,
                format!("/attempts/attempts/{i}/stream"),
                format!(
                    "attempt {} received {received} events the journal does not list: its consumer's log cannot be rebuilt",
                    a.ordinal
                ),
            ));
        }
    }
    Ok(EventLog::replayed(
        mode,
        replayed.attempts(),
        replayed.stream_actions(),
        |i| {
            digests
                .get(i)
                .map(|v| v.iter().map(raw_of).collect())
                .unwrap_or_default()
        },
    ))
}

/// A hex digest back to its bytes (digests in documents are checked lowercase hex).
pub(crate) fn raw_of(d: &Sha256Hex) -> Digest {
    let mut raw = [0u8; 32];
    let nibble = |c: u8| {
        (c as char)
            .to_digit(16)
            .and_then(|v| u8::try_from(v).ok())
            .unwrap_or(0)
    };
    for (slot, pair) in raw.iter_mut().zip(d.as_str().as_bytes().chunks(2)) {
        if let [hi, lo] = pair {
            *slot = (nibble(*hi) << 4) | nibble(*lo);
        }
    }
    raw
}

fn drift(code: ErrorCode, index: usize, field: &str, message: String) -> Error {
    Error::at(code, format!("/stream_events/{index}/{field}"), message)
}

/// Replay a bundle's event log against its attempts. The first problem is an
/// error: `stream_splice` (output of two attempts that are not one
/// continuation chain, joined), `stream_commit_before_terminal` (a commit
/// for an attempt that did not succeed with the provider's terminal event),
/// `stream_delta_after_invalidate`, `stream_deltas_mismatch` (the deltas do
/// not hash to what the attempt recorded), and `stream_event_drift` for
/// anything else that differs from the log the attempts imply.
pub fn verify_events(
    policy_sha256: &Sha256Hex,
    mode: StreamMode,
    attempts: &Attempts,
    actions: &[StreamAction],
    events: &[StreamEvent],
) -> Result<()> {
    let attempt = |ordinal: u64| {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| o.checked_sub(1))
            .and_then(|i| attempts.attempts.get(i))
    };
    let mut invalidated: Vec<u64> = Vec::new();
    let mut chain: Vec<u64> = Vec::new();
    let mut chain_deltas: Vec<Sha256Hex> = Vec::new();
    let mut per_attempt: Vec<Vec<Sha256Hex>> = vec![Vec::new(); attempts.attempts.len()];
    let mut committed = false;
    for (i, e) in events.iter().enumerate() {
        let expected = u64::try_from(i)
            .unwrap_or(MAX_SAFE_INTEGER)
            .saturating_add(1);
        if e.sequence != expected {
            return Err(drift(
                ErrorCode::StreamEventDrift,
                i,
                "sequence",
                format!("sequence {} where {expected} is next", e.sequence),
            ));
        }
        if &e.policy_sha256 != policy_sha256 {
            return Err(drift(
                ErrorCode::StreamEventDrift,
                i,
                "policy_sha256",
                "the event belongs to another run".into(),
            ));
        }
        let Some(a) = attempt(e.attempt_ordinal) else {
            return Err(drift(
                ErrorCode::StreamEventDrift,
                i,
                "attempt_ordinal",
                format!("no attempt {}", e.attempt_ordinal),
            ));
        };
        if committed {
            return Err(drift(
                ErrorCode::StreamEventDrift,
                i,
                "kind",
                "an event after the commit".into(),
            ));
        }
        match e.kind {
            EventKind::Delta => {
                if invalidated.contains(&e.attempt_ordinal) {
                    return Err(drift(
                        ErrorCode::StreamDeltaAfterInvalidate,
                        i,
                        "attempt_ordinal",
                        format!(
                            "a delta of attempt {} after its events were invalidated",
                            e.attempt_ordinal
                        ),
                    ));
                }
                if let Some(&last) = chain.last() {
                    let continues = a.stream.as_ref().and_then(|s| s.continues_ordinal);
                    if last != e.attempt_ordinal && continues != Some(last) {
                        return Err(drift(
                            ErrorCode::StreamSplice,
                            i,
                            "attempt_ordinal",
                            format!(
                                "a delta of attempt {} joins pending output of attempt {last}, which it does not continue",
                                e.attempt_ordinal
                            ),
                        ));
                    }
                }
                let Some(d) = &e.delta_sha256 else {
                    return Err(drift(
                        ErrorCode::StreamEventDrift,
                        i,
                        "delta_sha256",
                        "a delta without its digest".into(),
                    ));
                };
                if chain.last() != Some(&e.attempt_ordinal) {
                    chain.push(e.attempt_ordinal);
                }
                chain_deltas.push(d.clone());
                if let Some(v) = usize::try_from(e.attempt_ordinal)
                    .ok()
                    .and_then(|o| per_attempt.get_mut(o.saturating_sub(1)))
                {
                    v.push(d.clone());
                }
            }
            EventKind::Invalidate => {
                invalidated.append(&mut chain);
                chain_deltas.clear();
            }
            EventKind::Commit => {
                let done = a.outcome == Outcome::Success
                    && a.stream.as_ref().is_some_and(|s| s.terminal_event);
                if !done {
                    return Err(drift(
                        ErrorCode::StreamCommitBeforeTerminal,
                        i,
                        "attempt_ordinal",
                        format!(
                            "attempt {} did not succeed with the provider's terminal event",
                            e.attempt_ordinal
                        ),
                    ));
                }
                for (&before, &after) in chain.iter().zip(chain.iter().skip(1)) {
                    let continues = attempt(after)
                        .and_then(|a| a.stream.as_ref())
                        .and_then(|s| s.continues_ordinal);
                    if continues != Some(before) {
                        return Err(drift(
                            ErrorCode::StreamSplice,
                            i,
                            "committed_sha256",
                            format!("the commit joins attempts {before} and {after}"),
                        ));
                    }
                }
                if let Some(&last) = chain.last() {
                    if last != e.attempt_ordinal {
                        return Err(drift(
                            ErrorCode::StreamSplice,
                            i,
                            "attempt_ordinal",
                            format!(
                                "the commit of attempt {} covers output of attempt {last}",
                                e.attempt_ordinal
                            ),
                        ));
                    }
                }
                if e.committed_sha256.as_ref() != Some(&digest_list(&chain_deltas)) {
                    return Err(drift(
                        ErrorCode::StreamDeltasMismatch,
                        i,
                        "committed_sha256",
                        "the commit's digest is not the digest of the deltas it commits".into(),
                    ));
                }
                committed = true;
            }
        }
    }
    for (i, a) in attempts.attempts.iter().enumerate() {
        let Some(s) = &a.stream else { continue };
        let delivered = per_attempt.get(i).map_or(&[][..], Vec::as_slice);
        let expected_count = if mode.is_live() || actions.get(i) == Some(&StreamAction::Commit) {
            s.events
        } else {
            0
        };
        let count = u64::try_from(delivered.len()).unwrap_or(MAX_SAFE_INTEGER);
        let digest_differs = expected_count > 0 && digest_list(delivered) != s.deltas_sha256;
        if count != expected_count || digest_differs {
            return Err(Error::at(
                ErrorCode::StreamDeltasMismatch,
                format!("/attempts/attempts/{i}/stream/deltas_sha256"),
                format!(
                    "attempt {} recorded {expected_count} delivered deltas; the log holds {count}{}",
                    a.ordinal,
                    if digest_differs {
                        " with other digests"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    // The actions the replay took must each appear, in order.
    let expected = EventLog::replayed(mode, attempts, actions, |i| {
        per_attempt
            .get(i)
            .map(|v| v.iter().map(raw_of).collect())
            .unwrap_or_default()
    });
    let fresh = expected.events(policy_sha256);
    for (i, (sealed, replayed)) in events.iter().zip(fresh.iter()).enumerate() {
        if sealed != replayed {
            return Err(drift(
                ErrorCode::StreamEventDrift,
                i,
                "kind",
                format!(
                    "event {} is a {} ({}) of attempt {}; the replay gives a {} ({}) of attempt {}",
                    sealed.sequence,
                    sealed.kind.as_str(),
                    sealed.status.as_str(),
                    sealed.attempt_ordinal,
                    replayed.kind.as_str(),
                    replayed.status.as_str(),
                    replayed.attempt_ordinal
                ),
            ));
        }
    }
    if events.len() != fresh.len() {
        return Err(Error::at(
            ErrorCode::StreamEventDrift,
            format!("/stream_events/{}", events.len().min(fresh.len())),
            format!(
                "the log holds {} events; the replay gives {}",
                events.len(),
                fresh.len()
            ),
        ));
    }
    Ok(())
}
