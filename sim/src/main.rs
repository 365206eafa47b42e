//! `retryledger-sim`: simulate a scenario under every strategy, print the
//! figures table, write the charts (and the JSON figures when asked).
//!
//! ```text
//! retryledger-sim <scenario | path.json> [--seed N] [--strategy NAME]...
//!                 [--json PATH] [--charts DIR | --no-charts] [--splice FILE]...
//! retryledger-sim --list
//! retryledger-sim bench [--requests N] [--write docs/BENCHMARKS.md]
//! ```
//!
//! Errors print their code and exit with status 2 (input to fix: usage, an
//! unknown scenario or strategy, a scenario that does not decode) or 1 (a
//! file that cannot be read or written).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use retryledger_sim::{chart_stem, load, simulate, splice, Result, SimError, Strategy};

struct Args {
    scenario: Option<String>,
    seed: Option<u64>,
    strategies: Vec<Strategy>,
    json: Option<PathBuf>,
    charts: Option<PathBuf>,
    splice: Vec<PathBuf>,
    bench: bool,
    requests: u64,
    write: Option<PathBuf>,
    list: bool,
}

fn usage() -> SimError {
    SimError::new(
        "usage",
        "",
        "retryledger-sim <scenario | path.json> [--seed N] [--strategy NAME]... [--json PATH] [--charts DIR | --no-charts] [--splice FILE]...\n       retryledger-sim --list\n       retryledger-sim bench [--requests N] [--write FILE]",
    )
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("docs");
    let mut a = Args {
        scenario: None,
        seed: None,
        strategies: Vec::new(),
        json: None,
        charts: Some(docs),
        splice: Vec::new(),
        bench: false,
        requests: 1_000_000,
        write: None,
        list: false,
    };
    let number = |v: Option<String>, flag: &str| -> Result<u64> {
        v.and_then(|s| s.parse().ok()).ok_or_else(|| {
            SimError::new(
                "usage",
                flag,
                format!("{flag} takes a non-negative integer"),
            )
        })
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seed" => a.seed = Some(number(it.next(), "--seed")?),
            "--requests" => a.requests = number(it.next(), "--requests")?,
            "--strategy" => {
                let name = it.next().unwrap_or_default();
                let st = Strategy::parse(&name).ok_or_else(|| {
                    SimError::new(
                        "unknown_strategy",
                        "--strategy",
                        format!(
                            "`{name}`; one of {}",
                            Strategy::ALL.map(Strategy::as_str).join(", ")
                        ),
                    )
                })?;
                a.strategies.push(st);
            }
            "--json" => a.json = Some(it.next().ok_or_else(usage)?.into()),
            "--charts" => a.charts = Some(it.next().ok_or_else(usage)?.into()),
            "--no-charts" => a.charts = None,
            "--splice" => a.splice.push(it.next().ok_or_else(usage)?.into()),
            "--write" => a.write = Some(it.next().ok_or_else(usage)?.into()),
            "--list" => a.list = true,
            "bench" if a.scenario.is_none() => a.bench = true,
            "-h" | "--help" => return Err(usage()),
            s if s.starts_with('-') => return Err(usage()),
            s => {
                if a.scenario.is_some() {
                    return Err(usage());
                }
                a.scenario = Some(s.to_owned());
            }
        }
    }
    Ok(a)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| SimError::new("write_failed", "", format!("{}: {e}", path.display())))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| SimError::new("read_failed", "", format!("{}: {e}", path.display())))
}

