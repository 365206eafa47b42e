//! `faults.json`: runs with faults a testing kit injected.
//!
//! A failure whose response carries the `retryledger-injected-fault` header
//! was made by a fault injector (`retryledger.testing`,
//! `retryledger/testing`): the attempt records `injected_fault` and the
//! receipt counts them (`injected_faults`), so such a receipt can never pass
//! for production evidence. Runs without the header keep their digests.

use retryledger_core::lab;
use serde_json::{json, Value};

use crate::common::{reference, set, t};
use crate::family::Family;

fn injected(status: u64, extra: &[(&str, &str)]) -> Value {
    let mut headers = vec![json!(["retryledger-injected-fault", "rate_limited"])];
    headers.extend(extra.iter().map(|(k, v)| json!([k, v])));
    json!({"duration_ms": 30, "facts": {"error_types": ["InjectedFault"], "headers": headers, "result": "raised", "status": status}})
}

fn real(status: u64) -> Value {
    json!({"duration_ms": 30, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": status}})
}

fn ok() -> Value {
    json!({"duration_ms": 80, "facts": {"result": "returned"}})
}

fn bundle(policy: &str, script: &Value) -> Value {
    let b = lab::stream_bundle(policy, &t(script)).expect("a session");
    retryledger_core::canonical::to_value(&b)
}

pub fn family() -> Family {
    let mut f = Family::new(
        "faults",
        "stream_session: runs whose failures a testing fault injector made (the retryledger-injected-fault header), each attempt marked and the receipt counting them; verify_bundle of bundles whose marks were removed or forged.",
        "an injected 429 with its hint, then success; two injected faults and a real one; a run without injected faults (no field); a mark removed from an attempt, a count removed from or added to a receipt",
    );
    let policy = t(&reference());
    let session = |f: &mut Family, name: &str, script: Value, want: &str| {
        f.add(
            name,
            "stream_session",
            vec![("policy", json!(policy)), ("script", json!(t(&script)))],
            want,
        );
    };
    session(
        &mut f,
        "faults_injected_rate_limit_then_success",
        json!([injected(429, &[("retry-after-ms", "300")]), ok()]),
        "injected_faults\":1",
    );
    session(
        &mut f,
        "faults_two_injected_and_a_real_failure",
        json!([injected(503, &[]), real(503), injected(429, &[]), ok()]),
        "injected_faults\":2",
    );
    session(
        &mut f,
        "faults_none_injected_no_field",
        json!([real(503), ok()]),
        "completed",
    );
    let script = json!([injected(429, &[("retry-after-ms", "300")]), ok()]);
    let base = bundle(&policy, &script);
    f.verify("faults_verify_sealed", &t(&base), "verified");
    let mut b = base.clone();
    b["attempts"]["attempts"][0]
        .as_object_mut()
        .expect("attempt")
        .remove("injected_fault");
    f.verify("faults_verify_mark_removed", &t(&b), "receipt_mismatch");
    let mut b = base.clone();
    b["receipt"]
        .as_object_mut()
        .expect("receipt")
        .remove("injected_faults");
    f.verify("faults_verify_count_removed", &t(&b), "receipt_mismatch");
    let clean = bundle(&policy, &json!([real(503), ok()]));
    let mut b = clean.clone();
    set(&mut b, "/receipt/injected_faults", json!(1));
    f.verify("faults_verify_count_forged", &t(&b), "receipt_mismatch");
    f
}
