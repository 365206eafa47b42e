//! `price.json`: price schedules checked against a policy, and what usage
//! costs under them.

use serde_json::{json, Value};

use crate::common::{reference, set, t};
use crate::family::Family;

pub fn schedule() -> Value {
    let p = reference();
    let releases: Vec<Value> = p["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .zip([
            json!({"input": 50_000, "output": 200_000}),
            json!({"cached_input": 75_000, "input": 150_000, "output": 600_000, "reasoning": 600_000}),
        ])
        .map(|(r, prices)| json!({"prices_per_million": prices, "route_release_sha256": r["route_release_sha256"]}))
        .collect();
    json!({"cost_unit": p["cost_unit"], "releases": releases, "schema": "retryledger.price_schedule.v1"})
}

pub fn family() -> Family {
    let mut f = Family::new(
        "price",
        "check_price_schedule: a price schedule against a policy (its digest, or the first broken rule); price_cost: what raw usage costs on a release, sum of ceil(units * price / 10^6).",
        "a schedule pricing every route, the digest; a missing release, another cost unit, a release priced twice, unknown fields; usage costs with rounding up per kind, zero usage, large counts, unpriced kinds, an unpriced release, overflow past 2^53-1, negative and fractional units",
    );
    let policy = t(&reference());
    let s = schedule();
    let check = |f: &mut Family, name: &str, sched: &Value, want: &str| {
        f.add(
            name,
            "check_price_schedule",
            vec![("policy", json!(policy)), ("schedule", json!(t(sched)))],
            want,
        );
    };
    check(&mut f, "price_schedule_prices_every_route", &s, "ok");
    let mut missing = s.clone();
    missing["releases"].as_array_mut().expect("releases").pop();
    check(
        &mut f,
        "price_schedule_missing_release",
        &missing,
        "price_schedule_missing_release",
    );
    let mut unit = s.clone();
    set(&mut unit, "/cost_unit", json!("usd_cents"));
    check(
        &mut f,
        "price_schedule_other_cost_unit",
        &unit,
        "cost_unit_mismatch",
    );
    let mut twice = s.clone();
    let first = twice["releases"][0].clone();
    twice["releases"]
        .as_array_mut()
        .expect("releases")
        .push(first);
    check(
        &mut f,
        "price_schedule_release_twice",
        &twice,
        "duplicate_set_item",
    );
    let mut extra = s.clone();
    set(&mut extra, "/releases/0/currency", json!("usd"));
    check(
        &mut f,
        "price_schedule_unknown_field",
        &extra,
        "unknown_field",
    );
    let mut neg = s.clone();
    set(&mut neg, "/releases/0/prices_per_million/input", json!(-1));
    check(
        &mut f,
        "price_schedule_negative_price",
        &neg,
        "integer_out_of_range",
    );
    f.digest("price_schedule_digest", &t(&s), "ok");

    let fallback = s["releases"][1]["route_release_sha256"]
        .as_str()
        .expect("hex")
        .to_owned();
    let primary = s["releases"][0]["route_release_sha256"]
        .as_str()
        .expect("hex")
        .to_owned();
    let cost = |f: &mut Family, name: &str, release: &str, usage: &str, want: &str| {
        f.add(
            name,
            "price_cost",
            vec![
                ("route_release_sha256", json!(release)),
                ("schedule", json!(t(&s))),
                ("usage", json!(usage)),
            ],
            want,
        );
    };
    cost(
        &mut f,
        "price_cost_input_and_output",
        &fallback,
        r#"{"input":1200,"output":350}"#,
        "390",
    );
    cost(
        &mut f,
        "price_cost_rounds_up_per_kind",
        &fallback,
        r#"{"input":1,"output":1}"#,
        "2",
    );
    cost(
        &mut f,
        "price_cost_cached_and_reasoning",
        &fallback,
        r#"{"cached_input":4000,"input":100,"output":10,"reasoning":2000}"#,
        "1521",
    );
    cost(&mut f, "price_cost_no_usage", &fallback, "{}", "0");
    cost(
        &mut f,
        "price_cost_zero_units",
        &primary,
        r#"{"input":0,"output":0}"#,
        "0",
    );
    cost(
        &mut f,
        "price_cost_large_counts",
        &primary,
        r#"{"input":9007199254740991}"#,
        "450359962737050",
    );
    cost(
        &mut f,
        "price_cost_unpriced_kind",
        &primary,
        r#"{"reasoning":10}"#,
        "usage_unpriced",
    );
    cost(
        &mut f,
        "price_cost_unpriced_release",
        &"f".repeat(64),
        r#"{"input":10}"#,
        "price_schedule_missing_release",
    );
    cost(
        &mut f,
        "price_cost_negative_units",
        &primary,
        r#"{"input":-5}"#,
        "integer_out_of_range",
    );
    cost(
        &mut f,
        "price_cost_fractional_units",
        &primary,
        r#"{"input":1.5}"#,
        "float_value",
    );
    cost(
        &mut f,
        "price_cost_bad_kind",
        &primary,
        r#"{"in put":1}"#,
        "invalid_identifier",
    );
    cost(
        &mut f,
        "price_cost_bad_release",
        "ABC",
        r#"{"input":1}"#,
        "invalid_digest",
    );
    cost(
        &mut f,
        "price_cost_overflow",
        &fallback,
        r#"{"input":9007199254740991,"output":9007199254740991,"reasoning":9007199254740991}"#,
        "arithmetic_overflow",
    );
    f
}
