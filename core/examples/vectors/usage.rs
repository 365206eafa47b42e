//! `usage.json`: what an attempt records of what it sent and what it used.
//!
//! `priced_session` cases run a scripted session under a price schedule:
//! usage reported per attempt (several reports add up) is recorded raw and
//! priced by the core, the receipt binds the schedule's digest, and the
//! digest of the request body each attempt sent is recorded, a retry on the
//! same route sending the same body. `verify_bundle` cases forge the
//! recorded usage, cost, schedule and bodies.

use retryledger_core::lab;
use serde_json::{json, Value};

use crate::common::{id, policy_with, reference, set, t};
use crate::family::Family;
use crate::price::schedule;

fn ok() -> Value {
    json!({"duration_ms": 80, "facts": {"result": "returned"}})
}

fn unavailable() -> Value {
    json!({"duration_ms": 30, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": 503}})
}

fn with(mut step: Value, edits: &[(&str, Value)]) -> Value {
    for (k, v) in edits {
        step[*k] = v.clone();
    }
    step
}

fn body(label: &str) -> Value {
    json!(id(label))
}

fn bundle(policy: &str, sched: &str, script: &Value) -> Value {
    let b = lab::priced_bundle(policy, sched, &t(script)).expect("a session");
    retryledger_core::canonical::to_value(&b)
}

pub fn family() -> Family {
    let mut f = Family::new(
        "usage",
        "priced_session: a run under a price schedule step by step (attempts with their raw usage and request body digests, judgements, decisions, the receipt binding the schedule, the sealed bundle's digest and verdict); verify_bundle of bundles whose usage, cost, schedule or request bodies were forged.",
        "usage priced on success, reports adding up, kinds priced per release, failures keeping their reservation, a fallback priced on its own release; usage with a hand charge, unpriced kinds, overflow, a schedule for another cost unit or missing a release; the same body on every retry, another body on a fallback route, a body that changes on a retry or appears on a retry; forged costs, a missing or altered schedule, a forged body",
    );
    let policy = t(&reference());
    let sched = schedule();
    let s = t(&sched);
    let session = |f: &mut Family, name: &str, p: &str, sc: &str, script: Value, want: &str| {
        f.add(
            name,
            "priced_session",
            vec![
                ("policy", json!(p)),
                ("schedule", json!(sc)),
                ("script", json!(t(&script))),
            ],
            want,
        );
    };
    let usage = |u: Value| ("usage", json!([u]));
    let sent = |label: &str| ("request_body_sha256", body(label));

    session(
        &mut f,
        "usage_priced_on_success",
        &policy,
        &s,
        json!([with(ok(), &[usage(json!({"input": 1200, "output": 350}))])]),
        "price_schedule_sha256",
    );
    session(
        &mut f,
        "usage_reports_add_up",
        &policy,
        &s,
        json!([with(
            ok(),
            &[(
                "usage",
                json!([{"input": 1000}, {"input": 200, "output": 350}])
            )]
        )]),
        "verified",
    );
    session(
        &mut f,
        "usage_failure_keeps_reservation",
        &policy,
        &s,
        json!([
            unavailable(),
            with(ok(), &[usage(json!({"input": 10, "output": 1}))])
        ]),
        "verified",
    );
    session(
        &mut f,
        "usage_failure_with_usage",
        &policy,
        &s,
        json!([with(unavailable(), &[usage(json!({"input": 40}))]), ok()]),
        "verified",
    );
    session(
        &mut f,
        "usage_charged_by_hand_without_usage",
        &policy,
        &s,
        json!([with(ok(), &[("cost", json!(7))])]),
        "verified",
    );
    session(
        &mut f,
        "usage_no_usage_no_body",
        &policy,
        &s,
        json!([unavailable(), ok()]),
        "verified",
    );
    session(
        &mut f,
        "usage_with_hand_charge",
        &policy,
        &s,
        json!([with(
            ok(),
            &[usage(json!({"input": 10})), ("cost", json!(7))]
        )]),
        "charge_with_usage",
    );
    session(
        &mut f,
        "usage_unpriced_kind",
        &policy,
        &s,
        json!([with(ok(), &[usage(json!({"reasoning": 10}))])]),
        "usage_unpriced",
    );
    session(
        &mut f,
        "usage_reports_overflow",
        &policy,
        &s,
        json!([with(
            ok(),
            &[(
                "usage",
                json!([{"input": 9_007_199_254_740_991u64}, {"input": 1}])
            )]
        )]),
        "arithmetic_overflow",
    );
    let mut dear = sched.clone();
    set(
        &mut dear,
        "/releases/0/prices_per_million/input",
        json!(3_000_000),
    );
    session(
        &mut f,
        "usage_cost_overflow",
        &policy,
        &t(&dear),
        json!([with(
            ok(),
            &[usage(
                json!({"input": 9_007_199_254_740_991u64, "output": 9_007_199_254_740_991u64})
            )]
        )]),
        "arithmetic_overflow",
    );
    let mut other_unit = sched.clone();
    set(&mut other_unit, "/cost_unit", json!("usd_cents"));
    session(
        &mut f,
        "usage_schedule_other_cost_unit",
        &policy,
        &t(&other_unit),
        json!([ok()]),
        "cost_unit_mismatch",
    );
    let mut missing = sched.clone();
    missing["releases"].as_array_mut().expect("releases").pop();
    session(
        &mut f,
        "usage_schedule_missing_release",
        &policy,
        &t(&missing),
        json!([ok()]),
        "price_schedule_missing_release",
    );

    // Request bodies. The reference policy allows two attempts on the
    // primary before its fallback.
    session(
        &mut f,
        "body_same_on_every_retry",
        &policy,
        &s,
        json!([
            with(unavailable(), &[sent("body a")]),
            with(ok(), &[sent("body a")])
        ]),
        "request_body_sha256",
    );
    let exhaust = |label_fallback: &str| {
        json!([
            with(unavailable(), &[sent("body a")]),
            with(unavailable(), &[sent("body a")]),
            with(ok(), &[sent(label_fallback)]),
        ])
    };
    session(
        &mut f,
        "body_fallback_lowers_its_own",
        &policy,
        &s,
        exhaust("body b"),
        "verified",
    );
    session(
        &mut f,
        "body_changes_on_retry",
        &policy,
        &s,
        json!([
            with(unavailable(), &[sent("body a")]),
            with(ok(), &[sent("body b")])
        ]),
        "request_body_drift",
    );
    session(
        &mut f,
        "body_appears_on_retry",
        &policy,
        &s,
        json!([unavailable(), with(ok(), &[sent("body a")])]),
        "request_body_drift",
    );
    session(
        &mut f,
        "body_disappears_on_retry",
        &policy,
        &s,
        json!([with(unavailable(), &[sent("body a")]), ok()]),
        "request_body_drift",
    );
    session(
        &mut f,
        "body_and_usage_together",
        &policy,
        &s,
        json!([
            with(unavailable(), &[sent("body a")]),
            with(
                ok(),
                &[sent("body a"), usage(json!({"input": 500, "output": 20}))]
            ),
        ]),
        "verified",
    );
    session(
        &mut f,
        "body_bad_digest",
        &policy,
        &s,
        json!([with(ok(), &[("request_body_sha256", json!("ABC"))])]),
        "invalid_digest",
    );
    let streaming = t(&policy_with(&[(
        "/stream",
        json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500, "max_response_bytes": 65_536, "mode": "tentative"}),
    )]));
    session(
        &mut f,
        "usage_streamed_attempt",
        &streaming,
        &s,
        json!([{
            "deltas": ["Hello", " world"],
            "duration_ms": 60,
            "facts": {"result": "returned", "stream": {"bytes": 11, "events": 2, "terminal_event": true, "usage_event": true}},
            "request_body_sha256": body("streamed body"),
            "usage": [{"input": 30, "output": 2}],
        }]),
        "verified",
    );

    // Forged bundles.
    let priced = json!([
        with(unavailable(), &[sent("body a")]),
        with(
            ok(),
            &[sent("body a"), usage(json!({"input": 1200, "output": 350}))]
        ),
    ]);
    let base = bundle(&policy, &s, &priced);
    f.verify("usage_verify_sealed", &t(&base), "verified");
    let mut b = base.clone();
    set(&mut b, "/attempts/attempts/1/cost", json!(1));
    f.verify("usage_verify_cost_forged", &t(&b), "usage_cost_drift");
    let mut b = base.clone();
    set(&mut b, "/attempts/attempts/1/usage/input", json!(12));
    f.verify("usage_verify_usage_forged", &t(&b), "usage_cost_drift");
    let mut b = base.clone();
    b.as_object_mut().expect("bundle").remove("price_schedule");
    f.verify(
        "usage_verify_schedule_missing",
        &t(&b),
        "price_schedule_missing",
    );
    let mut b = base.clone();
    set(
        &mut b,
        "/price_schedule/releases/0/prices_per_million/input",
        json!(1),
    );
    f.verify("usage_verify_schedule_altered", &t(&b), "usage_cost_drift");
    let mut b = base.clone();
    set(
        &mut b,
        "/price_schedule/releases/1/prices_per_million/input",
        json!(1),
    );
    f.verify("usage_verify_schedule_digest", &t(&b), "receipt_mismatch");
    let mut b = base.clone();
    set(&mut b, "/price_schedule/cost_unit", json!("usd_cents"));
    f.verify(
        "usage_verify_schedule_other_unit",
        &t(&b),
        "cost_unit_mismatch",
    );
    let mut b = base.clone();
    set(
        &mut b,
        "/attempts/attempts/1/request_body_sha256",
        body("body b"),
    );
    f.verify("usage_verify_body_forged", &t(&b), "request_body_drift");
    let mut b = base.clone();
    set(
        &mut b,
        "/attempts/attempts/0/usage",
        json!({"reasoning": 3}),
    );
    f.verify("usage_verify_usage_unpriced", &t(&b), "usage_unpriced");
    f
}
