//! Durable runs through the public API: a crash after every journal prefix,
//! recovery under a new lease generation with each receiver answer, and the
//! fenced owner's late append.
#![cfg(feature = "lab")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use std::sync::Arc;

use retryledger_core::attempt::Reconciled;
use retryledger_core::canonical::{canonical_json, digest_of, to_jcs};
use retryledger_core::decode::{from_str, parse_strict};
use retryledger_core::journal::{
    append, classify_append, recover, verify, Answer, AnswerKind, Entry, EventKind, JournalEvent,
    Offer, Reconciliation, ReconciliationSchema, Recovery,
};
use retryledger_core::{compile, evaluate, lab, CompiledPolicy, Decision, ErrorCode, Session};

fn policy() -> Arc<CompiledPolicy> {
    Arc::new(compile(lab::reference_bundle().unwrap().policy).unwrap())
}

fn run_id() -> retryledger_core::ids::Identifier {
    retryledger_core::ids::Identifier::parse("run-1").unwrap()
}

fn push(cp: &CompiledPolicy, events: &mut Vec<JournalEvent>, generation: u64, entry: Entry) {
    let e = append(cp, events, generation, &entry).unwrap();
    events.push(e);
}

/// The reference run's journal, written as a host would under generation 1.
fn reference_journal(cp: &Arc<CompiledPolicy>) -> Vec<JournalEvent> {
    let bundle = lab::reference_bundle().unwrap();
    let mut events = Vec::new();
    push(
        cp,
        &mut events,
        1,
        Entry::Created {
            created_at_epoch_ms: 1_780_000_000_000,
            run_id: run_id(),
        },
    );
    push(cp, &mut events, 1, Entry::Decided);
    let mut session = Session::start(Arc::clone(cp));
    for a in &bundle.attempts.attempts {
        push(
            cp,
            &mut events,
            1,
            Entry::Reserved {
                dispatch: None,
                cancelled_at_ms: None,
            },
        );
        push(
            cp,
            &mut events,
            1,
            Entry::Dispatched {
                admission: None,
                snapshots: None,
                started_at_ms: a.started_at_ms,
            },
        );
        session
            .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
            .unwrap();
        let attempt = session.attempts().attempts.last().unwrap().clone();
        push(
            cp,
            &mut events,
            1,
            Entry::Observed {
                attempt,
                delta_digests: Vec::new(),
            },
        );
        push(cp, &mut events, 1, Entry::Decided);
    }
    push(
        cp,
        &mut events,
        1,
        Entry::Terminal {
            cancelled_at_ms: None,
            fleet_stop: None,
            snapshots: None,
        },
    );
    events
}

fn answers(ordinal: u64, list: &[(AnswerKind, u64)]) -> Reconciliation {
    Reconciliation {
        answers: list
            .iter()
            .map(|(answer, at_ms)| Answer {
                answer: *answer,
                at_ms: *at_ms,
                cost: None,
                job_sha256: None,
            })
            .collect(),
        max_polls: 4,
        ordinal,
        schema: ReconciliationSchema,
    }
}

/// Drive a recovered run to its end as a new owner under `generation`: the
/// receiver answers `answer` for every attempt in doubt, and every later
/// attempt succeeds at once. Counts resubmissions of an attempt in doubt.
fn finish(
    cp: &CompiledPolicy,
    events: &mut Vec<JournalEvent>,
    generation: u64,
    answer: AnswerKind,
) -> u64 {
    let mut resubmitted = 0;
    let mut in_doubt: Vec<u64> = Vec::new();
    for _ in 0..64 {
        match recover(cp, events, None).unwrap() {
            Recovery::Done { .. } => return resubmitted,
            Recovery::Resume { next, dispatch, .. } => {
                if let Some(d) = &dispatch {
                    if next == EventKind::Dispatched && in_doubt.contains(&d.ordinal) {
                        resubmitted += 1;
                    }
                }
                let entry = match next {
                    EventKind::Reserved => Entry::Reserved {
                        dispatch: None,
                        cancelled_at_ms: None,
                    },
                    EventKind::Dispatched => Entry::Dispatched {
                        admission: None,
                        snapshots: None,
                        started_at_ms: dispatch.unwrap().not_before_ms,
                    },
                    EventKind::Decided => Entry::Decided,
                    EventKind::Terminal => Entry::Terminal {
                        cancelled_at_ms: None,
                        fleet_stop: None,
                        snapshots: None,
                    },
                    EventKind::Created | EventKind::Observed => panic!("unexpected {next:?}"),
                };
                push(cp, events, generation, entry);
                // A fresh dispatch by the new owner: observe it at once.
                if next == EventKind::Dispatched {
                    let Recovery::Reconcile { attempt, .. } = recover(cp, events, None).unwrap()
                    else {
                        panic!("a dispatched attempt waits for its observation")
                    };
                    let rec = answers(
                        attempt.ordinal,
                        &[(AnswerKind::Succeeded, attempt.started_at_ms + 10)],
                    );
                    let Recovery::Adopt { mut attempt, .. } =
                        recover(cp, events, Some(&rec)).unwrap()
                    else {
                        panic!("a settled answer is adopted")
                    };
                    // Observed directly, not reconciled.
                    attempt.reconciled = None;
                    push(
                        cp,
                        events,
                        generation,
                        Entry::Observed {
                            attempt,
                            delta_digests: Vec::new(),
                        },
                    );
                }
            }
            Recovery::Reconcile {
                attempt,
                not_before_ms,
                ..
            } => {
                in_doubt.push(attempt.ordinal);
                let rec = answers(attempt.ordinal, &[(answer, not_before_ms + 50)]);
                let Recovery::Adopt {
                    attempt: adopted, ..
                } = recover(cp, events, Some(&rec)).unwrap()
                else {
                    panic!("a settled answer is adopted")
                };
                assert!(adopted.reconciled.is_some());
                push(
                    cp,
                    events,
                    generation,
                    Entry::Observed {
                        attempt: adopted,
                        delta_digests: Vec::new(),
                    },
                );
            }
            Recovery::Adopt { .. } => panic!("adopt only answers a reconciliation"),
        }
    }
    panic!("recovery did not finish")
}

