//! `admission.json`: admission limits (attempts in flight, request and token
//! buckets, the queue bound) and runs admitted under them.
//!
//! `admission_admit` / `admission_release` cases pin the pure transitions
//! (a burst, a planned queue, the queue bound, a full in-flight cap, token
//! reservations and their settlement, a clock behind the snapshot, scoped
//! keys, malformed snapshots); `validate_policy` cases pin the section's
//! bad input; `verify_bundle` cases replay runs admitted under the limits
//! (at once, queued, stopped by the queue bound or the deadline) and
//! tampered admissions.

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{id, policy_with, t, NOW_2026};
use crate::family::Family;

const T0: u64 = NOW_2026;

fn primary() -> String {
    id("release: private-primary")
}

/// In flight 2, 10 requests per second with a burst of 2, queue 1 s.
fn cfg() -> Value {
    json!({"max_in_flight": 2, "max_queue_ms": 1_000, "request_burst": 2, "requests_per_second": 10})
}

fn tokens_cfg() -> Value {
    json!({"max_queue_ms": 1_000, "token_bound": 100, "tokens_per_second": 100})
}

/// A snapshot of the primary's key with its fields edited (full buckets of
/// `cfg()`, nothing in flight, at T0).
fn snap(edits: &[(&str, Value)]) -> Value {
    let mut s = json!({
        "generation": 0, "in_flight": 0, "request_level_milli": 2_000, "requests_at_epoch_ms": T0,
        "route_release_sha256": primary(), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": T0, "updated_at_epoch_ms": T0,
    });
    for (k, v) in edits {
        s[*k] = v.clone();
    }
    s
}

pub fn family() -> Family {
    let mut f = Family::new(
        "admission",
        "admission_admit / admission_release / admission_observe: the pure transitions of admission limits (attempts in flight, request and token buckets, the queue bound); validate_policy: the section's bad input; verify_bundle: runs admitted under the limits and tampered admissions.",
        "a burst then a planned queue, the queue's tail in the future, the queue bound, a full in-flight cap (wait, then refusal; presumed lost after its lease), token reservations (now, planned, over the bound) and their settlement (unused back, overuse taken, no report), refill capped at the burst, a clock behind the snapshot, tenant and principal keys, another key's or an overfull snapshot; rate-limit headers observed on a response (OpenAI, Anthropic and IETF forms: a lower remaining lowers a bucket, an exhausted one with a reset empties it until the reset, never earlier than reserved, also an unconfigured bucket; garbage, past and absurdly far resets ignored and noted; no header keeps the snapshot); a limit, queue bound or burst of 0, a token rate without a bound and the reverse, a rate without a burst, no limit, a principal without a tenant; runs admitted at once, queued behind a spent bucket, retried after a release, stopped by the queue bound and by the deadline; tampered queue waits, starts, tokens, snapshots and stops",
    );
    admit_cases(&mut f);
    release_cases(&mut f);
    observe_cases(&mut f);
    policy_cases(&mut f);
    run_cases(&mut f);
    f
}

#[allow(clippy::too_many_arguments)] // one argument per input of the case
fn admit(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    now: u64,
    since: u64,
    tokens: u64,
    want: &str,
) {
    f.add(
        name,
        "admission_admit",
        vec![
            ("config", json!(t(c))),
            ("snapshot", json!(t(s))),
            ("now_epoch_ms", json!(now)),
            ("queued_since_epoch_ms", json!(since)),
            ("tokens", json!(tokens)),
        ],
        want,
    );
}

#[allow(clippy::too_many_arguments)] // one argument per input of the case
fn release(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    now: u64,
    reserved: u64,
    used: Option<u64>,
    want: &str,
) {
    let mut input = vec![
        ("config", json!(t(c))),
        ("snapshot", json!(t(s))),
        ("now_epoch_ms", json!(now)),
        ("reserved", json!(reserved)),
    ];
    if let Some(u) = used {
        input.push(("used", json!(u)));
    }
    f.add(name, "admission_release", input, want);
}

