//! Conformance vectors: builds inputs from the lab's reference policy and run,
//! computes every expected output by calling `retryledger_core::api`, and
//! writes one JSON file per family plus a README into the directory given as
//! the only argument (`tests/vectors` in the repository).
//!
//! Each case also names what it is meant to show (`want`); the generator
//! refuses to write a case whose computed expectation does not contain it, so
//! a case cannot silently pin something other than its purpose.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    missing_docs,
    reason = "a generator: any unexpected value is a bug to fail on loudly"
)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use retryledger_core::api;
use retryledger_core::canonical::sha256_hex;
use retryledger_core::decode::from_value;
use retryledger_core::lab::{self, Step};
use retryledger_core::limits::{MAX_SAFE_INTEGER, MAX_SET_ITEMS};
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, Outcome, RetryableKind};
use retryledger_core::{seal, Policy};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

/// A named set of pointer edits and the code or terminal it must show.
type EditCase = (&'static str, Vec<(&'static str, Value)>, &'static str);
/// The same with owned pointers.
type DriftCase = (&'static str, Vec<(String, Value)>, &'static str);

/// One vector.
struct Case {
    name: String,
    op: &'static str,
    input: Vec<(&'static str, Value)>,
    expect: Value,
}

impl Serialize for Case {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("name", &self.name)?;
        m.serialize_entry("op", self.op)?;
        m.serialize_entry("input", &Ordered(&self.input))?;
        m.serialize_entry("expect", &self.expect)?;
        m.end()
    }
}

struct Ordered<'a>(&'a [(&'static str, Value)]);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

struct FamilyFile<'a> {
    family: &'a str,
    description: &'a str,
    cases: &'a [Case],
}

impl Serialize for FamilyFile<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("schema", "retryledger.vectors.v1")?;
        m.serialize_entry("family", self.family)?;
        m.serialize_entry("description", self.description)?;
        m.serialize_entry("cases", self.cases)?;
        m.end()
    }
}

/// A family of cases under construction.
struct Family {
    name: &'static str,
    description: &'static str,
    covers: &'static str,
    cases: Vec<Case>,
}

fn get<'a>(input: &'a [(&'static str, Value)], key: &str) -> &'a Value {
    input
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("input has no `{key}`"))
}

fn text<'a>(input: &'a [(&'static str, Value)], key: &str) -> &'a str {
    get(input, key).as_str().expect("a text input")
}

fn parsed(s: String) -> Value {
    serde_json::from_str(&s).expect("api output is JSON")
}

/// The expected result of an operation: what the api returns, as data.
fn compute(op: &str, input: &[(&'static str, Value)]) -> Value {
    let r: retryledger_core::Result<Value> = match op {
        "validate_policy" => api::validate_policy(text(input, "policy")).map(Value::String),
        "plan_next" => api::plan_next(text(input, "policy"), text(input, "attempts")).map(parsed),
        "evaluate" => api::evaluate(text(input, "policy"), text(input, "attempts")).map(parsed),
        "verify_bundle" => api::verify(text(input, "bundle")).map(parsed),
        "digest" => api::digest(text(input, "document")).map(Value::String),
        "parse_retry_after" => api::parse_retry_after(
            text(input, "header"),
            text(input, "value"),
            get(input, "now_unix_ms").as_u64().expect("now"),
            get(input, "cap_ms").as_u64().expect("cap"),
        )
        .map(Value::from),
        "classify_http" => api::classify_http(text(input, "observation")).map(parsed),
        other => panic!("unknown op {other}"),
    };
    match r {
        Ok(v) => json!({ "ok": v }),
        Err(e) => {
            let mut err = serde_json::Map::new();
            err.insert("code".into(), json!(e.code.as_str()));
            if let Some(p) = e.path {
                err.insert("path".into(), json!(p));
            }
            json!({ "error": err })
        }
    }
}

impl Family {
    fn new(name: &'static str, description: &'static str, covers: &'static str) -> Self {
        Self {
            name,
            description,
            covers,
            cases: Vec::new(),
        }
    }

    /// Add a case; `want` must occur in the computed expectation (as a JSON
    /// string, or `ok` / `error` for the outcome kind).
    fn add(&mut self, name: &str, op: &'static str, input: Vec<(&'static str, Value)>, want: &str) {
        let expect = compute(op, &input);
        let shown = expect.to_string();
        let matches = match want {
            "ok" => expect.get("ok").is_some(),
            "error" => expect.get("error").is_some(),
            w => shown.contains(&format!("\"{w}\"")) || shown.contains(&format!(":{w}")),
        };
        assert!(
            matches,
            "{}/{name}: expected to show `{want}`, computed {shown:.300}",
            self.name
        );
        self.cases.push(Case {
            name: name.to_owned(),
            op,
            input,
            expect,
        });
    }

    fn policy(&mut self, name: &str, policy: &str, want: &str) {
        self.add(
            name,
            "validate_policy",
            vec![("policy", json!(policy))],
            want,
        );
    }

    fn plan(&mut self, name: &str, policy: &str, attempts: &str, want: &str) {
        self.add(
            name,
            "plan_next",
            vec![("policy", json!(policy)), ("attempts", json!(attempts))],
            want,
        );
    }

    fn eval(&mut self, name: &str, policy: &str, attempts: &str, want: &str) {
        self.add(
            name,
            "evaluate",
            vec![("policy", json!(policy)), ("attempts", json!(attempts))],
            want,
        );
    }

    fn verify(&mut self, name: &str, bundle: &str, want: &str) {
        self.add(name, "verify_bundle", vec![("bundle", json!(bundle))], want);
    }

    fn digest(&mut self, name: &str, document: &str, want: &str) {
        self.add(name, "digest", vec![("document", json!(document))], want);
    }

    fn retry_after(
        &mut self,
        name: &str,
        header: &str,
        value: &str,
        now: u64,
        cap: u64,
        want: &str,
    ) {
        self.add(
            name,
            "parse_retry_after",
            vec![
                ("header", json!(header)),
                ("value", json!(value)),
                ("now_unix_ms", json!(now)),
                ("cap_ms", json!(cap)),
            ],
            want,
        );
    }

    fn classify(&mut self, name: &str, observation: &str, want: &str) {
        self.add(
            name,
            "classify_http",
            vec![("observation", json!(observation))],
            want,
        );
    }
}

// ---------------------------------------------------------------------------
// Builders

fn id(label: &str) -> String {
    sha256_hex(label.as_bytes())
}

/// Replace the value at a JSON Pointer, or add it to its parent object.
fn set(v: &mut Value, pointer: &str, new: Value) {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = new;
        return;
    }
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let obj = v
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("no object at {parent}"));
    obj.insert(key.to_owned(), new);
}

fn remove(v: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let removed = v
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove(key));
    assert!(removed.is_some(), "nothing at {pointer}");
}

fn edited(base: &Value, edits: &[(&str, Value)]) -> Value {
    let mut v = base.clone();
    for (p, new) in edits {
        set(&mut v, p, new.clone());
    }
    v
}

fn t(v: &Value) -> String {
    serde_json::to_string(v).expect("json")
}

fn reference() -> Value {
    lab::reference_policy()
}

fn policy_with(edits: &[(&str, Value)]) -> Value {
    edited(&reference(), edits)
}

/// Simulate a script against a policy value; the attempts document as a value.
fn run(policy: &Value, steps: &[Step]) -> Value {
    let p: Policy = from_value(policy.clone()).expect("a decodable policy");
    let attempts = lab::simulate(&p, steps).expect("a valid policy");
    retryledger_core::canonical::to_value(&attempts)
}

fn sealed(policy: &Value, attempts: &Value) -> Value {
    let p: Policy = from_value(policy.clone()).expect("policy");
    let a = from_value(attempts.clone()).expect("attempts");
    retryledger_core::canonical::to_value(&seal(&p, &a).expect("a finished run"))
}

fn empty_attempts() -> Value {
    json!({"attempts": [], "schema": "retryledger.attempts.v1"})
}

fn truncated(attempts: &Value, n: usize) -> Value {
    let mut v = attempts.clone();
    v["attempts"].as_array_mut().expect("list").truncate(n);
    v
}

fn success() -> Outcome {
    Outcome::Success
}
fn rl(ms: u64) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: Some(ms),
    }
}
fn down() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
    }
}
fn timeout() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::TimeoutBeforeResponse,
        retry_after_ms: None,
    }
}
fn s(outcome: Outcome, duration: u64, cost: u64) -> Step {
    Step::new(outcome, duration, cost)
}
fn lagged(outcome: Outcome, duration: u64, cost: u64, lag: u64) -> Step {
    Step {
        start_lag_ms: lag,
        ..Step::new(outcome, duration, cost)
    }
}

