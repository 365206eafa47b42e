//! What a host observed of one attempt, judged by one set of tables.
//!
//! Hosts (the TypeScript and Python drivers) do not classify failures. They
//! extract plain [`Facts`] from what the dispatch returned or raised (the
//! error's class names and `code` strings along its cause chain, an HTTP
//! status and headers, whether response bytes reached the caller, whether the
//! caller cancelled) and the core turns them into an [`Outcome`] with
//! [`judge`], in a fixed order of [`Rule`]s:
//!
//! 1. `returned`: the dispatch returned a value: success (a stream only
//!    with its terminal event and no protocol violation), unless an output
//!    check failed: then `output_check` decides by
//!    [`crate::output::OUTPUT_CHECKS`] (a refusal is `policy_denied`, any
//!    other failed check `invalid_output`).
//! 2. `explicit`: the error carries an outcome (an `AttemptError`, or the
//!    host's classify hook). A raised error is never a success, so an explicit
//!    success is ignored and the next rules decide.
//! 3. `cancelled`: the caller cancelled during the attempt: indeterminate
//!    (`stream_interrupted_after_output` when output reached the caller,
//!    else `unknown_provider_acceptance`).
//! 4. `stream_violation`: the host detected a broken stream protocol: a
//!    protocol violation.
//! 5. `error_type`: a class name in [`ERROR_TYPES`] that names an outcome
//!    (an SDK's response-validation error is a protocol violation).
//! 6. `output_delivered`: any other error raised after output reached the
//!    caller is `stream_interrupted_after_output` (never retried: output of
//!    two attempts is never joined), except under the `tentative` and
//!    `continuation` stream contracts, whose events are invalidated or
//!    resumed ([`crate::stream`]).
//! 7. `status`: an HTTP status other than 2xx, judged by
//!    [`crate::http::classify_http`] with the response headers; the hint is
//!    recorded as observed (the schedule bounds it by the policy's cap).
//! 8. `stream_cut`: an opened stream that broke (no transport signal, or a
//!    connection reset) or ended without its terminal event: retryable
//!    `unavailable` (the provider produced a response; its delivery failed).
//! 9. `transport`: a transport signal from the host, [`ERROR_TYPES`] or
//!    [`ERROR_CODES`]; when several are present the strongest evidence wins:
//!    `connect_failed` (nothing was sent) over `timeout` over
//!    `connection_reset` over `aborted`. An abort after the run's deadline is
//!    a timeout before response; any other abort is unknown acceptance.
//! 10. `deadline`: an error raised at or after the run's deadline that no
//!     rule above recognizes is a timeout before response.
//! 11. `unrecognized`: anything else is indeterminate
//!     `unknown_provider_acceptance` and is never retried; the host reports
//!     it as unrecognized.

use serde_json::Value;

use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, names, object, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::http::{classify_reading, Header, HttpObservation, TransportError};
use crate::limits::{MAX_ERROR_NAMES, MAX_ERROR_NAME_BYTES, MAX_HEADERS, MAX_SAFE_INTEGER};
use crate::outcome::{IndeterminateKind, NonRetryableKind, Outcome, RetryableKind};
use crate::provider::{Note, ProviderFamily};
use crate::stream::{StreamAction, StreamFacts, StreamMode};

/// What the dispatch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Returned {
    /// It returned a value.
    Returned,
    /// It raised (threw) an error.
    Raised,
}

names!(Returned {
    Returned => "returned",
    Raised => "raised",
});

/// A transport-level signal read off an error (or given by the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    /// No connection was made; nothing was sent.
    ConnectFailed,
    /// No (complete) response before a timeout.
    Timeout,
    /// The connection broke after the request was sent.
    ConnectionReset,
    /// The attempt was aborted (by a signal, not by the transport).
    Aborted,
}

names!(Signal {
    ConnectFailed => "connect_failed",
    Timeout => "timeout",
    ConnectionReset => "connection_reset",
    Aborted => "aborted",
});

/// What an entry of [`ERROR_TYPES`] or [`ERROR_CODES`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    /// The error decides the outcome by itself.
    Outcome(Outcome),
    /// The error is evidence of a transport signal.
    Signal(Signal),
}

