//! The run machine: the reference run through it reaches the session's
//! receipt; its layers (fleet, journal) compose; a journaled run crashed at
//! every journal prefix and resumed never sends an attempt twice without a
//! reconciliation that said `failed_no_effect`, and every journal and bundle
//! verifies; bad answers are coded errors that change nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use std::sync::Arc;

use retryledger_core::canonical::{digest_of, to_value};
use retryledger_core::error::ErrorCode;
use retryledger_core::machine::script::{play, play_start, Script};
use retryledger_core::machine::{Effect, Event, JournalOptions, Machine, Options};
use retryledger_core::{compile, journal, lab, verify_bundle, CompiledPolicy, Verdict};
use serde_json::{json, Value};

const ORIGIN: u64 = 1_780_000_000_000;

fn policy(edit: impl FnOnce(&mut Value)) -> Arc<CompiledPolicy> {
    let mut p = lab::reference_policy();
    edit(&mut p);
    Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap())
}

fn fleet() -> Value {
    json!({
        "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000},
        "on_store_unavailable": "fail_closed",
        "retry_budget": {"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "s"}
    })
}

/// The reference run's outcomes as a script: 429 with a 250 ms hint, 503,
/// then a success on the fallback (times as the lab's).
fn reference_script() -> Script {
    let bundle = lab::reference_bundle().unwrap();
    let mut attempts = Vec::new();
    let mut at = 0;
    for a in &bundle.attempts.attempts {
        assert!(a.started_at_ms >= at);
        let facts = if a.outcome == retryledger_core::Outcome::Success {
            json!({"result": "returned"})
        } else {
            json!({"result": "raised", "outcome": to_value(&a.outcome)})
        };
        attempts.push(json!({
            "after_ms": a.completed_at_ms - a.started_at_ms,
            "cost": a.cost,
            "facts": facts,
        }));
        at = a.completed_at_ms;
    }
    Script {
        attempts,
        ..Script::default()
    }
}

/// The receipt digest the journal's `terminal` event holds.
fn sealed_receipt(events: &[journal::JournalEvent]) -> Option<String> {
    match &events.last()?.payload {
        journal::Payload::Terminal(end) => Some(end.receipt_sha256.as_str().to_owned()),
        _ => None,
    }
}

fn options(journal: bool) -> Options {
    Options {
        origin_epoch_ms: ORIGIN,
        journal: journal.then(|| JournalOptions {
            run_id: retryledger_core::ids::Identifier::parse("run-1").unwrap(),
            lease_generation: 1,
        }),
        ..Options::default()
    }
}

#[test]
fn the_reference_run_through_the_machine_is_the_sessions_receipt() {
    let cp = policy(|_| {});
    let played = play_start(&cp, options(false), &reference_script()).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    let mut m = Machine::start(Arc::clone(&cp), options(false)).unwrap();
    for e in &played.events {
        m.answer(e.clone()).unwrap();
    }
    assert!(matches!(m.next(), Effect::Done { .. }));
    let bundle = m.seal().unwrap();
    // The machine starts each attempt at its earliest start, as the lab does.
    let reference = lab::reference_bundle().unwrap();
    assert_eq!(digest_of(&bundle.receipt), digest_of(&reference.receipt));
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
}

#[test]
fn a_journaled_run_writes_two_appends_per_attempt_and_verifies() {
    let cp = policy(|_| {});
    let played = play_start(&cp, options(true), &reference_script()).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    let appends = played
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count();
    // created+decided, then per attempt reserved+dispatched and observed+decided, then terminal.
    assert_eq!(appends, 1 + 2 * 3 + 1);
    journal::verify(&cp, &played.journal).unwrap();
    let reference = lab::reference_bundle().unwrap();
    assert_eq!(
        sealed_receipt(&played.journal),
        Some(digest_of(&reference.receipt))
    );
}

#[test]
fn fleet_and_journal_compose_and_a_resumed_run_admits_again() {
    let cp = policy(|p| p["fleet"] = fleet());
    let full = play_start(&cp, options(true), &reference_script()).unwrap();
    assert!(full.error.is_none(), "{:?}", full.error);
    journal::verify(&cp, &full.journal).unwrap();
    // Every dispatched event records its admission.
    let admitted = full
        .journal
        .iter()
        .filter(|e| e.payload.kind() == journal::EventKind::Dispatched)
        .count();
    assert_eq!(admitted, 3);
    // The breaker of the primary was written back (two failures open it).
    let breaker_key = full
        .store
        .keys()
        .find(|k| k.starts_with("breaker/"))
        .cloned()
        .unwrap();
    assert!(full.store[&breaker_key].1 >= 1);
}

/// A sealed bundle replays to its receipt, every admission under the
/// snapshots it carries (a drift is a verdict, not an error).
fn assert_verified(bundle: &retryledger_core::Bundle, at: &str) {
    let verdict = verify_bundle(bundle).unwrap();
    assert!(
        matches!(verdict, Verdict::Verified { .. }),
        "{at}: {verdict:?}"
    );
}

/// Crash a journaled run after every number of appends and resume it
/// (reconciling an attempt in doubt as `failed_no_effect`): the run always
/// finishes, its journal and its sealed bundle verify (the bundle's receipt
/// is the one the journal's `terminal` event holds), and an attempt is sent
/// again only after such a reconciliation.
fn crash_everywhere(cp: &Arc<CompiledPolicy>, script: &Script) {
    let full = play_start(cp, options(true), script).unwrap();
    assert!(full.error.is_none(), "{:?}", full.error);
    let total = full
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count() as u64;
    for k in 0..=total {
        let crashed = play_start(
            cp,
            options(true),
            &Script {
                crash_after_appends: Some(k),
                ..script.clone()
            },
        )
        .unwrap();
        assert!(crashed.error.is_none(), "crash at {k}: {:?}", crashed.error);
        if k == total {
            assert!(!crashed.crashed);
            continue;
        }
        assert!(crashed.crashed, "crash at {k}");
        journal::verify(cp, &crashed.journal).unwrap();
        // The new owner: a higher lease; the dispatches left to do, and a
        // receiver that says the attempt in doubt had no effect.
        let sent = crashed
            .events
            .iter()
            .filter(|e| matches!(e, Event::Observed(_)))
            .count();
        let in_doubt = crashed
            .journal
            .last()
            .is_some_and(|e| e.payload.kind() == journal::EventKind::Dispatched);
        let skip = sent + usize::from(in_doubt);
        let rest = Script {
            attempts: script.attempts[skip.min(script.attempts.len())..].to_vec(),
            reconcile: vec![json!({"answer": "failed_no_effect"})],
            store: crashed
                .store
                .iter()
                .map(|(k, (d, _))| (k.clone(), d.clone()))
                .collect(),
            ..Script::default()
        };
        let mut opts = options(true);
        opts.journal.as_mut().unwrap().lease_generation = 2;
        opts.now_ms = crashed.now_ms;
        let mut m = Machine::resume(Arc::clone(cp), &crashed.journal, opts).unwrap();
        let resumed = play(&mut m, &rest, crashed.journal.clone());
        assert!(
            resumed.error.is_none(),
            "resume at {k}: {:?}",
            resumed.error
        );
        assert!(!resumed.crashed);
        journal::verify(cp, &resumed.journal).unwrap();
        assert!(m.next().is_done(), "resume at {k}");
        let bundle = m.seal().unwrap();
        assert_verified(&bundle, &format!("resume at {k}"));
        assert_eq!(
            sealed_receipt(&resumed.journal),
            Some(digest_of(&bundle.receipt)),
            "resume at {k}"
        );
        // Every attempt sent again follows a `failed_no_effect` answer.
        let reconciled = resumed
            .journal
            .iter()
            .filter_map(|e| match &e.payload {
                journal::Payload::Observed { attempt, .. } => attempt.reconciled,
                _ => None,
            })
            .count();
        assert_eq!(reconciled, usize::from(in_doubt), "resume at {k}");
    }
}

#[test]
fn a_journaled_run_crashed_at_every_prefix_resumes_to_a_verified_end() {
    crash_everywhere(&policy(|_| {}), &reference_script());
}

#[test]
fn a_journaled_fleet_run_crashed_at_every_prefix_resumes_to_a_verified_end() {
    crash_everywhere(&policy(|p| p["fleet"] = fleet()), &reference_script());
}

#[test]
fn an_answer_to_an_effect_not_asked_is_unexpected_and_changes_nothing() {
    let cp = policy(|_| {});
    let mut m = Machine::start(cp, options(true)).unwrap();
    let before = m.next().clone();
    assert!(matches!(before, Effect::Append { .. }));
    for bad in [
        Event::Clock { now_ms: 5 },
        Event::Written { written: 1 },
        Event::Cancelled { at_ms: 0 },
    ] {
        let e = m.answer(bad).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnexpectedEvent);
        assert_eq!(m.next(), &before);
    }
    m.answer(Event::Appended).unwrap();
    // A clock that goes back is refused.
    let mut m2 = Machine::start(policy(|_| {}), options(false)).unwrap();
    let Effect::Dispatch { .. } = m2.next() else {
        panic!("the first attempt is dispatched at once")
    };
    let played = play(&mut m2, &reference_script(), Vec::new());
    assert!(played.error.is_none());
}

