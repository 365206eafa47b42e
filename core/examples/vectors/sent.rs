//! `sent.json`: an SDK call about to be sent, checked against the logical
//! request its policy binds.

use serde_json::json;

use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "sent",
        "check_sent_request: the body an SDK call is about to send (its URL path and JSON body) lifted and compared with the logical request the policy binds; another request is request_drift, and nothing is sent.",
        "the bound call under another model and stream options; another prompt; other sampling; a parameter the table does not know; a body that is not JSON; a path the core does not lift; a request written by hand",
    );
    let bound = r#"{"schema":"retryledger.request.v1","operation":"chat.completions","input":{"messages":[{"role":"user","content":"Summarize the incident."}]}}"#;
    let mut sent = |name: &str, request: &str, path: &str, body: &str, want: &str| {
        f.add(
            name,
            "check_sent_request",
            vec![
                ("body", json!(body)),
                ("request", json!(request)),
                ("url_path", json!(path)),
            ],
            want,
        );
    };
    let chat = "/v1/chat/completions";
    sent(
        "sent_the_bound_call",
        bound,
        chat,
        r#"{"model":"gpt-4.1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Summarize the incident."}]}"#,
        "ok",
    );
    sent(
        "sent_another_prompt",
        bound,
        chat,
        r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Write a poem instead."}]}"#,
        "request_drift",
    );
    sent(
        "sent_other_sampling",
        bound,
        chat,
        r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Summarize the incident."}],"temperature":0.2}"#,
        "request_drift",
    );
    sent(
        "sent_unknown_parameter",
        bound,
        chat,
        r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Summarize the incident."}],"frobnicate":1}"#,
        "request_drift",
    );
    sent("sent_not_json", bound, chat, "not json", "request_drift");
    sent(
        "sent_path_not_lifted",
        bound,
        "/v1/responses/resp_1",
        "",
        "ok",
    );
    sent(
        "sent_request_by_hand",
        r#"{"schema":"retryledger.request.v1","operation":"chat","input":["Summarize the incident."]}"#,
        chat,
        r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Write a poem instead."}]}"#,
        "ok",
    );
    f
}
