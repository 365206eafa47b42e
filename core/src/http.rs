//! Reading HTTP observations: Retry-After hints and status classification.
//!
//! Provider error bodies and hints are untrusted. Hints are parsed strictly
//! (RFC 9110 delay-seconds or HTTP-date, or a `retry-after-ms` count), bounded
//! by the policy cap, and a malformed hint on a response is ignored rather
//! than allowed to choose a delay.

use serde_json::Value;

use crate::decode::{decode_array, decode_list, names, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::httpdate;
use crate::limits::{MAX_HEADERS, MAX_RETRY_AFTER_BYTES, MAX_SAFE_INTEGER};
use crate::outcome::{IndeterminateKind, NonRetryableKind, Outcome, RetryableKind};
use crate::provider::{self, Kind, ProviderFamily, Reading};

/// Which header carried the hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfterHeader {
    /// `Retry-After`: delay-seconds or an HTTP-date.
    RetryAfter,
    /// `retry-after-ms`: milliseconds, possibly fractional (rounded up).
    RetryAfterMs,
}

/// Parse a Retry-After hint into milliseconds from `now_unix_ms`, clamped to
/// `cap_ms` (and to 2^53 - 1). Dates in the past give 0; garbage is an error.
pub fn parse_retry_after(
    header: RetryAfterHeader,
    value: &str,
    now_unix_ms: u64,
    cap_ms: u64,
) -> Result<u64> {
    if value.len() > MAX_RETRY_AFTER_BYTES {
        return Err(Error::new(
            ErrorCode::RetryAfterOverlong,
            format!(
                "value is {} bytes; the limit is {MAX_RETRY_AFTER_BYTES}",
                value.len()
            ),
        ));
    }
    let invalid = |why: &str| {
        Error::new(
            ErrorCode::RetryAfterInvalid,
            format!("{why}: `{}`", escaped(value)),
        )
    };
    if !value.is_ascii() {
        return Err(invalid("not ASCII"));
    }
    let v = value.trim_matches(|c| c == ' ' || c == '\t');
    if v.is_empty() {
        return Err(invalid("empty"));
    }
    let cap = cap_ms.min(MAX_SAFE_INTEGER);
    let ms = match header {
        RetryAfterHeader::RetryAfter => {
            if v.bytes().all(|b| b.is_ascii_digit()) {
                seconds_to_ms(v)
            } else {
                let now_days = i64::try_from(now_unix_ms / 86_400_000).unwrap_or(i64::MAX);
                let now_year = (now_days.saturating_mul(400) / 146_097).saturating_add(1970);
                let at = httpdate::parse(v, now_year)
                    .ok_or_else(|| invalid("neither delay-seconds nor an HTTP-date"))?;
                let at_ms = u64::try_from(at).unwrap_or(0).saturating_mul(1000);
                at_ms.saturating_sub(now_unix_ms)
            }
        }
        RetryAfterHeader::RetryAfterMs => {
            let (int, frac) = v.split_once('.').unwrap_or((v, ""));
            let ok = !int.is_empty()
                && int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
                && !(v.contains('.') && frac.is_empty());
            if !ok {
                return Err(invalid("not a non-negative millisecond count"));
            }
            let whole = int.parse::<u64>().unwrap_or(u64::MAX);
            let round_up = frac.bytes().any(|b| b != b'0');
            whole.saturating_add(u64::from(round_up))
        }
    };
    Ok(ms.min(cap))
}

/// The value as `str::escape_default` writes it: printable ASCII as is,
/// `\t \r \n \' \" \\` escaped, anything else as `\u{hex}`.
fn escaped(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\'' | '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    out
}

fn seconds_to_ms(digits: &str) -> u64 {
    digits
        .parse::<u64>()
        .unwrap_or(u64::MAX)
        .saturating_mul(1000)
}

/// What went wrong below HTTP, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    /// No connection was made; nothing was sent.
    ConnectFailed,
    /// No response (or no complete response) before the attempt timeout.
    Timeout,
    /// The connection broke after the request was sent.
    ConnectionReset,
}

/// One HTTP attempt as the host observed it. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpObservation {
    /// The error body as text, for a route with a provider family
    /// ([`crate::provider`]); ignored without one.
    pub error_body: Option<String>,
    /// Response headers as `[name, value]` pairs (names case-insensitive).
    pub headers: Vec<(String, String)>,
    /// Wall clock at observation, Unix ms (resolves HTTP-date hints).
    pub now_unix_ms: u64,
    /// The route's provider family: the error table and every hint source
    /// apply ([`crate::provider`]). Absent: the v1 status and Retry-After rules.
    pub provider_family: Option<ProviderFamily>,
    /// Whether any response body bytes reached the caller.
    pub response_bytes_received: bool,
    /// Cap applied to a Retry-After hint, ms.
    pub retry_after_cap_ms: u64,
    /// The response status, when one arrived.
    pub status: Option<u64>,
    /// A transport failure, when one happened.
    pub transport_error: Option<TransportError>,
}

