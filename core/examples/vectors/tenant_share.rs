//! `tenant_share.json`: fair tenant shares of a route's admission limits
//! (docs/FLEET.md, "Fair tenants"): `admission_admit` with the call's
//! tenant (under its share, over it with idle capacity lent, over it while
//! others want capacity: a wait or a `tenant_over_share` refusal),
//! `validate_policy` of bad weights, and `verify_bundle` of runs admitted or
//! stopped under shares, and tampered.

use retryledger_core::{api, lab};
use serde_json::{json, Value};

use crate::common::{id, policy_with, t, NOW_2026};
use crate::family::Family;

const T0: u64 = NOW_2026;

fn primary() -> String {
    id("release: private-primary")
}

/// 20 requests per second, a burst of 1, queue 1 s; acme 1, globex 1,
/// initech 2.
fn cfg() -> Value {
    json!({"max_queue_ms": 1_000, "request_burst": 1, "requests_per_second": 20,
           "tenant_weights": [{"tenant": "acme", "weight": 1}, {"tenant": "globex", "weight": 1},
                              {"tenant": "initech", "weight": 2}]})
}

fn with(edits: &[(&str, Value)]) -> Value {
    let mut c = cfg();
    for (k, v) in edits {
        c[*k] = v.clone();
    }
    c
}

/// The share clocks of `dues` (tenant, due) as a snapshot's `tenants`.
fn dues(dues: &[(&str, u64)]) -> Value {
    Value::Array(
        dues.iter()
            .map(|(tenant, due)| json!({"due_at_epoch_ms": due, "tenant": tenant}))
            .collect(),
    )
}

/// A snapshot of the primary's key: the request bucket at `level` milli at
/// `at`, with the tenants' clocks (none: omitted).
fn snap(level: u64, at: u64, tenants: &[(&str, u64)]) -> Value {
    let mut s = json!({
        "generation": 4, "in_flight": 0, "request_level_milli": level, "requests_at_epoch_ms": at,
        "route_release_sha256": primary(), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": T0, "updated_at_epoch_ms": T0,
    });
    if !tenants.is_empty() {
        s["tenants"] = dues(tenants);
    }
    s
}

#[allow(clippy::too_many_arguments)] // one argument per input of the case
fn admit(
    f: &mut Family,
    name: &str,
    c: &Value,
    s: &Value,
    (now, since): (u64, u64),
    tenant: Option<&str>,
    want: &str,
) {
    let mut input = vec![
        ("config", json!(t(c))),
        ("snapshot", json!(t(s))),
        ("now_epoch_ms", json!(now)),
        ("queued_since_epoch_ms", json!(since)),
        ("tokens", json!(0)),
    ];
    if let Some(tenant) = tenant {
        input.push(("tenant", json!(tenant)));
    }
    f.add(name, "admission_admit", input, want);
}

pub fn family() -> Family {
    let mut f = Family::new(
        "tenant_share",
        "admission_admit with the call's tenant under tenant shares (tenant_weights): weighted fair sharing of one route's request bucket; validate_policy: bad weights; verify_bundle: runs admitted or stopped under shares, and tampered.",
        "a first call admitted and clocked, a tenant alone taking the whole rate and waiting when faster, a tenant under its share admitted (queued in the bucket) while another is over, a tenant over its share waiting for its share or for the bucket (whichever first), idle capacity lent to a tenant over its share (its clock unchanged), a refusal with reason tenant_over_share past the queue bound (counted from the first ask), an idle tenant leaving the shares, weights dividing the interval, a burst shared by weight, a shared in-flight cap; an unlisted, missing or unexpected tenant; snapshots with unsorted, unlisted or unexpected tenants; weights of 0, repeated or empty, shares with a tenant scope or without a request rate; runs admitted under shares, stopped for a tenant over its share, and tampered tenants, refusals and stops",
    );
    admit_cases(&mut f);
    policy_cases(&mut f);
    run_cases(&mut f);
    f
}

