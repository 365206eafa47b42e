//! `fleet.json`: circuit breakers, the retry budget, and runs admitted under them.
//!
//! `breaker_admit` / `breaker_record` and `budget_deposit` /
//! `budget_withdraw` cases pin every transition of the pure snapshot
//! functions (probe limits, window edges, the budget's floor and cap, a clock
//! behind the snapshot); `fleet_session` cases run a session against an
//! in-memory store (skips, stops, probes, fail open and closed); `verify_bundle`
//! cases replay tampered admissions and snapshots; `validate_policy` cases pin
//! the section's bounds.

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{id, policy_with, t, NOW_2026};
use crate::family::Family;

const T0: u64 = NOW_2026;

fn primary() -> String {
    id("release: private-primary")
}
fn fallback() -> String {
    id("release: external-fallback")
}

fn consecutive(n: u64, probes: u64) -> Value {
    json!({"consecutive_failures": n, "half_open_probes": probes, "open_ms": 10_000})
}

fn ratio() -> Value {
    json!({"failure_ratio_permille": 500, "half_open_probes": 1, "minimum_volume": 4, "open_ms": 10_000, "window_ms": 60_000})
}

/// A breaker snapshot from its fields (the rest zero, closed at T0).
fn snap(release: &str, edits: &[(&str, Value)]) -> Value {
    let mut s = json!({
        "consecutive_failures": 0, "generation": 0, "probe_successes": 0, "probes_in_flight": 0,
        "route_release_sha256": release, "schema": "retryledger.breaker.v1", "state": "closed",
        "updated_at_epoch_ms": T0, "window_failures": 0, "window_start_epoch_ms": T0, "window_total": 0,
    });
    for (k, v) in edits {
        s[*k] = v.clone();
    }
    s
}

fn open_at(release: &str, opened: u64, generation: u64) -> Value {
    snap(
        release,
        &[
            ("state", json!("open")),
            ("opened_at_epoch_ms", json!(opened)),
            ("generation", json!(generation)),
            ("updated_at_epoch_ms", json!(opened)),
            ("window_start_epoch_ms", json!(opened)),
        ],
    )
}

fn half_open(release: &str, in_flight: u64, successes: u64) -> Value {
    snap(
        release,
        &[
            ("state", json!("half_open")),
            ("generation", json!(2)),
            ("probes_in_flight", json!(in_flight)),
            ("probe_successes", json!(successes)),
        ],
    )
}

fn budget_cfg() -> Value {
    json!({"floor_per_second": 1, "max_tokens": 3, "ratio_permille": 500, "scope": "tenant-7/summaries"})
}

fn bsnap(balance: u64) -> Value {
    json!({"balance_milli": balance, "deposits": 0, "generation": 0, "schema": "retryledger.retry_budget.v1",
        "scope": "tenant-7/summaries", "updated_at_epoch_ms": T0, "withdrawals": 0})
}

fn down() -> Value {
    json!({"class": "retryable", "kind": "unavailable"})
}
fn ok() -> Value {
    json!({"class": "success"})
}

fn fleet_policy(
    breaker: Value,
    budget: Option<Value>,
    on_store: &str,
    edits: &[(&str, Value)],
) -> String {
    let mut fleet = json!({"breaker": breaker, "on_store_unavailable": on_store});
    if let Some(b) = budget {
        fleet["retry_budget"] = b;
    }
    let mut all = vec![("/fleet", fleet)];
    all.extend(edits.iter().map(|(k, v)| (*k, v.clone())));
    t(&policy_with(&all))
}

fn observe(duration: u64, facts: Value) -> Value {
    json!({"observe": {"duration_ms": duration, "facts": facts}})
}
fn succeeds() -> Value {
    observe(40, json!({"result": "returned"}))
}
fn fails() -> Value {
    observe(40, json!({"result": "raised", "status": 503}))
}
fn admit(at: u64) -> Value {
    json!({ "admit": at })
}

pub fn family() -> Family {
    let mut f = Family::new(
        "fleet",
        "breaker_admit / breaker_record and budget_deposit / budget_withdraw: the pure transitions of circuit breakers and the retry budget; fleet_session: runs admitted under them against an in-memory store; verify_bundle: tampered admissions and snapshots; validate_policy: the fleet section.",
        "every breaker transition (closed, open, half-open, reopen, close), probe limits, consecutive and ratio triggers, window edges, neutral outcomes, late and non-probe records, a clock behind the snapshot; the budget's ratio, floor, cap and refusal; malformed snapshots and configurations; runs that skip an open route, stop with every route open, probe and close or reopen, open a breaker mid-run, stop or go on by the budget, fail open and fail closed on an unreachable store; admissions missing, unexpected or regressing; tampered snapshots, flags, skips and stops",
    );
    breaker_cases(&mut f);
    budget_cases(&mut f);
    session_cases(&mut f);
    tamper_cases(&mut f);
    policy_cases(&mut f);
    f
}

