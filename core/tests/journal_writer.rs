//! The journal writer's appends advance its replay in place: a refused
//! entry (or a refused batch of `append_all`) leaves the writer exactly as
//! it was, and a replay refusing an event is unchanged by it.
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

use retryledger_core::canonical::digest_of;
use retryledger_core::journal::{
    verify, Entry, JournalEvent, Payload, Recovery, Writer, GENESIS_SHA256,
};
use retryledger_core::{compile, lab, CompiledPolicy, ErrorCode, Session};

fn policy() -> Arc<CompiledPolicy> {
    Arc::new(compile(lab::reference_bundle().unwrap().policy).unwrap())
}

/// The reference run's journal (15 events: three attempts), appended one
/// entry at a time through a writer under generation 1.
fn reference_journal(cp: &Arc<CompiledPolicy>) -> Vec<JournalEvent> {
    let bundle = lab::reference_bundle().unwrap();
    let mut w = Writer::new(Arc::clone(cp), &[], 1).unwrap();
    let mut events = Vec::new();
    let mut push = |w: &mut Writer, entry: Entry| events.push(w.append(&entry).unwrap());
    push(
        &mut w,
        Entry::Created {
            created_at_epoch_ms: 1_780_000_000_000,
            run_id: retryledger_core::ids::Identifier::parse("run-1").unwrap(),
        },
    );
    push(&mut w, Entry::Decided);
    let mut session = Session::start(Arc::clone(cp));
    for a in &bundle.attempts.attempts {
        push(
            &mut w,
            Entry::Reserved {
                dispatch: None,
                cancelled_at_ms: None,
            },
        );
        push(
            &mut w,
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
            &mut w,
            Entry::Observed {
                attempt,
                delta_digests: Vec::new(),
            },
        );
        push(&mut w, Entry::Decided);
    }
    push(
        &mut w,
        Entry::Terminal {
            cancelled_at_ms: None,
            fleet_stop: None,
            snapshots: None,
        },
    );
    assert_eq!(events.len(), 15);
    events
}

/// The entry a host gives for an event.
fn entry_of(e: &JournalEvent) -> Entry {
    match &e.payload {
        Payload::Created {
            created_at_epoch_ms,
            ..
        } => Entry::Created {
            created_at_epoch_ms: *created_at_epoch_ms,
            run_id: e.run_id.clone(),
        },
        Payload::Decided { .. } => Entry::Decided,
        Payload::Reserved { .. } => Entry::Reserved {
            dispatch: None,
            cancelled_at_ms: None,
        },
        Payload::Dispatched(sent) => Entry::Dispatched {
            admission: sent.admission.clone(),
            snapshots: sent.snapshots.clone(),
            started_at_ms: sent.started_at_ms,
        },
        Payload::Observed {
            attempt,
            delta_digests,
        } => Entry::Observed {
            attempt: attempt.clone(),
            delta_digests: delta_digests.clone(),
        },
        Payload::Terminal(end) => Entry::Terminal {
            cancelled_at_ms: end.cancelled_at_ms,
            fleet_stop: end.fleet_stop.clone(),
            snapshots: end.snapshots.clone(),
        },
    }
}

/// Entries a writer must refuse where `next` is the valid one.
fn refused(next: &JournalEvent) -> Vec<Entry> {
    let mut out = Vec::new();
    if !matches!(next.payload, Payload::Decided { .. }) {
        out.push(Entry::Decided);
    }
    if !matches!(next.payload, Payload::Terminal(_)) {
        out.push(Entry::Terminal {
            cancelled_at_ms: None,
            fleet_stop: None,
            snapshots: None,
        });
    }
    if next.seq > 0 {
        out.push(Entry::Created {
            created_at_epoch_ms: 1,
            run_id: next.run_id.clone(),
        });
    }
    match &next.payload {
        Payload::Reserved { dispatch, .. } => {
            let mut other = dispatch.clone();
            other.ordinal += 1;
            out.push(Entry::Reserved {
                dispatch: Some(other),
                cancelled_at_ms: None,
            });
        }
        Payload::Dispatched(sent) if sent.not_before_ms > 0 => out.push(Entry::Dispatched {
            admission: None,
            snapshots: None,
            started_at_ms: sent.not_before_ms - 1,
        }),
        Payload::Observed { attempt, .. } => {
            let mut a = attempt.clone();
            a.ordinal += 1;
            out.push(Entry::Observed {
                attempt: a,
                delta_digests: Vec::new(),
            });
            let mut a = attempt.clone();
            a.completed_at_ms = a.started_at_ms.saturating_sub(1);
            if a.completed_at_ms < a.started_at_ms {
                out.push(Entry::Observed {
                    attempt: a,
                    delta_digests: Vec::new(),
                });
            }
            let mut a = attempt.clone();
            a.route_id = retryledger_core::ids::Identifier::parse("nowhere").unwrap();
            out.push(Entry::Observed {
                attempt: a,
                delta_digests: Vec::new(),
            });
        }
        _ => {}
    }
    assert!(!out.is_empty());
    out
}

