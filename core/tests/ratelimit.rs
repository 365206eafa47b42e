//! Properties of rate-limit headers applied to admission buckets
//! (`admission::observe`): after a response says a kind of capacity is
//! exhausted until a reset, no admission on the key starts before the reset;
//! a bucket's time never goes back and its level now never rises; whatever
//! the headers, the snapshot stays valid and nothing panics; and a response
//! without rate-limit headers leaves the snapshot as it was.
//! `RETRYLEDGER_PROPERTY_CASES` cases per property (256 when unset; `make
//! properties` runs 10,000).
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use proptest::prelude::*;
use retryledger_core::admission::{
    admit, observe, AdmissionConfig, AdmissionSnapshot, LimitAnswer,
};
use retryledger_core::ids::Sha256Hex;

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

const T0: u64 = 1_780_000_000_000;

fn release() -> Sha256Hex {
    Sha256Hex::parse(&"cd".repeat(32)).unwrap()
}

/// Limits with or without a request bucket, a token bucket and a cap.
fn config() -> impl Strategy<Value = AdmissionConfig> {
    (
        proptest::option::of(1u64..=8),
        proptest::option::of((1u64..=50, 1u64..=20)),
        proptest::option::of((1u64..=5_000, 1u64..=10_000)),
    )
        .prop_filter("some limit", |(cap, req, tok)| {
            cap.is_some() || req.is_some() || tok.is_some()
        })
        .prop_map(|(cap, req, tok)| AdmissionConfig {
            in_flight_lease_ms: None,
            max_in_flight: cap,
            max_queue_ms: 86_400_000,
            principal: None,
            request_burst: req.map(|(_, b)| b),
            requests_per_second: req.map(|(r, _)| r),
            tenant: None,
            tenant_weights: None,
            token_bound: tok.map(|(_, b)| b),
            tokens_per_second: tok.map(|(r, _)| r),
        })
}

/// A snapshot of `cfg` after some admissions and releases from T0.
fn snapshot(cfg: &AdmissionConfig, takes: &[(u64, u64)]) -> AdmissionSnapshot {
    let mut s = AdmissionSnapshot::fresh(cfg, release(), T0);
    let mut now = T0;
    for (gap, tokens) in takes {
        now += gap;
        let tokens = cfg.token_bound.map_or(0, |b| tokens % (b + 1));
        let (answer, next) = admit(cfg, &s, now, now, tokens);
        if matches!(answer, LimitAnswer::Admitted { .. }) {
            s = retryledger_core::admission::release(cfg, &next, now, tokens, Some(tokens / 2));
        }
    }
    s
}

/// The level a bucket has at `now` (0 when reserved beyond it).
fn level_now(level: u64, at: u64, now: u64, rate: Option<u64>, cap: Option<u64>) -> u64 {
    match (rate, cap) {
        (Some(r), Some(c)) if at <= now => (level + (now - at) * r).min(c * 1000),
        (Some(_), Some(_)) => 0,
        _ => level,
    }
}

fn pairs(h: &[(&str, String)]) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

const NAMES: &[&str] = &[
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "RateLimit",
    "RateLimit-Policy",
    "content-type",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// A `remaining` of 0 with a reset holds every admission on the key
    /// (whatever its tokens, whenever it asks) until the reset.
    #[test]
    fn nothing_starts_before_the_reset(
        cfg in config(),
        takes in proptest::collection::vec((0u64..500, 0u64..10_000), 0..6),
        gap in 0u64..2_000,
        reset in 1u64..600_000,
        tokens_kind in any::<bool>(),
        asks in proptest::collection::vec((0u64..700_000, 0u64..10_000), 1..6),
    ) {
        let s = snapshot(&cfg, &takes);
        let now = s.updated_at_epoch_ms + gap;
        let what = if tokens_kind { "tokens" } else { "requests" };
        let h = pairs(&[
            (if tokens_kind { "x-ratelimit-remaining-tokens" } else { "x-ratelimit-remaining-requests" }, "0".into()),
            (if tokens_kind { "x-ratelimit-reset-tokens" } else { "x-ratelimit-reset-requests" }, format!("{reset}ms")),
        ]);
        let (seen, notes) = observe(&cfg, &s, &h, now);
        prop_assert!(notes.is_empty(), "{what}: {notes:?}");
        seen.check(&cfg, &release(), "").map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        let mut current = seen;
        for (later, t) in asks {
            let at = now + later;
            let t = cfg.token_bound.map_or(0, |b| t % (b + 1));
            let (answer, next) = admit(&cfg, &current, at, at, t);
            if let LimitAnswer::Admitted { start_epoch_ms } = answer {
                prop_assert!(start_epoch_ms >= now + reset, "started {start_epoch_ms} before {}", now + reset);
                current = next;
            }
        }
    }

    /// Whatever the headers: never a panic, a valid snapshot, bucket times
    /// that never go back and levels now that never rise; without any
    /// rate-limit header the same snapshot.
    #[test]
    fn headers_only_ever_hold_back(
        cfg in config(),
        takes in proptest::collection::vec((0u64..500, 0u64..10_000), 0..6),
        gap in 0u64..2_000,
        headers in proptest::collection::vec(
            (0..NAMES.len(), prop_oneof![
                "[0-9]{1,6}",
                "[0-9]{1,3}(ms|s|m|h)",
                "[0-9]{1,2}m[0-9]{1,2}(\\.[0-9]{1,3})?s",
                "2026-05-2[0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,3})?Z",
                "\"[a-z]{1,6}\";r=[0-9]{1,3};t=[0-9]{1,4}",
                ".{0,24}",
            ]),
            0..6,
        ),
    ) {
        let s = snapshot(&cfg, &takes);
        let now = s.updated_at_epoch_ms + gap;
        let h: Vec<(String, String)> = headers.iter().map(|(i, v)| (NAMES[*i].to_owned(), v.clone())).collect();
        let (seen, _) = observe(&cfg, &s, &h, now);
        seen.check(&cfg, &release(), "").map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert!(seen.requests_at_epoch_ms >= s.requests_at_epoch_ms);
        prop_assert!(seen.tokens_at_epoch_ms >= s.tokens_at_epoch_ms);
        let req = (cfg.requests_per_second, cfg.request_burst);
        let tok = (cfg.tokens_per_second, cfg.token_bound);
        prop_assert!(
            level_now(seen.request_level_milli, seen.requests_at_epoch_ms, now, req.0, req.1)
                <= level_now(s.request_level_milli, s.requests_at_epoch_ms, now, req.0, req.1)
        );
        prop_assert!(
            level_now(seen.token_level_milli, seen.tokens_at_epoch_ms, now, tok.0, tok.1)
                <= level_now(s.token_level_milli, s.tokens_at_epoch_ms, now, tok.0, tok.1)
        );
        prop_assert_eq!((seen.in_flight, &seen.route_release_sha256), (s.in_flight, &s.route_release_sha256));
        if h.iter().all(|(k, _)| k == "content-type") {
            prop_assert_eq!(seen, s);
        }
    }
}
