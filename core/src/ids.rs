//! Validated scalar types shared by every document: digests, identifiers and sets.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::canonical::{encode_list, Encode, Sink};
use crate::decode::{decode_array, decode_str, At, Decode};
use crate::error::{ErrorCode, Result as CoreResult};
use crate::limits::{MAX_ID_BYTES, MAX_SET_ITEMS};

/// A SHA-256 digest: exactly 64 lowercase hex characters. Shared, not
/// copied: a run repeats the same digests in every attempt and receipt.
#[derive(Debug, Clone, Eq, PartialOrd, Ord)]
pub struct Sha256Hex(Arc<str>);

/// Equal text; the same shared text is equal without comparing it (a run
/// checks every attempt against its plan, which share their digests and
/// identifiers).
impl PartialEq for Sha256Hex {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

/// The text's hash (consistent with equality).
impl std::hash::Hash for Sha256Hex {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl Sha256Hex {
    /// Check and wrap a digest string.
    pub fn parse(s: &str) -> Result<Self, String> {
        let ok = s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(Self(s.into()))
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
        Self(hex.into())
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Decode for Sha256Hex {
    fn decode(v: &Value, at: &At<'_>) -> CoreResult<Self> {
        Sha256Hex::parse(decode_str(v, at)?).map_err(|m| at.error(ErrorCode::InvalidDigest, m))
    }
}

impl Encode for Sha256Hex {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.str(&self.0);
    }
}

/// An identifier: 1 to 128 bytes of `A-Z a-z 0-9 . _ - : / @ +`. Shared,
/// not copied, like [`Sha256Hex`].
#[derive(Debug, Clone, Eq, PartialOrd, Ord)]
pub struct Identifier(Arc<str>);

/// Equal text, as for [`Sha256Hex`].
impl PartialEq for Identifier {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

/// The text's hash (consistent with equality).
impl std::hash::Hash for Identifier {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

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
            Ok(Self(s.into()))
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

impl Decode for Identifier {
    fn decode(v: &Value, at: &At<'_>) -> CoreResult<Self> {
        Identifier::parse(decode_str(v, at)?).map_err(|(c, m)| at.error(c, m))
    }
}

impl Encode for Identifier {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.str(&self.0);
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A set encoded as a JSON array: items unique, at most 64, kept (and emitted) in sorted order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Set<T: Ord>(Vec<T>);

impl<T: Ord> Set<T> {
    /// Whether an item is in the set.
    pub fn contains(&self, item: &T) -> bool {
        self.0.binary_search(item).is_ok()
    }

    /// Add an item; `false` when it was already there.
    pub fn insert(&mut self, item: T) -> bool {
        match self.0.binary_search(&item) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, item);
                true
            }
        }
    }

    /// The items in sorted order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// The number of items.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every item of `other` is in `self`.
    pub fn is_superset(&self, other: &Set<T>) -> bool {
        other.0.iter().all(|x| self.contains(x))
    }

    /// The items in `other` missing from `self`.
    pub fn missing_from<'a>(&self, other: &'a Set<T>) -> Vec<&'a T> {
        other.0.iter().filter(|x| !self.contains(x)).collect()
    }
}

impl<T: Ord> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut items: Vec<T> = iter.into_iter().collect();
        items.sort();
        items.dedup();
        Self(items)
    }
}

impl<T: Ord + Encode> Encode for Set<T> {
    fn encode(&self, sink: &mut dyn Sink) {
        encode_list(self.0.iter(), sink);
    }
}

impl<T: Ord + Decode> Decode for Set<T> {
    fn decode(v: &Value, at: &At<'_>) -> CoreResult<Self> {
        let mut out = Set(Vec::new());
        for (i, item) in decode_array(v, at)?.iter().enumerate() {
            let item = T::decode(item, &At::Index(at, i))?;
            if out.len() >= MAX_SET_ITEMS {
                return Err(at.error(
                    ErrorCode::TooManyItems,
                    format!("more than {MAX_SET_ITEMS} items"),
                ));
            }
            if !out.insert(item) {
                return Err(at.error(ErrorCode::DuplicateSetItem, "an item repeats"));
            }
        }
        Ok(out)
    }
}

/// Check the `schema` field of a document.
pub fn expect_schema(v: &Value, at: &At<'_>, expected: &str) -> CoreResult<()> {
    let s = decode_str(v, at)?;
    if s == expected {
        Ok(())
    } else {
        Err(at.error(
            ErrorCode::SchemaMismatch,
            format!("schema is `{}`, expected `{expected}`", truncate(s)),
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

        impl $crate::canonical::Encode for $name {
            fn encode(&self, sink: &mut dyn $crate::canonical::Sink) {
                sink.str($value);
            }
        }

        impl $crate::decode::Decode for $name {
            fn decode(
                v: &serde_json::Value,
                at: &$crate::decode::At<'_>,
            ) -> $crate::error::Result<Self> {
                $crate::ids::expect_schema(v, at, $value).map(|()| $name)
            }
        }
    };
}
pub(crate) use schema_marker;
