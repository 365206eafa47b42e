//! Provider tables through a session: the route's family decides how its
//! failures are read; a hostile body or hint never panics and never asks for
//! more than the cap; docs/PROVIDERS.md prints the table the core holds.
//! `RETRYLEDGER_PROPERTY_CASES` cases (256 unset).
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly"
)]

use std::sync::Arc;

use proptest::prelude::*;
use retryledger_core::canonical::digest_of;
use retryledger_core::decode::from_value;
use retryledger_core::evaluate::{Decision, Terminal};
use retryledger_core::http::{classify_http, HttpObservation};
use retryledger_core::observe::{judge, Facts};
use retryledger_core::outcome::{HintSource, NonRetryableKind, Outcome, RetryableKind};
use retryledger_core::provider::{table_markdown, ProviderFamily, MAX_HINT_MS};
use retryledger_core::{compile, lab, Policy, Session};
use serde_json::json;

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The reference policy with the primary route naming `family`.
fn policy(family: Option<&str>) -> Policy {
    let mut p = lab::reference_policy();
    if let Some(f) = family {
        p["routes"][0]["provider_family"] = json!(f);
    }
    from_value(p).unwrap()
}

fn raised(status: u64, body: &str) -> Facts {
    let mut f = Facts::raised();
    f.status = Some(status);
    f.error_body = Some(body.to_owned());
    f
}

const QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;

#[test]
fn a_family_is_omitted_when_unused_so_v1_digests_stay() {
    let plain = policy(None);
    assert_eq!(
        digest_of(&plain),
        digest_of(&lab::reference_bundle().unwrap().policy)
    );
    assert_ne!(digest_of(&policy(Some("openai"))), digest_of(&plain));
}

#[test]
fn the_session_reads_failures_by_the_route_family() {
    let p = Arc::new(compile(policy(Some("openai"))).unwrap());
    let mut s = Session::start(p);
    let Decision::Dispatch(d) = s.next().clone() else {
        panic!("a dispatch")
    };
    let j = s
        .observe(
            d.not_before_ms,
            d.not_before_ms + 10,
            None,
            &raised(429, QUOTA),
        )
        .unwrap();
    assert_eq!(
        j.outcome,
        Outcome::NonRetryable {
            kind: NonRetryableKind::QuotaExhausted
        }
    );
    let Decision::Terminal { terminal } = s.next() else {
        panic!("the run stops after one attempt")
    };
    assert_eq!(*terminal, Terminal::StopNonRetryable);
    assert_eq!(s.attempts().attempts.len(), 1);
}

#[test]
fn without_a_family_the_same_body_is_rate_limited() {
    let p = Arc::new(compile(policy(None)).unwrap());
    let mut s = Session::start(p);
    let Decision::Dispatch(d) = s.next().clone() else {
        panic!("a dispatch")
    };
    let j = s
        .observe(
            d.not_before_ms,
            d.not_before_ms + 10,
            None,
            &raised(429, QUOTA),
        )
        .unwrap();
    assert_eq!(
        j.outcome,
        Outcome::Retryable {
            kind: RetryableKind::RateLimited,
            retry_after_ms: None,
            retry_after_source: None
        }
    );
    assert!(j.notes.is_none());
    assert!(matches!(s.next(), Decision::Dispatch(_)));
}

#[test]
fn a_google_retry_delay_sets_the_next_start() {
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
    let p = Arc::new(compile(policy(Some("google"))).unwrap());
    let mut s = Session::start(p);
    let Decision::Dispatch(d) = s.next().clone() else {
        panic!("a dispatch")
    };
    let done = d.not_before_ms + 100;
    let j = s
        .observe(d.not_before_ms, done, None, &raised(429, body))
        .unwrap();
    assert_eq!(j.outcome.retry_after_ms(), Some(1_500));
    let Decision::Dispatch(next) = s.next() else {
        panic!("a retry")
    };
    assert_eq!(next.not_before_ms, done + 1_500);
    let attempts = retryledger_core::canonical::canonical_json(s.attempts());
    assert!(attempts.contains(r#""retry_after_source":"retry_info""#));
}

#[test]
fn the_docs_print_the_table() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROVIDERS.md"))
            .unwrap();
    assert!(
        page.contains(&table_markdown()),
        "docs/PROVIDERS.md must print provider::table_markdown() as it stands:\n{}",
        table_markdown()
    );
    for source in HintSource::NAMES {
        assert!(page.contains(&format!("`{source}`")), "{source}");
    }
    for note in retryledger_core::provider::Note::NAMES {
        assert!(page.contains(&format!("`{note}`")), "{note}");
    }
}

fn family() -> impl Strategy<Value = ProviderFamily> {
    prop::sample::select(ProviderFamily::ALL.to_vec())
}

fn header() -> impl Strategy<Value = (String, String)> {
    let names = prop::sample::select(retryledger_core::observe::READ_HEADERS.to_vec());
    let values = prop_oneof![
        "[0-9]{1,25}",
        "-?[0-9]{0,6}(\\.[0-9]{0,12})?(ms|s|m|h)?",
        "[0-9]{1,3}m[0-9]{1,2}(\\.[0-9]{1,3})?s",
        "(19|20|99)[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{1,12})?(Z|[+-][0-2][0-9]:[0-5][0-9])",
        "\"[a-z]{1,5}\";r=[0-9]{1,3}(;t=[0-9]{1,22})?(;w=[0-9]{1,22})?",
        ".{0,40}",
    ];
    (names, values).prop_map(|(n, v)| (n.to_owned(), v))
}

fn body() -> impl Strategy<Value = String> {
    let delay = "-?[0-9]{0,22}(\\.[0-9]{0,12})?s?";
    let quota = "[A-Za-z-]{0,20}(PerDay|PerMinute)?[A-Za-z-]{0,10}";
    prop_oneof![
        (delay, quota).prop_map(|(d, q)| json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": q}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": d},
        ]}}).to_string()),
        "[a-z_]{0,20}".prop_map(|c| json!({"error": {"code": c, "type": c}}).to_string()),
        ".{0,200}",
        (1usize..80).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Any body and any rate-limit headers: an outcome (never an error or a
    /// panic), and a hint within the cap and within the bound on read hints.
    #[test]
    fn hostile_bodies_and_hints_are_bounded(
        family in family(),
        status in prop::sample::select(vec![400u64, 402, 403, 404, 408, 413, 429, 500, 503, 504, 529]),
        headers in prop::collection::vec(header(), 0..8),
        body in prop::option::of(body()),
        cap in 0u64..200_000,
    ) {
        let obs = HttpObservation {
            error_body: body.clone(),
            headers: headers.clone(),
            now_unix_ms: 1_764_777_946_000,
            provider_family: Some(family),
            response_bytes_received: false,
            retry_after_cap_ms: cap,
            status: Some(status),
            transport_error: None,
        };
        let o = classify_http(&obs).unwrap();
        if let Some(ms) = o.retry_after_ms() {
            prop_assert!(ms <= cap);
        }
        let mut facts = Facts::raised();
        facts.status = Some(status);
        facts.headers = headers;
        facts.error_body = body;
        facts.provider_family = Some(family);
        facts.now_unix_ms = 1_764_777_946_000;
        let j = judge(&facts).unwrap();
        if let Outcome::Retryable { retry_after_ms: Some(ms), retry_after_source: Some(src), .. } = j.outcome {
            if matches!(src, HintSource::RetryInfo | HintSource::RateLimitReset) {
                prop_assert!(ms <= MAX_HINT_MS);
            }
        }
    }
}
