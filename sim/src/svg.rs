//! Hand-written SVG charts: offered load over time per strategy (log scale,
//! as a multiple of the admitted rate) and the latency CDF of logical
//! requests. Plain text with numbers at one decimal: the same run gives the
//! same bytes.

use std::fmt::Write as _;

use crate::engine::Strategy;
use crate::figures::label;
use crate::record::Recorder;
use crate::scenario::{FailureKind, Scenario};

const W: f64 = 900.0;
const H: f64 = 380.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 270.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

/// No retry is dashed: it runs under retryledger's line wherever nothing fails.
fn dash(s: Strategy) -> &'static str {
    if s == Strategy::NoRetry {
        " stroke-dasharray=\"6,4\""
    } else {
        ""
    }
}

fn color(s: Strategy) -> &'static str {
    match s {
        Strategy::NoRetry => "#7f7f7f",
        Strategy::NaiveLayered => "#d62728",
        Strategy::BackoffNoJitter => "#ff7f0e",
        Strategy::BackoffFullJitter => "#1f77b4",
        Strategy::Retryledger => "#2ca02c",
        Strategy::Hedged => "#9467bd",
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts far below 2^53 are exact in an f64"
)]
fn f(n: u64) -> f64 {
    n as f64
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W:.0}\" height=\"{H:.0}\" viewBox=\"0 0 {W:.0} {H:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n\
         <text x=\"{LEFT:.0}\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
}

fn legend(out: &mut String, s: &Scenario, strategies: &[Strategy]) {
    let x0 = W - RIGHT + 16.0;
    for (i, st) in strategies.iter().enumerate() {
        let y = TOP + 12.0 + 20.0 * f(u64::try_from(i).unwrap_or(0));
        let _ = writeln!(
            out,
            "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2.5\"{}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x0 + 22.0,
            color(*st),
            dash(*st),
            x0 + 28.0,
            y + 4.0,
            esc(&label(s, *st))
        );
    }
}

fn plot_w() -> f64 {
    W - LEFT - RIGHT
}

fn plot_h() -> f64 {
    H - TOP - BOTTOM
}

fn frame(out: &mut String, x_label: &str, y_label: &str) {
    let _ = writeln!(
        out,
        "<rect x=\"{LEFT:.1}\" y=\"{TOP:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#333333\"/>",
        plot_w(),
        plot_h()
    );
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        LEFT + plot_w() / 2.0,
        H - 10.0,
        esc(x_label)
    );
    let _ = writeln!(
        out,
        "<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">{}</text>",
        TOP + plot_h() / 2.0,
        TOP + plot_h() / 2.0,
        esc(y_label)
    );
}

fn polyline(out: &mut String, points: &[(f64, f64)], st: Strategy) {
    let mut d = String::new();
    for (px, py) in points {
        let _ = write!(d, "{px:.1},{py:.1} ");
    }
    let _ = writeln!(
        out,
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" stroke-linejoin=\"round\"{} points=\"{}\"/>",
        color(st),
        dash(st),
        d.trim_end()
    );
}

const LOG_TICKS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];

/// Offered load per bucket over the admitted rate, per strategy, log scale.
pub fn load_chart(s: &Scenario, strategies: &[Strategy], records: &[&Recorder]) -> String {
    let bm = s.bucket_ms.max(1);
    let admitted_per_bucket = f(s.arrivals.rate_per_s) * f(bm) / 1_000.0;
    // Until arrivals stop: what comes after is the drain of the last retries.
    let buckets = usize::try_from(s.duration_ms.checked_div(bm).unwrap_or(1))
        .unwrap_or(1)
        .max(1);
    let t_max = f(u64::try_from(buckets).unwrap_or(1)) * f(bm);
    let y_hi = records
        .iter()
        .flat_map(|r| r.offered.iter().take(buckets))
        .map(|v| f(*v) / admitted_per_bucket)
        .fold(1.0, f64::max);
    let top = LOG_TICKS
        .iter()
        .copied()
        .find(|t| *t >= y_hi * 1.15)
        .unwrap_or(2000.0);
    let (lo, hi) = (0.5f64.ln(), top.ln());
    let ypos = |v: f64| {
        let v = v.clamp(0.5, top);
        TOP + plot_h() * (1.0 - (v.ln() - lo) / (hi - lo))
    };
    let xpos = |t: f64| LEFT + plot_w() * t / t_max;
    let mut out = String::new();
    head(
        &mut out,
        &format!(
            "{}: offered load over time (attempts started per {} ms over the admitted rate)",
            s.name, bm
        ),
    );
    for r in s.routes.first().into_iter() {
        for w in &r.failures {
            let kind = match w.kind {
                FailureKind::Outage => "outage",
                FailureKind::Brownout { .. } => "brown-out",
                FailureKind::RateLimit { .. } => "rate limit",
                FailureKind::SlowTail { .. } => "slow tail",
            };
            let x0 = xpos(f(w.from_ms));
            let x1 = xpos(f(w.until_ms));
            let _ = writeln!(
                out,
                "<rect x=\"{x0:.1}\" y=\"{TOP:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#f2dede\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#a94442\">{} ({})</text>",
                x1 - x0,
                plot_h(),
                x0 + 4.0,
                TOP + plot_h() - 6.0,
                kind,
                esc(&r.id)
            );
        }
    }
    for t in LOG_TICKS.iter().copied().filter(|t| *t <= top) {
        let y = ypos(t);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#dddddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}x</text>",
            LEFT + plot_w(),
            LEFT - 6.0,
            y + 4.0,
            t
        );
    }
    let step_s = nice_step(t_max / 1_000.0);
    let mut tick = 0.0;
    while tick <= t_max / 1_000.0 + 1e-9 {
        let xp = xpos(tick * 1_000.0);
        let _ = writeln!(
            out,
            "<line x1=\"{xp:.1}\" y1=\"{:.1}\" x2=\"{xp:.1}\" y2=\"{:.1}\" stroke=\"#333333\"/><text x=\"{xp:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{tick:.0}</text>",
            TOP + plot_h(),
            TOP + plot_h() + 5.0,
            TOP + plot_h() + 18.0
        );
        tick += step_s;
    }
    frame(&mut out, "time, s", "offered load / admitted rate (log)");
    for (st, rec) in strategies.iter().zip(records) {
        let points: Vec<(f64, f64)> = rec
            .offered
            .iter()
            .take(buckets)
            .enumerate()
            .flat_map(|(i, v)| {
                let t0 = f(u64::try_from(i).unwrap_or(0)) * f(bm);
                let y = ypos(f(*v) / admitted_per_bucket);
                [(xpos(t0), y), (xpos(t0 + f(bm)), y)]
            })
            .collect();
        polyline(&mut out, &points, *st);
    }
    legend(&mut out, s, strategies);
    out.push_str("</svg>\n");
    out
}

