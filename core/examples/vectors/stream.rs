//! `stream.json`: the stream contract, case by case.
//!
//! `stream_session` cases run a scripted session (each step an attempt's
//! facts and delta texts) and pin every judgement (with its stream action),
//! every decision, the consumer's event log, the receipt and the sealed
//! bundle's digest and verdict. `verify_bundle` cases forge event logs and
//! attempts (a splice, a commit before the terminal event, a delta after an
//! invalidate, altered deltas); `validate_policy` and `judge` cases pin the
//! contract's validation and the classifier's stream rules.

use retryledger_core::lab;
use serde_json::{json, Value};

use crate::common::{policy_with, t};
use crate::family::Family;

const MODES: [&str; 4] = ["buffer", "tentative", "continuation", "restart"];

fn contract(mode: &str) -> Value {
    json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500, "max_response_bytes": 65_536, "mode": mode})
}

fn stream_policy(mode: &str) -> String {
    t(&policy_with(&[("/stream", contract(mode))]))
}

fn bytes(deltas: &[&str]) -> usize {
    deltas.iter().map(|d| d.len()).sum()
}

/// Stream facts of an opened stream that received `deltas`.
fn stream_facts(deltas: &[&str], terminal: bool, extra: &[(&str, Value)]) -> Value {
    let mut s = json!({
        "bytes": bytes(deltas),
        "events": deltas.len(),
        "terminal_event": terminal,
        "usage_event": terminal,
    });
    for (k, v) in extra {
        s[*k] = v.clone();
    }
    s
}

/// An attempt whose stream completed with its terminal event.
fn done(deltas: &[&str]) -> Value {
    json!({"duration_ms": 60, "deltas": deltas, "facts": {"result": "returned", "stream": stream_facts(deltas, true, &[])}})
}

/// An attempt whose stream was cut after `deltas` (the SDK raised a connection error).
fn cut(deltas: &[&str]) -> Value {
    json!({"duration_ms": 40, "deltas": deltas, "facts": {
        "error_types": ["APIConnectionError", "APIError"], "result": "raised",
        "stream": stream_facts(deltas, false, &[])}})
}

/// A responses-style stream (numbered events, a response id) cut after `deltas`.
fn cut_numbered(deltas: &[&str], response_id: &str, last: u64) -> Value {
    json!({"duration_ms": 40, "deltas": deltas, "facts": {
        "error_types": ["APIConnectionError", "APIError"], "result": "raised",
        "stream": stream_facts(deltas, false, &[("response_id", json!(response_id)), ("last_sequence", json!(last))])}})
}

fn done_numbered(deltas: &[&str], response_id: &str, last: u64) -> Value {
    json!({"duration_ms": 60, "deltas": deltas, "facts": {
        "result": "returned",
        "stream": stream_facts(deltas, true, &[("response_id", json!(response_id)), ("last_sequence", json!(last))])}})
}

