//! Advancing the run: the next effect after each decision, and each
//! observed or reconciled attempt taken into the session.

use std::sync::Arc;

use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::{Decision, Dispatch};
use crate::journal::{Entry, Pending, Reconciliation, Recovery};
use crate::observe::{Facts, Judgement};

use super::{job, stream, Effect, Machine, Observation, ReadFor, Settle, Stage, Then};

impl Machine {
    /// The planned dispatch, or an error when the run has ended.
    pub(super) fn planned(&self) -> Result<Dispatch> {
        match self.session.next() {
            Decision::Dispatch(d) => Ok(d.clone()),
            Decision::Terminal { terminal } => Err(Error::new(
                ErrorCode::AttemptAfterTerminal,
                format!("the run has ended with {}", terminal.as_str()),
            )),
        }
    }

    /// Compute the next effect from the stage, through every stage that
    /// needs no answer.
    pub(super) fn advance(&mut self) -> Result<()> {
        if self.hedge.is_some() {
            return self.hedge_advance();
        }
        loop {
            match self.stage.clone() {
                Stage::Open => {
                    let Some((_, run_id)) = &self.journal else {
                        self.stage = Stage::Plan;
                        continue;
                    };
                    let created = Entry::Created {
                        created_at_epoch_ms: self.origin_epoch_ms,
                        run_id: run_id.clone(),
                    };
                    return self.append(&[created, Entry::Decided], Then::Plan);
                }
                Stage::Decide => return self.append(&[Entry::Decided], Then::Plan),
                Stage::Plan => {
                    let decision = self.session.next().clone();
                    match decision {
                        Decision::Terminal { .. } => {
                            let attempts = self.session.attempts();
                            let entry = Entry::Terminal {
                                cancelled_at_ms: attempts.cancelled_at_ms,
                                snapshots: attempts
                                    .fleet_stop
                                    .as_ref()
                                    .and_then(|s| self.session.fleet_snapshots().named_by_stop(s)),
                                fleet_stop: attempts.fleet_stop.clone(),
                            };
                            if self.journal.is_some() {
                                return self.append(&[entry], Then::Done);
                            }
                            self.stage = Stage::Done;
                        }
                        Decision::Dispatch(d) => {
                            let fleet = self.session.policy().policy.fleet.is_some();
                            let admits = crate::job::admitted_step(&d);
                            if fleet && admits && self.session.admission().is_none() {
                                self.planned_not_before_ms = Some(d.not_before_ms);
                                let reads = self.admission_reads();
                                self.read(reads, ReadFor::Admission, 0);
                                return Ok(());
                            }
                            self.stage = Stage::Ready;
                        }
                    }
                }
                Stage::Ready => {
                    let d = self.planned()?;
                    if self.now_ms < d.not_before_ms {
                        self.effect = Effect::Sleep {
                            until_ms: d.not_before_ms,
                        };
                        self.stage = Stage::Sleeping(Then::Ready);
                        return Ok(());
                    }
                    if self.journal.is_none() {
                        self.stage = Stage::Send;
                        continue;
                    }
                    let dispatched = Entry::Dispatched {
                        admission: self.session.admission().cloned(),
                        snapshots: self.session.admission_snapshots(),
                        started_at_ms: self.now_ms,
                    };
                    if self.reserved {
                        self.reserved = false;
                        return self.append(&[dispatched], Then::Send);
                    }
                    // The plan as the core made it (moved by any skipped
                    // route); a later start the limits gave is the dispatch's.
                    let mut planned = d;
                    if let Some(nb) = self.planned_not_before_ms.take() {
                        planned.not_before_ms = nb;
                    }
                    let reserved = Entry::Reserved {
                        cancelled_at_ms: job::cancelled_first(&self.session, &planned),
                        dispatch: Some(planned),
                    };
                    return self.append(&[reserved, dispatched], Then::Send);
                }
                Stage::Send => {
                    let dispatch = self.planned()?;
                    self.effect = job::effect(dispatch, self.now_ms);
                    if let Effect::Dispatch {
                        key,
                        stream,
                        dispatch,
                        ..
                    } = &mut self.effect
                    {
                        *key = self.pools.send();
                        *stream = stream::plan(&self.policy, dispatch, self.now_ms);
                    }
                    self.stage = Stage::InFlight {
                        started_at_ms: self.now_ms,
                    };
                    return Ok(());
                }
                Stage::Log => {
                    let last: Option<Attempt> = self.session.attempts().attempts.last().cloned();
                    match last {
                        Some(attempt) if self.journal.is_some() => {
                            let observed = Entry::Observed {
                                attempt,
                                delta_digests: self.settle.deltas.clone(),
                            };
                            return self.append(&[observed, Entry::Decided], Then::Plan);
                        }
                        _ => self.stage = Stage::Plan,
                    }
                }
                Stage::Reconciling {
                    attempt,
                    not_before_ms,
                    poll,
                    asked: false,
                    reconciliation,
                } => {
                    if self.now_ms < not_before_ms {
                        self.effect = Effect::Sleep {
                            until_ms: not_before_ms,
                        };
                        // Asked once the sleep is over.
                        self.stage = Stage::Reconciling {
                            attempt,
                            not_before_ms,
                            poll,
                            asked: false,
                            reconciliation,
                        };
                        return Ok(());
                    }
                    if let Some(answer) = job::settled_in_doubt(&self.session, self.now_ms) {
                        let mut reconciliation = reconciliation;
                        reconciliation.answers.push(answer);
                        return self.reconciled(attempt, reconciliation);
                    }
                    self.effect = Effect::Reconcile {
                        attempt: attempt.clone(),
                        poll,
                    };
                    self.stage = Stage::Reconciling {
                        attempt,
                        not_before_ms,
                        poll,
                        asked: true,
                        reconciliation,
                    };
                    return Ok(());
                }
                Stage::Done => {
                    let terminal = match self.session.next() {
                        Decision::Terminal { terminal } => *terminal,
                        Decision::Dispatch(_) => {
                            return Err(Error::new(
                                ErrorCode::RunNotTerminal,
                                "the journal ended a run the session would continue",
                            ))
                        }
                    };
                    self.effect = Effect::Done { terminal };
                    return Ok(());
                }
                Stage::Appending(_)
                | Stage::Reading { .. }
                | Stage::Writing { .. }
                | Stage::Sleeping(_)
                | Stage::InFlight { .. }
                | Stage::Reconciling { asked: true, .. }
                | Stage::Failed => return Ok(()),
            }
        }
    }

