//! Invariants of the control plane, checked on random policies (routes,
//! budgets, backoff, jitter modes) and random outcome scripts driven the way
//! a host drives a run: plan, dispatch at the earliest start plus a random
//! lag, observe, repeat.
//!
//! Each property runs `RETRYLEDGER_PROPERTY_CASES` cases (256 when unset, so a
//! debug `cargo test` stays quick; `make properties` runs 10,000 in release).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "tests fail loudly on any unexpected value"
)]

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, sha256_hex, to_value};
use retryledger_core::decode::from_value;
use retryledger_core::lab;
use retryledger_core::outcome::{IndeterminateKind, NonRetryableKind, RetryableKind};
use retryledger_core::policy::DataBoundary;
use retryledger_core::{
    compile, evaluate, plan_next, seal, verify_bundle, Attempt, Attempts, CompiledPolicy, Decision,
    ErrorCode, Outcome, Policy, Terminal, Verdict,
};
use serde_json::{json, Value};

fn cases() -> u32 {
    std::env::var("RETRYLEDGER_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Generated inputs

#[derive(Debug, Clone)]
struct RouteSpec {
    max_attempts: u64,
    reserve_cost: u64,
    boundary: u8,
    degraded: bool,
}

#[derive(Debug, Clone)]
struct PolicySpec {
    routes: Vec<RouteSpec>,
    reversed: bool,
    max_boundary: u8,
    max_total_attempts: u64,
    max_total_cost: u64,
    deadline_ms: u64,
    base_ms: u64,
    max_factor: u64,
    retry_after_cap_ms: u64,
    jitter: u8,
    seed: u64,
}

#[derive(Debug, Clone, Copy)]
struct StepSpec {
    outcome: Outcome,
    duration_ms: u64,
    cost: u64,
    lag_ms: u64,
}

const BOUNDARIES: [&str; 3] = ["local_process", "private_service", "external_provider"];

fn route_spec() -> impl Strategy<Value = RouteSpec> {
    (1u64..=4, 0u64..=3_000, 0u8..3, prop::bool::weighted(0.2)).prop_map(
        |(max_attempts, reserve_cost, boundary, degraded)| RouteSpec {
            max_attempts,
            reserve_cost,
            boundary,
            degraded,
        },
    )
}

/// Unless `free_boundary`, the policy maximum is raised to cover every route.
fn policy_spec(free_boundary: bool) -> impl Strategy<Value = PolicySpec> {
    (
        prop::collection::vec(route_spec(), 1..=4),
        any::<bool>(),
        0u8..3,
        1u64..=12,
        prop_oneof![1 => 0u64..=2_000, 4 => 2_000u64..=60_000],
        prop_oneof![1 => 1u64..=500, 4 => 500u64..=30_000],
        1u64..=400,
        1u64..=20,
        prop_oneof![Just(0u64), 0u64..=5_000],
        0u8..4,
        any::<u64>(),
    )
        .prop_map(
            move |(
                routes,
                reversed,
                max_boundary,
                max_total_attempts,
                max_total_cost,
                deadline_ms,
                base_ms,
                max_factor,
                retry_after_cap_ms,
                jitter,
                seed,
            )| {
                let widest = routes.iter().map(|r| r.boundary).max().unwrap_or(0);
                PolicySpec {
                    max_boundary: if free_boundary {
                        max_boundary
                    } else {
                        max_boundary.max(widest)
                    },
                    routes,
                    reversed,
                    max_total_attempts,
                    max_total_cost,
                    deadline_ms,
                    base_ms,
                    max_factor,
                    retry_after_cap_ms,
                    jitter,
                    seed: seed % (1 << 53),
                }
            },
        )
}

fn outcome() -> impl Strategy<Value = Outcome> {
    let hint = prop_oneof![Just(None), (0u64..=8_000).prop_map(Some)];
    let retryable = (
        prop_oneof![
            Just(RetryableKind::TimeoutBeforeResponse),
            Just(RetryableKind::RateLimited),
            Just(RetryableKind::Unavailable),
        ],
        hint,
    )
        .prop_map(|(kind, retry_after_ms)| Outcome::Retryable {
            kind,
            retry_after_ms,
            retry_after_source: None,
        });
    let non_retryable = prop_oneof![
        Just(NonRetryableKind::Rejected),
        Just(NonRetryableKind::PolicyDenied),
        Just(NonRetryableKind::InvalidRequest),
        Just(NonRetryableKind::ProtocolViolation),
        Just(NonRetryableKind::InvalidOutput),
    ]
    .prop_map(|kind| Outcome::NonRetryable { kind });
    let indeterminate = prop_oneof![
        Just(IndeterminateKind::UnknownProviderAcceptance),
        Just(IndeterminateKind::StreamInterruptedAfterOutput),
    ]
    .prop_map(|kind| Outcome::Indeterminate { kind });
    prop_oneof![
        2 => Just(Outcome::Success),
        9 => retryable,
        2 => non_retryable,
        2 => indeterminate,
    ]
}

fn step() -> impl Strategy<Value = StepSpec> {
    (
        outcome(),
        prop_oneof![0u64..=50, 0u64..=3_000],
        prop_oneof![2 => Just(0u64), 1 => 0u64..=4_000],
        prop_oneof![Just(0u64), 0u64..=700],
    )
        .prop_map(|(outcome, duration_ms, cost, lag_ms)| StepSpec {
            outcome,
            duration_ms,
            cost,
            lag_ms,
        })
}

fn script() -> impl Strategy<Value = Vec<StepSpec>> {
    prop::collection::vec(step(), 0..=14)
}

fn id(label: &str) -> String {
    sha256_hex(label.as_bytes())
}

fn build(spec: &PolicySpec) -> Value {
    let mut p = lab::reference_policy();
    let template = p["routes"][0].clone();
    let degraded_class = id("behavior: generic summary v1");
    let mut routes: Vec<Value> = spec
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut v = template.clone();
            v["route_id"] = json!(format!("route-{i}"));
            v["priority"] = json!(i);
            v["route_release_sha256"] = json!(id(&format!("release: route-{i}")));
            v["max_attempts"] = json!(r.max_attempts);
            v["reserve_cost"] = json!(r.reserve_cost);
            v["data_boundary"] = json!(BOUNDARIES[usize::from(r.boundary)]);
            if r.degraded {
                v["behavior_class_sha256"] = json!(degraded_class);
            }
            v
        })
        .collect();
    if spec.reversed {
        routes.reverse();
    }
    p["routes"] = json!(routes);
    if spec.routes.iter().any(|r| r.degraded) {
        p["allowed_degraded_behavior_classes"] = json!([degraded_class]);
    }
    p["max_data_boundary"] = json!(BOUNDARIES[usize::from(spec.max_boundary)]);
    p["max_total_attempts"] = json!(spec.max_total_attempts);
    p["max_total_cost"] = json!(spec.max_total_cost);
    p["deadline_ms"] = json!(spec.deadline_ms);
    p["backoff"] = json!({
        "base_ms": spec.base_ms,
        "max_ms": spec.base_ms * spec.max_factor,
        "retry_after_cap_ms": spec.retry_after_cap_ms,
    });
    let modes = ["none", "full", "equal", "decorrelated"];
    p["jitter"] = match modes[usize::from(spec.jitter)] {
        "none" => json!({"mode": "none"}),
        mode => json!({"mode": mode, "scheduler_release": "sched-prop", "seed": spec.seed}),
    };
    p
}

