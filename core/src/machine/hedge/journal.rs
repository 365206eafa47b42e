//! The journal's side of a hedged run: each member's events appended, and a
//! resumed round's members in doubt reconciled with the receiver.

use super::super::{Effect, Machine};
use super::{After, Stage};
use crate::error::{Error, ErrorCode, Result};
use crate::journal::{Entry, Pending, Reconciliation, ReconciliationSchema, Recovery};

impl Machine {
    /// What the receiver's answers settle: ask again, or adopt the member's
    /// observation and journal it.
    pub(super) fn hedge_reconciled(
        &mut self,
        attempt: Pending,
        reconciliation: Reconciliation,
    ) -> Result<()> {
        let Some((writer, _)) = &self.journal else {
            return Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "a reconciliation without a journal",
            ));
        };
        match writer.recover(Some(&reconciliation))? {
            Recovery::Reconcile {
                not_before_ms,
                poll,
                ..
            } => {
                self.layer()?.stage = Stage::Reconciling {
                    attempt,
                    reconciliation,
                    not_before_ms,
                    poll,
                    asked: false,
                };
                self.hedge_advance()
            }
            Recovery::Adopt { attempt, .. } => {
                let ordinal = attempt.ordinal;
                let layer = self.layer()?;
                layer.session.adopted(attempt)?;
                layer.in_doubt.retain(|n| *n != ordinal);
                self.journal_observed(ordinal)
            }
            Recovery::Resume { .. } | Recovery::Done { .. } => Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "no member of the round waits for reconciliation",
            )),
        }
    }

    /// Journal member `ordinal`'s observation (and the round's decision
    /// once it is resolved), then go on.
    pub(super) fn journal_observed(&mut self, ordinal: u64) -> Result<()> {
        let layer = self.layer()?;
        layer.stage = Stage::Plan;
        let resolved = !layer.session.in_round();
        let attempt = layer.session.attempt_of_ordinal(ordinal).cloned();
        let (Some(attempt), true) = (attempt, self.journal.is_some()) else {
            return self.hedge_advance();
        };
        let mut entries = vec![Entry::Observed {
            attempt,
            delta_digests: Vec::new(),
        }];
        if resolved {
            entries.push(Entry::Decided);
        }
        self.hedge_append(&entries, After::Plan)
    }

    pub(super) fn hedge_append(&mut self, entries: &[Entry], after: After) -> Result<()> {
        let Some((writer, _)) = self.journal.as_mut() else {
            return Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "an append without a journal",
            ));
        };
        let events = writer.append_all(entries)?;
        self.effect = Effect::Append { events };
        self.layer()?.stage = Stage::Appending(after);
        Ok(())
    }

    /// Ask the receiver about the first member of the resumed round in
    /// flight, as the journal's recovery plans it.
    pub(super) fn hedge_reconcile(&mut self) -> Result<()> {
        let max_polls = self.layer()?.max_polls;
        let Some((writer, _)) = &self.journal else {
            return Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "a member in doubt without a journal",
            ));
        };
        let Recovery::Reconcile {
            attempt,
            not_before_ms,
            poll,
            ..
        } = writer.recover(None)?
        else {
            return Err(Error::new(
                ErrorCode::JournalOutOfOrder,
                "the journal holds no member in flight to reconcile",
            ));
        };
        self.layer()?.stage = Stage::Reconciling {
            reconciliation: Reconciliation {
                answers: Vec::new(),
                max_polls,
                ordinal: attempt.ordinal,
                schema: ReconciliationSchema,
            },
            attempt,
            not_before_ms,
            poll,
            asked: false,
        };
        self.hedge_advance()
    }
}
