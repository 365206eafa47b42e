//! The scripted session drivers: streamed, priced, async-job, fleet and
//! admission sessions run from a script, as the vectors pin them.

use serde_json::{json, Value};

use std::sync::Arc;

use crate::canonical::digest_of;
use crate::decode::from_value;
use crate::error::Result;
use crate::evaluate::Decision;
use crate::ids::Sha256Hex;
use crate::receipt::{verify_bundle, Bundle};
use crate::session::Session;

/// Run a scripted streamed session, as the `stream_session` vectors pin it.
///
/// Each step of `script` is either `{"cancel": true}` (the caller cancels
/// between attempts, at the last completion) or an observed attempt:
/// `{"duration_ms", "facts", "deltas"?, "cost"?, "lag_ms"?}`, started at the
/// planned `not_before_ms` plus `lag_ms` and completed `duration_ms` later.
/// The answer: each step's judgement and the decision after it, the event
/// log, the receipt, the sealed bundle's digest and its replay's verdict.
/// The first error (drift, malformed facts) is the answer instead.
pub fn stream_session(policy_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive_stream(policy_json, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "stream_events": bundle.stream_events.as_ref().map(to_value).unwrap_or(Value::Null),
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted streamed session ([`stream_session`]).
pub fn stream_bundle(policy_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive_stream(policy_json, script_json)?.0)
}

/// Run a scripted session that prices usage with a price schedule and
/// reports request bodies, as the `usage` vectors pin it: the steps of
/// [`stream_session`], each attempt step optionally with `usage` (a list of
/// usage reports, added in order) and `request_body_sha256`. The answer is
/// [`stream_session`]'s, with the bundle's price schedule digest.
pub fn priced_session(policy_json: &str, schedule_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive(policy_json, Some(schedule_json), script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "attempts": to_value(&bundle.attempts),
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "verdict": to_value(&verdict),
    }))
}

/// Run a scripted async-job session, as the `job_session` vectors pin it:
/// the steps of [`stream_session`], each attempt step optionally with `job`
/// (`{"id"?, "status"?}`: the provider's job id the attempt was answered
/// with or asked about, and the status its answer reported). The answer is
/// [`priced_session`]'s without a price schedule.
pub fn job_session(policy_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, judgements, decisions) = drive(policy_json, None, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "attempts": to_value(&bundle.attempts),
        "bundle_sha256": digest_of(&bundle),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": to_value(&bundle.receipt),
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted async-job session ([`job_session`]).
pub fn job_bundle(policy_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive(policy_json, None, script_json)?.0)
}

/// The sealed bundle of a scripted priced session ([`priced_session`]).
pub fn priced_bundle(policy_json: &str, schedule_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(drive(policy_json, Some(schedule_json), script_json)?.0)
}

fn drive_stream(policy_json: &str, script_json: &str) -> Result<(Bundle, Vec<Value>, Vec<Value>)> {
    drive(policy_json, None, script_json)
}

