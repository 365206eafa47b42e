//! `job.json`: provider asynchronous jobs, case by case.
//!
//! `job_session` cases run a scripted session whose steps report the job id
//! and status the host saw, and pin every judgement, decision, attempt, the
//! receipt (with its job summary) and the sealed bundle's verdict.
//! `verify_bundle` cases forge a sealed job run (a second submit after the
//! acceptance, an early poll, a poll past the bound, another job's id);
//! `validate_policy` cases pin the section's bounds.

use retryledger_core::lab;
use serde_json::{json, Value};

use crate::common::{policy_with, t};
use crate::family::Family;

const JOB_ID: &str = "resp_68af3c2e9b1a8190a1b2c3d4";

fn section(max_polls: u64, base: u64, max: u64) -> Value {
    json!({"max_polls": max_polls, "poll_base_ms": base, "poll_max_ms": max})
}

fn job_policy_value(max_polls: u64, base: u64, max: u64, deadline: u64) -> Value {
    policy_with(&[
        ("/async_job", section(max_polls, base, max)),
        ("/deadline_ms", json!(deadline)),
    ])
}

fn job_policy(max_polls: u64, base: u64, max: u64, deadline: u64) -> String {
    t(&job_policy_value(max_polls, base, max, deadline))
}

/// [`job_policy`] with `cancel_left_running`: a job the run would leave
/// running is cancelled first, and the cancel recorded.
fn cancelling_policy(max_polls: u64, base: u64, max: u64, deadline: u64) -> String {
    let mut v = job_policy_value(max_polls, base, max, deadline);
    v["async_job"]["cancel_left_running"] = json!(true);
    t(&v)
}

/// The cancel of the job, accepted by the provider.
fn cancel_accepted() -> Value {
    json!({"duration_ms": 40, "facts": {"result": "returned"}, "job": {"id": JOB_ID}})
}

/// A submit the provider accepted, answering `status`.
fn accepted(status: Option<&str>) -> Value {
    let mut job = json!({"id": JOB_ID});
    if let Some(s) = status {
        job["status"] = json!(s);
    }
    json!({"duration_ms": 80, "facts": {"result": "returned"}, "job": job})
}

/// A poll of the job that answered `status`.
fn polled(status: &str) -> Value {
    json!({"duration_ms": 30, "facts": {"result": "returned"}, "job": {"id": JOB_ID, "status": status}})
}

/// An attempt that raised with an HTTP status (and optional headers).
fn raised(status: u64, headers: Value) -> Value {
    json!({"duration_ms": 30, "facts": {"error_types": ["APIStatusError", "APIError"], "headers": headers, "result": "raised", "status": status}})
}

/// An attempt whose connection dropped after the request was sent.
fn dropped() -> Value {
    json!({"duration_ms": 50, "facts": {"error_types": ["APIConnectionError", "APIError"], "result": "raised"}})
}

/// An attempt that timed out before any answer.
fn timed_out() -> Value {
    json!({"duration_ms": 600, "facts": {"error_types": ["APITimeoutError", "APIConnectionError", "APIError"], "result": "raised"}})
}

/// A poll that raised, reporting the job id it asked about.
fn poll_raised(mut step: Value) -> Value {
    step["job"] = json!({"id": JOB_ID});
    step
}