fn policy(spec: &PolicySpec) -> Policy {
    from_value(build(spec)).expect("generated policies decode")
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

// ---------------------------------------------------------------------------
// The host loop, with the per-dispatch invariants

/// What the previous attempt left for the next dispatch.
struct Previous {
    completed_at_ms: u64,
    hint: Option<u64>,
    outcome: Outcome,
}

struct Driven {
    compiled: CompiledPolicy,
    attempts: Attempts,
    terminal: Terminal,
    /// Spent cost before the last observed attempt.
    spent_before_last: u64,
}

fn rank(b: DataBoundary) -> u8 {
    match b {
        DataBoundary::LocalProcess => 0,
        DataBoundary::PrivateService => 1,
        DataBoundary::ExternalProvider => 2,
    }
}

/// Drive a script as a host would, asserting every per-dispatch invariant.
/// When the script ends before a terminal, the caller cancels the run.
fn drive(policy: Policy, steps: &[StepSpec], cancel_lag: u64) -> Result<Driven, TestCaseError> {
    let compiled = compile(policy).map_err(|e| fail(format!("valid policy rejected: {e}")))?;
    let p = compiled.policy.clone();
    let mut attempts = Attempts::default();
    let mut per_route = vec![0u64; p.routes.len()];
    let mut spent = 0u64;
    let mut spent_before_last = 0u64;
    let mut previous: Option<Previous> = None;
    let mut steps = steps.iter();
    loop {
        let decision =
            plan_next(&compiled, &attempts).map_err(|e| fail(format!("plan_next: {e}")))?;
        let d = match decision {
            Decision::Terminal { terminal } => {
                return Ok(Driven {
                    compiled,
                    attempts,
                    terminal,
                    spent_before_last,
                })
            }
            Decision::Dispatch(d) => d,
        };
        // An outcome that is not retryable never leads to another dispatch.
        if let Some(prev) = &previous {
            prop_assert!(
                matches!(prev.outcome, Outcome::Retryable { .. }),
                "dispatch after {:?}",
                prev.outcome
            );
        }
        // Deadline, and the bounded Retry-After floor.
        prop_assert!(d.not_before_ms < p.deadline_ms, "dispatch at the deadline");
        prop_assert_eq!(d.deadline_ms, p.deadline_ms);
        match &previous {
            None => {
                prop_assert_eq!((d.not_before_ms, d.delay_ms), (0, 0));
            }
            Some(prev) => {
                let floor = prev.hint.unwrap_or(0).min(p.backoff.retry_after_cap_ms);
                prop_assert_eq!(d.retry_after_floor_ms, floor);
                prop_assert!(d.delay_ms >= floor);
                prop_assert_eq!(d.not_before_ms, prev.completed_at_ms + d.delay_ms);
                prop_assert!(d.not_before_ms >= prev.completed_at_ms + floor);
                if let (Some(lo), Some(hi), Some(sample)) =
                    (d.jitter_min_ms, d.jitter_max_ms, d.jitter_sample_ms)
                {
                    prop_assert!(lo <= sample && sample <= hi);
                    prop_assert_eq!(d.delay_ms, sample.max(floor));
                }
            }
        }
        // Total, per-route and cost bounds, and the data boundary.
        prop_assert!(d.ordinal <= p.max_total_attempts);
        prop_assert_eq!(d.ordinal, attempts.attempts.len() as u64 + 1);
        let (index, route) = p
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.route_id == d.route_id)
            .ok_or_else(|| fail(format!("unknown route {}", d.route_id)))?;
        prop_assert!(per_route[index] < route.max_attempts, "route bound");
        prop_assert_eq!(d.route_ordinal, per_route[index] + 1);
        prop_assert_eq!(d.reserve_cost, route.reserve_cost);
        prop_assert!(spent + d.reserve_cost <= p.max_total_cost, "reservation");
        prop_assert!(route.data_boundary <= p.max_data_boundary, "boundary");
        prop_assert!(rank(route.data_boundary) <= rank(p.max_data_boundary));

        let Some(step) = steps.next() else {
            // The host stops here: it cancels the run while waiting.
            let last = previous.as_ref().map_or(0, |x| x.completed_at_ms);
            attempts.cancelled_at_ms = Some(last + cancel_lag);
            return Ok(Driven {
                compiled,
                attempts,
                terminal: Terminal::StopCancelled,
                spent_before_last,
            });
        };
        let started = d.not_before_ms + step.lag_ms;
        let completed = started + step.duration_ms;
        attempts.attempts.push(Attempt {
            admission: None,
            completed_at_ms: completed,
            cost: step.cost,
            hedge: None,
            idempotency_key_sha256: d.idempotency_key_sha256,
            injected_fault: None,
            output_check: None,
            jitter_sample_ms: d.jitter_sample_ms,
            job: None,
            key_refused: None,
            logical_request_sha256: d.logical_request_sha256,
            model: None,
            ordinal: d.ordinal,
            outcome: step.outcome,
            reconciled: None,
            request_body_sha256: None,
            route_id: d.route_id,
            route_ordinal: d.route_ordinal,
            route_release_sha256: d.route_release_sha256,
            started_at_ms: started,
            stream: None,
            usage: None,
        });
        per_route[index] += 1;
        spent_before_last = spent;
        spent += step.cost;
        previous = Some(Previous {
            completed_at_ms: completed,
            hint: step.outcome.retry_after_ms(),
            outcome: step.outcome,
        });
    }
}

