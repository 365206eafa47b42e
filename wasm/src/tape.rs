//! Documents handed to JavaScript as a tape rather than as JSON text.
//!
//! The core encodes a document event by event ([`Encode`] into a [`Sink`]);
//! this sink records the events as numbers, and the strings' UTF-8 in one
//! byte buffer. The TypeScript side (`fromTape` in `wasm/ts/core.ts`) turns
//! the tape into plain objects in one pass: no JSON text is written here nor
//! parsed there. Nothing about any document's shape is known on either side:
//! the core's encoding is the only source of keys, order and values. Object
//! keys cross once per module: a key is sent with its text the first time and
//! as its number afterwards.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use retryledger_core::canonical::{Encode, Sink};

/// `{`
pub const OBJECT: f64 = 0.0;
/// `}`
pub const END_OBJECT: f64 = 1.0;
/// `[`
pub const ARRAY: f64 = 2.0;
/// `]`
pub const END_ARRAY: f64 = 3.0;
/// A key sent before: its number follows.
pub const KEY: f64 = 4.0;
/// A key sent for the first time: its number, then its text's start and end.
pub const NEW_KEY: f64 = 5.0;
/// A key not numbered (the table is full): its text's start and end.
pub const LONE_KEY: f64 = 6.0;
/// An integer: its value follows.
pub const INT: f64 = 7.0;
/// `true`
pub const TRUE: f64 = 8.0;
/// `false`
pub const FALSE: f64 = 9.0;
/// A string: its start and end follow.
pub const STR: f64 = 10.0;

/// Keys numbered at most (documents have a few dozen; map keys may be many).
const MAX_KEYS: usize = 4096;

/// A small multiplicative hasher for short keys.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = 0u64;
            for b in chunk.iter().rev() {
                word = (word << 8) | u64::from(*b);
            }
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u8(&mut self, b: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The keys numbered so far: by text, and their texts by number.
#[derive(Default)]
struct Keys {
    ids: HashMap<Box<str>, u32, BuildHasherDefault<KeyHasher>>,
    texts: Vec<Box<str>>,
}

thread_local! {
    /// The keys sent so far (the module's lifetime; the host keeps the same table).
    static KEYS: RefCell<Keys> = RefCell::new(Keys::default());
}

/// A numbered key's text (for a host that missed its first sending).
pub fn key_text(id: u32) -> Option<String> {
    KEYS.with(|keys| {
        let keys = keys.try_borrow().ok()?;
        let text = keys.texts.get(usize::try_from(id).ok()?)?;
        Some(text.to_string())
    })
}

/// A document's tape and string bytes, reused from one document to the next.
#[derive(Default)]
pub struct Tape {
    /// Operations and their operands.
    pub ops: Vec<f64>,
    /// The strings' UTF-8, one after another.
    pub text: Vec<u8>,
}

impl Tape {
    /// Replace the tape with `doc`'s.
    pub fn write<T: Encode + ?Sized>(&mut self, doc: &T) {
        self.ops.clear();
        self.text.clear();
        KEYS.with(|keys| match keys.try_borrow_mut() {
            Ok(mut keys) => doc.encode(&mut Writer {
                tape: self,
                utf16: 0,
                keys: Some(&mut keys),
            }),
            Err(_) => doc.encode(&mut Writer {
                tape: self,
                utf16: 0,
                keys: None,
            }),
        });
    }
}

struct Writer<'a, 'k> {
    tape: &'a mut Tape,
    /// Where the next string starts in the decoded text, in UTF-16 units.
    utf16: usize,
    keys: Option<&'k mut Keys>,
}

#[allow(clippy::cast_precision_loss)]
fn num(x: usize) -> f64 {
    // Offsets and key numbers are far below 2^53.
    x as f64
}

impl Writer<'_, '_> {
    /// Append a string's bytes: its start and end in the decoded text.
    fn span(&mut self, s: &str) -> (f64, f64) {
        let from = self.utf16;
        self.tape.text.extend_from_slice(s.as_bytes());
        let units = if s.is_ascii() {
            s.len()
        } else {
            s.encode_utf16().count()
        };
        self.utf16 = from.saturating_add(units);
        (num(from), num(self.utf16))
    }
}

impl Sink for Writer<'_, '_> {
    fn begin_object(&mut self) {
        self.tape.ops.push(OBJECT);
    }
    fn key(&mut self, key: &str) {
        if let Some(keys) = self.keys.as_deref_mut() {
            if let Some(id) = keys.ids.get(key) {
                let id = f64::from(*id);
                self.tape.ops.extend_from_slice(&[KEY, id]);
                return;
            }
            if keys.texts.len() < MAX_KEYS {
                let id = u32::try_from(keys.texts.len()).unwrap_or(u32::MAX);
                keys.ids.insert(key.into(), id);
                keys.texts.push(key.into());
                let (from, to) = self.span(key);
                self.tape
                    .ops
                    .extend_from_slice(&[NEW_KEY, f64::from(id), from, to]);
                return;
            }
        }
        let (from, to) = self.span(key);
        self.tape.ops.extend_from_slice(&[LONE_KEY, from, to]);
    }
    fn end_object(&mut self) {
        self.tape.ops.push(END_OBJECT);
    }
    fn begin_array(&mut self) {
        self.tape.ops.push(ARRAY);
    }
    fn end_array(&mut self) {
        self.tape.ops.push(END_ARRAY);
    }
    #[allow(clippy::cast_precision_loss)]
    fn u64(&mut self, v: u64) {
        // Document integers are at most 2^53 - 1: exact as JavaScript numbers.
        self.tape.ops.extend_from_slice(&[INT, v as f64]);
    }
    fn bool(&mut self, v: bool) {
        self.tape.ops.push(if v { TRUE } else { FALSE });
    }
    fn str(&mut self, v: &str) {
        let (from, to) = self.span(v);
        self.tape.ops.extend_from_slice(&[STR, from, to]);
    }
}