names!(RetryAfterHeader {
    RetryAfter => "retry-after",
    RetryAfterMs => "retry-after-ms",
});

names!(TransportError {
    ConnectFailed => "connect_failed",
    Timeout => "timeout",
    ConnectionReset => "connection_reset",
});

/// A header: a `[name, value]` pair of strings.
pub(crate) struct Header(pub(crate) String, pub(crate) String);

impl Header {
    /// The pair as a tuple.
    pub(crate) fn into_pair(self) -> (String, String) {
        (self.0, self.1)
    }
}

impl crate::canonical::Encode for Header {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        sink.begin_array();
        sink.str(&self.0);
        sink.str(&self.1);
        sink.end_array();
    }
}

impl Decode for Header {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let items = decode_array(v, at)?;
        let mut pair = items
            .iter()
            .enumerate()
            .map(|(i, x)| String::decode(x, &At::Index(at, i)));
        let short = || at.error(ErrorCode::InvalidValue, "expected a [name, value] pair");
        let name = pair.next().ok_or_else(short)??;
        let value = pair.next().ok_or_else(short)??;
        if items.len() > 2 {
            return Err(at.error(ErrorCode::TooManyItems, "expected a [name, value] pair"));
        }
        Ok(Self(name, value))
    }
}

impl Decode for HttpObservation {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let error_body = f.opt("error_body");
        let headers = f.opt_with("headers", |v, at| decode_list::<Header>(v, at, MAX_HEADERS));
        let now_unix_ms = f.opt("now_unix_ms");
        let provider_family = f.opt("provider_family");
        let response_bytes_received = f.opt("response_bytes_received");
        let retry_after_cap_ms = f.opt("retry_after_cap_ms");
        let status = f.opt("status");
        let transport_error = f.opt("transport_error");
        f.end()?;
        Ok(Self {
            error_body,
            headers: headers
                .unwrap_or_default()
                .into_iter()
                .map(Header::into_pair)
                .collect(),
            now_unix_ms: now_unix_ms.unwrap_or(0),
            provider_family,
            response_bytes_received: response_bytes_received.unwrap_or(false),
            retry_after_cap_ms: retry_after_cap_ms.unwrap_or(MAX_SAFE_INTEGER),
            status,
            transport_error,
        })
    }
}

impl HttpObservation {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The bounded hint: `retry-after-ms` first, then `retry-after`; malformed hints are ignored.
    fn hint(&self) -> Option<u64> {
        let ms = self.header("retry-after-ms").and_then(|v| {
            parse_retry_after(
                RetryAfterHeader::RetryAfterMs,
                v,
                self.now_unix_ms,
                self.retry_after_cap_ms,
            )
            .ok()
        });
        ms.or_else(|| {
            self.header("retry-after").and_then(|v| {
                parse_retry_after(
                    RetryAfterHeader::RetryAfter,
                    v,
                    self.now_unix_ms,
                    self.retry_after_cap_ms,
                )
                .ok()
            })
        })
    }
}

/// Classify an HTTP attempt into a typed outcome.
///
/// Output that reached the caller before a failure makes the attempt
/// indeterminate (never retried). A 2xx head without its body is unknown
/// acceptance. Otherwise the status decides: 408 timeout, 429 rate limited,
/// 500/502/503/504 and other 5xx unavailable (retryable, with the hint);
/// 501 and 505 invalid requests; 401 and other 4xx rejected; 403
/// policy denied; 400/404/405/406/410/411/413/414/415/422 invalid requests
/// (a 422 to a keyed request is the key reused with another body);
/// 1xx and 3xx protocol violations. A 409 with a valid `Retry-After` or
/// `retry-after-ms` hint is `in_progress` (retryable): the receiver still
/// runs the first request under the same idempotency key and says when to
/// ask again, as the IETF idempotency-key draft and this project's receiver
/// guard answer; a 409 without a valid hint (a conflict that says nothing
/// of when it clears, the guard's `idempotency_indeterminate` and
/// `idempotency_response_not_kept`) stays rejected. Without a status:
/// connect failures are unavailable, timeouts are timeouts before response,
/// resets are unknown acceptance. With a provider family, an error status
/// is read by [`crate::provider`]: its error table and every hint source
/// (a family's table has no 409 row: the rule above applies).
pub fn classify_http(obs: &HttpObservation) -> Result<Outcome> {
    Ok(classify_reading(obs)?.outcome)
}

