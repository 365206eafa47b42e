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

use serde_json::Value;

use crate::decode::names;
use crate::http::{parse_retry_after, RetryAfterHeader};
use crate::limits::MAX_SAFE_INTEGER;
use crate::outcome::{HintSource, NonRetryableKind, Outcome, RetryableKind};

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

/// The fields of an error body the classifier reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Body {
    error_type: Option<String>,
    error_code: Option<String>,
    error_status: Option<String>,
    /// `retryDelay` of the first RetryInfo detail, as written.
    retry_delay: Option<String>,
    /// Whether a RetryInfo detail carried a `retryDelay` that is not a string.
    retry_delay_not_text: bool,
    per_day: bool,
}

const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
const QUOTA_FAILURE: &str = "type.googleapis.com/google.rpc.QuotaFailure";

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::String(s)) => Some(s.chars().take(crate::limits::MAX_ID_BYTES).collect()),
        _ => None,
    }
}

fn read_body(body: &str, notes: &mut Vec<Note>) -> Option<Body> {
    if body.len() > MAX_ERROR_BODY_BYTES {
        notes.push(Note::BodyOversize);
        return None;
    }
    let value = match crate::parse::parse_any(body) {
        Ok(v) => v,
        Err(e) => {
            notes.push(if e.code == crate::error::ErrorCode::NestingTooDeep {
                Note::BodyTooDeep
            } else {
                Note::BodyMalformed
            });
            return None;
        }
    };
    let Value::Object(top) = &value else {
        notes.push(Note::BodyMalformed);
        return None;
    };
    let error = match top.get("error") {
        Some(Value::Object(e)) => e,
        _ => top,
    };
    let mut out = Body {
        error_type: text(error.get("type")),
        error_code: text(error.get("code")),
        error_status: text(error.get("status")),
        ..Body::default()
    };
    let details = match error.get("details") {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    for detail in details.iter().take(MAX_BODY_DETAILS) {
        let Value::Object(d) = detail else { continue };
        match d.get("@type").and_then(Value::as_str) {
            Some(RETRY_INFO) if out.retry_delay.is_none() && !out.retry_delay_not_text => {
                match d.get("retryDelay") {
                    Some(Value::String(s)) => out.retry_delay = Some(s.clone()),
                    Some(_) => out.retry_delay_not_text = true,
                    None => {}
                }
            }
            Some(QUOTA_FAILURE) => {
                let violations = match d.get("violations") {
                    Some(Value::Array(items)) => items.as_slice(),
                    _ => &[],
                };
                for v in violations.iter().take(MAX_BODY_DETAILS) {
                    if let Some(id) = v.get("quotaId").and_then(Value::as_str) {
                        if id.contains("PerDay") {
                            out.per_day = true;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(out)
}

fn code_of(family: ProviderFamily, body: &Body) -> Option<&str> {
    match family {
        F::Generic => None,
        F::Openai | F::AzureOpenai => body.error_code.as_deref().or(body.error_type.as_deref()),
        F::Anthropic => body.error_type.as_deref(),
        F::Google => body.error_status.as_deref(),
    }
}

/// The row for a family, status and body, if any.
fn lookup(family: ProviderFamily, status: u64, body: &Body) -> Option<&'static Row> {
    let family = match family {
        F::AzureOpenai => F::Openai,
        f => f,
    };
    let code = code_of(family, body)?;
    TABLE.iter().find(|r| {
        r.family == family
            && r.status == status
            && r.code == code
            && (r.quota == Quota::Any || body.per_day)
    })
}

/// A protobuf JSON duration (`"58.934310785s"`, `"1.5s"`, `"30s"`) in ms,
/// rounded up; `Err` with the note when it is not one or too long.
pub fn parse_duration(value: &str) -> Result<u64, Note> {
    let bad = Err(Note::RetryDelayInvalid);
    let Some(number) = value.strip_suffix('s') else {
        return bad;
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let ok = !int.is_empty()
        && int.len() <= 20
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.len() <= 9
        && frac.bytes().all(|b| b.is_ascii_digit())
        && !(number.contains('.') && frac.is_empty());
    if !ok {
        return bad;
    }
    let seconds = int.parse::<u64>().map_err(|_| Note::RetryDelayTooFar)?;
    let ms = ceil_ms(seconds, frac).ok_or(Note::RetryDelayTooFar)?;
    if ms > MAX_HINT_MS {
        return Err(Note::RetryDelayTooFar);
    }
    Ok(ms)
}

/// `seconds.frac` in ms, rounded up.
fn ceil_ms(seconds: u64, frac: &str) -> Option<u64> {
    let head = frac.get(..frac.len().min(3)).unwrap_or("");
    let scale = match head.len() {
        0 => 0,
        1 => 100,
        2 => 10,
        _ => 1,
    };
    let part = if head.is_empty() {
        0
    } else {
        head.parse::<u64>().ok()?.checked_mul(scale)?
    };
    let up = u64::from(frac.bytes().skip(3).any(|b| b != b'0'));
    seconds
        .checked_mul(1000)?
        .checked_add(part)?
        .checked_add(up)
}

/// OpenAI's reset duration (`6m0s`, `1s`, `20ms`, `1h2m3.5s`, `0.5s`) in ms,
/// rounded up.
pub fn parse_go_duration(value: &str) -> Option<u64> {
    let mut rest = value;
    let mut total: u64 = 0;
    if rest.is_empty() || rest.len() > 32 {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number = rest.get(..n)?;
        rest = rest.get(n..)?;
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = rest.get(..unit_len)?;
        rest = rest.get(unit_len..)?;
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if number.contains('.') && (frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit())) {
            return None;
        }
        let whole = int.parse::<u64>().ok()?;
        let ms = match unit {
            "h" => ceil_ms(whole.checked_mul(3600)?, "")?.checked_add(frac_of(frac, 3_600_000)?)?,
            "m" => ceil_ms(whole.checked_mul(60)?, "")?.checked_add(frac_of(frac, 60_000)?)?,
            "s" => ceil_ms(whole, frac)?,
            "ms" => whole.checked_add(u64::from(frac.bytes().any(|b| b != b'0')))?,
            _ => return None,
        };
        total = total.checked_add(ms)?;
    }
    Some(total)
}

/// `0.frac` of `unit_ms`, rounded up.
fn frac_of(frac: &str, unit_ms: u64) -> Option<u64> {
    if frac.is_empty() {
        return Some(0);
    }
    let digits = frac.get(..frac.len().min(9))?;
    let num = digits.parse::<u64>().ok()?;
    let den = 10u64.checked_pow(u32::try_from(digits.len()).ok()?)?;
    let scaled = num.checked_mul(unit_ms)?;
    let q = scaled.checked_div(den)?;
    q.checked_add(u64::from(scaled.checked_rem(den)? != 0))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim_matches(|c| c == ' ' || c == '\t'))
}

/// `Some(true)` when a remaining count is 0, `Some(false)` when it is a
/// positive count, `None` (noted) when it is garbage.
fn exhausted(value: &str, notes: &mut Vec<Note>) -> Option<bool> {
    if !value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.bytes().all(|b| b == b'0'));
    }
    notes.push(Note::RatelimitInvalid);
    None
}

/// A reset hint in ms, checked against [`MAX_HINT_MS`].
fn bounded(ms: u64, notes: &mut Vec<Note>) -> Option<u64> {
    if ms > MAX_HINT_MS {
        notes.push(Note::ResetTooFar);
        return None;
    }
    Some(ms)
}

/// OpenAI: `x-ratelimit-remaining-{requests,tokens}` and `x-ratelimit-reset-*`.
fn openai_resets(headers: &[(String, String)], notes: &mut Vec<Note>, out: &mut Vec<u64>) {
    for what in ["requests", "tokens"] {
        let Some(rem) = header(headers, &format!("x-ratelimit-remaining-{what}")) else {
            continue;
        };
        if exhausted(rem, notes) != Some(true) {
            continue;
        }
        let Some(reset) = header(headers, &format!("x-ratelimit-reset-{what}")) else {
            continue;
        };
        match parse_go_duration(reset) {
            Some(ms) => out.extend(bounded(ms, notes)),
            None => notes.push(Note::RatelimitInvalid),
        }
    }
}

/// Anthropic: `anthropic-ratelimit-*-remaining` and `-reset` (RFC 3339).
fn anthropic_resets(
    headers: &[(String, String)],
    now_unix_ms: u64,
    notes: &mut Vec<Note>,
    out: &mut Vec<u64>,
) {
    for what in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let Some(rem) = header(headers, &format!("anthropic-ratelimit-{what}-remaining")) else {
            continue;
        };
        if exhausted(rem, notes) != Some(true) {
            continue;
        }
        let Some(reset) = header(headers, &format!("anthropic-ratelimit-{what}-reset")) else {
            continue;
        };
        let Some(at) = crate::httpdate::rfc3339_ms(reset) else {
            notes.push(Note::RatelimitInvalid);
            continue;
        };
        let now = i64::try_from(now_unix_ms).unwrap_or(i64::MAX);
        match at.checked_sub(now).and_then(|d| u64::try_from(d).ok()) {
            Some(ms) if ms > 0 => out.extend(bounded(ms, notes)),
            _ => notes.push(Note::ResetPast),
        }
    }
}

/// One item of a structured-field list: its name and integer parameters.
struct Item<'a> {
    name: &'a str,
    params: Vec<(&'a str, u64)>,
}

/// A `RateLimit` / `RateLimit-Policy` field: `"name";r=0;t=30, …`.
fn items(value: &str) -> Option<Vec<Item<'_>>> {
    let mut out = Vec::new();
    for member in value.split(',').take(16) {
        let mut parts = member.trim_matches(|c| c == ' ' || c == '\t').split(';');
        let raw = parts.next()?;
        let name = raw.trim_matches('"');
        if name.is_empty() || raw.len() > 64 {
            return None;
        }
        let mut params = Vec::new();
        for p in parts {
            let (k, v) = p.trim().split_once('=')?;
            if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            params.push((k, v.parse::<u64>().ok()?));
        }
        out.push(Item { name, params });
    }
    Some(out)
}

fn param(item: &Item<'_>, key: &str) -> Option<u64> {
    item.params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// IETF: `RateLimit` items with `r=0` give `t` seconds, else the matching
/// `RateLimit-Policy` window `w`.
fn ietf_resets(headers: &[(String, String)], notes: &mut Vec<Note>, out: &mut Vec<u64>) {
    let Some(field) = header(headers, "ratelimit") else {
        return;
    };
    let Some(limits) = items(field) else {
        notes.push(Note::RatelimitInvalid);
        return;
    };
    let policies = header(headers, "ratelimit-policy").and_then(items);
    for item in &limits {
        if param(item, "r") != Some(0) {
            continue;
        }
        let seconds = param(item, "t").or_else(|| {
            policies
                .as_ref()
                .and_then(|ps| ps.iter().find(|p| p.name == item.name))
                .and_then(|p| param(p, "w"))
        });
        match seconds.and_then(|s| s.checked_mul(1000)) {
            Some(ms) => out.extend(bounded(ms, notes)),
            None => notes.push(Note::RatelimitInvalid),
        }
    }
}

/// The hint by precedence, and the source that gave it; every source read
/// before the winner that was present but unusable is noted.
fn hint(
    headers: &[(String, String)],
    body: Option<&Body>,
    now_unix_ms: u64,
    notes: &mut Vec<Note>,
) -> Option<(u64, HintSource)> {
    for (name, which, source, note) in [
        (
            "retry-after-ms",
            RetryAfterHeader::RetryAfterMs,
            HintSource::RetryAfterMs,
            Note::RetryAfterMsInvalid,
        ),
        (
            "retry-after",
            RetryAfterHeader::RetryAfter,
            HintSource::RetryAfter,
            Note::RetryAfterInvalid,
        ),
    ] {
        if let Some(v) = header(headers, name) {
            match parse_retry_after(which, v, now_unix_ms, MAX_SAFE_INTEGER) {
                Ok(ms) => return Some((ms, source)),
                Err(_) => notes.push(note),
            }
        }
    }
    if let Some(b) = body {
        if b.retry_delay_not_text {
            notes.push(Note::RetryDelayInvalid);
        }
        if let Some(d) = &b.retry_delay {
            match parse_duration(d) {
                Ok(ms) => return Some((ms, HintSource::RetryInfo)),
                Err(n) => notes.push(n),
            }
        }
    }
    let mut resets = Vec::new();
    openai_resets(headers, notes, &mut resets);
    anthropic_resets(headers, now_unix_ms, notes, &mut resets);
    ietf_resets(headers, notes, &mut resets);
    resets
        .into_iter()
        .max()
        .map(|ms| (ms, HintSource::RateLimitReset))
}

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

/// The response headers a provider-aware reading looks at, besides
/// `retry-after` and `retry-after-ms`.
pub const RATE_LIMIT_HEADERS: &[&str] = &[
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "ratelimit",
    "ratelimit-policy",
];

/// What one response's rate-limit headers say of one kind of capacity
/// (requests, or tokens): the least `remaining` reported, and when an
/// exhausted one returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The least valid `remaining` count of the kind.
    pub remaining: Option<u64>,
    /// A `remaining` of 0 with a valid reset: the latest such reset, ms from now.
    pub reset_ms: Option<u64>,
}

/// The rate-limit headers of one response (success or failure), read for
/// the admission buckets ([`crate::admission::observe`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests: `x-ratelimit-*-requests`, `anthropic-ratelimit-requests-*`
    /// and the IETF `RateLimit` items.
    pub requests: Capacity,
    /// Tokens: `x-ratelimit-*-tokens` and
    /// `anthropic-ratelimit-{tokens,input-tokens,output-tokens}-*`.
    pub tokens: Capacity,
    /// What was ignored, sorted, each once.
    pub notes: Vec<Note>,
}

