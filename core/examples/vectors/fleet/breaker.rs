//! Circuit breakers: every transition of `breaker_admit` / `breaker_record`.

use super::*;

pub(super) fn breaker_cases(f: &mut Family) {
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