fn drive(
    policy_json: &str,
    schedule_json: Option<&str>,
    script_json: &str,
) -> Result<(Bundle, Vec<Value>, Vec<Value>)> {
    use crate::canonical::to_value;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    if let Some(schedule) = schedule_json {
        session.set_price_schedule(Arc::new(crate::decode::from_str(schedule)?))?;
    }
    let (mut judgements, mut decisions) = (Vec::new(), Vec::new());
    let mut now = 0u64;
    for step in script.as_array().into_iter().flatten() {
        if step.get("cancel").is_some() {
            session.cancel(now)?;
            decisions.push(to_value(session.next()));
            continue;
        }
        let not_before = match session.next() {
            Decision::Dispatch(d) => d.not_before_ms,
            Decision::Terminal { .. } => now,
        };
        let num = |k: &str| step.get(k).and_then(Value::as_u64).unwrap_or(0);
        let started = not_before.max(now).saturating_add(num("lag_ms"));
        now = started.saturating_add(num("duration_ms"));
        let facts: Facts = from_value(step.get("facts").cloned().unwrap_or(Value::Null))?;
        let deltas: Vec<&str> = step
            .get("deltas")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let cost = step.get("cost").and_then(Value::as_u64);
        for usage in step
            .get("usage")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // As the bindings take it: a document of its own.
            session.add_usage(&crate::decode::from_str(&usage.to_string())?)?;
        }
        if let Some(body) = step.get("request_body_sha256") {
            let digest = Sha256Hex::parse(body.as_str().unwrap_or_default()).map_err(|m| {
                crate::error::Error::at(
                    crate::error::ErrorCode::InvalidDigest,
                    "/request_body_sha256",
                    m,
                )
            })?;
            session.set_request_body_sha256(digest);
        }
        if let Some(job) = step.get("job") {
            let status = match job.get("status") {
                // As the bindings take it: a name.
                Some(v) => Some(crate::job::JobStatus::parse(
                    v.as_str().unwrap_or_default(),
                )?),
                None => None,
            };
            session.set_job(job.get("id").and_then(Value::as_str), status);
        }
        if let Some(answer) = step.get("reconciled") {
            session.set_reconciled(crate::job::reconciled_named(
                answer.as_str().unwrap_or_default(),
            )?);
        }
        let j = session.observe_stream(started, now, cost, &facts, &deltas)?;
        judgements.push(to_value(&j));
        decisions.push(to_value(session.next()));
    }
    Ok((session.seal()?, judgements, decisions))
}

/// Run a scripted session under a fleet section against an in-memory store,
/// as the `fleet_session` vectors pin it.
///
/// `store` seeds the store: `{"breakers": [snapshots], "budget": snapshot?}`.
/// Each step of `script` is one of:
/// - `{"admit": now_epoch_ms}`: read the view from the store (or
///   `{"admit": now, "store_down": true}` for an unreachable store), admit at
///   the planned `not_before_ms` (or the run clock, if later), write back (a
///   wait answer, kept with its `wait_until_epoch_ms`, writes nothing);
/// - `{"observe": {"duration_ms", "facts"}}`: observe the admitted attempt,
///   then record its outcome on its route's breaker in the store at
///   `admitted_at_epoch_ms + duration_ms`;
/// - `{"set": snapshot}`: another process writes a snapshot.
///
/// The answer: each step's result, the final store, the receipt, the sealed
/// bundle's digest and its verdict; or the first error.
pub fn fleet_session(policy_json: &str, store_json: &str, script_json: &str) -> Result<Value> {
    use crate::canonical::to_value;
    let (bundle, steps, store) = fleet_drive(policy_json, store_json, script_json)?;
    let verdict = verify_bundle(&bundle)?;
    Ok(json!({
        "bundle_sha256": digest_of(&bundle),
        "receipt": to_value(&bundle.receipt),
        "steps": steps,
        "store": store,
        "verdict": to_value(&verdict),
    }))
}

/// The sealed bundle of a scripted fleet session ([`fleet_session`]).
pub fn fleet_bundle(policy_json: &str, store_json: &str, script_json: &str) -> Result<Bundle> {
    Ok(fleet_drive(policy_json, store_json, script_json)?.0)
}

