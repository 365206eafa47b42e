//! Policies and runs: compile, validate, build and bind a policy; plan,
//! evaluate, seal and verify a run; digests, repair chains and prices.

use serde_json::Value;

use crate::attempt::{Attempts, AttemptsSchema};
use crate::canonical::digest_of;
use crate::decode::{from_str, from_value, parse_strict};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate as run;
use crate::policy::{compile, CompiledPolicy, Policy, PolicySchema};
use crate::receipt::{verify_bundle, Bundle, BundleSchema, Receipt, ReceiptSchema};

use super::out;

/// `next_repair`: the policy of the next repair of a chain
/// ([`crate::repair::next_repair`]): `links_json` is a JSON array of
/// `retryledger.repair_chain.v1` links (the root run first).
pub fn next_repair(
    links_json: &str,
    request_sha256: &str,
    idempotency_key_sha256: &str,
    started_at_ms: u64,
) -> Result<String> {
    let chain = from_str::<crate::repair::RepairChain>(&format!(
        "{{\"links\":{links_json},\"schema\":\"retryledger.repair_chain.v1\"}}"
    ))?;
    let digest = |name: &str, v: &str| {
        crate::ids::Sha256Hex::parse(v)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, format!("/{name}"), m))
    };
    let policy = crate::repair::next_repair(
        &chain.links,
        &digest("request_sha256", request_sha256)?,
        &digest("idempotency_key_sha256", idempotency_key_sha256)?,
        started_at_ms,
    )?;
    Ok(out(&policy))
}

/// `repair_step`: what may follow a chain's last run (`links_json`, the
/// root run first), for a request whose root run sent the raw key
/// `root_key` (scoped by `tenant` and `operation` when given): `null` when
/// the last run's end stands, else the repair that may follow as
/// `{"idempotency_key", "idempotency_key_sha256", "repair_ordinal"}`
/// (its key `<root_key>:repair:<n>`, [`crate::repair::repair_key`]).
/// Whether it is within the policy's bounds is [`next_repair`]'s answer.
pub fn repair_step(
    links_json: &str,
    root_key: &str,
    tenant: Option<&str>,
    operation: Option<&str>,
) -> Result<String> {
    let chain = from_str::<crate::repair::RepairChain>(&format!(
        "{{\"links\":{links_json},\"schema\":\"retryledger.repair_chain.v1\"}}"
    ))?;
    let Some(ordinal) = crate::repair::next_repair_ordinal(&chain.links) else {
        return Ok("null".to_owned());
    };
    let key = crate::repair::repair_key(root_key, ordinal);
    let digest = crate::request::idempotency_key_sha256(&key, tenant, operation)?;
    let mut text = String::from("{\"idempotency_key\":");
    text.push_str(&crate::canonical::to_jcs(&serde_json::Value::String(key)));
    text.push_str(",\"idempotency_key_sha256\":\"");
    text.push_str(&digest);
    text.push_str("\",\"repair_ordinal\":");
    text.push_str(&ordinal.to_string());
    text.push('}');
    Ok(text)
}

/// `verify_repair_chain`: replay a `retryledger.repair_chain.v1`
/// ([`crate::repair::verify_chain`]).
pub fn verify_repair_chain(chain_json: &str) -> Result<String> {
    let chain = crate::decode::from_str_within::<crate::repair::RepairChain>(
        chain_json,
        crate::limits::MAX_BUNDLE_BYTES,
    )?;
    Ok(out(&crate::repair::verify_chain(&chain)?))
}

/// Decode and validate a policy.
pub fn compile_policy(policy_json: &str) -> Result<CompiledPolicy> {
    compile(from_str::<Policy>(policy_json).map_err(|e| not_a_policy(policy_json, e))?)
}

/// A document of another schema given where a policy belongs is told what
/// it is and what to do with it, rather than its first unknown field.
fn not_a_policy(text: &str, e: Error) -> Error {
    if !matches!(
        e.code,
        ErrorCode::UnknownField | ErrorCode::MissingField | ErrorCode::SchemaMismatch
    ) {
        return e;
    }
    let Ok(Value::Object(map)) = crate::decode::parse_strict(text) else {
        return e;
    };
    match map.get("schema").and_then(Value::as_str) {
        Some("retryledger.policy_spec.v1") => Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            "this is a policy spec (retryledger.policy_spec.v1), not a policy: build it with \
             build_policy (buildPolicy), or compile it once with compile_policy_template \
             (compilePolicyTemplate)",
        ),
        Some("retryledger.bundle.v1") => Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            "this is a bundle (retryledger.bundle.v1), not a policy: its policy is its `policy` field; \
             replay it with verify_bundle",
        ),
        _ => e,
    }
}

