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
use crate::ids::Sha256Hex;
use crate::outcome::{IndeterminateKind, NonRetryableKind, Outcome, RetryableKind};
use crate::policy::{compile, Policy};
use crate::receipt::{seal, verify_bundle, Bundle, Verdict};
use crate::session::Session;

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

/// Replace the value at a JSON Pointer, or add it to its parent object.
fn set(v: &mut Value, pointer: &str, new: Value) {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = new;
    } else if let Some((parent, key)) = pointer.rsplit_once('/') {
        if let Some(obj) = v.pointer_mut(parent).and_then(Value::as_object_mut) {
            obj.insert(key.to_owned(), new);
        }
    }
}

fn edited(base: &Value, edits: &[(&str, Value)]) -> Value {
    let mut v = base.clone();
    for (pointer, new) in edits {
        set(&mut v, pointer, new.clone());
    }
    v
}

/// One lab case: what it changes, the code it must produce, and its bundle.
#[derive(Debug, Clone)]
pub struct Case {
    /// Short name.
    pub name: String,
    /// What the case does, in a line.
    pub about: String,
    /// The terminal or code it must produce.
    pub expected: String,
    /// The bundle to verify.
    pub bundle: Value,
}

fn case(name: &str, about: &str, expected: &str, bundle: Value) -> Case {
    Case {
        name: name.into(),
        about: about.into(),
        expected: expected.into(),
        bundle,
    }
}

