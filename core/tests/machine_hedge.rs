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
    clippy::arithmetic_side_effects,
    reason = "a test: a missing value is a failure, counts are small"
)]

use std::path::PathBuf;
use std::sync::Arc;

use retryledger_core::canonical::digest_of;
use retryledger_core::decode::from_value;
use retryledger_core::error::ErrorCode;
use retryledger_core::journal::{self, JournalEvent};
use retryledger_core::machine::script::{play, Script};
use retryledger_core::machine::{Effect, Event, Machine, Observation, Options};
use retryledger_core::observe::Facts;
use retryledger_core::{api, verify_bundle, Verdict};
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
        key: None,
        stream: None,
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

fn journal_options(lease_generation: u64, now_ms: u64) -> Options {
    Options {
        journal: Some(retryledger_core::machine::JournalOptions {
            run_id: from_value(json!("run-hedged-1")).unwrap(),
            lease_generation,
        }),
        origin_epoch_ms: NOW,
        now_ms,
        ..Options::default()
    }
}

const NOW: u64 = 1_780_000_000_000;

/// A hedged policy whose hedges may reserve the whole cost budget, under
/// a breaker and a retry budget.
fn hedged_fleet() -> Arc<retryledger_core::policy::CompiledPolicy> {
    hedged_fleet_with(false)
}

/// [`hedged_fleet`], with admission limits too when `limits`.
fn hedged_fleet_with(limits: bool) -> Arc<retryledger_core::policy::CompiledPolicy> {
    let mut p = retryledger_core::lab::reference_policy();
    p["hedge"] = json!({
        "cancelled_cost": "reserve", "cost_share_percent": 100, "delay_ms": 300,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]
    });
    p["fleet"] = json!({"breaker": {"consecutive_failures": 3, "half_open_probes": 1, "open_ms": 10_000},
        "on_store_unavailable": "fail_closed", "retry_budget": {
        "floor_per_second": 0, "max_tokens": 5, "ratio_permille": 500, "scope": "tenant-7/summaries"}});
    if limits {
        p["fleet"]["admission"] = json!({"max_in_flight": 2, "max_queue_ms": 1_000,
            "request_burst": 4, "requests_per_second": 10});
    }
    Arc::new(api::compile_policy(&p.to_string()).unwrap())
}

fn full_budget() -> Value {
    json!({"budget/tenant-7/summaries": {"balance_milli": 5_000, "deposits": 0, "generation": 0,
        "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
        "updated_at_epoch_ms": NOW, "withdrawals": 0}})
}