pub fn family() -> Family {
    let mut f = Family::new(
        "job",
        "job_session: a provider asynchronous job step by step (submit, acceptance, polls by the job id; judgement, decision, attempts, receipt with its job summary, sealed bundle and its verdict); verify_bundle of forged job runs; validate_policy of the async_job section.",
        "acceptance with and without an initial status, a submit answered completed or failed at once, polls through queued and in_progress to every final status (completed, failed, cancelled, incomplete, expired), the poll schedule (base doubling to the maximum) and a poll's Retry-After floor, submits retried before the acceptance (429, 503 onto the fallback route), a lost submit answer (dropped connection, timeout) stopping indeterminate, a non-retryable submit, polls that fail retryably, lose their answer or find the job gone, the poll bound and the deadline (job left running), a completion after the deadline, cancellation between polls; under cancel_left_running the planned cancel of a job left running (at the deadline, after a completion past it, after the poll bound, after the caller's cancellation, after a poll finding the job gone; accepted, refused, answer lost; none when the job completed or was never accepted); errors: another job's id, an acceptance without an id, a poll without a status, a failure with a status, an unknown status; forged bundles (second submit after acceptance, early poll, poll past the bound, record missing or unexpected, poll number, job id, receipt summary; a cancel not planned, a second cancel, a cancel of another job, a poll or submit after the cancel, a cancel with a status, a planned cancel missing, a cancel before the caller's cancellation); section bounds",
    );
    let session = |f: &mut Family, name: &str, policy: &str, script: Vec<Value>, want: &str| {
        f.add(
            name,
            "job_session",
            vec![
                ("policy", json!(policy)),
                ("script", json!(t(&json!(script)))),
            ],
            want,
        );
    };
    let p = job_policy(6, 200, 1_000, 20_000);

    // Acceptance and every job state.
    session(
        &mut f,
        "job_completed_first_poll",
        &p,
        vec![accepted(Some("queued")), polled("completed")],
        "completed",
    );
    session(
        &mut f,
        "job_completed_after_polls",
        &p,
        vec![
            accepted(Some("queued")),
            polled("queued"),
            polled("in_progress"),
            polled("in_progress"),
            polled("in_progress"),
            polled("completed"),
        ],
        "polls\":5",
    );
    session(
        &mut f,
        "job_accepted_without_status",
        &p,
        vec![accepted(None), polled("completed")],
        "completed",
    );
    session(
        &mut f,
        "job_submit_answered_completed",
        &p,
        vec![accepted(Some("completed"))],
        "polls\":0",
    );
    session(
        &mut f,
        "job_submit_answered_failed",
        &p,
        vec![accepted(Some("failed"))],
        "stop_non_retryable",
    );
    for status in ["failed", "cancelled", "incomplete", "expired"] {
        session(
            &mut f,
            &format!("job_poll_{status}"),
            &p,
            vec![
                accepted(Some("queued")),
                polled("in_progress"),
                polled(status),
            ],
            "stop_non_retryable",
        );
    }

    // Before the acceptance: the usual retry rules.
    session(
        &mut f,
        "job_submit_rate_limited_then_accepted",
        &p,
        vec![
            raised(429, json!([["retry-after-ms", "700"]])),
            accepted(Some("queued")),
            polled("completed"),
        ],
        "submits\":2",
    );
    session(
        &mut f,
        "job_submit_fallback_then_polls",
        &p,
        vec![
            raised(503, json!([])),
            raised(503, json!([])),
            accepted(Some("in_progress")),
            polled("completed"),
        ],
        "external-fallback",
    );
    session(
        &mut f,
        "job_submit_rejected",
        &p,
        vec![raised(400, json!([]))],
        "stop_non_retryable",
    );
    // A lost submit answer is never resubmitted blind.
    session(
        &mut f,
        "job_submit_connection_dropped",
        &p,
        vec![dropped()],
        "stop_indeterminate",
    );
    session(
        &mut f,
        "job_submit_timed_out",
        &p,
        vec![timed_out()],
        "stop_indeterminate",
    );

    // A lost submit answer reconciled by idempotency key.
    let reconciled = |answer: &str, job: Option<Value>| {
        let mut s = dropped();
        s["reconciled"] = json!(answer);
        if let Some(j) = job {
            s["job"] = j;
        }
        s
    };
    session(
        &mut f,
        "job_lost_submit_reconciled_accepted",
        &p,
        vec![
            reconciled(
                "succeeded",
                Some(json!({"id": JOB_ID, "status": "in_progress"})),
            ),
            polled("completed"),
        ],
        "reconciled\":\"succeeded",
    );
    session(
        &mut f,
        "job_lost_submit_reconciled_no_effect",
        &p,
        vec![
            reconciled("failed_no_effect", None),
            accepted(Some("queued")),
            polled("completed"),
        ],
        "submits\":2",
    );
    session(
        &mut f,
        "job_lost_submit_reconciled_unknown",
        &p,
        vec![reconciled("unknown", None)],
        "stop_indeterminate",
    );
    session(
        &mut f,
        "job_lost_submit_reconciled_without_id",
        &p,
        vec![reconciled("succeeded", None)],
        "job_id_missing",
    );

    // Polls that fail.
    session(
        &mut f,
        "job_poll_rate_limited_hint",
        &p,
        vec![
            accepted(Some("queued")),
            poll_raised(raised(429, json!([["retry-after-ms", "1500"]]))),
            polled("completed"),
        ],
        "retry_after_floor_ms\":1500",
    );
    session(
        &mut f,
        "job_poll_connection_dropped",
        &p,
        vec![
            accepted(Some("queued")),
            poll_raised(dropped()),
            polled("completed"),
        ],
        "completed",
    );
    session(
        &mut f,
        "job_poll_unavailable",
        &p,
        vec![
            accepted(Some("queued")),
            poll_raised(raised(503, json!([]))),
            polled("completed"),
        ],
        "completed",
    );
    session(
        &mut f,
        "job_poll_not_found",
        &p,
        vec![
            accepted(Some("queued")),
            poll_raised(raised(404, json!([]))),
        ],
        "stop_non_retryable",
    );

    // Bounds: polls, deadline, cancellation.
    let bounded = job_policy(3, 200, 1_000, 20_000);
    session(
        &mut f,
        "job_poll_bound",
        &bounded,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
            polled("in_progress"),
        ],
        "left_running\":true",
    );
    let short = job_policy(10, 1_000, 4_000, 5_000);
    session(
        &mut f,
        "job_poll_deadline",
        &short,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
        ],
        "stop_deadline",
    );
    session(
        &mut f,
        "job_completed_after_deadline",
        &short,
        vec![
            accepted(Some("queued")),
            json!({"duration_ms": 4_000, "facts": {"result": "returned"}, "job": {"id": JOB_ID, "status": "completed"}}),
        ],
        "stop_deadline",
    );
    session(
        &mut f,
        "job_cancelled_between_polls",
        &p,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            json!({"cancel": true}),
        ],
        "stop_cancelled",
    );

    // cancel_left_running: the run that would leave the job running
    // plans one cancel of it, recorded with its outcome, then ends with the
    // terminal that planned it.
    let short_cancel = cancelling_policy(10, 1_000, 4_000, 5_000);
    let p_cancel = cancelling_policy(6, 200, 1_000, 20_000);
    let bounded_cancel = cancelling_policy(3, 200, 1_000, 20_000);
    let at_deadline = || {
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
        ]
    };
    let with = |mut v: Vec<Value>, last: Value| {
        v.push(last);
        v
    };
    session(
        &mut f,
        "job_cancel_planned_not_recorded",
        &short_cancel,
        at_deadline(),
        "run_not_terminal",
    );
    session(
        &mut f,
        "job_cancel_at_deadline_accepted",
        &short_cancel,
        with(at_deadline(), cancel_accepted()),
        "cancel\":\"accepted",
    );
    session(
        &mut f,
        "job_cancel_at_deadline_refused",
        &short_cancel,
        with(at_deadline(), poll_raised(raised(503, json!([])))),
        "cancel\":\"failed",
    );
    session(
        &mut f,
        "job_cancel_answer_lost",
        &short_cancel,
        with(at_deadline(), poll_raised(dropped())),
        "stop_deadline",
    );
    session(
        &mut f,
        "job_cancel_after_completion_past_deadline",
        &short_cancel,
        vec![
            accepted(Some("queued")),
            json!({"duration_ms": 4_500, "facts": {"result": "returned"}, "job": {"id": JOB_ID, "status": "in_progress"}}),
            cancel_accepted(),
        ],
        "stop_deadline",
    );
    session(
        &mut f,
        "job_cancel_after_poll_bound",
        &bounded_cancel,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
            polled("in_progress"),
            cancel_accepted(),
        ],
        "stop_total_attempts",
    );
    session(
        &mut f,
        "job_cancel_after_caller_cancellation",
        &p_cancel,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            json!({"cancel": true}),
            cancel_accepted(),
        ],
        "stop_cancelled",
    );
    session(
        &mut f,
        "job_cancel_after_poll_not_found",
        &p_cancel,
        vec![
            accepted(Some("queued")),
            poll_raised(raised(404, json!([]))),
            poll_raised(raised(404, json!([]))),
        ],
        "stop_non_retryable",
    );
    session(
        &mut f,
        "job_cancel_not_planned_when_completed",
        &p_cancel,
        vec![accepted(Some("queued")), polled("completed")],
        "completed",
    );
    session(
        &mut f,
        "job_cancel_not_planned_when_failed",
        &p_cancel,
        vec![accepted(Some("queued")), polled("failed")],
        "left_running\":false",
    );
    session(
        &mut f,
        "job_cancel_not_planned_before_acceptance",
        &p_cancel,
        vec![dropped()],
        "stop_indeterminate",
    );
    session(
        &mut f,
        "job_cancel_other_job",
        &short_cancel,
        with(
            at_deadline(),
            json!({"duration_ms": 40, "facts": {"result": "returned"}, "job": {"id": "resp_other"}}),
        ),
        "job_id_drift",
    );
    session(
        &mut f,
        "job_cancel_with_status",
        &short_cancel,
        with(
            at_deadline(),
            json!({"duration_ms": 40, "facts": {"result": "returned"}, "job": {"id": JOB_ID, "status": "cancelled"}}),
        ),
        "job_status_drift",
    );
    session(
        &mut f,
        "job_cancel_twice",
        &short_cancel,
        with(with(at_deadline(), cancel_accepted()), cancel_accepted()),
        "attempt_after_terminal",
    );
    session(
        &mut f,
        "job_cancelled_again_while_cancel_planned",
        &p_cancel,
        vec![
            accepted(Some("queued")),
            json!({"cancel": true}),
            json!({"cancel": true}),
        ],
        "cancel_drift",
    );

    // Facts that do not fit.
    session(
        &mut f,
        "job_poll_other_job",
        &p,
        vec![
            accepted(Some("queued")),
            json!({"duration_ms": 30, "facts": {"result": "returned"}, "job": {"id": "resp_other", "status": "completed"}}),
        ],
        "job_id_drift",
    );
    session(
        &mut f,
        "job_accepted_without_id",
        &p,
        vec![
            json!({"duration_ms": 80, "facts": {"result": "returned"}, "job": {"status": "queued"}}),
        ],
        "job_id_missing",
    );
    session(
        &mut f,
        "job_poll_without_status",
        &p,
        vec![
            accepted(Some("queued")),
            json!({"duration_ms": 30, "facts": {"result": "returned"}, "job": {"id": JOB_ID}}),
        ],
        "job_status_drift",
    );
    session(
        &mut f,
        "job_failure_with_status",
        &p,
        vec![
            accepted(Some("queued")),
            json!({"duration_ms": 30, "facts": {"error_types": ["APIStatusError"], "result": "raised", "status": 503}, "job": {"id": JOB_ID, "status": "in_progress"}}),
        ],
        "job_status_drift",
    );
    session(
        &mut f,
        "job_unknown_status",
        &p,
        vec![
            json!({"duration_ms": 80, "facts": {"result": "returned"}, "job": {"id": JOB_ID, "status": "done"}}),
        ],
        "invalid_value",
    );

    forged(&mut f, &p, &bounded);
    forged_cancel(&mut f, &short_cancel, &p_cancel);

    // The section's bounds.
    f.policy("job_policy_valid", &p, "ok");
    let bad = |f: &mut Family, name: &str, s: Value| {
        let v = policy_with(&[("/async_job", s)]);
        f.policy(name, &t(&v), "invalid_async_job");
    };
    bad(&mut f, "job_policy_zero_polls", section(0, 200, 1_000));
    bad(
        &mut f,
        "job_policy_too_many_polls",
        section(10_001, 200, 1_000),
    );
    bad(&mut f, "job_policy_zero_base", section(5, 0, 1_000));
    bad(&mut f, "job_policy_max_below_base", section(5, 500, 400));
    bad(&mut f, "job_policy_max_at_deadline", section(5, 200, 5_000));
    f.policy("job_policy_cancel_left_running", &p_cancel, "ok");
    let mut off = section(5, 200, 1_000);
    off["cancel_left_running"] = json!(false);
    bad(&mut f, "job_policy_cancel_left_running_false", off);
    let mut streamed = job_policy_value(5, 200, 1_000, 20_000);
    streamed["stream"] = json!({"max_response_bytes": 65_536, "mode": "buffer"});
    f.policy("job_policy_with_stream", &t(&streamed), "invalid_async_job");
    f
}

