//! Replays through the run machine.
//!
//! - The machine's log: a journal replayed event by event into the run it
//!   records (`log`, [`Log`], [`verify`]; a hedged round's events, `round`).
//!   Resuming a run is this replay, once; the writer advances it by each
//!   append.
//! - A transcript: a machine fed a recorded sequence of events, the effects
//!   it asked for, in order, and where it ended ([`transcript`]). This is
//!   how the composition vectors are checked in every language: the same
//!   events must draw the same effects, the same terminal and the same
//!   sealed bundle.

use std::sync::Arc;

use serde_json::{json, Value};

mod log;
pub(crate) mod round;

pub(crate) use log::{at_event, plan_drift, Expect};
pub use log::{verify, Log, Verified};

use super::{Event, JournalOptions, Machine, Options};
use crate::canonical::{digest_of, to_value, Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, At, Decode, Fields};
use crate::error::{Error, Result};
use crate::ids::Identifier;
use crate::journal::{JournalEvent, MAX_EVENTS};
use crate::policy::CompiledPolicy;
use crate::price::PriceSchedule;
use crate::receipt::verify_bundle;

/// Most events one replay takes: every journal event, every read, write
/// and sleep of every attempt.
pub const MAX_MACHINE_EVENTS: usize = 8 * MAX_EVENTS;

/// `{"lease_generation": …, "run_id": …}`.
impl Decode for JournalOptions {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let lease_generation = f.req("lease_generation");
        let run_id: Option<Identifier> = f.req("run_id");
        f.end()?;
        let (Some(lease_generation), Some(run_id)) = (lease_generation, run_id) else {
            return Err(f.incomplete());
        };
        Ok(Self {
            run_id,
            lease_generation,
        })
    }
}

impl Encode for JournalOptions {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .u64("lease_generation", self.lease_generation)
            .doc("run_id", &self.run_id)
            .end();
    }
}

/// The options of a start or a resume, as a document (every field optional
/// but `origin_epoch_ms`).
impl Decode for Options {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let journal = f.opt("journal");
        let key_affinity = f.opt("key_affinity");
        let max_conflicts = f.opt("max_conflicts");
        let max_polls = f.opt("max_polls");
        let now_ms = f.opt("now_ms");
        let origin_epoch_ms = f.req("origin_epoch_ms");
        let price_schedule: Option<PriceSchedule> = f.opt("price_schedule");
        let reserve_tokens = f.opt("reserve_tokens");
        let stream: Option<bool> = f.opt("stream");
        let tenant = f.opt("tenant");
        f.end()?;
        let Some(origin_epoch_ms) = origin_epoch_ms else {
            return Err(f.incomplete());
        };
        Ok(Self {
            origin_epoch_ms,
            now_ms: now_ms.unwrap_or(0),
            journal,
            price_schedule: price_schedule.map(Arc::new),
            reserve_tokens,
            max_polls,
            max_conflicts,
            key_affinity,
            stream: stream.unwrap_or(false),
            tenant,
        })
    }
}

impl Encode for Options {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.opt_doc("journal", self.journal.as_ref())
            .opt_doc("key_affinity", self.key_affinity.as_ref())
            .opt_u64("max_conflicts", self.max_conflicts)
            .opt_u64("max_polls", self.max_polls);
        if self.now_ms > 0 {
            o.u64("now_ms", self.now_ms);
        }
        o.u64("origin_epoch_ms", self.origin_epoch_ms)
            .opt_doc("price_schedule", self.price_schedule.as_deref())
            .opt_u64("reserve_tokens", self.reserve_tokens);
        if self.stream {
            o.bool("stream", true);
        }
        o.opt_doc("tenant", self.tenant.as_ref()).end();
    }
}

/// A list of events.
pub struct Events(pub Vec<Event>);

impl Decode for Events {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        decode_list(v, at, MAX_MACHINE_EVENTS).map(Self)
    }
}

/// The machine started (or, with `journal`, resumed from it) and fed
/// `events`: `{"effects": [the effect outstanding before each event, then
/// the last one], "terminal"?, "bundle_sha256"?, "receipt_sha256"?,
/// "error"? {"code", "path"?, "event"}}`. The first refused event ends the
/// replay; an error at start has `"event": null`.
pub fn transcript(
    cp: &Arc<CompiledPolicy>,
    options: Options,
    journal: Option<&[JournalEvent]>,
    events: &[Event],
) -> Value {
    let started = match journal {
        Some(j) => Machine::resume(Arc::clone(cp), j, options),
        None => Machine::start(Arc::clone(cp), options),
    };
    let mut m = match started {
        Ok(m) => m,
        Err(e) => return json!({"effects": [], "error": error_at(&e, None)}),
    };
    let mut effects = Vec::with_capacity(events.len().saturating_add(1));
    for (i, event) in events.iter().enumerate() {
        effects.push(to_value(m.next()));
        if let Err(e) = m.answer(event.clone()) {
            return json!({"effects": effects, "error": error_at(&e, Some(i))});
        }
    }
    effects.push(to_value(m.next()));
    let mut out = serde_json::Map::new();
    out.insert("effects".into(), Value::Array(effects));
    if let super::Effect::Done { terminal } = m.next() {
        out.insert("terminal".into(), json!(terminal.as_str()));
        match m.seal() {
            Ok(bundle) => {
                out.insert("receipt_sha256".into(), json!(digest_of(&bundle.receipt)));
                out.insert("bundle_sha256".into(), json!(digest_of(&bundle)));
                match verify_bundle(&bundle) {
                    Ok(crate::receipt::Verdict::Verified { .. }) => {}
                    // A sealed bundle that drifts is the machine's error.
                    Ok(crate::receipt::Verdict::Drift { code, path, .. }) => {
                        out.insert(
                            "error".into(),
                            json!({"code": code, "event": null, "path": path}),
                        );
                    }
                    Err(e) => {
                        out.insert("error".into(), error_at(&e, None));
                    }
                }
            }
            Err(e) => {
                out.insert("error".into(), error_at(&e, None));
            }
        }
    }
    Value::Object(out)
}

fn error_at(e: &Error, event: Option<usize>) -> Value {
    let mut v = serde_json::Map::new();
    v.insert("code".into(), json!(e.code.as_str()));
    v.insert("event".into(), json!(event));
    if let Some(p) = &e.path {
        v.insert("path".into(), json!(p));
    }
    Value::Object(v)
}
