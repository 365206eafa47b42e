//! The stream layer of the run machine under a journal (and a fleet): a
//! streamed run's consumer log is journaled with it, a run crashed at every
//! journal prefix and resumed rebuilds that log, never sends an attempt
//! twice without a `failed_no_effect` answer and never commits twice, and
//! every journal and bundle verifies.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use std::sync::Arc;

use retryledger_core::canonical::digest_of;
use retryledger_core::error::ErrorCode;
use retryledger_core::machine::script::{play, play_start, Played, Script};
use retryledger_core::machine::{Effect, Event, JournalOptions, Machine, Options};
use retryledger_core::receipt::Bundle;
use retryledger_core::stream::EventKind as StreamKind;
use retryledger_core::{compile, journal, lab, verify_bundle, CompiledPolicy};
use serde_json::{json, Value};

const ORIGIN: u64 = 1_780_000_000_000;
const TEXT: &[&str] = &["The incident", " began at 09:14", " UTC."];
const CUT: &[&str] = &["The incident", " beg"];

fn policy(mode: &str, fleet: bool) -> Arc<CompiledPolicy> {
    let mut p = lab::reference_policy();
    p["stream"] = json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500,
        "max_response_bytes": 65_536, "mode": mode});
    if fleet {
        p["fleet"] = json!({
            "admission": {"max_in_flight": 2, "max_queue_ms": 1_000, "request_burst": 2, "requests_per_second": 10},
            "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000},
            "on_store_unavailable": "fail_closed",
            "retry_budget": {"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "s"}
        });
    }
    Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap())
}

fn facts(deltas: &[&str], terminal: bool, response: Option<(&str, u64)>) -> Value {
    let bytes: usize = deltas.iter().map(|d| d.len()).sum();
    let mut s = json!({"bytes": bytes, "events": deltas.len(), "terminal_event": terminal, "usage_event": terminal});
    if let Some((id, seq)) = response {
        s["response_id"] = json!(id);
        s["last_sequence"] = json!(seq);
    }
    s
}

/// A stream cut after output, then one that completes; `checked` adds a
/// passing output check to the answer.
fn script(checked: bool) -> Script {
    let mut ok = json!({"after_ms": 60, "deltas": TEXT,
        "facts": {"result": "returned", "stream": facts(TEXT, true, None)}});
    if checked {
        ok["facts"]["output_checks"] =
            json!([{"kind": "empty", "validator": "builtin.empty", "verdict": "pass"}]);
    }
    Script {
        attempts: vec![
            json!({"after_ms": 40, "deltas": CUT, "facts": {
                "error_types": ["APIConnectionError", "APIError"], "result": "raised",
                "stream": facts(CUT, false, Some(("resp-1", 2)))}}),
            ok,
        ],
        // The retry budget full, so a retry is admitted.
        store: [(
            "budget/s".to_owned(),
            json!({"balance_milli": 5_000, "deposits": 0, "generation": 0,
                "schema": "retryledger.retry_budget.v1", "scope": "s",
                "updated_at_epoch_ms": ORIGIN, "withdrawals": 0}),
        )]
        .into_iter()
        .collect(),
        ..Script::default()
    }
}

fn options(generation: u64, now_ms: u64) -> Options {
    Options {
        origin_epoch_ms: ORIGIN,
        now_ms,
        journal: Some(JournalOptions {
            run_id: retryledger_core::ids::Identifier::parse("run-s").unwrap(),
            lease_generation: generation,
        }),
        ..Options::default()
    }
}

fn dispatches(p: &Played) -> usize {
    p.events
        .iter()
        .filter(|e| matches!(e, Event::Observed(_)))
        .count()
}

fn commits(b: &Bundle) -> usize {
    b.stream_events.as_ref().map_or(0, |l| {
        l.0.iter().filter(|e| e.kind == StreamKind::Commit).count()
    })
}

