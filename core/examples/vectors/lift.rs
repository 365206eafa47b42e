//! `lift.json`: logical requests lifted from the parameters of SDK calls.

use serde_json::json;

use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "lift",
        "lift_request: the logical request of an SDK call (openai chat completions and responses, anthropic messages), with the model and transport options kept out; unknown parameters are errors.",
        "each call with its sampling, tools, output contract, seed and modalities; the same request whatever the model and streaming options; floats; an unknown parameter, no input, an unknown call, a non-object",
    );
    let mut lift = |name: &str, call: &str, params: &str, want: &str| {
        f.add(
            name,
            "lift_request",
            vec![("call", json!(call)), ("params", json!(params))],
            want,
        );
    };
    let chat = r#"{"model":"gpt-4.1-mini","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Summarize the incident."}],"temperature":0.2,"top_p":0.95,"max_completion_tokens":256,"seed":7,"response_format":{"type":"json_schema","json_schema":{"name":"summary","schema":{"type":"object"}}},"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}],"tool_choice":"auto","stream":false,"user":"u-1"}"#;
    lift(
        "lift_openai_chat_full",
        "openai.chat.completions",
        chat,
        "ok",
    );
    lift(
        "lift_openai_chat_other_model_same_request",
        "openai.chat.completions",
        &chat.replace("gpt-4.1-mini", "gpt-4.1").replace(
            r#""stream":false"#,
            r#""stream":true,"stream_options":{"include_usage":true}"#,
        ),
        "ok",
    );
    lift(
        "lift_openai_chat_modalities",
        "openai.chat.completions",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"modalities":["text"]}"#,
        "ok",
    );
    lift(
        "lift_openai_responses",
        "openai.responses",
        r#"{"model":"gpt-4.1-mini","instructions":"Be brief.","input":"Summarize.","max_output_tokens":300,"text":{"format":{"type":"text"}},"background":true,"store":true}"#,
        "ok",
    );
    lift(
        "lift_anthropic_messages",
        "anthropic.messages",
        r#"{"model":"claude-sonnet-4-5","system":"Be brief.","messages":[{"role":"user","content":"Summarize."}],"max_tokens":512,"temperature":0.5,"stop_sequences":["END"]}"#,
        "ok",
    );
    lift(
        "lift_unknown_parameter",
        "openai.chat.completions",
        r#"{"model":"m","messages":[],"frobnicate":1}"#,
        "unknown_field",
    );
    lift(
        "lift_no_input",
        "openai.chat.completions",
        r#"{"model":"m","temperature":1}"#,
        "missing_field",
    );
    lift(
        "lift_unknown_call",
        "openai.completions",
        r#"{"prompt":"x"}"#,
        "invalid_value",
    );
    lift(
        "lift_not_an_object",
        "anthropic.messages",
        "[1]",
        "invalid_type",
    );
    lift(
        "lift_nan",
        "openai.chat.completions",
        r#"{"messages":[],"temperature":NaN}"#,
        "invalid_json",
    );
    f
}