#[test]
fn a_refused_append_loses_the_run() {
    let cp = policy(|_| {});
    let mut m = Machine::start(cp, options(true)).unwrap();
    let e = m.answer(Event::AppendRefused).unwrap_err();
    assert_eq!(e.code, ErrorCode::JournalStaleLease);
    assert_eq!(
        m.answer(Event::Appended).unwrap_err().code,
        ErrorCode::UnexpectedEvent
    );
}

/// Arbitrary answers (any answer to any effect, any store view, crashes
/// resumed from any journal prefix): every step is a coded error or a state
/// whose sealed bundle and journal verify. The fuzz target `machine` runs
/// the same check on coverage-guided input.
#[test]
fn arbitrary_answers_are_coded_errors_or_verified_states() {
    let cases: u64 = std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let (mut done, mut resumed, mut refused, mut keyed) = (0u64, 0u64, 0u64, 0u64);
    for case in 0..cases {
        let len = 8 + (case % 200) as usize;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                // xorshift64*: a fixed, repeatable sequence.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect();
        match retryledger_core::machine::arbitrary::drive(&data) {
            Ok(r) => {
                done += u64::from(r.done);
                resumed += u64::from(r.resumed);
                refused += u64::from(r.refused);
                keyed += u64::from(r.keyed);
            }
            Err(finding) => panic!("case {case} ({data:?}): {finding}"),
        }
    }
    // Not vacuous: runs finish and seal, journals are resumed, answers are refused.
    assert!(done > cases / 10, "{done} of {cases} runs finished");
    assert!(
        resumed > 0 && refused > 0,
        "resumed {resumed}, refused {refused}"
    );
    assert!(keyed > 0, "no run dispatched with a pooled key");
}

