//! `idempotency.json`: the receiver's records per scoped key
//! (`retryledger.idempotency_record.v1`), the claim of a request under a key
//! and the completion of a claim.

use retryledger_core::api;
use serde_json::{json, Value};

use crate::common::{id, t, NOW_2026};
use crate::family::Family;

const T0: u64 = NOW_2026;
const TTL: u64 = 86_400_000;

fn key() -> String {
    api::idempotency_key_sha256("INC-4471", Some("tenant-7"), Some("op-summarize")).expect("key")
}

fn body() -> String {
    id("request body: summarize INC-4471")
}

fn retention(expired: &str) -> Value {
    json!({"expired": expired, "poll_after_ms": 500, "ttl_ms": TTL})
}

fn request(body: &str) -> Value {
    json!({"idempotency_key_sha256": key(), "request_sha256": body})
}

/// A record of the key at T0 in a status (a result for `succeeded`).
fn record(status: &str) -> Value {
    let mut r = json!({
        "created_at_epoch_ms": T0, "expires_at_epoch_ms": T0 + TTL,
        "idempotency_key_sha256": key(), "request_sha256": body(),
        "schema": "retryledger.idempotency_record.v1", "status": status,
        "updated_at_epoch_ms": T0,
    });
    if status == "succeeded" {
        r["result_sha256"] = json!(id("response: severity 2, summary ..."));
    }
    r
}

fn with(mut v: Value, edits: &[(&str, Value)]) -> Value {
    for (k, x) in edits {
        v[*k] = x.clone();
    }
    v
}

fn claim(
    f: &mut Family,
    name: &str,
    ret: &Value,
    rec: Option<&Value>,
    req: &Value,
    now: u64,
    want: &str,
) {
    let mut input = vec![("retention", json!(t(ret)))];
    if let Some(r) = rec {
        input.push(("record", json!(t(r))));
    }
    input.push(("request", json!(t(req))));
    input.push(("now_epoch_ms", json!(now)));
    f.add(name, "idempotency_claim", input, want);
}

fn complete(f: &mut Family, name: &str, rec: &Value, completion: &Value, now: u64, want: &str) {
    f.add(
        name,
        "idempotency_complete",
        vec![
            ("retention", json!(t(&retention("reject")))),
            ("record", json!(t(rec))),
            ("completion", json!(t(completion))),
            ("now_epoch_ms", json!(now)),
        ],
        want,
    );
}

fn done(status: &str, result: Option<&str>) -> Value {
    let mut c =
        json!({"idempotency_key_sha256": key(), "request_sha256": body(), "status": status});
    if let Some(r) = result {
        c["result_sha256"] = json!(r);
    }
    c
}

