//! The receiver's guard: the `Idempotency-Key` header rule and the digests
//! of the HTTP request and response documents ([`crate::receiver`]).

use serde_json::Value;

use crate::decode::parse_strict;
use crate::error::{Error, ErrorCode, Result};

/// `check_idempotency_header`: `Ok` for an `Idempotency-Key` header value
/// the guard takes, `idempotency_key_invalid` otherwise.
pub fn check_idempotency_header(raw: &str) -> Result<()> {
    crate::receiver::check_header_key(raw)
}

/// `http_request_sha256`: the digest of a request as received (its method,
/// path and query, and body bytes).
#[must_use]
pub fn http_request_sha256(method: &str, target: &str, body: &[u8]) -> String {
    crate::receiver::http_request_sha256(method, target, body)
}

/// `http_response_sha256`: the digest of a response as sent: its status,
/// the kept headers (a JSON array of `[name, value]` string pairs, names in
/// lower case) and the body bytes.
pub fn http_response_sha256(status: u64, headers_json: &str, body: &[u8]) -> Result<String> {
    let headers = header_pairs(&parse_strict(headers_json).map_err(|e| e.under("/headers"))?)?;
    crate::receiver::http_response_sha256(status, &headers, body)
}

fn header_pairs(v: &Value) -> Result<Vec<(String, String)>> {
    let bad = |i: usize| {
        Error::at(
            ErrorCode::InvalidType,
            format!("/headers/{i}"),
            "a kept header is a [name, value] pair of strings",
        )
    };
    let Some(items) = v.as_array() else {
        return Err(Error::at(
            ErrorCode::InvalidType,
            "/headers",
            "the kept headers are an array of [name, value] pairs",
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_array().map(Vec::as_slice) {
            Some([Value::String(n), Value::String(v)]) => Ok((n.clone(), v.clone())),
            _ => Err(bad(i)),
        })
        .collect()
}
