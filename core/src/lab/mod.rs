//! The replay lab: the reference run and its mutation cases, as data.
//!
//! The reference run: the private primary is rate limited (completing at
//! 1,100 ms, Retry-After 250 ms), so attempt 2 may not start before 1,350 ms;
//! it fails unavailable at 1,450 ms and exhausts the primary's two attempts;
//! the external fallback may not start before 1,650 ms (base 100 ms) and
//! succeeds. Each case changes one thing and names the code it must produce;
//! [`run`] observes every case through [`verify_bundle`] and builds the report.
//! No I/O here: the `retry_fallback_replay` example prints and writes it.

use serde_json::{json, Value};

use std::sync::Arc;

use crate::attempt::Attempts;
use crate::canonical::{digest_of, digest_value, sha256_hex, to_jcs};
use crate::decode::from_value;
use crate::error::Result;
use crate::evaluate::Decision;
use crate::outcome::{Outcome, RetryableKind};
use crate::policy::{compile, Policy};
use crate::receipt::{seal, verify_bundle, Bundle, Verdict};
use crate::session::Session;

mod cases;
mod drivers;

pub use cases::{cases, Case};
pub use drivers::{
    admission_session, fleet_bundle, fleet_session, job_bundle, job_session, priced_bundle,
    priced_session, stream_bundle, stream_session,
};

/// A label's SHA-256 as a digest, for the lab's fixed identities.
fn id(label: &str) -> String {
    sha256_hex(label.as_bytes())
}

/// Requirements of the reference request: a screenshot-grounded JSON task.
pub fn reference_requirements() -> Value {
    json!({
        "input_modalities": ["text", "image"],
        "max_context_tokens": 32_000,
        "max_output_tokens": 2_048,
        "max_response_bytes": 1_048_576,
        "output_modalities": ["text"],
        "refusal": "typed",
        "regions": ["eu-central-1", "eu-west-1"],
        "release_pin": "exact",
        "retention_days": 30,
        "sampling_controls": ["seed", "temperature"],
        "streaming_events": ["terminal", "usage"],
        "structured_output": "json_schema",
        "tool_calls": "single"
    })
}

fn route(
    route_id: &str,
    priority: u64,
    boundary: &str,
    region: &str,
    retention: u64,
    reserve: u64,
) -> Value {
    let mut caps = reference_requirements();
    if let Some(obj) = caps.as_object_mut() {
        obj.insert("regions".into(), json!([region]));
        obj.insert("retention_days".into(), json!(retention));
        obj.insert("max_context_tokens".into(), json!(128_000));
    }
    json!({
        "behavior_class_sha256": id("behavior: incident-severity summary v3"),
        "capabilities": caps,
        "data_boundary": boundary,
        "max_attempts": 2,
        "priority": priority,
        "reserve_cost": reserve,
        "route_id": route_id,
        "route_release_sha256": id(&format!("release: {route_id}")),
        "supports_idempotency": true
    })
}

/// The reference policy as JSON.
pub fn reference_policy() -> Value {
    json!({
        "schema": "retryledger.policy.v1",
        "retry_owner": "harness",
        "logical_request_sha256": id("request: summarize incident INC-4471 from screenshot"),
        "idempotency_key_sha256": id("idempotency-key: tenant-7/op-summarize/INC-4471"),
        "behavior_class_sha256": id("behavior: incident-severity summary v3"),
        "requirements": reference_requirements(),
        "max_data_boundary": "external_provider",
        "max_total_attempts": 4,
        "max_total_cost": 10_000,
        "cost_unit": "micro_usd",
        "deadline_ms": 5_000,
        "backoff": {"base_ms": 100, "max_ms": 1_000, "retry_after_cap_ms": 2_000},
        "jitter": {"mode": "none"},
        "routes": [
            route("private-primary", 0, "private_service", "eu-west-1", 0, 1_500),
            route("external-fallback", 1, "external_provider", "eu-central-1", 30, 3_000)
        ]
    })
}

/// One scripted observation: the outcome, how long the attempt takes, what it costs,
/// and how long after its earliest start it is dispatched.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Observed outcome.
    pub outcome: Outcome,
    /// Start to completion, ms.
    pub duration_ms: u64,
    /// Actual cost.
    pub cost: u64,
    /// Start minus earliest start, ms.
    pub start_lag_ms: u64,
}

impl Step {
    /// A step dispatched at its earliest start.
    pub fn new(outcome: Outcome, duration_ms: u64, cost: u64) -> Self {
        Self {
            outcome,
            duration_ms,
            cost,
            start_lag_ms: 0,
        }
    }
}

