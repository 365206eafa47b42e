//! `admission_release`: slots freed and tokens settled.

use super::*;

pub(super) fn release_cases(f: &mut Family) {
    let c = cfg();
    release(
        f,
        "admission_release_frees_a_slot",
        &c,
        &snap(&[("in_flight", json!(2)), ("generation", json!(5))]),
        T0 + 10,
        0,
        None,
        "in_flight\":1",
    );
    release(
        f,
        "admission_release_never_below_zero",
        &c,
        &snap(&[]),
        T0,
        0,
        None,
        "in_flight\":0",
    );
    let tc = tokens_cfg();
    let held = snap(&[
        ("in_flight", json!(1)),
        ("request_level_milli", json!(0)),
        ("token_level_milli", json!(40_000)),
    ]);
    release(
        f,
        "admission_release_unused_tokens_back",
        &tc,
        &held,
        T0 + 10,
        60,
        Some(20),
        "token_level_milli\":80000",
    );
    release(
        f,
        "admission_release_refund_capped_at_the_bound",
        &tc,
        &snap(&[
            ("in_flight", json!(1)),
            ("request_level_milli", json!(0)),
            ("token_level_milli", json!(90_000)),
        ]),
        T0,
        60,
        Some(0),
        "token_level_milli\":100000",
    );
    release(
        f,
        "admission_release_overuse_taken",
        &tc,
        &held,
        T0,
        60,
        Some(90),
        "token_level_milli\":10000",
    );
    release(
        f,
        "admission_release_overuse_down_to_empty",
        &tc,
        &held,
        T0,
        10,
        Some(90),
        "token_level_milli\":0",
    );
    release(
        f,
        "admission_release_without_usage_keeps_the_reservation",
        &tc,
        &held,
        T0,
        60,
        None,
        "token_level_milli\":40000",
    );
}
