//! The JSON boundary: every public operation taking and returning JSON text.
//!
//! Bindings (WebAssembly, Python) call these and nothing else, so each stays a
//! thin layer of glue and every language decodes with the same strict rules
//! and reports the same codes. Outputs are compact JSON in canonical order.

use serde_json::Value;

use crate::attempt::{Attempts, AttemptsSchema};
use crate::canonical::{canonical_json, digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{from_str, from_value, parse_strict};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate as run;
use crate::http::{self, HttpObservation, RetryAfterHeader};
use crate::policy::{compile, CompiledPolicy, Policy, PolicySchema};
use crate::receipt::{verify_bundle, Bundle, BundleSchema, Receipt, ReceiptSchema};

/// A document's or answer's canonical JSON (RFC 8785).
fn out<T: Encode>(value: &T) -> String {
    canonical_json(value)
}

/// `next_repair`: the policy of the next repair of a chain
/// ([`crate::repair::next_repair`]): `links_json` is a JSON array of
/// `retryledger.repair_chain.v1` links (the root run first).
pub fn next_repair(
    links_json: &str,
    request_sha256: &str,
    idempotency_key_sha256: &str,
    started_at_ms: u64,
) -> Result<String> {
    let chain = from_str::<crate::repair::RepairChain>(&format!(
        "{{\"links\":{links_json},\"schema\":\"retryledger.repair_chain.v1\"}}"
    ))?;
    let digest = |name: &str, v: &str| {
        crate::ids::Sha256Hex::parse(v)
            .map_err(|m| Error::at(ErrorCode::InvalidDigest, format!("/{name}"), m))
    };
    let policy = crate::repair::next_repair(
        &chain.links,
        &digest("request_sha256", request_sha256)?,
        &digest("idempotency_key_sha256", idempotency_key_sha256)?,
        started_at_ms,
    )?;
    Ok(out(&policy))
}

/// `verify_repair_chain`: replay a `retryledger.repair_chain.v1`
/// ([`crate::repair::verify_chain`]).
pub fn verify_repair_chain(chain_json: &str) -> Result<String> {
    let chain = crate::decode::from_str_within::<crate::repair::RepairChain>(
        chain_json,
        crate::limits::MAX_BUNDLE_BYTES,
    )?;
    Ok(out(&crate::repair::verify_chain(&chain)?))
}

/// Decode and validate a policy.
pub fn compile_policy(policy_json: &str) -> Result<CompiledPolicy> {
    compile(from_str::<Policy>(policy_json).map_err(|e| not_a_policy(policy_json, e))?)
}

/// A document of another schema given where a policy belongs is told what
/// it is and what to do with it, rather than its first unknown field.
fn not_a_policy(text: &str, e: Error) -> Error {
    if !matches!(
        e.code,
        ErrorCode::UnknownField | ErrorCode::MissingField | ErrorCode::SchemaMismatch
    ) {
        return e;
    }
    let Ok(Value::Object(map)) = crate::decode::parse_strict(text) else {
        return e;
    };
    match map.get("schema").and_then(Value::as_str) {
        Some("retryledger.policy_spec.v1") => Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            "this is a policy spec (retryledger.policy_spec.v1), not a policy: build it with \
             build_policy (buildPolicy), or compile it once with compile_policy_template \
             (compilePolicyTemplate)",
        ),
        Some("retryledger.bundle.v1") => Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            "this is a bundle (retryledger.bundle.v1), not a policy: its policy is its `policy` field; \
             replay it with verify_bundle",
        ),
        _ => e,
    }
}

/// Decode an attempts document.
pub fn decode_attempts(attempts_json: &str) -> Result<Attempts> {
    from_str(attempts_json)
}

/// `validate_policy`: the policy digest, or the first rule it breaks.
pub fn validate_policy(policy_json: &str) -> Result<String> {
    Ok(compile_policy(policy_json)?.policy_sha256)
}

/// `plan_next` against a compiled policy: a `dispatch` or `terminal` decision as JSON.
pub fn plan_next_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    Ok(out(&run::plan_next(
        policy,
        &decode_attempts(attempts_json)?,
    )?))
}

/// `plan_next`: a `dispatch` or `terminal` decision as JSON.
pub fn plan_next(policy_json: &str, attempts_json: &str) -> Result<String> {
    plan_next_compiled(&compile_policy(policy_json)?, attempts_json)
}

/// `evaluate` against a compiled policy: the receipt as JSON.
pub fn evaluate_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    Ok(out(&run::evaluate(
        policy,
        &decode_attempts(attempts_json)?,
    )?))
}

/// `evaluate`: the receipt as JSON.
pub fn evaluate(policy_json: &str, attempts_json: &str) -> Result<String> {
    evaluate_compiled(&compile_policy(policy_json)?, attempts_json)
}

/// Seal a finished run against a compiled policy: the bundle as JSON.
pub fn seal_compiled(policy: &CompiledPolicy, attempts_json: &str) -> Result<String> {
    let attempts = decode_attempts(attempts_json)?;
    let receipt = run::evaluate(policy, &attempts)?;
    Ok(out(&Bundle::new(policy.policy.clone(), attempts, receipt)))
}