fn inputs() -> impl Strategy<Value = (PolicySpec, Vec<StepSpec>, u64)> {
    (policy_spec(false), script(), 0u64..=1_000)
}

// ---------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(config())]

    /// A planned dispatch never starts before the bounded Retry-After floor
    /// nor at or after the deadline (checked at every dispatch in `drive`),
    /// and the receipt's schedule records exactly those earliest starts.
    #[test]
    fn dispatch_respects_floor_and_deadline((spec, steps, lag) in inputs()) {
        let driven = drive(policy(&spec), &steps, lag)?;
        let receipt = evaluate(&driven.compiled, &driven.attempts)
            .map_err(|e| fail(format!("evaluate: {e}")))?;
        let deadline = driven.compiled.policy.deadline_ms;
        let cap = driven.compiled.policy.backoff.retry_after_cap_ms;
        let mut prev: Option<&Attempt> = None;
        for (entry, a) in receipt.schedule.iter().zip(&driven.attempts.attempts) {
            prop_assert!(entry.not_before_ms < deadline);
            prop_assert!(a.started_at_ms >= entry.not_before_ms);
            if let Some(p) = prev {
                let floor = p.outcome.retry_after_ms().unwrap_or(0).min(cap);
                prop_assert!(entry.not_before_ms >= p.completed_at_ms + floor);
            }
            prev = Some(a);
        }
    }

    /// No run exceeds its total attempt, per-route attempt or cost bound; cost
    /// goes over the maximum only by the attempt that ends the run with
    /// `stop_cost_budget` (or `stop_deadline`, which is checked first).
    #[test]
    fn bounds_are_never_exceeded((spec, steps, lag) in inputs()) {
        let driven = drive(policy(&spec), &steps, lag)?;
        let p = &driven.compiled.policy;
        let receipt = evaluate(&driven.compiled, &driven.attempts)
            .map_err(|e| fail(format!("evaluate: {e}")))?;
        prop_assert!(receipt.attempt_count <= p.max_total_attempts);
        for count in &receipt.route_attempts {
            let route = p.routes.iter().find(|r| r.route_id == count.route_id).unwrap();
            prop_assert!(count.attempts <= route.max_attempts);
        }
        prop_assert!(driven.spent_before_last <= p.max_total_cost);
        if receipt.total_cost > p.max_total_cost {
            // The last attempt went over: the run stops on cost, or on the
            // deadline when it also completed late (the deadline is checked first).
            prop_assert!(
                receipt.terminal == Terminal::StopCostBudget
                    || receipt.terminal == Terminal::StopDeadline,
                "{:?} with cost {} over {}", receipt.terminal, receipt.total_cost, p.max_total_cost
            );
        }
        prop_assert_eq!(receipt.terminal, driven.terminal);
    }

    /// No fallback widens the data boundary: a validated policy's every route
    /// stays inside the maximum, so every dispatch does; a policy with a wider
    /// route is refused before any dispatch.
    #[test]
    fn no_route_widens_the_data_boundary(
        (spec, steps, lag) in (policy_spec(true), script(), 0u64..=1_000)
    ) {
        let widest = spec.routes.iter().map(|r| r.boundary).max().unwrap_or(0);
        let p = policy(&spec);
        if widest > spec.max_boundary {
            let e = compile(p).err().ok_or_else(|| fail("wider route accepted".into()))?;
            prop_assert_eq!(e.code, ErrorCode::DataBoundaryExceeded);
        } else {
            let driven = drive(p, &steps, lag)?;
            let max = driven.compiled.policy.max_data_boundary;
            for a in &driven.attempts.attempts {
                let route = driven.compiled.policy.routes.iter()
                    .find(|r| r.route_id == a.route_id).unwrap();
                prop_assert!(route.data_boundary <= max);
            }
        }
    }

    /// An indeterminate or non-retryable outcome never leads to another
    /// dispatch: the run ends there (with that terminal, unless the deadline
    /// or the cost bound ended it first) and any further attempt is drift.
    #[test]
    fn final_outcomes_end_the_run((spec, steps, lag) in inputs()) {
        let driven = drive(policy(&spec), &steps, lag)?;
        let Some(last) = driven.attempts.attempts.last() else { return Ok(()) };
        if driven.attempts.cancelled_at_ms.is_some() {
            return Ok(());
        }
        let expected = match last.outcome {
            Outcome::NonRetryable { .. } => Some(Terminal::StopNonRetryable),
            Outcome::Indeterminate { .. } => Some(Terminal::StopIndeterminate),
            Outcome::Success => Some(Terminal::Completed),
            Outcome::Retryable { .. } => None,
        };
        for (i, a) in driven.attempts.attempts.iter().enumerate() {
            let prefix = Attempts {
                attempts: driven.attempts.attempts[..=i].to_vec(),
                ..Attempts::default()
            };
            let next = plan_next(&driven.compiled, &prefix).unwrap();
            if !matches!(a.outcome, Outcome::Retryable { .. }) {
                let Decision::Terminal { terminal } = next else {
                    return Err(fail(format!("dispatch after {:?}", a.outcome)));
                };
                prop_assert!(
                    [Terminal::StopNonRetryable, Terminal::StopIndeterminate,
                     Terminal::Completed, Terminal::StopDeadline, Terminal::StopCostBudget]
                        .contains(&terminal)
                );
            }
        }
        if let Some(t) = expected {
            prop_assert!(
                driven.terminal == t
                    || driven.terminal == Terminal::StopDeadline
                    || driven.terminal == Terminal::StopCostBudget,
                "{:?} after {:?}", driven.terminal, last.outcome
            );
            let mut extra = driven.attempts.clone();
            let mut again = last.clone();
            again.ordinal += 1;
            again.started_at_ms = last.completed_at_ms;
            extra.attempts.push(again);
            let e = evaluate(&driven.compiled, &extra).unwrap_err();
            prop_assert_eq!(e.code, ErrorCode::AttemptAfterTerminal);
        }
    }

    /// `evaluate` is deterministic, and `verify_bundle` accepts exactly what
    /// `evaluate` produced, through the typed API and the JSON-text boundary.
    #[test]
    fn evaluate_is_deterministic_and_verifies((spec, steps, lag) in inputs()) {
        let driven = drive(policy(&spec), &steps, lag)?;
        let first = evaluate(&driven.compiled, &driven.attempts).unwrap();
        let second = evaluate(&driven.compiled, &driven.attempts).unwrap();
        prop_assert_eq!(&first, &second);
        let bundle = seal(&driven.compiled.policy, &driven.attempts).unwrap();
        prop_assert_eq!(&bundle.receipt, &first);
        let verdict = verify_bundle(&bundle).unwrap();
        prop_assert_eq!(
            verdict,
            Verdict::Verified {
                attempts_sha256: retryledger_core::digest(&driven.attempts),
                policy_sha256: driven.compiled.policy_sha256.clone(),
                receipt_sha256: retryledger_core::digest(&first),
                terminal: first.terminal,
            }
        );
        let policy_text = canonical_json(&driven.compiled.policy);
        let attempts_text = canonical_json(&driven.attempts);
        prop_assert_eq!(
            api::evaluate(&policy_text, &attempts_text).unwrap(),
            canonical_json(&first)
        );
        let verified: Value = serde_json::from_str(
            &api::verify(&canonical_json(&bundle)).unwrap()
        ).unwrap();
        prop_assert_eq!(&verified["kind"], "verified");
    }

    /// Any single-field change of a sealed receipt is caught: the bundle no
    /// longer verifies, and the drift points at the changed field.
    #[test]
    fn any_single_receipt_change_is_caught(
        (spec, steps, lag) in inputs(),
        pick in any::<prop::sample::Index>(),
    ) {
        let driven = drive(policy(&spec), &steps, lag)?;
        let bundle = seal(&driven.compiled.policy, &driven.attempts).unwrap();
        let mut value = to_value(&bundle);
        let mut leaves = Vec::new();
        collect_leaves(&value["receipt"], String::from("/receipt"), &mut leaves);
        let pointer = leaves[pick.index(leaves.len())].clone();
        let old = value.pointer(&pointer).unwrap().clone();
        let new = mutate(&pointer, &old);
        prop_assert_ne!(&old, &new);
        *value.pointer_mut(&pointer).unwrap() = new;
        let text = serde_json::to_string(&value).unwrap();
        match api::verify(&text) {
            Err(e) => {
                // Only the schema marker cannot decode once changed.
                prop_assert_eq!(pointer.as_str(), "/receipt/schema");
                prop_assert_eq!(e.code, ErrorCode::SchemaMismatch);
            }
            Ok(out) => {
                let verdict: Value = serde_json::from_str(&out).unwrap();
                prop_assert_eq!(&verdict["kind"], "drift", "{} changed, still verified", pointer);
                prop_assert_eq!(&verdict["code"], "receipt_mismatch");
                prop_assert_eq!(verdict["path"].as_str().unwrap(), pointer.as_str());
            }
        }
    }
}

