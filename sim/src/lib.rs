//! # retryledger-sim
//!
//! A seeded fleet simulator of retry storms and recovery spikes over the same
//! core the drivers host. It measures what a fleet sees, not one request:
//! physical attempts per logical request, offered load over admitted load,
//! goodput, p50/p95/p99, deadline misses, cost per success and the recovery
//! spike.
//!
//! 1. [`scenario`]: a JSON file under `sim/scenarios/` (arrivals, clients and
//!    their deadline, the naive strategy's layers, the baselines' backoff,
//!    routes with capacity, latency and failure schedules, the retryledger
//!    policy's knobs), decoded strictly with coded errors.
//! 2. [`engine`]: a discrete-event run of one strategy over the scenario's
//!    seeded arrivals (the same arrivals for every strategy): no retry;
//!    naive layered retries (`count` layers of `attempts` tries: 3 x 3 x 3 =
//!    27 in a full outage); per-client capped exponential backoff without
//!    jitter and with full jitter; retryledger, where every logical request
//!    is a core [`retryledger_core::Session`] (plan, `not_before`, facts
//!    judged by the core) admitted through [`retryledger_core::Session::admit`]
//!    under a breaker and a retry budget every client shares ([`ledger`]).
//! 3. [`record`] and [`figures`]: the raw record and the figures, a Markdown
//!    table and JSON; [`svg`]: load over time and the latency CDF.
//!
//! Integer milliseconds, one seeded generator ([`rng`]), no clock, no
//! threads: the same scenario and seed give the same bytes.

pub mod engine;
pub mod error;
pub mod figures;
pub mod ledger;
pub mod record;
pub mod rng;
pub mod scenario;
pub mod svg;

use std::path::{Path, PathBuf};

pub use engine::Strategy;
pub use error::{Result, SimError};
pub use figures::Figures;
pub use record::Recorder;
pub use scenario::Scenario;

/// The scenarios shipped under `sim/scenarios/`.
pub const SCENARIOS: [&str; 4] = ["full_outage", "brownout", "rate_limited", "slow_tail"];

/// The directory of the shipped scenarios.
pub fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Load a scenario by name (a file under `sim/scenarios/`) or by path.
pub fn load(name_or_path: &str) -> Result<Scenario> {
    let as_path = Path::new(name_or_path);
    let (name, path) = if name_or_path.ends_with(".json") {
        let stem = as_path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(name_or_path)
            .to_owned();
        (stem, as_path.to_path_buf())
    } else {
        if name_or_path.is_empty()
            || !name_or_path
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(SimError::new(
                "unknown_scenario",
                "",
                format!("`{name_or_path}`: a scenario name is lowercase letters, digits and `_`, or give a path ending in .json"),
            ));
        }
        (
            name_or_path.to_owned(),
            scenario_dir().join(format!("{name_or_path}.json")),
        )
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            "unknown_scenario"
        } else {
            "scenario_unreadable"
        };
        SimError::new(code, "", format!("{}: {e}", path.display()))
    })?;
    scenario::decode(&name, &text)
}

/// One scenario simulated under several strategies.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario.
    pub scenario: Scenario,
    /// The strategies, in table order.
    pub strategies: Vec<Strategy>,
    /// Their figures.
    pub figures: Vec<Figures>,
    /// Their raw records (latencies sorted).
    pub records: Vec<Recorder>,
}

impl Report {
    /// The Markdown table.
    pub fn table(&self) -> String {
        figures::table(&self.scenario, &self.figures)
    }

    /// retryledger against the best baseline and the targets
    /// ([`figures::verdict`]), when retryledger ran.
    pub fn verdict(&self) -> Option<String> {
        figures::verdict(&self.scenario, &self.figures)
    }

    /// The table with its verdict under it: what the CLI prints and
    /// splices into the docs.
    pub fn summary(&self) -> String {
        let mut out = self.table();
        if let Some(v) = self.verdict() {
            out.push('\n');
            out.push_str(&v);
            out.push('\n');
        }
        out
    }

    /// The figures as pretty JSON text, newline-terminated.
    pub fn json(&self) -> String {
        let v = figures::to_json(&self.scenario, &self.figures, &self.records);
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The load chart (SVG text).
    pub fn load_svg(&self) -> String {
        let recs: Vec<&Recorder> = self.records.iter().collect();
        svg::load_chart(&self.scenario, &self.strategies, &recs)
    }

    /// The latency CDF chart (SVG text).
    pub fn latency_svg(&self) -> String {
        let lat: Vec<&[u64]> = self
            .records
            .iter()
            .map(|r| r.latencies.as_slice())
            .collect();
        svg::latency_chart(&self.scenario, &self.strategies, &lat)
    }

    /// The figures of one strategy.
    pub fn of(&self, strategy: Strategy) -> Option<&Figures> {
        self.figures.iter().find(|f| f.strategy == strategy)
    }
}

/// Simulate `strategies` (every one when empty) over the scenario.
pub fn simulate(s: &Scenario, strategies: &[Strategy]) -> Result<Report> {
    let strategies: Vec<Strategy> = if strategies.is_empty() {
        Strategy::for_scenario(s)
    } else {
        strategies.to_vec()
    };
    let arrivals = engine::arrivals(s);
    let mut figures = Vec::new();
    let mut records = Vec::new();
    for st in &strategies {
        let mut rec = engine::run(s, *st, &arrivals)?;
        figures.push(figures::compute(s, *st, &mut rec));
        records.push(rec);
    }
    Ok(Report {
        scenario: s.clone(),
        strategies,
        figures,
        records,
    })
}

/// The file name stem of a scenario's charts: `sim-full-outage`.
pub fn chart_stem(name: &str) -> String {
    format!("sim-{}", name.replace('_', "-"))
}

/// Replace the text between `<!-- sim:NAME:begin -->` and
/// `<!-- sim:NAME:end -->` in `doc` with `body`; `block_missing` when the
/// markers are absent.
pub fn splice(doc: &str, name: &str, body: &str) -> Result<String> {
    let begin = format!("<!-- sim:{name}:begin -->\n");
    let end = format!("<!-- sim:{name}:end -->");
    let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) else {
        return Err(SimError::new(
            "block_missing",
            "",
            format!("no `<!-- sim:{name}:begin -->` … `<!-- sim:{name}:end -->` block"),
        ));
    };
    let inner = b.saturating_add(begin.len());
    if e < inner {
        return Err(SimError::new(
            "block_missing",
            "",
            "the end marker comes before the begin marker",
        ));
    }
    let (Some(head), Some(tail)) = (doc.get(..inner), doc.get(e..)) else {
        return Err(SimError::new(
            "block_missing",
            "",
            "markers split a character",
        ));
    };
    Ok(format!("{head}{body}{tail}"))
}
