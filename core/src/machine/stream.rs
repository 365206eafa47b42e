//! The stream layer of the run machine: what a streamed attempt leaves in
//! the journal so that a resumed run rebuilds the consumer's event log.
//!
//! An observed streamed attempt is journaled with the SHA-256 of each delta
//! it received (`delta_digests` of its `observed` event, omitted when it
//! received none); they hash to its stream record's `deltas_sha256`, which
//! the replay checks. On resume the session rebuilds the log from them and
//! from the actions the replay took ([`crate::stream`]).
//!
//! An attempt cut by a crash has no observation: it is reconciled with the
//! receiver like any other. The journal holds none of its events, so the
//! attempt is adopted with an empty stream record: `failed_no_effect` lets
//! the plan send again; a `succeeded` answer is read as
//! `succeeded_stream_lost` (the run cannot commit output it never recorded,
//! and never sends it again: `stop_indeterminate`); `unknown` stays
//! indeterminate. A run therefore never commits twice.
//!
//! A streamed attempt's `dispatch` effect carries its [`Plan`]: how the
//! host delivers what it reads (as it arrives, or once the run commits),
//! how many events without text a fresh live attempt holds back until its
//! first text (a stream cut before any text then reaches the consumer not
//! at all), the bound on its delta text and when its first event is due.
//! The host follows it and measures; it reads nothing of the contract.

use super::Observation;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Dispatch;
use crate::ids::Sha256Hex;
use crate::policy::CompiledPolicy;

/// Events without text a fresh live attempt holds back at most before its
/// first text; any more are delivered as they come.
pub const MAX_HELD: u64 = 256;

/// How the host reads and delivers one streamed attempt (the `stream` of
/// its `dispatch` effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Events reach the consumer as they arrive (`tentative`), or only once
    /// the run commits (`buffer`).
    pub live: bool,
    /// Hold back up to this many events without text until the attempt's
    /// first text (0: hold none: buffered, or a resumption whose chain
    /// delivered output already). Held events are delivered before that
    /// text, or when the stream ends with its terminal event; held events
    /// of a stream that broke were never delivered and are not reported.
    pub hold_without_text: u64,
    /// The bound on the attempt's delta text and on any one event, bytes.
    pub max_response_bytes: u64,
    /// The run clock by which the first event must arrive, ms (the
    /// first-byte timeout after the start, capped by the deadline); absent:
    /// the deadline alone.
    pub first_event_by_ms: Option<u64>,
    /// The longest wait between two events, ms (each wait capped by the
    /// deadline); absent: the deadline alone.
    pub idle_timeout_ms: Option<u64>,
}

impl Encode for Plan {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .str("deliver", if self.live { "live" } else { "buffer" })
            .opt_u64("first_event_by_ms", self.first_event_by_ms)
            .u64("hold_without_text", self.hold_without_text)
            .opt_u64("idle_timeout_ms", self.idle_timeout_ms)
            .u64("max_response_bytes", self.max_response_bytes)
            .end();
    }
}

/// The plan of attempt `d` started at `started_at_ms`, under a stream
/// contract (none without one).
pub(super) fn plan(cp: &CompiledPolicy, d: &Dispatch, started_at_ms: u64) -> Option<Plan> {
    let c = cp.policy.stream.as_ref()?;
    let live = c.mode.is_live();
    let first = c
        .first_byte_timeout_ms
        .map(|t| started_at_ms.saturating_add(t).min(d.deadline_ms));
    Some(Plan {
        live,
        hold_without_text: if live && d.continuation.is_none() {
            MAX_HELD
        } else {
            0
        },
        max_response_bytes: c.max_response_bytes,
        first_event_by_ms: first,
        idle_timeout_ms: c.idle_timeout_ms,
    })
}

/// A host that streams (the options' `stream`) needs a stream contract.
pub(super) fn check(cp: &CompiledPolicy, streams: bool) -> Result<()> {
    if streams && cp.policy.stream.is_none() {
        return Err(Error::at(
            ErrorCode::InvalidStreamContract,
            "/stream",
            "a streamed run needs a policy with a stream section (mode, max_response_bytes)",
        ));
    }
    Ok(())
}

/// The digests of a streamed attempt's deltas, in order (none without a
/// stream contract, where deltas are refused anyway).
pub(super) fn digests(cp: &CompiledPolicy, obs: &Observation) -> Vec<Sha256Hex> {
    if cp.policy.stream.is_none() {
        return Vec::new();
    }
    obs.deltas
        .iter()
        .map(|d| {
            Sha256Hex::computed(crate::canonical::hex(&crate::stream::delta_digest(
                d.as_bytes(),
            )))
        })
        .collect()
}
