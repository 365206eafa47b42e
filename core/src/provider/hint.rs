//! Retry hints by precedence: protobuf and Go durations, and the
//! rate-limit reset headers of each provider family.

use crate::http::{parse_retry_after, RetryAfterHeader};
use crate::limits::MAX_SAFE_INTEGER;
use crate::outcome::HintSource;

use super::body::Body;
use super::{Note, MAX_HINT_MS};

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

pub(super) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim_matches(|c| c == ' ' || c == '\t'))
}

/// `Some(true)` when a remaining count is 0, `Some(false)` when it is a
/// positive count, `None` (noted) when it is garbage.
pub(super) fn exhausted(value: &str, notes: &mut Vec<Note>) -> Option<bool> {
    if !value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.bytes().all(|b| b == b'0'));
    }
    notes.push(Note::RatelimitInvalid);
    None
}

/// A reset hint in ms, checked against [`MAX_HINT_MS`].
pub(super) fn bounded(ms: u64, notes: &mut Vec<Note>) -> Option<u64> {
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
pub(super) struct Item<'a> {
    pub(super) name: &'a str,
    pub(super) params: Vec<(&'a str, u64)>,
}

/// A `RateLimit` / `RateLimit-Policy` field: `"name";r=0;t=30, …`.
pub(super) fn items(value: &str) -> Option<Vec<Item<'_>>> {
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

pub(super) fn param(item: &Item<'_>, key: &str) -> Option<u64> {
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
pub(super) fn hint(
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
