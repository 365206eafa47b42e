//! WebAssembly bindings of retryledger-core (built only for wasm32).
//!
//! Thin glue over [`retryledger_core::api`]: JSON text in, JSON text out. A
//! failure is thrown as the core's `error_json` string (code, family, message,
//! path, attempt index); the TypeScript layer of the npm package parses it and
//! throws a typed `Error` subclass. Numbers that cross as JavaScript numbers
//! are checked here to be integers in 0..=2^53-1, so nothing becomes a BigInt
//! and no input can trap.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, sha256_hex as sha256};
use retryledger_core::error::{Error, ErrorCode};
use retryledger_core::evaluate::{Decision, Dispatch, Terminal};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, Outcome, RetryableKind};
use retryledger_core::{CompiledPolicy, Session};
use wasm_bindgen::prelude::*;

/// Every fallible export returns text or throws the error's JSON as a string.
type Out<T> = Result<T, JsValue>;

fn thrown(e: &Error) -> JsValue {
    JsValue::from_str(&api::error_json(e))
}

fn lift<T>(r: retryledger_core::Result<T>) -> Out<T> {
    r.map_err(|e| thrown(&e))
}

/// A JavaScript number as a document integer: finite, whole, in 0..=2^53-1.
fn safe_integer(x: f64, name: &str) -> retryledger_core::Result<u64> {
    if !x.is_finite() || x.trunc() != x {
        return Err(Error::at(
            ErrorCode::FloatValue,
            format!("/{name}"),
            format!("`{name}` must be an integer"),
        ));
    }
    // Exact: MAX_SAFE_INTEGER is below 2^53, so the conversion loses nothing.
    #[allow(clippy::cast_precision_loss)]
    let max = MAX_SAFE_INTEGER as f64;
    if !(0.0..=max).contains(&x) {
        return Err(Error::at(
            ErrorCode::IntegerOutOfRange,
            format!("/{name}"),
            format!("`{name}` must be in 0..=2^53-1"),
        ));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(x as u64)
}

/// `validate_policy`: the policy digest.
#[wasm_bindgen]
pub fn validate_policy(policy: &str) -> Out<String> {
    lift(api::validate_policy(policy))
}

/// `plan_next`: the decision as JSON.
#[wasm_bindgen]
pub fn plan_next(policy: &str, attempts: &str) -> Out<String> {
    lift(api::plan_next(policy, attempts))
}

/// `evaluate`: the receipt as JSON.
#[wasm_bindgen]
pub fn evaluate(policy: &str, attempts: &str) -> Out<String> {
    lift(api::evaluate(policy, attempts))
}

/// `verify_bundle`: the verdict as JSON.
#[wasm_bindgen]
pub fn verify_bundle(bundle: &str) -> Out<String> {
    lift(api::verify(bundle))
}

/// `digest`: the document's SHA-256 as lowercase hex.
#[wasm_bindgen]
pub fn digest(document: &str) -> Out<String> {
    lift(api::digest(document))
}

/// `parse_retry_after`: bounded milliseconds.
#[wasm_bindgen]
pub fn parse_retry_after(header: &str, value: &str, now_unix_ms: f64, cap_ms: f64) -> Out<f64> {
    let run = || -> retryledger_core::Result<u64> {
        let now = safe_integer(now_unix_ms, "now_unix_ms")?;
        let cap = safe_integer(cap_ms, "cap_ms")?;
        api::parse_retry_after(header, value, now, cap)
    };
    // The core clamps to 2^53-1, so the number is exact in JavaScript.
    #[allow(clippy::cast_precision_loss)]
    lift(run().map(|ms| ms as f64))
}

/// `classify_http`: the outcome as JSON.
#[wasm_bindgen]
pub fn classify_http(observation: &str) -> Out<String> {
    lift(api::classify_http(observation))
}

/// Lowercase hex SHA-256 of a string's UTF-8 bytes (the idempotency key check).
#[wasm_bindgen]
pub fn sha256_hex(text: &str) -> String {
    sha256(text.as_bytes())
}

/// A policy validated and digested once, reused for every plan and seal of a run.
#[wasm_bindgen]
pub struct Compiled {
    inner: Arc<CompiledPolicy>,
}

#[wasm_bindgen]
impl Compiled {
    /// Decode and validate a policy.
    pub fn compile(policy: &str) -> Out<Compiled> {
        Ok(Compiled {
            inner: Arc::new(lift(api::compile_policy(policy))?),
        })
    }

    /// The policy digest.
    pub fn digest(&self) -> String {
        self.inner.policy_sha256.clone()
    }

    /// The policy as canonical JSON.
    pub fn policy_json(&self) -> String {
        canonical_json(&self.inner.policy)
    }

    /// `plan_next` against this policy.
    pub fn plan_next(&self, attempts: &str) -> Out<String> {
        lift(api::plan_next_compiled(&self.inner, attempts))
    }

    /// `evaluate` against this policy.
    pub fn evaluate(&self, attempts: &str) -> Out<String> {
        lift(api::evaluate_compiled(&self.inner, attempts))
    }

    /// Seal a finished run: the bundle as JSON.
    pub fn seal(&self, attempts: &str) -> Out<String> {
        lift(api::seal_compiled(&self.inner, attempts))
    }

    /// A new run of this policy with no attempt yet (the driver's state, kept here).
    pub fn start(&self) -> Run {
        Run {
            session: Session::start(Arc::clone(&self.inner)),
        }
    }
}

/// Outcomes by index, so that recording an attempt crosses no JSON.
const OUTCOMES: [Outcome; 11] = [
    Outcome::Success,
    Outcome::Retryable {
        kind: RetryableKind::TimeoutBeforeResponse,
        retry_after_ms: None,
    },
    Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: None,
    },
    Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
    },
    Outcome::NonRetryable {
        kind: NonRetryableKind::Rejected,
    },
    Outcome::NonRetryable {
        kind: NonRetryableKind::PolicyDenied,
    },
    Outcome::NonRetryable {
        kind: NonRetryableKind::InvalidRequest,
    },
    Outcome::NonRetryable {
        kind: NonRetryableKind::ProtocolViolation,
    },
    Outcome::NonRetryable {
        kind: NonRetryableKind::InvalidOutput,
    },
    Outcome::Indeterminate {
        kind: IndeterminateKind::UnknownProviderAcceptance,
    },
    Outcome::Indeterminate {
        kind: IndeterminateKind::StreamInterruptedAfterOutput,
    },
];

