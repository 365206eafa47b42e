//! Strict decoding: JSON text to typed documents in normal form.
//!
//! Two passes. The first reads the text into a [`serde_json::Value`] while
//! rejecting what serde would let through silently: duplicate keys, `null`,
//! floats, integers outside 0..=2^53-1, oversize input and deep nesting. The
//! second maps the value onto the typed document with unknown fields denied.
//! Every failure is an [`Error`] with a code and a JSON Pointer.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::{Error, ErrorCode, Result};
use crate::limits::{MAX_DEPTH, MAX_INPUT_BYTES, MAX_SAFE_INTEGER};

/// Parse JSON text into a value, enforcing the normal-form rules of every document.
pub fn parse_strict(text: &str) -> Result<Value> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(Error::new(
            ErrorCode::InputTooLarge,
            format!(
                "input is {} bytes; the limit is {MAX_INPUT_BYTES}",
                text.len()
            ),
        ));
    }
    let failure = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = Strict {
        depth: 0,
        at: Segment::Root,
        failure: &failure,
    };
    let parsed = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => Err(failure
            .into_inner()
            .unwrap_or_else(|| Error::new(ErrorCode::InvalidJson, e.to_string()))),
    }
}

/// Decode JSON text into a typed document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T> {
    from_value(parse_strict(text)?)
}

/// Map a strict value onto a typed document, translating serde's errors to codes.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T> {
    serde_path_to_error::deserialize(Typed(value)).map_err(|e| {
        let path = pointer(e.path());
        let message = e.inner().to_string();
        Error::at(code_of(&message), path, message)
    })
}

/// A [`Value`] as a deserializer that, unlike `serde_json`'s own, refuses an
/// array where a struct is expected: serde's derived structs also accept
/// their fields by position, which would let `"backoff": [100, 1000, 2000]`
/// decode (and hash) like the object it is not. Everything else is
/// delegated, so every other message, and so every code, is serde_json's.
struct Typed(Value);

type JsonError = serde_json::Error;

