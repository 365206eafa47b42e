//! `fleet_session`: runs admitted under breakers and the budget against an in-memory store.

use super::*;

/// `retry_after_over_cap: skip_route` under a fleet: a wait longer than the
/// cap parks the route in its breaker snapshot, so every run skips it until
/// the server's time.
fn parking_cases(f: &mut Family) {
    let p = fleet_policy(
        consecutive(5, 1),
        None,
        "fail_closed",
        &[("/backoff/retry_after_over_cap", json!("skip_route"))],
    );
    let over_cap = observe(
        40,
        json!({"headers": [["retry-after-ms", "30000"]], "result": "raised", "status": 429}),
    );
    session(
        f,
        "fleet_skip_route_parks_the_route",
        &p,
        json!({}),
        vec![admit(T0), over_cap, admit(T0 + 100), succeeds()],
        &format!("parked_until_epoch_ms\":{}", T0 + 40 + 30_000),
    );
    let within_cap = observe(
        40,
        json!({"headers": [["retry-after-ms", "1500"]], "result": "raised", "status": 429}),
    );
    session(
        f,
        "fleet_skip_route_within_cap_parks_nothing",
        &p,
        json!({}),
        vec![admit(T0), within_cap, admit(T0 + 1_540), succeeds()],
        "completed",
    );
    let parked = json!({"breakers": {primary(): snap(&primary(), &[("parked_until_epoch_ms", json!(T0 + 30_000))])}});
    session(
        f,
        "fleet_parked_route_skipped_by_another_run",
        &p,
        parked.clone(),
        vec![admit(T0 + 1_000), succeeds()],
        "routes_skipped\":1",
    );
    session(
        f,
        "fleet_parked_route_admits_at_its_time",
        &p,
        parked,
        vec![admit(T0 + 30_000), succeeds()],
        "routes_skipped\":0",
    );
    let cfg = consecutive(2, 1);
    b_admit(
        f,
        "breaker_parked_rejects_until_its_time",
        &cfg,
        &snap(&primary(), &[("parked_until_epoch_ms", json!(T0 + 5_000))]),
        T0 + 4_999,
        "rejected",
    );
    b_admit(
        f,
        "breaker_parked_admits_and_clears_at_its_time",
        &cfg,
        &snap(&primary(), &[("parked_until_epoch_ms", json!(T0 + 5_000))]),
        T0 + 5_000,
        "admitted",
    );
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

pub(super) fn session_cases(f: &mut Family) {
    let p = fleet_policy(consecutive(2, 1), Some(budget_cfg()), "fail_closed", &[]);
    let none = json!({});
    parking_cases(f);
    session(
        f,
        "fleet_all_closed",
        &p,
        none.clone(),
        vec![admit(T0), succeeds()],
        "completed",
    );
    let primary_open = json!({"breakers": {primary(): open_at(&primary(), T0, 3)}});
    session(
        f,
        "fleet_open_primary_skipped",
        &p,
        primary_open.clone(),
        vec![admit(T0 + 100), succeeds()],
        "routes_skipped\":1",
    );
    session(
        f,
        "fleet_every_route_open",
        &p,
        json!({"breakers": {primary(): open_at(&primary(), T0, 3), fallback(): open_at(&fallback(), T0, 1)}}),
        vec![admit(T0 + 100)],
        "stop_circuit_open",
    );
    session(
        f,
        "fleet_probe_closes",
        &p,
        json!({"breakers": {primary(): open_at(&primary(), T0, 3)}}),
        vec![admit(T0 + 10_000), succeeds()],
        "probes\":1",
    );
    session(
        f,
        "fleet_probe_fails_and_reopens",
        &p,
        json!({"breakers": {primary(): open_at(&primary(), T0, 3)}, "budget": bsnap(3_000)}),
        vec![admit(T0 + 10_000), fails(), admit(T0 + 10_200), succeeds()],
        "fallback_used\":true",
    );
    let three = fleet_policy(
        consecutive(2, 1),
        Some(budget_cfg()),
        "fail_closed",
        &[
            ("/routes/0/max_attempts", json!(3)),
            ("/max_total_attempts", json!(5)),
        ],
    );
    session(
        f,
        "fleet_breaker_opens_mid_run",
        &three,
        json!({"budget": bsnap(3_000)}),
        vec![
            admit(T0),
            fails(),
            admit(T0 + 200),
            fails(),
            admit(T0 + 500),
            succeeds(),
        ],
        "routes_skipped\":1",
    );
    session(
        f,
        "fleet_retry_budget_refuses",
        &p,
        none.clone(),
        vec![admit(T0), fails(), admit(T0 + 150)],
        "stop_retry_budget",
    );
    session(
        f,
        "fleet_retry_budget_grants",
        &p,
        json!({"budget": bsnap(1_600)}),
        vec![admit(T0), fails(), admit(T0 + 150), succeeds()],
        "withdrawals\":1",
    );
    session(
        f,
        "fleet_store_down_fail_closed",
        &p,
        none.clone(),
        vec![json!({"admit": T0, "store_down": true})],
        "stop_store_unavailable",
    );
    let open_policy = fleet_policy(consecutive(2, 1), Some(budget_cfg()), "fail_open", &[]);
    session(
        f,
        "fleet_store_down_fail_open",
        &open_policy,
        none.clone(),
        vec![json!({"admit": T0, "store_down": true}), succeeds()],
        "admitted_without_store\":1",
    );
    session(
        f,
        "fleet_observe_without_admission",
        &p,
        none.clone(),
        vec![succeeds()],
        "admission_missing",
    );
    session(
        f,
        "fleet_generation_goes_back",
        &p,
        // The first admission reads the budget at generation 5; the store
        // then answers with generation 2 (it lost state).
        json!({"budget": {"balance_milli": 3_000, "deposits": 0, "generation": 5, "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries", "updated_at_epoch_ms": T0, "withdrawals": 0}}),
        vec![
            admit(T0),
            fails(),
            json!({"set": {"balance_milli": 3_000, "deposits": 0, "generation": 2, "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries", "updated_at_epoch_ms": T0, "withdrawals": 0}}),
            admit(T0 + 200),
        ],
        "generation_regressed",
    );
    session(
        f,
        "fleet_admit_without_fleet",
        &t(&policy_with(&[])),
        none.clone(),
        vec![admit(T0)],
        "admission_unexpected",
    );
    session(
        f,
        "fleet_breaker_only",
        &fleet_policy(ratio(), None, "fail_closed", &[]),
        none.clone(),
        vec![admit(T0), fails(), admit(T0 + 150), succeeds()],
        "completed",
    );
    session(
        f,
        "fleet_snapshot_of_another_release",
        &p,
        json!({"breakers": {primary(): snap(&fallback(), &[("state", json!("open")), ("opened_at_epoch_ms", json!(T0))])}}),
        vec![admit(T0 + 1)],
        "snapshot_key_mismatch",
    );
}
