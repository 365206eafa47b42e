//! The reference run's worked numbers, the lab's pinned output, and digests
//! recomputed with an independent JCS implementation.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use retryledger_core::canonical::{canonical_json, digest_of, to_jcs};
use retryledger_core::decode::from_value;
use retryledger_core::lab;
use retryledger_core::{compile, evaluate, plan_next, Attempts, Decision, Terminal};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn independent_digest(value: &Value) -> String {
    let text = serde_jcs::to_string(value).unwrap();
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn reference_schedule_matches_the_worked_numbers() {
    let bundle = lab::reference_bundle().unwrap();
    let policy = compile(bundle.policy.clone()).unwrap();
    let starts: Vec<u64> = bundle
        .receipt
        .schedule
        .iter()
        .map(|s| s.not_before_ms)
        .collect();
    assert_eq!(starts, [0, 1_350, 1_650]);
    let completions: Vec<u64> = bundle
        .attempts
        .attempts
        .iter()
        .map(|a| a.completed_at_ms)
        .collect();
    assert_eq!(completions, [1_100, 1_450, 2_400]);
    assert_eq!(bundle.receipt.terminal, Terminal::Completed);
    assert!(bundle.receipt.fallback_used);
    assert!(!bundle.receipt.degraded);

    // Step by step: plan_next over each prefix gives the same earliest starts.
    let mut prefix = Attempts {
        attempts: vec![],
        ..bundle.attempts.clone()
    };
    for (i, attempt) in bundle.attempts.attempts.iter().enumerate() {
        match plan_next(&policy, &prefix).unwrap() {
            Decision::Dispatch(d) => {
                assert_eq!(d.not_before_ms, starts[i]);
                assert_eq!(d.route_id, attempt.route_id);
            }
            Decision::Terminal { terminal } => panic!("unexpected terminal {terminal:?}"),
        }
        prefix.attempts.push(attempt.clone());
    }
    assert_eq!(
        plan_next(&policy, &prefix).unwrap(),
        Decision::Terminal {
            terminal: Terminal::Completed
        }
    );
    assert_eq!(evaluate(&policy, &prefix).unwrap(), bundle.receipt);
}

#[test]
fn every_lab_case_produces_its_expected_code() {
    let report = lab::run().unwrap();
    let cases = report["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    for c in cases {
        assert_eq!(c["expected"], c["observed"], "case {}", c["name"]);
    }
    assert_eq!(report["passed"], report["total"]);
}

#[test]
fn digests_recompute_with_an_independent_jcs() {
    let report = lab::run().unwrap();
    // Round-trip through text so nothing typed is reused.
    let reparsed: Value = serde_json::from_str(&to_jcs(&report)).unwrap();
    let baseline = &reparsed["baseline"];
    assert_eq!(
        independent_digest(&baseline["policy"]),
        reparsed["policy_sha256"].as_str().unwrap()
    );
    assert_eq!(
        independent_digest(&baseline["attempts"]),
        reparsed["attempts_sha256"].as_str().unwrap()
    );
    assert_eq!(
        independent_digest(&baseline["receipt"]),
        reparsed["receipt_sha256"].as_str().unwrap()
    );
    assert_eq!(
        baseline["receipt"]["policy_sha256"],
        reparsed["policy_sha256"]
    );
    assert_eq!(
        baseline["receipt"]["attempts_sha256"],
        reparsed["attempts_sha256"]
    );
    let (_, report_digest) = lab::report_bytes(&report);
    assert_eq!(independent_digest(&reparsed), report_digest);
}

#[test]
fn typed_encoding_is_canonical_for_every_document() {
    // Documents encode their fields in sorted order so the output is JCS; check it.
    let report = lab::run().unwrap();
    for c in report["cases"].as_array().unwrap() {
        let bundle: Result<retryledger_core::Bundle, _> = from_value(c["bundle"].clone());
        let Ok(bundle) = bundle else { continue };
        let typed = canonical_json(&bundle);
        let jcs = to_jcs(&serde_json::from_str(&typed).unwrap());
        assert_eq!(typed, jcs, "case {}", c["name"]);
        let direct = digest_of(&bundle);
        assert_eq!(
            direct,
            independent_digest(&serde_json::from_str(&typed).unwrap())
        );
    }
}

#[test]
fn readme_pins_the_lab_output() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("<!-- lab:begin -->")
        .expect("README has a lab block");
    let end = readme
        .find("<!-- lab:end -->")
        .expect("README closes the lab block");
    let pinned = &readme[start..end];
    let summary = lab::summary(&lab::run().unwrap());
    for line in summary.lines() {
        assert!(
            pinned.contains(line),
            "README does not pin `{line}`; run `make demo` and update it"
        );
    }
}
