//! WebAssembly bindings of retryledger-core (built only for wasm32).
//!
//! Thin glue over [`retryledger_core::api`] and the core's
//! [`Session`](retryledger_core::Session): JSON text in, JSON text out,
//! except on a run's hot path, where the planned dispatch's numbers are
//! written into a buffer the host reads from the module's memory, the
//! attempts' canonical bytes are hashed where they were written, and the
//! sealed receipt crosses as a tape of the core's encoding events
//! (`tape.rs`). A failure is thrown as the core's `error_json` string (code,
//! family, message, path, attempt index); the TypeScript layer of the npm
//! package parses it and throws a typed `Error` subclass. Numbers that cross as JavaScript numbers
//! are checked here to be integers in 0..=2^53-1, so nothing becomes a BigInt
//! and no input can trap.
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, sha256_hex as sha256, write_canonical};
use retryledger_core::decode::from_str;
use retryledger_core::error::{Error, ErrorCode};
use retryledger_core::evaluate::{Decision, Dispatch};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use retryledger_core::observe::{Facts, Rule};
use retryledger_core::outcome::Outcome;
use retryledger_core::{CompiledPolicy, Session};
use wasm_bindgen::prelude::*;

mod hedge;
mod journal;
mod machine;
mod tape;

/// Every fallible export returns text or throws the error's JSON as a string.
type Out<T> = Result<T, JsValue>;

fn thrown(e: &Error) -> JsValue {
    JsValue::from_str(&api::error_json(e))
}

fn lift<T>(r: retryledger_core::Result<T>) -> Out<T> {
    r.map_err(|e| thrown(&e))
}

