//! Logical requests and what a host observed: lifting, digests and
//! idempotency keys, lowering per route, Retry-After and outcome judgement.

use crate::decode::from_str;
use crate::error::{Error, ErrorCode, Result};
use crate::http::{self, HttpObservation, RetryAfterHeader};

use super::out;

/// `lift_request`: a provider SDK call's parameters (`call` names it, e.g.
/// `openai.chat.completions`) split into the logical request, returned as
/// canonical JSON; the model and transport options stay out of it.
pub fn lift_request(call: &str, params_json: &str) -> Result<String> {
    Ok(crate::lift::lift(call, params_json)?.canonical)
}

/// `request_sha256`: the logical request's digest (`logical_request_sha256`)
/// over its full RFC 8785 canonical form.
pub fn request_sha256(request_json: &str) -> Result<String> {
    Ok(crate::request::parse_request(request_json)?.sha256())
}

/// `canonical_request`: the logical request's RFC 8785 canonical JSON.
pub fn canonical_request(request_json: &str) -> Result<String> {
    Ok(crate::request::parse_request(request_json)?.canonical)
}

/// `idempotency_key_sha256`: a bare key's `sha256(key)`, or a scoped key's
/// digest when both `tenant` and `operation` are given.
pub fn idempotency_key_sha256(
    key: &str,
    tenant: Option<&str>,
    operation: Option<&str>,
) -> Result<String> {
    crate::request::idempotency_key_sha256(key, tenant, operation)
}

/// `parse_retry_after` with the header named as `retry-after` or `retry-after-ms`.
pub fn parse_retry_after(header: &str, value: &str, now_unix_ms: u64, cap_ms: u64) -> Result<u64> {
    let header = match header.to_ascii_lowercase().as_str() {
        "retry-after" => RetryAfterHeader::RetryAfter,
        "retry-after-ms" => RetryAfterHeader::RetryAfterMs,
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidValue,
                "header must be `retry-after` or `retry-after-ms`",
            ))
        }
    };
    http::parse_retry_after(header, value, now_unix_ms, cap_ms)
}

/// `classify_http`: an observation document in, an outcome as JSON out.
pub fn classify_http(observation_json: &str) -> Result<String> {
    Ok(out(&http::classify_http(&from_str::<HttpObservation>(
        observation_json,
    )?)?))
}

/// `judge`: a host's facts about one attempt in, the judgement (`outcome`
/// and the deciding `rule`) as JSON out.
pub fn judge(facts_json: &str) -> Result<String> {
    Ok(out(&crate::observe::judge(&from_str::<
        crate::observe::Facts,
    >(facts_json)?)?))
}

/// `lower_request`: a logical request with `messages` lowered for a route
/// release (`retryledger.route_release.v1` with `lowering` settings) under
/// `options_json` (`{"provider_bound_parts": "refuse" | "drop"}`, each field
/// optional): `{"api", "body", "body_sha256", "model", "notes"}`, or the
/// coded reason the route cannot serve it ([`crate::lower`]).
pub fn lower_request(request_json: &str, release_json: &str, options_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let release = from_str::<crate::builder::RouteRelease>(release_json)?;
    let options = from_str::<crate::lower::LowerOptions>(options_json)?;
    let lowered = crate::lower::lower(
        &request,
        &release,
        options.provider_bound_parts.unwrap_or_default(),
    )?;
    Ok(crate::canonical::to_jcs(&lowered.to_json()))
}

/// `route_capabilities`: for a logical request and a policy spec, whether each
/// route can serve the request, and if not the coded reason and its JSON
/// Pointer in the request: `{"routes": [{"route_id", "capable", "code"?, "path"?}]}`.
pub fn route_capabilities(request_json: &str, spec_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    let report = crate::lower::route_report(&request, &spec.routes, spec.provider_bound_parts)?;
    Ok(crate::canonical::to_jcs(&report))
}

/// `lower_routes`: for a logical request and a policy spec, the request
/// lowered for each route that can serve it, in the spec's order:
/// `{"routes": [{"route_id", "lowered"}]}`, `lowered` as [`lower_request`]
/// answers ([`crate::lower::lowered_routes`]).
pub fn lower_routes(request_json: &str, spec_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    let routes = crate::lower::lowered_routes(&request, &spec.routes, spec.provider_bound_parts)?;
    Ok(crate::canonical::to_jcs(&routes))
}