/// Everything a writer holds, to compare before and after a refusal.
fn state(w: &Writer) -> String {
    format!("{w:?}")
}

#[test]
fn a_refused_append_leaves_the_writer_as_it_was() {
    let cp = policy();
    let full = reference_journal(&cp);
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    let mut written = Vec::new();
    for next in &full {
        for bad in refused(next) {
            let before = state(&w);
            let e = w.append(&bad).unwrap_err();
            assert!(
                e.path
                    .as_deref()
                    .is_some_and(|p| p.starts_with("/entry") || p == "/events/0/kind"),
                "{e:?}"
            );
            assert_eq!(state(&w), before, "{bad:?} refused at seq {}", next.seq);
        }
        written.push(w.append(&entry_of(next)).unwrap());
    }
    assert_eq!(written, full);
    assert_eq!(
        w.replayed().summary(),
        verify(&cp, &full).unwrap().summary()
    );
    // After the terminal every entry is refused, and changes nothing.
    let before = state(&w);
    let e = w.append(&Entry::Decided).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalAfterTerminal);
    assert_eq!(state(&w), before);
}

#[test]
fn a_writer_under_an_older_lease_is_refused_and_unchanged() {
    let cp = policy();
    let full = reference_journal(&cp);
    let mut w = Writer::new(Arc::clone(&cp), &full[..6], 0).unwrap();
    let before = state(&w);
    let e = w.append(&entry_of(&full[6])).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalStaleLease);
    assert_eq!(state(&w), before);
}

#[test]
fn a_replay_refusing_an_event_is_unchanged_by_it() {
    let cp = policy();
    let full = reference_journal(&cp);
    // After the first attempt's decision: a cancellation may end the run.
    let prefix = &full[..6];
    let Payload::Observed { attempt, .. } = &full[4].payload else {
        panic!("the first attempt's observation")
    };
    let mut w = Writer::new(Arc::clone(&cp), prefix, 1).unwrap();
    let cancel = w
        .append(&Entry::Terminal {
            cancelled_at_ms: Some(attempt.completed_at_ms + 1),
            fleet_stop: None,
            snapshots: None,
        })
        .unwrap();
    let Payload::Terminal(end) = &cancel.payload else {
        panic!("terminal")
    };
    // The same cancellation with a wrong receipt: refused after the run was
    // cancelled on the way to checking it; the replay is not cancelled.
    let mut forged_end = end.clone();
    forged_end.receipt_sha256 = end.attempts_sha256.clone();
    let forged = JournalEvent {
        payload: Payload::Terminal(forged_end),
        ..cancel.clone()
    };
    let mut r = verify(&cp, prefix).unwrap();
    let before = format!("{r:?}");
    let e = r.apply(&cp, &forged, 6).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalPlanDrift);
    assert_eq!(e.path.as_deref(), Some("/events/6/receipt_sha256"));
    assert_eq!(format!("{r:?}"), before);
    // A wrong attempt is refused without a trace either.
    for (k, e) in full.iter().enumerate().skip(6) {
        if let Payload::Observed { attempt, .. } = &e.payload {
            let mut early = attempt.clone();
            early.completed_at_ms = early.started_at_ms - 1;
            let bad = JournalEvent {
                payload: Payload::Observed {
                    attempt: early,
                    delta_digests: Vec::new(),
                },
                ..e.clone()
            };
            let before = format!("{r:?}");
            let refused = r.apply(&cp, &bad, k).unwrap_err();
            assert_eq!(refused.code, ErrorCode::CompletedBeforeStarted);
            assert_eq!(format!("{r:?}"), before);
        }
        r.apply(&cp, e, k).unwrap();
    }
    assert_eq!(r.summary(), verify(&cp, &full).unwrap().summary());
    // And the valid cancellation applies where the forged one did not.
    let mut r = verify(&cp, prefix).unwrap();
    r.apply(&cp, &forged, 6).unwrap_err();
    r.apply(&cp, &cancel, 6).unwrap();
    assert_eq!(
        r.summary().terminal.map(|t| t.as_str()),
        Some("stop_cancelled")
    );
}

#[test]
fn the_head_digest_is_the_last_event_s() {
    let cp = policy();
    let full = reference_journal(&cp);
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    assert_eq!(w.replayed().head_sha256(), GENESIS_SHA256);
    for e in &full {
        w.append(&entry_of(e)).unwrap();
        assert_eq!(w.replayed().head_sha256(), digest_of(e));
        assert_eq!(w.replayed().summary().last_kind, Some(e.payload.kind()));
    }
}

