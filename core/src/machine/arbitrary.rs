//! The run machine driven by arbitrary bytes (the `lab` feature): what the
//! fuzz target `machine` and a property test run. The bytes choose a policy
//! (plain, a fleet with breaker, budget and limits, a tentative stream, both,
//! an async job with and without a fleet, a hedged one alone or under the
//! whole fleet, a key pool on every route alone or under the whole fleet;
//! journaled or not) and then, one byte at a time, the host's
//! answer: most often a plausible one (a store that keeps its registers, a
//! clock that moves on, an observation with a status), sometimes any event
//! at all, and
//! sometimes a crash after which a new owner resumes from any prefix of the
//! journal written so far.
//!
//! What must hold for any input: every refused answer is a coded error; a
//! machine that is done seals a bundle that verifies; the journal written
//! verifies; a resume of any journal prefix starts or fails with a code. A
//! violation is returned as a finding.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{Effect, Event, JournalOptions, Machine, Observation, Options, Row};
use crate::canonical::to_value;
use crate::error::{Error, ErrorCode};
use crate::ids::Identifier;
use crate::journal::{self, AnswerKind, JournalEvent};
use crate::observe::{Facts, Returned};
use crate::policy::CompiledPolicy;
use crate::receipt::verify_bundle;

/// The policies the bytes choose from.
fn policies() -> Vec<Arc<CompiledPolicy>> {
    let fleet = json!({"admission": {"max_in_flight": 2, "max_queue_ms": 1_000, "request_burst": 2,
            "requests_per_second": 10},
        "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000},
        "on_store_unavailable": "fail_open",
        "retry_budget": {"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "s"}});
    let stream = json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500,
        "max_response_bytes": 65_536, "mode": "tentative"});
    let mut out = Vec::new();
    for (f, s) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut p = crate::lab::reference_policy();
        if let Value::Object(m) = &mut p {
            if f {
                m.insert("fleet".into(), fleet.clone());
            }
            if s {
                m.insert("stream".into(), stream.clone());
            }
        }
        if let Ok(cp) = crate::decode::from_value(p).and_then(crate::compile) {
            out.push(Arc::new(cp));
        }
    }
    for f in [false, true] {
        let mut p = crate::lab::reference_policy();
        if let Value::Object(m) = &mut p {
            m.insert(
                "async_job".into(),
                json!({"cancel_left_running": true, "max_polls": 3, "poll_base_ms": 100, "poll_max_ms": 400}),
            );
            if f {
                m.insert("fleet".into(), fleet.clone());
            }
        }
        if let Ok(cp) = crate::decode::from_value(p).and_then(crate::compile) {
            out.push(Arc::new(cp));
        }
    }
    // Hedged: alone, and under the whole fleet.
    let hedge = json!({"cancelled_cost": "reserve", "cost_share_percent": 100, "delay_ms": 50,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]});
    for f in [None, Some(fleet.clone())] {
        let mut p = crate::lab::reference_policy();
        if let Value::Object(m) = &mut p {
            m.insert("hedge".into(), hedge.clone());
            if let Some(f) = f {
                m.insert("fleet".into(), f);
            }
        }
        if let Ok(cp) = crate::decode::from_value(p).and_then(crate::compile) {
            out.push(Arc::new(cp));
        }
    }
    // A key pool on every route (two keys of one account and one of its
    // own): alone, and under the whole fleet.
    let pool = json!({"cool_ms": 500, "keys": [
            {"account": "a", "key_sha256": crate::canonical::sha256_hex(b"k0")},
            {"account": "a", "key_sha256": crate::canonical::sha256_hex(b"k1")},
            {"key_sha256": crate::canonical::sha256_hex(b"k2")}],
        "name": "keys", "park_ms": 5_000});
    for base in [json!({"on_store_unavailable": "fail_closed"}), fleet] {
        let mut p = crate::lab::reference_policy();
        if let Value::Object(m) = &mut p {
            let mut f = base;
            if let Value::Object(fm) = &mut f {
                fm.insert("key_pools".into(), json!([pool.clone()]));
            }
            m.insert("fleet".into(), f);
            if let Some(Value::Array(routes)) = m.get_mut("routes") {
                for r in routes.iter_mut() {
                    if let Value::Object(rm) = r {
                        rm.insert("key_pool".into(), json!("keys"));
                    }
                }
            }
        }
        if let Ok(cp) = crate::decode::from_value(p).and_then(crate::compile) {
            out.push(Arc::new(cp));
        }
    }
    out
}

