//! `verify_bundle` of tampered admissions and snapshots.

use super::*;

/// Re-seal a tampered bundle's receipt, as a forger would.
fn resealed(mut b: Value) -> Value {
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    b
}

fn digest(v: &Value) -> String {
    api::digest(&t(v)).expect("a document")
}

pub(super) fn tamper_cases(f: &mut Family) {
    let p = fleet_policy(consecutive(2, 1), Some(budget_cfg()), "fail_closed", &[]);
    let bundle = |store: Value, script: Vec<Value>| {
        let b = lab::fleet_bundle(&p, &t(&store), &t(&json!(script))).expect("a run");
        retryledger_core::canonical::to_value(&b)
    };
    let skipped = bundle(
        json!({"breakers": {primary(): open_at(&primary(), T0, 3)}}),
        vec![admit(T0 + 100), succeeds()],
    );
    f.verify("fleet_verify_skip", &t(&skipped), "verified");

    let mut b = skipped.clone();
    b["fleet_snapshots"]["breakers"][0]["generation"] = json!(4);
    f.verify("fleet_verify_snapshot_altered", &t(&b), "snapshot_missing");

    // A forger who replaces the open snapshot by a closed one, updates the
    // reference and re-seals: the skip no longer follows.
    let closed = snap(&primary(), &[]);
    let mut b = skipped.clone();
    b["fleet_snapshots"]["breakers"][0] = closed.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["snapshot_sha256"] =
        json!(digest(&closed));
    f.verify(
        "fleet_verify_skip_of_an_admitting_route",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["breaker"]["probe"] = json!(true);
    f.verify(
        "fleet_verify_probe_flag_flipped",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["breaker"]["generation"] = json!(9);
    f.verify(
        "fleet_verify_generation_altered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]
        .as_object_mut()
        .expect("attempt")
        .remove("admission");
    f.verify(
        "fleet_verify_admission_removed",
        &t(&b),
        "admission_missing",
    );

    let mut b = skipped.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["route_id"] =
        json!("external-fallback");
    f.verify(
        "fleet_verify_skip_of_another_route",
        &t(&b),
        "admission_drift",
    );

    let mut b = skipped.clone();
    let other = snap(
        &fallback(),
        &[
            ("state", json!("open")),
            ("opened_at_epoch_ms", json!(T0)),
            ("generation", json!(3)),
        ],
    );
    b["fleet_snapshots"]["breakers"][0] = other.clone();
    b["attempts"]["attempts"][0]["admission"]["skipped"][0]["snapshot_sha256"] =
        json!(digest(&other));
    f.verify(
        "fleet_verify_snapshot_of_another_release",
        &t(&resealed(b)),
        "snapshot_key_mismatch",
    );

    let mut b = skipped.clone();
    b["policy"] = policy_with(&[]);
    f.verify(
        "fleet_verify_admission_without_fleet",
        &t(&b),
        "admission_unexpected",
    );

    let mut b = skipped.clone();
    b.as_object_mut().expect("bundle").remove("fleet_snapshots");
    f.verify("fleet_verify_snapshots_missing", &t(&b), "snapshot_missing");

    let refused = bundle(json!({}), vec![admit(T0), fails(), admit(T0 + 150)]);
    f.verify("fleet_verify_budget_stop", &t(&refused), "verified");
    let rich = bsnap(2_000);
    let mut b = refused.clone();
    let n = b["fleet_snapshots"]["budgets"]
        .as_array()
        .expect("budgets")
        .len();
    b["fleet_snapshots"]["budgets"][n - 1] = rich.clone();
    b["attempts"]["fleet_stop"]["budget"]["snapshot_sha256"] = json!(digest(&rich));
    f.verify(
        "fleet_verify_budget_stop_covered",
        &t(&resealed(b)),
        "admission_drift",
    );

    let all_open = bundle(
        json!({"breakers": {primary(): open_at(&primary(), T0, 3), fallback(): open_at(&fallback(), T0, 1)}}),
        vec![admit(T0 + 100)],
    );
    f.verify("fleet_verify_circuit_open_stop", &t(&all_open), "verified");
    let mut b = all_open.clone();
    b["attempts"]["fleet_stop"]["skipped"]
        .as_array_mut()
        .expect("skips")
        .pop();
    f.verify(
        "fleet_verify_circuit_open_with_a_route_left",
        &t(&b),
        "admission_drift",
    );
}
