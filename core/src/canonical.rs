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
    /// An object key that is a field name of a document type: static text
    /// that needs no JSON escape (an identifier), so a sink may write it as
    /// it is and key a cache by its address. The next event is its value.
    fn field(&mut self, name: &'static str) {
        self.key(name);
    }
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

/// What a sink keeps per field name ([`Sink::field`]), found by the name's
/// address and length alone: no text is hashed or compared. A fixed number
/// of slots; a name whose slot another name took since is not found, and the
/// sink makes its value again.
pub struct FieldTable<V> {
    slots: Vec<Option<(usize, usize, V)>>,
}

impl<V> Default for FieldTable<V> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

impl<V> FieldTable<V> {
    /// Slots (a power of two).
    const SLOTS: usize = 1024;

    #[inline]
    fn slot(name: &'static str) -> usize {
        let at = name.as_ptr() as usize;
        ((at >> 2) ^ (at >> 12) ^ name.len()) & (Self::SLOTS - 1)
    }

    /// What was kept for `name`, if it is still there.
    #[inline]
    pub fn get(&self, name: &'static str) -> Option<&V> {
        match self.slots.get(Self::slot(name)) {
            Some(Some((at, n, v))) if *at == name.as_ptr() as usize && *n == name.len() => Some(v),
            _ => None,
        }
    }

    /// Keep `value` for `name` (in its slot, replacing what another name kept there).
    pub fn insert(&mut self, name: &'static str, value: V) {
        if self.slots.is_empty() {
            self.slots.resize_with(Self::SLOTS, || None);
        }
        if let Some(slot) = self.slots.get_mut(Self::slot(name)) {
            *slot = Some((name.as_ptr() as usize, name.len(), value));
        }
    }
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
    pub fn u64(&mut self, key: &'static str, v: u64) -> &mut Self {
        self.0.field(key);
        self.0.u64(v);
        self
    }

    /// An optional integer field, omitted when absent.
    pub fn opt_u64(&mut self, key: &'static str, v: Option<u64>) -> &mut Self {
        if let Some(v) = v {
            self.u64(key, v);
        }
        self
    }

    /// A boolean field.
    pub fn bool(&mut self, key: &'static str, v: bool) -> &mut Self {
        self.0.field(key);
        self.0.bool(v);
        self
    }

    /// A string field.
    pub fn str(&mut self, key: &'static str, v: &str) -> &mut Self {
        self.0.field(key);
        self.0.str(v);
        self
    }

    /// A field holding a document.
    pub fn doc(&mut self, key: &'static str, v: &dyn Encode) -> &mut Self {
        self.0.field(key);
        v.encode(self.0);
        self
    }

    /// An optional document field, omitted when absent.
    pub fn opt_doc<T: Encode>(&mut self, key: &'static str, v: Option<&T>) -> &mut Self {
        if let Some(v) = v {
            self.doc(key, v);
        }
        self
    }