/// Every lab case, the chapter's twelve first.
pub fn cases() -> Result<Vec<Case>> {
    let policy = reference_policy();
    let steps = reference_steps();
    let base = bundle_value(&policy, &steps)?;
    let with_policy =
        |edits: &[(&str, Value)], steps: &[Step]| bundle_value(&edited(&policy, edits), steps);
    let fallback_attempt = base
        .pointer("/attempts/attempts/2")
        .cloned()
        .unwrap_or(Value::Null);
    let att = |i: usize, field: &str| format!("/attempts/attempts/{i}/{field}");

    let mut out = vec![
        case(
            "valid_success",
            "the reference run",
            "completed",
            base.clone(),
        ),
        case(
            "opaque_retry_ownership",
            "the SDK owns retries",
            "retry_owner_not_harness",
            edited(&base, &[("/policy/retry_owner", json!("transport_sdk"))]),
        ),
        case(
            "contract_drift",
            "the fallback offers JSON text but no strict schema mode",
            "capability_missing",
            edited(
                &base,
                &[(
                    "/policy/routes/1/capabilities/structured_output",
                    json!("json_object"),
                )],
            ),
        ),
        case(
            "boundary_drift",
            "the policy allows private services only",
            "data_boundary_exceeded",
            edited(
                &base,
                &[("/policy/max_data_boundary", json!("private_service"))],
            ),
        ),
        case(
            "logical_request_drift",
            "attempt 2 carries another request",
            "logical_request_drift",
            edited(
                &base,
                &[(
                    &att(1, "logical_request_sha256"),
                    json!(id("request: another prompt")),
                )],
            ),
        ),
        case(
            "premature_fallback",
            "attempt 2 goes to the fallback before the primary is exhausted",
            "route_drift",
            edited(
                &base,
                &[
                    ("/attempts/attempts/1", fallback_attempt.clone()),
                    (&att(1, "ordinal"), json!(2)),
                ],
            ),
        ),
        case(
            "non_retryable_failure",
            "the primary rejects the request: no fallback",
            "stop_non_retryable",
            bundle_value(
                &policy,
                &[Step::new(
                    Outcome::NonRetryable {
                        kind: NonRetryableKind::Rejected,
                    },
                    300,
                    0,
                )],
            )?,
        ),
        case(
            "indeterminate_outcome",
            "attempt 2's acceptance is unknown: reconcile, never retry",
            "stop_indeterminate",
            bundle_value(
                &policy,
                &[
                    Step::new(rate_limited(250), 1_100, 0),
                    Step::new(
                        Outcome::Indeterminate {
                            kind: IndeterminateKind::UnknownProviderAcceptance,
                        },
                        100,
                        0,
                    ),
                ],
            )?,
        ),
        case(
            "total_attempt_budget",
            "two attempts in total",
            "stop_total_attempts",
            with_policy(&[("/max_total_attempts", json!(2))], &steps)?,
        ),
        case(
            "cost_budget",
            "the fallback's reservation does not fit",
            "stop_cost_budget",
            with_policy(&[("/max_total_cost", json!(2_500))], &steps)?,
        ),
        case(
            "deadline",
            "the fallback could not start before the deadline",
            "stop_deadline",
            with_policy(&[("/deadline_ms", json!(1_600))], &steps)?,
        ),
        case(
            "route_exhaustion",
            "the fallback fails too, with one attempt allowed",
            "stop_route_exhausted",
            with_policy(
                &[("/routes/1/max_attempts", json!(1))],
                &[
                    Step::new(rate_limited(250), 1_100, 0),
                    Step::new(unavailable(), 100, 0),
                    Step::new(unavailable(), 400, 0),
                ],
            )?,
        ),
    ];

    out.extend([
        case(
            "late_success",
            "success at 2,400 ms loses to a 2,300 ms deadline",
            "stop_deadline",
            with_policy(&[("/deadline_ms", json!(2_300))], &steps)?,
        ),
        case(
            "early_start",
            "attempt 2 starts at 1,300 ms, before its Retry-After",
            "early_start",
            edited(&base, &[(&att(1, "started_at_ms"), json!(1_300))]),
        ),
        case(
            "completed_before_started",
            "attempt 3 completes before it starts",
            "completed_before_started",
            edited(&base, &[(&att(2, "completed_at_ms"), json!(1_600))]),
        ),
        case(
            "ordinal_drift",
            "attempt 2 claims ordinal 5",
            "ordinal_drift",
            edited(&base, &[(&att(1, "ordinal"), json!(5))]),
        ),
        case(
            "route_ordinal_drift",
            "attempt 2 claims route ordinal 1",
            "route_ordinal_drift",
            edited(&base, &[(&att(1, "route_ordinal"), json!(1))]),
        ),
        case(
            "idempotency_key_change",
            "the fallback attempt carries a new idempotency key",
            "idempotency_key_drift",
            edited(
                &base,
                &[(
                    &att(2, "idempotency_key_sha256"),
                    json!(id("idempotency-key: fresh")),
                )],
            ),
        ),
        case(
            "release_change",
            "the fallback attempt went to another release",
            "release_drift",
            edited(
                &base,
                &[(
                    &att(2, "route_release_sha256"),
                    json!(id("release: external-fallback-next")),
                )],
            ),
        ),
        case(
            "attempt_after_terminal",
            "a fourth attempt after success",
            "attempt_after_terminal",
            {
                let mut v = base.clone();
                if let Some(list) = v
                    .pointer_mut("/attempts/attempts")
                    .and_then(Value::as_array_mut)
                {
                    let mut extra = fallback_attempt.clone();
                    set(&mut extra, "/ordinal", json!(4));
                    list.push(extra);
                }
                v
            },
        ),
        case(
            "degraded_fallback_not_allowed",
            "the fallback carries a weaker behavior class the policy does not allow",
            "behavior_class_mismatch",
            edited(
                &base,
                &[(
                    "/policy/routes/1/behavior_class_sha256",
                    json!(id("behavior: generic summary v1")),
                )],
            ),
        ),
        case(
            "degraded_fallback_allowed",
            "the same weaker class, explicitly allowed: completes, reported degraded",
            "completed",
            with_policy(
                &[
                    (
                        "/routes/1/behavior_class_sha256",
                        json!(id("behavior: generic summary v1")),
                    ),
                    (
                        "/allowed_degraded_behavior_classes",
                        json!([id("behavior: generic summary v1")]),
                    ),
                ],
                &steps,
            )?,
        ),
        case(
            "capability_missing",
            "a third route lacks image input for the screenshot task",
            "capability_missing",
            {
                let mut v = base.clone();
                let mut third = route(
                    "text-only-json",
                    2,
                    "external_provider",
                    "eu-central-1",
                    30,
                    1_000,
                );
                set(
                    &mut third,
                    "/capabilities/input_modalities",
                    json!(["text"]),
                );
                if let Some(list) = v
                    .pointer_mut("/policy/routes")
                    .and_then(Value::as_array_mut)
                {
                    list.push(third);
                }
                v
            },
        ),
        case(
            "cancelled",
            "the caller cancels while waiting for attempt 2",
            "stop_cancelled",
            {
                let p: Policy = from_value(policy.clone())?;
                let mut attempts = simulate(&p, steps.get(..1).unwrap_or_default())?;
                attempts.cancelled_at_ms = Some(1_200);
                to_json(&seal(&p, &attempts)?)?
            },
        ),
    ]);

    // Jitter: the reference run with equal jitter, then its mutations.
    let jitter = json!({"mode": "equal", "scheduler_release": "sched-2026.12", "seed": 7});
    let jittered = with_policy(&[("/jitter", jitter.clone())], &steps)?;
    let sample = jittered
        .pointer(&att(1, "jitter_sample_ms"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let upper = jittered
        .pointer("/receipt/schedule/1/jitter_max_ms")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let mut reseeded = jittered.clone();
    // Find a seed whose draws differ from seed 7 on this run, so the replay must catch it.
    for seed in 8..64u64 {
        let candidate = edited(&jittered, &[("/policy/jitter/seed", json!(seed))]);
        if observe(&candidate) != "completed" {
            reseeded = candidate;
            break;
        }
    }
    out.extend([
        case(
            "jitter_replay",
            "equal jitter, seeded: the replay draws the same samples",
            "completed",
            jittered.clone(),
        ),
        case(
            "jitter_out_of_interval",
            "attempt 2's sample is moved above its interval",
            "jitter_out_of_interval",
            edited(
                &jittered,
                &[(&att(1, "jitter_sample_ms"), json!(upper.saturating_add(1)))],
            ),
        ),
        case(
            "jitter_other_seed",
            "the bundle is replayed with another seed",
            "jitter_sample_drift",
            reseeded,
        ),
        case(
            "jitter_sample_missing",
            "attempt 2 does not record its sample",
            "jitter_sample_missing",
            {
                let mut v = jittered.clone();
                if let Some(obj) = v
                    .pointer_mut("/attempts/attempts/1")
                    .and_then(Value::as_object_mut)
                {
                    obj.remove("jitter_sample_ms");
                }
                v
            },
        ),
        case(
            "jitter_sample_unexpected",
            "a sample is recorded where jitter is off",
            "jitter_sample_unexpected",
            edited(&base, &[(&att(1, "jitter_sample_ms"), json!(sample))]),
        ),
    ]);

    // Each receipt field mutated.
    let receipt = base
        .get("receipt")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (field, value) in &receipt {
        let mutated = match value {
            Value::Bool(b) => json!(!b),
            Value::Number(n) => json!(n.as_u64().unwrap_or(0).saturating_add(1)),
            Value::String(s) if s.len() == 64 && Sha256Hex::parse(s).is_ok() => {
                json!(id(&format!("mutated {field}")))
            }
            Value::String(_) if field == "terminal" => json!("stop_deadline"),
            Value::String(_) if field == "schema" => json!("retryledger.receipt.v2"),
            Value::String(_) => json!("other-route"),
            Value::Array(items) => {
                let mut items = items.clone();
                items.pop();
                json!(items)
            }
            _ => continue,
        };
        let expected = if field == "schema" {
            "schema_mismatch"
        } else {
            "receipt_mismatch"
        };
        out.push(case(
            &format!("receipt_{field}"),
            &format!("the sealed receipt's `{field}` is changed"),
            expected,
            edited(&base, &[(&format!("/receipt/{field}"), mutated)]),
        ));
    }
    Ok(out)
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

/// Run a scripted streamed session, as the `stream_session` vectors pin it.
///
/// Each step of `script` is either `{"cancel": true}` (the caller cancels
/// between attempts, at the last completion) or an observed attempt:
/// `{"duration_ms", "facts", "deltas"?, "cost"?, "lag_ms"?}`, started at the
/// planned `not_before_ms` plus `lag_ms` and completed `duration_ms` later.
/// The answer: each step's judgement and the decision after it, the event
/// log, the receipt, the sealed bundle's digest and its replay's verdict.
/// The first error (drift, malformed facts) is the answer instead.
pub fn stream_session(policy_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive_stream(policy_json, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "stream_events": bundle.stream_events.as_ref().map(to_value).unwrap_or(Value::Null),
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted streamed session ([`stream_session`]).
pub fn stream_bundle(policy_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive_stream(policy_json, script_json)?.0)
}

/// Run a scripted session that prices usage with a price schedule and
/// reports request bodies, as the `usage` vectors pin it: the steps of
/// [`stream_session`], each attempt step optionally with `usage` (a list of
/// usage reports, added in order) and `request_body_sha256`. The answer is
/// [`stream_session`]'s, with the bundle's price schedule digest.
pub fn priced_session(policy_json: &str, schedule_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive(policy_json, Some(schedule_json), script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "attempts": to_value(&bundle.attempts),
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "verdict": to_value(&verdict),
    }))
}

/// Run a scripted async-job session, as the `job_session` vectors pin it:
/// the steps of [`stream_session`], each attempt step optionally with `job`
/// (`{"id"?, "status"?}`: the provider's job id the attempt was answered
/// with or asked about, and the status its answer reported). The answer is
/// [`priced_session`]'s without a price schedule.
pub fn job_session(policy_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive(policy_json, None, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "attempts": to_value(&bundle.attempts),
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted async-job session ([`job_session`]).
pub fn job_bundle(policy_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive(policy_json, None, script_json)?.0)
}

/// The sealed bundle of a scripted priced session ([`priced_session`]).
pub fn priced_bundle(policy_json: &str, schedule_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive(policy_json, Some(schedule_json), script_json)?.0)
}

fn drive_stream(policy_json: &str, script_json: &str) -> Result<(Bundle, Vec<Value>, Vec<Value>)> {
    drive(policy_json, None, script_json)
}

fn drive(
    policy_json: &str,
    schedule_json: Option<&str>,
    script_json: &str,
) -> Result<(Bundle, Vec<Value>, Vec<Value>)> {
    use crate::canonical::to_value;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    if let Some(schedule) = schedule_json {
        session.set_price_schedule(Arc::new(crate::decode::from_str(schedule)?))?;
    }
    let (mut judgements, mut decisions) = (Vec::new(), Vec::new());
    let mut now = 0u64;
    for step in script.as_array().into_iter().flatten() {
        if step.get("cancel").is_some() {
            session.cancel(now)?;
            decisions.push(to_value(session.next()));
            continue;
        }
        let not_before = match session.next() {
            Decision::Dispatch(d) => d.not_before_ms,
            Decision::Terminal { .. } => now,
        };
        let num = |k: &str| step.get(k).and_then(Value::as_u64).unwrap_or(0);
        let started = not_before.max(now).saturating_add(num("lag_ms"));
        now = started.saturating_add(num("duration_ms"));
        let facts: Facts = from_value(step.get("facts").cloned().unwrap_or(Value::Null))?;
        let deltas: Vec<&str> = step
            .get("deltas")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let cost = step.get("cost").and_then(Value::as_u64);
        for usage in step
            .get("usage")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // As the bindings take it: a document of its own.
            session.add_usage(&crate::decode::from_str(&usage.to_string())?)?;
        }
        if let Some(body) = step.get("request_body_sha256") {
            let digest = Sha256Hex::parse(body.as_str().unwrap_or_default()).map_err(|m| {
                crate::error::Error::at(
                    crate::error::ErrorCode::InvalidDigest,
                    "/request_body_sha256",
                    m,
                )
            })?;
            session.set_request_body_sha256(digest);
        }
        if let Some(job) = step.get("job") {
            let status = match job.get("status") {
                // As the bindings take it: a name.
                Some(v) => Some(crate::job::JobStatus::parse(
                    v.as_str().unwrap_or_default(),
                )?),
                None => None,
            };
            session.set_job(job.get("id").and_then(Value::as_str), status);
        }
        if let Some(answer) = step.get("reconciled") {
            session.set_reconciled(crate::job::reconciled_named(
                answer.as_str().unwrap_or_default(),
            )?);
        }
        let j = session.observe_stream(started, now, cost, &facts, &deltas)?;
        judgements.push(to_value(&j));
        decisions.push(to_value(session.next()));
    }
    Ok((session.seal()?, judgements, decisions))
}

/// Run a scripted session under a fleet section against an in-memory store,
/// as the `fleet_session` vectors pin it.
///
/// `store` seeds the store: `{"breakers": [snapshots], "budget": snapshot?}`.
/// Each step of `script` is one of:
/// - `{"admit": now_epoch_ms}`: read the view from the store (or
///   `{"admit": now, "store_down": true}` for an unreachable store), admit at
///   the planned `not_before_ms` (or the run clock, if later), write back (a
///   wait answer, kept with its `wait_until_epoch_ms`, writes nothing);
/// - `{"observe": {"duration_ms", "facts"}}`: observe the admitted attempt,
///   then record its outcome on its route's breaker in the store at
///   `admitted_at_epoch_ms + duration_ms`;
/// - `{"set": snapshot}`: another process writes a snapshot.
///
/// The answer: each step's result, the final store, the receipt, the sealed
/// bundle's digest and its verdict; or the first error.
pub fn fleet_session(policy_json: &str, store_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, steps, store) = fleet_drive(policy_json, store_json, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "bundle_sha256": digest_of(&bundle),
        "receipt": to_value(&bundle.receipt),
        "steps": steps,
        "store": store,
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted fleet session ([`fleet_session`]).
pub fn fleet_bundle(policy_json: &str, store_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(fleet_drive(policy_json, store_json, script_json)?.0)
}

fn fleet_drive(
    policy_json: &str,
    store_json: &str,
    script_json: &str,
) -> Result<(Bundle, Vec<Value>, Value)> {
    use crate::breaker::BreakerSnapshot;
    use crate::budget::RetryBudgetSnapshot;
    use crate::canonical::to_value;
    use crate::fleet::FleetView;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let store: Value = crate::decode::parse_strict(store_json)?;
    // The store: breaker snapshots under their keys (a seeded key may hold
    // another release's snapshot, as a broken store would return it).
    let mut breakers: Vec<(Sha256Hex, BreakerSnapshot)> = Vec::new();
    for (key, b) in store
        .get("breakers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let key = Sha256Hex::parse(key).map_err(|m| {
            crate::error::Error::at(crate::error::ErrorCode::InvalidDigest, "/breakers", m)
        })?;
        breakers.push((key, from_value(b.clone())?));
    }
    let mut budget: Option<RetryBudgetSnapshot> = store
        .get("budget")
        .map(|b| from_value(b.clone()))
        .transpose()?;
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    let mut steps = Vec::new();
    let (mut now, mut epoch) = (0u64, 0u64);
    let put = |breakers: &mut Vec<(Sha256Hex, BreakerSnapshot)>, s: BreakerSnapshot| {
        breakers.retain(|(k, _)| k != &s.route_release_sha256);
        breakers.push((s.route_release_sha256.clone(), s));
    };
    for step in script.as_array().into_iter().flatten() {
        if let Some(at) = step.get("admit").and_then(Value::as_u64) {
            epoch = at;
            let at_ms = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            now = at_ms;
            let view = FleetView {
                admission: Vec::new(),
                breakers: breakers.clone(),
                budget: budget.clone(),
                reserve_tokens: None,
                store_unavailable: step.get("store_down").is_some(),
            };
            let admitted = session.admit(at_ms, at, &view)?;
            for b in &admitted.writes.breakers {
                put(&mut breakers, b.clone());
            }
            if let Some(b) = &admitted.writes.budget {
                budget = Some(b.clone());
            }
            let mut answer = json!({
                "decision": to_value(&admitted.decision),
                "writes": to_value(&admitted.writes),
            });
            if let (Some(until), Some(o)) = (admitted.wait_until_epoch_ms, answer.as_object_mut()) {
                o.insert("wait_until_epoch_ms".into(), json!(until));
            }
            steps.push(answer);
        } else if let Some(o) = step.get("observe") {
            let started = now;
            let duration = o.get("duration_ms").and_then(Value::as_u64).unwrap_or(0);
            now = started.saturating_add(duration);
            let facts: Facts = from_value(o.get("facts").cloned().unwrap_or(Value::Null))?;
            let j = session.observe(started, now, None, &facts)?;
            let mut recorded = Value::Null;
            let release = session
                .attempts()
                .attempts
                .last()
                .map(|a| a.route_release_sha256.clone());
            if let (Some(release), Some(_)) = (
                release,
                session
                    .policy()
                    .policy
                    .fleet
                    .as_ref()
                    .and_then(|f| f.breaker.as_ref()),
            ) {
                let at = epoch.saturating_add(duration);
                let current = breakers
                    .iter()
                    .find(|(k, _)| k == &release)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_else(|| BreakerSnapshot::fresh(release.clone(), at));
                let next = session.breaker_after(&current, at)?;
                recorded = to_value(&next);
                put(&mut breakers, next);
            }
            steps.push(json!({
                "breaker": recorded,
                "judgement": to_value(&j),
                "next": to_value(session.next()),
            }));
        } else if let Some(s) = step.get("set") {
            if s.get("schema").and_then(Value::as_str)
                == Some(crate::budget::RetryBudgetSchema::NAME)
            {
                budget = Some(from_value(s.clone())?);
            } else {
                put(&mut breakers, from_value(s.clone())?);
            }
            steps.push(json!({"set": true}));
        }
    }
    breakers.sort_by(|a, b| a.0.cmp(&b.0));
    let store = json!({
        "breakers": breakers
            .iter()
            .map(|(k, b)| (k.as_str().to_owned(), to_value(b)))
            .collect::<serde_json::Map<String, Value>>(),
        "budget": budget.as_ref().map(to_value),
    });
    Ok((session.seal()?, steps, store))
}

