//! Runs admitted under admission limits, and their bundles replayed and tampered.

use super::*;

pub(super) fn run_cases(f: &mut Family) {
    let policy = |a: Value, edits: &[(&str, Value)]| {
        let mut all = vec![(
            "/fleet",
            json!({"admission": a, "on_store_unavailable": "fail_closed"}),
        )];
        all.extend(edits.iter().map(|(k, v)| (*k, v.clone())));
        t(&policy_with(&all))
    };
    let bundle = |p: &str, store: Value, script: Vec<Value>| {
        let (_, _, b) = lab::admission_session(p, &t(&store), &t(&json!(script)))
            .unwrap_or_else(|e| panic!("a run: {e:?}"));
        retryledger_core::canonical::to_value(&b)
    };
    let p = policy(cfg(), &[]);
    let at_once = bundle(&p, json!([]), vec![at(T0), succeeds()]);
    assert_eq!(
        at_once["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"],
        json!(0)
    );
    f.verify("admission_run_admitted_at_once", &t(&at_once), "verified");

    let queued = bundle(
        &p,
        json!([snap(&[("request_level_milli", json!(0))])]),
        vec![at(T0), succeeds()],
    );
    assert_eq!(
        queued["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"],
        json!(100)
    );
    assert_eq!(queued["receipt"]["fleet"]["queue_wait_ms"], json!(100));
    f.verify(
        "admission_run_queued_behind_a_spent_bucket",
        &t(&queued),
        "verified",
    );

    let retried = bundle(
        &p,
        json!([snap(&[("request_level_milli", json!(1_000))])]),
        vec![at(T0), fails(), at(T0 + 240), succeeds()],
    );
    f.verify(
        "admission_run_retried_after_a_release",
        &t(&retried),
        "completed",
    );

    // The failure's response said no request is left for 500 ms: the retry's
    // admission waits for the reset (empty then, one request 100 ms later).
    let exhausted = json!({"observe": {"duration_ms": 40, "facts": {"result": "raised", "status": 429},
        "headers": [["x-ratelimit-remaining-requests", "0"], ["x-ratelimit-reset-requests", "500ms"]]}});
    let held = bundle(
        &p,
        json!([]),
        vec![at(T0), exhausted, at(T0 + 240), succeeds()],
    );
    assert_eq!(
        held["attempts"]["attempts"][1]["admission"]["limits"]["start_epoch_ms"],
        json!(T0 + 40 + 500 + 100)
    );
    f.verify(
        "admission_run_retry_held_until_the_rate_limit_reset",
        &t(&held),
        "completed",
    );

    let full = snap(&[("in_flight", json!(2)), ("request_level_milli", json!(0))]);
    let short = policy(json!({"max_in_flight": 2, "max_queue_ms": 50}), &[]);
    let polled = bundle(
        &short,
        json!([full]),
        vec![at(T0), at(T0 + 20), at(T0 + 40)],
    );
    f.verify(
        "admission_run_stopped_by_the_queue_bound",
        &t(&polled),
        "stop_admission",
    );

    let late = policy(
        json!({"max_queue_ms": 5_000, "request_burst": 1, "requests_per_second": 1}),
        &[("/deadline_ms", json!(500))],
    );
    let spent = json!([{
        "generation": 3, "in_flight": 0, "request_level_milli": 0, "requests_at_epoch_ms": T0,
        "route_release_sha256": primary(), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": T0, "updated_at_epoch_ms": T0,
    }]);
    let no_room = bundle(&late, spent.clone(), vec![at(T0)]);
    f.verify(
        "admission_run_stopped_for_the_deadline",
        &t(&no_room),
        "stop_admission",
    );

    // Tampering.
    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"] = json!(2_000);
    f.verify(
        "admission_verify_queue_wait_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["start_epoch_ms"] = json!(T0 + 50);
    f.verify(
        "admission_verify_start_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("start_epoch_ms");
    f.verify(
        "admission_verify_start_removed",
        &t(&resealed_or(b)),
        "admission_drift",
    );

    let mut b = queued.clone();
    b["fleet_snapshots"]["admissions"][0]["generation"] = json!(7);
    f.verify(
        "admission_verify_snapshot_altered",
        &t(&b),
        "snapshot_missing",
    );

    // A forger who replaces the spent snapshot by a full one and re-seals:
    // the queue wait no longer follows.
    let fresh = snap(&[]);
    let mut b = queued.clone();
    b["fleet_snapshots"]["admissions"][0] = fresh.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["snapshot_sha256"] = json!(digest(&fresh));
    f.verify(
        "admission_verify_queue_without_cause",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = at_once.clone();
    b["attempts"]["attempts"][0]["admission"]
        .as_object_mut()
        .expect("admission")
        .remove("limits");
    f.verify(
        "admission_verify_limits_removed",
        &t(&resealed_or(b)),
        "admission_drift",
    );

    let mut b = at_once.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["tokens"] = json!(5);
    f.verify(
        "admission_verify_tokens_without_a_bucket",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = no_room.clone();
    let roomy = snap(&[
        ("request_level_milli", json!(1_000)),
        ("generation", json!(3)),
    ]);
    b["fleet_snapshots"]["admissions"][0] = roomy.clone();
    b["attempts"]["fleet_stop"]["limits"]["snapshot_sha256"] = json!(digest(&roomy));
    f.verify(
        "admission_verify_stop_the_snapshot_admits",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = polled.clone();
    b["attempts"]["fleet_stop"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("snapshot_sha256");
    f.verify(
        "admission_verify_stop_without_its_snapshot",
        &t(&resealed_or(b)),
        "error",
    );
}
