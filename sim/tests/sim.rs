//! The simulator's promises, asserted from real runs: the full-outage
//! thresholds, determinism, the committed table and charts, and coded
//! errors for bad scenarios.
#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use std::path::Path;
use std::sync::OnceLock;

use retryledger_sim::{chart_stem, load, scenario, simulate, splice, Report, Strategy};

/// The full-outage scenario as shipped, simulated once for every test here.
fn full_outage() -> &'static Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT.get_or_init(|| simulate(&load("full_outage").unwrap(), &[]).unwrap())
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn retryledger_keeps_offered_load_and_the_recovery_spike_down() {
    let r = full_outage();
    let ledger = r.of(Strategy::Retryledger).unwrap();
    assert!(
        ledger.peak_offered_ratio <= 1.1,
        "offered / admitted peak {}",
        ledger.peak_offered_ratio
    );
    assert!(ledger.mean_offered_ratio <= 1.1);
    let spike = ledger.recovery_spike.unwrap();
    assert!(spike <= 1.2, "recovery spike {spike}");
    // Every logical request ran through the core and ended with a terminal.
    let ended: u64 = ledger.terminals.iter().map(|(_, n)| n).sum();
    assert_eq!(ended, ledger.requests);
}

#[test]
fn naive_layers_multiply_to_about_27_attempts_in_the_outage() {
    let r = full_outage();
    let s = &r.scenario;
    assert_eq!(s.layers.attempts.pow(s.layers.count as u32), 27);
    let naive = r.of(Strategy::NaiveLayered).unwrap();
    let w = naive.window_attempts_per_request.unwrap();
    // Requests admitted at the very end of the window reach the recovered
    // route before their 27th attempt: slightly under 27.
    assert!((25.0..=27.0).contains(&w), "naive in the outage: {w}");
    assert!(
        naive.peak_offered_ratio >= 25.0,
        "{}",
        naive.peak_offered_ratio
    );
    let none = r.of(Strategy::NoRetry).unwrap();
    assert_eq!(none.window_attempts_per_request, Some(1.0));
}

#[test]
fn backoff_without_jitter_spikes_visibly_above_jitter() {
    let r = full_outage();
    let plain = r
        .of(Strategy::BackoffNoJitter)
        .unwrap()
        .recovery_spike
        .unwrap();
    let jitter = r
        .of(Strategy::BackoffFullJitter)
        .unwrap()
        .recovery_spike
        .unwrap();
    let ledger = r.of(Strategy::Retryledger).unwrap().recovery_spike.unwrap();
    assert!(plain >= 2.0, "no-jitter spike {plain}");
    assert!(plain >= jitter * 1.25, "no jitter {plain}, jitter {jitter}");
    assert!(jitter > ledger, "jitter {jitter}, retryledger {ledger}");
}

#[test]
fn the_table_says_both() {
    let r = full_outage();
    let table = r.table();
    let row = |st: Strategy| {
        let label = retryledger_sim::figures::label(&r.scenario, st);
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap()
            .to_owned()
    };
    let naive = r.of(Strategy::NaiveLayered).unwrap();
    let window = format!("| {:.2} |", naive.window_attempts_per_request.unwrap());
    assert!(row(Strategy::NaiveLayered).contains(&window), "{table}");
    let plain = r.of(Strategy::BackoffNoJitter).unwrap();
    let spike = format!("| {:.2}x |", plain.recovery_spike.unwrap());
    assert!(row(Strategy::BackoffNoJitter).contains(&spike), "{table}");
    let ledger = r.of(Strategy::Retryledger).unwrap();
    let peak = format!("| {:.2}x |", ledger.peak_offered_ratio);
    assert!(row(Strategy::Retryledger).contains(&peak), "{table}");
}