fn run(a: Args) -> Result<()> {
    if a.list {
        for name in retryledger_sim::SCENARIOS {
            let s = load(name)?;
            println!("{name:14} {}", s.description);
        }
        return Ok(());
    }
    if a.bench {
        return bench(&a);
    }
    let name = a.scenario.clone().ok_or_else(usage)?;
    let mut s = load(&name)?;
    if let Some(seed) = a.seed {
        s.seed = seed;
    }
    let report = simulate(&s, &a.strategies)?;
    let table = report.summary();
    println!("{} — {}\n", s.name, s.description);
    print!("{table}");
    if let Some(path) = &a.json {
        write(path, &report.json())?;
    }
    if let Some(dir) = &a.charts {
        std::fs::create_dir_all(dir)
            .map_err(|e| SimError::new("write_failed", "", format!("{}: {e}", dir.display())))?;
        let stem = chart_stem(&s.name);
        write(&dir.join(format!("{stem}-load.svg")), &report.load_svg())?;
        write(
            &dir.join(format!("{stem}-latency.svg")),
            &report.latency_svg(),
        )?;
    }
    for path in &a.splice {
        let body = format!(
            "`retryledger-sim {}`: seed {}, {} logical requests over {} s.\n\n{table}",
            s.name,
            s.seed,
            report.figures.first().map_or(0, |f| f.requests),
            s.duration_ms / 1_000
        );
        let doc = read(path)?;
        write(path, &splice(&doc, &s.name, &body)?)?;
    }
    Ok(())
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && digits.len().saturating_sub(i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// CPU time of this thread so far, ns (Linux `/proc/thread-self/schedstat`).
fn cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Time `requests` logical requests of the full-outage scenario (run back
/// to back until it holds that many) under each strategy.
fn bench(a: &Args) -> Result<()> {
    let base = load("full_outage")?;
    let times = a.requests.div_ceil(base.expected_requests().max(1)).max(1);
    let s = base.tiled(times)?;
    let arrivals = retryledger_sim::engine::arrivals(&s);
    let n = arrivals.len();
    let mut rows = Vec::new();
    let strategies = if a.strategies.is_empty() {
        Strategy::for_scenario(&s)
    } else {
        a.strategies.clone()
    };
    for st in strategies {
        let (t0, c0) = (Instant::now(), cpu_ns());
        let rec = retryledger_sim::engine::run(&s, st, &arrivals)?;
        let wall = t0.elapsed();
        let secs = wall.as_secs_f64();
        let per_s = (n as u128)
            .saturating_mul(1_000_000_000)
            .checked_div(wall.as_nanos())
            .map_or(u64::MAX, |v| u64::try_from(v).unwrap_or(u64::MAX));
        #[allow(
            clippy::cast_precision_loss,
            reason = "nanoseconds of one run are far below 2^53"
        )]
        let cpu = cpu_ns()
            .zip(c0)
            .map(|(b, a)| b.saturating_sub(a) as f64 / 1e9);
        let cpu_text = cpu.map_or("-".to_owned(), |c| format!("{c:.2} s"));
        println!(
            "{:20} {n} logical requests, {} attempts: wall {secs:.2} s, CPU {cpu_text}, {per_s} logical requests/s",
            st.as_str(),
            rec.attempts
        );
        rows.push((st, rec.attempts, secs, cpu_text, per_s));
    }
    if let Some(path) = &a.write {
        let mut body = format!(
            "Command: `make bench-sim` (= `cargo run --release -p retryledger-sim -- bench --requests {req} --write docs/BENCHMARKS.md`), \
             release profile (fat LTO, one codegen unit), one thread, on the shared 2-core machine. The \
             full-outage scenario run {times} times back to back (a 60 s period with the primary down from \
             20 s to 30 s of each): {nn} logical requests, Poisson arrivals at {rate} per second, the same \
             arrivals for every strategy. Wall and CPU time (this thread, `/proc/thread-self/schedstat`) of \
             one strategy's run: the event queue, the routes, the strategy (for retryledger the core's \
             `Session` per logical request, its admission under the shared breaker and budget, the \
             judgement of each attempt's facts, the breaker record) and the record; the arrivals (drawn \
             once for all strategies), figures and charts not included.\n\n\
             | strategy | logical requests | physical attempts | wall | CPU | logical requests per second (wall) |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
            req = a.requests,
            rate = thousands(s.arrivals.rate_per_s),
            nn = thousands(n as u64),
        );
        for (st, attempts, secs, cpu, per_s) in &rows {
            body.push_str(&format!(
                "| {} | {} | {} | {secs:.2} s | {cpu} | {} |\n",
                st.as_str(),
                thousands(n as u64),
                thousands(*attempts),
                thousands(*per_s)
            ));
        }
        let worst_wall = rows.iter().map(|r| r.2).fold(0.0, f64::max);
        let worst_cpu = rows
            .iter()
            .filter_map(|r| r.3.strip_suffix(" s").and_then(|c| c.parse::<f64>().ok()))
            .fold(0.0, f64::max);
        let holds = |v: f64| if v < 10.0 { "holds" } else { "does not hold" };
        body.push_str(&format!(
            "\n**Target: 1,000,000 logical requests simulated in under 10 s, every strategy: on CPU time \
             {} (slowest {worst_cpu:.2} s); on wall time {} (slowest {worst_wall:.2} s).** Wall time \
             above CPU time is time the thread waited for a core other jobs held. retryledger's time is \
             the core's work for each logical request (a profile puts about three quarters of it in the \
             session's calls: allocating and copying attempts and snapshots, the SHA-256 of the snapshots \
             each admission reads); the other strategies only draw and schedule.\n",
            holds(worst_cpu),
            holds(worst_wall),
        ));
        let doc = read(path)?;
        write(path, &splice(&doc, "bench", &body)?)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // Input the caller can fix is 2; a failure to read or write, or
            // anything internal, is 1.
            let bad_input = !matches!(
                e.code,
                "write_failed" | "read_failed" | "scenario_unreadable" | "internal"
            );
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}
