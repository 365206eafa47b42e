//! Journal invariants over generated runs: a journal written by
//! `journal::append` always verifies and ends with the evaluation's receipt,
//! and a crash after any prefix is recovered without resubmitting an
//! attempt whose outcome is unknown. Each property runs
//! `RETRYLEDGER_PROPERTY_CASES` cases (256 when unset).
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

use proptest::prelude::*;
use retryledger_core::canonical::digest_of;
use retryledger_core::decode::from_value;
use retryledger_core::journal::{
    append, recover, verify, Answer, AnswerKind, Entry, EventKind, JournalEvent, Payload,
    Reconciliation, ReconciliationSchema, Recovery, Writer, GENESIS_SHA256,
};
use retryledger_core::lab::{self, Step};
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, RetryableKind};
use retryledger_core::{compile, evaluate, CompiledPolicy, Decision, Outcome, Policy, Session};

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Success),
        2 => (0u64..3_000).prop_map(|ms| Outcome::Retryable { kind: RetryableKind::RateLimited, retry_after_ms: Some(ms), retry_after_source: None }),
        3 => Just(Outcome::Retryable { kind: RetryableKind::Unavailable, retry_after_ms: None, retry_after_source: None }),
        2 => Just(Outcome::Retryable { kind: RetryableKind::TimeoutBeforeResponse, retry_after_ms: None, retry_after_source: None }),
        1 => Just(Outcome::NonRetryable { kind: NonRetryableKind::Rejected }),
        1 => Just(Outcome::Indeterminate { kind: IndeterminateKind::UnknownProviderAcceptance }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (outcome(), 0u64..1_500, 0u64..2_000, 0u64..200).prop_map(|(o, d, c, lag)| Step {
            start_lag_ms: lag,
            ..Step::new(o, d, c)
        }),
        1..6,
    )
}

fn policy() -> Arc<CompiledPolicy> {
    let p: Policy = from_value(lab::reference_policy()).unwrap();
    Arc::new(compile(p).unwrap())
}

fn push(cp: &CompiledPolicy, events: &mut Vec<JournalEvent>, generation: u64, entry: Entry) {
    let e = append(cp, events, generation, &entry).unwrap();
    events.push(e);
}

