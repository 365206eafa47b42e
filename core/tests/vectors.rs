//! The conformance vectors in `tests/vectors/`, read in place: every case must
//! give exactly its expected result through `retryledger_core::api`, every
//! error code must be covered, and the two codes no vector can reach are
//! checked here directly.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use retryledger_core::api;
use retryledger_core::canonical::to_jcs;
use retryledger_core::lab::{self, Step};
use retryledger_core::limits::MAX_INPUT_BYTES;
use retryledger_core::outcome::RetryableKind;
use retryledger_core::{compile, evaluate, ErrorCode, Outcome, Policy};
use serde_json::{json, Value};

/// Codes no vector shows: `input_too_large` (no JSON text within the limits
/// produces it; its own test is below) and `store_conflict` (a host's: a
/// store write that keeps conflicting, which the store conformance scenarios
/// exercise).
const NOT_IN_VECTORS: [ErrorCode; 4] = [
    ErrorCode::InputTooLarge,
    ErrorCode::StoreConflict,
    // Raised by the drivers when the user's repair function fails (their tests).
    ErrorCode::RepairFunctionFailed,
    // Raised before dispatch when the host's client mapping lacks a route
    // (`CompiledPolicy::require_clients`: tests/route_clients.rs and the
    // drivers' tests); no document operation takes a client mapping.
    ErrorCode::RouteClientMissing,
];

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests")
        .join("vectors")
}

/// Every vector file, parsed: (file stem, document).
fn files() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("tests/vectors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        // tables.json is the core's tables for the bindings, not a family of cases.
        if doc["schema"] == "retryledger.tables.v1" {
            continue;
        }
        out.push((stem, doc));
    }
    out
}

fn s<'a>(input: &'a Value, key: &str) -> &'a str {
    input[key]
        .as_str()
        .unwrap_or_else(|| panic!("input `{key}` is not a string"))
}

fn n(input: &Value, key: &str) -> u64 {
    input[key]
        .as_u64()
        .unwrap_or_else(|| panic!("input `{key}` is not an integer"))
}

/// Parse an object output, which must be its own RFC 8785 form byte for byte
/// (bindings compare the text, not only the parsed value).
fn json_of(text: String) -> Value {
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(to_jcs(&v), text, "output is not canonical JSON");
    v
}