fn admit_cases(f: &mut Family) {
    let c = cfg();
    admit(
        f,
        "admission_fresh_admits_at_once",
        &c,
        &snap(&[]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{T0}"),
    );
    admit(
        f,
        "admission_burst_spent_queues_one_interval",
        &c,
        &snap(&[("request_level_milli", json!(0))]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 100),
    );
    admit(
        f,
        "admission_partial_level_waits_the_rest",
        &c,
        &snap(&[("request_level_milli", json!(400))]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 60),
    );
    admit(
        f,
        "admission_queue_tail_in_the_future",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 500)),
        ]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 600),
    );
    admit(
        f,
        "admission_beyond_the_queue_bound_refused",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 950)),
        ]),
        T0,
        T0,
        0,
        &format!("earliest_epoch_ms\":{}", T0 + 1_050),
    );
    admit(
        f,
        "admission_queue_bound_counts_from_the_first_ask",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 600)),
        ]),
        T0 + 500,
        T0 - 450,
        0,
        "refused",
    );
    admit(
        f,
        "admission_in_flight_full_waits",
        &c,
        &snap(&[("in_flight", json!(2))]),
        T0,
        T0,
        0,
        &format!("until_epoch_ms\":{}", T0 + 20),
    );
    admit(
        f,
        "admission_in_flight_full_at_the_bound_refused",
        &c,
        &snap(&[("in_flight", json!(2))]),
        T0 + 990,
        T0,
        0,
        &format!("earliest_epoch_ms\":{}", T0 + 1_010),
    );
    let leased = json!({"in_flight_lease_ms": 30_000, "max_in_flight": 2, "max_queue_ms": 1_000});
    let stale = snap(&[("in_flight", json!(2)), ("request_level_milli", json!(0))]);
    admit(
        f,
        "admission_full_cap_within_its_lease_waits",
        &leased,
        &stale,
        T0 + 29_999,
        T0 + 29_999,
        0,
        "wait",
    );
    admit(
        f,
        "admission_full_cap_unchanged_for_its_lease_starts_over",
        &leased,
        &stale,
        T0 + 30_000,
        T0 + 30_000,
        0,
        "in_flight\":1",
    );
    admit(
        f,
        "admission_refill_capped_at_the_burst",
        &c,
        &snap(&[("request_level_milli", json!(0))]),
        T0 + 60_000,
        T0 + 60_000,
        0,
        "request_level_milli\":1000",
    );
    admit(
        f,
        "admission_clock_behind_the_snapshot",
        &c,
        &snap(&[
            ("updated_at_epoch_ms", json!(T0 + 300)),
            ("requests_at_epoch_ms", json!(T0 + 300)),
            ("request_level_milli", json!(0)),
        ]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 400),
    );
    let tc = tokens_cfg();
    let ts = snap(&[
        ("request_level_milli", json!(0)),
        ("token_level_milli", json!(100_000)),
    ]);
    admit(
        f,
        "admission_tokens_reserved_now",
        &tc,
        &ts,
        T0,
        T0,
        60,
        "token_level_milli\":40000",
    );
    admit(
        f,
        "admission_tokens_deficit_planned",
        &tc,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("token_level_milli", json!(50_000)),
        ]),
        T0,
        T0,
        90,
        &format!("start_epoch_ms\":{}", T0 + 400),
    );
    admit(
        f,
        "admission_tokens_over_the_bound_refused",
        &tc,
        &ts,
        T0,
        T0,
        101,
        "kind\":\"refused\"}",
    );
    let scoped = json!({"max_in_flight": 1, "max_queue_ms": 100, "principal": "user-42", "tenant": "tenant-7"});
    let mut ss = snap(&[("request_level_milli", json!(0))]);
    ss["tenant"] = json!("tenant-7");
    ss["principal"] = json!("user-42");
    admit(
        f,
        "admission_tenant_and_principal_key",
        &scoped,
        &ss,
        T0,
        T0,
        0,
        "admitted",
    );
    let mut other = ss.clone();
    other["principal"] = json!("user-43");
    admit(
        f,
        "admission_another_principals_snapshot",
        &scoped,
        &other,
        T0,
        T0,
        0,
        "snapshot_key_mismatch",
    );
    admit(
        f,
        "admission_snapshot_over_its_burst",
        &c,
        &snap(&[("request_level_milli", json!(2_001))]),
        T0,
        T0,
        0,
        "invalid_snapshot",
    );
    admit(
        f,
        "admission_bad_config",
        &json!({"max_in_flight": 0, "max_queue_ms": 10}),
        &snap(&[("request_level_milli", json!(0))]),
        T0,
        T0,
        0,
        "invalid_admission",
    );
    admit(
        f,
        "admission_snapshot_of_another_schema",
        &c,
        &snap(&[("schema", json!("retryledger.breaker.v1"))]),
        T0,
        T0,
        0,
        "error",
    );
}

