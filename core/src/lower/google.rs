//! `google` generateContent (the REST body; the model is in the URL):
//! `systemInstruction`, `contents` with `user` and `model` turns of parts
//! (`text`, `inlineData`, `fileData`, `functionCall`, `functionResponse`,
//! and Gemini's own parts such as one carrying a `thoughtSignature`,
//! verbatim), `tools[].functionDeclarations`, and `generationConfig`
//! (`maxOutputTokens`, `temperature`, `topP`, `stopSequences`, `seed`,
//! `responseMimeType` with `responseJsonSchema`, `thinkingConfig`).
//!
//! Function calls carry no ids on this wire: a result names its call's
//! function (looked up by the call id), and consecutive tool messages share
//! one `user` turn.

use serde_json::{json, Map, Value};

use super::model::{ImageSource, Part, ResponseFormat, Role};
use super::{put, Plan};

/// The body.
pub fn body(plan: &mut Plan<'_>) -> Value {
    let c = plan.conv;
    let mut contents: Vec<Value> = Vec::new();
    let mut last_tool = false;
    for m in &c.messages {
        let mut parts: Vec<Value> = Vec::new();
        for p in &m.parts {
            match p {
                Part::Text(t) => parts.push(json!({"text": t})),
                Part::Image { media_type, source } => parts.push(match source {
                    ImageSource::Data(d) => {
                        json!({"inlineData": {"mimeType": media_type, "data": d}})
                    }
                    ImageSource::Url(u) => {
                        json!({"fileData": {"mimeType": media_type, "fileUri": u}})
                    }
                }),
                Part::ToolCall {
                    name, arguments, ..
                } => {
                    parts.push(json!({"functionCall": {"name": name, "args": arguments}}));
                }
                Part::ToolResult {
                    tool_call_id,
                    content,
                    is_error,
                } => {
                    let name = c.call_name(tool_call_id).unwrap_or_default();
                    let key = if *is_error { "error" } else { "result" };
                    parts.push(
                        json!({"functionResponse": {"name": name, "response": {key: content}}}),
                    );
                }
                Part::ProviderBound { data, .. } => {
                    if plan.keeps(p) {
                        parts.push(Value::Object(data.clone()));
                    }
                }
            }
        }
        if parts.is_empty() {
            continue;
        }
        let is_tool = m.role == Role::Tool;
        if is_tool && last_tool {
            if let Some(Value::Array(prev)) = contents.last_mut().and_then(|v| v.get_mut("parts")) {
                prev.extend(parts);
                continue;
            }
        }
        last_tool = is_tool;
        let role = if m.role == Role::Assistant {
            "model"
        } else {
            "user"
        };
        contents.push(json!({"role": role, "parts": parts}));
    }
    let mut body = Map::new();
    body.insert("contents".to_owned(), Value::Array(contents));
    put(
        &mut body,
        "systemInstruction",
        c.system.as_ref().map(|s| json!({"parts": [{"text": s}]})),
    );
    if !c.tools.is_empty() {
        let decls: Vec<Value> = c
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
                f.insert("parametersJsonSchema".to_owned(), t.parameters.clone());
                Value::Object(f)
            })
            .collect();
        body.insert("tools".to_owned(), json!([{"functionDeclarations": decls}]));
    }
    let mut config = Map::new();
    put(
        &mut config,
        "maxOutputTokens",
        plan.max_output_tokens.map(|n| json!(n)),
    );
    put(&mut config, "temperature", plan.temperature.cloned());
    put(&mut config, "topP", plan.top_p.cloned());
    if !c.stop.is_empty() {
        config.insert("stopSequences".to_owned(), json!(c.stop));
    }
    put(&mut config, "seed", c.seed.map(|s| json!(s)));
    match &c.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::Json) => {
            config.insert("responseMimeType".to_owned(), json!("application/json"));
        }
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            config.insert("responseMimeType".to_owned(), json!("application/json"));
            config.insert("responseJsonSchema".to_owned(), schema.clone());
        }
    }
    put(
        &mut config,
        "thinkingConfig",
        plan.reasoning.map(|(_, b)| json!({"thinkingBudget": b})),
    );
    if !config.is_empty() {
        body.insert("generationConfig".to_owned(), Value::Object(config));
    }
    Value::Object(body)
}
