//! `admission.json`: admission limits (attempts in flight, request and token
//! buckets, the queue bound) and runs admitted under them.
//!
//! `admission_admit` / `admission_release` cases pin the pure transitions
//! (a burst, a planned queue, the queue bound, a full in-flight cap, token
//! reservations and their settlement, a clock behind the snapshot, scoped
//! keys, malformed snapshots); `validate_policy` cases pin the section's
//! bad input; `verify_bundle` cases replay runs admitted under the limits
//! (at once, queued, stopped by the queue bound or the deadline) and
//! tampered admissions.

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{id, policy_with, t, NOW_2026};
use crate::family::Family;

mod admit;
mod observe;
mod release;
mod run;

use admit::admit_cases;
use observe::observe_cases;
use release::release_cases;
use run::run_cases;

const T0: u64 = NOW_2026;

fn primary() -> String {
    id("release: private-primary")
}

/// In flight 2, 10 requests per second with a burst of 2, queue 1 s.
fn cfg() -> Value {
    json!({"max_in_flight": 2, "max_queue_ms": 1_000, "request_burst": 2, "requests_per_second": 10})
}

fn tokens_cfg() -> Value {
    json!({"max_queue_ms": 1_000, "token_bound": 100, "tokens_per_second": 100})
}

/// A snapshot of the primary's key with its fields edited (full buckets of
/// `cfg()`, nothing in flight, at T0).
fn snap(edits: &[(&str, Value)]) -> Value {
    let mut s = json!({
        "generation": 0, "in_flight": 0, "request_level_milli": 2_000, "requests_at_epoch_ms": T0,
        "route_release_sha256": primary(), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": T0, "updated_at_epoch_ms": T0,
    });
    for (k, v) in edits {
        s[*k] = v.clone();
    }
    s
}

pub fn family() -> Family {
    let mut f = Family::new(
        "admission",
        "admission_admit / admission_release / admission_observe: the pure transitions of admission limits (attempts in flight, request and token buckets, the queue bound); validate_policy: the section's bad input; verify_bundle: runs admitted under the limits and tampered admissions.",
        "a burst then a planned queue, the queue's tail in the future, the queue bound, a full in-flight cap (wait, then refusal; presumed lost after its lease), token reservations (now, planned, over the bound) and their settlement (unused back, overuse taken, no report), refill capped at the burst, a clock behind the snapshot, tenant and principal keys, another key's or an overfull snapshot; rate-limit headers observed on a response (OpenAI, Anthropic and IETF forms: a lower remaining lowers a bucket, an exhausted one with a reset empties it until the reset, never earlier than reserved, also an unconfigured bucket; garbage, past and absurdly far resets ignored and noted; no header keeps the snapshot); a limit, queue bound or burst of 0, a token rate without a bound and the reverse, a rate without a burst, no limit, a principal without a tenant; runs admitted at once, queued behind a spent bucket, retried after a release, stopped by the queue bound and by the deadline; tampered queue waits, starts, tokens, snapshots and stops",
    );
    admit_cases(&mut f);
    release_cases(&mut f);
    observe_cases(&mut f);
    policy_cases(&mut f);
    run_cases(&mut f);
    f
}

#[allow(clippy::too_many_arguments)] // one argument per input of the case
fn admit(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    now: u64,
    since: u64,
    tokens: u64,
    want: &str,
) {
    f.add(
        name,
        "admission_admit",
        vec![
            ("config", json!(t(c))),
            ("snapshot", json!(t(s))),
            ("now_epoch_ms", json!(now)),
            ("queued_since_epoch_ms", json!(since)),
            ("tokens", json!(tokens)),
        ],
        want,
    );
}

#[allow(clippy::too_many_arguments)] // one argument per input of the case
fn release(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    now: u64,
    reserved: u64,
    used: Option<u64>,
    want: &str,
) {
    let mut input = vec![
        ("config", json!(t(c))),
        ("snapshot", json!(t(s))),
        ("now_epoch_ms", json!(now)),
        ("reserved", json!(reserved)),
    ];
    if let Some(u) = used {
        input.push(("used", json!(u)));
    }
    f.add(name, "admission_release", input, want);
}

