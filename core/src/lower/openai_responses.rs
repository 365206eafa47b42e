//! `openai` responses: `instructions` for the system text, `input` items
//! (messages with `input_text` / `input_image` / `output_text` parts,
//! `function_call` and `function_call_output` items, and provider-bound
//! OpenAI items such as `reasoning` verbatim), `tools` as flat functions,
//! `text.format`, `max_output_tokens`, `reasoning.effort`, `temperature`,
//! `top_p`. This wire has no stop sequences (a request with `stop` is not
//! served here) and no seed (a seed is dropped and noted).

use serde_json::{json, Map, Value};

use super::model::{part_path, Part, ResponseFormat, Role};
use super::{arguments_text, image_url, put, Plan};

/// The body.
pub fn body(plan: &mut Plan<'_>) -> Value {
    let c = plan.conv;
    let mut input: Vec<Value> = Vec::new();
    for m in &c.messages {
        let mut content: Vec<Value> = Vec::new();
        let flush = |content: &mut Vec<Value>, input: &mut Vec<Value>, role: &str| {
            if !content.is_empty() {
                input.push(json!({"role": role, "content": std::mem::take(content)}));
            }
        };
        let role = if m.role == Role::Assistant {
            "assistant"
        } else {
            "user"
        };
        for p in &m.parts {
            match p {
                Part::Text(t) if m.role == Role::Assistant => {
                    content.push(json!({"type": "output_text", "text": t}));
                }
                Part::Text(t) => content.push(json!({"type": "input_text", "text": t})),
                Part::Image { media_type, source } => content.push(json!({
                    "type": "input_image",
                    "image_url": image_url(media_type, source),
                })),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    flush(&mut content, &mut input, role);
                    input.push(json!({
                        "type": "function_call",
                        "call_id": id,
                        "name": name,
                        "arguments": arguments_text(arguments),
                    }));
                }
                Part::ToolResult {
                    tool_call_id,
                    content: out,
                    ..
                } => {
                    flush(&mut content, &mut input, role);
                    input.push(json!({
                        "type": "function_call_output",
                        "call_id": tool_call_id,
                        "output": out,
                    }));
                }
                Part::ProviderBound { data, .. } => {
                    if plan.keeps(p) {
                        flush(&mut content, &mut input, role);
                        input.push(Value::Object(data.clone()));
                    }
                }
            }
        }
        flush(&mut content, &mut input, role);
    }
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(plan.model));
    put(
        &mut body,
        "instructions",
        c.system.as_ref().map(|s| json!(s)),
    );
    body.insert("input".to_owned(), Value::Array(input));
    if !c.tools.is_empty() {
        let tools = c
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("type".to_owned(), json!("function"));
                f.insert("name".to_owned(), json!(t.name));
                put(
                    &mut f,
                    "description",
                    t.description.as_ref().map(|d| json!(d)),
                );
                f.insert("parameters".to_owned(), t.parameters.clone());
                f.insert("strict".to_owned(), json!(false));
                Value::Object(f)
            })
            .collect();
        body.insert("tools".to_owned(), Value::Array(tools));
    }
    put(
        &mut body,
        "text",
        match &c.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::Json) => Some(json!({"format": {"type": "json_object"}})),
            Some(ResponseFormat::JsonSchema { name, schema }) => Some(json!({
                "format": {"type": "json_schema", "name": name, "schema": schema, "strict": true},
            })),
        },
    );
    put(
        &mut body,
        "max_output_tokens",
        plan.max_output_tokens.map(|n| json!(n)),
    );
    put(
        &mut body,
        "reasoning",
        plan.reasoning.map(|(e, _)| json!({"effort": e.as_str()})),
    );
    put(&mut body, "temperature", plan.temperature.cloned());
    put(&mut body, "top_p", plan.top_p.cloned());
    if c.seed.is_some() {
        plan.note("/seed".to_owned(), "dropped_unsupported");
    }
    let _ = part_path;
    Value::Object(body)
}
