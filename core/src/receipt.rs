//! Receipts and bundles: the sealed record of a run, and its replay.
//!
//! A bundle carries the policy, the observed attempts and the receipt. Anyone
//! can replay it: [`verify_bundle`] recompiles the policy, re-evaluates the
//! attempts and compares the result with the sealed receipt field by field,
//! reporting the first drift with its code, attempt and JSON Pointer.

use serde_json::Value;

use crate::attempt::Attempts;
use crate::canonical::{digest_of, to_value, Encode, ObjectWriter, Sink};
use crate::decode::{decode_tag, names, object, pick, At, Decode, Fields};
use crate::error::{ErrorCode, ErrorFamily, Result};
use crate::evaluate::{replay, Terminal};
use crate::fleet::{FleetSnapshots, FleetSummary};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::{MAX_ATTEMPTS, MAX_ROUTES};
use crate::outcome::OutcomeClass;
use crate::policy::{compile, Policy};
use crate::price::{verify_usage, PriceSchedule};
use crate::stream::{verify_events, StreamEvents, StreamSummary};

schema_marker!(
    /// `retryledger.receipt.v1`
    ReceiptSchema = "retryledger.receipt.v1"
);
schema_marker!(
    /// `retryledger.bundle.v1`
    BundleSchema = "retryledger.bundle.v1"
);

/// Attempts used on one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCount {
    /// Attempts dispatched on the route.
    pub attempts: u64,
    /// The route.
    pub route_id: Identifier,
}

/// One attempt as scheduled and observed. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleEntry {
    /// Observed completion, ms.
    pub completed_at_ms: u64,
    /// Actual cost.
    pub cost: u64,
    /// Planned delay from the previous completion, ms.
    pub delay_ms: u64,
    /// Jitter interval upper end.
    pub jitter_max_ms: Option<u64>,
    /// Jitter interval lower end.
    pub jitter_min_ms: Option<u64>,
    /// Jitter sample.
    pub jitter_sample_ms: Option<u64>,
    /// Why the provider refused the pool key the attempt was sent with
    /// (`unauthorized`, `forbidden`); absent otherwise.
    pub key_refused: Option<crate::keypool::KeyRefusal>,
    /// The digest of the pool key the attempt was sent with (never the
    /// secret); absent when its route names no key pool.
    pub key_sha256: Option<Sha256Hex>,
    /// The requested and served model the attempt records; absent when it
    /// records none.
    pub model: Option<crate::attempt::ModelRecord>,
    /// Planned earliest start, ms.
    pub not_before_ms: u64,
    /// Global ordinal.
    pub ordinal: u64,
    /// Outcome kind (`success` or the failure kind).
    pub outcome: String,
    /// Outcome class.
    pub outcome_class: OutcomeClass,
    /// How a recovered run learned the outcome from the receiver; absent
    /// for an attempt observed directly.
    pub reconciled: Option<crate::attempt::Reconciled>,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub final_route_id: Option<Identifier>,
    /// Last completion or cancellation time, ms.
    pub finished_at_ms: u64,
    /// What the fleet did to the run.
    pub fleet: Option<FleetSummary>,
    /// What hedging did: the winner, the losers and their cost
    /// ([`crate::hedge`]); absent for a policy without a hedge section.
    pub hedge: Option<crate::hedge::HedgeSummary>,
    /// Idempotency key digest of every attempt.
    pub idempotency_key_sha256: Sha256Hex,
    /// Attempts whose failure a testing fault injector made: a receipt that
    /// has this is not production evidence. Absent when none was.
    pub injected_faults: Option<u64>,
    /// The async job: its id digest, submits, polls, last status, and
    /// whether it was left running; present when the policy has `async_job`.
    pub job: Option<crate::job::JobSummary>,
    /// Logical request digest of every attempt.
    pub logical_request_sha256: Sha256Hex,
    /// Digest of the policy document.
    pub policy_sha256: Sha256Hex,
    /// Digest of the price schedule that priced the run's usage, when the run had one.
    pub price_schedule_sha256: Option<Sha256Hex>,
    /// Attempts per route, in priority order.
    pub route_attempts: Vec<RouteCount>,
    /// Every attempt as scheduled and observed.
    pub schedule: Vec<ScheduleEntry>,
    /// `retryledger.receipt.v1`
    pub schema: ReceiptSchema,
    /// What a streamed run delivered, committed and invalidated.
    pub stream: Option<StreamSummary>,
    /// How the run ended.
    pub terminal: Terminal,
    /// Total actual cost.
    pub total_cost: u64,
}

/// A bundle: everything needed to replay a run. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// The observed attempts.
    pub attempts: Attempts,
    /// The fleet snapshots every admission read.
    pub fleet_snapshots: Option<FleetSnapshots>,
    /// The policy.
    pub policy: Policy,
    /// The price schedule the run priced usage with, when it had one.
    pub price_schedule: Option<PriceSchedule>,
    /// The sealed receipt.
    pub receipt: Receipt,
    /// `retryledger.bundle.v1`
    pub schema: BundleSchema,
    /// The events the consumer received, for a streamed run.
    pub stream_events: Option<StreamEvents>,
}

