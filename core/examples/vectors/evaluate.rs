//! `evaluate.json`.

use retryledger_core::lab;
use retryledger_core::limits::MAX_SAFE_INTEGER;
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, Outcome};
use serde_json::json;

use crate::common::{
    down, edited, empty_attempts, id, in_progress, policy_with, reference, rl, run, s, set,
    success, t, timeout, truncated,
};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "evaluate",
        "evaluate: the full receipt of a finished run for every terminal, and the errors for runs that have not ended or drift.",
        "evaluate's receipt (digests, schedule, counts, cost, fallback and degraded flags, final route) for each terminal incl. zero-attempt runs, the degraded fallback, jittered receipts in the jitter family; run_not_terminal on empty and partial runs; drift and decode errors through evaluate",
    );
    let r = reference();
    let pt = t(&r);
    let steps = lab::reference_steps();
    let ra = run(&r, &steps);
    f.eval("receipt_reference_run", &pt, &t(&ra), "completed");
    f.eval(
        "receipt_completed_on_primary",
        &pt,
        &t(&run(&r, &[s(success(), 300, 900)])),
        "completed",
    );
    let generic = id("behavior: generic summary v1");
    let degraded = policy_with(&[
        ("/routes/1/behavior_class_sha256", json!(generic)),
        ("/allowed_degraded_behavior_classes", json!([generic])),
    ]);
    f.eval(
        "receipt_completed_on_degraded_fallback",
        &t(&degraded),
        &t(&run(&degraded, &steps)),
        "completed",
    );
    f.eval(
        "receipt_degraded_route_failing_is_not_degraded",
        &t(&degraded),
        &t(&run(
            &degraded,
            &[
                s(down(), 10, 0),
                s(down(), 10, 0),
                s(
                    Outcome::NonRetryable {
                        kind: NonRetryableKind::Rejected,
                    },
                    10,
                    0,
                ),
            ],
        )),
        "stop_non_retryable",
    );
    f.eval(
        "receipt_stop_non_retryable",
        &pt,
        &t(&run(
            &r,
            &[s(
                Outcome::NonRetryable {
                    kind: NonRetryableKind::PolicyDenied,
                },
                300,
                40,
            )],
        )),
        "stop_non_retryable",
    );
    f.eval(
        "receipt_stop_indeterminate",
        &pt,
        &t(&run(
            &r,
            &[
                s(rl(250), 1_100, 0),
                s(
                    Outcome::Indeterminate {
                        kind: IndeterminateKind::StreamInterruptedAfterOutput,
                    },
                    100,
                    700,
                ),
            ],
        )),
        "stop_indeterminate",
    );
    let two = policy_with(&[("/max_total_attempts", json!(2))]);
    f.eval(
        "receipt_stop_total_attempts",
        &t(&two),
        &t(&run(&two, &steps)),
        "stop_total_attempts",
    );
    let one_fallback = policy_with(&[("/routes/1/max_attempts", json!(1))]);
    f.eval(
        "receipt_stop_route_exhausted",
        &t(&one_fallback),
        &t(&run(
            &one_fallback,
            &[s(down(), 10, 0), s(down(), 10, 0), s(timeout(), 400, 0)],
        )),
        "stop_route_exhausted",
    );
    f.eval(
        "receipt_stop_cost_budget_spent",
        &pt,
        &t(&run(&r, &[s(down(), 10, 4_000), s(success(), 10, 6_001)])),
        "stop_cost_budget",
    );
    let tight = policy_with(&[("/max_total_cost", json!(2_500))]);
    f.eval(
        "receipt_stop_cost_budget_reservation",
        &t(&tight),
        &t(&run(&tight, &steps)),
        "stop_cost_budget",
    );
    let tiny = policy_with(&[("/max_total_cost", json!(1_000))]);
    f.eval(
        "receipt_stop_cost_budget_with_zero_attempts",
        &t(&tiny),
        &t(&empty_attempts()),
        "stop_cost_budget",
    );
    let late = policy_with(&[("/deadline_ms", json!(2_300))]);
    f.eval(
        "receipt_stop_deadline_late_success",
        &t(&late),
        &t(&run(&late, &steps)),
        "stop_deadline",
    );
    let d1600 = policy_with(&[("/deadline_ms", json!(1_600))]);
    f.eval(
        "receipt_stop_deadline_before_dispatch",
        &t(&d1600),
        &t(&run(&d1600, &steps)),
        "stop_deadline",
    );
    let mut cancelled = run(&r, &steps[..1]);
    set(&mut cancelled, "/cancelled_at_ms", json!(1_200));
    f.eval(
        "receipt_stop_cancelled",
        &pt,
        &t(&cancelled),
        "stop_cancelled",
    );
    let mut cancel_empty = empty_attempts();
    set(&mut cancel_empty, "/cancelled_at_ms", json!(5));
    f.eval(
        "receipt_stop_cancelled_with_zero_attempts",
        &pt,
        &t(&cancel_empty),
        "stop_cancelled",
    );
    f.eval(
        "receipt_run_not_terminal_empty",
        &pt,
        &t(&empty_attempts()),
        "run_not_terminal",
    );
    f.eval(
        "receipt_run_not_terminal_partial",
        &pt,
        &t(&truncated(&ra, 2)),
        "run_not_terminal",
    );
    f.eval(
        "receipt_drift_early_start",
        &pt,
        &t(&edited(&ra, &[("/attempts/1/started_at_ms", json!(1_349))])),
        "early_start",
    );
    f.eval(
        "receipt_drift_cost_after_terminal",
        &pt,
        &t(&edited(
            &ra,
            &[("/attempts/0/cost", json!(MAX_SAFE_INTEGER))],
        )),
        "attempt_after_terminal",
    );
    f.eval(
        "receipt_invalid_policy",
        &t(&policy_with(&[(
            "/routes/1/supports_idempotency",
            json!(false),
        )])),
        &t(&ra),
        "idempotency_unsupported",
    );
    f.eval(
        "receipt_policy_decode_error_before_attempts",
        "{\"schema\":null}",
        "[",
        "null_value",
    );
    f.eval(
        "receipt_attempts_decode_error",
        &pt,
        "{\"attempts\":[]}",
        "missing_field",
    );
    // A timeout retried under the same key while the first request runs:
    // 409 in progress, then the replayed answer completes on the same route.
    let replayed = run(
        &r,
        &[
            s(timeout(), 1_000, 0),
            s(in_progress(1_000), 20, 0),
            s(success(), 30, 1_500),
        ],
    );
    f.eval(
        "receipt_in_progress_then_replayed_on_the_same_route",
        &pt,
        &t(&replayed),
        "completed",
    );
    let unknown = run(
        &r,
        &[
            s(timeout(), 1_000, 0),
            s(in_progress(1_000), 20, 0),
            s(in_progress(1_000), 20, 0),
            s(in_progress(1_000), 20, 0),
        ],
    );
    f.eval(
        "receipt_in_progress_until_total_attempts_is_indeterminate",
        &pt,
        &t(&unknown),
        "stop_indeterminate",
    );
    f.eval(
        "receipt_in_progress_ask_not_yet_made_is_not_terminal",
        &pt,
        &t(&truncated(&replayed, 2)),
        "run_not_terminal",
    );
    f
}
