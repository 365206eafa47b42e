//! The stream side of a session: observing a streamed attempt and the
//! events the consumer received.

use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Decision;
use crate::observe::{judge_at, Facts, Judgement};
use crate::stream::{delta_digest, StreamEvent};

use super::{Charge, Session};

impl Session {
    /// [`Session::observe`] for a streamed run: `deltas` are the texts of
    /// the events the attempt received, in order (their count and UTF-8
    /// bytes must match `facts.stream`). The session fills in the stream
    /// mode, records the attempt's stream, appends the consumer's events to
    /// the run's log and says in the judgement what the host does with them:
    /// `commit`, `invalidate`, `continue` (the next dispatch resumes this
    /// response) or `none`.
    pub fn observe_stream<S: AsRef<str>>(
        &mut self,
        started_at_ms: u64,
        completed_at_ms: u64,
        cost: Option<u64>,
        facts: &Facts,
        deltas: &[S],
    ) -> Result<Judgement> {
        let index = self.attempts.attempts.len();
        let (deadline_ms, reserve_cost) = match self.run.next() {
            Decision::Dispatch(d) => (d.deadline_ms, d.reserve_cost),
            Decision::Terminal { .. } => (u64::MAX, 0),
        };
        // The route the attempt went to (after an admission, the one it admitted).
        let family = match self.next() {
            Decision::Dispatch(d) => self
                .policy
                .policy
                .routes
                .iter()
                .find(|r| r.route_id == d.route_id)
                .and_then(|r| r.provider_family),
            Decision::Terminal { .. } => None,
        };
        let mode = self.policy.policy.stream.as_ref().map(|s| s.mode);
        let bad = |field: &str, msg: String| {
            Err(Error::attempt(ErrorCode::InvalidValue, index, field, msg))
        };
        let mut stream_facts = facts.stream.clone();
        let bytes: u64 = deltas
            .iter()
            .map(|d| u64::try_from(d.as_ref().len()).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add);
        let events = u64::try_from(deltas.len()).unwrap_or(u64::MAX);
        match (mode, stream_facts.as_mut()) {
            (None, Some(_)) => {
                return Err(Error::attempt(
                    ErrorCode::StreamRecordUnexpected,
                    index,
                    "stream",
                    "the facts describe a stream the policy does not have",
                ))
            }
            (None, None) if events > 0 => {
                return bad(
                    "stream",
                    "deltas for a policy without a stream contract".into(),
                )
            }
            (Some(_), None) if events > 0 => {
                return bad("stream/events", "deltas without stream facts".into())
            }
            (Some(m), Some(s)) => {
                if s.mode.is_some_and(|given| given != m) {
                    return bad(
                        "stream/mode",
                        format!("the policy's stream mode is {}", m.as_str()),
                    );
                }
                s.mode = Some(m);
                if s.events != events {
                    return bad(
                        "stream/events",
                        format!("{} events reported, {events} deltas given", s.events),
                    );
                }
                if s.bytes != bytes {
                    return bad(
                        "stream/bytes",
                        format!("{} bytes reported, the deltas hold {bytes}", s.bytes),
                    );
                }
            }
            _ => {}
        }
        let judged = Facts {
            provider_family: family.or(facts.provider_family),
            stream: stream_facts,
            ..facts.clone()
        };
        let mut judgement = judge_at(&judged, completed_at_ms >= deadline_ms)?;
        self.notes.status = judged.status;
        self.notes.output_check = if judgement.rule == crate::observe::Rule::OutputCheck {
            crate::output::judge_checks(&judged.output_checks).map(|(_, record)| record)
        } else {
            None
        };
        let stream = mode.map(|_| {
            let digests = deltas
                .iter()
                .map(|d| delta_digest(d.as_ref().as_bytes()))
                .collect();
            (judged.stream.as_ref(), digests, bytes)
        });
        let action = self.push(
            started_at_ms,
            completed_at_ms,
            cost.map_or(Charge::Reserved(reserve_cost), Charge::Charged),
            judgement.outcome,
            stream,
            crate::observe::injected(facts),
        );
        // A drift leaves the session as it was: no check held for a later attempt.
        if action.is_err() {
            self.notes.output_check = None;
        }
        let action = action?;
        if mode.is_some() {
            judgement.stream = Some(action);
        }
        Ok(judgement)
    }

    /// The events the consumer received so far (a streamed run), as documents.
    pub fn stream_events(&self) -> Vec<StreamEvent> {
        self.log.events(&self.policy_sha256)
    }

    /// How many events the consumer received so far.
    pub fn stream_event_count(&self) -> usize {
        self.log.len()
    }
}
