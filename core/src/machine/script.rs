//! A scripted host for the run machine (the `lab` feature): an in-memory
//! register store with generations, an in-memory journal, a fake clock and
//! a script of what each dispatch observes. It answers every effect the way
//! a real host would and records the events, so vectors, tests, the fuzz
//! target and the benches drive the machine with no I/O at all.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{Effect, Event, Machine, Observation, Options, Row};
use crate::canonical::to_value;
use crate::decode::{from_value, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::journal::{AnswerKind, JournalEvent};
use crate::observe::Facts;
use crate::policy::CompiledPolicy;

/// What the scripted host does.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// What each dispatch (a job's polls and cancel included) observes, in
    /// order: `{"after_ms", "facts"?, "deltas"?, "usage"?, "cost"?,
    /// "used_tokens"?, "request_body_sha256"?, "model"?, "job_id"?, "job_status"?}`
    /// (in a hedged run, `after_ms` from its own start; `"late": true` on a
    /// loser waits for its result instead of cancelling it).
    pub attempts: Vec<Value>,
    /// What the receiver answers each reconcile: `{"answer", "after_ms"?,
    /// "cost"?, "job_id"?}`.
    pub reconcile: Vec<Value>,
    /// The store's documents before the run, each at generation 1.
    pub store: BTreeMap<String, Value>,
    /// Writes that conflict (another writer got there first), by index.
    pub conflicts: Vec<u64>,
    /// Reads the store cannot answer, by index.
    pub unavailable: Vec<u64>,
    /// Sleeps the caller cancels, by index.
    pub cancel_sleeps: Vec<u64>,
    /// The host stops (a crash) after this many appends were made durable.
    pub crash_after_appends: Option<u64>,
}

fn indices(v: &Value, key: &str) -> Vec<u64> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

impl Script {
    /// A script from its JSON form.
    pub fn from_value(v: &Value) -> Result<Self> {
        let list = |key: &str| {
            v.get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let store = v
            .get("store")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, d)| (k.clone(), d.clone())).collect())
            .unwrap_or_default();
        Ok(Self {
            attempts: list("attempts"),
            reconcile: list("reconcile"),
            store,
            conflicts: indices(v, "conflicts"),
            unavailable: indices(v, "unavailable"),
            cancel_sleeps: indices(v, "cancel_sleeps"),
            crash_after_appends: v.get("crash_after_appends").and_then(Value::as_u64),
        })
    }
}

/// What a scripted run left behind.
#[derive(Debug, Clone, Default)]
pub struct Played {
    /// The events the host answered with, in order.
    pub events: Vec<Event>,
    /// The journal the host holds (made durable).
    pub journal: Vec<JournalEvent>,
    /// The store after the run: key -> (document, generation).
    pub store: BTreeMap<String, (Value, u64)>,
    /// Whether the host stopped before the run was done (a crash).
    pub crashed: bool,
    /// The run clock at the end.
    pub now_ms: u64,
    /// The machine's error, when it refused an answer.
    pub error: Option<Error>,
}

fn after(v: &Value) -> u64 {
    v.get("after_ms").and_then(Value::as_u64).unwrap_or(0)
}

fn decoded<T: Decode>(v: Option<&Value>) -> Result<Option<T>> {
    v.map(|v| T::decode(v, &At::Root)).transpose()
}

