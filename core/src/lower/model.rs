//! The provider-neutral conversation a logical request carries, decoded
//! strictly from the request's `messages` and its companion fields.
//!
//! A request with `messages` is a conversation: `system`, `messages`,
//! `tools`, `response_format`, `max_output_tokens`, `reasoning`, `stop`,
//! `sampling` (`temperature`, `top_p`) and `seed` each have one shape,
//! checked here with a coded error and the JSON Pointer of the offending
//! part. A request without `messages` keeps its free-form `input` (and
//! `tools`, `sampling`) exactly as before, so its digest is unchanged.

use serde_json::{Map, Value};

use crate::error::{Error, ErrorCode, Result};
use crate::limits::MAX_SAFE_INTEGER;
use crate::provider::ProviderFamily;

/// Most messages in a conversation.
pub const MAX_MESSAGES: usize = 1_024;
/// Most content parts in one message.
pub const MAX_PARTS: usize = 256;
/// Most tools a request declares.
pub const MAX_TOOLS: usize = 128;
/// Most stop sequences.
pub const MAX_STOP: usize = 16;
/// Longest stop sequence, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// Longest tool name (every provider's limit), in bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 64;
/// Longest tool-call id, in bytes.
pub const MAX_CALL_ID_BYTES: usize = 256;
/// Image media types every target takes.
pub const IMAGE_MEDIA_TYPES: &[&str] = &["image/gif", "image/jpeg", "image/png", "image/webp"];

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The caller: text and images.
    User,
    /// The model: text, tool calls and provider-bound parts.
    Assistant,
    /// Tool results answering the model's tool calls.
    Tool,
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Base64 bytes inline.
    Data(String),
    /// An `https:` URL the provider fetches.
    Url(String),
}

/// One content part.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Plain text.
    Text(String),
    /// An image.
    Image {
        /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
        media_type: String,
        /// Inline data or a URL.
        source: ImageSource,
    },
    /// A tool call the model made.
    ToolCall {
        /// The call's id, unique in the conversation.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments, a JSON object.
        arguments: Value,
    },
    /// The result of a tool call.
    ToolResult {
        /// The id of the call it answers.
        tool_call_id: String,
        /// The result text.
        content: String,
        /// Whether the tool failed.
        is_error: bool,
    },
    /// A part only its issuing provider family accepts (a thinking block
    /// with its signature, a reasoning item, a thought signature): its
    /// `data` is the provider's own part, passed through verbatim.
    ProviderBound {
        /// The family that issued it.
        family: ProviderFamily,
        /// What it is (`thinking`, `redacted_thinking`, `reasoning`, …).
        kind: String,
        /// The provider's own part.
        data: Map<String, Value>,
    },
}

/// One message, with its parts and each part's JSON Pointer.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// The parts, in order.
    pub parts: Vec<Part>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name (`[A-Za-z0-9_-]{1,64}`).
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// Its parameters as a JSON Schema object.
    pub parameters: Value,
}

/// The output contract.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    Json,
    /// JSON valid against a schema.
    JsonSchema {
        /// The schema's name.
        name: String,
        /// The JSON Schema.
        schema: Value,
    },
}

/// Reasoning effort, as a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effort {
    /// Little reasoning.
    Low,
    /// Some reasoning.
    Medium,
    /// Much reasoning.
    High,
}

impl Effort {
    /// The level's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}

/// How much the model may reason before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// A level.
    Effort(Effort),
    /// A budget in tokens.
    Budget(u64),
}

/// A decoded conversation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Conversation {
    /// System instructions.
    pub system: Option<String>,
    /// The messages, in order.
    pub messages: Vec<Message>,
    /// The tools.
    pub tools: Vec<Tool>,
    /// The output contract; absent is free text.
    pub response_format: Option<ResponseFormat>,
    /// The most output tokens the caller allows.
    pub max_output_tokens: Option<u64>,
    /// Reasoning effort or budget.
    pub reasoning: Option<Reasoning>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Sampling temperature (a JSON number in 0..=2).
    pub temperature: Option<Value>,
    /// Nucleus sampling (a JSON number in 0..=1).
    pub top_p: Option<Value>,
    /// A reproducibility seed.
    pub seed: Option<u64>,
}

impl Conversation {
    /// The JSON Pointer of the first image part, if any.
    pub fn first_image(&self) -> Option<String> {
        self.find(|p| matches!(p, Part::Image { .. }))
    }

