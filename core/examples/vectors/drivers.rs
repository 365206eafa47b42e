//! `drivers.json`: the host contract, replayed by both drivers.
//!
//! `drive` cases are scripts that the TypeScript and Python drivers replay
//! with a fake clock (docs/HOSTS.md). The expectation is computed here by the
//! reference host below: the loop every driver runs (sleep until
//! `not_before_ms`, dispatch once, extract facts, `Session::observe`, seal),
//! with the script standing in for the user's dispatch. `judge` cases pin the
//! classifier's tables and rule order directly.

use std::sync::Arc;

use retryledger_core::canonical::{sha256_hex, to_value};
use retryledger_core::decode::from_value;
use retryledger_core::evaluate::Decision;
use retryledger_core::observe::{Facts, Rule};
use retryledger_core::{api, Session};
use serde_json::{json, Value};

use crate::common::{id, policy_with, set, single_route, t, NOW};
use crate::family::Family;

/// The raw idempotency key of every driver case.
pub const KEY: &str = "driver-key: tenant-7/op-1";

/// An error as a script describes it (see docs/HOSTS.md).
fn chain(error: &Value, types: &mut Vec<String>, codes: &mut Vec<String>) {
    for n in error["types"].as_array().into_iter().flatten() {
        types.push(n.as_str().expect("type name").to_owned());
    }
    if let Some(c) = error["code"].as_str() {
        codes.push(c.to_owned());
    }
    if let Some(cause) = error.get("cause") {
        chain(cause, types, codes);
    }
}

/// The facts a host extracts from a raised error.
fn facts_of(error: &Value, classify: &Value, delivered: bool) -> Facts {
    let mut facts = Facts::raised();
    facts.now_unix_ms = NOW;
    facts.response_bytes_received = delivered;
    if let Some(o) = error.get("outcome") {
        facts.outcome = Some(from_value(o.clone()).expect("an outcome"));
        return facts;
    }
    chain(error, &mut facts.error_types, &mut facts.error_codes);
    if let Some(first) = facts.error_types.first() {
        if let Some(o) = classify.get(first) {
            facts.outcome = Some(from_value(o.clone()).expect("an outcome"));
        }
    }
    facts.status = error["status"].as_u64().filter(|s| (100..=599).contains(s));
    if facts.status.is_some_and(|s| !(200..=299).contains(&s)) {
        facts.error_body = error["body"].as_str().map(str::to_owned);
    }
    for pair in error["headers"].as_array().into_iter().flatten() {
        let name = pair[0].as_str().expect("name");
        if retryledger_core::observe::READ_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            facts
                .headers
                .push((name.to_owned(), pair[1].as_str().expect("value").to_owned()));
        }
    }
    facts
}

