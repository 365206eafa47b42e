//! `admission_admit`: concurrency slots and token buckets, admitted, queued and refused.

use super::*;

pub(super) fn admit_cases(f: &mut Family) {
    let c = cfg();
    admit(
        f,
        "admission_fresh_admits_at_once",
        &c,
        &snap(&[]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{T0}"),
    );
    admit(
        f,
        "admission_burst_spent_queues_one_interval",
        &c,
        &snap(&[("request_level_milli", json!(0))]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 100),
    );
    admit(
        f,
        "admission_partial_level_waits_the_rest",
        &c,
        &snap(&[("request_level_milli", json!(400))]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 60),
    );
    admit(
        f,
        "admission_queue_tail_in_the_future",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 500)),
        ]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 600),
    );
    admit(
        f,
        "admission_beyond_the_queue_bound_refused",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 950)),
        ]),
        T0,
        T0,
        0,
        &format!("earliest_epoch_ms\":{}", T0 + 1_050),
    );
    admit(
        f,
        "admission_queue_bound_counts_from_the_first_ask",
        &c,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("requests_at_epoch_ms", json!(T0 + 600)),
        ]),
        T0 + 500,
        T0 - 450,
        0,
        "refused",
    );
    admit(
        f,
        "admission_in_flight_full_waits",
        &c,
        &snap(&[("in_flight", json!(2))]),
        T0,
        T0,
        0,
        &format!("until_epoch_ms\":{}", T0 + 20),
    );
    admit(
        f,
        "admission_in_flight_full_at_the_bound_refused",
        &c,
        &snap(&[("in_flight", json!(2))]),
        T0 + 990,
        T0,
        0,
        &format!("earliest_epoch_ms\":{}", T0 + 1_010),
    );
    let leased = json!({"in_flight_lease_ms": 30_000, "max_in_flight": 2, "max_queue_ms": 1_000});
    let stale = snap(&[("in_flight", json!(2)), ("request_level_milli", json!(0))]);
    admit(
        f,
        "admission_full_cap_within_its_lease_waits",
        &leased,
        &stale,
        T0 + 29_999,
        T0 + 29_999,
        0,
        "wait",
    );
    admit(
        f,
        "admission_full_cap_unchanged_for_its_lease_starts_over",
        &leased,
        &stale,
        T0 + 30_000,
        T0 + 30_000,
        0,
        "in_flight\":1",
    );
    admit(
        f,
        "admission_refill_capped_at_the_burst",
        &c,
        &snap(&[("request_level_milli", json!(0))]),
        T0 + 60_000,
        T0 + 60_000,
        0,
        "request_level_milli\":1000",
    );
    admit(
        f,
        "admission_clock_behind_the_snapshot",
        &c,
        &snap(&[
            ("updated_at_epoch_ms", json!(T0 + 300)),
            ("requests_at_epoch_ms", json!(T0 + 300)),
            ("request_level_milli", json!(0)),
        ]),
        T0,
        T0,
        0,
        &format!("start_epoch_ms\":{}", T0 + 400),
    );
    let tc = tokens_cfg();
    let ts = snap(&[
        ("request_level_milli", json!(0)),
        ("token_level_milli", json!(100_000)),
    ]);
    admit(
        f,
        "admission_tokens_reserved_now",
        &tc,
        &ts,
        T0,
        T0,
        60,
        "token_level_milli\":40000",
    );
    admit(
        f,
        "admission_tokens_deficit_planned",
        &tc,
        &snap(&[
            ("request_level_milli", json!(0)),
            ("token_level_milli", json!(50_000)),
        ]),
        T0,
        T0,
        90,
        &format!("start_epoch_ms\":{}", T0 + 400),
    );
    admit(
        f,
        "admission_tokens_over_the_bound_refused",
        &tc,
        &ts,
        T0,
        T0,
        101,
        "kind\":\"refused\"}",
    );
    let scoped = json!({"max_in_flight": 1, "max_queue_ms": 100, "principal": "user-42", "tenant": "tenant-7"});
    let mut ss = snap(&[("request_level_milli", json!(0))]);
    ss["tenant"] = json!("tenant-7");
    ss["principal"] = json!("user-42");
    admit(
        f,
        "admission_tenant_and_principal_key",
        &scoped,
        &ss,
        T0,
        T0,
        0,
        "admitted",
    );
    let mut other = ss.clone();
    other["principal"] = json!("user-43");
    admit(
        f,
        "admission_another_principals_snapshot",
        &scoped,
        &other,
        T0,
        T0,
        0,
        "snapshot_key_mismatch",
    );
    admit(
        f,
        "admission_snapshot_over_its_burst",
        &c,
        &snap(&[("request_level_milli", json!(2_001))]),
        T0,
        T0,
        0,
        "invalid_snapshot",
    );
    admit(
        f,
        "admission_bad_config",
        &json!({"max_in_flight": 0, "max_queue_ms": 10}),
        &snap(&[("request_level_milli", json!(0))]),
        T0,
        T0,
        0,
        "invalid_admission",
    );
    admit(
        f,
        "admission_snapshot_of_another_schema",
        &c,
        &snap(&[("schema", json!("retryledger.breaker.v1"))]),
        T0,
        T0,
        0,
        "error",
    );
}