/// A JavaScript number as a document integer: finite, whole, in 0..=2^53-1.
fn safe_integer(x: f64, name: &str) -> retryledger_core::Result<u64> {
    if !x.is_finite() || x.trunc() != x {
        return Err(Error::at(
            ErrorCode::FloatValue,
            format!("/{name}"),
            format!("`{name}` must be an integer"),
        ));
    }
    // Exact: MAX_SAFE_INTEGER is below 2^53, so the conversion loses nothing.
    #[allow(clippy::cast_precision_loss)]
    let max = MAX_SAFE_INTEGER as f64;
    if !(0.0..=max).contains(&x) {
        return Err(Error::at(
            ErrorCode::IntegerOutOfRange,
            format!("/{name}"),
            format!("`{name}` must be in 0..=2^53-1"),
        ));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(x as u64)
}

/// `validate_policy`: the policy digest.
#[wasm_bindgen]
pub fn validate_policy(policy: &str) -> Out<String> {
    lift(api::validate_policy(policy))
}

/// `plan_next`: the decision as JSON.
#[wasm_bindgen]
pub fn plan_next(policy: &str, attempts: &str) -> Out<String> {
    lift(api::plan_next(policy, attempts))
}

/// `evaluate`: the receipt as JSON.
#[wasm_bindgen]
pub fn evaluate(policy: &str, attempts: &str) -> Out<String> {
    lift(api::evaluate(policy, attempts))
}

/// `verify_bundle`: the verdict as JSON.
#[wasm_bindgen]
pub fn verify_bundle(bundle: &str) -> Out<String> {
    lift(api::verify(bundle))
}

/// `digest`: the document's SHA-256 as lowercase hex.
#[wasm_bindgen]
pub fn digest(document: &str) -> Out<String> {
    lift(api::digest(document))
}

/// `parse_retry_after`: bounded milliseconds.
#[wasm_bindgen]
pub fn parse_retry_after(header: &str, value: &str, now_unix_ms: f64, cap_ms: f64) -> Out<f64> {
    let run = || -> retryledger_core::Result<u64> {
        let now = safe_integer(now_unix_ms, "now_unix_ms")?;
        let cap = safe_integer(cap_ms, "cap_ms")?;
        api::parse_retry_after(header, value, now, cap)
    };
    // The core clamps to 2^53-1, so the number is exact in JavaScript.
    #[allow(clippy::cast_precision_loss)]
    lift(run().map(|ms| ms as f64))
}

/// `classify_http`: the outcome as JSON.
#[wasm_bindgen]
pub fn classify_http(observation: &str) -> Out<String> {
    lift(api::classify_http(observation))
}

/// The module's memory, where a session's plan and sealed bytes are read
/// (`Session::plan_ptr`, `Session::bytes_ptr`).
#[wasm_bindgen]
pub fn module_memory() -> JsValue {
    wasm_bindgen::memory()
}

/// The text of an object key a tape numbered (`undefined` for a number never given).
#[wasm_bindgen]
pub fn tape_key(id: u32) -> Option<String> {
    tape::key_text(id)
}

/// The text of a string value a tape numbered (`undefined` for a number never given).
#[wasm_bindgen]
pub fn tape_str(id: u32) -> Option<String> {
    tape::str_text(id)
}

/// The canonical JSON of the document a tape holds (`ops` and the text as
/// the host decoded it, as [`WasmSession::seal_hashed`] wrote them): the
/// core's canonical writer encodes the tape's events, which make the same
/// bytes as the document they were written from. A tape that is not one
/// well-formed document is `invalid_value`.
#[wasm_bindgen]
pub fn tape_json(ops: &[f64], text: &str) -> Out<String> {
    match tape::replay(ops, text) {
        Some(doc) => Ok(canonical_json(&doc)),
        None => Err(thrown(&Error::at(
            ErrorCode::InvalidValue,
            "/tape",
            "not the tape of one document",
        ))),
    }
}

/// Lowercase hex SHA-256 of a string's UTF-8 bytes (the idempotency key check).
#[wasm_bindgen]
pub fn sha256_hex(text: &str) -> String {
    sha256(text.as_bytes())
}

/// Lowercase hex SHA-256 of bytes (a request body as sent).
#[wasm_bindgen]
pub fn sha256_bytes_hex(bytes: &[u8]) -> String {
    sha256(bytes)
}

/// A policy validated and digested once, reused for every plan and seal of a run.
#[wasm_bindgen]
pub struct Compiled {
    inner: Arc<CompiledPolicy>,
    /// The logical request a template bound: each SDK call a run of it
    /// sends is checked against it ([`WasmSession::check_sent`]).
    request: Option<Arc<retryledger_core::request::Request>>,
}

#[wasm_bindgen]
impl Compiled {
    /// Decode and validate a policy.
    pub fn compile(policy: &str) -> Out<Compiled> {
        Ok(Compiled {
            inner: Arc::new(lift(api::compile_policy(policy))?),
            request: None,
        })
    }

    /// The policy digest.
    pub fn digest(&self) -> String {
        self.inner.policy_sha256.clone()
    }

    /// The policy as canonical JSON.
    pub fn policy_json(&self) -> String {
        canonical_json(&self.inner.policy)
    }

    /// `plan_next` against this policy.
    pub fn plan_next(&self, attempts: &str) -> Out<String> {
        lift(api::plan_next_compiled(&self.inner, attempts))
    }

    /// `evaluate` against this policy.
    pub fn evaluate(&self, attempts: &str) -> Out<String> {
        lift(api::evaluate_compiled(&self.inner, attempts))
    }

    /// Seal a finished run: the bundle as JSON.
    pub fn seal(&self, attempts: &str) -> Out<String> {
        lift(api::seal_compiled(&self.inner, attempts))
    }

    /// `journal_verify` against this policy.
    pub fn journal_verify(&self, events: &str) -> Out<String> {
        lift(api::journal_verify_compiled(&self.inner, events))
    }

    /// `journal_recover` against this policy.
    pub fn journal_recover(&self, events: &str, reconciliation: Option<String>) -> Out<String> {
        lift(api::journal_recover_compiled(
            &self.inner,
            events,
            reconciliation.as_deref(),
        ))
    }

    /// `journal_append` against this policy.
    pub fn journal_append(&self, events: &str, lease_generation: f64, entry: &str) -> Out<String> {
        let generation = lift(safe_integer(lease_generation, "lease_generation"))?;
        lift(api::journal_append_compiled(
            &self.inner,
            events,
            generation,
            entry,
        ))
    }

    /// `journal_classify` against this policy.
    pub fn journal_classify(&self, events: &str, event: &str) -> Out<String> {
        lift(api::journal_classify_compiled(&self.inner, events, event))
    }

    /// The writer of a journal (JSON text of its events) of this policy,
    /// verified, appending under `lease_generation`.
    pub fn journal_writer(
        &self,
        events: &str,
        lease_generation: f64,
    ) -> Out<journal::JournalWriter> {
        let generation = lift(safe_integer(lease_generation, "lease_generation"))?;
        Ok(journal::JournalWriter::new(lift(api::journal_writer(
            Arc::clone(&self.inner),
            events,
            generation,
        ))?))
    }

    /// Refuse, before any dispatch, a policy with a route that has no
    /// client: `route_ids` are the route ids the host holds a client for
    /// (`route_client_missing` otherwise).
    pub fn require_clients(&self, route_ids: Vec<String>) -> Out<()> {
        lift(
            self.inner
                .require_clients(|id| route_ids.iter().any(|x| x == id)),
        )
    }

    /// Refuse, before any dispatch, a fleet that does not fit the policy:
    /// `given` is whether the caller passed one (`admission_missing`,
    /// `admission_unexpected`).
    pub fn require_fleet(&self, given: bool) -> Out<()> {
        lift(self.inner.require_fleet(given))
    }

    /// Refuse, before any dispatch, a section the driver named `driver`
    /// cannot carry (docs/COMPOSITION.md, "What a driver carries").
    pub fn require_driver(&self, driver: &str) -> Out<()> {
        lift(
            retryledger_core::host::Driver::parse(driver)
                .and_then(|d| self.inner.require_driver(d)),
        )
    }

    /// Refuse, before any dispatch, an async job without a cancel call
    /// under `cancel_left_running` (`invalid_async_job`).
    pub fn require_job_calls(&self, has_cancel: bool) -> Out<()> {
        lift(self.inner.require_job_calls(has_cancel))
    }

    /// A run of this policy with no attempt yet: the core's Session.
    pub fn session(&self) -> WasmSession {
        WasmSession {
            session: Session::start(Arc::clone(&self.inner)),
            policy: Arc::clone(&self.inner),
            request: self.request.clone(),
            plan: [0.0; PLAN_FIELDS],
            bytes: Vec::new(),
            tape: tape::Tape::default(),
        }
    }
}

#[allow(clippy::cast_precision_loss)]
fn num(x: u64) -> f64 {
    // Every document integer is at most 2^53 - 1: exact as a JavaScript number.
    x as f64
}

/// An outcome document, decoded strictly by the core: its canonical JSON.
#[wasm_bindgen]
pub fn check_outcome(outcome: &str) -> Out<String> {
    lift(from_str::<Outcome>(outcome).map(|o| canonical_json(&o)))
}

/// `judge`: the core's judgement of a host's facts, as JSON.
#[wasm_bindgen]
pub fn judge(facts: &str) -> Out<String> {
    lift(api::judge(facts))
}

/// `next_repair`: the policy (JSON) of the next repair of a chain.
#[wasm_bindgen]
pub fn next_repair(
    links: &str,
    request_sha256: &str,
    idempotency_key_sha256: &str,
    started_at_ms: f64,
) -> Out<String> {
    let run = || -> retryledger_core::Result<String> {
        let started = safe_integer(started_at_ms, "started_at_ms")?;
        api::next_repair(links, request_sha256, idempotency_key_sha256, started)
    };
    lift(run())
}

/// `repair_step`: the repair that may follow a chain's last run (its key,
/// the key's digest and its ordinal, as JSON), or `null` when the last
/// run's end stands.
#[wasm_bindgen]
pub fn repair_step(
    links: &str,
    root_key: &str,
    tenant: Option<String>,
    operation: Option<String>,
) -> Out<String> {
    lift(api::repair_step(
        links,
        root_key,
        tenant.as_deref(),
        operation.as_deref(),
    ))
}

/// `verify_repair_chain`: a repair chain's verdict, as JSON.
#[wasm_bindgen]
pub fn verify_repair_chain(chain: &str) -> Out<String> {
    lift(api::verify_repair_chain(chain))
}

/// `request_sha256`: a logical request's digest (full RFC 8785).
#[wasm_bindgen]
pub fn request_sha256(request: &str) -> Out<String> {
    lift(api::request_sha256(request))
}

/// `build_policy`: the validated policy (JSON) built from a logical request and a policy spec.
#[wasm_bindgen]
pub fn build_policy(request: &str, spec: &str) -> Out<String> {
    lift(api::build_policy(request, spec))
}

/// A policy spec compiled once (`compilePolicyTemplate`), bound per call.
#[wasm_bindgen]
pub struct PolicyTemplate {
    inner: retryledger_core::template::PolicyTemplate,
}

#[wasm_bindgen]
impl PolicyTemplate {
    /// Compile a policy spec without `idempotency_key_sha256`.
    pub fn compile(spec: &str) -> Out<PolicyTemplate> {
        Ok(PolicyTemplate {
            inner: lift(api::compile_policy_template(spec))?,
        })
    }

    /// The compiled policy of one call: a logical request and the key's digest.
    pub fn bind(&self, request: &str, idempotency_key_sha256: &str) -> Out<Compiled> {
        let (inner, _, request) = lift(api::bind_policy_template_request(
            &self.inner,
            request,
            idempotency_key_sha256,
        ))?;
        Ok(Compiled {
            inner: Arc::new(inner),
            request: Some(Arc::new(request)),
        })
    }
}

/// `check_price_schedule`: the schedule's digest once checked against the policy.
#[wasm_bindgen]
pub fn check_price_schedule(policy: &str, schedule: &str) -> Out<String> {
    lift(api::check_price_schedule(policy, schedule))
}

/// `price_cost`: what raw usage costs on a release under a price schedule.
#[wasm_bindgen]
pub fn price_cost(schedule: &str, route_release_sha256: &str, usage: &str) -> Out<f64> {
    // Costs are at most 2^53 - 1: exact as JavaScript numbers.
    #[allow(clippy::cast_precision_loss)]
    lift(api::price_cost(schedule, route_release_sha256, usage).map(|c| c as f64))
}

/// `lift_request`: the logical request (canonical JSON) of an SDK call's parameters.
#[wasm_bindgen]
pub fn lift_request(call: &str, params: &str) -> Out<String> {
    lift(api::lift_request(call, params))
}

/// `check_sent_request`: an SDK call about to be sent (its URL path and JSON
/// body) against the logical request its policy binds.
#[wasm_bindgen]
pub fn check_sent_request(request: &str, url_path: &str, body: &str) -> Out<()> {
    lift(api::check_sent_request(request, url_path, body.as_bytes()))
}

/// `canonical_request`: a logical request's RFC 8785 canonical JSON.
#[wasm_bindgen]
pub fn canonical_request(request: &str) -> Out<String> {
    lift(api::canonical_request(request))
}

/// `idempotency_key_sha256`: a bare or scoped idempotency key's digest.
#[wasm_bindgen]
pub fn idempotency_key_sha256(
    key: &str,
    tenant: Option<String>,
    operation: Option<String>,
) -> Out<String> {
    lift(api::idempotency_key_sha256(
        key,
        tenant.as_deref(),
        operation.as_deref(),
    ))
}

/// `machineTranscript`: the run machine started under `options` (or, with
/// `journal`, resumed from it) and fed `events` (docs/COMPOSITION.md).
#[wasm_bindgen]
pub fn machine_transcript(
    policy: &str,
    options: &str,
    journal: Option<String>,
    events: &str,
) -> Out<String> {
    lift(api::machine_transcript(
        policy,
        options,
        journal.as_deref(),
        events,
    ))
}

/// `journalVerify`: what the replay of a journal (a JSON array of events) found.
#[wasm_bindgen]
pub fn journal_verify(policy: &str, events: &str) -> Out<String> {
    lift(api::journal_verify(policy, events))
}

/// `journalRecover`: `resume`, `reconcile`, `adopt` or `done` for a journal
/// and, while an attempt waits for one, the reconciliation answers so far.
#[wasm_bindgen]
pub fn journal_recover(policy: &str, events: &str, reconciliation: Option<String>) -> Out<String> {
    lift(api::journal_recover(
        policy,
        events,
        reconciliation.as_deref(),
    ))
}

/// `journalAppend`: the next event of a journal, built from an entry under a lease generation.
#[wasm_bindgen]
pub fn journal_append(
    policy: &str,
    events: &str,
    lease_generation: f64,
    entry: &str,
) -> Out<String> {
    let generation = lift(safe_integer(lease_generation, "lease_generation"))?;
    lift(api::journal_append(policy, events, generation, entry))
}

/// `journalClassify`: `append`, `duplicate` or `evidence` for an event offered to a journal.
#[wasm_bindgen]
pub fn journal_classify(policy: &str, events: &str, event: &str) -> Out<String> {
    lift(api::journal_classify(policy, events, event))
}

/// `idempotencyClaim`: `proceed`, `replay`, `poll` or `rejected` for a request under its key.
#[wasm_bindgen]
pub fn idempotency_claim(
    retention: &str,
    record: Option<String>,
    request: &str,
    now_epoch_ms: f64,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::idempotency_claim(
        retention,
        record.as_deref(),
        request,
        now,
    ))
}