#[test]
fn a_crash_after_every_prefix_recovers_without_resubmitting() {
    let cp = policy();
    let full = reference_journal(&cp);
    assert_eq!(full.len(), 15);
    for n in 0..=full.len() {
        for answer in [
            AnswerKind::Succeeded,
            AnswerKind::FailedNoEffect,
            AnswerKind::Unknown,
        ] {
            let mut events = full[..n].to_vec();
            if n == 0 {
                push(
                    &cp,
                    &mut events,
                    2,
                    Entry::Created {
                        created_at_epoch_ms: 1,
                        run_id: run_id(),
                    },
                );
            }
            let resubmitted = finish(&cp, &mut events, 2, answer);
            assert_eq!(resubmitted, 0, "prefix {n}, {answer:?}");
            // The recovered journal verifies, and its terminal's receipt is
            // the evaluation of its attempts.
            let r = verify(&cp, &events).unwrap();
            let receipt = evaluate(&cp, r.attempts()).unwrap();
            let Some(retryledger_core::journal::Payload::Terminal(end)) =
                events.last().map(|e| e.payload.clone())
            else {
                panic!("the journal ends with its terminal")
            };
            assert_eq!(end.receipt_sha256.as_str(), digest_of(&receipt));
            let reconciled: Vec<_> = receipt
                .schedule
                .iter()
                .filter_map(|s| s.reconciled)
                .collect();
            let doubted = full[..n]
                .last()
                .is_some_and(|e| e.payload.kind() == EventKind::Dispatched);
            assert_eq!(reconciled.len(), usize::from(doubted), "prefix {n}");
            if doubted && answer == AnswerKind::Unknown {
                assert_eq!(receipt.terminal.as_str(), "stop_indeterminate");
            }
            if doubted && answer == AnswerKind::Succeeded {
                assert_eq!(reconciled, vec![Reconciled::Succeeded]);
                assert_eq!(receipt.terminal.as_str(), "completed");
            }
            // A run never crashed has no reconciled attempt: its receipt is the
            // plain one (the optional field is omitted).
            if !doubted {
                assert!(!canonical_json(&receipt).contains("reconciled"));
            }
        }
    }
}

#[test]
fn the_fenced_owner_cannot_append_and_its_late_result_is_evidence() {
    let cp = policy();
    let full = reference_journal(&cp);
    let crashed = full[..12].to_vec();
    let rec = answers(3, &[(AnswerKind::Succeeded, 1_900)]);
    let Recovery::Adopt { attempt, decision } = recover(&cp, &crashed, Some(&rec)).unwrap() else {
        panic!("adopt")
    };
    assert!(matches!(decision, Decision::Terminal { .. }));
    let mut taken = crashed.clone();
    push(
        &cp,
        &mut taken,
        2,
        Entry::Observed {
            attempt,
            delta_digests: Vec::new(),
        },
    );
    // The old owner's observation of the same attempt, under generation 1.
    let late = &full[12];
    let c = classify_append(&cp, &taken, late).unwrap();
    assert!(matches!(c.offer, Offer::Evidence { .. }));
    // It cannot be appended after the takeover either.
    let e = append(&cp, &taken, 1, &Entry::Decided).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalStaleLease);
    let mut spliced = taken.clone();
    let mut old = append(&cp, &taken, 2, &Entry::Decided).unwrap();
    old.lease_generation = 1;
    spliced.push(old);
    assert_eq!(
        verify(&cp, &spliced).unwrap_err().code,
        ErrorCode::JournalStaleLease
    );
    // Evidence never changes the decision: recovery answers as before.
    assert_eq!(
        recover(&cp, &taken, None).unwrap(),
        recover(&cp, &taken, None).unwrap()
    );
}

