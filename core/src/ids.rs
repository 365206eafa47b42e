//! Validated scalar types shared by every document: digests, identifiers and sets.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::decode::coded;
use crate::error::ErrorCode;
use crate::limits::{MAX_ID_BYTES, MAX_SET_ITEMS};

/// A SHA-256 digest: exactly 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Sha256Hex(String);

impl Sha256Hex {
    /// Check and wrap a digest string.
    pub fn parse(s: &str) -> Result<Self, String> {
        let ok = s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(format!(
                "`{}` is not 64 lowercase hex characters",
                truncate(s)
            ))
        }
    }

    /// The hex string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wrap a digest the core computed itself.
    pub(crate) fn computed(hex: String) -> Self {
        Self(hex)
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Sha256Hex::parse(&s).map_err(|m| coded(ErrorCode::InvalidDigest, m))
    }
}

/// An identifier: 1 to 128 bytes of `A-Z a-z 0-9 . _ - : / @ +`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Identifier(String);

impl Identifier {
    /// Check and wrap an identifier.
    pub fn parse(s: &str) -> Result<Self, (ErrorCode, String)> {
        if s.len() > MAX_ID_BYTES {
            return Err((
                ErrorCode::StringTooLong,
                format!(
                    "identifier is {} bytes; the limit is {MAX_ID_BYTES}",
                    s.len()
                ),
            ));
        }
        let ok = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_:/@+".contains(&b));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err((
                ErrorCode::InvalidIdentifier,
                format!(
                    "`{}` is not a non-empty identifier of A-Z a-z 0-9 . _ - : / @ +",
                    truncate(s)
                ),
            ))
        }
    }

    /// The identifier string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Identifier {
    fn deserialize<D: Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Identifier::parse(&s).map_err(|(c, m)| coded(c, m))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A set encoded as a JSON array: items unique, at most 64, emitted in sorted order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Set<T: Ord>(pub BTreeSet<T>);

impl<T: Ord> Set<T> {
    /// Whether every item of `other` is in `self`.
    pub fn is_superset(&self, other: &Set<T>) -> bool {
        self.0.is_superset(&other.0)
    }

    /// The items in `other` missing from `self`.
    pub fn missing_from<'a>(&self, other: &'a Set<T>) -> Vec<&'a T> {
        other.0.iter().filter(|x| !self.0.contains(x)).collect()
    }
}

impl<T: Ord> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<T: Ord + Serialize> Serialize for Set<T> {
    fn serialize<S: Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl<'de, T: Ord + Deserialize<'de>> Deserialize<'de> for Set<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Ord + Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Set<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of unique items")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Set<T>, A::Error> {
                let mut out = BTreeSet::new();
                while let Some(item) = seq.next_element::<T>()? {
                    if out.len() >= MAX_SET_ITEMS {
                        return Err(coded(
                            ErrorCode::TooManyItems,
                            format!("more than {MAX_SET_ITEMS} items"),
                        ));
                    }
                    if !out.insert(item) {
                        return Err(coded::<A::Error>(
                            ErrorCode::DuplicateSetItem,
                            "an item repeats",
                        ));
                    }
                }
                Ok(Set(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// Deserialize a bounded list, rejecting more than `N` items.
pub fn bounded_vec<'de, D, T, const N: usize>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T, const N: usize>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of at most {N} items")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<T>()? {
                if out.len() >= N {
                    return Err(coded(
                        ErrorCode::TooManyItems,
                        format!("more than {N} items"),
                    ));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V::<T, N>(std::marker::PhantomData))
}

/// Check the `schema` field of a document.
pub fn expect_schema<'de, D: Deserializer<'de>>(d: D, expected: &str) -> Result<(), D::Error> {
    let s = String::deserialize(d)?;
    if s == expected {
        Ok(())
    } else {
        Err(coded(
            ErrorCode::SchemaMismatch,
            format!("schema is `{}`, expected `{expected}`", truncate(&s)),
        ))
    }
}

/// Declare a zero-sized marker for a document's `schema` string.
macro_rules! schema_marker {
    ($(#[$doc:meta])* $name:ident = $value:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name;

        impl $name {
            /// The schema string.
            pub const NAME: &'static str = $value;
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str($value)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                $crate::ids::expect_schema(d, $value).map(|()| $name)
            }
        }
    };
}
pub(crate) use schema_marker;
