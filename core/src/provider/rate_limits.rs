//! The rate-limit headers a response carries, read into remaining
//! capacity and reset times.

use super::hint::{bounded, header, items, param, parse_go_duration};
use super::Note;

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
pub(super) fn count(value: &str, notes: &mut Vec<Note>) -> Option<u64> {
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
/// count or reset, a reset in the past or beyond [`MAX_HINT_MS`](super::MAX_HINT_MS) is
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
