//! The hedge layer's cases of `composition.json`: hedged runs through the
//! run machine (more than one attempt in flight, losers cancelled or late),
//! alone and under a fleet, and the pairs still refused.

use serde_json::{json, Value};

use crate::common::{policy_with, t, NOW_2026};
use crate::composition::{
    breaker, budget, case, full_budget, invalid, limits, ok, options, status, timeout,
};
use crate::family::Family;

/// One hedge of each lead, 300 ms after it, on the fallback route.
fn hedge() -> Value {
    json!({"cancelled_cost": "reserve", "cost_share_percent": 50, "delay_ms": 300,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]})
}

fn hedged(fleet: Option<Value>) -> String {
    let mut edits = vec![("/hedge", hedge())];
    if let Some(f) = fleet {
        edits.push(("/fleet", f));
    }
    t(&policy_with(&edits))
}

/// A step that succeeds `after_ms` after its own start.
fn ok_after(after_ms: u64) -> Value {
    let mut s = ok(false);
    s["after_ms"] = json!(after_ms);
    s
}

/// A loser whose result the host waits for (observed late, never adopted).
fn late(mut step: Value) -> Value {
    step["late"] = json!(true);
    step
}

fn with_after(mut step: Value, after_ms: u64) -> Value {
    step["after_ms"] = json!(after_ms);
    step
}

/// The outcome scripts of a hedged run: each step is one dispatch, in the
/// order sent, `after_ms` from its own start.
fn scripts() -> Vec<(&'static str, Vec<Value>, &'static str)> {
    vec![
        (
            "lead_wins_before_the_hedge",
            vec![ok_after(60)],
            "completed",
        ),
        (
            "hedge_wins_lead_cancelled",
            vec![ok_after(1_000), ok_after(100)],
            "cancel_attempts",
        ),
        (
            "hedge_wins_lead_late",
            vec![late(ok_after(1_000)), ok_after(100)],
            "completed",
        ),
        (
            "lead_wins_hedge_cancelled",
            vec![ok_after(350), ok_after(500)],
            "cancel_attempts",
        ),
        (
            "lead_fails_before_the_hedge_retries",
            vec![status(503, None), ok_after(60)],
            "completed",
        ),
        (
            "round_of_failures_then_retry",
            vec![
                with_after(status(503, None), 400),
                with_after(status(503, None), 200),
                ok_after(60),
            ],
            "completed",
        ),
        (
            "non_retryable_hedge_decides",
            vec![ok_after(1_000), with_after(status(400, None), 100)],
            "stop_non_retryable",
        ),
        (
            "timeout_lead_hedge_wins",
            vec![timeout(), ok_after(800)],
            "completed",
        ),
        (
            "hedge_output_check_fails",
            vec![ok_after(1_000), with_after(invalid(false), 100)],
            "stop_non_retryable",
        ),
    ]
}

