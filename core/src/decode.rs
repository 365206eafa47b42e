//! Strict decoding: JSON text to typed documents in normal form.
//!
//! Two passes. The first reads the text into a [`serde_json::Value`] (with
//! the crate's own strict reader) while rejecting what plain JSON allows:
//! duplicate keys, `null`, floats, integers outside 0..=2^53-1, oversize
//! input and deep nesting. The second maps the value onto the typed document
//! by hand ([`Decode`], [`Fields`]) with unknown fields denied. Every failure
//! is an [`Error`] with a code and a JSON Pointer.

use serde_json::Value;

use crate::error::{Error, ErrorCode, Result, MAX_ERRORS};
use crate::limits::MAX_INPUT_BYTES;

/// Parse JSON text into a value, enforcing the normal-form rules of every document.
pub fn parse_strict(text: &str) -> Result<Value> {
    check_size(text)?;
    crate::parse::parse(text)
}

/// Input over [`MAX_INPUT_BYTES`] is `input_too_large`, before any parsing.
pub(crate) fn check_size(text: &str) -> Result<()> {
    check_size_within(text, MAX_INPUT_BYTES)
}

fn check_size_within(text: &str, max: usize) -> Result<()> {
    if text.len() > max {
        return Err(Error::new(
            ErrorCode::InputTooLarge,
            format!("input is {} bytes; the limit is {max}", text.len()),
        ));
    }
    Ok(())
}

/// Decode JSON text into a typed document.
pub fn from_str<T: Decode>(text: &str) -> Result<T> {
    from_value(parse_strict(text).map_err(explain)?).map_err(explain)
}

/// Fields whose integers the policy bounds more narrowly than the decoder:
/// a bad value is told the policy's range, not the integer decoder's.
const RANGES: &[(&str, &str)] = &[
    ("max_attempts", "1..=10000"),
    ("max_total_attempts", "1..=10000"),
];

/// A decode error (and each further one it carries) said in the words of
/// the field it is about.
pub(crate) fn explain(mut e: Error) -> Error {
    e.more = std::mem::take(&mut e.more)
        .into_iter()
        .map(explain)
        .collect();
    if !matches!(
        e.code,
        ErrorCode::IntegerOutOfRange | ErrorCode::InvalidType
    ) {
        return e;
    }
    let field = e
        .path
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default();
    if let Some((name, range)) = RANGES.iter().find(|(n, _)| *n == field) {
        e.message = format!("`{name}` must be an integer in {range}: it counts attempts");
    }
    e
}

/// [`from_str`] for a document allowed up to `max` bytes (a bundle, whose
/// stream event log may be long: [`crate::limits::MAX_BUNDLE_BYTES`]).
pub fn from_str_within<T: Decode>(text: &str, max: usize) -> Result<T> {
    check_size_within(text, max)?;
    from_value(crate::parse::parse(text)?)
}

/// Map a strict value onto a typed document.
pub fn from_value<T: Decode>(value: Value) -> Result<T> {
    T::decode(&value, &At::Root)
}

/// A typed document read from a strict [`Value`].
///
/// Every failure carries its code and the JSON Pointer of the value at fault:
/// a wrong JSON type is `invalid_type`, a string outside an enumeration
/// `invalid_value`; an object reports the first key (in sorted order) it does
/// not define as `unknown_field` at that key, then the first absent required
/// field as `missing_field` at the object itself.
pub trait Decode: Sized {
    /// Decode the value found at `at`.
    fn decode(v: &Value, at: &At<'_>) -> Result<Self>;
}

/// Where a value sits, as a chain of borrowed segments: rendered as a JSON
/// Pointer only when something fails there, so valid input allocates no paths.
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// The document itself.
    Root,
    /// A key of the object at the parent.
    Key(&'a At<'a>, &'a str),
    /// An index of the array at the parent.
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    fn render(&self, out: &mut String) {
        match self {
            At::Root => {}
            At::Key(parent, key) => {
                parent.render(out);
                out.push('/');
                out.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            At::Index(parent, i) => {
                parent.render(out);
                out.push('/');
                out.push_str(&i.to_string());
            }
        }
    }

    /// The JSON Pointer of this place.
    pub fn pointer(&self) -> String {
        let mut out = String::new();
        self.render(&mut out);
        out
    }

    /// An error here.
    pub fn error(&self, code: ErrorCode, message: impl Into<String>) -> Error {
        Error::at(code, self.pointer(), message)
    }
}

impl Decode for u64 {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        // The strict parse admits only integers in 0..=2^53-1.
        v.as_u64()
            .ok_or_else(|| at.error(ErrorCode::InvalidType, "expected an integer"))
    }
}

impl Decode for bool {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        v.as_bool()
            .ok_or_else(|| at.error(ErrorCode::InvalidType, "expected a boolean"))
    }
}