/// The reference host: replay a script as every driver does; the expectation.
pub fn drive(input: &Value) -> Value {
    let compiled = api::compile_policy(input["policy"].as_str().expect("policy text"))
        .expect("a valid policy");
    let key = input["idempotency_key"].as_str().expect("key");
    if sha256_hex(key.as_bytes()) != compiled.policy.idempotency_key_sha256.as_str() {
        return json!({"error": {"class": "DriftError", "code": "idempotency_key_drift"}, "sleeps": []});
    }
    let classify = input.get("classify").cloned().unwrap_or(json!({}));
    let mut session = Session::start(Arc::new(compiled));
    let mut script = input["script"].as_array().expect("script").iter();
    let (mut now, mut sleeps, mut rules) = (0u64, Vec::new(), Vec::new());
    let (mut result, mut cancelled, mut unrecognized) = (None, false, false);
    while let Decision::Dispatch(d) = session.next().clone() {
        let step = script.next().expect("the script covers every dispatch");
        let overshoot = step["sleep_overshoot_ms"].as_u64().unwrap_or(0);
        if step["cancel_before"] == json!(true) {
            assert!(now < d.not_before_ms, "cancel_before needs a sleep");
            sleeps.push(d.not_before_ms - now);
            session.cancel(now).expect("cancel");
            cancelled = true;
            break;
        }
        while now < d.not_before_ms {
            sleeps.push(d.not_before_ms - now);
            now = d.not_before_ms + overshoot;
        }
        let started = now;
        now += step["duration_ms"].as_u64().expect("duration_ms");
        let cost = step["charge"]
            .as_array()
            .map(|c| c.iter().map(|x| x.as_u64().expect("charge")).sum::<u64>());
        let delivered = step["output_delivered"] == json!(true);
        let facts = if step["cancel_during"] == json!(true) {
            cancelled = true;
            let mut f = Facts::raised();
            f.now_unix_ms = NOW;
            f.cancelled = true;
            f.response_bytes_received = delivered;
            f
        } else if let Some(v) = step.get("returns") {
            result = Some(v.clone());
            match step.get("verdict") {
                // The host's output check answered this verdict (docs/REPAIR.md):
                // the core decodes it, or the answer is unrecognized.
                Some(verdict) => {
                    from_value::<Facts>(json!({"result": "returned", "output_checks": [verdict]}))
                        .unwrap_or_else(|_| {
                            let mut f = Facts::raised();
                            f.error_types = vec!["OutputCheckError".into()];
                            f
                        })
                }
                None => Facts::returned(),
            }
        } else {
            result = None;
            facts_of(&step["raises"], &classify, delivered)
        };
        let j = session
            .observe(started, now, cost, &facts)
            .expect("no drift");
        unrecognized = j.rule == Rule::Unrecognized;
        rules.push(j.rule.as_str());
        if cancelled {
            break;
        }
    }
    assert!(
        script.next().is_none(),
        "every script step is used: {}",
        input["script"]
    );
    let bundle = session.seal().expect("a finished run");
    let terminal = bundle.receipt.terminal.as_str();
    let mut expect = json!({
        "attempts": to_value(&bundle.attempts),
        "receipt_sha256": retryledger_core::digest(&bundle.receipt),
        "rules": rules,
        "sleeps": sleeps,
        "terminal": terminal,
    });
    let class = if cancelled {
        Some("RunCancelledError")
    } else if terminal == "completed" {
        None
    } else if unrecognized {
        Some("UnrecognizedDispatchError")
    } else {
        Some("RunStoppedError")
    };
    match (class, result) {
        (None, Some(r)) => set(&mut expect, "/result", r),
        (Some(c), _) => set(&mut expect, "/error", json!({"class": c, "code": terminal})),
        (None, None) => panic!("completed without a result"),
    }
    expect
}

fn ok(v: &str) -> Value {
    json!({"duration_ms": 40, "returns": v})
}

fn raise(duration: u64, error: Value) -> Value {
    json!({"duration_ms": duration, "raises": error})
}

fn status(s: u64) -> Value {
    json!({"types": ["APIStatusError", "APIError"], "status": s})
}

fn status_h(s: u64, headers: Value) -> Value {
    json!({"types": ["RateLimitError", "APIStatusError", "APIError"], "status": s, "headers": headers})
}

fn types(names: &[&str]) -> Value {
    json!({ "types": names })
}

fn explicit(outcome: Value) -> Value {
    json!({ "outcome": outcome })
}

/// The reference policy (two routes of two attempts, deadline 5 s) with the drivers' key.
pub fn driver_policy(edits: &[(&str, Value)]) -> String {
    let mut p = policy_with(&[("/idempotency_key_sha256", json!(id(KEY)))]);
    for (ptr, v) in edits {
        set(&mut p, ptr, v.clone());
    }
    t(&p)
}

fn one_route(max: u64, base: u64, max_ms: u64, cap: u64, deadline: u64) -> String {
    let mut p = single_route(max, base, max_ms, cap, deadline);
    set(&mut p, "/idempotency_key_sha256", json!(id(KEY)));
    t(&p)
}