pub fn family() -> Family {
    let mut f = Family::new(
        "idempotency",
        "idempotency_claim / idempotency_complete: the receiver's idempotency record per scoped key (retryledger.idempotency_record.v1) under an explicit retention (ttl_ms, poll_after_ms, what an expired record means), the claim of a request under a key and the completion of a claim; digest of a record.",
        "a new key proceeds with the record to write; the same request replays a stored result, polls a request in progress (bounded by the retention and the record's expiry), proceeds again after a verified no-effect failure, is refused when indeterminate; another request under the key is key reuse; an expired record under each retention choice; a clock behind the record; a record of another scope, inconsistent times and results, bad retentions; completions to each final status, of a record not in progress, by another request, without a result",
    );
    let (proceed, reject) = (retention("proceed"), retention("reject"));
    let req = request(&body());
    claim(
        &mut f,
        "claim_new_key_proceeds",
        &reject,
        None,
        &req,
        T0,
        "proceed",
    );
    claim(
        &mut f,
        "claim_same_request_succeeded_replays",
        &reject,
        Some(&record("succeeded")),
        &req,
        T0 + 60_000,
        "replay",
    );
    claim(
        &mut f,
        "claim_same_request_in_progress_polls",
        &reject,
        Some(&record("in_progress")),
        &req,
        T0 + 1_000,
        "retry_after_ms\":500",
    );
    claim(
        &mut f,
        "claim_in_progress_poll_bounded_by_expiry",
        &reject,
        Some(&record("in_progress")),
        &req,
        T0 + TTL - 200,
        "retry_after_ms\":200",
    );
    claim(
        &mut f,
        "claim_after_failed_no_effect_proceeds_again",
        &reject,
        Some(&record("failed_no_effect")),
        &req,
        T0 + 5_000,
        "proceed",
    );
    claim(
        &mut f,
        "claim_indeterminate_is_refused",
        &reject,
        Some(&record("indeterminate")),
        &req,
        T0 + 5_000,
        "indeterminate",
    );
    let other = request(&id("request body: summarize INC-9999"));
    claim(
        &mut f,
        "claim_another_request_is_key_reuse",
        &reject,
        Some(&record("succeeded")),
        &other,
        T0 + 5_000,
        "key_reuse",
    );
    claim(
        &mut f,
        "claim_another_request_while_in_progress_is_key_reuse",
        &reject,
        Some(&record("in_progress")),
        &other,
        T0 + 5_000,
        "key_reuse",
    );
    for (ret, label, want) in [
        (&proceed, "proceed", "proceed"),
        (&reject, "reject", "key_expired"),
    ] {
        claim(
            &mut f,
            &format!("claim_expired_succeeded_under_{label}"),
            ret,
            Some(&record("succeeded")),
            &req,
            T0 + TTL,
            want,
        );
        claim(
            &mut f,
            &format!("claim_expired_in_progress_under_{label}"),
            ret,
            Some(&record("in_progress")),
            &other,
            T0 + TTL + 1,
            want,
        );
    }
    claim(
        &mut f,
        "claim_clock_behind_the_record",
        &reject,
        Some(&with(
            record("in_progress"),
            &[("updated_at_epoch_ms", json!(T0 + 2_000))],
        )),
        &req,
        T0,
        "poll_at_epoch_ms\":1780000002500",
    );
    let elsewhere = api::idempotency_key_sha256("INC-4471", Some("tenant-8"), Some("op-summarize"))
        .expect("key");
    claim(
        &mut f,
        "claim_record_of_another_scope",
        &reject,
        Some(&with(
            record("succeeded"),
            &[("idempotency_key_sha256", json!(elsewhere))],
        )),
        &req,
        T0,
        "idempotency_scope_mismatch",
    );
    claim(
        &mut f,
        "claim_record_changed_before_created",
        &reject,
        Some(&with(
            record("in_progress"),
            &[("updated_at_epoch_ms", json!(T0 - 1))],
        )),
        &req,
        T0,
        "idempotency_record_invalid",
    );
    claim(
        &mut f,
        "claim_record_expiring_before_its_change",
        &reject,
        Some(&with(
            record("in_progress"),
            &[("expires_at_epoch_ms", json!(T0))],
        )),
        &req,
        T0,
        "idempotency_record_invalid",
    );
    claim(
        &mut f,
        "claim_succeeded_record_without_result",
        &reject,
        Some(&with(
            record("failed_no_effect"),
            &[("status", json!("succeeded"))],
        )),
        &req,
        T0,
        "idempotency_record_invalid",
    );
    claim(
        &mut f,
        "claim_expiry_past_the_integer_range",
        &reject,
        None,
        &req,
        retryledger_core::limits::MAX_SAFE_INTEGER - 1_000,
        "invalid_value",
    );
    claim(
        &mut f,
        "claim_retention_ttl_zero",
        &json!({"expired": "reject", "poll_after_ms": 1, "ttl_ms": 0}),
        None,
        &req,
        T0,
        "idempotency_retention_invalid",
    );
    claim(
        &mut f,
        "claim_retention_poll_after_ttl",
        &json!({"expired": "proceed", "poll_after_ms": 2_000, "ttl_ms": 1_000}),
        None,
        &req,
        T0,
        "idempotency_retention_invalid",
    );
    claim(
        &mut f,
        "claim_retention_without_expiry_choice",
        &json!({"poll_after_ms": 500, "ttl_ms": 1_000}),
        None,
        &req,
        T0,
        "missing_field",
    );
    claim(
        &mut f,
        "claim_record_of_another_schema",
        &reject,
        Some(&with(
            record("in_progress"),
            &[("schema", json!("retryledger.breaker.v1"))],
        )),
        &req,
        T0,
        "schema_mismatch",
    );

    let result = id("response: severity 2, summary ...");
    let running = record("in_progress");
    complete(
        &mut f,
        "complete_succeeded_stores_the_result",
        &running,
        &done("succeeded", Some(&result)),
        T0 + 3_000,
        "succeeded",
    );
    complete(
        &mut f,
        "complete_failed_no_effect",
        &running,
        &done("failed_no_effect", None),
        T0 + 3_000,
        "failed_no_effect",
    );
    complete(
        &mut f,
        "complete_indeterminate",
        &running,
        &done("indeterminate", None),
        T0 + 3_000,
        "indeterminate",
    );
    complete(
        &mut f,
        "complete_a_finished_record",
        &record("succeeded"),
        &done("succeeded", Some(&result)),
        T0 + 3_000,
        "idempotency_not_in_progress",
    );
    complete(
        &mut f,
        "complete_by_another_request",
        &running,
        &with(
            done("succeeded", Some(&result)),
            &[(
                "request_sha256",
                json!(id("request body: summarize INC-9999")),
            )],
        ),
        T0 + 3_000,
        "idempotency_request_mismatch",
    );
    complete(
        &mut f,
        "complete_succeeded_without_result",
        &running,
        &done("succeeded", None),
        T0 + 3_000,
        "idempotency_record_invalid",
    );
    complete(
        &mut f,
        "complete_back_to_in_progress",
        &running,
        &done("in_progress", None),
        T0 + 3_000,
        "invalid_value",
    );
    complete(
        &mut f,
        "complete_record_of_another_scope",
        &with(
            running.clone(),
            &[("idempotency_key_sha256", json!(elsewhere))],
        ),
        &done("succeeded", Some(&result)),
        T0 + 3_000,
        "idempotency_scope_mismatch",
    );
    f.digest("digest_idempotency_record", &t(&record("succeeded")), "ok");
    f
}
