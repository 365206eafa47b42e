//! The logical request (`retryledger.request.v1`) and scoped idempotency keys.
//!
//! A logical request is what a host means to ask, before any route lowers it
//! to a provider's wire format: the operation, the input (messages), tools,
//! the output contract, sampling, a seed and the modalities. Unlike the other
//! documents it holds arbitrary JSON (floats and `null` included), so its
//! canonical form is full RFC 8785: numbers are IEEE 754 doubles written as
//! ECMAScript writes them (`1e21`, `5e-324`, `-0` as `0`). Its digest is the
//! policy's `logical_request_sha256`.
//!
//! An idempotency key is never stored: documents hold its digest. A bare key
//! digests as `sha256(key)`; a scoped key as the SHA-256 of the canonical JSON
//! of `{"key", "operation", "tenant"}`, so the same key in two tenants or two
//! operations never collides.

use serde_json::{Map, Value};

use crate::canonical::{sha256_hex, to_jcs};
use crate::decode::At;
use crate::error::{Error, ErrorCode, Result};
use crate::limits::{MAX_ID_BYTES, MAX_SAFE_INTEGER};

/// The request document's schema string.
pub const REQUEST_SCHEMA: &str = "retryledger.request.v1";

/// The fields of a request, in canonical order, and whether each is required.
/// `input` is required of a request without `messages`; a request with
/// `messages` is a conversation ([`crate::lower::model`]) and has no `input`.
const FIELDS: &[(&str, bool)] = &[
    ("input", false),
    ("max_output_tokens", false),
    ("messages", false),
    ("modalities", false),
    ("operation", true),
    ("output_contract", false),
    ("reasoning", false),
    ("response_format", false),
    ("sampling", false),
    ("schema", true),
    ("seed", false),
    ("stop", false),
    ("system", false),
    ("tools", false),
];

/// A checked logical request: its value and canonical JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The document, as parsed.
    pub value: Value,
    /// Its RFC 8785 canonical JSON.
    pub canonical: String,
}

impl Request {
    /// The digest: `logical_request_sha256`.
    pub fn sha256(&self) -> String {
        sha256_hex(self.canonical.as_bytes())
    }
}

/// Parse and check a request from JSON text (floats and `null` allowed
/// inside; duplicate keys, lone surrogates, non-finite numbers, oversize
/// input and deep nesting are errors).
pub fn parse_request(text: &str) -> Result<Request> {
    check_request(crate::parse::parse_any_sized(text)?)
}

/// Check a parsed request value.
pub fn check_request(value: Value) -> Result<Request> {
    let Value::Object(map) = &value else {
        return Err(Error::new(
            ErrorCode::InvalidType,
            "a request is a JSON object",
        ));
    };
    check_fields(map)?;
    let canonical = to_jcs(&value);
    Ok(Request { value, canonical })
}

fn check_fields(map: &Map<String, Value>) -> Result<()> {
    let root = At::Root;
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    if let Some(k) = keys
        .iter()
        .find(|k| !FIELDS.iter().any(|(name, _)| *name == k.as_str()))
    {
        return Err(At::Key(&root, k).error(
            ErrorCode::UnknownField,
            format!("unknown field `{}`", k.chars().take(80).collect::<String>()),
        ));
    }
    if !map.contains_key("messages") && !map.contains_key("input") {
        return Err(root.error(ErrorCode::MissingField, "missing field `input`"));
    }
    if let Some((name, _)) = FIELDS
        .iter()
        .find(|(name, required)| *required && !map.contains_key(*name))
    {
        return Err(root.error(ErrorCode::MissingField, format!("missing field `{name}`")));
    }
    if !map.contains_key("messages") {
        if let Some(name) = crate::lower::model::CONVERSATION_ONLY
            .iter()
            .find(|k| map.contains_key(**k))
        {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                format!("/{name}"),
                format!("`{name}` belongs to a request with `messages`"),
            ));
        }
    }
    match map.get("schema") {
        Some(Value::String(s)) if s == REQUEST_SCHEMA => {}
        Some(Value::String(_)) => {
            return Err(Error::at(
                ErrorCode::SchemaMismatch,
                "/schema",
                format!("expected `{REQUEST_SCHEMA}`"),
            ))
        }
        _ => {
            return Err(Error::at(
                ErrorCode::InvalidType,
                "/schema",
                "expected a string",
            ))
        }
    }
    match map.get("operation") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_ID_BYTES => {}
        Some(Value::String(_)) => {
            return Err(Error::at(
                ErrorCode::InvalidIdentifier,
                "/operation",
                format!("an operation is 1 to {MAX_ID_BYTES} bytes"),
            ))
        }
        _ => {
            return Err(Error::at(
                ErrorCode::InvalidType,
                "/operation",
                "expected a string",
            ))
        }
    }
    if let Some(seed) = map.get("seed") {
        let whole = seed
            .as_f64()
            .is_some_and(|x| x >= 0.0 && x.fract() == 0.0 && x <= MAX_SAFE_INTEGER as f64);
        if !whole {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/seed",
                "a seed is an integer in 0..=2^53-1",
            ));
        }
    }
    if map.contains_key("messages") {
        crate::lower::model::conversation(map)?;
        return Ok(());
    }
    for name in ["modalities", "sampling"] {
        if let Some(v) = map.get(name) {
            if !v.is_object() {
                return Err(Error::at(
                    ErrorCode::InvalidType,
                    format!("/{name}"),
                    "expected an object",
                ));
            }
        }
    }
    Ok(())
}