/// Decode an attempts document.
pub fn decode_attempts(attempts_json: &str) -> Result<Attempts> {
    from_str(attempts_json)
}

/// `validate_policy`: the policy digest, or the first rule it breaks.
pub fn validate_policy(policy_json: &str) -> Result<String> {
    Ok(compile_policy(policy_json)?.policy_sha256)
}

/// `plan_next` against a compiled policy: a `dispatch` or `terminal` decision as JSON.
pub fn plan_next_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    Ok(out(&run::plan_next(
        policy,
        &decode_attempts(attempts_json)?,
    )?))
}

/// `plan_next`: a `dispatch` or `terminal` decision as JSON.
pub fn plan_next(policy_json: &str, attempts_json: &str) -> Result<String> {
    plan_next_compiled(&compile_policy(policy_json)?, attempts_json)
}

/// `evaluate` against a compiled policy: the receipt as JSON.
pub fn evaluate_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    Ok(out(&run::evaluate(
        policy,
        &decode_attempts(attempts_json)?,
    )?))
}

/// `evaluate`: the receipt as JSON.
pub fn evaluate(policy_json: &str, attempts_json: &str) -> Result<String> {
    evaluate_compiled(&compile_policy(policy_json)?, attempts_json)
}

/// Seal a finished run against a compiled policy: the bundle as JSON.
pub fn seal_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    let attempts = decode_attempts(attempts_json)?;
    let receipt = run::evaluate(policy, &attempts)?;
    Ok(out(&Bundle::new(policy.policy.clone(), attempts, receipt)))
}

/// `verify_bundle`: a `verified` or `drift` verdict as JSON.
pub fn verify(bundle_json: &str) -> Result<String> {
    let bundle =
        crate::decode::from_str_within::<Bundle>(bundle_json, crate::limits::MAX_BUNDLE_BYTES)?;
    Ok(out(&verify_bundle(&bundle)?))
}

/// `digest`: the SHA-256 of a document's canonical JSON, after strict decoding
/// into the type its `schema` names, so only documents in normal form hash.
pub fn digest(document_json: &str) -> Result<String> {
    // A bundle may carry a long stream event log: it alone may exceed the
    // common input limit, up to its own.
    if document_json.len() > crate::limits::MAX_INPUT_BYTES {
        let bundle = crate::decode::from_str_within::<Bundle>(
            document_json,
            crate::limits::MAX_BUNDLE_BYTES,
        )
        .map_err(|e| match e.code {
            ErrorCode::InputTooLarge => e,
            _ => Error::new(
                ErrorCode::InputTooLarge,
                format!(
                    "input is {} bytes; only a bundle may exceed {}",
                    document_json.len(),
                    crate::limits::MAX_INPUT_BYTES
                ),
            ),
        })?;
        return Ok(digest_of(&bundle));
    }
    let value = match parse_strict(document_json) {
        Ok(v) => v,
        // Only a logical request may hold floats and nulls (full RFC 8785);
        // anything else keeps the strict reader's error.
        Err(strict) => {
            return match crate::parse::parse_any_sized(document_json) {
                Ok(v) if schema_of(&v) == Some(crate::request::REQUEST_SCHEMA) => {
                    Ok(crate::request::check_request(v)?.sha256())
                }
                _ => Err(strict),
            }
        }
    };
    let schema = match &value {
        Value::Object(map) => map.get("schema").and_then(Value::as_str).map(str::to_owned),
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidType,
                "a document is a JSON object",
            ))
        }
    };
    let Some(schema) = schema else {
        return Err(Error::at(
            ErrorCode::MissingField,
            "/schema",
            "a document names its `schema`",
        ));
    };
    match schema.as_str() {
        crate::request::REQUEST_SCHEMA => Ok(crate::request::check_request(value)?.sha256()),
        PolicySchema::NAME => Ok(digest_of(&from_value::<Policy>(value)?)),
        AttemptsSchema::NAME => Ok(digest_of(&from_value::<Attempts>(value)?)),
        ReceiptSchema::NAME => Ok(digest_of(&from_value::<Receipt>(value)?)),
        BundleSchema::NAME => Ok(digest_of(&from_value::<Bundle>(value)?)),
        crate::price::PriceScheduleSchema::NAME => Ok(digest_of(&from_value::<
            crate::price::PriceSchedule,
        >(value)?)),
        crate::builder::RouteReleaseSchema::NAME => Ok(digest_of(&from_value::<
            crate::builder::RouteRelease,
        >(value)?)),
        crate::builder::BehaviorClassSchema::NAME => Ok(digest_of(&from_value::<
            crate::builder::BehaviorClass,
        >(value)?)),
        crate::stream::StreamEventSchema::NAME => {
            Ok(digest_of(&from_value::<crate::stream::StreamEvent>(value)?))
        }
        crate::breaker::BreakerSchema::NAME => Ok(digest_of(&from_value::<
            crate::breaker::BreakerSnapshot,
        >(value)?)),
        crate::budget::RetryBudgetSchema::NAME => Ok(digest_of(&from_value::<
            crate::budget::RetryBudgetSnapshot,
        >(value)?)),
        crate::admission::AdmissionSchema::NAME => Ok(digest_of(&from_value::<
            crate::admission::AdmissionSnapshot,
        >(value)?)),
        crate::journal::JournalEventSchema::NAME => Ok(digest_of(&from_value::<
            crate::journal::JournalEvent,
        >(value)?)),
        crate::idempotency::IdempotencyRecordSchema::NAME => Ok(digest_of(&from_value::<
            crate::idempotency::IdempotencyRecord,
        >(value)?)),
        other => Err(Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            format!(
                "`{}` is not a retryledger document schema",
                other.chars().take(80).collect::<String>()
            ),
        )),
    }
}

