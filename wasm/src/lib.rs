//! WebAssembly bindings of retryledger-core (built only for wasm32).
//!
//! Thin glue over [`retryledger_core::api`]: JSON text in, JSON text out. A
//! failure is thrown as the core's `error_json` string (code, family, message,
//! path, attempt index); the TypeScript layer of the npm package parses it and
//! throws a typed `Error` subclass. Numbers that cross as JavaScript numbers
//! are checked here to be integers in 0..=2^53-1, so nothing becomes a BigInt
//! and no input can trap.
#![cfg(target_arch = "wasm32")]

use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, sha256_hex as sha256};
use retryledger_core::error::{Error, ErrorCode};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use retryledger_core::CompiledPolicy;
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
    inner: CompiledPolicy,
}

#[wasm_bindgen]
impl Compiled {
    /// Decode and validate a policy.
    pub fn compile(policy: &str) -> Out<Compiled> {
        Ok(Compiled {
            inner: lift(api::compile_policy(policy))?,
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
}