/// What a job's answer reports, chosen by a byte: the job id and a status
/// (a returned submit or poll), nothing otherwise.
fn job_answer(obs: &mut Observation, effect: &Effect, b: u8) {
    use crate::job::JobStatus;
    let returned = obs
        .facts
        .as_ref()
        .is_some_and(|f| f.result == Returned::Returned);
    if !returned || matches!(effect, Effect::Cancel { .. }) {
        return;
    }
    obs.job_id = (b & 0x80 == 0).then(|| "job-1".to_owned());
    obs.job_status = JobStatus::ALL.get(usize::from(b % 8)).copied();
}

/// Reads bytes one at a time (0 once they run out).
struct Bytes<'a>(std::slice::Iter<'a, u8>);

impl Bytes<'_> {
    fn next(&mut self) -> Option<u8> {
        self.0.next().copied()
    }
    fn byte(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }
}

fn options(journal: bool, lease: u64, now_ms: u64) -> Options {
    Options {
        origin_epoch_ms: 1_780_000_000_000,
        now_ms,
        journal: journal
            .then(|| Identifier::parse("run-arbitrary").ok())
            .flatten()
            .map(|run_id| JournalOptions {
                run_id,
                lease_generation: lease,
            }),
        ..Options::default()
    }
}

const TEXT: [&str; 3] = ["The incident", " began", " at 09:14."];

/// An observation chosen by a byte: returned, a status, a timeout or a cut
/// stream; its stream facts agree with its deltas when `stream`.
fn observed(b: u8, after: u8, now: u64, stream: bool) -> Observation {
    let mut facts = Facts::raised();
    let statuses = [429, 503, 400, 408, 500, 409, 422];
    let pick = usize::from(b % 10);
    let mut delivered = 0usize;
    match pick {
        0..=2 => {
            facts = Facts::returned();
            delivered = TEXT.len();
        }
        3 => facts.transport_error = Some(crate::observe::Signal::Timeout),
        4 => delivered = 1,
        _ => facts.status = statuses.get(pick.saturating_sub(5)).copied(),
    }
    if b & 0x80 != 0 {
        facts.headers = vec![("retry-after".into(), "1".into())];
    }
    let deltas: Vec<String> = if stream {
        TEXT.iter()
            .take(delivered)
            .map(|s| (*s).to_owned())
            .collect()
    } else {
        Vec::new()
    };
    if stream && (facts.result == Returned::Returned || delivered > 0 || b & 0x40 != 0) {
        let bytes: usize = deltas.iter().map(String::len).sum();
        facts.stream = crate::decode::from_value(json!({
            "bytes": bytes, "events": deltas.len(),
            "terminal_event": facts.result == Returned::Returned,
            "usage_event": facts.result == Returned::Returned,
        }))
        .ok();
    }
    if b & 0x20 != 0 && facts.result == Returned::Returned {
        let check: Option<crate::output::OutputCheck> = crate::decode::from_value(json!({
            "defects": [{"message": "empty"}], "kind": "empty",
            "validator": "builtin.empty", "verdict": "defects"}))
        .ok();
        facts.output_checks = check.into_iter().collect();
    }
    Observation {
        completed_at_ms: now.saturating_add(u64::from(after)),
        deltas,
        facts: Some(facts),
        ..Observation::default()
    }
}

/// Any event at all, chosen by the bytes.
fn any_event(b: u8, bytes: &mut Bytes<'_>, now: u64) -> Event {
    let x = u64::from(bytes.byte());
    match b % 9 {
        0 => Event::Appended,
        1 => Event::AppendRefused,
        2 => Event::Read {
            now_ms: now.saturating_add(x),
            rows: (0..x % 4)
                .map(|g| Row {
                    document: (g % 2 == 0).then(|| json!({"schema": "retryledger.breaker.v1"})),
                    generation: g,
                })
                .collect(),
        },
        3 => Event::StoreUnavailable {
            now_ms: now.saturating_sub(x),
        },
        4 => Event::Written { written: x % 4 },
        5 => Event::Clock {
            now_ms: now.saturating_add(x).saturating_sub(128),
        },
        6 => Event::Observed(Box::new(observed(
            bytes.byte(),
            bytes.byte(),
            now,
            x % 2 == 0,
        ))),
        7 => Event::Reconciled {
            answer: [
                AnswerKind::Succeeded,
                AnswerKind::FailedNoEffect,
                AnswerKind::InProgress,
                AnswerKind::Unknown,
            ]
            .get(usize::try_from(x % 4).unwrap_or(0))
            .copied()
            .unwrap_or(AnswerKind::Unknown),
            at_ms: now.saturating_add(x),
            cost: None,
            job_id: (x % 3 == 0).then(|| "job-1".to_owned()),
        },
        _ => Event::Cancelled { at_ms: now },
    }
}

