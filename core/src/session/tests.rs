//! The session driven step by step against the reference run and the vectors.

use super::*;
use crate::lab;
use crate::{compile, evaluate, plan_next};

#[test]
fn a_session_reaches_the_reference_receipt_step_by_step() {
    let bundle = lab::reference_bundle().unwrap();
    let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
    let mut session = Session::start(policy.clone());
    for a in &bundle.attempts.attempts {
        assert_eq!(
            session.next(),
            &plan_next(&policy, session.attempts()).unwrap()
        );
        session
            .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
            .unwrap();
    }
    assert_eq!(session.attempts(), &bundle.attempts);
    assert_eq!(session.receipt().unwrap(), bundle.receipt);
    assert_eq!(session.seal().unwrap(), bundle);
}

#[test]
fn a_host_digest_of_the_attempts_gives_the_same_receipt() {
    let bundle = lab::reference_bundle().unwrap();
    let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
    let mut session = Session::start(policy);
    for a in &bundle.attempts.attempts {
        session
            .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
            .unwrap();
    }
    let text = crate::canonical::canonical_json(session.attempts());
    let hex = crate::canonical::sha256_hex(text.as_bytes());
    assert_eq!(
        session.receipt_with_attempts_sha256(&hex).unwrap(),
        bundle.receipt
    );
    let e = session.receipt_with_attempts_sha256("ABC").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidDigest);
}

/// A document encoded by a function (for the encoders that write from a session or run).
struct Encoded<F: Fn(&mut dyn crate::canonical::Sink)>(F);

impl<F: Fn(&mut dyn crate::canonical::Sink)> crate::canonical::Encode for Encoded<F> {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        (self.0)(sink);
    }
}

/// A sink that records whether anything was written to it.
#[derive(Default)]
struct Untouched(bool);

impl crate::canonical::Sink for Untouched {
    fn begin_object(&mut self) {
        self.0 = true;
    }
    fn key(&mut self, _: &str) {
        self.0 = true;
    }
    fn end_object(&mut self) {
        self.0 = true;
    }
    fn begin_array(&mut self) {
        self.0 = true;
    }
    fn end_array(&mut self) {
        self.0 = true;
    }
    fn u64(&mut self, _: u64) {
        self.0 = true;
    }
    fn bool(&mut self, _: bool) {
        self.0 = true;
    }
    fn str(&mut self, _: &str) {
        self.0 = true;
    }
}

#[test]
fn the_receipt_encoded_from_the_session_is_the_receipt() {
    let bundle = lab::reference_bundle().unwrap();
    let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
    let mut session = Session::start(policy);
    let hex = "ab".repeat(32);
    let mut sink = Untouched::default();
    let e = session
        .encode_receipt_with_attempts_sha256(&hex, &mut sink)
        .unwrap_err();
    assert_eq!((e.code, sink.0), (ErrorCode::RunNotTerminal, false));
    for a in &bundle.attempts.attempts {
        session
            .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
            .unwrap();
    }
    let e = session
        .encode_receipt_with_attempts_sha256("ABC", &mut sink)
        .unwrap_err();
    assert_eq!((e.code, sink.0), (ErrorCode::InvalidDigest, false));
    let encoded = crate::canonical::canonical_json(&Encoded(|s| {
        session
            .encode_receipt_with_attempts_sha256(&hex, s)
            .unwrap();
    }));
    let owned = session.receipt_with_attempts_sha256(&hex).unwrap();
    assert_eq!(encoded, crate::canonical::canonical_json(&owned));
}

/// Every run the conformance vectors hold (a policy and its attempts,
/// replayed to a terminal: fleets, jobs, streams, hedges, injected
/// faults): the receipt encoded from the run has the owned receipt's
/// canonical bytes, with and without a price schedule's digest.
#[test]
fn the_receipt_encoded_from_a_run_is_the_receipt_for_every_vector() {
    fn walk(v: &serde_json::Value, found: &mut Vec<(String, String)>) {
        let text = |x: &serde_json::Value| match x {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match v {
            serde_json::Value::Object(m) => {
                if let (Some(p), Some(a)) = (m.get("policy"), m.get("attempts")) {
                    found.push((text(p), text(a)));
                }
                m.values().for_each(|x| walk(x, found));
            }
            serde_json::Value::Array(xs) => xs.iter().for_each(|x| walk(x, found)),
            // A document given as its text (a bundle to verify).
            serde_json::Value::String(s) if s.starts_with('{') => {
                if let Ok(doc) = serde_json::from_str::<serde_json::Value>(s) {
                    walk(&doc, found);
                }
            }
            _ => {}
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let doc: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            walk(&doc, &mut found);
        }
    }
    let digest = Sha256Hex::computed("cd".repeat(32));
    let mut compared = 0;
    let parts = ["fleet", "hedge", "job", "stream", "injected_faults"];
    let mut covered = [false; 5];
    for (policy, attempts) in &found {
        let Ok(cp) = crate::api::compile_policy(policy) else {
            continue;
        };
        let Ok(attempts) = crate::api::decode_attempts(attempts) else {
            continue;
        };
        let Ok(run) = crate::evaluate::replay(&cp, &attempts) else {
            continue;
        };
        let Ok(mut owned) = run.receipt(&cp, digest.as_str().to_owned()) else {
            continue;
        };
        for price in [None, Some(Sha256Hex::computed("ef".repeat(32)))] {
            owned.price_schedule_sha256 = price.clone();
            let encoded = crate::canonical::canonical_json(&Encoded(|s| {
                run.encode_receipt(&cp, &digest, price.as_ref(), s).unwrap();
            }));
            assert_eq!(encoded, crate::canonical::canonical_json(&owned));
        }
        compared += 1;
        let has = [
            owned.fleet.is_some(),
            owned.hedge.is_some(),
            owned.job.is_some(),
            owned.stream.is_some(),
            owned.injected_faults.is_some(),
        ];
        for (seen, h) in covered.iter_mut().zip(has) {
            *seen |= h;
        }
    }
    assert!(compared >= 50, "only {compared} runs compared");
    assert_eq!(covered, [true; 5], "{parts:?}: not every part met");
}

#[test]
fn drift_leaves_the_session_unchanged() {
    let bundle = lab::reference_bundle().unwrap();
    let policy = Arc::new(compile(bundle.policy.clone()).unwrap());
    let mut session = Session::start(policy.clone());
    let a = &bundle.attempts.attempts[0];
    session
        .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
        .unwrap();
    let before = session.next().clone();
    let e = session
        .record(1_300, 1_400, 0, Outcome::Success)
        .unwrap_err();
    assert_eq!((e.code, e.attempt_index), (ErrorCode::EarlyStart, Some(1)));
    let e = session
        .record(1_400, 1_399, 0, Outcome::Success)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CompletedBeforeStarted);
    assert_eq!(session.next(), &before);
    assert_eq!(session.attempts().attempts.len(), 1);
    assert_eq!(
        session.receipt().unwrap_err().code,
        ErrorCode::RunNotTerminal
    );
    session.cancel(1_200).unwrap();
    let receipt = session.receipt().unwrap();
    assert_eq!(receipt, evaluate(&policy, session.attempts()).unwrap());
    assert_eq!(receipt.terminal.as_str(), "stop_cancelled");
    assert_eq!(
        session.cancel(1_300).unwrap_err().code,
        ErrorCode::CancelDrift
    );
    let e = session
        .record(1_400, 1_500, 0, Outcome::Success)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::AttemptAfterTerminal);
}
