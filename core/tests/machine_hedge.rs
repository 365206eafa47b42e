//! The hedge layer of the run machine: every `hedge_session` vector of
//! `tests/vectors/hedge.json` replayed through the machine reaches the
//! bundle the hedge session pinned (or a refusal where the session refused),
//! and the machine's protocol for attempts in flight refuses what does not
//! fit.
#![cfg(feature = "lab")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "a test: a missing value is a failure"
)]

use std::path::PathBuf;
use std::sync::Arc;

use retryledger_core::canonical::digest_of;
use retryledger_core::decode::from_value;
use retryledger_core::error::ErrorCode;
use retryledger_core::machine::{Effect, Event, Machine, Observation, Options};
use retryledger_core::observe::Facts;
use retryledger_core::{api, verify_bundle};
use serde_json::{json, Value};

fn hedge_vectors() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests")
        .join("vectors")
        .join("hedge.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["op"] == "hedge_session")
        .cloned()
        .collect()
}

/// What replaying a session script through the machine gave.
#[derive(Debug)]
enum Replayed {
    /// The run ended: its bundle's digest.
    Sealed(String),
    /// The machine refused an event (or the run could not be sealed).
    Refused(ErrorCode),
    /// The script does the machine's part (a lead started later than the
    /// machine sends it): not a host's answer.
    NotAHostScript,
}

fn observed(step: &Value, ordinal: u64) -> Event {
    let facts: Facts = from_value(step["facts"].clone()).unwrap();
    Event::Observed(Box::new(Observation {
        ordinal: Some(ordinal),
        completed_at_ms: step["at"].as_u64().unwrap(),
        cost: step.get("cost").and_then(Value::as_u64),
        facts: Some(facts),
        ..Observation::default()
    }))
}

/// Feed the machine the answers a host gives for the session `script`.
fn replay(policy: &str, script: &[Value]) -> Replayed {
    let cp = Arc::new(api::compile_policy(policy).unwrap());
    let mut m = match Machine::start(cp, Options::default()) {
        Ok(m) => m,
        Err(e) => return Replayed::Refused(e.code),
    };
    for step in script {
        let at = step.get("at").and_then(Value::as_u64).unwrap_or(0);
        let event = if let Some(n) = step.get("start").and_then(Value::as_u64) {
            // The host's part of a start: the clock reading that lets the
            // machine send it (a lead's wait or a hedge's threshold).
            match m.next().clone() {
                Effect::Dispatch { dispatch, .. } if dispatch.ordinal == n => {
                    if m.now_ms() != at {
                        return Replayed::NotAHostScript;
                    }
                    continue;
                }
                Effect::Sleep { .. }
                | Effect::Dispatch {
                    hedge_at_ms: Some(_),
                    ..
                }
                | Effect::Await {
                    hedge_at_ms: Some(_),
                    ..
                } => Event::Clock { now_ms: at },
                _ => Event::Clock { now_ms: at },
            }
        } else if let Some(n) = step.get("observe").and_then(Value::as_u64) {
            observed(step, n)
        } else if let Some(n) = step.get("cancelled").and_then(Value::as_u64) {
            Event::AttemptCancelled {
                ordinal: n,
                at_ms: at,
            }
        } else if let Some(at) = step.get("cancel_run").and_then(Value::as_u64) {
            Event::Cancelled { at_ms: at }
        } else {
            panic!("an unknown step {step}");
        };
        if let Err(e) = m.answer(event) {
            return Replayed::Refused(e.code);
        }
        if let Some(n) = step.get("start").and_then(Value::as_u64) {
            match m.next() {
                Effect::Dispatch {
                    dispatch,
                    started_at_ms,
                    ..
                } if dispatch.ordinal == n && *started_at_ms == at => {}
                other => panic!("start {n} at {at}: the machine asks {other:?}"),
            }
        }
    }
    match m.seal() {
        Ok(bundle) => {
            verify_bundle(&bundle).unwrap();
            Replayed::Sealed(digest_of(&bundle))
        }
        Err(e) => Replayed::Refused(e.code),
    }
}

