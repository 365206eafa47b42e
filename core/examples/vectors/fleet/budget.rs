//! The retry budget: `budget_deposit` / `budget_withdraw`.

use super::*;

pub(super) fn budget_cases(f: &mut Family) {
    let c = budget_cfg();
    let op = |f: &mut Family,
              name: &str,
              op: &'static str,
              cfg: &Value,
              s: &Value,
              now: u64,
              want: &str| {
        f.add(
            name,
            op,
            vec![
                ("config", json!(t(cfg))),
                ("snapshot", json!(t(s))),
                ("now_epoch_ms", json!(now)),
            ],
            want,
        );
    };
    op(
        f,
        "budget_deposit_ratio",
        "budget_deposit",
        &c,
        &bsnap(0),
        T0,
        "balance_milli\":500",
    );
    op(
        f,
        "budget_deposit_capped",
        "budget_deposit",
        &c,
        &bsnap(2_800),
        T0,
        "balance_milli\":3000",
    );
    op(
        f,
        "budget_withdraw_granted",
        "budget_withdraw",
        &c,
        &bsnap(1_500),
        T0,
        "balance_milli\":500",
    );
    op(
        f,
        "budget_withdraw_refused",
        "budget_withdraw",
        &c,
        &bsnap(999),
        T0,
        "granted\":false",
    );
    op(
        f,
        "budget_withdraw_exact_token",
        "budget_withdraw",
        &c,
        &bsnap(1_000),
        T0,
        "granted\":true",
    );
    op(
        f,
        "budget_floor_refills",
        "budget_withdraw",
        &c,
        &bsnap(0),
        T0 + 1_000,
        "granted\":true",
    );
    op(
        f,
        "budget_floor_not_yet",
        "budget_withdraw",
        &c,
        &bsnap(0),
        T0 + 999,
        "granted\":false",
    );
    op(
        f,
        "budget_floor_capped",
        "budget_deposit",
        &c,
        &bsnap(0),
        T0 + 3_600_000,
        "balance_milli\":3000",
    );
    let mut behind = bsnap(400);
    behind["updated_at_epoch_ms"] = json!(T0 + 10_000);
    op(
        f,
        "budget_clock_behind_the_snapshot",
        "budget_withdraw",
        &c,
        &behind,
        T0,
        "updated_at_epoch_ms\":1780000010000",
    );
    op(
        f,
        "budget_over_cap",
        "budget_withdraw",
        &c,
        &bsnap(3_001),
        T0,
        "budget_over_cap",
    );
    let mut other = bsnap(0);
    other["scope"] = json!("tenant-8/summaries");
    op(
        f,
        "budget_other_scope",
        "budget_withdraw",
        &c,
        &other,
        T0,
        "snapshot_key_mismatch",
    );
    for (name, cfg, want) in [
        (
            "budget_config_zero_cap",
            json!({"floor_per_second": 0, "max_tokens": 0, "ratio_permille": 100, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_nothing_accrues",
            json!({"floor_per_second": 0, "max_tokens": 5, "ratio_permille": 0, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_floor_over_cap",
            json!({"floor_per_second": 6, "max_tokens": 5, "ratio_permille": 0, "scope": "s"}),
            "invalid_retry_budget",
        ),
        (
            "budget_config_bad_scope",
            json!({"floor_per_second": 0, "max_tokens": 5, "ratio_permille": 100, "scope": "a b"}),
            "invalid_identifier",
        ),
    ] {
        op(f, name, "budget_deposit", &cfg, &bsnap(0), T0, want);
    }
}
