//! A 409 with a hint to a keyed request is `in_progress`: the first request
//! still runs at the receiver. The run asks again on the same route with the
//! same key, never on another route (not even after a later failure), at most
//! `MAX_IN_PROGRESS` answers in a row, never past its total attempts or its
//! deadline; when no ask fits it stops `stop_indeterminate`. Sealed runs
//! verify. `RETRYLEDGER_PROPERTY_CASES` cases (256 unset).
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use proptest::prelude::*;
use retryledger_core::decode::from_value;
use retryledger_core::evaluate::{Decision, Terminal, MAX_IN_PROGRESS};
use retryledger_core::http::{classify_http, HttpObservation};
use retryledger_core::outcome::{NonRetryableKind, RetryableKind};
use retryledger_core::{
    compile, lab, plan_next, seal, verify_bundle, Attempts, Outcome, Policy, Verdict,
};
use serde_json::json;

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// `routes` routes of `per_route` attempts, `total` attempts, deadline `deadline`.
fn policy(routes: usize, per_route: u64, total: u64, deadline: u64) -> Policy {
    let mut p = lab::reference_policy();
    let template = p["routes"][1].clone();
    let mut list = Vec::new();
    for i in 0..routes {
        let mut r = template.clone();
        r["route_id"] = json!(format!("route-{i}"));
        r["priority"] = json!(i);
        r["max_attempts"] = json!(per_route);
        r["reserve_cost"] = json!(0);
        r["route_release_sha256"] = json!(retryledger_core::canonical::sha256_hex(
            format!("release {i}").as_bytes()
        ));
        list.push(r);
    }
    p["routes"] = json!(list);
    p["max_total_attempts"] = json!(total);
    p["deadline_ms"] = json!(deadline);
    p["backoff"] = json!({"base_ms": 10, "max_ms": 200, "retry_after_cap_ms": 1_000});
    from_value(p).unwrap()
}

fn in_progress(hint: Option<u64>) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::InProgress,
        retry_after_ms: hint,
        retry_after_source: None,
    }
}

fn retryable(kind: RetryableKind) -> Outcome {
    Outcome::Retryable {
        kind,
        retry_after_ms: None,
        retry_after_source: None,
    }
}

/// 0: success, 1: timeout, 2: unavailable, 3..: in progress.
fn outcome() -> impl Strategy<Value = Outcome> {
    (0u8..8, prop::option::of(0u64..2_500)).prop_map(|(k, hint)| match k {
        0 => Outcome::Success,
        1 => retryable(RetryableKind::TimeoutBeforeResponse),
        2 => retryable(RetryableKind::Unavailable),
        _ => in_progress(hint),
    })
}

/// Drive a run by its plan: each step's outcome after `duration` ms.
fn drive(cp: &retryledger_core::CompiledPolicy, steps: &[(Outcome, u64)]) -> (Attempts, Decision) {
    let mut attempts = Attempts::default();
    for (outcome, duration) in steps {
        let Decision::Dispatch(d) = plan_next(cp, &attempts).unwrap() else {
            break;
        };
        let started = d.not_before_ms;
        attempts
            .attempts
            .push(d.attempt(started, started + duration, 0, *outcome));
    }
    let next = plan_next(cp, &attempts).unwrap();
    (attempts, next)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn an_in_progress_run_never_leaves_its_route_and_stays_bounded(
        routes in 1usize..4,
        per_route in 1u64..4,
        total in 1u64..14,
        deadline in 500u64..20_000,
        steps in prop::collection::vec((outcome(), 0u64..400), 1..16),
    ) {
        let cp = compile(policy(routes, per_route, total, deadline)).unwrap();
        let mut attempts = Attempts::default();
        let mut pinned: Option<String> = None;
        let mut in_a_row = 0u64;
        for (outcome, duration) in &steps {
            let next = plan_next(&cp, &attempts).unwrap();
            let Decision::Dispatch(d) = next else {
                let Decision::Terminal { terminal } = next else { unreachable!() };
                if let Some(last) = attempts.attempts.last() {
                    let asked = matches!(last.outcome, Outcome::Retryable { kind: RetryableKind::InProgress, .. });
                    if asked && last.completed_at_ms < deadline {
                        prop_assert_eq!(terminal, Terminal::StopIndeterminate);
                    }
                    if pinned.is_some() && matches!(last.outcome, Outcome::Retryable { .. }) && last.completed_at_ms < deadline {
                        prop_assert_eq!(terminal, Terminal::StopIndeterminate);
                    }
                }
                break;
            };
            if let Some(route) = &pinned {
                prop_assert_eq!(d.route_id.as_str(), route.as_str(), "left the route that answered in progress");
            }
            prop_assert!(d.ordinal <= total);
            prop_assert!(d.not_before_ms < deadline);
            let a = d.attempt(d.not_before_ms, d.not_before_ms + duration, 0, *outcome);
            if matches!(outcome, Outcome::Retryable { kind: RetryableKind::InProgress, .. }) {
                in_a_row += 1;
                pinned.get_or_insert_with(|| d.route_id.as_str().to_owned());
            } else {
                in_a_row = 0;
            }
            prop_assert!(in_a_row <= MAX_IN_PROGRESS);
            attempts.attempts.push(a);
        }
        // A finished run seals and verifies.
        if let Decision::Terminal { .. } = plan_next(&cp, &attempts).unwrap() {
            let bundle = seal(&cp.policy, &attempts).unwrap();
            let verified = matches!(verify_bundle(&bundle), Ok(Verdict::Verified { .. }));
            prop_assert!(verified, "the sealed run does not verify");
        }
    }
}

