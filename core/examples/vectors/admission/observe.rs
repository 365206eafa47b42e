//! `admission_observe`: rate-limit headers applied to the buckets.

use super::*;

fn observe_headers(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    headers: &[(&str, &str)],
    now: u64,
    want: &str,
) {
    let pairs: Vec<Value> = headers.iter().map(|(k, v)| json!([k, v])).collect();
    f.add(
        name,
        "admission_observe",
        vec![
            ("config", json!(t(c))),
            ("snapshot", json!(t(s))),
            ("headers", json!(t(&Value::Array(pairs)))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

/// Both buckets: 2 requests (10 per second) and 100 tokens (100 per second).
fn both_cfg() -> Value {
    json!({"max_queue_ms": 1_000, "request_burst": 2, "requests_per_second": 10, "token_bound": 100, "tokens_per_second": 100})
}

pub(super) fn observe_cases(f: &mut Family) {
    let c = both_cfg();
    let full = snap(&[("token_level_milli", json!(100_000))]);
    let o = |f: &mut Family, name: &str, h: &[(&str, &str)], want: &str| {
        observe_headers(f, name, &c, &full, h, T0, want);
    };
    o(
        f,
        "admission_observe_openai_requests_remaining_lowers",
        &[
            ("x-ratelimit-remaining-requests", "1"),
            ("x-ratelimit-reset-requests", "6s"),
        ],
        "request_level_milli\":1000",
    );
    o(
        f,
        "admission_observe_openai_tokens_remaining_lowers",
        &[("x-ratelimit-remaining-tokens", "40")],
        "token_level_milli\":40000",
    );
    o(
        f,
        "admission_observe_openai_requests_zero_waits_for_the_reset",
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
        ],
        &format!("requests_at_epoch_ms\":{}", T0 + 360_000),
    );
    o(
        f,
        "admission_observe_openai_tokens_zero_ms_reset",
        &[
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ],
        &format!("tokens_at_epoch_ms\":{}", T0 + 20),
    );
    o(
        f,
        "admission_observe_openai_fractional_seconds_reset",
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.5s"),
        ],
        &format!("requests_at_epoch_ms\":{}", T0 + 1_500),
    );
    o(
        f,
        "admission_observe_header_names_any_case",
        &[
            ("X-RateLimit-Remaining-Requests", "0"),
            ("X-RateLimit-Reset-Requests", "2s"),
        ],
        &format!("requests_at_epoch_ms\":{}", T0 + 2_000),
    );
    o(
        f,
        "admission_observe_anthropic_requests_zero_rfc3339_reset",
        &[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-05-28T20:27:10Z"),
        ],
        &format!("requests_at_epoch_ms\":{}", T0 + 30_000),
    );
    o(
        f,
        "admission_observe_anthropic_least_token_remaining_counts",
        &[
            ("anthropic-ratelimit-tokens-remaining", "90"),
            ("anthropic-ratelimit-output-tokens-remaining", "10"),
            ("anthropic-ratelimit-input-tokens-remaining", "70"),
        ],
        "token_level_milli\":10000",
    );
    o(
        f,
        "admission_observe_anthropic_input_tokens_zero_fractional_reset",
        &[
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-05-28T20:26:41.250Z",
            ),
        ],
        &format!("tokens_at_epoch_ms\":{}", T0 + 1_250),
    );
    o(
        f,
        "admission_observe_ietf_zero_with_t",
        &[("RateLimit", "\"default\";r=0;t=30")],
        &format!("requests_at_epoch_ms\":{}", T0 + 30_000),
    );
    o(
        f,
        "admission_observe_ietf_zero_with_the_policy_window",
        &[
            ("RateLimit", "\"hour\";r=0"),
            ("RateLimit-Policy", "\"hour\";q=100;w=3600"),
        ],
        &format!("requests_at_epoch_ms\":{}", T0 + 3_600_000),
    );
    o(
        f,
        "admission_observe_ietf_remaining_lowers",
        &[("RateLimit", "\"default\";r=1;t=10")],
        "request_level_milli\":1000",
    );
    o(
        f,
        "admission_observe_no_rate_limit_headers_keeps_the_snapshot",
        &[("content-type", "application/json"), ("retry-after", "3")],
        "generation\":0",
    );
    o(
        f,
        "admission_observe_remaining_above_the_level_never_raises",
        &[
            ("x-ratelimit-remaining-requests", "500"),
            ("anthropic-ratelimit-tokens-remaining", "100"),
        ],
        "generation\":0",
    );
    o(
        f,
        "admission_observe_garbage_remaining_ignored_and_noted",
        &[
            ("x-ratelimit-remaining-requests", "lots"),
            ("anthropic-ratelimit-tokens-remaining", "-1"),
            ("x-ratelimit-remaining-tokens", "99999999999999999999"),
        ],
        "ratelimit_invalid",
    );
    o(
        f,
        "admission_observe_garbage_reset_noted_remaining_counts",
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "soon"),
        ],
        "request_level_milli\":0",
    );
    o(
        f,
        "admission_observe_garbage_ietf_field_ignored",
        &[("RateLimit", "default;r=zero")],
        "ratelimit_invalid",
    );
    o(
        f,
        "admission_observe_reset_in_the_past_ignored_and_noted",
        &[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-05-28T20:26:00Z"),
        ],
        "reset_past",
    );
    o(
        f,
        "admission_observe_reset_absurdly_far_ignored_and_noted",
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "200h"),
        ],
        "reset_too_far",
    );
    o(
        f,
        "admission_observe_anthropic_reset_absurdly_far",
        &[
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2027-01-01T00:00:00Z"),
        ],
        "reset_too_far",
    );
    let reserved = snap(&[
        ("request_level_milli", json!(0)),
        ("requests_at_epoch_ms", json!(T0 + 5_000)),
        ("token_level_milli", json!(100_000)),
    ]);
    observe_headers(
        f,
        "admission_observe_earlier_reset_keeps_the_reservation",
        &c,
        &reserved,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
        ],
        T0,
        "generation\":0",
    );
    observe_headers(
        f,
        "admission_observe_later_reset_moves_the_reservation",
        &c,
        &reserved,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "9s"),
        ],
        T0,
        &format!("requests_at_epoch_ms\":{}", T0 + 9_000),
    );
    observe_headers(
        f,
        "admission_observe_remaining_leaves_a_reserved_bucket_alone",
        &c,
        &reserved,
        &[("x-ratelimit-remaining-requests", "1")],
        T0,
        "generation\":0",
    );
    let refilling = snap(&[
        ("request_level_milli", json!(0)),
        ("requests_at_epoch_ms", json!(T0 - 100)),
        ("token_level_milli", json!(100_000)),
    ]);
    observe_headers(
        f,
        "admission_observe_remaining_compared_with_the_refilled_level",
        &c,
        &refilling,
        &[("x-ratelimit-remaining-requests", "1")],
        T0,
        "generation\":0",
    );
    observe_headers(
        f,
        "admission_observe_clock_behind_the_snapshot",
        &c,
        &full,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
        ],
        T0 - 1_000,
        &format!("requests_at_epoch_ms\":{}", T0 + 1_000),
    );
    let cap_only = json!({"max_in_flight": 2, "max_queue_ms": 5_000});
    let bare = snap(&[("request_level_milli", json!(0))]);
    observe_headers(
        f,
        "admission_observe_unconfigured_bucket_holds_the_reset",
        &cap_only,
        &bare,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "2s"),
        ],
        T0,
        &format!("requests_at_epoch_ms\":{}", T0 + 2_000),
    );
    observe_headers(
        f,
        "admission_observe_unconfigured_bucket_ignores_remaining",
        &cap_only,
        &bare,
        &[("x-ratelimit-remaining-tokens", "3")],
        T0,
        "generation\":0",
    );
    let parked = snap(&[
        ("request_level_milli", json!(0)),
        ("requests_at_epoch_ms", json!(T0 + 2_000)),
        ("generation", json!(1)),
    ]);
    admit(
        f,
        "admission_unconfigured_bucket_reset_delays_the_start",
        &cap_only,
        &parked,
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 2_000),
    );
    admit(
        f,
        "admission_unconfigured_bucket_reset_beyond_the_queue_refused",
        &cap_only,
        &parked,
        T0 - 4_000,
        T0 - 4_000,
        0,
        "refused",
    );
    let emptied = snap(&[
        ("request_level_milli", json!(0)),
        ("requests_at_epoch_ms", json!(T0 + 500)),
        ("generation", json!(1)),
    ]);
    admit(
        f,
        "admission_emptied_bucket_refills_after_the_reset",
        &cfg(),
        &emptied,
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 600),
    );
    observe_headers(
        f,
        "admission_observe_empty_headers_keep_the_snapshot",
        &c,
        &full,
        &[],
        T0,
        "generation\":0",
    );
    f.add(
        "admission_observe_bad_headers_document",
        "admission_observe",
        vec![
            ("config", json!(t(&c))),
            ("snapshot", json!(t(&full))),
            ("headers", json!("[[\"x-ratelimit-remaining-requests\"]]")),
            ("now_epoch_ms", json!(T0)),
        ],
        "error",
    );
}