pub fn family() -> Family {
    let mut f = Family::new(
        "drivers",
        "drive: scripts both drivers replay with a fake clock; the same script gives the same sleeps, attempts, receipt digest, terminal, judging rules, result and error in TypeScript and Python.",
        "success first time; the reference run; every HTTP status family (408, 429, 5xx, 501/505, 4xx, 403, 3xx, out of range); SDK and runtime errors by class name and by code along the cause chain (openai/anthropic, httpx, Python builtins, undici, DOM); Retry-After as seconds, milliseconds, HTTP-dates past and future, garbage, above its cap, header case; explicit outcomes and the classify hook; deadline expiry during sleep and during dispatch; cancellation between and during attempts (with output delivered); output delivered before a failure; charge and no charge; cost, attempt and route budgets; jitter; a wrong idempotency key",
    );
    let p = driver_policy(&[]);
    let mut drive = |name: &str, policy: &str, script: Vec<Value>, want: &str| {
        f.drive(name, policy, script, false, None, want);
    };
    drive(
        "driver_success_first_try",
        &p,
        vec![ok("ok-1")],
        "completed",
    );
    drive(
        "driver_reference_run",
        &p,
        vec![
            raise(1_100, status_h(429, json!([["retry-after-ms", "250"]]))),
            raise(100, status(503)),
            ok("ok-3"),
        ],
        "completed",
    );
    for (s, want) in [
        (408, "completed"),
        (429, "completed"),
        (500, "completed"),
        (502, "completed"),
        (503, "completed"),
        (504, "completed"),
        (507, "completed"),
        (501, "stop_non_retryable"),
        (505, "stop_non_retryable"),
        (400, "stop_non_retryable"),
        (401, "stop_non_retryable"),
        (403, "stop_non_retryable"),
        (404, "stop_non_retryable"),
        (409, "stop_non_retryable"),
        (422, "stop_non_retryable"),
        (302, "stop_non_retryable"),
    ] {
        drive(
            &format!("driver_status_{s}"),
            &p,
            vec![raise(30, status(s)), ok("after")]
                .into_iter()
                .take(if want == "completed" { 2 } else { 1 })
                .collect(),
            want,
        );
    }
    // A timeout retried under the same key while the first request still
    // runs: 409 with Retry-After is in progress, asked again on the same
    // route; the replayed answer completes the run.
    let conflict = |hint: &str| json!({"types": ["ConflictError", "APIStatusError", "APIError"], "status": 409, "headers": [["retry-after", hint]]});
    drive(
        "driver_status_409_in_progress_then_replayed",
        &p,
        vec![
            raise(1_000, types(&["TimeoutError"])),
            raise(20, conflict("1")),
            ok("replayed"),
        ],
        "completed",
    );
    drive(
        "driver_status_409_in_progress_until_total_attempts",
        &p,
        vec![
            raise(1_000, types(&["TimeoutError"])),
            raise(20, conflict("1")),
            raise(20, conflict("1")),
            raise(20, conflict("1")),
        ],
        "stop_indeterminate",
    );
    drive(
        "driver_status_409_in_progress_past_the_deadline",
        &p,
        vec![
            raise(3_500, types(&["TimeoutError"])),
            raise(20, conflict("2")),
        ],
        "stop_indeterminate",
    );
    drive(
        "driver_status_422_after_timeout_key_reused",
        &p,
        vec![
            raise(1_000, types(&["TimeoutError"])),
            raise(20, status_h(422, json!([["retry-after", "1"]]))),
        ],
        "stop_non_retryable",
    );
    drive(
        "driver_status_out_of_range_is_unrecognized",
        &p,
        vec![raise(30, json!({"types": ["WeirdError"], "status": 700}))],
        "UnrecognizedDispatchError",
    );
    drive(
        "driver_status_with_success_code_on_an_error_is_unrecognized",
        &p,
        vec![raise(30, json!({"types": ["WeirdError"], "status": 200}))],
        "UnrecognizedDispatchError",
    );
    let by_type: &[(&str, Value, &str)] = &[
        (
            "openai_connection_error_after_connect_failure",
            json!({"types": ["APIConnectionError", "APIError"], "cause": {"types": ["ConnectError", "TransportError"]}}),
            "completed",
        ),
        (
            "openai_connection_error_refused_code_in_cause",
            json!({"types": ["APIConnectionError", "APIError"], "cause": {"types": ["TypeError"], "code": "ECONNREFUSED"}}),
            "completed",
        ),
        (
            "openai_connection_error_reset",
            json!({"types": ["APIConnectionError", "APIError"], "cause": {"types": ["TypeError"], "code": "ECONNRESET"}}),
            "stop_indeterminate",
        ),
        (
            "openai_connection_error_alone",
            types(&["APIConnectionError", "APIError"]),
            "stop_indeterminate",
        ),
        (
            "openai_timeout_python",
            types(&["APITimeoutError", "APIConnectionError", "APIError"]),
            "completed",
        ),
        (
            "openai_timeout_typescript",
            types(&[
                "APIConnectionTimeoutError",
                "APIConnectionError",
                "APIError",
            ]),
            "completed",
        ),
        (
            "openai_response_validation",
            json!({"types": ["APIResponseValidationError", "APIError"], "status": 200}),
            "stop_non_retryable",
        ),
        (
            "openai_user_abort_before_deadline",
            types(&["APIUserAbortError", "APIError"]),
            "stop_indeterminate",
        ),
        (
            "httpx_read_timeout",
            types(&["ReadTimeout", "TimeoutException"]),
            "completed",
        ),
        (
            "httpx_connect_timeout",
            types(&["ConnectTimeout", "TimeoutException"]),
            "completed",
        ),
        (
            "httpx_pool_timeout",
            types(&["PoolTimeout", "TimeoutException"]),
            "completed",
        ),
        (
            "httpx_remote_protocol_error",
            types(&["RemoteProtocolError", "ProtocolError"]),
            "stop_indeterminate",
        ),
        (
            "httpx_read_error",
            types(&["ReadError", "NetworkError"]),
            "stop_indeterminate",
        ),
        (
            "python_connection_refused",
            types(&["ConnectionRefusedError", "ConnectionError", "OSError"]),
            "completed",
        ),
        (
            "python_connection_reset",
            types(&["ConnectionResetError", "ConnectionError", "OSError"]),
            "stop_indeterminate",
        ),
        ("timeout_error", types(&["TimeoutError"]), "completed"),
        (
            "undici_socket_code",
            json!({"types": ["SocketError"], "code": "UND_ERR_SOCKET"}),
            "stop_indeterminate",
        ),
        (
            "undici_connect_timeout_code",
            json!({"types": ["Error"], "code": "UND_ERR_CONNECT_TIMEOUT"}),
            "completed",
        ),
        (
            "node_dns_failure_code",
            json!({"types": ["Error"], "code": "ENOTFOUND"}),
            "completed",
        ),
        (
            "node_etimedout_code",
            json!({"types": ["Error"], "code": "ETIMEDOUT"}),
            "completed",
        ),
        (
            "unknown_exception_never_retried",
            types(&["KeyError", "LookupError"]),
            "UnrecognizedDispatchError",
        ),
        (
            "unknown_code_never_retried",
            json!({"types": ["Error"], "code": "ESOMETHING"}),
            "UnrecognizedDispatchError",
        ),
    ];
    for (name, error, want) in by_type {
        drive(
            &format!("driver_{name}"),
            &p,
            vec![raise(30, error.clone()), ok("after")]
                .into_iter()
                .take(if *want == "completed" { 2 } else { 1 })
                .collect(),
            want,
        );
    }
    let hint = |name: &str, headers: Value, want: &str| (name.to_owned(), headers, want.to_owned());
    for (name, headers, want) in [
        hint("seconds", json!([["Retry-After", "1"]]), "1000"),
        hint(
            "milliseconds_fraction_rounds_up",
            json!([["retry-after-ms", "250.5"]]),
            "251",
        ),
        hint(
            "ms_over_seconds",
            json!([["retry-after", "3"], ["retry-after-ms", "120"]]),
            "120",
        ),
        hint(
            "http_date_future",
            json!([["Retry-After", "Sun, 06 Nov 1994 08:49:39 GMT"]]),
            "2000",
        ),
        hint(
            "http_date_past",
            json!([["Retry-After", "Sun, 06 Nov 1994 08:00:00 GMT"]]),
            "completed",
        ),
        hint(
            "garbage_ignored",
            json!([["Retry-After", "soon"]]),
            "completed",
        ),
        hint(
            "above_cap_recorded_as_sent",
            json!([["Retry-After", "3600"]]),
            "3600000",
        ),
        hint(
            "header_name_case",
            json!([["RETRY-AFTER-MS", "700"]]),
            "700",
        ),
        hint(
            "other_headers_ignored",
            json!([["x-request-id", "abc"], ["retry-after", "0"]]),
            "completed",
        ),
    ] {
        drive(
            &format!("driver_retry_after_{name}"),
            &p,
            vec![raise(50, status_h(429, headers)), ok("after")],
            &want,
        );
    }
    drive(
        "driver_headers_of_a_cause_are_not_read",
        &p,
        vec![
            raise(
                50,
                json!({"types": ["RateLimitError"], "status": 429, "cause": {"types": ["HTTPError"], "headers": [["retry-after", "2"]]}}),
            ),
            ok("after"),
        ],
        "completed",
    );
    let rl = |ms: u64| json!({"class": "retryable", "kind": "rate_limited", "retry_after_ms": ms});
    drive(
        "driver_explicit_retryable_with_hint",
        &p,
        vec![raise(10, explicit(rl(700))), ok("after")],
        "completed",
    );
    drive(
        "driver_explicit_invalid_output",
        &p,
        vec![raise(
            10,
            explicit(json!({"class": "non_retryable", "kind": "invalid_output"})),
        )],
        "stop_non_retryable",
    );
    drive(
        "driver_explicit_indeterminate",
        &p,
        vec![raise(
            10,
            explicit(json!({"class": "indeterminate", "kind": "unknown_provider_acceptance"})),
        )],
        "stop_indeterminate",
    );
    let unavailable = json!({"class": "retryable", "kind": "unavailable"});
    drive(
        "driver_total_attempt_budget",
        &driver_policy(&[("/max_total_attempts", json!(3))]),
        vec![
            raise(10, explicit(unavailable.clone())),
            raise(10, explicit(unavailable.clone())),
            raise(10, explicit(unavailable.clone())),
        ],
        "stop_total_attempts",
    );
    drive(
        "driver_routes_exhausted",
        &p,
        vec![
            raise(10, status(503)),
            raise(10, status(503)),
            raise(10, status(503)),
            raise(10, status(503)),
        ],
        "stop_total_attempts",
    );
    drive(
        "driver_routes_exhausted_before_total",
        &driver_policy(&[("/max_total_attempts", json!(10))]),
        vec![
            raise(10, status(502)),
            raise(10, status(502)),
            raise(10, status(502)),
            raise(10, status(502)),
        ],
        "stop_route_exhausted",
    );
    drive(
        "driver_charged_cost",
        &p,
        vec![
            json!({"duration_ms": 20, "charge": [300, 45], "raises": status(500)}),
            json!({"duration_ms": 20, "charge": [0], "returns": "cheap"}),
        ],
        "completed",
    );
    drive(
        "driver_uncharged_attempt_costs_its_reservation",
        &p,
        vec![raise(20, status(500)), ok("reserved")],
        "completed",
    );
    drive(
        "driver_charge_over_budget_stops",
        &p,
        vec![json!({"duration_ms": 20, "charge": [10_001], "raises": status(500)})],
        "stop_cost_budget",
    );
    drive(
        "driver_late_success_loses",
        &p,
        vec![json!({"duration_ms": 5_000, "returns": "late"})],
        "stop_deadline",
    );
    drive(
        "driver_deadline_during_dispatch_abort_is_a_timeout",
        &p,
        vec![raise(5_200, types(&["AbortError", "DOMException"]))],
        "stop_deadline",
    );
    drive(
        "driver_deadline_during_dispatch_unknown_error_is_a_timeout",
        &p,
        vec![raise(5_001, types(&["KeyError"]))],
        "stop_deadline",
    );
    drive(
        "driver_deadline_reset_after_deadline_stays_indeterminate",
        &p,
        vec![raise(
            5_001,
            types(&["ConnectionResetError", "ConnectionError", "OSError"]),
        )],
        "stop_deadline",
    );
    drive(
        "driver_deadline_during_sleep_overshoot",
        &one_route(3, 1_000, 1_000, 1_000, 2_000),
        vec![
            raise(900, status(503)),
            json!({"sleep_overshoot_ms": 400, "duration_ms": 10, "returns": "too late"}),
        ],
        "stop_deadline",
    );
    drive(
        "driver_deadline_before_dispatch",
        &one_route(3, 1_000, 1_000, 1_000, 1_500),
        vec![raise(600, status(503))],
        "stop_deadline",
    );
    drive(
        "driver_output_delivered_then_reset",
        &p,
        vec![
            json!({"duration_ms": 80, "output_delivered": true, "raises": types(&["ReadError", "NetworkError"])}),
        ],
        "stop_indeterminate",
    );
    drive(
        "driver_output_delivered_then_status",
        &p,
        vec![json!({"duration_ms": 80, "output_delivered": true, "raises": status(503)})],
        "stream_interrupted_after_output",
    );
    drive(
        "driver_output_delivered_then_success",
        &p,
        vec![json!({"duration_ms": 80, "output_delivered": true, "returns": "streamed"})],
        "completed",
    );
    let mut jittered = policy_with(&[("/idempotency_key_sha256", json!(id(KEY)))]);
    set(
        &mut jittered,
        "/jitter",
        json!({"mode": "full", "scheduler_release": "sched-2026.12", "seed": 7}),
    );
    drive(
        "driver_full_jitter_sleeps",
        &t(&jittered),
        vec![
            raise(100, status(503)),
            raise(100, status(503)),
            ok("jittered"),
        ],
        "completed",
    );
    set(
        &mut jittered,
        "/jitter",
        json!({"mode": "decorrelated", "scheduler_release": "sched-2026.12", "seed": 11}),
    );
    drive(
        "driver_decorrelated_jitter_sleeps",
        &t(&jittered),
        vec![
            raise(100, status(503)),
            raise(100, status(503)),
            ok("jittered"),
        ],
        "completed",
    );
    let quota = json!({"QuotaError": {"class": "non_retryable", "kind": "rejected"}, "SoftError": {"class": "success"}});
    f.drive(
        "driver_classify_hook_decides",
        &p,
        vec![raise(10, types(&["QuotaError"]))],
        false,
        Some(quota.clone()),
        "stop_non_retryable",
    );
    f.drive(
        "driver_classify_hook_cannot_make_an_error_a_success",
        &p,
        vec![raise(10, types(&["SoftError"]))],
        false,
        Some(quota.clone()),
        "UnrecognizedDispatchError",
    );
    f.drive(
        "driver_classify_hook_passes_unlisted_errors",
        &p,
        vec![raise(10, status(503)), ok("after")],
        false,
        Some(quota),
        "completed",
    );
    f.drive(
        "driver_cancel_between_attempts",
        &p,
        vec![raise(100, status(503)), json!({"cancel_before": true})],
        true,
        None,
        "stop_cancelled",
    );
    f.drive(
        "driver_cancel_during_attempt",
        &p,
        vec![json!({"duration_ms": 70, "cancel_during": true})],
        true,
        None,
        "unknown_provider_acceptance",
    );
    f.drive(
        "driver_cancel_during_attempt_after_output",
        &p,
        vec![json!({"duration_ms": 70, "cancel_during": true, "output_delivered": true})],
        true,
        None,
        "stream_interrupted_after_output",
    );
    f.drive(
        "driver_cancel_during_second_attempt",
        &p,
        vec![
            raise(100, status(429)),
            json!({"duration_ms": 70, "cancel_during": true}),
        ],
        true,
        None,
        "RunCancelledError",
    );
    // A route that names its provider family: the body decides (docs/PROVIDERS.md).
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let openai = driver_policy(&[("/routes/0/provider_family", json!("openai"))]);
    let quota_error = json!({"types": ["RateLimitError", "APIStatusError", "APIError"], "status": 429, "headers": [["retry-after", "1"]], "body": quota});
    f.drive(
        "driver_provider_openai_insufficient_quota_stops",
        &openai,
        vec![raise(100, quota_error.clone())],
        false,
        None,
        "stop_non_retryable",
    );
    f.drive(
        "driver_provider_body_unread_without_a_family",
        &p,
        vec![raise(100, quota_error), ok("after")],
        false,
        None,
        "completed",
    );
    let google = driver_policy(&[("/routes/0/provider_family", json!("google"))]);
    let gemini = |quota: &str| {
        json!({"types": ["ClientError", "APIError"], "status": 429, "body": t(&json!({"error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": quota}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"},
            ],
        }}))})
    };
    f.drive(
        "driver_provider_google_per_minute_waits_retry_delay",
        &google,
        vec![
            raise(
                100,
                gemini("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"),
            ),
            ok("after"),
        ],
        false,
        None,
        "retry_info",
    );
    f.drive(
        "driver_provider_google_per_day_stops",
        &google,
        vec![raise(
            100,
            gemini("GenerateRequestsPerDayPerProjectPerModel-FreeTier"),
        )],
        false,
        None,
        "stop_non_retryable",
    );
    let anthropic = driver_policy(&[("/routes/0/provider_family", json!("anthropic"))]);
    f.drive(
        "driver_provider_anthropic_overloaded_retries",
        &anthropic,
        vec![
            raise(100, json!({"types": ["OverloadedError", "APIStatusError", "APIError"], "status": 529, "body": r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#})),
            ok("after"),
        ],
        false,
        None,
        "completed",
    );
    let mut wrong = f.drive_input(&p, vec![ok("never")], false, None);
    set(&mut wrong, "/idempotency_key", json!("another key"));
    f.add_drive(
        "driver_wrong_idempotency_key_refused",
        wrong,
        "idempotency_key_drift",
    );
    f
}

impl Family {
    /// The input of a `drive` case.
    pub fn drive_input(
        &self,
        policy: &str,
        script: Vec<Value>,
        cancellable: bool,
        classify: Option<Value>,
    ) -> Value {
        let mut input = json!({
            "cancellable": cancellable,
            "idempotency_key": KEY,
            "now_unix_ms": NOW,
            "policy": policy,
            "script": script,
        });
        if let Some(c) = classify {
            set(&mut input, "/classify", c);
        }
        input
    }

    /// A `drive` case from its input.
    pub fn add_drive(&mut self, name: &str, input: Value, want: &str) {
        let fields = input
            .as_object()
            .expect("an object")
            .iter()
            .map(|(k, v)| (leak(k), v.clone()))
            .collect();
        self.add(name, "drive", fields, want);
    }

    /// A `drive` case.
    pub fn drive(
        &mut self,
        name: &str,
        policy: &str,
        script: Vec<Value>,
        cancellable: bool,
        classify: Option<Value>,
        want: &str,
    ) {
        let input = self.drive_input(policy, script, cancellable, classify);
        self.add_drive(name, input, want);
    }

    /// A `judge` case.
    pub fn judge(&mut self, name: &str, facts: &str, want: &str) {
        self.add(name, "judge", vec![("facts", json!(facts))], want);
    }
}

/// Input keys are `&'static str`; the few drive keys live for the program.
fn leak(k: &str) -> &'static str {
    match k {
        "cancellable" => "cancellable",
        "classify" => "classify",
        "idempotency_key" => "idempotency_key",
        "now_unix_ms" => "now_unix_ms",
        "policy" => "policy",
        "script" => "script",
        other => panic!("unexpected drive input {other}"),
    }
}

/// Rule names that no case shows (the generator refuses to write then).
pub fn rules_missing(families: &[Family]) -> Vec<&'static str> {
    let shown: String = families
        .iter()
        .flat_map(|fam| fam.cases.iter())
        .map(|c| serde_json::to_string(c).expect("json"))
        .collect();
    Rule::NAMES
        .iter()
        .copied()
        .filter(|r| !shown.contains(&format!("\"{r}\"")))
        .collect()
}
