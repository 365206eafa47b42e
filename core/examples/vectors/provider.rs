//! `provider.json`: provider error tables and the hint precedence, judged
//! from the error bodies and rate-limit headers each provider documents.

use retryledger_core::provider::{Kind, Quota, MAX_ERROR_BODY_BYTES, TABLE};
use serde_json::{json, Value};

use crate::common::{t, NOW};
use crate::family::Family;

/// The body each provider documents for an error code.
fn body_for(family: &str, status: u64, code: &str, per_day: bool) -> Value {
    match family {
        "openai" => json!({"error": {
            "message": format!("an error of kind {code}"),
            "type": if code == "insufficient_quota" { "insufficient_quota" } else { "invalid_request_error" },
            "param": null,
            "code": code,
        }}),
        "anthropic" => {
            json!({"type": "error", "error": {"type": code, "message": format!("an error of kind {code}")}})
        }
        "google" => {
            let mut details = Vec::new();
            if code == "RESOURCE_EXHAUSTED" {
                let quota = if per_day {
                    "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
                } else {
                    "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
                };
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": quota,
                        "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                        "quotaValue": "200",
                    }],
                }));
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}],
                }));
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": "58.934310785s",
                }));
            }
            json!({"error": {"code": status, "message": format!("an error of kind {code}"), "status": code, "details": details}})
        }
        other => panic!("no body for {other}"),
    }
}

fn facts(family: &str, status: u64, body: Option<&str>, headers: Value) -> String {
    let mut v = json!({"result": "raised", "status": status, "provider_family": family, "now_unix_ms": NOW});
    if let Some(b) = body {
        v["error_body"] = json!(b);
    }
    if headers.as_array().is_some_and(|h| !h.is_empty()) {
        v["headers"] = headers;
    }
    t(&v)
}

fn gemini_429(retry_delay: Value, quota: &str) -> String {
    t(&json!({"error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": quota}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay},
        ],
    }}))
}

const PER_MINUTE: &str = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier";