#[test]
fn a_journal_cut_after_reserved_goes_on_with_dispatched_alone() {
    let cp = policy(|_| {});
    let full = play_start(&cp, options(true), &reference_script()).unwrap();
    assert!(full.error.is_none(), "{:?}", full.error);
    let mut cuts = 0;
    for n in 1..=full.journal.len() {
        let prefix = &full.journal[..n];
        if !matches!(prefix[n - 1].payload, journal::Payload::Reserved { .. }) {
            continue;
        }
        cuts += 1;
        let mut opts = options(true);
        if let Some(j) = opts.journal.as_mut() {
            j.lease_generation = 2;
        }
        // The write of `reserved` + `dispatched` was cut between its events:
        // nothing was sent, and the next append is `dispatched` alone.
        let mut m = Machine::resume(Arc::clone(&cp), prefix, opts).unwrap();
        if let Effect::Sleep { until_ms } = m.next() {
            let now_ms = *until_ms;
            m.answer(Event::Clock { now_ms }).unwrap();
        }
        let Effect::Append { events } = m.next() else {
            panic!("expected an append after a cut at {n}, got {:?}", m.next());
        };
        assert_eq!(events.len(), 1, "cut at {n}");
        assert!(matches!(events[0].payload, journal::Payload::Dispatched(_)));
    }
    assert_eq!(cuts, 3);
}

