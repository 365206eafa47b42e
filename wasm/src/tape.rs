//! Documents handed to JavaScript as a tape rather than as JSON text.
//!
//! The core encodes a document event by event ([`Encode`] into a [`Sink`]);
//! this sink records the events as numbers, and the strings' UTF-8 in one
//! byte buffer. The TypeScript side (`fromTape` in `wasm/ts/core.ts`) turns
//! the tape into plain objects in one pass: no JSON text is written here nor
//! parsed there. Nothing about any document's shape is known on either side:
//! the core's encoding is the only source of keys, order and values. Object
//! keys cross once per module: a key is sent with its text the first time and
//! as its number afterwards; so does a string value met again where it was
//! met before (a policy's digests and identifiers, run after run).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use retryledger_core::canonical::{Encode, FieldTable, Sink};

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
/// A string sent before: its number follows.
pub const SEEN_STR: f64 = 11.0;
/// A string sent for the first time with a number: its number, then its text's start and end.
pub const NEW_STR: f64 = 12.0;

/// Keys numbered at most (documents have a few dozen; map keys may be many).
const MAX_KEYS: usize = 4096;

/// Strings numbered at most, and the longest one numbered (a receipt's
/// repeated strings are digests, identifiers and names).
const MAX_STRS: usize = 4096;
const MAX_STR_BYTES: usize = 256;

/// Slots of the table of strings by address (a power of two).
const STR_SLOTS: usize = 1024;

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

/// The keys numbered so far: by text, and their texts by number. In front
/// of the map, a small table by the key's address and length: a key met
/// again at the same place (the field names of the core's encodings) is
/// found without hashing its text; a hit still compares the text, so an
/// address reused by other text is a miss.
#[derive(Default)]
struct Keys {
    ids: HashMap<Box<str>, u32, BuildHasherDefault<KeyHasher>>,
    texts: Vec<Box<str>>,
    front: Vec<(usize, u32)>,
    /// The numbers of field names met before ([`Sink::field`]).
    fields: FieldTable<u32>,
    /// String values numbered so far: by text, and their texts by number.
    str_ids: HashMap<Box<str>, u32, BuildHasherDefault<KeyHasher>>,
    strs: Vec<Box<str>>,
    /// String values by address and length: the hash of the text last met
    /// there, and its number once it has one ([`Keys::string`]).
    str_slots: Vec<(usize, usize, u64, Option<u32>)>,
}

/// What the table of strings says of a string value.
enum Seen {
    /// Numbered before: its number.
    Before(u32),
    /// Numbered now: its number (the host learns its text with it).
    Now(u32),
    /// Not numbered.
    No,
}

