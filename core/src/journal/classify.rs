//! A late or repeated append: a valid extension, a duplicate, or evidence
//! of a fenced owner that never changes a decision.

use super::event::JournalEvent;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::names;
use crate::error::{Error, ErrorCode, Result};
use crate::machine::replay::verify;
use crate::policy::CompiledPolicy;

/// What an event offered for a journal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It extends the journal validly: append it.
    Append,
    /// The journal already holds exactly this event (a repeated write).
    Duplicate,
    /// Written by a fenced owner (a lower lease generation than the
    /// journal's), or for a seq already taken by another event: keep it as
    /// evidence; it never changes a decision.
    Evidence {
        /// `stale_lease` or `seq_taken`.
        reason: EvidenceReason,
    },
}

/// Why an offered event is evidence only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceReason {
    /// Its owner was fenced: a newer lease generation wrote since.
    StaleLease,
    /// Another event holds its seq.
    SeqTaken,
}

names!(EvidenceReason {
    StaleLease => "stale_lease",
    SeqTaken => "seq_taken",
});

/// `{"kind", "reason"?, "lease_generation", "seq"}`: the offer's class, the
/// journal's lease generation and the offered event's seq.
pub struct Classified {
    /// The class.
    pub offer: Offer,
    /// The journal's highest lease generation.
    pub lease_generation: u64,
    /// The offered event's seq.
    pub seq: u64,
}

impl Encode for Classified {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        let kind = match self.offer {
            Offer::Append => "append",
            Offer::Duplicate => "duplicate",
            Offer::Evidence { .. } => "evidence",
        };
        o.str("kind", kind)
            .u64("lease_generation", self.lease_generation);
        if let Offer::Evidence { reason } = self.offer {
            o.doc("reason", &reason);
        }
        o.u64("seq", self.seq).end();
    }
}

/// Classify an event offered for a verified journal (a late append of an
/// old owner, a retried write): append, duplicate, or evidence. An event of
/// another run or past the next free seq is an error.
pub fn classify_append(
    cp: &CompiledPolicy,
    events: &[JournalEvent],
    event: &JournalEvent,
) -> Result<Classified> {
    let mut r = verify(cp, events)?;
    if let Some(run) = &r.tip.run_id {
        if &event.run_id != run {
            return Err(Error::at(
                ErrorCode::JournalWrongRun,
                "/event/run_id",
                format!("an event of run `{}` offered to `{run}`", event.run_id),
            ));
        }
    }
    let lease_generation = r.tip.lease_generation;
    let out = |offer| Classified {
        offer,
        lease_generation,
        seq: event.seq,
    };
    let held = usize::try_from(event.seq).ok().and_then(|s| events.get(s));
    if let Some(existing) = held {
        if existing == event {
            return Ok(out(Offer::Duplicate));
        }
        let reason = if event.lease_generation < lease_generation {
            EvidenceReason::StaleLease
        } else {
            EvidenceReason::SeqTaken
        };
        return Ok(out(Offer::Evidence { reason }));
    }
    if event.seq > r.tip.len {
        return Err(Error::at(
            ErrorCode::JournalSeqGap,
            "/event/seq",
            format!("seq {} skips ahead of {}", event.seq, r.tip.len),
        ));
    }
    if event.lease_generation < lease_generation {
        return Ok(out(Offer::Evidence {
            reason: EvidenceReason::StaleLease,
        }));
    }
    r.step(cp, event, events.len()).map_err(|mut e| {
        // The offered event is the input's `/event`.
        let i = events.len();
        if let Some(p) = e.path.take() {
            let prefix = format!("/events/{i}");
            e.path = Some(match p.strip_prefix(&prefix) {
                Some(rest) => format!("/event{rest}"),
                None => p,
            });
        }
        e
    })?;
    Ok(out(Offer::Append))
}
