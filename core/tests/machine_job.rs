//! The async job layer of the run machine: a submit, then polls of the
//! accepted job at the schedule `job` plans, and the cancel of a job a run
//! would leave running. Through the machine a job reaches the receipt a
//! session reaches on the same answers; its output checks run on the final
//! result only; under a fleet the submit is admitted and the polls are
//! not; under a journal a run crashed at every prefix and resumed never
//! submits again after an acceptance, and every journal and bundle
//! verifies.
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
use retryledger_core::job::{JobKind, JobStatus};
use retryledger_core::machine::script::{play, play_start, Script};
use retryledger_core::machine::{Effect, Event, JournalOptions, Machine, Options};
use retryledger_core::observe::Facts;
use retryledger_core::{compile, journal, lab, verify_bundle, CompiledPolicy, Session, Terminal};
use serde_json::{json, Value};

const ORIGIN: u64 = 1_780_000_000_000;

fn policy(fleet: bool, cancel: bool) -> Arc<CompiledPolicy> {
    let mut p = lab::reference_policy();
    p["async_job"] = json!({"max_polls": 4, "poll_base_ms": 200, "poll_max_ms": 600});
    if cancel {
        p["async_job"]["cancel_left_running"] = json!(true);
    }
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

fn failed_check() -> Value {
    json!([{"defects": [{"message": "the answer has no content"}], "kind": "empty",
        "validator": "builtin.empty", "verdict": "defects"}])
}

/// A submit refused 503, a submit accepted (its answer carries a failing
/// output check, which is not judged: it is not the final result), a poll
/// still running, a poll that lost its answer, then the completed job.
fn script(final_check_fails: bool) -> Script {
    let mut done = json!({"after_ms": 40, "facts": {"result": "returned"},
        "job_id": "job-7", "job_status": "completed"});
    if final_check_fails {
        done["facts"]["output_checks"] = failed_check();
    }
    Script {
        attempts: vec![
            json!({"after_ms": 30, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": 503}}),
            json!({"after_ms": 50, "facts": {"output_checks": failed_check(), "result": "returned"},
                "job_id": "job-7", "job_status": "queued"}),
            json!({"after_ms": 20, "facts": {"result": "returned"}, "job_id": "job-7", "job_status": "in_progress"}),
            json!({"after_ms": 1_000, "facts": {"result": "raised", "transport_error": "timeout"}}),
            done,
        ],
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

fn options(journal: Option<u64>, now_ms: u64) -> Options {
    Options {
        origin_epoch_ms: ORIGIN,
        now_ms,
        journal: journal.map(|g| JournalOptions {
            run_id: retryledger_core::ids::Identifier::parse("run-j").unwrap(),
            lease_generation: g,
        }),
        ..Options::default()
    }
}

/// Drive `cp` through the machine, recording the effect before each answer.
fn effects_of(cp: &Arc<CompiledPolicy>, opts: Options, s: &Script) -> (Vec<Effect>, Machine) {
    let played = play_start(cp, opts.clone(), s).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    let mut m = Machine::start(Arc::clone(cp), opts).unwrap();
    let mut effects = Vec::new();
    for e in &played.events {
        effects.push(m.next().clone());
        m.answer(e.clone()).unwrap();
    }
    assert!(m.next().is_done());
    (effects, m)
}

#[test]
fn a_job_through_the_machine_is_submitted_then_polled_and_reaches_the_sessions_receipt() {
    let cp = policy(false, false);
    let (effects, m) = effects_of(&cp, options(None, 0), &script(false));
    let kinds: Vec<&str> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dispatch { .. } => Some("dispatch"),
            Effect::Poll { .. } => Some("poll"),
            Effect::Cancel { .. } => Some("cancel"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["dispatch", "dispatch", "poll", "poll", "poll"]);
    // Each poll waits its planned delay after the answer before it.
    for w in effects.windows(2) {
        if let (Effect::Sleep { until_ms }, Effect::Poll { dispatch, .. }) = (&w[0], &w[1]) {
            assert_eq!(*until_ms, dispatch.not_before_ms);
        }
    }
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::Completed);
    // The accepted submit's failing check was not judged.
    assert!(bundle
        .attempts
        .attempts
        .iter()
        .all(|a| a.output_check.is_none()));

    // The same answers through a bare session: the same receipt.
    let mut session = Session::start(Arc::clone(&cp));
    let mut now = 0;
    for step in &script(false).attempts {
        let retryledger_core::Decision::Dispatch(d) = session.next().clone() else {
            panic!("the session ended early")
        };
        now = now.max(d.not_before_ms);
        let mut facts: Facts = retryledger_core::decode::from_value(step["facts"].clone()).unwrap();
        facts.now_unix_ms = ORIGIN + now + step["after_ms"].as_u64().unwrap();
        let final_result = step["job_status"] == "completed";
        if !final_result {
            facts.output_checks.clear();
        }
        let status = step["job_status"]
            .as_str()
            .map(|s| JobStatus::parse(s).unwrap());
        if step.get("job_id").is_some() || status.is_some() {
            session.set_job(step["job_id"].as_str(), status);
        }
        let end = now + step["after_ms"].as_u64().unwrap();
        session.observe(now, end, None, &facts).unwrap();
        now = end;
    }
    let plain = session.seal().unwrap();
    assert_eq!(digest_of(&plain.receipt), digest_of(&bundle.receipt));
}

#[test]
fn a_jobs_output_checks_run_on_its_final_result_only() {
    let cp = policy(false, false);
    let (_, m) = effects_of(&cp, options(None, 0), &script(true));
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::StopNonRetryable);
    let checked: Vec<_> = bundle
        .attempts
        .attempts
        .iter()
        .filter(|a| a.output_check.is_some())
        .collect();
    assert_eq!(checked.len(), 1);
    assert_eq!(checked[0].job.as_ref().unwrap().kind, JobKind::Poll);
}

#[test]
fn a_caller_cancellation_cancels_the_accepted_job() {
    let cp = policy(false, true);
    let mut s = script(false);
    // The sleep before the first poll is cancelled (sleeps: the backoff
    // after the 503, then the wait before the first poll).
    s.cancel_sleeps = vec![1];
    s.attempts.truncate(2);
    s.attempts
        .push(json!({"after_ms": 15, "facts": {"result": "returned"}}));
    let (effects, m) = effects_of(&cp, options(None, 0), &s);
    assert!(matches!(
        effects
            .iter()
            .rev()
            .find(|e| !matches!(e, Effect::Done { .. })),
        Some(Effect::Cancel { .. })
    ));
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::StopCancelled);
    let job = bundle.receipt.job.as_ref().unwrap();
    assert!(!job.left_running);
}

#[test]
fn under_a_fleet_the_submit_is_admitted_and_the_polls_are_not() {
    let cp = policy(true, false);
    let (effects, m) = effects_of(&cp, options(None, 0), &script(false));
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::Completed);
    for a in &bundle.attempts.attempts {
        let submit = a.job.as_ref().unwrap().kind == JobKind::Submit;
        assert_eq!(a.admission.is_some(), submit, "attempt {}", a.ordinal);
    }
    // A read (the admission) comes before each submit, none before a poll.
    for (i, e) in effects.iter().enumerate() {
        if let Effect::Poll { .. } = e {
            let before = effects[..i]
                .iter()
                .rev()
                .find(|e| !matches!(e, Effect::Sleep { .. } | Effect::Append { .. }));
            assert!(
                !matches!(before, Some(Effect::Read { .. })),
                "a poll admitted at {i}"
            );
        }
    }
    assert!(effects.iter().any(|e| matches!(e, Effect::Read { .. })));
}

/// Crash a journaled job after every number of appends and resume it: the
/// job is submitted again only after a reconciliation that said
/// `failed_no_effect`, never after its acceptance.
fn crash_everywhere(cp: &Arc<CompiledPolicy>, answer: &str) {
    let s = script(false);
    let full = play_start(cp, options(Some(1), 0), &s).unwrap();
    assert!(full.error.is_none(), "{:?}", full.error);
    journal::verify(cp, &full.journal).unwrap();
    let total = full
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count() as u64;
    let mut resumed_in_doubt = 0;
    for k in 0..total {
        let crashed = play_start(
            cp,
            options(Some(1), 0),
            &Script {
                crash_after_appends: Some(k),
                ..s.clone()
            },
        )
        .unwrap();
        assert!(crashed.crashed && crashed.error.is_none(), "crash at {k}");
        journal::verify(cp, &crashed.journal).unwrap();
        let observed = crashed
            .journal
            .iter()
            .filter(|e| e.payload.kind() == journal::EventKind::Observed)
            .count();
        let in_doubt = crashed
            .journal
            .last()
            .is_some_and(|e| e.payload.kind() == journal::EventKind::Dispatched);
        let rest = Script {
            // A poll or a submit with no effect is sent again: its step replays.
            attempts: s.attempts[observed.min(s.attempts.len())..].to_vec(),
            reconcile: vec![json!({"answer": answer, "job_id": "job-7"})],
            store: crashed
                .store
                .iter()
                .map(|(k, (d, _))| (k.clone(), d.clone()))
                .collect(),
            ..Script::default()
        };
        let mut m = Machine::resume(
            Arc::clone(cp),
            &crashed.journal,
            options(Some(2), crashed.now_ms),
        )
        .unwrap();
        let resumed = play(&mut m, &rest, crashed.journal.clone());
        assert!(
            resumed.error.is_none(),
            "resume at {k}: {:?}",
            resumed.error
        );
        journal::verify(cp, &resumed.journal).unwrap();
        let bundle = m.seal().unwrap();
        assert!(
            matches!(
                verify_bundle(&bundle).unwrap_or_else(|e| panic!("resume at {k}: {e:?}")),
                retryledger_core::Verdict::Verified { .. }
            ),
            "resume at {k}"
        );
        let jobs: Vec<_> = bundle
            .attempts
            .attempts
            .iter()
            .map(|a| (a.job.as_ref().unwrap().kind, a.outcome, a.reconciled))
            .collect();
        // At most one accepted submit, and no submit after it.
        let accepted = jobs.iter().position(|(k, o, _)| {
            *k == JobKind::Submit && *o == retryledger_core::Outcome::Success
        });
        if let Some(at) = accepted {
            assert!(
                jobs[at + 1..].iter().all(|(k, _, _)| *k != JobKind::Submit),
                "resume at {k}: a submit after the acceptance"
            );
        }
        // A submit after another is allowed only after a refusal or a
        // reconciliation that found no effect.
        for w in jobs.windows(2) {
            if w[1].0 == JobKind::Submit {
                assert!(
                    w[0].1 != retryledger_core::Outcome::Success,
                    "resume at {k}"
                );
            }
        }
        // A submit whose acceptance the journal holds is the run's only one.
        let submitted_before = crashed.journal.iter().any(|e| match &e.payload {
            journal::Payload::Observed { attempt, .. } => {
                attempt.outcome == retryledger_core::Outcome::Success
                    && attempt.job.as_ref().unwrap().kind == JobKind::Submit
            }
            _ => false,
        });
        if submitted_before {
            assert_eq!(
                resumed
                    .events
                    .iter()
                    .filter(|e| matches!(e, Event::Observed(o) if o.job_status == Some(JobStatus::Queued)))
                    .count(),
                0,
                "resume at {k}: submitted again"
            );
        }
        if in_doubt {
            resumed_in_doubt += 1;
        }
        if !in_doubt && cp.policy.fleet.is_none() && k >= 1 {
            assert_eq!(
                bundle.receipt.terminal,
                Terminal::Completed,
                "resume at {k}"
            );
        }
    }
    assert!(resumed_in_doubt >= 3);
}

#[test]
fn a_journaled_job_crashed_at_every_prefix_resumes_polling_and_never_resubmits() {
    for answer in ["failed_no_effect", "succeeded", "unknown"] {
        crash_everywhere(&policy(false, false), answer);
    }
}

#[test]
fn a_journaled_fleet_job_crashed_at_every_prefix_resumes_polling_and_never_resubmits() {
    for answer in ["failed_no_effect", "succeeded", "unknown"] {
        crash_everywhere(&policy(true, false), answer);
    }
}

#[test]
fn a_poll_in_doubt_is_polled_again_without_asking_the_receiver() {
    let cp = policy(false, false);
    let s = script(false);
    // Find the prefixes that end with an attempt in doubt: a submit's is
    // reconciled, a poll's is not.
    let full = play_start(&cp, options(Some(1), 0), &s).unwrap();
    let appends = full
        .events
        .iter()
        .filter(|e| matches!(e, Event::Appended))
        .count() as u64;
    let mut at = None;
    for k in 0..appends {
        let crashed = play_start(
            &cp,
            options(Some(1), 0),
            &Script {
                crash_after_appends: Some(k),
                ..s.clone()
            },
        )
        .unwrap();
        if let Some(journal::Payload::Dispatched(_)) = crashed.journal.last().map(|e| &e.payload) {
            let m = Machine::resume(
                Arc::clone(&cp),
                &crashed.journal,
                options(Some(2), crashed.now_ms),
            )
            .unwrap();
            if matches!(m.next(), Effect::Reconcile { .. }) {
                continue;
            }
            at = Some(k);
            // No reconcile effect: the journal already holds the settled
            // poll, and the next poll is planned.
            assert!(!matches!(m.next(), Effect::Reconcile { .. }));
            break;
        }
    }
    assert!(at.is_some(), "no prefix ends with a poll in doubt");
}

#[test]
fn a_journaled_caller_cancellation_cancels_the_accepted_job() {
    let cp = policy(false, true);
    let mut s = script(false);
    s.cancel_sleeps = vec![1];
    s.attempts.truncate(2);
    s.attempts
        .push(json!({"after_ms": 15, "facts": {"result": "returned"}}));
    let played = play_start(&cp, options(Some(1), 0), &s).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    journal::verify(&cp, &played.journal).unwrap();
    assert!(matches!(
        played.journal.last().map(|e| &e.payload),
        Some(journal::Payload::Terminal(end)) if end.terminal == Terminal::StopCancelled
    ));
}

#[test]
fn a_cancellation_journaled_with_the_cancels_reservation_resumes_to_the_cancel() {
    let cp = policy(false, true);
    let mut s = script(false);
    s.cancel_sleeps = vec![1];
    s.attempts.truncate(2);
    s.attempts
        .push(json!({"after_ms": 15, "facts": {"result": "returned"}}));
    let full = play_start(&cp, options(Some(1), 0), &s).unwrap();
    let at = full
        .journal
        .iter()
        .position(|e| {
            matches!(
                &e.payload,
                journal::Payload::Reserved {
                    cancelled_at_ms: Some(_),
                    ..
                }
            )
        })
        .expect("the cancellation is journaled with the cancel's reservation");
    // Cut right after that reservation: the new owner sends the cancel.
    let prefix = full.journal[..=at].to_vec();
    let mut m = Machine::resume(Arc::clone(&cp), &prefix, options(Some(2), full.now_ms)).unwrap();
    let rest = Script {
        attempts: vec![json!({"after_ms": 15, "facts": {"result": "returned"}})],
        ..Script::default()
    };
    let resumed = play(&mut m, &rest, prefix.clone());
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    journal::verify(&cp, &resumed.journal).unwrap();
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::StopCancelled);
    assert_eq!(
        bundle
            .attempts
            .attempts
            .last()
            .unwrap()
            .job
            .as_ref()
            .unwrap()
            .kind,
        JobKind::Cancel
    );
    // A cancellation with a reservation that is not a job's cancel is refused.
    let mut tampered = full.journal.clone();
    let first_reserved = tampered
        .iter()
        .position(|e| e.payload.kind() == journal::EventKind::Reserved)
        .unwrap();
    if let journal::Payload::Reserved {
        cancelled_at_ms, ..
    } = &mut tampered[first_reserved].payload
    {
        *cancelled_at_ms = Some(0);
    }
    let e = journal::verify(&cp, &tampered[..=first_reserved]).unwrap_err();
    assert_eq!(e.code, retryledger_core::ErrorCode::JournalPlanDrift);
}