/// A hash of a text (which strings met again are numbered).
fn text_hash(s: &str) -> u64 {
    let mut h = KeyHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

/// Slots of the table by address (a power of two).
const FRONT_SLOTS: usize = 256;

/// Whether two texts are equal, eight bytes at a time and inline (short
/// texts: no call into the library's byte comparison).
#[inline]
fn same_text(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    while let (Some((p, x)), Some((q, y))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if u64::from_ne_bytes(*p) != u64::from_ne_bytes(*q) {
            return false;
        }
        (a, b) = (x, y);
    }
    a.iter().zip(b).all(|(p, q)| p == q)
}

impl Keys {
    fn slot(key: &str) -> usize {
        let at = key.as_ptr() as usize;
        ((at >> 2) ^ (at >> 10) ^ key.len()) & (FRONT_SLOTS - 1)
    }

    /// The key's number, if met before at this address.
    fn front(&self, key: &str) -> Option<u32> {
        let (at, id) = *self.front.get(Self::slot(key))?;
        let text = self.texts.get(usize::try_from(id).ok()?)?;
        (at == key.as_ptr() as usize && same_text(text, key)).then_some(id)
    }

    /// The number of a field name met before.
    #[inline]
    fn field(&self, name: &'static str) -> Option<u32> {
        self.fields.get(name).copied()
    }

    fn remember_field(&mut self, name: &'static str, id: u32) {
        self.fields.insert(name, id);
    }

    fn remember(&mut self, key: &str, id: u32) {
        if self.front.is_empty() {
            self.front = vec![(0, 0); FRONT_SLOTS];
        }
        if let Some(slot) = self.front.get_mut(Self::slot(key)) {
            *slot = (key.as_ptr() as usize, id);
        }
    }

    /// A string value: its number when it is met again at the same address
    /// with the same text (a policy's digests and identifiers, which a
    /// sealed receipt is encoded from, stay where they are run after run),
    /// numbered the second time it is met there (a text numbered before,
    /// at another address, keeps its number); a string met once, or whose
    /// text changes at its address (a run's own digest), is not. A number
    /// always stands for one text: a hit compares the text.
    fn string(&mut self, s: &str) -> Seen {
        if s.len() > MAX_STR_BYTES {
            return Seen::No;
        }
        if self.str_slots.is_empty() {
            self.str_slots = vec![(0, 0, 0, None); STR_SLOTS];
        }
        let at = s.as_ptr() as usize;
        let Some(slot) = self.str_slots.get_mut(Self::str_slot(s)) else {
            return Seen::No;
        };
        if slot.0 == at && slot.1 == s.len() {
            if let Some(id) = slot.3 {
                let same = usize::try_from(id)
                    .ok()
                    .and_then(|i| self.strs.get(i))
                    .is_some_and(|t| same_text(t, s));
                if same {
                    return Seen::Before(id);
                }
            } else {
                let h = text_hash(s);
                if slot.2 == h {
                    // A text numbered before (met again at another address) keeps its number.
                    if let Some(id) = self.str_ids.get(s).copied() {
                        slot.3 = Some(id);
                        return Seen::Before(id);
                    }
                    if self.strs.len() < MAX_STRS {
                        let id = u32::try_from(self.strs.len()).unwrap_or(u32::MAX);
                        self.str_ids.insert(s.into(), id);
                        self.strs.push(s.into());
                        slot.3 = Some(id);
                        return Seen::Now(id);
                    }
                }
                slot.2 = h;
                return Seen::No;
            }
        }
        *slot = (at, s.len(), text_hash(s), None);
        Seen::No
    }

    fn str_slot(s: &str) -> usize {
        // Multiplicative: strings near one another (a data section, one
        // allocation after another) spread over the table.
        let at = (s.as_ptr() as u64) ^ ((s.len() as u64) << 32);
        let mixed = at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54;
        usize::try_from(mixed).unwrap_or(0) & (STR_SLOTS - 1)
    }
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

/// A numbered string's text (for a host that missed its first sending).
pub fn str_text(id: u32) -> Option<String> {
    KEYS.with(|keys| {
        let keys = keys.try_borrow().ok()?;
        let text = keys.strs.get(usize::try_from(id).ok()?)?;
        Some(text.to_string())
    })
}

/// A document's tape and string bytes, reused from one document to the next.
#[derive(Default)]
pub struct Tape {
    /// Operations and their operands: the first [`Tape::len`] numbers
    /// (the vector is kept filled to its length, so that a write is a
    /// bounds check and a store where the build optimizes for size).
    pub ops: Vec<f64>,
    /// How many numbers of `ops` the document wrote.
    len: usize,
    /// The strings' UTF-8, one after another.
    pub text: Vec<u8>,
}

impl Tape {
    /// Replace the tape with the document `encode` writes into the sink it
    /// is given (one document), returning what `encode` returns.
    pub fn write_with<R>(&mut self, encode: impl FnOnce(&mut dyn Sink) -> R) -> R {
        self.len = 0;
        self.text.clear();
        if self.ops.len() < 256 {
            self.ops.resize(256, 0.0);
        }
        KEYS.with(|keys| match keys.try_borrow_mut() {
            Ok(mut keys) => encode(&mut Writer {
                tape: self,
                utf16: 0,
                keys: Some(&mut keys),
            }),
            Err(_) => encode(&mut Writer {
                tape: self,
                utf16: 0,
                keys: None,
            }),
        })
    }

    /// How many numbers the tape holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Append numbers to the tape.
    #[inline(always)]
    fn put(&mut self, xs: &[f64]) {
        let end = self.len.saturating_add(xs.len());
        if end > self.ops.len() {
            self.grow(end);
        }
        if let Some(dst) = self.ops.get_mut(self.len..end) {
            dst.copy_from_slice(xs);
        }
        self.len = end;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, need: usize) {
        let room = need.max(self.ops.len().saturating_mul(2));
        self.ops.resize(room, 0.0);
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
        self.tape.put(&[OBJECT]);
    }
    fn key(&mut self, key: &str) {
        if let Some(keys) = self.keys.as_deref_mut() {
            if let Some(id) = keys.front(key) {
                self.tape.put(&[KEY, f64::from(id)]);
                return;
            }
            if let Some(id) = keys.ids.get(key).copied() {
                keys.remember(key, id);
                self.tape.put(&[KEY, f64::from(id)]);
                return;
            }
            if keys.texts.len() < MAX_KEYS {
                let id = u32::try_from(keys.texts.len()).unwrap_or(u32::MAX);
                keys.ids.insert(key.into(), id);
                keys.texts.push(key.into());
                keys.remember(key, id);
                let (from, to) = self.span(key);
                self.tape.put(&[NEW_KEY, f64::from(id), from, to]);
                return;
            }
        }
        let (from, to) = self.span(key);
        self.tape.put(&[LONE_KEY, from, to]);
    }
    fn field(&mut self, name: &'static str) {
        if let Some(id) = self.keys.as_deref().and_then(|k| k.field(name)) {
            self.tape.put(&[KEY, f64::from(id)]);
            return;
        }
        self.key(name);
        if let Some(keys) = self.keys.as_deref_mut() {
            if let Some(id) = keys.ids.get(name).copied() {
                keys.remember_field(name, id);
            }
        }
    }
    fn end_object(&mut self) {
        self.tape.put(&[END_OBJECT]);
    }
    fn begin_array(&mut self) {
        self.tape.put(&[ARRAY]);
    }
    fn end_array(&mut self) {
        self.tape.put(&[END_ARRAY]);
    }
    #[allow(clippy::cast_precision_loss)]
    fn u64(&mut self, v: u64) {
        // Document integers are at most 2^53 - 1: exact as JavaScript numbers.
        self.tape.put(&[INT, v as f64]);
    }
    fn bool(&mut self, v: bool) {
        self.tape.put(&[if v { TRUE } else { FALSE }]);
    }
    fn str(&mut self, v: &str) {
        match self.keys.as_deref_mut().map_or(Seen::No, |k| k.string(v)) {
            Seen::Before(id) => self.tape.put(&[SEEN_STR, f64::from(id)]),
            Seen::Now(id) => {
                let (from, to) = self.span(v);
                self.tape.put(&[NEW_STR, f64::from(id), from, to]);
            }
            Seen::No => {
                let (from, to) = self.span(v);
                self.tape.put(&[STR, from, to]);
            }
        }
    }
}

/// One event of a tape read back, its strings resolved.
enum Event {
    Object,
    EndObject,
    Array,
    EndArray,
    Key(String),
    Int(u64),
    Bool(bool),
    Str(String),
}

/// A document's events, read back from its tape: the core's canonical
/// writer encodes them as it encoded the document (the same events make
/// the same bytes).
pub struct Replay(Vec<Event>);

impl Encode for Replay {
    fn encode(&self, sink: &mut dyn Sink) {
        for e in &self.0 {
            match e {
                Event::Object => sink.begin_object(),
                Event::EndObject => sink.end_object(),
                Event::Array => sink.begin_array(),
                Event::EndArray => sink.end_array(),
                Event::Key(k) => sink.key(k),
                Event::Int(v) => sink.u64(*v),
                Event::Bool(b) => sink.bool(*b),
                Event::Str(s) => sink.str(s),
            }
        }
    }
}

/// Where the strings of a tape's text are: UTF-16 offsets (as the host
/// decoded it) walked to UTF-8 byte offsets, string after string.
struct Cursor<'t> {
    text: &'t str,
    /// Bytes read so far.
    byte: usize,
    /// UTF-16 units read so far.
    unit: usize,
}

impl<'t> Cursor<'t> {
    /// The string spanning UTF-16 units `[from, to)`, which starts where the last one ended.
    fn take(&mut self, from: f64, to: f64) -> Option<&'t str> {
        if from != num(self.unit) {
            return None;
        }
        let start = self.byte;
        let rest = self.text.get(start..)?;
        let mut chars = rest.char_indices();
        while num(self.unit) < to {
            let (_, c) = chars.next()?;
            self.unit = self.unit.saturating_add(c.len_utf16());
            self.byte = self.byte.saturating_add(c.len_utf8());
        }
        if num(self.unit) != to {
            return None;
        }
        self.text.get(start..self.byte)
    }
}