/// Run a script against a policy the way a host would: plan, dispatch at the
/// earliest start, record. Stops at the terminal or when the script ends.
pub fn simulate(policy: &Policy, steps: &[Step]) -> Result<Attempts> {
    let mut session = Session::start(Arc::new(compile(policy.clone())?));
    for step in steps {
        let Decision::Dispatch(d) = session.next() else {
            break;
        };
        let started = d.not_before_ms.saturating_add(step.start_lag_ms);
        let completed = started.saturating_add(step.duration_ms);
        session.record(started, completed, step.cost, step.outcome)?;
    }
    Ok(session.attempts().clone())
}

fn rate_limited(ms: u64) -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: Some(ms),
        retry_after_source: None,
    }
}

fn unavailable() -> Outcome {
    Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    }
}

/// The reference script: rate limited (Retry-After 250 ms), unavailable, success.
pub fn reference_steps() -> Vec<Step> {
    vec![
        Step::new(rate_limited(250), 1_100, 0),
        Step::new(unavailable(), 100, 0),
        Step::new(Outcome::Success, 750, 1_800),
    ]
}

fn bundle_value(policy: &Value, steps: &[Step]) -> Result<Value> {
    let p: Policy = from_value(policy.clone())?;
    let attempts = simulate(&p, steps)?;
    to_json(&seal(&p, &attempts)?)
}

fn to_json(bundle: &Bundle) -> Result<Value> {
    Ok(crate::canonical::to_value(bundle))
}

/// The reference bundle: the reference policy and script, sealed.
pub fn reference_bundle() -> Result<Bundle> {
    from_value(bundle_value(&reference_policy(), &reference_steps())?)
}

/// What verifying a bundle shows: the terminal when verified, else the code.
pub fn observe(bundle: &Value) -> String {
    let decoded: Result<Bundle> = from_value(bundle.clone());
    match decoded.and_then(|b| verify_bundle(&b)) {
        Ok(Verdict::Verified { terminal, .. }) => terminal.as_str().to_owned(),
        Ok(Verdict::Drift { code, .. }) => code,
        Err(e) => e.code.as_str().to_owned(),
    }
}

/// The lab report: the baseline, every case with its expected and observed
/// result, and the digests.
pub fn run() -> Result<Value> {
    let baseline = reference_bundle()?;
    let compiled = compile(baseline.policy.clone())?;
    let cases = cases()?;
    let total = cases.len();
    let mut passed = 0usize;
    let mut rows = Vec::with_capacity(total);
    for c in cases {
        let observed = observe(&c.bundle);
        if observed == c.expected {
            passed = passed.saturating_add(1);
        }
        rows.push(json!({
            "about": c.about,
            "bundle": c.bundle,
            "expected": c.expected,
            "name": c.name,
            "observed": observed,
        }));
    }
    Ok(json!({
        "schema": "retryledger.lab_report.v1",
        "baseline": crate::canonical::to_value(&baseline),
        "baseline_terminal": baseline.receipt.terminal.as_str(),
        "fallback_used": baseline.receipt.fallback_used,
        "policy_sha256": compiled.policy_sha256,
        "attempts_sha256": digest_of(&baseline.attempts),
        "receipt_sha256": digest_of(&baseline.receipt),
        "cases": rows,
        "passed": passed,
        "total": total,
    }))
}

/// The report's canonical bytes and their digest.
pub fn report_bytes(report: &Value) -> (String, String) {
    let text = to_jcs(report);
    let digest = digest_value(report);
    (text, digest)
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len().saturating_sub(i)) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The summary table the lab prints and the README pins.
pub fn summary(report: &Value) -> String {
    let get = |k: &str| {
        report
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let num = |k: &str| report.get(k).and_then(Value::as_u64).unwrap_or(0);
    let baseline = match (
        get("baseline_terminal").as_str(),
        report.get("fallback_used").and_then(Value::as_bool),
    ) {
        ("completed", Some(true)) => "completed on compatible fallback".to_owned(),
        ("completed", _) => "completed on primary".to_owned(),
        (other, _) => other.to_owned(),
    };
    let (bytes, digest) = report_bytes(report);
    let rows = [
        ("baseline", baseline),
        (
            "mutation cases",
            format!("{} / {}", num("passed"), num("total")),
        ),
        ("policy SHA-256", get("policy_sha256")),
        ("attempts SHA-256", get("attempts_sha256")),
        ("receipt SHA-256", get("receipt_sha256")),
        ("report bytes", thousands(bytes.len())),
        ("report SHA-256", digest),
    ];
    rows.iter().map(|(k, v)| format!("{k:<35}{v}\n")).collect()
}

/// One line per case: name, expected, observed, and whether they agree.
pub fn case_table(report: &Value) -> String {
    let mut out = format!(
        "{:<36}{:<28}{:<28}{}\n",
        "case", "expected", "observed", "ok"
    );
    for c in report
        .get("cases")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| {
            c.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let ok = if s("expected") == s("observed") {
            "yes"
        } else {
            "NO"
        };
        out.push_str(&format!(
            "{:<36}{:<28}{:<28}{}\n",
            s("name"),
            s("expected"),
            s("observed"),
            ok
        ));
    }
    out
}