/// The crash test's bug: a timeout retried under the same key while the first
/// request still runs gets 409 in progress; the run waits, asks again on the
/// same route (its two attempts spent) and completes with the replayed answer.
#[test]
fn a_timeout_then_in_progress_then_the_replay_completes_on_the_same_route() {
    let cp = compile(from_value(lab::reference_policy()).unwrap()).unwrap();
    let conflict = HttpObservation {
        error_body: None,
        headers: vec![("Retry-After".into(), "1".into())],
        now_unix_ms: 0,
        provider_family: None,
        response_bytes_received: false,
        retry_after_cap_ms: 2_000,
        status: Some(409),
        transport_error: None,
    };
    let judged = classify_http(&conflict).unwrap();
    assert_eq!(judged, in_progress(Some(1_000)));
    let (attempts, next) = drive(
        &cp,
        &[
            (retryable(RetryableKind::TimeoutBeforeResponse), 1_000),
            (judged, 20),
        ],
    );
    let Decision::Dispatch(d) = next else {
        panic!("expected a dispatch, got {next:?}")
    };
    assert_eq!(d.route_id.as_str(), "private-primary");
    assert_eq!(d.route_ordinal, 3, "past the route's bound of 2");
    assert_eq!(
        d.not_before_ms,
        attempts.attempts[1].completed_at_ms + 1_000
    );
    assert_eq!(
        d.idempotency_key_sha256,
        attempts.attempts[0].idempotency_key_sha256
    );
    let (attempts, next) = drive(
        &cp,
        &[
            (retryable(RetryableKind::TimeoutBeforeResponse), 1_000),
            (judged, 20),
            (Outcome::Success, 30),
        ],
    );
    assert_eq!(
        next,
        Decision::Terminal {
            terminal: Terminal::Completed
        }
    );
    let bundle = seal(&cp.policy, &attempts).unwrap();
    assert!(!bundle.receipt.fallback_used);
    assert!(matches!(
        verify_bundle(&bundle),
        Ok(Verdict::Verified { .. })
    ));
}

#[test]
fn a_409_without_a_hint_and_a_422_stay_non_retryable() {
    let obs = |status, headers: Vec<(String, String)>| HttpObservation {
        error_body: None,
        headers,
        now_unix_ms: 0,
        provider_family: None,
        response_bytes_received: false,
        retry_after_cap_ms: 2_000,
        status: Some(status),
        transport_error: None,
    };
    assert_eq!(
        classify_http(&obs(409, vec![])).unwrap(),
        Outcome::NonRetryable {
            kind: NonRetryableKind::Rejected
        }
    );
    assert_eq!(
        classify_http(&obs(422, vec![("retry-after".into(), "1".into())])).unwrap(),
        Outcome::NonRetryable {
            kind: NonRetryableKind::InvalidRequest
        }
    );
}

#[test]
fn the_bound_stops_indeterminate_after_max_in_progress_answers_in_a_row() {
    let cp = compile(policy(1, 20, 20, 1_000_000)).unwrap();
    let n = usize::try_from(MAX_IN_PROGRESS).unwrap();
    let steps = vec![(in_progress(Some(10)), 5); n];
    let (_, next) = drive(&cp, &steps[..n - 1]);
    assert!(matches!(next, Decision::Dispatch(_)));
    let (attempts, next) = drive(&cp, &steps);
    assert_eq!(
        next,
        Decision::Terminal {
            terminal: Terminal::StopIndeterminate
        }
    );
    assert!(matches!(
        verify_bundle(&seal(&cp.policy, &attempts).unwrap()),
        Ok(Verdict::Verified { .. })
    ));
}
