//! Streamed runs beyond the vectors: a long event log crosses the common
//! input limit and still verifies and digests as a bundle.
#![allow(clippy::unwrap_used, clippy::panic, reason = "tests fail loudly")]

use retryledger_core::{api, lab};
use serde_json::json;

#[test]
fn a_bundle_with_a_long_event_log_verifies_above_the_common_input_limit() {
    let mut policy = lab::reference_policy();
    policy["stream"] = json!({"max_response_bytes": 1_000_000, "mode": "tentative"});
    let deltas: Vec<String> = (0..12_000).map(|i| format!("token {i} ")).collect();
    let bytes: usize = deltas.iter().map(String::len).sum();
    let script = json!([{"duration_ms": 900, "deltas": deltas, "facts": {
        "result": "returned",
        "stream": {"bytes": bytes, "events": deltas.len(), "terminal_event": true, "usage_event": true}}}]);
    let bundle = lab::stream_bundle(&policy.to_string(), &script.to_string()).unwrap();
    let text = retryledger_core::canonical::canonical_json(&bundle);
    assert!(text.len() > retryledger_core::limits::MAX_INPUT_BYTES);
    let verdict: serde_json::Value = serde_json::from_str(&api::verify(&text).unwrap()).unwrap();
    assert_eq!(verdict["kind"], "verified");
    assert_eq!(
        api::digest(&text).unwrap(),
        retryledger_core::digest(&bundle)
    );
    let events = bundle.stream_events.unwrap().0;
    assert_eq!(events.len(), 12_001);
    assert_eq!(events.last().unwrap().sequence, 12_001);
    // A document of another kind that large is still refused.
    let big_policy = format!("{{\"pad\":\"{}\"}}", "x".repeat(text.len()));
    assert_eq!(
        api::digest(&big_policy).unwrap_err().code.as_str(),
        "input_too_large"
    );
}
