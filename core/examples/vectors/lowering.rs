//! `lowering.json`: one logical request lowered per route (openai chat
//! completions, openai responses, anthropic messages, google generateContent),
//! the capability check that refuses a route before any dispatch, and
//! policies built with routes that cannot serve the request left out.

use serde_json::{json, Value};

use crate::family::Family;

/// The four wires, with a release name each.
const APIS: [(&str, &str, &str, &str); 4] = [
    (
        "chat",
        "openai.chat_completions",
        "openai",
        "gpt-4.1-2025-04-14",
    ),
    (
        "responses",
        "openai.responses",
        "openai",
        "gpt-5-2025-08-07",
    ),
    (
        "anthropic",
        "anthropic.messages",
        "anthropic",
        "claude-sonnet-4-5-20250929",
    ),
    (
        "google",
        "google.generate_content",
        "google",
        "gemini-2.5-pro",
    ),
];

/// Settings that support everything, with room to spare.
fn settings(api: &str) -> Value {
    json!({
        "api": api,
        "context_window_tokens": 200_000,
        "max_output_tokens": 8_192,
        "supports": ["images", "json_schema", "tools"],
        "thinking_budget_tokens": 16_384,
    })
}

fn release(provider: &str, model: &str, lowering: &Value) -> Value {
    json!({
        "endpoint": format!("https://api.{provider}.example/v1"),
        "lowering": lowering,
        "model": model,
        "provider": provider,
        "provider_family": provider,
        "release_pin": model,
        "schema": "retryledger.route_release.v1",
    })
}

fn request(extra: Value) -> Value {
    let mut r = json!({
        "schema": "retryledger.request.v1",
        "operation": "chat",
        "system": "You answer incident questions briefly.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What failed in the 02:00 deploy?"}]}
        ],
    });
    if let (Some(o), Value::Object(extra)) = (r.as_object_mut(), extra) {
        for (k, v) in extra {
            o.insert(k, v);
        }
    }
    r
}

fn tools() -> Value {
    json!([{
        "name": "lookup_deploy",
        "description": "Find a deploy by time.",
        "parameters": {"type": "object", "properties": {"at": {"type": "string"}}, "required": ["at"]}
    }])
}

fn tool_history(call_id: &str) -> Value {
    json!([
        {"role": "user", "content": [{"type": "text", "text": "What failed in the 02:00 deploy?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking it up."},
            {"type": "tool_call", "id": call_id, "name": "lookup_deploy", "arguments": {"at": "02:00"}}
        ]},
        {"role": "tool", "content": [{"type": "tool_result", "tool_call_id": call_id, "content": "deploy 981: migration timed out"}]}
    ])
}

fn schema_format() -> Value {
    json!({"type": "json_schema", "name": "incident", "schema": {
        "type": "object",
        "properties": {"cause": {"type": "string"}, "severity": {"type": "integer"}},
        "required": ["cause", "severity"],
        "additionalProperties": false
    }})
}