/// `build_policy`: a logical request and a policy spec (catalog documents in
/// place of digests, routes in priority order) in, the validated policy's
/// canonical JSON out; every digest computed here.
pub fn build_policy(request_json: &str, spec_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    Ok(out(&crate::builder::build_policy(&request, spec)?.policy))
}

/// `compile_policy_template`: a policy spec without `idempotency_key_sha256`
/// compiled once ([`crate::template::PolicyTemplate`]).
pub fn compile_policy_template(spec_json: &str) -> Result<crate::template::PolicyTemplate> {
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    crate::template::PolicyTemplate::compile(spec)
}

/// `bind_policy_template`: the policy of one call (a logical request and the
/// idempotency key's digest), exactly what `build_policy` returns for the
/// spec with that key.
pub fn bind_policy_template(
    template: &crate::template::PolicyTemplate,
    request_json: &str,
    idempotency_key_sha256: &str,
) -> Result<crate::template::BoundPolicy> {
    let request = crate::request::parse_request(request_json)?;
    Ok(template.bind_json(&request, &key_digest(idempotency_key_sha256)?))
}

/// `bind_policy_template` as a compiled policy (for a session) and its
/// canonical JSON.
pub fn bind_policy_template_compiled(
    template: &crate::template::PolicyTemplate,
    request_json: &str,
    idempotency_key_sha256: &str,
) -> Result<(CompiledPolicy, String)> {
    let request = crate::request::parse_request(request_json)?;
    Ok(template.bind_both(&request, &key_digest(idempotency_key_sha256)?))
}

/// [`bind_policy_template_compiled`] with the bound logical request, which a
/// host keeps to check each call it sends ([`crate::lift::check_sent`]).
pub fn bind_policy_template_request(
    template: &crate::template::PolicyTemplate,
    request_json: &str,
    idempotency_key_sha256: &str,
) -> Result<(CompiledPolicy, String, crate::request::Request)> {
    let request = crate::request::parse_request(request_json)?;
    let (compiled, json) = template.bind_both(&request, &key_digest(idempotency_key_sha256)?);
    Ok((compiled, json, request))
}

fn key_digest(hex: &str) -> Result<crate::ids::Sha256Hex> {
    crate::ids::Sha256Hex::parse(hex)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/idempotency_key_sha256", m))
}

/// `check_price_schedule`: a price schedule checked against a policy before
/// any dispatch (the same cost unit, every route release priced once); its
/// digest, which a receipt binds.
pub fn check_price_schedule(policy_json: &str, schedule_json: &str) -> Result<String> {
    let policy = compile_policy(policy_json)?;
    let schedule = from_str::<crate::price::PriceSchedule>(schedule_json)?;
    crate::price::check_schedule(&policy.policy, &schedule)?;
    Ok(digest_of(&schedule))
}

/// `price_cost`: what `usage` (units by kind) costs on a route release under
/// a price schedule: the sum of `ceil(units * price / 10^6)`.
pub fn price_cost(
    schedule_json: &str,
    route_release_sha256: &str,
    usage_json: &str,
) -> Result<u64> {
    let schedule = from_str::<crate::price::PriceSchedule>(schedule_json)?;
    let release = crate::ids::Sha256Hex::parse(route_release_sha256)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/route_release_sha256", m))?;
    let usage = from_str::<crate::price::Units>(usage_json)?;
    crate::price::cost(&schedule, &release, &usage)
}

fn schema_of(v: &Value) -> Option<&str> {
    v.as_object()?.get("schema")?.as_str()
}