fn answer_json(m: &mut Machine, event: Value) -> retryledger_core::error::Result<&Effect> {
    m.answer(retryledger_core::decode::from_value(event).unwrap())
}

#[test]
fn a_submit_whose_answer_was_lost_is_reconciled_in_the_run_and_its_job_polled() {
    let cp = policy(false, false);
    let mut m = Machine::start(Arc::clone(&cp), options(None, 0)).unwrap();
    assert!(matches!(m.next(), Effect::Dispatch { .. }));
    // The submit raised; the receiver, asked by idempotency key, holds the
    // accepted job: the attempt is the acceptance and the job is polled.
    let lost = json!({"kind": "observed", "completed_at_ms": 30, "reconciled": "succeeded",
        "job_id": "job-9", "job_status": "queued",
        "facts": {"result": "raised", "transport_error": "connection_reset"}});
    // A reconciliation of an attempt that is not a job's is refused, nothing changed.
    let mut plain = Machine::start(
        Arc::new(
            compile(retryledger_core::decode::from_value(lab::reference_policy()).unwrap())
                .unwrap(),
        ),
        options(None, 0),
    )
    .unwrap();
    let e = answer_json(&mut plain, lost.clone()).unwrap_err();
    assert_eq!(
        e.code,
        retryledger_core::error::ErrorCode::JobRecordUnexpected
    );
    assert!(matches!(plain.next(), Effect::Dispatch { .. }));
    let next = answer_json(&mut m, lost).unwrap().clone();
    assert!(matches!(next, Effect::Sleep { .. }), "{next:?}");
    let first = m.session().attempts().attempts[0].clone();
    assert_eq!(
        first.reconciled,
        Some(retryledger_core::attempt::Reconciled::Succeeded)
    );
    m.answer(Event::Clock { now_ms: 1_000 }).unwrap();
    let Effect::Poll { started_at_ms, .. } = m.next().clone() else {
        panic!("a poll of the reconciled job: {:?}", m.next())
    };
    // A poll is not reconciled in the run.
    let poll = json!({"kind": "observed", "completed_at_ms": started_at_ms + 10, "reconciled": "succeeded",
        "job_id": "job-9", "job_status": "completed", "facts": {"result": "returned"}});
    let e = answer_json(&mut m, poll).unwrap_err();
    assert_eq!(
        e.code,
        retryledger_core::error::ErrorCode::JobRecordUnexpected
    );
    let done = json!({"kind": "observed", "completed_at_ms": started_at_ms + 10,
        "job_id": "job-9", "job_status": "completed", "facts": {"result": "returned"}});
    answer_json(&mut m, done).unwrap();
    assert!(m.next().is_done());
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::Completed);
    assert_eq!(bundle.receipt.job.as_ref().unwrap().submits, 1);
}

