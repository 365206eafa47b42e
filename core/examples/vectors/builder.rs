//! `builder.json`: policies built from a logical request and a policy spec
//! (catalog documents in place of digests); every digest computed by the core.

use serde_json::{json, Value};

use crate::common::{id, reference, set, t};
use crate::family::Family;

fn release(provider: &str, model: &str, pin: &str) -> Value {
    json!({
        "endpoint": format!("https://api.{provider}.example/v1/chat"),
        "model": model,
        "provider": provider,
        "release_pin": pin,
        "schema": "retryledger.route_release.v1",
    })
}

fn class(name: &str) -> Value {
    json!({"name": name, "schema": "retryledger.behavior_class.v1"})
}

pub const REQUEST: &str = r#"{"schema":"retryledger.request.v1","operation":"chat.completions","input":[{"role":"user","content":"Summarize the incident in three bullet points."}],"sampling":{"temperature":0.2,"top_p":0.95},"seed":7}"#;

/// A spec equivalent to the reference policy, with catalog documents.
pub fn spec() -> Value {
    let p = reference();
    let routes: Vec<Value> = p["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .zip([
            release("private", "summarizer-7b", "summarizer-7b@2026-10-01"),
            release("openai", "gpt-4.1-mini", "gpt-4.1-mini-2025-04-14"),
        ])
        .map(|(r, rel)| {
            json!({
                "capabilities": r["capabilities"],
                "data_boundary": r["data_boundary"],
                "max_attempts": r["max_attempts"],
                "release": rel,
                "reserve_cost": r["reserve_cost"],
                "route_id": r["route_id"],
                "supports_idempotency": r["supports_idempotency"],
            })
        })
        .collect();
    json!({
        "backoff": p["backoff"],
        "behavior_class": class("incident-summary@1"),
        "cost_unit": p["cost_unit"],
        "deadline_ms": p["deadline_ms"],
        "idempotency_key_sha256": id("incident-42"),
        "max_data_boundary": p["max_data_boundary"],
        "max_total_attempts": p["max_total_attempts"],
        "max_total_cost": p["max_total_cost"],
        "requirements": p["requirements"],
        "routes": routes,
        "schema": "retryledger.policy_spec.v1",
    })
}

pub fn family() -> Family {
    let mut f = Family::new(
        "builder",
        "build_policy: a logical request and a policy spec (route releases and behavior classes as catalog documents, routes in priority order, budgets) in, the validated policy with every digest computed out; digest of the catalog documents.",
        "the reference spec, routes in priority order, a route with its own (degraded, allowed) behavior class, jitter, the digests of route releases and behavior classes; errors: a route release missing a field or with a bad identifier, an unknown field, a request that cannot be canonicalized, a behavior class listed twice, and policy rules (data boundary, duplicate route id, route attempts) reported with validation's codes",
    );
    let build = |f: &mut Family, name: &str, request: &str, spec: &Value, want: &str| {
        f.add(
            name,
            "build_policy",
            vec![("request", json!(request)), ("spec", json!(t(spec)))],
            want,
        );
    };
    let s = spec();
    build(&mut f, "build_reference_spec", REQUEST, &s, "ok");
    let mut swapped = s.clone();
    swapped["routes"].as_array_mut().expect("routes").reverse();
    set(
        &mut swapped,
        "/max_data_boundary",
        json!("external_provider"),
    );
    build(
        &mut f,
        "build_routes_in_list_order",
        REQUEST,
        &swapped,
        "ok",
    );
    let mut degraded = s.clone();
    set(
        &mut degraded,
        "/routes/1/behavior_class",
        class("incident-summary-lite@1"),
    );
    set(
        &mut degraded,
        "/allowed_degraded_behavior_classes",
        json!([class("incident-summary-lite@1")]),
    );
    build(
        &mut f,
        "build_degraded_fallback_allowed",
        REQUEST,
        &degraded,
        "ok",
    );
    let mut not_allowed = s.clone();
    set(
        &mut not_allowed,
        "/routes/1/behavior_class",
        class("incident-summary-lite@1"),
    );
    build(
        &mut f,
        "build_degraded_fallback_not_allowed",
        REQUEST,
        &not_allowed,
        "behavior_class_mismatch",
    );
    let mut jitter = s.clone();
    set(
        &mut jitter,
        "/jitter",
        json!({"mode": "full", "scheduler_release": "sched-2026.12", "seed": 3}),
    );
    build(&mut f, "build_with_jitter", REQUEST, &jitter, "ok");
    let float_request =
        r#"{"schema":"retryledger.request.v1","operation":"chat","input":[0.1,1e21,null]}"#;
    build(&mut f, "build_request_with_floats", float_request, &s, "ok");
    let mut missing = s.clone();
    missing["routes"][0]["release"]
        .as_object_mut()
        .expect("release")
        .remove("release_pin");
    build(
        &mut f,
        "build_release_missing_pin",
        REQUEST,
        &missing,
        "missing_field",
    );
    let mut bad_id = s.clone();
    set(&mut bad_id, "/routes/0/release/model", json!("gpt 4"));
    build(
        &mut f,
        "build_release_bad_model",
        REQUEST,
        &bad_id,
        "invalid_identifier",
    );
    let mut unknown = s.clone();
    set(&mut unknown, "/routes/0/priority", json!(0));
    build(
        &mut f,
        "build_spec_route_priority_is_its_place",
        REQUEST,
        &unknown,
        "unknown_field",
    );
    let mut twice = s.clone();
    set(
        &mut twice,
        "/allowed_degraded_behavior_classes",
        json!([class("a"), class("a")]),
    );
    build(
        &mut f,
        "build_class_listed_twice",
        REQUEST,
        &twice,
        "duplicate_set_item",
    );
    let mut boundary = s.clone();
    set(
        &mut boundary,
        "/max_data_boundary",
        json!("private_service"),
    );
    build(
        &mut f,
        "build_data_boundary_exceeded",
        REQUEST,
        &boundary,
        "data_boundary_exceeded",
    );
    let mut dup = s.clone();
    set(&mut dup, "/routes/1/route_id", json!("private-primary"));
    build(
        &mut f,
        "build_duplicate_route_id",
        REQUEST,
        &dup,
        "duplicate_route_id",
    );
    let mut same_release = s.clone();
    let r0 = same_release["routes"][0]["release"].clone();
    set(&mut same_release, "/routes/1/release", r0);
    build(
        &mut f,
        "build_duplicate_release",
        REQUEST,
        &same_release,
        "duplicate_route_release",
    );
    let mut zero = s.clone();
    set(&mut zero, "/routes/0/max_attempts", json!(0));
    build(
        &mut f,
        "build_route_attempts_unbounded",
        REQUEST,
        &zero,
        "route_attempts_unbounded",
    );
    build(
        &mut f,
        "build_request_nan",
        r#"{"schema":"retryledger.request.v1","operation":"chat","input":[NaN]}"#,
        &s,
        "invalid_json",
    );
    build(
        &mut f,
        "build_request_missing_input",
        r#"{"schema":"retryledger.request.v1","operation":"chat"}"#,
        &s,
        "missing_field",
    );
    f.digest(
        "digest_route_release",
        &t(&release(
            "openai",
            "gpt-4.1-mini",
            "gpt-4.1-mini-2025-04-14",
        )),
        "ok",
    );
    f.digest(
        "digest_behavior_class",
        &t(&class("incident-summary@1")),
        "ok",
    );
    f
}
