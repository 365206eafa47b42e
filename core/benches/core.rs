//! Core benchmarks: validate_policy, plan_next, evaluate with receipt and
//! verify_bundle on the reference run, verify_bundle on runs of 10, 100
//! and 1,000 attempts, and a journal writer's appends at 10, 100 and 1,000
//! events (with the ratios of their medians printed after the groups). Run
//! with `make bench-core` (or `make bench`).
//!
//! Each operation is measured at two layers: the typed API a Rust host uses
//! with a policy compiled once per run, and the JSON-text boundary
//! (`retryledger_core::api`) the WebAssembly and Python bindings call, which
//! also decodes every document and encodes the result.
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

use criterion::{criterion_group, BatchSize, BenchmarkId, Criterion, Throughput};
use retryledger_core::api;
use retryledger_core::canonical::canonical_json;
use retryledger_core::decode::from_value;
use retryledger_core::journal::{Entry, JournalEvent, Writer};
use retryledger_core::lab::{self, Step};
use retryledger_core::outcome::RetryableKind;
use retryledger_core::{
    compile, evaluate, plan_next, seal, verify_bundle, Attempts, Bundle, CompiledPolicy, Outcome,
    Policy,
};
use serde_json::json;

/// A run of `n` attempts: one route allowing them all, 1 ms delays, a
/// generous deadline and budget; `n - 1` unavailable attempts, then success.
pub fn long_run(n: usize) -> Bundle {
    let mut p = lab::reference_policy();
    p["routes"].as_array_mut().unwrap().truncate(1);
    p["routes"][0]["max_attempts"] = json!(n);
    p["routes"][0]["reserve_cost"] = json!(1);
    p["max_total_attempts"] = json!(n);
    p["max_total_cost"] = json!(1_000_000);
    p["deadline_ms"] = json!(100_000_000);
    p["backoff"] = json!({"base_ms": 1, "max_ms": 1, "retry_after_cap_ms": 0});
    let policy: Policy = from_value(p).unwrap();
    let down = Outcome::Retryable {
        kind: RetryableKind::Unavailable,
        retry_after_ms: None,
        retry_after_source: None,
    };
    let mut steps: Vec<Step> = (1..n).map(|_| Step::new(down, 20, 1)).collect();
    steps.push(Step::new(Outcome::Success, 20, 1));
    let attempts = lab::simulate(&policy, &steps).unwrap();
    assert_eq!(attempts.attempts.len(), n);
    seal(&policy, &attempts).unwrap()
}

fn reference(c: &mut Criterion) {
    let bundle = lab::reference_bundle().unwrap();
    let compiled = compile(bundle.policy.clone()).unwrap();
    let policy_text = canonical_json(&bundle.policy);
    let attempts_text = canonical_json(&bundle.attempts);
    let bundle_text = canonical_json(&bundle);
    let two = Attempts {
        attempts: bundle.attempts.attempts[..2].to_vec(),
        ..bundle.attempts.clone()
    };
    let two_text = canonical_json(&two);

    let mut g = c.benchmark_group("reference");
    g.bench_function("validate_policy/typed", |b| {
        b.iter(|| retryledger_core::validate_policy(black_box(&bundle.policy)).unwrap())
    });
    g.bench_function("validate_policy/json", |b| {
        b.iter(|| api::validate_policy(black_box(&policy_text)).unwrap())
    });
    g.bench_function("plan_next/typed", |b| {
        b.iter(|| plan_next(black_box(&compiled), black_box(&two)).unwrap())
    });
    g.bench_function("plan_next/json_compiled", |b| {
        b.iter(|| api::plan_next_compiled(black_box(&compiled), black_box(&two_text)).unwrap())
    });
    g.bench_function("plan_next/json", |b| {
        b.iter(|| api::plan_next(black_box(&policy_text), black_box(&two_text)).unwrap())
    });
    g.bench_function("evaluate_with_receipt/typed", |b| {
        b.iter(|| evaluate(black_box(&compiled), black_box(&bundle.attempts)).unwrap())
    });
    g.bench_function("evaluate_with_receipt/json_compiled", |b| {
        b.iter(|| api::evaluate_compiled(black_box(&compiled), black_box(&attempts_text)).unwrap())
    });
    g.bench_function("evaluate_with_receipt/json", |b| {
        b.iter(|| api::evaluate(black_box(&policy_text), black_box(&attempts_text)).unwrap())
    });
    g.bench_function("verify_bundle/typed", |b| {
        b.iter(|| verify_bundle(black_box(&bundle)).unwrap())
    });
    g.bench_function("verify_bundle/json", |b| {
        b.iter(|| api::verify(black_box(&bundle_text)).unwrap())
    });
    g.finish();
}

fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("verify_bundle_attempts");
    for n in [10usize, 100, 1_000] {
        let bundle = long_run(n);
        let text = canonical_json(&bundle);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("typed", n), &bundle, |b, bundle| {
            b.iter(|| verify_bundle(black_box(bundle)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("json", n), &text, |b, text| {
            b.iter(|| api::verify(black_box(text)).unwrap())
        });
    }
    g.finish();
    let mut g = c.benchmark_group("evaluate_attempts");
    for n in [10usize, 100, 1_000] {
        let bundle = long_run(n);
        let compiled = compile(bundle.policy.clone()).unwrap();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("typed", n), &bundle, |b, bundle| {
            b.iter(|| evaluate(black_box(&compiled), black_box(&bundle.attempts)).unwrap())
        });
    }
    g.finish();
}

/// The builder's cost per policy (request digest, catalog digests, build and
/// validation) next to `validate_policy` on the policy it builds.
fn builder(c: &mut Criterion) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vectors/builder.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "build_reference_spec")
        .unwrap();
    let request = case["input"]["request"].as_str().unwrap().to_owned();
    let spec = case["input"]["spec"].as_str().unwrap().to_owned();
    let built = api::build_policy(&request, &spec).unwrap();
    let mut g = c.benchmark_group("builder");
    g.bench_function("build_policy/json", |b| {
        b.iter(|| api::build_policy(black_box(&request), black_box(&spec)).unwrap())
    });
    g.bench_function("validate_policy/json_same_policy", |b| {
        b.iter(|| api::validate_policy(black_box(&built)).unwrap())
    });
    g.bench_function("request_sha256/json", |b| {
        b.iter(|| api::request_sha256(black_box(&request)).unwrap())
    });
    let (template, keyless, key) = template_of(&spec);
    drop(keyless);
    g.bench_function("template_bind/json", |b| {
        b.iter(|| {
            api::bind_policy_template(&template, black_box(&request), black_box(&key)).unwrap()
        })
    });
    let typed = retryledger_core::request::parse_request(&request).unwrap();
    let key_hex = retryledger_core::ids::Sha256Hex::parse(&key).unwrap();
    g.bench_function("template_bind/typed", |b| {
        b.iter(|| template.bind(black_box(&typed), black_box(&key_hex)))
    });
    g.finish();
}

/// The reference spec's template (its key taken out), the keyless spec and the key.
fn template_of(spec: &str) -> (retryledger_core::template::PolicyTemplate, String, String) {
    let mut v: serde_json::Value = serde_json::from_str(spec).unwrap();
    let key = v
        .as_object_mut()
        .unwrap()
        .remove("idempotency_key_sha256")
        .unwrap();
    let keyless = v.to_string();
    let template = api::compile_policy_template(&keyless).unwrap();
    (template, keyless, key.as_str().unwrap().to_owned())
}

/// A template's bind next to `build_policy` per call (JSON text in and out,
/// the bindings' boundary), medians of interleaved rounds, and their ratio.
fn template_ratios() {
    const ROUNDS: usize = 41;
    const PER_ROUND: usize = 2_000;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vectors/builder.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "build_reference_spec")
        .unwrap();
    let request = case["input"]["request"].as_str().unwrap().to_owned();
    let spec = case["input"]["spec"].as_str().unwrap().to_owned();
    let (template, _, key) = template_of(&spec);
    let typed = retryledger_core::request::parse_request(&request).unwrap();
    let key_hex = retryledger_core::ids::Sha256Hex::parse(&key).unwrap();
    let mut bind = Vec::with_capacity(ROUNDS);
    let mut bind_typed = Vec::with_capacity(ROUNDS);
    let mut build = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..PER_ROUND {
            black_box(template.bind(black_box(&typed), black_box(&key_hex)));
        }
        bind_typed.push(start.elapsed().as_nanos() as f64 / PER_ROUND as f64);
        let start = Instant::now();
        for _ in 0..PER_ROUND {
            black_box(
                api::bind_policy_template(&template, black_box(&request), black_box(&key)).unwrap(),
            );
        }
        bind.push(start.elapsed().as_nanos() as f64 / PER_ROUND as f64);
        let start = Instant::now();
        for _ in 0..PER_ROUND {
            black_box(api::build_policy(black_box(&request), black_box(&spec)).unwrap());
        }
        build.push(start.elapsed().as_nanos() as f64 / PER_ROUND as f64);
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let (bind, typed, build) = (
        median(&mut bind),
        median(&mut bind_typed),
        median(&mut build),
    );
    println!(
        "policy per call (Rust): template bind {:.2} µs (JSON request in, policy JSON out; {:.2} µs typed), build_policy {:.2} µs, build_policy / bind = {:.1} (median of {ROUNDS} rounds)",
        bind / 1000.0,
        typed / 1000.0,
        build / 1000.0,
        build / bind
    );
}