#[test]
fn a_cancellation_before_a_send_cancels_the_run_and_nothing_is_sent() {
    // A plain run: the dispatch is outstanding and the caller cancels
    // before sending it: no attempt, `stop_cancelled`.
    let plain = Arc::new(
        compile(retryledger_core::decode::from_value(lab::reference_policy()).unwrap()).unwrap(),
    );
    let mut m = Machine::start(Arc::clone(&plain), options(None, 0)).unwrap();
    assert!(matches!(m.next(), Effect::Dispatch { .. }));
    m.answer(Event::Cancelled { at_ms: 5 }).unwrap();
    assert!(m.next().is_done());
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::StopCancelled);
    assert!(bundle.attempts.attempts.is_empty());
    // Journaled, the `dispatched` is durable: the answer is the attempt's
    // observation, a cancellation is refused and the effect stays.
    let mut j = Machine::start(Arc::clone(&plain), options(Some(1), 0)).unwrap();
    while !matches!(j.next(), Effect::Dispatch { .. }) {
        j.answer(Event::Appended).unwrap();
    }
    let e = j.answer(Event::Cancelled { at_ms: 5 }).unwrap_err();
    assert_eq!(e.code, retryledger_core::error::ErrorCode::UnexpectedEvent);
    assert!(matches!(j.next(), Effect::Dispatch { .. }));
    // A job: a poll not yet sent is cancelled like a dispatch, and the
    // planned cancel of the job left running follows; that cancel is sent
    // whatever the caller did.
    let cp = policy(false, true);
    let mut m = Machine::start(Arc::clone(&cp), options(None, 0)).unwrap();
    answer_json(
        &mut m,
        json!({"kind": "observed", "completed_at_ms": 30, "job_id": "job-9",
        "job_status": "queued", "facts": {"result": "returned"}}),
    )
    .unwrap();
    while !matches!(m.next(), Effect::Poll { .. }) {
        let Effect::Sleep { until_ms } = m.next().clone() else {
            panic!("{:?}", m.next())
        };
        m.answer(Event::Clock { now_ms: until_ms }).unwrap();
    }
    let at = m.now_ms();
    m.answer(Event::Cancelled { at_ms: at }).unwrap();
    assert!(matches!(m.next(), Effect::Cancel { .. }), "{:?}", m.next());
    let e = m.answer(Event::Cancelled { at_ms: at }).unwrap_err();
    assert_eq!(e.code, retryledger_core::error::ErrorCode::UnexpectedEvent);
    answer_json(
        &mut m,
        json!({"kind": "observed", "completed_at_ms": at + 5, "job_id": "job-9",
        "facts": {"result": "returned"}}),
    )
    .unwrap();
    assert!(m.next().is_done());
    let bundle = m.seal().unwrap();
    assert!(matches!(
        verify_bundle(&bundle).unwrap(),
        retryledger_core::Verdict::Verified { .. }
    ));
    assert_eq!(bundle.receipt.terminal, Terminal::StopCancelled);
    assert_eq!(bundle.attempts.attempts.len(), 2);
}
