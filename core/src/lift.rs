//! Logical requests lifted from the calls users make to a provider's SDK.
//!
//! A user writes the call they would send (`openai` chat completions
//! parameters, say); [`lift`] splits it by a table into the logical request
//! (what is asked: messages, tools, output contract, sampling, seed) and the
//! route-specific lowering that must not enter the request's digest (the
//! model, streaming and transport options). A parameter the table does not
//! know is an error, never silently dropped or hashed.

use serde_json::{Map, Value};

use crate::error::{Error, ErrorCode, Result};
use crate::request::{check_request, Request, REQUEST_SCHEMA};

/// Where a call parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The request's `input`.
    Input,
    /// Into the request's `tools` object under the parameter's name.
    Tools,
    /// The request's `output_contract`.
    OutputContract,
    /// Into the request's `sampling` object under the parameter's name.
    Sampling,
    /// The request's `seed`.
    Seed,
    /// Into the request's `modalities` object under the parameter's name.
    Modalities,
    /// Route-specific lowering: not part of the logical request.
    Lowering,
}

/// An SDK call the core can lift: its operation name and parameter table.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// The SDK call, as named in `lift` (`openai.chat.completions`).
    pub name: &'static str,
    /// The request's `operation`.
    pub operation: &'static str,
    /// Every parameter the call takes, sorted by name.
    pub parameters: &'static [(&'static str, Place)],
}

use Place::{Input, Lowering, Modalities, OutputContract, Sampling, Seed, Tools};

/// The calls the core lifts.
pub const CALLS: &[Call] = &[
    Call {
        name: "anthropic.messages",
        operation: "messages",
        parameters: &[
            ("max_tokens", Sampling),
            ("messages", Input),
            ("metadata", Lowering),
            ("model", Lowering),
            ("stop_sequences", Sampling),
            ("stream", Lowering),
            ("system", Input),
            ("temperature", Sampling),
            ("thinking", Sampling),
            ("tool_choice", Tools),
            ("tools", Tools),
            ("top_k", Sampling),
            ("top_p", Sampling),
        ],
    },
    Call {
        name: "openai.chat.completions",
        operation: "chat.completions",
        parameters: &[
            ("frequency_penalty", Sampling),
            ("logit_bias", Sampling),
            ("logprobs", Sampling),
            ("max_completion_tokens", Sampling),
            ("max_tokens", Sampling),
            ("messages", Input),
            ("metadata", Lowering),
            ("modalities", Modalities),
            ("model", Lowering),
            ("n", Sampling),
            ("parallel_tool_calls", Tools),
            ("presence_penalty", Sampling),
            ("reasoning_effort", Sampling),
            ("response_format", OutputContract),
            ("seed", Seed),
            ("service_tier", Lowering),
            ("stop", Sampling),
            ("store", Lowering),
            ("stream", Lowering),
            ("stream_options", Lowering),
            ("temperature", Sampling),
            ("tool_choice", Tools),
            ("tools", Tools),
            ("top_logprobs", Sampling),
            ("top_p", Sampling),
            ("user", Lowering),
        ],
    },
    Call {
        name: "openai.responses",
        operation: "responses",
        parameters: &[
            ("background", Lowering),
            ("input", Input),
            ("instructions", Input),
            ("max_output_tokens", Sampling),
            ("metadata", Lowering),
            ("model", Lowering),
            ("parallel_tool_calls", Tools),
            ("reasoning", Sampling),
            ("service_tier", Lowering),
            ("store", Lowering),
            ("stream", Lowering),
            ("temperature", Sampling),
            ("text", OutputContract),
            ("tool_choice", Tools),
            ("tools", Tools),
            ("top_p", Sampling),
            ("user", Lowering),
        ],
    },
];

fn call_named(name: &str) -> Result<&'static Call> {
    CALLS.iter().find(|c| c.name == name).ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidValue,
            format!(
                "no call named `{}`; known: {}",
                name.chars().take(80).collect::<String>(),
                CALLS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
            ),
        )
    })
}

