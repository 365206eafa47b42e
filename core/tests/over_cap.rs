//! Never earlier than asked: under `retry_after_over_cap: "skip_route"` no
//! attempt is dispatched to a route before the Retry-After hint a failed
//! attempt of that route carried, and a fallback is taken when one is left;
//! under `stop` the run ends `stop_retry_after` at such a hint; under `clamp`
//! (the default) the wait is the cap. `RETRYLEDGER_PROPERTY_CASES` cases
//! (256 unset; `make properties` runs 10,000).
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use proptest::prelude::*;
use retryledger_core::decode::from_value;
use retryledger_core::evaluate::{Decision, Terminal};
use retryledger_core::outcome::RetryableKind;
use retryledger_core::{compile, lab, plan_next, Attempt, Attempts, Outcome, Policy};
use serde_json::json;

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A policy with `routes` routes of `per_route` attempts each, the given cap and mode.
fn policy(routes: usize, per_route: u64, cap: u64, mode: &str) -> Policy {
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
    p["max_total_attempts"] = json!(routes as u64 * per_route);
    p["deadline_ms"] = json!(1_000_000);
    p["backoff"] = json!({"base_ms": 10, "max_ms": 200, "retry_after_cap_ms": cap, "retry_after_over_cap": mode});
    from_value(p).unwrap()
}

#[derive(Debug, Clone, Copy)]
struct Step {
    duration: u64,
    hint: Option<u64>,
    succeeds: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        1u64..200,
        prop::option::of(0u64..3_000),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(duration, hint, succeeds)| Step {
            duration,
            hint,
            succeeds,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn skip_route_never_dispatches_before_a_hint(
        routes in 1usize..5,
        per_route in 1u64..5,
        cap in 0u64..1_500,
        steps in prop::collection::vec(step(), 1..20),
        lag in 0u64..50,
    ) {
        let cp = compile(policy(routes, per_route, cap, "skip_route")).unwrap();
        let mut attempts = Attempts::default();
        // Per route: no dispatch before this time (its last over-cap hint).
        let mut blocked: Vec<(String, u64)> = Vec::new();
        for s in &steps {
            let d = match plan_next(&cp, &attempts).unwrap() {
                Decision::Terminal { terminal } => {
                    // A run that stops right after an over-cap hint does so
                    // only when no route is left after it.
                    if let Some(last) = attempts.attempts.last() {
                        if terminal == Terminal::StopRetryAfter {
                            let hint = last.outcome.retry_after_ms().unwrap();
                            prop_assert!(hint > cap);
                            let at = cp.routes().position(|r| r.route_id == last.route_id).unwrap();
                            prop_assert_eq!(at + 1, routes, "stopped with a route left");
                        }
                    }
                    break;
                }
                Decision::Dispatch(d) => d,
            };
            let started = d.not_before_ms + lag;
            for (route, until) in &blocked {
                if route == d.route_id.as_str() {
                    prop_assert!(started >= *until, "route {} dispatched at {} before its hint {}", route, started, until);
                }
            }
            // A fallback is taken after an over-cap hint when a route is left.
            if let Some(last) = attempts.attempts.last() {
                if last.outcome.retry_after_ms().is_some_and(|h| h > cap) {
                    prop_assert_ne!(d.route_id.as_str(), last.route_id.as_str());
                }
            }
            let completed = started + s.duration;
            let outcome = if s.succeeds {
                Outcome::Success
            } else {
                Outcome::Retryable { kind: RetryableKind::RateLimited, retry_after_ms: s.hint, retry_after_source: None }
            };
            if let Some(h) = s.hint.filter(|h| *h > cap && !s.succeeds) {
                blocked.push((d.route_id.as_str().to_owned(), completed + h));
            }
            attempts.attempts.push(Attempt {
                admission: None,
                completed_at_ms: completed,
                cost: 0,
                hedge: None,
                idempotency_key_sha256: d.idempotency_key_sha256.clone(),
                injected_fault: None,
                output_check: None,
                jitter_sample_ms: d.jitter_sample_ms,
                job: None,
                key_refused: None,
                logical_request_sha256: d.logical_request_sha256.clone(),
                model: None,
                ordinal: d.ordinal,
                outcome,
                reconciled: None,
                request_body_sha256: None,
                route_id: d.route_id.clone(),
                route_ordinal: d.route_ordinal,
                route_release_sha256: d.route_release_sha256.clone(),
                started_at_ms: started,
                stream: None,
                usage: None,
            });
        }
    }

    #[test]
    fn stop_ends_the_run_at_an_over_cap_hint_and_clamp_waits_the_cap(
        cap in 0u64..1_500,
        hint in 0u64..3_000,
    ) {
        let failed = |mode: &str| {
            let cp = compile(policy(2, 3, cap, mode)).unwrap();
            let mut attempts = Attempts::default();
            let Decision::Dispatch(d) = plan_next(&cp, &attempts).unwrap() else { unreachable!() };
            attempts.attempts.push(Attempt {
                admission: None,
                completed_at_ms: 100,
                cost: 0,
                hedge: None,
                idempotency_key_sha256: d.idempotency_key_sha256.clone(),
                injected_fault: None,
                output_check: None,
                jitter_sample_ms: None,
                job: None,
                key_refused: None,
                logical_request_sha256: d.logical_request_sha256.clone(),
                model: None,
                ordinal: 1,
                outcome: Outcome::Retryable { kind: RetryableKind::RateLimited, retry_after_ms: Some(hint), retry_after_source: None },
                reconciled: None,
                request_body_sha256: None,
                route_id: d.route_id.clone(),
                route_ordinal: 1,
                route_release_sha256: d.route_release_sha256.clone(),
                started_at_ms: 0,
                stream: None,
                usage: None,
            });
            plan_next(&cp, &attempts).unwrap()
        };
        match failed("stop") {
            Decision::Terminal { terminal } => {
                prop_assert!(hint > cap);
                prop_assert_eq!(terminal, Terminal::StopRetryAfter);
            }
            Decision::Dispatch(d) => {
                prop_assert!(hint <= cap);
                prop_assert!(d.not_before_ms >= 100 + hint);
            }
        }
        match failed("clamp") {
            Decision::Dispatch(d) => {
                prop_assert_eq!(d.route_id.as_str(), "route-0");
                prop_assert_eq!(d.retry_after_floor_ms, hint.min(cap));
            }
            Decision::Terminal { terminal } => prop_assert!(false, "clamp stopped: {}", terminal.as_str()),
        }
    }
}
