//! `cancel_left_running` over every short script of answers: the flag
//! changes no terminal, plans at most one cancel (the last attempt),
//! exactly when the run would leave the job running, and only that
//! cancel may start at or after the deadline.
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::evaluate::{plan_next, Decision, Terminal};
use crate::policy::CompiledPolicy;
use crate::session::Session;
use crate::{compile, verify_bundle};

const DEADLINE: u64 = 2_000;

fn policy(cancel: bool) -> Arc<CompiledPolicy> {
    let mut p = crate::lab::reference_policy();
    p["async_job"] = json!({"max_polls": 3, "poll_base_ms": 200, "poll_max_ms": 600});
    if cancel {
        p["async_job"]["cancel_left_running"] = json!(true);
    }
    p["deadline_ms"] = json!(DEADLINE);
    Arc::new(compile(crate::decode::from_value(p).unwrap()).unwrap())
}

/// An answer by index: (duration, facts, status); `None` is the caller's
/// cancellation between attempts.
fn answer(k: usize) -> Option<(u64, &'static str, Option<JobStatus>)> {
    let ok = r#"{"result":"returned"}"#;
    let unavailable = r#"{"error_types":["APIStatusError"],"result":"raised","status":503}"#;
    match k {
        0 => Some((50, ok, Some(JobStatus::Queued))),
        1 => Some((700, ok, Some(JobStatus::InProgress))),
        2 => Some((50, ok, Some(JobStatus::Completed))),
        3 => Some((50, unavailable, None)),
        4 => Some((1_500, ok, Some(JobStatus::InProgress))),
        _ => None,
    }
}

/// Run `script` (answer indexes; the cancel step answers `cancel_ok`),
/// padded with completions, to its sealed bundle and its decisions.
fn run(cancel: bool, script: &[usize], cancel_ok: bool) -> (crate::Bundle, Vec<Decision>) {
    let cp = policy(cancel);
    let mut s = Session::start(cp.clone());
    let mut decisions = vec![s.next().clone()];
    let mut now = 0u64;
    let mut next = script.iter().copied().chain(std::iter::repeat(2));
    while let Decision::Dispatch(d) = s.next().clone() {
        let start = d.not_before_ms.max(now);
        let (duration, facts, status) = if d.job.as_ref().unwrap().kind == JobKind::Cancel {
            let facts = if cancel_ok {
                r#"{"result":"returned"}"#
            } else {
                r#"{"error_types":["APIStatusError"],"result":"raised","status":409}"#
            };
            (20, facts, None)
        } else {
            match answer(next.next().unwrap()) {
                Some(a) => a,
                None => {
                    s.cancel(now).unwrap();
                    decisions.push(s.next().clone());
                    continue;
                }
            }
        };
        now = start + duration;
        // A submit reports the id only when the provider accepted it.
        let submit = d.job.as_ref().unwrap().kind == JobKind::Submit;
        let id = (!submit || status.is_some()).then_some("resp_exhaustive");
        s.set_job(id, status);
        let facts = crate::decode::from_str(facts).unwrap();
        s.observe(start, now, None, &facts).unwrap();
        assert_eq!(s.next(), &plan_next(&cp, s.attempts()).unwrap());
        decisions.push(s.next().clone());
    }
    (s.seal().unwrap(), decisions)
}

fn scripts(len: usize) -> Vec<Vec<usize>> {
    (0..len).fold(vec![vec![]], |acc, _| {
        acc.iter()
            .flat_map(|s| {
                (0..6).map(move |k| {
                    let mut s = s.clone();
                    s.push(k);
                    s
                })
            })
            .chain(acc.iter().cloned())
            .collect()
    })
}

#[test]
fn the_cancel_of_a_job_left_running_is_planned_once_and_recorded() {
    let mut cancels = 0;
    for script in scripts(4) {
        for cancel_ok in [true, false] {
            let (plain, _) = run(false, &script, cancel_ok);
            let (b, decisions) = run(true, &script, cancel_ok);
            let plain_job = plain.receipt.job.clone().unwrap();
            let job = b.receipt.job.clone().unwrap();
            assert_eq!(b.receipt.terminal, plain.receipt.terminal, "{script:?}");
            assert_eq!(plain_job.cancel, None);
            let recorded: Vec<_> = b
                .attempts
                .attempts
                .iter()
                .filter(|a| a.job.as_ref().unwrap().kind == JobKind::Cancel)
                .collect();
            // A cancel exactly when the plain run left the job running.
            assert_eq!(
                recorded.len(),
                usize::from(plain_job.left_running),
                "{script:?}"
            );
            assert_eq!(job.cancel.is_some(), plain_job.left_running);
            if let Some(c) = recorded.first() {
                cancels += 1;
                assert_eq!(Some(*c), b.attempts.attempts.last());
                let want = if cancel_ok {
                    CancelResult::Accepted
                } else {
                    CancelResult::Failed
                };
                assert_eq!(job.cancel, Some(want));
                assert_eq!(job.left_running, !cancel_ok);
                assert_eq!(c.job.as_ref().unwrap().job_sha256, job.job_sha256);
            }
            // Only the cancel may start at or after the deadline.
            for d in &decisions {
                if let Decision::Dispatch(d) = d {
                    let is_cancel = d.job.as_ref().unwrap().kind == JobKind::Cancel;
                    assert!(is_cancel || d.not_before_ms < DEADLINE, "{script:?}");
                    if is_cancel {
                        assert_eq!(d.reserve_cost, 0);
                    }
                }
            }
            assert!(verify_bundle(&b).is_ok(), "{script:?}");
        }
    }
    assert!(cancels > 100, "the scripts reach the cancel: {cancels}");
}

#[test]
fn a_cancel_past_the_deadline_is_planned_at_the_last_completion() {
    // A poll that completes past the deadline, the job still running.
    let (b, decisions) = run(true, &[4, 1], true);
    let last = b.attempts.attempts.last().unwrap();
    assert_eq!(last.job.as_ref().unwrap().kind, JobKind::Cancel);
    let before = &b.attempts.attempts[b.attempts.attempts.len() - 2];
    assert!(before.completed_at_ms >= DEADLINE);
    assert_eq!(last.started_at_ms, before.completed_at_ms);
    assert_eq!(b.receipt.terminal, Terminal::StopDeadline);
    let doc: Value = crate::canonical::to_value(&b.receipt);
    assert_eq!(doc["job"]["cancel"], "accepted");
    assert!(matches!(decisions.last(), Some(Decision::Terminal { .. })));
}
