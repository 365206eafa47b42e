//! Invariants of hedging, on random hedge sections and random servers: a
//! host drives a `HedgeSession` by the plan alone (the lead at its earliest
//! start, a hedge at its threshold unless a result came first, losers
//! cancelled or answered late), every attempt with a random latency and
//! outcome. The session never reports drift for a host that follows it; the
//! run stays within its attempts, hedges per round, hedge share and cost
//! reservation; one winner at most; and the live receipt is the replay's.
//!
//! Each property runs `RETRYLEDGER_PROPERTY_CASES` cases (256 when unset).
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
use retryledger_core::decode::from_value;
use retryledger_core::hedge::{HedgeSession, HedgeStep, Loss};
use retryledger_core::lab;
use retryledger_core::observe::Facts;
use retryledger_core::{api, evaluate, verify_bundle, Outcome, Terminal, Verdict};
use serde_json::json;

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

#[derive(Debug, Clone)]
struct Section {
    delay_ms: u64,
    max_hedges: u64,
    share: u64,
    zero: bool,
    both_routes: bool,
    max_total_attempts: u64,
    per_route: u64,
}

fn section() -> impl Strategy<Value = Section> {
    (
        1u64..400,
        1u64..4,
        1u64..=100,
        any::<bool>(),
        any::<bool>(),
        0u64..6,
        1u64..5,
    )
        .prop_map(
            |(delay_ms, max_hedges, share, zero, both_routes, extra, per_route)| Section {
                delay_ms,
                max_hedges,
                share,
                zero,
                both_routes,
                max_total_attempts: max_hedges + 1 + extra,
                per_route,
            },
        )
}

/// One attempt as the random server answers it: latency and outcome.
#[derive(Debug, Clone, Copy)]
struct Reply {
    latency_ms: u64,
    kind: u8,
    lag_ms: u64,
}

fn replies() -> impl Strategy<Value = Vec<Reply>> {
    proptest::collection::vec(
        (1u64..900, 0u8..10, 0u64..30).prop_map(|(latency_ms, kind, lag_ms)| Reply {
            latency_ms,
            kind,
            lag_ms,
        }),
        24,
    )
}

fn facts(kind: u8) -> Facts {
    let v = match kind {
        0..=3 => json!({"result": "returned"}),
        4..=7 => json!({"error_types": ["APIStatusError"], "result": "raised", "status": 503}),
        8 => {
            json!({"error_types": ["APIStatusError"], "result": "raised", "status": 429, "headers": [["retry-after-ms", "120"]]})
        }
        _ => json!({"error_types": ["APIStatusError"], "result": "raised", "status": 400}),
    };
    from_value(v).unwrap()
}