impl Capacity {
    fn remaining(&mut self, n: u64) {
        self.remaining = Some(self.remaining.map_or(n, |r| r.min(n)));
    }

    fn reset(&mut self, ms: u64) {
        if ms > 0 {
            self.reset_ms = Some(self.reset_ms.map_or(ms, |r| r.max(ms)));
        }
    }
}

/// A `remaining` count, `None` (noted) when it is garbage.
fn count(value: &str, notes: &mut Vec<Note>) -> Option<u64> {
    let n = (!value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit()))
        .then(|| value.parse::<u64>().ok())
        .flatten();
    if n.is_none() {
        notes.push(Note::RatelimitInvalid);
    }
    n
}

/// Read the rate-limit headers of a response at `now_unix_ms`: the same
/// header forms as the hint's reset source (OpenAI durations, Anthropic
/// RFC 3339, IETF `t` or the policy window `w`, in seconds). A garbage
/// count or reset, a reset in the past or beyond [`MAX_HINT_MS`] is
/// ignored and noted; a valid `remaining` with a bad reset still counts.
pub fn rate_limits(headers: &[(String, String)], now_unix_ms: u64) -> RateLimits {
    let mut out = RateLimits::default();
    // Most responses carry none of them: one pass over the names first.
    let any = headers.iter().any(|(k, _)| {
        k.as_bytes().get(..9).is_some_and(|head| {
            head.eq_ignore_ascii_case(b"ratelimit")
                || head.eq_ignore_ascii_case(b"x-ratelim")
                || head.eq_ignore_ascii_case(b"anthropic")
        })
    });
    if !any {
        return out;
    }
    let notes = &mut out.notes;
    for (remaining, reset, tokens) in [
        (
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            false,
        ),
        (
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
            true,
        ),
    ] {
        let cap = if tokens {
            &mut out.tokens
        } else {
            &mut out.requests
        };
        let Some(rem) = header(headers, remaining) else {
            continue;
        };
        let Some(n) = count(rem, notes) else { continue };
        cap.remaining(n);
        if n != 0 {
            continue;
        }
        if let Some(reset) = header(headers, reset) {
            match parse_go_duration(reset) {
                Some(ms) => {
                    if let Some(ms) = bounded(ms, notes) {
                        cap.reset(ms);
                    }
                }
                None => notes.push(Note::RatelimitInvalid),
            }
        }
    }
    for (remaining, reset, tokens) in [
        (
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
            false,
        ),
        (
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
            true,
        ),
        (
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
            true,
        ),
        (
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
            true,
        ),
    ] {
        let cap = if tokens {
            &mut out.tokens
        } else {
            &mut out.requests
        };
        let Some(rem) = header(headers, remaining) else {
            continue;
        };
        let Some(n) = count(rem, notes) else { continue };
        cap.remaining(n);
        if n != 0 {
            continue;
        }
        let Some(reset) = header(headers, reset) else {
            continue;
        };
        let Some(at) = crate::httpdate::rfc3339_ms(reset) else {
            notes.push(Note::RatelimitInvalid);
            continue;
        };
        let now = i64::try_from(now_unix_ms).unwrap_or(i64::MAX);
        match at.checked_sub(now).and_then(|d| u64::try_from(d).ok()) {
            Some(ms) if ms > 0 => {
                if let Some(ms) = bounded(ms, notes) {
                    cap.reset(ms);
                }
            }
            _ => notes.push(Note::ResetPast),
        }
    }
    if let Some(field) = header(headers, "ratelimit") {
        match items(field) {
            None => notes.push(Note::RatelimitInvalid),
            Some(limits) => {
                let policies = header(headers, "ratelimit-policy").and_then(items);
                for item in &limits {
                    let Some(r) = param(item, "r") else {
                        notes.push(Note::RatelimitInvalid);
                        continue;
                    };
                    out.requests.remaining(r);
                    if r != 0 {
                        continue;
                    }
                    let seconds = param(item, "t").or_else(|| {
                        policies
                            .as_ref()
                            .and_then(|ps| ps.iter().find(|p| p.name == item.name))
                            .and_then(|p| param(p, "w"))
                    });
                    match seconds.and_then(|s| s.checked_mul(1000)) {
                        Some(ms) => {
                            if let Some(ms) = bounded(ms, notes) {
                                out.requests.reset(ms);
                            }
                        }
                        None => notes.push(Note::RatelimitInvalid),
                    }
                }
            }
        }
    }
    out.notes.sort();
    out.notes.dedup();
    out
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