    /// The pointer of the first part that matches.
    pub fn find(&self, pred: impl Fn(&Part) -> bool) -> Option<String> {
        self.messages
            .iter()
            .enumerate()
            .find_map(|(i, m)| m.parts.iter().position(&pred).map(|j| part_path(i, j)))
    }

    /// Whether tools are declared or tool calls or results appear.
    pub fn uses_tools(&self) -> Option<String> {
        if !self.tools.is_empty() {
            return Some("/tools".to_owned());
        }
        self.find(|p| matches!(p, Part::ToolCall { .. } | Part::ToolResult { .. }))
    }

    /// The name of the tool a call id belongs to.
    pub fn call_name(&self, id: &str) -> Option<&str> {
        self.messages
            .iter()
            .flat_map(|m| m.parts.iter())
            .find_map(|p| match p {
                Part::ToolCall { id: i, name, .. } if i == id => Some(name.as_str()),
                _ => None,
            })
    }
}

/// The JSON Pointer of part `j` of message `i`.
pub fn part_path(i: usize, j: usize) -> String {
    format!("/messages/{i}/content/{j}")
}

fn err(code: ErrorCode, path: &str, msg: impl Into<String>) -> Error {
    Error::at(code, path, msg)
}

fn obj<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| err(ErrorCode::InvalidType, path, "expected an object"))
}

/// Check an object's keys against the allowed set and the required ones.
fn keys(m: &Map<String, Value>, path: &str, allowed: &[&str], required: &[&str]) -> Result<()> {
    let mut sorted: Vec<&String> = m.keys().collect();
    sorted.sort();
    if let Some(k) = sorted.iter().find(|k| !allowed.contains(&k.as_str())) {
        return Err(err(
            ErrorCode::UnknownField,
            &format!("{path}/{}", escape(k)),
            format!("unknown field `{}`", k.chars().take(80).collect::<String>()),
        ));
    }
    if let Some(k) = required.iter().find(|k| !m.contains_key(**k)) {
        return Err(err(
            ErrorCode::MissingField,
            path,
            format!("missing field `{k}`"),
        ));
    }
    Ok(())
}

fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

fn string(m: &Map<String, Value>, key: &str, path: &str) -> Result<String> {
    match m.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(err(
            ErrorCode::InvalidType,
            &format!("{path}/{key}"),
            "expected a string",
        )),
        None => Err(err(
            ErrorCode::MissingField,
            path,
            format!("missing field `{key}`"),
        )),
    }
}

fn nonempty(m: &Map<String, Value>, key: &str, path: &str, max: usize) -> Result<String> {
    let s = string(m, key, path)?;
    if s.is_empty() || s.len() > max {
        return Err(err(
            ErrorCode::InvalidValue,
            &format!("{path}/{key}"),
            format!("`{key}` is 1 to {max} bytes"),
        ));
    }
    Ok(s)
}

fn array<'a>(v: &'a Value, path: &str, max: usize) -> Result<&'a Vec<Value>> {
    let a = v
        .as_array()
        .ok_or_else(|| err(ErrorCode::InvalidType, path, "expected an array"))?;
    if a.len() > max {
        return Err(err(
            ErrorCode::TooManyItems,
            path,
            format!("at most {max} items"),
        ));
    }
    Ok(a)
}

fn count(v: &Value, path: &str, min: u64) -> Result<u64> {
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x >= min as f64 && x <= MAX_SAFE_INTEGER as f64 => v
            .as_u64()
            .or_else(|| format!("{x}").parse::<u64>().ok())
            .ok_or_else(|| err(ErrorCode::InvalidValue, path, "expected an integer")),
        Some(_) => Err(err(
            ErrorCode::InvalidValue,
            path,
            format!("an integer in {min}..=2^53-1"),
        )),
        None => Err(err(ErrorCode::InvalidType, path, "expected a number")),
    }
}

fn tool_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TOOL_NAME_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn schema_object(v: &Value, path: &str) -> Result<Value> {
    let m = obj(v, path)?;
    match m.get("type") {
        Some(Value::String(t)) if t == "object" => Ok(v.clone()),
        _ => Err(err(
            ErrorCode::InvalidValue,
            path,
            "a JSON Schema whose `type` is `object`",
        )),
    }
}