fn b_admit(f: &mut Family, name: &str, cfg: &Value, s: &Value, now: u64, want: &str) {
    f.add(
        name,
        "breaker_admit",
        vec![
            ("config", json!(t(cfg))),
            ("snapshot", json!(t(s))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

/// `seen` is (whether the attempt was a probe, its outcome).
fn b_record(
    f: &mut Family,
    name: &str,
    cfg: &Value,
    s: &Value,
    seen: (bool, &Value),
    now: u64,
    want: &str,
) {
    let (probe, outcome) = seen;
    f.add(
        name,
        "breaker_record",
        vec![
            ("config", json!(t(cfg))),
            ("snapshot", json!(t(s))),
            ("probe", json!(probe)),
            ("outcome", json!(t(outcome))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

fn breaker_cases(f: &mut Family) {
    let c = consecutive(3, 2);
    let p = primary();
    b_admit(
        f,
        "breaker_admit_closed",
        &c,
        &snap(&p, &[]),
        T0 + 5,
        "admitted",
    );
    b_admit(
        f,
        "breaker_admit_open_before_its_time",
        &c,
        &open_at(&p, T0, 1),
        T0 + 9_999,
        "rejected",
    );
    b_admit(
        f,
        "breaker_admit_open_at_its_time_probes",
        &c,
        &open_at(&p, T0, 1),
        T0 + 10_000,
        "half_open",
    );
    b_admit(
        f,
        "breaker_admit_half_open_second_probe",
        &c,
        &half_open(&p, 1, 0),
        T0 + 1,
        "probes_in_flight\":2",
    );
    b_admit(
        f,
        "breaker_admit_half_open_full",
        &c,
        &half_open(&p, 2, 0),
        T0 + 1,
        "rejected",
    );
    let stuck = snap(
        &p,
        &[
            ("state", json!("half_open")),
            ("generation", json!(2)),
            ("probes_in_flight", json!(2)),
            ("probe_started_at_epoch_ms", json!(T0)),
        ],
    );
    b_admit(
        f,
        "breaker_admit_probes_unanswered_before_open_ms",
        &c,
        &stuck,
        T0 + 9_999,
        "rejected",
    );
    b_admit(
        f,
        "breaker_admit_probes_unanswered_for_open_ms_are_released",
        &c,
        &stuck,
        T0 + 10_000,
        "probes_in_flight\":1",
    );
    b_admit(
        f,
        "breaker_admit_clock_behind_the_snapshot",
        &c,
        &snap(&p, &[("updated_at_epoch_ms", json!(T0 + 500))]),
        T0,
        "admitted",
    );
    b_admit(
        f,
        "breaker_admit_open_clock_behind_opening",
        &c,
        &open_at(&p, T0 + 500, 1),
        T0,
        "rejected",
    );
    let two = snap(
        &p,
        &[
            ("consecutive_failures", json!(2)),
            ("window_total", json!(2)),
            ("window_failures", json!(2)),
        ],
    );
    b_record(
        f,
        "breaker_record_success_resets_the_run",
        &c,
        &two,
        (false, &ok()),
        T0 + 1,
        "consecutive_failures\":0",
    );
    b_record(
        f,
        "breaker_record_failure_counts",
        &c,
        &snap(&p, &[]),
        (false, &down()),
        T0 + 1,
        "consecutive_failures\":1",
    );
    b_record(
        f,
        "breaker_record_third_failure_opens",
        &c,
        &two,
        (false, &down()),
        T0 + 1,
        "open",
    );
    b_record(
        f,
        "breaker_record_invalid_request_is_neutral",
        &c,
        &two,
        (
            false,
            &json!({"class": "non_retryable", "kind": "invalid_request"}),
        ),
        T0 + 1,
        "consecutive_failures\":2",
    );
    b_record(
        f,
        "breaker_record_rate_limited_is_unhealthy",
        &c,
        &two,
        (
            false,
            &json!({"class": "retryable", "kind": "rate_limited", "retry_after_ms": 1000}),
        ),
        T0 + 1,
        "open",
    );
    b_record(
        f,
        "breaker_record_indeterminate_is_neutral",
        &c,
        &two,
        (
            false,
            &json!({"class": "indeterminate", "kind": "unknown_provider_acceptance"}),
        ),
        T0 + 1,
        "closed",
    );
    let r = ratio();
    let w = |total: u64, failures: u64| {
        snap(
            &p,
            &[
                ("window_total", json!(total)),
                ("window_failures", json!(failures)),
                ("consecutive_failures", json!(1)),
            ],
        )
    };
    b_record(
        f,
        "breaker_ratio_below_volume",
        &r,
        &w(2, 2),
        (false, &down()),
        T0 + 1,
        "closed",
    );
    b_record(
        f,
        "breaker_ratio_at_volume_and_threshold_opens",
        &r,
        &w(3, 1),
        (false, &down()),
        T0 + 1,
        "open",
    );
    b_record(
        f,
        "breaker_ratio_under_threshold_stays_closed",
        &r,
        &w(3, 0),
        (false, &down()),
        T0 + 1,
        "closed",
    );
    b_record(
        f,
        "breaker_ratio_success_never_opens",
        &r,
        &w(3, 3),
        (false, &ok()),
        T0 + 1,
        "closed",
    );
    b_record(
        f,
        "breaker_window_rolls_at_its_end",
        &r,
        &w(3, 3),
        (false, &down()),
        T0 + 60_000,
        "window_total\":1",
    );
    b_record(
        f,
        "breaker_window_holds_before_its_end",
        &r,
        &w(3, 3),
        (false, &down()),
        T0 + 59_999,
        "open",
    );
    b_record(
        f,
        "breaker_probe_success_counts",
        &c,
        &half_open(&p, 2, 0),
        (true, &ok()),
        T0 + 1,
        "probe_successes\":1",
    );
    b_record(
        f,
        "breaker_probe_successes_close",
        &c,
        &half_open(&p, 1, 1),
        (true, &ok()),
        T0 + 1,
        "closed",
    );
    b_record(
        f,
        "breaker_probe_failure_reopens",
        &c,
        &half_open(&p, 2, 1),
        (true, &down()),
        T0 + 1,
        "open",
    );
    b_record(
        f,
        "breaker_probe_neutral_frees_its_slot",
        &c,
        &half_open(&p, 1, 0),
        (
            true,
            &json!({"class": "non_retryable", "kind": "invalid_request"}),
        ),
        T0 + 1,
        "probes_in_flight\":0",
    );
    b_record(
        f,
        "breaker_non_probe_while_half_open_ignored",
        &c,
        &half_open(&p, 1, 0),
        (false, &down()),
        T0 + 1,
        "half_open",
    );
    b_record(
        f,
        "breaker_late_record_while_open_ignored",
        &c,
        &open_at(&p, T0, 1),
        (false, &ok()),
        T0 + 1,
        "open",
    );
    for (name, s, want) in [
        (
            "breaker_snapshot_unknown_state",
            snap(&p, &[("state", json!("ajar"))]),
            "invalid_value",
        ),
        (
            "breaker_snapshot_open_without_time",
            snap(&p, &[("state", json!("open"))]),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_closed_with_time",
            snap(&p, &[("opened_at_epoch_ms", json!(T0))]),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_too_many_probes",
            half_open(&p, 3, 0),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_closed_with_probes",
            snap(&p, &[("probes_in_flight", json!(1))]),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_closed_with_probe_time",
            snap(&p, &[("probe_started_at_epoch_ms", json!(T0))]),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_failures_over_total",
            snap(
                &p,
                &[("window_failures", json!(2)), ("window_total", json!(1))],
            ),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_window_after_clock",
            snap(&p, &[("window_start_epoch_ms", json!(T0 + 1))]),
            "invalid_snapshot",
        ),
        (
            "breaker_snapshot_unknown_field",
            snap(&p, &[("owner", json!("me"))]),
            "unknown_field",
        ),
    ] {
        b_admit(f, name, &c, &s, T0, want);
    }
    for (name, cfg, want) in [
        (
            "breaker_config_no_trigger",
            json!({"half_open_probes": 1, "open_ms": 10}),
            "invalid_breaker",
        ),
        (
            "breaker_config_partial_ratio",
            json!({"failure_ratio_permille": 500, "half_open_probes": 1, "open_ms": 10}),
            "invalid_breaker",
        ),
        (
            "breaker_config_zero_probes",
            json!({"consecutive_failures": 1, "half_open_probes": 0, "open_ms": 10}),
            "invalid_breaker",
        ),
        (
            "breaker_config_zero_open",
            json!({"consecutive_failures": 1, "half_open_probes": 1, "open_ms": 0}),
            "invalid_breaker",
        ),
        (
            "breaker_config_ratio_over_one",
            json!({"failure_ratio_permille": 1001, "half_open_probes": 1, "minimum_volume": 1, "open_ms": 10, "window_ms": 10}),
            "invalid_breaker",
        ),
    ] {
        b_admit(f, name, &cfg, &snap(&p, &[]), T0, want);
    }
}

fn budget_cases(f: &mut Family) {
    let c = budget_cfg();
    let op = |f: &mut Family,
              name: &str,
              op: &'static str,
              cfg: &Value,
              s: &Value,
              now: u64,
              want: &str| {
        f.add(
            name,
            op,
            vec![
                ("config", json!(t(cfg))),
                ("snapshot", json!(t(s))),
                ("now_epoch_ms", json!(now)),
            ],
            want,
        );
    };
    op(
        f,
        "budget_deposit_ratio",
        "budget_deposit",
        &c,
        &bsnap(0),
        T0,
        "balance_milli\":500",
    );
    op(
        f,
        "budget_deposit_capped",
        "budget_deposit",
        &c,
        &bsnap(2_800),
        T0,
        "balance_milli\":3000",
    );
    op(
        f,
        "budget_withdraw_granted",
        "budget_withdraw",
        &c,
        &bsnap(1_500),
        T0,
        "balance_milli\":500",
    );
    op(
        f,
        "budget_withdraw_refused",
        "budget_withdraw",
        &c,
        &bsnap(999),
        T0,
        "granted\":false",
    );
    op(
        f,
        "budget_withdraw_exact_token",
        "budget_withdraw",
        &c,
        &bsnap(1_000),
        T0,
        "granted\":true",
    );
    op(
        f,
        "budget_floor_refills",
        "budget_withdraw",
        &c,
        &bsnap(0),
        T0 + 1_000,
        "granted\":true",
    );
    op(
        f,
        "budget_floor_not_yet",
        "budget_withdraw",
        &c,
        &bsnap(0),
        T0 + 999,
        "granted\":false",
    );
    op(
        f,
        "budget_floor_capped",
        "budget_deposit",
        &c,
        &bsnap(0),
        T0 + 3_600_000,
        "balance_milli\":3000",
    );
    let mut behind = bsnap(400);
    behind["updated_at_epoch_ms"] = json!(T0 + 10_000);
    op(
        f,
        "budget_clock_behind_the_snapshot",
        "budget_withdraw",
        &c,
        &behind,
        T0,
        "updated_at_epoch_ms\":1780000010000",
    );
    op(
        f,
        "budget_over_cap",
        "budget_withdraw",
        &c,
        &bsnap(3_001),
        T0,
        "budget_over_cap",
    );
    let mut other = bsnap(0);
    other["scope"] = json!("tenant-8/summaries");
    op(
        f,
        "budget_other_scope",
        "budget_withdraw",
        &c,
        &other,
        T0,
        "snapshot_key_mismatch",
    );
    for (name, cfg, want) in [
        (
            "budget_config_zero_cap",
            json!({"floor_per_second": 0, "max_tokens": 0, "ratio_permille": 100, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_nothing_accrues",
            json!({"floor_per_second": 0, "max_tokens": 5, "ratio_permille": 0, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_floor_over_cap",
            json!({"floor_per_second": 6, "max_tokens": 5, "ratio_permille": 0, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_bad_scope",
            json!({"floor_per_second": 0, "max_tokens": 5, "ratio_permille": 100, "scope": "a b"}),
            "invalid_identifier",
        ),
    ] {
        op(f, name, "budget_deposit", &cfg, &bsnap(0), T0, want);
    }
}

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

fn session_cases(f: &mut Family) {
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

/// Re-seal a tampered bundle's receipt, as a forger would.
fn resealed(mut b: Value) -> Value {
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    b
}

fn digest(v: &Value) -> String {
    api::digest(&t(v)).expect("a document")
}

fn tamper_cases(f: &mut Family) {
    let p = fleet_policy(consecutive(2, 1), Some(budget_cfg()), "fail_closed", &[]);
    let bundle = |store: Value, script: Vec<Value>| {
        let b = lab::fleet_bundle(&p, &t(&store), &t(&json!(script))).expect("a run");
        retryledger_core::canonical::to_value(&b)
    };
    let skipped = bundle(
        json!({"breakers": {primary(): open_at(&primary(), T0, 3)}}),
        vec![admit(T0 + 100), succeeds()],
    );
    f.verify("fleet_verify_skip", &t(&skipped), "verified");

    let mut b = skipped.clone();
    b["fleet_snapshots"]["breakers"][0]["generation"] = json!(4);
    f.verify("fleet_verify_snapshot_altered", &t(&b), "snapshot_missing");

    // A forger who replaces the open snapshot by a closed one, updates the
    // reference and re-seals: the skip no longer follows.
    let closed = snap(&primary(), &[]);
    let mut b = skipped.clone();
    b["fleet_snapshots"]["breakers"][0] = closed.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["snapshot_sha256"] =
        json!(digest(&closed));
    f.verify(
        "fleet_verify_skip_of_an_admitting_route",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["breaker"]["probe"] = json!(true);
    f.verify(
        "fleet_verify_probe_flag_flipped",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["breaker"]["generation"] = json!(9);
    f.verify(
        "fleet_verify_generation_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]
        .as_object_mut()
        .expect("attempt")
        .remove("admission");
    f.verify(
        "fleet_verify_admission_removed",
        &t(&b),
        "admission_missing",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["route_id"] =
        json!("external-fallback");
    f.verify(
        "fleet_verify_skip_of_another_route",
        &t(&b),
        "admission_drift",
    );

    let mut b = skipped.clone();
    let other = snap(
        &fallback(),
        &[
            ("state", json!("open")),
            ("opened_at_epoch_ms", json!(T0)),
            ("generation", json!(3)),
        ],
    );
    b["fleet_snapshots"]["breakers"][0] = other.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["snapshot_sha256"] =
        json!(digest(&other));
    f.verify(
        "fleet_verify_snapshot_of_another_release",
        &t(&resealed(b)),
        "snapshot_key_mismatch",
    );

    let mut b = skipped.clone();
    b["policy"] = policy_with(&[]);
    f.verify(
        "fleet_verify_admission_without_fleet",
        &t(&b),
        "admission_unexpected",
    );

    let mut b = skipped.clone();
    b.as_object_mut().expect("bundle").remove("fleet_snapshots");
    f.verify("fleet_verify_snapshots_missing", &t(&b), "snapshot_missing");

    let refused = bundle(json!({}), vec![admit(T0), fails(), admit(T0 + 150)]);
    f.verify("fleet_verify_budget_stop", &t(&refused), "verified");
    let rich = bsnap(2_000);
    let mut b = refused.clone();
    let n = b["fleet_snapshots"]["budgets"]
        .as_array()
        .expect("budgets")
        .len();
    b["fleet_snapshots"]["budgets"][n - 1] = rich.clone();
    b["attempts"]["fleet_stop"]["budget"]["snapshot_sha256"] = json!(digest(&rich));
    f.verify(
        "fleet_verify_budget_stop_covered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let all_open = bundle(
        json!({"breakers": {primary(): open_at(&primary(), T0, 3), fallback(): open_at(&fallback(), T0, 1)}}),
        vec![admit(T0 + 100)],
    );
    f.verify("fleet_verify_circuit_open_stop", &t(&all_open), "verified");
    let mut b = all_open.clone();
    b["attempts"]["fleet_stop"]["skipped"]
        .as_array_mut()
        .expect("skips")
        .pop();
    f.verify(
        "fleet_verify_circuit_open_with_a_route_left",
        &t(&b),
        "admission_drift",
    );
}

fn policy_cases(f: &mut Family) {
    for (name, fleet, want) in [
        (
            "fleet_policy_empty",
            json!({"on_store_unavailable": "fail_open"}),
            "invalid_breaker",
        ),
        (
            "fleet_policy_bad_breaker",
            json!({"breaker": {"half_open_probes": 1, "open_ms": 5}, "on_store_unavailable": "fail_open"}),
            "invalid_breaker",
        ),
        (
            "fleet_policy_bad_budget",
            json!({"on_store_unavailable": "fail_open", "retry_budget": {"floor_per_second": 0, "max_tokens": 0, "ratio_permille": 1, "scope": "s"}}),
            "invalid_retry_budget",
        ),
        (
            "fleet_policy_bad_store_choice",
            json!({"breaker": consecutive(1, 1), "on_store_unavailable": "shrug"}),
            "invalid_value",
        ),
        (
            "fleet_policy_valid",
            json!({"breaker": ratio(), "on_store_unavailable": "fail_closed", "retry_budget": budget_cfg()}),
            "ok",
        ),
    ] {
        f.policy(name, &t(&policy_with(&[("/fleet", fleet)])), want);
    }
}