/// Whether this `cargo bench` run's filter (if any) selects `group`.
fn group_selected(group: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    args.iter().any(|a| a == "--bench")
        && (filters.is_empty() || filters.iter().any(|f| group.contains(f.as_str())))
}

/// A streamed attempt of 1,000 short deltas observed by a session (the core's
/// share of a host's per-event cost: digests, the record, the event log), and
/// a fleet admission plus the breaker's record for one attempt, in memory.
fn streams_and_fleet(c: &mut Criterion) {
    use retryledger_core::observe::Facts;
    use retryledger_core::stream::StreamFacts;
    use retryledger_core::Session;

    let mut p = lab::reference_policy();
    p["stream"] = json!({"max_response_bytes": 1_000_000, "mode": "tentative"});
    let policy = Arc::new(compile(from_value(p).unwrap()).unwrap());
    let deltas: Vec<String> = (0..1_000).map(|i| format!(" tok{i}")).collect();
    let bytes: u64 = deltas.iter().map(|d| d.len() as u64).sum();
    let mut facts = Facts::returned();
    facts.stream = Some(StreamFacts {
        bytes,
        events: 1_000,
        last_sequence: None,
        mode: None,
        response_id: None,
        terminal_event: true,
        usage_event: true,
        violation: None,
    });
    let mut g = c.benchmark_group("streams");
    g.throughput(Throughput::Elements(1_000));
    g.bench_function("observe_stream/1000_deltas", |b| {
        b.iter(|| {
            let mut s = Session::start(policy.clone());
            black_box(
                s.observe_stream(1_000, 1_500, None, &facts, &deltas)
                    .unwrap(),
            )
        })
    });
    g.bench_function("observe_stream_and_seal/1000_deltas", |b| {
        b.iter(|| {
            let mut s = Session::start(policy.clone());
            black_box(
                s.observe_stream(1_000, 1_500, None, &facts, &deltas)
                    .unwrap(),
            );
            black_box(s.seal().unwrap())
        })
    });
    g.bench_function("sha256/1000_deltas", |b| {
        b.iter(|| {
            for d in &deltas {
                black_box(retryledger_core::stream::delta_digest(d.as_bytes()));
            }
        })
    });
    g.finish();

    let mut p = lab::reference_policy();
    p["fleet"] = json!({
        "breaker": {"consecutive_failures": 5, "half_open_probes": 1, "open_ms": 30_000},
        "on_store_unavailable": "fail_closed",
        "retry_budget": {"floor_per_second": 1, "max_tokens": 20, "ratio_permille": 100, "scope": "tenant-7"}
    });
    let policy = Arc::new(compile(from_value(p).unwrap()).unwrap());
    let view = retryledger_core::fleet::FleetView::default();
    let mut g = c.benchmark_group("fleet");
    g.bench_function("admit_observe_record/one_attempt", |b| {
        b.iter(|| {
            let mut s = Session::start(policy.clone());
            let admitted = s.admit(1_000, 1_780_000_000_000, black_box(&view)).unwrap();
            black_box(&admitted);
            s.observe(1_000, 1_040, None, &Facts::returned()).unwrap();
            let fresh = retryledger_core::breaker::BreakerSnapshot::fresh(
                s.attempts().attempts[0].route_release_sha256.clone(),
                1_780_000_000_000,
            );
            black_box(s.breaker_after(&fresh, 1_780_000_000_040).unwrap())
        })
    });
    g.bench_function("admit_only/one_attempt", |b| {
        b.iter(|| {
            let mut s = Session::start(policy.clone());
            black_box(s.admit(1_000, 1_780_000_000_000, black_box(&view)).unwrap())
        })
    });
    // Admission limits: one attempt admitted under an in-flight cap and both
    // buckets (the snapshot carried from one admission to the next, as a
    // store would hold it), then released with its token usage settled.
    let mut lp = lab::reference_policy();
    lp["fleet"] = json!({
        "admission": {"max_in_flight": 4, "max_queue_ms": 10_000, "request_burst": 1_000_000,
            "requests_per_second": 1_000_000, "token_bound": 1_000_000_000, "tokens_per_second": 1_000_000_000},
        "on_store_unavailable": "fail_closed"
    });
    let limited = Arc::new(compile(from_value(lp).unwrap()).unwrap());
    let release = limited.policy.routes[0].route_release_sha256.clone();
    let cfg = limited
        .policy
        .fleet
        .as_ref()
        .and_then(|f| f.admission.clone())
        .unwrap();
    let fresh = retryledger_core::admission::AdmissionSnapshot::fresh(
        &cfg,
        release.clone(),
        1_780_000_000_000,
    );
    g.bench_function("admission_admit_release/pure", |b| {
        let mut snap = fresh.clone();
        let mut now = 1_780_000_000_000u64;
        b.iter(|| {
            now += 1;
            let (answer, held) =
                retryledger_core::admission::admit(&cfg, black_box(&snap), now, now, 500);
            black_box(answer);
            snap = retryledger_core::admission::release(&cfg, &held, now, 500, Some(300));
        })
    });
    g.bench_function("admission_admit_observe_release/one_attempt", |b| {
        let mut snap = fresh.clone();
        let mut now = 1_780_000_000_000u64;
        b.iter(|| {
            now += 1;
            let mut s = Session::start(limited.clone());
            let view = retryledger_core::fleet::FleetView {
                admission: vec![(release.clone(), snap.clone())],
                reserve_tokens: Some(500),
                ..Default::default()
            };
            let admitted = s.admit(1_000, now, black_box(&view)).unwrap();
            black_box(&admitted);
            s.observe(1_000, 1_040, None, &Facts::returned()).unwrap();
            snap = s
                .admission_release(&admitted.writes.admission[0], now + 40, Some(300))
                .unwrap();
        })
    });
    let headers: Vec<(String, String)> = [
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-reset-requests", "120ms"),
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "29500"),
        ("x-ratelimit-reset-tokens", "1s"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    g.bench_function("admission_observe/openai_headers", |b| {
        let now = 1_780_000_000_000u64;
        b.iter(|| {
            black_box(retryledger_core::admission::observe(
                &cfg,
                black_box(&fresh),
                black_box(&headers),
                now,
            ))
        })
    });
    g.bench_function("admission_admit_observe_release_seen/openai_headers", |b| {
        let mut snap = fresh.clone();
        let mut now = 1_780_000_000_000u64;
        b.iter(|| {
            now += 1;
            let mut s = Session::start(limited.clone());
            let view = retryledger_core::fleet::FleetView {
                admission: vec![(release.clone(), snap.clone())],
                reserve_tokens: Some(500),
                ..Default::default()
            };
            let admitted = s.admit(1_000, now, black_box(&view)).unwrap();
            black_box(&admitted);
            s.observe(1_000, 1_040, None, &Facts::returned()).unwrap();
            snap = s
                .admission_release_seen(
                    &admitted.writes.admission[0],
                    now + 40,
                    Some(300),
                    black_box(&headers),
                )
                .unwrap();
        })
    });
    g.bench_function("session_start/fleet_policy", |b| {
        b.iter(|| black_box(Session::start(policy.clone())))
    });
    g.bench_function("session_observe/one_attempt_without_fleet", |b| {
        let plain = Arc::new(compile(lab::reference_bundle().unwrap().policy).unwrap());
        b.iter(|| {
            let mut s = Session::start(plain.clone());
            black_box(s.observe(1_000, 1_040, None, &Facts::returned()).unwrap())
        })
    });
    g.finish();
}

/// The journal of a run of `attempts` attempts (all but the last
/// unavailable, 1 ms apart) written through a writer, without its terminal:
/// its events and the entries that wrote them.
fn long_journal(attempts: usize) -> (Arc<CompiledPolicy>, Vec<JournalEvent>, Vec<Entry>) {
    let bundle = long_run(attempts);
    let cp = Arc::new(compile(bundle.policy.clone()).unwrap());
    let mut entries = vec![
        Entry::Created {
            created_at_epoch_ms: 1_780_000_000_000,
            run_id: retryledger_core::ids::Identifier::parse("run-1").unwrap(),
        },
        Entry::Decided,
    ];
    for a in &bundle.attempts.attempts {
        entries.push(Entry::Reserved {
            dispatch: None,
            cancelled_at_ms: None,
        });
        entries.push(Entry::Dispatched {
            admission: None,
            snapshots: None,
            started_at_ms: a.started_at_ms,
        });
        entries.push(Entry::Observed {
            attempt: a.clone(),
            delta_digests: Vec::new(),
        });
        entries.push(Entry::Decided);
    }
    let mut w = Writer::new(Arc::clone(&cp), &[], 1).unwrap();
    let events = w.append_all(&entries).unwrap();
    (cp, events, entries)
}

/// Journal lengths the append is measured at.
const JOURNAL_LENGTHS: [usize; 3] = [10, 100, 1_000];

/// Events appended per measurement: four in a row, one of each kind
/// (`reserved`, `dispatched`, `observed`, `decided`, in some rotation).
const CYCLE: usize = 4;

/// A journal's writer ready to append at one length.
struct AtLength {
    /// The journal's length.
    n: usize,
    /// The writer of its first `n - CYCLE` events.
    before: Writer,
    /// The entries of events `n - CYCLE .. n`.
    warm: Vec<Entry>,
    /// The entries of events `n .. n + CYCLE`, to measure.
    next: Vec<Entry>,
}

impl AtLength {
    /// A writer of the first `n` events whose lists have room for the next
    /// events, as a writer that has been appending has (a clone's lists
    /// are full: its first append would copy them to grow them).
    fn writer(&self) -> Writer {
        let mut w = self.before.clone();
        for e in &self.warm {
            w.append(e).unwrap();
        }
        w
    }
}

fn journal_writers() -> Vec<AtLength> {
    let (cp, events, entries) = long_journal(300);
    JOURNAL_LENGTHS
        .iter()
        .map(|&n| AtLength {
            n,
            before: Writer::new(Arc::clone(&cp), &events[..n - CYCLE], 1).unwrap(),
            warm: entries[n - CYCLE..n].to_vec(),
            next: entries[n..n + CYCLE].to_vec(),
        })
        .collect()
}

/// A journal writer appending four events (one of each kind) to a journal
/// of `n` events: the core's share of a durable run's append, which should
/// not grow with `n`. Making the writer is setup, not measured.
fn journal(c: &mut Criterion) {
    let mut g = c.benchmark_group("journal_append");
    g.throughput(Throughput::Elements(CYCLE as u64));
    for at in journal_writers() {
        g.bench_with_input(BenchmarkId::new("writer_4_events", at.n), &at, |b, at| {
            b.iter_batched(
                || at.writer(),
                |mut w| {
                    for e in &at.next {
                        black_box(w.append(e).unwrap());
                    }
                    w
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("append_all_2x2", at.n), &at, |b, at| {
            b.iter_batched(
                || at.writer(),
                |mut w| {
                    black_box(w.append_all(&at.next[..2]).unwrap());
                    black_box(w.append_all(&at.next[2..]).unwrap());
                    w
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// The medians of the writer's four appends at each journal length,
/// measured over interleaved rounds (so drift in the machine's load falls
/// on every length alike), printed as ratios to the shortest journal.
fn journal_ratios() {
    const ROUNDS: usize = 61;
    const PER_ROUND: usize = 64;
    let lengths = journal_writers();
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); lengths.len()];
    for _ in 0..ROUNDS {
        for (k, at) in lengths.iter().enumerate() {
            let mut ws: Vec<Writer> = (0..PER_ROUND).map(|_| at.writer()).collect();
            let start = Instant::now();
            for w in &mut ws {
                for e in &at.next {
                    black_box(w.append(e).unwrap());
                }
            }
            let ns = start.elapsed().as_nanos() as f64 / (PER_ROUND * CYCLE) as f64;
            times[k].push(ns);
            drop(ws);
        }
    }
    let medians: Vec<f64> = times
        .iter_mut()
        .map(|t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect();
    for (at, m) in lengths.iter().zip(&medians) {
        println!(
            "journal append: n={}: {m:.0} ns per event (median of {ROUNDS} rounds)",
            at.n
        );
    }
    for (at, m) in lengths.iter().zip(&medians).skip(1) {
        println!(
            "journal append: n={} / n={} = {:.2}",
            at.n,
            lengths[0].n,
            m / medians[0]
        );
    }
}

/// Whether this is a `cargo bench` run whose filter (if any) selects the
/// journal group.
fn journal_selected() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    args.iter().any(|a| a == "--bench")
        && (filters.is_empty()
            || filters
                .iter()
                .any(|f| "journal_append".contains(f.as_str())))
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = reference, scaling, builder, streams_and_fleet, journal
}

fn main() {
    benches();
    if journal_selected() {
        journal_ratios();
    }
    if group_selected("builder") {
        template_ratios();
    }
    Criterion::default().configure_from_args().final_summary();
}