    /// A field holding an array of documents.
    pub fn list<T: Encode>(&mut self, key: &'static str, items: &[T]) -> &mut Self {
        self.0.field(key);
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

/// An output buffer whose small writes compile to a bounds check and a
/// store even where the build optimizes for size (the WebAssembly module),
/// where `Vec::push` stays a call: the vector is kept filled to its capacity
/// and `len` counts the bytes written.
struct Buf {
    bytes: Vec<u8>,
    len: usize,
}

impl Buf {
    /// A buffer that goes on after `start`'s bytes, in `start`'s memory
    /// (its spare capacity zeroed at once, never filled byte by byte): a
    /// buffer handed back and forth is written again without allocating.
    fn new(mut start: Vec<u8>) -> Self {
        let len = start.len();
        start.resize(start.capacity().max(len.saturating_add(1024)), 0);
        Self { bytes: start, len }
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) {
        if self.len >= self.bytes.len() {
            self.grow(self.len.saturating_add(1));
        }
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = b;
        }
        self.len = self.len.saturating_add(1);
    }

    #[inline(always)]
    fn put(&mut self, s: &[u8]) {
        let end = self.len.saturating_add(s.len());
        if end > self.bytes.len() {
            self.grow(end);
        }
        if let Some(dst) = self.bytes.get_mut(self.len..end) {
            dst.copy_from_slice(s);
        }
        self.len = end;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, need: usize) {
        let mut bigger = vec![0u8; need.max(self.bytes.len().saturating_mul(2))];
        if let Some(head) = bigger.get_mut(..self.bytes.len()) {
            head.copy_from_slice(&self.bytes);
        }
        self.bytes = bigger;
    }

    fn finish(mut self) -> Vec<u8> {
        self.bytes.truncate(self.len);
        self.bytes
    }
}

/// Canonical JSON text, written as bytes: every piece is ASCII punctuation,
/// a decimal integer or the UTF-8 of a `&str`, so the result is UTF-8.
struct Text {
    out: Buf,
    comma: bool,
}

impl Text {
    #[inline(always)]
    fn sep(&mut self) {
        if self.comma {
            self.out.byte(b',');
        }
    }
}

impl Sink for Text {
    fn begin_object(&mut self) {
        self.sep();
        self.out.byte(b'{');
        self.comma = false;
    }
    fn key(&mut self, key: &str) {
        self.sep();
        write_string(key, &mut self.out);
        self.out.byte(b':');
        self.comma = false;
    }
    fn field(&mut self, name: &'static str) {
        debug_assert!(
            !name.bytes().any(needs_escape),
            "field names need no escape"
        );
        self.sep();
        self.out.byte(b'"');
        self.out.put(name.as_bytes());
        self.out.put(b"\":");
        self.comma = false;
    }
    fn end_object(&mut self) {
        self.out.byte(b'}');
        self.comma = true;
    }
    fn begin_array(&mut self) {
        self.sep();
        self.out.byte(b'[');
        self.comma = false;
    }
    fn end_array(&mut self) {
        self.out.byte(b']');
        self.comma = true;
    }
    fn u64(&mut self, v: u64) {
        self.sep();
        write_u64(v, &mut self.out);
        self.comma = true;
    }
    fn bool(&mut self, v: bool) {
        self.sep();
        self.out.put(if v { b"true" } else { b"false" });
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

fn write_u64(v: u64, out: &mut Buf) {
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
    out.put(buf.get(i..).unwrap_or_default());
}

/// Canonical JSON (RFC 8785) of any JSON value holding integers only.
pub fn to_jcs(value: &Value) -> String {
    let mut out = Buf::new(Vec::new());
    write_value(value, &mut out);
    into_text(out.finish())
}

fn write_value(value: &Value, out: &mut Buf) {
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(b) => out.put(if *b { b"true" } else { b"false" }),
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) if u <= crate::limits::MAX_SAFE_INTEGER => write_u64(u, out),
            // RFC 8785: every number as the IEEE 754 double it is, written as
            // ECMAScript's Number.prototype.toString writes it.
            (_, Some(f)) => out.put(ryu_js::Buffer::new().format(f).as_bytes()),
            _ => out.put(n.to_string().as_bytes()),
        },
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.byte(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.byte(b',');
                }
                write_value(item, out);
            }
            out.byte(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.byte(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.byte(b',');
                }
                write_string(key, out);
                out.byte(b':');
                if let Some(v) = map.get(key) {
                    write_value(v, out);
                }
            }
            out.byte(b'}');
        }
    }
}

/// Whether a byte must be escaped inside a JSON string.
#[inline(always)]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether any of eight bytes may need an escape (word-at-a-time: a byte
/// below 0x20, a quote or a backslash). It never misses one; a borrow may
/// flag a word that has none, which the byte-wise check then clears.
#[inline(always)]
fn any_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES.wrapping_mul(n)) & !x & HIGH;
    let quote = word ^ ONES.wrapping_mul(u64::from(b'"'));
    let backslash = word ^ ONES.wrapping_mul(u64::from(b'\\'));
    (below(word, 0x20) | below(quote, 1) | below(backslash, 1)) != 0
}

/// How many leading bytes need no escape, found eight bytes at a time
/// (a lower bound: the byte-wise loop goes on from there).
#[inline(always)]
fn clean_prefix(bytes: &[u8]) -> usize {
    let mut n = 0usize;
    let mut rest = bytes;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        if any_escape(u64::from_le_bytes(*word)) {
            break;
        }
        n = n.saturating_add(8);
        rest = tail;
    }
    n
}