/// Lift a call's parameters (JSON text; floats allowed) into the logical
/// request, checked like any request.
pub fn lift(call: &str, params_json: &str) -> Result<Request> {
    let call = call_named(call)?;
    let Value::Object(params) = crate::parse::parse_any_sized(params_json)? else {
        return Err(Error::new(
            ErrorCode::InvalidType,
            "call parameters are a JSON object",
        ));
    };
    let mut request = Map::new();
    let (mut input, mut tools, mut sampling, mut modalities) =
        (Map::new(), Map::new(), Map::new(), Map::new());
    for (k, v) in params {
        let place = call
            .parameters
            .binary_search_by(|(name, _)| (*name).cmp(k.as_str()))
            .ok()
            .and_then(|i| call.parameters.get(i))
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                Error::at(
                    ErrorCode::UnknownField,
                    format!("/{}", k.replace('~', "~0").replace('/', "~1")),
                    format!(
                        "`{}` is not a parameter of {} the core knows",
                        k.chars().take(80).collect::<String>(),
                        call.name
                    ),
                )
            })?;
        let (map, key) = match place {
            Place::Input => (&mut input, k),
            Place::Tools => (&mut tools, k),
            Place::Sampling => (&mut sampling, k),
            Place::Modalities => (&mut modalities, k),
            Place::OutputContract => (&mut request, "output_contract".to_owned()),
            Place::Seed => (&mut request, "seed".to_owned()),
            Place::Lowering => continue,
        };
        map.insert(key, v);
    }
    if input.is_empty() {
        return Err(Error::new(
            ErrorCode::MissingField,
            format!("{} needs its input parameters", call.name),
        ));
    }
    request.insert("input".to_owned(), Value::Object(input));
    for (name, m) in [
        ("modalities", modalities),
        ("sampling", sampling),
        ("tools", tools),
    ] {
        if !m.is_empty() {
            request.insert(name.to_owned(), Value::Object(m));
        }
    }
    request.insert(
        "operation".to_owned(),
        Value::String(call.operation.to_owned()),
    );
    request.insert(
        "schema".to_owned(),
        Value::String(REQUEST_SCHEMA.to_owned()),
    );
    check_request(Value::Object(request))
}

/// The URL path endings of the calls the core lifts, as an SDK sends them
/// (`/v1/chat/completions`, `/v1/responses`, `/v1/messages`).
pub const PATHS: &[(&str, &str)] = &[
    ("/chat/completions", "openai.chat.completions"),
    ("/messages", "anthropic.messages"),
    ("/responses", "openai.responses"),
];

/// The call an HTTP request to `url_path` makes, if the core lifts it.
pub fn call_for_path(url_path: &str) -> Option<&'static Call> {
    let path = url_path.split(['?', '#']).next().unwrap_or_default();
    let path = path.trim_end_matches('/');
    let (_, name) = PATHS.iter().find(|(end, _)| path.ends_with(end))?;
    CALLS.iter().find(|c| c.name == *name)
}