/// The result of replaying a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        attempt_index: Option<usize>,
        /// Stable error code.
        code: String,
        /// Human-readable explanation.
        message: String,
        /// JSON Pointer into the bundle.
        path: String,
    },
}

object!(RouteCount {
    attempts: u64,
    route_id: doc,
});

object!(ScheduleEntry {
    completed_at_ms: u64,
    cost: u64,
    delay_ms: u64,
    jitter_max_ms: opt_u64,
    jitter_min_ms: opt_u64,
    jitter_sample_ms: opt_u64,
    key_refused: opt_doc,
    key_sha256: opt_doc,
    model: opt_doc,
    not_before_ms: u64,
    ordinal: u64,
    outcome: str,
    outcome_class: doc,
    reconciled: opt_doc,
    retry_after_floor_ms: u64,
    route_id: doc,
    route_ordinal: u64,
    started_at_ms: u64,
});

object!(Receipt {
    attempt_count: u64,
    attempts_sha256: doc,
    behavior_class_sha256: doc,
    capability_contract_sha256: doc,
    degraded: bool,
    fallback_used: bool,
    final_route_id: opt_doc,
    finished_at_ms: u64,
    fleet: opt_doc,
    hedge: opt_doc,
    idempotency_key_sha256: doc,
    injected_faults: opt_u64,
    job: opt_doc,
    logical_request_sha256: doc,
    policy_sha256: doc,
    price_schedule_sha256: opt_doc,
    route_attempts: list(MAX_ROUTES),
    schedule: list(MAX_ATTEMPTS),
    schema: doc,
    stream: opt_doc,
    terminal: doc,
    total_cost: u64,
});

object!(Bundle {
    attempts: doc,
    fleet_snapshots: opt_doc,
    policy: doc,
    price_schedule: opt_doc,
    receipt: doc,
    schema: doc,
    stream_events: opt_doc,
});

/// A verdict is an object tagged by `kind`, its keys in RFC 8785 order.
impl Encode for Verdict {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Verified {
                attempts_sha256,
                policy_sha256,
                receipt_sha256,
                terminal,
            } => {
                o.str("attempts_sha256", attempts_sha256)
                    .str("kind", "verified")
                    .str("policy_sha256", policy_sha256)
                    .str("receipt_sha256", receipt_sha256)
                    .doc("terminal", terminal);
            }
            Self::Drift {
                attempt_index,
                code,
                message,
                path,
            } => {
                o.opt_u64(
                    "attempt_index",
                    attempt_index.and_then(|i| u64::try_from(i).ok()),
                )
                .str("code", code)
                .str("kind", "drift")
                .str("message", message)
                .str("path", path);
            }
        }
        o.end();
    }
}

/// The kinds of [`Verdict`], as its `kind` tag names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VerdictKind {
    Verified,
    Drift,
}

names!(VerdictKind {
    Verified => "verified",
    Drift => "drift",
});

/// A verdict is an object tagged by `kind`; a bad tag is reported at
/// `kind`, everything else inside the object at the object.
impl Decode for Verdict {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = pick(
            VerdictKind::ALL,
            decode_tag(v, at, "kind", VerdictKind::NAMES)?,
            at,
        )?;
        let mut f = Fields::open(v, at)?.variant("kind");
        if kind == VerdictKind::Verified {
            let attempts_sha256 = f.req("attempts_sha256");
            let policy_sha256 = f.req("policy_sha256");
            let receipt_sha256 = f.req("receipt_sha256");
            let terminal = f.req("terminal");
            f.end()?;
            let (Some(attempts_sha256), Some(policy_sha256), Some(receipt_sha256), Some(terminal)) =
                (attempts_sha256, policy_sha256, receipt_sha256, terminal)
            else {
                return Err(f.incomplete());
            };
            return Ok(Self::Verified {
                attempts_sha256,
                policy_sha256,
                receipt_sha256,
                terminal,
            });
        }
        let attempt_index: Option<u64> = f.opt("attempt_index");
        let code = f.req("code");
        let message = f.req("message");
        let path = f.req("path");
        f.end()?;
        let (Some(code), Some(message), Some(path)) = (code, message, path) else {
            return Err(f.incomplete());
        };
        Ok(Self::Drift {
            attempt_index: attempt_index.and_then(|i| usize::try_from(i).ok()),
            code,
            message,
            path,
        })
    }
}