impl Decode for String {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_str(v, at).map(str::to_owned)
    }
}

/// A string value.
pub fn decode_str<'v>(v: &'v Value, at: &At<'_>) -> Result<&'v str> {
    v.as_str()
        .ok_or_else(|| at.error(ErrorCode::InvalidType, "expected a string"))
}

/// An array value's items.
pub fn decode_array<'v>(v: &'v Value, at: &At<'_>) -> Result<&'v [Value]> {
    match v {
        Value::Array(items) => Ok(items),
        _ => Err(at.error(ErrorCode::InvalidType, "expected an array")),
    }
}

/// A list of at most `max` items, each decoded in turn; every bad item is
/// reported (up to [`MAX_ERRORS`]), the first one first.
pub fn decode_list<T: Decode>(v: &Value, at: &At<'_>, max: usize) -> Result<Vec<T>> {
    let items = decode_array(v, at)?;
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match T::decode(item, &At::Index(at, i)) {
            Err(e) => {
                errors.push(e);
                if errors.len() >= MAX_ERRORS {
                    break;
                }
            }
            Ok(_) if i >= max => {
                errors.push(at.error(ErrorCode::TooManyItems, format!("more than {max} items")));
                break;
            }
            Ok(x) => out.push(x),
        }
    }
    match Error::gather(errors) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The index of one of a fixed set of names. As a one-key object the name
