//! What a provider's error really says: error tables and retry hints.
//!
//! A route may name its provider family (`provider_family` on the route, from
//! its route release). For such a route the classifier reads, besides the
//! status and the `Retry-After` headers of v1:
//!
//! - the error body, bounded: at most [`MAX_ERROR_BODY_BYTES`] of JSON
//!   (nesting at most [`crate::limits::MAX_DEPTH`]), of which only
//!   `error.type`, `error.code`, `error.status`, `error.details[].@type`,
//!   `retryDelay` and `quotaId` are read. The error object is the body's
//!   `error` member, or the body itself when it has none (an SDK that hands
//!   over only the inner object). The provider's code is `error.code` (else
//!   `error.type`) for `openai` and `azure_openai`, `error.type` for
//!   `anthropic` and `error.status` for `google`; (family, status, code, quota
//!   scope) is looked up in [`TABLE`], and a row decides the outcome kind.
//!   Without a row the status rules of [`crate::http::classify_http`] decide.
//! - retry hints from four sources in one precedence: `retry-after-ms`, then
//!   `Retry-After`, then the body's `google.rpc.RetryInfo` `retryDelay` (a
//!   protobuf duration such as `58.934310785s`), then the rate-limit reset
//!   headers whose matching `remaining` is 0 (`x-ratelimit-reset-requests` /
//!   `-tokens` in OpenAI's duration form such as `6m0s`, `1s` or `20ms`;
//!   `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset`
//!   as RFC 3339; the IETF `RateLimit` field's `t`, or the matching
//!   `RateLimit-Policy` window `w`); the latest of the exhausted resets
//!   counts. The first source that gives a valid hint wins and the outcome
//!   records it as `retry_after_source`.
//!
//! Nothing here ends a run: a missing, oversize, malformed or too deep body
//! falls back to the status rules, and a hint that is garbage, negative, in
//! the past or beyond [`MAX_HINT_MS`] is ignored (the next source is read);
//! each is a [`Note`] on the judgement. A route without a provider family is
//! judged exactly as in v1 (its outcomes and digests do not change).

use crate::decode::names;
use crate::limits::MAX_SAFE_INTEGER;
use crate::outcome::{NonRetryableKind, Outcome, RetryableKind};

mod body;
mod hint;
mod rate_limits;

use body::{lookup, read_body};
use hint::hint;

pub use hint::{parse_duration, parse_go_duration};
pub use rate_limits::{rate_limits, Capacity, RateLimits, RATE_LIMIT_HEADERS};

/// Largest error body read, in bytes (16 KiB); a longer one is noted and ignored.
pub const MAX_ERROR_BODY_BYTES: usize = 16 * 1024;
/// Longest wait a body or reset hint may ask for (7 days); a longer one is
/// noted and ignored.
pub const MAX_HINT_MS: u64 = 7 * 24 * 3_600_000;
/// Most entries of `error.details` (and of a QuotaFailure's `violations`) read.
pub const MAX_BODY_DETAILS: usize = 16;

/// A provider family: which error table and body fields apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderFamily {
    /// Every hint source, no error table.
    Generic,
    /// OpenAI.
    Openai,
    /// Azure OpenAI (OpenAI's table).
    AzureOpenai,
    /// Anthropic.
    Anthropic,
    /// Google (Gemini API, Vertex AI).
    Google,
}

names!(ProviderFamily {
    Generic => "generic",
    Openai => "openai",
    AzureOpenai => "azure_openai",
    Anthropic => "anthropic",
    Google => "google",
});

/// Something the classifier ignored, and why. Noted on the judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Note {
    /// The provider family expects an error body and none was passed.
    BodyMissing,
    /// The body is over [`MAX_ERROR_BODY_BYTES`].
    BodyOversize,
    /// The body is not a JSON object.
    BodyMalformed,
    /// The body nests deeper than the limit.
    BodyTooDeep,
    /// `retry-after-ms` is not a millisecond count.
    RetryAfterMsInvalid,
    /// `Retry-After` is neither delay-seconds nor an HTTP-date.
    RetryAfterInvalid,
    /// `retryDelay` is not a non-negative protobuf duration.
    RetryDelayInvalid,
    /// `retryDelay` is beyond [`MAX_HINT_MS`].
    RetryDelayTooFar,
    /// A rate-limit header is garbage.
    RatelimitInvalid,
    /// A rate-limit reset is in the past.
    ResetPast,
    /// A rate-limit reset is beyond [`MAX_HINT_MS`].
    ResetTooFar,
}