/// A sealed job bundle from a session script.
fn sealed(policy: &str, script: Vec<Value>) -> Value {
    let bundle = lab::job_bundle(policy, &t(&json!(script))).expect("a session");
    retryledger_core::canonical::to_value(&bundle)
}

/// Forged bundles: each changes one thing of a verified job run.
fn forged(f: &mut Family, p: &str, bounded: &str) {
    let base = sealed(
        p,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("completed"),
        ],
    );
    f.verify("job_verify_sealed", &t(&base), "verified");

    // The first poll recorded as a second submit.
    let mut b = base.clone();
    b["attempts"]["attempts"][1]["job"] = json!({"job_sha256": base["attempts"]["attempts"][1]["job"]["job_sha256"], "kind": "submit", "status": "in_progress"});
    f.verify("job_verify_second_submit", &t(&b), "job_resubmit");

    // A poll started before its planned time.
    let mut b = base.clone();
    let planned = base["receipt"]["schedule"][1]["not_before_ms"]
        .as_u64()
        .expect("not_before");
    b["attempts"]["attempts"][1]["started_at_ms"] = json!(planned - 1);
    f.verify("job_verify_early_poll", &t(&b), "early_start");

    // A poll of another job.
    let mut b = base.clone();
    b["attempts"]["attempts"][2]["job"]["job_sha256"] = json!(crate::common::id("resp_other"));
    f.verify("job_verify_other_job", &t(&b), "job_id_drift");

    // A poll's number changed.
    let mut b = base.clone();
    b["attempts"]["attempts"][2]["job"]["poll"] = json!(3);
    f.verify("job_verify_poll_number", &t(&b), "job_kind_drift");

    // The job record removed.
    let mut b = base.clone();
    b["attempts"]["attempts"][1]
        .as_object_mut()
        .expect("attempt")
        .remove("job");
    f.verify("job_verify_record_missing", &t(&b), "job_record_missing");

    // The same attempts under a policy without the section.
    let mut b = base.clone();
    b["policy"]
        .as_object_mut()
        .expect("policy")
        .remove("async_job");
    f.verify(
        "job_verify_record_unexpected",
        &t(&b),
        "job_record_unexpected",
    );

    // The receipt says the job was left running.
    let mut b = base.clone();
    b["receipt"]["job"]["left_running"] = json!(true);
    f.verify("job_verify_summary_changed", &t(&b), "receipt_mismatch");

    // A poll past the bound.
    let run = sealed(
        bounded,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
            polled("in_progress"),
        ],
    );
    f.verify("job_verify_bound_sealed", &t(&run), "verified");
    let mut b = run.clone();
    let attempts = b["attempts"]["attempts"].as_array_mut().expect("attempts");
    let mut extra = attempts.last().expect("a poll").clone();
    let at = extra["completed_at_ms"].as_u64().expect("completed") + 1_000;
    extra["ordinal"] = json!(5);
    extra["job"]["poll"] = json!(4);
    extra["started_at_ms"] = json!(at);
    extra["completed_at_ms"] = json!(at + 30);
    attempts.push(extra);
    f.verify("job_verify_poll_past_bound", &t(&b), "job_poll_bound");
}

