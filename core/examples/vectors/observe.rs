//! `observe.json`: the core's classifier of host facts, case by case.

use serde_json::{json, Value};

use crate::common::{t, NOW};
use crate::family::Family;

/// `observe.json`: the classifier on facts alone.
pub fn family() -> Family {
    let mut f = Family::new(
        "observe",
        "judge: the core's classifier of what a host observed (facts) into an outcome and the rule that decided it.",
        "each rule in order (returned, explicit, cancelled, error_type, output_delivered, status, transport, deadline, unrecognized), every entry of the error type and error code tables, the strongest transport evidence, hints recorded as observed, and malformed facts (unknown fields, bad result, status out of range, too many or too long names, bad headers)",
    );
    let j = |v: Value| t(&v);
    f.judge(
        "judge_returned",
        &j(json!({"result": "returned"})),
        "returned",
    );
    f.judge(
        "judge_explicit",
        &j(json!({"result": "raised", "outcome": {"class": "non_retryable", "kind": "invalid_output"}, "status": 503})),
        "explicit",
    );
    f.judge(
        "judge_explicit_success_ignored",
        &j(json!({"result": "raised", "outcome": {"class": "success"}, "status": 503})),
        "status",
    );
    f.judge(
        "judge_cancelled",
        &j(json!({"result": "raised", "cancelled": true, "status": 429})),
        "cancelled",
    );
    f.judge(
        "judge_cancelled_after_output",
        &j(json!({"result": "raised", "cancelled": true, "response_bytes_received": true})),
        "stream_interrupted_after_output",
    );
    f.judge(
        "judge_output_delivered",
        &j(json!({"result": "raised", "response_bytes_received": true, "status": 503})),
        "output_delivered",
    );
    f.judge(
        "judge_status_with_hint",
        &j(json!({"result": "raised", "status": 429, "headers": [["retry-after", "7"]], "now_unix_ms": NOW})),
        "7000",
    );
    f.judge(
        "judge_status_2xx_then_reset",
        &j(json!({"result": "raised", "status": 200, "error_codes": ["ECONNRESET"]})),
        "unknown_provider_acceptance",
    );
    f.judge(
        "judge_host_transport_error",
        &j(json!({"result": "raised", "transport_error": "connect_failed"})),
        "unavailable",
    );
    f.judge(
        "judge_strongest_evidence",
        &j(json!({"result": "raised", "error_types": ["APIConnectionError"], "error_codes": ["ECONNRESET", "ECONNREFUSED"]})),
        "unavailable",
    );
    f.judge(
        "judge_abort_after_deadline",
        &j(json!({"result": "raised", "error_types": ["AbortError"], "deadline_passed": true})),
        "timeout_before_response",
    );
    f.judge(
        "judge_deadline",
        &j(json!({"result": "raised", "error_types": ["ValueError"], "deadline_passed": true})),
        "deadline",
    );
    f.judge(
        "judge_unrecognized",
        &j(json!({"result": "raised", "error_types": ["ValueError", "Exception", "BaseException"]})),
        "unrecognized",
    );
    f.judge(
        "judge_status_409_in_progress",
        &j(json!({"result": "raised", "error_types": ["ConflictError", "APIStatusError"], "status": 409, "headers": [["retry-after", "1"]], "now_unix_ms": NOW})),
        "in_progress",
    );
    f.judge(
        "judge_status_409_in_progress_hint_as_observed",
        &j(json!({"result": "raised", "status": 409, "headers": [["retry-after", "600"]], "now_unix_ms": NOW})),
        "600000",
    );
    f.judge(
        "judge_status_409_without_hint_rejected",
        &j(json!({"result": "raised", "status": 409})),
        "rejected",
    );
    f.judge(
        "judge_status_422_key_reused",
        &j(json!({"result": "raised", "status": 422, "headers": [["retry-after", "1"]]})),
        "invalid_request",
    );
    for (name, _) in retryledger_core::observe::ERROR_TYPES {
        f.judge(
            &format!("judge_type_{}", name.to_ascii_lowercase()),
            &j(json!({"result": "raised", "error_types": [name]})),
            "ok",
        );
    }
    for (code, _) in retryledger_core::observe::ERROR_CODES {
        f.judge(
            &format!("judge_code_{}", code.to_ascii_lowercase()),
            &j(json!({"result": "raised", "error_codes": [code]})),
            "ok",
        );
    }
    let long = "x".repeat(257);
    let many: Vec<String> = (0..33).map(|i| format!("E{i}")).collect();
    for (name, facts, want) in [
        (
            "judge_bad_result",
            json!({"result": "maybe"}),
            "invalid_value",
        ),
        (
            "judge_missing_result",
            json!({"status": 503}),
            "missing_field",
        ),
        (
            "judge_unknown_field",
            json!({"result": "raised", "stack": "..."}),
            "unknown_field",
        ),
        (
            "judge_status_out_of_range",
            json!({"result": "raised", "status": 600}),
            "invalid_status",
        ),
        (
            "judge_name_too_long",
            json!({"result": "raised", "error_types": [long]}),
            "string_too_long",
        ),
        (
            "judge_too_many_names",
            json!({"result": "raised", "error_codes": many}),
            "too_many_items",
        ),
        (
            "judge_header_not_a_pair",
            json!({"result": "raised", "headers": [["retry-after"]]}),
            "invalid_value",
        ),
        (
            "judge_name_not_a_string",
            json!({"result": "raised", "error_types": [7]}),
            "invalid_type",
        ),
        (
            "judge_bad_transport_error",
            json!({"result": "raised", "transport_error": "dns"}),
            "invalid_value",
        ),
    ] {
        f.judge(name, &j(facts), want);
    }
    f
}