fn step(after_ms: u64, status: Option<u64>) -> Value {
    match status {
        None => json!({"after_ms": after_ms, "facts": {"result": "returned"}}),
        Some(s) => {
            json!({"after_ms": after_ms, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": s}})
        }
    }
}

/// Round 1: the lead and its hedge both fail; round 2: the hedge wins and
/// the lead is cancelled.
fn two_rounds() -> Script {
    Script::from_value(&json!({
        "attempts": [step(400, Some(503)), step(200, Some(503)), step(1_000, None), step(100, None)],
        "store": full_budget(),
    }))
    .unwrap()
}

/// The run is done, its journal verifies to the bundle's receipt, and the
/// bundle verifies (a resumed run's too: the snapshots the first owner
/// read come from its journal).
fn sealed(
    cp: &Arc<retryledger_core::policy::CompiledPolicy>,
    m: &Machine,
    journal: &[JournalEvent],
) {
    assert!(m.next().is_done());
    let bundle = m.seal().unwrap();
    // Every admission replays under the snapshots the bundle carries, the
    // first owner's too (its journal's `dispatched` events carry them).
    let verdict = verify_bundle(&bundle).unwrap();
    assert!(matches!(verdict, Verdict::Verified { .. }), "{verdict:?}");
    let verified = journal::verify(cp, journal).unwrap();
    assert_eq!(verified.summary().terminal, Some(bundle.receipt.terminal));
    let Some(journal::Payload::Terminal(end)) = journal.last().map(|e| &e.payload) else {
        panic!("the journal ends with its terminal")
    };
    assert_eq!(end.receipt_sha256.as_str(), digest_of(&bundle.receipt));
}

#[test]
fn a_hedged_journaled_run_under_a_budget_writes_each_member_and_verifies() {
    let cp = hedged_fleet();
    let mut m = Machine::start(Arc::clone(&cp), journal_options(1, 0)).unwrap();
    let played = play(&mut m, &two_rounds(), Vec::new());
    assert!(played.error.is_none(), "{:?}", played.error);
    sealed(&cp, &m, &played.journal);
    // Four members dispatched, each durable before it was sent, each observed.
    let count = |k: journal::EventKind| {
        played
            .journal
            .iter()
            .filter(|e| e.payload.kind() == k)
            .count()
    };
    assert_eq!(count(journal::EventKind::Dispatched), 4);
    assert_eq!(count(journal::EventKind::Observed), 4);
    let bundle = m.seal().unwrap();
    let summary = bundle.receipt.hedge.clone().unwrap();
    assert_eq!((summary.hedges, summary.winner_ordinal), (2, Some(4)));
    assert_eq!(summary.losers.len(), 1);
    // The same run without a journal reaches the same receipt.
    let mut plain = Machine::start(
        Arc::clone(&cp),
        Options {
            origin_epoch_ms: NOW,
            ..Options::default()
        },
    )
    .unwrap();
    let p = play(&mut plain, &two_rounds(), Vec::new());
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(
        digest_of(&plain.seal().unwrap().receipt),
        digest_of(&bundle.receipt)
    );
}

/// Crash the hedged run after every number of appends and resume it as a
/// new owner whose receiver answers `answer` about every member in doubt.
fn crash_everywhere(answer: &str, limits: bool) -> (usize, usize) {
    let cp = hedged_fleet_with(limits);
    let script = two_rounds();
    let mut m = Machine::start(Arc::clone(&cp), journal_options(1, 0)).unwrap();
    let full = play(&mut m, &script, Vec::new());
    assert!(full.error.is_none(), "{:?}", full.error);
    let total = full
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count() as u64;
    let (mut resumed_runs, mut with_doubt) = (0, 0);
    for k in 0..total {
        let mut m = Machine::start(Arc::clone(&cp), journal_options(1, 0)).unwrap();
        let crashed = play(
            &mut m,
            &Script {
                crash_after_appends: Some(k),
                ..script.clone()
            },
            Vec::new(),
        );
        assert!(crashed.error.is_none(), "crash at {k}: {:?}", crashed.error);
        assert!(crashed.crashed, "crash at {k}");
        journal::verify(&cp, &crashed.journal).unwrap();
        let kinds = |j: &[JournalEvent], kind: journal::EventKind| -> Vec<u64> {
            j.iter()
                .filter(|e| e.payload.kind() == kind)
                .filter_map(|e| match &e.payload {
                    journal::Payload::Dispatched(s) => Some(s.ordinal),
                    journal::Payload::Observed { attempt, .. } => Some(attempt.ordinal),
                    _ => None,
                })
                .collect()
        };
        let sent = kinds(&crashed.journal, journal::EventKind::Dispatched);
        let observed = kinds(&crashed.journal, journal::EventKind::Observed);
        let in_doubt: Vec<u64> = sent
            .iter()
            .filter(|n| !observed.contains(n))
            .copied()
            .collect();
        // The new owner: the dispatches not yet sent, a receiver that
        // answers about the members in doubt.
        let rest = Script {
            attempts: script.attempts[sent.len().min(script.attempts.len())..].to_vec(),
            reconcile: vec![json!({"answer": answer, "after_ms": 5}); 4],
            store: crashed
                .store
                .iter()
                .map(|(k, (d, _))| (k.clone(), d.clone()))
                .collect(),
            ..Script::default()
        };
        let mut r = Machine::resume(
            Arc::clone(&cp),
            &crashed.journal,
            journal_options(2, crashed.now_ms + 10),
        )
        .unwrap();
        let resumed = play(&mut r, &rest, crashed.journal.clone());
        assert!(
            resumed.error.is_none(),
            "resume at {k}: {:?}",
            resumed.error
        );
        assert!(!resumed.crashed);
        sealed(&cp, &r, &resumed.journal);
        resumed_runs += 1;
        // No ordinal is dispatched twice.
        let all_sent = kinds(&resumed.journal, journal::EventKind::Dispatched);
        let mut unique = all_sent.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all_sent.len(), "resume at {k}: {all_sent:?}");
        // Every member in doubt is settled by the receiver's answer (or,
        // once the round is decided, cancelled as a loser).
        let answers: Vec<(u64, Option<String>, bool)> = resumed
            .journal
            .iter()
            .filter_map(|e| match &e.payload {
                journal::Payload::Observed { attempt, .. }
                    if in_doubt.contains(&attempt.ordinal) =>
                {
                    Some((
                        attempt.ordinal,
                        attempt.reconciled.map(|r| r.as_str().to_owned()),
                        attempt.hedge.as_ref().and_then(|h| h.loss).is_some(),
                    ))
                }
                _ => None,
            })
            .collect();
        assert_eq!(answers.len(), in_doubt.len(), "resume at {k}");
        assert!(
            answers
                .iter()
                .all(|(_, reconciled, lost)| reconciled.is_some() || *lost),
            "resume at {k}: {answers:?}"
        );
        // A new attempt after a crash with members in doubt only when every
        // one of them was reconciled `failed_no_effect`.
        let sent_after = all_sent.len() > sent.len();
        if sent_after && !in_doubt.is_empty() {
            with_doubt += 1;
            assert!(
                answers
                    .iter()
                    .all(|(_, reconciled, _)| reconciled.as_deref() == Some("failed_no_effect")),
                "resume at {k}: sent again after {answers:?}"
            );
        }
    }
    (resumed_runs, with_doubt)
}

#[test]
fn a_hedged_fleet_journal_run_crashed_at_every_prefix_resumes_to_a_verified_end() {
    // Under a breaker and a retry budget, then with admission limits too.
    for limits in [false, true] {
        let (runs, resent) = crash_everywhere("failed_no_effect", limits);
        assert!(runs >= 10, "only {runs} crash points");
        // Some crash left members in doubt that the receiver cleared.
        assert!(
            resent >= 1,
            "no resumed run sent again after a reconciliation"
        );
        let (runs, resent) = crash_everywhere("succeeded", limits);
        assert!(runs >= 10, "only {runs} crash points");
        // A succeeded member in doubt completes its round: nothing is sent again.
        assert_eq!(resent, 0);
    }
}

#[test]
fn a_hedged_journal_written_one_attempt_at_a_time_still_verifies() {
    // What a journaled driver that ran a hedged policy's attempts one at a
    // time wrote: rounds of one. Its terminal holds the plain session's
    // receipt, and the hedged replay reaches the same one.
    use retryledger_core::journal::{Entry, Writer};
    use retryledger_core::outcome::{Outcome, RetryableKind};
    use retryledger_core::{Decision, Session};
    let cp = hedged(None);
    let mut session = Session::start(Arc::clone(&cp));
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    w.append_all(&[
        Entry::Created {
            created_at_epoch_ms: NOW,
            run_id: from_value(json!("run-sequential")).unwrap(),
        },
        Entry::Decided,
    ])
    .unwrap();
    let down = Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    };
    for (after, outcome) in [(100, down), (50, Outcome::Success)] {
        let Decision::Dispatch(d) = session.next().clone() else {
            panic!("a dispatch")
        };
        let start = d.not_before_ms;
        let attempt = d.attempt(start, start + after, d.reserve_cost, outcome);
        session
            .record(start, start + after, d.reserve_cost, outcome)
            .unwrap();
        w.append_all(&[
            Entry::Reserved {
                dispatch: None,
                cancelled_at_ms: None,
            },
            Entry::Dispatched {
                admission: None,
                snapshots: None,
                started_at_ms: start,
            },
            Entry::Observed {
                attempt,
                delta_digests: Vec::new(),
            },
            Entry::Decided,
        ])
        .unwrap();
    }
    let end = w
        .append(&Entry::Terminal {
            cancelled_at_ms: None,
            fleet_stop: None,
            snapshots: None,
        })
        .unwrap();
    let journal::Payload::Terminal(ending) = &end.payload else {
        panic!("a terminal")
    };
    assert_eq!(
        ending.receipt_sha256.as_str(),
        digest_of(&session.receipt().unwrap())
    );
}