/// Forged bundles of runs that cancel the job they left running.
fn forged_cancel(f: &mut Family, short: &str, p: &str) {
    let base = sealed(
        short,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            polled("in_progress"),
            cancel_accepted(),
        ],
    );
    f.verify("job_verify_cancel_sealed", &t(&base), "verified");
    let cancel = base["attempts"]["attempts"][3].clone();
    let push = |b: &mut Value, mut extra: Value, kind: Value| {
        let attempts = b["attempts"]["attempts"].as_array_mut().expect("attempts");
        let at = extra["completed_at_ms"].as_u64().expect("completed");
        extra["ordinal"] = json!(attempts.len() + 1);
        extra["started_at_ms"] = json!(at);
        extra["completed_at_ms"] = json!(at + 40);
        extra["job"] = kind;
        attempts.push(extra);
    };

    // The same run under a policy without cancel_left_running: the core
    // planned no cancel.
    let mut b = base.clone();
    b["policy"]["async_job"]
        .as_object_mut()
        .expect("section")
        .remove("cancel_left_running");
    f.verify("job_verify_cancel_not_planned", &t(&b), "job_kind_drift");

    // A second cancel.
    let mut b = base.clone();
    push(&mut b, cancel.clone(), cancel["job"].clone());
    f.verify("job_verify_second_cancel", &t(&b), "job_kind_drift");

    // A poll after the cancel.
    let mut b = base.clone();
    let mut poll = cancel["job"].clone();
    poll["kind"] = json!("poll");
    poll["poll"] = json!(3);
    poll["status"] = json!("in_progress");
    push(&mut b, cancel.clone(), poll);
    f.verify("job_verify_poll_after_cancel", &t(&b), "job_kind_drift");

    // A submit after the cancel.
    let mut b = base.clone();
    let mut submit = cancel["job"].clone();
    submit["kind"] = json!("submit");
    submit["status"] = json!("queued");
    push(&mut b, cancel.clone(), submit);
    f.verify("job_verify_submit_after_cancel", &t(&b), "job_resubmit");

    // The cancel of another job.
    let mut b = base.clone();
    b["attempts"]["attempts"][3]["job"]["job_sha256"] = json!(crate::common::id("resp_other"));
    f.verify("job_verify_cancel_other_job", &t(&b), "job_id_drift");

    // A cancel recorded where the second poll was planned.
    let mut b = base.clone();
    let rec = b["attempts"]["attempts"][2]["job"]
        .as_object_mut()
        .expect("job");
    rec.remove("poll");
    rec.remove("status");
    rec.insert("kind".into(), json!("cancel"));
    f.verify(
        "job_verify_cancel_instead_of_poll",
        &t(&b),
        "job_kind_drift",
    );

    // A cancel that records a status.
    let mut b = base.clone();
    b["attempts"]["attempts"][3]["job"]["status"] = json!("cancelled");
    f.verify("job_verify_cancel_with_status", &t(&b), "job_status_drift");

    // The planned cancel left out.
    let mut b = base.clone();
    b["attempts"]["attempts"]
        .as_array_mut()
        .expect("attempts")
        .pop();
    f.verify("job_verify_cancel_missing", &t(&b), "run_not_terminal");

    // The receipt says the cancel failed.
    let mut b = base.clone();
    b["receipt"]["job"]["cancel"] = json!("failed");
    f.verify(
        "job_verify_cancel_summary_changed",
        &t(&b),
        "receipt_mismatch",
    );

    // After the caller's cancellation: the cancel comes after it.
    let run = sealed(
        p,
        vec![
            accepted(Some("queued")),
            polled("in_progress"),
            json!({"cancel": true}),
            cancel_accepted(),
        ],
    );
    f.verify("job_verify_caller_cancel_sealed", &t(&run), "verified");
    // The cancellation moved after the cancel's start.
    let mut b = run.clone();
    let started = run["attempts"]["attempts"][2]["started_at_ms"]
        .as_u64()
        .expect("started");
    b["attempts"]["cancelled_at_ms"] = json!(started + 1);
    f.verify(
        "job_verify_cancel_before_cancellation",
        &t(&b),
        "early_start",
    );
}
