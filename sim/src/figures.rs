//! The figures of one strategy in one scenario, the table that prints them
//! side by side, and their JSON.
//!
//! - attempts per logical request: physical attempts over logical requests,
//!   overall and for requests admitted inside the primary's failure window;
//! - offered load over admitted load: physical attempts started over logical
//!   requests admitted, per bucket (the peak, over buckets inside the run)
//!   and over the whole run (the mean);
//! - recovery spike: the busiest bucket of offered load starting in the
//!   recovery window after the failure window ends, over the steady offered
//!   load (mean per bucket after the warm-up and before the failure window);
//! - success: logical requests that succeeded (before their deadline, for
//!   retryledger, whose late success loses); goodput per second;
//! - latency p50/p95/p99 from admission to the final answer (success or
//!   failure) of every logical request, nearest rank;
//! - deadline misses: answers at or after the deadline;
//! - cost per success: the cost of every attempt over the successes.

use serde_json::{json, Value};

use crate::engine::Strategy;
use crate::record::Recorder;
use crate::scenario::Scenario;

/// One strategy's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// The strategy.
    pub strategy: Strategy,
    /// Logical requests simulated.
    pub requests: u64,
    /// Physical attempts per logical request.
    pub attempts_per_request: f64,
    /// The same for logical requests admitted inside the failure window.
    pub window_attempts_per_request: Option<f64>,
    /// Peak per-bucket offered load over admitted load.
    pub peak_offered_ratio: f64,
    /// Offered over admitted over the whole run.
    pub mean_offered_ratio: f64,
    /// Peak offered load after recovery over the steady offered load.
    pub recovery_spike: Option<f64>,
    /// Steady offered load, attempts per second.
    pub steady_per_s: Option<f64>,
    /// Share of logical requests that succeeded.
    pub success_rate: f64,
    /// Successful logical requests per second of arrivals.
    pub goodput_per_s: f64,
    /// Latency percentiles, ms.
    pub p50_ms: u64,
    /// 95th percentile, ms.
    pub p95_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// Share of logical requests answered at or after their deadline.
    pub deadline_miss_rate: f64,
    /// Cost per successful logical request (micro-USD), when any succeeded.
    pub cost_per_success: Option<f64>,
    /// retryledger's terminals by name.
    pub terminals: Vec<(&'static str, u64)>,
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts far below 2^53 are exact in an f64"
)]
fn f(n: u64) -> f64 {
    n as f64
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| f(a) / f(b))
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], pct: u64) -> u64 {
    let n = u64::try_from(sorted.len()).unwrap_or(u64::MAX);
    if n == 0 {
        return 0;
    }
    let rank = n.saturating_mul(pct).div_ceil(100).max(1);
    let i = usize::try_from(rank.saturating_sub(1)).unwrap_or(0);
    sorted.get(i).copied().unwrap_or(0)
}