/// `verify_bundle`: a `verified` or `drift` verdict as JSON.
pub fn verify(bundle_json: &str) -> Result<String> {
    let bundle =
        crate::decode::from_str_within::<Bundle>(bundle_json, crate::limits::MAX_BUNDLE_BYTES)?;
    Ok(out(&verify_bundle(&bundle)?))
}

/// `digest`: the SHA-256 of a document's canonical JSON, after strict decoding
/// into the type its `schema` names, so only documents in normal form hash.
pub fn digest(document_json: &str) -> Result<String> {
    // A bundle may carry a long stream event log: it alone may exceed the
    // common input limit, up to its own.
    if document_json.len() > crate::limits::MAX_INPUT_BYTES {
        let bundle = crate::decode::from_str_within::<Bundle>(
            document_json,
            crate::limits::MAX_BUNDLE_BYTES,
        )
        .map_err(|e| match e.code {
            ErrorCode::InputTooLarge => e,
            _ => Error::new(
                ErrorCode::InputTooLarge,
                format!(
                    "input is {} bytes; only a bundle may exceed {}",
                    document_json.len(),
                    crate::limits::MAX_INPUT_BYTES
                ),
            ),
        })?;
        return Ok(digest_of(&bundle));
    }
    let value = match parse_strict(document_json) {
        Ok(v) => v,
        // Only a logical request may hold floats and nulls (full RFC 8785);
        // anything else keeps the strict reader's error.
        Err(strict) => {
            return match crate::parse::parse_any_sized(document_json) {
                Ok(v) if schema_of(&v) == Some(crate::request::REQUEST_SCHEMA) => {
                    Ok(crate::request::check_request(v)?.sha256())
                }
                _ => Err(strict),
            }
        }
    };
    let schema = match &value {
        Value::Object(map) => map.get("schema").and_then(Value::as_str).map(str::to_owned),
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidType,
                "a document is a JSON object",
            ))
        }
    };
    let Some(schema) = schema else {
        return Err(Error::at(
            ErrorCode::MissingField,
            "/schema",
            "a document names its `schema`",
        ));
    };
    match schema.as_str() {
        crate::request::REQUEST_SCHEMA => Ok(crate::request::check_request(value)?.sha256()),
        PolicySchema::NAME => Ok(digest_of(&from_value::<Policy>(value)?)),
        AttemptsSchema::NAME => Ok(digest_of(&from_value::<Attempts>(value)?)),
        ReceiptSchema::NAME => Ok(digest_of(&from_value::<Receipt>(value)?)),
        BundleSchema::NAME => Ok(digest_of(&from_value::<Bundle>(value)?)),
        crate::price::PriceScheduleSchema::NAME => Ok(digest_of(&from_value::<
            crate::price::PriceSchedule,
        >(value)?)),
        crate::builder::RouteReleaseSchema::NAME => Ok(digest_of(&from_value::<
            crate::builder::RouteRelease,
        >(value)?)),
        crate::builder::BehaviorClassSchema::NAME => Ok(digest_of(&from_value::<
            crate::builder::BehaviorClass,
        >(value)?)),
        crate::stream::StreamEventSchema::NAME => {
            Ok(digest_of(&from_value::<crate::stream::StreamEvent>(value)?))
        }
        crate::breaker::BreakerSchema::NAME => Ok(digest_of(&from_value::<
            crate::breaker::BreakerSnapshot,
        >(value)?)),
        crate::budget::RetryBudgetSchema::NAME => Ok(digest_of(&from_value::<
            crate::budget::RetryBudgetSnapshot,
        >(value)?)),
        crate::admission::AdmissionSchema::NAME => Ok(digest_of(&from_value::<
            crate::admission::AdmissionSnapshot,
        >(value)?)),
        crate::journal::JournalEventSchema::NAME => Ok(digest_of(&from_value::<
            crate::journal::JournalEvent,
        >(value)?)),
        crate::idempotency::IdempotencyRecordSchema::NAME => Ok(digest_of(&from_value::<
            crate::idempotency::IdempotencyRecord,
        >(value)?)),
        other => Err(Error::at(
            ErrorCode::SchemaMismatch,
            "/schema",
            format!(
                "`{}` is not a retryledger document schema",
                other.chars().take(80).collect::<String>()
            ),
        )),
    }
}

/// `build_policy`: a logical request and a policy spec (catalog documents in
/// place of digests, routes in priority order) in, the validated policy's
/// canonical JSON out; every digest computed here.
pub fn build_policy(request_json: &str, spec_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    Ok(out(&crate::builder::build_policy(&request, spec)?.policy))
}

/// `compile_policy_template`: a policy spec without `idempotency_key_sha256`
/// compiled once ([`crate::template::PolicyTemplate`]).
pub fn compile_policy_template(spec_json: &str) -> Result<crate::template::PolicyTemplate> {
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    crate::template::PolicyTemplate::compile(spec)
}

/// `bind_policy_template`: the policy of one call (a logical request and the
/// idempotency key's digest), exactly what `build_policy` returns for the
/// spec with that key.
pub fn bind_policy_template(
    template: &crate::template::PolicyTemplate,
    request_json: &str,
    idempotency_key_sha256: &str,
) -> Result<crate::template::BoundPolicy> {
    let request = crate::request::parse_request(request_json)?;
    Ok(template.bind_json(&request, &key_digest(idempotency_key_sha256)?))
}