/// Hedged runs alone and under a retry budget; the store's conflicts and
/// outages on a hedge's admission; the pairs still refused.
pub fn cases(f: &mut Family) {
    let fleets = [
        ("hedged", None),
        (
            "hedged_budget",
            Some(json!({"on_store_unavailable": "fail_closed", "retry_budget": budget()})),
        ),
        (
            "hedged_breaker",
            Some(json!({"breaker": breaker(), "on_store_unavailable": "fail_closed"})),
        ),
        (
            "hedged_fleet",
            Some(
                json!({"breaker": breaker(), "on_store_unavailable": "fail_closed", "retry_budget": budget()}),
            ),
        ),
        (
            "hedged_limits",
            Some(json!({"admission": limits(), "on_store_unavailable": "fail_open"})),
        ),
        (
            "hedged_all",
            Some(json!({"admission": limits(), "breaker": breaker(),
                "on_store_unavailable": "fail_closed", "retry_budget": budget()})),
        ),
    ];
    for (prefix, fleet) in &fleets {
        let p = hedged(fleet.clone());
        for journal in [false, true] {
            let j = if journal { "_journal" } else { "" };
            for (name, steps, want) in scripts() {
                case(
                    f,
                    &format!("{prefix}{j}_{name}"),
                    &p,
                    &options(journal),
                    None,
                    &json!({"attempts": steps, "store": full_budget()}),
                    want,
                );
            }
            case(
                f,
                &format!("{prefix}{j}_cancelled_between_rounds"),
                &p,
                &options(journal),
                None,
                &json!({"attempts": [status(429, Some("1")), ok(false)], "cancel_sleeps": [0], "store": full_budget()}),
                "stop_cancelled",
            );
        }
    }
    crashes(f);
    open_breakers(f);
    full_limits(f);
    let p = hedged(fleets[1].1.clone());
    let slow = json!([ok_after(1_000), ok_after(100)]);
    // A budget with nothing in it and no floor: the lead deposits half a
    // token, the hedge needs a whole one and is not sent; the lead wins
    // alone.
    let empty = json!({"budget/tenant-7/summaries": {"balance_milli": 0, "deposits": 0, "generation": 0,
        "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
        "updated_at_epoch_ms": NOW_2026, "withdrawals": 0}});
    let mut no_floor = budget();
    no_floor["floor_per_second"] = json!(0);
    let short = hedged(Some(
        json!({"on_store_unavailable": "fail_closed", "retry_budget": no_floor}),
    ));
    case(
        f,
        "hedged_budget_short_refuses_the_hedge_not_the_run",
        &short,
        &options(false),
        None,
        &json!({"attempts": slow, "store": empty}),
        "completed",
    );
    // The hedge's admission write conflicts: read again, decided again.
    case(
        f,
        "hedged_budget_hedge_write_conflict_reads_again",
        &p,
        &options(false),
        None,
        &json!({"attempts": slow, "conflicts": [1], "store": full_budget()}),
        "completed",
    );
    // The store unreachable when the hedge is due (fail closed): the hedge
    // is not sent, the run goes on with its lead.
    case(
        f,
        "hedged_budget_store_unreachable_for_the_hedge",
        &p,
        &options(false),
        None,
        &json!({"attempts": slow, "unavailable": [1], "store": full_budget()}),
        "completed",
    );
    refusals(f);
}

/// The store with the full budget and an open breaker on route `i`.
fn open_on(i: usize) -> Value {
    let p = policy_with(&[]);
    let release = p["routes"][i]["route_release_sha256"].clone();
    let key = format!("breaker/{}", release.as_str().unwrap());
    let mut store = full_budget();
    store[key] = json!({"consecutive_failures": 0, "generation": 1, "opened_at_epoch_ms": NOW_2026,
        "probe_successes": 0, "probes_in_flight": 0, "route_release_sha256": release,
        "schema": "retryledger.breaker.v1", "state": "open", "updated_at_epoch_ms": NOW_2026,
        "window_failures": 0, "window_start_epoch_ms": NOW_2026, "window_total": 0});
    store
}

