//! Lowering: one logical request, the body each route's SDK call sends.
//!
//! A request with `messages` ([`model`]) is provider-neutral. A route
//! release that carries lowering settings (`lowering` on
//! `retryledger.route_release.v1`: the wire `api`, its context window and
//! output ceiling, whether it takes temperature, its thinking budget and
//! what it supports) turns it, by a pure function, into the parameters of
//! one of four calls: `openai` chat completions ([`openai_chat`]), `openai`
//! responses ([`openai_responses`]), `anthropic` messages ([`anthropic`])
//! and `google` generateContent ([`google`]).
//!
//! Before any body is written, [`check`] asks whether the route can serve the
//! request at all, through the capability coverage of [`crate::capability`]:
//! what the request needs (tools, images, JSON or JSON Schema output, stop
//! sequences, its context in tokens) against what the settings offer. A
//! provider-bound part (a thinking block with its signature, a reasoning
//! item) that the route's wire cannot carry is dropped only when the
//! caller allows it ([`BoundParts::Drop`]), else the route is refused with
//! `provider_bound_history`. What lowering changes on the way (an output
//! bound clamped to the route's ceiling, a temperature the route does not
//! take, a tool-call id rewritten to the target's alphabet) is listed in the
//! answer's `notes`, each with the request's JSON Pointer.
//!
//! The body's digest (SHA-256 over its RFC 8785 form) is what an attempt
//! records as `request_body_sha256`, so a retry on the route must send the
//! same body (`request_body_drift`).

use serde_json::{json, Map, Value};

use crate::builder::RouteRelease;
use crate::canonical::{sha256_hex, to_jcs};
use crate::capability::{Capabilities, Modality, SamplingControl, StructuredOutput, ToolCalls};
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Set;
use crate::provider::ProviderFamily;
use crate::request::Request;

pub mod anthropic;
pub mod google;
pub mod model;
pub mod openai_chat;
pub mod openai_responses;

use model::{Conversation, Effort, ImageSource, Part, Reasoning, ResponseFormat};

/// The wire a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    OpenaiChatCompletions,
    /// `POST /v1/responses`.
    OpenaiResponses,
    /// `POST /v1/messages`.
    AnthropicMessages,
    /// `POST /v1beta/models/{model}:generateContent`.
    GoogleGenerateContent,
}

names!(Api {
    OpenaiChatCompletions => "openai.chat_completions",
    OpenaiResponses => "openai.responses",
    AnthropicMessages => "anthropic.messages",
    GoogleGenerateContent => "google.generate_content",
});

impl Api {
    /// Whether a provider-bound part of `family` can be sent on this wire.
    pub fn carries(self, family: ProviderFamily) -> bool {
        match self {
            Self::OpenaiChatCompletions => false,
            Self::OpenaiResponses => {
                matches!(family, ProviderFamily::Openai | ProviderFamily::AzureOpenai)
            }
            Self::AnthropicMessages => family == ProviderFamily::Anthropic,
            Self::GoogleGenerateContent => family == ProviderFamily::Google,
        }
    }
}

/// Something a route supports beyond plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Support {
    /// Image input.
    Images,
    /// JSON Schema constrained output.
    JsonSchema,
    /// Tool declarations, calls and results.
    Tools,
}

names!(Support {
    Images => "images",
    JsonSchema => "json_schema",
    Tools => "tools",
});

/// A route release's lowering settings. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoweringSettings {
    /// Whether the model takes `temperature` and `top_p`; absent is yes.
    pub accepts_temperature: Option<bool>,
    /// The wire.
    pub api: Api,
    /// Context window, in tokens: the estimated input plus the output bound
    /// sent must fit.
    pub context_window_tokens: u64,
    /// Output ceiling, in tokens: a larger request bound is clamped to it.
    pub max_output_tokens: u64,
    /// What the route supports beyond text; absent is nothing.
    pub supports: Option<Set<Support>>,
    /// The most reasoning tokens the route allows; absent, reasoning is not sent.
    pub thinking_budget_tokens: Option<u64>,
}

