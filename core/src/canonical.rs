//! RFC 8785 (JCS) canonical JSON and SHA-256 digests of documents.
//!
//! A document's digest is lowercase hex SHA-256 over its canonical JSON. The
//! core never hashes bytes a host serialized: it re-encodes the typed value.
//!
//! Documents hold only objects, arrays, strings, booleans and integers in
//! 0..=2^53-1, so JCS reduces to: keys sorted by UTF-16 code units, no
//! whitespace, integers in plain decimal, and JSON string escaping with
//! `\b \t \n \f \r \" \\` and `\u00xx` (lowercase hex) for other controls.
//! Every document type implements [`Encode`] by hand (a plain object through
//! the crate's `object!` macro), writing its fields in that sorted order, so
//! its encoding already *is* its JCS form; a test checks this against
//! [`to_jcs`] for every document type.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A document that writes itself, field by field in RFC 8785 key order, to a [`Sink`].
///
/// One hand-written encoding per type serves every output: canonical text
/// ([`canonical_json`]), digests ([`digest_of`]) and JSON values ([`to_value`]).
pub trait Encode {
    /// Write the document to the sink.
    fn encode(&self, sink: &mut dyn Sink);
}

/// Where an encoding goes: a stream of JSON events.
pub trait Sink {
    /// `{`
    fn begin_object(&mut self);
    /// An object key; the next event is its value.
    fn key(&mut self, key: &str);
    /// `}`
    fn end_object(&mut self);
    /// `[`
    fn begin_array(&mut self);
    /// `]`
    fn end_array(&mut self);
    /// An integer.
    fn u64(&mut self, v: u64);
    /// A boolean.
    fn bool(&mut self, v: bool);
    /// A string.
    fn str(&mut self, v: &str);
}

/// Writes the fields of one object; keys must come in RFC 8785 order.
pub struct ObjectWriter<'a>(&'a mut dyn Sink);

impl<'a> ObjectWriter<'a> {
    /// Open an object.
    pub fn new(sink: &'a mut dyn Sink) -> Self {
        sink.begin_object();
        Self(sink)
    }

    /// An integer field.
    pub fn u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.0.key(key);
        self.0.u64(v);
        self
    }

    /// An optional integer field, omitted when absent.
    pub fn opt_u64(&mut self, key: &str, v: Option<u64>) -> &mut Self {
        if let Some(v) = v {
            self.u64(key, v);
        }
        self
    }

    /// A boolean field.
    pub fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.0.key(key);
        self.0.bool(v);
        self
    }

    /// A string field.
    pub fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.0.key(key);
        self.0.str(v);
        self
    }

    /// A field holding a document.
    pub fn doc(&mut self, key: &str, v: &dyn Encode) -> &mut Self {
        self.0.key(key);
        v.encode(self.0);
        self
    }

    /// An optional document field, omitted when absent.
    pub fn opt_doc<T: Encode>(&mut self, key: &str, v: Option<&T>) -> &mut Self {
        if let Some(v) = v {
            self.doc(key, v);
        }
        self
    }

    /// A field holding an array of documents.
    pub fn list<T: Encode>(&mut self, key: &str, items: &[T]) -> &mut Self {
        self.0.key(key);
        encode_list(items.iter(), self.0);
        self
    }

    /// Close the object.
    pub fn end(&mut self) {
        self.0.end_object();
    }
}

/// Encode items as a JSON array.
pub fn encode_list<'a, T: Encode + 'a>(items: impl Iterator<Item = &'a T>, sink: &mut dyn Sink) {
    sink.begin_array();
    for item in items {
        item.encode(sink);
    }
    sink.end_array();
}

impl Encode for u64 {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.u64(*self);
    }
}

impl Encode for bool {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.bool(*self);
    }
}

impl Encode for str {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.str(self);
    }
}

impl Encode for String {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.str(self);
    }
}

/// Canonical JSON text.
#[derive(Default)]
struct Text {
    out: String,
    comma: bool,
}

impl Text {
    fn sep(&mut self) {
        if self.comma {
            self.out.push(',');
        }
    }
}