#[test]
fn every_hedge_is_admitted_by_its_breaker_and_a_forged_one_is_drift() {
    let cp = hedged_fleet();
    let mut m = Machine::start(
        Arc::clone(&cp),
        Options {
            origin_epoch_ms: NOW,
            ..Options::default()
        },
    )
    .unwrap();
    let played = play(&mut m, &two_rounds(), Vec::new());
    assert!(played.error.is_none(), "{:?}", played.error);
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        Verdict::Verified { .. }
    ));
    let hedges: Vec<usize> = bundle
        .attempts
        .attempts
        .iter()
        .enumerate()
        .filter(|(_, a)| a.hedge.as_ref().is_some_and(|h| h.hedges_ordinal.is_some()))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hedges.len(), 2);
    for i in hedges {
        let adm = bundle.attempts.attempts[i].admission.as_ref().unwrap();
        assert!(adm.breaker.is_some() && adm.budget.is_some(), "{adm:?}");
        let mut forged = bundle.clone();
        forged.attempts.attempts[i]
            .admission
            .as_mut()
            .unwrap()
            .breaker = None;
        let v = verify_bundle(&forged).unwrap();
        assert!(
            matches!(&v, Verdict::Drift { code, .. } if code == "admission_drift"),
            "{v:?}"
        );
    }
    // Each member's outcome is recorded on its route's breaker.
    let breakers = played
        .store
        .iter()
        .filter(|(k, _)| k.starts_with("breaker/"))
        .count();
    assert_eq!(breakers, 2);
}