#[test]
fn events_are_canonical_and_decode_back() {
    let cp = policy();
    for e in reference_journal(&cp) {
        let text = canonical_json(&e);
        assert_eq!(to_jcs(&parse_strict(&text).unwrap()), text);
        let back: JournalEvent = from_str(&text).unwrap();
        assert_eq!(back, e);
    }
}

#[test]
fn in_progress_polls_are_bounded_by_count_and_deadline() {
    let cp = policy();
    let full = reference_journal(&cp);
    let first = &full[..4];
    // Each in-progress answer pushes the next poll by the capped backoff.
    let mut at = 100;
    let mut list = Vec::new();
    for k in 1..=3_u64 {
        list.push((AnswerKind::InProgress, at));
        let Recovery::Reconcile {
            not_before_ms,
            poll,
            ..
        } = recover(&cp, first, Some(&answers(1, &list))).unwrap()
        else {
            panic!("poll again")
        };
        assert_eq!(poll, k + 1);
        assert_eq!(not_before_ms, at + (100 << (k - 1)).min(1_000));
        at = not_before_ms;
    }
    // The fourth in-progress answer reaches max_polls (4): unknown, never resubmitted.
    list.push((AnswerKind::InProgress, at));
    let Recovery::Adopt { attempt, decision } =
        recover(&cp, first, Some(&answers(1, &list))).unwrap()
    else {
        panic!("settled as unknown")
    };
    assert_eq!(attempt.reconciled, Some(Reconciled::Unknown));
    assert!(matches!(decision, Decision::Terminal { .. }));
}

#[test]
fn a_fleet_run_journals_its_admission_and_recovers_it() {
    use retryledger_core::fleet::FleetView;
    use serde_json::json;
    let mut p = lab::reference_policy();
    p["fleet"] = json!({
        "breaker": {"consecutive_failures": 1, "half_open_probes": 1, "open_ms": 60_000},
        "on_store_unavailable": "fail_closed"
    });
    let cp = Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap());
    // The primary's breaker is open: the admission skips to the fallback.
    let primary = cp.policy.routes[0].route_release_sha256.clone();
    let open: retryledger_core::breaker::BreakerSnapshot = retryledger_core::decode::from_value(json!({
        "consecutive_failures": 0, "generation": 1, "opened_at_epoch_ms": 1_780_000_000_000_u64,
        "probe_successes": 0, "probes_in_flight": 0, "route_release_sha256": primary.as_str(),
        "schema": "retryledger.breaker.v1", "state": "open", "updated_at_epoch_ms": 1_780_000_000_000_u64,
        "window_failures": 0, "window_start_epoch_ms": 1_780_000_000_000_u64, "window_total": 0
    }))
    .unwrap();
    let view = FleetView {
        breakers: vec![(primary, open)],
        ..FleetView::default()
    };
    let mut session = Session::start(Arc::clone(&cp));
    let admitted = session.admit(0, 1_780_000_000_100, &view).unwrap();
    let Decision::Dispatch(d) = admitted.decision else {
        panic!("the fallback admits")
    };
    assert_eq!(d.route_id.as_str(), "external-fallback");
    let mut events = Vec::new();
    push(
        &cp,
        &mut events,
        1,
        Entry::Created {
            created_at_epoch_ms: 1_780_000_000_000,
            run_id: run_id(),
        },
    );
    push(&cp, &mut events, 1, Entry::Decided);
    // Without the admitted dispatch the plan (the primary) is reserved; with
    // it, the fallback; anything else is refused.
    push(
        &cp,
        &mut events,
        1,
        Entry::Reserved {
            dispatch: Some(d.clone()),
            cancelled_at_ms: None,
        },
    );
    let mut off = d.clone();
    off.not_before_ms += 1;
    let e = append(
        &cp,
        &events[..2],
        1,
        &Entry::Reserved {
            dispatch: Some(off),
            cancelled_at_ms: None,
        },
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::JournalPlanDrift, Some("/entry/dispatch"))
    );
    session
        .record(0, 500, 2_000, retryledger_core::Outcome::Success)
        .unwrap();
    let attempt = session.attempts().attempts[0].clone();
    let e = append(
        &cp,
        &events,
        1,
        &Entry::Dispatched {
            admission: None,
            snapshots: None,
            started_at_ms: 0,
        },
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::AdmissionMissing);
    // The admission's snapshots travel with it: without them (or with
    // one it does not name) the event is refused.
    let named = session
        .fleet_snapshots()
        .named_by(attempt.admission.as_ref().unwrap());
    assert_eq!(named.as_ref().map(|s| s.breakers.len()), Some(2));
    let bare = append(
        &cp,
        &events,
        1,
        &Entry::Dispatched {
            admission: attempt.admission.clone(),
            snapshots: None,
            started_at_ms: 0,
        },
    )
    .unwrap_err();
    assert_eq!(
        (bare.code, bare.path.as_deref()),
        (ErrorCode::SnapshotMissing, Some("/entry/snapshots"))
    );
    let mut swapped = named.clone().unwrap();
    swapped.breakers.reverse();
    let e = append(
        &cp,
        &events,
        1,
        &Entry::Dispatched {
            admission: attempt.admission.clone(),
            snapshots: Some(swapped),
            started_at_ms: 0,
        },
    )
    .unwrap_err();
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::InvalidValue, Some("/entry/snapshots"))
    );
    let mut forged = named.clone().unwrap();
    forged.breakers[0].opened_at_epoch_ms = None;
    forged.breakers[0].state = retryledger_core::breaker::BreakerState::Closed;
    let e = append(
        &cp,
        &events,
        1,
        &Entry::Dispatched {
            admission: attempt.admission.clone(),
            snapshots: Some(forged),
            started_at_ms: 0,
        },
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::SnapshotMissing);
    push(
        &cp,
        &mut events,
        1,
        Entry::Dispatched {
            admission: attempt.admission.clone(),
            snapshots: named,
            started_at_ms: 0,
        },
    );
    // A crash here: the adopted attempt carries the admission.
    let rec = answers(1, &[(AnswerKind::Succeeded, 500)]);
    let Recovery::Adopt {
        attempt: adopted, ..
    } = recover(&cp, &events, Some(&rec)).unwrap()
    else {
        panic!("adopt")
    };
    assert_eq!(adopted.admission, attempt.admission);
    push(
        &cp,
        &mut events,
        2,
        Entry::Observed {
            attempt: adopted,
            delta_digests: Vec::new(),
        },
    );
    push(&cp, &mut events, 2, Entry::Decided);
    push(
        &cp,
        &mut events,
        2,
        Entry::Terminal {
            cancelled_at_ms: None,
            fleet_stop: None,
            snapshots: None,
        },
    );
    let r = verify(&cp, &events).unwrap();
    assert_eq!(r.summary().terminal.map(|t| t.as_str()), Some("completed"));
}