/// `idempotencyComplete`: the claimed record moved to its final status.
#[wasm_bindgen]
pub fn idempotency_complete(
    retention: &str,
    record: &str,
    completion: &str,
    now_epoch_ms: f64,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::idempotency_complete(
        retention, record, completion, now,
    ))
}

/// `breakerAdmit`: `{"admission", "snapshot"}` for a breaker configuration and snapshot at a wall-clock time.
#[wasm_bindgen]
pub fn breaker_admit(config: &str, snapshot: &str, now_epoch_ms: f64) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::breaker_admit(config, snapshot, now))
}

/// `breakerRecord`: the next breaker snapshot after an admitted attempt's outcome.
#[wasm_bindgen]
pub fn breaker_record(
    config: &str,
    snapshot: &str,
    probe: bool,
    outcome: &str,
    now_epoch_ms: f64,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::breaker_record(config, snapshot, probe, outcome, now))
}

/// `budgetDeposit`: the next budget snapshot after a first attempt's deposit.
#[wasm_bindgen]
pub fn budget_deposit(config: &str, snapshot: &str, now_epoch_ms: f64) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::budget_deposit(config, snapshot, now))
}

/// `budgetWithdraw`: `{"granted", "snapshot"}` for a retry's withdrawal.
#[wasm_bindgen]
pub fn budget_withdraw(config: &str, snapshot: &str, now_epoch_ms: f64) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::budget_withdraw(config, snapshot, now))
}