names!(Note {
    BodyMissing => "body_missing",
    BodyOversize => "body_oversize",
    BodyMalformed => "body_malformed",
    BodyTooDeep => "body_too_deep",
    RetryAfterMsInvalid => "retry_after_ms_invalid",
    RetryAfterInvalid => "retry_after_invalid",
    RetryDelayInvalid => "retry_delay_invalid",
    RetryDelayTooFar => "retry_delay_too_far",
    RatelimitInvalid => "ratelimit_invalid",
    ResetPast => "reset_past",
    ResetTooFar => "reset_too_far",
});

/// Which quotas a `google.rpc.QuotaFailure` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// The row applies whatever the body's quotas.
    Any,
    /// A violated quota's `quotaId` contains `PerDay`: it cannot clear within a run.
    PerDay,
}

/// The outcome kind a row decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Retryable, with the hint.
    Retryable(RetryableKind),
    /// Non-retryable.
    NonRetryable(NonRetryableKind),
}

/// One row of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The provider family.
    pub family: ProviderFamily,
    /// The HTTP status.
    pub status: u64,
    /// The provider's error code (see the module documentation for the field).
    pub code: &'static str,
    /// The quota condition.
    pub quota: Quota,
    /// What the row decides.
    pub kind: Kind,
}

const fn row(family: ProviderFamily, status: u64, code: &'static str, kind: Kind) -> Row {
    Row {
        family,
        status,
        code,
        quota: Quota::Any,
        kind,
    }
}

use Kind::{NonRetryable as N, Retryable as R};
use NonRetryableKind as NK;
use ProviderFamily as F;
use RetryableKind as RK;

/// The error table, from each provider's documented error bodies. The first
/// row that matches decides; a per-day row precedes its family's any-quota
/// row for the same status and code.
pub const TABLE: &[Row] = &[
    row(
        F::Openai,
        400,
        "invalid_request_error",
        N(NK::InvalidRequest),
    ),
    row(F::Openai, 401, "invalid_api_key", N(NK::Rejected)),
    row(
        F::Openai,
        403,
        "unsupported_country_region_territory",
        N(NK::PolicyDenied),
    ),
    row(F::Openai, 429, "insufficient_quota", N(NK::QuotaExhausted)),
    row(F::Openai, 429, "rate_limit_exceeded", R(RK::RateLimited)),
    row(F::Openai, 500, "server_error", R(RK::Unavailable)),
    row(F::Openai, 503, "engine_overloaded", R(RK::Unavailable)),
    row(
        F::Anthropic,
        400,
        "invalid_request_error",
        N(NK::InvalidRequest),
    ),
    row(F::Anthropic, 401, "authentication_error", N(NK::Rejected)),
    row(F::Anthropic, 402, "billing_error", N(NK::QuotaExhausted)),
    row(F::Anthropic, 403, "permission_error", N(NK::PolicyDenied)),
    row(F::Anthropic, 404, "not_found_error", N(NK::InvalidRequest)),
    row(
        F::Anthropic,
        413,
        "request_too_large",
        N(NK::InvalidRequest),
    ),
    row(F::Anthropic, 429, "rate_limit_error", R(RK::RateLimited)),
    row(F::Anthropic, 500, "api_error", R(RK::Unavailable)),
    row(F::Anthropic, 529, "overloaded_error", R(RK::Unavailable)),
    row(F::Google, 400, "FAILED_PRECONDITION", N(NK::InvalidRequest)),
    row(F::Google, 400, "INVALID_ARGUMENT", N(NK::InvalidRequest)),
    row(F::Google, 403, "PERMISSION_DENIED", N(NK::PolicyDenied)),
    row(F::Google, 404, "NOT_FOUND", N(NK::InvalidRequest)),
    Row {
        family: F::Google,
        status: 429,
        code: "RESOURCE_EXHAUSTED",
        quota: Quota::PerDay,
        kind: N(NK::QuotaExhausted),
    },
    row(F::Google, 429, "RESOURCE_EXHAUSTED", R(RK::RateLimited)),
    row(F::Google, 500, "INTERNAL", R(RK::Unavailable)),
    row(F::Google, 503, "UNAVAILABLE", R(RK::Unavailable)),
    row(
        F::Google,
        504,
        "DEADLINE_EXCEEDED",
        R(RK::TimeoutBeforeResponse),
    ),
];