/// Arbitrary answers to a hedged run (alone, and under a breaker and a
/// budget; journaled or not, crashed and resumed from any prefix): every
/// refused answer is a coded error, every finished run seals a bundle that
/// verifies and a journal that verifies.
#[test]
fn arbitrary_answers_to_a_hedged_run_are_coded_errors_or_verified_states() {
    let cases: u64 = std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let (mut done, mut resumed, mut refused) = (0u64, 0u64, 0u64);
    for case in 0..cases {
        let len = 8 + (case % 200) as usize;
        let mut data: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect();
        // A hedged policy (both of 0x60 in the first byte).
        data[0] |= 0x60;
        match retryledger_core::machine::arbitrary::drive(&data) {
            Ok(r) => {
                assert!(r.hedged, "case {case}: not a hedged policy");
                done += u64::from(r.done);
                resumed += u64::from(r.resumed);
                refused += u64::from(r.refused);
            }
            Err(finding) => panic!("case {case} ({data:?}): {finding}"),
        }
    }
    assert!(done > cases / 10, "{done} of {cases} hedged runs finished");
    assert!(
        resumed > 0 && refused > 0,
        "resumed {resumed}, refused {refused}"
    );
}

#[test]
fn the_attempt_just_observed_is_known_before_its_round_is_resolved() {
    let mut m = Machine::start(hedged(None), Options::default()).unwrap();
    assert!(m.observed().is_none());
    m.answer(Event::Clock { now_ms: 200 }).unwrap();
    // The hedge wins while the lead is still in flight: the round is not
    // resolved, and the hedge's attempt is the one observed.
    m.answer(ok_at(Some(2), 300)).unwrap();
    assert!(m.hedge_attempts().unwrap().attempts.is_empty());
    let (attempt, judgement) = m.observed().unwrap();
    assert_eq!((attempt.ordinal, attempt.completed_at_ms), (2, 300));
    assert_eq!(judgement.outcome, attempt.outcome);
    // The live handle's `observed` says the same.
    let mut live =
        api::LiveMachine::start(&hedged_policy_text(), r#"{"origin_epoch_ms":0}"#).unwrap();
    live.answer_json(r#"{"kind":"clock","now_ms":200}"#)
        .unwrap();
    live.answer_json(
        r#"{"kind":"observed","ordinal":2,"completed_at_ms":300,"facts":{"result":"returned"}}"#,
    )
    .unwrap();
    let seen: Value = serde_json::from_str(&live.observed_json().unwrap()).unwrap();
    assert_eq!(seen["attempt"]["ordinal"], json!(2));
    assert_eq!(seen["judgement"]["outcome"], seen["attempt"]["outcome"]);
}

fn hedged_policy_text() -> String {
    let mut p = retryledger_core::lab::reference_policy();
    p["max_total_attempts"] = json!(6);
    p["routes"][0]["max_attempts"] = json!(3);
    p["routes"][1]["max_attempts"] = json!(3);
    p["hedge"] = json!({
        "cancelled_cost": "reserve", "cost_share_percent": 50, "delay_ms": 200,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]
    });
    p.to_string()
}
