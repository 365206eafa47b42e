//! `repair.json`: output checks judged by the core's table, and bounded
//! semantic repair (chains of a request and its repairs).

use std::sync::Arc;

use retryledger_core::api;
use retryledger_core::canonical::to_value;
use retryledger_core::decode::from_value;
use retryledger_core::evaluate::Decision;
use retryledger_core::observe::Facts;
use retryledger_core::output::{
    MAX_DEFECTS, MAX_DEFECT_MESSAGE_BYTES, MAX_DEFECT_PATH_BYTES, MAX_OUTPUT_CHECKS,
};
use retryledger_core::policy::{compile, Policy};
use retryledger_core::session::Session;
use serde_json::{json, Value};

use crate::common::{id, policy_with, set, t};
use crate::drivers::KEY as DRIVER_KEY;
use crate::family::Family;

fn defects(kind: &str, validator: &str, messages: &[&str]) -> Value {
    let list: Vec<Value> = messages.iter().map(|m| json!({"message": m})).collect();
    json!({"defects": list, "kind": kind, "validator": validator, "verdict": "defects"})
}

fn pass(kind: &str, validator: &str) -> Value {
    json!({"kind": kind, "validator": validator, "verdict": "pass"})
}

fn returned(checks: Vec<Value>) -> Value {
    json!({"result": "returned", "output_checks": checks})
}

fn invalid() -> Value {
    returned(vec![defects(
        "schema",
        "summary-model",
        &["field required: /title"],
    )])
}

fn ok() -> Value {
    returned(vec![pass("schema", "summary-model")])
}

fn down() -> Value {
    json!({"result": "raised", "status": 503})
}

/// A session over facts: each attempt starts at its earliest start, takes
/// 100 ms and costs `cost` (its reservation when `None`); the sealed bundle.
fn checked(policy: &Value, script: &[(Value, Option<u64>)]) -> Value {
    let p: Policy = from_value(policy.clone()).expect("policy");
    let mut s = Session::start(Arc::new(compile(p).expect("a valid policy")));
    for (facts, cost) in script {
        let Decision::Dispatch(d) = s.next() else {
            break;
        };
        let started = d.not_before_ms;
        let f: Facts = from_value(facts.clone()).expect("facts");
        s.observe(started, started + 100, *cost, &f)
            .expect("observed");
    }
    match s.seal() {
        Ok(bundle) => to_value(&bundle),
        // A run still going: its attempts so far.
        Err(_) => json!({"attempts": to_value(s.attempts())}),
    }
}

fn with_repair(max_repairs: u64, share: u64) -> Value {
    policy_with(&[(
        "/repair",
        json!({"cost_share_percent": share, "max_repairs": max_repairs}),
    )])
}

fn root(bundle: Value) -> Value {
    json!({"bundle": bundle, "started_at_ms": 0})
}

fn end_of(link: &Value) -> u64 {
    link["started_at_ms"].as_u64().unwrap()
        + link["bundle"]["receipt"]["finished_at_ms"]
            .as_u64()
            .unwrap()
}

fn request(n: u64) -> String {
    id(&format!("request: summarize incident INC-4471, repair {n}"))
}

fn key(n: u64) -> String {
    id(&format!(
        "idempotency-key: tenant-7/op-summarize/INC-4471:repair:{n}"
    ))
}

/// The next repair's policy as the core derives it.
fn derived(links: &[Value], n: u64, started: u64) -> Value {
    let text =
        api::next_repair(&t(&json!(links)), &request(n), &key(n), started).expect("a repair");
    serde_json::from_str(&text).expect("json")
}

/// Append repair `n` (its run under the derived policy) to `links`.
fn repaired(links: &mut Vec<Value>, script: &[(Value, Option<u64>)]) {
    let n = links.len() as u64;
    let parent = links.last().unwrap();
    let started = end_of(parent) + 10;
    let parent_request = parent["bundle"]["policy"]["logical_request_sha256"].clone();
    let policy = derived(links, n, started);
    links.push(json!({
        "bundle": checked(&policy, script),
        "parent_request_sha256": parent_request,
        "repair_ordinal": n,
        "started_at_ms": started,
    }));
}