fn nice_step(span: f64) -> f64 {
    [
        1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| span / s <= 12.0)
    .unwrap_or(7200.0)
}

/// The latency CDF of logical requests (sorted latencies), per strategy.
pub fn latency_chart(s: &Scenario, strategies: &[Strategy], sorted: &[&[u64]]) -> String {
    let max = sorted
        .iter()
        .filter_map(|l| l.last())
        .copied()
        .max()
        .unwrap_or(1)
        .max(s.clients.deadline_ms);
    let ticks: Vec<u64> = [1u64, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000]
        .into_iter()
        .collect();
    let lo_ms = 10u64;
    let hi_ms = ticks
        .iter()
        .copied()
        .find(|t| *t >= max)
        .unwrap_or(10_000_000);
    let (lo, hi) = (f(lo_ms).ln(), f(hi_ms).ln());
    let xpos = |ms: u64| {
        let v = f(ms.clamp(lo_ms, hi_ms));
        LEFT + plot_w() * (v.ln() - lo) / (hi - lo)
    };
    let ypos = |q: f64| TOP + plot_h() * (1.0 - q);
    let mut out = String::new();
    head(
        &mut out,
        &format!(
            "{}: latency of logical requests (admission to final answer), CDF",
            s.name
        ),
    );
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let y = ypos(q);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#dddddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text>",
            LEFT + plot_w(),
            LEFT - 6.0,
            y + 4.0,
            q * 100.0
        );
    }
    for t in ticks.iter().copied().filter(|t| *t >= lo_ms && *t <= hi_ms) {
        let xp = xpos(t);
        let text = if t >= 1_000 {
            format!("{} s", t / 1_000)
        } else {
            format!("{t} ms")
        };
        let _ = writeln!(
            out,
            "<line x1=\"{xp:.1}\" y1=\"{TOP:.1}\" x2=\"{xp:.1}\" y2=\"{:.1}\" stroke=\"#dddddd\"/><text x=\"{xp:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{text}</text>",
            TOP + plot_h(),
            TOP + plot_h() + 18.0
        );
    }
    let dx = xpos(s.clients.deadline_ms);
    let _ = writeln!(
        out,
        "<line x1=\"{dx:.1}\" y1=\"{TOP:.1}\" x2=\"{dx:.1}\" y2=\"{:.1}\" stroke=\"#a94442\" stroke-dasharray=\"5,4\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#a94442\" text-anchor=\"end\">deadline</text>",
        TOP + plot_h(),
        dx - 4.0,
        TOP + plot_h() - 8.0
    );
    frame(&mut out, "latency (log)", "share of logical requests");
    for (st, lat) in strategies.iter().zip(sorted) {
        let n = u64::try_from(lat.len()).unwrap_or(0);
        if n == 0 {
            continue;
        }
        let steps = 400u64;
        let points: Vec<(f64, f64)> = (0..=steps)
            .map(|k| {
                let rank = n.saturating_mul(k) / steps;
                let i = usize::try_from(rank.min(n.saturating_sub(1))).unwrap_or(0);
                let v = lat.get(i).copied().unwrap_or(0);
                (xpos(v), ypos(f(k) / f(steps)))
            })
            .collect();
        polyline(&mut out, &points, *st);
    }
    legend(&mut out, s, strategies);
    out.push_str("</svg>\n");
    out
}