/// Compute the figures of a run; sorts its latencies in place.
pub fn compute(s: &Scenario, strategy: Strategy, rec: &mut Recorder) -> Figures {
    rec.latencies.sort_unstable();
    let bm = rec.bucket_ms;
    let full = usize::try_from(s.duration_ms.checked_div(bm).unwrap_or(0)).unwrap_or(0);
    let peak = rec
        .admitted
        .iter()
        .zip(rec.offered.iter())
        .take(full)
        .filter_map(|(a, o)| ratio(*o, *a))
        .fold(0.0, f64::max);
    let total_offered: u64 = rec.offered.iter().sum();
    let total_admitted: u64 = rec.admitted.iter().sum();
    let (spike, steady) = match rec.window {
        Some((from, until)) => {
            let first = usize::try_from(s.warmup_ms.div_ceil(bm)).unwrap_or(0);
            let last = usize::try_from(from.checked_div(bm).unwrap_or(0)).unwrap_or(0);
            let steady: Vec<u64> = rec.offered.iter().copied().take(last).skip(first).collect();
            let steady_sum: u64 = steady.iter().sum();
            let steady_mean = ratio(steady_sum, u64::try_from(steady.len()).unwrap_or(0));
            let after = usize::try_from(until.div_ceil(bm)).unwrap_or(0);
            let span = usize::try_from(s.recovery_window_ms.div_ceil(bm)).unwrap_or(1);
            let peak_after = rec
                .offered
                .iter()
                .skip(after)
                .take(span)
                .copied()
                .max()
                .unwrap_or(0);
            match steady_mean {
                Some(m) if m > 0.0 => (Some(f(peak_after) / m), Some(m * 1_000.0 / f(bm))),
                _ => (None, None),
            }
        }
        None => (None, None),
    };
    Figures {
        strategy,
        requests: rec.requests,
        attempts_per_request: ratio(rec.attempts, rec.requests).unwrap_or(0.0),
        window_attempts_per_request: ratio(rec.window_attempts, rec.window_requests),
        peak_offered_ratio: peak,
        mean_offered_ratio: ratio(total_offered, total_admitted).unwrap_or(0.0),
        recovery_spike: spike,
        steady_per_s: steady,
        success_rate: ratio(rec.successes, rec.requests).unwrap_or(0.0),
        goodput_per_s: f(rec.successes) * 1_000.0 / f(s.duration_ms.max(1)),
        p50_ms: percentile(&rec.latencies, 50),
        p95_ms: percentile(&rec.latencies, 95),
        p99_ms: percentile(&rec.latencies, 99),
        deadline_miss_rate: ratio(rec.late, rec.requests).unwrap_or(0.0),
        cost_per_success: ratio(rec.cost, rec.successes),
        terminals: rec.terminals.clone(),
    }
}

/// How the table names a strategy in a scenario.
pub fn label(s: &Scenario, strategy: Strategy) -> String {
    match strategy {
        Strategy::NoRetry => "no retry".to_owned(),
        Strategy::NaiveLayered => format!(
            "naive, {} layers x {} tries",
            s.layers.count, s.layers.attempts
        ),
        Strategy::BackoffNoJitter => {
            format!("backoff, no jitter ({} tries)", s.backoff.max_attempts)
        }
        Strategy::BackoffFullJitter => {
            format!("backoff, full jitter ({} tries)", s.backoff.max_attempts)
        }
        Strategy::Hedged => format!(
            "hedged, 1 hedge after {} ms (no retry)",
            s.hedge.as_ref().map_or(0, |h| h.delay_ms)
        ),
        Strategy::Retryledger => {
            if s.routes.len() > 1 {
                "retryledger (breaker, budget, fallback)".to_owned()
            } else {
                "retryledger (breaker, budget)".to_owned()
            }
        }
    }
}

fn x(v: f64) -> String {
    format!("{v:.2}x")
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn ms(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1} s", f(v) / 1_000.0)
    } else {
        format!("{v} ms")
    }
}