const PROTOCOL_VIOLATION: Meaning = Meaning::Outcome(Outcome::NonRetryable {
    kind: NonRetryableKind::ProtocolViolation,
});
const CONNECT_FAILED: Meaning = Meaning::Signal(Signal::ConnectFailed);
const TIMEOUT: Meaning = Meaning::Signal(Signal::Timeout);
const RESET: Meaning = Meaning::Signal(Signal::ConnectionReset);
const ABORTED: Meaning = Meaning::Signal(Signal::Aborted);

/// Error class names the core knows, in the SDKs and runtimes users call
/// (openai and anthropic in Python and TypeScript, httpx, requests, Python's
/// builtins, undici and the DOM in JavaScript). Sorted by name.
pub const ERROR_TYPES: &[(&str, Meaning)] = &[
    ("APIConnectionError", RESET),
    ("APIConnectionTimeoutError", TIMEOUT),
    ("APIResponseValidationError", PROTOCOL_VIOLATION),
    ("APITimeoutError", TIMEOUT),
    ("APIUserAbortError", ABORTED),
    ("AbortError", ABORTED),
    ("BodyTimeoutError", TIMEOUT),
    ("BrokenPipeError", RESET),
    ("ConnectError", CONNECT_FAILED),
    ("ConnectTimeout", CONNECT_FAILED),
    ("ConnectTimeoutError", CONNECT_FAILED),
    ("ConnectionAbortedError", RESET),
    ("ConnectionRefusedError", CONNECT_FAILED),
    ("ConnectionResetError", RESET),
    ("HeadersTimeoutError", TIMEOUT),
    ("PoolTimeout", CONNECT_FAILED),
    ("ReadError", RESET),
    ("ReadTimeout", TIMEOUT),
    ("RemoteProtocolError", RESET),
    ("SocketError", RESET),
    ("TimeoutError", TIMEOUT),
    ("WriteError", RESET),
    ("WriteTimeout", TIMEOUT),
];

/// Error `code` strings the core knows (errno names and undici codes). Sorted.
pub const ERROR_CODES: &[(&str, Meaning)] = &[
    ("ABORT_ERR", ABORTED),
    ("EAI_AGAIN", CONNECT_FAILED),
    ("ECONNREFUSED", CONNECT_FAILED),
    ("ECONNRESET", RESET),
    ("EHOSTUNREACH", CONNECT_FAILED),
    ("ENETUNREACH", CONNECT_FAILED),
    ("ENOTFOUND", CONNECT_FAILED),
    ("EPIPE", RESET),
    ("ETIMEDOUT", TIMEOUT),
    ("UND_ERR_BODY_TIMEOUT", TIMEOUT),
    ("UND_ERR_CONNECT_TIMEOUT", CONNECT_FAILED),
    ("UND_ERR_HEADERS_TIMEOUT", TIMEOUT),
    ("UND_ERR_SOCKET", RESET),
];

/// The header a testing fault injector puts on every failure it makes
/// (`retryledger.testing`, `retryledger/testing`): the attempt records
/// `injected_fault` and the receipt counts them, so a run with injected
/// faults can never pass for production evidence.
pub const INJECTED_FAULT_HEADER: &str = "retryledger-injected-fault";

/// Whether the facts carry [`INJECTED_FAULT_HEADER`].
pub fn injected(facts: &Facts) -> bool {
    facts
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case(INJECTED_FAULT_HEADER))
}

/// The response headers the core reads; hosts need pass no others. The
/// rate-limit headers are read only for a route with a provider family
/// ([`crate::provider`]).
pub const READ_HEADERS: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "retryledger-injected-fault",
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

fn lookup(table: &[(&str, Meaning)], name: &str) -> Option<Meaning> {
    table
        .binary_search_by(|(k, _)| (*k).cmp(name))
        .ok()
        .and_then(|i| table.get(i))
        .map(|(_, m)| *m)
}

