//! `classify_http.json`.

use serde_json::{json, Value};

use crate::common::{set, t, NOW};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "classify_http",
        "classify_http: a typed outcome from status, headers and transport facts; the Retry-After hint is bounded and a malformed hint is ignored.",
        "every status class and the special codes (2xx, 408, 429, 500-504, 501/505, other 5xx, 400/404/405/406/410/411/413/414/415/422, 401/409/418/499, 403, 1xx, 3xx), out-of-range statuses, no status at all, each transport error with and without a status and with response bytes, hint precedence (retry-after-ms over retry-after), header names in any case, the cap and its default, HTTP-date hints, and malformed hints",
    );
    let obs = |status: u64| t(&json!({"status": status}));
    for status in [
        200u64, 201, 204, 299, 408, 429, 500, 501, 502, 503, 504, 505, 507, 599, 400, 401, 403,
        404, 405, 406, 409, 410, 411, 413, 414, 415, 418, 422, 499, 100, 101, 199, 301, 302, 304,
        399,
    ] {
        f.classify(&format!("status_{status}"), &obs(status), "ok");
    }
    f.classify("status_600", &obs(600), "invalid_status");
    f.classify("status_99", &obs(99), "invalid_status");
    f.classify("status_0", &obs(0), "invalid_status");
    f.classify("nothing_observed", "{}", "invalid_status");
    for (name, err) in [
        ("connect_failed", "connect_failed"),
        ("timeout", "timeout"),
        ("connection_reset", "connection_reset"),
    ] {
        f.classify(
            &format!("transport_{name}"),
            &t(&json!({"transport_error": err})),
            "ok",
        );
        f.classify(
            &format!("transport_{name}_after_bytes"),
            &t(&json!({"transport_error": err, "response_bytes_received": true})),
            "stream_interrupted_after_output",
        );
    }
    f.classify(
        "transport_reset_after_2xx_head",
        &t(&json!({"status": 200, "transport_error": "connection_reset"})),
        "unknown_provider_acceptance",
    );
    f.classify(
        "transport_timeout_after_503_head",
        &t(&json!({"status": 503, "transport_error": "timeout"})),
        "unavailable",
    );
    f.classify(
        "transport_error_with_invalid_status",
        &t(&json!({"status": 700, "transport_error": "timeout"})),
        "invalid_status",
    );
    f.classify(
        "bytes_received_without_transport_error_is_the_status",
        &t(&json!({"status": 200, "response_bytes_received": true})),
        "success",
    );
    let h = |headers: Value, status: u64, cap: Option<u64>| {
        let mut v = json!({"headers": headers, "now_unix_ms": NOW, "status": status});
        if let Some(c) = cap {
            set(&mut v, "/retry_after_cap_ms", json!(c));
        }
        t(&v)
    };
    f.classify(
        "rate_limited_with_seconds",
        &h(json!([["Retry-After", "2"]]), 429, Some(5_000)),
        "2000",
    );
    f.classify(
        "rate_limited_ms_takes_precedence",
        &h(
            json!([["Retry-After", "2"], ["retry-after-ms", "250"]]),
            429,
            Some(5_000),
        ),
        "250",
    );
    f.classify(
        "malformed_ms_falls_back_to_seconds",
        &h(
            json!([["retry-after-ms", "soon"], ["retry-after", "3"]]),
            429,
            Some(5_000),
        ),
        "3000",
    );
    f.classify(
        "malformed_hint_ignored",
        &h(json!([["retry-after", "junk"]]), 503, Some(5_000)),
        "unavailable",
    );
    f.classify(
        "hint_capped",
        &h(json!([["retry-after", "3600"]]), 503, Some(5_000)),
        "5000",
    );
    f.classify(
        "hint_default_cap_is_2_pow_53_minus_1",
        &h(json!([["retry-after", "3600"]]), 503, None),
        "3600000",
    );
    f.classify(
        "hint_http_date",
        &h(
            json!([["retry-after", "Sun, 06 Nov 1994 08:49:47 GMT"]]),
            429,
            Some(60_000),
        ),
        "10000",
    );
    f.classify(
        "hint_header_upper_case",
        &h(json!([["RETRY-AFTER-MS", "42"]]), 429, None),
        "42",
    );
    f.classify(
        "first_header_of_a_name_wins",
        &h(
            json!([["retry-after", "1"], ["retry-after", "9"]]),
            429,
            None,
        ),
        "1000",
    );
    f.classify(
        "hint_on_408",
        &h(json!([["retry-after", "1"]]), 408, None),
        "timeout_before_response",
    );
    f.classify(
        "hint_on_non_retryable_not_reported",
        &h(json!([["retry-after", "1"]]), 400, None),
        "invalid_request",
    );
    f.classify(
        "hint_on_connect_failure",
        &t(&json!({"headers": [["retry-after", "1"]], "transport_error": "connect_failed"})),
        "1000",
    );
    f.classify(
        "overlong_hint_ignored",
        &h(json!([["retry-after", "1".repeat(65)]]), 429, None),
        "rate_limited",
    );
    f.classify(
        "non_ascii_header_value_ignored",
        &h(json!([["retry-after", "\u{ff12}"]]), 429, None),
        "rate_limited",
    );
    // A 409 that says when to ask again: the keyed request is still in
    // progress at the receiver (retryable, on the same route). Without a
    // valid hint it stays a rejected conflict (status_409 above).
    f.classify(
        "in_progress_409_with_retry_after",
        &h(json!([["Retry-After", "1"]]), 409, None),
        "in_progress",
    );
    f.classify(
        "in_progress_409_with_retry_after_ms",
        &h(json!([["retry-after-ms", "250"]]), 409, None),
        "in_progress",
    );
    f.classify(
        "in_progress_409_hint_bounded_by_the_cap",
        &h(json!([["retry-after", "30"]]), 409, Some(2_000)),
        "retry_after_ms\":2000",
    );
    f.classify(
        "in_progress_409_with_zero_retry_after",
        &h(json!([["retry-after", "0"]]), 409, None),
        "in_progress",
    );
    f.classify(
        "in_progress_409_malformed_hint_is_rejected",
        &h(json!([["retry-after", "soon"]]), 409, None),
        "rejected",
    );
    f.classify(
        "in_progress_409_without_hint_is_rejected",
        &h(json!([["idempotent-replayed", "true"]]), 409, None),
        "rejected",
    );
    f.classify(
        "in_progress_422_key_reused_stays_invalid_request",
        &h(json!([["retry-after", "1"]]), 422, None),
        "invalid_request",
    );
    f.classify(
        "in_progress_409_on_a_provider_route_records_the_source",
        &t(&json!({"error_body": "{\"code\":\"idempotency_in_progress\",\"message\":\"in progress\"}", "headers": [["retry-after", "2"]], "now_unix_ms": NOW, "provider_family": "openai", "status": 409})),
        "retry_after_source\":\"retry-after",
    );
    f.classify(
        "in_progress_409_after_a_timeout_reading_the_body",
        &t(&json!({"headers": [["retry-after", "1"]], "status": 409, "transport_error": "timeout"})),
        "in_progress",
    );
    f
}