#[test]
fn the_committed_table_and_charts_are_what_the_simulator_writes() {
    let r = full_outage();
    let stem = chart_stem("full_outage");
    let docs = repo().join("docs");
    let load_svg = std::fs::read_to_string(docs.join(format!("{stem}-load.svg"))).unwrap();
    let latency_svg = std::fs::read_to_string(docs.join(format!("{stem}-latency.svg"))).unwrap();
    assert!(
        load_svg == r.load_svg(),
        "docs/{stem}-load.svg is stale: make sim-docs"
    );
    assert!(
        latency_svg == r.latency_svg(),
        "docs/{stem}-latency.svg is stale: make sim-docs"
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let table = r.table();
    // The README block holds the CLI's table (after one line naming the run).
    let spliced = splice(&readme, "full_outage", "").unwrap();
    assert_ne!(spliced, readme, "the README block is empty");
    assert!(
        readme.contains(&table),
        "the README's full_outage table is stale: make sim-docs"
    );
}

fn small(seed: u64) -> scenario::Scenario {
    let mut s = load("full_outage").unwrap();
    s.seed = seed;
    s.arrivals.rate_per_s = 100;
    for r in &mut s.routes {
        r.capacity = 800;
    }
    s
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let a = simulate(&small(7), &[]).unwrap();
    let b = simulate(&small(7), &[]).unwrap();
    assert_eq!(a.json(), b.json());
    assert_eq!(a.table(), b.table());
    assert_eq!(a.load_svg(), b.load_svg());
    assert_eq!(a.latency_svg(), b.latency_svg());
    let c = simulate(&small(8), &[]).unwrap();
    assert_ne!(a.json(), c.json());
}

#[test]
fn every_shipped_scenario_decodes() {
    for name in retryledger_sim::SCENARIOS {
        let s = load(name).unwrap();
        assert_eq!(s.name, name);
        assert!(s.failure_window().is_some(), "{name}");
        assert_eq!(s.routes.len(), 2, "{name}");
    }
}

fn shipped() -> serde_json::Value {
    let text =
        std::fs::read_to_string(retryledger_sim::scenario_dir().join("full_outage.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn code_of(v: &serde_json::Value) -> (&'static str, String) {
    let e = scenario::decode("t", &v.to_string()).unwrap_err();
    (e.code, e.path)
}

#[test]
fn bad_scenarios_get_coded_errors_not_panics() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str, &str)> = vec![
        (
            "unknown field",
            Box::new(|v| v["surprise"] = 1.into()),
            "unknown_field",
            "/surprise",
        ),
        (
            "missing field",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("seed");
            }),
            "missing_field",
            "",
        ),
        (
            "wrong type",
            Box::new(|v| v["arrivals"]["rate_per_s"] = "fast".into()),
            "invalid_type",
            "/arrivals/rate_per_s",
        ),
        (
            "zero rate",
            Box::new(|v| v["arrivals"]["rate_per_s"] = 0.into()),
            "invalid_value",
            "/arrivals/rate_per_s",
        ),
        (
            "bad process",
            Box::new(|v| v["arrivals"]["process"] = "bursty".into()),
            "invalid_value",
            "/arrivals/process",
        ),
        (
            "bad failure kind",
            Box::new(|v| v["routes"][0]["failures"][0]["kind"] = "meteor".into()),
            "invalid_value",
            "/routes/0/failures/0/kind",
        ),
        (
            "window backwards",
            Box::new(|v| v["routes"][0]["failures"][0]["until_ms"] = 1000.into()),
            "invalid_value",
            "/routes/0/failures/0/until_ms",
        ),
        (
            "window past the run",
            Box::new(|v| v["routes"][0]["failures"][0]["until_ms"] = 999_999.into()),
            "invalid_value",
            "/routes/0/failures/0/until_ms",
        ),
        (
            "three routes",
            Box::new(|v| {
                let r = v["routes"][0].clone();
                v["routes"].as_array_mut().unwrap().push(r);
            }),
            "invalid_value",
            "/routes",
        ),
        (
            "too many requests",
            Box::new(|v| {
                v["arrivals"]["rate_per_s"] = 10_000_000.into();
                v["duration_ms"] = 86_400_000.into();
            }),
            "too_many_requests",
            "/arrivals/rate_per_s",
        ),
        (
            "layers explode",
            Box::new(|v| {
                v["layers"]["count"] = 6.into();
                v["layers"]["attempts"] = 10.into();
            }),
            "invalid_value",
            "/layers",
        ),
        (
            "wrong schema",
            Box::new(|v| v["schema"] = "retryledger.policy.v1".into()),
            "invalid_value",
            "/schema",
        ),
        (
            "not an object",
            Box::new(|v| *v = serde_json::json!([1, 2])),
            "invalid_type",
            "",
        ),
        (
            "warm-up past the failure",
            Box::new(|v| v["warmup_ms"] = 25_000.into()),
            "invalid_value",
            "/warmup_ms",
        ),
    ];
    for (what, edit, code, path) in cases {
        let mut v = shipped();
        edit(&mut v);
        assert_eq!(code_of(&v), (code, path.to_owned()), "{what}");
    }
    // The core's strict reader: floats, duplicate keys, nulls, bad JSON.
    for (text, code) in [
        (r#"{"seed": 1.5}"#, "float_value"),
        (r#"{"seed": 1, "seed": 2}"#, "duplicate_key"),
        (r#"{"seed": null}"#, "null_value"),
        ("{", "invalid_json"),
    ] {
        let e = scenario::decode("t", text).unwrap_err();
        assert_eq!(e.code, code, "{text}");
    }
    assert_eq!(
        load("no_such_scenario").unwrap_err().code,
        "unknown_scenario"
    );
    assert_eq!(load("../etc/passwd").unwrap_err().code, "unknown_scenario");
}

/// Random edits of a shipped scenario (values of every JSON type put at
/// every field, fields removed) decode or fail with a code; never a panic.
#[test]
fn mutated_scenarios_never_panic() {
    use retryledger_sim::rng::Rng;
    fn paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, c) in m {
                    let p = format!("{at}/{k}");
                    out.push(p.clone());
                    paths(c, p, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    let p = format!("{at}/{i}");
                    out.push(p.clone());
                    paths(c, p, out);
                }
            }
            _ => {}
        }
    }
    let values = [
        serde_json::json!(0),
        serde_json::json!(1),
        serde_json::json!(u64::MAX),
        serde_json::json!(9_007_199_254_740_991u64),
        serde_json::json!(-1),
        serde_json::json!(""),
        serde_json::json!("outage"),
        serde_json::json!([]),
        serde_json::json!({}),
        serde_json::json!(true),
    ];
    let mut rng = Rng::new(2026, 0);
    for name in retryledger_sim::SCENARIOS {
        let text =
            std::fs::read_to_string(retryledger_sim::scenario_dir().join(format!("{name}.json")))
                .unwrap();
        let base: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut all = Vec::new();
        paths(&base, String::new(), &mut all);
        for _ in 0..400 {
            let mut v = base.clone();
            for _ in 0..=rng.below(3) {
                let p = &all[rng.below(all.len() as u64) as usize];
                if rng.chance_permille(200) {
                    let (parent, key) = p.rsplit_once('/').unwrap();
                    if let Some(serde_json::Value::Object(m)) = v.pointer_mut(parent) {
                        m.remove(key);
                    }
                } else if let Some(slot) = v.pointer_mut(p) {
                    *slot = values[rng.below(values.len() as u64) as usize].clone();
                }
            }
            match scenario::decode(name, &v.to_string()) {
                Ok(s) => {
                    // What decodes also builds its retryledger policies.
                    if let Err(e) = retryledger_sim::ledger::compile_for(&s, 0) {
                        panic!("{name}: decoded, but the core refuses its policy: {e}");
                    }
                }
                Err(e) => assert!(!e.code.is_empty() && e.code != "internal", "{e}"),
            }
        }
    }
}

