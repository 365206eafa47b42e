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
}
