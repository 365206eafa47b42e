//! Strict JSON text to a [`Value`], in one pass.
//!
//! RFC 8259 syntax, plus the normal-form rules every document obeys: no
//! duplicate keys, no `null`, no number with a fraction or exponent, integers
//! in 0..=2^53-1 only, at most [`MAX_DEPTH`] nested arrays and objects. The
//! first offence is reported with its code and the JSON Pointer of the value
//! (or, for a repeated key, of the key); broken syntax is `invalid_json`.
//!
//! Numbers are classified without floating point, as a binary64 reader would
//! see them: a number that rounds to infinity is not JSON (`invalid_json`),
//! one whose magnitude rounds to 2^53 or more is an integer out of range,
//! anything else with a fraction or exponent (or `-0`) a float.

use serde_json::{Map, Value};

use crate::decode::At;
use crate::error::{Error, ErrorCode, Result};
use crate::limits::{MAX_DEPTH, MAX_SAFE_INTEGER};

/// Parse JSON text (already within the size limit) into a value.
pub(crate) fn parse(text: &str) -> Result<Value> {
    parse_with(text, false)
}

/// Parse any JSON text (already within the size limit): `null` and numbers
/// of every form are values (each number as the binary64 it denotes), but
/// duplicate keys, lone surrogates, numbers that round to infinity and deep
/// nesting are still errors. The logical request holds such JSON.
pub(crate) fn parse_any(text: &str) -> Result<Value> {
    parse_with(text, true)
}

/// [`parse_any`] after the size check.
pub(crate) fn parse_any_sized(text: &str) -> Result<Value> {
    if text.len() > crate::limits::MAX_INPUT_BYTES {
        return Err(Error::new(
            ErrorCode::InputTooLarge,
            "input over the size limit",
        ));
    }
    parse_any(text)
}

fn parse_with(text: &str, any: bool) -> Result<Value> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        any,
    };
    let v = p.value(&At::Root, 0)?;
    p.ws();
    if p.i < p.s.len() {
        return Err(syntax("trailing characters"));
    }
    Ok(v)
}

fn syntax(message: &str) -> Error {
    Error::new(ErrorCode::InvalidJson, message)
}