/// Plain facts about one attempt, as a host extracted them. Fields in
/// canonical order; every one but `result` is optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The caller cancelled the run while this attempt was in flight.
    pub cancelled: bool,
    /// The attempt completed at or after the run's deadline (a session sets it).
    pub deadline_passed: bool,
    /// The error response's body as text (at most
    /// [`crate::provider::MAX_ERROR_BODY_BYTES`] are read; a host passes at
    /// most one character more). Read only for a provider family.
    pub error_body: Option<String>,
    /// `code` strings of the error and its causes (`ECONNRESET`, ...).
    pub error_codes: Vec<String>,
    /// Class names of the error (most specific first), then of its causes.
    pub error_types: Vec<String>,
    /// Response headers as `[name, value]` pairs (only [`READ_HEADERS`] are read).
    pub headers: Vec<(String, String)>,
    /// Wall clock at observation, Unix ms (resolves HTTP-date hints).
    pub now_unix_ms: u64,
    /// An outcome the error carries explicitly.
    pub outcome: Option<Outcome>,
    /// The verdicts of the output checks the host ran on a returned answer
    /// ([`crate::output`]).
    pub output_checks: Vec<crate::output::OutputCheck>,
    /// The provider family whose tables apply ([`crate::provider`]); a
    /// session takes it from the planned route when the route names one.
    pub provider_family: Option<ProviderFamily>,
    /// Whether any response body bytes reached the caller.
    pub response_bytes_received: bool,
    /// Returned or raised.
    pub result: Returned,
    /// The HTTP status the error carries, if any.
    pub status: Option<u64>,
    /// What the host saw of the stream, when the dispatch opened one.
    pub stream: Option<StreamFacts>,
    /// A transport signal the host itself observed.
    pub transport_error: Option<Signal>,
}

impl Facts {
    /// The facts of a dispatch that returned a value.
    pub fn returned() -> Self {
        Self::new(Returned::Returned)
    }

    /// The facts of a dispatch that raised, with nothing known yet.
    pub fn raised() -> Self {
        Self::new(Returned::Raised)
    }

    fn new(result: Returned) -> Self {
        Self {
            cancelled: false,
            deadline_passed: false,
            error_body: None,
            error_codes: Vec::new(),
            error_types: Vec::new(),
            headers: Vec::new(),
            now_unix_ms: 0,
            outcome: None,
            output_checks: Vec::new(),
            provider_family: None,
            response_bytes_received: false,
            result,
            status: None,
            stream: None,
            transport_error: None,
        }
    }
}

/// Which rule decided an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The dispatch returned a value.
    Returned,
    /// The dispatch returned a value an output check failed.
    OutputCheck,
    /// The error carried an outcome.
    Explicit,
    /// The caller cancelled during the attempt.
    Cancelled,
    /// The host detected a broken stream protocol.
    StreamViolation,
    /// An error class name that names an outcome.
    ErrorType,
    /// Response bytes reached the caller before the error.
    OutputDelivered,
    /// The HTTP status.
    Status,
    /// An opened stream broke or ended without its terminal event.
    StreamCut,
    /// A transport signal.
    Transport,
    /// Raised after the run's deadline, otherwise unrecognized.
    Deadline,
    /// Nothing recognized the error; never retried.
    Unrecognized,
}

names!(Rule {
    Returned => "returned",
    OutputCheck => "output_check",
    Explicit => "explicit",
    Cancelled => "cancelled",
    StreamViolation => "stream_violation",
    ErrorType => "error_type",
    OutputDelivered => "output_delivered",
    Status => "status",
    StreamCut => "stream_cut",
    Transport => "transport",
    Deadline => "deadline",
    Unrecognized => "unrecognized",
});

/// An outcome and the rule that decided it. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// The outcome to record.
    pub outcome: Outcome,
    /// What the provider-aware reading of the response ignored, and why
    /// ([`crate::provider`]); absent when nothing was.
    pub notes: Option<Notes>,
    /// The rule that decided it.
    pub rule: Rule,
    /// For a streamed run observed by a session: what the host does with
    /// the consumer's events ([`crate::stream::StreamAction`]).
    pub stream: Option<StreamAction>,
}

/// The notes of a judgement, as a list of names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notes(pub Vec<Note>);

impl Decode for Notes {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, Note::ALL.len()).map(Self)
    }
}

