//! Every policy rule, decision rule and decode rule, each with its own code.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use retryledger_core::api;
use retryledger_core::canonical::canonical_json;
use retryledger_core::decode::from_value;
use retryledger_core::lab::{self, Step};
use retryledger_core::outcome::{NonRetryableKind, RetryableKind};
use retryledger_core::{
    compile, evaluate, plan_next, Decision, ErrorCode, Outcome, Policy, Terminal,
};
use serde_json::{json, Value};

fn with(edits: &[(&str, Value)]) -> Value {
    let mut v = lab::reference_policy();
    for (ptr, new) in edits {
        let (parent, key) = ptr.rsplit_once('/').unwrap();
        let target = if parent.is_empty() {
            &mut v
        } else {
            v.pointer_mut(parent).unwrap()
        };
        match target {
            Value::Object(m) => {
                m.insert(key.to_owned(), new.clone());
            }
            Value::Array(a) => a[key.parse::<usize>().unwrap()] = new.clone(),
            _ => panic!("bad pointer {ptr}"),
        }
    }
    v
}

fn policy_code(edits: &[(&str, Value)]) -> (ErrorCode, Option<String>) {
    let e = api::validate_policy(&with(edits).to_string()).unwrap_err();
    (e.code, e.path)
}

#[test]
fn reference_policy_is_valid() {
    let digest = api::validate_policy(&lab::reference_policy().to_string()).unwrap();
    assert_eq!(digest.len(), 64);
}

#[test]
fn each_policy_rule_has_its_code() {
    use ErrorCode::*;
    type Case<'a> = (&'a str, Vec<(&'a str, Value)>, ErrorCode, &'a str);
    let cases: Vec<Case> = vec![
        (
            "adapter owner",
            vec![("/retry_owner", json!("adapter"))],
            RetryOwnerNotHarness,
            "/retry_owner",
        ),
        (
            "sdk owner",
            vec![("/retry_owner", json!("transport_sdk"))],
            RetryOwnerNotHarness,
            "/retry_owner",
        ),
        (
            "no routes",
            vec![("/routes", json!([]))],
            NoRoutes,
            "/routes",
        ),
        (
            "duplicate priority",
            vec![("/routes/1/priority", json!(0))],
            DuplicatePriority,
            "/routes/1/priority",
        ),
        (
            "gap in priorities",
            vec![("/routes/1/priority", json!(2))],
            PriorityNotContiguous,
            "/routes/1/priority",
        ),
        (
            "duplicate id",
            vec![("/routes/1/route_id", json!("private-primary"))],
            DuplicateRouteId,
            "/routes/1/route_id",
        ),
        (
            "duplicate release",
            vec![(
                "/routes/1/route_release_sha256",
                lab::reference_policy()["routes"][0]["route_release_sha256"].clone(),
            )],
            DuplicateRouteRelease,
            "/routes/1/route_release_sha256",
        ),
        (
            "text-only route",
            vec![("/routes/1/capabilities/input_modalities", json!(["text"]))],
            CapabilityMissing,
            "/routes/1/capabilities/input_modalities",
        ),
        (
            "small context",
            vec![("/routes/0/capabilities/max_context_tokens", json!(1000))],
            CapabilityMissing,
            "/routes/0/capabilities/max_context_tokens",
        ),
        (
            "region outside",
            vec![("/routes/1/capabilities/regions", json!(["us-east-1"]))],
            CapabilityMissing,
            "/routes/1/capabilities/regions",
        ),
        (
            "long retention",
            vec![("/routes/1/capabilities/retention_days", json!(90))],
            CapabilityMissing,
            "/routes/1/capabilities/retention_days",
        ),
        (
            "floating pin",
            vec![("/routes/1/capabilities/release_pin", json!("floating"))],
            CapabilityMissing,
            "/routes/1/capabilities/release_pin",
        ),
        (
            "no tools",
            vec![("/routes/1/capabilities/tool_calls", json!("none"))],
            CapabilityMissing,
            "/routes/1/capabilities/tool_calls",
        ),
        (
            "no usage events",
            vec![(
                "/routes/1/capabilities/streaming_events",
                json!(["terminal"]),
            )],
            CapabilityMissing,
            "/routes/1/capabilities/streaming_events",
        ),
        (
            "no seed",
            vec![(
                "/routes/1/capabilities/sampling_controls",
                json!(["temperature"]),
            )],
            CapabilityMissing,
            "/routes/1/capabilities/sampling_controls",
        ),
        (
            "in-band refusal",
            vec![("/routes/1/capabilities/refusal", json!("in_band_text"))],
            CapabilityMissing,
            "/routes/1/capabilities/refusal",
        ),
        (
            "small responses",
            vec![("/routes/1/capabilities/max_response_bytes", json!(10))],
            CapabilityMissing,
            "/routes/1/capabilities/max_response_bytes",
        ),
        (
            "small output",
            vec![("/routes/1/capabilities/max_output_tokens", json!(10))],
            CapabilityMissing,
            "/routes/1/capabilities/max_output_tokens",
        ),
        (
            "text output only",
            vec![
                ("/requirements/output_modalities", json!(["text", "image"])),
                (
                    "/routes/0/capabilities/output_modalities",
                    json!(["text", "image"]),
                ),
            ],
            CapabilityMissing,
            "/routes/1/capabilities/output_modalities",
        ),
        (
            "behavior",
            vec![("/routes/1/behavior_class_sha256", json!("0".repeat(64)))],
            BehaviorClassMismatch,
            "/routes/1/behavior_class_sha256",
        ),
        (
            "boundary",
            vec![("/max_data_boundary", json!("local_process"))],
            DataBoundaryExceeded,
            "/routes/0/data_boundary",
        ),
        (
            "idempotency",
            vec![("/routes/1/supports_idempotency", json!(false))],
            IdempotencyUnsupported,
            "/routes/1/supports_idempotency",
        ),
        (
            "zero route attempts",
            vec![("/routes/0/max_attempts", json!(0))],
            RouteAttemptsUnbounded,
            "/routes/0/max_attempts",
        ),
        (
            "huge route attempts",
            vec![("/routes/0/max_attempts", json!(1_000_000))],
            RouteAttemptsUnbounded,
            "/routes/0/max_attempts",
        ),
        (
            "zero total",
            vec![("/max_total_attempts", json!(0))],
            BudgetUnbounded,
            "/max_total_attempts",
        ),
        (
            "huge total",
            vec![("/max_total_attempts", json!(10_001))],
            BudgetUnbounded,
            "/max_total_attempts",
        ),
        (
            "zero deadline",
            vec![("/deadline_ms", json!(0))],
            BudgetUnbounded,
            "/deadline_ms",
        ),
        (
            "zero base",
            vec![("/backoff/base_ms", json!(0))],
            InvalidBackoff,
            "/backoff",
        ),
        (
            "max below base",
            vec![("/backoff/max_ms", json!(50))],
            InvalidBackoff,
            "/backoff",
        ),
    ];
    for (name, edits, code, path) in cases {
        assert_eq!(policy_code(&edits), (code, Some(path.to_owned())), "{name}");
    }
}