fn fleet_drive(
    policy_json: &str,
    store_json: &str,
    script_json: &str,
) -> Result<(Bundle, Vec<Value>, Value)> {
    use crate::breaker::BreakerSnapshot;
    use crate::budget::RetryBudgetSnapshot;
    use crate::canonical::to_value;
    use crate::fleet::FleetView;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let store: Value = crate::decode::parse_strict(store_json)?;
    // The store: breaker snapshots under their keys (a seeded key may hold
    // another release's snapshot, as a broken store would return it).
    let mut breakers: Vec<(Sha256Hex, BreakerSnapshot)> = Vec::new();
    for (key, b) in store
        .get("breakers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let key = Sha256Hex::parse(key).map_err(|m| {
            crate::error::Error::at(crate::error::ErrorCode::InvalidDigest, "/breakers", m)
        })?;
        breakers.push((key, from_value(b.clone())?));
    }
    let mut budget: Option<RetryBudgetSnapshot> = store
        .get("budget")
        .map(|b| from_value(b.clone()))
        .transpose()?;
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    let mut steps = Vec::new();
    let (mut now, mut epoch) = (0u64, 0u64);
    let put = |breakers: &mut Vec<(Sha256Hex, BreakerSnapshot)>, s: BreakerSnapshot| {
        breakers.retain(|(k, _)| k != &s.route_release_sha256);
        breakers.push((s.route_release_sha256.clone(), s));
    };
    for step in script.as_array().into_iter().flatten() {
        if let Some(at) = step.get("admit").and_then(Value::as_u64) {
            epoch = at;
            let at_ms = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            now = at_ms;
            let view = FleetView {
                admission: Vec::new(),
                breakers: breakers.clone(),
                budget: budget.clone(),
                reserve_tokens: None,
                store_unavailable: step.get("store_down").is_some(),
                tenant: None,
            };
            let admitted = session.admit(at_ms, at, &view)?;
            for b in &admitted.writes.breakers {
                put(&mut breakers, b.clone());
            }
            if let Some(b) = &admitted.writes.budget {
                budget = Some(b.clone());
            }
            let mut answer = json!({
                "decision": to_value(&admitted.decision),
                "writes": to_value(&admitted.writes),
            });
            if let (Some(until), Some(o)) = (admitted.wait_until_epoch_ms, answer.as_object_mut()) {
                o.insert("wait_until_epoch_ms".into(), json!(until));
            }
            steps.push(answer);
        } else if let Some(o) = step.get("observe") {
            let started = now;
            let duration = o.get("duration_ms").and_then(Value::as_u64).unwrap_or(0);
            now = started.saturating_add(duration);
            let facts: Facts = from_value(o.get("facts").cloned().unwrap_or(Value::Null))?;
            let j = session.observe(started, now, None, &facts)?;
            let mut recorded = Value::Null;
            let release = session
                .attempts()
                .attempts
                .last()
                .map(|a| a.route_release_sha256.clone());
            if let (Some(release), Some(_)) = (
                release,
                session
                    .policy()
                    .policy
                    .fleet
                    .as_ref()
                    .and_then(|f| f.breaker.as_ref()),
            ) {
                let at = epoch.saturating_add(duration);
                let current = breakers
                    .iter()
                    .find(|(k, _)| k == &release)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_else(|| BreakerSnapshot::fresh(release.clone(), at));
                let next = session.breaker_after(&current, at)?;
                recorded = to_value(&next);
                put(&mut breakers, next);
            }
            steps.push(json!({
                "breaker": recorded,
                "judgement": to_value(&j),
                "next": to_value(session.next()),
            }));
        } else if let Some(s) = step.get("set") {
            if s.get("schema").and_then(Value::as_str)
                == Some(crate::budget::RetryBudgetSchema::NAME)
            {
                budget = Some(from_value(s.clone())?);
            } else {
                put(&mut breakers, from_value(s.clone())?);
            }
            steps.push(json!({"set": true}));
        }
    }
    breakers.sort_by(|a, b| a.0.cmp(&b.0));
    let store = json!({
        "breakers": breakers
            .iter()
            .map(|(k, b)| (k.as_str().to_owned(), to_value(b)))
            .collect::<serde_json::Map<String, Value>>(),
        "budget": budget.as_ref().map(to_value),
    });
    Ok((session.seal()?, steps, store))
}