/// `admissionAdmit`: `{"answer", "snapshot"}` for one admission under
/// admission limits (`tenant`: the call's, under tenant shares).
#[wasm_bindgen]
pub fn admission_admit(
    config: &str,
    snapshot: &str,
    now_epoch_ms: f64,
    queued_since_epoch_ms: f64,
    tokens: f64,
    tenant: Option<String>,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    let since = lift(safe_integer(queued_since_epoch_ms, "queued_since_epoch_ms"))?;
    let tokens = lift(safe_integer(tokens, "tokens"))?;
    lift(api::admission_admit(
        config,
        snapshot,
        now,
        since,
        tokens,
        tenant.as_deref(),
    ))
}

/// `admissionRelease`: the next admission snapshot once an admitted attempt
/// is over (`used`: the tokens it reported, or `undefined`).
#[wasm_bindgen]
pub fn admission_release(
    config: &str,
    snapshot: &str,
    now_epoch_ms: f64,
    reserved: f64,
    used: Option<f64>,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    let reserved = lift(safe_integer(reserved, "reserved"))?;
    let used = lift(used.map(|u| safe_integer(u, "used")).transpose())?;
    lift(api::admission_release(
        config, snapshot, now, reserved, used,
    ))
}

/// `admissionObserve`: a response's rate-limit headers (JSON text of
/// `[name, value]` pairs) applied to an admission snapshot.
#[wasm_bindgen]
pub fn admission_observe(
    config: &str,
    snapshot: &str,
    headers: &str,
    now_epoch_ms: f64,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::admission_observe(config, snapshot, headers, now))
}

/// `keyPoolSelect`: `{"selection", "snapshot"}`: the key of a pool the next
/// attempt uses and the snapshot to write back (`snapshot` absent: a fresh
/// pool).
#[wasm_bindgen]
pub fn key_pool_select(
    config: &str,
    snapshot: Option<String>,
    now_epoch_ms: f64,
    affinity: Option<String>,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    lift(api::key_pool_select(
        config,
        snapshot.as_deref(),
        now,
        affinity.as_deref(),
    ))
}

/// `keyPoolRecord`: the pool's next snapshot after a key's answer.
#[wasm_bindgen]
pub fn key_pool_record(
    config: &str,
    snapshot: Option<String>,
    key_sha256: &str,
    outcome: &str,
    now_epoch_ms: f64,
    status: Option<f64>,
) -> Out<String> {
    let now = lift(safe_integer(now_epoch_ms, "now_epoch_ms"))?;
    let status = lift(status.map(|s| safe_integer(s, "status")).transpose())?;
    lift(api::key_pool_record(
        config,
        snapshot.as_deref(),
        key_sha256,
        outcome,
        status,
        now,
    ))
}

/// `keySha256`: a pool key's identity (hex SHA-256 of its secret).
#[wasm_bindgen]
pub fn key_sha256(secret: &str) -> Out<String> {
    lift(api::key_sha256(secret))
}

/// `checkIdempotencyHeader`: an `Idempotency-Key` header value the
/// receiver's guard takes, or `idempotency_key_invalid`.
#[wasm_bindgen]
pub fn check_idempotency_header(raw: &str) -> Out<()> {
    lift(api::check_idempotency_header(raw))
}

/// `httpRequestSha256`: the digest of an HTTP request as received.
#[wasm_bindgen]
pub fn http_request_sha256(method: &str, target: &str, body: &[u8]) -> String {
    api::http_request_sha256(method, target, body)
}

/// `httpResponseSha256`: the digest of a response as sent (the kept headers
/// as JSON text of `[name, value]` pairs).
#[wasm_bindgen]
pub fn http_response_sha256(status: f64, headers: &str, body: &[u8]) -> Out<String> {
    let status = lift(safe_integer(status, "status"))?;
    lift(api::http_response_sha256(status, headers, body))
}

/// Facts decoded (strictly) once, for attempts that raise the same error.
#[wasm_bindgen(js_name = Facts)]
pub struct PreparedFacts {
    facts: Facts,
}

#[wasm_bindgen(js_class = Facts)]
impl PreparedFacts {
    /// Decode facts from their JSON.
    pub fn decode(facts: &str) -> Out<PreparedFacts> {
        Ok(PreparedFacts {
            facts: lift(from_str::<Facts>(facts))?,
        })
    }

