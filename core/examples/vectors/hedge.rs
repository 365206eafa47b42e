//! `hedge.json`: hedging, one winner, every attempt accounted.
//!
//! `validate_policy` cases break each rule of the `hedge` section alone.
//! `hedge_session` cases run a scripted hedged session event by event (a
//! lead, hedges at their thresholds, results, cancelled and late losers) and
//! pin every step, the attempts, the receipt with its hedge summary and the
//! sealed bundle's verdict. `verify_bundle` cases forge sealed hedged
//! bundles: a second commit, a hedge before its threshold, beyond its
//! budget, after a result, a loser charged or marked otherwise.

use retryledger_core::hedge;
use serde_json::{json, Value};

use crate::common::{edited, policy_with, remove, set, t};
use crate::family::Family;

/// The reference policy with a hedge on the fallback after 200 ms.
pub fn hedged() -> Value {
    policy_with(&[
        ("/max_total_attempts", json!(6)),
        ("/routes/0/max_attempts", json!(3)),
        ("/routes/1/max_attempts", json!(3)),
        (
            "/hedge",
            json!({
                "cancelled_cost": "reserve",
                "cost_share_percent": 50,
                "delay_ms": 200,
                "effects": "none",
                "max_hedges": 1,
                "routes": ["external-fallback"]
            }),
        ),
    ])
}

fn ok() -> Value {
    json!({"result": "returned"})
}

fn down() -> Value {
    json!({"error_types": ["APIStatusError"], "result": "raised", "status": 503})
}

fn rejected() -> Value {
    json!({"error_types": ["APIStatusError"], "result": "raised", "status": 400})
}

fn start(n: u64, at: u64) -> Value {
    json!({"start": n, "at": at})
}

fn observe(n: u64, at: u64, facts: Value) -> Value {
    json!({"observe": n, "at": at, "facts": facts})
}

fn cancelled(n: u64, at: u64) -> Value {
    json!({"cancelled": n, "at": at})
}

fn bundle(policy: &Value, script: &Value) -> Value {
    let r = hedge::script(&t(policy), &t(script)).expect("a session");
    assert_eq!(r["verdict"]["kind"], "verified", "{r}");
    // The bundle itself, sealed again from its parts.
    let attempts = &r["attempts"];
    json!({
        "attempts": attempts,
        "policy": policy,
        "receipt": r["receipt"],
        "schema": "retryledger.bundle.v1",
    })
}

/// A hedged run under a fleet retry budget, admitted through the session:
/// the lead deposits, the hedge withdraws; the hedge wins, the lead is cancelled.
fn fleet_bundle(hp: &Value) -> Value {
    use retryledger_core::fleet::FleetView;
    use retryledger_core::observe::Facts;
    let mut p = hp.clone();
    set(
        &mut p,
        "/fleet",
        json!({"on_store_unavailable": "fail_closed", "retry_budget": {
            "floor_per_second": 0, "max_tokens": 3, "ratio_permille": 500, "scope": "tenant-7/summaries"}}),
    );
    let view = |balance: u64| -> FleetView {
        let snap = json!({"balance_milli": balance, "deposits": 0, "generation": 0,
            "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
            "updated_at_epoch_ms": 1_780_000_000_000u64, "withdrawals": 0});
        retryledger_core::decode::from_value(json!({"breakers": {}, "budget": snap}))
            .expect("a view")
    };
    let mut h = hedge::HedgeSession::start_json(&t(&p)).expect("a hedged policy");
    let a = h
        .admit(0, 1_780_000_000_000, &view(1_000))
        .expect("the lead");
    let balance = a.writes.budget.expect("a deposit").balance_milli;
    h.start_attempt(1, 0).expect("the lead");
    h.admit(200, 1_780_000_000_200, &view(balance))
        .expect("the hedge");
    h.start_attempt(2, 200).expect("the hedge");
    h.observe(2, 330, None, &Facts::returned())
        .expect("the winner");
    h.cancelled(1, 331).expect("the loser");
    retryledger_core::canonical::to_value(&h.seal().expect("a finished run"))
}