#[test]
fn decode_rules_have_codes_and_paths() {
    use ErrorCode::*;
    let text = lab::reference_policy().to_string();
    let cases: Vec<(String, ErrorCode, Option<&str>)> = vec![
        (
            text.replacen("\"schema\"", "\"extra\":1,\"schema\"", 1),
            UnknownField,
            None,
        ),
        (
            text.replacen("\"deadline_ms\":5000", "\"deadline_ms\":5000.0", 1),
            FloatValue,
            Some("/deadline_ms"),
        ),
        (
            text.replacen("\"deadline_ms\":5000", "\"deadline_ms\":null", 1),
            NullValue,
            Some("/deadline_ms"),
        ),
        (
            text.replacen(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":9007199254740992",
                1,
            ),
            IntegerOutOfRange,
            Some("/deadline_ms"),
        ),
        (
            text.replacen(
                "\"deadline_ms\":5000",
                "\"deadline_ms\":5000,\"deadline_ms\":6000",
                1,
            ),
            DuplicateKey,
            Some("/deadline_ms"),
        ),
        (
            text.replacen("\"deadline_ms\":5000", "\"deadline_ms\":\"5000\"", 1),
            InvalidType,
            Some("/deadline_ms"),
        ),
        (
            text.replacen(
                "\"retry_owner\":\"harness\"",
                "\"retry_owner\":\"nobody\"",
                1,
            ),
            InvalidValue,
            Some("/retry_owner"),
        ),
        (
            text.replacen("retryledger.policy.v1", "retryledger.policy.v2", 1),
            SchemaMismatch,
            Some("/schema"),
        ),
        (
            text.replacen("\"cost_unit\":\"micro_usd\",", "", 1),
            MissingField,
            None,
        ),
        (
            text.replacen(
                "\"cost_unit\":\"micro_usd\"",
                "\"cost_unit\":\"micro usd\"",
                1,
            ),
            InvalidIdentifier,
            Some("/cost_unit"),
        ),
        (
            text.replacen(
                "\"cost_unit\":\"micro_usd\"",
                &format!("\"cost_unit\":\"{}\"", "u".repeat(129)),
                1,
            ),
            StringTooLong,
            Some("/cost_unit"),
        ),
        (
            text.replacen("[\"seed\",\"temperature\"]", "[\"seed\",\"seed\"]", 1),
            DuplicateSetItem,
            Some("/requirements/sampling_controls"),
        ),
        (
            text.replacen(
                "\"behavior_class_sha256\":\"",
                "\"behavior_class_sha256\":\"X",
                1,
            ),
            InvalidDigest,
            Some("/behavior_class_sha256"),
        ),
        ("{".to_owned(), InvalidJson, None),
        (
            format!("{}{}", "[".repeat(33), "]".repeat(33)),
            NestingTooDeep,
            None,
        ),
    ];
    for (input, code, path) in cases {
        let e = api::validate_policy(&input).unwrap_err();
        assert_eq!(e.code, code, "{input:.120} -> {e}");
        if let Some(p) = path {
            assert_eq!(e.path.as_deref(), Some(p), "{e}");
        }
    }
    let routes: Vec<Value> = (0..65)
        .map(|_| lab::reference_policy()["routes"][0].clone())
        .collect();
    let e = api::validate_policy(&with(&[("/routes", json!(routes))]).to_string()).unwrap_err();
    assert_eq!(e.code, TooManyItems);
}