object!(LoweringSettings {
    accepts_temperature: opt_doc,
    api: doc,
    context_window_tokens: u64,
    max_output_tokens: u64,
    supports: opt_doc,
    thinking_budget_tokens: opt_u64,
});

impl LoweringSettings {
    fn supports(&self, s: Support) -> bool {
        self.supports.as_ref().is_some_and(|set| set.contains(&s))
    }
}

/// What happens to a provider-bound part a route's wire cannot carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BoundParts {
    /// The route is refused: `provider_bound_history` (the default).
    #[default]
    Refuse,
    /// The part is left out of that route's body, and noted.
    Drop,
}

names!(BoundParts {
    Refuse => "refuse",
    Drop => "drop",
});

/// Tokens an image counts for in the context estimate.
pub const IMAGE_TOKENS: u64 = 1_600;
/// Bytes of text per estimated token.
pub const BYTES_PER_TOKEN: u64 = 4;
/// The reasoning budget each effort stands for where a budget is sent.
pub const EFFORT_BUDGET: [(Effort, u64); 3] = [
    (Effort::Low, 2_048),
    (Effort::Medium, 8_192),
    (Effort::High, 24_576),
];
/// The smallest thinking budget Anthropic takes; a smaller one is not sent.
pub const ANTHROPIC_MIN_THINKING: u64 = 1_024;

/// A change lowering made, at the request's JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Where in the request.
    pub path: String,
    /// What: `clamped_to_ceiling`, `dropped_provider_bound`,
    /// `dropped_unsupported`, `tool_call_id_rewritten`.
    pub what: &'static str,
}

/// A lowered request: the call's parameters and what changed on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Lowered {
    /// The wire.
    pub api: Api,
    /// The model the route asks for (in the body, or the URL for `google`).
    pub model: String,
    /// The SDK call's parameters, as JSON.
    pub body: Value,
    /// What lowering changed, in request order.
    pub notes: Vec<Note>,
}

impl Lowered {
    /// SHA-256 of the body's RFC 8785 form: the attempt's `request_body_sha256`.
    pub fn body_sha256(&self) -> String {
        sha256_hex(to_jcs(&self.body).as_bytes())
    }

    /// The answer document: `api`, `body`, `body_sha256`, `model`, `notes`.
    pub fn to_json(&self) -> Value {
        json!({
            "api": self.api.as_str(),
            "body": self.body,
            "body_sha256": self.body_sha256(),
            "model": self.model,
            "notes": self.notes.iter().map(|n| json!({"path": n.path, "what": n.what})).collect::<Vec<_>>(),
        })
    }
}

/// The conversation of a request, or `missing_field` when it has none.
pub fn conversation_of(request: &Request) -> Result<Conversation> {
    match &request.value {
        Value::Object(m) if m.contains_key("messages") => model::conversation(m),
        _ => Err(Error::at(
            ErrorCode::MissingField,
            "/messages",
            "only a request with `messages` is lowered",
        )),
    }
}

fn settings_of(release: &RouteRelease) -> Result<&LoweringSettings> {
    release.lowering.as_ref().ok_or_else(|| {
        Error::new(
            ErrorCode::CapabilityMissing,
            format!(
                "route release of model `{}` has no lowering settings",
                release.model
            ),
        )
    })
}