/// `bind_policy_template` as a compiled policy (for a session) and its
/// canonical JSON.
pub fn bind_policy_template_compiled(
    template: &crate::template::PolicyTemplate,
    request_json: &str,
    idempotency_key_sha256: &str,
) -> Result<(CompiledPolicy, String)> {
    let request = crate::request::parse_request(request_json)?;
    Ok(template.bind_both(&request, &key_digest(idempotency_key_sha256)?))
}

fn key_digest(hex: &str) -> Result<crate::ids::Sha256Hex> {
    crate::ids::Sha256Hex::parse(hex)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/idempotency_key_sha256", m))
}

/// `check_price_schedule`: a price schedule checked against a policy before
/// any dispatch (the same cost unit, every route release priced once); its
/// digest, which a receipt binds.
pub fn check_price_schedule(policy_json: &str, schedule_json: &str) -> Result<String> {
    let policy = compile_policy(policy_json)?;
    let schedule = from_str::<crate::price::PriceSchedule>(schedule_json)?;
    crate::price::check_schedule(&policy.policy, &schedule)?;
    Ok(digest_of(&schedule))
}

/// `price_cost`: what `usage` (units by kind) costs on a route release under
/// a price schedule: the sum of `ceil(units * price / 10^6)`.
pub fn price_cost(
    schedule_json: &str,
    route_release_sha256: &str,
    usage_json: &str,
) -> Result<u64> {
    let schedule = from_str::<crate::price::PriceSchedule>(schedule_json)?;
    let release = crate::ids::Sha256Hex::parse(route_release_sha256)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/route_release_sha256", m))?;
    let usage = from_str::<crate::price::Units>(usage_json)?;
    crate::price::cost(&schedule, &release, &usage)
}

/// `lift_request`: a provider SDK call's parameters (`call` names it, e.g.
/// `openai.chat.completions`) split into the logical request, returned as
/// canonical JSON; the model and transport options stay out of it.
pub fn lift_request(call: &str, params_json: &str) -> Result<String> {
    Ok(crate::lift::lift(call, params_json)?.canonical)
}

/// `request_sha256`: the logical request's digest (`logical_request_sha256`)
/// over its full RFC 8785 canonical form.
pub fn request_sha256(request_json: &str) -> Result<String> {
    Ok(crate::request::parse_request(request_json)?.sha256())
}

/// `canonical_request`: the logical request's RFC 8785 canonical JSON.
pub fn canonical_request(request_json: &str) -> Result<String> {
    Ok(crate::request::parse_request(request_json)?.canonical)
}

/// `idempotency_key_sha256`: a bare key's `sha256(key)`, or a scoped key's
/// digest when both `tenant` and `operation` are given.
pub fn idempotency_key_sha256(
    key: &str,
    tenant: Option<&str>,
    operation: Option<&str>,
) -> Result<String> {
    crate::request::idempotency_key_sha256(key, tenant, operation)
}

fn schema_of(v: &Value) -> Option<&str> {
    v.as_object()?.get("schema")?.as_str()
}

/// `parse_retry_after` with the header named as `retry-after` or `retry-after-ms`.
pub fn parse_retry_after(header: &str, value: &str, now_unix_ms: u64, cap_ms: u64) -> Result<u64> {
    let header = match header.to_ascii_lowercase().as_str() {
        "retry-after" => RetryAfterHeader::RetryAfter,
        "retry-after-ms" => RetryAfterHeader::RetryAfterMs,
        _ => {
            return Err(Error::new(
                ErrorCode::InvalidValue,
                "header must be `retry-after` or `retry-after-ms`",
            ))
        }
    };
    http::parse_retry_after(header, value, now_unix_ms, cap_ms)
}

/// `classify_http`: an observation document in, an outcome as JSON out.
pub fn classify_http(observation_json: &str) -> Result<String> {
    Ok(out(&http::classify_http(&from_str::<HttpObservation>(
        observation_json,
    )?)?))
}

/// `judge`: a host's facts about one attempt in, the judgement (`outcome`
/// and the deciding `rule`) as JSON out.
pub fn judge(facts_json: &str) -> Result<String> {
    Ok(out(&crate::observe::judge(&from_str::<
        crate::observe::Facts,
    >(facts_json)?)?))
}

/// `{"admission": …, "snapshot": …}`: a breaker answer and its next snapshot.
struct BreakerStep(
    crate::breaker::BreakerAdmission,
    crate::breaker::BreakerSnapshot,
);

impl Encode for BreakerStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("admission", &self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

/// `{"granted": …, "snapshot": …}`: a withdrawal's answer and the next snapshot.
struct BudgetStep(bool, crate::budget::RetryBudgetSnapshot);

impl Encode for BudgetStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .bool("granted", self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

fn breaker_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::breaker::BreakerConfig,
    crate::breaker::BreakerSnapshot,
)> {
    let cfg =
        from_str::<crate::breaker::BreakerConfig>(config_json).map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::breaker::BreakerSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, &snap.route_release_sha256, "/snapshot")?;
    Ok((cfg, snap))
}

fn budget_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::budget::RetryBudgetConfig,
    crate::budget::RetryBudgetSnapshot,
)> {
    let cfg = from_str::<crate::budget::RetryBudgetConfig>(config_json)
        .map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::budget::RetryBudgetSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, "/snapshot")?;
    Ok((cfg, snap))
}

