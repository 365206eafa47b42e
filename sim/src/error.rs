//! The simulator's errors: a stable snake_case code, the JSON Pointer of the
//! field at fault where there is one, and a message for people.

use std::fmt;

/// A coded error: bad scenario input, an unreadable file, or a refusal of the
/// core (which should not happen with a valid scenario, and is reported, not
/// panicked on, if it does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    /// Stable code, e.g. `missing_field`, `invalid_value`, `unknown_scenario`.
    pub code: &'static str,
    /// JSON Pointer of the offending field (empty when none applies).
    pub path: String,
    /// Human-readable detail; not part of the contract.
    pub message: String,
}

impl SimError {
    /// An error with a code, a pointer and a message.
    pub fn new(code: &'static str, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            path: path.into(),
            message: message.into(),
        }
    }

    /// A core error, keeping its code.
    pub fn core(e: &retryledger_core::Error) -> Self {
        Self {
            code: e.code.as_str(),
            path: e.path.clone().unwrap_or_default(),
            message: e.message.clone(),
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.code, self.message)
        } else {
            write!(f, "{} at {}: {}", self.code, self.path, self.message)
        }
    }
}

impl std::error::Error for SimError {}

/// The simulator's result.
pub type Result<T> = std::result::Result<T, SimError>;