    /// The facts of a dispatch that returned a value.
    pub fn returned() -> PreparedFacts {
        PreparedFacts {
            facts: Facts::returned(),
        }
    }
}

/// A run in progress: the core's [`Session`]. The planned dispatch crosses as
/// numbers (`undefined` once the run is terminal); an observed attempt
/// crosses as numbers and, when dispatch raised, the facts' JSON; the
/// attempts and the receipt cross as JSON when asked for.
#[wasm_bindgen(js_name = Session)]
pub struct WasmSession {
    session: Session,
    /// The compiled policy, to start over ([`WasmSession::restart`]).
    policy: Arc<CompiledPolicy>,
    /// The logical request a template bound, if any ([`WasmSession::check_sent`]).
    request: Option<Arc<retryledger_core::request::Request>>,
    /// The planned dispatch's numbers, written by [`WasmSession::plan`]
    /// (read by the host at [`WasmSession::plan_ptr`]).
    plan: [f64; PLAN_FIELDS],
    /// Canonical JSON written for the host to read at [`WasmSession::bytes_ptr`].
    bytes: Vec<u8>,
    /// The sealed receipt as a tape ([`WasmSession::seal_hashed`]).
    tape: tape::Tape,
}

/// The numbers of a planned dispatch, in this order in the plan buffer:
/// `not_before_ms`, `delay_ms`, `ordinal`, `route_ordinal`, `reserve_cost`,
/// `retry_after_floor_ms`, the route's position in priority order, whether
/// there is a jitter draw (1 or 0), `jitter_min_ms`, `jitter_max_ms`,
/// `jitter_sample_ms`, whether there is a continuation (1 or 0).
const PLAN_FIELDS: usize = 12;

/// A buffer's address in the module's memory, for the host to read it.
fn address<T>(p: *const T) -> u32 {
    // wasm32 addresses are 32 bits wide.
    u32::try_from(p as usize).unwrap_or(0)
}