/// A hedged run's answer to a dispatch or a wait: the clock at the hedge's
/// time, or the observation of an attempt in flight (its ordinal named).
fn hedged_answer(
    bytes: &mut Bytes<'_>,
    now: &mut u64,
    flying: &[u64],
    hedge_at_ms: Option<u64>,
    hedged: bool,
) -> Event {
    let b = bytes.byte();
    if let (Some(at), 0) = (hedge_at_ms, b % 3) {
        *now = (*now).max(at);
        return Event::Clock { now_ms: *now };
    }
    let mut obs = observed(bytes.byte(), bytes.byte(), *now, false);
    if hedged {
        obs.ordinal = flying
            .get(usize::from(b).checked_rem(flying.len()).unwrap_or(0))
            .copied();
    }
    *now = obs.completed_at_ms;
    Event::Observed(Box::new(obs))
}

/// A refused answer must carry a known code and a JSON Pointer.
fn coded(e: &Error) -> Result<(), String> {
    if !ErrorCode::ALL.contains(&e.code) {
        return Err(format!("an unknown code {:?}", e.code));
    }
    if e.path
        .as_ref()
        .is_some_and(|p| !p.is_empty() && !p.starts_with('/'))
    {
        return Err(format!("a path that is not a JSON Pointer: {:?}", e.path));
    }
    Ok(())
}

/// What a drive reached, so a test can show the checks are not vacuous.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    /// The machine was done: its bundle sealed and verified.
    pub done: bool,
    /// Resumes from a journal prefix.
    pub resumed: u32,
    /// Answers refused with a code.
    pub refused: u32,
    /// The policy was hedged.
    pub hedged: bool,
    /// An attempt was dispatched with a key of a pool.
    pub keyed: bool,
}