fn part(v: &Value, role: Role, path: &str) -> Result<Part> {
    let m = obj(v, path)?;
    let kind = string(m, "type", path)?;
    let allowed_here = match (role, kind.as_str()) {
        (Role::User, "text" | "image")
        | (Role::Assistant, "text" | "tool_call" | "provider_bound")
        | (Role::Tool, "tool_result") => true,
        (_, "text" | "image" | "tool_call" | "tool_result" | "provider_bound") => false,
        _ => {
            return Err(err(
                ErrorCode::InvalidValue,
                &format!("{path}/type"),
                "a part is `text`, `image`, `tool_call`, `tool_result` or `provider_bound`",
            ))
        }
    };
    if !allowed_here {
        return Err(err(
            ErrorCode::InvalidValue,
            &format!("{path}/type"),
            format!("a `{kind}` part cannot appear in this role's message"),
        ));
    }
    Ok(match kind.as_str() {
        "text" => {
            keys(m, path, &["text", "type"], &["text"])?;
            Part::Text(string(m, "text", path)?)
        }
        "image" => {
            keys(
                m,
                path,
                &["data", "media_type", "type", "url"],
                &["media_type"],
            )?;
            let media_type = string(m, "media_type", path)?;
            if !IMAGE_MEDIA_TYPES.contains(&media_type.as_str()) {
                return Err(err(
                    ErrorCode::InvalidValue,
                    &format!("{path}/media_type"),
                    format!("an image is one of {}", IMAGE_MEDIA_TYPES.join(", ")),
                ));
            }
            let source = match (m.contains_key("data"), m.contains_key("url")) {
                (true, false) => {
                    let d = nonempty(m, "data", path, crate::limits::MAX_INPUT_BYTES)?;
                    if !d
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                    {
                        return Err(err(
                            ErrorCode::InvalidValue,
                            &format!("{path}/data"),
                            "image data is base64",
                        ));
                    }
                    ImageSource::Data(d)
                }
                (false, true) => {
                    let u = nonempty(m, "url", path, 4_096)?;
                    if !u.starts_with("https://") {
                        return Err(err(
                            ErrorCode::InvalidValue,
                            &format!("{path}/url"),
                            "an image URL is `https:`",
                        ));
                    }
                    ImageSource::Url(u)
                }
                _ => {
                    return Err(err(
                        ErrorCode::InvalidValue,
                        path,
                        "an image has exactly one of `data` and `url`",
                    ))
                }
            };
            Part::Image { media_type, source }
        }
        "tool_call" => {
            keys(
                m,
                path,
                &["arguments", "id", "name", "type"],
                &["arguments", "id", "name"],
            )?;
            let id = nonempty(m, "id", path, MAX_CALL_ID_BYTES)?;
            let name = string(m, "name", path)?;
            if !tool_name(&name) {
                return Err(err(
                    ErrorCode::InvalidValue,
                    &format!("{path}/name"),
                    "a tool name is 1 to 64 of [A-Za-z0-9_-]",
                ));
            }
            let arguments = m.get("arguments").cloned().unwrap_or(Value::Null);
            obj(&arguments, &format!("{path}/arguments"))?;
            Part::ToolCall {
                id,
                name,
                arguments,
            }
        }
        "tool_result" => {
            keys(
                m,
                path,
                &["content", "is_error", "tool_call_id", "type"],
                &["content", "tool_call_id"],
            )?;
            let is_error = match m.get("is_error") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(err(
                        ErrorCode::InvalidType,
                        &format!("{path}/is_error"),
                        "expected a boolean",
                    ))
                }
            };
            Part::ToolResult {
                tool_call_id: nonempty(m, "tool_call_id", path, MAX_CALL_ID_BYTES)?,
                content: string(m, "content", path)?,
                is_error,
            }
        }
        _ => {
            keys(
                m,
                path,
                &["data", "family", "kind", "type"],
                &["data", "family", "kind"],
            )?;
            let fam = string(m, "family", path)?;
            let family = ProviderFamily::ALL
                .iter()
                .copied()
                .find(|f| f.as_str() == fam && *f != ProviderFamily::Generic)
                .ok_or_else(|| {
                    err(
                        ErrorCode::InvalidValue,
                        &format!("{path}/family"),
                        "the issuing family is `openai`, `azure_openai`, `anthropic` or `google`",
                    )
                })?;
            let kind = nonempty(m, "kind", path, crate::limits::MAX_ID_BYTES)?;
            let data = obj(
                m.get("data").unwrap_or(&Value::Null),
                &format!("{path}/data"),
            )?;
            Part::ProviderBound {
                family,
                kind,
                data: data.clone(),
            }
        }
    })
}

