//! The run machine's cost per attempt, side by side with the session it
//! drives: the reference run (three attempts) recorded once as a scripted
//! host answered it, then replayed through a fresh machine — plain, with a
//! fleet section (breaker, retry budget and admission limits: a read and a
//! write before each attempt, a read and a write after it), and journaled
//! with the fleet — next to the same attempts observed through a bare
//! session. Run with `make bench-core` (or `make bench`); the last lines
//! print the medians per attempt and their ratios.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    missing_docs,
    reason = "a benchmark: any unexpected value is a bug to fail on loudly"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use retryledger_core::canonical::to_value;
use retryledger_core::machine::script::{play_start, Script};
use retryledger_core::machine::{Event, JournalOptions, Machine, Options};
use retryledger_core::observe::Facts;
use retryledger_core::{compile, lab, CompiledPolicy, Session};
use serde_json::{json, Value};

const ORIGIN: u64 = 1_780_000_000_000;

fn policy(fleet: bool) -> Arc<CompiledPolicy> {
    let mut p = lab::reference_policy();
    if fleet {
        p["fleet"] = json!({
            "admission": {"max_in_flight": 4, "max_queue_ms": 1_000, "request_burst": 4, "requests_per_second": 100},
            "breaker": {"consecutive_failures": 3, "half_open_probes": 1, "open_ms": 1_000},
            "on_store_unavailable": "fail_closed",
            "retry_budget": {"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "s"}
        });
    }
    Arc::new(compile(retryledger_core::decode::from_value(p).unwrap()).unwrap())
}

fn full_budget() -> Value {
    json!({"budget/s": {"balance_milli": 5_000, "deposits": 0, "generation": 0,
        "schema": "retryledger.retry_budget.v1", "scope": "s",
        "updated_at_epoch_ms": ORIGIN, "withdrawals": 0}})
}

/// The reference run's outcomes as a script.
fn script() -> Script {
    let bundle = lab::reference_bundle().unwrap();
    let attempts: Vec<Value> = bundle
        .attempts
        .attempts
        .iter()
        .map(|a| {
            let facts = if a.outcome == retryledger_core::Outcome::Success {
                json!({"result": "returned"})
            } else {
                json!({"result": "raised", "outcome": to_value(&a.outcome)})
            };
            json!({"after_ms": a.completed_at_ms - a.started_at_ms, "cost": a.cost, "facts": facts})
        })
        .collect();
    Script::from_value(&json!({"attempts": attempts, "store": full_budget()})).unwrap()
}

fn options(journal: bool) -> Options {
    Options {
        origin_epoch_ms: ORIGIN,
        journal: journal.then(|| JournalOptions {
            run_id: retryledger_core::ids::Identifier::parse("run-bench").unwrap(),
            lease_generation: 1,
        }),
        ..Options::default()
    }
}

/// A recorded run: its policy, options and the events its host answered.
struct Recorded {
    cp: Arc<CompiledPolicy>,
    journal: bool,
    events: Vec<Event>,
    attempts: u32,
}

fn recorded(fleet: bool, journal: bool) -> Recorded {
    let cp = policy(fleet);
    let played = play_start(&cp, options(journal), &script()).unwrap();
    assert!(played.error.is_none(), "{:?}", played.error);
    let attempts = played
        .events
        .iter()
        .filter(|e| matches!(e, Event::Observed(_)))
        .count() as u32;
    assert_eq!(attempts, 3);
    Recorded {
        cp,
        journal,
        events: played.events,
        attempts,
    }
}

fn replay(r: &Recorded) {
    let mut m = Machine::start(Arc::clone(&r.cp), options(r.journal)).unwrap();
    for e in &r.events {
        m.answer(e.clone()).unwrap();
    }
    assert!(m.next().is_done());
    black_box(m.seal().unwrap());
}

/// The same attempts observed through a bare session (no fleet, no journal).
fn session_alone(cp: &Arc<CompiledPolicy>, facts: &[(u64, u64, Option<u64>, Facts)]) {
    let mut s = Session::start(Arc::clone(cp));
    for (start, end, cost, f) in facts {
        s.observe(*start, *end, *cost, f).unwrap();
    }
    black_box(s.seal().unwrap());
}

fn session_facts() -> Vec<(u64, u64, Option<u64>, Facts)> {
    let bundle = lab::reference_bundle().unwrap();
    bundle
        .attempts
        .attempts
        .iter()
        .map(|a| {
            let mut f = if a.outcome == retryledger_core::Outcome::Success {
                Facts::returned()
            } else {
                Facts::raised()
            };
            if a.outcome != retryledger_core::Outcome::Success {
                f.outcome = Some(a.outcome);
            }
            (a.started_at_ms, a.completed_at_ms, Some(a.cost), f)
        })
        .collect()
}

fn machine(c: &mut Criterion) {
    let plain = recorded(false, false);
    let fleet = recorded(true, false);
    let both = recorded(true, true);
    let cp = policy(false);
    let facts = session_facts();
    let mut g = c.benchmark_group("machine");
    g.bench_function("session_alone_reference_run", |b| {
        b.iter(|| session_alone(&cp, &facts))
    });
    g.bench_function("machine_reference_run", |b| b.iter(|| replay(&plain)));
    g.bench_function("machine_fleet_reference_run", |b| b.iter(|| replay(&fleet)));
    g.bench_function("machine_fleet_journal_reference_run", |b| {
        b.iter(|| replay(&both))
    });
    g.finish();
}

/// CPU time of this thread so far, ns (Linux `/proc/thread-self/schedstat`;
/// `None` elsewhere).
fn cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Wall and CPU time of `f` per call, over interleaved rounds: the CPU
/// time (this thread's) is what the run costs when other processes share
/// the machine, the wall time what a caller waits.
fn per_call(wall: &mut [Vec<f64>], cpu: &mut [Vec<f64>], fs: &[&dyn Fn()], calls: u32) {
    for _ in 0..15 {
        for (i, f) in fs.iter().enumerate() {
            let c = cpu_ns();
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            wall[i].push(t.elapsed().as_secs_f64() / f64::from(calls));
            if let (Some(a), Some(b)) = (c, cpu_ns()) {
                cpu[i].push((b - a) as f64 * 1e-9 / f64::from(calls));
            }
        }
    }
}

/// The median of `r`, per attempt of a run of `attempts`, µs (NaN when
/// nothing was measured).
fn median_per_attempt(r: &mut [f64], attempts: u32) -> f64 {
    if r.is_empty() {
        return f64::NAN;
    }
    r.sort_by(|a, b| a.partial_cmp(b).unwrap());
    r[r.len() / 2] * 1e6 / f64::from(attempts)
}

fn summary() {
    let plain = recorded(false, false);
    let fleet = recorded(true, false);
    let both = recorded(true, true);
    let cp = policy(false);
    let facts = session_facts();
    let fs: [&dyn Fn(); 4] = [
        &|| session_alone(&cp, &facts),
        &|| replay(&plain),
        &|| replay(&fleet),
        &|| replay(&both),
    ];
    let mut wall = vec![Vec::new(); fs.len()];
    let mut cpu = vec![Vec::new(); fs.len()];
    per_call(&mut wall, &mut cpu, &fs, 2_000);
    let w: Vec<f64> = wall
        .iter_mut()
        .map(|r| median_per_attempt(r, plain.attempts))
        .collect();
    let c: Vec<f64> = cpu
        .iter_mut()
        .map(|r| median_per_attempt(r, plain.attempts))
        .collect();
    println!();
    println!("machine, per attempt of the reference run (medians of 15 interleaved rounds, µs; wall, then CPU of this thread):");
    let rows = [
        "session alone (observe, no fleet)           ",
        "machine, plain                              ",
        "machine, fleet (breaker, budget, limits)    ",
        "machine, fleet + journal (two appends each) ",
    ];
    for (i, name) in rows.iter().enumerate() {
        let note = match i {
            0 => String::new(),
            2 => format!(
                "  ({:.2}× the session, {:.2}× the plain machine, CPU; target ≤ 2 µs)",
                c[i] / c[0],
                c[i] / c[1]
            ),
            _ => format!("  ({:.2}× the session, CPU)", c[i] / c[0]),
        };
        println!("  {name} {:>7.2}  {:>7.2}{note}", w[i], c[i]);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = machine
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