#[test]
fn a_session_resumed_from_any_prefix_continues_to_the_same_bundle() {
    let cp = policy();
    let bundle = lab::reference_bundle().unwrap();
    let events = reference_journal(&cp);
    for n in 1..=events.len() {
        let prefix = &events[..n];
        let mut session = Session::start(Arc::clone(&cp));
        session.resume_journal(prefix).unwrap();
        let held = verify(&cp, prefix).unwrap().attempts().attempts.len();
        assert_eq!(session.attempts().attempts.len(), held);
        // The rest of the run, observed through the resumed session.
        for a in &bundle.attempts.attempts[held..] {
            session
                .record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
                .unwrap();
        }
        assert_eq!(
            session.seal().unwrap(),
            bundle,
            "after a prefix of {n} events"
        );
    }
}

#[test]
fn a_resumed_session_refuses_a_used_session_a_broken_journal_and_a_fleet() {
    let cp = policy();
    let events = reference_journal(&cp);
    let a = lab::reference_bundle().unwrap().attempts.attempts[0].clone();
    let mut used = Session::start(Arc::clone(&cp));
    used.record(a.started_at_ms, a.completed_at_ms, a.cost, a.outcome)
        .unwrap();
    let e = used.resume_journal(&events).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidValue);
    assert_eq!(
        used.attempts().attempts.len(),
        1,
        "a refused resume changes nothing"
    );

    let mut broken = events.clone();
    broken.remove(3);
    let mut fresh = Session::start(Arc::clone(&cp));
    let e = fresh.resume_journal(&broken).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalSeqGap);
    assert!(fresh.attempts().attempts.is_empty());

    // A fleet policy and a stream policy, as the vectors hold them.
    for (file, code) in [
        ("fleet.json", ErrorCode::AdmissionUnexpected),
        ("stream.json", ErrorCode::InvalidStreamContract),
    ] {
        let path = format!("{}/../tests/vectors/{file}", env!("CARGO_MANIFEST_DIR"));
        let vectors: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let text = vectors["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|c| c["input"]["policy"].as_str())
            .unwrap()
            .to_owned();
        let cp = Arc::new(retryledger_core::api::compile_policy(&text).unwrap());
        let mut s = Session::start(cp);
        assert_eq!(s.resume_journal(&[]).unwrap_err().code, code, "{file}");
    }
}
