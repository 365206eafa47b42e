//! A retry budget that waits (`wait_ms`): a retry short of budget asks again
//! later instead of stopping, and stops only when the wait would reach the
//! deadline; replay checks that a stop had no room to wait.

use super::*;

fn waiting(wait_ms: u64) -> Value {
    let mut b = budget_cfg();
    b["wait_ms"] = json!(wait_ms);
    b
}

fn session(f: &mut Family, name: &str, policy: &str, store: Value, script: Vec<Value>, want: &str) {
    f.add(
        name,
        "fleet_session",
        vec![
            ("policy", json!(policy)),
            ("store", json!(t(&store))),
            ("script", json!(t(&json!(script)))),
        ],
        want,
    );
}

pub(super) fn wait_cases(f: &mut Family) {
    let p = fleet_policy(consecutive(2, 1), Some(waiting(1_000)), "fail_closed", &[]);
    let none = json!({});
    // The first attempt deposits 500 milli-tokens; 150 ms later the floor has
    // added 150: short of a token, the retry waits 1,000 ms and writes
    // nothing; asked again then, the floor has filled the token: granted.
    session(
        f,
        "fleet_budget_waits_when_short_then_is_granted",
        &p,
        none.clone(),
        vec![
            admit(T0),
            fails(),
            admit(T0 + 150),
            admit(T0 + 1_150),
            succeeds(),
        ],
        &format!("wait_until_epoch_ms\":{}", T0 + 1_150),
    );
    // Still short when asked again early: it waits again, from then.
    session(
        f,
        "fleet_budget_waits_again",
        &p,
        none.clone(),
        vec![
            admit(T0),
            fails(),
            admit(T0 + 150),
            admit(T0 + 300),
            admit(T0 + 1_300),
            succeeds(),
        ],
        &format!("wait_until_epoch_ms\":{}", T0 + 1_300),
    );
    // A budget that covers the retry does not wait.
    session(
        f,
        "fleet_budget_wait_not_needed",
        &p,
        json!({"budget": bsnap(1_600)}),
        vec![admit(T0), fails(), admit(T0 + 150), succeeds()],
        "withdrawals\":1",
    );
    // A wait that would reach the deadline (5,000 ms) stops at once.
    let late = fleet_policy(consecutive(2, 1), Some(waiting(4_950)), "fail_closed", &[]);
    session(
        f,
        "fleet_budget_wait_past_the_deadline_stops",
        &late,
        none.clone(),
        vec![admit(T0), fails(), admit(T0 + 150)],
        "stop_retry_budget",
    );
    // First attempts never wait: they deposit.
    session(
        f,
        "fleet_budget_wait_first_attempt_deposits",
        &p,
        none.clone(),
        vec![admit(T0), succeeds()],
        "completed",
    );

    // Replay: a stop of a waiting budget that had room to wait is a drift.
    let stopped = lab::fleet_bundle(
        &late,
        &t(&none),
        &t(&json!([admit(T0), fails(), admit(T0 + 150)])),
    )
    .expect("a run");
    let stopped = retryledger_core::canonical::to_value(&stopped);
    f.verify("fleet_verify_budget_wait_stop", &t(&stopped), "verified");
    let mut b = stopped.clone();
    b["attempts"]["fleet_stop"]["at_ms"] = json!(40);
    // Re-sealed, as a forger would.
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    f.verify(
        "fleet_verify_budget_wait_stop_with_room",
        &t(&b),
        "admission_drift",
    );

    for (name, wait, want) in [
        ("fleet_policy_budget_wait", json!(1_000), "ok"),
        (
            "fleet_policy_budget_wait_zero",
            json!(0),
            "invalid_retry_budget",
        ),
        (
            "fleet_policy_budget_wait_over_a_minute",
            json!(60_001),
            "invalid_retry_budget",
        ),
        ("fleet_policy_budget_wait_float", json!(1.5), "float_value"),
    ] {
        let mut b = budget_cfg();
        b["wait_ms"] = wait;
        let fleet =
            json!({"breaker": ratio(), "on_store_unavailable": "fail_closed", "retry_budget": b});
        f.policy(name, &t(&policy_with(&[("/fleet", fleet)])), want);
    }
}