/// Breakers at a hedge: an open hedge route sends no hedge (the lead runs
/// alone); an open primary moves the lead to the fallback, whose hedge
/// there is admitted by the same breaker; both open stops the run.
fn open_breakers(f: &mut Family) {
    let p = hedged(Some(
        json!({"breaker": breaker(), "on_store_unavailable": "fail_closed", "retry_budget": budget()}),
    ));
    let slow = json!([ok_after(1_000), ok_after(100)]);
    for journal in [false, true] {
        let j = if journal { "_journal" } else { "" };
        case(
            f,
            &format!("hedged_fleet{j}_open_hedge_route_sends_no_hedge"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": slow, "store": open_on(1)}),
            "completed",
        );
        case(
            f,
            &format!("hedged_fleet{j}_open_primary_moves_the_lead"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": slow, "store": open_on(0)}),
            "completed",
        );
        let mut both = open_on(0);
        let other = open_on(1);
        for (k, v) in other.as_object().unwrap() {
            both[k] = v.clone();
        }
        case(
            f,
            &format!("hedged_fleet{j}_every_route_open_stops"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": slow, "store": both}),
            "stop_circuit_open",
        );
    }
}

/// Admission limits with one slot in flight per route, and a hedge on the
/// lead's own route: the lead takes the slot, the hedge finds none and is
/// not sent (a hedge never queues); the lead wins alone.
fn full_limits(f: &mut Family) {
    let mut one = limits();
    one["max_in_flight"] = json!(1);
    let mut h = hedge();
    h["routes"] = json!(["private-primary"]);
    let p = t(&policy_with(&[
        ("/hedge", h),
        (
            "/fleet",
            json!({"admission": one, "on_store_unavailable": "fail_closed"}),
        ),
    ]));
    for journal in [false, true] {
        let j = if journal { "_journal" } else { "" };
        case(
            f,
            &format!("hedged_limits{j}_no_slot_sends_no_hedge"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": [ok_after(1_000), ok_after(100)]}),
            "completed",
        );
    }
}

fn refusals(f: &mut Family) {
    let p = hedged(None);
    let run = |events: Value| {
        vec![
            ("policy", json!(p.clone())),
            ("options", json!(t(&options(false)))),
            ("events", json!(t(&events))),
        ]
    };
    f.add(
        "hedged_clock_before_the_threshold_is_refused",
        "machine",
        run(json!([{"kind": "clock", "now_ms": 299}])),
        "hedge_before_threshold",
    );
    f.add(
        "hedged_two_in_flight_an_observation_names_its_ordinal",
        "machine",
        run(json!([{"kind": "clock", "now_ms": 300},
            {"completed_at_ms": 400, "facts": {"result": "returned"}, "kind": "observed"}])),
        "missing_field",
    );
    f.add(
        "hedged_an_observation_of_an_attempt_not_in_flight",
        "machine",
        run(json!([{"kind": "clock", "now_ms": 300},
            {"completed_at_ms": 400, "facts": {"result": "returned"}, "kind": "observed", "ordinal": 3}])),
        "ordinal_drift",
    );
    f.add(
        "hedged_a_cancel_of_an_attempt_not_a_loser",
        "machine",
        run(json!([{"kind": "clock", "now_ms": 300},
            {"completed_at_ms": 400, "facts": {"result": "returned"}, "kind": "observed", "ordinal": 2},
            {"at_ms": 401, "kind": "attempt_cancelled", "ordinal": 2}])),
        "ordinal_drift",
    );
    f.add(
        "hedged_a_loser_cancelled_before_the_round_is_decided",
        "machine",
        run(json!([{"kind": "clock", "now_ms": 300},
            {"at_ms": 301, "kind": "attempt_cancelled", "ordinal": 1}])),
        "unexpected_event",
    );
    f.add(
        "hedged_priced_by_usage_is_not_yet_a_layer",
        "machine",
        vec![
            ("policy", json!(p.clone())),
            (
                "options",
                json!(t(&json!({"origin_epoch_ms": NOW_2026, "price_schedule": crate::price::schedule()}))),
            ),
            ("events", json!("[]")),
        ],
        "machine_layer_missing",
    );
}

/// A hedged run under a retry budget and a journal, crashed after every
/// number of appends and resumed by a new owner whose receiver answers
/// about every member in doubt: `failed_no_effect` (the round goes on and
/// the run may send again) or `succeeded` (the round is decided, the rest
/// are cancelled).
fn crashes(f: &mut Family) {
    let mut fleet = json!({"on_store_unavailable": "fail_closed", "retry_budget": budget()});
    fleet["retry_budget"]["floor_per_second"] = json!(0);
    let mut h = hedge();
    h["cost_share_percent"] = json!(100);
    let p = t(&policy_with(&[("/hedge", h), ("/fleet", fleet)]));
    // Round 1: both fail; round 2: the hedge wins, the lead is cancelled.
    let attempts = json!([
        with_after(status(503, None), 400),
        with_after(status(503, None), 200),
        ok_after(1_000),
        ok_after(100),
    ]);
    let script = json!({"attempts": attempts, "store": full_budget()});
    for k in 0..16u64 {
        let mut crashed = script.clone();
        crashed["crash_after_appends"] = json!(k);
        let name = format!("hedged_budget_journal_crash_after_{k}_appends");
        let (journal, now) = case(f, &name, &p, &options(true), None, &crashed, "ok");
        if journal
            .last()
            .is_some_and(|e| e.payload.kind() == retryledger_core::journal::EventKind::Terminal)
        {
            break;
        }
        let sent = journal
            .iter()
            .filter(|e| e.payload.kind() == retryledger_core::journal::EventKind::Dispatched)
            .count();
        let rest: Vec<Value> = attempts.as_array().unwrap()[sent.min(4)..].to_vec();
        let mut opts = options(true);
        opts["journal"]["lease_generation"] = json!(2);
        opts["now_ms"] = json!(now + 10);
        for answer in ["failed_no_effect", "succeeded"] {
            let resume = json!({"attempts": rest, "store": full_budget(),
                "reconcile": [{"answer": answer, "after_ms": 5}, {"answer": answer, "after_ms": 5}]});
            case(
                f,
                &format!("hedged_budget_journal_resumed_after_{k}_appends_{answer}"),
                &p,
                &opts,
                Some(&journal),
                &resume,
                "terminal",
            );
        }
    }
}
