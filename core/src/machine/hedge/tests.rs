//! Hedged runs driven through the hedge drivers' handle, replayed to their
//! receipts, under a retry budget and live.

use std::sync::Arc;

use super::{HedgeSession, HedgeStep};
use crate::error::ErrorCode;
use crate::evaluate::Terminal;
use crate::fleet::FleetView;
use crate::hedge::HedgeSummary;
use crate::observe::Facts;
use crate::outcome::{Outcome, RetryableKind};
use crate::policy::CompiledPolicy;
use serde_json::json;

fn hedged() -> Arc<CompiledPolicy> {
    let mut p = crate::lab::reference_policy();
    p["max_total_attempts"] = json!(6);
    p["routes"][0]["max_attempts"] = json!(3);
    p["routes"][1]["max_attempts"] = json!(3);
    p["hedge"] = json!({
        "cancelled_cost": "reserve", "cost_share_percent": 50, "delay_ms": 200,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]
    });
    Arc::new(crate::api::compile_policy(&p.to_string()).unwrap())
}

#[test]
fn a_plain_session_under_a_hedge_policy_replays_to_its_receipt() {
    let cp = hedged();
    let mut s = crate::Session::start(Arc::clone(&cp));
    let down = Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    };
    s.record(0, 100, 1_500, down).unwrap();
    s.record(200, 300, 1_500, Outcome::Success).unwrap();
    let receipt = s.receipt().unwrap();
    assert_eq!(receipt, crate::evaluate(&cp, s.attempts()).unwrap());
    assert_eq!(
        receipt.hedge,
        Some(HedgeSummary {
            winner_ordinal: Some(2),
            ..HedgeSummary::default()
        })
    );
}

fn budget_view(balance_milli: u64) -> FleetView {
    let snap = json!({"balance_milli": balance_milli, "deposits": 0, "generation": 0,
        "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
        "updated_at_epoch_ms": 1_000, "withdrawals": 0});
    crate::decode::from_str(&json!({"breakers": {}, "budget": snap}).to_string()).unwrap()
}

fn with_budget() -> Arc<CompiledPolicy> {
    let mut p = crate::canonical::to_value(&hedged().policy);
    p["fleet"] = json!({"on_store_unavailable": "fail_closed", "retry_budget": {
        "floor_per_second": 0, "max_tokens": 3, "ratio_permille": 500, "scope": "tenant-7/summaries"}});
    Arc::new(crate::api::compile_policy(&p.to_string()).unwrap())
}

#[test]
fn a_hedge_withdraws_from_the_retry_budget_and_replays() {
    let cp = with_budget();
    let mut h = HedgeSession::start(Arc::clone(&cp)).unwrap();
    // The lead deposits; the hedge withdraws a whole token.
    let a = h.admit(0, 1_000, &budget_view(1_000)).unwrap();
    assert!(matches!(a.step, HedgeStep::Dispatch(_)));
    let deposited = a.writes.budget.unwrap();
    h.start_attempt(1, 0).unwrap();
    let a = h
        .admit(200, 1_200, &budget_view(deposited.balance_milli))
        .unwrap();
    assert!(matches!(a.step, HedgeStep::Await { hedge: Some(_), .. }));
    assert!(a.writes.budget.is_some());
    h.start_attempt(2, 200).unwrap();
    h.observe(2, 300, None, &Facts::returned()).unwrap();
    h.cancelled(1, 301).unwrap();
    let bundle = h.seal().unwrap();
    assert_eq!(
        bundle.receipt.fleet.as_ref().map(|f| f.withdrawals),
        Some(1)
    );
    assert!(matches!(
        crate::receipt::verify_bundle(&bundle).unwrap(),
        crate::Verdict::Verified { .. }
    ));
    // A hedge without its budget token is forged.
    let mut forged = bundle.clone();
    forged.attempts.attempts[1].admission = None;
    let v = crate::receipt::verify_bundle(&forged).unwrap();
    assert!(
        matches!(v, crate::Verdict::Drift { ref code, .. } if code == "admission_missing"),
        "{v:?}"
    );
}

#[test]
fn a_budget_snapshot_older_than_one_the_run_read_is_refused() {
    // As for a plain session: a store answering an older generation of
    // the budget than the run already read is not believed.
    let cp = with_budget();
    let mut h = HedgeSession::start(Arc::clone(&cp)).unwrap();
    let at = |generation: u64, balance_milli: u64| -> FleetView {
        let snap = json!({"balance_milli": balance_milli, "deposits": 0, "generation": generation,
            "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
            "updated_at_epoch_ms": 1_000, "withdrawals": 0});
        crate::decode::from_str(&json!({"breakers": {}, "budget": snap}).to_string()).unwrap()
    };
    h.admit(0, 1_000, &at(5, 3_000)).unwrap();
    h.start_attempt(1, 0).unwrap();
    let e = h.admit(200, 1_200, &at(4, 3_000)).unwrap_err();
    assert_eq!(
        (e.code.as_str(), e.path.as_deref()),
        ("generation_regressed", Some("/budget/generation"))
    );
    // The same generation again (an unchanged register) is fine.
    assert!(h.admit(200, 1_200, &at(5, 3_000)).is_ok());
}

#[test]
fn a_budget_short_of_a_token_refuses_the_hedge_not_the_run() {
    let cp = with_budget();
    let mut h = HedgeSession::start(Arc::clone(&cp)).unwrap();
    h.admit(0, 1_000, &budget_view(0)).unwrap();
    h.start_attempt(1, 0).unwrap();
    // 500 milli-tokens after the deposit: short of a hedge.
    let a = h.admit(200, 1_200, &budget_view(500)).unwrap();
    assert_eq!(
        a.step,
        HedgeStep::Await {
            hedge: None,
            in_flight: vec![1]
        }
    );
    assert_eq!(
        h.start_attempt(2, 200).unwrap_err().code,
        ErrorCode::HedgeOverBudget
    );
    h.observe(1, 700, None, &Facts::returned()).unwrap();
    let receipt = h.receipt().unwrap();
    assert_eq!(receipt.terminal, Terminal::Completed);
    assert_eq!(receipt.attempt_count, 1);
}

#[test]
fn the_live_session_is_the_replay() {
    let cp = hedged();
    let mut h = HedgeSession::start(Arc::clone(&cp)).unwrap();
    let ok = Facts::returned();
    assert!(matches!(h.next(), HedgeStep::Dispatch(_)));
    let step = h.start_attempt(1, 0).unwrap();
    let HedgeStep::Await { hedge: Some(d), .. } = step else {
        panic!("a hedge on offer: {step:?}")
    };
    assert_eq!(
        (d.ordinal, d.not_before_ms, d.route_id.as_str()),
        (2, 200, "external-fallback")
    );
    h.start_attempt(2, 210).unwrap();
    let (_, step) = h.observe(2, 400, None, &ok).unwrap();
    assert_eq!(
        step,
        HedgeStep::Cancel {
            decided_by: 2,
            ordinals: vec![1]
        }
    );
    let step = h.cancelled(1, 401).unwrap();
    assert_eq!(
        step,
        HedgeStep::Terminal {
            terminal: Terminal::Completed
        }
    );
    let receipt = h.receipt().unwrap();
    assert_eq!(receipt, crate::evaluate(&cp, h.attempts()).unwrap());
    let summary = receipt.hedge.unwrap();
    assert_eq!(summary.winner_ordinal, Some(2));
    assert_eq!(summary.loser_cost, 1_500);
    assert_eq!(receipt.total_cost, 4_500);
    assert_eq!(receipt.attempt_count, 2);
}