fn images() -> Value {
    json!([{"role": "user", "content": [
        {"type": "text", "text": "What does this dashboard show?"},
        {"type": "image", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="},
        {"type": "image", "media_type": "image/jpeg", "url": "https://dashboards.example/latency.jpg"}
    ]}])
}

/// A history whose assistant turn carries a part bound to `family`.
fn bound_history(family: &str) -> Value {
    let data = match family {
        "anthropic" => {
            json!({"type": "thinking", "thinking": "The deploy log shows a timeout.", "signature": "EqQBCkYIBxgCKkDx"})
        }
        "google" => {
            json!({"text": "Checking the deploy log.", "thought": true, "thoughtSignature": "CiQB0e2Kb3Ns"})
        }
        _ => {
            json!({"type": "reasoning", "id": "rs_68af", "summary": [], "encrypted_content": "gAAAAABo"})
        }
    };
    let kind = match family {
        "anthropic" => "thinking",
        "google" => "thought_signature",
        _ => "reasoning",
    };
    json!([
        {"role": "user", "content": [{"type": "text", "text": "What failed in the 02:00 deploy?"}]},
        {"role": "assistant", "content": [
            {"type": "provider_bound", "family": family, "kind": kind, "data": data},
            {"type": "text", "text": "A migration timed out."}
        ]},
        {"role": "user", "content": [{"type": "text", "text": "And the fix?"}]}
    ])
}

fn lower(f: &mut Family, name: String, req: &Value, rel: &Value, opts: &Value, want: &str) {
    f.add(
        &name,
        "lower_request",
        vec![
            ("request", text(req)),
            ("release", text(rel)),
            ("options", text(opts)),
        ],
        want,
    );
}

fn text(v: &Value) -> Value {
    json!(v.to_string())
}

pub fn family() -> Family {
    let mut f = Family::new(
        "lowering",
        "lower_request: one provider-neutral logical request (messages, tools, output format, reasoning, provider-bound parts) lowered for openai chat completions, openai responses, anthropic messages and google generateContent by each route release's lowering settings; routes that cannot serve the request refused with a coded reason before any dispatch (route_capabilities, build_policy).",
        "each wire x text, sampling and seed, tools with a call history, JSON Schema and JSON output, images, reasoning effort and budget, provider-bound parts kept, dropped or refused, output ceilings, temperature not taken, tool-call ids rewritten, stop sequences, and refusals (tools, images, structured output, context); malformed requests and settings; route reports and policies with routes left out or none capable",
    );
    let none = json!({});
    let drop = json!({"provider_bound_parts": "drop"});
    for (short, api, provider, model) in APIS {
        let full = settings(api);
        let rel = release(provider, model, &full);
        let with = |patch: Value| {
            let mut s = full.clone();
            if let (Some(o), Value::Object(p)) = (s.as_object_mut(), patch) {
                for (k, v) in p {
                    if v.is_null() {
                        o.remove(&k);
                    } else {
                        o.insert(k, v);
                    }
                }
            }
            release(provider, model, &s)
        };
        let n = |what: &str| format!("lower_{short}_{what}");
        lower(
            &mut f,
            n("text"),
            &request(json!({
                "max_output_tokens": 512,
                "sampling": {"temperature": 0.2, "top_p": 0.95},
                "seed": 7,
            })),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("no_bound"),
            &request(json!({})),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("tools_history"),
            &request(json!({
                "tools": tools(),
                "messages": tool_history("call_a1"),
            })),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("json_schema"),
            &request(json!({"response_format": schema_format()})),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("json"),
            &request(json!({"response_format": {"type": "json"}})),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("images"),
            &request(json!({"messages": images()})),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("reasoning_effort"),
            &request(json!({"reasoning": {"effort": "high"}, "max_output_tokens": 4096})),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("reasoning_budget"),
            &request(
                json!({"reasoning": {"budget_tokens": 3000}, "sampling": {"temperature": 0.7}}),
            ),
            &rel,
            &none,
            "ok",
        );
        lower(
            &mut f,
            n("reasoning_over_budget"),
            &request(json!({"reasoning": {"budget_tokens": 60000}})),
            &rel,
            &none,
            "clamped_to_ceiling",
        );
        lower(
            &mut f,
            n("reasoning_unsupported"),
            &request(json!({"reasoning": {"effort": "low"}})),
            &with(json!({"thinking_budget_tokens": null})),
            &none,
            "dropped_unsupported",
        );
        lower(
            &mut f,
            n("ceiling"),
            &request(json!({"max_output_tokens": 64000})),
            &rel,
            &none,
            "clamped_to_ceiling",
        );
        lower(
            &mut f,
            n("no_temperature"),
            &request(json!({"sampling": {"temperature": 1.3, "top_p": 0.5}})),
            &with(json!({"accepts_temperature": false})),
            &none,
            "dropped_unsupported",
        );
        lower(
            &mut f,
            n("long_call_id"),
            &request(json!({
                "tools": tools(),
                "messages": tool_history("functions.lookup_deploy:0/8c1f2e4a-5b6c-4d7e-9f80-a1b2c3d4e5f6"),
            })),
            &rel,
            &none,
            "ok",
        );
        let stop_want = if api == "openai.responses" {
            "capability_missing"
        } else {
            "ok"
        };
        lower(
            &mut f,
            n("stop"),
            &request(json!({"stop": ["\n\nEND"]})),
            &rel,
            &none,
            stop_want,
        );
        for family in ["anthropic", "google", "openai"] {
            let carried = matches!(
                (api, family),
                ("openai.responses", "openai")
                    | ("anthropic.messages", "anthropic")
                    | ("google.generate_content", "google")
            );
            let req = request(json!({"messages": bound_history(family)}));
            if carried {
                lower(
                    &mut f,
                    n(&format!("bound_{family}_kept")),
                    &req,
                    &rel,
                    &none,
                    "ok",
                );
            } else {
                lower(
                    &mut f,
                    n(&format!("bound_{family}_refused")),
                    &req,
                    &rel,
                    &none,
                    "provider_bound_history",
                );
                lower(
                    &mut f,
                    n(&format!("bound_{family}_dropped")),
                    &req,
                    &rel,
                    &drop,
                    "dropped_provider_bound",
                );
            }
        }
        lower(
            &mut f,
            n("refuse_tools"),
            &request(json!({"tools": tools()})),
            &with(json!({"supports": ["images", "json_schema"]})),
            &none,
            "capability_missing",
        );
        lower(
            &mut f,
            n("refuse_tool_history"),
            &request(json!({"messages": tool_history("call_b2")})),
            &with(json!({"supports": null})),
            &none,
            "capability_missing",
        );
        lower(
            &mut f,
            n("refuse_images"),
            &request(json!({"messages": images()})),
            &with(json!({"supports": ["tools"]})),
            &none,
            "capability_missing",
        );
        lower(
            &mut f,
            n("refuse_json_schema"),
            &request(json!({"response_format": schema_format()})),
            &with(json!({"supports": ["images", "tools"]})),
            &none,
            "capability_missing",
        );
        let json_want = if api == "anthropic.messages" {
            "capability_missing"
        } else {
            "ok"
        };
        lower(
            &mut f,
            n("json_without_schema_support"),
            &request(json!({"response_format": {"type": "json"}})),
            &with(json!({"supports": []})),
            &none,
            json_want,
        );
        lower(
            &mut f,
            n("refuse_context"),
            &request(json!({"messages": images(), "max_output_tokens": 1000})),
            &with(json!({"context_window_tokens": 4000})),
            &none,
            "capability_missing",
        );
    }
    // Malformed requests and settings: coded errors with the part's pointer.
    let chat = release("openai", "gpt-4.1", &settings("openai.chat_completions"));
    let bad = |f: &mut Family, name: &str, req: Value, want: &str| {
        lower(f, name.to_owned(), &req, &chat, &none, want);
    };
    bad(
        &mut f,
        "lower_bad_part_type",
        request(
            json!({"messages": [{"role": "user", "content": [{"type": "audio", "data": "AA=="}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_part_in_role",
        request(
            json!({"messages": [{"role": "user", "content": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {}}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_result_without_call",
        request(
            json!({"messages": [{"role": "tool", "content": [{"type": "tool_result", "tool_call_id": "nope", "content": "x"}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_duplicate_call_id",
        request(json!({"messages": [{"role": "assistant", "content": [
        {"type": "tool_call", "id": "c1", "name": "f", "arguments": {}},
        {"type": "tool_call", "id": "c1", "name": "g", "arguments": {}}]}]})),
        "duplicate_set_item",
    );
    bad(
        &mut f,
        "lower_bad_unknown_part_field",
        request(
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache": true}]}]}),
        ),
        "unknown_field",
    );
    bad(
        &mut f,
        "lower_bad_empty_messages",
        request(json!({"messages": []})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_tool_schema",
        request(json!({"tools": [{"name": "f", "parameters": {"type": "string"}}]})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_tool_name",
        request(json!({"tools": [{"name": "look up", "parameters": {"type": "object"}}]})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_image_media_type",
        request(
            json!({"messages": [{"role": "user", "content": [{"type": "image", "media_type": "image/tiff", "data": "AA=="}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_image_http",
        request(
            json!({"messages": [{"role": "user", "content": [{"type": "image", "media_type": "image/png", "url": "http://x.example/a.png"}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_reasoning_both",
        request(json!({"reasoning": {"effort": "low", "budget_tokens": 10}})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_max_output_float",
        request(json!({"max_output_tokens": 1.5})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_temperature",
        request(json!({"sampling": {"temperature": 3}})),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_sampling_field",
        request(json!({"sampling": {"top_k": 3}})),
        "unknown_field",
    );
    bad(
        &mut f,
        "lower_bad_stop_count",
        request(json!({"stop": (0..17).map(|i| format!("s{i}")).collect::<Vec<_>>()})),
        "too_many_items",
    );
    bad(
        &mut f,
        "lower_bad_bound_family",
        request(
            json!({"messages": [{"role": "assistant", "content": [{"type": "provider_bound", "family": "generic", "kind": "x", "data": {}}]}]}),
        ),
        "invalid_value",
    );
    bad(
        &mut f,
        "lower_bad_input_and_messages",
        request(json!({"input": "hi"})),
        "invalid_value",
    );
    let legacy = json!({"schema": "retryledger.request.v1", "operation": "chat", "input": [{"role": "user", "content": "hi"}]});
    bad(
        &mut f,
        "lower_legacy_request",
        legacy.clone(),
        "missing_field",
    );
    let mut legacy_system = legacy.clone();
    legacy_system["system"] = json!("Be brief.");
    f.add(
        "request_conversation_field_without_messages",
        "request_sha256",
        vec![("request", text(&legacy_system))],
        "invalid_value",
    );
    f.add(
        "request_conversation_digest",
        "request_sha256",
        vec![(
            "request",
            text(&request(
                json!({"tools": tools(), "messages": tool_history("call_a1")}),
            )),
        )],
        "ok",
    );
    let mut no_lowering = chat.clone();
    no_lowering.as_object_mut().map(|o| o.remove("lowering"));
    lower(
        &mut f,
        "lower_release_without_settings".to_owned(),
        &request(json!({})),
        &no_lowering,
        &none,
        "capability_missing",
    );
    let mut bad_api = chat.clone();
    bad_api["lowering"]["api"] = json!("openai.completions");
    lower(
        &mut f,
        "lower_release_unknown_api".to_owned(),
        &request(json!({})),
        &bad_api,
        &none,
        "invalid_value",
    );
    lower(
        &mut f,
        "lower_options_unknown".to_owned(),
        &request(json!({})),
        &chat,
        &json!({"drop": true}),
        "unknown_field",
    );

    // Capability reports and policies built with incapable routes left out.
    let anthropic = release(
        "anthropic",
        "claude-sonnet-4-5-20250929",
        &settings("anthropic.messages"),
    );
    let google = release(
        "google",
        "gemini-2.5-pro",
        &settings("google.generate_content"),
    );
    let spec = |bound: Option<&str>, releases: &[&Value]| {
        let mut s = crate::builder::spec();
        let proto = s["routes"][1].clone();
        let routes: Vec<Value> = releases
            .iter()
            .enumerate()
            .map(|(i, rel)| {
                let mut r = proto.clone();
                r["release"] = (*rel).clone();
                r["route_id"] = json!(format!("route-{i}"));
                r
            })
            .collect();
        s["routes"] = json!(routes);
        if let Some(b) = bound {
            s["provider_bound_parts"] = json!(b);
        }
        s
    };
    let thinking = request(json!({"messages": bound_history("anthropic")}));
    let all = [&chat, &anthropic, &google];
    f.add(
        "routes_thinking_history_refused",
        "route_capabilities",
        vec![
            ("request", text(&thinking)),
            ("spec", text(&spec(None, &all))),
        ],
        "provider_bound_history",
    );
    f.add(
        "routes_thinking_history_dropped",
        "route_capabilities",
        vec![
            ("request", text(&thinking)),
            ("spec", text(&spec(Some("drop"), &all))),
        ],
        "capable\":true",
    );
    f.add(
        "build_thinking_history_gemini_only_refused",
        "build_policy",
        vec![
            ("request", text(&thinking)),
            ("spec", text(&spec(None, &[&google]))),
        ],
        "no_capable_route",
    );
    f.add(
        "build_thinking_history_gemini_only_dropped",
        "build_policy",
        vec![
            ("request", text(&thinking)),
            ("spec", text(&spec(Some("drop"), &[&google]))),
        ],
        "ok",
    );
    f.add(
        "build_thinking_history_keeps_anthropic_only",
        "build_policy",
        vec![
            ("request", text(&thinking)),
            ("spec", text(&spec(None, &all))),
        ],
        "route-1",
    );
    let mut small = settings("google.generate_content");
    small["supports"] = json!(["tools"]);
    let google_no_images = release("google", "gemini-2.5-flash-lite", &small);
    let pictures = request(json!({"messages": images()}));
    f.add(
        "build_images_skip_route",
        "build_policy",
        vec![
            ("request", text(&pictures)),
            ("spec", text(&spec(None, &[&google_no_images, &anthropic]))),
        ],
        "route-1",
    );
    f.add(
        "build_images_no_capable_route",
        "build_policy",
        vec![
            ("request", text(&pictures)),
            ("spec", text(&spec(None, &[&google_no_images]))),
        ],
        "no_capable_route",
    );
    f.add(
        "routes_images_report",
        "route_capabilities",
        vec![
            ("request", text(&pictures)),
            ("spec", text(&spec(None, &[&google_no_images, &anthropic]))),
        ],
        "capability_missing",
    );
    f
}
