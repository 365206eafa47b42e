//! Key pools in the judge: the key an attempt's admission records, an
//! attempt whose pool key the provider refused, and the run's stop when a
//! pool has no usable key ([`crate::keypool`]).
//!
//! - An admission records a key (`admission.key`) exactly when the planned
//!   route names a key pool, and the key is one of that pool's. A key the
//!   provider refused earlier in the run is never sent again, unless its
//!   pool sets `disable_ms` (then it may clear within the run).
//! - `key_refused` marks an attempt whose key the provider refused (401
//!   `unauthorized`, 403 `forbidden`); it needs a recorded key and a
//!   non-retryable outcome. Such an attempt says nothing about the route:
//!   after the deadline and cost checks, the run goes on with the same
//!   route's same per-route ordinal at once (no backoff, no jitter draw),
//!   counted against the total attempt budget but not the route's bound.
//! - A fleet stop `no_usable_key` names the planned route's pool:
//!   `stop_no_usable_key`.

use super::{Decision, Dispatch, Run, Terminal};
use crate::attempt::Attempt;
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{Admission, FleetConfig, FleetStop};
use crate::ids::Identifier;
use crate::outcome::Outcome;
use crate::policy::CompiledPolicy;
use crate::schedule::Delay;

/// The pool the route `route_id` names.
fn pool_of<'a>(cp: &'a CompiledPolicy, route_id: &Identifier) -> Option<&'a Identifier> {
    cp.routes()
        .find(|r| &r.route_id == route_id)
        .and_then(|r| r.key_pool.as_ref())
}

impl Run {
    /// Whether `stop` names the key pool of the planned route `plan`.
    pub(super) fn names_pool(
        &self,
        cp: &CompiledPolicy,
        plan: &Dispatch,
        stop: &FleetStop,
    ) -> bool {
        pool_of(cp, &plan.route_id).is_some_and(|p| stop.key_pool.as_ref() == Some(p))
    }

    /// The key an admission records, against the planned route `plan`'s
    /// pool (attempt index `i`).
    pub(super) fn check_key(
        &self,
        cp: &CompiledPolicy,
        fleet: &FleetConfig,
        plan: &Dispatch,
        adm: &Admission,
        i: usize,
    ) -> Result<()> {
        let drift = |msg: &str| {
            Err(Error::attempt(
                ErrorCode::AdmissionDrift,
                i,
                "admission/key",
                msg.to_owned(),
            ))
        };
        let pool = pool_of(cp, &plan.route_id);
        let key = match (pool, &adm.key) {
            (None, None) => return Ok(()),
            (Some(name), Some(k)) if &k.pool == name => k,
            _ => return drift(
                "an admission records a key of its route's pool exactly when the route names one",
            ),
        };
        let cfg = fleet.key_pools.as_ref().and_then(|p| p.get(&key.pool));
        if !cfg.is_some_and(|c| c.keys.iter().any(|k| k.key_sha256 == key.key_sha256)) {
            return drift("the recorded key is not one of its pool's keys");
        }
        if self.refused_keys.contains(&key.key_sha256) {
            return drift("a key the provider refused earlier in the run is sent again");
        }
        Ok(())
    }

    /// `key_refused` needs a recorded pool key and a non-retryable outcome.
    pub(super) fn check_key_refused(a: &Attempt, i: usize) -> Result<()> {
        let keyed = a.admission.as_ref().is_some_and(|adm| adm.key.is_some());
        let refused = matches!(a.outcome, Outcome::NonRetryable { .. });
        if a.key_refused.is_some() && !(keyed && refused) {
            return Err(Error::attempt(
                ErrorCode::AdmissionDrift,
                i,
                "key_refused",
                "only a non-retryable answer to an attempt sent with a pool key refuses the key"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Count a refused key's attempt: not against its route's bound, and
    /// the key is never sent again in the run unless its pool lets it clear.
    pub(super) fn note_refusal(&mut self, cp: &CompiledPolicy, a: &Attempt, priority: usize) {
        if a.key_refused.is_none() {
            return;
        }
        if let Some(slot) = self.refused.get_mut(priority) {
            *slot = slot.saturating_add(1);
        }
        let Some(key) = a.admission.as_ref().and_then(|adm| adm.key.as_ref()) else {
            return;
        };
        let pools = cp.policy.fleet.as_ref().and_then(|f| f.key_pools.as_ref());
        let lasting = pools
            .and_then(|p| p.get(&key.pool))
            .is_some_and(|c| c.disable_ms.is_none());
        if lasting && !self.refused_keys.contains(&key.key_sha256) {
            self.refused_keys.push(key.key_sha256.clone());
        }
    }

    /// Plan after a refused key on `priority` (its `route_ordinal`-th
    /// counted attempt, completed at `completed`): the same route and
    /// per-route ordinal at once, with another key of the pool.
    pub(super) fn plan_next_key(
        &self,
        cp: &CompiledPolicy,
        priority: usize,
        route_ordinal: u64,
        completed: u64,
    ) -> Decision {
        if self.count >= cp.policy.max_total_attempts {
            return Decision::Terminal {
                terminal: Terminal::StopTotalAttempts,
            };
        }
        let now = Delay {
            delay_ms: 0,
            retry_after_floor_ms: 0,
            jitter: None,
        };
        self.admit(cp, priority, route_ordinal, completed, now)
    }
}