#[allow(clippy::cast_precision_loss)]
fn num(x: u64) -> f64 {
    // Every document integer is at most 2^53 - 1: exact as a JavaScript number.
    x as f64
}

fn opt_num(x: Option<u64>) -> f64 {
    x.map_or(-1.0, num)
}

/// One run in progress: its attempts and next decision. Recording crosses
/// numbers only; the receipt crosses as JSON once, at the end.
#[wasm_bindgen]
pub struct Run {
    session: Session,
}

impl Run {
    fn dispatch(&self) -> Option<&Dispatch> {
        match self.session.next() {
            Decision::Dispatch(d) => Some(d),
            Decision::Terminal { .. } => None,
        }
    }

    fn field(&self, f: impl Fn(&Dispatch) -> u64) -> f64 {
        self.dispatch().map_or(-1.0, |d| num(f(d)))
    }
}

#[wasm_bindgen]
impl Run {
    /// 0 while the next decision is a dispatch, else the terminal's index from 1
    /// (completed, stop_non_retryable, stop_indeterminate, stop_total_attempts,
    /// stop_route_exhausted, stop_cost_budget, stop_deadline, stop_cancelled).
    pub fn terminal(&self) -> u32 {
        match self.session.next() {
            Decision::Dispatch(_) => 0,
            Decision::Terminal { terminal } => Terminal::ALL
                .iter()
                .position(|t| t == terminal)
                .and_then(|i| u32::try_from(i).ok())
                .map_or(0, |i| i.saturating_add(1)),
        }
    }