/// `breaker_admit`: a breaker configuration and snapshot and the wall clock
/// in; `{"admission", "snapshot"}` out (the answer and the next snapshot).
pub fn breaker_admit(config_json: &str, snapshot_json: &str, now_epoch_ms: u64) -> Result<String> {
    let (cfg, snap) = breaker_inputs(config_json, snapshot_json)?;
    let (a, next) = crate::breaker::admit(&cfg, &snap, now_epoch_ms);
    Ok(out(&BreakerStep(a, next)))
}

/// `breaker_record`: an admitted attempt's outcome (and whether it was a
/// probe) recorded on the snapshot; the next snapshot out.
pub fn breaker_record(
    config_json: &str,
    snapshot_json: &str,
    probe: bool,
    outcome_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = breaker_inputs(config_json, snapshot_json)?;
    let outcome =
        from_str::<crate::outcome::Outcome>(outcome_json).map_err(|e| e.under("/outcome"))?;
    let health = crate::breaker::Health::of(&outcome);
    Ok(out(&crate::breaker::record(
        &cfg,
        &snap,
        probe,
        health,
        now_epoch_ms,
    )))
}

/// `budget_deposit`: a first attempt's deposit; the next snapshot out.
pub fn budget_deposit(config_json: &str, snapshot_json: &str, now_epoch_ms: u64) -> Result<String> {
    let (cfg, snap) = budget_inputs(config_json, snapshot_json)?;
    Ok(out(&crate::budget::deposit(&cfg, &snap, now_epoch_ms)))
}

/// `budget_withdraw`: a retry's withdrawal; `{"granted", "snapshot"}` out.
pub fn budget_withdraw(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = budget_inputs(config_json, snapshot_json)?;
    let (granted, next) = crate::budget::withdraw(&cfg, &snap, now_epoch_ms);
    Ok(out(&BudgetStep(granted, next)))
}

/// `{"answer": {"kind", …}, "snapshot": …}`: an admission's answer and the next snapshot.
struct AdmissionStep(
    crate::admission::LimitAnswer,
    crate::admission::AdmissionSnapshot,
);

struct LimitAnswerDoc(crate::admission::LimitAnswer);

impl Encode for LimitAnswerDoc {
    fn encode(&self, sink: &mut dyn Sink) {
        use crate::admission::LimitAnswer as A;
        let mut w = ObjectWriter::new(sink);
        match self.0 {
            A::Admitted { start_epoch_ms } => w
                .str("kind", "admitted")
                .u64("start_epoch_ms", start_epoch_ms),
            A::Refused { earliest_epoch_ms } => w
                .opt_u64("earliest_epoch_ms", earliest_epoch_ms)
                .str("kind", "refused"),
            A::Wait { until_epoch_ms } => {
                w.str("kind", "wait").u64("until_epoch_ms", until_epoch_ms)
            }
        }
        .end();
    }
}

impl Encode for AdmissionStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("answer", &LimitAnswerDoc(self.0))
            .doc("snapshot", &self.1)
            .end();
    }
}

fn admission_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::admission::AdmissionConfig,
    crate::admission::AdmissionSnapshot,
)> {
    let cfg = from_str::<crate::admission::AdmissionConfig>(config_json)
        .map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::admission::AdmissionSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, &snap.route_release_sha256, "/snapshot")?;
    Ok((cfg, snap))
}

/// `admission_admit`: admission limits and a snapshot, the wall clock, when
/// the attempt first asked and the tokens it reserves in; `{"answer",
/// "snapshot"}` out (`admitted` with its start, `wait` until when, or
/// `refused` with the earliest start if any; the next snapshot).
pub fn admission_admit(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
    queued_since_epoch_ms: u64,
    tokens: u64,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    let (a, next) =
        crate::admission::admit(&cfg, &snap, now_epoch_ms, queued_since_epoch_ms, tokens);
    Ok(out(&AdmissionStep(a, next)))
}

/// `admission_release`: an admitted attempt is over; its slot freed and its
/// `reserved` tokens settled with the `used` ones (none: not reported); the
/// next snapshot out.
pub fn admission_release(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
    reserved: u64,
    used: Option<u64>,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    Ok(out(&crate::admission::release(
        &cfg,
        &snap,
        now_epoch_ms,
        reserved,
        used,
    )))
}

/// `{"notes": [...], "snapshot": ...}`: what a response's rate-limit headers
/// did to an admission snapshot, and what was ignored.
struct ObservedStep(
    crate::admission::AdmissionSnapshot,
    Vec<crate::provider::Note>,
);

impl Encode for ObservedStep {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut w = ObjectWriter::new(sink);
        if !self.1.is_empty() {
            w.list("notes", &self.1);
        }
        w.doc("snapshot", &self.0).end();
    }
}

/// `admission_observe`: admission limits, a snapshot, a response's headers
/// (a JSON array of `[name, value]` pairs) and the wall clock in;
/// `{"notes"?, "snapshot"}` out: the snapshot the rate-limit headers leave
/// (unchanged when none applies) and the headers ignored.
pub fn admission_observe(
    config_json: &str,
    snapshot_json: &str,
    headers_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    let headers =
        from_str::<crate::admission::SeenHeaders>(headers_json).map_err(|e| e.under("/headers"))?;
    let (next, notes) = crate::admission::observe(&cfg, &snap, &headers.0, now_epoch_ms);
    Ok(out(&ObservedStep(next, notes)))
}