#[test]
fn every_hedge_session_vector_replays_through_the_machine() {
    let cases = hedge_vectors();
    let (mut sealed, mut refused, mut same) = (0, 0, 0);
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let policy = c["input"]["policy"].as_str().unwrap();
        let script: Vec<Value> =
            serde_json::from_str(c["input"]["script"].as_str().unwrap()).unwrap();
        let got = replay(policy, &script);
        match (&c["expect"]["ok"]["bundle_sha256"], &got) {
            (Value::String(want), Replayed::Sealed(d)) => {
                assert_eq!(want, d, "{name}: another bundle through the machine");
                sealed += 1;
            }
            (Value::String(_), other) => {
                panic!("{name}: the session sealed, the machine {other:?}")
            }
            (_, Replayed::Sealed(d)) => {
                panic!("{name}: the session refused, the machine sealed {d}")
            }
            (_, Replayed::NotAHostScript) => refused += 1,
            (_, Replayed::Refused(code)) => {
                // The machine refuses with the session's code, or never
                // asks for what the script forces (a hedge it does not
                // offer, a cancel before the round is decided).
                let want = c["expect"]["error"]["code"].as_str().unwrap();
                assert!(
                    code.as_str() == want || *code == ErrorCode::UnexpectedEvent,
                    "{name}: the session refused {want}, the machine {code:?}"
                );
                same += usize::from(code.as_str() == want);
                refused += 1;
            }
        }
    }
    // Every successful session and every refusal is covered.
    assert_eq!(sealed + refused, cases.len());
    assert!(sealed >= 12, "only {sealed} sealed session vectors");
    assert!(refused >= 8, "only {refused} refused session vectors");
    assert!(
        same >= 3,
        "only {same} refusals with the session's own code"
    );
}

fn hedged(fleet: Option<Value>) -> Arc<retryledger_core::policy::CompiledPolicy> {
    let mut p = retryledger_core::lab::reference_policy();
    p["max_total_attempts"] = json!(6);
    p["routes"][0]["max_attempts"] = json!(3);
    p["routes"][1]["max_attempts"] = json!(3);
    p["hedge"] = json!({
        "cancelled_cost": "reserve", "cost_share_percent": 50, "delay_ms": 200,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]
    });
    if let Some(f) = fleet {
        p["fleet"] = f;
    }
    Arc::new(api::compile_policy(&p.to_string()).unwrap())
}

fn ok_at(ordinal: Option<u64>, at: u64) -> Event {
    Event::Observed(Box::new(Observation {
        ordinal,
        completed_at_ms: at,
        facts: Some(Facts::returned()),
        ..Observation::default()
    }))
}

#[test]
fn a_hedge_is_a_dispatch_while_the_lead_is_in_flight() {
    let mut m = Machine::start(hedged(None), Options::default()).unwrap();
    let Effect::Dispatch {
        dispatch,
        hedge_at_ms: Some(200),
        ..
    } = m.next().clone()
    else {
        panic!("a lead with a hedge due: {:?}", m.next())
    };
    assert_eq!(dispatch.ordinal, 1);
    // Early clock: the hedge is not due.
    let e = m.answer(Event::Clock { now_ms: 150 }).unwrap_err();
    assert_eq!(e.code, ErrorCode::HedgeBeforeThreshold);
    m.answer(Event::Clock { now_ms: 200 }).unwrap();
    let Effect::Dispatch {
        dispatch,
        hedge_at_ms: None,
        started_at_ms: 200,
    } = m.next().clone()
    else {
        panic!("the hedge: {:?}", m.next())
    };
    assert_eq!(
        (dispatch.ordinal, dispatch.route_id.as_str()),
        (2, "external-fallback")
    );
    // Two in flight: an observation names its attempt.
    let e = m.answer(ok_at(None, 300)).unwrap_err();
    assert_eq!(e.code, ErrorCode::MissingField);
    let e = m.answer(ok_at(Some(3), 300)).unwrap_err();
    assert_eq!(e.code, ErrorCode::OrdinalDrift);
    m.answer(ok_at(Some(2), 300)).unwrap();
    assert_eq!(
        m.next(),
        &Effect::CancelAttempts {
            decided_by: 2,
            ordinals: vec![1]
        }
    );
    let e = m
        .answer(Event::AttemptCancelled {
            ordinal: 2,
            at_ms: 301,
        })
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::OrdinalDrift);
    m.answer(Event::AttemptCancelled {
        ordinal: 1,
        at_ms: 301,
    })
    .unwrap();
    assert!(m.next().is_done());
    let bundle = m.seal().unwrap();
    verify_bundle(&bundle).unwrap();
    let summary = bundle.receipt.hedge.unwrap();
    assert_eq!(summary.winner_ordinal, Some(2));
    assert_eq!(summary.losers.len(), 1);
}

#[test]
fn a_hedged_journal_is_refused_until_it_is_a_layer() {
    let o = Options {
        journal: Some(retryledger_core::machine::JournalOptions {
            run_id: from_value(json!("run-1")).unwrap(),
            lease_generation: 1,
        }),
        ..Options::default()
    };
    let e = Machine::start(hedged(None), o).unwrap_err();
    assert_eq!(e.code, ErrorCode::MachineLayerMissing);
}