struct Parser<'t> {
    s: &'t [u8],
    i: usize,
    /// Any JSON: `null` and numbers of every form are values.
    any: bool,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) {
        self.i = self.i.saturating_add(1);
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.bump();
        }
    }

    fn value(&mut self, at: &At<'_>, depth: usize) -> Result<Value> {
        self.ws();
        match self.peek() {
            Some(b'{') => self.object(at, depth),
            Some(b'[') => self.array(at, depth),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal(b"true", Value::Bool(true)),
            Some(b'f') => self.literal(b"false", Value::Bool(false)),
            Some(b'n') if self.any => self.literal(b"null", Value::Null),
            Some(b'n') => {
                self.literal(b"null", Value::Null)?;
                Err(at.error(
                    ErrorCode::NullValue,
                    "null is not allowed; omit optional fields",
                ))
            }
            Some(b'-' | b'0'..=b'9') => self.number(at),
            _ => Err(syntax("expected a value")),
        }
    }

    fn literal(&mut self, word: &[u8], v: Value) -> Result<Value> {
        let end = self.i.saturating_add(word.len());
        if self.s.get(self.i..end) == Some(word) {
            self.i = end;
            Ok(v)
        } else {
            Err(syntax("expected a literal"))
        }
    }

    fn enter(at: &At<'_>, depth: usize) -> Result<()> {
        if depth >= MAX_DEPTH {
            return Err(at.error(ErrorCode::NestingTooDeep, "nesting deeper than the limit"));
        }
        Ok(())
    }

    fn array(&mut self, at: &At<'_>, depth: usize) -> Result<Value> {
        self.bump();
        Self::enter(at, depth)?;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.bump();
            return Ok(Value::Array(items));
        }
        loop {
            let v = self.value(&At::Index(at, items.len()), depth.saturating_add(1))?;
            items.push(v);
            self.ws();
            match self.peek() {
                Some(b',') => self.bump(),
                Some(b']') => {
                    self.bump();
                    return Ok(Value::Array(items));
                }
                _ => return Err(syntax("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, at: &At<'_>, depth: usize) -> Result<Value> {
        self.bump();
        Self::enter(at, depth)?;
        let mut map = Map::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.bump();
            return Ok(Value::Object(map));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(syntax("expected a string key"));
            }
            let key = self.string()?;
            let here = At::Key(at, &key);
            if map.contains_key(&key) {
                return Err(here.error(ErrorCode::DuplicateKey, "a key repeats"));
            }
            self.ws();
            if self.peek() != Some(b':') {
                return Err(syntax("expected `:`"));
            }
            self.bump();
            let v = self.value(&here, depth.saturating_add(1))?;
            map.insert(key, v);
            self.ws();
            match self.peek() {
                Some(b',') => self.bump(),
                Some(b'}') => {
                    self.bump();
                    return Ok(Value::Object(map));
                }
                _ => return Err(syntax("expected `,` or `}`")),
            }
        }
    }

    /// A string, the opening quote under the cursor.
    fn string(&mut self) -> Result<String> {
        self.bump();
        let mut out = String::new();
        loop {
            let start = self.i;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.bump();
            }
            // The run stops at ASCII, so it ends on a character boundary.
            let run = self.s.get(start..self.i).unwrap_or_default();
            out.push_str(std::str::from_utf8(run).map_err(|_| syntax("invalid UTF-8"))?);
            match self.peek() {
                Some(b'"') => {
                    self.bump();
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.bump();
                    let c = self.escape()?;
                    out.push(c);
                }
                Some(_) => return Err(syntax("control character in a string")),
                None => return Err(syntax("unterminated string")),
            }
        }
    }

    /// The character of an escape, the backslash consumed.
    fn escape(&mut self) -> Result<char> {
        let Some(b) = self.peek() else {
            return Err(syntax("unterminated escape"));
        };
        self.bump();
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        if self.s.get(self.i..self.i.saturating_add(2)) != Some(b"\\u") {
                            return Err(syntax("lone leading surrogate"));
                        }
                        self.i = self.i.saturating_add(2);
                        let lo = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return Err(syntax("lone leading surrogate"));
                        }
                        0x10000u32
                            .saturating_add((hi.saturating_sub(0xD800)) << 10)
                            .saturating_add(lo.saturating_sub(0xDC00))
                    }
                    0xDC00..=0xDFFF => return Err(syntax("lone trailing surrogate")),
                    c => c,
                };
                char::from_u32(code).ok_or_else(|| syntax("invalid escape"))?
            }
            _ => return Err(syntax("invalid escape")),
        })
    }

    fn hex4(&mut self) -> Result<u32> {
        let mut n = 0u32;
        for _ in 0..4 {
            let d = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or_else(|| syntax("invalid \\u escape"))?;
            n = (n << 4) | d;
            self.bump();
        }
        Ok(n)
    }

    fn digits(&mut self) -> &[u8] {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.bump();
        }
        self.s.get(start..self.i).unwrap_or_default()
    }

    /// A number: an integer in range, or the code of its offence.
    fn number(&mut self, at: &At<'_>) -> Result<Value> {
        let start = self.i;
        let strict = self.strict_number(at);
        if !self.any {
            return strict;
        }
        if let Err(e) = &strict {
            if e.code == ErrorCode::InvalidJson {
                return strict;
            }
        }
        // The syntax is valid JSON: the number is the binary64 it denotes
        // (Rust's parse rounds correctly); one that rounds to infinity is not.
        let text = std::str::from_utf8(self.s.get(start..self.i).unwrap_or_default())
            .map_err(|_| syntax("invalid number"))?;
        text.parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| syntax("number out of range"))
    }

    /// A number under the document rules: an integer in range, or the code of its offence.
    fn strict_number(&mut self, at: &At<'_>) -> Result<Value> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.bump();
        }
        let int = self.digits().to_vec();
        match int.as_slice() {
            [] => return Err(syntax("invalid number")),
            [b'0', _, ..] => return Err(syntax("invalid number")),
            _ => {}
        }
        let mut frac: &[u8] = &[];
        let mut fractional = false;
        if self.peek() == Some(b'.') {
            self.bump();
            fractional = true;
            frac = self.digits();
            if frac.is_empty() {
                return Err(syntax("invalid number"));
            }
        }
        let frac = frac.to_vec();
        let mut exp: i64 = 0;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.bump();
            fractional = true;
            let minus = match self.peek() {
                Some(b'-') => {
                    self.bump();
                    true
                }
                Some(b'+') => {
                    self.bump();
                    false
                }
                _ => false,
            };
            let digits = self.digits();
            if digits.is_empty() {
                return Err(syntax("invalid number"));
            }
            for d in digits {
                exp = exp
                    .saturating_mul(10)
                    .saturating_add(i64::from(d.saturating_sub(b'0')));
            }
            if minus {
                exp = exp.saturating_neg();
            }
        }
        if !fractional && !negative {
            let mut n: u64 = 0;
            let fits = int.iter().all(|d| {
                match n
                    .checked_mul(10)
                    .and_then(|x| x.checked_add(u64::from(d.saturating_sub(b'0'))))
                {
                    Some(x) => {
                        n = x;
                        true
                    }
                    None => false,
                }
            });
            if fits && n <= MAX_SAFE_INTEGER {
                return Ok(Value::from(n));
            }
        }
        let zero = int.iter().chain(frac.iter()).all(|d| *d == b'0');
        if zero && negative && !fractional {
            // `-0` reads as a float.
            return Err(float(at));
        }
        match magnitude(&int, &frac, exp) {
            Magnitude::Infinite => Err(syntax("number out of range")),
            Magnitude::Large => {
                Err(at.error(ErrorCode::IntegerOutOfRange, "integer outside 0..=2^53 - 1"))
            }
            Magnitude::Small if !fractional => {
                Err(at.error(ErrorCode::IntegerOutOfRange, "integer outside 0..=2^53 - 1"))
            }
            Magnitude::Small => Err(float(at)),
        }
    }
}

