//! `anthropic` messages: `system`, `messages` whose content is blocks
//! (`text`, `image` with a `base64` or `url` source, `tool_use`,
//! `tool_result`, and Anthropic's own blocks such as `thinking` with its
//! signature, verbatim), `tools` with `input_schema`, `output_config.format`
//! for JSON Schema output, `max_tokens` (always sent: the request's bound
//! clamped to the ceiling, else the ceiling), `thinking`, `stop_sequences`,
//! `temperature`, `top_p`.
//!
//! Tool results become a `user` turn (consecutive tool messages share one).
//! Extended thinking takes a budget of at least 1,024 tokens below
//! `max_tokens` and no sampling changes: a smaller budget is not sent, and
//! with thinking on, `temperature` and `top_p` are dropped (each noted).
//! JSON output without a schema asks for any object. Tool-call ids outside
//! `[A-Za-z0-9_-]` (or over 64 bytes) are rewritten (`toolu_` and 24 hex
//! digits); the seed is dropped (this wire has none).

use serde_json::{json, Map, Value};

use super::model::{part_path, ImageSource, Part, ResponseFormat, Role};
use super::{put, Plan, ANTHROPIC_MIN_THINKING};

/// The longest tool-call id kept as is.
pub const MAX_ID_BYTES: usize = 64;

fn id(plan: &mut Plan<'_>, id: &str, path: String) -> String {
    let (out, rewritten) = plan.call_id(id, MAX_ID_BYTES, "toolu_");
    if rewritten {
        plan.note(path, "tool_call_id_rewritten");
    }
    out
}

/// The body.
pub fn body(plan: &mut Plan<'_>) -> Value {
    let c = plan.conv;
    let mut messages: Vec<Value> = Vec::new();
    let mut last_tool = false;
    for (i, m) in c.messages.iter().enumerate() {
        let mut blocks: Vec<Value> = Vec::new();
        for (j, p) in m.parts.iter().enumerate() {
            match p {
                Part::Text(t) => blocks.push(json!({"type": "text", "text": t})),
                Part::Image { media_type, source } => blocks.push(json!({
                    "type": "image",
                    "source": match source {
                        ImageSource::Data(d) => json!({"type": "base64", "media_type": media_type, "data": d}),
                        ImageSource::Url(u) => json!({"type": "url", "url": u}),
                    },
                })),
                Part::ToolCall {
                    id: call,
                    name,
                    arguments,
                } => {
                    let call = id(plan, call, format!("{}/id", part_path(i, j)));
                    blocks.push(json!({"type": "tool_use", "id": call, "name": name, "input": arguments}));
                }
                Part::ToolResult {
                    tool_call_id,
                    content,
                    is_error,
                } => {
                    let call = id(plan, tool_call_id, format!("{}/tool_call_id", part_path(i, j)));
                    let mut b = Map::new();
                    b.insert("type".to_owned(), json!("tool_result"));
                    b.insert("tool_use_id".to_owned(), json!(call));
                    b.insert("content".to_owned(), json!(content));
                    if *is_error {
                        b.insert("is_error".to_owned(), json!(true));
                    }
                    blocks.push(Value::Object(b));
                }
                Part::ProviderBound { data, .. } => {
                    if plan.keeps(p) {
                        blocks.push(Value::Object(data.clone()));
                    }
                }
            }
        }
        if blocks.is_empty() {
            continue;
        }
        let role = if m.role == Role::Assistant {
            "assistant"
        } else {
            "user"
        };
        let is_tool = m.role == Role::Tool;
        if is_tool && last_tool {
            if let Some(Value::Array(prev)) = messages.last_mut().and_then(|v| v.get_mut("content"))
            {
                prev.extend(blocks);
                continue;
            }
        }
        last_tool = is_tool;
        messages.push(json!({"role": role, "content": blocks}));
    }
    let max_tokens = plan
        .max_output_tokens
        .unwrap_or(plan.settings.max_output_tokens);
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(plan.model));
    body.insert("max_tokens".to_owned(), json!(max_tokens));
    put(&mut body, "system", c.system.as_ref().map(|s| json!(s)));
    body.insert("messages".to_owned(), Value::Array(messages));
    if !c.tools.is_empty() {
        let tools = c
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".to_owned(), json!(t.name));
                put(
                    &mut f,
                    "description",
                    t.description.as_ref().map(|d| json!(d)),
                );
                f.insert("input_schema".to_owned(), t.parameters.clone());
                Value::Object(f)
            })
            .collect();
        body.insert("tools".to_owned(), Value::Array(tools));
    }
    put(
        &mut body,
        "output_config",
        match &c.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::Json) => Some(json!({
                "format": {"type": "json_schema", "schema": {"type": "object"}},
            })),
            Some(ResponseFormat::JsonSchema { schema, .. }) => Some(json!({
                "format": {"type": "json_schema", "schema": schema},
            })),
        },
    );
    let mut thinking = false;
    if let Some((_, budget)) = plan.reasoning {
        let budget = budget.min(max_tokens.saturating_sub(1));
        if budget >= ANTHROPIC_MIN_THINKING {
            thinking = true;
            body.insert(
                "thinking".to_owned(),
                json!({"type": "enabled", "budget_tokens": budget}),
            );
        } else {
            plan.note("/reasoning".to_owned(), "dropped_unsupported");
        }
    }
    if !c.stop.is_empty() {
        body.insert("stop_sequences".to_owned(), json!(c.stop));
    }
    for (key, v, path) in [
        (
            "temperature",
            plan.temperature.cloned(),
            "/sampling/temperature",
        ),
        ("top_p", plan.top_p.cloned(), "/sampling/top_p"),
    ] {
        if thinking && v.is_some() {
            plan.note(path.to_owned(), "dropped_unsupported");
        } else {
            put(&mut body, key, v);
        }
    }
    if c.seed.is_some() {
        plan.note("/seed".to_owned(), "dropped_unsupported");
    }
    Value::Object(body)
}