/// What a provider-aware reading of an error response decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The outcome.
    pub outcome: Outcome,
    /// What was ignored, sorted, each once.
    pub notes: Vec<Note>,
}

/// Classify an error status for a route of `family`: the table row (else
/// the status rule `by_status` gives), with the hint by precedence, bounded
/// by `cap_ms`.
pub(crate) fn read(
    family: ProviderFamily,
    status: u64,
    headers: &[(String, String)],
    body: Option<&str>,
    now_unix_ms: u64,
    cap_ms: u64,
    by_status: impl Fn(u64) -> Kind,
) -> Reading {
    let mut notes = Vec::new();
    let parsed = match body {
        Some(text) => read_body(text, &mut notes),
        None => {
            if family != F::Generic {
                notes.push(Note::BodyMissing);
            }
            None
        }
    };
    let kind = parsed
        .as_ref()
        .and_then(|b| lookup(family, status, b))
        .map_or_else(|| by_status(status), |r| r.kind);
    let outcome = match kind {
        Kind::NonRetryable(kind) => Outcome::NonRetryable { kind },
        Kind::Retryable(kind) => {
            let h = hint(headers, parsed.as_ref(), now_unix_ms, &mut notes);
            Outcome::Retryable {
                kind,
                retry_after_ms: h.map(|(ms, _)| ms.min(cap_ms).min(MAX_SAFE_INTEGER)),
                retry_after_source: h.map(|(_, s)| s),
            }
        }
    };
    notes.sort();
    notes.dedup();
    Reading { outcome, notes }
}

/// The table as a Markdown table (docs/PROVIDERS.md prints it; a test keeps
/// them equal).
pub fn table_markdown() -> String {
    let mut out = String::from(
        "| family | status | code | quota | outcome |\n| --- | ---: | --- | --- | --- |\n",
    );
    for r in TABLE {
        let (class, kind) = match r.kind {
            Kind::Retryable(k) => ("retryable", k.as_str()),
            Kind::NonRetryable(k) => ("non_retryable", k.as_str()),
        };
        let quota = match r.quota {
            Quota::Any => "any",
            Quota::PerDay => "`PerDay` in a `quotaId`",
        };
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {} | {class} `{kind}` |\n",
            r.family.as_str(),
            r.status,
            r.code,
            quota
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("58.934310785s"), Ok(58_935));
        assert_eq!(parse_duration("1.5s"), Ok(1_500));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("-1s"), Err(Note::RetryDelayInvalid));
        assert_eq!(parse_duration("1.5"), Err(Note::RetryDelayInvalid));
        assert_eq!(parse_duration("s"), Err(Note::RetryDelayInvalid));
        assert_eq!(parse_duration("1.s"), Err(Note::RetryDelayInvalid));
        assert_eq!(
            parse_duration("9007199254740993s"),
            Err(Note::RetryDelayTooFar)
        );
        assert_eq!(
            parse_duration("99999999999999999999s"),
            Err(Note::RetryDelayTooFar)
        );
        assert_eq!(parse_go_duration("6m0s"), Some(360_000));
        assert_eq!(parse_go_duration("1s"), Some(1_000));
        assert_eq!(parse_go_duration("20ms"), Some(20));
        assert_eq!(parse_go_duration("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_go_duration("0.5m"), Some(30_000));
        assert_eq!(parse_go_duration("7.66ms"), Some(8));
        for bad in ["", "6", "m", "1x", "-1s", "1..5s", ".5s", "1.s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn table_rows_are_reachable_in_order() {
        for (i, r) in TABLE.iter().enumerate() {
            let earlier = TABLE.iter().take(i).any(|e| {
                e.family == r.family
                    && e.status == r.status
                    && e.code == r.code
                    && e.quota == Quota::Any
            });
            assert!(!earlier, "row {i} is shadowed");
        }
    }
}