#[test]
fn a_budget_that_waits_retries_the_cohort_a_stopping_one_refuses() {
    let waiting = small(11);
    assert!(waiting.retryledger.budget_wait_ms.is_some());
    let mut stopping = waiting.clone();
    stopping.retryledger.budget_wait_ms = None;
    let w = simulate(&waiting, &[Strategy::Retryledger]).unwrap();
    let s = simulate(&stopping, &[Strategy::Retryledger]).unwrap();
    let (w, s) = (
        w.of(Strategy::Retryledger).unwrap(),
        s.of(Strategy::Retryledger).unwrap(),
    );
    assert!(
        w.success_rate > s.success_rate,
        "waiting {} stopping {}",
        w.success_rate,
        s.success_rate
    );
    let stops = |f: &retryledger_sim::Figures| {
        f.terminals
            .iter()
            .find(|(k, _)| *k == "stop_retry_budget")
            .map_or(0, |(_, n)| *n)
    };
    assert!(stops(w) < stops(s), "{:?} {:?}", w.terminals, s.terminals);
}

#[test]
fn hedges_cut_the_slow_tails_p99_and_are_no_baseline() {
    let mut s = load("slow_tail").unwrap();
    assert!(s.hedge.is_some());
    s.arrivals.rate_per_s = 100;
    for r in &mut s.routes {
        r.capacity = 800;
    }
    let r = simulate(&s, &[]).unwrap();
    let hedged = r.of(Strategy::Hedged).unwrap();
    let none = r.of(Strategy::NoRetry).unwrap();
    assert!(
        hedged.p99_ms < none.p99_ms,
        "{} {}",
        hedged.p99_ms,
        none.p99_ms
    );
    assert!(hedged.attempts_per_request > 1.0);
    let table = r.table();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("| hedged, 1 hedge after")),
        "{table}"
    );
    // The line under the table names a baseline, never the hedged strategy.
    let summary = r.summary();
    let verdict = summary.lines().last().unwrap();
    assert!(
        verdict.starts_with("retryledger against the best baseline ("),
        "{verdict}"
    );
    assert!(!verdict.contains("hedged"), "{verdict}");
    // Without a hedge section the strategy does not run.
    let plain = simulate(&load("full_outage").unwrap(), &[Strategy::NoRetry]).unwrap();
    assert!(plain.of(Strategy::Hedged).is_none());
    assert!(!Strategy::for_scenario(&load("full_outage").unwrap()).contains(&Strategy::Hedged));
}
