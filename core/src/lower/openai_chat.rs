//! `openai` chat completions: `messages` with a leading `system` message,
//! `tools` as functions, `response_format`, `max_completion_tokens`,
//! `reasoning_effort`, `stop`, `temperature`, `top_p`, `seed`.
//!
//! User content is a string when it is one text part, else an array of
//! `text` and `image_url` parts (inline images as `data:` URLs). An assistant
//! message carries its text as `content` and its calls as `tool_calls`
//! (arguments as JSON text); each tool result is a `tool` message. No
//! provider-bound part travels on this wire. Tool-call ids longer than 40
//! bytes or outside `[A-Za-z0-9_-]` are rewritten (`call_` and 24 hex digits).

use serde_json::{json, Map, Value};

use super::model::{Part, ResponseFormat, Role};
use super::{arguments_text, image_url, put, Plan};

/// The longest tool-call id kept as is.
pub const MAX_ID_BYTES: usize = 40;

fn id(plan: &mut Plan<'_>, id: &str, path: String) -> String {
    let (out, rewritten) = plan.call_id(id, MAX_ID_BYTES, "call_");
    if rewritten {
        plan.note(path, "tool_call_id_rewritten");
    }
    out
}

/// The body.
pub fn body(plan: &mut Plan<'_>) -> Value {
    let c = plan.conv;
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &c.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    for (i, m) in c.messages.iter().enumerate() {
        match m.role {
            Role::User => {
                let content = match m.parts.as_slice() {
                    [Part::Text(t)] => json!(t),
                    parts => Value::Array(
                        parts
                            .iter()
                            .filter_map(|p| match p {
                                Part::Text(t) => Some(json!({"type": "text", "text": t})),
                                Part::Image { media_type, source } => Some(json!({
                                    "type": "image_url",
                                    "image_url": {"url": image_url(media_type, source)},
                                })),
                                _ => None,
                            })
                            .collect(),
                    ),
                };
                messages.push(json!({"role": "user", "content": content}));
            }
            Role::Assistant => {
                let mut text = String::new();
                let mut calls = Vec::new();
                for (j, p) in m.parts.iter().enumerate() {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::ToolCall {
                            id: call,
                            name,
                            arguments,
                        } => {
                            let call =
                                id(plan, call, format!("{}/id", super::model::part_path(i, j)));
                            calls.push(json!({
                                "id": call,
                                "type": "function",
                                "function": {"name": name, "arguments": arguments_text(arguments)},
                            }));
                        }
                        _ => {}
                    }
                }
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut msg = Map::new();
                msg.insert("role".to_owned(), json!("assistant"));
                if !text.is_empty() {
                    msg.insert("content".to_owned(), json!(text));
                }
                if !calls.is_empty() {
                    msg.insert("tool_calls".to_owned(), Value::Array(calls));
                }
                messages.push(Value::Object(msg));
            }
            Role::Tool => {
                for (j, p) in m.parts.iter().enumerate() {
                    if let Part::ToolResult {
                        tool_call_id,
                        content,
                        ..
                    } = p
                    {
                        let call = id(
                            plan,
                            tool_call_id,
                            format!("{}/tool_call_id", super::model::part_path(i, j)),
                        );
                        messages.push(
                            json!({"role": "tool", "tool_call_id": call, "content": content}),
                        );
                    }
                }
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(plan.model));
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
                f.insert("parameters".to_owned(), t.parameters.clone());
                json!({"type": "function", "function": f})
            })
            .collect();
        body.insert("tools".to_owned(), Value::Array(tools));
    }
    put(
        &mut body,
        "response_format",
        match &c.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::Json) => Some(json!({"type": "json_object"})),
            Some(ResponseFormat::JsonSchema { name, schema }) => Some(json!({
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": true},
            })),
        },
    );
    put(
        &mut body,
        "max_completion_tokens",
        plan.max_output_tokens.map(|n| json!(n)),
    );
    put(
        &mut body,
        "reasoning_effort",
        plan.reasoning.map(|(e, _)| json!(e.as_str())),
    );
    if !c.stop.is_empty() {
        body.insert("stop".to_owned(), json!(c.stop));
    }
    put(&mut body, "temperature", plan.temperature.cloned());
    put(&mut body, "top_p", plan.top_p.cloned());
    put(&mut body, "seed", c.seed.map(|s| json!(s)));
    Value::Object(body)
}