/// The figures side by side, as a Markdown table.
pub fn table(s: &Scenario, figures: &[Figures]) -> String {
    let mut out = String::new();
    out.push_str("| strategy | attempts / request | in the failure window | offered / admitted, peak | mean | recovery spike | goodput (succeeded) | p50 | p95 | p99 | deadline misses | cost / success |\n");
    out.push_str(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for fig in figures {
        let row = [
            label(s, fig.strategy),
            format!("{:.2}", fig.attempts_per_request),
            fig.window_attempts_per_request
                .map_or("-".to_owned(), |v| format!("{v:.2}")),
            x(fig.peak_offered_ratio),
            x(fig.mean_offered_ratio),
            fig.recovery_spike.map_or("-".to_owned(), x),
            pct(fig.success_rate),
            ms(fig.p50_ms),
            ms(fig.p95_ms),
            ms(fig.p99_ms),
            pct(fig.deadline_miss_rate),
            fig.cost_per_success
                .map_or("-".to_owned(), |v| format!("{v:.0}")),
        ];
        out.push_str("| ");
        out.push_str(&row.join(" | "));
        out.push_str(" |\n");
    }
    out
}

/// Goodput within this many percentage points of the best baseline counts as even.
pub const GOODPUT_SLACK_PP: f64 = 0.1;
/// Most offered load over admitted load (peak) and recovery spike allowed.
pub const LOAD_LIMIT: f64 = 1.1;

/// retryledger against the best baseline (the other strategy with the most
/// goodput): its goodput, peak and recovery spike against the targets
/// (goodput within [`GOODPUT_SLACK_PP`] of the best baseline or above, peak
/// and spike at most [`LOAD_LIMIT`]), and which it misses, by how much.
pub fn verdict(s: &Scenario, figures: &[Figures]) -> Option<String> {
    let ours = figures
        .iter()
        .find(|f| f.strategy == Strategy::Retryledger)?;
    let best = figures
        .iter()
        .filter(|f| !matches!(f.strategy, Strategy::Retryledger | Strategy::Hedged))
        .fold(None::<&Figures>, |b, f| match b {
            Some(b) if b.success_rate >= f.success_rate => Some(b),
            _ => Some(f),
        })?;
    let gap_pp = (ours.success_rate - best.success_rate) * 100.0;
    let spike = ours.recovery_spike.unwrap_or(0.0);
    let mut misses = Vec::new();
    if gap_pp < -GOODPUT_SLACK_PP {
        misses.push(format!("goodput, by {:.2} pp", -gap_pp - GOODPUT_SLACK_PP));
    }
    if ours.peak_offered_ratio > LOAD_LIMIT {
        misses.push(format!(
            "peak, by {:.3}x",
            ours.peak_offered_ratio - LOAD_LIMIT
        ));
    }
    if spike > LOAD_LIMIT {
        misses.push(format!("recovery spike, by {:.3}x", spike - LOAD_LIMIT));
    }
    let outcome = if misses.is_empty() {
        "every target holds".to_owned()
    } else {
        format!("misses {}", misses.join("; "))
    };
    Some(format!(
        "retryledger against the best baseline ({}): goodput {:.2}% vs {:.2}% ({:+.2} pp), peak {:.3}x, recovery spike {:.3}x. Targets: goodput within {GOODPUT_SLACK_PP} pp of the best baseline or above, peak and spike at most {LOAD_LIMIT}x: {outcome}.",
        label(s, best.strategy),
        ours.success_rate * 100.0,
        best.success_rate * 100.0,
        gap_pp,
        ours.peak_offered_ratio,
        spike,
    ))
}

/// A figure rounded to 4 decimals (the JSON keeps no more).
fn r4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

/// The figures as JSON, with each strategy's load per bucket.
pub fn to_json(s: &Scenario, figures: &[Figures], records: &[Recorder]) -> Value {
    let strategies: Vec<Value> = figures
        .iter()
        .zip(records)
        .map(|(fig, rec)| {
            let terminals: serde_json::Map<String, Value> = fig
                .terminals
                .iter()
                .map(|(k, n)| ((*k).to_owned(), json!(n)))
                .collect();
            json!({
                "strategy": fig.strategy.as_str(),
                "label": label(s, fig.strategy),
                "requests": fig.requests,
                "attempts_per_request": r4(fig.attempts_per_request),
                "window_attempts_per_request": fig.window_attempts_per_request.map(r4),
                "peak_offered_ratio": r4(fig.peak_offered_ratio),
                "mean_offered_ratio": r4(fig.mean_offered_ratio),
                "recovery_spike": fig.recovery_spike.map(r4),
                "steady_offered_per_s": fig.steady_per_s.map(r4),
                "success_rate": r4(fig.success_rate),
                "goodput_per_s": r4(fig.goodput_per_s),
                "latency_ms": {"p50": fig.p50_ms, "p95": fig.p95_ms, "p99": fig.p99_ms},
                "deadline_miss_rate": r4(fig.deadline_miss_rate),
                "cost_per_success": fig.cost_per_success.map(r4),
                "terminals": terminals,
                "load": {
                    "offered": rec.offered,
                    "admitted": rec.admitted,
                    "succeeded": rec.succeeded,
                    "offered_by_route": rec.offered_by_route,
                },
            })
        })
        .collect();
    json!({
        "schema": "retryledger.sim_figures.v1",
        "scenario": s.name,
        "description": s.description,
        "seed": s.seed,
        "bucket_ms": s.bucket_ms,
        "duration_ms": s.duration_ms,
        "failure_window_ms": s.failure_window().map(|(a, b)| vec![a, b]),
        "routes": s.routes.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        "strategies": strategies,
    })
}
