//! The fleet simulator as WebAssembly, for the inspector's fleet view.
//!
//! The same `retryledger-sim` library the CLI runs (its engine over the
//! core, its figures, its Markdown table and its SVG writer), behind two
//! calls with JSON text in and out:
//!
//! - [`scenarios`]: the scenarios shipped under `sim/scenarios/`, by name,
//!   with their text;
//! - [`simulate`]: a scenario's JSON text, an optional seed (decimal text, so
//!   every `u64` crosses exactly) → `retryledger.sim_run.v1`: the table (the
//!   CLI's bytes), the figures (the CLI's `--json`) and both charts (the CLI's
//!   `--charts` files).
//!
//! A failure is thrown as `{"code", "path", "message"}` JSON text, the
//! simulator's own codes (`missing_field`, `invalid_value`, …) plus
//! `input_too_large` and `scenario_too_large` for runs a page should not
//! attempt. The host-side functions ([`run`], [`bundled`]) are plain Rust so
//! that `cargo test` covers them; only the exports are gated on wasm32.

use retryledger_sim::{scenario, simulate as run_all, SimError};
use serde_json::{json, Value};

/// The largest scenario text accepted, bytes.
pub const MAX_SCENARIO_BYTES: usize = 1024 * 1024;

/// The most logical requests a run in a page may simulate (the scenario's
/// rate times its duration); the shipped scenarios hold 60,000.
pub const MAX_REQUESTS: u64 = 250_000;

/// The shipped scenarios: name and JSON text, in the CLI's order.
pub const BUNDLED: [(&str, &str); 4] = [
    (
        "full_outage",
        include_str!("../../sim/scenarios/full_outage.json"),
    ),
    (
        "brownout",
        include_str!("../../sim/scenarios/brownout.json"),
    ),
    (
        "rate_limited",
        include_str!("../../sim/scenarios/rate_limited.json"),
    ),
    (
        "slow_tail",
        include_str!("../../sim/scenarios/slow_tail.json"),
    ),
];

/// The shipped scenarios as JSON: `[{"name", "description", "text"}]`.
pub fn bundled() -> String {
    let list: Vec<Value> = BUNDLED
        .iter()
        .map(|(name, text)| {
            let description = scenario::decode(name, text)
                .map(|s| s.description)
                .unwrap_or_default();
            json!({"name": name, "description": description, "text": text})
        })
        .collect();
    Value::Array(list).to_string()
}

/// An error as the JSON text the page reads.
pub fn error_json(e: &SimError) -> String {
    json!({"code": e.code, "path": e.path, "message": e.message}).to_string()
}

/// Decode `text` as scenario `name`, set the seed when given, simulate every
/// strategy and return the run as JSON text.
pub fn run(name: &str, text: &str, seed: Option<&str>) -> Result<String, SimError> {
    if text.len() > MAX_SCENARIO_BYTES {
        return Err(SimError::new(
            "input_too_large",
            "",
            format!(
                "the scenario is {} bytes; at most {MAX_SCENARIO_BYTES}",
                text.len()
            ),
        ));
    }
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_name {
        return Err(SimError::new(
            "invalid_value",
            "/name",
            "a scenario name is 1 to 64 lowercase letters, digits and `_`",
        ));
    }
    let mut s = scenario::decode(name, text)?;
    if let Some(seed) = seed {
        s.seed = seed.trim().parse().map_err(|_| {
            SimError::new(
                "invalid_value",
                "/seed",
                "the seed is a whole number in 0..=18446744073709551615",
            )
        })?;
    }
    let requests = s.expected_requests();
    if requests > MAX_REQUESTS {
        return Err(SimError::new(
            "scenario_too_large",
            "/arrivals/rate_per_s",
            format!("about {requests} logical requests (rate times duration); a run in the page simulates at most {MAX_REQUESTS}"),
        ));
    }
    let report = run_all(&s, &[])?;
    let figures: Value = serde_json::from_str(&report.json())
        .map_err(|e| SimError::new("internal", "", e.to_string()))?;
    Ok(json!({
        "schema": "retryledger.sim_run.v1",
        "scenario": s.name,
        "description": s.description,
        "seed": s.seed.to_string(),
        "requests": report.figures.first().map_or(0, |f| f.requests),
        "duration_ms": s.duration_ms,
        "table": report.table(),
        "figures": figures,
        "load_svg": report.load_svg(),
        "latency_svg": report.latency_svg(),
        "chart_stem": retryledger_sim::chart_stem(&s.name),
    })
    .to_string())
}

#[cfg(target_arch = "wasm32")]
mod exports {
    use wasm_bindgen::prelude::*;

    /// `scenarios()`: the shipped scenarios as JSON text.
    #[wasm_bindgen]
    pub fn scenarios() -> String {
        super::bundled()
    }

    /// `simulate(name, scenario, seed?)`: the run as JSON text, or the
    /// error's JSON thrown as a string.
    #[wasm_bindgen]
    pub fn simulate(name: &str, scenario: &str, seed: Option<String>) -> Result<String, JsValue> {
        super::run(name, scenario, seed.as_deref())
            .map_err(|e| JsValue::from_str(&super::error_json(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_scenarios_decode() {
        for (name, text) in BUNDLED {
            assert!(scenario::decode(name, text).is_ok(), "{name}");
        }
        assert_eq!(BUNDLED.map(|b| b.0), retryledger_sim::SCENARIOS);
    }

    #[test]
    fn bad_input_is_coded() {
        let code = |r: Result<String, SimError>| r.err().map(|e| e.code);
        assert_eq!(code(run("x", "not json", None)), Some("invalid_json"));
        assert_eq!(
            code(run("full_outage", BUNDLED[0].1, Some("-1"))),
            Some("invalid_value")
        );
        assert_eq!(
            code(run("Bad Name", BUNDLED[0].1, None)),
            Some("invalid_value")
        );
        let big = " ".repeat(MAX_SCENARIO_BYTES + 1);
        assert_eq!(code(run("x", &big, None)), Some("input_too_large"));
        let heavy = BUNDLED[0]
            .1
            .replace("\"rate_per_s\": 1000", "\"rate_per_s\": 100000");
        assert_eq!(
            code(run("full_outage", &heavy, None)),
            Some("scenario_too_large")
        );
    }
}
