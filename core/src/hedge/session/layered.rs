//! What the run machine's hedge layer needs of a hedge session beyond a
//! host's driver: continuing a journaled run, settling a member in doubt by
//! reconciliation, and recording a member's outcome on its breaker.

use std::sync::Arc;

use super::{HedgeSession, Member, Round};
use crate::admission::{self, AdmissionSnapshot};
use crate::attempt::{Attempt, Attempts};
use crate::breaker;
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Run;
use crate::fleet::Admission;
use crate::hedge::decides;
use crate::ids::Sha256Hex;
use crate::policy::CompiledPolicy;

impl HedgeSession {
    /// Continue a journaled run: the rounds the journal resolved (`run`,
    /// `attempts`) and its open round, whose members in flight are in doubt
    /// (the round takes no more hedges).
    pub(crate) fn resumed(
        policy: Arc<CompiledPolicy>,
        run: Run,
        attempts: Attempts,
        open: Option<&crate::journal::hedged::Round>,
    ) -> Result<Self> {
        let mut s = Self::start(policy)?;
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
        Ok(s)
    }

    /// Whether a round is open (attempts in flight or not yet resolved).
    pub(crate) fn in_round(&self) -> bool {
        self.round.is_some()
    }

    /// The admission held for the dispatch on offer `ordinal`.
    pub(crate) fn admitted_for(&self, ordinal: u64) -> Option<&Admission> {
        self.admitted
            .as_ref()
            .filter(|(n, _)| *n == ordinal)
            .map(|(_, a)| a)
    }

    /// Attempt `ordinal` as recorded (in the open round or resolved).
    pub(crate) fn attempt_of_ordinal(&self, ordinal: u64) -> Option<&Attempt> {
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

    /// The next snapshot of attempt `ordinal`'s breaker after its outcome,
    /// from the snapshot a host reads now (`now_epoch_ms`, wall clock): a
    /// lead, a hedge and a cancelled loser each count on their route.
    pub fn breaker_after(
        &self,
        ordinal: u64,
        snapshot: &crate::breaker::BreakerSnapshot,
        now_epoch_ms: u64,
    ) -> Result<crate::breaker::BreakerSnapshot> {
        let cfg = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.breaker.as_ref())
            .ok_or_else(|| {
                Error::at(
                    ErrorCode::AdmissionUnexpected,
                    "/fleet/breaker",
                    "the policy has no breaker",
                )
            })?;
        let Some(a) = self.attempt_of_ordinal(ordinal) else {
            return Err(Error::new(
                ErrorCode::AdmissionMissing,
                format!("attempt {ordinal} has not been observed"),
            ));
        };
        snapshot.check(cfg, &a.route_release_sha256, "")?;
        self.seen
            .check(a.route_release_sha256.as_str(), snapshot.generation, "")?;
        let probe = a
            .admission
            .as_ref()
            .and_then(|adm| adm.breaker.as_ref())
            .is_some_and(|b| b.probe);
        let recorded = breaker::record(
            cfg,
            snapshot,
            probe,
            breaker::Health::of(&a.outcome),
            now_epoch_ms,
        );
        let backoff = &self.policy.policy.backoff;
        if backoff.retry_after_over_cap == Some(crate::policy::OverCap::SkipRoute) {
            if let Some(hint) = a.outcome.retry_after_ms() {
                if hint > backoff.retry_after_cap_ms {
                    let until = now_epoch_ms.saturating_add(hint);
                    return Ok(breaker::park(&recorded, until, now_epoch_ms));
                }
            }
        }
        Ok(recorded)
    }

    /// A member in doubt settled by reconciliation: `attempt` is its
    /// observation (as the journal's recovery built it).
    pub(crate) fn adopted(&mut self, attempt: Attempt) -> Result<()> {
        let ordinal = attempt.ordinal;
        self.member(ordinal)?;
        let late = attempt.hedge.as_ref().is_some_and(|h| h.loss.is_some());
        let decides_now = !late && decides(&self.policy, &attempt);
        let at = attempt.completed_at_ms;
        self.settle(ordinal, attempt, decides_now.then_some((ordinal, at)))
    }
}

impl HedgeSession {
    /// The admission limits' snapshot of attempt `ordinal`'s key once it is
    /// over (answered or cancelled): its slot freed, its reserved tokens
    /// settled with `used_tokens`, then the rate-limit `headers` its
    /// response carried applied. `None` when it holds no slot.
    pub(crate) fn admission_release_of(
        &self,
        ordinal: u64,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
        used_tokens: Option<u64>,
        headers: &[(String, String)],
    ) -> Result<Option<AdmissionSnapshot>> {
        let Some(cfg) = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        else {
            return Ok(None);
        };
        let Some(a) = self.attempt_of_ordinal(ordinal) else {
            return Ok(None);
        };
        let Some(limits) = a.admission.as_ref().and_then(|adm| adm.limits.as_ref()) else {
            return Ok(None);
        };
        snapshot.check(cfg, &a.route_release_sha256, "")?;
        let released = admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            used_tokens,
        );
        Ok(Some(if headers.is_empty() {
            released
        } else {
            admission::observe(cfg, &released, headers, now_epoch_ms).0
        }))
    }

    /// The route release whose admission-limits slot the admitted lead
    /// holds before it is sent (a cancellation frees it).
    pub(crate) fn held_slot(&self) -> Option<Sha256Hex> {
        let (n, adm) = self.admitted.as_ref()?;
        adm.limits.as_ref()?;
        self.lead
            .as_ref()
            .filter(|l| l.ordinal == *n)
            .map(|l| l.route_release_sha256.clone())
    }

    /// The snapshot with the held lead's slot freed (nothing was sent).
    pub(crate) fn release_held(
        &self,
        snapshot: &AdmissionSnapshot,
        now_epoch_ms: u64,
    ) -> Result<Option<AdmissionSnapshot>> {
        let Some(cfg) = self
            .policy
            .policy
            .fleet
            .as_ref()
            .and_then(|f| f.admission.as_ref())
        else {
            return Ok(None);
        };
        let Some((_, adm)) = &self.admitted else {
            return Ok(None);
        };
        let (Some(limits), Some(release)) = (adm.limits.as_ref(), self.held_slot()) else {
            return Ok(None);
        };
        snapshot.check(cfg, &release, "")?;
        Ok(Some(admission::release(
            cfg,
            snapshot,
            now_epoch_ms,
            limits.tokens.unwrap_or(0),
            None,
        )))
    }
}
