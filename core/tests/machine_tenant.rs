//! The call's tenant under tenant shares, given to the run machine in its
//! options: a machine-driven run (journaled, hedged, a job) is admitted on
//! its tenant's share, resumed under it, and refused without one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "tests fail loudly"
)]

use std::sync::Arc;

use retryledger_core::machine::script::{play_resume, play_start, Script};
use retryledger_core::machine::{JournalOptions, Options};
use retryledger_core::{compile, journal, lab, CompiledPolicy};
use serde_json::{json, Value};

const ORIGIN: u64 = 1_780_000_000_000;

fn policy(shares: bool) -> Arc<CompiledPolicy> {
    let mut p = lab::reference_policy();
    let mut admission = json!({"requests_per_second": 20, "request_burst": 2, "max_queue_ms": 500});
    if shares {
        admission["tenant_weights"] =
            json!([{"tenant": "acme", "weight": 1}, {"tenant": "globex", "weight": 2}]);
    }
    p["fleet"] = json!({"admission": admission, "on_store_unavailable": "fail_closed"});
    Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap())
}

fn options(tenant: Option<&str>, journaled: bool) -> Options {
    Options {
        origin_epoch_ms: ORIGIN,
        journal: journaled.then(|| JournalOptions {
            run_id: retryledger_core::ids::Identifier::parse("run-t").unwrap(),
            lease_generation: 1,
        }),
        tenant: tenant.map(|t| retryledger_core::ids::Identifier::parse(t).unwrap()),
        ..Options::default()
    }
}

/// One attempt that succeeds at once.
fn one_success() -> Script {
    Script {
        attempts: vec![json!({"after_ms": 40, "cost": 1, "facts": {"result": "returned"}})],
        ..Script::default()
    }
}

/// The tenants the store's admission register holds a share record for.
fn tenants_in(store: &std::collections::BTreeMap<String, (Value, u64)>) -> Vec<String> {
    let (key, (doc, _)) = store
        .iter()
        .find(|(k, _)| k.starts_with("admission/"))
        .expect("an admission register");
    assert!(key.starts_with("admission/"));
    let shares = doc["tenants"].as_array().cloned().unwrap_or_default();
    shares
        .iter()
        .filter_map(|s| s["tenant"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_run_under_tenant_shares_is_admitted_on_its_tenant_share() {
    let cp = policy(true);
    let played = play_start(&cp, options(Some("globex"), false), &one_success()).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    assert_eq!(tenants_in(&played.store), vec!["globex".to_owned()]);
}

#[test]
fn a_run_under_tenant_shares_without_its_tenant_is_refused_at_tenant() {
    let cp = policy(true);
    let played = play_start(&cp, options(None, false), &one_success()).unwrap();
    let error = played.error.expect("refused");
    assert_eq!(error.code.as_str(), "invalid_value");
    assert_eq!(error.path.as_deref(), Some("/tenant"));
    let unlisted = play_start(&cp, options(Some("umbrella"), false), &one_success()).unwrap();
    let error = unlisted.error.expect("refused");
    assert_eq!(error.path.as_deref(), Some("/tenant"));
    assert!(error.message.contains("umbrella"), "{}", error.message);
}

#[test]
fn a_tenant_given_to_a_policy_without_shares_changes_nothing() {
    let cp = policy(false);
    let with = play_start(&cp, options(Some("acme"), false), &one_success()).unwrap();
    let without = play_start(&cp, options(None, false), &one_success()).unwrap();
    assert!(with.error.is_none() && without.error.is_none());
    assert_eq!(with.store, without.store);
}

#[test]
fn a_journaled_run_under_tenant_shares_resumes_on_its_tenant_share() {
    let cp = policy(true);
    let full = play_start(&cp, options(Some("acme"), true), &one_success()).unwrap();
    assert!(full.error.is_none(), "{:?}", full.error);
    journal::verify(&cp, &full.journal).unwrap();
    // Crash after `created` + `decided`, before the attempt: resumed under the same tenant.
    let prefix: Vec<_> = full.journal.iter().take(2).cloned().collect();
    let mut resume = options(Some("acme"), true);
    resume.journal.as_mut().unwrap().lease_generation = 2;
    let resumed = play_resume(&cp, resume, prefix, &one_success()).unwrap();
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    journal::verify(&cp, &resumed.journal).unwrap();
    assert_eq!(tenants_in(&resumed.store), vec!["acme".to_owned()]);
}

#[test]
fn the_options_document_carries_the_tenant() {
    let doc = json!({"origin_epoch_ms": ORIGIN, "tenant": "acme"});
    let options = retryledger_core::machine::script::options_of(&doc).unwrap();
    assert_eq!(options.tenant.as_ref().map(|t| t.as_str()), Some("acme"));
    let bad = retryledger_core::machine::script::options_of(
        &json!({"origin_epoch_ms": ORIGIN, "tenant": ""}),
    );
    assert_eq!(bad.unwrap_err().path.as_deref(), Some("/tenant"));
}