/// Check a call about to be sent against the logical request its policy
/// binds, before it is sent: the body an SDK sends to `url_path` is the
/// call's parameters, lifted like [`lift`] and compared by digest.
///
/// Only what can be compared is: a path the core does not lift (a poll, a
/// retrieve, another API) passes, and so does a bound request written in
/// another vocabulary than the call's (its `operation` is not the call's),
/// since a request lifted from the call can never equal it. A body that does
/// not lift (not JSON, a parameter the table does not know) or lifts to
/// another request is `request_drift`, at the first top-level field of the
/// request that differs.
pub fn check_sent(bound: &Request, url_path: &str, body: &[u8]) -> Result<()> {
    let Some(call) = call_for_path(url_path) else {
        return Ok(());
    };
    if bound.value.get("operation").and_then(Value::as_str) != Some(call.operation) {
        return Ok(());
    }
    let drift =
        |path: String, message: String| Err(Error::at(ErrorCode::RequestDrift, path, message));
    let Ok(text) = std::str::from_utf8(body) else {
        return drift(
            String::new(),
            format!("the body sent as {} is not UTF-8 JSON: it cannot be checked against the bound request", call.name),
        );
    };
    let sent = match lift(call.name, text) {
        Ok(sent) => sent,
        Err(e) => {
            return drift(
                e.path.clone().unwrap_or_default(),
                format!(
                    "the {} call does not lift to a logical request ({}), so it cannot be the one the policy binds",
                    call.name, e.message
                ),
            )
        }
    };
    if sent.canonical == bound.canonical {
        return Ok(());
    }
    let empty = Map::new();
    let (a, b) = (
        sent.value.as_object().unwrap_or(&empty),
        bound.value.as_object().unwrap_or(&empty),
    );
    let mut fields: Vec<&String> = a.keys().chain(b.keys()).collect();
    fields.sort();
    fields.dedup();
    let differ: Vec<&str> = fields
        .into_iter()
        .filter(|k| a.get(k.as_str()) != b.get(k.as_str()))
        .map(String::as_str)
        .collect();
    drift(
        differ.first().map(|k| format!("/{k}")).unwrap_or_default(),
        format!(
            "the {} call sends logical request {} but the policy binds {}: {} differ; bind the request the call sends (lift_request) or send the bound one",
            call.name,
            sent.sha256(),
            bound.sha256(),
            differ
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_sorted() {
        for c in CALLS {
            assert!(
                c.parameters.windows(2).all(|w| w[0].0 < w[1].0),
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn the_model_is_lowering_and_unknown_parameters_are_errors() {
        let a = lift(
            "openai.chat.completions",
            r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"seed":7}"#,
        )
        .unwrap();
        let b = lift(
            "openai.chat.completions",
            r#"{"model":"other","stream":true,"messages":[{"role":"user","content":"hi"}],"temperature":0.2,"seed":7}"#,
        )
        .unwrap();
        assert_eq!(a.sha256(), b.sha256());
        assert_eq!(
            a.canonical,
            r#"{"input":{"messages":[{"content":"hi","role":"user"}]},"operation":"chat.completions","sampling":{"temperature":0.2},"schema":"retryledger.request.v1","seed":7}"#
        );
        let e = lift(
            "openai.chat.completions",
            r#"{"messages":[],"frobnicate":1}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::UnknownField, Some("/frobnicate"))
        );
        assert_eq!(
            lift("nope", "{}").unwrap_err().code,
            ErrorCode::InvalidValue
        );
    }

    #[test]
    fn a_sent_call_is_checked_against_the_bound_request() {
        let bound = lift(
            "openai.chat.completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let same =
            br#"{"model":"other","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(check_sent(&bound, "/v1/chat/completions", same), Ok(()));
        let other =
            br#"{"model":"m","messages":[{"role":"user","content":"bye"}],"temperature":1}"#;
        let e = check_sent(&bound, "/v1/chat/completions/", other).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::RequestDrift, Some("/input"))
        );
        assert!(e.message.contains("`input`, `sampling`"), "{}", e.message);
        let unknown = br#"{"model":"m","messages":[],"frobnicate":1}"#;
        let e = check_sent(&bound, "/v1/chat/completions", unknown).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::RequestDrift, Some("/frobnicate"))
        );
        assert_eq!(
            check_sent(&bound, "/v1/chat/completions", b"\xff")
                .unwrap_err()
                .code,
            ErrorCode::RequestDrift
        );
        // Not a call the core lifts, or a request in another vocabulary: not compared.
        assert_eq!(check_sent(&bound, "/v1/responses/r1", other), Ok(()));
        assert_eq!(check_sent(&bound, "/v1/messages", other), Ok(()));
        let by_hand = crate::request::parse_request(
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":["hi"]}"#,
        )
        .unwrap();
        assert_eq!(check_sent(&by_hand, "/v1/chat/completions", other), Ok(()));
    }
}