pub fn family() -> Family {
    let mut f = Family::new(
        "provider",
        "judge with a provider family: the error table (family, status, code, quota scope), the hint precedence (retry-after-ms, Retry-After, the body's RetryInfo, rate-limit resets whose remaining is 0) and the source recorded, and bad bodies and hints noted and ignored.",
        "every row of the provider table with the body its provider documents; each hint source alone and the precedence between them; OpenAI, Anthropic and IETF reset headers (remaining 0 or not, the latest reset, garbage, past, too far); malformed, oversize, non-object, too deep and missing bodies; bad retryDelay values (negative, not a duration, not a string, beyond 2^53 ms); a bare inner error object; azure_openai and generic families; the cap of classify_http; without a family the v1 rules",
    );
    // Every table row, with its provider's documented body.
    for r in TABLE {
        let per_day = r.quota == Quota::PerDay;
        let body = t(&body_for(r.family.as_str(), r.status, r.code, per_day));
        let want = match r.kind {
            Kind::Retryable(k) => k.as_str(),
            Kind::NonRetryable(k) => k.as_str(),
        };
        let name = format!(
            "provider_row_{}_{}_{}{}",
            r.family.as_str(),
            r.status,
            r.code.to_ascii_lowercase(),
            if per_day { "_per_day" } else { "" }
        );
        f.judge(
            &name,
            &facts(r.family.as_str(), r.status, Some(&body), json!([])),
            want,
        );
    }
    // The rows that matter most, shown by their effect.
    f.judge(
        "provider_openai_insufficient_quota_stops",
        &facts(
            "openai",
            429,
            Some(r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#),
            json!([["retry-after", "20"]]),
        ),
        "non_retryable",
    );
    f.judge(
        "provider_openai_code_null_uses_type",
        &facts(
            "openai",
            429,
            Some(r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":null}}"#),
            json!([]),
        ),
        "quota_exhausted",
    );
    f.judge(
        "provider_openai_inner_error_object",
        &facts(
            "openai",
            429,
            Some(r#"{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}"#),
            json!([]),
        ),
        "quota_exhausted",
    );
    f.judge(
        "provider_azure_openai_uses_openai_table",
        &facts(
            "azure_openai",
            429,
            Some(r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#),
            json!([]),
        ),
        "quota_exhausted",
    );
    f.judge(
        "provider_openai_unknown_code_status_rules",
        &facts(
            "openai",
            429,
            Some(r#"{"error":{"message":"slow down","type":"requests","code":"something_new"}}"#),
            json!([["retry-after-ms", "120"]]),
        ),
        "120",
    );
    f.judge(
        "provider_openai_row_other_status_status_rules",
        &facts(
            "openai",
            503,
            Some(r#"{"error":{"code":"insufficient_quota","message":"odd"}}"#),
            json!([]),
        ),
        "unavailable",
    );
    f.judge(
        "provider_anthropic_wrong_family_code_status_rules",
        &facts(
            "anthropic",
            429,
            Some(r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#),
            json!([]),
        ),
        "rate_limited",
    );
    f.judge(
        "provider_google_per_minute_waits_retry_info",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("1.5s"), PER_MINUTE)),
            json!([]),
        ),
        "1500",
    );
    f.judge(
        "provider_google_per_day_stops",
        &facts(
            "google",
            429,
            Some(&gemini_429(
                json!("1.5s"),
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
            )),
            json!([]),
        ),
        "quota_exhausted",
    );
    f.judge(
        "provider_google_no_quota_failure_rate_limited",
        &facts(
            "google",
            429,
            Some(r#"{"error":{"code":429,"message":"busy","status":"RESOURCE_EXHAUSTED"}}"#),
            json!([]),
        ),
        "rate_limited",
    );
    f.judge(
        "provider_google_retry_info_nanoseconds_round_up",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("58.934310785s"), PER_MINUTE)),
            json!([]),
        ),
        "58935",
    );
    f.judge(
        "provider_google_retry_info_whole_seconds",
        &facts(
            "google",
            503,
            Some(r#"{"error":{"code":503,"status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}"#),
            json!([]),
        ),
        "30000",
    );
    // Precedence between the sources.
    let all = json!([
        ["retry-after-ms", "250"],
        ["Retry-After", "2"],
        ["x-ratelimit-remaining-requests", "0"],
        ["x-ratelimit-reset-requests", "6m0s"]
    ]);
    f.judge(
        "provider_precedence_retry_after_ms_first",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("1.5s"), PER_MINUTE)),
            all,
        ),
        "retry-after-ms",
    );
    f.judge(
        "provider_precedence_retry_after_over_body",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("1.5s"), PER_MINUTE)),
            json!([
                ["Retry-After", "2"],
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "6m0s"]
            ]),
        ),
        "2000",
    );
    f.judge(
        "provider_precedence_retry_info_over_resets",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("1.5s"), PER_MINUTE)),
            json!([
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "6m0s"]
            ]),
        ),
        "retry_info",
    );
    f.judge(
        "provider_precedence_garbage_ms_falls_to_retry_after",
        &facts(
            "openai",
            429,
            None,
            json!([["retry-after-ms", "soon"], ["retry-after", "3"]]),
        ),
        "retry_after_ms_invalid",
    );
    f.judge(
        "provider_precedence_garbage_headers_fall_to_body",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("1.5s"), PER_MINUTE)),
            json!([["retry-after-ms", "-1"], ["retry-after", "later"]]),
        ),
        "retry_after_invalid",
    );
    f.judge(
        "provider_precedence_bad_retry_delay_falls_to_resets",
        &facts(
            "google",
            429,
            Some(&gemini_429(json!("-5s"), PER_MINUTE)),
            json!([["RateLimit", "\"default\";r=0;t=7"]]),
        ),
        "ratelimit_reset",
    );
    // Each source alone.
    f.judge(
        "provider_source_retry_after_ms",
        &facts("generic", 503, None, json!([["retry-after-ms", "99.5"]])),
        "100",
    );
    f.judge(
        "provider_source_retry_after_date",
        &facts(
            "generic",
            503,
            None,
            json!([["retry-after", "Sun, 06 Nov 1994 08:49:47 GMT"]]),
        ),
        "10000",
    );
    f.judge(
        "provider_generic_no_body_no_note",
        &facts("generic", 503, None, json!([])),
        "unavailable",
    );
    // OpenAI reset headers.
    f.judge(
        "provider_openai_reset_requests",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "6m0s"]
            ]),
        ),
        "360000",
    );
    f.judge(
        "provider_openai_reset_tokens_ms",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-tokens", "0"],
                ["x-ratelimit-reset-tokens", "20ms"]
            ]),
        ),
        "20",
    );
    f.judge(
        "provider_openai_reset_latest_of_exhausted",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "1s"],
                ["x-ratelimit-remaining-tokens", "0"],
                ["x-ratelimit-reset-tokens", "1m30.5s"]
            ]),
        ),
        "90500",
    );
    f.judge(
        "provider_openai_reset_ignored_when_remaining",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "12"],
                ["x-ratelimit-reset-requests", "6m0s"]
            ]),
        ),
        "rate_limited\"},\"rule",
    );
    f.judge(
        "provider_openai_reset_garbage",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "soon"]
            ]),
        ),
        "ratelimit_invalid",
    );
    f.judge(
        "provider_openai_remaining_garbage",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "none"],
                ["x-ratelimit-reset-requests", "1s"]
            ]),
        ),
        "ratelimit_invalid",
    );
    f.judge(
        "provider_openai_reset_too_far",
        &facts(
            "openai",
            429,
            None,
            json!([
                ["x-ratelimit-remaining-requests", "0"],
                ["x-ratelimit-reset-requests", "9999h"]
            ]),
        ),
        "reset_too_far",
    );
    // Anthropic reset headers (RFC 3339); NOW is 1994-11-06T08:49:37Z.
    f.judge(
        "provider_anthropic_reset_requests",
        &facts(
            "anthropic",
            429,
            Some(r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}"#),
            json!([
                ["anthropic-ratelimit-requests-remaining", "0"],
                ["anthropic-ratelimit-requests-reset", "1994-11-06T08:49:47Z"]
            ]),
        ),
        "10000",
    );
    f.judge(
        "provider_anthropic_reset_offset_and_fraction",
        &facts(
            "anthropic",
            429,
            None,
            json!([
                ["anthropic-ratelimit-output-tokens-remaining", "0"],
                [
                    "anthropic-ratelimit-output-tokens-reset",
                    "1994-11-06T09:49:38.0001+01:00"
                ]
            ]),
        ),
        "1001",
    );
    f.judge(
        "provider_anthropic_reset_latest_of_input_and_tokens",
        &facts(
            "anthropic",
            429,
            None,
            json!([
                ["anthropic-ratelimit-input-tokens-remaining", "0"],
                [
                    "anthropic-ratelimit-input-tokens-reset",
                    "1994-11-06T08:49:40Z"
                ],
                ["anthropic-ratelimit-tokens-remaining", "0"],
                ["anthropic-ratelimit-tokens-reset", "1994-11-06T08:50:07Z"]
            ]),
        ),
        "30000",
    );
    f.judge(
        "provider_anthropic_reset_in_the_past",
        &facts(
            "anthropic",
            429,
            None,
            json!([
                ["anthropic-ratelimit-requests-remaining", "0"],
                ["anthropic-ratelimit-requests-reset", "1994-11-06T08:00:00Z"]
            ]),
        ),
        "reset_past",
    );
    f.judge(
        "provider_anthropic_reset_absurdly_far",
        &facts(
            "anthropic",
            429,
            None,
            json!([
                ["anthropic-ratelimit-requests-remaining", "0"],
                ["anthropic-ratelimit-requests-reset", "2094-11-06T08:00:00Z"]
            ]),
        ),
        "reset_too_far",
    );
    f.judge(
        "provider_anthropic_reset_garbage",
        &facts(
            "anthropic",
            429,
            None,
            json!([
                ["anthropic-ratelimit-tokens-remaining", "0"],
                ["anthropic-ratelimit-tokens-reset", "1994-13-06T08:49:47Z"]
            ]),
        ),
        "ratelimit_invalid",
    );
    f.judge(
        "provider_anthropic_529_retries_with_retry_after",
        &facts(
            "anthropic",
            529,
            Some(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            json!([["retry-after", "1"]]),
        ),
        "1000",
    );
    // IETF RateLimit fields.
    f.judge(
        "provider_ietf_ratelimit_t",
        &facts(
            "generic",
            429,
            None,
            json!([["RateLimit", "\"default\";r=0;t=30"]]),
        ),
        "30000",
    );
    f.judge(
        "provider_ietf_ratelimit_policy_window",
        &facts(
            "generic",
            429,
            None,
            json!([
                ["RateLimit", "\"burst\";r=0"],
                [
                    "RateLimit-Policy",
                    "\"burst\";q=100;w=60, \"day\";q=1000;w=86400"
                ]
            ]),
        ),
        "60000",
    );
    f.judge(
        "provider_ietf_ratelimit_remaining",
        &facts(
            "generic",
            429,
            None,
            json!([["RateLimit", "\"default\";r=5;t=30"]]),
        ),
        "rate_limited\"},\"rule",
    );
    f.judge(
        "provider_ietf_ratelimit_garbage",
        &facts(
            "generic",
            429,
            None,
            json!([["RateLimit", "default;r=zero"]]),
        ),
        "ratelimit_invalid",
    );
    // Bad bodies: noted, the status rules decide.
    f.judge(
        "provider_body_missing",
        &facts("openai", 429, None, json!([["retry-after", "1"]])),
        "body_missing",
    );
    f.judge(
        "provider_body_not_json",
        &facts(
            "openai",
            429,
            Some("<html>Too Many Requests</html>"),
            json!([]),
        ),
        "body_malformed",
    );
    f.judge(
        "provider_body_not_an_object",
        &facts("anthropic", 529, Some("[\"overloaded_error\"]"), json!([])),
        "body_malformed",
    );
    f.judge(
        "provider_body_duplicate_keys",
        &facts(
            "openai",
            429,
            Some(r#"{"error":{"code":"insufficient_quota","code":"rate_limit_exceeded"}}"#),
            json!([]),
        ),
        "body_malformed",
    );
    f.judge(
        "provider_body_truncated",
        &facts(
            "openai",
            429,
            Some(r#"{"error":{"code":"insufficient_quota""#),
            json!([]),
        ),
        "body_malformed",
    );
    let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
    f.judge(
        "provider_body_too_deep",
        &facts(
            "google",
            429,
            Some(&format!(
                r#"{{"error":{{"status":"RESOURCE_EXHAUSTED","details":{deep}}}}}"#
            )),
            json!([]),
        ),
        "body_too_deep",
    );
    let pad = "x".repeat(MAX_ERROR_BODY_BYTES);
    f.judge(
        "provider_body_oversize",
        &facts(
            "openai",
            429,
            Some(&format!(
                r#"{{"error":{{"code":"insufficient_quota","message":"{pad}"}}}}"#
            )),
            json!([]),
        ),
        "body_oversize",
    );
    let fits = "x".repeat(MAX_ERROR_BODY_BYTES - 80);
    let body = format!(r#"{{"error":{{"code":"insufficient_quota","message":"{fits}"}}}}"#);
    assert!(body.len() <= MAX_ERROR_BODY_BYTES);
    f.judge(
        "provider_body_at_the_limit",
        &facts("openai", 429, Some(&body), json!([])),
        "quota_exhausted",
    );
    // Bad retryDelay values.
    for (name, delay, want) in [
        ("negative", json!("-1.5s"), "retry_delay_invalid"),
        ("no_unit", json!("1.5"), "retry_delay_invalid"),
        ("minutes", json!("1m"), "retry_delay_invalid"),
        ("not_a_string", json!(1.5), "retry_delay_invalid"),
        ("object", json!({"seconds": 1}), "retry_delay_invalid"),
        (
            "beyond_2_53_ms",
            json!("9007199254740993s"),
            "retry_delay_too_far",
        ),
        (
            "beyond_u64",
            json!("99999999999999999999s"),
            "retry_delay_too_far",
        ),
        ("too_far", json!("864000s"), "retry_delay_too_far"),
        (
            "too_many_digits",
            json!("1.0000000001s"),
            "retry_delay_invalid",
        ),
    ] {
        f.judge(
            &format!("provider_retry_delay_{name}"),
            &facts(
                "google",
                429,
                Some(&gemini_429(delay, PER_MINUTE)),
                json!([]),
            ),
            want,
        );
    }
    // Without a family: the v1 rules, the body and reset headers unread.
    f.judge(
        "provider_none_reads_no_body",
        &t(&json!({
            "result": "raised",
            "status": 429,
            "error_body": r#"{"error":{"code":"insufficient_quota"}}"#,
            "headers": [["x-ratelimit-remaining-requests", "0"], ["x-ratelimit-reset-requests", "6m0s"]],
        })),
        "rate_limited\"},\"rule",
    );
    f.judge(
        "provider_bad_family",
        &t(&json!({"result": "raised", "status": 429, "provider_family": "mistral"})),
        "invalid_value",
    );
    f.judge(
        "provider_body_not_a_string",
        &t(&json!({"result": "raised", "status": 429, "provider_family": "openai", "error_body": {"error": {}}})),
        "invalid_type",
    );
    // classify_http: the cap bounds every source.
    f.classify(
        "provider_classify_cap_bounds_retry_info",
        &t(&json!({
            "status": 429,
            "provider_family": "google",
            "error_body": gemini_429(json!("58.934310785s"), PER_MINUTE),
            "retry_after_cap_ms": 5000,
        })),
        "5000",
    );
    f.classify(
        "provider_classify_quota_exhausted",
        &t(&json!({
            "status": 429,
            "provider_family": "openai",
            "error_body": r#"{"error":{"code":"insufficient_quota"}}"#,
        })),
        "quota_exhausted",
    );
    f
}