macro_rules! delegate {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, JsonError> {
                de::Deserializer::$method(self.0, visitor)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Typed {
    type Error = JsonError;

    fn deserialize_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.0 {
            Value::Array(items) => visit_array(items, visitor),
            Value::Object(map) => visit_object(map, visitor),
            other => de::Deserializer::deserialize_any(other, visitor),
        }
    }

    delegate! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32
        deserialize_f64 deserialize_char deserialize_str deserialize_string
        deserialize_bytes deserialize_byte_buf deserialize_unit deserialize_identifier
    }

    fn deserialize_option<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Typed(other)),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        de::Deserializer::deserialize_unit_struct(self.0, name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.0 {
            Value::Array(items) => visit_array(items, visitor),
            other => de::Deserializer::deserialize_seq(other, visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.0 {
            Value::Object(map) => visit_object(map, visitor),
            other => de::Deserializer::deserialize_map(other, visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.0 {
            Value::Object(map) => visit_object(map, visitor),
            Value::Array(_) => Err(de::Error::invalid_type(de::Unexpected::Seq, &visitor)),
            other => de::Deserializer::deserialize_struct(other, name, fields, visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        de::Deserializer::deserialize_enum(self.0, name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, JsonError> {
        visitor.visit_unit()
    }
}

/// As serde_json: visit the items, then refuse any the visitor left over.
fn visit_array<'de, V: Visitor<'de>>(
    items: Vec<Value>,
    visitor: V,
) -> std::result::Result<V::Value, JsonError> {
    let len = items.len();
    let mut seq = TypedSeq(items.into_iter());
    let out = visitor.visit_seq(&mut seq)?;
    if seq.0.len() == 0 {
        Ok(out)
    } else {
        Err(de::Error::invalid_length(len, &"fewer elements in array"))
    }
}

/// As serde_json: visit the entries, then refuse any the visitor left over.
fn visit_object<'de, V: Visitor<'de>>(
    map: Map<String, Value>,
    visitor: V,
) -> std::result::Result<V::Value, JsonError> {
    let len = map.len();
    let mut access = TypedMap {
        iter: map.into_iter(),
        value: None,
    };
    let out = visitor.visit_map(&mut access)?;
    if access.iter.len() == 0 {
        Ok(out)
    } else {
        Err(de::Error::invalid_length(len, &"fewer elements in map"))
    }
}

struct TypedSeq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for TypedSeq {
    type Error = JsonError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> std::result::Result<Option<T::Value>, JsonError> {
        self.0
            .next()
            .map(|v| seed.deserialize(Typed(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct TypedMap {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for TypedMap {
    type Error = JsonError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, JsonError> {
        match self.iter.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(de::value::StringDeserializer::<JsonError>::new(key))
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, JsonError> {
        match self.value.take() {
            Some(v) => seed.deserialize(Typed(v)),
            None => Err(de::Error::custom("value is missing")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// JSON Pointer (RFC 6901) for a serde path.
fn pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => {
                out.push('/');
                out.push_str(&index.to_string());
            }
            Segment::Map { key } => {
                out.push('/');
                out.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// Our own messages carry their code as a `code: ` prefix; serde's are recognized by wording.
fn code_of(message: &str) -> ErrorCode {
    if let Some((head, _)) = message.split_once(": ") {
        if let Some(code) = ErrorCode::ALL.iter().find(|c| c.as_str() == head) {
            return *code;
        }
    }
    if message.starts_with("unknown field") {
        ErrorCode::UnknownField
    } else if message.starts_with("missing field") {
        ErrorCode::MissingField
    } else if message.starts_with("invalid type") {
        ErrorCode::InvalidType
    } else if message.starts_with("invalid length") && message.contains("expected a tuple") {
        // Fewer items than a fixed-size pair: not "too many".
        ErrorCode::InvalidValue
    } else if message.starts_with("invalid length") {
        ErrorCode::TooManyItems
    } else {
        ErrorCode::InvalidValue
    }
}

/// A serde error message that names its code, for validating newtypes.
pub fn coded<E: de::Error>(code: ErrorCode, message: impl fmt::Display) -> E {
    E::custom(format!("{}: {message}", code.as_str()))
}

/// Where a value sits, as a chain of borrowed segments: rendered as a JSON
/// Pointer only when something fails there, so valid input allocates no paths.
#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Key(&'a Segment<'a>, &'a str),
    Index(&'a Segment<'a>, usize),
}

impl Segment<'_> {
    fn render(&self, out: &mut String) {
        match self {
            Segment::Root => {}
            Segment::Key(parent, key) => {
                parent.render(out);
                out.push('/');
                out.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Index(parent, i) => {
                parent.render(out);
                out.push('/');
                out.push_str(&i.to_string());
            }
        }
    }
}

struct Strict<'a> {
    depth: usize,
    at: Segment<'a>,
    failure: &'a RefCell<Option<Error>>,
}

impl<'a> Strict<'a> {
    fn fail<E: de::Error>(&self, code: ErrorCode, message: String) -> E {
        let mut slot = self.failure.borrow_mut();
        if slot.is_none() {
            let mut path = String::new();
            self.at.render(&mut path);
            *slot = Some(Error::at(code, path, message.clone()));
        }
        E::custom(message)
    }

    fn child<'b>(&'b self, at: Segment<'b>) -> Strict<'b>
    where
        'a: 'b,
    {
        Strict {
            depth: self.depth.saturating_add(1),
            at,
            failure: self.failure,
        }
    }

    fn enter<E: de::Error>(&self) -> std::result::Result<(), E> {
        if self.depth >= MAX_DEPTH {
            return Err(self.fail(
                ErrorCode::NestingTooDeep,
                format!("nesting deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value in normal form")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
        if v > MAX_SAFE_INTEGER {
            return Err(self.fail(
                ErrorCode::IntegerOutOfRange,
                format!("{v} is above 2^53 - 1"),
            ));
        }
        Ok(Value::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
        match u64::try_from(v) {
            Ok(u) => self.visit_u64(u),
            Err(_) => Err(self.fail(ErrorCode::IntegerOutOfRange, format!("{v} is negative"))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        // serde_json hands integers beyond u64 to us as floats.
        let integral = v.is_finite() && v.fract() == 0.0;
        if integral && (v.abs() >= 9_007_199_254_740_992.0) {
            return Err(self.fail(
                ErrorCode::IntegerOutOfRange,
                "integer outside 0..=2^53 - 1".to_owned(),
            ));
        }
        Err(self.fail(
            ErrorCode::FloatValue,
            "numbers must be integers without fraction or exponent".to_owned(),
        ))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Value, E> {
        Err(self.fail(
            ErrorCode::NullValue,
            "null is not allowed; omit optional fields".to_owned(),
        ))
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        self.enter()?;
        let mut items = Vec::new();
        loop {
            let child = self.child(Segment::Index(&self.at, items.len()));
            match seq.next_element_seed(child)? {
                Some(v) => items.push(v),
                None => break,
            }
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        self.enter()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(Segment::Key(&self.at, &key));
            if out.contains_key(&key) {
                return Err(child.fail(ErrorCode::DuplicateKey, format!("key `{key}` repeats")));
            }
            let v = map.next_value_seed(child)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

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
    fn accepts_normal_form() {
        let v = parse_strict(r#"{"a":[1,true,"s",{"b":9007199254740991}]}"#).unwrap();
        assert_eq!(v["a"][3]["b"], 9_007_199_254_740_991_u64);
    }
}