/// The first place two JSON values differ, as a JSON Pointer below `at`.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            // Every key of either map in sorted order (whatever order the
            // maps keep): the first one absent from one side or holding a
            // different value there.
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort_unstable();
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
    if let Some(schedule) = &bundle.price_schedule {
        crate::price::check_schedule(&policy.policy, schedule)
            .map_err(|e| e.under("/price_schedule"))?;
    }
    let run = replay(&policy, &bundle.attempts).and_then(|run| {
        let mut receipt = run.receipt(&policy, digest_of(&bundle.attempts))?;
        receipt.price_schedule_sha256 = bundle
            .price_schedule
            .as_ref()
            .map(|s| Sha256Hex::computed(digest_of(s)));
        Ok((receipt, run))
    });
    let (replayed, run) = match run {
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
    if let Err(e) = verify_usage(bundle.price_schedule.as_ref(), &bundle.attempts) {
        return Ok(Verdict::Drift {
            attempt_index: e.attempt_index,
            code: e.code.as_str().to_owned(),
            path: format!("/attempts{}", e.path.unwrap_or_default()),
            message: e.message,
        });
    }
    if replayed != bundle.receipt {
        let sealed = to_value(&bundle.receipt);
        let fresh = to_value(&replayed);
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
    if let Some(e) = stream_drift(&policy, bundle, run.stream_actions()) {
        return Ok(e);
    }
    let snapshots = bundle.fleet_snapshots.clone().unwrap_or_default();
    if let Err(e) = crate::fleet::verify_admissions(&policy, &bundle.attempts, &snapshots) {
        return Ok(Verdict::Drift {
            attempt_index: e.attempt_index,
            code: e.code.as_str().to_owned(),
            path: e.path.unwrap_or_else(|| "/fleet_snapshots".to_owned()),
            message: e.message,
        });
    }
    Ok(Verdict::Verified {
        attempts_sha256: replayed.attempts_sha256.as_str().to_owned(),
        policy_sha256: policy.policy_sha256.clone(),
        receipt_sha256: digest_of(&replayed),
        terminal: replayed.terminal,
    })
}

/// The first problem of a bundle's stream event log, as a verdict.
fn stream_drift(
    policy: &crate::policy::CompiledPolicy,
    bundle: &Bundle,
    actions: &[crate::stream::StreamAction],
) -> Option<Verdict> {
    let mode = policy.policy.stream.as_ref().map(|s| s.mode);
    let drift = |code: ErrorCode, path: &str, message: String| Verdict::Drift {
        attempt_index: None,
        code: code.as_str().to_owned(),
        message,
        path: path.to_owned(),
    };
    let (mode, events) = match (mode, &bundle.stream_events) {
        (None, None) => return None,
        (Some(mode), Some(events)) => (mode, events),
        (Some(_), None) => {
            return Some(drift(
                ErrorCode::StreamEventDrift,
                "/stream_events",
                "the policy streams but the bundle carries no stream events".into(),
            ))
        }
        (None, Some(_)) => {
            return Some(drift(
                ErrorCode::StreamEventDrift,
                "/stream_events",
                "the bundle carries stream events but the policy does not stream".into(),
            ))
        }
    };
    let policy_sha256 = Sha256Hex::computed(policy.policy_sha256.clone());
    verify_events(&policy_sha256, mode, &bundle.attempts, actions, &events.0)
        .err()
        .map(|e| Verdict::Drift {
            attempt_index: None,
            code: e.code.as_str().to_owned(),
            path: e.path.unwrap_or_else(|| "/stream_events".to_owned()),
            message: e.message,
        })
}

/// Seal a finished run into a bundle.
///
/// A streamed run's bundle carries its event log. Built from the attempts
/// alone, the log can hold no delivered delta (their digests live with the
/// session that observed them), so a streamed run that delivered output is
/// sealed by its [`crate::session::Session`]; here it is `invalid_value`.
pub fn seal(policy: &Policy, attempts: &Attempts) -> Result<Bundle> {
    let compiled = compile(policy.clone())?;
    let run = replay(&compiled, attempts)?;
    let receipt = run.receipt(&compiled, digest_of(attempts))?;
    let mut bundle = Bundle::new(policy.clone(), attempts.clone(), receipt);
    if let Some(contract) = &policy.stream {
        if let Some(i) = attempts
            .attempts
            .iter()
            .position(|a| a.stream.as_ref().is_some_and(|s| s.events > 0))
        {
            return Err(crate::error::Error::at(
                ErrorCode::InvalidValue,
                format!("/attempts/{i}/stream/events"),
                "a streamed run that delivered output is sealed by its session, which holds the deltas' digests",
            ));
        }
        let policy_sha256 = Sha256Hex::computed(compiled.policy_sha256.clone());
        let log = crate::stream::EventLog::replayed(
            contract.mode,
            attempts,
            run.stream_actions(),
            |_| Vec::new(),
        );
        bundle.stream_events = Some(StreamEvents(log.events(&policy_sha256)));
    }
    Ok(bundle)
}

impl Bundle {
    /// A bundle of a policy, its observed attempts and their receipt.
    pub fn new(policy: Policy, attempts: Attempts, receipt: Receipt) -> Self {
        Bundle {
            attempts,
            fleet_snapshots: None,
            policy,
            price_schedule: None,
            receipt,
            schema: BundleSchema,
            stream_events: None,
        }
    }
}