impl Encode for Notes {
    fn encode(&self, sink: &mut dyn Sink) {
        crate::canonical::encode_list(self.0.iter(), sink);
    }
}

object!(Judgement {
    notes: opt_doc,
    outcome: doc,
    rule: doc,
    stream: opt_doc,
});

const UNKNOWN: Outcome = Outcome::Indeterminate {
    kind: IndeterminateKind::UnknownProviderAcceptance,
};
const INTERRUPTED: Outcome = Outcome::Indeterminate {
    kind: IndeterminateKind::StreamInterruptedAfterOutput,
};
const TIMED_OUT: Outcome = Outcome::Retryable {
    kind: RetryableKind::TimeoutBeforeResponse,
    retry_after_ms: None,
    retry_after_source: None,
};

/// Judge what a host observed (see the module documentation for the order).
pub fn judge(facts: &Facts) -> Result<Judgement> {
    judge_at(facts, facts.deadline_passed)
}

/// [`judge`] with `deadline_passed` given by a session, which knows the
/// attempt's completion and the run's deadline.
pub(crate) fn judge_at(facts: &Facts, deadline_passed: bool) -> Result<Judgement> {
    let decided = |outcome, rule| {
        Ok(Judgement {
            notes: None,
            outcome,
            rule,
            stream: None,
        })
    };
    let stream = facts.stream.as_ref();
    // A stream is complete only with the provider's terminal event.
    let complete = stream.is_none_or(|s| s.terminal_event && s.violation.is_none());
    if facts.result == Returned::Returned && complete {
        if let Some((o, _)) = crate::output::judge_checks(&facts.output_checks) {
            return decided(o, Rule::OutputCheck);
        }
        return decided(Outcome::Success, Rule::Returned);
    }
    if let Some(o) = facts.outcome {
        if o != Outcome::Success {
            return decided(o, Rule::Explicit);
        }
    }
    // Output reached the consumer: bytes of a response, or events of a live
    // stream (under `buffer` nothing reaches it before validation).
    let delivered =
        facts.response_bytes_received || stream.is_some_and(StreamFacts::delivered_live);
    if facts.cancelled {
        let o = if delivered { INTERRUPTED } else { UNKNOWN };
        return decided(o, Rule::Cancelled);
    }
    if stream.is_some_and(|s| s.violation.is_some()) {
        return decided(
            Outcome::NonRetryable {
                kind: NonRetryableKind::ProtocolViolation,
            },
            Rule::StreamViolation,
        );
    }
    if let Some(o) = facts
        .error_types
        .iter()
        .find_map(|n| match lookup(ERROR_TYPES, n) {
            Some(Meaning::Outcome(o)) => Some(o),
            _ => None,
        })
    {
        return decided(o, Rule::ErrorType);
    }
    // Under `tentative` and `continuation` delivered events are invalidated
    // or resumed, so the failure itself decides; elsewhere output that
    // reached the consumer is never retried.
    let recoverable = stream
        .and_then(|s| s.mode)
        .is_some_and(|m| matches!(m, StreamMode::Tentative | StreamMode::Continuation));
    if delivered && !recoverable {
        return decided(INTERRUPTED, Rule::OutputDelivered);
    }
    let signal = facts
        .error_types
        .iter()
        .filter_map(|n| lookup(ERROR_TYPES, n))
        .chain(
            facts
                .error_codes
                .iter()
                .filter_map(|n| lookup(ERROR_CODES, n)),
        )
        .filter_map(|m| match m {
            Meaning::Signal(s) => Some(s),
            Meaning::Outcome(_) => None,
        })
        .chain(facts.transport_error)
        .min();
    if let Some(status) = facts.status {
        let obs = HttpObservation {
            error_body: facts.error_body.clone(),
            headers: facts.headers.clone(),
            now_unix_ms: facts.now_unix_ms,
            provider_family: facts.provider_family,
            response_bytes_received: false,
            retry_after_cap_ms: MAX_SAFE_INTEGER,
            status: Some(status),
            transport_error: signal.and_then(transport),
        };
        let reading = classify_reading(&obs)?;
        // A raised error is never a success, whatever status it carries.
        if reading.outcome != Outcome::Success {
            return Ok(Judgement {
                notes: (!reading.notes.is_empty()).then_some(Notes(reading.notes)),
                outcome: reading.outcome,
                rule: Rule::Status,
                stream: None,
            });
        }
    }
    // An opened stream that broke (or ended without its terminal event) is
    // a failed delivery of a response the provider produced: retryable.
    if stream.is_some() && matches!(signal, None | Some(Signal::ConnectionReset)) {
        return decided(
            Outcome::Retryable {
                kind: RetryableKind::Unavailable,
                retry_after_ms: None,
                retry_after_source: None,
            },
            Rule::StreamCut,
        );
    }
    if let Some(s) = signal {
        let o = match s {
            Signal::ConnectFailed => Outcome::Retryable {
                kind: RetryableKind::Unavailable,
                retry_after_ms: None,
                retry_after_source: None,
            },
            Signal::Timeout => TIMED_OUT,
            Signal::Aborted if deadline_passed => TIMED_OUT,
            Signal::ConnectionReset | Signal::Aborted => UNKNOWN,
        };
        return decided(o, Rule::Transport);
    }
    if deadline_passed {
        return decided(TIMED_OUT, Rule::Deadline);
    }
    decided(UNKNOWN, Rule::Unrecognized)
}