/// A failure before any stream opened (the dispatch raised with a status).
fn refused(status: u64) -> Value {
    json!({"duration_ms": 30, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": status}})
}

const A: &[&str] = &["The incident", " began at 09:14", " UTC."];
const B: &[&str] = &["Severity 2:", " checkout latency."];
const PARTIAL: &[&str] = &["The incident", " beg"];

pub fn family() -> Family {
    let mut f = Family::new(
        "stream",
        "stream_session: a streamed run step by step (judgement and stream action, decision, event log, receipt, sealed bundle and its verdict); verify_bundle of forged stream bundles; the stream contract's validation and the classifier's stream rules.",
        "every contract (buffer, tentative, continuation, restart) with a clean stream, a cut before output, a cut after output, a failure before the stream opened, a stream without its terminal event, and a terminal event after the deadline; continuation resumed, resumed twice, impossible without sequence numbers, failing over to a fallback after invalidate; fallback after invalidate; cancellation between and during attempts; protocol violations; facts that disagree with the deltas; forged logs (splice, commit before the terminal event, delta after invalidate, altered deltas, missing log, missing record, continuation drift); contract bounds",
    );
    let session = |f: &mut Family, name: &str, policy: &str, script: Vec<Value>, want: &str| {
        f.add(
            name,
            "stream_session",
            vec![
                ("policy", json!(policy)),
                ("script", json!(t(&json!(script)))),
            ],
            want,
        );
    };
    for mode in MODES {
        let p = stream_policy(mode);
        session(
            &mut f,
            &format!("stream_{mode}_clean"),
            &p,
            vec![done(A)],
            "commit",
        );
        session(
            &mut f,
            &format!("stream_{mode}_cut_before_output"),
            &p,
            vec![cut(&[]), done(A)],
            "completed",
        );
        let after: Vec<Value> = if mode == "restart" {
            vec![cut(PARTIAL)]
        } else {
            vec![cut(PARTIAL), done(A)]
        };
        let want = match mode {
            "restart" => "stop_indeterminate",
            "buffer" => "completed",
            _ => "invalidate",
        };
        session(
            &mut f,
            &format!("stream_{mode}_cut_after_output"),
            &p,
            after,
            want,
        );
        session(
            &mut f,
            &format!("stream_{mode}_failed_before_open"),
            &p,
            vec![refused(503), done(A)],
            "completed",
        );
        let no_terminal = json!({"duration_ms": 50, "deltas": PARTIAL, "facts": {"result": "returned", "stream": stream_facts(PARTIAL, false, &[])}});
        let script = if mode == "restart" {
            vec![no_terminal]
        } else {
            vec![no_terminal, done(A)]
        };
        session(
            &mut f,
            &format!("stream_{mode}_no_terminal_event"),
            &p,
            script,
            if mode == "restart" {
                "output_delivered"
            } else {
                "stream_cut"
            },
        );
        let late = json!({"duration_ms": 5_200, "deltas": A, "facts": {"result": "returned", "stream": stream_facts(A, true, &[])}});
        session(
            &mut f,
            &format!("stream_{mode}_late_terminal_loses"),
            &p,
            vec![late],
            "stop_deadline",
        );
    }
    let cont = stream_policy("continuation");
    session(
        &mut f,
        "stream_continuation_resumed",
        &cont,
        vec![
            cut_numbered(A, "resp_7Qx", 9),
            done_numbered(B, "resp_7Qx", 14),
        ],
        "continue",
    );
    session(
        &mut f,
        "stream_continuation_resumed_without_new_events_then_fallback",
        &cont,
        vec![
            cut_numbered(A, "resp_7Qx", 9),
            json!({"duration_ms": 40, "deltas": [], "facts": {"error_types": ["APIConnectionError"], "result": "raised", "stream": stream_facts(&[], false, &[])}}),
            done(B),
        ],
        "invalidate",
    );
    session(
        &mut f,
        "stream_continuation_resumed_twice",
        &t(&policy_with(&[
            ("/stream", contract("continuation")),
            ("/routes/0/max_attempts", json!(3)),
        ])),
        vec![
            cut_numbered(PARTIAL, "resp_9", 4),
            cut_numbered(&["an"], "resp_9", 5),
            done_numbered(B, "resp_9", 12),
        ],
        "resumed_attempts",
    );
    session(
        &mut f,
        "stream_continuation_without_sequence_numbers_restarts_fresh",
        &cont,
        vec![cut(PARTIAL), done(A)],
        "invalidate",
    );
    session(
        &mut f,
        "stream_continuation_error_event_non_retryable",
        &cont,
        vec![json!({"duration_ms": 40, "deltas": PARTIAL, "facts": {
            "error_types": ["BadRequestError", "APIStatusError"], "result": "raised", "status": 400,
            "stream": stream_facts(PARTIAL, false, &[("response_id", json!("resp_1")), ("last_sequence", json!(3))])}})],
        "stop_non_retryable",
    );
    session(
        &mut f,
        "stream_continuation_cancel_while_resumable",
        &cont,
        vec![cut_numbered(A, "resp_7Qx", 9), json!({"cancel": true})],
        "stop_cancelled",
    );
    let tent = stream_policy("tentative");
    session(
        &mut f,
        "stream_tentative_fallback_after_invalidate",
        &tent,
        vec![cut(PARTIAL), cut(&["The"]), done(B)],
        "fallback_used",
    );
    session(
        &mut f,
        "stream_tentative_rate_limited_error_event",
        &tent,
        vec![
            json!({"duration_ms": 40, "deltas": PARTIAL, "facts": {
                "error_types": ["RateLimitError", "APIStatusError"], "result": "raised", "status": 429,
                "headers": [["retry-after-ms", "300"]],
                "stream": stream_facts(PARTIAL, false, &[])}}),
            done(A),
        ],
        "rate_limited",
    );
    session(
        &mut f,
        "stream_tentative_cancelled_during_output",
        &tent,
        vec![json!({"duration_ms": 40, "deltas": PARTIAL, "facts": {
            "cancelled": true, "result": "raised", "stream": stream_facts(PARTIAL, false, &[])}})],
        "stream_interrupted_after_output",
    );
    session(
        &mut f,
        "stream_tentative_sequence_back_is_a_violation",
        &tent,
        vec![json!({"duration_ms": 40, "deltas": PARTIAL, "facts": {
            "error_types": ["StreamProtocolError"], "result": "raised",
            "stream": stream_facts(PARTIAL, false, &[("violation", json!("sequence_back"))])}})],
        "stream_violation",
    );
    session(
        &mut f,
        "stream_buffer_response_too_large",
        &stream_policy("buffer"),
        vec![json!({"duration_ms": 40, "deltas": A, "facts": {
            "error_types": ["StreamProtocolError"], "result": "raised",
            "stream": stream_facts(A, false, &[("violation", json!("response_too_large"))])}})],
        "protocol_violation",
    );
    // Facts that disagree with the deltas, or with the policy.
    session(
        &mut f,
        "stream_facts_events_disagree",
        &tent,
        vec![
            json!({"duration_ms": 40, "deltas": A, "facts": {"result": "returned", "stream": stream_facts(PARTIAL, true, &[])}}),
        ],
        "invalid_value",
    );
    let mut wrong_bytes = stream_facts(A, true, &[]);
    wrong_bytes["bytes"] = json!(3);
    session(
        &mut f,
        "stream_facts_bytes_disagree",
        &tent,
        vec![
            json!({"duration_ms": 40, "deltas": A, "facts": {"result": "returned", "stream": wrong_bytes}}),
        ],
        "invalid_value",
    );
    session(
        &mut f,
        "stream_facts_mode_disagrees",
        &tent,
        vec![
            json!({"duration_ms": 40, "deltas": A, "facts": {"result": "returned", "stream": stream_facts(A, true, &[("mode", json!("buffer"))])}}),
        ],
        "invalid_value",
    );
    session(
        &mut f,
        "stream_facts_without_contract",
        &t(&policy_with(&[])),
        vec![done(A)],
        "stream_record_unexpected",
    );
    session(
        &mut f,
        "stream_facts_bad_violation",
        &tent,
        vec![
            json!({"duration_ms": 40, "facts": {"result": "raised", "stream": stream_facts(&[], false, &[("violation", json!("rude"))])}}),
        ],
        "invalid_value",
    );
    forged(&mut f, &tent, &cont);
    for (name, edit, want) in [
        (
            "stream_contract_zero_bytes",
            json!({"max_response_bytes": 0, "mode": "tentative"}),
            "invalid_stream_contract",
        ),
        (
            "stream_contract_idle_beyond_deadline",
            json!({"idle_timeout_ms": 5_001, "max_response_bytes": 10, "mode": "tentative"}),
            "invalid_stream_contract",
        ),
        (
            "stream_contract_unknown_mode",
            json!({"max_response_bytes": 10, "mode": "splice"}),
            "invalid_value",
        ),
        (
            "stream_contract_unknown_field",
            json!({"max_response_bytes": 10, "mode": "buffer", "join": true}),
            "unknown_field",
        ),
        (
            "stream_contract_valid",
            json!({"max_response_bytes": 10, "mode": "restart"}),
            "ok",
        ),
    ] {
        f.policy(name, &t(&policy_with(&[("/stream", edit)])), want);
    }
    for (name, facts, want) in [
        (
            "judge_stream_cut",
            json!({"result": "raised", "error_types": ["RemoteProtocolError"], "stream": stream_facts(&[], false, &[])}),
            "stream_cut",
        ),
        (
            "judge_stream_timeout_is_not_a_cut",
            json!({"result": "raised", "error_types": ["ReadTimeout"], "stream": stream_facts(PARTIAL, false, &[("mode", json!("tentative"))])}),
            "timeout_before_response",
        ),
        (
            "judge_stream_restart_output_delivered",
            json!({"result": "raised", "stream": stream_facts(PARTIAL, false, &[("mode", json!("restart"))])}),
            "output_delivered",
        ),
        (
            "judge_stream_returned_without_terminal",
            json!({"result": "returned", "stream": stream_facts(A, false, &[("mode", json!("tentative"))])}),
            "stream_cut",
        ),
        (
            "judge_stream_violation",
            json!({"result": "returned", "stream": stream_facts(A, true, &[("violation", json!("malformed_event"))])}),
            "stream_violation",
        ),
        (
            "judge_stream_response_id_not_an_identifier",
            json!({"result": "returned", "stream": stream_facts(A, true, &[("response_id", json!("resp 1"))])}),
            "invalid_identifier",
        ),
    ] {
        f.judge(name, &t(&facts), want);
    }
    f
}

/// A sealed streamed bundle from a session script.
fn sealed(policy: &str, script: Vec<Value>) -> Value {
    let bundle = lab::stream_bundle(policy, &t(&json!(script))).expect("a session");
    retryledger_core::canonical::to_value(&bundle)
}

fn renumbered(mut events: Vec<Value>) -> Value {
    for (i, e) in events.iter_mut().enumerate() {
        e["sequence"] = json!(i + 1);
    }
    Value::Array(events)
}

/// Forged bundles: each changes one thing of a verified streamed run.
fn forged(f: &mut Family, tent: &str, cont: &str) {
    // Attempt 1 cut after output (invalidated), attempt 2 commits.
    let base = sealed(tent, vec![cut(PARTIAL), done(A)]);
    f.verify("stream_verify_sealed", &t(&base), "verified");
    let events: Vec<Value> = base["stream_events"].as_array().expect("events").clone();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["kind"].as_str().expect("kind"))
        .collect();
    let invalidate = kinds
        .iter()
        .position(|k| *k == "invalidate")
        .expect("an invalidate");
    let commit = kinds.len() - 1;

    let mut splice = events.clone();
    splice.remove(invalidate);
    let mut b = base.clone();
    b["stream_events"] = renumbered(splice);
    f.verify("stream_verify_splice", &t(&b), "stream_splice");

    let mut early = events.clone();
    early[commit]["attempt_ordinal"] = json!(1);
    let mut b = base.clone();
    b["stream_events"] = json!(early);
    f.verify(
        "stream_verify_commit_of_failed_attempt",
        &t(&b),
        "stream_commit_before_terminal",
    );

    let mut late_delta = events.clone();
    let stray = late_delta[0].clone();
    late_delta.insert(invalidate + 1, stray);
    let mut b = base.clone();
    b["stream_events"] = renumbered(late_delta);
    f.verify(
        "stream_verify_delta_after_invalidate",
        &t(&b),
        "stream_delta_after_invalidate",
    );

    let mut altered = events.clone();
    altered[invalidate + 1]["delta_sha256"] = json!(crate::common::id("other text"));
    let mut b = base.clone();
    b["stream_events"] = json!(altered);
    f.verify(
        "stream_verify_altered_delta",
        &t(&b),
        "stream_deltas_mismatch",
    );

    let mut status = events.clone();
    status[0]["status"] = json!("committed");
    let mut b = base.clone();
    b["stream_events"] = json!(status);
    f.verify("stream_verify_status_drift", &t(&b), "stream_event_drift");

    let mut dropped = events.clone();
    dropped.pop();
    let mut b = base.clone();
    b["stream_events"] = json!(dropped);
    f.verify("stream_verify_commit_missing", &t(&b), "stream_event_drift");

    let mut b = base.clone();
    b.as_object_mut().expect("bundle").remove("stream_events");
    f.verify("stream_verify_log_missing", &t(&b), "stream_event_drift");

    let mut b = base.clone();
    b["attempts"]["attempts"][1]["stream"]["terminal_event"] = json!(false);
    f.verify(
        "stream_verify_success_without_terminal_event",
        &t(&b),
        "stream_commit_before_terminal",
    );

    let mut b = base.clone();
    b["attempts"]["attempts"][0]
        .as_object_mut()
        .expect("attempt")
        .remove("stream");
    f.verify(
        "stream_verify_record_missing",
        &t(&b),
        "stream_record_missing",
    );

    let plain = t(&policy_with(&[]));
    let mut b = base.clone();
    b["policy"] = serde_json::from_str(&plain).expect("policy");
    f.verify(
        "stream_verify_record_unexpected",
        &t(&b),
        "stream_record_unexpected",
    );

    let resumed = sealed(
        cont,
        vec![
            cut_numbered(A, "resp_7Qx", 9),
            done_numbered(B, "resp_7Qx", 14),
        ],
    );
    f.verify(
        "stream_verify_continuation_sealed",
        &t(&resumed),
        "verified",
    );
    let mut b = resumed.clone();
    b["attempts"]["attempts"][1]["stream"]["starting_after"] = json!(7);
    f.verify(
        "stream_verify_continuation_drift",
        &t(&b),
        "continuation_drift",
    );
    // The same two attempts without the continuation: their output joined.
    let mut b = resumed.clone();
    let second = b["attempts"]["attempts"][1]["stream"]
        .as_object_mut()
        .expect("stream");
    second.remove("continues_ordinal");
    second.remove("starting_after");
    f.verify(
        "stream_verify_resumption_erased",
        &t(&b),
        "continuation_drift",
    );
}
