//! `decode.json`.

use std::fmt::Write as _;

use retryledger_core::lab;
use retryledger_core::limits::MAX_SET_ITEMS;
use serde_json::{json, Value};

use crate::common::{policy_with, reference, remove, run, set, t};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "decode",
        "Hostile and malformed documents: every decode rule, with its code and JSON Pointer, for policies, attempts, bundles and HTTP observations.",
        "strict decoding: unknown fields, nulls, floats and exponents, negative and too-large integers (2^53, 2^64, 10^20), duplicate keys, wrong types and values, schema mismatch, missing fields, identifiers and digests, duplicate and too many set items, too many routes, invalid JSON (empty, truncated, trailing data, BOM, lone surrogate, comments, NaN), deep nesting (33 levels and 100,000 brackets), huge strings, an array where an object is expected, fields beside a unit variant's tag, header pairs of the wrong length, and formatting that must not change a digest",
    );
    let r = reference();
    let pt = t(&r);
    let rep = |from: &str, to: &str| -> String {
        assert!(pt.contains(from), "policy text lacks {from}");
        pt.replacen(from, to, 1)
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unknown_field_top_level",
            rep("\"schema\":", "\"extra\":1,\"schema\":"),
            "unknown_field",
        ),
        (
            "unknown_field_in_backoff",
            rep("\"base_ms\":100", "\"base_ms\":100,\"factor\":2"),
            "unknown_field",
        ),
        (
            "unknown_field_in_route",
            rep("\"max_attempts\":2", "\"max_attempts\":2,\"weight\":1"),
            "unknown_field",
        ),
        (
            "unknown_field_in_capabilities",
            rep(
                "\"refusal\":\"typed\"",
                "\"refusal\":\"typed\",\"vision\":true",
            ),
            "unknown_field",
        ),
        (
            "unknown_field_in_jitter_none",
            rep("{\"mode\":\"none\"}", "{\"mode\":\"none\",\"seed\":1}"),
            "unknown_field",
        ),
        (
            "unknown_field_holding_huge_string",
            rep(
                "\"schema\":",
                &format!("\"comment\":\"{}\",\"schema\":", "x".repeat(65_536)),
            ),
            "unknown_field",
        ),
        (
            "null_required_field",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":null"),
            "null_value",
        ),
        (
            "null_optional_field",
            rep(
                "\"schema\":",
                "\"allowed_degraded_behavior_classes\":null,\"schema\":",
            ),
            "null_value",
        ),
        (
            "null_in_array",
            rep(
                "\"regions\":[\"eu-central-1\",\"eu-west-1\"]",
                "\"regions\":[\"eu-central-1\",null]",
            ),
            "null_value",
        ),
        (
            "float_with_fraction",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":5000.5"),
            "float_value",
        ),
        (
            "float_integral",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":5000.0"),
            "float_value",
        ),
        (
            "float_exponent",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":5e3"),
            "float_value",
        ),
        (
            "float_overflowing_exponent",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":1e400"),
            "error",
        ),
        (
            "negative_integer",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":-1"),
            "integer_out_of_range",
        ),
        (
            "negative_zero",
            rep("\"max_total_cost\":10000", "\"max_total_cost\":-0"),
            "float_value",
        ),
        (
            "integer_2_pow_53",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":9007199254740992"),
            "integer_out_of_range",
        ),
        (
            "integer_2_pow_64",
            rep(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":18446744073709551616",
            ),
            "integer_out_of_range",
        ),
        (
            "integer_10_pow_20",
            rep(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":100000000000000000000",
            ),
            "integer_out_of_range",
        ),
        (
            "integer_2_pow_53_minus_1_accepted",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":9007199254740991"),
            "ok",
        ),
        (
            "integer_with_leading_zero",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":05000"),
            "invalid_json",
        ),
        (
            "duplicate_key_top_level",
            rep(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":5000,\"deadline_ms\":6000",
            ),
            "duplicate_key",
        ),
        (
            "duplicate_key_same_value",
            rep(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":5000,\"deadline_ms\":5000",
            ),
            "duplicate_key",
        ),
        (
            "duplicate_key_nested",
            rep(
                "\"refusal\":\"typed\"",
                "\"refusal\":\"typed\",\"refusal\":\"none\"",
            ),
            "duplicate_key",
        ),
        (
            "duplicate_schema_key",
            rep(
                "\"schema\":",
                "\"schema\":\"retryledger.policy.v1\",\"schema\":",
            ),
            "duplicate_key",
        ),
        (
            "string_for_integer",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":\"5000\""),
            "invalid_type",
        ),
        (
            "bool_for_integer",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":true"),
            "invalid_type",
        ),
        (
            "array_for_object",
            rep("\"backoff\":{", "\"backoff\":[{").replacen(
                "\"retry_after_cap_ms\":2000}",
                "\"retry_after_cap_ms\":2000}]",
                1,
            ),
            "invalid_type",
        ),
        ("top_level_array", "[]".to_owned(), "invalid_type"),
        (
            "struct_given_as_array_of_its_fields",
            rep(
                "\"backoff\":{\"base_ms\":100,\"max_ms\":1000,\"retry_after_cap_ms\":2000}",
                "\"backoff\":[100,1000,2000]",
            ),
            "invalid_type",
        ),
        ("top_level_number", "5".to_owned(), "invalid_type"),
        ("top_level_string", "\"policy\"".to_owned(), "invalid_type"),
        (
            "unknown_retry_owner",
            rep("\"retry_owner\":\"harness\"", "\"retry_owner\":\"nobody\""),
            "invalid_value",
        ),
        (
            "retry_owner_wrong_case",
            rep("\"retry_owner\":\"harness\"", "\"retry_owner\":\"Harness\""),
            "invalid_value",
        ),
        (
            "unknown_data_boundary",
            rep(
                "\"max_data_boundary\":\"external_provider\"",
                "\"max_data_boundary\":\"anywhere\"",
            ),
            "invalid_value",
        ),
        (
            "unknown_jitter_mode",
            rep("{\"mode\":\"none\"}", "{\"mode\":\"gaussian\"}"),
            "invalid_value",
        ),
        (
            "jitter_without_mode",
            rep("{\"mode\":\"none\"}", "{}"),
            "error",
        ),
        (
            "jitter_full_without_seed",
            rep(
                "{\"mode\":\"none\"}",
                "{\"mode\":\"full\",\"scheduler_release\":\"s\"}",
            ),
            "missing_field",
        ),
        (
            "unknown_modality",
            rep(
                "\"output_modalities\":[\"text\"]",
                "\"output_modalities\":[\"smell\"]",
            ),
            "invalid_value",
        ),
        (
            "schema_next_version",
            rep("retryledger.policy.v1", "retryledger.policy.v2"),
            "schema_mismatch",
        ),
        (
            "schema_of_another_document",
            rep("retryledger.policy.v1", "retryledger.attempts.v1"),
            "schema_mismatch",
        ),
        (
            "missing_cost_unit",
            rep("\"cost_unit\":\"micro_usd\",", ""),
            "missing_field",
        ),
        (
            "missing_schema",
            {
                let mut v = r.clone();
                remove(&mut v, "/schema");
                t(&v)
            },
            "missing_field",
        ),
        (
            "missing_routes",
            {
                let mut v = r.clone();
                remove(&mut v, "/routes");
                t(&v)
            },
            "missing_field",
        ),
        ("empty_object", "{}".to_owned(), "missing_field"),
        (
            "identifier_with_space",
            rep("\"cost_unit\":\"micro_usd\"", "\"cost_unit\":\"micro usd\""),
            "invalid_identifier",
        ),
        (
            "identifier_empty",
            rep("\"cost_unit\":\"micro_usd\"", "\"cost_unit\":\"\""),
            "invalid_identifier",
        ),
        (
            "identifier_non_ascii",
            rep(
                "\"cost_unit\":\"micro_usd\"",
                "\"cost_unit\":\"micro_\u{20ac}\"",
            ),
            "invalid_identifier",
        ),
        (
            "identifier_escaped_control",
            rep(
                "\"cost_unit\":\"micro_usd\"",
                "\"cost_unit\":\"micro\\u0000usd\"",
            ),
            "invalid_identifier",
        ),
        (
            "identifier_129_bytes",
            rep(
                "\"cost_unit\":\"micro_usd\"",
                &format!("\"cost_unit\":\"{}\"", "u".repeat(129)),
            ),
            "string_too_long",
        ),
        (
            "identifier_128_bytes_accepted",
            rep(
                "\"cost_unit\":\"micro_usd\"",
                &format!("\"cost_unit\":\"{}\"", "u".repeat(128)),
            ),
            "ok",
        ),
        (
            "identifier_huge",
            rep(
                "\"cost_unit\":\"micro_usd\"",
                &format!("\"cost_unit\":\"{}\"", "u".repeat(65_536)),
            ),
            "string_too_long",
        ),
        (
            "digest_uppercase",
            rep(
                &format!(
                    "\"behavior_class_sha256\":\"{}",
                    &r["behavior_class_sha256"].as_str().unwrap_or_default()[..8]
                ),
                &format!(
                    "\"behavior_class_sha256\":\"{}",
                    r["behavior_class_sha256"].as_str().unwrap_or_default()[..8]
                        .to_ascii_uppercase()
                ),
            ),
            "invalid_digest",
        ),
        (
            "digest_63_chars",
            rep(
                "\"behavior_class_sha256\":\"",
                "\"behavior_class_sha256\":\"",
            )
            .replacen(
                &format!(
                    "\"{}\"",
                    r["behavior_class_sha256"].as_str().unwrap_or_default()
                ),
                &format!(
                    "\"{}\"",
                    &r["behavior_class_sha256"].as_str().unwrap_or_default()[1..]
                ),
                1,
            ),
            "invalid_digest",
        ),
        (
            "digest_not_hex",
            rep(
                "\"behavior_class_sha256\":\"",
                "\"behavior_class_sha256\":\"zz",
            )
            .replacen(
                &format!(
                    "zz{}",
                    r["behavior_class_sha256"].as_str().unwrap_or_default()
                ),
                &format!(
                    "zz{}",
                    &r["behavior_class_sha256"].as_str().unwrap_or_default()[2..]
                ),
                1,
            ),
            "invalid_digest",
        ),
        (
            "digest_huge",
            {
                let mut v = r.clone();
                set(&mut v, "/logical_request_sha256", json!("a".repeat(65_536)));
                t(&v)
            },
            "invalid_digest",
        ),
        (
            "duplicate_set_item",
            rep("[\"seed\",\"temperature\"]", "[\"seed\",\"seed\"]"),
            "duplicate_set_item",
        ),
        (
            "duplicate_region",
            rep(
                "\"regions\":[\"eu-central-1\",\"eu-west-1\"]",
                "\"regions\":[\"eu-west-1\",\"eu-west-1\"]",
            ),
            "duplicate_set_item",
        ),
        (
            "set_items_unsorted_accepted",
            rep("[\"seed\",\"temperature\"]", "[\"temperature\",\"seed\"]"),
            "ok",
        ),
        (
            "too_many_set_items",
            {
                let regions: Vec<String> = (0..=MAX_SET_ITEMS).map(|i| format!("r-{i}")).collect();
                t(&policy_with(&[("/requirements/regions", json!(regions))]))
            },
            "too_many_items",
        ),
        (
            "too_many_routes",
            {
                let routes: Vec<Value> = (0..65).map(|_| r["routes"][0].clone()).collect();
                t(&policy_with(&[("/routes", json!(routes))]))
            },
            "too_many_items",
        ),
        ("empty_text", String::new(), "invalid_json"),
        ("whitespace_only", " \n\t ".to_owned(), "invalid_json"),
        ("truncated", pt[..pt.len() - 1].to_owned(), "invalid_json"),
        ("trailing_data", format!("{pt} x"), "invalid_json"),
        ("two_documents", format!("{pt}{pt}"), "invalid_json"),
        ("byte_order_mark", format!("\u{feff}{pt}"), "invalid_json"),
        (
            "lone_surrogate_escape",
            rep("\"cost_unit\":\"micro_usd\"", "\"cost_unit\":\"\\ud800\""),
            "invalid_json",
        ),
        (
            "single_quotes",
            rep("\"cost_unit\":\"micro_usd\"", "\"cost_unit\":'micro_usd'"),
            "invalid_json",
        ),
        (
            "trailing_comma",
            rep(
                "\"schema\":\"retryledger.policy.v1\"",
                "\"schema\":\"retryledger.policy.v1\",",
            ),
            "invalid_json",
        ),
        ("comment", format!("// policy\n{pt}"), "invalid_json"),
        (
            "nan_literal",
            rep("\"deadline_ms\":5000", "\"deadline_ms\":NaN"),
            "invalid_json",
        ),
        (
            "nesting_33_levels",
            format!("{}{}", "[".repeat(33), "]".repeat(33)),
            "nesting_too_deep",
        ),
        (
            "nesting_32_levels_is_a_type_error",
            format!("{}{}", "[".repeat(32), "]".repeat(32)),
            "invalid_type",
        ),
        (
            "nesting_100000_open_brackets",
            "[".repeat(100_000),
            "nesting_too_deep",
        ),
        (
            "nesting_inside_unknown_field",
            rep(
                "\"schema\":",
                &format!(
                    "\"x\":{}1{},\"schema\":",
                    "{\"a\":".repeat(40),
                    "}".repeat(40)
                ),
            ),
            "nesting_too_deep",
        ),
    ];
    for (name, input, want) in cases {
        f.policy(name, &input, want);
    }

    // Formatting never changes the digest: the same digest as the compact reference.
    let pretty = serde_json::to_string_pretty(&r).expect("json");
    f.policy("pretty_printed_same_digest", &pretty, "ok");
    let mut reversed = String::from("{");
    let obj = r.as_object().expect("object");
    for (i, (k, v)) in obj.iter().rev().enumerate() {
        if i > 0 {
            reversed.push_str(" ,\n ");
        }
        let _ = write!(reversed, "{} : {}", json!(k), t(v));
    }
    reversed.push('}');
    f.policy("keys_reversed_same_digest", &reversed, "ok");
    f.policy(
        "escaped_ascii_same_digest",
        &rep(
            "\"cost_unit\":\"micro_usd\"",
            "\"cost_unit\":\"micro\\u005fusd\"",
        ),
        "ok",
    );

    // Attempts documents.
    let attempts = run(&r, &lab::reference_steps());
    let at = t(&attempts);
    let arep = |from: &str, to: &str| -> String {
        assert!(at.contains(from), "attempts text lacks {from}");
        at.replacen(from, to, 1)
    };
    let attempt_cases: Vec<(&str, String, &str)> = vec![
        (
            "attempts_unknown_field",
            arep("\"cost\":0", "\"cost\":0,\"latency_ms\":3"),
            "unknown_field",
        ),
        (
            "attempts_unknown_outcome_class",
            arep("\"class\":\"success\"", "\"class\":\"partial\""),
            "invalid_value",
        ),
        (
            "attempts_outcome_without_class",
            arep("{\"class\":\"success\"}", "{}"),
            "error",
        ),
        (
            "attempts_retryable_without_kind",
            arep(
                "\"class\":\"retryable\",\"kind\":\"unavailable\"",
                "\"class\":\"retryable\"",
            ),
            "missing_field",
        ),
        (
            "attempts_success_with_kind",
            arep(
                "{\"class\":\"success\"}",
                "{\"class\":\"success\",\"kind\":\"rejected\"}",
            ),
            "error",
        ),
        (
            "attempts_unknown_retryable_kind",
            arep("\"kind\":\"unavailable\"", "\"kind\":\"overloaded\""),
            "invalid_value",
        ),
        (
            "attempts_null_jitter_sample",
            arep("\"cost\":0", "\"cost\":0,\"jitter_sample_ms\":null"),
            "null_value",
        ),
        (
            "attempts_float_cost",
            arep("\"cost\":1800", "\"cost\":1800.25"),
            "float_value",
        ),
        (
            "attempts_negative_start",
            arep("\"started_at_ms\":0", "\"started_at_ms\":-5"),
            "integer_out_of_range",
        ),
        (
            "attempts_retry_after_2_pow_53",
            arep(
                "\"retry_after_ms\":250",
                "\"retry_after_ms\":9007199254740992",
            ),
            "integer_out_of_range",
        ),
        (
            "attempts_duplicate_key",
            arep("\"ordinal\":1", "\"ordinal\":1,\"ordinal\":2"),
            "duplicate_key",
        ),
        (
            "attempts_not_a_list",
            "{\"attempts\":{},\"schema\":\"retryledger.attempts.v1\"}".to_owned(),
            "invalid_type",
        ),
        (
            "attempts_schema_mismatch",
            arep("retryledger.attempts.v1", "retryledger.policy.v1"),
            "schema_mismatch",
        ),
        (
            "attempts_null_cancelled",
            arep("\"schema\"", "\"cancelled_at_ms\":null,\"schema\""),
            "null_value",
        ),
        (
            "attempts_route_id_invalid",
            arep(
                "\"route_id\":\"private-primary\"",
                "\"route_id\":\"private primary\"",
            ),
            "invalid_identifier",
        ),
    ];
    for (name, input, want) in attempt_cases {
        f.plan(name, &pt, &input, want);
    }

    // Bundles and observations.
    let bundle = lab::reference_bundle().expect("bundle");
    let bt = retryledger_core::canonical::canonical_json(&bundle);
    let brep = |from: &str, to: &str| -> String {
        assert!(bt.contains(from), "bundle text lacks {from}");
        bt.replacen(from, to, 1)
    };
    f.verify(
        "bundle_duplicate_key_in_receipt",
        &brep(
            "\"attempt_count\":3",
            "\"attempt_count\":3,\"attempt_count\":3",
        ),
        "duplicate_key",
    );
    f.verify(
        "bundle_unknown_field_in_schedule_entry",
        &brep("\"delay_ms\":0", "\"delay_ms\":0,\"note\":\"x\""),
        "unknown_field",
    );
    f.verify(
        "bundle_null_final_route",
        &brep(
            "\"final_route_id\":\"external-fallback\"",
            "\"final_route_id\":null",
        ),
        "null_value",
    );
    f.verify(
        "bundle_missing_receipt",
        &{
            let mut v = retryledger_core::canonical::to_value(&bundle);
            remove(&mut v, "/receipt");
            t(&v)
        },
        "missing_field",
    );
    f.verify(
        "bundle_unknown_terminal",
        &brep("\"terminal\":\"completed\"", "\"terminal\":\"done\""),
        "invalid_value",
    );
    f.classify(
        "observation_unknown_field",
        "{\"status\":200,\"body\":\"x\"}",
        "unknown_field",
    );
    f.classify(
        "observation_header_not_a_pair",
        "{\"headers\":[[\"retry-after\"]],\"status\":429}",
        "invalid_value",
    );
    f.classify(
        "observation_header_triple",
        "{\"headers\":[[\"retry-after\",\"1\",\"x\"]],\"status\":429}",
        "too_many_items",
    );
    f.classify(
        "observation_too_many_headers",
        &t(&json!({
            "headers": (0..257).map(|i| json!([format!("x-h{i}"), "v"])).collect::<Vec<_>>(),
            "status": 200
        })),
        "too_many_items",
    );
    f.classify(
        "observation_status_float",
        "{\"status\":429.0}",
        "float_value",
    );
    f.classify(
        "observation_unknown_transport_error",
        "{\"transport_error\":\"dns_failure\"}",
        "invalid_value",
    );
    f
}
