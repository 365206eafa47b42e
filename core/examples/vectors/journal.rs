//! `journal.json`: durable runs. Journals of clean runs are built event by
//! event through `journal_append` (every digest computed by the core); every
//! prefix's recovery answer; each reconciliation answer, bounded polls, a
//! takeover under a higher lease generation and the late append of the
//! fenced owner; tampered journals (broken chain, seq gap and repeat, a lower
//! lease generation, plan disagreement, another run, an unknown kind, events
//! out of order or after the terminal, another policy).

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{policy_with, reference, run, s, success, t, timeout, NOW_2026};
use crate::family::Family;

const RUN: &str = "run-2026-12-03/summaries/42";

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("api output is JSON")
}

/// Append one entry through the core; the event as a value.
fn append(policy: &str, events: &[Value], generation: u64, entry: Value) -> Value {
    let text = api::journal_append(policy, &t(&json!(events)), generation, &t(&entry))
        .unwrap_or_else(|e| panic!("append {entry}: {e}"));
    parse(&text)
}

fn push(policy: &str, events: &mut Vec<Value>, generation: u64, entry: Value) {
    let e = append(policy, events, generation, entry);
    events.push(e);
}

/// The whole journal of a run whose attempts are given, at one generation.
fn journal_of(policy: &str, attempts: &Value, generation: u64) -> Vec<Value> {
    let mut events = Vec::new();
    push(
        policy,
        &mut events,
        generation,
        json!({"kind": "created", "run_id": RUN, "created_at_epoch_ms": NOW_2026}),
    );
    push(policy, &mut events, generation, json!({"kind": "decided"}));
    for a in attempts["attempts"].as_array().expect("attempts") {
        push(policy, &mut events, generation, json!({"kind": "reserved"}));
        push(
            policy,
            &mut events,
            generation,
            json!({"kind": "dispatched", "started_at_ms": a["started_at_ms"]}),
        );
        push(
            policy,
            &mut events,
            generation,
            json!({"kind": "observed", "attempt": a}),
        );
        push(policy, &mut events, generation, json!({"kind": "decided"}));
    }
    push(policy, &mut events, generation, json!({"kind": "terminal"}));
    events
}

/// Renumber `seq` from 0 and recompute every `prev_sha256` with the core's
/// digest: a tampered journal whose chain is intact, so only the tampering shows.
fn rechain(events: &mut [Value]) {
    let mut prev = "0".repeat(64);
    for (i, e) in events.iter_mut().enumerate() {
        e["seq"] = json!(i);
        e["prev_sha256"] = json!(prev);
        prev = api::digest(&t(e)).expect("an event digests");
    }
}

fn evs(events: &[Value]) -> String {
    t(&json!(events))
}

fn verify(f: &mut Family, name: &str, policy: &str, events: &[Value], want: &str) {
    f.add(
        name,
        "journal_verify",
        vec![("policy", json!(policy)), ("events", json!(evs(events)))],
        want,
    );
}

fn recover(
    f: &mut Family,
    name: &str,
    policy: &str,
    events: &[Value],
    reconciliation: Option<Value>,
    want: &str,
) {
    let mut input = vec![("policy", json!(policy)), ("events", json!(evs(events)))];
    if let Some(r) = reconciliation {
        input.push(("reconciliation", json!(t(&r))));
    }
    f.add(name, "journal_recover", input, want);
}

fn append_case(
    f: &mut Family,
    name: &str,
    policy: &str,
    events: &[Value],
    generation: u64,
    entry: Value,
    want: &str,
) {
    f.add(
        name,
        "journal_append",
        vec![
            ("policy", json!(policy)),
            ("events", json!(evs(events))),
            ("lease_generation", json!(generation)),
            ("entry", json!(t(&entry))),
        ],
        want,
    );
}

fn classify(f: &mut Family, name: &str, policy: &str, events: &[Value], event: &Value, want: &str) {
    f.add(
        name,
        "journal_classify",
        vec![
            ("policy", json!(policy)),
            ("events", json!(evs(events))),
            ("event", json!(t(event))),
        ],
        want,
    );
}

fn answers(ordinal: u64, max_polls: u64, list: &[(&str, u64)]) -> Value {
    json!({
        "schema": "retryledger.reconciliation.v1",
        "ordinal": ordinal,
        "max_polls": max_polls,
        "answers": list.iter().map(|(a, at)| json!({"answer": a, "at_ms": at})).collect::<Vec<_>>(),
    })
}

