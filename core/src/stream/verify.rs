//! Replaying a bundle's stream event log against its attempts.

use crate::attempt::Attempts;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;
use crate::limits::MAX_SAFE_INTEGER;
use crate::outcome::Outcome;

use super::{digest_list, raw_of, EventKind, EventLog, StreamAction, StreamEvent, StreamMode};

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
