//! `plan.json`.

use retryledger_core::lab;
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, Outcome};
use serde_json::{json, Value};

use crate::common::{
    down, edited, empty_attempts, id, in_progress, lagged, policy_with, reference, rl, run, s, set,
    single_route, success, t, timeout,
};
use crate::family::{DriftCase, Family};

pub fn family() -> Family {
    let mut f = Family::new(
        "plan",
        "plan_next: every decision branch and terminal, the order of the checks, and drift in observed attempts.",
        "plan_next after every outcome kind, each terminal (completed, stop_non_retryable, stop_indeterminate, stop_total_attempts, stop_route_exhausted, stop_cost_budget spent and reserved, stop_deadline late and before dispatch, stop_cancelled), boundaries (cost equal to the maximum, reservation that exactly fits, completion one ms before the deadline), the check order (deadline before cost before outcome; total attempts before route exhaustion; reservation before deadline), Retry-After above the cap under clamp, skip_route and stop (stop_retry_after), quota_exhausted under stop (the default) and skip_route, and each drift code in its check order",
    );
    let r = reference();
    let pt = t(&r);
    let ref_attempts = run(&r, &lab::reference_steps());
    f.plan(
        "empty_run_dispatches_primary",
        &pt,
        &t(&empty_attempts()),
        "dispatch",
    );
    f.plan(
        "completed_on_primary",
        &pt,
        &t(&run(&r, &[s(success(), 300, 900)])),
        "completed",
    );
    f.plan("completed_on_fallback", &pt, &t(&ref_attempts), "completed");
    for (kind, outcome) in [
        ("timeout_before_response", timeout()),
        ("rate_limited", rl(250)),
        ("unavailable", down()),
    ] {
        f.plan(
            &format!("retryable_{kind}_dispatches_again"),
            &pt,
            &t(&run(&r, &[s(outcome, 200, 0)])),
            "dispatch",
        );
    }
    for (name, kind) in [
        ("rejected", NonRetryableKind::Rejected),
        ("policy_denied", NonRetryableKind::PolicyDenied),
        ("invalid_request", NonRetryableKind::InvalidRequest),
        ("protocol_violation", NonRetryableKind::ProtocolViolation),
        ("invalid_output", NonRetryableKind::InvalidOutput),
    ] {
        f.plan(
            &format!("non_retryable_{name}_stops"),
            &pt,
            &t(&run(&r, &[s(Outcome::NonRetryable { kind }, 200, 0)])),
            "stop_non_retryable",
        );
    }
    for (name, kind) in [
        (
            "unknown_provider_acceptance",
            IndeterminateKind::UnknownProviderAcceptance,
        ),
        (
            "stream_interrupted_after_output",
            IndeterminateKind::StreamInterruptedAfterOutput,
        ),
    ] {
        f.plan(
            &format!("indeterminate_{name}_stops"),
            &pt,
            &t(&run(&r, &[s(Outcome::Indeterminate { kind }, 200, 0)])),
            "stop_indeterminate",
        );
    }
    f.plan(
        "non_retryable_on_fallback_stops",
        &pt,
        &t(&run(
            &r,
            &[
                s(down(), 10, 0),
                s(down(), 10, 0),
                s(
                    Outcome::NonRetryable {
                        kind: NonRetryableKind::InvalidOutput,
                    },
                    10,
                    0,
                ),
            ],
        )),
        "stop_non_retryable",
    );
    f.plan(
        "indeterminate_after_retry_stops",
        &pt,
        &t(&run(
            &r,
            &[
                s(rl(250), 1_100, 0),
                s(
                    Outcome::Indeterminate {
                        kind: IndeterminateKind::UnknownProviderAcceptance,
                    },
                    100,
                    0,
                ),
            ],
        )),
        "stop_indeterminate",
    );
    let two_total = policy_with(&[("/max_total_attempts", json!(2))]);
    f.plan(
        "stop_total_attempts",
        &t(&two_total),
        &t(&run(&two_total, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "stop_total_attempts",
    );
    let one_fallback = policy_with(&[("/routes/1/max_attempts", json!(1))]);
    let three_down = [s(down(), 10, 0), s(down(), 10, 0), s(down(), 10, 0)];
    f.plan(
        "stop_route_exhausted",
        &t(&one_fallback),
        &t(&run(&one_fallback, &three_down)),
        "stop_route_exhausted",
    );
    let three_total = policy_with(&[
        ("/routes/1/max_attempts", json!(1)),
        ("/max_total_attempts", json!(3)),
    ]);
    f.plan(
        "order_total_attempts_before_route_exhaustion",
        &t(&three_total),
        &t(&run(&three_total, &three_down)),
        "stop_total_attempts",
    );
    f.plan(
        "stop_cost_budget_spent",
        &pt,
        &t(&run(&r, &[s(success(), 100, 10_001)])),
        "stop_cost_budget",
    );
    f.plan(
        "cost_equal_to_maximum_completes",
        &pt,
        &t(&run(&r, &[s(success(), 100, 10_000)])),
        "completed",
    );
    let tight = policy_with(&[("/max_total_cost", json!(2_500))]);
    f.plan(
        "stop_cost_budget_reservation",
        &t(&tight),
        &t(&run(&tight, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "stop_cost_budget",
    );
    let exact = policy_with(&[("/max_total_cost", json!(3_000))]);
    f.plan(
        "reservation_that_exactly_fits_dispatches",
        &t(&exact),
        &t(&run(&exact, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "dispatch",
    );
    let tiny = policy_with(&[("/max_total_cost", json!(1_000))]);
    f.plan(
        "stop_cost_budget_before_first_dispatch",
        &t(&tiny),
        &t(&empty_attempts()),
        "stop_cost_budget",
    );
    f.plan(
        "stop_deadline_late_success",
        &t(&policy_with(&[("/deadline_ms", json!(2_300))])),
        &t(&ref_attempts),
        "stop_deadline",
    );
    f.plan(
        "completion_at_deadline_stops",
        &t(&policy_with(&[("/deadline_ms", json!(300))])),
        &t(&run(&r, &[s(success(), 300, 0)])),
        "stop_deadline",
    );
    f.plan(
        "completion_one_ms_before_deadline_completes",
        &t(&policy_with(&[("/deadline_ms", json!(301))])),
        &t(&run(&r, &[s(success(), 300, 0)])),
        "completed",
    );
    let d1600 = policy_with(&[("/deadline_ms", json!(1_600))]);
    f.plan(
        "stop_deadline_before_dispatch",
        &t(&d1600),
        &t(&run(&d1600, &lab::reference_steps())),
        "stop_deadline",
    );
    let d1651 = policy_with(&[("/deadline_ms", json!(1_651))]);
    f.plan(
        "not_before_one_ms_before_deadline_dispatches",
        &t(&d1651),
        &t(&run(&d1651, &lab::reference_steps()[..2])),
        "dispatch",
    );
    let d1650 = policy_with(&[("/deadline_ms", json!(1_650))]);
    f.plan(
        "not_before_at_deadline_stops",
        &t(&d1650),
        &t(&run(&d1650, &lab::reference_steps()[..2])),
        "stop_deadline",
    );
    f.plan(
        "order_deadline_before_cost",
        &pt,
        &t(&run(&r, &[s(success(), 6_000, 20_000)])),
        "stop_deadline",
    );
    f.plan(
        "order_cost_before_outcome",
        &pt,
        &t(&run(
            &r,
            &[s(
                Outcome::NonRetryable {
                    kind: NonRetryableKind::Rejected,
                },
                100,
                20_000,
            )],
        )),
        "stop_cost_budget",
    );
    let both = policy_with(&[
        ("/max_total_cost", json!(2_000)),
        ("/deadline_ms", json!(300)),
    ]);
    f.plan(
        "order_reservation_before_deadline",
        &t(&both),
        &t(&run(&both, &[s(rl(5_000), 100, 600)])),
        "stop_cost_budget",
    );
    let mut cancelled = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancelled, "/cancelled_at_ms", json!(1_200));
    f.plan(
        "stop_cancelled_while_waiting",
        &pt,
        &t(&cancelled),
        "stop_cancelled",
    );
    let mut cancel_at_completion = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancel_at_completion, "/cancelled_at_ms", json!(1_100));
    f.plan(
        "cancelled_at_last_completion",
        &pt,
        &t(&cancel_at_completion),
        "stop_cancelled",
    );
    let mut cancel_empty = empty_attempts();
    set(&mut cancel_empty, "/cancelled_at_ms", json!(0));
    f.plan(
        "cancelled_before_any_attempt",
        &pt,
        &t(&cancel_empty),
        "stop_cancelled",
    );

    let generic = id("behavior: generic summary v1");
    let degraded = policy_with(&[
        ("/routes/1/behavior_class_sha256", json!(generic)),
        ("/allowed_degraded_behavior_classes", json!([generic])),
    ]);
    f.plan(
        "fallback_to_allowed_degraded_route",
        &t(&degraded),
        &t(&run(&degraded, &lab::reference_steps()[..2])),
        "external-fallback",
    );
    let mut three = r.clone();
    let mut third = r["routes"][1].clone();
    set(&mut third, "/route_id", json!("external-tertiary"));
    set(&mut third, "/priority", json!(2));
    set(&mut third, "/max_attempts", json!(1));
    set(
        &mut third,
        "/route_release_sha256",
        json!(id("release: external-tertiary")),
    );
    set(&mut three, "/max_total_attempts", json!(6));
    set(&mut three, "/max_total_cost", json!(100_000));
    three["routes"].as_array_mut().expect("routes").push(third);
    let four_down = [
        s(down(), 10, 0),
        s(down(), 10, 0),
        s(down(), 10, 0),
        s(down(), 10, 0),
    ];
    f.plan(
        "second_fallback_after_two_routes_exhausted",
        &t(&three),
        &t(&run(&three, &four_down)),
        "external-tertiary",
    );
    f.plan(
        "start_lag_schedules_from_completion",
        &pt,
        &t(&run(&r, &[lagged(rl(250), 100, 0, 700)])),
        "dispatch",
    );

    // Drift, each alone, on the reference run; then the check order.
    let ra = &ref_attempts;
    let other_request = id("request: another prompt");
    let drifts: Vec<DriftCase> = vec![
        (
            "drift_route",
            vec![("/attempts/1/route_id".into(), json!("external-fallback"))],
            "route_drift",
        ),
        (
            "drift_release",
            vec![(
                "/attempts/1/route_release_sha256".into(),
                json!(id("release: other")),
            )],
            "release_drift",
        ),
        (
            "drift_ordinal",
            vec![("/attempts/1/ordinal".into(), json!(5))],
            "ordinal_drift",
        ),
        (
            "drift_route_ordinal",
            vec![("/attempts/1/route_ordinal".into(), json!(1))],
            "route_ordinal_drift",
        ),
        (
            "drift_logical_request",
            vec![(
                "/attempts/2/logical_request_sha256".into(),
                json!(other_request),
            )],
            "logical_request_drift",
        ),
        (
            "drift_idempotency_key",
            vec![(
                "/attempts/2/idempotency_key_sha256".into(),
                json!(id("idempotency-key: fresh")),
            )],
            "idempotency_key_drift",
        ),
        (
            "drift_early_start",
            vec![("/attempts/1/started_at_ms".into(), json!(1_349))],
            "early_start",
        ),
        (
            "start_exactly_at_not_before_is_fine",
            vec![("/attempts/1/started_at_ms".into(), json!(1_350))],
            "completed",
        ),
        (
            "drift_completed_before_started",
            vec![("/attempts/2/completed_at_ms".into(), json!(1_649))],
            "completed_before_started",
        ),
        (
            "drift_jitter_sample_unexpected",
            vec![("/attempts/1/jitter_sample_ms".into(), json!(100))],
            "jitter_sample_unexpected",
        ),
        (
            "order_route_before_ordinal",
            vec![
                ("/attempts/1/route_id".into(), json!("external-fallback")),
                ("/attempts/1/ordinal".into(), json!(9)),
            ],
            "route_drift",
        ),
        (
            "order_release_before_ordinal",
            vec![
                (
                    "/attempts/1/route_release_sha256".into(),
                    json!(id("release: other")),
                ),
                ("/attempts/1/ordinal".into(), json!(9)),
            ],
            "release_drift",
        ),
        (
            "order_ordinal_before_route_ordinal",
            vec![
                ("/attempts/1/ordinal".into(), json!(9)),
                ("/attempts/1/route_ordinal".into(), json!(9)),
            ],
            "ordinal_drift",
        ),
        (
            "order_identity_before_timing",
            vec![
                (
                    "/attempts/1/idempotency_key_sha256".into(),
                    json!(id("idempotency-key: fresh")),
                ),
                ("/attempts/1/started_at_ms".into(), json!(0)),
            ],
            "idempotency_key_drift",
        ),
        (
            "order_early_start_before_completion",
            vec![
                ("/attempts/1/started_at_ms".into(), json!(1_000)),
                ("/attempts/1/completed_at_ms".into(), json!(900)),
            ],
            "early_start",
        ),
        (
            "first_drift_wins",
            vec![
                ("/attempts/0/ordinal".into(), json!(3)),
                ("/attempts/2/route_id".into(), json!("private-primary")),
            ],
            "/attempts/0/ordinal",
        ),
    ];
    for (name, edits, want) in drifts {
        let edits: Vec<(&str, Value)> =
            edits.iter().map(|(p, v)| (p.as_str(), v.clone())).collect();
        f.plan(name, &pt, &t(&edited(ra, &edits)), want);
    }
    let mut after = ref_attempts.clone();
    let extra = {
        let mut a = after["attempts"][2].clone();
        set(&mut a, "/ordinal", json!(4));
        a
    };
    after["attempts"].as_array_mut().expect("list").push(extra);
    f.plan(
        "drift_attempt_after_terminal",
        &pt,
        &t(&after),
        "attempt_after_terminal",
    );
    let mut cancel_after_terminal = ref_attempts.clone();
    set(&mut cancel_after_terminal, "/cancelled_at_ms", json!(3_000));
    f.plan(
        "drift_cancel_after_terminal",
        &pt,
        &t(&cancel_after_terminal),
        "cancel_drift",
    );
    let mut cancel_early = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancel_early, "/cancelled_at_ms", json!(1_099));
    f.plan(
        "drift_cancel_before_last_completion",
        &pt,
        &t(&cancel_early),
        "cancel_drift",
    );
    f.plan(
        "invalid_policy_is_reported_first",
        &t(&policy_with(&[("/retry_owner", json!("adapter"))])),
        "{",
        "retry_owner_not_harness",
    );
    // A Retry-After hint above the cap (2,000 ms): clamp waits the cap;
    // skip_route leaves the route (the fallback waits the backoff only) or
    // stops when none is left; stop ends the run.
    for (name, mode, routes, hint, want) in [
        ("over_cap_clamp_waits_the_cap", "clamp", 2, 5_000, "2000"),
        (
            "over_cap_skip_route_falls_back_at_once",
            "skip_route",
            2,
            5_000,
            "external-fallback",
        ),
        (
            "over_cap_skip_route_without_a_route_left_stops",
            "skip_route",
            1,
            5_000,
            "stop_retry_after",
        ),
        ("over_cap_stop", "stop", 2, 5_000, "stop_retry_after"),
        (
            "over_cap_stop_hint_at_the_cap_waits",
            "stop",
            2,
            2_000,
            "private-primary",
        ),
    ] {
        let mut p = policy_with(&[("/backoff/retry_after_over_cap", serde_json::json!(mode))]);
        if routes == 1 {
            p["routes"].as_array_mut().expect("routes").truncate(1);
        }
        let attempts = run(&p, &[s(rl(hint), 100, 0)]);
        f.plan(name, &t(&p), &t(&attempts), want);
    }
    f.policy(
        "over_cap_unknown_mode",
        &t(&policy_with(&[(
            "/backoff/retry_after_over_cap",
            serde_json::json!("wait"),
        )])),
        "invalid_value",
    );
    quota_cases(&mut f);
    in_progress_cases(&mut f);
    f
}

/// `quota_exhausted` (an account quota that cannot clear within the run):
/// `stop_non_retryable` by default; under `quota_exhausted: skip_route` the
/// next route at once (another provider's account may serve the request),
/// and `stop_non_retryable` when none is left.
fn quota_cases(f: &mut Family) {
    let quota = Outcome::NonRetryable {
        kind: NonRetryableKind::QuotaExhausted,
    };
    for (name, mode, routes, want) in [
        (
            "quota_exhausted_stops_by_default",
            None,
            2,
            "stop_non_retryable",
        ),
        (
            "quota_exhausted_stop",
            Some("stop"),
            2,
            "stop_non_retryable",
        ),
        (
            "quota_exhausted_skip_route_falls_back_at_once",
            Some("skip_route"),
            2,
            "external-fallback",
        ),
        (
            "quota_exhausted_skip_route_without_a_route_left_stops",
            Some("skip_route"),
            1,
            "stop_non_retryable",
        ),
    ] {
        let mut p = reference();
        if let Some(mode) = mode {
            set(&mut p, "/backoff/quota_exhausted", json!(mode));
        }
        if routes == 1 {
            p["routes"].as_array_mut().expect("routes").truncate(1);
        }
        let attempts = run(&p, &[s(quota, 100, 0)]);
        f.plan(name, &t(&p), &t(&attempts), want);
    }
    let mut p = reference();
    set(&mut p, "/backoff/quota_exhausted", json!("skip_route"));
    let attempts = run(&p, &[s(quota, 100, 0)]);
    f.plan(
        "quota_exhausted_skip_route_waits_the_backoff_only",
        &t(&p),
        &t(&attempts),
        "not_before_ms\":200",
    );
    f.policy(
        "quota_exhausted_unknown_mode",
        &t(&policy_with(&[(
            "/backoff/quota_exhausted",
            json!("retry"),
        )])),
        "invalid_value",
    );
}

/// `in_progress` (a 409 with a hint to a keyed request): asked again on the
/// same route, never on another, bounded; `stop_indeterminate` when no ask fits.
fn in_progress_cases(f: &mut Family) {
    let r = reference();
    let pt = t(&r);
    let ip = |steps: &[retryledger_core::lab::Step]| t(&run(&r, steps));
    f.plan(
        "in_progress_first_attempt_asks_again_after_the_hint",
        &pt,
        &ip(&[s(in_progress(1_000), 300, 0)]),
        "retry_after_floor_ms\":1000",
    );
    f.plan(
        "in_progress_without_hint_waits_the_backoff",
        &pt,
        &t(&run(
            &r,
            &[s(
                retryledger_core::outcome::Outcome::Retryable {
                    kind: retryledger_core::outcome::RetryableKind::InProgress,
                    retry_after_ms: None,
                    retry_after_source: None,
                },
                300,
                0,
            )],
        )),
        "not_before_ms\":400",
    );
    f.plan(
        "in_progress_after_timeout_stays_on_the_spent_route",
        &pt,
        &ip(&[s(timeout(), 1_000, 0), s(in_progress(1_000), 50, 0)]),
        "route_ordinal\":3",
    );
    f.plan(
        "in_progress_after_timeout_never_falls_back",
        &pt,
        &ip(&[s(timeout(), 1_000, 0), s(in_progress(1_000), 50, 0)]),
        "private-primary",
    );
    f.plan(
        "in_progress_then_replayed_answer_completes",
        &pt,
        &ip(&[
            s(timeout(), 1_000, 0),
            s(in_progress(1_000), 50, 0),
            s(success(), 60, 1_000),
        ]),
        "completed",
    );
    f.plan(
        "in_progress_hint_over_cap_is_clamped_under_skip_route",
        &t(&policy_with(&[(
            "/backoff/retry_after_over_cap",
            json!("skip_route"),
        )])),
        &t(&run(
            &policy_with(&[("/backoff/retry_after_over_cap", json!("skip_route"))]),
            &[s(in_progress(9_000), 100, 0)],
        )),
        "retry_after_floor_ms\":2000",
    );
    f.plan(
        "in_progress_hint_over_cap_is_clamped_under_stop",
        &t(&policy_with(&[(
            "/backoff/retry_after_over_cap",
            json!("stop"),
        )])),
        &t(&run(
            &policy_with(&[("/backoff/retry_after_over_cap", json!("stop"))]),
            &[s(in_progress(9_000), 100, 0)],
        )),
        "private-primary",
    );
    f.plan(
        "in_progress_at_total_attempts_stops_indeterminate",
        &pt,
        &ip(&[
            s(timeout(), 200, 0),
            s(in_progress(100), 50, 0),
            s(in_progress(100), 50, 0),
            s(in_progress(100), 50, 0),
        ]),
        "stop_indeterminate",
    );
    f.plan(
        "in_progress_past_the_deadline_stops_indeterminate",
        &pt,
        &ip(&[s(in_progress(2_000), 3_500, 0)]),
        "stop_indeterminate",
    );
    f.plan(
        "in_progress_completed_at_the_deadline_stops_deadline",
        &pt,
        &ip(&[s(in_progress(100), 5_000, 0)]),
        "stop_deadline",
    );
    f.plan(
        "in_progress_then_unavailable_on_the_spent_route_stops_indeterminate",
        &pt,
        &ip(&[
            s(timeout(), 200, 0),
            s(in_progress(100), 50, 0),
            s(down(), 50, 0),
        ]),
        "stop_indeterminate",
    );
    let three = policy_with(&[("/routes/0/max_attempts", json!(3))]);
    f.plan(
        "in_progress_then_unavailable_within_the_route_bound_asks_again",
        &t(&three),
        &t(&run(
            &three,
            &[s(in_progress(100), 50, 0), s(down(), 50, 0)],
        )),
        "route_ordinal\":3",
    );
    // The bound: MAX_IN_PROGRESS (5) answers in a row.
    let many = single_route(10, 10, 100, 1_000, 60_000);
    let mt = t(&many);
    let asks = |n: usize| {
        let steps: Vec<_> = (0..n).map(|_| s(in_progress(10), 5, 0)).collect();
        t(&run(&many, &steps))
    };
    f.plan(
        "in_progress_four_in_a_row_asks_again",
        &mt,
        &asks(4),
        "ordinal\":5",
    );
    f.plan(
        "in_progress_bound_in_a_row_stops_indeterminate",
        &mt,
        &asks(5),
        "stop_indeterminate",
    );
    let mut reset = vec![s(in_progress(10), 5, 0); 4];
    reset.push(s(down(), 5, 0));
    reset.push(s(in_progress(10), 5, 0));
    f.plan(
        "in_progress_count_restarts_after_another_answer",
        &mt,
        &t(&run(&many, &reset)),
        "ordinal\":7",
    );
}