#[test]
fn append_all_builds_what_append_builds() {
    let cp = policy();
    let full = reference_journal(&cp);
    let entries: Vec<Entry> = full.iter().map(entry_of).collect();
    // As a host writes them: events written together in one batch.
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    let mut written = w.append_all(&entries[..2]).unwrap();
    for pair in entries[2..14].chunks(2) {
        written.extend(w.append_all(pair).unwrap());
    }
    written.extend(w.append_all(&entries[14..]).unwrap());
    assert_eq!(written, full);
    assert_eq!(w.append_all(&[]).unwrap(), vec![]);
    // The whole journal in one batch, and from any prefix the rest of it.
    for cut in 0..=full.len() {
        let mut w = Writer::new(Arc::clone(&cp), &full[..cut], 1).unwrap();
        assert_eq!(w.append_all(&entries[cut..]).unwrap(), &full[cut..]);
        assert_eq!(
            w.replayed().summary(),
            verify(&cp, &full).unwrap().summary()
        );
    }
}

#[test]
fn a_refused_batch_leaves_the_writer_as_it_was() {
    let cp = policy();
    let full = reference_journal(&cp);
    let entries: Vec<Entry> = full.iter().map(entry_of).collect();
    for cut in 0..full.len() {
        let mut w = Writer::new(Arc::clone(&cp), &full[..cut], 1).unwrap();
        // Every batch from `cut` that ends with an entry refused there:
        // the error names the entry, and the writer is unchanged.
        for end in cut..full.len() {
            let mut probe = Writer::new(Arc::clone(&cp), &full[..end], 1).unwrap();
            let probed = state(&probe);
            for bad in refused(&full[end]) {
                let mut batch = entries[cut..end].to_vec();
                batch.push(bad.clone());
                let before = state(&w);
                let e = w.append_all(&batch).unwrap_err();
                let k = end - cut;
                assert!(
                    e.path.as_deref().is_some_and(
                        |p| p.starts_with(&format!("/entries/{k}")) || p == "/events/0/kind"
                    ),
                    "{e:?} for {bad:?} at {k}"
                );
                assert_eq!(state(&w), before, "batch {cut}..={end} ending {bad:?}");
                // The same refusal one entry at a time.
                assert_eq!(probe.append(&bad).unwrap_err().code, e.code);
                assert_eq!(state(&probe), probed);
            }
        }
        // Past the terminal.
        let mut batch = entries[cut..].to_vec();
        batch.push(Entry::Decided);
        let before = state(&w);
        let e = w.append_all(&batch).unwrap_err();
        assert_eq!(e.code, ErrorCode::JournalAfterTerminal);
        assert_eq!(state(&w), before);
        // The writer then writes the rest as if nothing was offered.
        assert_eq!(w.append_all(&entries[cut..]).unwrap(), &full[cut..]);
    }
}

#[test]
fn a_writer_recovers_after_an_observed_and_decided_batch() {
    let cp = policy();
    let full = reference_journal(&cp);
    let entries: Vec<Entry> = full.iter().map(entry_of).collect();
    let mut w = Writer::new(Arc::clone(&cp), &full[..4], 1).unwrap();
    assert!(matches!(
        w.recover(None).unwrap(),
        Recovery::Reconcile { .. }
    ));
    w.append_all(&entries[4..6]).unwrap();
    let Recovery::Resume { next_seq, .. } = w.recover(None).unwrap() else {
        panic!("resume")
    };
    assert_eq!(next_seq, 6);
}

#[test]
fn an_attempt_whose_cost_the_run_cannot_add_is_refused_without_a_trace() {
    use retryledger_core::lab::Step;
    use retryledger_core::outcome::RetryableKind;
    use retryledger_core::Outcome;
    let cp = policy();
    let down = Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    };
    let steps = [Step::new(down, 20, 5), Step::new(Outcome::Success, 20, 5)];
    let attempts = lab::simulate(&cp.policy, &steps).unwrap();
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    w.append_all(&[
        Entry::Created {
            created_at_epoch_ms: 1,
            run_id: retryledger_core::ids::Identifier::parse("run-2").unwrap(),
        },
        Entry::Decided,
    ])
    .unwrap();
    for a in &attempts.attempts {
        w.append_all(&[
            Entry::Reserved {
                dispatch: None,
                cancelled_at_ms: None,
            },
            Entry::Dispatched {
                admission: None,
                snapshots: None,
                started_at_ms: a.started_at_ms,
            },
        ])
        .unwrap();
        if a.ordinal == 2 {
            // The run has spent 5: this cost does not add up.
            let mut dear = a.clone();
            dear.cost = u64::MAX;
            let before = state(&w);
            let e = w
                .append_all(&[
                    Entry::Observed {
                        attempt: dear,
                        delta_digests: Vec::new(),
                    },
                    Entry::Decided,
                ])
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::ArithmeticOverflow);
            assert!(e.path.as_deref().unwrap().starts_with("/entries/0/attempt"));
            assert_eq!(state(&w), before);
        }
        w.append_all(&[
            Entry::Observed {
                attempt: a.clone(),
                delta_digests: Vec::new(),
            },
            Entry::Decided,
        ])
        .unwrap();
    }
    w.append(&Entry::Terminal {
        cancelled_at_ms: None,
        fleet_stop: None,
        snapshots: None,
    })
    .unwrap();
    assert_eq!(w.replayed().attempts(), &attempts);
}