/// A journal (a JSON array of `retryledger.journal_event.v1` documents),
/// its errors under `/events`.
fn journal_events(events_json: &str) -> Result<crate::journal::Journal> {
    from_str::<crate::journal::Journal>(events_json).map_err(|e| e.under("/events"))
}

/// `Session.resume_journal`: continue `session` (fresh) from a journal's
/// JSON text, verified against the session's policy.
pub fn session_resume_journal(session: &mut crate::Session, events_json: &str) -> Result<()> {
    let events = journal_events(events_json)?;
    session.resume_journal(&events.0)
}

/// `journal_verify`: a policy and a journal in; what the replay found
/// (`attempts`, `head_sha256`, `last_kind`, `lease_generation`, `next_seq`,
/// `run_id`, `terminal`) out, or the first event the core refuses.
pub fn journal_verify(policy_json: &str, events_json: &str) -> Result<String> {
    journal_verify_compiled(&policy_of(policy_json)?, events_json)
}

/// [`journal_verify`] against a compiled policy (a host that keeps one
/// does not have the policy decoded and validated again for every call).
pub fn journal_verify_compiled(cp: &CompiledPolicy, events_json: &str) -> Result<String> {
    let events = journal_events(events_json)?;
    Ok(out(&crate::journal::verify(cp, &events.0)?.summary()))
}

/// The policy a journal call names, compiled; its errors under `/policy`.
fn policy_of(policy_json: &str) -> Result<CompiledPolicy> {
    compile_policy(policy_json).map_err(|e| e.under("/policy"))
}

/// `journal_recover`: what a new owner does with a journal (and, while an
/// attempt waits for one, the receiver's reconciliation answers so far):
/// `resume`, `reconcile`, `adopt` or `done`.
pub fn journal_recover(
    policy_json: &str,
    events_json: &str,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    journal_recover_compiled(&policy_of(policy_json)?, events_json, reconciliation_json)
}

/// [`journal_recover`] against a compiled policy.
pub fn journal_recover_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let rec = reconciliation_of(reconciliation_json)?;
    Ok(out(&crate::journal::recover(cp, &events.0, rec.as_ref())?))
}

fn reconciliation_of(
    reconciliation_json: Option<&str>,
) -> Result<Option<crate::journal::Reconciliation>> {
    reconciliation_json
        .map(|t| {
            from_str::<crate::journal::Reconciliation>(t).map_err(|e| e.under("/reconciliation"))
        })
        .transpose()
}

/// A journal entry's JSON text, decoded; its errors under `/entry`.
fn entry_of(entry_json: &str) -> Result<crate::journal::Entry> {
    from_str::<crate::journal::Entry>(entry_json).map_err(|e| e.under("/entry"))
}

/// `JournalWriter`: the writer of a journal (JSON text of its events) of
/// `cp`, verified, appending under `lease_generation`.
pub fn journal_writer(
    cp: std::sync::Arc<CompiledPolicy>,
    events_json: &str,
    lease_generation: u64,
) -> Result<crate::journal::Writer> {
    crate::journal::Writer::new(cp, &journal_events(events_json)?.0, lease_generation)
}

/// `JournalWriter.append`: the next event (JSON) built from an entry, the
/// writer advanced by it.
pub fn journal_writer_append(
    writer: &mut crate::journal::Writer,
    entry_json: &str,
) -> Result<String> {
    Ok(out(&writer.append(&entry_of(entry_json)?)?))
}

/// `JournalWriter.recover`: `journal_recover` of the journal written so far.
pub fn journal_writer_recover(
    writer: &crate::journal::Writer,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    Ok(out(&writer.recover(
        reconciliation_of(reconciliation_json)?.as_ref(),
    )?))
}

/// `journal_append`: the next event of a journal, built by the core from an
/// entry (`{"kind": …}` and what only the host knows) under the writer's
/// lease generation, with its `seq` and `prev_sha256`; append it at its seq.
pub fn journal_append(
    policy_json: &str,
    events_json: &str,
    lease_generation: u64,
    entry_json: &str,
) -> Result<String> {
    journal_append_compiled(
        &policy_of(policy_json)?,
        events_json,
        lease_generation,
        entry_json,
    )
}

/// [`journal_append`] against a compiled policy.
pub fn journal_append_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    lease_generation: u64,
    entry_json: &str,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let entry = entry_of(entry_json)?;
    Ok(out(&crate::journal::append(
        cp,
        &events.0,
        lease_generation,
        &entry,
    )?))
}

/// `journal_classify`: an event offered for a journal (a late append of an
/// old owner, a retried write): `append`, `duplicate` or `evidence`
/// (`stale_lease`, `seq_taken`; kept, never a decision).
pub fn journal_classify(policy_json: &str, events_json: &str, event_json: &str) -> Result<String> {
    journal_classify_compiled(&policy_of(policy_json)?, events_json, event_json)
}

/// [`journal_classify`] against a compiled policy.
pub fn journal_classify_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    event_json: &str,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let event =
        from_str::<crate::journal::JournalEvent>(event_json).map_err(|e| e.under("/event"))?;
    Ok(out(&crate::journal::classify_append(
        cp, &events.0, &event,
    )?))
}

