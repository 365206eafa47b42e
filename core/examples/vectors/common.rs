//! Builders shared by the families: pointer edits of the reference policy,
//! simulated runs and sealed bundles, outcomes and steps, time constants.

use retryledger_core::canonical::sha256_hex;
use retryledger_core::decode::from_value;
use retryledger_core::lab::{self, Step};
use retryledger_core::outcome::{Outcome, RetryableKind};
use retryledger_core::{seal, Policy};
use serde_json::{json, Value};

pub fn id(label: &str) -> String {
    sha256_hex(label.as_bytes())
}

/// Replace the value at a JSON Pointer, or add it to its parent object.
pub fn set(v: &mut Value, pointer: &str, new: Value) {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = new;
        return;
    }
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let obj = v
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("no object at {parent}"));
    obj.insert(key.to_owned(), new);
}

pub fn remove(v: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let removed = v
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove(key));
    assert!(removed.is_some(), "nothing at {pointer}");
}

pub fn edited(base: &Value, edits: &[(&str, Value)]) -> Value {
    let mut v = base.clone();
    for (p, new) in edits {
        set(&mut v, p, new.clone());
    }
    v
}

pub fn t(v: &Value) -> String {
    serde_json::to_string(v).expect("json")
}

pub fn reference() -> Value {
    lab::reference_policy()
}

pub fn policy_with(edits: &[(&str, Value)]) -> Value {
    edited(&reference(), edits)
}

/// Simulate a script against a policy value; the attempts document as a value.
pub fn run(policy: &Value, steps: &[Step]) -> Value {
    let p: Policy = from_value(policy.clone()).expect("a decodable policy");
    let attempts = lab::simulate(&p, steps).expect("a valid policy");
    retryledger_core::canonical::to_value(&attempts)
}

pub fn sealed(policy: &Value, attempts: &Value) -> Value {
    let p: Policy = from_value(policy.clone()).expect("policy");
    let a = from_value(attempts.clone()).expect("attempts");
    retryledger_core::canonical::to_value(&seal(&p, &a).expect("a finished run"))
}

pub fn empty_attempts() -> Value {
    json!({"attempts": [], "schema": "retryledger.attempts.v1"})
}

pub fn truncated(attempts: &Value, n: usize) -> Value {
    let mut v = attempts.clone();
    v["attempts"].as_array_mut().expect("list").truncate(n);
    v
}

pub fn success() -> Outcome {
    Outcome::Success
}
pub fn rl(ms: u64) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: Some(ms),
        retry_after_source: None,
    }
}
pub fn down() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    }
}
pub fn timeout() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::TimeoutBeforeResponse,
        retry_after_ms: None,
        retry_after_source: None,
    }
}
/// A 409 with a hint to a keyed request: still in progress at the receiver.
pub fn in_progress(ms: u64) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::InProgress,
        retry_after_ms: Some(ms),
        retry_after_source: None,
    }
}
pub fn s(outcome: Outcome, duration: u64, cost: u64) -> Step {
    Step::new(outcome, duration, cost)
}
pub fn lagged(outcome: Outcome, duration: u64, cost: u64, lag: u64) -> Step {
    Step {
        start_lag_ms: lag,
        ..Step::new(outcome, duration, cost)
    }
}

/// A one-route policy that allows many attempts with the given backoff.
pub fn single_route(max_attempts: u64, base: u64, max: u64, cap: u64, deadline: u64) -> Value {
    let mut p = reference();
    let routes = p["routes"].as_array_mut().expect("routes");
    routes.truncate(1);
    set(&mut p, "/routes/0/max_attempts", json!(max_attempts));
    set(&mut p, "/routes/0/reserve_cost", json!(0));
    set(&mut p, "/max_total_attempts", json!(max_attempts));
    set(&mut p, "/deadline_ms", json!(deadline));
    set(
        &mut p,
        "/backoff",
        json!({"base_ms": base, "max_ms": max, "retry_after_cap_ms": cap}),
    );
    p
}

pub fn jitter(mode: &str, seed: u64) -> Value {
    if mode == "none" {
        json!({"mode": "none"})
    } else {
        json!({"mode": mode, "scheduler_release": "sched-2026.12", "seed": seed})
    }
}

pub const MODES: [&str; 4] = ["none", "full", "equal", "decorrelated"];

pub const NOW: u64 = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
pub const NOW_2026: u64 = 1_780_000_000_000; // 2026-05-28
