//! The mutation cases: each changes one thing of the reference run and
//! names the code it must produce.

use serde_json::{json, Value};

use crate::decode::from_value;
use crate::error::Result;
use crate::ids::Sha256Hex;
use crate::outcome::{IndeterminateKind, NonRetryableKind, Outcome};
use crate::policy::Policy;
use crate::receipt::seal;

use super::{
    bundle_value, id, observe, rate_limited, reference_policy, reference_steps, route, simulate,
    to_json, unavailable, Step,
};

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
