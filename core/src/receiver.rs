//! What the receiver's guard identifies a request and a response by, and
//! the rule an `Idempotency-Key` header value follows (docs/RECEIVER.md).
//!
//! The guard keeps one idempotency record per scoped key
//! ([`crate::idempotency`]); the record holds the digest of the HTTP request
//! that claimed the key and, once it succeeded, the digest of the response
//! that was sent. Both are digests of small canonical documents, so every
//! host (and a store shared between them) computes the same ones:
//!
//! - `retryledger.http_request.v1`: `{body_sha256, method, schema, target}`,
//!   the method in upper case, the path and query as received, the SHA-256
//!   of the body's bytes. Headers are not part of it.
//! - `retryledger.http_response.v1`: `{body_sha256, headers, schema,
//!   status}`, the kept headers as `[name, value]` pairs with lower-case
//!   names, in the order given.

use serde_json::{json, Value};

use crate::canonical::{digest_value, sha256_hex};
use crate::error::{Error, ErrorCode, Result};

/// The schema of the request document.
pub const REQUEST_SCHEMA: &str = "retryledger.http_request.v1";
/// The schema of the response document.
pub const RESPONSE_SCHEMA: &str = "retryledger.http_response.v1";
/// The longest `Idempotency-Key` header value the guard takes.
pub const MAX_HEADER_KEY_LENGTH: usize = 255;
/// The lowest and highest HTTP status a response document holds.
const STATUS_RANGE: std::ops::RangeInclusive<u64> = 100..=999;

/// An `Idempotency-Key` header value the guard takes: 1 to
/// [`MAX_HEADER_KEY_LENGTH`] printable ASCII characters (space to `~`);
/// `idempotency_key_invalid` otherwise.
pub fn check_header_key(raw: &str) -> Result<()> {
    let printable = raw.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if raw.is_empty() || raw.len() > MAX_HEADER_KEY_LENGTH || !printable {
        return Err(Error::at(
            ErrorCode::IdempotencyKeyInvalid,
            "/idempotency_key",
            format!(
                "a key is 1 to {MAX_HEADER_KEY_LENGTH} printable ASCII characters (space to '~'); this one has {} bytes{}",
                raw.len(),
                if printable { "" } else { ", some outside that range" }
            ),
        ));
    }
    Ok(())
}

/// The request document of an HTTP request as received.
pub fn http_request(method: &str, target: &str, body: &[u8]) -> Value {
    json!({
        "body_sha256": sha256_hex(body),
        "method": method.to_ascii_uppercase(),
        "schema": REQUEST_SCHEMA,
        "target": target,
    })
}

/// The digest a claim compares: SHA-256 of [`http_request`]'s canonical JSON.
pub fn http_request_sha256(method: &str, target: &str, body: &[u8]) -> String {
    digest_value(&http_request(method, target, body))
}

/// The response document of a response as sent: `status` 100 to 999 and
/// the kept headers, each name in lower case (`invalid_value` otherwise).
pub fn http_response(status: u64, headers: &[(String, String)], body: &[u8]) -> Result<Value> {
    if !STATUS_RANGE.contains(&status) {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/status",
            format!("an HTTP status is 100 to 999, not {status}"),
        ));
    }
    if let Some(i) = headers
        .iter()
        .position(|(name, _)| name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()))
    {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            format!("/headers/{i}/0"),
            "a kept header's name is not empty and in lower case",
        ));
    }
    let pairs: Vec<Value> = headers.iter().map(|(n, v)| json!([n, v])).collect();
    Ok(json!({
        "body_sha256": sha256_hex(body),
        "headers": pairs,
        "schema": RESPONSE_SCHEMA,
        "status": status,
    }))
}

/// The digest a record keeps: SHA-256 of [`http_response`]'s canonical JSON.
pub fn http_response_sha256(
    status: u64,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<String> {
    http_response(status, headers, body).map(|d| digest_value(&d))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn the_key_rule_takes_printable_ascii_up_to_255_bytes() {
        assert!(check_header_key("order-42").is_ok());
        assert!(check_header_key(" ~").is_ok());
        assert!(check_header_key(&"k".repeat(255)).is_ok());
        for bad in ["", "tab\there", "ключ", "\u{7f}", &"k".repeat(256)] {
            let e = check_header_key(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::IdempotencyKeyInvalid, "{bad:?}");
        }
    }

    #[test]
    fn the_request_digest_ignores_the_method_case_only() {
        let a = http_request_sha256("post", "/orders?x=1", b"{}");
        assert_eq!(a, http_request_sha256("POST", "/orders?x=1", b"{}"));
        assert_ne!(a, http_request_sha256("POST", "/orders?x=2", b"{}"));
        assert_ne!(a, http_request_sha256("POST", "/orders?x=1", b"{ }"));
    }

    #[test]
    fn a_response_with_a_bad_status_or_header_name_is_refused() {
        assert_eq!(
            http_response_sha256(99, &[], b"").unwrap_err().code,
            ErrorCode::InvalidValue
        );
        let upper = [("Content-Type".to_owned(), "a".to_owned())];
        let e = http_response_sha256(200, &upper, b"").unwrap_err();
        assert_eq!(e.path.as_deref(), Some("/headers/0/0"));
    }
}