fn message(v: &Value, path: &str) -> Result<Message> {
    let m = obj(v, path)?;
    keys(m, path, &["content", "role"], &["content", "role"])?;
    let role = match string(m, "role", path)?.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => {
            return Err(err(
                ErrorCode::InvalidValue,
                &format!("{path}/role"),
                "a role is `user`, `assistant` or `tool`",
            ))
        }
    };
    let content_path = format!("{path}/content");
    let items = array(
        m.get("content").unwrap_or(&Value::Null),
        &content_path,
        MAX_PARTS,
    )?;
    if items.is_empty() {
        return Err(err(
            ErrorCode::InvalidValue,
            &content_path,
            "a message has at least one part",
        ));
    }
    let parts = items
        .iter()
        .enumerate()
        .map(|(j, p)| part(p, role, &format!("{content_path}/{j}")))
        .collect::<Result<Vec<_>>>()?;
    Ok(Message { role, parts })
}

fn tool(v: &Value, path: &str) -> Result<Tool> {
    let m = obj(v, path)?;
    keys(
        m,
        path,
        &["description", "name", "parameters"],
        &["name", "parameters"],
    )?;
    let name = string(m, "name", path)?;
    if !tool_name(&name) {
        return Err(err(
            ErrorCode::InvalidValue,
            &format!("{path}/name"),
            "a tool name is 1 to 64 of [A-Za-z0-9_-]",
        ));
    }
    let description = match m.get("description") {
        None => None,
        Some(_) => Some(string(m, "description", path)?),
    };
    let parameters = schema_object(
        m.get("parameters").unwrap_or(&Value::Null),
        &format!("{path}/parameters"),
    )?;
    Ok(Tool {
        name,
        description,
        parameters,
    })
}

fn response_format(v: &Value) -> Result<ResponseFormat> {
    let path = "/response_format";
    let m = obj(v, path)?;
    match string(m, "type", path)?.as_str() {
        "text" => {
            keys(m, path, &["type"], &[])?;
            Ok(ResponseFormat::Text)
        }
        "json" => {
            keys(m, path, &["type"], &[])?;
            Ok(ResponseFormat::Json)
        }
        "json_schema" => {
            keys(m, path, &["name", "schema", "type"], &["name", "schema"])?;
            let name = string(m, "name", path)?;
            if !tool_name(&name) {
                return Err(err(
                    ErrorCode::InvalidValue,
                    "/response_format/name",
                    "a schema name is 1 to 64 of [A-Za-z0-9_-]",
                ));
            }
            let schema = schema_object(
                m.get("schema").unwrap_or(&Value::Null),
                "/response_format/schema",
            )?;
            Ok(ResponseFormat::JsonSchema { name, schema })
        }
        _ => Err(err(
            ErrorCode::InvalidValue,
            "/response_format/type",
            "a response format is `text`, `json` or `json_schema`",
        )),
    }
}

fn reasoning(v: &Value) -> Result<Reasoning> {
    let path = "/reasoning";
    let m = obj(v, path)?;
    keys(m, path, &["budget_tokens", "effort"], &[])?;
    match (m.get("effort"), m.get("budget_tokens")) {
        (Some(_), None) => match string(m, "effort", path)?.as_str() {
            "low" => Ok(Reasoning::Effort(Effort::Low)),
            "medium" => Ok(Reasoning::Effort(Effort::Medium)),
            "high" => Ok(Reasoning::Effort(Effort::High)),
            _ => Err(err(
                ErrorCode::InvalidValue,
                "/reasoning/effort",
                "an effort is `low`, `medium` or `high`",
            )),
        },
        (None, Some(b)) => Ok(Reasoning::Budget(count(b, "/reasoning/budget_tokens", 1)?)),
        _ => Err(err(
            ErrorCode::InvalidValue,
            path,
            "reasoning has exactly one of `effort` and `budget_tokens`",
        )),
    }
}

fn ranged(v: &Value, path: &str, max: f64) -> Result<Value> {
    match v.as_f64() {
        Some(x) if (0.0..=max).contains(&x) => Ok(v.clone()),
        Some(_) => Err(err(
            ErrorCode::InvalidValue,
            path,
            format!("a number in 0..={max}"),
        )),
        None => Err(err(ErrorCode::InvalidType, path, "expected a number")),
    }
}