/// A `drive` case's input (as `drivers.json` has them; not cancellable, no classify hook).
fn f_drive_input(policy: &str, script: Vec<Value>) -> Vec<(&'static str, Value)> {
    vec![
        ("cancellable", json!(false)),
        ("idempotency_key", json!(DRIVER_KEY)),
        ("now_unix_ms", json!(crate::common::NOW)),
        ("policy", json!(policy)),
        ("script", json!(script)),
    ]
}

fn chain(links: &[Value]) -> String {
    t(&json!({"links": links, "schema": "retryledger.repair_chain.v1"}))
}

pub fn family() -> Family {
    let mut f = Family::new(
        "repair",
        "Output checks (the verdicts of the host's validators, judged by the core's table) and bounded semantic repair (a request and its repairs as a chain, replayed).",
        "judge with each built-in output check (empty, unparsable_json, truncated, refusal) and a user schema check, passes, the table's precedence (refusal first), checks ignored on a raise, and verdicts that are not one or over their bounds; a refusal stops without a fallback (plan, evaluate) while a 503 falls back; an attempt's output check record replayed and its drift; the repair policy section's rules; next_repair's derived policy (deadline and cost left) and each reason for no repair; chains of one and two repairs, max_repairs at and past its bound, the repairs' cost share spent, the deadline passed, and the three replay rejections (beyond the budget, after a terminal other than invalid_output, the parent's request again), plus chain drift (ordinal, parent, start, policy, a tampered bundle)",
    );

    // ---- output checks, judged --------------------------------------------
    let j = |v: Value| t(&v);
    for (name, facts, want) in [
        (
            "judge_output_all_pass",
            returned(vec![
                pass("empty", "builtin.empty"),
                pass("schema", "summary-model"),
            ]),
            "returned",
        ),
        (
            "judge_output_empty",
            returned(vec![defects(
                "empty",
                "builtin.empty",
                &["the answer has no content"],
            )]),
            "output_check",
        ),
        (
            "judge_output_unparsable_json",
            returned(vec![defects(
                "unparsable_json",
                "builtin.json",
                &["Expecting value: line 1 column 1"],
            )]),
            "invalid_output",
        ),
        (
            "judge_output_truncated",
            returned(vec![defects(
                "truncated",
                "openai.finish_reason",
                &["finish_reason: length"],
            )]),
            "invalid_output",
        ),
        (
            "judge_output_truncated_anthropic",
            returned(vec![defects(
                "truncated",
                "anthropic.stop_reason",
                &["stop_reason: max_tokens"],
            )]),
            "invalid_output",
        ),
        (
            "judge_output_refusal_openai",
            returned(vec![defects(
                "refusal",
                "openai.refusal",
                &["I can't help with that."],
            )]),
            "policy_denied",
        ),
        (
            "judge_output_refusal_anthropic",
            returned(vec![defects(
                "refusal",
                "anthropic.stop_reason",
                &["stop_reason: refusal"],
            )]),
            "policy_denied",
        ),
        ("judge_output_schema", invalid(), "invalid_output"),
        (
            "judge_output_refusal_before_schema",
            returned(vec![
                defects("schema", "summary-model", &["x"]),
                defects("refusal", "openai.refusal", &["no"]),
            ]),
            "policy_denied",
        ),
        (
            "judge_output_truncated_and_unparsable",
            returned(vec![
                defects("unparsable_json", "builtin.json", &["EOF"]),
                defects("truncated", "openai.finish_reason", &["length"]),
            ]),
            "invalid_output",
        ),
        (
            "judge_output_ignored_on_raise",
            json!({"result": "raised", "status": 503, "output_checks": [defects("empty", "builtin.empty", &["no content"])]}),
            "unavailable",
        ),
    ] {
        f.judge(name, &j(facts), want);
    }
    let long_message = "m".repeat(MAX_DEFECT_MESSAGE_BYTES + 1);
    let long_path = "p".repeat(MAX_DEFECT_PATH_BYTES + 1);
    let many: Vec<Value> = (0..=MAX_DEFECTS)
        .map(|i| json!({"message": format!("defect {i}")}))
        .collect();
    let checks: Vec<Value> = (0..=MAX_OUTPUT_CHECKS)
        .map(|_| pass("schema", "v"))
        .collect();
    for (name, facts, want) in [
        (
            "judge_output_verdict_unknown",
            returned(vec![
                json!({"kind": "schema", "validator": "v", "verdict": "maybe"}),
            ]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_verdict_not_a_string",
            returned(vec![
                json!({"kind": "schema", "validator": "v", "verdict": true}),
            ]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_kind_unknown",
            returned(vec![
                json!({"kind": "vibes", "validator": "v", "verdict": "pass"}),
            ]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_defects_without_any",
            returned(vec![
                json!({"defects": [], "kind": "schema", "validator": "v", "verdict": "defects"}),
            ]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_pass_with_defects",
            returned(vec![
                json!({"defects": [{"message": "m"}], "kind": "schema", "validator": "v", "verdict": "pass"}),
            ]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_validator_empty",
            returned(vec![pass("schema", "")]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_validator_missing",
            returned(vec![json!({"kind": "schema", "verdict": "pass"})]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_not_an_object",
            returned(vec![json!(42)]),
            "output_verdict_invalid",
        ),
        (
            "judge_output_too_many_defects",
            returned(vec![
                json!({"defects": many, "kind": "schema", "validator": "v", "verdict": "defects"}),
            ]),
            "output_defects_over_bound",
        ),
        (
            "judge_output_message_too_long",
            returned(vec![defects("schema", "v", &[long_message.as_str()])]),
            "output_defects_over_bound",
        ),
        (
            "judge_output_path_too_long",
            returned(vec![
                json!({"defects": [{"message": "m", "path": long_path}], "kind": "schema", "validator": "v", "verdict": "defects"}),
            ]),
            "output_defects_over_bound",
        ),
        (
            "judge_output_too_many_checks",
            returned(checks),
            "output_defects_over_bound",
        ),
        (
            "judge_output_defect_unknown_field",
            returned(vec![
                json!({"defects": [{"message": "m", "value": "secret"}], "kind": "schema", "validator": "v", "verdict": "defects"}),
            ]),
            "unknown_field",
        ),
    ] {
        f.judge(name, &j(facts), want);
    }

    // ---- a refusal stops; it never falls back -----------------------------
    let refusal = returned(vec![defects(
        "refusal",
        "openai.refusal",
        &["I can't help with that."],
    )]);
    let refused = checked(&crate::common::reference(), &[(refusal.clone(), Some(700))]);
    let policy_text = t(&crate::common::reference());
    f.plan(
        "plan_refusal_never_falls_back",
        &policy_text,
        &t(&refused["attempts"]),
        "stop_non_retryable",
    );
    f.eval(
        "eval_refusal_receipt_no_fallback",
        &policy_text,
        &t(&refused["attempts"]),
        "fallback_used\":false",
    );
    let unavailable = checked(
        &crate::common::reference(),
        &[(down(), Some(0)), (down(), Some(0))],
    );
    f.plan(
        "plan_unavailable_falls_back",
        &policy_text,
        &t(&unavailable["attempts"]),
        "external-fallback",
    );
    let schema_failed = checked(&crate::common::reference(), &[(invalid(), Some(700))]);
    f.plan(
        "plan_invalid_output_stops_without_fallback",
        &policy_text,
        &t(&schema_failed["attempts"]),
        "stop_non_retryable",
    );
    f.verify("verify_output_check_record", &t(&refused), "verified");
    let mut forged = schema_failed.clone();
    set(
        &mut forged,
        "/attempts/attempts/0/outcome/kind",
        json!("policy_denied"),
    );
    f.verify(
        "verify_output_check_drift",
        &t(&forged),
        "output_check_drift",
    );

    // ---- the repair section ------------------------------------------------
    f.policy("policy_repair_section", &t(&with_repair(2, 50)), "ok");
    f.policy(
        "policy_repair_max_zero",
        &t(&with_repair(0, 50)),
        "budget_unbounded",
    );
    f.policy(
        "policy_repair_max_over_bound",
        &t(&with_repair(9, 50)),
        "budget_unbounded",
    );
    f.policy(
        "policy_repair_share_over_100",
        &t(&with_repair(2, 101)),
        "invalid_value",
    );
    f.policy(
        "policy_repair_unknown_field",
        &t(&policy_with(&[(
            "/repair",
            json!({"cost_share_percent": 50, "max_repairs": 2, "temperature": 1}),
        )])),
        "unknown_field",
    );

    // ---- next_repair: the derived policy and the reasons for none ---------
    let base = with_repair(2, 50);
    let root_invalid = root(checked(&base, &[(invalid(), Some(700))]));
    let start = end_of(&root_invalid) + 10;
    let next = |f: &mut Family,
                name: &str,
                links: &[Value],
                n: u64,
                req: &str,
                started: u64,
                want: &str| {
        f.add(
            name,
            "next_repair",
            vec![
                ("links", json!(t(&json!(links)))),
                ("request_sha256", json!(req)),
                ("idempotency_key_sha256", json!(key(n))),
                ("started_at_ms", json!(started)),
            ],
            want,
        );
    };
    next(
        &mut f,
        "next_repair_derived_policy",
        std::slice::from_ref(&root_invalid),
        1,
        &request(1),
        start,
        "max_total_cost\":5000",
    );
    next(
        &mut f,
        "next_repair_deadline_left",
        std::slice::from_ref(&root_invalid),
        1,
        &request(1),
        start,
        &format!("deadline_ms\":{}", 5000 - start),
    );
    next(
        &mut f,
        "next_repair_same_request",
        std::slice::from_ref(&root_invalid),
        1,
        &id("request: summarize incident INC-4471 from screenshot"),
        start,
        "repair_same_request",
    );
    next(
        &mut f,
        "next_repair_before_parent_ended",
        std::slice::from_ref(&root_invalid),
        1,
        &request(1),
        50,
        "repair_chain_drift",
    );
    next(
        &mut f,
        "next_repair_no_time_left",
        std::slice::from_ref(&root_invalid),
        1,
        &request(1),
        5000,
        "repair_over_budget",
    );
    let root_refused = root(checked(&base, &[(refusal.clone(), Some(700))]));
    next(
        &mut f,
        "next_repair_after_refusal",
        std::slice::from_ref(&root_refused),
        1,
        &request(1),
        start,
        "repair_after_terminal",
    );
    let root_ok = root(checked(&base, &[(ok(), Some(700))]));
    next(
        &mut f,
        "next_repair_after_success",
        std::slice::from_ref(&root_ok),
        1,
        &request(1),
        start,
        "repair_after_terminal",
    );
    let no_section = root(checked(
        &crate::common::reference(),
        &[(invalid(), Some(700))],
    ));
    next(
        &mut f,
        "next_repair_without_section",
        std::slice::from_ref(&no_section),
        1,
        &request(1),
        start,
        "repair_not_allowed",
    );
    let zero_share = root(checked(&with_repair(2, 0), &[(invalid(), Some(700))]));
    next(
        &mut f,
        "next_repair_zero_share",
        &[zero_share],
        1,
        &request(1),
        start,
        "repair_over_budget",
    );
    next(
        &mut f,
        "next_repair_bad_digest",
        std::slice::from_ref(&root_invalid),
        1,
        "not-a-digest",
        start,
        "invalid_digest",
    );

    // ---- chains --------------------------------------------------------------
    f.add(
        "chain_root_only",
        "verify_repair_chain",
        vec![("chain", json!(chain(std::slice::from_ref(&root_ok))))],
        "repairs\":0",
    );

    let mut one = vec![root_invalid.clone()];
    repaired(&mut one, &[(ok(), Some(900))]);
    f.add(
        "chain_one_repair_completes",
        "verify_repair_chain",
        vec![("chain", json!(chain(&one)))],
        "repairs\":1",
    );

    let mut two = vec![root_invalid.clone()];
    repaired(
        &mut two,
        &[(
            returned(vec![defects("empty", "builtin.empty", &["no content"])]),
            Some(900),
        )],
    );
    repaired(&mut two, &[(down(), Some(0)), (ok(), Some(900))]);
    f.add(
        "chain_two_repairs_completes",
        "verify_repair_chain",
        vec![("chain", json!(chain(&two)))],
        "completed",
    );

    // max_repairs at its bound, then past it.
    let one_allowed = with_repair(1, 50);
    let mut at_max = vec![root(checked(&one_allowed, &[(invalid(), Some(700))]))];
    repaired(&mut at_max, &[(invalid(), Some(900))]);
    f.add(
        "chain_max_repairs_exactly",
        "verify_repair_chain",
        vec![("chain", json!(chain(&at_max)))],
        "stop_non_retryable",
    );
    let mut beyond = at_max.clone();
    {
        // A second repair, built as if the budget allowed it (the policy the
        // first repair ran under, with the next request).
        let last = beyond.last().unwrap().clone();
        let started = end_of(&last) + 10;
        let mut policy = last["bundle"]["policy"].clone();
        set(&mut policy, "/logical_request_sha256", json!(request(2)));
        set(&mut policy, "/idempotency_key_sha256", json!(key(2)));
        beyond.push(json!({
            "bundle": checked(&policy, &[(ok(), Some(900))]),
            "parent_request_sha256": last["bundle"]["policy"]["logical_request_sha256"],
            "repair_ordinal": 2,
            "started_at_ms": started,
        }));
    }
    f.add(
        "chain_repair_beyond_max_repairs",
        "verify_repair_chain",
        vec![("chain", json!(chain(&beyond)))],
        "repair_over_budget",
    );
    next(
        &mut f,
        "next_repair_beyond_max_repairs",
        &at_max,
        2,
        &request(2),
        end_of(at_max.last().unwrap()) + 10,
        "repair_over_budget",
    );

    // The repairs' share of the cost budget: 30% of 10,000 is 3,000.
    let thirty = with_repair(3, 30);
    let mut share = vec![root(checked(&thirty, &[(invalid(), Some(700))]))];
    repaired(&mut share, &[(invalid(), Some(3000))]);
    f.add(
        "chain_cost_share_spent_exactly",
        "verify_repair_chain",
        vec![("chain", json!(chain(&share)))],
        "total_cost\":3700",
    );
    next(
        &mut f,
        "next_repair_cost_share_spent",
        &share,
        2,
        &request(2),
        end_of(share.last().unwrap()) + 10,
        "repair_over_budget",
    );

    // The three replay rejections.
    let after_refusal = {
        let mut links = vec![root_refused.clone()];
        let mut policy = base.clone();
        set(&mut policy, "/logical_request_sha256", json!(request(1)));
        set(&mut policy, "/idempotency_key_sha256", json!(key(1)));
        set(&mut policy, "/deadline_ms", json!(5000 - start));
        set(&mut policy, "/max_total_cost", json!(5000));
        links.push(json!({
            "bundle": checked(&policy, &[(ok(), Some(900))]),
            "parent_request_sha256": links[0]["bundle"]["policy"]["logical_request_sha256"],
            "repair_ordinal": 1,
            "started_at_ms": start,
        }));
        links
    };
    f.add(
        "chain_repair_after_refusal",
        "verify_repair_chain",
        vec![("chain", json!(chain(&after_refusal)))],
        "repair_after_terminal",
    );
    let after_success = {
        let mut links = after_refusal.clone();
        links[0] = root_ok.clone();
        links[1]["parent_request_sha256"] =
            root_ok["bundle"]["policy"]["logical_request_sha256"].clone();
        links
    };
    f.add(
        "chain_repair_after_success",
        "verify_repair_chain",
        vec![("chain", json!(chain(&after_success)))],
        "repair_after_terminal",
    );
    let same_request = {
        let mut links = vec![root_invalid.clone()];
        let mut policy = base.clone();
        set(&mut policy, "/deadline_ms", json!(5000 - start));
        set(&mut policy, "/max_total_cost", json!(5000));
        links.push(json!({
            "bundle": checked(&policy, &[(ok(), Some(900))]),
            "parent_request_sha256": links[0]["bundle"]["policy"]["logical_request_sha256"],
            "repair_ordinal": 1,
            "started_at_ms": start,
        }));
        links
    };
    f.add(
        "chain_repair_same_request",
        "verify_repair_chain",
        vec![("chain", json!(chain(&same_request)))],
        "repair_same_request",
    );

    // Chain drift.
    let mut wrong_ordinal = one.clone();
    wrong_ordinal[1]["repair_ordinal"] = json!(2);
    f.add(
        "chain_wrong_ordinal",
        "verify_repair_chain",
        vec![("chain", json!(chain(&wrong_ordinal)))],
        "repair_chain_drift",
    );
    let mut wrong_parent = one.clone();
    wrong_parent[1]["parent_request_sha256"] = json!(request(9));
    f.add(
        "chain_wrong_parent",
        "verify_repair_chain",
        vec![("chain", json!(chain(&wrong_parent)))],
        "repair_chain_drift",
    );
    let mut early = one.clone();
    early[1]["started_at_ms"] = json!(50);
    f.add(
        "chain_repair_starts_before_parent_ended",
        "verify_repair_chain",
        vec![("chain", json!(chain(&early)))],
        "repair_chain_drift",
    );
    let mut merged_budget = one.clone();
    merged_budget[1]["bundle"] = checked(
        &{
            let mut p = one[1]["bundle"]["policy"].clone();
            set(&mut p, "/max_total_cost", json!(10000));
            p
        },
        &[(ok(), Some(900))],
    );
    f.add(
        "chain_repair_with_merged_budget",
        "verify_repair_chain",
        vec![("chain", json!(chain(&merged_budget)))],
        "repair_chain_drift",
    );
    let mut rooted = one.clone();
    rooted[0]["repair_ordinal"] = json!(0);
    f.add(
        "chain_root_with_ordinal",
        "verify_repair_chain",
        vec![("chain", json!(chain(&rooted)))],
        "repair_chain_drift",
    );
    let mut tampered = one.clone();
    tampered[1]["bundle"]["receipt"]["total_cost"] = json!(1);
    f.add(
        "chain_tampered_receipt",
        "verify_repair_chain",
        vec![("chain", json!(chain(&tampered)))],
        "receipt_mismatch",
    );
    let mut too_many = vec![root_invalid.clone()];
    too_many.extend(std::iter::repeat_n(one[1].clone(), 9));
    f.add(
        "chain_too_many_links",
        "verify_repair_chain",
        vec![("chain", json!(chain(&too_many)))],
        "too_many_items",
    );
    // ---- the drivers with an output check (replayed by both drivers) ---------
    let driven = t(&policy_with(&[(
        "/idempotency_key_sha256",
        json!(id(DRIVER_KEY)),
    )]));
    let answer = |verdict: Value| json!({"duration_ms": 40, "returns": "{}", "verdict": verdict});
    let unavailable = json!({"duration_ms": 30, "raises": {"types": ["APIStatusError", "APIError"], "status": 503}});
    for (name, script, want) in [
        (
            "drive_output_check_passes",
            vec![answer(pass("schema", "script"))],
            "completed",
        ),
        (
            "drive_output_invalid_stops",
            vec![answer(defects(
                "schema",
                "script",
                &["/severity: required"],
            ))],
            "output_check",
        ),
        (
            "drive_refusal_never_falls_back",
            vec![answer(defects(
                "refusal",
                "script",
                &["I can't help with that."],
            ))],
            "policy_denied",
        ),
        (
            "drive_retry_then_invalid_output",
            vec![
                unavailable.clone(),
                answer(defects("empty", "script", &["no content"])),
            ],
            "invalid_output",
        ),
        (
            "drive_verdict_not_one_is_unrecognized",
            vec![answer(
                json!({"kind": "schema", "validator": "script", "verdict": "maybe"}),
            )],
            "UnrecognizedDispatchError",
        ),
    ] {
        let input = f_drive_input(&driven, script);
        f.add(name, "drive", input, want);
    }
    f.add(
        "chain_schema_mismatch",
        "verify_repair_chain",
        vec![(
            "chain",
            json!(t(
                &json!({"links": [root_ok], "schema": "retryledger.repair_chain.v2"})
            )),
        )],
        "schema_mismatch",
    );
    f
}
