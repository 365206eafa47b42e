//! `preset.json`: short policy specs (a preset, routes by provider, model and
//! base URL) built with every default written into the policy, and policy
//! templates compiled once and bound per call.

use serde_json::{json, Value};

use crate::builder::{spec as reference_spec, REQUEST};
use crate::common::{id, set, t};
use crate::family::Family;

fn route(provider: &str, model: &str) -> Value {
    json!({
        "base_url": format!("http://127.0.0.1:8080/{provider}/v1"),
        "model": model,
        "price": {"input": 400_000, "output": 1_600_000},
        "provider": provider,
    })
}

/// The README's spec: an interactive preset, a primary and a fallback.
pub fn short_spec() -> Value {
    json!({
        "idempotency_key_sha256": id("order-1234"),
        "preset": "interactive",
        "routes": [route("openai", "gpt-4.1-mini"), route("anthropic", "claude-3-5-haiku-20241022")],
        "schema": "retryledger.policy_spec.v1",
    })
}

fn without_key(mut spec: Value) -> Value {
    spec.as_object_mut()
        .expect("spec")
        .remove("idempotency_key_sha256");
    spec
}

pub fn family() -> Family {
    let mut f = Family::new(
        "preset",
        "Short policy specs: a `preset` (`interactive`, `batch`) defaults every field but the routes (text chat capabilities, a private data boundary, micro_usd costs from each route's price, backoff, deadline and budgets: docs/PRESETS.md), and a route is named by provider, model and base URL; the built policy holds every default. Policy templates: a spec without its key compiled once, bound per call to a request and a key digest, giving build_policy's document and digest.",
        "interactive and batch presets, a route by provider/model/base_url or by a release document, prices in place of a reserve, overrides of every default, an external route allowed or refused; errors: an unknown preset, a route with neither price nor reserve or with both, a release named twice, a short route missing its base URL, a short spec without a preset, two routes on one model, build_policy without a key; templates: bound to the short and the reference spec, refused with a key in the spec, a malformed key digest or request",
    );
    let build = |f: &mut Family, name: &str, spec: &Value, want: &str| {
        f.add(
            name,
            "build_policy",
            vec![("request", json!(REQUEST)), ("spec", json!(t(spec)))],
            want,
        );
    };
    let s = short_spec();
    build(&mut f, "preset_interactive_two_routes", &s, "ok");
    let mut batch = s.clone();
    set(&mut batch, "/preset", json!("batch"));
    build(&mut f, "preset_batch_two_routes", &batch, "ok");
    let mut one = s.clone();
    one["routes"].as_array_mut().expect("routes").truncate(1);
    build(&mut f, "preset_one_route", &one, "ok");
    let mut release = s.clone();
    set(
        &mut release,
        "/routes/1",
        json!({
            "release": {
                "endpoint": "https://gateway.internal.example/v1",
                "model": "summarizer-7b",
                "provider": "private",
                "release_pin": "summarizer-7b@2026-10-01",
                "schema": "retryledger.route_release.v1",
            },
            "reserve_cost": 2_000,
        }),
    );
    build(&mut f, "preset_route_by_release_document", &release, "ok");
    let mut over = s.clone();
    set(
        &mut over,
        "/backoff",
        json!({"base_ms": 100, "max_ms": 800, "retry_after_cap_ms": 3_000}),
    );
    set(&mut over, "/deadline_ms", json!(10_000));
    set(&mut over, "/max_total_attempts", json!(3));
    set(&mut over, "/max_total_cost", json!(500_000));
    set(&mut over, "/cost_unit", json!("micro_eur"));
    set(&mut over, "/routes/0/max_attempts", json!(1));
    set(&mut over, "/routes/0/route_id", json!("primary"));
    set(
        &mut over,
        "/routes/0/release_pin",
        json!("gpt-4.1-mini-2025-04-14"),
    );
    build(&mut f, "preset_overrides", &over, "ok");
    let mut external = s.clone();
    set(
        &mut external,
        "/routes/0/data_boundary",
        json!("external_provider"),
    );
    set(
        &mut external,
        "/max_data_boundary",
        json!("external_provider"),
    );
    build(&mut f, "preset_external_route_allowed", &external, "ok");
    let mut refused = s.clone();
    set(
        &mut refused,
        "/routes/0/data_boundary",
        json!("external_provider"),
    );
    build(
        &mut f,
        "preset_external_route_refused",
        &refused,
        "data_boundary_exceeded",
    );
    let mut unknown = s.clone();
    set(&mut unknown, "/preset", json!("fast"));
    build(&mut f, "preset_unknown", &unknown, "invalid_value");
    let mut unpriced = s.clone();
    unpriced["routes"][0]
        .as_object_mut()
        .expect("route")
        .remove("price");
    build(
        &mut f,
        "preset_route_without_price",
        &unpriced,
        "missing_field",
    );
    let mut both = s.clone();
    set(&mut both, "/routes/0/reserve_cost", json!(1_000));
    build(
        &mut f,
        "preset_route_price_and_reserve",
        &both,
        "invalid_value",
    );
    let mut twice = release.clone();
    set(&mut twice, "/routes/1/model", json!("summarizer-7b"));
    build(
        &mut f,
        "preset_route_release_named_twice",
        &twice,
        "invalid_value",
    );
    let mut no_url = s.clone();
    no_url["routes"][0]
        .as_object_mut()
        .expect("route")
        .remove("base_url");
    build(
        &mut f,
        "preset_route_missing_base_url",
        &no_url,
        "missing_field",
    );
    let mut no_preset = s.clone();
    no_preset.as_object_mut().expect("spec").remove("preset");
    build(
        &mut f,
        "preset_absent_fields_required",
        &no_preset,
        "missing_field",
    );
    let mut same = s.clone();
    set(&mut same, "/routes/1/provider", json!("openai"));
    set(&mut same, "/routes/1/model", json!("gpt-4.1-mini"));
    set(
        &mut same,
        "/routes/1/base_url",
        json!("http://127.0.0.1:8081/v1"),
    );
    build(
        &mut f,
        "preset_two_routes_one_model",
        &same,
        "duplicate_route_id",
    );
    let keyless = without_key(s.clone());
    build(
        &mut f,
        "preset_build_without_key",
        &keyless,
        "missing_field",
    );

    let bind = |f: &mut Family, name: &str, request: &str, spec: &Value, key: &str, want: &str| {
        f.add(
            name,
            "bind_policy_template",
            vec![
                ("idempotency_key_sha256", json!(key)),
                ("request", json!(request)),
                ("spec", json!(t(spec))),
            ],
            want,
        );
    };
    let key = id("order-1234");
    bind(&mut f, "template_short_spec", REQUEST, &keyless, &key, "ok");
    bind(
        &mut f,
        "template_reference_spec",
        REQUEST,
        &without_key(reference_spec()),
        &id("incident-42"),
        "ok",
    );
    bind(
        &mut f,
        "template_spec_with_key",
        REQUEST,
        &s,
        &key,
        "invalid_value",
    );
    bind(
        &mut f,
        "template_bad_key_digest",
        REQUEST,
        &keyless,
        "order-1234",
        "invalid_digest",
    );
    bind(
        &mut f,
        "template_request_missing_input",
        r#"{"schema":"retryledger.request.v1","operation":"chat"}"#,
        &keyless,
        &key,
        "missing_field",
    );
    f
}
