//! `schedule.json`.

use retryledger_core::lab::{self, Step};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use serde_json::json;

use crate::common::{down, lagged, policy_with, reference, rl, run, s, single_route, t, truncated};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "schedule",
        "The schedule rules through plan_next: capped exponential backoff, the bounded Retry-After floor, the route change, saturation and the deadline, with DESIGN's worked numbers.",
        "DESIGN's worked numbers (reference run: completion 1,100 -> earliest start 1,350 -> completion 1,450 -> fallback earliest start 1,650; base 200 / max 1,500: delays 200, 400, 800, 1,500, 1,500; a 1,200 ms hint on attempt 2 gives 1,200), the hint below the exponential term, the hint above and at its cap, a zero hint, the fallback's delay from the failed attempt and its route ordinal reset, the start lag, zero-duration attempts, saturation of the shift at route ordinals 64 and 65, a huge base capped at the maximum, and delays that reach the deadline",
    );
    let r = reference();
    let pt = t(&r);
    let ra = run(&r, &lab::reference_steps());
    f.plan(
        "design_reference_first_dispatch_at_0",
        &pt,
        &t(&truncated(&ra, 0)),
        "dispatch",
    );
    f.plan(
        "design_reference_retry_after_250_gives_1350",
        &pt,
        &t(&truncated(&ra, 1)),
        "1350",
    );
    f.plan(
        "design_reference_fallback_base_gives_1650",
        &pt,
        &t(&truncated(&ra, 2)),
        "1650",
    );

    let p = single_route(6, 200, 1_500, 2_000, 100_000);
    let ptx = t(&p);
    let fails: Vec<Step> = (0..6).map(|_| s(down(), 10, 0)).collect();
    for (k, want) in [(1, "200"), (2, "400"), (3, "800"), (4, "1500"), (5, "1500")] {
        f.plan(
            &format!("design_base200_max1500_after_route_attempt_{k}"),
            &ptx,
            &t(&run(&p, &fails[..k])),
            want,
        );
    }
    f.plan(
        "design_hint_1200_on_attempt_2",
        &ptx,
        &t(&run(&p, &[s(down(), 10, 0), s(rl(1_200), 10, 0)])),
        "1200",
    );
    f.plan(
        "hint_below_exponential_term",
        &ptx,
        &t(&run(
            &p,
            &[s(down(), 10, 0), s(down(), 10, 0), s(rl(300), 10, 0)],
        )),
        "800",
    );
    f.plan(
        "hint_above_cap_is_capped",
        &ptx,
        &t(&run(&p, &[s(rl(60_000), 10, 0)])),
        "2000",
    );
    f.plan(
        "hint_at_cap",
        &ptx,
        &t(&run(&p, &[s(rl(2_000), 10, 0)])),
        "2000",
    );
    f.plan(
        "hint_zero",
        &ptx,
        &t(&run(&p, &[s(rl(0), 10, 0)])),
        "dispatch",
    );
    let nocap = single_route(6, 200, 1_500, 0, 100_000);
    f.plan(
        "cap_zero_ignores_hints",
        &t(&nocap),
        &t(&run(&nocap, &[s(rl(60_000), 10, 0)])),
        "200",
    );
    let hugecap = single_route(6, 200, 1_500, MAX_SAFE_INTEGER, MAX_SAFE_INTEGER);
    f.plan(
        "hint_at_2_pow_53_minus_1_uncapped",
        &t(&hugecap),
        &t(&run(&hugecap, &[s(rl(1_000_000_000_000), 10, 0)])),
        "1000000000010",
    );
    f.plan(
        "hint_huge_reaches_deadline",
        &t(&hugecap),
        &t(&run(&hugecap, &[s(rl(MAX_SAFE_INTEGER), 10, 0)])),
        "stop_deadline",
    );
    let one_primary = policy_with(&[("/routes/0/max_attempts", json!(1))]);
    f.plan(
        "fallback_delay_from_failed_attempt",
        &t(&one_primary),
        &t(&run(&one_primary, &[s(down(), 500, 0)])),
        "600",
    );
    f.plan(
        "fallback_route_ordinal_restarts_at_1",
        &t(&one_primary),
        &t(&run(&one_primary, &[s(down(), 500, 0), s(down(), 100, 0)])),
        "dispatch",
    );
    f.plan(
        "start_lag_delay_counts_from_completion",
        &ptx,
        &t(&run(
            &p,
            &[lagged(down(), 10, 0, 0), lagged(down(), 10, 0, 333)],
        )),
        "dispatch",
    );
    f.plan(
        "zero_duration_attempts",
        &ptx,
        &t(&run(&p, &[s(down(), 0, 0), s(down(), 0, 0)])),
        "dispatch",
    );
    let long = single_route(70, 1, 1_000, 0, MAX_SAFE_INTEGER);
    let many: Vec<Step> = (0..65).map(|_| s(down(), 1, 0)).collect();
    f.plan(
        "saturates_at_route_ordinal_64",
        &t(&long),
        &t(&run(&long, &many[..64])),
        "1000",
    );
    f.plan(
        "saturates_at_route_ordinal_65",
        &t(&long),
        &t(&run(&long, &many)),
        "1000",
    );
    let big = single_route(20, 1 << 52, MAX_SAFE_INTEGER, 0, MAX_SAFE_INTEGER);
    f.plan(
        "huge_base_dispatches_below_deadline",
        &t(&big),
        &t(&run(&big, &[s(down(), 1, 0)])),
        "dispatch",
    );
    f.plan(
        "exponential_capped_at_max_reaches_deadline",
        &t(&big),
        &t(&run(&big, &[s(down(), 1, 0), s(down(), 1, 0)])),
        "stop_deadline",
    );
    f
}