/// Run a scripted session under a fleet section with admission limits
/// against an in-memory store of admission snapshots (keyed by their
/// [`crate::admission::AdmissionSnapshot::key`]), as the `admission` vectors
/// build their bundles.
///
/// `store` seeds it: a list of admission snapshots. Each step of `script`:
/// - `{"admit": now_epoch_ms, "reserve_tokens"?: n}`: admit at the planned
///   `not_before_ms` (or the run clock, if later) and write back; a wait
///   answer writes nothing;
/// - `{"observe": {"duration_ms", "facts", "used_tokens"?, "headers"?}}`:
///   observe the admitted attempt, started at its `not_before_ms`, then
///   release it (applying the response's rate-limit `headers`, `[name,
///   value]` pairs);
/// - `{"set": snapshot}`: another process writes a snapshot.
///
/// The answer: each step's result, the final store, the sealed bundle.
pub fn admission_session(
    policy_json: &str,
    store_json: &str,
    script_json: &str,
) -> Result<(Vec<Value>, Value, Bundle)> {
    use crate::admission::AdmissionSnapshot;
    use crate::canonical::to_value;
    use crate::fleet::FleetView;
    use crate::observe::Facts;
    let policy = Arc::new(crate::api::compile_policy(policy_json)?);
    let mut store: Vec<(String, AdmissionSnapshot)> = Vec::new();
    let seeded: Value = crate::decode::parse_strict(store_json)?;
    for s in seeded.as_array().into_iter().flatten() {
        let s: AdmissionSnapshot = from_value(s.clone())?;
        store.push((s.key(), s));
    }
    let put = |store: &mut Vec<(String, AdmissionSnapshot)>, s: AdmissionSnapshot| {
        let key = s.key();
        store.retain(|(k, _)| k != &key);
        store.push((key, s));
    };
    let script: Value = crate::decode::parse_strict(script_json)?;
    let mut session = Session::start(policy);
    let mut steps = Vec::new();
    let (mut now, mut epoch) = (0u64, 0u64);
    for step in script.as_array().into_iter().flatten() {
        if let Some(at) = step.get("admit").and_then(Value::as_u64) {
            let at_ms = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            now = at_ms;
            epoch = at;
            let view = FleetView {
                admission: store
                    .iter()
                    .map(|(_, s)| (s.route_release_sha256.clone(), s.clone()))
                    .collect(),
                breakers: Vec::new(),
                budget: None,
                reserve_tokens: step.get("reserve_tokens").and_then(Value::as_u64),
                store_unavailable: false,
                tenant: match step.get("tenant").and_then(Value::as_str) {
                    Some(t) => Some(
                        crate::ids::Identifier::parse(t)
                            .map_err(|(code, m)| crate::error::Error::at(code, "/tenant", m))?,
                    ),
                    None => None,
                },
            };
            let admitted = session.admit(now, at, &view)?;
            for s in &admitted.writes.admission {
                put(&mut store, s.clone());
            }
            steps.push(to_value(&admitted));
        } else if let Some(o) = step.get("observe") {
            let started = match session.next() {
                Decision::Dispatch(d) => d.not_before_ms.max(now),
                Decision::Terminal { .. } => now,
            };
            let duration = o.get("duration_ms").and_then(Value::as_u64).unwrap_or(0);
            now = started.saturating_add(duration);
            let facts: Facts = from_value(o.get("facts").cloned().unwrap_or(Value::Null))?;
            let j = session.observe(started, now, None, &facts)?;
            let at = epoch.saturating_add(now.saturating_sub(started));
            let release = session
                .attempts()
                .attempts
                .last()
                .map(|a| a.route_release_sha256.clone());
            let admitted = session
                .attempts()
                .attempts
                .last()
                .and_then(|a| a.admission.as_ref())
                .is_some_and(|a| a.limits.is_some());
            let current = store
                .iter()
                .find(|(_, s)| Some(&s.route_release_sha256) == release.as_ref())
                .map(|(_, s)| s.clone());
            let mut released = Value::Null;
            if let (true, Some(current)) = (admitted, current) {
                let used = o.get("used_tokens").and_then(Value::as_u64);
                let headers: crate::admission::SeenHeaders = match o.get("headers") {
                    Some(h) => from_value(h.clone())?,
                    None => crate::admission::SeenHeaders::default(),
                };
                let next = session.admission_release_seen(&current, at, used, &headers.0)?;
                released = to_value(&next);
                put(&mut store, next);
            }
            steps.push(json!({
                "judgement": to_value(&j),
                "next": to_value(session.next()),
                "released": released,
            }));
        } else if let Some(s) = step.get("set") {
            put(&mut store, from_value(s.clone())?);
            steps.push(json!({"set": true}));
        }
    }
    store.sort_by(|a, b| a.0.cmp(&b.0));
    let out = Value::Array(store.iter().map(|(_, s)| to_value(s)).collect());
    Ok((steps, out, session.seal()?))
}