fn release_cases(f: &mut Family) {
    let c = cfg();
    release(
        f,
        "admission_release_frees_a_slot",
        &c,
        &snap(&[("in_flight", json!(2)), ("generation", json!(5))]),
        T0 + 10,
        0,
        None,
        "in_flight\":1",
    );
    release(
        f,
        "admission_release_never_below_zero",
        &c,
        &snap(&[]),
        T0,
        0,
        None,
        "in_flight\":0",
    );
    let tc = tokens_cfg();
    let held = snap(&[
        ("in_flight", json!(1)),
        ("request_level_milli", json!(0)),
        ("token_level_milli", json!(40_000)),
    ]);
    release(
        f,
        "admission_release_unused_tokens_back",
        &tc,
        &held,
        T0 + 10,
        60,
        Some(20),
        "token_level_milli\":80000",
    );
    release(
        f,
        "admission_release_refund_capped_at_the_bound",
        &tc,
        &snap(&[
            ("in_flight", json!(1)),
            ("request_level_milli", json!(0)),
            ("token_level_milli", json!(90_000)),
        ]),
        T0,
        60,
        Some(0),
        "token_level_milli\":100000",
    );
    release(
        f,
        "admission_release_overuse_taken",
        &tc,
        &held,
        T0,
        60,
        Some(90),
        "token_level_milli\":10000",
    );
    release(
        f,
        "admission_release_overuse_down_to_empty",
        &tc,
        &held,
        T0,
        10,
        Some(90),
        "token_level_milli\":0",
    );
    release(
        f,
        "admission_release_without_usage_keeps_the_reservation",
        &tc,
        &held,
        T0,
        60,
        None,
        "token_level_milli\":40000",
    );
}

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