fn write_string(s: &str, out: &mut Buf) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.byte(b'"');
    // Runs without an escape are copied whole (most strings are one run:
    // digests, identifiers, names). A byte to escape is ASCII, so a run
    // never ends inside a character.
    let mut run = 0;
    let tail = bytes.get(clean_prefix(bytes)..).unwrap_or_default();
    let offset = bytes.len().saturating_sub(tail.len());
    for (k, &b) in tail.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        let i = offset.saturating_add(k);
        out.put(bytes.get(run..i).unwrap_or_default());
        run = i.saturating_add(1);
        match b {
            b'"' => out.put(b"\\\""),
            b'\\' => out.put(b"\\\\"),
            0x08 => out.put(b"\\b"),
            b'\t' => out.put(b"\\t"),
            b'\n' => out.put(b"\\n"),
            0x0c => out.put(b"\\f"),
            b'\r' => out.put(b"\\r"),
            _ => {
                out.put(b"\\u00");
                out.byte(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'));
                out.byte(HEX.get(usize::from(b & 0xf)).copied().unwrap_or(b'0'));
            }
        }
    }
    out.put(bytes.get(run..).unwrap_or_default());
    out.byte(b'"');
}

/// The text of bytes the writers above produced (always UTF-8: ASCII and
/// whole `&str`s).
fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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

/// Canonical JSON (RFC 8785) of a document, as UTF-8 bytes appended to `out`.
pub fn write_canonical<T: Encode + ?Sized>(doc: &T, out: &mut Vec<u8>) {
    let mut text = Text {
        out: Buf::new(std::mem::take(out)),
        comma: false,
    };
    doc.encode(&mut text);
    *out = text.out.finish();
}

/// Canonical JSON text (RFC 8785) of a document.
pub fn canonical_json<T: Encode + ?Sized>(doc: &T) -> String {
    let mut out = Vec::with_capacity(1024);
    write_canonical(doc, &mut out);
    into_text(out)
}

thread_local! {
    /// The text [`digest_of`] hashes, written into the same memory each time.
    static DIGEST_TEXT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Digest of a document: lowercase hex SHA-256 of its canonical JSON.
pub fn digest_of<T: Encode + ?Sized>(doc: &T) -> String {
    // Taken out while in use: a digest computed while writing (none is) would start afresh.
    let mut out = DIGEST_TEXT.with(std::cell::Cell::take);
    out.clear();
    write_canonical(doc, &mut out);
    let hex = sha256_hex(&out);
    // A buffer grown for a huge document is not kept.
    if out.capacity() <= 1 << 16 {
        DIGEST_TEXT.with(|t| t.set(out));
    }
    hex
}

/// Digest of any JSON value in normal form (keys sorted by JCS).
pub fn digest_value(value: &Value) -> String {
    sha256_hex(to_jcs(value).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_table_finds_names_by_address_only() {
        static A: &str = "attempts";
        static B: &str = "attempts_sha256";
        let mut t = FieldTable::default();
        assert_eq!(t.get(A), None);
        t.insert(A, 1u32);
        t.insert(B, 2u32);
        assert_eq!((t.get(A), t.get(B)), (Some(&1), Some(&2)));
        // The same text at another address is another name.
        let leaked: &'static str = Box::leak(String::from(A).into_boxed_str());
        assert_eq!(t.get(leaked), None);
        // A prefix at the same address differs by its length.
        assert_eq!(t.get(&B[..8]), None);
        t.insert(A, 3);
        assert_eq!(t.get(A), Some(&3));
    }

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
    fn every_escape_at_every_offset() {
        // Each escaped character, and a non-ASCII one, at each position of
        // strings longer than a word: the word-at-a-time check misses none.
        for c in [
            '"', '\\', '\u{8}', '\t', '\n', '\u{c}', '\r', '\u{0}', '\u{1f}', 'é', '\u{7f}',
        ] {
            for at in 0..20 {
                let s: String = (0..20).map(|i| if i == at { c } else { 'a' }).collect();
                let via_serde = serde_json::to_string(&s).unwrap();
                let mut out = Buf::new(Vec::new());
                write_string(&s, &mut out);
                let ours = String::from_utf8(out.finish()).unwrap();
                // serde_json writes the same escapes, with uppercase hex.
                let expect = if c == '\u{0}' || c == '\u{1f}' {
                    via_serde.to_lowercase()
                } else {
                    via_serde
                };
                assert_eq!(ours, expect, "{c:?} at {at}");
            }
        }
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