fn float(at: &At<'_>) -> Error {
    at.error(
        ErrorCode::FloatValue,
        "numbers must be integers without fraction or exponent",
    )
}

enum Magnitude {
    /// Rounds to 2^53 or above, but not to infinity.
    Large,
    /// Rounds below 2^53.
    Small,
    /// Rounds to infinity.
    Infinite,
}

/// Smallest magnitude that rounds to 2^53: 2^53 - 1/2 (ties go to the even 2^53).
const LARGE: &[u8] = b"90071992547409915";
const LARGE_POINT: i64 = 16;
/// Smallest magnitude that rounds to infinity: 2^1024 - 2^970.
const INFINITE: &[u8] = b"179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792";
const INFINITE_POINT: i64 = 309;

/// How a decimal `int.frac × 10^exp` rounds, in binary64.
fn magnitude(int: &[u8], frac: &[u8], exp: i64) -> Magnitude {
    let all: Vec<u8> = int.iter().chain(frac.iter()).copied().collect();
    let lead = all.iter().take_while(|d| **d == b'0').count();
    let digits = all.get(lead..).unwrap_or_default();
    let int_len = i64::try_from(int.len()).unwrap_or(i64::MAX);
    let lead = i64::try_from(lead).unwrap_or(i64::MAX);
    // The value is 0.<digits> × 10^point.
    let point = int_len.saturating_sub(lead).saturating_add(exp);
    let at_least = |bound: &[u8], bound_point: i64| {
        !digits.is_empty()
            && match point.cmp(&bound_point) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal => {
                    let len = digits.len().max(bound.len());
                    let pad = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(b'0');
                    (0..len)
                        .map(|i| (pad(digits, i), pad(bound, i)))
                        .find(|(a, b)| a != b)
                        .is_none_or(|(a, b)| a > b)
                }
            }
    };
    if at_least(INFINITE, INFINITE_POINT) {
        Magnitude::Infinite
    } else if at_least(LARGE, LARGE_POINT) {
        Magnitude::Large
    } else {
        Magnitude::Small
    }
}

#[cfg(test)]
mod tests {
    //! The parser against the serde_json-based reader it replaced, as an oracle.
    use super::*;
    use crate::limits::{MAX_DEPTH, MAX_SAFE_INTEGER};
    use proptest::prelude::*;

    mod oracle {
        use std::cell::RefCell;
        use std::fmt;

        use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
        use serde_json::{Map, Value};

        use crate::decode::At;
        use crate::error::{Error, ErrorCode, Result};
        use crate::limits::{MAX_DEPTH, MAX_SAFE_INTEGER};