fn observation(step: &Value, now: u64) -> Result<Observation> {
    let facts: Option<Facts> = decoded(step.get("facts"))?;
    let deltas = step
        .get("deltas")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(Observation {
        ordinal: None,
        completed_at_ms: now.saturating_add(after(step)),
        cost: step.get("cost").and_then(Value::as_u64),
        deltas,
        facts,
        job_id: step
            .get("job_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        job_status: decoded(step.get("job_status"))?,
        model: decoded(step.get("model"))?,
        reconciled: decoded(step.get("reconciled"))?,
        request_body_sha256: decoded(step.get("request_body_sha256"))?,
        usage: decoded(step.get("usage"))?,
        used_tokens: step.get("used_tokens").and_then(Value::as_u64),
    })
}

/// Drive `m` to its end (or the script's crash) as a host would; the
/// journal given is what the store already holds (a resumed run).
pub fn play(m: &mut Machine, script: &Script, journal: Vec<JournalEvent>) -> Played {
    let mut played = Played {
        journal,
        now_ms: m.now_ms(),
        store: script
            .store
            .iter()
            .map(|(k, d)| (k.clone(), (d.clone(), 1)))
            .collect(),
        ..Played::default()
    };
    let (mut dispatches, mut polls, mut writes, mut reads, mut sleeps, mut appends) =
        (0usize, 0usize, 0u64, 0u64, 0u64, 0u64);
    // A hedged run's attempts in flight, with what each will observe.
    let mut flying: Vec<(Observation, bool)> = Vec::new();
    // Every effect is answered once; a run has a bounded number of them.
    for _ in 0..super::replay::MAX_MACHINE_EVENTS {
        let event =
            match m.next().clone() {
                Effect::Done { .. } => return played,
                Effect::Append { events } => {
                    if script.crash_after_appends == Some(appends) {
                        played.crashed = true;
                        return played;
                    }
                    appends = appends.saturating_add(1);
                    played.journal.extend(events);
                    Event::Appended
                }
                Effect::Read { keys } => {
                    reads = reads.saturating_add(1);
                    if script.unavailable.contains(&reads.saturating_sub(1)) {
                        Event::StoreUnavailable {
                            now_ms: played.now_ms,
                        }
                    } else {
                        let rows = keys
                            .iter()
                            .map(|k| match played.store.get(k) {
                                Some((d, g)) => Row {
                                    document: Some(d.clone()),
                                    generation: *g,
                                },
                                None => Row {
                                    document: None,
                                    generation: 0,
                                },
                            })
                            .collect();
                        Event::Read {
                            now_ms: played.now_ms,
                            rows,
                        }
                    }
                }
                Effect::Write { writes: cas } => {
                    let mut written = 0u64;
                    for c in &cas {
                        let index = writes;
                        writes = writes.saturating_add(1);
                        let current = played.store.get(&c.key).map_or(0, |(_, g)| *g);
                        if script.conflicts.contains(&index) {
                            // Another writer moved the key on first.
                            let doc = played
                                .store
                                .get(&c.key)
                                .map_or_else(|| to_value(&c.document), |(d, _)| d.clone());
                            played
                                .store
                                .insert(c.key.clone(), (doc, current.saturating_add(1)));
                            break;
                        }
                        if current != c.expected_generation {
                            break;
                        }
                        played.store.insert(
                            c.key.clone(),
                            (to_value(&c.document), current.saturating_add(1)),
                        );
                        written = written.saturating_add(1);
                    }
                    Event::Written { written }
                }
                Effect::Sleep { until_ms } => {
                    sleeps = sleeps.saturating_add(1);
                    if script.cancel_sleeps.contains(&sleeps.saturating_sub(1)) {
                        Event::Cancelled {
                            at_ms: played.now_ms,
                        }
                    } else {
                        played.now_ms = played.now_ms.max(until_ms);
                        Event::Clock {
                            now_ms: played.now_ms,
                        }
                    }
                }
                Effect::Poll { .. } | Effect::Cancel { .. } => {
                    let step = script.attempts.get(dispatches).cloned().unwrap_or_else(
                        || json!({"after_ms": 10, "facts": {"result": "returned"}}),
                    );
                    dispatches = dispatches.saturating_add(1);
                    match observation(&step, played.now_ms) {
                        Ok(obs) => {
                            played.now_ms = obs.completed_at_ms;
                            Event::Observed(Box::new(obs))
                        }
                        Err(e) => {
                            played.error = Some(e);
                            return played;
                        }
                    }
                }
                Effect::Dispatch {
                    dispatch,
                    started_at_ms,
                    hedge_at_ms,
                    ..
                } => {
                    let step = script.attempts.get(dispatches).cloned().unwrap_or_else(
                        || json!({"after_ms": 10, "facts": {"result": "returned"}}),
                    );
                    dispatches = dispatches.saturating_add(1);
                    match observation(&step, started_at_ms) {
                        Ok(mut obs) if m.is_hedged() => {
                            obs.ordinal = Some(dispatch.ordinal);
                            let late = step.get("late").and_then(Value::as_bool) == Some(true);
                            flying.push((obs, late));
                            hedged_wait(&mut flying, &mut played.now_ms, hedge_at_ms)
                        }
                        Ok(obs) => {
                            played.now_ms = obs.completed_at_ms;
                            Event::Observed(Box::new(obs))
                        }
                        Err(e) => {
                            played.error = Some(e);
                            return played;
                        }
                    }
                }
                Effect::Await { hedge_at_ms, .. } => {
                    hedged_wait(&mut flying, &mut played.now_ms, hedge_at_ms)
                }
                Effect::CancelAttempts { ordinals, .. } => {
                    // A loser whose result is in (or that waits for it) is
                    // observed late; otherwise the first is cancelled now.
                    let late = flying.iter().position(|(o, late)| {
                        o.ordinal.is_some_and(|n| ordinals.contains(&n))
                            && (*late || o.completed_at_ms <= played.now_ms)
                    });
                    match late {
                        Some(i) => {
                            let (obs, _) = flying.remove(i);
                            played.now_ms = played.now_ms.max(obs.completed_at_ms);
                            Event::Observed(Box::new(obs))
                        }
                        None => {
                            let ordinal = ordinals.first().copied().unwrap_or(0);
                            flying.retain(|(o, _)| o.ordinal != Some(ordinal));
                            Event::AttemptCancelled {
                                ordinal,
                                at_ms: played.now_ms,
                            }
                        }
                    }
                }
                Effect::Reconcile { .. } => {
                    let step = script
                        .reconcile
                        .get(polls)
                        .cloned()
                        .unwrap_or_else(|| json!({"answer": "unknown"}));
                    polls = polls.saturating_add(1);
                    played.now_ms = played.now_ms.saturating_add(after(&step));
                    let answer = step
                        .get("answer")
                        .map(|a| AnswerKind::decode(a, &At::Root))
                        .unwrap_or(Ok(AnswerKind::Unknown));
                    match answer {
                        Ok(answer) => Event::Reconciled {
                            answer,
                            at_ms: played.now_ms,
                            cost: step.get("cost").and_then(Value::as_u64),
                            job_id: step
                                .get("job_id")
                                .and_then(Value::as_str)
                                .map(str::to_owned),
                        },
                        Err(e) => {
                            played.error = Some(e);
                            return played;
                        }
                    }
                }
            };
        played.events.push(event.clone());
        if let Err(e) = m.answer(event) {
            played.error = Some(e);
            return played;
        }
    }
    played.error = Some(Error::new(
        ErrorCode::TooManyItems,
        "the scripted run did not end within the bound of events",
    ));
    played
}

/// A hedged run's wait: the earliest result in flight, or the clock at
/// `hedge_at_ms` when that comes first.
fn hedged_wait(
    flying: &mut Vec<(Observation, bool)>,
    now: &mut u64,
    hedge_at_ms: Option<u64>,
) -> Event {
    let first = flying
        .iter()
        .enumerate()
        .min_by_key(|(_, (o, _))| (o.completed_at_ms, o.ordinal))
        .map(|(i, (o, _))| (i, o.completed_at_ms));
    match (first, hedge_at_ms) {
        (Some((i, at)), h) if h.is_none_or(|h| at <= h) => {
            let (obs, _) = flying.remove(i);
            *now = (*now).max(at);
            Event::Observed(Box::new(obs))
        }
        (_, h) => {
            *now = (*now).max(h.unwrap_or(*now));
            Event::Clock { now_ms: *now }
        }
    }
}

/// Start a run of `policy` with `options` and play `script` to its end.
pub fn play_start(cp: &Arc<CompiledPolicy>, options: Options, script: &Script) -> Result<Played> {
    let mut m = Machine::start(Arc::clone(cp), options)?;
    Ok(play(&mut m, script, Vec::new()))
}

/// Resume from `journal` and play `script` to its end.
pub fn play_resume(
    cp: &Arc<CompiledPolicy>,
    options: Options,
    journal: Vec<JournalEvent>,
    script: &Script,
) -> Result<Played> {
    let mut m = Machine::resume(Arc::clone(cp), &journal, options)?;
    Ok(play(&mut m, script, journal))
}

/// Options from their JSON form.
pub fn options_of(v: &Value) -> Result<Options> {
    from_value(v.clone())
}
