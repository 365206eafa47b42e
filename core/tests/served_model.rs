//! Which model answered: an attempt records the model it asked for and the
//! one the provider reported; the receipt names both per attempt; an
//! attempt whose host reported neither records nothing, so existing digests
//! are unchanged; a side the host did not learn stays absent.
#![cfg(feature = "lab")]
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    reason = "tests fail loudly"
)]

use std::sync::Arc;

use retryledger_core::decode::from_value;
use retryledger_core::ids::Identifier;
use retryledger_core::observe::Facts;
use retryledger_core::{compile, lab, verify_bundle, Session, Verdict};
use serde_json::json;

fn id(s: &str) -> Identifier {
    Identifier::parse(s).unwrap()
}

fn session() -> Session {
    let policy = compile(from_value(lab::reference_policy()).unwrap()).unwrap();
    Session::start(Arc::new(policy))
}

fn overloaded() -> Facts {
    let mut f = Facts::raised();
    f.status = Some(503);
    f
}

#[test]
fn the_receipt_names_the_requested_and_served_model_per_attempt() {
    let mut s = session();
    s.set_model(Some(id("gpt-4.1-2025-04-14")), None);
    s.observe(0, 100, None, &overloaded()).unwrap();
    let nb = match s.next() {
        retryledger_core::Decision::Dispatch(d) => d.not_before_ms,
        other => panic!("{other:?}"),
    };
    s.set_model(
        Some(id("claude-sonnet-4-5")),
        Some(id("claude-sonnet-4-5-20250929")),
    );
    s.observe(nb, nb + 50, None, &Facts::returned()).unwrap();
    let bundle = s.seal().unwrap();
    let attempts = retryledger_core::canonical::to_value(&bundle.attempts);
    assert_eq!(
        attempts["attempts"][0]["model"],
        json!({"requested": "gpt-4.1-2025-04-14"})
    );
    assert_eq!(
        attempts["attempts"][1]["model"],
        json!({"requested": "claude-sonnet-4-5", "served": "claude-sonnet-4-5-20250929"})
    );
    let receipt = retryledger_core::canonical::to_value(&bundle.receipt);
    assert_eq!(
        receipt["schedule"][1]["model"]["served"],
        json!("claude-sonnet-4-5-20250929")
    );
    assert!(receipt["schedule"][0]["model"].get("served").is_none());
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        Verdict::Verified { .. }
    ));
    // A recorded model is bound by the receipt: changing it is a mismatch.
    let mut text = retryledger_core::canonical::canonical_json(&bundle);
    text = text.replacen("claude-sonnet-4-5-20250929", "claude-opus-4-1-20250805", 1);
    let tampered: retryledger_core::Bundle =
        retryledger_core::decode::from_str_within(&text, usize::MAX).unwrap();
    assert!(matches!(
        verify_bundle(&tampered).unwrap(),
        Verdict::Drift { .. }
    ));
}

#[test]
fn an_attempt_without_a_reported_model_records_nothing() {
    let mut with = session();
    with.set_model(None, None);
    with.observe(0, 100, None, &Facts::returned()).unwrap();
    let mut without = session();
    without.observe(0, 100, None, &Facts::returned()).unwrap();
    let a = with.seal().unwrap();
    let b = without.seal().unwrap();
    assert_eq!(a, b);
    assert!(!retryledger_core::canonical::canonical_json(&a).contains("\"model\""));
}

#[test]
fn an_empty_model_record_is_refused() {
    let e = from_value::<retryledger_core::attempt::ModelRecord>(json!({})).unwrap_err();
    assert_eq!(e.code, retryledger_core::ErrorCode::MissingField);
}
