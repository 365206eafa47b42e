//! `verify.json`.

use retryledger_core::lab;
use serde_json::json;

use crate::common::{edited, reference, remove, run, s, sealed, success, t};
use crate::family::Family;

pub fn family() -> Family {
    let mut f = Family::new(
        "verify",
        "verify_bundle: the lab's reference bundle and each of its mutation cases, plus bundles that were reformatted, cut short or changed deep inside the receipt.",
        "verify_bundle on every lab case (the reference run, policy rules, drift of each kind, jitter replay and its drift, each receipt field changed), a reformatted bundle, a run cut short (run_not_terminal), a schedule entry changed (attempt index), and decode errors",
    );
    for c in lab::cases().expect("lab cases") {
        f.verify(&format!("lab_{}", c.name), &t(&c.bundle), &c.expected);
    }
    let bundle = retryledger_core::canonical::to_value(&lab::reference_bundle().expect("bundle"));
    f.verify(
        "reference_pretty_printed",
        &serde_json::to_string_pretty(&bundle).expect("json"),
        "verified",
    );
    let mut cut = bundle.clone();
    cut["attempts"]["attempts"]
        .as_array_mut()
        .expect("list")
        .truncate(2);
    f.verify("run_cut_short", &t(&cut), "run_not_terminal");
    f.verify(
        "schedule_entry_changed",
        &t(&edited(
            &bundle,
            &[("/receipt/schedule/1/not_before_ms", json!(1_351))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "route_count_changed",
        &t(&edited(
            &bundle,
            &[("/receipt/route_attempts/1/attempts", json!(2))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "receipt_final_route_removed",
        &{
            let mut v = bundle.clone();
            remove(&mut v, "/receipt/final_route_id");
            t(&v)
        },
        "receipt_mismatch",
    );
    f.verify(
        "policy_changed_after_sealing",
        &t(&edited(
            &bundle,
            &[("/policy/max_total_cost", json!(10_001))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "attempt_cost_changed_after_sealing",
        &t(&edited(
            &bundle,
            &[("/attempts/attempts/2/cost", json!(1_801))],
        )),
        "receipt_mismatch",
    );
    f.verify(
        "bundle_schema_mismatch",
        &t(&edited(
            &bundle,
            &[("/schema", json!("retryledger.bundle.v2"))],
        )),
        "schema_mismatch",
    );
    let other = sealed(&reference(), &run(&reference(), &[s(success(), 300, 900)]));
    f.verify("verified_completed_on_primary", &t(&other), "verified");
    f
}