fn retention_of(retention_json: &str) -> Result<crate::idempotency::Retention> {
    let r = from_str::<crate::idempotency::Retention>(retention_json)
        .map_err(|e| e.under("/retention"))?;
    r.check("/retention")?;
    Ok(r)
}

/// `idempotency_claim`: a retention, the record the store holds for the
/// key (or none), the request (`idempotency_key_sha256`, `request_sha256`)
/// and the wall clock in; `proceed` (with the record to write by
/// compare-and-set), `replay`, `poll` or `rejected` out.
pub fn idempotency_claim(
    retention_json: &str,
    record_json: Option<&str>,
    request_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let retention = retention_of(retention_json)?;
    let record = record_json
        .map(|t| {
            from_str::<crate::idempotency::IdempotencyRecord>(t).map_err(|e| e.under("/record"))
        })
        .transpose()?;
    let request = from_str::<crate::idempotency::ClaimRequest>(request_json)
        .map_err(|e| e.under("/request"))?;
    Ok(out(&crate::idempotency::claim(
        &retention,
        record.as_ref(),
        &request,
        now_epoch_ms,
    )?))
}

/// `idempotency_complete`: the claimed record moved to `succeeded` (with
/// the result's digest), `failed_no_effect` or `indeterminate`; the record
/// to write back by compare-and-set.
pub fn idempotency_complete(
    retention_json: &str,
    record_json: &str,
    completion_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let retention = retention_of(retention_json)?;
    let record = from_str::<crate::idempotency::IdempotencyRecord>(record_json)
        .map_err(|e| e.under("/record"))?;
    let completion = from_str::<crate::idempotency::Completion>(completion_json)
        .map_err(|e| e.under("/completion"))?;
    Ok(out(&crate::idempotency::complete(
        &retention,
        &record,
        &completion,
        now_epoch_ms,
    )?))
}

/// The run machine ([`crate::machine`]) started under `options_json` (or,
/// with `journal_json`, resumed from it) and fed the events of
/// `events_json`: the effects it asked for and where it ended
/// ([`crate::machine::replay::transcript`]). Only malformed input is an
/// error; a refused event is part of the answer.
pub fn machine_transcript(
    policy_json: &str,
    options_json: &str,
    journal_json: Option<&str>,
    events_json: &str,
) -> Result<String> {
    let cp = std::sync::Arc::new(compile_policy(policy_json)?);
    let options: crate::machine::Options = crate::decode::from_str(options_json)?;
    let journal = journal_json.map(journal_events).transpose()?;
    let events: crate::machine::replay::Events = crate::decode::from_str(events_json)?;
    let t = crate::machine::replay::transcript(
        &cp,
        options,
        journal.as_ref().map(|j| j.0.as_slice()),
        &events.0,
    );
    Ok(crate::canonical::to_jcs(&t))
}

/// A live run machine for the bindings ([`crate::machine::Machine`]):
/// JSON text in and out, so each binding is a few lines of glue. The host
/// loop asks [`LiveMachine::next_json`] for the outstanding effect, carries
/// it out and answers with [`LiveMachine::answer_json`]; nothing is decided
/// outside the core.
#[derive(Debug, Clone)]
pub struct LiveMachine {
    machine: crate::machine::Machine,
}

impl LiveMachine {
    /// Start a run of `policy_json` under `options_json` (the options
    /// document of [`machine_transcript`]).
    pub fn start(policy_json: &str, options_json: &str) -> Result<Self> {
        let cp = std::sync::Arc::new(compile_policy(policy_json).map_err(|e| e.under("/policy"))?);
        Self::start_compiled(cp, options_json)
    }

    /// [`LiveMachine::start`] of a policy compiled once for many runs.
    pub fn start_compiled(cp: std::sync::Arc<CompiledPolicy>, options_json: &str) -> Result<Self> {
        let options: crate::machine::Options =
            from_str(options_json).map_err(|e| e.under("/options"))?;
        Ok(Self {
            machine: crate::machine::Machine::start(cp, options)?,
        })
    }

    /// Take over the run `journal_json` holds (a JSON array of journal
    /// events) as the owner named in `options_json`'s `journal`.
    pub fn resume(policy_json: &str, options_json: &str, journal_json: &str) -> Result<Self> {
        let cp = std::sync::Arc::new(compile_policy(policy_json).map_err(|e| e.under("/policy"))?);
        Self::resume_compiled(cp, options_json, journal_json)
    }

    /// [`LiveMachine::resume`] of a policy compiled once for many runs.
    pub fn resume_compiled(
        cp: std::sync::Arc<CompiledPolicy>,
        options_json: &str,
        journal_json: &str,
    ) -> Result<Self> {
        let options: crate::machine::Options =
            from_str(options_json).map_err(|e| e.under("/options"))?;
        let journal = journal_events(journal_json)?;
        Ok(Self {
            machine: crate::machine::Machine::resume(cp, &journal.0, options)?,
        })
    }

    /// The outstanding effect as JSON (tagged by `kind`).
    pub fn next_json(&self) -> String {
        out(self.machine.next())
    }

    /// Whether the run is over (the outstanding effect is `done`).
    pub fn is_done(&self) -> bool {
        self.machine.next().is_done()
    }

