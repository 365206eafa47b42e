//! Receipts and bundles: the sealed record of a run, and its replay.
//!
//! A bundle carries the policy, the observed attempts and the receipt. Anyone
//! can replay it: [`verify_bundle`] recompiles the policy, re-evaluates the
//! attempts and compares the result with the sealed receipt field by field,
//! reporting the first drift with its code, attempt and JSON Pointer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::attempt::Attempts;
use crate::canonical::digest_of;
use crate::error::{ErrorCode, ErrorFamily, Result};
use crate::evaluate::{evaluate, Terminal};
use crate::ids::{bounded_vec, schema_marker, Identifier, Sha256Hex};
use crate::limits::{MAX_ATTEMPTS, MAX_ROUTES};
use crate::outcome::OutcomeClass;
use crate::policy::{compile, Policy};

schema_marker!(
    /// `retryledger.receipt.v1`
    ReceiptSchema = "retryledger.receipt.v1"
);
schema_marker!(
    /// `retryledger.bundle.v1`
    BundleSchema = "retryledger.bundle.v1"
);

/// Attempts used on one route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteCount {
    /// Attempts dispatched on the route.
    pub attempts: u64,
    /// The route.
    pub route_id: Identifier,
}

/// One attempt as scheduled and observed. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleEntry {
    /// Observed completion, ms.
    pub completed_at_ms: u64,
    /// Actual cost.
    pub cost: u64,
    /// Planned delay from the previous completion, ms.
    pub delay_ms: u64,
    /// Jitter interval upper end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_max_ms: Option<u64>,
    /// Jitter interval lower end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_min_ms: Option<u64>,
    /// Jitter sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_sample_ms: Option<u64>,
    /// Planned earliest start, ms.
    pub not_before_ms: u64,
    /// Global ordinal.
    pub ordinal: u64,
    /// Outcome kind (`success` or the failure kind).
    pub outcome: String,
    /// Outcome class.
    pub outcome_class: OutcomeClass,
    /// Bounded Retry-After floor that applied to the delay, ms.
    pub retry_after_floor_ms: u64,
    /// Route.
    pub route_id: Identifier,
    /// Ordinal on the route.
    pub route_ordinal: u64,
    /// Observed start, ms.
    pub started_at_ms: u64,
}

/// The receipt document. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// Physical attempts dispatched.
    pub attempt_count: u64,
    /// Digest of the attempts document.
    pub attempts_sha256: Sha256Hex,
    /// Required behavior class.
    pub behavior_class_sha256: Sha256Hex,
    /// Digest of the request's capability contract.
    pub capability_contract_sha256: Sha256Hex,
    /// Completed on a route with an allowed degraded behavior class.
    pub degraded: bool,
    /// Any attempt used a route other than the primary.
    pub fallback_used: bool,
    /// Route of the last attempt; absent when none was dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_route_id: Option<Identifier>,
    /// Last completion or cancellation time, ms.
    pub finished_at_ms: u64,
    /// Idempotency key digest of every attempt.
    pub idempotency_key_sha256: Sha256Hex,
    /// Logical request digest of every attempt.
    pub logical_request_sha256: Sha256Hex,
    /// Digest of the policy document.
    pub policy_sha256: Sha256Hex,
    /// Attempts per route, in priority order.
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_ROUTES>")]
    pub route_attempts: Vec<RouteCount>,
    /// Every attempt as scheduled and observed.
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_ATTEMPTS>")]
    pub schedule: Vec<ScheduleEntry>,
    /// `retryledger.receipt.v1`
    pub schema: ReceiptSchema,
    /// How the run ended.
    pub terminal: Terminal,
    /// Total actual cost.
    pub total_cost: u64,
}

/// A bundle: everything needed to replay a run. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// The observed attempts.
    pub attempts: Attempts,
    /// The policy.
    pub policy: Policy,
    /// The sealed receipt.
    pub receipt: Receipt,
    /// `retryledger.bundle.v1`
    pub schema: BundleSchema,
}

/// The result of replaying a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Verdict {
    /// The receipt is exactly the replay of the policy and attempts.
    Verified {
        /// Digest of the attempts document.
        attempts_sha256: String,
        /// Digest of the policy document.
        policy_sha256: String,
        /// Digest of the receipt document.
        receipt_sha256: String,
        /// How the run ended.
        terminal: Terminal,
    },
    /// The first difference between the sealed run and its replay.
    Drift {
        /// Index of the offending attempt, when the drift is in an attempt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt_index: Option<usize>,
        /// Stable error code.
        code: String,
        /// Human-readable explanation.
        message: String,
        /// JSON Pointer into the bundle.
        path: String,
    },
}

/// The first place two JSON values differ, as a JSON Pointer below `at`.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(u), Some(v)) => first_difference(u, v, format!("{at}/{k}")),
                _ => Some(format!("{at}/{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            let common = x
                .iter()
                .zip(y.iter())
                .enumerate()
                .find_map(|(i, (u, v))| first_difference(u, v, format!("{at}/{i}")));
            common
                .or_else(|| (x.len() != y.len()).then(|| format!("{at}/{}", x.len().min(y.len()))))
        }
        _ => (a != b).then_some(at),
    }
}

/// Replay a bundle. Drift (an attempt off plan, a run that has not ended, a
/// receipt that differs from its replay) is a verdict; a policy that fails
/// validation is an error, as it would be before any dispatch.
pub fn verify_bundle(bundle: &Bundle) -> Result<Verdict> {
    let policy = compile(bundle.policy.clone()).map_err(|e| e.under("/policy"))?;
    let replayed = match evaluate(&policy, &bundle.attempts) {
        Ok(r) => r,
        Err(e) if matches!(e.family(), ErrorFamily::Drift | ErrorFamily::Run) => {
            let path = match &e.path {
                Some(p) => format!("/attempts{p}"),
                None => "/attempts".to_owned(),
            };
            return Ok(Verdict::Drift {
                attempt_index: e.attempt_index,
                code: e.code.as_str().to_owned(),
                message: e.message,
                path,
            });
        }
        Err(e) => return Err(e),
    };
    if replayed != bundle.receipt {
        let sealed = serde_json::to_value(&bundle.receipt).unwrap_or(Value::Null);
        let fresh = serde_json::to_value(&replayed).unwrap_or(Value::Null);
        let path = first_difference(&sealed, &fresh, "/receipt".to_owned())
            .unwrap_or_else(|| "/receipt".to_owned());
        let attempt_index = path
            .strip_prefix("/receipt/schedule/")
            .and_then(|rest| rest.split('/').next())
            .and_then(|i| i.parse().ok());
        return Ok(Verdict::Drift {
            attempt_index,
            code: ErrorCode::ReceiptMismatch.as_str().to_owned(),
            message: format!("the sealed receipt differs from its replay at {path}"),
            path,
        });
    }
    Ok(Verdict::Verified {
        attempts_sha256: replayed.attempts_sha256.as_str().to_owned(),
        policy_sha256: policy.policy_sha256.clone(),
        receipt_sha256: digest_of(&replayed),
        terminal: replayed.terminal,
    })
}

/// Seal a finished run into a bundle.
pub fn seal(policy: &Policy, attempts: &Attempts) -> Result<Bundle> {
    let compiled = compile(policy.clone())?;
    let receipt = evaluate(&compiled, attempts)?;
    Ok(Bundle {
        attempts: attempts.clone(),
        policy: policy.clone(),
        receipt,
        schema: BundleSchema,
    })
}
