//! A policy template: a spec compiled once, bound to each call's request.
//!
//! A policy binds one logical request and one idempotency key, so a host
//! that decorates a function once serves many policies. [`PolicyTemplate`]
//! does the spec's work once — decoding, presets, catalog digests, every
//! validation rule of [`crate::policy::compile`] (none of which reads the two
//! per-call digests) — and keeps the policy's canonical JSON with the two
//! digests cut out. [`PolicyTemplate::bind`] digests the request, splices
//! both digests into the text and hashes it: the same document and digest as
//! [`crate::builder::build_policy`] on the same spec, request and key.

use crate::builder::{assemble, PolicySpec};
use sha2::{Digest, Sha256};

use crate::canonical::{canonical_json, hex, sha256_hex};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Sha256Hex;
use crate::policy::{compile, CompiledPolicy};
use crate::request::Request;

const KEY_FIELD: &str = "\"idempotency_key_sha256\":\"";
const REQUEST_FIELD: &str = "\"logical_request_sha256\":\"";

/// A compiled spec without a request or key; [`PolicyTemplate::bind`] adds them.
#[derive(Debug, Clone)]
pub struct PolicyTemplate {
    compiled: CompiledPolicy,
    /// The canonical text around the two digests; `None` when a section
    /// repeats a field name, and each bind re-encodes.
    pieces: Option<Pieces>,
}

/// The constant parts of the policy's canonical text, and the hash state
/// after the first one, so that a bind hashes only what follows it.
#[derive(Debug, Clone)]
struct Pieces {
    /// Before the key digest (`idempotency_key_sha256` sorts first).
    head: String,
    /// Between the key digest and the request digest.
    middle: String,
    /// After the request digest.
    tail: String,
    /// SHA-256 over `head`.
    head_state: Sha256,
}

/// A bound policy: the canonical JSON and its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPolicy {
    /// The policy's canonical JSON (what `build_policy` returns).
    pub policy_json: String,
    /// Its digest.
    pub policy_sha256: String,
}

fn placeholder(c: char) -> Sha256Hex {
    Sha256Hex::computed(std::iter::repeat_n(c, 64).collect())
}

/// The text around `field` + 64 hex characters, when the field occurs once.
fn split_once<'a>(text: &'a str, field: &str) -> Option<(&'a str, &'a str)> {
    let at = text.find(field)?;
    if text.get(at.checked_add(1)?..)?.contains(field) {
        return None;
    }
    let value = at.checked_add(field.len())?;
    Some((text.get(..value)?, text.get(value.checked_add(64)?..)?))
}

impl PolicyTemplate {
    /// Compile `spec` once. The spec has no `idempotency_key_sha256`: each
    /// call binds its own.
    pub fn compile(spec: PolicySpec) -> Result<Self> {
        if spec.idempotency_key_sha256.is_some() {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/idempotency_key_sha256",
                "a template binds the idempotency key per call: leave it out of the spec",
            ));
        }
        // Which routes serve a request depends on the request when a route
        // is lowered: build_policy checks each request against them, a
        // template binds any request to the same routes.
        if let Some(i) = spec
            .routes
            .iter()
            .position(|r| r.release.lowering.is_some())
        {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                format!("/routes/{i}/release/lowering"),
                "a template binds every request to the same routes: a route with lowering settings is checked per request by build_policy",
            ));
        }
        let compiled = compile(assemble(spec, placeholder('f'), placeholder('0'))?)?;
        let text = canonical_json(&compiled.policy);
        let pieces = split_once(&text, KEY_FIELD).and_then(|(head, rest)| {
            let (middle, tail) = split_once(rest, REQUEST_FIELD)?;
            Some(Pieces {
                head: head.to_owned(),
                middle: middle.to_owned(),
                tail: tail.to_owned(),
                head_state: Sha256::new_with_prefix(head.as_bytes()),
            })
        });
        Ok(Self { compiled, pieces })
    }

    /// The policy for one call: `request` and the idempotency key's digest
    /// (bare or scoped, never the raw key).
    pub fn bind_json(&self, request: &Request, idempotency_key_sha256: &Sha256Hex) -> BoundPolicy {
        self.splice(&request.sha256(), idempotency_key_sha256.as_str())
    }

    /// [`PolicyTemplate::bind_json`] as a compiled policy, for a session.
    pub fn bind(&self, request: &Request, idempotency_key_sha256: &Sha256Hex) -> CompiledPolicy {
        self.bind_both(request, idempotency_key_sha256).0
    }

    /// The compiled policy of one call and its canonical JSON.
    pub fn bind_both(
        &self,
        request: &Request,
        idempotency_key_sha256: &Sha256Hex,
    ) -> (CompiledPolicy, String) {
        let request_sha256 = request.sha256();
        let bound = self.splice(&request_sha256, idempotency_key_sha256.as_str());
        let mut compiled = self.compiled.clone();
        compiled.policy.logical_request_sha256 = Sha256Hex::computed(request_sha256);
        compiled.policy.idempotency_key_sha256 = idempotency_key_sha256.clone();
        compiled.policy_sha256 = bound.policy_sha256;
        (compiled, bound.policy_json)
    }

    fn splice(&self, request_sha256: &str, key_sha256: &str) -> BoundPolicy {
        let Some(Pieces {
            head,
            middle,
            tail,
            head_state,
        }) = &self.pieces
        else {
            let mut policy = self.compiled.policy.clone();
            policy.logical_request_sha256 = Sha256Hex::computed(request_sha256.to_owned());
            policy.idempotency_key_sha256 = Sha256Hex::computed(key_sha256.to_owned());
            let text = canonical_json(&policy);
            let policy_sha256 = sha256_hex(text.as_bytes());
            return BoundPolicy {
                policy_json: text,
                policy_sha256,
            };
        };
        let mut text = String::with_capacity(
            head.len()
                .saturating_add(middle.len())
                .saturating_add(tail.len())
                .saturating_add(128),
        );
        text.push_str(head);
        text.push_str(key_sha256);
        text.push_str(middle);
        text.push_str(request_sha256);
        text.push_str(tail);
        // The head's hash state was kept at compile time: hash only the rest.
        let mut hasher = head_state.clone();
        hasher.update(text.get(head.len()..).unwrap_or_default().as_bytes());
        let policy_sha256 = hex(&hasher.finalize());
        BoundPolicy {
            policy_json: text,
            policy_sha256,
        }
    }
}