/// Drive a machine with `data`; a finding (a property violated) is the error.
pub fn drive(data: &[u8]) -> Result<Reached, String> {
    let mut reached = Reached::default();
    let mut bytes = Bytes(data.iter());
    let first = bytes.byte();
    let all = policies();
    // Both of 0x60: a hedged policy; 0x80 alone of 0xe0: a pooled one;
    // otherwise one of the first six.
    let pick = if first & 0x60 == 0x60 {
        6 + usize::from(first & 1)
    } else if first & 0xe0 == 0x80 {
        8 + usize::from(first & 1)
    } else {
        usize::from(first % 6)
    };
    let Some(cp) = all.get(pick).cloned() else {
        return Err("a policy of the set does not compile".into());
    };
    let journaled = first & 0x10 != 0;
    reached.hedged = cp.policy.hedge.is_some();
    let stream = cp.policy.stream.is_some();
    let mut lease = 1;
    let mut m = match Machine::start(Arc::clone(&cp), options(journaled, lease, 0)) {
        Ok(m) => m,
        Err(e) => return coded(&e).map(|()| reached),
    };
    let mut log: Vec<JournalEvent> = Vec::new();
    let mut store: BTreeMap<String, (Value, u64)> = BTreeMap::new();
    let mut now = 0u64;
    let mut steps = 0u32;
    // A hedged run's attempts in flight, as the host sent them.
    let mut flying: Vec<u64> = Vec::new();
    while let Some(b) = bytes.next() {
        steps = steps.saturating_add(1);
        if steps > 4_096 || m.next().is_done() {
            break;
        }
        // A crash: a new owner resumes from a prefix of the journal.
        if b == 0xFF && journaled {
            let cut = usize::from(bytes.byte())
                .checked_rem(log.len().saturating_add(1))
                .unwrap_or(0);
            log.truncate(cut);
            lease = lease.saturating_add(1);
            match Machine::resume(Arc::clone(&cp), &log, options(true, lease, now)) {
                Ok(r) => m = r,
                Err(e) => return coded(&e).map(|()| reached),
            }
            flying.clear();
            reached.resumed = reached.resumed.saturating_add(1);
            continue;
        }
        let effect = m.next().clone();
        if let Effect::Dispatch { key: Some(_), .. } = &effect {
            reached.keyed = true;
        }
        let event = if b % 8 == 7 {
            any_event(bytes.byte(), &mut bytes, now)
        } else {
            match effect.clone() {
                Effect::Done { .. } => break,
                Effect::Append { .. } => {
                    if b % 32 == 1 {
                        Event::AppendRefused
                    } else {
                        Event::Appended
                    }
                }
                Effect::Read { keys } => {
                    if b % 16 == 3 {
                        Event::StoreUnavailable { now_ms: now }
                    } else {
                        let rows = keys
                            .iter()
                            .map(|k| match store.get(k) {
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
                        Event::Read { now_ms: now, rows }
                    }
                }
                Effect::Write { writes } => {
                    let mut written = 0u64;
                    for w in &writes {
                        let g = store.get(&w.key).map_or(0, |(_, g)| *g);
                        if g != w.expected_generation || b % 16 == 5 {
                            break;
                        }
                        store.insert(w.key.clone(), (to_value(&w.document), g.saturating_add(1)));
                        written = written.saturating_add(1);
                    }
                    Event::Written { written }
                }
                Effect::Sleep { until_ms } => {
                    if b % 16 == 9 {
                        Event::Cancelled { at_ms: now }
                    } else {
                        now = now.max(until_ms);
                        Event::Clock { now_ms: now }
                    }
                }
                Effect::Dispatch {
                    dispatch,
                    hedge_at_ms,
                    ..
                } if m.is_hedged() => {
                    if !flying.contains(&dispatch.ordinal) {
                        flying.push(dispatch.ordinal);
                    }
                    hedged_answer(&mut bytes, &mut now, &flying, hedge_at_ms, true)
                }
                Effect::Dispatch { .. } | Effect::Poll { .. } | Effect::Cancel { .. } => {
                    let mut obs = observed(bytes.byte(), bytes.byte(), now, stream);
                    if cp.policy.async_job.is_some() {
                        job_answer(&mut obs, &effect, bytes.byte());
                    }
                    now = obs.completed_at_ms;
                    Event::Observed(Box::new(obs))
                }
                Effect::Reconcile { .. } => any_event(7, &mut bytes, now),
                Effect::Await { hedge_at_ms, .. } => {
                    hedged_answer(&mut bytes, &mut now, &flying, hedge_at_ms, true)
                }
                Effect::CancelAttempts { ordinals, .. } => {
                    let pick = usize::from(bytes.byte());
                    let ordinal = ordinals
                        .get(pick.checked_rem(ordinals.len()).unwrap_or(0))
                        .copied()
                        .unwrap_or(0);
                    if pick % 4 == 3 {
                        // The loser's result came first: a late observation.
                        let mut obs = observed(bytes.byte(), bytes.byte(), now, stream);
                        obs.ordinal = Some(ordinal);
                        now = obs.completed_at_ms;
                        Event::Observed(Box::new(obs))
                    } else {
                        Event::AttemptCancelled {
                            ordinal,
                            at_ms: now,
                        }
                    }
                }
            }
        };
        let appended = matches!(event, Event::Appended);
        let answered = match &event {
            Event::Observed(o) => o.ordinal,
            Event::AttemptCancelled { ordinal, .. } => Some(*ordinal),
            _ => None,
        };
        match m.answer(event) {
            Ok(_) => {
                if let Some(n) = answered {
                    flying.retain(|f| *f != n);
                }
                now = now.max(m.now_ms());
                // The events of an append answered `appended` are durable.
                if let (true, Effect::Append { events }) = (appended, effect) {
                    log.extend(events);
                }
            }
            Err(e) => {
                coded(&e)?;
                reached.refused = reached.refused.saturating_add(1);
                if e.code == ErrorCode::JournalStaleLease {
                    return Ok(reached);
                }
            }
        }
    }
    if m.next().is_done() {
        let bundle = m
            .seal()
            .map_err(|e| format!("a done machine does not seal: {e:?}"))?;
        match verify_bundle(&bundle) {
            Ok(crate::receipt::Verdict::Verified { .. }) => {}
            other => return Err(format!("a sealed bundle does not verify: {other:?}")),
        }
        reached.done = true;
    }
    if journaled {
        journal::verify(&cp, &log)
            .map_err(|e| format!("the journal written does not verify: {e:?}"))?;
    }
    Ok(reached)
}
