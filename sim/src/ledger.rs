//! The retryledger strategy's side of the fleet: one compiled policy per
//! client (the replay lab's reference policy with the scenario's bounds,
//! full jitter seeded per client, a breaker and a retry budget), and the
//! in-memory store every client shares.
//!
//! The store is a perfectly consistent register: the simulation is one
//! thread, so every admission reads the latest snapshots and its writes
//! land before the next event (no compare-and-set conflicts to model).

use std::sync::Arc;

use retryledger_core::breaker::BreakerSnapshot;
use retryledger_core::budget::RetryBudgetSnapshot;
use retryledger_core::fleet::{FleetView, FleetWrites};
use retryledger_core::ids::Sha256Hex;
use retryledger_core::{compile, CompiledPolicy, Policy};
use serde_json::{json, Value};

use crate::error::{Result, SimError};
use crate::scenario::Scenario;

/// The scheduler release bound into every jitter draw.
pub const SCHEDULER_RELEASE: &str = "retryledger-sim-scheduler-v1";

/// The policy of client `client`: the lab's reference policy with the
/// scenario's knobs (as JSON, then decoded strictly and compiled by the core).
pub fn policy_json(s: &Scenario, client: u64) -> Value {
    let l = &s.retryledger;
    let mut p = retryledger_core::lab::reference_policy();
    let costs: Vec<u64> = s.routes.iter().map(|r| r.cost.max(1)).collect();
    let most = costs.iter().copied().max().unwrap_or(1);
    let mut breaker = json!({
        "consecutive_failures": l.breaker_consecutive_failures,
        "half_open_probes": l.breaker_half_open_probes,
        "open_ms": l.breaker_open_ms,
    });
    if let (Some((ratio, volume, window)), Some(b)) =
        (l.breaker_failure_ratio, breaker.as_object_mut())
    {
        b.insert("failure_ratio_permille".into(), json!(ratio));
        b.insert("minimum_volume".into(), json!(volume));
        b.insert("window_ms".into(), json!(window));
    }
    if let Some(obj) = p.as_object_mut() {
        obj.insert("deadline_ms".into(), json!(s.clients.deadline_ms));
        obj.insert("max_total_attempts".into(), json!(l.max_total_attempts));
        obj.insert(
            "max_total_cost".into(),
            json!(most.saturating_mul(l.max_total_attempts.saturating_add(1))),
        );
        obj.insert(
            "backoff".into(),
            json!({
                "base_ms": l.base_ms,
                "max_ms": l.max_ms.max(l.base_ms),
                "retry_after_cap_ms": l.retry_after_cap_ms,
            }),
        );
        obj.insert(
            "jitter".into(),
            json!({
                "mode": "full",
                "scheduler_release": SCHEDULER_RELEASE,
                "seed": s.seed.wrapping_add(client) & ((1u64 << 53) - 1),
            }),
        );
        let mut budget = json!({
            "floor_per_second": l.budget_floor_per_second,
            "max_tokens": l.budget_max_tokens,
            "ratio_permille": l.budget_ratio_permille,
            "scope": "sim-fleet",
        });
        if let (Some(w), Some(b)) = (l.budget_wait_ms, budget.as_object_mut()) {
            b.insert("wait_ms".into(), json!(w));
        }
        obj.insert(
            "fleet".into(),
            json!({
                "breaker": breaker,
                "on_store_unavailable": "fail_closed",
                "retry_budget": budget,
            }),
        );
        if let Some(Value::Array(routes)) = obj.get_mut("routes") {
            routes.truncate(s.routes.len());
            for (i, r) in routes.iter_mut().enumerate() {
                let attempts = if i == 0 {
                    l.primary_attempts
                } else {
                    l.fallback_attempts
                };
                if let Some(ro) = r.as_object_mut() {
                    ro.insert("max_attempts".into(), json!(attempts));
                    ro.insert(
                        "reserve_cost".into(),
                        json!(costs.get(i).copied().unwrap_or(1)),
                    );
                }
            }
        }
    }
    p
}

/// Compile client `client`'s policy.
pub fn compile_for(s: &Scenario, client: u64) -> Result<CompiledPolicy> {
    let policy: Policy = retryledger_core::decode::from_value(policy_json(s, client))
        .map_err(|e| SimError::core(&e))?;
    compile(policy).map_err(|e| SimError::core(&e))
}

/// Every client's compiled policy, and the route releases by scenario route index.
pub fn policies(s: &Scenario) -> Result<(Vec<Arc<CompiledPolicy>>, Vec<Sha256Hex>)> {
    let mut out = Vec::new();
    for c in 0..s.clients.count {
        out.push(Arc::new(compile_for(s, c)?));
    }
    let releases = match out.first() {
        Some(p) => (0..s.routes.len())
            .filter_map(|i| p.route_at(i).map(|r| r.route_release_sha256.clone()))
            .collect(),
        None => Vec::new(),
    };
    Ok((out, releases))
}

/// The shared store: a breaker snapshot per route release and the budget.
#[derive(Debug, Default)]
pub struct Store {
    view: FleetView,
}

impl Store {
    /// What an admission reads.
    pub fn view(&self) -> &FleetView {
        &self.view
    }

    /// Apply an admission's writes.
    pub fn write(&mut self, writes: FleetWrites) {
        for b in writes.breakers {
            self.put(b);
        }
        if let Some(b) = writes.budget {
            self.view.budget = Some(b);
        }
    }

    /// A route release's breaker, or a fresh one.
    pub fn breaker(&self, release: &Sha256Hex, now_epoch_ms: u64) -> BreakerSnapshot {
        self.view
            .breakers
            .iter()
            .find(|(k, _)| k == release)
            .map_or_else(
                || BreakerSnapshot::fresh(release.clone(), now_epoch_ms),
                |(_, b)| b.clone(),
            )
    }

    /// Write a breaker snapshot under its release.
    pub fn put(&mut self, snapshot: BreakerSnapshot) {
        match self
            .view
            .breakers
            .iter_mut()
            .find(|(k, _)| *k == snapshot.route_release_sha256)
        {
            Some((_, b)) => *b = snapshot,
            None => self
                .view
                .breakers
                .push((snapshot.route_release_sha256.clone(), snapshot)),
        }
    }

    /// The budget snapshot, when one was written.
    pub fn budget(&self) -> Option<&RetryBudgetSnapshot> {
        self.view.budget.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_policy_compiles_for_every_scenario() {
        for name in crate::SCENARIOS {
            let s = crate::load(name).unwrap();
            let (policies, releases) = policies(&s).unwrap();
            assert_eq!(policies.len() as u64, s.clients.count);
            assert_eq!(releases.len(), s.routes.len());
            // Each client draws its own jitter: the policies differ.
            if policies.len() > 1 {
                assert_ne!(policies[0].policy_sha256, policies[1].policy_sha256);
            }
        }
    }
}