impl Sink for Text {
    fn begin_object(&mut self) {
        self.sep();
        self.out.push('{');
        self.comma = false;
    }
    fn key(&mut self, key: &str) {
        self.sep();
        write_string(key, &mut self.out);
        self.out.push(':');
        self.comma = false;
    }
    fn end_object(&mut self) {
        self.out.push('}');
        self.comma = true;
    }
    fn begin_array(&mut self) {
        self.sep();
        self.out.push('[');
        self.comma = false;
    }
    fn end_array(&mut self) {
        self.out.push(']');
        self.comma = true;
    }
    fn u64(&mut self, v: u64) {
        self.sep();
        write_u64(v, &mut self.out);
        self.comma = true;
    }
    fn bool(&mut self, v: bool) {
        self.sep();
        self.out.push_str(if v { "true" } else { "false" });
        self.comma = true;
    }
    fn str(&mut self, v: &str) {
        self.sep();
        write_string(v, &mut self.out);
        self.comma = true;
    }
}

/// A JSON value under construction.
enum Frame {
    Object(Map<String, Value>, String),
    Array(Vec<Value>),
}

/// Builds a [`Value`].
#[derive(Default)]
struct Tree {
    stack: Vec<Frame>,
    done: Option<Value>,
}

impl Tree {
    fn put(&mut self, v: Value) {
        match self.stack.last_mut() {
            Some(Frame::Object(map, key)) => {
                map.insert(std::mem::take(key), v);
            }
            Some(Frame::Array(items)) => items.push(v),
            None => self.done = Some(v),
        }
    }
}

impl Sink for Tree {
    fn begin_object(&mut self) {
        self.stack.push(Frame::Object(Map::new(), String::new()));
    }
    fn key(&mut self, key: &str) {
        if let Some(Frame::Object(_, k)) = self.stack.last_mut() {
            key.clone_into(k);
        }
    }
    fn end_object(&mut self) {
        if let Some(Frame::Object(map, _)) = self.stack.pop() {
            self.put(Value::Object(map));
        }
    }
    fn begin_array(&mut self) {
        self.stack.push(Frame::Array(Vec::new()));
    }
    fn end_array(&mut self) {
        if let Some(Frame::Array(items)) = self.stack.pop() {
            self.put(Value::Array(items));
        }
    }
    fn u64(&mut self, v: u64) {
        self.put(Value::from(v));
    }
    fn bool(&mut self, v: bool) {
        self.put(Value::Bool(v));
    }
    fn str(&mut self, v: &str) {
        self.put(Value::String(v.to_owned()));
    }
}

/// A document as a JSON value.
pub fn to_value<T: Encode + ?Sized>(doc: &T) -> Value {
    let mut tree = Tree::default();
    doc.encode(&mut tree);
    tree.done.unwrap_or(Value::Null)
}

fn write_u64(v: u64, out: &mut String) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = v;
    loop {
        i = i.saturating_sub(1);
        if let Some(slot) = buf.get_mut(i) {
            // n % 10 < 10: the cast cannot truncate.
            *slot = b'0'.saturating_add((n % 10) as u8);
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(buf.get(i..).unwrap_or_default()).unwrap_or_default());
}

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
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) if u <= crate::limits::MAX_SAFE_INTEGER => write_u64(u, out),
            // RFC 8785: every number as the IEEE 754 double it is, written as
            // ECMAScript's Number.prototype.toString writes it.
            (_, Some(f)) => out.push_str(ryu_js::Buffer::new().format(f)),
            _ => out.push_str(&n.to_string()),
        },
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
    // Most strings (digests, identifiers, names) need no escape at all.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(s);
        out.push('"');
        return;
    }
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

/// Canonical JSON text (RFC 8785) of a document.
pub fn canonical_json<T: Encode + ?Sized>(doc: &T) -> String {
    let mut text = Text {
        out: String::with_capacity(1024),
        comma: false,
    };
    doc.encode(&mut text);
    text.out
}

/// Digest of a document: lowercase hex SHA-256 of its canonical JSON.
pub fn digest_of<T: Encode + ?Sized>(doc: &T) -> String {
    sha256_hex(canonical_json(doc).as_bytes())
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