pub fn family() -> Family {
    let mut f = Family::new(
        "hedge",
        "hedging: validate_policy of the hedge section (each rule alone); hedge_session: a hedged run event by event (each step's answer, the attempts, the receipt with its hedge summary, the sealed bundle's verdict); verify_bundle and evaluate of forged hedged bundles.",
        "a valid hedge section and each of its rules broken (delay 0 or at the deadline, no hedges, more hedges than attempts, external effects, a route without idempotency, an unknown or repeated route, the cost share out of range, a stream, unknown fields); the lead winning before the threshold, a hedge winning with the lead cancelled or late, the lead winning with the hedge cancelled, a cancelled loser at zero cost, failures before and after a hedge went out, a round of failures followed by a retry, a non-retryable hedge, two hedges, the share and the deadline refusing a hedge; a hedge early, after a result, beyond max_hedges; a cancellation before the round was decided; a second commit, a hedge before its threshold or beyond its budget, a loser unmarked, marked before the commit or charged otherwise, a forged winner",
    );
    let hp = hedged();
    let p = t(&hp);

    // Validation.
    f.policy("hedge_policy_valid", &p, "ok");
    let bad: &[(&str, &str, Value, &str)] = &[
        (
            "hedge_delay_zero",
            "/hedge/delay_ms",
            json!(0),
            "invalid_hedge",
        ),
        (
            "hedge_delay_at_deadline",
            "/hedge/delay_ms",
            json!(5_000),
            "invalid_hedge",
        ),
        (
            "hedge_max_hedges_zero",
            "/hedge/max_hedges",
            json!(0),
            "invalid_hedge",
        ),
        (
            "hedge_more_hedges_than_attempts",
            "/hedge/max_hedges",
            json!(6),
            "hedge_exceeds_attempts",
        ),
        (
            "hedge_external_effects",
            "/hedge/effects",
            json!("external"),
            "hedge_external_effects",
        ),
        (
            "hedge_route_not_idempotent",
            "/routes/1/supports_idempotency",
            json!(false),
            "hedge_route_not_idempotent",
        ),
        (
            "hedge_route_unknown",
            "/hedge/routes",
            json!(["nowhere"]),
            "invalid_hedge",
        ),
        (
            "hedge_route_twice",
            "/hedge/routes",
            json!(["external-fallback", "external-fallback"]),
            "invalid_hedge",
        ),
        (
            "hedge_no_routes",
            "/hedge/routes",
            json!([]),
            "invalid_hedge",
        ),
        (
            "hedge_cost_share_zero",
            "/hedge/cost_share_percent",
            json!(0),
            "invalid_hedge",
        ),
        (
            "hedge_cost_share_over_100",
            "/hedge/cost_share_percent",
            json!(101),
            "invalid_hedge",
        ),
        (
            "hedge_with_stream",
            "/stream",
            json!({"max_response_bytes": 1000, "mode": "buffer"}),
            "invalid_hedge",
        ),
        (
            "hedge_unknown_field",
            "/hedge/jitter",
            json!(1),
            "unknown_field",
        ),
        (
            "hedge_effects_unknown",
            "/hedge/effects",
            json!("some"),
            "invalid_value",
        ),
        (
            "hedge_delay_float",
            "/hedge/delay_ms",
            json!(1.5),
            "float_value",
        ),
    ];
    for (name, ptr, v, want) in bad {
        f.policy(name, &t(&edited(&hp, &[(ptr, v.clone())])), want);
    }
    let mut missing = hp.clone();
    remove(&mut missing, "/hedge/effects");
    f.policy("hedge_effects_missing", &t(&missing), "missing_field");

    // Sessions.
    let session = |f: &mut Family, name: &str, policy: &Value, script: Value, want: &str| {
        f.add(
            name,
            "hedge_session",
            vec![("policy", json!(t(policy))), ("script", json!(t(&script)))],
            want,
        );
    };
    let lead_wins = json!([start(1, 0), observe(1, 150, ok())]);
    session(
        &mut f,
        "hedge_lead_wins_before_threshold",
        &hp,
        lead_wins,
        "winner_ordinal\":1",
    );
    let hedge_wins = json!([
        start(1, 0),
        start(2, 200),
        observe(2, 350, ok()),
        cancelled(1, 351)
    ]);
    session(
        &mut f,
        "hedge_wins_lead_cancelled",
        &hp,
        hedge_wins.clone(),
        "winner_ordinal\":2",
    );
    let late = json!([
        start(1, 0),
        start(2, 200),
        observe(2, 350, ok()),
        observe(1, 900, ok())
    ]);
    session(&mut f, "hedge_wins_lead_late", &hp, late.clone(), "late");
    let lead_after = json!([
        start(1, 0),
        start(2, 200),
        observe(1, 300, ok()),
        cancelled(2, 305)
    ]);
    session(
        &mut f,
        "hedge_lead_wins_hedge_cancelled",
        &hp,
        lead_after,
        "cancelled",
    );
    let zero = edited(&hp, &[("/hedge/cancelled_cost", json!("zero"))]);
    session(
        &mut f,
        "hedge_cancelled_loser_costs_zero",
        &zero,
        hedge_wins.clone(),
        "loser_cost\":0",
    );
    session(
        &mut f,
        "hedge_lead_fails_before_threshold_retries",
        &hp,
        json!([
            start(1, 0),
            observe(1, 100, down()),
            start(2, 200),
            observe(2, 260, ok())
        ]),
        "completed",
    );
    session(
        &mut f,
        "hedge_lead_fails_after_hedge_hedge_wins",
        &hp,
        json!([
            start(1, 0),
            start(2, 200),
            observe(1, 250, down()),
            observe(2, 400, ok())
        ]),
        "winner_ordinal\":2",
    );
    session(
        &mut f,
        "hedge_round_of_failures_then_retry",
        &hp,
        json!([
            start(1, 0),
            start(2, 200),
            observe(1, 250, down()),
            observe(2, 300, down()),
            start(3, 400),
            observe(3, 450, ok())
        ]),
        "completed",
    );
    session(
        &mut f,
        "hedge_non_retryable_hedge_decides",
        &hp,
        json!([
            start(1, 0),
            start(2, 200),
            observe(2, 260, rejected()),
            cancelled(1, 270)
        ]),
        "stop_non_retryable",
    );
    let two = edited(
        &hp,
        &[
            ("/hedge/max_hedges", json!(2)),
            (
                "/hedge/routes",
                json!(["external-fallback", "private-primary"]),
            ),
            ("/hedge/cost_share_percent", json!(100)),
            ("/max_total_cost", json!(20_000)),
        ],
    );
    session(
        &mut f,
        "hedge_two_hedges_second_wins",
        &two,
        json!([
            start(1, 0),
            start(2, 200),
            start(3, 400),
            observe(3, 450, ok()),
            cancelled(1, 451),
            observe(2, 460, down())
        ]),
        "winner_ordinal\":3",
    );
    let small = edited(&hp, &[("/hedge/cost_share_percent", json!(20))]);
    session(
        &mut f,
        "hedge_share_refuses_hedge",
        &small,
        json!([start(1, 0), observe(1, 300, ok())]),
        "hedges\":0",
    );
    session(
        &mut f,
        "hedge_share_refuses_started_hedge",
        &small,
        json!([start(1, 0), start(2, 200)]),
        "hedge_over_budget",
    );
    session(
        &mut f,
        "hedge_threshold_past_deadline",
        &hp,
        json!([start(1, 4_850), start(2, 5_050)]),
        "hedge_over_budget",
    );
    session(
        &mut f,
        "hedge_success_at_deadline_stops",
        &hp,
        json!([
            start(1, 0),
            start(2, 200),
            observe(1, 5_000, ok()),
            cancelled(2, 5_001)
        ]),
        "stop_deadline",
    );
    session(
        &mut f,
        "hedge_before_threshold",
        &hp,
        json!([start(1, 0), start(2, 199)]),
        "hedge_before_threshold",
    );
    session(
        &mut f,
        "hedge_after_result",
        &two,
        json!([
            start(1, 0),
            start(2, 200),
            observe(1, 250, down()),
            start(3, 400)
        ]),
        "hedge_after_result",
    );
    session(
        &mut f,
        "hedge_beyond_max_hedges",
        &hp,
        json!([start(1, 0), start(2, 200), start(3, 400)]),
        "hedge_over_budget",
    );
    session(
        &mut f,
        "hedge_cancelled_before_decision",
        &hp,
        json!([start(1, 0), start(2, 200), cancelled(2, 250)]),
        "hedge_loss_drift",
    );
    session(
        &mut f,
        "hedge_observe_not_in_flight",
        &hp,
        json!([start(1, 0), observe(3, 50, ok())]),
        "ordinal_drift",
    );
    session(
        &mut f,
        "hedge_run_not_finished",
        &hp,
        json!([start(1, 0), start(2, 200)]),
        "run_not_terminal",
    );
    session(
        &mut f,
        "hedge_cancel_run_between_rounds",
        &hp,
        json!([start(1, 0), observe(1, 100, down()), {"cancel_run": 120}]),
        "stop_cancelled",
    );

    // Forged bundles.
    let won = bundle(&hp, &hedge_wins);
    f.verify("hedge_bundle_verified", &t(&won), "verified");
    f.add(
        "hedge_evaluate_receipt",
        "evaluate",
        vec![
            ("policy", json!(p)),
            ("attempts", json!(t(&won["attempts"]))),
        ],
        "winner_ordinal\":2",
    );
    f.plan(
        "hedge_plan_after_round",
        &p,
        &t(&won["attempts"]),
        "terminal",
    );
    let forge = |edits: &[(&str, Value)]| t(&edited(&won, edits));
    f.verify(
        "hedge_forged_before_threshold",
        &forge(&[("/attempts/attempts/1/started_at_ms", json!(150))]),
        "hedge_before_threshold",
    );
    f.verify(
        "hedge_forged_cancelled_charge",
        &forge(&[("/attempts/attempts/0/cost", json!(0))]),
        "hedge_charge_drift",
    );
    let mut unmarked = won.clone();
    remove(&mut unmarked, "/attempts/attempts/0/hedge");
    set(
        &mut unmarked,
        "/attempts/attempts/0/outcome",
        json!({"class": "retryable", "kind": "unavailable"}),
    );
    f.verify(
        "hedge_forged_loser_unmarked",
        &t(&unmarked),
        "hedge_loss_drift",
    );
    f.verify(
        "hedge_forged_loser_before_commit",
        &forge(&[("/attempts/attempts/0/completed_at_ms", json!(340))]),
        "hedge_loss_drift",
    );
    f.verify(
        "hedge_forged_winner",
        &forge(&[("/receipt/hedge/winner_ordinal", json!(1))]),
        "receipt_mismatch",
    );
    let mut orphan = won.clone();
    set(
        &mut orphan,
        "/attempts/attempts/1/hedge/hedges_ordinal",
        json!(2),
    );
    f.verify(
        "hedge_forged_hedges_ordinal",
        &t(&orphan),
        "hedge_loss_drift",
    );
    let mut over = won.clone();
    set(&mut over, "/policy/hedge/cost_share_percent", json!(20));
    f.verify("hedge_forged_beyond_budget", &t(&over), "hedge_over_budget");
    let lated = bundle(&hp, &late);
    let mut second = lated.clone();
    remove(&mut second, "/attempts/attempts/0/hedge");
    f.verify(
        "hedge_forged_second_commit",
        &t(&second),
        "hedge_second_commit",
    );
    // Under the fleet retry budget: the lead deposits, the hedge withdraws.
    let fleet = fleet_bundle(&hp);
    assert_eq!(
        fleet["receipt"]["fleet"]["withdrawals"], 1,
        "the hedge withdrew"
    );
    f.verify("hedge_fleet_bundle_verified", &t(&fleet), "verified");
    let mut deposit = fleet.clone();
    set(
        &mut deposit,
        "/attempts/attempts/1/admission/budget/kind",
        json!("deposit"),
    );
    f.verify(
        "hedge_fleet_forged_deposit",
        &t(&deposit),
        "admission_drift",
    );
    let mut unadmitted = fleet.clone();
    remove(&mut unadmitted, "/attempts/attempts/1/admission");
    f.verify(
        "hedge_fleet_forged_unadmitted",
        &t(&unadmitted),
        "admission_missing",
    );
    let mut after = bundle(
        &hp,
        &json!([
            start(1, 0),
            start(2, 200),
            observe(1, 250, down()),
            observe(2, 400, ok())
        ]),
    );
    set(
        &mut after,
        "/attempts/attempts/0/completed_at_ms",
        json!(190),
    );
    f.verify(
        "hedge_forged_after_result",
        &t(&after),
        "hedge_after_result",
    );
    f
}
