//! `fleet.json`: circuit breakers, the retry budget, and runs admitted under them.
//!
//! `breaker_admit` / `breaker_record` and `budget_deposit` /
//! `budget_withdraw` cases pin every transition of the pure snapshot
//! functions (probe limits, window edges, the budget's floor and cap, a clock
//! behind the snapshot); `fleet_session` cases run a session against an
//! in-memory store (skips, stops, probes, fail open and closed); `verify_bundle`
//! cases replay tampered admissions and snapshots; `validate_policy` cases pin
//! the section's bounds.

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{id, policy_with, t, NOW_2026};
use crate::family::Family;

mod breaker;
mod budget;
mod session;
mod tamper;
mod wait;

use breaker::breaker_cases;
use budget::budget_cases;
use session::session_cases;
use tamper::tamper_cases;
use wait::wait_cases;

const T0: u64 = NOW_2026;

fn primary() -> String {
    id("release: private-primary")
}
fn fallback() -> String {
    id("release: external-fallback")
}

fn consecutive(n: u64, probes: u64) -> Value {
    json!({"consecutive_failures": n, "half_open_probes": probes, "open_ms": 10_000})
}

fn ratio() -> Value {
    json!({"failure_ratio_permille": 500, "half_open_probes": 1, "minimum_volume": 4, "open_ms": 10_000, "window_ms": 60_000})
}

/// A breaker snapshot from its fields (the rest zero, closed at T0).
fn snap(release: &str, edits: &[(&str, Value)]) -> Value {
    let mut s = json!({
        "consecutive_failures": 0, "generation": 0, "probe_successes": 0, "probes_in_flight": 0,
        "route_release_sha256": release, "schema": "retryledger.breaker.v1", "state": "closed",
        "updated_at_epoch_ms": T0, "window_failures": 0, "window_start_epoch_ms": T0, "window_total": 0,
    });
    for (k, v) in edits {
        s[*k] = v.clone();
    }
    s
}

fn open_at(release: &str, opened: u64, generation: u64) -> Value {
    snap(
        release,
        &[
            ("state", json!("open")),
            ("opened_at_epoch_ms", json!(opened)),
            ("generation", json!(generation)),
            ("updated_at_epoch_ms", json!(opened)),
            ("window_start_epoch_ms", json!(opened)),
        ],
    )
}

fn half_open(release: &str, in_flight: u64, successes: u64) -> Value {
    snap(
        release,
        &[
            ("state", json!("half_open")),
            ("generation", json!(2)),
            ("probes_in_flight", json!(in_flight)),
            ("probe_successes", json!(successes)),
        ],
    )
}

fn budget_cfg() -> Value {
    json!({"floor_per_second": 1, "max_tokens": 3, "ratio_permille": 500, "scope": "tenant-7/summaries"})
}

fn bsnap(balance: u64) -> Value {
    json!({"balance_milli": balance, "deposits": 0, "generation": 0, "schema": "retryledger.retry_budget.v1",
        "scope": "tenant-7/summaries", "updated_at_epoch_ms": T0, "withdrawals": 0})
}

fn down() -> Value {
    json!({"class": "retryable", "kind": "unavailable"})
}
fn ok() -> Value {
    json!({"class": "success"})
}

fn fleet_policy(
    breaker: Value,
    budget: Option<Value>,
    on_store: &str,
    edits: &[(&str, Value)],
) -> String {
    let mut fleet = json!({"breaker": breaker, "on_store_unavailable": on_store});
    if let Some(b) = budget {
        fleet["retry_budget"] = b;
    }
    let mut all = vec![("/fleet", fleet)];
    all.extend(edits.iter().map(|(k, v)| (*k, v.clone())));
    t(&policy_with(&all))
}

fn observe(duration: u64, facts: Value) -> Value {
    json!({"observe": {"duration_ms": duration, "facts": facts}})
}
fn succeeds() -> Value {
    observe(40, json!({"result": "returned"}))
}
fn fails() -> Value {
    observe(40, json!({"result": "raised", "status": 503}))
}
fn admit(at: u64) -> Value {
    json!({ "admit": at })
}

pub fn family() -> Family {
    let mut f = Family::new(
        "fleet",
        "breaker_admit / breaker_record and budget_deposit / budget_withdraw: the pure transitions of circuit breakers and the retry budget; fleet_session: runs admitted under them against an in-memory store; verify_bundle: tampered admissions and snapshots; validate_policy: the fleet section.",
        "every breaker transition (closed, open, half-open, reopen, close), probe limits, consecutive and ratio triggers, window edges, neutral outcomes, late and non-probe records, a clock behind the snapshot; the budget's ratio, floor, cap and refusal; malformed snapshots and configurations; runs that skip an open route, stop with every route open, probe and close or reopen, open a breaker mid-run, stop or go on by the budget, fail open and fail closed on an unreachable store; admissions missing, unexpected or regressing; tampered snapshots, flags, skips and stops; a budget that waits (`wait_ms`): a retry short of budget waits and asks again, granted after the wait, a wait past the deadline stops, and a stop with room to wait is a drift",
    );
    breaker_cases(&mut f);
    budget_cases(&mut f);
    session_cases(&mut f);
    tamper_cases(&mut f);
    policy_cases(&mut f);
    wait_cases(&mut f);
    f
}

fn b_admit(f: &mut Family, name: &str, cfg: &Value, s: &Value, now: u64, want: &str) {
    f.add(
        name,
        "breaker_admit",
        vec![
            ("config", json!(t(cfg))),
            ("snapshot", json!(t(s))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

/// `seen` is (whether the attempt was a probe, its outcome).
fn b_record(
    f: &mut Family,
    name: &str,
    cfg: &Value,
    s: &Value,
    seen: (bool, &Value),
    now: u64,
    want: &str,
) {
    let (probe, outcome) = seen;
    f.add(
        name,
        "breaker_record",
        vec![
            ("config", json!(t(cfg))),
            ("snapshot", json!(t(s))),
            ("probe", json!(probe)),
            ("outcome", json!(t(outcome))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

fn policy_cases(f: &mut Family) {
    for (name, fleet, want) in [
        (
            "fleet_policy_empty",
            json!({"on_store_unavailable": "fail_open"}),
            "invalid_breaker",
        ),
        (
            "fleet_policy_bad_breaker",
            json!({"breaker": {"half_open_probes": 1, "open_ms": 5}, "on_store_unavailable": "fail_open"}),
            "invalid_breaker",
        ),
        (
            "fleet_policy_bad_budget",
            json!({"on_store_unavailable": "fail_open", "retry_budget": {"floor_per_second": 0, "max_tokens": 0, "ratio_permille": 1, "scope": "s"}}),
            "invalid_retry_budget",
        ),
        (
            "fleet_policy_bad_store_choice",
            json!({"breaker": consecutive(1, 1), "on_store_unavailable": "shrug"}),
            "invalid_value",
        ),
        (
            "fleet_policy_valid",
            json!({"breaker": ratio(), "on_store_unavailable": "fail_closed", "retry_budget": budget_cfg()}),
            "ok",
        ),
    ] {
        f.policy(name, &t(&policy_with(&[("/fleet", fleet)])), want);
    }
}