/// is taken from the key (and its value can only be of the wrong type); any
/// other object is not one of the names.
pub fn decode_name(v: &Value, at: &At<'_>, names: &[&str]) -> Result<usize> {
    let lookup = |s: &str| {
        names.iter().position(|n| *n == s).ok_or_else(|| {
            at.error(
                ErrorCode::InvalidValue,
                format!(
                    "unknown variant `{}`: expected one of {}",
                    s.chars().take(80).collect::<String>(),
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    };
    match v {
        Value::String(s) => lookup(s),
        Value::Object(map) => match map.iter().next() {
            Some((k, _)) if map.len() == 1 => {
                lookup(k)?;
                Err(at.error(ErrorCode::InvalidType, "expected a unit variant"))
            }
            _ => Err(at.error(ErrorCode::InvalidValue, "expected a string")),
        },
        _ => Err(at.error(ErrorCode::InvalidType, "expected a string")),
    }
}

/// The value at an index of a name table (see [`decode_name`]).
pub fn pick<T: Copy>(all: &[T], i: usize, at: &At<'_>) -> Result<T> {
    all.get(i)
        .copied()
        .ok_or_else(|| at.error(ErrorCode::InvalidValue, "unknown variant"))
}

/// The entries of an object in sorted key order, whatever order the map
/// keeps: serde_json's default map iterates sorted, but with its
/// `preserve_order` feature (turned on by any crate in the build) it keeps
/// insertion order. Only then, and only for an object not written in sorted
/// order, are the entries gathered and sorted.
enum Keys<'a> {
    /// The map's own iteration, already sorted.
    Map(serde_json::map::Iter<'a>),
    /// The entries, sorted here.
    Sorted(std::vec::IntoIter<(&'a String, &'a Value)>),
}

impl<'a> Keys<'a> {
    fn sorted(map: &'a serde_json::Map<String, Value>) -> Self {
        if map.keys().is_sorted() {
            Keys::Map(map.iter())
        } else {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by_key(|(a, _)| *a);
            Keys::Sorted(entries.into_iter())
        }
    }
}

impl<'a> Iterator for Keys<'a> {
    type Item = (&'a String, &'a Value);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Keys::Map(it) => it.next(),
            Keys::Sorted(it) => it.next(),
        }
    }
}

/// The fields of one object, read in sorted key order.
///
/// Fields are asked for in sorted order ([`Fields::req`], [`Fields::opt`]);
/// a key that sorts before the field asked for is one the type does not
/// define. [`Fields::end`] refuses leftover keys, then absent required fields.
pub struct Fields<'a> {
    keys: std::iter::Peekable<Keys<'a>>,
    at: &'a At<'a>,
    /// Errors inside the object are reported at the object itself (the
    /// fields of a tagged variant).
    flat: bool,
    /// A key read separately (a variant's tag).
    tag: Option<&'static str>,
    /// The required fields found absent, in the order asked for.
    missing: Vec<&'static str>,
    /// The errors found so far (fields that failed, keys not defined), in
    /// sorted key order; [`Fields::end`] reports them all.
    failures: Vec<Error>,
}

impl<'a> Fields<'a> {
    /// The fields of an object value.
    pub fn open(v: &'a Value, at: &'a At<'a>) -> Result<Self> {
        match v {
            Value::Object(map) => Ok(Self {
                keys: Keys::sorted(map).peekable(),
                at,
                flat: false,
                tag: None,
                missing: Vec::new(),
                failures: Vec::new(),
            }),
            _ => Err(at.error(ErrorCode::InvalidType, "expected an object")),
        }
    }

    /// The variant fields of a tagged object: `tag` is skipped, and every
    /// error inside is reported at the object.
    pub fn variant(mut self, tag: &'static str) -> Self {
        self.flat = true;
        self.tag = Some(tag);
        self
    }

    fn unknown(&self, key: &str) -> Error {
        let message = format!(
            "unknown field `{}`",
            key.chars().take(80).collect::<String>()
        );
        if self.flat {
            self.at.error(ErrorCode::UnknownField, message)
        } else {
            At::Key(self.at, key).error(ErrorCode::UnknownField, message)
        }
    }

    fn fail(&mut self, e: Error) {
        if self.failures.len() < MAX_ERRORS {
            self.failures.push(e);
        }
    }

    /// The field `name`, if present; keys sorting before it are ones the
    /// type does not define, each noted as a failure.
    fn find(&mut self, name: &str) -> Option<(&'a str, &'a Value)> {
        while let Some(&(key, value)) = self.keys.peek() {
            if Some(key.as_str()) == self.tag {
                self.keys.next();
                continue;
            }
            match key.as_str().cmp(name) {
                std::cmp::Ordering::Less => {
                    self.keys.next();
                    let e = self.unknown(key);
                    self.fail(e);
                }
                std::cmp::Ordering::Equal => {
                    self.keys.next();
                    return Some((key.as_str(), value));
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        None
    }

    /// A field's value and place, if present.
    #[inline(never)]
    fn field(&mut self, name: &'static str, required: bool) -> Option<(&'a Value, At<'a>)> {
        let found = self.find(name);
        if found.is_none() && required {
            self.missing.push(name);
        }
        found.map(|(key, value)| {
            let at = if self.flat {
                *self.at
            } else {
                At::Key(self.at, key)
            };
            (value, at)
        })
    }

    /// A field decoded with `f`; `None` when absent or when it failed,
    /// which [`Fields::end`] reports (the fields after a failure are still
    /// read, so that one pass finds every error).
    fn read<T>(
        &mut self,
        name: &'static str,
        required: bool,
        f: impl FnOnce(&Value, &At<'_>) -> Result<T>,
    ) -> Option<T> {
        let (v, at) = self.field(name, required)?;
        match f(v, &at) {
            Ok(x) => Some(x),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// An optional field, decoded with `f`.
    pub fn opt_with<T>(
        &mut self,
        name: &'static str,
        f: impl FnOnce(&Value, &At<'_>) -> Result<T>,
    ) -> Option<T> {
        self.read(name, false, f)
    }

    /// An optional field.
    pub fn opt<T: Decode>(&mut self, name: &'static str) -> Option<T> {
        self.read(name, false, T::decode)
    }

    /// A required field, decoded with `f`; absence is reported by [`Fields::end`].
    pub fn req_with<T>(
        &mut self,
        name: &'static str,
        f: impl FnOnce(&Value, &At<'_>) -> Result<T>,
    ) -> Option<T> {
        self.read(name, true, f)
    }

    /// A required field.
    pub fn req<T: Decode>(&mut self, name: &'static str) -> Option<T> {
        self.read(name, true, T::decode)
    }

    /// Every error of the object, in one error: the failures inside
    /// fields and keys not defined (in sorted key order), then keys left
    /// over, then the required fields that were absent. The first is the
    /// headline; the rest go in [`Error::more`] (at most [`MAX_ERRORS`]).
    pub fn end(&mut self) -> Result<()> {
        while let Some((key, _)) = self.keys.next() {
            if Some(key.as_str()) != self.tag {
                let e = self.unknown(key);
                self.fail(e);
            }
        }
        for name in std::mem::take(&mut self.missing) {
            let e = self
                .at
                .error(ErrorCode::MissingField, format!("missing field `{name}`"));
            self.fail(e);
        }
        match Error::gather(std::mem::take(&mut self.failures)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The error for a required field found absent after [`Fields::end`]
    /// succeeded (which it reports first, so this is not reached).
    pub fn incomplete(&self) -> Error {
        self.at.error(ErrorCode::MissingField, "missing field")
    }
}

/// The tag of a tagged object (`class`, `mode`): a required string naming a variant.
pub fn decode_tag(v: &Value, at: &At<'_>, tag: &'static str, names: &[&str]) -> Result<usize> {
    let Value::Object(map) = v else {
        return Err(at.error(ErrorCode::InvalidType, "expected an object"));
    };
    let Some(value) = map.get(tag) else {
        return Err(at.error(ErrorCode::MissingField, format!("missing field `{tag}`")));
    };
    let here = At::Key(at, tag);
    match value {
        Value::String(_) => decode_name(value, &here, names),
        _ => Err(here.error(ErrorCode::InvalidType, "expected a string")),
    }
}

/// Names for a fieldless enum: `as_str`, [`Decode`] and [`Encode`](crate::canonical::Encode) as a string.
macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// Every value, in the order of [`Self::NAMES`].
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];
            /// Every name.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The snake_case name.
            pub fn as_str(self) -> &'static str {
                match self { $( $ty::$variant => $name, )* }
            }
        }

        impl $crate::decode::Decode for $ty {
            fn decode(
                v: &serde_json::Value,
                at: &$crate::decode::At<'_>,
            ) -> $crate::error::Result<Self> {
                let i = $crate::decode::decode_name(v, at, Self::NAMES)?;
                $crate::decode::pick(Self::ALL, i, at)
            }
        }

        impl $crate::canonical::Encode for $ty {
            fn encode(&self, sink: &mut dyn $crate::canonical::Sink) {
                sink.str(self.as_str());
            }
        }
    };
}
pub(crate) use names;

/// [`Decode`] and [`Encode`](crate::canonical::Encode) for a plain object,
/// from its fields in RFC 8785 key order, each with its writer kind:
/// `u64`, `bool`, `str` and `doc` are required, `opt_u64` and `opt_doc`
/// optional, `list(MAX)` a required list of at most `MAX` items. Each field's
/// key is its name. The expansion is the hand-written shape: one read per
/// field, [`Fields::end`], then one `let … else` over the required fields
/// (optional ones stand in as `()`).
macro_rules! object {
    ($ty:ident { $($name:ident: $kind:ident $(($max:expr))?),* $(,)? }) => {
        impl $crate::decode::Decode for $ty {
            fn decode(
                v: &serde_json::Value,
                at: &$crate::decode::At<'_>,
            ) -> $crate::error::Result<Self> {
                let mut f = $crate::decode::Fields::open(v, at)?;
                $(let $name = object!(@read f $kind $name $(($max))?);)*
                f.end()?;
                let ($(object!(@pat $kind $name)),*) = ($(object!(@val $kind $name)),*) else {
                    return Err(f.incomplete());
                };
                Ok(Self { $($name),* })
            }
        }

        impl $crate::canonical::Encode for $ty {
            fn encode(&self, sink: &mut dyn $crate::canonical::Sink) {
                $crate::canonical::ObjectWriter::new(sink)
                    $(.$kind(stringify!($name), object!(@arg self $kind $name)))*
                    .end();
            }
        }
    };
    (@read $f:ident list $name:ident ($max:expr)) => {
        $f.req_with(stringify!($name), |v, at| $crate::decode::decode_list(v, at, $max))
    };
    (@read $f:ident opt_u64 $name:ident) => { $f.opt(stringify!($name)) };
    (@read $f:ident opt_doc $name:ident) => { $f.opt(stringify!($name)) };
    (@read $f:ident $kind:ident $name:ident) => { $f.req(stringify!($name)) };
    (@pat opt_u64 $name:ident) => { () };
    (@pat opt_doc $name:ident) => { () };
    (@pat $kind:ident $name:ident) => { Some($name) };
    (@val opt_u64 $name:ident) => { () };
    (@val opt_doc $name:ident) => { () };
    (@val $kind:ident $name:ident) => { $name };
    (@arg $s:ident u64 $name:ident) => { $s.$name };
    (@arg $s:ident bool $name:ident) => { $s.$name };
    (@arg $s:ident opt_u64 $name:ident) => { $s.$name };
    (@arg $s:ident opt_doc $name:ident) => { $s.$name.as_ref() };
    (@arg $s:ident $kind:ident $name:ident) => { &$s.$name };
}
pub(crate) use object;

#[cfg(test)]
mod tests {
    use super::*;

    fn code(text: &str) -> ErrorCode {
        parse_strict(text).unwrap_err().code
    }

    #[test]
    fn rejects_what_serde_lets_through() {
        assert_eq!(code(r#"{"a":1,"a":2}"#), ErrorCode::DuplicateKey);
        assert_eq!(code(r#"{"a":null}"#), ErrorCode::NullValue);
        assert_eq!(code(r#"{"a":1.5}"#), ErrorCode::FloatValue);
        assert_eq!(code(r#"{"a":1e3}"#), ErrorCode::FloatValue);
        assert_eq!(code(r#"{"a":-1}"#), ErrorCode::IntegerOutOfRange);
        assert_eq!(
            code(r#"{"a":9007199254740992}"#),
            ErrorCode::IntegerOutOfRange
        );
        assert_eq!(
            code(r#"{"a":184467440737095516160}"#),
            ErrorCode::IntegerOutOfRange
        );
        assert_eq!(code(r#"{"a":1"#), ErrorCode::InvalidJson);
        assert_eq!(code(r#"{"a":1} x"#), ErrorCode::InvalidJson);
        assert_eq!(code(&"[".repeat(40)), ErrorCode::NestingTooDeep);
        assert_eq!(code(&"[".repeat(100_000)), ErrorCode::NestingTooDeep);
        let big = format!("\"{}\"", "x".repeat(MAX_INPUT_BYTES));
        assert_eq!(code(&big), ErrorCode::InputTooLarge);
    }

    #[test]
    fn paths_point_at_the_offender() {
        let e = parse_strict(r#"{"a":[1,{"b":null}]}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("/a/1/b"));
        let e = parse_strict(r#"{"x/y":{"k":1,"k":2}}"#).unwrap_err();
        assert_eq!(e.path.as_deref(), Some("/x~1y/k"));
    }

    #[test]
    fn key_order_in_the_text_does_not_matter() {
        use crate::policy::Backoff;
        let fail = |text: &str| {
            let e = from_str::<Backoff>(text).unwrap_err();
            (e.code, e.path)
        };
        let sorted = from_str::<Backoff>(r#"{"base_ms":1,"max_ms":2,"retry_after_cap_ms":3}"#);
        let shuffled = from_str::<Backoff>(r#"{"retry_after_cap_ms":3,"max_ms":2,"base_ms":1}"#);
        assert_eq!(sorted.unwrap(), shuffled.unwrap());
        // The first unknown key in sorted order, wherever it stands.
        assert_eq!(
            fail(r#"{"zz":1,"max_ms":2,"c":1,"base_ms":1,"retry_after_cap_ms":3}"#),
            (ErrorCode::UnknownField, Some("/c".to_owned()))
        );
        // An unknown key sorting before a bad field is reported first...
        assert_eq!(
            fail(r#"{"max_ms":"x","retry_after_cap_ms":3,"c":1,"base_ms":1}"#),
            (ErrorCode::UnknownField, Some("/c".to_owned()))
        );
        // ...and one sorting after it is not.
        assert_eq!(
            fail(r#"{"zz":1,"max_ms":"x","retry_after_cap_ms":3,"base_ms":1}"#),
            (ErrorCode::InvalidType, Some("/max_ms".to_owned()))
        );
        assert_eq!(
            fail(r#"{"retry_after_cap_ms":3,"base_ms":1}"#).0,
            ErrorCode::MissingField
        );
        let e = parse_strict(r#"{"b":1,"a":{"y":1,"x":2,"y":3}}"#).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::DuplicateKey, Some("/a/y"))
        );
    }

    #[test]
    fn accepts_normal_form() {
        let v = parse_strict(r#"{"a":[1,true,"s",{"b":9007199254740991}]}"#).unwrap();
        assert_eq!(v["a"][3]["b"], 9_007_199_254_740_991_u64);
    }
}
