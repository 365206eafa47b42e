//! `jitter.json`.

use retryledger_core::api;
use retryledger_core::lab::{self, Step};
use retryledger_core::limits::MAX_SAFE_INTEGER;
use serde_json::json;

use crate::common::{
    down, edited, jitter, policy_with, remove, rl, run, s, set, single_route, t, truncated, MODES,
};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "jitter",
        "Replayable jitter in every mode (none, full, equal, decorrelated): the interval, the seeded sample, the Retry-After floor over the sample, the deadline clamp, receipts, and jitter drift.",
        "plan_next and evaluate with jitter none/full/equal/decorrelated: the first dispatch has no draw, the interval of each mode ([0,e], [e/2,e], [base, min(max, 3*previous)]), the decorrelated chain over several attempts, other seeds and scheduler releases, the floor above the sample, the interval's upper end pulled below the deadline, full receipts, and the jitter drift codes (missing, unexpected, out of interval, other seed)",
    );
    let steps = lab::reference_steps();
    for mode in MODES {
        let p = policy_with(&[("/jitter", jitter(mode, 7))]);
        let a = run(&p, &steps);
        f.plan(
            &format!("{mode}_first_dispatch_has_no_draw"),
            &t(&p),
            &t(&truncated(&a, 0)),
            "dispatch",
        );
        f.plan(
            &format!("{mode}_after_rate_limit"),
            &t(&p),
            &t(&truncated(&a, 1)),
            "dispatch",
        );
        f.plan(
            &format!("{mode}_to_fallback"),
            &t(&p),
            &t(&truncated(&a, 2)),
            "dispatch",
        );
        f.eval(&format!("{mode}_receipt"), &t(&p), &t(&a), "completed");
    }
    for mode in ["full", "equal", "decorrelated"] {
        let mut p = single_route(8, 100, 5_000, 2_000, 1_000_000);
        set(&mut p, "/jitter", jitter(mode, 42));
        let fails: Vec<Step> = (0..7).map(|_| s(down(), 10, 0)).collect();
        for k in [3, 6] {
            f.plan(
                &format!("{mode}_chain_after_{k}_failures"),
                &t(&p),
                &t(&run(&p, &fails[..k])),
                "jitter_sample_ms",
            );
        }
        let mut other_seed = p.clone();
        set(&mut other_seed, "/jitter/seed", json!(MAX_SAFE_INTEGER));
        f.plan(
            &format!("{mode}_seed_2_pow_53_minus_1"),
            &t(&other_seed),
            &t(&run(&other_seed, &fails[..3])),
            "jitter_sample_ms",
        );
        let mut other_release = p.clone();
        set(
            &mut other_release,
            "/jitter/scheduler_release",
            json!("sched-2027.01"),
        );
        f.plan(
            &format!("{mode}_other_scheduler_release"),
            &t(&other_release),
            &t(&run(&other_release, &fails[..3])),
            "jitter_sample_ms",
        );
        f.plan(
            &format!("{mode}_floor_above_sample"),
            &t(&p),
            &t(&run(&p, &[s(rl(1_900), 10, 0)])),
            "1900",
        );
        // One failure completing at 10 ms: e = 100, so the interval's upper
        // end (100, or 300 for decorrelated) is pulled down to deadline - 11.
        let mut near = p.clone();
        let deadline = if mode == "decorrelated" { 211 } else { 91 };
        set(&mut near, "/deadline_ms", json!(deadline));
        f.plan(
            &format!("{mode}_interval_clamped_below_deadline"),
            &t(&near),
            &t(&run(&near, &fails[..1])),
            &(deadline - 11).to_string(),
        );
    }
    let p = policy_with(&[("/jitter", jitter("equal", 7))]);
    let pt = t(&p);
    let a = run(&p, &steps);
    let sample = a["attempts"][1]["jitter_sample_ms"]
        .as_u64()
        .expect("sample");
    let mut missing = a.clone();
    remove(&mut missing, "/attempts/1/jitter_sample_ms");
    f.eval(
        "drift_sample_missing",
        &pt,
        &t(&missing),
        "jitter_sample_missing",
    );
    f.eval(
        "drift_sample_out_of_interval",
        &pt,
        &t(&edited(
            &a,
            &[("/attempts/1/jitter_sample_ms", json!(1_001))],
        )),
        "jitter_out_of_interval",
    );
    let in_interval_other = if sample > 50 { sample - 1 } else { sample + 1 };
    f.eval(
        "drift_sample_not_the_seeded_draw",
        &pt,
        &t(&edited(
            &a,
            &[("/attempts/1/jitter_sample_ms", json!(in_interval_other))],
        )),
        "jitter_sample_drift",
    );
    f.eval(
        "drift_sample_on_first_attempt",
        &pt,
        &t(&edited(&a, &[("/attempts/0/jitter_sample_ms", json!(0))])),
        "jitter_sample_unexpected",
    );
    let mut reseeded = None;
    for seed in 8..64u64 {
        let q = policy_with(&[("/jitter", jitter("equal", seed))]);
        if api::evaluate(&t(&q), &t(&a)).is_err() {
            reseeded = Some(q);
            break;
        }
    }
    let q = reseeded.expect("a seed whose draws differ");
    f.eval(
        "drift_replayed_with_other_seed",
        &t(&q),
        &t(&a),
        "jitter_sample_drift",
    );
    f
}