/// [`classify_http`] with the notes of a provider-aware reading
/// ([`crate::provider`]): what was ignored and why.
pub fn classify_reading(obs: &HttpObservation) -> Result<Reading> {
    use IndeterminateKind as I;
    use RetryableKind as R;
    let plain = |outcome| Reading {
        outcome,
        notes: Vec::new(),
    };
    let retry = |kind| Outcome::Retryable {
        kind,
        retry_after_ms: obs.hint(),
        retry_after_source: None,
    };
    let unknown = |kind| Outcome::Indeterminate { kind };
    if let Some(s) = obs.status {
        if !(100..=599).contains(&s) {
            return Err(Error::at(
                ErrorCode::InvalidStatus,
                "/status",
                format!("status {s} is outside 100..=599"),
            ));
        }
    }
    if obs.transport_error.is_some() {
        if obs.response_bytes_received {
            return Ok(plain(unknown(I::StreamInterruptedAfterOutput)));
        }
        match obs.status {
            Some(200..=299) => return Ok(plain(unknown(I::UnknownProviderAcceptance))),
            Some(_) => {}
            None => {
                return Ok(plain(match obs.transport_error {
                    Some(TransportError::ConnectFailed) => retry(R::Unavailable),
                    Some(TransportError::Timeout) => retry(R::TimeoutBeforeResponse),
                    _ => unknown(I::UnknownProviderAcceptance),
                }))
            }
        }
    }
    let Some(status) = obs.status else {
        return Err(Error::at(
            ErrorCode::InvalidStatus,
            "/status",
            "neither a status nor a transport error was observed",
        ));
    };
    if (200..=299).contains(&status) {
        return Ok(plain(Outcome::Success));
    }
    // A 409 that says when to ask again: the first request under the key
    // still runs. Without a valid hint it stays a rejected conflict.
    let in_progress = status == 409 && obs.hint().is_some();
    let rule = |s: u64| {
        if in_progress {
            Kind::Retryable(R::InProgress)
        } else {
            by_status(s)
        }
    };
    let Some(family) = obs.provider_family else {
        return Ok(plain(match rule(status) {
            Kind::Retryable(kind) => retry(kind),
            Kind::NonRetryable(kind) => Outcome::NonRetryable { kind },
        }));
    };
    Ok(provider::read(
        family,
        status,
        &obs.headers,
        obs.error_body.as_deref(),
        obs.now_unix_ms,
        obs.retry_after_cap_ms,
        rule,
    ))
}

