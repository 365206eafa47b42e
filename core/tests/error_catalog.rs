//! docs/ERRORS.md: each common mistake's input, run through the core's API,
//! gives exactly the code, path and message the page shows.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use retryledger_core::api;

const REQUEST: &str =
    r#"{"schema":"retryledger.request.v1","operation":"chat","input":["Summarize the incident."]}"#;

/// The call whose lifted request the `check_sent_request` entries bind.
const SENT: &str =
    r#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Summarize the incident."}]}"#;

struct Entry {
    title: String,
    op: String,
    input: String,
    code: String,
    path: String,
    message: String,
    /// The further errors of the same pass: (code, path, message).
    more: Vec<(String, String, String)>,
}

fn between<'a>(line: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let start = line.find(open)? + open.len();
    let end = start + line[start..].find(close)?;
    Some((&line[start..end], &line[end + close.len()..]))
}

fn entries() -> Vec<Entry> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ERRORS.md")).unwrap();
    let mut out = Vec::new();
    let mut title = None;
    let (mut op, mut input, mut code, mut path) = (None, None, None, None);
    for line in page.lines() {
        if let Some(t) = line.strip_prefix("### ") {
            title = Some(t.to_owned());
        } else if let Some(rest) = line.strip_prefix("Input: `") {
            let (o, rest) = rest.split_once("` of `").unwrap();
            op = Some(o.to_owned());
            input = Some(rest.strip_suffix('`').unwrap().to_owned());
        } else if let Some(rest) = line.strip_prefix("Code: `") {
            let (c, rest) = rest.split_once('`').unwrap();
            code = Some(c.to_owned());
            path = Some(between(rest, "at `", "`").map_or("", |(p, _)| p).to_owned());
        } else if let Some(m) = line.strip_prefix("> ") {
            out.push(Entry {
                title: title.take().unwrap(),
                op: op.take().unwrap(),
                input: input.take().unwrap(),
                code: code.take().unwrap(),
                path: path.take().unwrap(),
                message: m.to_owned(),
                more: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("- `") {
            // "- `code` at `path`: message", after the entry's headline.
            let (c, rest) = rest.split_once('`').unwrap();
            let (p, m) = between(rest, "at `", "`").unwrap();
            let m = m.strip_prefix(": ").unwrap();
            out.last_mut()
                .unwrap()
                .more
                .push((c.to_owned(), p.to_owned(), m.to_owned()));
        }
    }
    out
}

#[test]
fn every_catalogued_mistake_gives_the_message_shown() {
    let entries = entries();
    assert!(
        entries.len() >= 10,
        "only {} mistakes catalogued",
        entries.len()
    );
    for e in entries {
        let result = match e.op.as_str() {
            "validate_policy" => api::validate_policy(&e.input).map(drop),
            "build_policy" => api::build_policy(REQUEST, &e.input).map(drop),
            "compile_policy_template" => api::compile_policy_template(&e.input).map(drop),
            "check_sent_request" => api::check_sent_request(
                &api::lift_request("openai.chat.completions", SENT).unwrap(),
                "/v1/chat/completions",
                e.input.as_bytes(),
            ),
            other => panic!("{}: unknown op {other}", e.title),
        };
        let err = result.expect_err(&e.title);
        assert_eq!(err.code.as_str(), e.code, "{}: code", e.title);
        assert_eq!(
            err.path.as_deref().unwrap_or(""),
            e.path,
            "{}: path",
            e.title
        );
        assert_eq!(err.message, e.message, "{}: message", e.title);
        let more: Vec<_> = err
            .more
            .iter()
            .map(|m| {
                (
                    m.code.as_str().to_owned(),
                    m.path.clone().unwrap_or_default(),
                    m.message.clone(),
                )
            })
            .collect();
        assert_eq!(more, e.more, "{}: the further errors", e.title);
    }
}
