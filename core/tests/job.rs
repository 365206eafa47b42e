//! Async jobs beyond the vectors: for arbitrary scripts of submit and poll
//! answers, the core never plans a second submit after an acceptance, plans
//! at most `max_polls` polls, each no earlier than its backoff after the
//! previous completion, and every sealed run verifies.
#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use proptest::prelude::*;
use retryledger_core::{api, lab};
use serde_json::{json, Value};

const MAX_POLLS: u64 = 4;
const BASE: u64 = 150;
const MAX: u64 = 500;

/// One scripted answer, by index: what an attempt saw.
fn answer(kind: u8, duration: u64) -> Value {
    let ok = |status: &str| json!({"duration_ms": duration, "facts": {"result": "returned"}, "job": {"id": "resp_prop", "status": status}});
    match kind % 9 {
        0 => ok("queued"),
        1 => ok("in_progress"),
        2 => ok("completed"),
        3 => ok("failed"),
        4 => {
            json!({"duration_ms": duration, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": 429}})
        }
        5 => {
            json!({"duration_ms": duration, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": 503}})
        }
        6 => {
            json!({"duration_ms": duration, "facts": {"error_types": ["APIConnectionError"], "result": "raised"}})
        }
        7 => ok("in_progress"),
        _ => ok("expired"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn no_second_submit_and_bounded_polls(steps in prop::collection::vec((any::<u8>(), 0u64..400), 1..12)) {
        let mut policy = lab::reference_policy();
        policy["async_job"] = json!({"max_polls": MAX_POLLS, "poll_base_ms": BASE, "poll_max_ms": MAX});
        policy["deadline_ms"] = json!(30_000);
        let policy = policy.to_string();
        // The shortest prefix of the script that reaches a terminal (a
        // prefix that does not is `run_not_terminal` when sealed).
        // Padded with answers that end the run (a completed job; the bounds
        // end it otherwise), so every case reaches a terminal and asserts.
        let mut script: Vec<Value> = steps.iter().map(|(k, d)| answer(*k, *d)).collect();
        script.extend((0..16).map(|_| answer(2, 10)));
        let mut out = None;
        let mut used = 0;
        for n in 1..=script.len() {
            match lab::job_session(&policy, &Value::Array(script[..n].to_vec()).to_string()) {
                Ok(v) => {
                    out = Some(v);
                    used = n;
                    break;
                }
                Err(e) => prop_assert_eq!(e.code.as_str(), "run_not_terminal"),
            }
        }
        let Some(out) = out else { panic!("every padded script reaches a terminal") };
        let attempts = out["attempts"]["attempts"].as_array().unwrap();
        let mut accepted = false;
        let mut polls = 0u64;
        let mut last_completed = 0u64;
        for a in attempts {
            let kind = a["job"]["kind"].as_str().unwrap();
            if accepted {
                prop_assert_eq!(kind, "poll", "a second submit after the acceptance");
                polls += 1;
                prop_assert_eq!(a["job"]["poll"].as_u64().unwrap(), polls);
                let delay = (BASE << (polls - 1).min(20)).min(MAX);
                prop_assert!(a["started_at_ms"].as_u64().unwrap() >= last_completed + delay);
            } else {
                prop_assert_eq!(kind, "submit");
                accepted = a["outcome"]["class"] == "success";
            }
            last_completed = a["completed_at_ms"].as_u64().unwrap();
        }
        prop_assert!(polls <= MAX_POLLS);
        let receipt = &out["receipt"];
        prop_assert_eq!(receipt["job"]["polls"].as_u64().unwrap(), polls);
        prop_assert_eq!(out["verdict"]["kind"].as_str().unwrap(), "verified");
        // A run that lost a submit answer never submits again.
        if attempts.iter().any(|a| a["job"]["kind"] == "submit" && a["outcome"]["class"] == "indeterminate") {
            prop_assert_eq!(receipt["terminal"].as_str().unwrap(), "stop_indeterminate");
        }
        prop_assert_eq!(attempts.len(), used);
        let b = lab::job_bundle(&policy, &Value::Array(script[..used].to_vec()).to_string()).unwrap();
        let text = retryledger_core::canonical::canonical_json(&b);
        prop_assert!(!text.contains("resp_prop"), "the raw job id is never in the bundle");
        let verdict: Value = serde_json::from_str(&api::verify(&text).unwrap()).unwrap();
        prop_assert_eq!(verdict["kind"].as_str().unwrap(), "verified");
    }
}

/// The first policy of a vectors file that has `section`.
fn vector_policy(file: &str, section: &str) -> Value {
    let path = format!("{}/../tests/vectors/{file}", env!("CARGO_MANIFEST_DIR"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["input"]["policy"].as_str())
        .map(|t| serde_json::from_str::<Value>(t).unwrap())
        .find(|p| p.get(section).is_some())
        .unwrap()
}

#[test]
fn an_async_job_is_not_hedged() {
    let mut policy = vector_policy("job.json", "async_job");
    assert!(api::validate_policy(&policy.to_string()).is_ok());
    policy["hedge"] = vector_policy("hedge.json", "hedge")["hedge"].clone();
    // The hedge's routes must be the policy's for the hedge itself to be valid.
    policy["hedge"]["routes"] = json!([policy["routes"][1]["route_id"].clone()]);
    let e = api::validate_policy(&policy.to_string()).unwrap_err();
    assert_eq!(e.code.as_str(), "invalid_async_job");
    assert_eq!(e.path.as_deref(), Some("/async_job"));
}