fn admit_cases(f: &mut Family) {
    let c = cfg();
    let full = |tenants: &[(&str, u64)]| snap(1_000, T0, tenants);
    admit(
        f,
        "tenant_share_first_call_admitted_and_clocked",
        &c,
        &full(&[]),
        (T0, T0),
        Some("acme"),
        &format!("due_at_epoch_ms\":{}", T0 + 50),
    );
    admit(
        f,
        "tenant_share_alone_faster_than_the_rate_waits",
        &c,
        &snap(0, T0, &[("acme", T0 + 50)]),
        (T0, T0),
        Some("acme"),
        &format!("until_epoch_ms\":{}", T0 + 50),
    );
    admit(
        f,
        "tenant_share_alone_on_time_takes_the_whole_rate",
        &c,
        &snap(0, T0 - 50, &[("acme", T0)]),
        (T0, T0),
        Some("acme"),
        &format!("due_at_epoch_ms\":{}", T0 + 50),
    );
    admit(
        f,
        "tenant_share_under_share_admitted_while_another_is_over",
        &c,
        &snap(0, T0, &[("acme", T0 + 600), ("globex", T0)]),
        (T0, T0),
        Some("globex"),
        &format!("start_epoch_ms\":{}", T0 + 50),
    );
    admit(
        f,
        "tenant_share_over_share_waits_for_its_share",
        &c,
        &snap(0, T0 + 300, &[("acme", T0 + 120), ("globex", T0 + 100)]),
        (T0, T0),
        Some("acme"),
        &format!("until_epoch_ms\":{}", T0 + 120),
    );
    admit(
        f,
        "tenant_share_over_share_waits_for_the_bucket",
        &c,
        &snap(0, T0, &[("acme", T0 + 600), ("globex", T0 + 100)]),
        (T0, T0),
        Some("acme"),
        "tenant_over_share",
    );
    admit(
        f,
        "tenant_share_idle_capacity_lent_over_share",
        &c,
        &full(&[("acme", T0 + 600), ("globex", T0)]),
        (T0, T0),
        Some("acme"),
        &format!("due_at_epoch_ms\":{}", T0 + 600),
    );
    admit(
        f,
        "tenant_share_over_share_refused_past_the_queue_bound",
        &c,
        &snap(0, T0 + 2_000, &[("acme", T0 + 5_000), ("globex", T0 + 100)]),
        (T0, T0),
        Some("acme"),
        &format!("earliest_epoch_ms\":{}", T0 + 2_050),
    );
    admit(
        f,
        "tenant_share_queue_bound_counts_from_the_first_ask",
        &c,
        &snap(0, T0 + 100, &[("acme", T0 + 600), ("globex", T0 + 100)]),
        (T0, T0 - 900),
        Some("acme"),
        "tenant_over_share",
    );
    admit(
        f,
        "tenant_share_idle_tenant_leaves_the_shares",
        &c,
        &full(&[("acme", T0), ("globex", T0 - 1_500)]),
        (T0, T0),
        Some("acme"),
        &format!(
            "tenants\":[{{\"due_at_epoch_ms\":{},\"tenant\":\"acme\"}}]",
            T0 + 50
        ),
    );
    admit(
        f,
        "tenant_share_weight_two_halves_the_interval",
        &c,
        &full(&[("acme", T0 + 100), ("globex", T0 + 100)]),
        (T0, T0),
        Some("initech"),
        &format!("due_at_epoch_ms\":{}", T0 + 100),
    );
    admit(
        f,
        "tenant_share_weight_one_of_four",
        &c,
        &full(&[("globex", T0 + 100), ("initech", T0 + 100)]),
        (T0, T0),
        Some("acme"),
        &format!("due_at_epoch_ms\":{}", T0 + 200),
    );
    admit(
        f,
        "tenant_share_burst_shared_by_weight",
        &with(&[("request_burst", json!(8))]),
        &snap(
            8_000,
            T0,
            &[("acme", T0 + 150), ("globex", T0), ("initech", T0)],
        ),
        (T0, T0),
        Some("acme"),
        &format!("due_at_epoch_ms\":{}", T0 + 350),
    );
    admit(
        f,
        "tenant_share_in_flight_cap_shared",
        &with(&[("max_in_flight", json!(2))]),
        &{
            let mut s = full(&[("acme", T0)]);
            s["in_flight"] = json!(2);
            s
        },
        (T0, T0),
        Some("acme"),
        &format!("until_epoch_ms\":{}", T0 + 20),
    );
    admit(
        f,
        "tenant_share_unlisted_tenant",
        &c,
        &full(&[]),
        (T0, T0),
        Some("hooli"),
        "invalid_value",
    );
    admit(
        f,
        "tenant_share_call_without_its_tenant",
        &c,
        &full(&[]),
        (T0, T0),
        None,
        "invalid_value",
    );
    let plain = json!({"max_queue_ms": 1_000, "request_burst": 1, "requests_per_second": 20});
    admit(
        f,
        "tenant_share_tenant_without_shares",
        &plain,
        &full(&[]),
        (T0, T0),
        Some("acme"),
        "invalid_value",
    );
    admit(
        f,
        "tenant_share_snapshot_tenants_unsorted",
        &c,
        &full(&[("globex", T0), ("acme", T0)]),
        (T0, T0),
        Some("acme"),
        "invalid_snapshot",
    );
    admit(
        f,
        "tenant_share_snapshot_tenant_unlisted",
        &c,
        &full(&[("hooli", T0)]),
        (T0, T0),
        Some("acme"),
        "invalid_snapshot",
    );
    admit(
        f,
        "tenant_share_snapshot_tenants_without_shares",
        &plain,
        &full(&[("acme", T0)]),
        (T0, T0),
        None,
        "invalid_snapshot",
    );
}

fn fleet_policy(a: Value) -> String {
    t(&policy_with(&[(
        "/fleet",
        json!({"admission": a, "on_store_unavailable": "fail_closed"}),
    )]))
}