/// A one-route policy that allows many attempts with the given backoff.
fn single_route(max_attempts: u64, base: u64, max: u64, cap: u64, deadline: u64) -> Value {
    let mut p = reference();
    let routes = p["routes"].as_array_mut().expect("routes");
    routes.truncate(1);
    set(&mut p, "/routes/0/max_attempts", json!(max_attempts));
    set(&mut p, "/routes/0/reserve_cost", json!(0));
    set(&mut p, "/max_total_attempts", json!(max_attempts));
    set(&mut p, "/deadline_ms", json!(deadline));
    set(
        &mut p,
        "/backoff",
        json!({"base_ms": base, "max_ms": max, "retry_after_cap_ms": cap}),
    );
    p
}

fn jitter(mode: &str, seed: u64) -> Value {
    if mode == "none" {
        json!({"mode": "none"})
    } else {
        json!({"mode": mode, "scheduler_release": "sched-2026.12", "seed": seed})
    }
}

const MODES: [&str; 4] = ["none", "full", "equal", "decorrelated"];

// ---------------------------------------------------------------------------
// Families

fn policy_family() -> Family {
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

fn decode_family() -> Family {
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

fn plan_family() -> Family {
    let mut f = Family::new(
        "plan",
        "plan_next: every decision branch and terminal, the order of the checks, and drift in observed attempts.",
        "plan_next after every outcome kind, each terminal (completed, stop_non_retryable, stop_indeterminate, stop_total_attempts, stop_route_exhausted, stop_cost_budget spent and reserved, stop_deadline late and before dispatch, stop_cancelled), boundaries (cost equal to the maximum, reservation that exactly fits, completion one ms before the deadline), the check order (deadline before cost before outcome; total attempts before route exhaustion; reservation before deadline), and each drift code in its check order",
    );
    let r = reference();
    let pt = t(&r);
    let ref_attempts = run(&r, &lab::reference_steps());
    f.plan(
        "empty_run_dispatches_primary",
        &pt,
        &t(&empty_attempts()),
        "dispatch",
    );
    f.plan(
        "completed_on_primary",
        &pt,
        &t(&run(&r, &[s(success(), 300, 900)])),
        "completed",
    );
    f.plan("completed_on_fallback", &pt, &t(&ref_attempts), "completed");
    for (kind, outcome) in [
        ("timeout_before_response", timeout()),
        ("rate_limited", rl(250)),
        ("unavailable", down()),
    ] {
        f.plan(
            &format!("retryable_{kind}_dispatches_again"),
            &pt,
            &t(&run(&r, &[s(outcome, 200, 0)])),
            "dispatch",
        );
    }
    for (name, kind) in [
        ("rejected", NonRetryableKind::Rejected),
        ("policy_denied", NonRetryableKind::PolicyDenied),
        ("invalid_request", NonRetryableKind::InvalidRequest),
        ("protocol_violation", NonRetryableKind::ProtocolViolation),
        ("invalid_output", NonRetryableKind::InvalidOutput),
    ] {
        f.plan(
            &format!("non_retryable_{name}_stops"),
            &pt,
            &t(&run(&r, &[s(Outcome::NonRetryable { kind }, 200, 0)])),
            "stop_non_retryable",
        );
    }
    for (name, kind) in [
        (
            "unknown_provider_acceptance",
            IndeterminateKind::UnknownProviderAcceptance,
        ),
        (
            "stream_interrupted_after_output",
            IndeterminateKind::StreamInterruptedAfterOutput,
        ),
    ] {
        f.plan(
            &format!("indeterminate_{name}_stops"),
            &pt,
            &t(&run(&r, &[s(Outcome::Indeterminate { kind }, 200, 0)])),
            "stop_indeterminate",
        );
    }
    f.plan(
        "non_retryable_on_fallback_stops",
        &pt,
        &t(&run(
            &r,
            &[
                s(down(), 10, 0),
                s(down(), 10, 0),
                s(
                    Outcome::NonRetryable {
                        kind: NonRetryableKind::InvalidOutput,
                    },
                    10,
                    0,
                ),
            ],
        )),
        "stop_non_retryable",
    );
    f.plan(
        "indeterminate_after_retry_stops",
        &pt,
        &t(&run(
            &r,
            &[
                s(rl(250), 1_100, 0),
                s(
                    Outcome::Indeterminate {
                        kind: IndeterminateKind::UnknownProviderAcceptance,
                    },
                    100,
                    0,
                ),
            ],
        )),
        "stop_indeterminate",
    );
    let two_total = policy_with(&[("/max_total_attempts", json!(2))]);
    f.plan(
        "stop_total_attempts",
        &t(&two_total),
        &t(&run(&two_total, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "stop_total_attempts",
    );
    let one_fallback = policy_with(&[("/routes/1/max_attempts", json!(1))]);
    let three_down = [s(down(), 10, 0), s(down(), 10, 0), s(down(), 10, 0)];
    f.plan(
        "stop_route_exhausted",
        &t(&one_fallback),
        &t(&run(&one_fallback, &three_down)),
        "stop_route_exhausted",
    );
    let three_total = policy_with(&[
        ("/routes/1/max_attempts", json!(1)),
        ("/max_total_attempts", json!(3)),
    ]);
    f.plan(
        "order_total_attempts_before_route_exhaustion",
        &t(&three_total),
        &t(&run(&three_total, &three_down)),
        "stop_total_attempts",
    );
    f.plan(
        "stop_cost_budget_spent",
        &pt,
        &t(&run(&r, &[s(success(), 100, 10_001)])),
        "stop_cost_budget",
    );
    f.plan(
        "cost_equal_to_maximum_completes",
        &pt,
        &t(&run(&r, &[s(success(), 100, 10_000)])),
        "completed",
    );
    let tight = policy_with(&[("/max_total_cost", json!(2_500))]);
    f.plan(
        "stop_cost_budget_reservation",
        &t(&tight),
        &t(&run(&tight, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "stop_cost_budget",
    );
    let exact = policy_with(&[("/max_total_cost", json!(3_000))]);
    f.plan(
        "reservation_that_exactly_fits_dispatches",
        &t(&exact),
        &t(&run(&exact, &[s(down(), 10, 0), s(down(), 10, 0)])),
        "dispatch",
    );
    let tiny = policy_with(&[("/max_total_cost", json!(1_000))]);
    f.plan(
        "stop_cost_budget_before_first_dispatch",
        &t(&tiny),
        &t(&empty_attempts()),
        "stop_cost_budget",
    );
    f.plan(
        "stop_deadline_late_success",
        &t(&policy_with(&[("/deadline_ms", json!(2_300))])),
        &t(&ref_attempts),
        "stop_deadline",
    );
    f.plan(
        "completion_at_deadline_stops",
        &t(&policy_with(&[("/deadline_ms", json!(300))])),
        &t(&run(&r, &[s(success(), 300, 0)])),
        "stop_deadline",
    );
    f.plan(
        "completion_one_ms_before_deadline_completes",
        &t(&policy_with(&[("/deadline_ms", json!(301))])),
        &t(&run(&r, &[s(success(), 300, 0)])),
        "completed",
    );
    let d1600 = policy_with(&[("/deadline_ms", json!(1_600))]);
    f.plan(
        "stop_deadline_before_dispatch",
        &t(&d1600),
        &t(&run(&d1600, &lab::reference_steps())),
        "stop_deadline",
    );
    let d1651 = policy_with(&[("/deadline_ms", json!(1_651))]);
    f.plan(
        "not_before_one_ms_before_deadline_dispatches",
        &t(&d1651),
        &t(&run(&d1651, &lab::reference_steps()[..2])),
        "dispatch",
    );
    let d1650 = policy_with(&[("/deadline_ms", json!(1_650))]);
    f.plan(
        "not_before_at_deadline_stops",
        &t(&d1650),
        &t(&run(&d1650, &lab::reference_steps()[..2])),
        "stop_deadline",
    );
    f.plan(
        "order_deadline_before_cost",
        &pt,
        &t(&run(&r, &[s(success(), 6_000, 20_000)])),
        "stop_deadline",
    );
    f.plan(
        "order_cost_before_outcome",
        &pt,
        &t(&run(
            &r,
            &[s(
                Outcome::NonRetryable {
                    kind: NonRetryableKind::Rejected,
                },
                100,
                20_000,
            )],
        )),
        "stop_cost_budget",
    );
    let both = policy_with(&[
        ("/max_total_cost", json!(2_000)),
        ("/deadline_ms", json!(300)),
    ]);
    f.plan(
        "order_reservation_before_deadline",
        &t(&both),
        &t(&run(&both, &[s(rl(5_000), 100, 600)])),
        "stop_cost_budget",
    );
    let mut cancelled = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancelled, "/cancelled_at_ms", json!(1_200));
    f.plan(
        "stop_cancelled_while_waiting",
        &pt,
        &t(&cancelled),
        "stop_cancelled",
    );
    let mut cancel_at_completion = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancel_at_completion, "/cancelled_at_ms", json!(1_100));
    f.plan(
        "cancelled_at_last_completion",
        &pt,
        &t(&cancel_at_completion),
        "stop_cancelled",
    );
    let mut cancel_empty = empty_attempts();
    set(&mut cancel_empty, "/cancelled_at_ms", json!(0));
    f.plan(
        "cancelled_before_any_attempt",
        &pt,
        &t(&cancel_empty),
        "stop_cancelled",
    );

    let generic = id("behavior: generic summary v1");
    let degraded = policy_with(&[
        ("/routes/1/behavior_class_sha256", json!(generic)),
        ("/allowed_degraded_behavior_classes", json!([generic])),
    ]);
    f.plan(
        "fallback_to_allowed_degraded_route",
        &t(&degraded),
        &t(&run(&degraded, &lab::reference_steps()[..2])),
        "external-fallback",
    );
    let mut three = r.clone();
    let mut third = r["routes"][1].clone();
    set(&mut third, "/route_id", json!("external-tertiary"));
    set(&mut third, "/priority", json!(2));
    set(&mut third, "/max_attempts", json!(1));
    set(
        &mut third,
        "/route_release_sha256",
        json!(id("release: external-tertiary")),
    );
    set(&mut three, "/max_total_attempts", json!(6));
    set(&mut three, "/max_total_cost", json!(100_000));
    three["routes"].as_array_mut().expect("routes").push(third);
    let four_down = [
        s(down(), 10, 0),
        s(down(), 10, 0),
        s(down(), 10, 0),
        s(down(), 10, 0),
    ];
    f.plan(
        "second_fallback_after_two_routes_exhausted",
        &t(&three),
        &t(&run(&three, &four_down)),
        "external-tertiary",
    );
    f.plan(
        "start_lag_schedules_from_completion",
        &pt,
        &t(&run(&r, &[lagged(rl(250), 100, 0, 700)])),
        "dispatch",
    );

    // Drift, each alone, on the reference run; then the check order.
    let ra = &ref_attempts;
    let other_request = id("request: another prompt");
    let drifts: Vec<DriftCase> = vec![
        (
            "drift_route",
            vec![("/attempts/1/route_id".into(), json!("external-fallback"))],
            "route_drift",
        ),
        (
            "drift_release",
            vec![(
                "/attempts/1/route_release_sha256".into(),
                json!(id("release: other")),
            )],
            "release_drift",
        ),
        (
            "drift_ordinal",
            vec![("/attempts/1/ordinal".into(), json!(5))],
            "ordinal_drift",
        ),
        (
            "drift_route_ordinal",
            vec![("/attempts/1/route_ordinal".into(), json!(1))],
            "route_ordinal_drift",
        ),
        (
            "drift_logical_request",
            vec![(
                "/attempts/2/logical_request_sha256".into(),
                json!(other_request),
            )],
            "logical_request_drift",
        ),
        (
            "drift_idempotency_key",
            vec![(
                "/attempts/2/idempotency_key_sha256".into(),
                json!(id("idempotency-key: fresh")),
            )],
            "idempotency_key_drift",
        ),
        (
            "drift_early_start",
            vec![("/attempts/1/started_at_ms".into(), json!(1_349))],
            "early_start",
        ),
        (
            "start_exactly_at_not_before_is_fine",
            vec![("/attempts/1/started_at_ms".into(), json!(1_350))],
            "completed",
        ),
        (
            "drift_completed_before_started",
            vec![("/attempts/2/completed_at_ms".into(), json!(1_649))],
            "completed_before_started",
        ),
        (
            "drift_jitter_sample_unexpected",
            vec![("/attempts/1/jitter_sample_ms".into(), json!(100))],
            "jitter_sample_unexpected",
        ),
        (
            "order_route_before_ordinal",
            vec![
                ("/attempts/1/route_id".into(), json!("external-fallback")),
                ("/attempts/1/ordinal".into(), json!(9)),
            ],
            "route_drift",
        ),
        (
            "order_release_before_ordinal",
            vec![
                (
                    "/attempts/1/route_release_sha256".into(),
                    json!(id("release: other")),
                ),
                ("/attempts/1/ordinal".into(), json!(9)),
            ],
            "release_drift",
        ),
        (
            "order_ordinal_before_route_ordinal",
            vec![
                ("/attempts/1/ordinal".into(), json!(9)),
                ("/attempts/1/route_ordinal".into(), json!(9)),
            ],
            "ordinal_drift",
        ),
        (
            "order_identity_before_timing",
            vec![
                (
                    "/attempts/1/idempotency_key_sha256".into(),
                    json!(id("idempotency-key: fresh")),
                ),
                ("/attempts/1/started_at_ms".into(), json!(0)),
            ],
            "idempotency_key_drift",
        ),
        (
            "order_early_start_before_completion",
            vec![
                ("/attempts/1/started_at_ms".into(), json!(1_000)),
                ("/attempts/1/completed_at_ms".into(), json!(900)),
            ],
            "early_start",
        ),
        (
            "first_drift_wins",
            vec![
                ("/attempts/0/ordinal".into(), json!(3)),
                ("/attempts/2/route_id".into(), json!("private-primary")),
            ],
            "/attempts/0/ordinal",
        ),
    ];
    for (name, edits, want) in drifts {
        let edits: Vec<(&str, Value)> =
            edits.iter().map(|(p, v)| (p.as_str(), v.clone())).collect();
        f.plan(name, &pt, &t(&edited(ra, &edits)), want);
    }
    let mut after = ref_attempts.clone();
    let extra = {
        let mut a = after["attempts"][2].clone();
        set(&mut a, "/ordinal", json!(4));
        a
    };
    after["attempts"].as_array_mut().expect("list").push(extra);
    f.plan(
        "drift_attempt_after_terminal",
        &pt,
        &t(&after),
        "attempt_after_terminal",
    );
    let mut cancel_after_terminal = ref_attempts.clone();
    set(&mut cancel_after_terminal, "/cancelled_at_ms", json!(3_000));
    f.plan(
        "drift_cancel_after_terminal",
        &pt,
        &t(&cancel_after_terminal),
        "cancel_drift",
    );
    let mut cancel_early = run(&r, &lab::reference_steps()[..1]);
    set(&mut cancel_early, "/cancelled_at_ms", json!(1_099));
    f.plan(
        "drift_cancel_before_last_completion",
        &pt,
        &t(&cancel_early),
        "cancel_drift",
    );
    f.plan(
        "invalid_policy_is_reported_first",
        &t(&policy_with(&[("/retry_owner", json!("adapter"))])),
        "{",
        "retry_owner_not_harness",
    );
    f
}

fn schedule_family() -> Family {
    let mut f = Family::new(
        "schedule",
        "The schedule rules through plan_next: capped exponential backoff, the bounded Retry-After floor, the route change, saturation and the deadline, with DESIGN's worked numbers.",
        "DESIGN's worked numbers (reference run: completion 1,100 -> earliest start 1,350 -> completion 1,450 -> fallback earliest start 1,650; base 200 / max 1,500: delays 200, 400, 800, 1,500, 1,500; a 1,200 ms hint on attempt 2 gives 1,200), the hint below the exponential term, the hint above and at its cap, a zero hint, the fallback's delay from the failed attempt and its route ordinal reset, the start lag, zero-duration attempts, saturation of the shift at route ordinals 64 and 65, a huge base capped at the maximum, and delays that reach the deadline",
    );
    let r = reference();
    let pt = t(&r);
    let ra = run(&r, &lab::reference_steps());
    f.plan(
        "design_reference_first_dispatch_at_0",
        &pt,
        &t(&truncated(&ra, 0)),
        "dispatch",
    );
    f.plan(
        "design_reference_retry_after_250_gives_1350",
        &pt,
        &t(&truncated(&ra, 1)),
        "1350",
    );
    f.plan(
        "design_reference_fallback_base_gives_1650",
        &pt,
        &t(&truncated(&ra, 2)),
        "1650",
    );

    let p = single_route(6, 200, 1_500, 2_000, 100_000);
    let ptx = t(&p);
    let fails: Vec<Step> = (0..6).map(|_| s(down(), 10, 0)).collect();
    for (k, want) in [(1, "200"), (2, "400"), (3, "800"), (4, "1500"), (5, "1500")] {
        f.plan(
            &format!("design_base200_max1500_after_route_attempt_{k}"),
            &ptx,
            &t(&run(&p, &fails[..k])),
            want,
        );
    }
    f.plan(
        "design_hint_1200_on_attempt_2",
        &ptx,
        &t(&run(&p, &[s(down(), 10, 0), s(rl(1_200), 10, 0)])),
        "1200",
    );
    f.plan(
        "hint_below_exponential_term",
        &ptx,
        &t(&run(
            &p,
            &[s(down(), 10, 0), s(down(), 10, 0), s(rl(300), 10, 0)],
        )),
        "800",
    );
    f.plan(
        "hint_above_cap_is_capped",
        &ptx,
        &t(&run(&p, &[s(rl(60_000), 10, 0)])),
        "2000",
    );
    f.plan(
        "hint_at_cap",
        &ptx,
        &t(&run(&p, &[s(rl(2_000), 10, 0)])),
        "2000",
    );
    f.plan(
        "hint_zero",
        &ptx,
        &t(&run(&p, &[s(rl(0), 10, 0)])),
        "dispatch",
    );
    let nocap = single_route(6, 200, 1_500, 0, 100_000);
    f.plan(
        "cap_zero_ignores_hints",
        &t(&nocap),
        &t(&run(&nocap, &[s(rl(60_000), 10, 0)])),
        "200",
    );
    let hugecap = single_route(6, 200, 1_500, MAX_SAFE_INTEGER, MAX_SAFE_INTEGER);
    f.plan(
        "hint_at_2_pow_53_minus_1_uncapped",
        &t(&hugecap),
        &t(&run(&hugecap, &[s(rl(1_000_000_000_000), 10, 0)])),
        "1000000000010",
    );
    f.plan(
        "hint_huge_reaches_deadline",
        &t(&hugecap),
        &t(&run(&hugecap, &[s(rl(MAX_SAFE_INTEGER), 10, 0)])),
        "stop_deadline",
    );
    let one_primary = policy_with(&[("/routes/0/max_attempts", json!(1))]);
    f.plan(
        "fallback_delay_from_failed_attempt",
        &t(&one_primary),
        &t(&run(&one_primary, &[s(down(), 500, 0)])),
        "600",
    );
    f.plan(
        "fallback_route_ordinal_restarts_at_1",
        &t(&one_primary),
        &t(&run(&one_primary, &[s(down(), 500, 0), s(down(), 100, 0)])),
        "dispatch",
    );
    f.plan(
        "start_lag_delay_counts_from_completion",
        &ptx,
        &t(&run(
            &p,
            &[lagged(down(), 10, 0, 0), lagged(down(), 10, 0, 333)],
        )),
        "dispatch",
    );
    f.plan(
        "zero_duration_attempts",
        &ptx,
        &t(&run(&p, &[s(down(), 0, 0), s(down(), 0, 0)])),
        "dispatch",
    );
    let long = single_route(70, 1, 1_000, 0, MAX_SAFE_INTEGER);
    let many: Vec<Step> = (0..65).map(|_| s(down(), 1, 0)).collect();
    f.plan(
        "saturates_at_route_ordinal_64",
        &t(&long),
        &t(&run(&long, &many[..64])),
        "1000",
    );
    f.plan(
        "saturates_at_route_ordinal_65",
        &t(&long),
        &t(&run(&long, &many)),
        "1000",
    );
    let big = single_route(20, 1 << 52, MAX_SAFE_INTEGER, 0, MAX_SAFE_INTEGER);
    f.plan(
        "huge_base_dispatches_below_deadline",
        &t(&big),
        &t(&run(&big, &[s(down(), 1, 0)])),
        "dispatch",
    );
    f.plan(
        "exponential_capped_at_max_reaches_deadline",
        &t(&big),
        &t(&run(&big, &[s(down(), 1, 0), s(down(), 1, 0)])),
        "stop_deadline",
    );
    f
}

fn jitter_family() -> Family {
    let mut f = Family::new(
        "jitter",
        "Replayable jitter in every mode (none, full, equal, decorrelated): the interval, the seeded sample, the Retry-After floor over the sample, the deadline clamp, receipts, and jitter drift.",
        "plan_next and evaluate with jitter none/full/equal/decorrelated: the first dispatch has no draw, the interval of each mode ([0,e], [e/2,e], [base, min(max, 3*previous)]), the decorrelated chain over several attempts, other seeds and scheduler releases, the floor above the sample, the interval's upper end pulled below the deadline, full receipts, and the jitter drift codes (missing, unexpected, out of interval, other seed)",
    );
    let steps = lab::reference_steps();
    for mode in MODES {
        let p = policy_with(&[("/jitter", jitter(mode, 7))]);
        let a = run(&p, &steps);
        f.plan(
            &format!("{mode}_first_dispatch_has_no_draw"),
            &t(&p),
            &t(&truncated(&a, 0)),
            "dispatch",
        );
        f.plan(
            &format!("{mode}_after_rate_limit"),
            &t(&p),
            &t(&truncated(&a, 1)),
            "dispatch",
        );
        f.plan(
            &format!("{mode}_to_fallback"),
            &t(&p),
            &t(&truncated(&a, 2)),
            "dispatch",
        );
        f.eval(&format!("{mode}_receipt"), &t(&p), &t(&a), "completed");
    }
    for mode in ["full", "equal", "decorrelated"] {
        let mut p = single_route(8, 100, 5_000, 2_000, 1_000_000);
        set(&mut p, "/jitter", jitter(mode, 42));
        let fails: Vec<Step> = (0..7).map(|_| s(down(), 10, 0)).collect();
        for k in [3, 6] {
            f.plan(
                &format!("{mode}_chain_after_{k}_failures"),
                &t(&p),
                &t(&run(&p, &fails[..k])),
                "jitter_sample_ms",
            );
        }
        let mut other_seed = p.clone();
        set(&mut other_seed, "/jitter/seed", json!(MAX_SAFE_INTEGER));
        f.plan(
            &format!("{mode}_seed_2_pow_53_minus_1"),
            &t(&other_seed),
            &t(&run(&other_seed, &fails[..3])),
            "jitter_sample_ms",
        );
        let mut other_release = p.clone();
        set(
            &mut other_release,
            "/jitter/scheduler_release",
            json!("sched-2027.01"),
        );
        f.plan(
            &format!("{mode}_other_scheduler_release"),
            &t(&other_release),
            &t(&run(&other_release, &fails[..3])),
            "jitter_sample_ms",
        );
        f.plan(
            &format!("{mode}_floor_above_sample"),
            &t(&p),
            &t(&run(&p, &[s(rl(1_900), 10, 0)])),
            "1900",
        );
        // One failure completing at 10 ms: e = 100, so the interval's upper
        // end (100, or 300 for decorrelated) is pulled down to deadline - 11.
        let mut near = p.clone();
        let deadline = if mode == "decorrelated" { 211 } else { 91 };
        set(&mut near, "/deadline_ms", json!(deadline));
        f.plan(
            &format!("{mode}_interval_clamped_below_deadline"),
            &t(&near),
            &t(&run(&near, &fails[..1])),
            &(deadline - 11).to_string(),
        );
    }
    let p = policy_with(&[("/jitter", jitter("equal", 7))]);
    let pt = t(&p);
    let a = run(&p, &steps);
    let sample = a["attempts"][1]["jitter_sample_ms"]
        .as_u64()
        .expect("sample");
    let mut missing = a.clone();
    remove(&mut missing, "/attempts/1/jitter_sample_ms");
    f.eval(
        "drift_sample_missing",
        &pt,
        &t(&missing),
        "jitter_sample_missing",
    );
    f.eval(
        "drift_sample_out_of_interval",
        &pt,
        &t(&edited(
            &a,
            &[("/attempts/1/jitter_sample_ms", json!(1_001))],
        )),
        "jitter_out_of_interval",
    );
    let in_interval_other = if sample > 50 { sample - 1 } else { sample + 1 };
    f.eval(
        "drift_sample_not_the_seeded_draw",
        &pt,
        &t(&edited(
            &a,
            &[("/attempts/1/jitter_sample_ms", json!(in_interval_other))],
        )),
        "jitter_sample_drift",
    );
    f.eval(
        "drift_sample_on_first_attempt",
        &pt,
        &t(&edited(&a, &[("/attempts/0/jitter_sample_ms", json!(0))])),
        "jitter_sample_unexpected",
    );
    let mut reseeded = None;
    for seed in 8..64u64 {
        let q = policy_with(&[("/jitter", jitter("equal", seed))]);
        if api::evaluate(&t(&q), &t(&a)).is_err() {
            reseeded = Some(q);
            break;
        }
    }
    let q = reseeded.expect("a seed whose draws differ");
    f.eval(
        "drift_replayed_with_other_seed",
        &t(&q),
        &t(&a),
        "jitter_sample_drift",
    );
    f
}

fn evaluate_family() -> Family {
    let mut f = Family::new(
        "evaluate",
        "evaluate: the full receipt of a finished run for every terminal, and the errors for runs that have not ended or drift.",
        "evaluate's receipt (digests, schedule, counts, cost, fallback and degraded flags, final route) for each terminal incl. zero-attempt runs, the degraded fallback, jittered receipts in the jitter family; run_not_terminal on empty and partial runs; drift and decode errors through evaluate",
    );
    let r = reference();
    let pt = t(&r);
    let steps = lab::reference_steps();
    let ra = run(&r, &steps);
    f.eval("receipt_reference_run", &pt, &t(&ra), "completed");
    f.eval(
        "receipt_completed_on_primary",
        &pt,
        &t(&run(&r, &[s(success(), 300, 900)])),
        "completed",
    );
    let generic = id("behavior: generic summary v1");
    let degraded = policy_with(&[
        ("/routes/1/behavior_class_sha256", json!(generic)),
        ("/allowed_degraded_behavior_classes", json!([generic])),
    ]);
    f.eval(
        "receipt_completed_on_degraded_fallback",
        &t(&degraded),
        &t(&run(&degraded, &steps)),
        "completed",
    );
    f.eval(
        "receipt_degraded_route_failing_is_not_degraded",
        &t(&degraded),
        &t(&run(
            &degraded,
            &[
                s(down(), 10, 0),
                s(down(), 10, 0),
                s(
                    Outcome::NonRetryable {
                        kind: NonRetryableKind::Rejected,
                    },
                    10,
                    0,
                ),
            ],
        )),
        "stop_non_retryable",
    );
    f.eval(
        "receipt_stop_non_retryable",
        &pt,
        &t(&run(
            &r,
            &[s(
                Outcome::NonRetryable {
                    kind: NonRetryableKind::PolicyDenied,
                },
                300,
                40,
            )],
        )),
        "stop_non_retryable",
    );
    f.eval(
        "receipt_stop_indeterminate",
        &pt,
        &t(&run(
            &r,
            &[
                s(rl(250), 1_100, 0),
                s(
                    Outcome::Indeterminate {
                        kind: IndeterminateKind::StreamInterruptedAfterOutput,
                    },
                    100,
                    700,
                ),
            ],
        )),
        "stop_indeterminate",
    );
    let two = policy_with(&[("/max_total_attempts", json!(2))]);
    f.eval(
        "receipt_stop_total_attempts",
        &t(&two),
        &t(&run(&two, &steps)),
        "stop_total_attempts",
    );
    let one_fallback = policy_with(&[("/routes/1/max_attempts", json!(1))]);
    f.eval(
        "receipt_stop_route_exhausted",
        &t(&one_fallback),
        &t(&run(
            &one_fallback,
            &[s(down(), 10, 0), s(down(), 10, 0), s(timeout(), 400, 0)],
        )),
        "stop_route_exhausted",
    );
    f.eval(
        "receipt_stop_cost_budget_spent",
        &pt,
        &t(&run(&r, &[s(down(), 10, 4_000), s(success(), 10, 6_001)])),
        "stop_cost_budget",
    );
    let tight = policy_with(&[("/max_total_cost", json!(2_500))]);
    f.eval(
        "receipt_stop_cost_budget_reservation",
        &t(&tight),
        &t(&run(&tight, &steps)),
        "stop_cost_budget",
    );
    let tiny = policy_with(&[("/max_total_cost", json!(1_000))]);
    f.eval(
        "receipt_stop_cost_budget_with_zero_attempts",
        &t(&tiny),
        &t(&empty_attempts()),
        "stop_cost_budget",
    );
    let late = policy_with(&[("/deadline_ms", json!(2_300))]);
    f.eval(
        "receipt_stop_deadline_late_success",
        &t(&late),
        &t(&run(&late, &steps)),
        "stop_deadline",
    );
    let d1600 = policy_with(&[("/deadline_ms", json!(1_600))]);
    f.eval(
        "receipt_stop_deadline_before_dispatch",
        &t(&d1600),
        &t(&run(&d1600, &steps)),
        "stop_deadline",
    );
    let mut cancelled = run(&r, &steps[..1]);
    set(&mut cancelled, "/cancelled_at_ms", json!(1_200));
    f.eval(
        "receipt_stop_cancelled",
        &pt,
        &t(&cancelled),
        "stop_cancelled",
    );
    let mut cancel_empty = empty_attempts();
    set(&mut cancel_empty, "/cancelled_at_ms", json!(5));
    f.eval(
        "receipt_stop_cancelled_with_zero_attempts",
        &pt,
        &t(&cancel_empty),
        "stop_cancelled",
    );
    f.eval(
        "receipt_run_not_terminal_empty",
        &pt,
        &t(&empty_attempts()),
        "run_not_terminal",
    );
    f.eval(
        "receipt_run_not_terminal_partial",
        &pt,
        &t(&truncated(&ra, 2)),
        "run_not_terminal",
    );
    f.eval(
        "receipt_drift_early_start",
        &pt,
        &t(&edited(&ra, &[("/attempts/1/started_at_ms", json!(1_349))])),
        "early_start",
    );
    f.eval(
        "receipt_drift_cost_after_terminal",
        &pt,
        &t(&edited(
            &ra,
            &[("/attempts/0/cost", json!(MAX_SAFE_INTEGER))],
        )),
        "attempt_after_terminal",
    );
    f.eval(
        "receipt_invalid_policy",
        &t(&policy_with(&[(
            "/routes/1/supports_idempotency",
            json!(false),
        )])),
        &t(&ra),
        "idempotency_unsupported",
    );
    f.eval(
        "receipt_policy_decode_error_before_attempts",
        "{\"schema\":null}",
        "[",
        "null_value",
    );
    f.eval(
        "receipt_attempts_decode_error",
        &pt,
        "{\"attempts\":[]}",
        "missing_field",
    );
    f
}

fn verify_family() -> Family {
    let mut f = Family::new(
        "verify",
        "verify_bundle: the lab's reference bundle and each of its mutation cases, plus bundles that were reformatted, cut short or changed deep inside the receipt.",
        "verify_bundle on every lab case (the reference run, policy rules, drift of each kind, jitter replay and its drift, each receipt field changed), a reformatted bundle, a run cut short (run_not_terminal), a schedule entry changed (attempt index), and decode errors",
    );
    for c in lab::cases().expect("lab cases") {
        f.verify(&format!("lab_{}", c.name), &t(&c.bundle), &c.expected);
    }
    let bundle = retryledger_core::canonical::to_value(&lab::reference_bundle().expect("bundle"));
    f.verify(
        "reference_pretty_printed",
        &serde_json::to_string_pretty(&bundle).expect("json"),
        "verified",
    );
    let mut cut = bundle.clone();
    cut["attempts"]["attempts"]
        .as_array_mut()
        .expect("list")
        .truncate(2);
    f.verify("run_cut_short", &t(&cut), "run_not_terminal");
    f.verify(
        "schedule_entry_changed",
        &t(&edited(
            &bundle,
            &[("/receipt/schedule/1/not_before_ms", json!(1_351))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "route_count_changed",
        &t(&edited(
            &bundle,
            &[("/receipt/route_attempts/1/attempts", json!(2))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "receipt_final_route_removed",
        &{
            let mut v = bundle.clone();
            remove(&mut v, "/receipt/final_route_id");
            t(&v)
        },
        "receipt_mismatch",
    );
    f.verify(
        "policy_changed_after_sealing",
        &t(&edited(
            &bundle,
            &[("/policy/max_total_cost", json!(10_001))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "attempt_cost_changed_after_sealing",
        &t(&edited(
            &bundle,
            &[("/attempts/attempts/2/cost", json!(1_801))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "bundle_schema_mismatch",
        &t(&edited(
            &bundle,
            &[("/schema", json!("retryledger.bundle.v2"))],
        )),
        "schema_mismatch",
    );
    let other = sealed(&reference(), &run(&reference(), &[s(success(), 300, 900)]));
    f.verify("verified_completed_on_primary", &t(&other), "verified");
    f
}

fn digest_family() -> Family {
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

const NOW: u64 = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
const NOW_2026: u64 = 1_780_000_000_000; // 2026-05-28

fn retry_after_family() -> Family {
    let mut f = Family::new(
        "retry_after",
        "parse_retry_after: delay-seconds, the three HTTP-date forms, retry-after-ms, and every malformed or hostile value; results are milliseconds clamped to cap_ms.",
        "delay-seconds (zero, small, padded, capped, huge, 64-byte boundary), IMF-fixdate, RFC 850 (two-digit years around the 50-year window) and asctime, dates in the past and before 1970, retry-after-ms (integer, fractional rounded up, trailing zeros), negative, fractional seconds, exponents, signs, hex, empty, non-ASCII (fullwidth digit, no-break space, emoji), overlong (65 bytes, multi-byte), header names in any case and an unknown header",
    );
    let ra = "retry-after";
    let ms = "retry-after-ms";
    let cap = 60_000;
    let max = MAX_SAFE_INTEGER;
    let ones64 = "1".repeat(64);
    let ones65 = "1".repeat(65);
    let e33 = "\u{e9}".repeat(33);
    let nines65 = "9".repeat(65);
    let cases: Vec<(&str, &str, &str, u64, u64, &str)> = vec![
        ("seconds_zero", ra, "0", NOW, cap, "ok"),
        ("seconds_two", ra, "2", NOW, cap, "ok"),
        ("seconds_padded_spaces", ra, "  2  ", NOW, cap, "ok"),
        ("seconds_padded_tabs", ra, "\t2\t", NOW, cap, "ok"),
        ("seconds_leading_zeros", ra, "0002", NOW, cap, "ok"),
        ("seconds_capped", ra, "120", NOW, cap, "ok"),
        ("seconds_at_cap", ra, "60", NOW, cap, "ok"),
        ("seconds_cap_zero", ra, "30", NOW, 0, "ok"),
        (
            "seconds_huge_capped",
            ra,
            "99999999999999999999999",
            NOW,
            cap,
            "ok",
        ),
        (
            "seconds_huge_uncapped_clamps_to_2_pow_53_minus_1",
            ra,
            "99999999999999999999999",
            NOW,
            max,
            "ok",
        ),
        (
            "seconds_u64_max",
            ra,
            "18446744073709551615",
            NOW,
            max,
            "ok",
        ),
        ("seconds_64_bytes_accepted", ra, &ones64, NOW, cap, "ok"),
        (
            "seconds_65_bytes_overlong",
            ra,
            &ones65,
            NOW,
            cap,
            "retry_after_overlong",
        ),
        (
            "seconds_negative",
            ra,
            "-1",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "seconds_plus_sign",
            ra,
            "+1",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "seconds_fractional",
            ra,
            "1.5",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "seconds_exponent",
            ra,
            "1e3",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        ("seconds_hex", ra, "0x10", NOW, cap, "retry_after_invalid"),
        (
            "seconds_inner_space",
            ra,
            "1 0",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "seconds_with_unit",
            ra,
            "10s",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        ("empty", ra, "", NOW, cap, "retry_after_invalid"),
        ("blank", ra, "   ", NOW, cap, "retry_after_invalid"),
        ("word", ra, "soon", NOW, cap, "retry_after_invalid"),
        (
            "fullwidth_digit",
            ra,
            "\u{ff12}",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "no_break_space",
            ra,
            "5\u{a0}",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        ("emoji", ra, "\u{23f3}", NOW, cap, "retry_after_invalid"),
        ("newline_inside", ra, "1\n", NOW, cap, "retry_after_invalid"),
        (
            "non_ascii_overlong",
            ra,
            &e33,
            NOW,
            cap,
            "retry_after_overlong",
        ),
        (
            "imf_fixdate_future",
            ra,
            "Sun, 06 Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "rfc850_future",
            ra,
            "Sunday, 06-Nov-94 08:49:47 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "asctime_future",
            ra,
            "Sun Nov  6 08:49:47 1994",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_now",
            ra,
            "Sun, 06 Nov 1994 08:49:37 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_past",
            ra,
            "Sun, 06 Nov 1994 08:00:00 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_years_past",
            ra,
            "Fri, 01 Jan 1988 00:00:00 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_before_1970",
            ra,
            "Wed, 31 Dec 1969 23:59:59 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_epoch_with_now_zero",
            ra,
            "Thu, 01 Jan 1970 00:00:10 GMT",
            0,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_far_future_capped",
            ra,
            "Fri, 31 Dec 9999 23:59:59 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_far_future_uncapped",
            ra,
            "Fri, 31 Dec 9999 23:59:59 GMT",
            NOW,
            max,
            "ok",
        ),
        (
            "imf_fixdate_leap_second",
            ra,
            "Sun, 06 Nov 1994 08:49:60 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_leap_day",
            ra,
            "Tue, 29 Feb 2028 00:00:00 GMT",
            NOW_2026,
            max,
            "ok",
        ),
        (
            "imf_fixdate_weekday_not_checked",
            ra,
            "Mon, 06 Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "ok",
        ),
        (
            "imf_fixdate_second_61",
            ra,
            "Sun, 06 Nov 1994 08:49:61 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_hour_24",
            ra,
            "Sun, 06 Nov 1994 24:00:00 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_feb_30",
            ra,
            "Sun, 30 Feb 1994 08:49:37 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_utc_not_gmt",
            ra,
            "Sun, 06 Nov 1994 08:49:47 UTC",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_lowercase_day",
            ra,
            "sun, 06 Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_lowercase_month",
            ra,
            "Sun, 06 nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_one_digit_day",
            ra,
            "Sun, 6 Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_double_space",
            ra,
            "Sun, 06  Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "imf_fixdate_numeric_offset",
            ra,
            "Sun, 06 Nov 1994 08:49:47 +0000",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "rfc850_year_99_is_1999",
            ra,
            "Friday, 31-Dec-99 23:59:59 GMT",
            NOW_2026,
            max,
            "ok",
        ),
        (
            "rfc850_year_76_within_50_years",
            ra,
            "Wednesday, 01-Jan-76 00:00:00 GMT",
            NOW_2026,
            max,
            "ok",
        ),
        (
            "rfc850_year_77_is_last_century",
            ra,
            "Saturday, 01-Jan-77 00:00:00 GMT",
            NOW_2026,
            max,
            "ok",
        ),
        (
            "rfc850_short_day_name",
            ra,
            "Sun, 06-Nov-94 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "rfc850_four_digit_year",
            ra,
            "Sunday, 06-Nov-1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "asctime_two_digit_day",
            ra,
            "Wed Nov 16 08:49:37 1994",
            NOW,
            max,
            "ok",
        ),
        (
            "asctime_one_space_day",
            ra,
            "Sun Nov 6 08:49:47 1994",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "asctime_trailing_gmt",
            ra,
            "Sun Nov  6 08:49:47 1994 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        (
            "date_padded_accepted",
            ra,
            "  Sun, 06 Nov 1994 08:49:47 GMT ",
            NOW,
            cap,
            "ok",
        ),
        (
            "iso_8601_rejected",
            ra,
            "1994-11-06T08:49:47Z",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        ("ms_integer", ms, "250", NOW, cap, "ok"),
        ("ms_zero", ms, "0", NOW, cap, "ok"),
        ("ms_fraction_rounds_up", ms, "250.1", NOW, cap, "ok"),
        ("ms_fraction_tiny_rounds_up", ms, "0.0001", NOW, cap, "ok"),
        ("ms_fraction_zero", ms, "250.000", NOW, cap, "ok"),
        ("ms_padded", ms, " 250 ", NOW, cap, "ok"),
        ("ms_capped", ms, "90000", NOW, cap, "ok"),
        ("ms_huge", ms, "99999999999999999999999.5", NOW, max, "ok"),
        ("ms_exponent", ms, "1e3", NOW, cap, "retry_after_invalid"),
        ("ms_negative", ms, "-5", NOW, cap, "retry_after_invalid"),
        ("ms_leading_dot", ms, ".5", NOW, cap, "retry_after_invalid"),
        ("ms_trailing_dot", ms, "5.", NOW, cap, "retry_after_invalid"),
        ("ms_two_dots", ms, "5.0.1", NOW, cap, "retry_after_invalid"),
        ("ms_with_unit", ms, "250ms", NOW, cap, "retry_after_invalid"),
        (
            "ms_http_date_rejected",
            ms,
            "Sun, 06 Nov 1994 08:49:47 GMT",
            NOW,
            cap,
            "retry_after_invalid",
        ),
        ("ms_empty", ms, "", NOW, cap, "retry_after_invalid"),
        (
            "ms_overlong",
            ms,
            &nines65,
            NOW,
            cap,
            "retry_after_overlong",
        ),
        ("header_mixed_case", "Retry-After", "3", NOW, cap, "ok"),
        (
            "header_ms_upper_case",
            "RETRY-AFTER-MS",
            "3",
            NOW,
            cap,
            "ok",
        ),
        (
            "header_unknown",
            "x-retry-after",
            "3",
            NOW,
            cap,
            "invalid_value",
        ),
    ];
    for (name, header, value, now, cap, want) in cases {
        f.retry_after(name, header, value, now, cap, want);
    }
    f
}

fn classify_family() -> Family {
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
    f
}

fn write_family(dir: &Path, fam: &Family) -> std::io::Result<usize> {
    let file = FamilyFile {
        family: fam.name,
        description: fam.description,
        cases: &fam.cases,
    };
    let mut text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(dir.join(format!("{}.json", fam.name)), text.as_bytes())?;
    Ok(text.len())
}

fn readme(families: &[Family], sizes: &[usize]) -> String {
    let total: usize = families.iter().map(|f| f.cases.len()).sum();
    let mut out = String::new();
    out.push_str(
        "# Conformance vectors\n\
         \n\
         Generated by `cargo run -q -p retryledger-core --example vectors -- tests/vectors`\n\
         (do not edit by hand: `make test` regenerates them into a temporary directory\n\
         and fails on any difference). Every expected output is computed by the Rust\n\
         core through `retryledger_core::api`, the same JSON-text boundary the\n\
         WebAssembly and Python bindings call, so a binding conforms when it gives\n\
         exactly these results. The Rust test `core/tests/vectors.rs` reads these\n\
         files in place.\n\
         \n\
         ## Format\n\
         \n\
         Each file is `{\"schema\": \"retryledger.vectors.v1\", \"family\", \"description\", \"cases\"}`.\n\
         A case is `{\"name\", \"op\", \"input\", \"expect\"}`; names are unique across all files.\n\
         \n\
         | op | input |\n\
         | --- | --- |\n\
         | `validate_policy` | `policy` |\n\
         | `plan_next` | `policy`, `attempts` |\n\
         | `evaluate` | `policy`, `attempts` |\n\
         | `verify_bundle` | `bundle` |\n\
         | `digest` | `document` |\n\
         | `parse_retry_after` | `header` (`retry-after` or `retry-after-ms`), `value`, `now_unix_ms`, `cap_ms` |\n\
         | `classify_http` | `observation` |\n\
         \n\
         Document inputs are JSON *text* (strings), passed to the operation as is, so\n\
         hostile text (duplicate keys, `-0`, lone surrogate escapes, a byte order mark)\n\
         reaches the core unchanged. Never parse and re-serialize them.\n\
         \n\
         `expect` is either `{\"ok\": value}` — the operation's output parsed as JSON: a\n\
         string for `validate_policy` and `digest`, a number for `parse_retry_after`,\n\
         an object for the others — or `{\"error\": {\"code\", \"path\"}}` with the stable\n\
         error code and, when the error has one, its JSON Pointer (`path` is absent\n\
         otherwise). Compare `ok` values as parsed JSON (deep equality); every\n\
         integer is at most 2^53 - 1.\n\
         \n\
         ## Files\n\
         \n\
         | file | cases | bytes | covers |\n\
         | --- | ---: | ---: | --- |\n",
    );
    for (fam, size) in families.iter().zip(sizes) {
        let _ = writeln!(
            out,
            "| `{}.json` | {} | {} | {} |",
            fam.name,
            fam.cases.len(),
            size,
            fam.covers
        );
    }
    let _ = writeln!(
        out,
        "| total | {total} | {} | |",
        sizes.iter().sum::<usize>()
    );
    out.push_str(
        "\n\
         ## Error codes\n\
         \n\
         Every code in `ErrorCode::ALL` appears in some case (as `expect.error.code`, or\n\
         as the `code` of a `drift` verdict of `verify_bundle`), except two that no JSON\n\
         text within the limits can produce, each covered by a Rust test in\n\
         `core/tests/vectors.rs` instead:\n\
         \n\
         - `input_too_large`: an input over 2 MiB would make the vector files too large\n\
           to keep in the repository; the test feeds 2 MiB + 1 byte to every operation\n\
           and checks that exactly 2 MiB passes the size check.\n\
         - `arithmetic_overflow`: spent cost never exceeds `max_total_cost` (at most\n\
           2^53 - 1) before the run stops, and each cost is at most 2^53 - 1, so the sum\n\
           cannot overflow from decoded documents; the test reaches it through the typed\n\
           Rust API with costs beyond 2^53.\n",
    );
    out
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: vectors <output-dir>");
        return ExitCode::FAILURE;
    };
    let families = vec![
        policy_family(),
        decode_family(),
        plan_family(),
        schedule_family(),
        jitter_family(),
        evaluate_family(),
        verify_family(),
        digest_family(),
        retry_after_family(),
        classify_family(),
    ];
    let mut names = BTreeSet::new();
    let mut dup = false;
    for fam in &families {
        for c in &fam.cases {
            if !names.insert(c.name.clone()) {
                eprintln!("duplicate case name {} in {}", c.name, fam.name);
                dup = true;
            }
        }
    }
    if dup {
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let mut sizes = Vec::new();
    for fam in &families {
        match write_family(&dir, fam) {
            Ok(n) => sizes.push(n),
            Err(e) => {
                eprintln!("cannot write {}: {e}", fam.name);
                return ExitCode::FAILURE;
            }
        }
    }
    if let Err(e) = std::fs::write(dir.join("README.md"), readme(&families, &sizes)) {
        eprintln!("cannot write README: {e}");
        return ExitCode::FAILURE;
    }
    let total: usize = families.iter().map(|f| f.cases.len()).sum();
    println!(
        "{total} cases in {} files, {} bytes, written to {}",
        families.len(),
        sizes.iter().sum::<usize>(),
        dir.display()
    );
    ExitCode::SUCCESS
}