    /// Answer the outstanding effect with an event (JSON tagged by `kind`):
    /// the next effect as JSON. A refused event is the core's coded error
    /// and leaves the same effect outstanding (but after a refused append).
    pub fn answer_json(&mut self, event_json: &str) -> Result<String> {
        let event: crate::machine::Event = from_str(event_json).map_err(|e| e.under("/event"))?;
        self.machine.answer(event).map(out)
    }

    /// The last attempt recorded and how its observation was judged:
    /// `{"attempt", "judgement"}` as JSON, or `None` before the first.
    pub fn observed_json(&self) -> Option<String> {
        let attempt = self.machine.session().attempts().attempts.last()?;
        let judgement = self.machine.judgement()?;
        let mut text = String::from("{\"attempt\":");
        text.push_str(&out(attempt));
        text.push_str(",\"judgement\":");
        text.push_str(&out(judgement));
        text.push('}');
        Some(text)
    }

    /// The run clock as the machine last read it, ms.
    pub fn now_ms(&self) -> u64 {
        self.machine.now_ms()
    }

    /// The sealed bundle of the finished run as JSON
    /// (`run_not_terminal` before it is over).
    pub fn seal_json(&self) -> Result<String> {
        self.machine.seal().map(|b| out(&b))
    }

    /// The sealed run: `{"bundle", "receipt_sha256"}` as JSON.
    pub fn sealed_json(&self) -> Result<String> {
        let bundle = self.machine.seal()?;
        let mut text = String::from("{\"bundle\":");
        text.push_str(&out(&bundle));
        text.push_str(",\"receipt_sha256\":\"");
        text.push_str(&digest_of(&bundle.receipt));
        text.push_str("\"}");
        Ok(text)
    }
}

/// `lower_request`: a logical request with `messages` lowered for a route
/// release (`retryledger.route_release.v1` with `lowering` settings) under
/// `options_json` (`{"provider_bound_parts": "refuse" | "drop"}`, each field
/// optional): `{"api", "body", "body_sha256", "model", "notes"}`, or the
/// coded reason the route cannot serve it ([`crate::lower`]).
pub fn lower_request(request_json: &str, release_json: &str, options_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let release = from_str::<crate::builder::RouteRelease>(release_json)?;
    let options = from_str::<crate::lower::LowerOptions>(options_json)?;
    let lowered = crate::lower::lower(
        &request,
        &release,
        options.provider_bound_parts.unwrap_or_default(),
    )?;
    Ok(crate::canonical::to_jcs(&lowered.to_json()))
}

/// `route_capabilities`: for a logical request and a policy spec, whether each
/// route can serve the request, and if not the coded reason and its JSON
/// Pointer in the request: `{"routes": [{"route_id", "capable", "code"?, "path"?}]}`.
pub fn route_capabilities(request_json: &str, spec_json: &str) -> Result<String> {
    let request = crate::request::parse_request(request_json)?;
    let spec = from_str::<crate::builder::PolicySpec>(spec_json)?;
    let report = crate::lower::route_report(&request, &spec.routes, spec.provider_bound_parts)?;
    Ok(crate::canonical::to_jcs(&report))
}

/// An error as the JSON object bindings raise from: `code`, `family`, `message`, and `path`/`attempt_index` when known.
pub fn error_json(e: &Error) -> String {
    canonical_json(&ErrorDoc(e))
}

struct ErrorDoc<'a>(&'a Error);

impl Encode for ErrorDoc<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        let e = self.0;
        let index = e.attempt_index.and_then(|i| u64::try_from(i).ok());
        let mut o = ObjectWriter::new(sink);
        o.opt_u64("attempt_index", index)
            .str("code", e.code.as_str())
            .str("family", e.family().as_str())
            .str("message", &e.message);
        if let Some(p) = &e.path {
            o.str("path", p);
        }
        o.end();
    }
}

/// The lab report (canonical JSON), its summary table and its case table.
#[cfg(feature = "lab")]
pub fn lab() -> Result<(String, String, String)> {
    let report = crate::lab::run()?;
    let (text, _) = crate::lab::report_bytes(&report);
    Ok((
        text,
        crate::lab::summary(&report),
        crate::lab::case_table(&report),
    ))
}

/// A key pool's configuration and its snapshot (a fresh one when the store
/// holds none), both checked.
fn key_pool_inputs(
    config_json: &str,
    snapshot_json: Option<&str>,
) -> Result<(
    crate::keypool::KeyPoolConfig,
    crate::keypool::KeyPoolSnapshot,
)> {
    let cfg =
        from_str::<crate::keypool::KeyPoolConfig>(config_json).map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = match snapshot_json {
        Some(s) => {
            from_str::<crate::keypool::KeyPoolSnapshot>(s).map_err(|e| e.under("/snapshot"))?
        }
        None => crate::keypool::KeyPoolSnapshot::fresh(&cfg),
    };
    snap.check(&cfg, "/snapshot")?;
    Ok((cfg, snap))
}

/// `{"selection": …, "snapshot": …}`: the key chosen and the next snapshot.
struct KeyPoolStep(crate::keypool::Selection, crate::keypool::KeyPoolSnapshot);

