//! An admission previewed is the admission made, and leaves the session as it was.
#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use std::sync::Arc;

use retryledger_core::fleet::FleetView;
use retryledger_core::{compile, lab, Session};
use serde_json::json;

#[test]
fn a_previewed_admission_changes_nothing_and_equals_the_admission() {
    let mut p = lab::reference_policy();
    p["fleet"] = json!({
        "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000},
        "on_store_unavailable": "fail_closed",
        "retry_budget": {"floor_per_second": 0, "max_tokens": 5, "ratio_permille": 100, "scope": "s"}
    });
    let policy = Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap());
    let mut session = Session::start(policy);
    let view = FleetView::default();
    let before = session.next().clone();
    let preview = session.admit_preview(0, 1_780_000_000_000, &view).unwrap();
    assert_eq!(session.next(), &before);
    assert!(session.fleet_snapshots().breakers.is_empty());
    let admitted = session.admit(0, 1_780_000_000_000, &view).unwrap();
    assert_eq!(preview, admitted);
    assert!(!session.fleet_snapshots().breakers.is_empty());
}