        pub fn parse(text: &str) -> Result<Value> {
            let failure = RefCell::new(None);
            let mut de = serde_json::Deserializer::from_str(text);
            let seed = Strict {
                depth: 0,
                at: At::Root,
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

        struct Strict<'a> {
            depth: usize,
            at: At<'a>,
            failure: &'a RefCell<Option<Error>>,
        }

        impl<'a> Strict<'a> {
            fn fail<E: de::Error>(&self, code: ErrorCode, message: String) -> E {
                let mut slot = self.failure.borrow_mut();
                if slot.is_none() {
                    let path = self.at.pointer();
                    *slot = Some(Error::at(code, path, message.clone()));
                }
                E::custom(message)
            }

            fn child<'b>(&'b self, at: At<'b>) -> Strict<'b>
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
            fn deserialize<D: de::Deserializer<'de>>(
                self,
                d: D,
            ) -> std::result::Result<Value, D::Error> {
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
                    Err(_) => {
                        Err(self.fail(ErrorCode::IntegerOutOfRange, format!("{v} is negative")))
                    }
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

            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Value, A::Error> {
                self.enter()?;
                let mut items = Vec::new();
                loop {
                    let child = self.child(At::Index(&self.at, items.len()));
                    match seq.next_element_seed(child)? {
                        Some(v) => items.push(v),
                        None => break,
                    }
                }
                Ok(Value::Array(items))
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Value, A::Error> {
                self.enter()?;
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let child = self.child(At::Key(&self.at, &key));
                    if out.contains_key(&key) {
                        return Err(
                            child.fail(ErrorCode::DuplicateKey, format!("key `{key}` repeats"))
                        );
                    }
                    let v = map.next_value_seed(child)?;
                    out.insert(key, v);
                }
                Ok(Value::Object(out))
            }
        }
    }

    fn outcome(r: Result<Value>) -> std::result::Result<Value, (ErrorCode, Option<String>)> {
        r.map_err(|e| (e.code, e.path))
    }

    fn same(text: &str) {
        assert_eq!(
            outcome(parse(text)),
            outcome(oracle::parse(text)),
            "{text:?}"
        );
    }

    #[test]
    fn agrees_on_edge_cases() {
        for t in [
            "",
            " ",
            "{}",
            "[]",
            "[1,]",
            "{\"a\":1,}",
            "{,}",
            "[,1]",
            "{\"a\" 1}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1,\"a\"}",
            "{\"a\":1,\"a\":",
            "-0",
            "-0.0",
            "0e5",
            "-1",
            "-9223372036854775808",
            "-9223372036854775809",
            "01",
            "-01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "1E-2",
            "1.5",
            "1e5",
            "1e20",
            "9007199254740991",
            "9007199254740992",
            "9007199254740991.4",
            "9007199254740991.5",
            "9007199254740991.49999",
            "18446744073709551615",
            "18446744073709551616",
            "1e308",
            "1.7976931348623157e308",
            "1.7976931348623158e308",
            "1.7976931348623159e308",
            "1e309",
            "-1e309",
            "1e-400",
            "0.000",
            "-",
            "+1",
            "tru",
            "true",
            "truex",
            "nul",
            "null",
            "nullx",
            "[null]",
            "{\"a\":null}",
            "\"\\u00e9\"",
            "\"\\ud83d\\ude00\"",
            "\"\\ud83d\"",
            "\"\\ud83dx\"",
            "\"\\ude00\"",
            "\"\\ud83d\\u0041\"",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "\"é\"",
            "\"abc",
            "[1 2]",
            "{\"a\":[1,{\"b\":1.5}]}",
            "{\"x/y~\":{\"k\":1,\"k\":2}}",
            "1 x",
            "[1] x",
            "{\"a\":1} ",
            " \n\t\r1",
            "\u{feff}1",
            "[\"\\/\"]",
        ] {
            same(t);
        }
        same(&format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        ));
        same(&format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        ));
        same(&"[".repeat(100_000));
        same(&format!("{}{{", "[".repeat(MAX_DEPTH)));
        same(&format!("1{}", "0".repeat(400)));
        same(&format!("-1{}", "0".repeat(400)));
        same(&format!("0.{}1", "0".repeat(400)));
        let _ = MAX_SAFE_INTEGER;
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn agrees_with_the_reader_it_replaced(
            text in r#"[\[\]{}:, "a-z0-9.eE+\-\\u]{0,24}"#
        ) {
            same(&text);
        }

        #[test]
        fn agrees_on_numbers(text in r"-?[0-9]{0,20}(\.[0-9]{0,18})?([eE][+-]?[0-9]{0,4})?") {
            same(&text);
        }
    }
}