fn observe_cases(f: &mut Family) {
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

fn policy_cases(f: &mut Family) {
    let with = |a: Value| {
        t(&policy_with(&[(
            "/fleet",
            json!({"admission": a, "on_store_unavailable": "fail_closed"}),
        )]))
    };
    for (name, a, want) in [
        (
            "admission_policy_in_flight_zero",
            json!({"max_in_flight": 0, "max_queue_ms": 100}),
            "path\":\"/fleet/admission/max_in_flight\"",
        ),
        (
            "admission_policy_queue_bound_zero",
            json!({"max_in_flight": 4, "max_queue_ms": 0}),
            "path\":\"/fleet/admission/max_queue_ms\"",
        ),
        (
            "admission_policy_queue_bound_over_a_day",
            json!({"max_in_flight": 4, "max_queue_ms": 86_400_001u64}),
            "path\":\"/fleet/admission/max_queue_ms\"",
        ),
        (
            "admission_policy_token_rate_without_bound",
            json!({"max_queue_ms": 100, "tokens_per_second": 1_000}),
            "path\":\"/fleet/admission/token_bound\"",
        ),
        (
            "admission_policy_token_bound_without_rate",
            json!({"max_queue_ms": 100, "token_bound": 1_000}),
            "path\":\"/fleet/admission/tokens_per_second\"",
        ),
        (
            "admission_policy_token_rate_zero",
            json!({"max_queue_ms": 100, "token_bound": 10, "tokens_per_second": 0}),
            "path\":\"/fleet/admission/tokens_per_second\"",
        ),
        (
            "admission_policy_rate_without_burst",
            json!({"max_queue_ms": 100, "requests_per_second": 20}),
            "path\":\"/fleet/admission/request_burst\"",
        ),
        (
            "admission_policy_burst_zero",
            json!({"max_queue_ms": 100, "request_burst": 0, "requests_per_second": 20}),
            "path\":\"/fleet/admission/request_burst\"",
        ),
        (
            "admission_policy_rate_zero",
            json!({"max_queue_ms": 100, "request_burst": 1, "requests_per_second": 0}),
            "path\":\"/fleet/admission/requests_per_second\"",
        ),
        (
            "admission_policy_no_limit",
            json!({"max_queue_ms": 100}),
            "invalid_admission",
        ),
        (
            "admission_policy_lease_without_a_cap",
            json!({"in_flight_lease_ms": 1_000, "max_queue_ms": 100, "request_burst": 1, "requests_per_second": 1}),
            "path\":\"/fleet/admission/in_flight_lease_ms\"",
        ),
        (
            "admission_policy_lease_zero",
            json!({"in_flight_lease_ms": 0, "max_in_flight": 1, "max_queue_ms": 100}),
            "path\":\"/fleet/admission/in_flight_lease_ms\"",
        ),
        (
            "admission_policy_principal_without_tenant",
            json!({"max_in_flight": 1, "max_queue_ms": 100, "principal": "user-42"}),
            "path\":\"/fleet/admission/principal\"",
        ),
        (
            "admission_policy_unknown_field",
            json!({"max_in_flight": 1, "max_queue_ms": 100, "max_queue": 3}),
            "error",
        ),
        (
            "admission_policy_valid_scoped",
            json!({"max_in_flight": 4, "max_queue_ms": 2_000, "principal": "user-42", "request_burst": 1, "requests_per_second": 20, "tenant": "tenant-7", "token_bound": 50_000, "tokens_per_second": 10_000}),
            "ok",
        ),
    ] {
        f.policy(name, &with(a), want);
    }
    let alone = t(&policy_with(&[(
        "/fleet",
        json!({"admission": cfg(), "on_store_unavailable": "fail_open"}),
    )]));
    f.policy("admission_policy_alone_in_the_fleet_section", &alone, "ok");
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
fn at(epoch: u64) -> Value {
    json!({ "admit": epoch })
}

fn digest(v: &Value) -> String {
    api::digest(&t(v)).expect("a document")
}

fn resealed(mut b: Value) -> Value {
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    b
}

fn run_cases(f: &mut Family) {
    let policy = |a: Value, edits: &[(&str, Value)]| {
        let mut all = vec![(
            "/fleet",
            json!({"admission": a, "on_store_unavailable": "fail_closed"}),
        )];
        all.extend(edits.iter().map(|(k, v)| (*k, v.clone())));
        t(&policy_with(&all))
    };
    let bundle = |p: &str, store: Value, script: Vec<Value>| {
        let (_, _, b) = lab::admission_session(p, &t(&store), &t(&json!(script)))
            .unwrap_or_else(|e| panic!("a run: {e:?}"));
        retryledger_core::canonical::to_value(&b)
    };
    let p = policy(cfg(), &[]);
    let at_once = bundle(&p, json!([]), vec![at(T0), succeeds()]);
    assert_eq!(
        at_once["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"],
        json!(0)
    );
    f.verify("admission_run_admitted_at_once", &t(&at_once), "verified");

    let queued = bundle(
        &p,
        json!([snap(&[("request_level_milli", json!(0))])]),
        vec![at(T0), succeeds()],
    );
    assert_eq!(
        queued["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"],
        json!(100)
    );
    assert_eq!(queued["receipt"]["fleet"]["queue_wait_ms"], json!(100));
    f.verify(
        "admission_run_queued_behind_a_spent_bucket",
        &t(&queued),
        "verified",
    );

    let retried = bundle(
        &p,
        json!([snap(&[("request_level_milli", json!(1_000))])]),
        vec![at(T0), fails(), at(T0 + 240), succeeds()],
    );
    f.verify(
        "admission_run_retried_after_a_release",
        &t(&retried),
        "completed",
    );

    // The failure's response said no request is left for 500 ms: the retry's
    // admission waits for the reset (empty then, one request 100 ms later).
    let exhausted = json!({"observe": {"duration_ms": 40, "facts": {"result": "raised", "status": 429},
        "headers": [["x-ratelimit-remaining-requests", "0"], ["x-ratelimit-reset-requests", "500ms"]]}});
    let held = bundle(
        &p,
        json!([]),
        vec![at(T0), exhausted, at(T0 + 240), succeeds()],
    );
    assert_eq!(
        held["attempts"]["attempts"][1]["admission"]["limits"]["start_epoch_ms"],
        json!(T0 + 40 + 500 + 100)
    );
    f.verify(
        "admission_run_retry_held_until_the_rate_limit_reset",
        &t(&held),
        "completed",
    );

    let full = snap(&[("in_flight", json!(2)), ("request_level_milli", json!(0))]);
    let short = policy(json!({"max_in_flight": 2, "max_queue_ms": 50}), &[]);
    let polled = bundle(
        &short,
        json!([full]),
        vec![at(T0), at(T0 + 20), at(T0 + 40)],
    );
    f.verify(
        "admission_run_stopped_by_the_queue_bound",
        &t(&polled),
        "stop_admission",
    );

    let late = policy(
        json!({"max_queue_ms": 5_000, "request_burst": 1, "requests_per_second": 1}),
        &[("/deadline_ms", json!(500))],
    );
    let spent = json!([{
        "generation": 3, "in_flight": 0, "request_level_milli": 0, "requests_at_epoch_ms": T0,
        "route_release_sha256": primary(), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": T0, "updated_at_epoch_ms": T0,
    }]);
    let no_room = bundle(&late, spent.clone(), vec![at(T0)]);
    f.verify(
        "admission_run_stopped_for_the_deadline",
        &t(&no_room),
        "stop_admission",
    );

    // Tampering.
    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"] = json!(2_000);
    f.verify(
        "admission_verify_queue_wait_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["start_epoch_ms"] = json!(T0 + 50);
    f.verify(
        "admission_verify_start_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("start_epoch_ms");
    f.verify(
        "admission_verify_start_removed",
        &t(&resealed_or(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["fleet_snapshots"]["admissions"][0]["generation"] = json!(7);
    f.verify(
        "admission_verify_snapshot_altered",
        &t(&b),
        "snapshot_missing",
    );

    // A forger who replaces the spent snapshot by a full one and re-seals:
    // the queue wait no longer follows.
    let fresh = snap(&[]);
    let mut b = queued.clone();
    b["fleet_snapshots"]["admissions"][0] = fresh.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["snapshot_sha256"] = json!(digest(&fresh));
    f.verify(
        "admission_verify_queue_without_cause",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = at_once.clone();
    b["attempts"]["attempts"][0]["admission"]
        .as_object_mut()
        .expect("admission")
        .remove("limits");
    f.verify(
        "admission_verify_limits_removed",
        &t(&resealed_or(b)),
        "admission_drift",
    );

    let mut b = at_once.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["tokens"] = json!(5);
    f.verify(
        "admission_verify_tokens_without_a_bucket",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = no_room.clone();
    let roomy = snap(&[
        ("request_level_milli", json!(1_000)),
        ("generation", json!(3)),
    ]);
    b["fleet_snapshots"]["admissions"][0] = roomy.clone();
    b["attempts"]["fleet_stop"]["limits"]["snapshot_sha256"] = json!(digest(&roomy));
    f.verify(
        "admission_verify_stop_the_snapshot_admits",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = polled.clone();
    b["attempts"]["fleet_stop"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("snapshot_sha256");
    f.verify(
        "admission_verify_stop_without_its_snapshot",
        &t(&resealed_or(b)),
        "error",
    );
}

/// Re-seal when the run still replays (else the bundle as it stands).
fn resealed_or(b: Value) -> Value {
    match api::evaluate(&t(&b["policy"]), &t(&b["attempts"])) {
        Ok(_) => resealed(b),
        Err(_) => b,
    }
}