impl Encode for KeyPoolStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("selection", &self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

/// `key_pool_select`: which key of the pool the next attempt uses
/// ([`crate::keypool::select`]); `{"selection", "snapshot"}` out, the
/// snapshot to write back with compare-and-set. `affinity` is the key the
/// session used before.
pub fn key_pool_select(
    config_json: &str,
    snapshot_json: Option<&str>,
    now_epoch_ms: u64,
    affinity: Option<&str>,
) -> Result<String> {
    let (cfg, snap) = key_pool_inputs(config_json, snapshot_json)?;
    let affinity = affinity
        .map(|a| {
            crate::ids::Sha256Hex::parse(a)
                .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/affinity", m))
        })
        .transpose()?;
    let (selection, next) = crate::keypool::select(&cfg, &snap, now_epoch_ms, affinity.as_ref());
    Ok(out(&KeyPoolStep(selection, next)))
}

/// `key_pool_record`: the pool's next snapshot after `key_sha256` answered
/// with `outcome` (and the HTTP `status`, when there was one: 401 and 403
/// disable the key) ([`crate::keypool::record`]).
pub fn key_pool_record(
    config_json: &str,
    snapshot_json: Option<&str>,
    key_sha256: &str,
    outcome_json: &str,
    status: Option<u64>,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = key_pool_inputs(config_json, snapshot_json)?;
    let key = crate::ids::Sha256Hex::parse(key_sha256)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/key_sha256", m))?;
    let outcome =
        from_str::<crate::outcome::Outcome>(outcome_json).map_err(|e| e.under("/outcome"))?;
    let status = status
        .map(|s| {
            u16::try_from(s)
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| {
                    Error::at(
                        ErrorCode::IntegerOutOfRange,
                        "/status",
                        format!("status {s} is not an HTTP status (100..=599)"),
                    )
                })
        })
        .transpose()?;
    let signal = crate::keypool::KeySignal::of(&outcome, status);
    let next = crate::keypool::record(&cfg, &snap, &key, signal, now_epoch_ms)?;
    Ok(out(&next))
}

/// `key_sha256`: a pool key's identity, the SHA-256 of its secret's UTF-8
/// bytes (the secret itself is never in a document).
pub fn key_sha256(secret: &str) -> Result<String> {
    if secret.is_empty() {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/secret",
            "a key's secret is not empty",
        ));
    }
    Ok(crate::canonical::sha256_hex(secret.as_bytes()))
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::canonical::to_jcs;
    use crate::evaluate::Decision;
    use crate::receipt::Verdict;

    #[test]
    fn answers_are_canonical_and_decode_back() {
        let bundle = crate::lab::reference_bundle().unwrap();
        let policy = canonical_json(&bundle.policy);
        let mut attempts = bundle.attempts.clone();
        for n in 0..=attempts.attempts.len() {
            attempts.attempts.truncate(n);
            let text = plan_next(&policy, &canonical_json(&attempts)).unwrap();
            let value = parse_strict(&text).unwrap();
            assert_eq!(to_jcs(&value), text);
            let d: Decision = from_str(&text).unwrap();
            assert_eq!(canonical_json(&d), text);
        }
        let verdict = verify(&canonical_json(&bundle)).unwrap();
        let v: Verdict = from_str(&verdict).unwrap();
        assert!(matches!(v, Verdict::Verified { .. }));
        assert_eq!(canonical_json(&v), verdict);
        let mut drifted = bundle;
        drifted.receipt.total_cost += 1;
        let verdict = verify(&canonical_json(&drifted)).unwrap();
        let v: Verdict = from_str(&verdict).unwrap();
        assert!(matches!(v, Verdict::Drift { ref path, .. } if path == "/receipt/total_cost"));
        assert_eq!(canonical_json(&v), verdict);
        assert_eq!(to_jcs(&parse_strict(&verdict).unwrap()), verdict);
    }

    #[test]
    fn tagged_documents_are_objects_only() {
        // serde's internally tagged enums also took `["retryable", "rate_limited"]`.
        use crate::outcome::Outcome;
        use crate::policy::Jitter;
        for text in [r#"["success"]"#, r#"["retryable","rate_limited"]"#] {
            let e = from_str::<Outcome>(text).unwrap_err();
            assert_eq!(
                (e.code, e.path.as_deref()),
                (ErrorCode::InvalidType, Some(""))
            );
        }
        let e = from_str::<Jitter>(r#"["full","s",1]"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidType);
        let e = from_str::<Outcome>(r#"{"class":5}"#).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::InvalidType, Some("/class"))
        );
    }

    #[test]
    fn requests_digest_the_same_with_or_without_floats() {
        let ints = r#"{"schema":"retryledger.request.v1","operation":"chat","input":[1,2]}"#;
        let floats =
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":[1.0,2e0],"seed":0}"#;
        assert_eq!(digest(ints).unwrap(), request_sha256(ints).unwrap());
        assert_eq!(digest(floats).unwrap(), request_sha256(floats).unwrap());
        // A float anywhere else keeps the strict reader's error.
        let e = digest(r#"{"schema":"retryledger.policy.v1","x":1.5}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::FloatValue);
    }

    #[test]
    fn error_json_is_canonical() {
        let e = Error::attempt(ErrorCode::EarlyStart, 2, "started_at_ms", "early");
        assert_eq!(
            error_json(&e),
            r#"{"attempt_index":2,"code":"early_start","family":"drift","message":"early","path":"/attempts/2/started_at_ms"}"#
        );
    }
}