/// The recovery answer's adopted attempt, for appending it.
fn adopted(policy: &str, events: &[Value], rec: &Value) -> Value {
    let answer =
        parse(&api::journal_recover(policy, &evs(events), Some(&t(rec))).expect("recover"));
    assert_eq!(answer["kind"], "adopt", "{answer}");
    answer["attempt"].clone()
}

pub fn family() -> Family {
    let mut f = Family::new(
        "journal",
        "journal_append / journal_verify / journal_recover / journal_classify: the durable journal of a run (retryledger.journal_event.v1, a hash chain by prev_sha256 over seq 0, 1, 2, ... under non-decreasing lease generations), its verification against the core's plan, recovery (resume, reconcile, adopt, done) with reconciliation answers (retryledger.reconciliation.v1) on a bounded poll schedule, and the classification of a late append; evaluate and digest of reconciled attempts and journal events.",
        "journals of the reference run and of a fallback run after two timeouts, built by journal_append, and the recovery answer for every prefix; succeeded, failed_no_effect, in_progress and unknown answers; polls bounded by count and by the deadline, too early, too many, after settling, for another attempt or none; a takeover under a higher lease generation that adopts the receiver's result and ends completed with a reconciled receipt; the old owner's late append as evidence, a duplicate, a seq taken; broken chain, seq gap and repeat, a lower lease generation, plan disagreement (reservation, decision, dispatch, observation, terminal digests), another run, an unknown kind, events out of order and after the terminal, another policy, an early dispatch",
    );
    let r = reference();
    let policy = t(&r);
    let steps = lab::reference_steps();
    let attempts = run(&r, &steps);
    let full = journal_of(&policy, &attempts, 1);
    assert_eq!(full.len(), 15);

    // Clean journals and the recovery answer of every prefix.
    verify(
        &mut f,
        "verify_reference_journal",
        &policy,
        &full,
        "completed",
    );
    let kinds = [
        "empty",
        "created",
        "decided",
        "reserved",
        "dispatched",
        "observed",
        "decided",
    ];
    for n in 0..=full.len() {
        let last = if n == 0 {
            kinds[0].to_owned()
        } else {
            full[n - 1]["kind"].as_str().expect("kind").to_owned()
        };
        let want = match last.as_str() {
            "empty" | "created" | "decided" | "reserved" | "observed" => "resume",
            "dispatched" => "reconcile",
            _ => "done",
        };
        recover(
            &mut f,
            &format!("recover_reference_prefix_{n:02}_after_{last}"),
            &policy,
            &full[..n],
            None,
            want,
        );
    }
    let fb_attempts = run(
        &r,
        &[
            s(timeout(), 200, 0),
            s(timeout(), 200, 0),
            s(success(), 300, 1_200),
        ],
    );
    let fb = journal_of(&policy, &fb_attempts, 3);
    verify(&mut f, "verify_fallback_journal", &policy, &fb, "completed");
    for n in [4, 8, 12, 13, 14] {
        let last = fb[n - 1]["kind"].as_str().expect("kind");
        let want = if last == "dispatched" {
            "reconcile"
        } else {
            "resume"
        };
        recover(
            &mut f,
            &format!("recover_fallback_prefix_{n:02}_after_{last}"),
            &policy,
            &fb[..n],
            None,
            want,
        );
    }

    // Reconciliation of the first attempt (dispatched at 0; backoff base
    // 100 ms, maximum 1,000 ms; deadline 5,000 ms).
    let first = &full[..4];
    recover(
        &mut f,
        "reconcile_succeeded_adopts_the_result",
        &policy,
        first,
        Some(answers(1, 5, &[("succeeded", 900)])),
        "completed",
    );
    recover(
        &mut f,
        "reconcile_failed_no_effect_permits_the_next_dispatch",
        &policy,
        first,
        Some(answers(1, 5, &[("failed_no_effect", 900)])),
        "dispatch",
    );
    recover(
        &mut f,
        "reconcile_unknown_ends_indeterminate",
        &policy,
        first,
        Some(answers(1, 5, &[("unknown", 900)])),
        "stop_indeterminate",
    );
    recover(
        &mut f,
        "reconcile_in_progress_polls_after_the_backoff",
        &policy,
        first,
        Some(answers(1, 5, &[("in_progress", 900)])),
        "poll\":2",
    );
    recover(
        &mut f,
        "reconcile_in_progress_twice_doubles_the_delay",
        &policy,
        first,
        Some(answers(
            1,
            5,
            &[("in_progress", 900), ("in_progress", 1_000)],
        )),
        "not_before_ms\":1200",
    );
    recover(
        &mut f,
        "reconcile_in_progress_then_succeeded",
        &policy,
        first,
        Some(answers(
            1,
            5,
            &[
                ("in_progress", 900),
                ("in_progress", 1_000),
                ("succeeded", 1_250),
            ],
        )),
        "succeeded",
    );
    recover(
        &mut f,
        "reconcile_in_progress_at_the_poll_bound_is_unknown",
        &policy,
        first,
        Some(answers(
            1,
            2,
            &[("in_progress", 900), ("in_progress", 1_000)],
        )),
        "unknown",
    );
    recover(
        &mut f,
        "reconcile_in_progress_past_the_deadline_is_unknown",
        &policy,
        first,
        Some(answers(1, 5, &[("in_progress", 4_950)])),
        "stop_indeterminate",
    );
    let mut costly = answers(1, 5, &[("succeeded", 900)]);
    costly["answers"][0]["cost"] = json!(1_234);
    recover(
        &mut f,
        "reconcile_succeeded_with_its_cost",
        &policy,
        first,
        Some(costly),
        "cost\":1234",
    );
    recover(
        &mut f,
        "reconcile_poll_too_early",
        &policy,
        first,
        Some(answers(1, 5, &[("in_progress", 900), ("in_progress", 950)])),
        "poll_too_early",
    );
    recover(
        &mut f,
        "reconcile_poll_limit_exceeded",
        &policy,
        first,
        Some(answers(1, 1, &[("in_progress", 900), ("succeeded", 1_000)])),
        "poll_limit_exceeded",
    );
    recover(
        &mut f,
        "reconcile_answer_after_settled",
        &policy,
        first,
        Some(answers(1, 5, &[("succeeded", 900), ("succeeded", 1_000)])),
        "reconciliation_after_settled",
    );
    recover(
        &mut f,
        "reconcile_another_attempt",
        &policy,
        first,
        Some(answers(2, 5, &[("succeeded", 900)])),
        "reconciliation_unexpected",
    );
    recover(
        &mut f,
        "reconcile_nothing_pending",
        &policy,
        &full[..5],
        Some(answers(1, 5, &[("succeeded", 900)])),
        "reconciliation_unexpected",
    );
    let mut charged = answers(1, 5, &[("in_progress", 900)]);
    charged["answers"][0]["cost"] = json!(1);
    recover(
        &mut f,
        "reconcile_in_progress_with_a_cost",
        &policy,
        first,
        Some(charged),
        "invalid_value",
    );
    recover(
        &mut f,
        "reconcile_max_polls_zero",
        &policy,
        first,
        Some(answers(1, 0, &[])),
        "invalid_value",
    );
    recover(
        &mut f,
        "reconcile_answered_before_the_dispatch",
        &policy,
        &full[..8],
        Some(answers(2, 5, &[("succeeded", 1_300)])),
        "poll_too_early",
    );

    // A takeover: the owner at generation 1 crashed after dispatching the
    // fallback's attempt; the owner at generation 2 reconciles, adopts the
    // receiver's result and finishes. The old owner's late observation is
    // evidence.
    let crashed = &full[..12];
    let settled = answers(3, 5, &[("in_progress", 2_000), ("succeeded", 2_400)]);
    let attempt = adopted(&policy, crashed, &settled);
    let mut taken = crashed.to_vec();
    push(
        &policy,
        &mut taken,
        2,
        json!({"kind": "observed", "attempt": attempt}),
    );
    push(&policy, &mut taken, 2, json!({"kind": "decided"}));
    push(&policy, &mut taken, 2, json!({"kind": "terminal"}));
    verify(
        &mut f,
        "verify_recovered_journal",
        &policy,
        &taken,
        "lease_generation\":2",
    );
    recover(
        &mut f,
        "recover_recovered_journal_is_done",
        &policy,
        &taken,
        None,
        "done",
    );
    let mut recovered_attempts = attempts.clone();
    recovered_attempts["attempts"][2] = attempt.clone();
    f.eval(
        "receipt_of_a_recovered_run_names_the_reconciled_attempt",
        &policy,
        &t(&recovered_attempts),
        "reconciled\":\"succeeded",
    );
    let mut mislabelled = recovered_attempts.clone();
    mislabelled["attempts"][2]["reconciled"] = json!("failed_no_effect");
    f.eval(
        "receipt_reconciled_label_disagrees_with_the_outcome",
        &policy,
        &t(&mislabelled),
        "reconciliation_drift",
    );
    f.digest("digest_reconciled_attempts", &t(&recovered_attempts), "ok");
    f.digest("digest_journal_event", &t(&full[3]), "ok");
    let late = full[12].clone();
    classify(
        &mut f,
        "classify_late_append_of_the_fenced_owner",
        &policy,
        &taken,
        &late,
        "stale_lease",
    );
    let mut late_next = append(&policy, &taken[..13], 2, json!({"kind": "decided"}));
    late_next["lease_generation"] = json!(1);
    classify(
        &mut f,
        "classify_stale_append_at_the_next_seq",
        &policy,
        &taken[..13],
        &late_next,
        "stale_lease",
    );
    classify(
        &mut f,
        "classify_repeated_write_is_a_duplicate",
        &policy,
        &taken,
        &taken[13],
        "duplicate",
    );
    let mut other = taken[13].clone();
    other["decision"] = json!({"kind": "terminal", "terminal": "stop_cancelled"});
    classify(
        &mut f,
        "classify_seq_taken_by_another_event",
        &policy,
        &taken,
        &other,
        "seq_taken",
    );
    let next = append(&policy, &full[..5], 1, json!({"kind": "decided"}));
    classify(
        &mut f,
        "classify_next_event_appends",
        &policy,
        &full[..5],
        &next,
        "append",
    );
    let mut ahead = next.clone();
    ahead["seq"] = json!(9);
    classify(
        &mut f,
        "classify_seq_ahead",
        &policy,
        &full[..5],
        &ahead,
        "journal_seq_gap",
    );
    let mut stranger = next;
    stranger["run_id"] = json!("run-other");
    classify(
        &mut f,
        "classify_event_of_another_run",
        &policy,
        &full[..5],
        &stranger,
        "journal_wrong_run",
    );

    // Appends.
    append_case(
        &mut f,
        "append_created_opens_the_chain",
        &policy,
        &[],
        1,
        json!({"kind": "created", "run_id": RUN, "created_at_epoch_ms": NOW_2026}),
        "0000000000000000000000000000000000000000000000000000000000000000",
    );
    append_case(
        &mut f,
        "append_reserved_holds_the_plan",
        &policy,
        &full[..2],
        1,
        json!({"kind": "reserved"}),
        "not_before_ms\":0",
    );
    append_case(
        &mut f,
        "append_dispatched_before_its_time",
        &policy,
        &full[..7],
        1,
        json!({"kind": "dispatched", "started_at_ms": 1_349}),
        "early_start",
    );
    append_case(
        &mut f,
        "append_under_a_lower_lease_generation",
        &policy,
        &taken[..13],
        1,
        json!({"kind": "decided"}),
        "journal_stale_lease",
    );
    append_case(
        &mut f,
        "append_dispatched_without_a_reservation",
        &policy,
        &full[..2],
        1,
        json!({"kind": "dispatched", "started_at_ms": 0}),
        "journal_out_of_order",
    );
    append_case(
        &mut f,
        "append_terminal_while_the_run_may_dispatch",
        &policy,
        &full[..6],
        1,
        json!({"kind": "terminal"}),
        "journal_out_of_order",
    );
    append_case(
        &mut f,
        "append_terminal_cancels_before_the_dispatch",
        &policy,
        &full[..7],
        1,
        json!({"kind": "terminal", "cancelled_at_ms": 1_200}),
        "stop_cancelled",
    );
    let mut wrong = attempts["attempts"][0].clone();
    wrong["route_ordinal"] = json!(2);
    append_case(
        &mut f,
        "append_observed_attempt_off_plan",
        &policy,
        &full[..4],
        1,
        json!({"kind": "observed", "attempt": wrong}),
        "route_ordinal_drift",
    );
    let mut elsewhere = attempts["attempts"][0].clone();
    elsewhere["started_at_ms"] = json!(5);
    append_case(
        &mut f,
        "append_observed_attempt_not_the_dispatched_one",
        &policy,
        &full[..4],
        1,
        json!({"kind": "observed", "attempt": elsewhere}),
        "journal_plan_drift",
    );
    append_case(
        &mut f,
        "append_created_twice",
        &policy,
        &full[..1],
        1,
        json!({"kind": "created", "run_id": RUN, "created_at_epoch_ms": NOW_2026}),
        "journal_out_of_order",
    );
    append_case(
        &mut f,
        "append_first_event_not_created",
        &policy,
        &[],
        1,
        json!({"kind": "decided"}),
        "journal_out_of_order",
    );
    append_case(
        &mut f,
        "append_unknown_kind",
        &policy,
        &full[..2],
        1,
        json!({"kind": "paused"}),
        "journal_unknown_kind",
    );

    // Tampered journals.
    let tampered = |edit: &dyn Fn(&mut Vec<Value>), chain: bool| {
        let mut e = full.clone();
        edit(&mut e);
        if chain {
            rechain(&mut e);
        }
        e
    };
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        (
            "verify_broken_chain",
            tampered(&|e| e[4]["attempt"]["cost"] = json!(7), false),
            "journal_chain_broken",
        ),
        (
            "verify_seq_gap",
            tampered(
                &|e| {
                    e.remove(5);
                },
                false,
            ),
            "journal_seq_gap",
        ),
        (
            "verify_seq_repeat",
            tampered(
                &|e| {
                    let d = e[4].clone();
                    e.insert(5, d);
                },
                false,
            ),
            "journal_seq_repeat",
        ),
        (
            "verify_lower_lease_generation",
            tampered(
                &|e| {
                    for ev in e.iter_mut().take(6) {
                        ev["lease_generation"] = json!(2);
                    }
                },
                true,
            ),
            "journal_stale_lease",
        ),
        (
            "verify_reservation_off_plan",
            tampered(&|e| e[6]["dispatch"]["not_before_ms"] = json!(1_300), true),
            "journal_plan_drift",
        ),
        (
            "verify_decision_off_plan",
            tampered(
                &|e| {
                    e[4]["attempt"]["outcome"] = json!({"class": "success"});
                },
                true,
            ),
            "journal_plan_drift",
        ),
        (
            "verify_dispatch_to_another_route",
            tampered(&|e| e[3]["route_id"] = json!("external-fallback"), true),
            "journal_plan_drift",
        ),
        (
            "verify_terminal_receipt_digest",
            tampered(&|e| e[14]["receipt_sha256"] = json!("ab".repeat(32)), true),
            "journal_plan_drift",
        ),
        (
            "verify_event_of_another_run",
            tampered(&|e| e[3]["run_id"] = json!("run-other"), true),
            "journal_wrong_run",
        ),
        (
            "verify_unknown_kind",
            tampered(&|e| e[3]["kind"] = json!("paused"), false),
            "journal_unknown_kind",
        ),
        (
            "verify_events_out_of_order",
            tampered(
                &|e| {
                    e.remove(2);
                },
                true,
            ),
            "journal_out_of_order",
        ),
        (
            "verify_event_after_terminal",
            tampered(
                &|e| {
                    let d = e[13].clone();
                    e.push(d);
                },
                true,
            ),
            "journal_after_terminal",
        ),
        (
            "verify_first_event_not_created",
            tampered(
                &|e| {
                    e.remove(0);
                },
                true,
            ),
            "journal_out_of_order",
        ),
        (
            "verify_missing_prev_sha256",
            tampered(
                &|e| {
                    e[2].as_object_mut().expect("event").remove("prev_sha256");
                },
                false,
            ),
            "missing_field",
        ),
        (
            "verify_unknown_field",
            tampered(&|e| e[2]["note"] = json!("x"), false),
            "unknown_field",
        ),
    ];
    for (name, events, want) in cases {
        verify(&mut f, name, &policy, &events, want);
    }
    let other_policy = t(&policy_with(&[("/deadline_ms", json!(6_000))]));
    verify(
        &mut f,
        "verify_under_another_policy",
        &other_policy,
        &full,
        "journal_policy_mismatch",
    );
    f.add(
        "verify_events_not_an_array",
        "journal_verify",
        vec![("policy", json!(policy)), ("events", json!("{}"))],
        "invalid_type",
    );
    f
}