fn policy(edits: &[(&str, Value)]) -> Policy {
    from_value(with(edits)).unwrap()
}

fn run(edits: &[(&str, Value)], steps: &[Step]) -> Terminal {
    let p = policy(edits);
    let attempts = lab::simulate(&p, steps).unwrap();
    evaluate(&compile(p).unwrap(), &attempts).unwrap().terminal
}

fn rl(ms: u64) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: Some(ms),
        retry_after_source: None,
    }
}
fn down() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    }
}

#[test]
fn decision_order_per_attempt() {
    // Deadline beats cost beats outcome.
    let late_and_costly = [Step::new(Outcome::Success, 6_000, 20_000)];
    assert_eq!(run(&[], &late_and_costly), Terminal::StopDeadline);
    let costly = [Step::new(Outcome::Success, 100, 20_000)];
    assert_eq!(run(&[], &costly), Terminal::StopCostBudget);
    assert_eq!(
        run(&[], &[Step::new(Outcome::Success, 100, 10_000)]),
        Terminal::Completed
    );
    let rejected = [Step::new(
        Outcome::NonRetryable {
            kind: NonRetryableKind::PolicyDenied,
        },
        100,
        0,
    )];
    assert_eq!(run(&[], &rejected), Terminal::StopNonRetryable);
}

#[test]
fn decision_order_before_dispatch() {
    // Total attempts is checked before route exhaustion.
    let three_failures = [
        Step::new(down(), 10, 0),
        Step::new(down(), 10, 0),
        Step::new(down(), 10, 0),
        Step::new(down(), 10, 0),
    ];
    assert_eq!(
        run(&[("/max_total_attempts", json!(4))], &three_failures),
        Terminal::StopTotalAttempts
    );
    assert_eq!(
        run(&[("/max_total_attempts", json!(5))], &three_failures),
        Terminal::StopRouteExhausted
    );
    // Cost reservation is checked before the deadline.
    assert_eq!(
        run(
            &[
                ("/max_total_cost", json!(2_000)),
                ("/deadline_ms", json!(300))
            ],
            &[Step::new(rl(5_000), 100, 600), Step::new(down(), 10, 0)]
        ),
        Terminal::StopCostBudget
    );
    // A first dispatch whose reservation does not fit never happens.
    let p = policy(&[("/max_total_cost", json!(1_000))]);
    let compiled = compile(p.clone()).unwrap();
    let empty = lab::simulate(&p, &[]).unwrap();
    assert_eq!(
        plan_next(&compiled, &empty).unwrap(),
        Decision::Terminal {
            terminal: Terminal::StopCostBudget
        }
    );
}

#[test]
fn retry_after_is_capped_and_raises_the_delay() {
    let p = policy(&[(
        "/backoff",
        json!({"base_ms": 200, "max_ms": 1_500, "retry_after_cap_ms": 1_200}),
    )]);
    let compiled = compile(p.clone()).unwrap();
    let attempts = lab::simulate(&p, &[Step::new(rl(60_000), 100, 0)]).unwrap();
    let Decision::Dispatch(d) = plan_next(&compiled, &attempts).unwrap() else {
        panic!()
    };
    assert_eq!(
        (d.delay_ms, d.not_before_ms, d.retry_after_floor_ms),
        (1_200, 1_300, 1_200)
    );
}

