//! The machine's effects and events as JSON documents, for the bindings
//! and the vectors: each an object tagged by `kind`, keys in RFC 8785
//! order, decoded as strictly as every other document.

use serde_json::Value;

use super::{Effect, Event, Observation, Row};
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, decode_tag, names, pick, At, Decode, Fields};
use crate::error::Result;
use crate::limits::{MAX_ROUTES, MAX_STREAM_EVENTS};

/// A store document as read: documents in normal form hold objects,
/// arrays, strings, booleans and integers (the strict parse admits nothing
/// else); any other value is written as its JSON text.
struct Json<'a>(&'a Value);

impl Encode for Json<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        match self.0 {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
                sink.begin_object();
                for k in keys {
                    sink.key(k);
                    if let Some(v) = map.get(k) {
                        Json(v).encode(sink);
                    }
                }
                sink.end_object();
            }
            Value::Array(items) => {
                sink.begin_array();
                for v in items {
                    Json(v).encode(sink);
                }
                sink.end_array();
            }
            Value::String(s) => sink.str(s),
            Value::Bool(b) => sink.bool(*b),
            Value::Number(n) => match n.as_u64() {
                Some(u) => sink.u64(u),
                None => sink.str(&n.to_string()),
            },
            Value::Null => sink.str("null"),
        }
    }
}

/// A list of keys.
struct Keys<'a>(&'a [String]);

impl Encode for Keys<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.begin_array();
        for k in self.0 {
            sink.str(k);
        }
        sink.end_array();
    }
}

impl Encode for Effect {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Append { events } => o.list("events", events).str("kind", "append"),
            Self::Read { keys } => o.doc("keys", &Keys(keys)).str("kind", "read"),
            Self::Write { writes } => o.str("kind", "write").list("writes", writes),
            Self::Sleep { until_ms } => o.str("kind", "sleep").u64("until_ms", *until_ms),
            Self::Dispatch {
                dispatch,
                started_at_ms,
                hedge_at_ms,
                key,
                stream,
            } => o
                .doc("dispatch", dispatch)
                .opt_u64("hedge_at_ms", *hedge_at_ms)
                .opt_doc("key", key.as_ref())
                .str("kind", "dispatch")
                .u64("started_at_ms", *started_at_ms)
                .opt_doc("stream", stream.as_ref()),
            Self::Poll {
                dispatch,
                started_at_ms,
            } => o
                .doc("dispatch", dispatch)
                .str("kind", "poll")
                .u64("started_at_ms", *started_at_ms),
            Self::Cancel {
                dispatch,
                started_at_ms,
            } => o
                .doc("dispatch", dispatch)
                .str("kind", "cancel")
                .u64("started_at_ms", *started_at_ms),
            Self::Await {
                in_flight,
                hedge_at_ms,
            } => o
                .opt_u64("hedge_at_ms", *hedge_at_ms)
                .doc("in_flight", &Ordinals(in_flight))
                .str("kind", "await"),
            Self::CancelAttempts {
                decided_by,
                ordinals,
            } => o
                .u64("decided_by", *decided_by)
                .str("kind", "cancel_attempts")
                .doc("ordinals", &Ordinals(ordinals)),
            Self::Reconcile { attempt, poll } => o
                .doc("attempt", attempt)
                .str("kind", "reconcile")
                .u64("poll", *poll),
            Self::Done { terminal } => o.str("kind", "done").doc("terminal", terminal),
        };
        o.end();
    }
}

/// A list of ordinals.
struct Ordinals<'a>(&'a [u64]);

impl Encode for Ordinals<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        sink.begin_array();
        for n in self.0 {
            sink.u64(*n);
        }
        sink.end_array();
    }
}

/// The kinds of [`Event`], as the `kind` tag names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Appended,
    AppendRefused,
    Read,
    StoreUnavailable,
    Written,
    Clock,
    Observed,
    Reconciled,
    Cancelled,
    AttemptCancelled,
}

names!(EventKind {
    Appended => "appended",
    AppendRefused => "append_refused",
    Read => "read",
    StoreUnavailable => "store_unavailable",
    Written => "written",
    Clock => "clock",
    Observed => "observed",
    Reconciled => "reconciled",
    Cancelled => "cancelled",
    AttemptCancelled => "attempt_cancelled",
});

impl Decode for Row {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let document = f.opt_with("document", |v, _| Ok(v.clone()));
        let generation = f.req("generation");
        f.end()?;
        let Some(generation) = generation else {
            return Err(f.incomplete());
        };
        Ok(Self {
            document,
            generation,
        })
    }
}

/// `{"document"?: …, "generation": …}`.
impl Encode for Row {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        if let Some(d) = &self.document {
            o.doc("document", &Json(d));
        }
        o.u64("generation", self.generation).end();
    }
}