fn collect_leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                collect_leaves(x, format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                collect_leaves(x, format!("{at}/{i}"), out);
            }
        }
        _ => out.push(at),
    }
}

/// Another valid value for the field: numbers move by one, booleans flip,
/// digests change, enums take another variant, identifiers another name.
fn mutate(pointer: &str, old: &Value) -> Value {
    let field = pointer.rsplit('/').next().unwrap();
    match old {
        Value::Bool(b) => json!(!b),
        Value::Number(n) => {
            let n = n.as_u64().unwrap();
            json!(if n == 0 { 1 } else { n - 1 })
        }
        Value::String(s) => {
            let s = s.as_str();
            match field {
                "terminal" => json!(if s == "completed" {
                    "stop_deadline"
                } else {
                    "completed"
                }),
                "outcome_class" => json!(if s == "success" {
                    "retryable"
                } else {
                    "success"
                }),
                "schema" => json!("retryledger.receipt.v2"),
                _ if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    json!(id(&format!("changed {s}")))
                }
                _ => json!(format!("{s}-changed")),
            }
        }
        other => panic!("unexpected leaf {other}"),
    }
}

/// The generator is not degenerate: a fixed sample of 2,000 inputs reaches
/// every terminal, uses fallbacks, jitter draws in every mode and Retry-After
/// floors. (It prints the terminal counts with `--nocapture`.)
#[test]
fn generated_runs_reach_every_terminal() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::collections::BTreeMap;

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = inputs();
    let mut terminals: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut fallbacks, mut floors) = (0usize, 0usize);
    let mut jittered = [0usize; 4];
    for _ in 0..2_000 {
        let (spec, steps, lag) = strategy.new_tree(&mut runner).unwrap().current();
        let driven = drive(policy(&spec), &steps, lag).unwrap();
        *terminals.entry(driven.terminal.as_str()).or_default() += 1;
        let receipt = evaluate(&driven.compiled, &driven.attempts).unwrap();
        fallbacks += usize::from(receipt.fallback_used);
        floors += usize::from(receipt.schedule.iter().any(|e| e.retry_after_floor_ms > 0));
        if receipt
            .schedule
            .iter()
            .any(|e| e.jitter_sample_ms.is_some())
        {
            jittered[usize::from(spec.jitter)] += 1;
        }
    }
    eprintln!("terminals {terminals:?}, fallback used {fallbacks}, floor applied {floors}, jitter draws by mode {jittered:?}");
    // The fleet's terminals need a fleet section and snapshots, and
    // stop_retry_after a hint over the cap under `stop` or `skip_route`:
    // the fleet, admission and key pool vectors and the over-cap property
    // below reach them.
    let fleet = [
        Terminal::StopAdmission,
        Terminal::StopNoUsableKey,
        Terminal::StopCircuitOpen,
        Terminal::StopRetryBudget,
        Terminal::StopStoreUnavailable,
        Terminal::StopRetryAfter,
    ];
    for &t in Terminal::ALL.iter().filter(|t| !fleet.contains(t)) {
        assert!(
            terminals.get(t.as_str()).copied().unwrap_or(0) >= 10,
            "{} rarely reached: {terminals:?}",
            t.as_str()
        );
    }
    assert!(fallbacks >= 100 && floors >= 100, "{fallbacks} {floors}");
    assert_eq!(jittered[0], 0, "mode none draws nothing");
    assert!(jittered[1..].iter().all(|&n| n >= 50), "{jittered:?}");
}