fn policy(s: &Section) -> String {
    let mut p = lab::reference_policy();
    p["max_total_attempts"] = json!(s.max_total_attempts);
    p["routes"][0]["max_attempts"] = json!(s.per_route);
    p["routes"][1]["max_attempts"] = json!(s.per_route);
    let routes = if s.both_routes {
        json!(["external-fallback", "private-primary"])
    } else {
        json!(["external-fallback"])
    };
    p["hedge"] = json!({
        "cancelled_cost": if s.zero { "zero" } else { "reserve" },
        "cost_share_percent": s.share,
        "delay_ms": s.delay_ms,
        "effects": "none",
        "max_hedges": s.max_hedges,
        "routes": routes,
    });
    p.to_string()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_host_that_follows_the_plan_stays_within_every_bound(s in section(), script in replies()) {
        let text = policy(&s);
        let cp = Arc::new(api::compile_policy(&text).unwrap());
        let mut h = HedgeSession::start(Arc::clone(&cp)).unwrap();
        // In flight: ordinal -> (started, completes, facts kind).
        let mut flight: Vec<(u64, u64, u8)> = Vec::new();
        let mut next_reply = script.iter().cycle();
        let mut now = 0u64;
        let mut step = h.next();
        let mut guard = 0;
        loop {
            guard += 1;
            prop_assert!(guard < 500, "the run ends");
            step = match step {
                HedgeStep::Terminal { .. } => break,
                HedgeStep::Dispatch(d) => {
                    let r = *next_reply.next().unwrap();
                    let at = d.not_before_ms.max(now) + r.lag_ms;
                    now = at;
                    flight.push((d.ordinal, at + r.latency_ms, r.kind));
                    h.start_attempt(d.ordinal, at).unwrap()
                }
                HedgeStep::Await { hedge, .. } => {
                    let (k, first) = flight.iter().enumerate().min_by_key(|(_, f)| (f.1, f.0)).map(|(k, f)| (k, *f)).unwrap();
                    match hedge {
                        Some(d) if d.not_before_ms < first.1 => {
                            let r = *next_reply.next().unwrap();
                            let at = (d.not_before_ms.max(now) + r.lag_ms).min(first.1);
                            now = at;
                            flight.push((d.ordinal, at + r.latency_ms, r.kind));
                            h.start_attempt(d.ordinal, at).unwrap()
                        }
                        _ => {
                            flight.remove(k);
                            now = now.max(first.1);
                            h.observe(first.0, first.1, None, &facts(first.2)).unwrap().1
                        }
                    }
                }
                HedgeStep::Cancel { ordinals, .. } => {
                    let o = ordinals[0];
                    let k = flight.iter().position(|f| f.0 == o).unwrap();
                    let f = flight.remove(k);
                    // An answer already due at the commit arrives late; the others are cancelled.
                    if f.1 <= now {
                        h.observe(o, now, None, &facts(f.2)).unwrap().1
                    } else {
                        h.cancelled(o, now + 1).unwrap()
                    }
                }
            };
        }
        let bundle = h.seal().unwrap();
        let receipt = &bundle.receipt;
        prop_assert_eq!(receipt, &evaluate(&cp, &bundle.attempts).unwrap());
        let verified = matches!(verify_bundle(&bundle).unwrap(), Verdict::Verified { .. });
        prop_assert!(verified, "the sealed bundle replays");
        let attempts = &bundle.attempts.attempts;
        prop_assert!(attempts.len() as u64 <= s.max_total_attempts);
        let summary = receipt.hedge.as_ref().unwrap();
        // Hedges per round, and the hedge share.
        for lead in attempts.iter().filter(|a| a.hedge.as_ref().and_then(|m| m.hedges_ordinal).is_none()) {
            let n = attempts.iter().filter(|a| a.hedge.as_ref().and_then(|m| m.hedges_ordinal) == Some(lead.ordinal)).count() as u64;
            prop_assert!(n <= s.max_hedges);
        }
        let reserve = |route: &str| cp.policy.routes.iter().find(|r| r.route_id.as_str() == route).unwrap().reserve_cost;
        let hedge_reserved: u64 = attempts
            .iter()
            .filter(|a| a.hedge.as_ref().and_then(|m| m.hedges_ordinal).is_some())
            .map(|a| reserve(a.route_id.as_str()))
            .sum();
        prop_assert!(hedge_reserved <= cp.policy.max_total_cost * s.share / 100);
        prop_assert!(receipt.total_cost <= cp.policy.max_total_cost);
        // Losers: charged as the policy says; at most one winner, a success never marked.
        for l in &summary.losers {
            if l.reason == Loss::Cancelled {
                let a = attempts.iter().find(|a| a.ordinal == l.ordinal).unwrap();
                prop_assert_eq!(l.cost, if s.zero { 0 } else { reserve(a.route_id.as_str()) });
            }
        }
        match summary.winner_ordinal {
            Some(w) => {
                prop_assert_eq!(receipt.terminal, Terminal::Completed);
                let a = attempts.iter().find(|a| a.ordinal == w).unwrap();
                prop_assert_eq!(a.outcome, Outcome::Success);
                prop_assert!(a.hedge.as_ref().is_none_or(|m| m.loss.is_none()));
            }
            None => prop_assert_ne!(receipt.terminal, Terminal::Completed),
        }
    }
}
