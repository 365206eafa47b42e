//! `digest.json`.

use std::fmt::Write as _;

use retryledger_core::lab;
use serde_json::json;

use crate::common::{edited, empty_attempts, policy_with, t};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "digest",
        "digest: SHA-256 over the RFC 8785 canonical JSON of each document type after strict decoding; formatting and key order never change it.",
        "digest of a policy (equal to validate_policy's), attempts, receipt and bundle; a policy that breaks a rule but decodes; pretty-printed and reordered input; and the errors: not an object, no schema, schema not a string, unknown schema, non-normal documents",
    );
    let bundle = retryledger_core::canonical::to_value(&lab::reference_bundle().expect("bundle"));
    f.digest("policy", &t(&bundle["policy"]), "ok");
    f.digest("attempts", &t(&bundle["attempts"]), "ok");
    f.digest("receipt", &t(&bundle["receipt"]), "ok");
    f.digest("bundle", &t(&bundle), "ok");
    f.digest("empty_attempts", &t(&empty_attempts()), "ok");
    f.digest(
        "policy_breaking_a_rule_still_digests",
        &t(&policy_with(&[("/retry_owner", json!("adapter"))])),
        "ok",
    );
    f.digest(
        "receipt_pretty_printed",
        &serde_json::to_string_pretty(&bundle["receipt"]).expect("json"),
        "ok",
    );
    let mut reversed = String::from("{");
    for (i, (k, v)) in bundle["attempts"]
        .as_object()
        .expect("object")
        .iter()
        .rev()
        .enumerate()
    {
        if i > 0 {
            reversed.push(',');
        }
        let _ = write!(reversed, "{}:{}", json!(k), t(v));
    }
    reversed.push('}');
    f.digest("attempts_keys_reversed", &reversed, "ok");
    f.digest("not_an_object", "[1,2]", "invalid_type");
    f.digest("string", "\"retryledger.policy.v1\"", "invalid_type");
    f.digest("no_schema", "{\"a\":1}", "missing_field");
    f.digest("schema_not_a_string", "{\"schema\":5}", "missing_field");
    f.digest(
        "unknown_schema",
        "{\"schema\":\"retryledger.lab_report.v1\"}",
        "schema_mismatch",
    );
    f.digest(
        "vectors_schema_is_not_a_document",
        "{\"schema\":\"retryledger.vectors.v1\"}",
        "schema_mismatch",
    );
    f.digest(
        "receipt_with_unknown_field",
        &t(&edited(&bundle["receipt"], &[("/extra", json!(1))])),
        "unknown_field",
    );
    f.digest(
        "attempts_with_float",
        &t(&bundle["attempts"]).replacen("\"cost\":0", "\"cost\":0.0", 1),
        "float_value",
    );
    f.digest(
        "policy_with_duplicate_key",
        &t(&bundle["policy"]).replacen(
            "\"deadline_ms\":5000",
            "\"deadline_ms\":5000,\"deadline_ms\":5000",
            1,
        ),
        "duplicate_key",
    );
    f.digest("invalid_json", "{\"schema\":", "invalid_json");
    f
}