/// The digest of an idempotency key: `sha256(key)` for a bare key, or the
/// digest of `{"key", "operation", "tenant"}` when both scope fields are given.
pub fn idempotency_key_sha256(
    key: &str,
    tenant: Option<&str>,
    operation: Option<&str>,
) -> Result<String> {
    match (tenant, operation) {
        (None, None) => Ok(sha256_hex(key.as_bytes())),
        (Some(tenant), Some(operation)) => {
            let mut map = Map::new();
            map.insert("key".to_owned(), Value::String(key.to_owned()));
            map.insert("operation".to_owned(), Value::String(operation.to_owned()));
            map.insert("tenant".to_owned(), Value::String(tenant.to_owned()));
            Ok(sha256_hex(to_jcs(&Value::Object(map)).as_bytes()))
        }
        _ => Err(Error::new(
            ErrorCode::InvalidValue,
            "a scoped idempotency key names both its tenant and its operation",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        to_jcs(&crate::parse::parse_any(text).unwrap())
    }

    #[test]
    fn numbers_are_written_as_ecmascript_writes_them() {
        for (input, want) in [
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("5e-324", "5e-324"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("9007199254740991", "9007199254740991"),
            ("9007199254740993", "9007199254740992"),
            ("1.0", "1"),
            ("1E2", "100"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("-1.5", "-1.5"),
        ] {
            assert_eq!(
                canonical(&format!("[{input}]")),
                format!("[{want}]"),
                "{input}"
            );
        }
    }

    #[test]
    fn nulls_and_floats_are_allowed_but_not_garbage() {
        assert_eq!(canonical(r#"{"b":null,"a":0.5}"#), r#"{"a":0.5,"b":null}"#);
        for bad in [
            "[1e400]",
            "[NaN]",
            "[Infinity]",
            r#"["\ud800"]"#,
            r#"{"a":1,"a":2}"#,
        ] {
            assert!(crate::parse::parse_any(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_scoped_and_never_stored() {
        let bare = idempotency_key_sha256("k", None, None).unwrap();
        assert_eq!(bare, sha256_hex(b"k"));
        let a = idempotency_key_sha256("k", Some("t1"), Some("chat")).unwrap();
        let b = idempotency_key_sha256("k", Some("t2"), Some("chat")).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a,
            sha256_hex(br#"{"key":"k","operation":"chat","tenant":"t1"}"#)
        );
        assert!(idempotency_key_sha256("k", Some("t1"), None).is_err());
    }

    #[test]
    fn requests_are_checked() {
        let ok = r#"{"schema":"retryledger.request.v1","operation":"chat","input":[{"role":"user","content":"hi"}],"sampling":{"temperature":0.2},"seed":7}"#;
        let r = parse_request(ok).unwrap();
        assert_eq!(r.sha256(), sha256_hex(r.canonical.as_bytes()));
        let e =
            parse_request(r#"{"schema":"retryledger.request.v1","operation":"chat"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::MissingField);
        let e = parse_request(
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":1,"model":"x"}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::UnknownField, Some("/model"))
        );
        let e = parse_request(
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":1,"seed":1.5}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidValue);
    }
}