fn text_bytes(c: &Conversation) -> u64 {
    let mut n: usize = c.system.as_ref().map_or(0, String::len);
    for p in c.messages.iter().flat_map(|m| m.parts.iter()) {
        n = n.saturating_add(match p {
            Part::Text(t) => t.len(),
            Part::Image { .. } => 0,
            Part::ToolCall {
                name, arguments, ..
            } => name.len().saturating_add(to_jcs(arguments).len()),
            Part::ToolResult { content, .. } => content.len(),
            Part::ProviderBound { data, .. } => to_jcs(&Value::Object(data.clone())).len(),
        });
    }
    for t in &c.tools {
        n = n
            .saturating_add(t.name.len())
            .saturating_add(t.description.as_ref().map_or(0, String::len))
            .saturating_add(to_jcs(&t.parameters).len());
    }
    if let Some(ResponseFormat::JsonSchema { schema, .. }) = &c.response_format {
        n = n.saturating_add(to_jcs(schema).len());
    }
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The estimated input tokens of a conversation: its text (system, parts,
/// tool declarations and the output schema) at [`BYTES_PER_TOKEN`] bytes a
/// token, rounded up, plus [`IMAGE_TOKENS`] per image.
pub fn estimate_input_tokens(c: &Conversation) -> u64 {
    let images = c
        .messages
        .iter()
        .flat_map(|m| m.parts.iter())
        .filter(|p| matches!(p, Part::Image { .. }))
        .count();
    text_bytes(c).div_ceil(BYTES_PER_TOKEN).saturating_add(
        u64::try_from(images)
            .unwrap_or(u64::MAX)
            .saturating_mul(IMAGE_TOKENS),
    )
}

/// The output bound a route sends: the request's, clamped to the ceiling;
/// without one, the ceiling where the wire requires a bound (`anthropic`).
fn output_bound(c: &Conversation, s: &LoweringSettings) -> Option<u64> {
    match c.max_output_tokens {
        Some(m) => Some(m.min(s.max_output_tokens)),
        None if s.api == Api::AnthropicMessages => Some(s.max_output_tokens),
        None => None,
    }
}

/// What the conversation needs, as a capability contract (every other field
/// at its floor).
pub fn needs(c: &Conversation, s: &LoweringSettings) -> Capabilities {
    let mut need = Capabilities::floor();
    need.retention_days = crate::limits::MAX_SAFE_INTEGER;
    let mut input: Vec<Modality> = vec![Modality::Text];
    if c.first_image().is_some() {
        input.push(Modality::Image);
    }
    need.input_modalities = input.into_iter().collect();
    need.max_context_tokens =
        estimate_input_tokens(c).saturating_add(output_bound(c, s).unwrap_or(0));
    need.structured_output = match c.response_format {
        None | Some(ResponseFormat::Text) => StructuredOutput::None,
        Some(ResponseFormat::Json) => StructuredOutput::JsonObject,
        Some(ResponseFormat::JsonSchema { .. }) => StructuredOutput::JsonSchema,
    };
    if c.uses_tools().is_some() {
        need.tool_calls = ToolCalls::Single;
    }
    if !c.stop.is_empty() {
        need.sampling_controls = std::iter::once(SamplingControl::StopSequences).collect();
    }
    need
}

/// What a route's settings offer, as a capability contract.
pub fn offer(s: &LoweringSettings) -> Capabilities {
    let mut offer = Capabilities::floor();
    let mut input: Vec<Modality> = vec![Modality::Text];
    if s.supports(Support::Images) {
        input.push(Modality::Image);
    }
    offer.input_modalities = input.into_iter().collect();
    offer.max_context_tokens = s.context_window_tokens;
    offer.max_output_tokens = s.max_output_tokens;
    offer.structured_output = if s.supports(Support::JsonSchema) {
        StructuredOutput::JsonSchema
    } else if s.api == Api::AnthropicMessages {
        StructuredOutput::None
    } else {
        StructuredOutput::JsonObject
    };
    if s.supports(Support::Tools) {
        offer.tool_calls = ToolCalls::Parallel;
    }
    if s.api != Api::OpenaiResponses {
        offer.sampling_controls = std::iter::once(SamplingControl::StopSequences).collect();
    }
    offer
}

/// Whether the route can serve the conversation: `capability_missing` at the
/// request's pointer for the first need the settings do not cover, then
/// `provider_bound_history` at the first provider-bound part the wire cannot
/// carry (unless `bound` drops it).
pub fn check(c: &Conversation, s: &LoweringSettings, bound: BoundParts) -> Result<()> {
    if let Some((field, why)) = offer(s).uncovered(&needs(c, s)) {
        let path = match field {
            "input_modalities" => c.first_image(),
            "structured_output" => Some("/response_format".to_owned()),
            "tool_calls" => c.uses_tools(),
            "sampling_controls" => Some("/stop".to_owned()),
            _ => Some("/messages".to_owned()),
        };
        let why = if field == "max_context_tokens" {
            format!(
                "{why} (estimated input {} tokens plus the output bound sent)",
                estimate_input_tokens(c)
            )
        } else {
            why
        };
        return Err(Error::at(
            ErrorCode::CapabilityMissing,
            path.unwrap_or_else(|| "/messages".to_owned()),
            format!("route on `{}` {why}", s.api.as_str()),
        ));
    }
    if bound == BoundParts::Refuse {
        if let Some(path) = c.find(|p| match p {
            Part::ProviderBound { family, .. } => !s.api.carries(*family),
            _ => false,
        }) {
            return Err(Error::at(
                ErrorCode::ProviderBoundHistory,
                path,
                format!(
                    "the history holds a part bound to another provider than `{}`, and dropping it is not allowed",
                    s.api.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// What every target reads: the conversation and what the route's settings
/// decided about each optional field.
pub struct Plan<'a> {
    /// The conversation.
    pub conv: &'a Conversation,
    /// The settings.
    pub settings: &'a LoweringSettings,
    /// The model.
    pub model: &'a str,
    /// The output bound to send.
    pub max_output_tokens: Option<u64>,
    /// Reasoning to send: the effort and the budget, both derived.
    pub reasoning: Option<(Effort, u64)>,
    /// Temperature to send.
    pub temperature: Option<&'a Value>,
    /// `top_p` to send.
    pub top_p: Option<&'a Value>,
    /// Notes so far; targets add theirs.
    pub notes: Vec<Note>,
}

impl Plan<'_> {
    /// Whether a part goes into this route's body.
    pub fn keeps(&self, p: &Part) -> bool {
        match p {
            Part::ProviderBound { family, .. } => self.settings.api.carries(*family),
            _ => true,
        }
    }

    /// Note a change.
    pub fn note(&mut self, path: String, what: &'static str) {
        self.notes.push(Note { path, what });
    }

    /// A tool-call id in the target's alphabet: kept when it is at most
    /// `max` bytes of `[A-Za-z0-9_-]`, else `{prefix}` and the first 24 hex
    /// digits of its SHA-256 (the same id always maps to the same one).
    pub fn call_id(&self, id: &str, max: usize, prefix: &str) -> (String, bool) {
        let fits = id.len() <= max
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if fits {
            (id.to_owned(), false)
        } else {
            let digest = sha256_hex(id.as_bytes());
            (format!("{prefix}{}", digest.get(..24).unwrap_or("")), true)
        }
    }
}

/// The effort a budget stands for where only levels are sent.
pub fn effort_of(budget: u64) -> Effort {
    EFFORT_BUDGET
        .iter()
        .find(|(_, b)| budget <= *b)
        .map_or(Effort::High, |(e, _)| *e)
}

fn budget_of(effort: Effort) -> u64 {
    EFFORT_BUDGET
        .iter()
        .find(|(e, _)| *e == effort)
        .map_or(0, |(_, b)| *b)
}

/// An image as a URL (inline data as a `data:` URL).
pub fn image_url(media_type: &str, source: &ImageSource) -> String {
    match source {
        ImageSource::Data(d) => format!("data:{media_type};base64,{d}"),
        ImageSource::Url(u) => u.clone(),
    }
}

/// Arguments as the JSON text OpenAI's wires carry (RFC 8785).
pub fn arguments_text(arguments: &Value) -> String {
    to_jcs(arguments)
}

/// Lower a conversation for a route release: checked first ([`check`]), then
/// written by the release's wire.
pub fn lower_conversation(
    c: &Conversation,
    release: &RouteRelease,
    bound: BoundParts,
) -> Result<Lowered> {
    let s = settings_of(release)?;
    check(c, s, bound)?;
    let mut plan = Plan {
        conv: c,
        settings: s,
        model: release.model.as_str(),
        max_output_tokens: output_bound(c, s),
        reasoning: None,
        temperature: None,
        top_p: None,
        notes: Vec::new(),
    };
    if let (Some(m), Some(sent)) = (c.max_output_tokens, plan.max_output_tokens) {
        if sent < m {
            plan.note("/max_output_tokens".to_owned(), "clamped_to_ceiling");
        }
    }
    if let Some(r) = c.reasoning {
        match s.thinking_budget_tokens {
            Some(cap) if cap > 0 => {
                // A budget is sent by `anthropic` and `google`; OpenAI's
                // wires send a level, derived from a budget when one is given.
                let sends_budget =
                    matches!(s.api, Api::AnthropicMessages | Api::GoogleGenerateContent);
                let (effort, budget, over) = match r {
                    Reasoning::Effort(e) => {
                        let b = budget_of(e);
                        (e, b.min(cap), sends_budget && b > cap)
                    }
                    Reasoning::Budget(b) => (effort_of(b.min(cap)), b.min(cap), b > cap),
                };
                if over {
                    plan.note("/reasoning".to_owned(), "clamped_to_ceiling");
                }
                plan.reasoning = Some((effort, budget));
            }
            _ => plan.note("/reasoning".to_owned(), "dropped_unsupported"),
        }
    }
    if s.accepts_temperature == Some(false) {
        for (v, path) in [
            (&c.temperature, "/sampling/temperature"),
            (&c.top_p, "/sampling/top_p"),
        ] {
            if v.is_some() {
                plan.note(path.to_owned(), "dropped_unsupported");
            }
        }
    } else {
        plan.temperature = c.temperature.as_ref();
        plan.top_p = c.top_p.as_ref();
    }
    for (i, m) in c.messages.iter().enumerate() {
        for (j, p) in m.parts.iter().enumerate() {
            if !plan.keeps(p) {
                plan.note(model::part_path(i, j), "dropped_provider_bound");
            }
        }
    }
    let body = match s.api {
        Api::OpenaiChatCompletions => openai_chat::body(&mut plan),
        Api::OpenaiResponses => openai_responses::body(&mut plan),
        Api::AnthropicMessages => anthropic::body(&mut plan),
        Api::GoogleGenerateContent => google::body(&mut plan),
    };
    let mut notes = plan.notes;
    notes.sort_by_key(|a| pointer_key(&a.path));
    Ok(Lowered {
        api: s.api,
        model: release.model.as_str().to_owned(),
        body,
        notes,
    })
}

/// Sort key of a pointer: numeric segments compare as numbers.
fn pointer_key(p: &str) -> Vec<(u64, String)> {
    p.split('/')
        .map(|seg| match seg.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, seg.to_owned()),
        })
        .collect()
}

/// Lower a request for a route release ([`lower_conversation`]).
pub fn lower(request: &Request, release: &RouteRelease, bound: BoundParts) -> Result<Lowered> {
    lower_conversation(&conversation_of(request)?, release, bound)
}

/// Insert `key: value` into an object body when `value` is some.
pub fn put(body: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        body.insert(key.to_owned(), v);
    }
}

/// Why each route of a spec cannot serve a request: one entry per route, in
/// order, `None` for a route that can (or whose release has no lowering
/// settings, or when the request has no `messages`: nothing to check).
pub fn exclusions(
    request: &Request,
    routes: &[crate::builder::RouteSpec],
    bound: Option<BoundParts>,
) -> Result<Vec<Option<Error>>> {
    let is_conversation = matches!(&request.value, Value::Object(m) if m.contains_key("messages"));
    if !is_conversation {
        return Ok(routes.iter().map(|_| None).collect());
    }
    let c = conversation_of(request)?;
    let bound = bound.unwrap_or_default();
    Ok(routes
        .iter()
        .map(|r| {
            r.release
                .lowering
                .as_ref()
                .and_then(|s| check(&c, s, bound).err())
        })
        .collect())
}

/// The routes of a spec that can serve the request, in order; `no_capable_route`
/// (naming each route's reason) when none can.
pub fn capable_routes(
    request: &Request,
    routes: Vec<crate::builder::RouteSpec>,
    bound: Option<BoundParts>,
) -> Result<Vec<crate::builder::RouteSpec>> {
    let why = exclusions(request, &routes, bound)?;
    if routes.is_empty() || why.iter().all(Option::is_none) {
        return Ok(routes);
    }
    if why.iter().all(Option::is_some) {
        let reasons: Vec<String> = routes
            .iter()
            .zip(&why)
            .filter_map(|(r, e)| {
                e.as_ref().map(|e| {
                    format!(
                        "`{}`: {} at {}",
                        r.route_id,
                        e.code.as_str(),
                        e.path.as_deref().unwrap_or("")
                    )
                })
            })
            .collect();
        return Err(Error::at(
            ErrorCode::NoCapableRoute,
            "/routes",
            format!("no route can serve the request ({})", reasons.join("; ")),
        ));
    }
    Ok(routes
        .into_iter()
        .zip(why)
        .filter_map(|(r, e)| e.is_none().then_some(r))
        .collect())
}

/// The request lowered for every route of a spec that can serve it, in the
/// spec's order, as JSON: `{"routes": [{"route_id", "lowered"}]}` (what each
/// route's attempts send, `lowered` as [`Lowered::to_json`]). A route that
/// cannot serve it is left out, as `build_policy` leaves it out, and
/// `no_capable_route` when none can; a capable route whose release has no
/// lowering settings is `missing_field` at `/routes/<i>/release/lowering`
/// (a host that sends the lowered request needs every route's wire).
pub fn lowered_routes(
    request: &Request,
    routes: &[crate::builder::RouteSpec],
    bound: Option<BoundParts>,
) -> Result<Value> {
    let why = exclusions(request, routes, bound)?;
    if !routes.is_empty() && why.iter().all(Option::is_some) {
        capable_routes(request, routes.to_vec(), bound)?;
    }
    let mut out = Vec::new();
    for (i, (r, e)) in routes.iter().zip(why).enumerate() {
        if e.is_some() {
            continue;
        }
        if r.release.lowering.is_none() {
            return Err(Error::at(
                ErrorCode::MissingField,
                format!("/routes/{i}/release/lowering"),
                format!(
                    "route `{}` has no lowering settings: give its release `lowering` (its wire and what it takes) to send it the lowered request",
                    r.route_id
                ),
            ));
        }
        let lowered = lower(request, &r.release, bound.unwrap_or_default())?;
        out.push(json!({"route_id": r.route_id.as_str(), "lowered": lowered.to_json()}));
    }
    Ok(json!({ "routes": out }))
}

/// The capability answer for every route of a spec, as JSON:
/// `{"routes": [{"route_id", "capable", "code"?, "path"?}]}`.
pub fn route_report(
    request: &Request,
    routes: &[crate::builder::RouteSpec],
    bound: Option<BoundParts>,
) -> Result<Value> {
    let why = exclusions(request, routes, bound)?;
    Ok(json!({
        "routes": routes.iter().zip(why).map(|(r, e)| {
            let mut o = Map::new();
            o.insert("route_id".to_owned(), json!(r.route_id.as_str()));
            o.insert("capable".to_owned(), json!(e.is_none()));
            if let Some(e) = e {
                o.insert("code".to_owned(), json!(e.code.as_str()));
                put(&mut o, "path", e.path.map(Value::String));
            }
            Value::Object(o)
        }).collect::<Vec<_>>(),
    }))
}

/// Options of [`lower`] at the JSON boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerOptions {
    /// What a provider-bound part the wire cannot carry does; `refuse` when absent.
    pub provider_bound_parts: Option<BoundParts>,
}

impl crate::decode::Decode for LowerOptions {
    fn decode(v: &Value, at: &crate::decode::At<'_>) -> Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let provider_bound_parts = f.opt("provider_bound_parts");
        f.end()?;
        Ok(Self {
            provider_bound_parts,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::indexing_slicing,
        reason = "tests fail loudly on any unexpected value"
    )]
    use super::*;
    use crate::decode::from_str;
    use crate::request::parse_request;

    fn release(api: &str, supports: &str) -> RouteRelease {
        from_str(&format!(
            r#"{{"endpoint":"https://x.example","lowering":{{"api":"{api}","context_window_tokens":100000,"max_output_tokens":4096,"supports":{supports},"thinking_budget_tokens":8192}},"model":"m-1","provider":"p","release_pin":"m-1","schema":"retryledger.route_release.v1"}}"#
        ))
        .unwrap()
    }

    const CONVERSATION: &str = r#"{"schema":"retryledger.request.v1","operation":"chat","system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":[{"type":"tool_call","id":"fc:1/a","name":"f","arguments":{"x":1}}]},{"role":"tool","content":[{"type":"tool_result","tool_call_id":"fc:1/a","content":"ok"}]}],"tools":[{"name":"f","parameters":{"type":"object"}}],"max_output_tokens":9000}"#;

    #[test]
    fn each_wire_lowers_deterministically_and_digests_its_body() {
        let r = parse_request(CONVERSATION).unwrap();
        for api in Api::NAMES {
            let rel = release(api, r#"["tools"]"#);
            let a = lower(&r, &rel, BoundParts::Refuse).unwrap();
            let b = lower(&r, &rel, BoundParts::Refuse).unwrap();
            assert_eq!(a, b, "{api}");
            assert_eq!(a.body_sha256(), sha256_hex(to_jcs(&a.body).as_bytes()));
            assert!(to_jcs(&a.body).contains("\"hi\""), "{api}");
            // The bound is clamped to the ceiling everywhere it is sent.
            assert!(
                a.notes.iter().any(|n| n.path == "/max_output_tokens"),
                "{api}"
            );
        }
    }

    #[test]
    fn a_rewritten_call_id_is_the_same_in_the_call_and_its_result() {
        let r = parse_request(CONVERSATION).unwrap();
        let body = lower(
            &r,
            &release("anthropic.messages", r#"["tools"]"#),
            BoundParts::Refuse,
        )
        .unwrap()
        .body;
        let id = body["messages"][1]["content"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
        assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], json!(id));
        assert_eq!(body["max_tokens"], json!(4096));
    }

    #[test]
    fn a_route_without_tools_is_refused_at_the_tools() {
        let r = parse_request(CONVERSATION).unwrap();
        let e = lower(
            &r,
            &release("google.generate_content", "[]"),
            BoundParts::Drop,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::CapabilityMissing, Some("/tools"))
        );
    }

    #[test]
    fn a_request_without_the_new_fields_keeps_its_canonical_form() {
        let text = r#"{"schema":"retryledger.request.v1","operation":"chat","input":[{"role":"user","content":"hi"}],"tools":{"tools":[]},"sampling":{"temperature":0.2}}"#;
        let r = parse_request(text).unwrap();
        assert_eq!(
            r.canonical,
            r#"{"input":[{"content":"hi","role":"user"}],"operation":"chat","sampling":{"temperature":0.2},"schema":"retryledger.request.v1","tools":{"tools":[]}}"#
        );
        assert_eq!(
            conversation_of(&r).unwrap_err().code,
            ErrorCode::MissingField
        );
    }
}