/// The v1 status rules for a status outside 2xx.
fn by_status(status: u64) -> Kind {
    use NonRetryableKind as N;
    use RetryableKind as R;
    match status {
        408 => Kind::Retryable(R::TimeoutBeforeResponse),
        429 => Kind::Retryable(R::RateLimited),
        501 | 505 => Kind::NonRetryable(N::InvalidRequest),
        500..=599 => Kind::Retryable(R::Unavailable),
        403 => Kind::NonRetryable(N::PolicyDenied),
        400 | 404 | 405 | 406 | 410 | 411 | 413 | 414 | 415 | 422 => {
            Kind::NonRetryable(N::InvalidRequest)
        }
        400..=499 => Kind::NonRetryable(N::Rejected),
        _ => Kind::NonRetryable(N::ProtocolViolation),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT

    fn ra(v: &str) -> Result<u64> {
        parse_retry_after(RetryAfterHeader::RetryAfter, v, NOW, 60_000)
    }

    #[test]
    fn delay_seconds_and_dates() {
        assert_eq!(ra("2"), Ok(2_000));
        assert_eq!(ra(" 0 "), Ok(0));
        assert_eq!(ra("99999999999999999999999"), Ok(60_000));
        assert_eq!(ra("Sun, 06 Nov 1994 08:49:47 GMT"), Ok(10_000));
        assert_eq!(ra("Sunday, 06-Nov-94 08:49:47 GMT"), Ok(10_000));
        assert_eq!(ra("Sun Nov  6 08:49:47 1994"), Ok(10_000));
        assert_eq!(ra("Sun, 06 Nov 1994 08:00:00 GMT"), Ok(0));
    }

    #[test]
    fn garbage_is_an_error() {
        for v in ["-1", "1.5", "soon", "", "２", "0x10"] {
            assert_eq!(ra(v).unwrap_err().code, ErrorCode::RetryAfterInvalid, "{v}");
        }
        assert_eq!(
            ra(&"1".repeat(65)).unwrap_err().code,
            ErrorCode::RetryAfterOverlong
        );
    }

    #[test]
    fn messages_escape_as_escape_default() {
        for v in ["a b", "tab\tcr\rnl\n", "q'\"\\", "\u{1}\u{7f}", "é２😀", ""] {
            assert_eq!(escaped(v), v.escape_default().to_string());
        }
    }

    #[test]
    fn milliseconds() {
        let ms = |v| parse_retry_after(RetryAfterHeader::RetryAfterMs, v, NOW, 60_000);
        assert_eq!(ms("250"), Ok(250));
        assert_eq!(ms("250.1"), Ok(251));
        assert_eq!(ms("250.0"), Ok(250));
        assert_eq!(ms("1e3").unwrap_err().code, ErrorCode::RetryAfterInvalid);
        assert_eq!(ms("-5").unwrap_err().code, ErrorCode::RetryAfterInvalid);
    }

    fn obs(status: Option<u64>, headers: &[(&str, &str)]) -> HttpObservation {
        HttpObservation {
            headers: headers
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect(),
            error_body: None,
            now_unix_ms: NOW,
            provider_family: None,
            response_bytes_received: false,
            retry_after_cap_ms: 5_000,
            status,
            transport_error: None,
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(classify_http(&obs(Some(200), &[])), Ok(Outcome::Success));
        assert_eq!(
            classify_http(&obs(
                Some(429),
                &[("Retry-After", "1"), ("retry-after-ms", "250")]
            )),
            Ok(Outcome::Retryable {
                kind: RetryableKind::RateLimited,
                retry_after_ms: Some(250),
                retry_after_source: None,
            })
        );
        assert_eq!(
            classify_http(&obs(Some(503), &[("retry-after", "junk")])),
            Ok(Outcome::Retryable {
                kind: RetryableKind::Unavailable,
                retry_after_ms: None,
                retry_after_source: None,
            })
        );
        assert_eq!(
            classify_http(&obs(Some(403), &[])),
            Ok(Outcome::NonRetryable {
                kind: NonRetryableKind::PolicyDenied
            })
        );
        assert_eq!(
            classify_http(&obs(Some(302), &[])),
            Ok(Outcome::NonRetryable {
                kind: NonRetryableKind::ProtocolViolation
            })
        );
        assert_eq!(
            classify_http(&obs(Some(600), &[])).unwrap_err().code,
            ErrorCode::InvalidStatus
        );
        let in_progress = |ms| {
            Ok(Outcome::Retryable {
                kind: RetryableKind::InProgress,
                retry_after_ms: Some(ms),
                retry_after_source: None,
            })
        };
        assert_eq!(
            classify_http(&obs(Some(409), &[("Retry-After", "1")])),
            in_progress(1_000)
        );
        assert_eq!(
            classify_http(&obs(Some(409), &[("retry-after-ms", "250")])),
            in_progress(250)
        );
        assert_eq!(
            classify_http(&obs(Some(409), &[("Retry-After", "99")])),
            in_progress(5_000),
            "bounded by the cap"
        );
        for headers in [&[][..], &[("Retry-After", "soon")][..]] {
            assert_eq!(
                classify_http(&obs(Some(409), headers)),
                Ok(Outcome::NonRetryable {
                    kind: NonRetryableKind::Rejected
                })
            );
        }
        assert_eq!(
            classify_http(&obs(Some(422), &[("Retry-After", "1")])),
            Ok(Outcome::NonRetryable {
                kind: NonRetryableKind::InvalidRequest
            })
        );
        let mut keyed = obs(Some(409), &[("Retry-After", "2")]);
        keyed.provider_family = Some(ProviderFamily::Openai);
        keyed.error_body = Some(r#"{"code":"idempotency_in_progress"}"#.to_owned());
        assert_eq!(
            classify_http(&keyed),
            Ok(Outcome::Retryable {
                kind: RetryableKind::InProgress,
                retry_after_ms: Some(2_000),
                retry_after_source: Some(crate::outcome::HintSource::RetryAfter),
            })
        );
        let mut o = obs(Some(200), &[]);
        o.transport_error = Some(TransportError::ConnectionReset);
        o.response_bytes_received = true;
        assert_eq!(
            classify_http(&o),
            Ok(Outcome::Indeterminate {
                kind: IndeterminateKind::StreamInterruptedAfterOutput
            })
        );
    }
}
