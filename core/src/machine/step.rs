//! Applying one event: the step it answers, what follows it, and the
//! store reads, writes and journal appends the machine asks for.

use std::sync::Arc;

use crate::error::{Error, ErrorCode, Result};
use crate::journal::{Answer, AnswerKind, Entry};
use crate::session::Session;

use super::{fleet, unexpected, Cas, Effect, Event, Machine, ReadFor, Stage, Then};

impl Machine {
    pub(super) fn step(&mut self, event: Event) -> Result<()> {
        let stage = self.stage.clone();
        match (stage, event) {
            (Stage::Appending(then), Event::Appended) => self.then(then),
            (Stage::Appending(_), Event::AppendRefused) => {
                self.stage = Stage::Failed;
                Err(Error::at(
                    ErrorCode::JournalStaleLease,
                    "/kind",
                    "the store refused the append: another owner holds the run",
                ))
            }
            (
                Stage::Reading {
                    reads,
                    why,
                    conflicts,
                },
                Event::Read { now_ms, rows },
            ) => {
                self.clock(now_ms)?;
                self.on_read(reads, why, conflicts, &rows, false)
            }
            (
                Stage::Reading {
                    reads,
                    why,
                    conflicts,
                },
                Event::StoreUnavailable { now_ms },
            ) => {
                self.clock(now_ms)?;
                self.on_read(reads, why, conflicts, &[], true)
            }
            (
                Stage::Writing {
                    reads,
                    why,
                    conflicts,
                    count,
                    then,
                },
                Event::Written { written },
            ) => {
                let Some(conflicts) = self.unwritten(written, count, conflicts)? else {
                    return self.then(then);
                };
                // Read again and decide again under the fresh state.
                let reads = match why {
                    ReadFor::Admission => self.admission_reads(),
                    ReadFor::Settlement | ReadFor::Release(_) => reads,
                };
                self.read(reads, why, conflicts);
                Ok(())
            }
            (Stage::Reconciling { asked: false, .. }, Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.advance()
            }
            (Stage::Sleeping(then), Event::Clock { now_ms }) => {
                self.clock(now_ms)?;
                self.then(then)
            }
            (
                Stage::Sleeping(Then::Plan | Then::Ready)
                | Stage::Reading {
                    why: ReadFor::Admission,
                    ..
                },
                Event::Cancelled { at_ms },
            ) => {
                self.clock(at_ms)?;
                self.cancel(at_ms)
            }
            // The caller cancelled before the attempt was sent (nothing went
            // out): a run without a journal, whose `dispatched` is not
            // durable yet, is cancelled as between attempts. The planned
            // cancel of a job left running is sent whatever the caller did.
            (Stage::InFlight { .. }, Event::Cancelled { at_ms })
                if self.journal.is_none()
                    && matches!(self.effect, Effect::Dispatch { .. } | Effect::Poll { .. }) =>
            {
                self.clock(at_ms)?;
                self.cancel(at_ms)
            }
            (Stage::InFlight { started_at_ms }, Event::Observed(obs)) => {
                self.observe(started_at_ms, *obs)
            }
            (
                Stage::Reconciling {
                    attempt,
                    mut reconciliation,
                    asked: true,
                    ..
                },
                Event::Reconciled {
                    answer,
                    at_ms,
                    cost,
                    job_id,
                },
            ) => {
                self.clock(at_ms)?;
                reconciliation.answers.push(Answer {
                    answer,
                    at_ms,
                    cost: cost.filter(|_| answer != AnswerKind::InProgress),
                    job_sha256: job_id.as_deref().map(crate::job::job_id_digest),
                });
                self.reconciled(attempt, reconciliation)
            }
            (_, event) => Err(unexpected(&event, &self.effect)),
        }
    }

    /// Go on to `then`.
    pub(super) fn then(&mut self, then: Then) -> Result<()> {
        self.stage = match then {
            Then::Plan => Stage::Plan,
            Then::Ready => Stage::Ready,
            Then::Send => Stage::Send,
            Then::Log => Stage::Log,
            Then::Done => Stage::Done,
            Then::Cancel(at) => {
                self.session.cancel(at)?;
                Stage::Plan
            }
            Then::Resync => {
                let Some((writer, _)) = &self.journal else {
                    return Err(Error::new(
                        ErrorCode::JournalOutOfOrder,
                        "an adopted attempt without a journal",
                    ));
                };
                let mut session = Session::start(Arc::clone(&self.policy));
                if let Some(s) = &self.schedule {
                    session.set_price_schedule(Arc::clone(s))?;
                }
                session.resume_admitting(writer.replayed().clone())?;
                self.session = session;
                Stage::Plan
            }
        };
        self.advance()
    }

    pub(super) fn admission_reads(&self) -> fleet::Reads {
        self.keys.admission()
    }

    pub(super) fn read(&mut self, reads: fleet::Reads, why: ReadFor, conflicts: u64) {
        self.effect = Effect::Read { keys: reads.keys() };
        self.stage = Stage::Reading {
            reads,
            why,
            conflicts,
        };
    }

    pub(super) fn write(
        &mut self,
        reads: fleet::Reads,
        why: ReadFor,
        conflicts: u64,
        writes: Vec<Cas>,
        then: Then,
    ) -> Result<()> {
        if writes.is_empty() {
            return self.then(then);
        }
        let count = u64::try_from(writes.len()).unwrap_or(u64::MAX);
        self.effect = Effect::Write { writes };
        self.stage = Stage::Writing {
            reads,
            why,
            conflicts,
            count,
            then,
        };
        Ok(())
    }

    /// What a store's answer to a compare-and-set of `count` documents
    /// leaves: `None` when every write went through, else the conflicts in
    /// a row so far (a write lost to another writer: read again and decide
    /// again); `store_conflict` past the bound, `invalid_value` for more
    /// writes than asked.
    pub(super) fn unwritten(
        &self,
        written: u64,
        count: u64,
        conflicts: u64,
    ) -> Result<Option<u64>> {
        if written > count {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/written",
                format!("{written} writes reported of {count} asked"),
            ));
        }
        if written == count {
            return Ok(None);
        }
        let conflicts = conflicts.saturating_add(1);
        if conflicts > self.max_conflicts {
            return Err(Error::at(
                ErrorCode::StoreConflict,
                "/written",
                format!("the store write conflicted {conflicts} times in a row"),
            ));
        }
        Ok(Some(conflicts))
    }

    pub(super) fn append(&mut self, entries: &[Entry], then: Then) -> Result<()> {
        let Some((writer, _)) = self.journal.as_mut() else {
            return self.then(then);
        };
        // Every event of the write or none.
        let events = writer.append_all(entries)?;
        self.effect = Effect::Append { events };
        self.stage = Stage::Appending(then);
        Ok(())
    }
}