/// Crash the run after every number of appends and resume it with a
/// receiver that answers `answer` about an attempt in doubt.
fn crash_everywhere(cp: &Arc<CompiledPolicy>, script: &Script, answer: &str) {
    let mut full_m = Machine::start(Arc::clone(cp), options(1, 0)).unwrap();
    let full = play(&mut full_m, script, Vec::new());
    assert!(full.error.is_none(), "{:?}", full.error);
    let full_bundle = full_m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&full_bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(commits(&full_bundle), 1);
    // The streamed attempts' delta digests are journaled with them.
    let listed: usize = full
        .journal
        .iter()
        .map(|e| match &e.payload {
            journal::Payload::Observed { delta_digests, .. } => delta_digests.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(listed, CUT.len() + TEXT.len());
    let total = full
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count() as u64;
    for k in 0..total {
        let crashed = play_start(
            cp,
            options(1, 0),
            &Script {
                crash_after_appends: Some(k),
                ..script.clone()
            },
        )
        .unwrap();
        assert!(crashed.crashed && crashed.error.is_none(), "crash at {k}");
        journal::verify(cp, &crashed.journal).unwrap();
        let sent = dispatches(&crashed);
        let in_doubt = crashed
            .journal
            .last()
            .is_some_and(|e| e.payload.kind() == journal::EventKind::Dispatched);
        let observed = crashed
            .journal
            .iter()
            .filter(|e| e.payload.kind() == journal::EventKind::Observed)
            .count();
        let rest = Script {
            // An attempt with no effect is sent again: its step is replayed.
            attempts: script.attempts[observed.min(2)..].to_vec(),
            reconcile: vec![json!({"answer": answer})],
            store: crashed
                .store
                .iter()
                .map(|(k, (d, _))| (k.clone(), d.clone()))
                .collect(),
            ..Script::default()
        };
        let mut m =
            Machine::resume(Arc::clone(cp), &crashed.journal, options(2, crashed.now_ms)).unwrap();
        let resumed = play(&mut m, &rest, crashed.journal.clone());
        assert!(
            resumed.error.is_none(),
            "resume at {k}: {:?}",
            resumed.error
        );
        assert!(!resumed.crashed);
        journal::verify(cp, &resumed.journal).unwrap();
        let bundle = m.seal().unwrap();
        let verdict = verify_bundle(&bundle).unwrap_or_else(|e| panic!("resume at {k}: {e:?}"));
        assert!(
            matches!(verdict, retryledger_core::Verdict::Verified { .. }),
            "resume at {k}: {verdict:?}"
        );
        assert!(commits(&bundle) <= 1, "resume at {k}");
        // An attempt in doubt is sent again only after `failed_no_effect`.
        let again = dispatches(&resumed);
        if in_doubt && answer != "failed_no_effect" {
            assert_eq!(again, 0, "resume at {k}");
            assert_eq!(
                bundle.receipt.terminal,
                retryledger_core::Terminal::StopIndeterminate,
                "resume at {k}"
            );
        }
        // Every attempt the bundle records was sent once: by the first
        // owner, by the second, or reconciled.
        let reconciled = bundle
            .attempts
            .attempts
            .iter()
            .filter(|a| a.reconciled.is_some())
            .count();
        assert_eq!(reconciled, usize::from(in_doubt), "resume at {k}");
        assert_eq!(
            sent + again,
            bundle.attempts.attempts.len() + usize::from(in_doubt) - reconciled,
            "resume at {k}"
        );
        // A run resumed where nothing was in doubt is the run uncut: the
        // consumer's log rebuilt from the journal, and without a fleet the
        // same receipt.
        if !in_doubt && k >= 1 {
            assert_eq!(
                bundle.stream_events, full_bundle.stream_events,
                "resume at {k}"
            );
            // Under a fleet the resumed run admits again (other snapshots).
            if cp.policy.fleet.is_none() {
                assert_eq!(
                    digest_of(&bundle.receipt),
                    digest_of(&full_bundle.receipt),
                    "resume at {k}"
                );
            }
        }
    }
}

#[test]
fn a_streamed_journaled_run_crashed_at_every_prefix_resumes_to_a_verified_end() {
    for mode in ["buffer", "tentative", "continuation"] {
        for answer in ["failed_no_effect", "succeeded", "unknown"] {
            crash_everywhere(&policy(mode, false), &script(false), answer);
        }
    }
}

#[test]
fn a_streamed_journaled_fleet_run_with_output_checks_crashed_at_every_prefix_resumes() {
    for mode in ["buffer", "tentative", "continuation"] {
        for answer in ["failed_no_effect", "succeeded", "unknown"] {
            crash_everywhere(&policy(mode, true), &script(true), answer);
        }
    }
}

#[test]
fn a_reconciled_success_of_a_cut_stream_is_never_committed() {
    let cp = policy("tentative", false);
    let crashed = play_start(
        &cp,
        options(1, 0),
        &Script {
            crash_after_appends: Some(2),
            ..script(false)
        },
    )
    .unwrap();
    let mut m = Machine::resume(Arc::clone(&cp), &crashed.journal, options(2, 10)).unwrap();
    assert!(matches!(m.next(), Effect::Reconcile { .. }));
    let played = play(
        &mut m,
        &Script {
            reconcile: vec![json!({"answer": "succeeded"})],
            ..Script::default()
        },
        crashed.journal.clone(),
    );
    assert!(played.error.is_none());
    let bundle = m.seal().unwrap();
    assert_eq!(
        bundle.attempts.attempts[0].reconciled,
        Some(retryledger_core::attempt::Reconciled::SucceededStreamLost)
    );
    assert_eq!(commits(&bundle), 0);
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
}

#[test]
fn delta_digests_that_do_not_hash_to_the_record_are_refused() {
    let cp = policy("tentative", false);
    let full = play_start(&cp, options(1, 0), &script(false)).unwrap();
    let mut events = full.journal.clone();
    let i = events
        .iter()
        .position(|e| e.payload.kind() == journal::EventKind::Observed)
        .unwrap();
    if let journal::Payload::Observed { delta_digests, .. } = &mut events[i].payload {
        delta_digests.reverse();
    }
    let e = journal::verify(&cp, &events).unwrap_err();
    assert_eq!(e.code, ErrorCode::StreamDeltasMismatch);
    // A journal that lists no digests for received events verifies, but its
    // consumer's log cannot be rebuilt: a resume is refused.
    let mut bare = full.journal[..=i].to_vec();
    if let journal::Payload::Observed { delta_digests, .. } = &mut bare[i].payload {
        delta_digests.clear();
    }
    let mut chained = Vec::new();
    for e in &bare {
        let mut e = e.clone();
        e.prev_sha256 = retryledger_core::ids::Sha256Hex::parse(
            &chained
                .last()
                .map_or(journal::GENESIS_SHA256.to_owned(), digest_of),
        )
        .unwrap();
        chained.push(e);
    }
    journal::verify(&cp, &chained).unwrap();
    let refused = Machine::resume(Arc::clone(&cp), &chained, options(2, 100)).unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidStreamContract);
}

/// Drive a run without a journal through `answers` (one observation per
/// dispatch), collecting each dispatch effect's stream plan as JSON.
fn plans(cp: &Arc<CompiledPolicy>, answers: &[Value]) -> Vec<Value> {
    let mut m = Machine::start(
        Arc::clone(cp),
        Options {
            origin_epoch_ms: ORIGIN,
            ..Options::default()
        },
    )
    .unwrap();
    let mut out = Vec::new();
    let mut now = 0;
    let mut answers = answers.iter();
    loop {
        let effect = m.next().clone();
        let event = match &effect {
            Effect::Done { .. } => break,
            Effect::Sleep { until_ms } => {
                now = *until_ms;
                Event::Clock { now_ms: now }
            }
            Effect::Dispatch { .. } => {
                let doc = retryledger_core::canonical::to_value(&effect);
                out.push(doc["stream"].clone());
                let mut answer = answers.next().unwrap().clone();
                now += answer["after_ms"].as_u64().unwrap();
                answer.as_object_mut().unwrap().remove("after_ms");
                answer["kind"] = json!("observed");
                answer["completed_at_ms"] = json!(now);
                <Event as retryledger_core::decode::Decode>::decode(
                    &answer,
                    &retryledger_core::decode::At::Root,
                )
                .unwrap()
            }
            other => panic!("unexpected effect {other:?}"),
        };
        m.answer(event).unwrap();
    }
    out
}

#[test]
fn a_streamed_dispatch_carries_its_plan() {
    let cut = json!({"after_ms": 40, "deltas": CUT, "facts": {
        "error_types": ["APIConnectionError", "APIError"], "result": "raised",
        "stream": facts(CUT, false, Some(("resp-1", 2)))}});
    let ok = json!({"after_ms": 60, "deltas": TEXT,
        "facts": {"result": "returned", "stream": facts(TEXT, true, None)}});
    // A fresh live attempt holds events without text; its resumption does not.
    let live = plans(&policy("continuation", false), &[cut.clone(), ok.clone()]);
    assert_eq!(live.len(), 2);
    assert_eq!(
        live[0],
        json!({"deliver": "live", "first_event_by_ms": 1_000, "hold_without_text": 256,
            "idle_timeout_ms": 500, "max_response_bytes": 65_536})
    );
    assert_eq!(live[1]["hold_without_text"], json!(0));
    assert_eq!(live[1]["deliver"], json!("live"));
    // The first event is due a first-byte timeout after the attempt's start.
    let start = live[1]["first_event_by_ms"].as_u64().unwrap();
    assert!(start >= 1_040, "{start}");
    // Buffered: nothing delivered before the commit, nothing held.
    let buffered = plans(&policy("buffer", false), &[cut, ok]);
    assert_eq!(buffered[0]["deliver"], json!("buffer"));
    assert_eq!(buffered[0]["hold_without_text"], json!(0));
    assert_eq!(buffered[1]["hold_without_text"], json!(0));
}

#[test]
fn a_streamed_run_needs_a_stream_contract() {
    let plain = Arc::new(
        compile(retryledger_core::decode::from_value(lab::reference_policy()).unwrap()).unwrap(),
    );
    let streams = Options {
        origin_epoch_ms: ORIGIN,
        stream: true,
        ..Options::default()
    };
    let err = Machine::start(plain, streams.clone()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidStreamContract);
    assert_eq!(err.path.as_deref(), Some("/stream"));
    assert!(Machine::start(policy("tentative", false), streams).is_ok());
}