/// The conversation fields of a request: the ones only a request with
/// `messages` may carry.
pub const CONVERSATION_ONLY: &[&str] = &[
    "max_output_tokens",
    "reasoning",
    "response_format",
    "stop",
    "system",
];

/// Decode the conversation of a request object that has `messages`.
pub fn conversation(map: &Map<String, Value>) -> Result<Conversation> {
    for name in ["input", "modalities", "output_contract"] {
        if map.contains_key(name) {
            return Err(err(
                ErrorCode::InvalidValue,
                &format!("/{name}"),
                format!("a request with `messages` has no `{name}` (see `response_format`)"),
            ));
        }
    }
    let mut c = Conversation::default();
    if let Some(v) = map.get("system") {
        c.system = Some(
            v.as_str()
                .ok_or_else(|| err(ErrorCode::InvalidType, "/system", "expected a string"))?
                .to_owned(),
        );
    }
    let items = array(
        map.get("messages").unwrap_or(&Value::Null),
        "/messages",
        MAX_MESSAGES,
    )?;
    if items.is_empty() {
        return Err(err(
            ErrorCode::InvalidValue,
            "/messages",
            "a conversation has at least one message",
        ));
    }
    for (i, v) in items.iter().enumerate() {
        c.messages.push(message(v, &format!("/messages/{i}"))?);
    }
    if let Some(v) = map.get("tools") {
        for (i, t) in array(v, "/tools", MAX_TOOLS)?.iter().enumerate() {
            let t = tool(t, &format!("/tools/{i}"))?;
            if c.tools.iter().any(|o| o.name == t.name) {
                return Err(err(
                    ErrorCode::DuplicateSetItem,
                    &format!("/tools/{i}/name"),
                    "a tool name is declared twice",
                ));
            }
            c.tools.push(t);
        }
    }
    if let Some(v) = map.get("response_format") {
        c.response_format = Some(response_format(v)?);
    }
    if let Some(v) = map.get("max_output_tokens") {
        c.max_output_tokens = Some(count(v, "/max_output_tokens", 1)?);
    }
    if let Some(v) = map.get("reasoning") {
        c.reasoning = Some(reasoning(v)?);
    }
    if let Some(v) = map.get("stop") {
        for (i, s) in array(v, "/stop", MAX_STOP)?.iter().enumerate() {
            let path = format!("/stop/{i}");
            let s = s
                .as_str()
                .ok_or_else(|| err(ErrorCode::InvalidType, &path, "expected a string"))?;
            if s.is_empty() || s.len() > MAX_STOP_BYTES {
                return Err(err(
                    ErrorCode::InvalidValue,
                    &path,
                    format!("a stop sequence is 1 to {MAX_STOP_BYTES} bytes"),
                ));
            }
            c.stop.push(s.to_owned());
        }
    }
    if let Some(v) = map.get("sampling") {
        let m = obj(v, "/sampling")?;
        keys(m, "/sampling", &["temperature", "top_p"], &[])?;
        if let Some(t) = m.get("temperature") {
            c.temperature = Some(ranged(t, "/sampling/temperature", 2.0)?);
        }
        if let Some(t) = m.get("top_p") {
            c.top_p = Some(ranged(t, "/sampling/top_p", 1.0)?);
        }
    }
    if let Some(v) = map.get("seed") {
        c.seed = Some(count(v, "/seed", 0)?);
    }
    check_calls(&c)?;
    Ok(c)
}

/// Tool-call ids are unique, and each result answers an earlier call.
fn check_calls(c: &Conversation) -> Result<()> {
    let mut seen: Vec<&str> = Vec::new();
    for (i, m) in c.messages.iter().enumerate() {
        for (j, p) in m.parts.iter().enumerate() {
            match p {
                Part::ToolCall { id, .. } => {
                    if seen.contains(&id.as_str()) {
                        return Err(err(
                            ErrorCode::DuplicateSetItem,
                            &format!("{}/id", part_path(i, j)),
                            "a tool-call id is used twice",
                        ));
                    }
                    seen.push(id);
                }
                Part::ToolResult { tool_call_id, .. } if !seen.contains(&tool_call_id.as_str()) => {
                    return Err(err(
                        ErrorCode::InvalidValue,
                        &format!("{}/tool_call_id", part_path(i, j)),
                        "a tool result answers no earlier tool call",
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}