fn policy_cases(f: &mut Family) {
    let with = |a: Value| {
        t(&policy_with(&[(
            "/fleet",
            json!({"admission": a, "on_store_unavailable": "fail_closed"}),
        )]))
    };
    for (name, a, want) in [
        (
            "admission_policy_in_flight_zero",
            json!({"max_in_flight": 0, "max_queue_ms": 100}),
            "path\":\"/fleet/admission/max_in_flight\"",
        ),
        (
            "admission_policy_queue_bound_zero",
            json!({"max_in_flight": 4, "max_queue_ms": 0}),
            "path\":\"/fleet/admission/max_queue_ms\"",
        ),
        (
            "admission_policy_queue_bound_over_a_day",
            json!({"max_in_flight": 4, "max_queue_ms": 86_400_001u64}),
            "path\":\"/fleet/admission/max_queue_ms\"",
        ),
        (
            "admission_policy_token_rate_without_bound",
            json!({"max_queue_ms": 100, "tokens_per_second": 1_000}),
            "path\":\"/fleet/admission/token_bound\"",
        ),
        (
            "admission_policy_token_bound_without_rate",
            json!({"max_queue_ms": 100, "token_bound": 1_000}),
            "path\":\"/fleet/admission/tokens_per_second\"",
        ),
        (
            "admission_policy_token_rate_zero",
            json!({"max_queue_ms": 100, "token_bound": 10, "tokens_per_second": 0}),
            "path\":\"/fleet/admission/tokens_per_second\"",
        ),
        (
            "admission_policy_rate_without_burst",
            json!({"max_queue_ms": 100, "requests_per_second": 20}),
            "path\":\"/fleet/admission/request_burst\"",
        ),
        (
            "admission_policy_burst_zero",
            json!({"max_queue_ms": 100, "request_burst": 0, "requests_per_second": 20}),
            "path\":\"/fleet/admission/request_burst\"",
        ),
        (
            "admission_policy_rate_zero",
            json!({"max_queue_ms": 100, "request_burst": 1, "requests_per_second": 0}),
            "path\":\"/fleet/admission/requests_per_second\"",
        ),
        (
            "admission_policy_no_limit",
            json!({"max_queue_ms": 100}),
            "invalid_admission",
        ),
        (
            "admission_policy_lease_without_a_cap",
            json!({"in_flight_lease_ms": 1_000, "max_queue_ms": 100, "request_burst": 1, "requests_per_second": 1}),
            "path\":\"/fleet/admission/in_flight_lease_ms\"",
        ),
        (
            "admission_policy_lease_zero",
            json!({"in_flight_lease_ms": 0, "max_in_flight": 1, "max_queue_ms": 100}),
            "path\":\"/fleet/admission/in_flight_lease_ms\"",
        ),
        (
            "admission_policy_principal_without_tenant",
            json!({"max_in_flight": 1, "max_queue_ms": 100, "principal": "user-42"}),
            "path\":\"/fleet/admission/principal\"",
        ),
        (
            "admission_policy_unknown_field",
            json!({"max_in_flight": 1, "max_queue_ms": 100, "max_queue": 3}),
            "error",
        ),
        (
            "admission_policy_valid_scoped",
            json!({"max_in_flight": 4, "max_queue_ms": 2_000, "principal": "user-42", "request_burst": 1, "requests_per_second": 20, "tenant": "tenant-7", "token_bound": 50_000, "tokens_per_second": 10_000}),
            "ok",
        ),
    ] {
        f.policy(name, &with(a), want);
    }
    let alone = t(&policy_with(&[(
        "/fleet",
        json!({"admission": cfg(), "on_store_unavailable": "fail_open"}),
    )]));
    f.policy("admission_policy_alone_in_the_fleet_section", &alone, "ok");
}

fn observe(duration: u64, facts: Value) -> Value {
    json!({"observe": {"duration_ms": duration, "facts": facts}})
}
fn succeeds() -> Value {
    observe(40, json!({"result": "returned"}))
}
fn fails() -> Value {
    observe(40, json!({"result": "raised", "status": 503}))
}
fn at(epoch: u64) -> Value {
    json!({ "admit": epoch })
}

fn digest(v: &Value) -> String {
    api::digest(&t(v)).expect("a document")
}

fn resealed(mut b: Value) -> Value {
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    b
}

/// Re-seal when the run still replays (else the bundle as it stands).
fn resealed_or(b: Value) -> Value {
    match api::evaluate(&t(&b["policy"]), &t(&b["attempts"])) {
        Ok(_) => resealed(b),
        Err(_) => b,
    }
}