/// What the core gives for a case, in the vectors' `expect` shape.
fn actual(op: &str, input: &Value) -> Value {
    let keys: BTreeSet<&str> = input
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // Inputs an op may leave out: checked by the api, not listed below.
    let optional: &[&str] = match op {
        "key_pool_select" => &["affinity", "snapshot"],
        "key_pool_record" => &["snapshot", "status"],
        "admission_admit" => &["tenant"],
        _ => &[],
    };
    let keys: BTreeSet<&str> = keys.into_iter().filter(|k| !optional.contains(k)).collect();
    let want: &[&str] = match op {
        "key_pool_select" => &["config", "now_epoch_ms"],
        "key_pool_record" => &["config", "key_sha256", "now_epoch_ms", "outcome"],
        "key_sha256" => &["secret"],
        "check_idempotency_header" => &["raw"],
        "http_request_sha256" => &["body", "method", "target"],
        "http_response_sha256" => &["body", "headers", "status"],
        "validate_policy" => &["policy"],
        "plan_next" | "evaluate" => &["attempts", "policy"],
        "verify_bundle" => &["bundle"],
        "digest" => &["document"],
        "parse_retry_after" => &["cap_ms", "header", "now_unix_ms", "value"],
        "classify_http" => &["observation"],
        "judge" => &["facts"],
        "next_repair" => &[
            "idempotency_key_sha256",
            "links",
            "request_sha256",
            "started_at_ms",
        ],
        "verify_repair_chain" => &["chain"],
        "canonical_request" | "request_sha256" => &["request"],
        "build_policy" => &["request", "spec"],
        "bind_policy_template" => &["idempotency_key_sha256", "request", "spec"],
        "lift_request" => &["call", "params"],
        "lower_request" => &["options", "release", "request"],
        "route_capabilities" => &["request", "spec"],
        "check_price_schedule" => &["policy", "schedule"],
        "price_cost" => &["route_release_sha256", "schedule", "usage"],
        "stream_session" => &["policy", "script"],
        "job_session" => &["policy", "script"],
        "priced_session" => &["policy", "schedule", "script"],
        "hedge_session" => &["policy", "script"],
        "fleet_session" => &["policy", "script", "store"],
        "machine" if input.get("journal").is_some() => &["events", "journal", "options", "policy"],
        "machine" => &["events", "options", "policy"],
        "breaker_admit" | "budget_deposit" | "budget_withdraw" => {
            &["config", "now_epoch_ms", "snapshot"]
        }
        "breaker_record" => &["config", "now_epoch_ms", "outcome", "probe", "snapshot"],
        "admission_admit" => &[
            "config",
            "now_epoch_ms",
            "queued_since_epoch_ms",
            "snapshot",
            "tokens",
        ],
        "admission_release" if input.get("used").is_some() => {
            &["config", "now_epoch_ms", "reserved", "snapshot", "used"]
        }
        "admission_release" => &["config", "now_epoch_ms", "reserved", "snapshot"],
        "admission_observe" => &["config", "headers", "now_epoch_ms", "snapshot"],
        "journal_verify" => &["events", "policy"],
        "journal_recover" if input.get("reconciliation").is_some() => {
            &["events", "policy", "reconciliation"]
        }
        "journal_recover" => &["events", "policy"],
        "journal_append" => &["entry", "events", "lease_generation", "policy"],
        "journal_classify" => &["event", "events", "policy"],
        "idempotency_claim" if input.get("record").is_some() => {
            &["now_epoch_ms", "record", "request", "retention"]
        }
        "idempotency_claim" => &["now_epoch_ms", "request", "retention"],
        "idempotency_complete" => &["completion", "now_epoch_ms", "record", "retention"],
        "idempotency_key_sha256" => match (input.get("tenant"), input.get("operation")) {
            (Some(_), Some(_)) => &["key", "operation", "tenant"],
            (Some(_), None) => &["key", "tenant"],
            (None, Some(_)) => &["key", "operation"],
            (None, None) => &["key"],
        },
        other => panic!("unknown op `{other}`"),
    };
    assert_eq!(
        keys,
        want.iter().copied().collect(),
        "input keys of a `{op}` case"
    );
    let r = match op {
        "validate_policy" => api::validate_policy(s(input, "policy")).map(Value::String),
        "plan_next" => api::plan_next(s(input, "policy"), s(input, "attempts")).map(json_of),
        "evaluate" => api::evaluate(s(input, "policy"), s(input, "attempts")).map(json_of),
        "verify_bundle" => api::verify(s(input, "bundle")).map(json_of),
        "digest" => api::digest(s(input, "document")).map(Value::String),
        "parse_retry_after" => api::parse_retry_after(
            s(input, "header"),
            s(input, "value"),
            n(input, "now_unix_ms"),
            n(input, "cap_ms"),
        )
        .map(Value::from),
        "judge" => api::judge(s(input, "facts")).map(json_of),
        "next_repair" => api::next_repair(
            s(input, "links"),
            s(input, "request_sha256"),
            s(input, "idempotency_key_sha256"),
            n(input, "started_at_ms"),
        )
        .map(json_of),
        "verify_repair_chain" => api::verify_repair_chain(s(input, "chain")).map(json_of),
        "canonical_request" => api::canonical_request(s(input, "request")).map(Value::String),
        "build_policy" => api::build_policy(s(input, "request"), s(input, "spec")).map(json_of),
        "bind_policy_template" => api::compile_policy_template(s(input, "spec"))
            .and_then(|t| {
                api::bind_policy_template(
                    &t,
                    s(input, "request"),
                    s(input, "idempotency_key_sha256"),
                )
            })
            .map(|b| json!({"policy": json_of(b.policy_json), "policy_sha256": b.policy_sha256})),
        "lift_request" => api::lift_request(s(input, "call"), s(input, "params")).map(json_of),
        "lower_request" => api::lower_request(
            s(input, "request"),
            s(input, "release"),
            s(input, "options"),
        )
        .map(json_of),
        "route_capabilities" => {
            api::route_capabilities(s(input, "request"), s(input, "spec")).map(json_of)
        }
        "check_price_schedule" => {
            api::check_price_schedule(s(input, "policy"), s(input, "schedule")).map(Value::String)
        }
        "price_cost" => api::price_cost(
            s(input, "schedule"),
            s(input, "route_release_sha256"),
            s(input, "usage"),
        )
        .map(Value::from),
        "request_sha256" => api::request_sha256(s(input, "request")).map(Value::String),
        "stream_session" => lab::stream_session(s(input, "policy"), s(input, "script")),
        "hedge_session" => retryledger_core::hedge::script(s(input, "policy"), s(input, "script")),
        "job_session" => lab::job_session(s(input, "policy"), s(input, "script")),
        "priced_session" => {
            lab::priced_session(s(input, "policy"), s(input, "schedule"), s(input, "script"))
        }
        "fleet_session" => {
            lab::fleet_session(s(input, "policy"), s(input, "store"), s(input, "script"))
        }
        "machine" => api::machine_transcript(
            s(input, "policy"),
            s(input, "options"),
            input.get("journal").and_then(Value::as_str),
            s(input, "events"),
        )
        .map(json_of),
        "key_pool_select" => api::key_pool_select(
            s(input, "config"),
            input.get("snapshot").and_then(Value::as_str),
            n(input, "now_epoch_ms"),
            input.get("affinity").and_then(Value::as_str),
        )
        .map(json_of),
        "key_pool_record" => api::key_pool_record(
            s(input, "config"),
            input.get("snapshot").and_then(Value::as_str),
            s(input, "key_sha256"),
            s(input, "outcome"),
            input.get("status").and_then(Value::as_u64),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "key_sha256" => api::key_sha256(s(input, "secret")).map(Value::String),
        "check_idempotency_header" => {
            api::check_idempotency_header(s(input, "raw")).map(|()| Value::Null)
        }
        "http_request_sha256" => Ok(Value::String(api::http_request_sha256(
            s(input, "method"),
            s(input, "target"),
            s(input, "body").as_bytes(),
        ))),
        "http_response_sha256" => api::http_response_sha256(
            n(input, "status"),
            s(input, "headers"),
            s(input, "body").as_bytes(),
        )
        .map(Value::String),
        "breaker_admit" => api::breaker_admit(
            s(input, "config"),
            s(input, "snapshot"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "breaker_record" => api::breaker_record(
            s(input, "config"),
            s(input, "snapshot"),
            input["probe"].as_bool().unwrap(),
            s(input, "outcome"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "admission_admit" => api::admission_admit(
            s(input, "config"),
            s(input, "snapshot"),
            n(input, "now_epoch_ms"),
            n(input, "queued_since_epoch_ms"),
            n(input, "tokens"),
            input.get("tenant").and_then(Value::as_str),
        )
        .map(json_of),
        "admission_release" => api::admission_release(
            s(input, "config"),
            s(input, "snapshot"),
            n(input, "now_epoch_ms"),
            n(input, "reserved"),
            input.get("used").and_then(Value::as_u64),
        )
        .map(json_of),
        "admission_observe" => api::admission_observe(
            s(input, "config"),
            s(input, "snapshot"),
            s(input, "headers"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "budget_deposit" => api::budget_deposit(
            s(input, "config"),
            s(input, "snapshot"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "budget_withdraw" => api::budget_withdraw(
            s(input, "config"),
            s(input, "snapshot"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "journal_verify" => {
            api::journal_verify(s(input, "policy"), s(input, "events")).map(json_of)
        }
        "journal_recover" => api::journal_recover(
            s(input, "policy"),
            s(input, "events"),
            input.get("reconciliation").and_then(Value::as_str),
        )
        .map(json_of),
        "journal_append" => api::journal_append(
            s(input, "policy"),
            s(input, "events"),
            n(input, "lease_generation"),
            s(input, "entry"),
        )
        .map(json_of),
        "journal_classify" => {
            api::journal_classify(s(input, "policy"), s(input, "events"), s(input, "event"))
                .map(json_of)
        }
        "idempotency_claim" => api::idempotency_claim(
            s(input, "retention"),
            input.get("record").and_then(Value::as_str),
            s(input, "request"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "idempotency_complete" => api::idempotency_complete(
            s(input, "retention"),
            s(input, "record"),
            s(input, "completion"),
            n(input, "now_epoch_ms"),
        )
        .map(json_of),
        "idempotency_key_sha256" => api::idempotency_key_sha256(
            s(input, "key"),
            input.get("tenant").and_then(Value::as_str),
            input.get("operation").and_then(Value::as_str),
        )
        .map(Value::String),
        _ => api::classify_http(s(input, "observation")).map(json_of),
    };
    match r {
        Ok(v) => json!({ "ok": v }),
        Err(e) => match e.path {
            Some(p) => json!({"error": {"code": e.code.as_str(), "path": p}}),
            None => json!({"error": {"code": e.code.as_str()}}),
        },
    }
}

#[test]
fn every_vector_gives_its_expected_result() {
    let mut total = 0usize;
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    let files = files();
    assert!(files.len() >= 8, "expected one file per family");
    for (stem, doc) in &files {
        assert_eq!(doc["schema"], "retryledger.vectors.v1", "{stem}");
        assert_eq!(doc["family"], stem.as_str(), "family names its file");
        assert!(doc["description"].as_str().is_some_and(|d| !d.is_empty()));
        let cases = doc["cases"].as_array().unwrap();
        assert!(!cases.is_empty(), "{stem} has cases");
        for case in cases {
            let name = case["name"].as_str().unwrap();
            assert!(names.insert(name.to_owned()), "case name `{name}` repeats");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'_'
                    || b == b'-'),
                "case name `{name}` is snake or kebab case"
            );
            let expect = &case["expect"];
            if case["op"] == "drive" {
                // Driver scripts are replayed by the TypeScript and Python
                // drivers; here their sealed attempts must evaluate to the
                // pinned receipt digest and terminal.
                if let Some(attempts) = expect.get("attempts") {
                    let policy = s(&case["input"], "policy");
                    let receipt = api::evaluate(policy, &attempts.to_string()).unwrap();
                    let got = retryledger_core::canonical::sha256_hex(receipt.as_bytes());
                    if expect["receipt_sha256"] != json!(got)
                        || json_of(receipt)["terminal"] != expect["terminal"]
                    {
                        failures.push(format!("{stem}/{name}: receipt differs"));
                    }
                }
                total += 1;
                continue;
            }
            let kinds = expect.as_object().unwrap().len();
            assert_eq!(kinds, 1, "{name}: expect holds `ok` or `error`");
            let got = actual(case["op"].as_str().unwrap(), &case["input"]);
            if &got != expect {
                failures.push(format!(
                    "{stem}/{name}: expected {:.200}, got {:.200}",
                    expect.to_string(),
                    got.to_string()
                ));
            }
            total += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(total >= 150, "only {total} vectors");
}

#[test]
fn every_error_code_has_a_vector() {
    let mut seen = BTreeSet::new();
    for (_, doc) in files() {
        for case in doc["cases"].as_array().unwrap() {
            let expect = &case["expect"];
            if case["op"] == "drive" {
                continue; // a driver's error code is a terminal or a driver error
            }
            if let Some(code) = expect.pointer("/error/code").and_then(Value::as_str) {
                seen.insert(code.to_owned());
            }
            // A machine's refused event is part of its transcript.
            if let Some(code) = expect.pointer("/ok/error/code").and_then(Value::as_str) {
                seen.insert(code.to_owned());
            }
            // An admission's reason (`tenant_over_share`) is a code too.
            if let Some(code) = expect.pointer("/ok/answer/reason").and_then(Value::as_str) {
                seen.insert(code.to_owned());
            }
            if expect.pointer("/ok/kind") == Some(&json!("drift")) {
                if let Some(code) = expect.pointer("/ok/code").and_then(Value::as_str) {
                    seen.insert(code.to_owned());
                }
            }
        }
    }
    let missing: Vec<&str> = ErrorCode::ALL
        .iter()
        .filter(|c| !NOT_IN_VECTORS.contains(c))
        .map(|c| c.as_str())
        .filter(|c| !seen.contains(*c))
        .collect();
    assert!(missing.is_empty(), "codes without a vector: {missing:?}");
    let known: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    for code in &seen {
        assert!(known.contains(code.as_str()), "unknown code `{code}`");
    }
}

#[test]
fn input_too_large_for_every_document_operation() {
    let reference = lab::reference_policy().to_string();
    // Exactly the limit passes the size check: the padded policy is the reference.
    let mut at_limit = reference.clone();
    at_limit.push_str(&" ".repeat(MAX_INPUT_BYTES - reference.len()));
    assert_eq!(at_limit.len(), MAX_INPUT_BYTES);
    assert_eq!(
        api::validate_policy(&at_limit).unwrap(),
        api::validate_policy(&reference).unwrap()
    );
    // One byte more, however it is spent (ASCII or multi-byte), is refused.
    let mut over = at_limit.clone();
    over.push(' ');
    let mut over_multibyte = reference.clone();
    let pad = (MAX_INPUT_BYTES - reference.len()) / 2 + 1;
    over_multibyte.insert_str(
        over_multibyte.len() - 1,
        &format!(",\"x\":\"{}\"", "\u{e9}".repeat(pad)),
    );
    assert!(over_multibyte.chars().count() < MAX_INPUT_BYTES);
    for text in [&over, &over_multibyte] {
        assert!(text.len() > MAX_INPUT_BYTES);
        let codes = [
            api::validate_policy(text).map(|_| ()),
            api::plan_next(text, "{}").map(|_| ()),
            api::plan_next(&reference, text).map(|_| ()),
            api::evaluate(text, "{}").map(|_| ()),
            api::evaluate(&reference, text).map(|_| ()),
            api::digest(text).map(|_| ()),
            api::classify_http(text).map(|_| ()),
        ];
        for r in codes {
            let e = r.unwrap_err();
            assert_eq!((e.code, e.path), (ErrorCode::InputTooLarge, None));
        }
        // A bundle may carry a long stream event log: its own, larger limit.
        assert_ne!(
            api::verify(text).unwrap_err().code,
            ErrorCode::InputTooLarge
        );
    }
    let over_bundle = " ".repeat(retryledger_core::limits::MAX_BUNDLE_BYTES + 1);
    let e = api::verify(&over_bundle).unwrap_err();
    assert_eq!((e.code, e.path), (ErrorCode::InputTooLarge, None));
}

#[test]
fn arithmetic_overflow_through_the_typed_api() {
    // Decoded documents cannot reach it (every integer is at most 2^53 - 1 and
    // the run stops once spent cost exceeds the maximum); typed values can.
    let mut policy: Policy = retryledger_core::decode::from_value(lab::reference_policy()).unwrap();
    policy.max_total_cost = u64::MAX;
    for route in &mut policy.routes {
        route.reserve_cost = 0;
    }
    let unavailable = Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    };
    // A host recording the run step by step is refused at the overflowing attempt...
    let e = lab::simulate(
        &policy,
        &[
            Step::new(unavailable, 10, u64::MAX - 1),
            Step::new(unavailable, 10, 2),
        ],
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.attempt_index),
        (ErrorCode::ArithmeticOverflow, Some(1))
    );
    // ...and so is a replay of an attempts list that holds it.
    let mut attempts = lab::simulate(&policy, &[Step::new(unavailable, 10, u64::MAX - 1)]).unwrap();
    let mut second = attempts.attempts[0].clone();
    second.ordinal = 2;
    second.route_ordinal = 2;
    second.started_at_ms = 110; // completed at 10, base backoff 100 ms
    second.completed_at_ms = 120;
    second.cost = 2;
    attempts.attempts.push(second);
    let e = evaluate(&compile(policy).unwrap(), &attempts).unwrap_err();
    assert_eq!(
        (e.code, e.attempt_index, e.path.as_deref()),
        (
            ErrorCode::ArithmeticOverflow,
            Some(1),
            Some("/attempts/1/cost")
        )
    );
}

#[test]
fn the_exempt_codes_are_exactly_those_without_vectors() {
    // If a vector ever reaches an exempt code, the exemption is stale.
    for (_, doc) in files() {
        for case in doc["cases"].as_array().unwrap() {
            if let Some(code) = case["expect"]
                .pointer("/error/code")
                .and_then(Value::as_str)
            {
                assert!(
                    NOT_IN_VECTORS.iter().all(|c| c.as_str() != code),
                    "`{code}` now has a vector; drop its exemption"
                );
            }
        }
    }
}

/// A built policy carries the digests of the documents its spec names.
#[test]
fn built_policies_carry_the_digests_of_their_documents() {
    let mut checked = 0;
    for (_, doc) in files() {
        for case in doc["cases"].as_array().unwrap() {
            let Some(policy) = case["expect"]
                .get("ok")
                .filter(|_| case["op"] == "build_policy")
            else {
                continue;
            };
            let input = &case["input"];
            let spec: Value = serde_json::from_str(s(input, "spec")).unwrap();
            assert_eq!(
                policy["logical_request_sha256"],
                json!(api::request_sha256(s(input, "request")).unwrap())
            );
            // A preset spec's class and short routes' releases are defaults
            // (their digests: the preset vectors and core/tests/template.rs).
            let class = spec.get("behavior_class").cloned().unwrap_or_else(
                || json!({"name": "text-chat@1", "schema": "retryledger.behavior_class.v1"}),
            );
            assert_eq!(
                policy["behavior_class_sha256"],
                json!(api::digest(&class.to_string()).unwrap())
            );
            // Routes that cannot serve the request are left out (lowering.json):
            // the others keep their order, prioritized from 0.
            let built_routes = policy["routes"].as_array().unwrap();
            let kept: Vec<&Value> = spec["routes"]
                .as_array()
                .unwrap()
                .iter()
                // A preset route named by provider and model (no route_id)
                // carries no lowering settings: it is never left out.
                .filter(|r| {
                    r.get("route_id").is_none()
                        || built_routes.iter().any(|b| b["route_id"] == r["route_id"])
                })
                .collect();
            assert_eq!(kept.len(), built_routes.len());
            for (i, route) in kept.into_iter().enumerate() {
                let built = &built_routes[i];
                if let Some(id) = route.get("route_id") {
                    assert_eq!(&built["route_id"], id);
                }
                assert_eq!(built["priority"], json!(i));
                let release = route.get("release").cloned().unwrap_or_else(|| {
                    let mut r = json!({
                        "endpoint": route["base_url"],
                        "model": route["model"],
                        "provider": route["provider"],
                        "release_pin": route.get("release_pin").unwrap_or(&route["model"]),
                        "schema": "retryledger.route_release.v1",
                    });
                    let family = ["openai", "azure_openai", "anthropic", "google", "generic"];
                    if family.contains(&route["provider"].as_str().unwrap()) {
                        r["provider_family"] = route["provider"].clone();
                    }
                    r
                });
                assert_eq!(
                    built["route_release_sha256"],
                    json!(api::digest(&release.to_string()).unwrap())
                );
            }
            assert_eq!(
                api::validate_policy(&policy.to_string()).unwrap(),
                api::digest(&policy.to_string()).unwrap()
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} built policies");
}