#[test]
fn an_observed_model_is_recorded_by_the_machine_and_journaled() {
    let cp = policy(|_| {});
    let mut script = reference_script();
    script.attempts[0]["model"] = json!({"requested": "gpt-4.1"});
    script.attempts[2]["model"] =
        json!({"requested": "claude-sonnet-4-5", "served": "claude-sonnet-4-5-20250929"});
    for journaled in [false, true] {
        let played = play_start(&cp, options(journaled), &script).unwrap();
        assert!(played.error.is_none(), "{:?}", played.error);
        let mut m = Machine::start(Arc::clone(&cp), options(journaled)).unwrap();
        for e in &played.events {
            m.answer(e.clone()).unwrap();
        }
        let bundle = m.seal().unwrap();
        let receipt = to_value(&bundle.receipt);
        assert_eq!(
            receipt["schedule"][0]["model"],
            json!({"requested": "gpt-4.1"})
        );
        assert!(receipt["schedule"][1].get("model").is_none());
        assert_eq!(
            receipt["schedule"][2]["model"]["served"],
            json!("claude-sonnet-4-5-20250929")
        );
        assert!(matches!(
            verify_bundle(&bundle).unwrap(),
            retryledger_core::Verdict::Verified { .. }
        ));
        if journaled {
            journal::verify(&cp, &played.journal).unwrap();
        }
    }
    // An empty model record is refused, as a document would be.
    let mut bad = reference_script();
    bad.attempts[0]["model"] = json!({});
    let played = play_start(&cp, options(false), &bad);
    let refused = match played {
        Err(e) => Some(e.code),
        Ok(p) => p.error.map(|e| e.code),
    };
    assert_eq!(refused, Some(ErrorCode::MissingField));
}

/// A journaled fleet run the fleet stopped (every route's breaker open),
/// resumed from its whole journal: the resumed machine seals a bundle
/// that verifies.
#[test]
fn a_fleet_stopped_journal_resumed_when_done_seals_a_verified_bundle() {
    let cp = policy(|p| p["fleet"] = fleet());
    let open = |release: &str| {
        json!({
            "consecutive_failures": 0, "generation": 1, "opened_at_epoch_ms": ORIGIN,
            "probe_successes": 0, "probes_in_flight": 0, "route_release_sha256": release,
            "schema": "retryledger.breaker.v1", "state": "open", "updated_at_epoch_ms": ORIGIN,
            "window_failures": 0, "window_start_epoch_ms": ORIGIN, "window_total": 0
        })
    };
    let mut script = reference_script();
    for r in &cp.policy.routes {
        let release = r.route_release_sha256.as_str();
        script
            .store
            .insert(format!("breaker/{release}"), open(release));
    }
    let mut m = Machine::start(Arc::clone(&cp), options(true)).unwrap();
    let full = play(&mut m, &script, Vec::new());
    assert!(full.error.is_none(), "{:?}", full.error);
    let bundle = m.seal().unwrap();
    assert_eq!(
        bundle.receipt.terminal,
        retryledger_core::Terminal::StopCircuitOpen
    );
    assert_verified(&bundle, "the first owner");
    let mut opts = options(true);
    opts.journal.as_mut().unwrap().lease_generation = 2;
    opts.now_ms = full.now_ms;
    let resumed = Machine::resume(Arc::clone(&cp), &full.journal, opts).unwrap();
    assert!(resumed.next().is_done());
    let again = resumed.seal().unwrap();
    assert_eq!(digest_of(&again.receipt), digest_of(&bundle.receipt));
    assert_verified(&again, "resumed when done");
}