fn transport(s: Signal) -> Option<TransportError> {
    match s {
        Signal::ConnectFailed => Some(TransportError::ConnectFailed),
        Signal::Timeout => Some(TransportError::Timeout),
        Signal::ConnectionReset => Some(TransportError::ConnectionReset),
        Signal::Aborted => None,
    }
}

/// A name: a string of at most [`MAX_ERROR_NAME_BYTES`].
struct Name(String);

impl Decode for Name {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let s = String::decode(v, at)?;
        if s.len() > MAX_ERROR_NAME_BYTES {
            return Err(at.error(
                ErrorCode::StringTooLong,
                format!(
                    "name is {} bytes; the limit is {MAX_ERROR_NAME_BYTES}",
                    s.len()
                ),
            ));
        }
        Ok(Self(s))
    }
}

fn names_of(v: &Value, at: &At<'_>) -> Result<Vec<String>> {
    Ok(decode_list::<Name>(v, at, MAX_ERROR_NAMES)?
        .into_iter()
        .map(|Name(s)| s)
        .collect())
}

impl Decode for Facts {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let cancelled = f.opt("cancelled");
        let deadline_passed = f.opt("deadline_passed");
        let error_body = f.opt("error_body");
        let error_codes = f.opt_with("error_codes", names_of);
        let error_types = f.opt_with("error_types", names_of);
        let headers = f.opt_with("headers", |v, at| decode_list::<Header>(v, at, MAX_HEADERS));
        let now_unix_ms = f.opt("now_unix_ms");
        let outcome = f.opt("outcome");
        let output_checks = f.opt_with("output_checks", crate::output::decode_checks);
        let provider_family = f.opt("provider_family");
        let response_bytes_received = f.opt("response_bytes_received");
        let result = f.req("result");
        let status = f.opt("status");
        let stream = f.opt("stream");
        let transport_error = f.opt("transport_error");
        f.end()?;
        let Some(result) = result else {
            return Err(f.incomplete());
        };
        if let Some(s) = status {
            if !(100..=599).contains(&s) {
                return Err(Error::at(
                    ErrorCode::InvalidStatus,
                    At::Key(at, "status").pointer(),
                    format!("status {s} is outside 100..=599"),
                ));
            }
        }
        Ok(Self {
            error_body,
            cancelled: cancelled.unwrap_or(false),
            deadline_passed: deadline_passed.unwrap_or(false),
            error_codes: error_codes.unwrap_or_default(),
            error_types: error_types.unwrap_or_default(),
            headers: headers
                .unwrap_or_default()
                .into_iter()
                .map(Header::into_pair)
                .collect(),
            now_unix_ms: now_unix_ms.unwrap_or(0),
            outcome,
            output_checks: output_checks.unwrap_or_default(),
            provider_family,
            response_bytes_received: response_bytes_received.unwrap_or(false),
            result,
            status,
            stream,
            transport_error,
        })
    }
}