/// The journal of a simulated run, written as a host would.
fn journal(cp: &Arc<CompiledPolicy>, steps: &[Step]) -> Vec<JournalEvent> {
    let attempts = lab::simulate(&cp.policy, steps).unwrap();
    let run_id = retryledger_core::ids::Identifier::parse("run-p").unwrap();
    let mut events = Vec::new();
    push(
        cp,
        &mut events,
        1,
        Entry::Created {
            created_at_epoch_ms: 0,
            run_id,
        },
    );
    push(cp, &mut events, 1, Entry::Decided);
    for a in &attempts.attempts {
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
        push(
            cp,
            &mut events,
            1,
            Entry::Observed {
                attempt: a.clone(),
                delta_digests: Vec::new(),
            },
        );
        push(cp, &mut events, 1, Entry::Decided);
    }
    if matches!(
        recover(cp, &events, None).unwrap(),
        Recovery::Resume {
            next: EventKind::Terminal,
            ..
        }
    ) {
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
    }
    events
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn an_appended_journal_verifies_and_seals_the_evaluation(steps in steps()) {
        let cp = policy();
        let events = journal(&cp, &steps);
        let r = verify(&cp, &events).unwrap();
        let mut prev = GENESIS_SHA256.to_owned();
        for (i, e) in events.iter().enumerate() {
            prop_assert_eq!(e.seq, i as u64);
            prop_assert_eq!(e.prev_sha256.as_str(), prev.as_str());
            prev = digest_of(e);
        }
        if let Some(Payload::Terminal(end)) = events.last().map(|e| &e.payload) {
            let receipt = evaluate(&cp, r.attempts()).unwrap();
            prop_assert_eq!(end.receipt_sha256.as_str(), digest_of(&receipt));
            prop_assert_eq!(end.terminal, receipt.terminal);
        }
    }

    #[test]
    fn a_writer_builds_what_append_builds_and_recovers_the_same(steps in steps(), cut in 0usize..40) {
        // The journal a host writes with `append` (the whole journal replayed
        // per event), written again by a writer taking over after `cut`
        // events: every event byte for byte, and after each one the same
        // recovery and the same continuing session as from the events.
        let cp = policy();
        let events = journal(&cp, &steps);
        let cut = cut.min(events.len());
        let mut writer = Writer::new(Arc::clone(&cp), &events[..cut], 1).unwrap();
        for (k, e) in events.iter().enumerate().skip(cut) {
            let entry = match &e.payload {
                Payload::Created { created_at_epoch_ms, .. } => Entry::Created {
                    created_at_epoch_ms: *created_at_epoch_ms,
                    run_id: e.run_id.clone(),
                },
                Payload::Decided { .. } => Entry::Decided,
                Payload::Reserved { .. } => Entry::Reserved { dispatch: None, cancelled_at_ms: None },
                Payload::Dispatched(sent) => Entry::Dispatched {
                    admission: None,
                    snapshots: None,
                    started_at_ms: sent.started_at_ms,
                },
                Payload::Observed { attempt, .. } => Entry::Observed { attempt: attempt.clone(), delta_digests: Vec::new() },
                Payload::Terminal(_) => Entry::Terminal { cancelled_at_ms: None, fleet_stop: None, snapshots: None },
            };
            let built = writer.append(&entry).unwrap();
            prop_assert_eq!(digest_of(&built), digest_of(e));
            let held = &events[..=k];
            prop_assert_eq!(
                format!("{:?}", writer.recover(None)),
                format!("{:?}", recover(&cp, held, None))
            );
            let mut resumed = Session::start(Arc::clone(&cp));
            let from_events = resumed.resume_journal(held).map(|()| resumed);
            let mut continued = Session::start(Arc::clone(&cp));
            let from_writer = writer.resume(&mut continued).map(|()| continued);
            prop_assert_eq!(from_writer.is_ok(), from_events.is_ok());
            if let (Ok(w), Ok(s)) = (from_writer, from_events) {
                prop_assert_eq!(digest_of(w.attempts()), digest_of(s.attempts()));
                prop_assert_eq!(format!("{:?}", w.next()), format!("{:?}", s.next()));
            }
        }
        // A writer refuses what append refuses: an event after the terminal
        // (or out of order), with the same coded error.
        let offered = Entry::Decided;
        let stateless = append(&cp, &events, 1, &offered);
        let kept = writer.append(&offered);
        prop_assert_eq!(format!("{:?}", kept.map(|e| digest_of(&e))), format!("{:?}", stateless.map(|e| digest_of(&e))));
    }

    #[test]
    fn a_crash_after_a_dispatch_never_resubmits_it(steps in steps(), answer in 0usize..3, late in 0u64..500) {
        let cp = policy();
        let events = journal(&cp, &steps);
        for n in 0..=events.len() {
            let prefix = &events[..n];
            let ends_dispatched = prefix.last().is_some_and(|e| e.payload.kind() == EventKind::Dispatched);
            let r = recover(&cp, prefix, None).unwrap();
            let Recovery::Reconcile { attempt, not_before_ms, .. } = r else {
                prop_assert!(!ends_dispatched, "a dispatched attempt is always reconciled");
                continue;
            };
            prop_assert!(ends_dispatched);
            let kind = [AnswerKind::Succeeded, AnswerKind::FailedNoEffect, AnswerKind::Unknown][answer];
            let rec = Reconciliation {
                answers: vec![Answer { answer: kind, at_ms: not_before_ms + late, cost: None, job_sha256: None }],
                max_polls: 3,
                ordinal: attempt.ordinal,
                schema: ReconciliationSchema,
            };
            let Recovery::Adopt { attempt: adopted, decision } = recover(&cp, prefix, Some(&rec)).unwrap() else {
                panic!("a settled answer is adopted");
            };
            prop_assert_eq!(adopted.ordinal, attempt.ordinal);
            match (kind, &decision) {
                // Only a verified no-effect answer may dispatch again, and then a new attempt.
                (AnswerKind::FailedNoEffect, Decision::Dispatch(d)) => prop_assert!(d.ordinal > attempt.ordinal),
                (_, Decision::Dispatch(_)) => prop_assert!(false, "{kind:?} dispatched again"),
                (_, Decision::Terminal { .. }) => {}
            }
            let mut taken = prefix.to_vec();
            push(&cp, &mut taken, 2, Entry::Observed { attempt: adopted, delta_digests: Vec::new() });
            push(&cp, &mut taken, 2, Entry::Decided);
            verify(&cp, &taken).unwrap();
        }
    }
}