/// A document's events from its tape (`ops`, as [`Tape::write_with`] wrote
/// them, and the text the host decoded), checked: known operations with
/// their operands, keys the module numbered, strings in order within the
/// text, objects and arrays balanced, one document. `None` otherwise.
pub fn replay(ops: &[f64], text: &str) -> Option<Replay> {
    let mut events = Vec::with_capacity(ops.len());
    let mut cursor = Cursor {
        text,
        byte: 0,
        unit: 0,
    };
    // Per open container: whether it is an object, and (objects) whether a key waits for its value.
    let mut open: Vec<(bool, bool)> = Vec::new();
    let mut done = false;
    let mut it = ops.iter().copied();
    while let Some(op) = it.next() {
        let is_key = op == KEY || op == NEW_KEY || op == LONE_KEY;
        let closes = op == END_OBJECT || op == END_ARRAY;
        // Where this event stands: a key only in an object waiting for one,
        // a value only at the top (once) or where a value is due.
        match open.last_mut() {
            None if done || is_key || closes => return None,
            Some((true, true)) if is_key || op == END_OBJECT => return None,
            Some((true, waiting)) if is_key => *waiting = true,
            Some((true, _)) if op == END_OBJECT => {}
            Some((true, false)) => return None,
            Some((true, waiting)) => *waiting = false,
            Some((false, _)) if is_key || op == END_OBJECT => return None,
            _ => {}
        }
        let event = if op == OBJECT || op == ARRAY {
            open.push((op == OBJECT, false));
            if op == OBJECT {
                Event::Object
            } else {
                Event::Array
            }
        } else if closes {
            let (object, _) = open.pop()?;
            if object != (op == END_OBJECT) {
                return None;
            }
            if op == END_OBJECT {
                Event::EndObject
            } else {
                Event::EndArray
            }
        } else if op == KEY {
            Event::Key(key_text(whole(it.next()?)?)?)
        } else if op == NEW_KEY {
            let id = whole(it.next()?)?;
            let s = cursor.take(it.next()?, it.next()?)?;
            if key_text(id).as_deref() != Some(s) {
                return None;
            }
            Event::Key(s.to_owned())
        } else if op == LONE_KEY {
            Event::Key(cursor.take(it.next()?, it.next()?)?.to_owned())
        } else if op == INT {
            Event::Int(integer(it.next()?)?)
        } else if op == TRUE || op == FALSE {
            Event::Bool(op == TRUE)
        } else if op == STR {
            Event::Str(cursor.take(it.next()?, it.next()?)?.to_owned())
        } else if op == SEEN_STR {
            Event::Str(str_text(whole(it.next()?)?)?)
        } else if op == NEW_STR {
            let id = whole(it.next()?)?;
            let s = cursor.take(it.next()?, it.next()?)?;
            if str_text(id).as_deref() != Some(s) {
                return None;
            }
            Event::Str(s.to_owned())
        } else {
            return None;
        };
        events.push(event);
        if open.is_empty() {
            done = true;
        }
    }
    (done && cursor.byte == text.len()).then_some(Replay(events))
}

/// A number that is a whole `u32` (a key number).
fn whole(x: f64) -> Option<u32> {
    let n = integer(x)?;
    u32::try_from(n).ok()
}

/// A number that is a document integer (0..=2^53-1).
fn integer(x: f64) -> Option<u64> {
    // Exact: 2^53 - 1 is a double.
    #[allow(clippy::cast_precision_loss)]
    let max = retryledger_core::limits::MAX_SAFE_INTEGER as f64;
    if !x.is_finite() || x.trunc() != x || !(0.0..=max).contains(&x) {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(x as u64)
}
