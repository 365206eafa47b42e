//! `policy.json`.

use retryledger_core::limits::MAX_SAFE_INTEGER;
use serde_json::json;

use crate::common::{id, jitter, policy_with, reference, set, single_route, t, MODES};
use crate::family::{EditCase, Family};

pub fn family() -> Family {
    let mut f = Family::new(
        "policy",
        "validate_policy: valid policies give their digest; each validation rule, broken alone, gives its own code and path.",
        "validate_policy on valid policies (reference, every jitter mode, degraded fallback allowed, routes out of order, bounds at their limits) and every policy rule broken alone, incl. each capability field, plus the order in which rules are checked",
    );
    let r = reference();
    f.policy("reference", &t(&r), "ok");
    for mode in MODES {
        f.policy(
            &format!("jitter_{mode}"),
            &t(&policy_with(&[("/jitter", jitter(mode, 7))])),
            "ok",
        );
    }
    let generic = id("behavior: generic summary v1");
    f.policy(
        "degraded_fallback_allowed",
        &t(&policy_with(&[
            ("/routes/1/behavior_class_sha256", json!(generic)),
            ("/allowed_degraded_behavior_classes", json!([generic])),
        ])),
        "ok",
    );
    f.policy(
        "degraded_class_allowed_but_unused",
        &t(&policy_with(&[(
            "/allowed_degraded_behavior_classes",
            json!([generic]),
        )])),
        "ok",
    );
    let mut swapped = r.clone();
    swapped["routes"].as_array_mut().expect("routes").reverse();
    f.policy("routes_listed_out_of_priority_order", &t(&swapped), "ok");
    f.policy(
        "single_route",
        &t(&single_route(3, 100, 1_000, 2_000, 5_000)),
        "ok",
    );
    let mut local = single_route(2, 100, 1_000, 2_000, 5_000);
    set(&mut local, "/max_data_boundary", json!("local_process"));
    set(
        &mut local,
        "/routes/0/data_boundary",
        json!("local_process"),
    );
    f.policy("local_process_boundary", &t(&local), "ok");
    f.policy(
        "attempt_bounds_at_limit",
        &t(&policy_with(&[
            ("/max_total_attempts", json!(10_000)),
            ("/routes/0/max_attempts", json!(10_000)),
        ])),
        "ok",
    );
    f.policy(
        "integers_at_2_pow_53_minus_1",
        &t(&policy_with(&[
            ("/deadline_ms", json!(MAX_SAFE_INTEGER)),
            ("/max_total_cost", json!(MAX_SAFE_INTEGER)),
            ("/jitter", jitter("full", MAX_SAFE_INTEGER)),
        ])),
        "ok",
    );
    f.policy(
        "backoff_base_equals_max",
        &t(&policy_with(&[(
            "/backoff",
            json!({"base_ms": 500, "max_ms": 500, "retry_after_cap_ms": 0}),
        )])),
        "ok",
    );
    f.policy(
        "route_stronger_than_required",
        &t(&policy_with(&[
            (
                "/routes/1/capabilities/structured_output",
                json!("constrained_decoding"),
            ),
            ("/routes/1/capabilities/tool_calls", json!("parallel")),
            ("/routes/1/capabilities/retention_days", json!(0)),
        ])),
        "ok",
    );

    let release0 = r["routes"][0]["route_release_sha256"].clone();
    let rules: Vec<EditCase> = vec![
        (
            "retry_owner_adapter",
            vec![("/retry_owner", json!("adapter"))],
            "retry_owner_not_harness",
        ),
        (
            "retry_owner_transport_sdk",
            vec![("/retry_owner", json!("transport_sdk"))],
            "retry_owner_not_harness",
        ),
        ("no_routes", vec![("/routes", json!([]))], "no_routes"),
        (
            "duplicate_priority",
            vec![("/routes/1/priority", json!(0))],
            "duplicate_priority",
        ),
        (
            "priority_gap",
            vec![("/routes/1/priority", json!(2))],
            "priority_not_contiguous",
        ),
        (
            "priority_not_from_zero",
            vec![
                ("/routes/0/priority", json!(1)),
                ("/routes/1/priority", json!(2)),
            ],
            "priority_not_contiguous",
        ),
        (
            "priority_huge",
            vec![("/routes/1/priority", json!(MAX_SAFE_INTEGER))],
            "priority_not_contiguous",
        ),
        (
            "duplicate_route_id",
            vec![("/routes/1/route_id", json!("private-primary"))],
            "duplicate_route_id",
        ),
        (
            "duplicate_route_release",
            vec![("/routes/1/route_release_sha256", release0)],
            "duplicate_route_release",
        ),
        (
            "capability_input_modalities",
            vec![("/routes/1/capabilities/input_modalities", json!(["text"]))],
            "capability_missing",
        ),
        (
            "capability_max_context_tokens",
            vec![("/routes/0/capabilities/max_context_tokens", json!(1_000))],
            "capability_missing",
        ),
        (
            "capability_max_output_tokens",
            vec![("/routes/1/capabilities/max_output_tokens", json!(10))],
            "capability_missing",
        ),
        (
            "capability_max_response_bytes",
            vec![("/routes/1/capabilities/max_response_bytes", json!(10))],
            "capability_missing",
        ),
        (
            "capability_output_modalities",
            vec![
                ("/requirements/output_modalities", json!(["text", "image"])),
                (
                    "/routes/0/capabilities/output_modalities",
                    json!(["image", "text"]),
                ),
            ],
            "capability_missing",
        ),
        (
            "capability_refusal",
            vec![("/routes/1/capabilities/refusal", json!("in_band_text"))],
            "capability_missing",
        ),
        (
            "capability_regions",
            vec![("/routes/1/capabilities/regions", json!(["us-east-1"]))],
            "capability_missing",
        ),
        (
            "capability_release_pin",
            vec![("/routes/1/capabilities/release_pin", json!("alias"))],
            "capability_missing",
        ),
        (
            "capability_retention_days",
            vec![("/routes/1/capabilities/retention_days", json!(31))],
            "capability_missing",
        ),
        (
            "capability_sampling_controls",
            vec![(
                "/routes/1/capabilities/sampling_controls",
                json!(["temperature"]),
            )],
            "capability_missing",
        ),
        (
            "capability_streaming_events",
            vec![(
                "/routes/1/capabilities/streaming_events",
                json!(["terminal"]),
            )],
            "capability_missing",
        ),
        (
            "capability_structured_output",
            vec![(
                "/routes/1/capabilities/structured_output",
                json!("json_object"),
            )],
            "capability_missing",
        ),
        (
            "capability_tool_calls",
            vec![("/routes/1/capabilities/tool_calls", json!("none"))],
            "capability_missing",
        ),
        (
            "capability_first_uncovered_field_named",
            vec![
                ("/routes/1/capabilities/tool_calls", json!("none")),
                ("/routes/1/capabilities/input_modalities", json!(["text"])),
            ],
            "/routes/1/capabilities/input_modalities",
        ),
        (
            "behavior_class_mismatch",
            vec![("/routes/1/behavior_class_sha256", json!("0".repeat(64)))],
            "behavior_class_mismatch",
        ),
        (
            "data_boundary_private_only",
            vec![("/max_data_boundary", json!("private_service"))],
            "data_boundary_exceeded",
        ),
        (
            "data_boundary_local_only",
            vec![("/max_data_boundary", json!("local_process"))],
            "data_boundary_exceeded",
        ),
        (
            "idempotency_unsupported",
            vec![("/routes/1/supports_idempotency", json!(false))],
            "idempotency_unsupported",
        ),
        (
            "route_attempts_zero",
            vec![("/routes/0/max_attempts", json!(0))],
            "route_attempts_unbounded",
        ),
        (
            "route_attempts_above_limit",
            vec![("/routes/0/max_attempts", json!(10_001))],
            "route_attempts_unbounded",
        ),
        (
            "total_attempts_zero",
            vec![("/max_total_attempts", json!(0))],
            "budget_unbounded",
        ),
        (
            "total_attempts_above_limit",
            vec![("/max_total_attempts", json!(10_001))],
            "budget_unbounded",
        ),
        (
            "deadline_zero",
            vec![("/deadline_ms", json!(0))],
            "budget_unbounded",
        ),
        (
            "backoff_base_zero",
            vec![("/backoff/base_ms", json!(0))],
            "invalid_backoff",
        ),
        (
            "backoff_max_below_base",
            vec![("/backoff/max_ms", json!(50))],
            "invalid_backoff",
        ),
        // Order of the checks: the first rule in DESIGN's order wins.
        (
            "order_owner_before_budgets",
            vec![
                ("/retry_owner", json!("adapter")),
                ("/deadline_ms", json!(0)),
            ],
            "retry_owner_not_harness",
        ),
        (
            "order_budgets_before_backoff",
            vec![
                ("/max_total_attempts", json!(0)),
                ("/backoff/base_ms", json!(0)),
            ],
            "budget_unbounded",
        ),
        (
            "order_backoff_before_routes",
            vec![("/backoff/base_ms", json!(0)), ("/routes", json!([]))],
            "invalid_backoff",
        ),
        (
            "order_capability_before_behavior_and_boundary",
            vec![
                ("/routes/1/capabilities/tool_calls", json!("none")),
                ("/routes/1/behavior_class_sha256", json!("0".repeat(64))),
                ("/max_data_boundary", json!("private_service")),
            ],
            "capability_missing",
        ),
        (
            "order_behavior_before_boundary",
            vec![
                ("/routes/1/behavior_class_sha256", json!("0".repeat(64))),
                ("/max_data_boundary", json!("private_service")),
            ],
            "behavior_class_mismatch",
        ),
        (
            "order_earlier_route_first",
            vec![
                ("/routes/0/supports_idempotency", json!(false)),
                ("/routes/1/capabilities/tool_calls", json!("none")),
            ],
            "idempotency_unsupported",
        ),
    ];
    for (name, edits, want) in rules {
        f.policy(name, &t(&policy_with(&edits)), want);
    }
    f
}
