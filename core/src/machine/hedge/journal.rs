//! The journal's side of a hedged run: each member's events appended, a
//! journaled run continued where its journal stops, and a resumed round's
//! members in doubt reconciled with the receiver.

use super::super::{Effect, Machine};
use super::rounds::{Member, Round};
use super::{After, Layer, Stage};
use crate::attempt::{Attempt, Attempts};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Run;
use crate::fleet::Admission;
use crate::hedge::decides;
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
                layer.adopted(attempt)?;
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
        let resolved = !layer.in_round();
        let attempt = layer.attempt_of_ordinal(ordinal).cloned();
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

impl Layer {
    /// Continue a journaled run: the rounds the journal resolved (`run`,
    /// `attempts`) and its open round, whose members in flight are in doubt
    /// (the round takes no more hedges).
    pub(super) fn resume_from(
        &mut self,
        run: Run,
        attempts: Attempts,
        open: Option<&crate::machine::replay::round::Round>,
    ) {
        let s = self;
        s.summary = run.hedge_summary().cloned().unwrap_or_default();
        s.run = run;
        s.attempts = attempts;
        s.round = open.map(|r| {
            let members: Vec<Member> = r
                .members
                .iter()
                .filter_map(|m| {
                    m.sent.as_ref().map(|sent| Member {
                        plan: m.plan.clone(),
                        started_at_ms: sent.started_at_ms,
                        admission: sent.admission.clone(),
                        attempt: m.attempt.clone(),
                    })
                })
                .collect();
            let decided = members
                .iter()
                .filter_map(|m| m.attempt.as_ref())
                .filter(|a| a.hedge.as_ref().is_none_or(|h| h.loss.is_none()))
                .filter(|a| decides(&s.policy, a))
                .min_by_key(|a| (a.completed_at_ms, a.ordinal))
                .map(|a| (a.ordinal, a.completed_at_ms));
            Round {
                members,
                closed: true,
                refused: false,
                decided,
            }
        });
    }

    /// Whether a round is open (attempts in flight or not yet resolved).
    pub(super) fn in_round(&self) -> bool {
        self.round.is_some()
    }

    /// The admission held for the dispatch on offer `ordinal`.
    pub(super) fn admitted_for(&self, ordinal: u64) -> Option<&Admission> {
        self.admitted
            .as_ref()
            .filter(|(n, _)| *n == ordinal)
            .map(|(_, a)| a)
    }

    /// Attempt `ordinal` as recorded (in the open round or resolved).
    pub(super) fn attempt_of_ordinal(&self, ordinal: u64) -> Option<&Attempt> {
        self.round
            .as_ref()
            .and_then(|r| {
                r.members
                    .iter()
                    .filter_map(|m| m.attempt.as_ref())
                    .find(|a| a.ordinal == ordinal)
            })
            .or_else(|| {
                self.attempts
                    .attempts
                    .iter()
                    .rev()
                    .find(|a| a.ordinal == ordinal)
            })
    }

    /// A member in doubt settled by reconciliation: `attempt` is its
    /// observation (as the journal's recovery built it).
    pub(super) fn adopted(&mut self, attempt: Attempt) -> Result<()> {
        let ordinal = attempt.ordinal;
        self.member(ordinal)?;
        let late = attempt.hedge.as_ref().is_some_and(|h| h.loss.is_some());
        let decides_now = !late && decides(&self.policy, &attempt);
        let at = attempt.completed_at_ms;
        self.settle(ordinal, attempt, decides_now.then_some((ordinal, at)))
    }
}