/// Run a scripted session under a fleet section with admission limits
/// against an in-memory store of admission snapshots (keyed by their
/// [`crate::admission::AdmissionSnapshot::key`]), as the `admission` vectors
/// build their bundles.
///
/// `store` seeds it: a list of admission snapshots. Each step of `script`:
/// - `{"admit": now_epoch_ms, "reserve_tokens"?: n}`: admit at the planned
///   `not_before_ms` (or the run clock, if later) and write back; a wait
///   answer writes nothing;
/// - `{"observe": {"duration_ms", "facts", "used_tokens"?, "headers"?}}`:
///   observe the admitted attempt, started at its `not_before_ms`, then
///   release it (applying the response's rate-limit `headers`, `[name,
///   value]` pairs);
/// - `{"set": snapshot}`: another process writes a snapshot.
///
/// The answer: each step's result, the final store, the sealed bundle.
pub fn admission_session(
    policy_json: &str,
    store_json: &str,
    script_json: &str,
) -> Result<(Vec<Value>, Value, Bundle)> {
    use crate::admission::AdmissionSnapshot;
    use crate::canonical::to_value;
    use crate::fleet::FleetView;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let mut store: Vec<(String, AdmissionSnapshot)> = Vec::new();
    let seeded: Value = crate::decode::parse_strict(store_json)?;
    for s in seeded.as_array().into_iter().flatten() {
        let s: AdmissionSnapshot = from_value(s.clone())?;
        store.push((s.key(), s));
    }
    let put = |store: &mut Vec<(String, AdmissionSnapshot)>, s: AdmissionSnapshot| {
        let key = s.key();
        store.retain(|(k, _)| k != &key);
        store.push((key, s));
    };
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    let mut steps = Vec::new();
    let (mut now, mut epoch) = (0u64, 0u64);
    for step in script.as_array().into_iter().flatten() {
        if let Some(at) = step.get("admit").and_then(Value::as_u64) {
            let at_ms = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            now = at_ms;
            epoch = at;
            let view = FleetView {
                admission: store
                    .iter()
                    .map(|(_, s)| (s.route_release_sha256.clone(), s.clone()))
                    .collect(),
                breakers: Vec::new(),
                budget: None,
                reserve_tokens: step.get("reserve_tokens").and_then(Value::as_u64),
                store_unavailable: false,
            };
            let admitted = session.admit(now, at, &view)?;
            for s in &admitted.writes.admission {
                put(&mut store, s.clone());
            }
            steps.push(to_value(&admitted));
        } else if let Some(o) = step.get("observe") {
            let started = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            let duration = o.get("duration_ms").and_then(Value::as_u64).unwrap_or(0);
            now = started.saturating_add(duration);
            let facts: Facts = from_value(o.get("facts").cloned().unwrap_or(Value::Null))?;
            let j = session.observe(started, now, None, &facts)?;
            let at = epoch.saturating_add(now.saturating_sub(started));
            let release = session
                .attempts()
                .attempts
                .last()
                .map(|a| a.route_release_sha256.clone());
            let admitted = session
                .attempts()
                .attempts
                .last()
                .and_then(|a| a.admission.as_ref())
                .is_some_and(|a| a.limits.is_some());
            let current = store
                .iter()
                .find(|(_, s)| Some(&s.route_release_sha256) == release.as_ref())
                .map(|(_, s)| s.clone());
            let mut released = Value::Null;
            if let (true, Some(current)) = (admitted, current) {
                let used = o.get("used_tokens").and_then(Value::as_u64);
                let headers: crate::admission::SeenHeaders = match o.get("headers") {
                    Some(h) => from_value(h.clone())?,
                    None => crate::admission::SeenHeaders::default(),
                };
                let next = session.admission_release_seen(&current, at, used, &headers.0)?;
                released = to_value(&next);
                put(&mut store, next);
            }
            steps.push(json!({
                "judgement": to_value(&j),
                "next": to_value(session.next()),
                "released": released,
            }));
        } else if let Some(s) = step.get("set") {
            put(&mut store, from_value(s.clone())?);
            steps.push(json!({"set": true}));
        }
    }
    store.sort_by(|a, b| a.0.cmp(&b.0));
    let out = Value::Array(store.iter().map(|(_, s)| to_value(s)).collect());
    Ok((steps, out, session.seal()?))
}