    pub(super) fn observe(&mut self, started_at_ms: u64, obs: Observation) -> Result<()> {
        if obs.completed_at_ms < self.now_ms {
            return Err(Error::at(
                ErrorCode::ClockBackwards,
                "/completed_at_ms",
                format!(
                    "completed at {} before the dispatch at {}",
                    obs.completed_at_ms, self.now_ms
                ),
            ));
        }
        let mut facts = obs.facts.clone().unwrap_or_else(Facts::returned);
        if facts.now_unix_ms == 0 {
            facts.now_unix_ms = self.epoch(obs.completed_at_ms);
        }
        job::note(&mut self.session, &obs, &mut facts)?;
        // A refused observation leaves the session as it was: the usage and
        // body reported for it are dropped with it.
        let observed = self.observe_in_session(started_at_ms, &obs, &facts);
        if observed.is_err() {
            self.session.clear_notes();
        }
        let judgement = observed?;
        self.judgement = Some(judgement);
        self.now_ms = obs.completed_at_ms;
        self.settle = Arc::new(Settle {
            status: facts.status,
            headers: facts.headers,
            used_tokens: obs.used_tokens,
            deltas: stream::digests(&self.policy, &obs),
        });
        let release = self
            .session
            .attempts()
            .attempts
            .last()
            .filter(|a| a.admission.is_some())
            .map(|a| a.route_release_sha256.clone());
        // An attempt the fleet did not admit (a job's poll or cancel) is not settled.
        if let Some(release) = release {
            let reads = self.keys.settlement(&release, false);
            if !reads.is_empty() {
                self.read(reads, ReadFor::Settlement, 0);
                return Ok(());
            }
        }
        self.stage = Stage::Log;
        self.advance()
    }

    fn observe_in_session(
        &mut self,
        started_at_ms: u64,
        obs: &Observation,
        facts: &Facts,
    ) -> Result<Judgement> {
        if let Some(u) = &obs.usage {
            self.session.add_usage(u)?;
        }
        if let Some(b) = &obs.request_body_sha256 {
            self.session.set_request_body_sha256(b.clone());
        }
        if let Some(m) = &obs.model {
            self.session
                .set_model(m.requested.clone(), m.served.clone());
        }
        self.session.observe_stream(
            started_at_ms,
            obs.completed_at_ms,
            obs.cost,
            facts,
            &obs.deltas,
        )
    }

    pub(super) fn reconciled(
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
                self.stage = Stage::Reconciling {
                    attempt,
                    reconciliation,
                    not_before_ms,
                    poll,
                    asked: false,
                };
                self.advance()
            }
            Recovery::Adopt { attempt, .. } => {
                let observed = Entry::Observed {
                    attempt,
                    delta_digests: Vec::new(),
                };
                self.append(&[observed, Entry::Decided], Then::Resync)
            }
            Recovery::Resume { .. } | Recovery::Done { .. } => {
                self.stage = Stage::Plan;
                self.advance()
            }
        }
    }
}
