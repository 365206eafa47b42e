//! RFC 8785 (JCS) canonical JSON and SHA-256 digests of documents.
//!
//! A document's digest is lowercase hex SHA-256 over its canonical JSON. The
//! core never hashes bytes a host serialized: it re-encodes the typed value.
//!
//! Documents hold only objects, arrays, strings, booleans and integers in
//! 0..=2^53-1, so JCS reduces to: keys sorted by UTF-16 code units, no
//! whitespace, integers in plain decimal, and JSON string escaping with
//! `\b \t \n \f \r \" \\` and `\u00xx` (lowercase hex) for other controls.
//! Every document struct declares its fields in that sorted order, so the
//! serde encoding of a document already *is* its JCS form; a test checks
//! this against [`to_jcs`] for every document type.

use std::io::Write;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON (RFC 8785) of any JSON value holding integers only.
pub fn to_jcs(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                if let Some(v) = map.get(key) {
                    write_value(v, out);
                }
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let b = c as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX.get(b >> 4).copied().unwrap_or(b'0')));
                out.push(char::from(HEX.get(b & 0xf).copied().unwrap_or(b'0')));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len().saturating_mul(2));
    for b in bytes {
        s.push(char::from(
            HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'),
        ));
        s.push(char::from(
            HEX.get(usize::from(b & 0xf)).copied().unwrap_or(b'0'),
        ));
    }
    s
}

/// Lowercase hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Canonical JSON text of a document.
pub fn canonical_json<T: Serialize>(doc: &T) -> String {
    // Documents serialize in sorted-field order, so serde's compact output is JCS.
    serde_json::to_string(doc).unwrap_or_default()
}

/// Digest of a document: lowercase hex SHA-256 of its canonical JSON, streamed.
pub fn digest_of<T: Serialize>(doc: &T) -> String {
    let mut w = HashWriter(Sha256::new());
    // Serializing our own types into a hasher cannot fail: no maps with
    // non-string keys, no I/O errors from the writer.
    let _ = serde_json::to_writer(&mut w, doc);
    hex(&w.0.finalize())
}

/// Digest of any JSON value in normal form (keys sorted by JCS).
pub fn digest_value(value: &Value) -> String {
    sha256_hex(to_jcs(value).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jcs_sorts_keys_and_escapes() {
        let v: Value =
            serde_json::from_str(r#"{"b":1,"a":"x\u0001\n\"é","c":[true,{"z":0,"y":1}]}"#).unwrap();
        assert_eq!(
            to_jcs(&v),
            "{\"a\":\"x\\u0001\\n\\\"é\",\"b\":1,\"c\":[true,{\"y\":1,\"z\":0}]}"
        );
    }

    #[test]
    fn utf16_key_order() {
        // U+FB33 sorts after U+1D11E (a surrogate pair) in UTF-16, before it in UTF-8.
        let v: Value = serde_json::from_str("{\"\u{fb33}\":1,\"\u{1d11e}\":2}").unwrap();
        assert_eq!(to_jcs(&v), "{\"\u{1d11e}\":2,\"\u{fb33}\":1}");
    }

    #[test]
    fn sha256_known_answer() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