    /// The planned route's priority (its index in priority order), or -1.
    pub fn priority(&self) -> i32 {
        self.dispatch()
            .and_then(|d| {
                self.session
                    .policy()
                    .routes()
                    .position(|r| r.route_id == d.route_id)
            })
            .and_then(|i| i32::try_from(i).ok())
            .unwrap_or(-1)
    }

    /// The planned global ordinal, or -1.
    pub fn ordinal(&self) -> f64 {
        self.field(|d| d.ordinal)
    }

    /// The planned per-route ordinal, or -1.
    pub fn route_ordinal(&self) -> f64 {
        self.field(|d| d.route_ordinal)
    }

    /// The planned earliest start, ms, or -1.
    pub fn not_before_ms(&self) -> f64 {
        self.field(|d| d.not_before_ms)
    }

    /// The planned delay from the previous completion, ms, or -1.
    pub fn delay_ms(&self) -> f64 {
        self.field(|d| d.delay_ms)
    }

    /// The planned reservation, or -1.
    pub fn reserve_cost(&self) -> f64 {
        self.field(|d| d.reserve_cost)
    }

    /// The bounded Retry-After floor of the planned delay, ms, or -1.
    pub fn retry_after_floor_ms(&self) -> f64 {
        self.field(|d| d.retry_after_floor_ms)
    }

    /// The jitter interval's lower end, or -1 without jitter.
    pub fn jitter_min_ms(&self) -> f64 {
        opt_num(self.dispatch().and_then(|d| d.jitter_min_ms))
    }

    /// The jitter interval's upper end, or -1 without jitter.
    pub fn jitter_max_ms(&self) -> f64 {
        opt_num(self.dispatch().and_then(|d| d.jitter_max_ms))
    }

    /// The jitter sample, or -1 without jitter.
    pub fn jitter_sample_ms(&self) -> f64 {
        opt_num(self.dispatch().and_then(|d| d.jitter_sample_ms))
    }

    /// Record the planned attempt: run-clock start and completion, actual cost,
    /// the outcome's index and its Retry-After hint (-1 for none). Drift is an
    /// error and leaves the run unchanged.
    pub fn record(
        &mut self,
        started_at_ms: f64,
        completed_at_ms: f64,
        cost: f64,
        outcome: u32,
        retry_after_ms: f64,
    ) -> Out<()> {
        let observed = || -> retryledger_core::Result<(u64, u64, u64, Outcome)> {
            let started = safe_integer(started_at_ms, "started_at_ms")?;
            let completed = safe_integer(completed_at_ms, "completed_at_ms")?;
            let cost = safe_integer(cost, "cost")?;
            let hint = if retry_after_ms < 0.0 {
                None
            } else {
                Some(safe_integer(retry_after_ms, "retry_after_ms")?)
            };
            let mut outcome = usize::try_from(outcome)
                .ok()
                .and_then(|i| OUTCOMES.get(i).copied())
                .ok_or_else(|| Error::at(ErrorCode::InvalidValue, "/outcome", "no such outcome"))?;
            if let Outcome::Retryable { retry_after_ms, .. } = &mut outcome {
                *retry_after_ms = hint;
            }
            Ok((started, completed, cost, outcome))
        };
        let (started, completed, cost, outcome) = lift(observed())?;
        lift(
            self.session
                .record(started, completed, cost, outcome)
                .map(|_| ()),
        )
    }

    /// Mark the run cancelled between attempts at `at_ms` on the run clock.
    pub fn cancel(&mut self, at_ms: f64) -> Out<()> {
        let at = lift(safe_integer(at_ms, "cancelled_at_ms"))?;
        lift(self.session.cancel(at))
    }

    /// The receipt of the finished run as JSON.
    pub fn receipt_json(&self) -> Out<String> {
        lift(self.session.receipt().map(|r| canonical_json(&r)))
    }

    /// The attempts so far as JSON.
    pub fn attempts_json(&self) -> String {
        canonical_json(self.session.attempts())
    }
}