/// The `observed` event's fields (without its `kind`).
fn observation(f: &mut Fields<'_>) -> Result<Observation> {
    let completed_at_ms = f.req("completed_at_ms");
    let cost = f.opt("cost");
    let deltas = f.opt_with("deltas", |v, at| decode_list(v, at, MAX_STREAM_EVENTS));
    let facts = f.opt("facts");
    let job_id = f.opt("job_id");
    let job_status = f.opt("job_status");
    let model = f.opt("model");
    let ordinal = f.opt("ordinal");
    let reconciled = f.opt("reconciled");
    let request_body_sha256 = f.opt("request_body_sha256");
    let usage = f.opt("usage");
    let used_tokens = f.opt("used_tokens");
    f.end()?;
    let Some(completed_at_ms) = completed_at_ms else {
        return Err(f.incomplete());
    };
    Ok(Observation {
        ordinal,
        completed_at_ms,
        cost,
        deltas: deltas.unwrap_or_default(),
        facts,
        job_id,
        job_status,
        model,
        reconciled,
        request_body_sha256,
        usage,
        used_tokens,
    })
}

impl Encode for Observation {
    fn encode(&self, sink: &mut dyn Sink) {
        self.write(false, sink);
    }
}

impl Observation {
    fn write(&self, tagged: bool, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.u64("completed_at_ms", self.completed_at_ms)
            .opt_u64("cost", self.cost);
        if !self.deltas.is_empty() {
            o.list("deltas", &self.deltas);
        }
        o.opt_doc("facts", self.facts.as_ref());
        if let Some(id) = &self.job_id {
            o.str("job_id", id);
        }
        o.opt_doc("job_status", self.job_status.as_ref());
        if tagged {
            o.str("kind", "observed");
        }
        o.opt_doc("model", self.model.as_ref());
        o.opt_u64("ordinal", self.ordinal);
        o.opt_doc("reconciled", self.reconciled.as_ref());
        o.opt_doc("request_body_sha256", self.request_body_sha256.as_ref())
            .opt_doc("usage", self.usage.as_ref())
            .opt_u64("used_tokens", self.used_tokens)
            .end();
    }
}

impl Encode for Event {
    fn encode(&self, sink: &mut dyn Sink) {
        if let Self::Observed(obs) = self {
            obs.write(true, sink);
            return;
        }
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Appended => o.str("kind", "appended"),
            Self::AppendRefused => o.str("kind", "append_refused"),
            Self::Read { now_ms, rows } => o
                .str("kind", "read")
                .u64("now_ms", *now_ms)
                .list("rows", rows),
            Self::StoreUnavailable { now_ms } => {
                o.str("kind", "store_unavailable").u64("now_ms", *now_ms)
            }
            Self::Written { written } => o.str("kind", "written").u64("written", *written),
            Self::Clock { now_ms } => o.str("kind", "clock").u64("now_ms", *now_ms),
            Self::Reconciled {
                answer,
                at_ms,
                cost,
                job_id,
            } => {
                o.doc("answer", answer)
                    .u64("at_ms", *at_ms)
                    .opt_u64("cost", *cost);
                if let Some(id) = job_id {
                    o.str("job_id", id);
                }
                o.str("kind", "reconciled")
            }
            Self::Cancelled { at_ms } => o.u64("at_ms", *at_ms).str("kind", "cancelled"),
            Self::AttemptCancelled { ordinal, at_ms } => o
                .u64("at_ms", *at_ms)
                .str("kind", "attempt_cancelled")
                .u64("ordinal", *ordinal),
            Self::Observed(_) => &mut o,
        };
        o.end();
    }
}

/// An event is an object tagged by `kind`; everything else inside the
/// object is reported at the object.
impl Decode for Event {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let kind = pick(
            EventKind::ALL,
            decode_tag(v, at, "kind", EventKind::NAMES)?,
            at,
        )?;
        let mut f = Fields::open(v, at)?.variant("kind");
        let event = match kind {
            EventKind::Appended => Some(Self::Appended),
            EventKind::AppendRefused => Some(Self::AppendRefused),
            EventKind::Read => {
                let now_ms = f.req("now_ms");
                // One row per key: at most every route's breaker,
                // admission limits and key pool, and the budget.
                let bound = MAX_ROUTES.saturating_mul(3).saturating_add(1);
                let rows = f.req_with("rows", |v, at| decode_list(v, at, bound));
                now_ms
                    .zip(rows)
                    .map(|(now_ms, rows)| Self::Read { now_ms, rows })
            }
            EventKind::StoreUnavailable => f
                .req("now_ms")
                .map(|now_ms| Self::StoreUnavailable { now_ms }),
            EventKind::Written => f.req("written").map(|written| Self::Written { written }),
            EventKind::Clock => f.req("now_ms").map(|now_ms| Self::Clock { now_ms }),
            EventKind::Observed => {
                return Ok(Self::Observed(Box::new(observation(&mut f)?)));
            }
            EventKind::Reconciled => {
                let answer = f.req("answer");
                let at_ms = f.req("at_ms");
                let cost = f.opt("cost");
                let job_id = f.opt("job_id");
                answer.zip(at_ms).map(|(answer, at_ms)| Self::Reconciled {
                    answer,
                    at_ms,
                    cost,
                    job_id,
                })
            }
            EventKind::Cancelled => f.req("at_ms").map(|at_ms| Self::Cancelled { at_ms }),
            EventKind::AttemptCancelled => {
                let at_ms = f.req("at_ms");
                let ordinal = f.req("ordinal");
                at_ms
                    .zip(ordinal)
                    .map(|(at_ms, ordinal)| Self::AttemptCancelled { ordinal, at_ms })
            }
        };
        f.end()?;
        event.ok_or_else(|| f.incomplete())
    }
}