/// A byte count as the host reads it.
fn length(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl WasmSession {
    fn dispatch(&self) -> Option<&Dispatch> {
        match self.session.next() {
            Decision::Dispatch(d) => Some(d),
            Decision::Terminal { .. } => None,
        }
    }

    fn field(&self, f: impl Fn(&Dispatch) -> Option<u64>) -> Option<f64> {
        self.dispatch().and_then(f).map(num)
    }
}

#[wasm_bindgen(js_class = Session)]
impl WasmSession {
    /// The terminal's name, or `undefined` while the run can dispatch.
    pub fn terminal(&self) -> Option<String> {
        match self.session.next() {
            Decision::Dispatch(_) => None,
            Decision::Terminal { terminal } => Some(terminal.as_str().to_owned()),
        }
    }

    /// The terminal's position in the core's table of terminals
    /// (`Terminal::NAMES`, which the host's generated tables list in the
    /// same order), or `undefined` while the run can dispatch: no text
    /// crosses.
    pub fn terminal_index(&self) -> Option<u32> {
        match self.session.next() {
            Decision::Dispatch(_) => None,
            Decision::Terminal { terminal } => retryledger_core::Terminal::ALL
                .iter()
                .position(|t| t == terminal)
                .and_then(|i| u32::try_from(i).ok()),
        }
    }

    /// The planned route's position in priority order.
    pub fn route_index(&self) -> Option<u32> {
        let d = self.dispatch()?;
        self.session
            .policy()
            .routes()
            .position(|r| r.route_id == d.route_id)
            .and_then(|i| u32::try_from(i).ok())
    }

    /// Start over: a run of the same policy with no attempt yet (a host
    /// reuses a finished session's memory for its next run).
    pub fn restart(&mut self) {
        self.session = Session::start(Arc::clone(&self.policy));
    }

    /// The planned dispatch into the plan buffer (see `PLAN_FIELDS`), one
    /// crossing for every number of the decision: `false` once the run is
    /// terminal (the buffer is then unchanged).
    pub fn plan(&mut self) -> bool {
        let Decision::Dispatch(d) = self.session.next() else {
            return false;
        };
        let index = self
            .session
            .policy()
            .routes()
            .position(|r| r.route_id == d.route_id)
            .unwrap_or(usize::MAX);
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        #[allow(clippy::cast_precision_loss)]
        let fields = [
            num(d.not_before_ms),
            num(d.delay_ms),
            num(d.ordinal),
            num(d.route_ordinal),
            num(d.reserve_cost),
            num(d.retry_after_floor_ms),
            index as f64,
            flag(d.jitter_sample_ms.is_some()),
            num(d.jitter_min_ms.unwrap_or(0)),
            num(d.jitter_max_ms.unwrap_or(0)),
            num(d.jitter_sample_ms.unwrap_or(0)),
            flag(d.continuation.is_some()),
        ];
        self.plan = fields;
        true
    }

    /// Where [`Self::plan`] writes (fixed for the session's life).
    pub fn plan_ptr(&self) -> u32 {
        address(self.plan.as_ptr())
    }

    /// Where the bytes [`Self::attempts_bytes`] and [`Self::seal_hashed`]
    /// wrote are (valid until the next call that writes them).
    pub fn bytes_ptr(&self) -> u32 {
        address(self.bytes.as_ptr())
    }

    /// The attempts' canonical JSON as UTF-8 bytes at [`Self::bytes_ptr`]:
    /// their count. A host with a native SHA-256 hashes them there, with no
    /// text decoded.
    pub fn attempts_bytes(&mut self) -> u32 {
        self.bytes.clear();
        write_canonical(self.session.attempts(), &mut self.bytes);
        length(self.bytes.len())
    }

    /// Seal the finished run given the host's SHA-256 of the attempts'
    /// canonical JSON ([`Self::attempts_bytes`]): the receipt is written as
    /// a tape (`fromTape` in the TypeScript layer makes the plain object
    /// from it, no JSON parsed; [`tape_json`] is its canonical JSON, written
    /// when first asked for). Where to read them goes into the plan buffer,
    /// in this order: the attempts' bytes' address and count, the tape's
    /// address and count of numbers, the tape's text's address and count of
    /// bytes. `run_not_terminal` before the run ends, `invalid_digest` for a
    /// malformed digest.
    pub fn seal_hashed(&mut self, attempts_sha256: &str) -> Out<()> {
        // Encoded straight from the session (no owned receipt built); on an
        // error nothing was encoded.
        let session = &self.session;
        lift(self.tape.write_with(|sink| {
            session.encode_receipt_with_attempts_sha256(attempts_sha256, sink)
        }))?;
        #[allow(clippy::cast_precision_loss)]
        let at = |n: usize| n as f64;
        self.plan = [
            f64::from(address(self.bytes.as_ptr())),
            at(self.bytes.len()),
            f64::from(address(self.tape.ops.as_ptr())),
            at(self.tape.len()),
            f64::from(address(self.tape.text.as_ptr())),
            at(self.tape.text.len()),
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
        ];
        Ok(())
    }

    /// The planned global ordinal.
    pub fn ordinal(&self) -> Option<f64> {
        self.field(|d| Some(d.ordinal))
    }

    /// The planned per-route ordinal.
    pub fn route_ordinal(&self) -> Option<f64> {
        self.field(|d| Some(d.route_ordinal))
    }

    /// The planned earliest start, ms.
    pub fn not_before_ms(&self) -> Option<f64> {
        self.field(|d| Some(d.not_before_ms))
    }

    /// The planned delay from the previous completion, ms.
    pub fn delay_ms(&self) -> Option<f64> {
        self.field(|d| Some(d.delay_ms))
    }

    /// The planned reservation.
    pub fn reserve_cost(&self) -> Option<f64> {
        self.field(|d| Some(d.reserve_cost))
    }

    /// The bounded Retry-After floor of the planned delay, ms.
    pub fn retry_after_floor_ms(&self) -> Option<f64> {
        self.field(|d| Some(d.retry_after_floor_ms))
    }

    /// The jitter interval's lower end (absent without a draw).
    pub fn jitter_min_ms(&self) -> Option<f64> {
        self.field(|d| d.jitter_min_ms)
    }

    /// The jitter interval's upper end (absent without a draw).
    pub fn jitter_max_ms(&self) -> Option<f64> {
        self.field(|d| d.jitter_max_ms)
    }

    /// The jitter sample (absent without a draw).
    pub fn jitter_sample_ms(&self) -> Option<f64> {
        self.field(|d| d.jitter_sample_ms)
    }

    /// Record the planned attempt (run-clock start and completion, the cost
    /// charged or the reservation when absent). Without facts the dispatch
    /// returned: the rule `returned` comes back. With facts (JSON, decoded
    /// strictly) the core judges them and the judgement's JSON comes back.
    /// Drift is an error and leaves the run unchanged.
    pub fn observe(
        &mut self,
        started_at_ms: f64,
        completed_at_ms: f64,
        cost: Option<f64>,
        facts: Option<String>,
    ) -> Out<String> {
        let run = || -> retryledger_core::Result<String> {
            let started = safe_integer(started_at_ms, "started_at_ms")?;
            let completed = safe_integer(completed_at_ms, "completed_at_ms")?;
            let cost = cost.map(|c| safe_integer(c, "cost")).transpose()?;
            match facts {
                None => {
                    let j = self
                        .session
                        .observe(started, completed, cost, &Facts::returned())?;
                    Ok(j.rule.as_str().to_owned())
                }
                Some(text) => {
                    let facts = from_str::<Facts>(&text)?;
                    let j = self.session.observe(started, completed, cost, &facts)?;
                    Ok(canonical_json(&j))
                }
            }
        };
        lift(run())
    }

    /// [`Self::observe`] with facts decoded once beforehand (an
    /// `AttemptError`'s, or [`PreparedFacts::returned`]): the rule comes
    /// back as its position in the core's table of rules (`Rule::NAMES`,
    /// which the host's generated tables list in the same order); nothing
    /// crosses as JSON or text.
    pub fn observe_prepared(
        &mut self,
        started_at_ms: f64,
        completed_at_ms: f64,
        cost: Option<f64>,
        facts: &PreparedFacts,
    ) -> Out<u32> {
        let mut run = || -> retryledger_core::Result<u32> {
            let started = safe_integer(started_at_ms, "started_at_ms")?;
            let completed = safe_integer(completed_at_ms, "completed_at_ms")?;
            let cost = cost.map(|c| safe_integer(c, "cost")).transpose()?;
            let j = self
                .session
                .observe(started, completed, cost, &facts.facts)?;
            let at = Rule::ALL.iter().position(|r| *r == j.rule).unwrap_or(0);
            Ok(u32::try_from(at).unwrap_or(0))
        };
        lift(run())
    }

    /// [`Self::observe`] for a streamed run: the facts' JSON (with their
    /// `stream` part when a stream opened) and the texts of the events the
    /// attempt received, in order. The judgement's JSON comes back; its
    /// `stream` says what the host does with the consumer's events.
    pub fn observe_stream(
        &mut self,
        started_at_ms: f64,
        completed_at_ms: f64,
        cost: Option<f64>,
        facts: &str,
        deltas: Vec<String>,
    ) -> Out<String> {
        let mut run = || -> retryledger_core::Result<String> {
            let started = safe_integer(started_at_ms, "started_at_ms")?;
            let completed = safe_integer(completed_at_ms, "completed_at_ms")?;
            let cost = cost.map(|c| safe_integer(c, "cost")).transpose()?;
            let facts = from_str::<Facts>(facts)?;
            let j = self
                .session
                .observe_stream(started, completed, cost, &facts, &deltas)?;
            Ok(canonical_json(&j))
        };
        lift(run())
    }

    /// [`Self::observe_stream`] with the delta texts joined into one string
    /// and their UTF-8 byte lengths: one crossing for the whole attempt. A
    /// length that does not end on a character boundary, or lengths that do
    /// not add up to the text, is `invalid_value`.
    pub fn observe_stream_joined(
        &mut self,
        started_at_ms: f64,
        completed_at_ms: f64,
        cost: Option<f64>,
        facts: &str,
        joined: &str,
        lengths: &[u32],
    ) -> Out<String> {
        let mut run = || -> retryledger_core::Result<String> {
            let started = safe_integer(started_at_ms, "started_at_ms")?;
            let completed = safe_integer(completed_at_ms, "completed_at_ms")?;
            let cost = cost.map(|c| safe_integer(c, "cost")).transpose()?;
            let facts = from_str::<Facts>(facts)?;
            let mut deltas: Vec<&str> = Vec::with_capacity(lengths.len());
            let mut at = 0usize;
            for (i, n) in lengths.iter().enumerate() {
                let end = usize::try_from(*n).ok().and_then(|n| at.checked_add(n));
                let Some(piece) = end.and_then(|end| joined.get(at..end)) else {
                    return Err(Error::at(
                        ErrorCode::InvalidValue,
                        format!("/deltas/{i}"),
                        "a delta length past the text or inside a character",
                    ));
                };
                deltas.push(piece);
                at = at.saturating_add(piece.len());
            }
            if at != joined.len() {
                return Err(Error::at(
                    ErrorCode::InvalidValue,
                    "/deltas",
                    "the delta lengths do not add up to the text",
                ));
            }
            let j = self
                .session
                .observe_stream(started, completed, cost, &facts, &deltas)?;
            Ok(canonical_json(&j))
        };
        lift(run())
    }

    /// The planned attempt's continuation as JSON (a streamed run resuming
    /// a provider response), or `undefined`.
    pub fn continuation_json(&self) -> Option<String> {
        self.dispatch()
            .and_then(|d| d.continuation.as_ref())
            .map(canonical_json)
    }

    /// The planned attempt's async-job step as JSON (`{"kind": "submit"}`,
    /// or a poll with the job's id digest and number), or `undefined`.
    pub fn job_json(&self) -> Option<String> {
        self.dispatch()
            .and_then(|d| d.job.as_ref())
            .map(canonical_json)
    }

    /// The stream events the consumer received so far as JSON, or
    /// `undefined` when the policy does not stream.
    pub fn stream_events_json(&self) -> Option<String> {
        self.session.policy().policy.stream.as_ref().map(|_| {
            canonical_json(&retryledger_core::stream::StreamEvents(
                self.session.stream_events(),
            ))
        })
    }

    /// Admit the planned attempt under the fleet view (JSON: breakers by
    /// route release, the budget, whether the store is unavailable) read at
    /// `now_epoch_ms`, `at_ms` on the run clock: `{"decision", "writes"}`.
    pub fn admit(&mut self, at_ms: f64, now_epoch_ms: f64, view: &str) -> Out<String> {
        let mut run = || -> retryledger_core::Result<String> {
            let at = safe_integer(at_ms, "at_ms")?;
            let now = safe_integer(now_epoch_ms, "now_epoch_ms")?;
            let view = from_str::<retryledger_core::fleet::FleetView>(view)?;
            Ok(canonical_json(&self.session.admit(at, now, &view)?))
        };
        lift(run())
    }

    /// What [`Self::admit`] would answer under `view`, the session unchanged.
    pub fn admit_preview(&self, at_ms: f64, now_epoch_ms: f64, view: &str) -> Out<String> {
        let run = || -> retryledger_core::Result<String> {
            let at = safe_integer(at_ms, "at_ms")?;
            let now = safe_integer(now_epoch_ms, "now_epoch_ms")?;
            let view = from_str::<retryledger_core::fleet::FleetView>(view)?;
            Ok(canonical_json(&self.session.admit_preview(at, now, &view)?))
        };
        lift(run())
    }

    /// The last attempt's breaker after its outcome, from the snapshot (JSON)
    /// read now: the next snapshot's JSON.
    pub fn breaker_after(&self, snapshot: &str, now_epoch_ms: f64) -> Out<String> {
        let run = || -> retryledger_core::Result<String> {
            let now = safe_integer(now_epoch_ms, "now_epoch_ms")?;
            let snapshot = from_str::<retryledger_core::breaker::BreakerSnapshot>(snapshot)?;
            Ok(canonical_json(&self.session.breaker_after(&snapshot, now)?))
        };
        lift(run())
    }

    /// The admitted attempt's admission snapshot once it is over, from the
    /// snapshot (JSON) read now: its slot freed and its reserved tokens
    /// settled with `used_tokens` (`undefined`: not reported), then the
    /// rate-limit `headers` of its response (JSON text of `[name, value]`
    /// pairs, optional) applied; the next snapshot's JSON.
    pub fn admission_release(
        &self,
        snapshot: &str,
        now_epoch_ms: f64,
        used_tokens: Option<f64>,
        headers: Option<String>,
    ) -> Out<String> {
        let run = || -> retryledger_core::Result<String> {
            let now = safe_integer(now_epoch_ms, "now_epoch_ms")?;
            let used = used_tokens
                .map(|u| safe_integer(u, "used_tokens"))
                .transpose()?;
            let snapshot = from_str::<retryledger_core::admission::AdmissionSnapshot>(snapshot)?;
            let headers = headers
                .map(|h| from_str::<retryledger_core::admission::SeenHeaders>(&h))
                .transpose()
                .map_err(|e| e.under("/headers"))?
                .unwrap_or_default();
            Ok(canonical_json(&self.session.admission_release_seen(
                &snapshot, now, used, &headers.0,
            )?))
        };
        lift(run())
    }

    /// The fleet snapshots the admissions read, as JSON (`undefined` without a fleet section).
    pub fn fleet_snapshots_json(&self) -> Option<String> {
        self.session
            .policy()
            .policy
            .fleet
            .as_ref()
            .map(|_| canonical_json(self.session.fleet_snapshots()))
    }

    /// Price the run's usage with `schedule` (JSON), checked against the
    /// policy before the first attempt: the schedule's canonical JSON.
    pub fn set_price_schedule(&mut self, schedule: &str) -> Out<String> {
        let mut run = || -> retryledger_core::Result<String> {
            let schedule = from_str::<retryledger_core::price::PriceSchedule>(schedule)?;
            let text = canonical_json(&schedule);
            self.session.set_price_schedule(Arc::new(schedule))?;
            Ok(text)
        };
        lift(run())
    }

    /// Report usage (JSON units by kind) of the attempt in flight: what the
    /// attempt's usage so far costs.
    pub fn add_usage(&mut self, usage: &str) -> Out<f64> {
        let mut run = || -> retryledger_core::Result<f64> {
            let usage = from_str::<retryledger_core::price::Units>(usage)?;
            Ok(self.session.add_usage(&usage)? as f64)
        };
        lift(run())
    }

    /// Check an SDK call the attempt in flight is about to send (its URL
    /// path and JSON body) against the logical request a template bound:
    /// `request_drift` when it lifts to another one.
    pub fn check_sent(&self, url_path: &str, body: &[u8]) -> Out<()> {
        match &self.request {
            Some(request) => lift(retryledger_core::lift::check_sent(request, url_path, body)),
            None => Ok(()),
        }
    }

    /// Report the digest (lowercase hex) of the request body the attempt in flight sent.
    pub fn set_request_body_sha256(&mut self, digest: &str) -> Out<()> {
        let digest = lift(
            retryledger_core::ids::Sha256Hex::parse(digest)
                .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/request_body_sha256", m)),
        )?;
        self.session.set_request_body_sha256(digest);
        Ok(())
    }

    /// Report the model the attempt in flight asked for and the one the
    /// provider's response named; a side not learned is `undefined` (left
    /// out, never invented).
    pub fn set_model(&mut self, requested: Option<String>, served: Option<String>) -> Out<()> {
        let parse =
            |v: Option<String>, path: &str| -> Out<Option<retryledger_core::ids::Identifier>> {
                match v {
                    None => Ok(None),
                    Some(s) => lift(
                        retryledger_core::ids::Identifier::parse(&s)
                            .map(Some)
                            .map_err(|(code, m)| Error::at(code, path, m)),
                    ),
                }
            };
        let requested = parse(requested, "/model/requested")?;
        let served = parse(served, "/model/served")?;
        self.session.set_model(requested, served);
        Ok(())
    }

    /// Report what the attempt in flight was of an async job: the provider's
    /// job id (the core keeps only its SHA-256) and the status its answer
    /// reported (`queued`, `in_progress`, `completed`, …).
    pub fn set_job(&mut self, id: Option<String>, status: Option<String>) -> Out<()> {
        let status = match status {
            Some(s) => Some(lift(retryledger_core::job::JobStatus::parse(&s))?),
            None => None,
        };
        self.session.set_job(id.as_deref(), status);
        Ok(())
    }

    /// Report the receiver's answer for the attempt in flight, reconciled by
    /// idempotency key (`succeeded`, `failed_no_effect`, `unknown`).
    pub fn set_reconciled(&mut self, answer: &str) -> Out<()> {
        let answer = lift(retryledger_core::job::reconciled_named(answer))?;
        self.session.set_reconciled(answer);
        Ok(())
    }

    /// Continue the run a journal (JSON text of its events) holds: the core
    /// verifies it against this session's policy; only a fresh session resumes.
    pub fn resume_journal(&mut self, events: &str) -> Out<()> {
        lift(api::session_resume_journal(&mut self.session, events))
    }

    /// Mark the run cancelled between attempts at `at_ms` on the run clock.
    pub fn cancel(&mut self, at_ms: f64) -> Out<()> {
        let at = lift(safe_integer(at_ms, "cancelled_at_ms"))?;
        lift(self.session.cancel(at))
    }

    /// The attempts so far as JSON.
    pub fn attempts_json(&self) -> String {
        canonical_json(self.session.attempts())
    }

    /// The last recorded attempt as JSON.
    pub fn last_attempt_json(&self) -> Option<String> {
        self.session.attempts().attempts.last().map(canonical_json)
    }

    /// The receipt of the finished run as JSON (`run_not_terminal` before).
    pub fn receipt_json(&self) -> Out<String> {
        lift(self.session.receipt().map(|r| canonical_json(&r)))
    }

    /// The receipt as JSON, given the host's SHA-256 of `attempts_json()`.
    pub fn receipt_json_hashed(&self, attempts_sha256: &str) -> Out<String> {
        lift(
            self.session
                .receipt_with_attempts_sha256(attempts_sha256)
                .map(|r| canonical_json(&r)),
        )
    }
}

/// `lower_request`: a conversation request lowered for a route release under
/// options (`{"api", "body", "body_sha256", "model", "notes"}`), or why the
/// route cannot serve it.
#[wasm_bindgen]
pub fn lower_request(request: &str, release: &str, options: &str) -> Out<String> {
    lift(api::lower_request(request, release, options))
}

/// `route_capabilities`: whether each route of a policy spec can serve a request.
#[wasm_bindgen]
pub fn route_capabilities(request: &str, spec: &str) -> Out<String> {
    lift(api::route_capabilities(request, spec))
}