fn policy_cases(f: &mut Family) {
    f.policy("tenant_share_policy_ok", &fleet_policy(cfg()), "ok");
    let bad = |f: &mut Family, name: &str, a: Value, want: &str| {
        f.policy(name, &fleet_policy(a), want);
    };
    bad(
        f,
        "tenant_share_policy_weight_zero",
        with(&[("tenant_weights", json!([{"tenant": "acme", "weight": 0}]))]),
        "/fleet/admission/tenant_weights/0/weight",
    );
    bad(
        f,
        "tenant_share_policy_weight_over_bound",
        with(&[(
            "tenant_weights",
            json!([{"tenant": "acme", "weight": 1_001}]),
        )]),
        "invalid_admission",
    );
    bad(
        f,
        "tenant_share_policy_tenant_repeated",
        with(&[(
            "tenant_weights",
            json!([{"tenant": "acme", "weight": 1}, {"tenant": "acme", "weight": 2}]),
        )]),
        "/fleet/admission/tenant_weights/1/tenant",
    );
    bad(
        f,
        "tenant_share_policy_empty_weights",
        with(&[("tenant_weights", json!([]))]),
        "invalid_admission",
    );
    bad(
        f,
        "tenant_share_policy_with_a_tenant_scope",
        with(&[("tenant", json!("acme"))]),
        "/fleet/admission/tenant_weights",
    );
    bad(
        f,
        "tenant_share_policy_without_a_request_rate",
        json!({"max_in_flight": 4, "max_queue_ms": 1_000,
               "tenant_weights": [{"tenant": "acme", "weight": 1}]}),
        "/fleet/admission/tenant_weights",
    );
}

fn resealed(mut b: Value) -> Value {
    let receipt = api::evaluate(&t(&b["policy"]), &t(&b["attempts"])).expect("a replayable run");
    b["receipt"] = serde_json::from_str(&receipt).expect("receipt");
    b
}

fn run_cases(f: &mut Family) {
    let p = fleet_policy(cfg());
    let bundle = |store: Value, script: Value| {
        let (_, _, b) = lab::admission_session(&p, &t(&store), &t(&script))
            .unwrap_or_else(|e| panic!("a run: {e:?}"));
        retryledger_core::canonical::to_value(&b)
    };
    let ok = json!({"observe": {"duration_ms": 40, "facts": {"result": "returned"}}});
    // globex under its share, queued behind acme's lent request.
    let admitted = bundle(
        json!([snap(0, T0, &[("acme", T0 + 600), ("globex", T0)])]),
        json!([{"admit": T0, "tenant": "globex"}, ok]),
    );
    let limits = &admitted["attempts"]["attempts"][0]["admission"]["limits"];
    assert_eq!(limits["tenant"], json!("globex"));
    assert_eq!(limits["queue_wait_ms"], json!(50));
    f.verify(
        "tenant_share_run_under_share_admitted",
        &t(&admitted),
        "completed",
    );
    // acme over its share, the bucket reserved past the queue bound.
    let stopped = bundle(
        json!([snap(
            0,
            T0 + 2_000,
            &[("acme", T0 + 5_000), ("globex", T0 + 100)]
        )]),
        json!([{"admit": T0, "tenant": "acme"}]),
    );
    assert_eq!(
        stopped["attempts"]["fleet_stop"]["limits"]["refusal"],
        json!("tenant_over_share")
    );
    f.verify(
        "tenant_share_run_stopped_over_its_share",
        &t(&stopped),
        "stop_admission",
    );
    // acme waits for its share, then is admitted on it.
    let waited = bundle(
        json!([snap(
            0,
            T0 + 300,
            &[("acme", T0 + 120), ("globex", T0 + 100)]
        )]),
        json!([{"admit": T0, "tenant": "acme"}, {"admit": T0 + 120, "tenant": "acme"}, ok]),
    );
    f.verify(
        "tenant_share_run_waited_for_its_share",
        &t(&waited),
        "completed",
    );

    let mut b = admitted.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("tenant");
    f.verify(
        "tenant_share_verify_tenant_removed",
        &t(&resealed(b)),
        "admission_drift",
    );
    let mut b = admitted.clone();
    b["attempts"]["attempts"][0]["admission"]["limits"]["tenant"] = json!("acme");
    f.verify(
        "tenant_share_verify_tenant_swapped",
        &t(&resealed(b)),
        "admission_drift",
    );
    let mut b = stopped.clone();
    b["attempts"]["fleet_stop"]["limits"]
        .as_object_mut()
        .expect("limits")
        .remove("refusal");
    f.verify(
        "tenant_share_verify_refusal_removed",
        &t(&resealed(b)),
        "admission_drift",
    );
    // A stop of globex, under its share: the snapshot admits it.
    let mut b = stopped.clone();
    b["attempts"]["fleet_stop"]["limits"]["tenant"] = json!("globex");
    f.verify(
        "tenant_share_verify_stop_of_a_tenant_under_share",
        &t(&resealed(b)),
        "admission_drift",
    );
}
