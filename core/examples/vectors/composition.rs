//! `composition.json`: the run machine with its layers composed.
//!
//! Each `machine` case is a run of the machine (`retryledger_core::machine`)
//! as a scripted host answered it: the policy, the options, optionally a
//! journal to resume from, and the events the host answered with. Replayed,
//! the same events must draw the same effects (appends, reads, writes,
//! sleeps, dispatches, reconciliations), the same terminal and the same
//! sealed receipt and bundle, in every language. The cases cross every
//! fleet layer (breaker, retry budget, admission limits, all three), the
//! journal, stream contracts and output checks with the usual outcome
//! scripts, then crashes and resumes (streamed runs and async jobs too),
//! async jobs as a layer, store conflicts and outages, cancellation, and
//! refused answers.

use std::sync::Arc;

use retryledger_core::canonical::to_value;
use retryledger_core::machine::script::{options_of, play_resume, play_start, Script};
use retryledger_core::{api, journal::JournalEvent};
use serde_json::{json, Value};

use crate::common::{policy_with, t, NOW_2026};
use crate::family::Family;

const RUN: &str = "run-composition-1";

pub(crate) fn breaker() -> Value {
    json!({"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 10_000})
}
pub(crate) fn budget() -> Value {
    json!({"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "tenant-7/summaries"})
}
pub(crate) fn limits() -> Value {
    json!({"max_in_flight": 2, "max_queue_ms": 1_000, "request_burst": 2, "requests_per_second": 10})
}

/// The fleet sections crossed.
fn fleets() -> Vec<(&'static str, Option<Value>)> {
    vec![
        ("plain", None),
        (
            "breaker",
            Some(json!({"breaker": breaker(), "on_store_unavailable": "fail_closed"})),
        ),
        (
            "budget",
            Some(json!({"on_store_unavailable": "fail_closed", "retry_budget": budget()})),
        ),
        (
            "limits",
            Some(json!({"admission": limits(), "on_store_unavailable": "fail_open"})),
        ),
        (
            "fleet",
            Some(json!({"admission": limits(), "breaker": breaker(),
                "on_store_unavailable": "fail_closed", "retry_budget": budget()})),
        ),
    ]
}

fn contract(mode: &str) -> Value {
    json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500, "max_response_bytes": 65_536, "mode": mode})
}

fn policy(fleet: &Option<Value>, stream: Option<&str>) -> String {
    let mut edits = Vec::new();
    if let Some(f) = fleet {
        edits.push(("/fleet", f.clone()));
    }
    if let Some(mode) = stream {
        edits.push(("/stream", contract(mode)));
    }
    t(&policy_with(&edits))
}

pub(crate) fn options(journal: bool) -> Value {
    let mut o = json!({"origin_epoch_ms": NOW_2026});
    if journal {
        o["journal"] = json!({"lease_generation": 1, "run_id": RUN});
    }
    o
}

const TEXT: &[&str] = &["The incident", " began at 09:14", " UTC."];
const CUT: &[&str] = &["The incident", " beg"];

fn bytes(deltas: &[&str]) -> usize {
    deltas.iter().map(|d| d.len()).sum()
}

fn stream_facts(deltas: &[&str], terminal: bool) -> Value {
    json!({"bytes": bytes(deltas), "events": deltas.len(), "terminal_event": terminal, "usage_event": terminal})
}

/// A step that succeeds (with its text, under a stream contract).
pub(crate) fn ok(stream: bool) -> Value {
    if stream {
        json!({"after_ms": 60, "deltas": TEXT, "facts": {"result": "returned", "stream": stream_facts(TEXT, true)}})
    } else {
        json!({"after_ms": 60, "facts": {"result": "returned"}})
    }
}

/// A step refused with `status` before any output.
pub(crate) fn status(code: u64, hint: Option<&str>) -> Value {
    let mut facts = json!({"error_types": ["APIStatusError"], "result": "raised", "status": code});
    if let Some(h) = hint {
        facts["headers"] = json!([["retry-after", h]]);
    }
    json!({"after_ms": 30, "facts": facts})
}

/// A stream cut after its first events.
fn cut() -> Value {
    json!({"after_ms": 40, "deltas": CUT, "facts": {
        "error_types": ["APIConnectionError", "APIError"], "result": "raised",
        "stream": stream_facts(CUT, false)}})
}

/// A client timeout before any response.
pub(crate) fn timeout() -> Value {
    json!({"after_ms": 1_000, "facts": {"result": "raised", "transport_error": "timeout"}})
}

/// An answer whose output check failed.
pub(crate) fn invalid(stream: bool) -> Value {
    let mut s = ok(stream);
    s["facts"]["output_checks"] = json!([{"defects": [{"message": "the answer has no content"}],
        "kind": "empty", "validator": "builtin.empty", "verdict": "defects"}]);
    s
}

/// The outcome scripts crossed with every layer.
fn scripts(stream: bool) -> Vec<(&'static str, Vec<Value>)> {
    let mut out = vec![
        ("success", vec![ok(stream)]),
        (
            "rate_limited_then_success",
            vec![status(429, Some("1")), ok(stream)],
        ),
        (
            "fallback_after_two_failures",
            vec![status(503, None), status(503, None), ok(stream)],
        ),
        ("non_retryable", vec![status(400, None)]),
        ("timeout_then_success", vec![timeout(), ok(stream)]),
        ("output_check_fails", vec![invalid(stream)]),
    ];
    if stream {
        out.push(("cut_after_output", vec![cut(), ok(stream)]));
    }
    out
}

fn events_text(events: &[retryledger_core::machine::Event]) -> String {
    t(&Value::Array(events.iter().map(to_value).collect()))
}

/// Play `script` from a start (or from `journal`), then pin the replay.
pub(crate) fn case(
    f: &mut Family,
    name: &str,
    policy: &str,
    opts: &Value,
    journal: Option<&[JournalEvent]>,
    script: &Value,
    want: &str,
) -> (Vec<JournalEvent>, u64) {
    let cp = Arc::new(api::compile_policy(policy).expect("a valid policy"));
    let o = options_of(opts).expect("options");
    let s = Script::from_value(script).expect("a script");
    let played = match journal {
        Some(j) => play_resume(&cp, o, j.to_vec(), &s),
        None => play_start(&cp, o, &s),
    }
    .expect("a machine");
    let mut input = vec![("policy", json!(policy)), ("options", json!(t(opts)))];
    if let Some(j) = journal {
        input.push((
            "journal",
            json!(t(&Value::Array(j.iter().map(to_value).collect()))),
        ));
    }
    input.push(("events", json!(events_text(&played.events))));
    f.add(name, "machine", input, want);
    (played.journal, played.now_ms)
}

/// The budget full, so the outcome scripts show more than its refusal
/// (a fresh budget holds nothing yet).
pub(crate) fn full_budget() -> Value {
    json!({"budget/tenant-7/summaries": {"balance_milli": 5_000, "deposits": 0, "generation": 0,
        "schema": "retryledger.retry_budget.v1", "scope": "tenant-7/summaries",
        "updated_at_epoch_ms": NOW_2026, "withdrawals": 0}})
}

pub fn family() -> Family {
    let mut f = Family::new(
        "composition",
        "machine: the run machine (docs/COMPOSITION.md) started (or resumed from `journal`) under `options` and fed `events`; expect: the effect outstanding before each event and after the last, the terminal, the receipt and bundle digests, or the refused event's error.",
        "every fleet layer (breaker, retry budget, admission limits, all three) crossed with the journal, stream contracts (buffer, tentative) and output checks over success, rate limits with a hint, a fallback after two failures, a non-retryable refusal, a timeout, a failed output check and a stream cut after output; a journaled run crashed at every journal prefix and resumed (an attempt in doubt reconciled), under a fleet too; streamed journaled runs (buffer, tentative; under a fleet, with output checks) crashed at every prefix and resumed; an async job submitted and polled (alone, under a journal, under a fleet, both; output checks on the final result only; a cancellation that cancels the job; crashed at every prefix and resumed without a second submit); store conflicts and an unreachable store (fail open, fail closed); a cancellation while waiting; refused answers (an event out of turn, a clock going back, a refused append, an unlayered section); hedged runs (a hedge sent while its lead is in flight, losers cancelled or late, rounds of failures retried) alone, under a retry budget, a breaker, both, admission limits and all three, journaled or not, with its store conflicting or unreachable at a hedge and open breakers at a lead or a hedge, crashed after every append under a budget and a journal and resumed (members in doubt reconciled), and the hedge answers refused",
    );
    for (fleet_name, fleet) in fleets() {
        for journal in [false, true] {
            for stream in [None, Some("buffer"), Some("tentative")] {
                let p = policy(&fleet, stream);
                for (script_name, steps) in scripts(stream.is_some()) {
                    let name = format!(
                        "{fleet_name}{}{}_{script_name}",
                        if journal { "_journal" } else { "" },
                        stream.map(|m| format!("_stream_{m}")).unwrap_or_default()
                    );
                    case(
                        &mut f,
                        &name,
                        &p,
                        &options(journal),
                        None,
                        &json!({"attempts": steps, "store": full_budget()}),
                        "terminal",
                    );
                }
            }
        }
    }
    crash_cases(&mut f);
    stream_crash_cases(&mut f);
    job_cases(&mut f);
    store_cases(&mut f);
    refusal_cases(&mut f);
    crate::composition_hedge::cases(&mut f);
    f
}

/// A journaled run crashed after every number of appends, then resumed by a
/// new owner (an attempt in doubt reconciled: `failed_no_effect`).
fn crash_cases(f: &mut Family) {
    let script = json!({"attempts": [status(429, Some("1")), status(503, None), ok(false)], "store": full_budget()});
    for (fleet_name, fleet) in [fleets().swap_remove(0), fleets().swap_remove(4)] {
        let p = policy(&fleet, None);
        for k in 0..8u64 {
            let mut crashed = script.clone();
            crashed["crash_after_appends"] = json!(k);
            let name = format!("{fleet_name}_journal_crash_after_{k}_appends");
            let (journal, now) = case(f, &name, &p, &options(true), None, &crashed, "ok");
            let done = journal.last().is_some_and(|e| {
                e.payload.kind() == retryledger_core::journal::EventKind::Terminal
            });
            if done {
                continue;
            }
            let in_doubt = journal.last().is_some_and(|e| {
                e.payload.kind() == retryledger_core::journal::EventKind::Dispatched
            });
            let observed = journal
                .iter()
                .filter(|e| e.payload.kind() == retryledger_core::journal::EventKind::Observed)
                .count();
            let skip = observed + usize::from(in_doubt);
            let rest: Vec<Value> = script["attempts"].as_array().unwrap()[skip..].to_vec();
            let mut opts = options(true);
            opts["journal"]["lease_generation"] = json!(2);
            opts["now_ms"] = json!(now + 10);
            let resume = json!({"attempts": rest, "reconcile": [{"answer": "failed_no_effect"}], "store": full_budget()});
            case(
                f,
                &format!("{fleet_name}_journal_resumed_after_{k}_appends"),
                &p,
                &opts,
                Some(&journal),
                &resume,
                "terminal",
            );
        }
    }
    // An empty journal (a lease claimed, nothing written) starts the run.
    let mut opts = options(true);
    opts["journal"]["lease_generation"] = json!(2);
    case(
        f,
        "journal_resumed_from_an_empty_journal_starts_the_run",
        &policy(&None, None),
        &opts,
        Some(&[]),
        &json!({"attempts": [ok(false)]}),
        "completed",
    );
    // A receiver still in progress, then done: the attempt is adopted.
    let p = policy(&None, None);
    let (journal, _) = case(
        f,
        "journal_crash_after_dispatch",
        &p,
        &options(true),
        None,
        &json!({"attempts": [ok(false)], "crash_after_appends": 2}),
        "ok",
    );
    let mut opts = options(true);
    opts["journal"]["lease_generation"] = json!(2);
    opts["now_ms"] = json!(100);
    case(
        f,
        "journal_reconciled_in_progress_then_succeeded",
        &p,
        &opts,
        Some(&journal),
        &json!({"reconcile": [{"answer": "in_progress", "after_ms": 10}, {"answer": "succeeded", "after_ms": 10}]}),
        "completed",
    );
    case(
        f,
        "journal_reconciled_unknown_stops_indeterminate",
        &p,
        &opts,
        Some(&journal),
        &json!({"reconcile": [{"answer": "unknown"}]}),
        "stop_indeterminate",
    );
}

/// An answer with a passing output check.
fn checked(stream: bool) -> Value {
    let mut s = ok(stream);
    s["facts"]["output_checks"] =
        json!([{"kind": "empty", "validator": "builtin.empty", "verdict": "pass"}]);
    s
}

/// A streamed journaled run (plain, and under every fleet layer with output
/// checks) crashed after every number of appends, then resumed: the
/// consumer's log rebuilt from the journal's delta digests; a cut attempt
/// in doubt reconciled (`failed_no_effect` sends it again; `succeeded`
/// cannot be committed: `stop_indeterminate`).
fn stream_crash_cases(f: &mut Family) {
    let runs = [
        ("stream", None, "tentative", vec![cut(), ok(true)]),
        ("stream", None, "buffer", vec![cut(), ok(true)]),
        (
            "fleet_stream",
            fleets().swap_remove(4).1,
            "tentative",
            vec![cut(), ok(true)],
        ),
        (
            "fleet_stream_checked",
            fleets().swap_remove(4).1,
            "tentative",
            vec![cut(), checked(true)],
        ),
        (
            "fleet_stream_check_fails",
            fleets().swap_remove(4).1,
            "tentative",
            vec![cut(), invalid(true)],
        ),
    ];
    for (prefix, fleet, mode, steps) in runs {
        let p = policy(&fleet, Some(mode));
        let script = json!({"attempts": steps, "store": full_budget()});
        // Six appends finish the run: a crash after them is no crash.
        for k in 0..6u64 {
            let mut crashed = script.clone();
            crashed["crash_after_appends"] = json!(k);
            let name = format!("{prefix}_{mode}_journal_crash_after_{k}_appends");
            let (journal, now) = case(f, &name, &p, &options(true), None, &crashed, "ok");
            let Some((in_doubt, observed)) = crash_point(&journal) else {
                continue;
            };
            // An attempt with no effect is sent again: its step replays.
            let rest: Vec<Value> = script["attempts"].as_array().unwrap()[observed..].to_vec();
            let mut opts = options(true);
            opts["journal"]["lease_generation"] = json!(2);
            opts["now_ms"] = json!(now + 10);
            let answers: &[&str] = if in_doubt {
                &["failed_no_effect", "succeeded"]
            } else {
                &["failed_no_effect"]
            };
            for answer in answers {
                let resume = json!({"attempts": rest, "reconcile": [{"answer": answer}], "store": full_budget()});
                let (suffix, want) = if *answer == "succeeded" {
                    ("_reconciled_succeeded", "stop_indeterminate")
                } else {
                    ("", "terminal")
                };
                case(
                    f,
                    &format!("{prefix}_{mode}_journal_resumed_after_{k}_appends{suffix}"),
                    &p,
                    &opts,
                    Some(&journal),
                    &resume,
                    want,
                );
            }
        }
    }
}

fn job_policy(fleet: &Option<Value>, cancel: bool) -> String {
    let mut job = json!({"max_polls": 4, "poll_base_ms": 200, "poll_max_ms": 600});
    if cancel {
        job["cancel_left_running"] = json!(true);
    }
    let mut edits = vec![("/async_job", job)];
    if let Some(f) = fleet {
        edits.push(("/fleet", f.clone()));
    }
    t(&policy_with(&edits))
}

/// A job's answers: `status` the job's (with its id), `check` a failing
/// output check on the answer.
fn job_step(status: &str, check: bool) -> Value {
    let mut s = json!({"after_ms": 40, "facts": {"result": "returned"},
        "job_id": "job-7", "job_status": status});
    if check {
        s["facts"]["output_checks"] = json!([{"defects": [{"message": "the answer has no content"}],
            "kind": "empty", "validator": "builtin.empty", "verdict": "defects"}]);
    }
    s
}

/// An async job as a layer: submitted (retried after a refusal), accepted,
/// polled at the planned schedule until it completes; its output checks
/// judged on the final result only; the cancel of a job a cancelled run
/// would leave running; under a fleet (the submit admitted, the polls not)
/// and a journal, crashed after every number of appends and resumed (a
/// submit in doubt reconciled, never resubmitted after its acceptance; a
/// poll in doubt polled again).
fn job_cases(f: &mut Family) {
    let polled = vec![
        status(503, None),
        job_step("queued", true),
        job_step("in_progress", false),
        timeout(),
        job_step("completed", false),
    ];
    for (fleet_name, fleet) in [fleets().swap_remove(0), fleets().swap_remove(4)] {
        let p = job_policy(&fleet, false);
        for journal in [false, true] {
            let j = if journal { "_journal" } else { "" };
            case(
                f,
                &format!("{fleet_name}{j}_job_submitted_then_polled_to_completion"),
                &p,
                &options(journal),
                None,
                &json!({"attempts": polled, "store": full_budget()}),
                "completed",
            );
            let mut failed = polled.clone();
            failed[4] = job_step("completed", true);
            case(
                f,
                &format!("{fleet_name}{j}_job_output_check_fails_on_the_final_result"),
                &p,
                &options(journal),
                None,
                &json!({"attempts": failed, "store": full_budget()}),
                "stop_non_retryable",
            );
            case(
                f,
                &format!("{fleet_name}{j}_job_poll_bound_stops"),
                &p,
                &options(journal),
                None,
                &json!({"attempts": [job_step("queued", false), job_step("in_progress", false),
                    job_step("in_progress", false), job_step("in_progress", false),
                    job_step("in_progress", false)], "store": full_budget()}),
                "stop_total_attempts",
            );
            let cancels = job_policy(&fleet, true);
            case(
                f,
                &format!("{fleet_name}{j}_job_cancelled_while_waiting_cancels_the_job"),
                &cancels,
                &options(journal),
                None,
                &json!({"attempts": [job_step("queued", false), {"after_ms": 15, "facts": {"result": "returned"}}],
                    "cancel_sleeps": [0], "store": full_budget()}),
                "stop_cancelled",
            );
        }
        let script = json!({"attempts": polled, "store": full_budget()});
        // 2 appends open the run, 2 per attempt and 1 for the terminal.
        for k in 0..12u64 {
            let mut crashed = script.clone();
            crashed["crash_after_appends"] = json!(k);
            let name = format!("{fleet_name}_journal_job_crash_after_{k}_appends");
            let (journal, now) = case(f, &name, &p, &options(true), None, &crashed, "ok");
            let Some((in_doubt, observed)) = crash_point(&journal) else {
                continue;
            };
            let rest: Vec<Value> = script["attempts"].as_array().unwrap()[observed..].to_vec();
            let mut opts = options(true);
            opts["journal"]["lease_generation"] = json!(2);
            opts["now_ms"] = json!(now + 10);
            // A submit in doubt is asked about; a poll in doubt is polled
            // again without asking (it had no effect).
            let submit_in_doubt = in_doubt
                && journal.iter().rev().nth(1).is_some_and(|e| {
                    matches!(&e.payload, retryledger_core::journal::Payload::Reserved { dispatch, .. }
                        if dispatch.job.as_ref().is_some_and(|s| s.kind == retryledger_core::job::JobKind::Submit))
                });
            let answers: &[&str] = if submit_in_doubt {
                &["failed_no_effect", "succeeded"]
            } else {
                &["failed_no_effect"]
            };
            for answer in answers {
                // A submit accepted behind a lost answer: the receiver
                // reports the job's id.
                let resume = json!({"attempts": rest,
                    "reconcile": [{"answer": answer, "job_id": "job-7"}], "store": full_budget()});
                let suffix = if *answer == "succeeded" {
                    "_reconciled_succeeded"
                } else {
                    ""
                };
                case(
                    f,
                    &format!("{fleet_name}_journal_job_resumed_after_{k}_appends{suffix}"),
                    &p,
                    &opts,
                    Some(&journal),
                    &resume,
                    "terminal",
                );
            }
        }
    }
}

fn store_cases(f: &mut Family) {
    let all = fleets().swap_remove(4).1;
    let p = policy(&all, None);
    for journal in [false, true] {
        let j = if journal { "_journal" } else { "" };
        case(
            f,
            &format!("fleet{j}_write_conflict_reads_again"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": [ok(false)], "conflicts": [0]}),
            "completed",
        );
        case(
            f,
            &format!("fleet{j}_store_unreachable_fails_closed"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": [ok(false)], "unavailable": [0]}),
            "stop_store_unavailable",
        );
        let open = policy(&fleets().swap_remove(3).1, None);
        case(
            f,
            &format!("limits{j}_store_unreachable_fails_open"),
            &open,
            &options(journal),
            None,
            &json!({"attempts": [ok(false)], "unavailable": [0]}),
            "completed",
        );
        case(
            f,
            &format!("fleet{j}_cancelled_while_waiting_frees_its_slot"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": [status(429, Some("1")), ok(false)], "cancel_sleeps": [0], "store": full_budget()}),
            "stop_cancelled",
        );
        case(
            f,
            &format!("fleet{j}_conflicts_past_the_bound_are_store_conflict"),
            &p,
            &options(journal),
            None,
            &json!({"attempts": [ok(false)], "conflicts": [0, 1, 2, 3, 4, 5]}),
            "store_conflict",
        );
    }
}

fn refusal_cases(f: &mut Family) {
    let p = policy(&None, None);
    let base = |events: Value| {
        vec![
            ("policy", json!(p.clone())),
            ("options", json!(t(&options(true)))),
            ("events", json!(t(&events))),
        ]
    };
    f.add(
        "an_event_out_of_turn_is_unexpected",
        "machine",
        base(json!([{"kind": "clock", "now_ms": 5}])),
        "unexpected_event",
    );
    f.add(
        "a_refused_append_loses_the_run",
        "machine",
        base(json!([{"kind": "append_refused"}])),
        "journal_stale_lease",
    );
    let plain = vec![
        ("policy", json!(p.clone())),
        (
            "options",
            json!(t(&json!({"origin_epoch_ms": NOW_2026, "now_ms": 500}))),
        ),
        (
            "events",
            json!(t(
                &json!([{"completed_at_ms": 100, "facts": {"result": "returned"}, "kind": "observed"}])
            )),
        ),
    ];
    f.add(
        "a_completion_before_the_clock_is_clock_backwards",
        "machine",
        plain,
        "clock_backwards",
    );
    // A streamed run's empty journal (a lease claimed, nothing written)
    // starts the run like any other.
    let mut opts = options(true);
    opts["journal"]["lease_generation"] = json!(2);
    f.add(
        "a_stream_journal_resumed_from_an_empty_journal_starts_the_run",
        "machine",
        vec![
            ("policy", json!(policy(&None, Some("tentative")))),
            ("options", json!(t(&opts))),
            ("journal", json!("[]")),
            ("events", json!("[]")),
        ],
        "ok",
    );
}

/// Where a crashed run's journal stopped: `None` when it holds the terminal
/// (no crash), else whether an attempt was left in doubt (dispatched, not
/// observed) and how many attempts were observed.
fn crash_point(journal: &[JournalEvent]) -> Option<(bool, usize)> {
    use retryledger_core::journal::EventKind;
    let kind = |e: &JournalEvent| e.payload.kind();
    let last = journal.last().map(kind);
    if last == Some(EventKind::Terminal) {
        return None;
    }
    let observed = journal
        .iter()
        .filter(|e| kind(e) == EventKind::Observed)
        .count();
    Some((last == Some(EventKind::Dispatched), observed))
}
