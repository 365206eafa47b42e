//! The stream side of a run: the pending chain and its counts, each
//! attempt's stream record, and the event log the consumer received.

use crate::attempt::Attempts;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Terminal;
use crate::ids::Sha256Hex;
use crate::limits::MAX_SAFE_INTEGER;
use crate::outcome::Outcome;

use super::{
    digest_raw_list, hex_of, Continuation, Digest, EventKind, EventStatus, StreamAction,
    StreamEvent, StreamEventSchema, StreamFacts, StreamMode, StreamRecord, StreamSummary,
};

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
pub(crate) fn log_of(mode: StreamMode, replayed: &crate::machine::replay::Log) -> Result<EventLog> {
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