#[test]
fn drift_errors_point_at_the_attempt() {
    let bundle = lab::reference_bundle().unwrap();
    let compiled = compile(bundle.policy.clone()).unwrap();
    let mut attempts = bundle.attempts.clone();
    attempts.attempts[1].started_at_ms = 1_349;
    let e = evaluate(&compiled, &attempts).unwrap_err();
    assert_eq!(
        (e.code, e.attempt_index, e.path.as_deref()),
        (
            ErrorCode::EarlyStart,
            Some(1),
            Some("/attempts/1/started_at_ms")
        )
    );
    let mut partial = bundle.attempts.clone();
    partial.attempts.truncate(2);
    assert_eq!(
        evaluate(&compiled, &partial).unwrap_err().code,
        ErrorCode::RunNotTerminal
    );
    let mut cancelled = bundle.attempts.clone();
    cancelled.cancelled_at_ms = Some(3_000);
    assert_eq!(
        evaluate(&compiled, &cancelled).unwrap_err().code,
        ErrorCode::CancelDrift
    );
    let mut costly = bundle.attempts.clone();
    costly.attempts[0].cost = 9_007_199_254_740_991;
    let e = evaluate(&compiled, &costly).unwrap_err();
    assert_eq!(
        (e.code, e.attempt_index),
        (ErrorCode::AttemptAfterTerminal, Some(1))
    );
    costly.attempts.truncate(1);
    assert_eq!(
        evaluate(&compiled, &costly).unwrap().terminal,
        Terminal::StopCostBudget
    );
}

#[test]
fn digest_decodes_by_schema() {
    let bundle = lab::reference_bundle().unwrap();
    let text = canonical_json(&bundle.receipt);
    assert_eq!(
        api::digest(&text).unwrap(),
        retryledger_core::digest(&bundle.receipt)
    );
    assert_eq!(
        api::digest("{\"schema\":\"nope\"}").unwrap_err().code,
        ErrorCode::SchemaMismatch
    );
    assert_eq!(api::digest("[]").unwrap_err().code, ErrorCode::InvalidType);
    assert_eq!(api::digest("{}").unwrap_err().code, ErrorCode::MissingField);
}

#[test]
fn documents_are_objects_with_no_extra_fields_anywhere() {
    // serde accepts a struct's fields by position and ignores fields beside
    // the tag of a unit variant; strict decoding refuses both.
    let text = lab::reference_policy().to_string();
    let positional = text.replacen(
        "{\"base_ms\":100,\"max_ms\":1000,\"retry_after_cap_ms\":2000}",
        "[100,1000,2000]",
        1,
    );
    assert_ne!(positional, text);
    let e = api::validate_policy(&positional).unwrap_err();
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::InvalidType, Some("/backoff"))
    );
    let seeded_none = text.replacen("{\"mode\":\"none\"}", "{\"mode\":\"none\",\"seed\":1}", 1);
    assert_ne!(seeded_none, text);
    assert_eq!(
        api::validate_policy(&seeded_none).unwrap_err().code,
        ErrorCode::UnknownField
    );
    let bundle = lab::reference_bundle().unwrap();
    let attempts = canonical_json(&bundle.attempts);
    let success_with_kind = attempts.replacen(
        "{\"class\":\"success\"}",
        "{\"class\":\"success\",\"kind\":\"rejected\"}",
        1,
    );
    assert_ne!(success_with_kind, attempts);
    assert_eq!(
        api::evaluate(&text, &success_with_kind).unwrap_err().code,
        ErrorCode::UnknownField
    );
    // The headers' [name, value] pairs are still arrays.
    assert!(api::classify_http("{\"headers\":[[\"retry-after\",\"1\"]],\"status\":429}").is_ok());
}

#[test]
fn every_api_output_is_canonical_json() {
    use retryledger_core::canonical::to_jcs;
    let bundle = lab::reference_bundle().unwrap();
    let policy = canonical_json(&bundle.policy);
    let attempts = canonical_json(&bundle.attempts);
    let mut first = bundle.attempts.clone();
    first.attempts.truncate(1);
    let outputs = [
        api::plan_next(&policy, &canonical_json(&first)).unwrap(),
        api::plan_next(&policy, &attempts).unwrap(),
        api::evaluate(&policy, &attempts).unwrap(),
        api::verify(&canonical_json(&bundle)).unwrap(),
        api::classify_http(r#"{"status":429,"headers":[["retry-after","2"]]}"#).unwrap(),
    ];
    for text in outputs {
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(text, to_jcs(&value));
    }
}