impl Encode for Facts {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        if self.cancelled {
            o.bool("cancelled", true);
        }
        if self.deadline_passed {
            o.bool("deadline_passed", true);
        }
        if let Some(b) = &self.error_body {
            o.str("error_body", b);
        }
        if !self.error_codes.is_empty() {
            o.list("error_codes", &self.error_codes);
        }
        if !self.error_types.is_empty() {
            o.list("error_types", &self.error_types);
        }
        if !self.headers.is_empty() {
            let pairs: Vec<Header> = self
                .headers
                .iter()
                .map(|(k, v)| Header(k.clone(), v.clone()))
                .collect();
            o.list("headers", &pairs);
        }
        if self.now_unix_ms != 0 {
            o.u64("now_unix_ms", self.now_unix_ms);
        }
        o.opt_doc("outcome", self.outcome.as_ref());
        if !self.output_checks.is_empty() {
            o.list("output_checks", &self.output_checks);
        }
        o.opt_doc("provider_family", self.provider_family.as_ref());
        if self.response_bytes_received {
            o.bool("response_bytes_received", true);
        }
        o.doc("result", &self.result);
        o.opt_u64("status", self.status);
        o.opt_doc("stream", self.stream.as_ref());
        o.opt_doc("transport_error", self.transport_error.as_ref());
        o.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raised(f: impl FnOnce(&mut Facts)) -> Judgement {
        let mut facts = Facts::raised();
        f(&mut facts);
        judge(&facts).unwrap()
    }

    #[test]
    fn hosts_pass_every_header_a_provider_reading_needs() {
        for h in crate::provider::RATE_LIMIT_HEADERS {
            assert!(READ_HEADERS.contains(h), "{h}");
        }
        assert_eq!(
            READ_HEADERS.len(),
            crate::provider::RATE_LIMIT_HEADERS.len() + 3
        );
        assert!(READ_HEADERS.contains(&INJECTED_FAULT_HEADER));
    }

    #[test]
    fn tables_are_sorted_for_binary_search() {
        for table in [ERROR_TYPES, ERROR_CODES] {
            assert!(table.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }

    #[test]
    fn the_rules_in_order() {
        assert_eq!(judge(&Facts::returned()).unwrap().rule, Rule::Returned);
        let j = raised(|f| {
            f.outcome = Some(Outcome::Success);
            f.status = Some(503);
        });
        assert_eq!(
            j.rule,
            Rule::Status,
            "an explicit success on a raise is ignored"
        );
        let j = raised(|f| {
            f.error_types = vec!["APIResponseValidationError".into()];
            f.status = Some(200);
        });
        assert_eq!(j.rule, Rule::ErrorType);
        let j = raised(|f| {
            f.error_types = vec!["APIConnectionError".into(), "ConnectError".into()];
        });
        assert_eq!(
            j.outcome,
            Outcome::Retryable {
                kind: RetryableKind::Unavailable,
                retry_after_ms: None,
                retry_after_source: None,
            },
            "connect_failed is the strongest evidence"
        );
        let j = raised(|f| f.error_types = vec!["APIUserAbortError".into()]);
        assert_eq!(j.outcome, UNKNOWN);
        let j = raised(|f| {
            f.error_types = vec!["AbortError".into()];
            f.deadline_passed = true;
        });
        assert_eq!((j.outcome, j.rule), (TIMED_OUT, Rule::Transport));
        let j = raised(|f| f.deadline_passed = true);
        assert_eq!((j.outcome, j.rule), (TIMED_OUT, Rule::Deadline));
        let j = raised(|f| f.error_types = vec!["KeyError".into()]);
        assert_eq!((j.outcome, j.rule), (UNKNOWN, Rule::Unrecognized));
        let j = raised(|f| {
            f.cancelled = true;
            f.status = Some(429);
        });
        assert_eq!((j.outcome, j.rule), (UNKNOWN, Rule::Cancelled));
    }

    #[test]
    fn hints_are_recorded_as_observed() {
        let j = raised(|f| {
            f.status = Some(429);
            f.headers = vec![("Retry-After".into(), "3600".into())];
        });
        assert_eq!(j.outcome.retry_after_ms(), Some(3_600_000));
    }
}
