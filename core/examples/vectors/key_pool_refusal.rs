//! `key_pool.json`, a refused key: a 401 or 403 to an attempt sent with a
//! pool key disables the key (with its reason, until the configuration
//! changes or for the pool's `disable_ms`), marks the attempt
//! `key_refused` and moves the run at once to another key of the pool,
//! on the same route and per-route ordinal, without a breaker failure;
//! with no key left the run ends sealed, `stop_no_usable_key`. Then the
//! sealed bundles as `evaluate` and `verify_bundle` cases, and tampered
//! copies each refused with its drift.
//!
//! Each case is checked here against what it is meant to show.

use std::sync::Arc;

use retryledger_core::api;
use retryledger_core::canonical::to_value;
use retryledger_core::machine::script::{options_of, play_start, Script};
use retryledger_core::machine::Machine;
use serde_json::{json, Value};

use crate::common::{policy_with, t, NOW_2026};
use crate::composition::{breaker, case, ok, options, status};
use crate::family::Family;
use crate::key_pool_machine::{
    dispatched, fleet, key, pool, pool_writes, refused, snapshot_after, some, state_of, POOL,
    REGISTER,
};

/// The bundle the machine seals after `script` (no journal).
fn bundle(policy: &str, script: &Value) -> Value {
    let cp = Arc::new(api::compile_policy(policy).expect("a valid policy"));
    let o = options_of(&options(false)).expect("options");
    let s = Script::from_value(script).expect("a script");
    let played = play_start(&cp, o.clone(), &s).expect("a machine");
    let mut m = Machine::start(cp, o).expect("a machine");
    for e in played.events {
        m.answer(e).expect("the played answers");
    }
    to_value(&m.seal().expect("a sealed run"))
}

/// The last case's expectation, as text.
fn shown(f: &Family) -> String {
    t(&serde_json::to_value(f.cases.last().expect("a case")).expect("case"))
}

/// The breaker snapshots the last case wrote.
fn breaker_writes(f: &Family) -> Vec<Value> {
    let v = serde_json::to_value(f.cases.last().expect("a case")).expect("case");
    let effects = v["expect"]["ok"]["effects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    effects
        .iter()
        .filter(|e| e["kind"] == "write")
        .flat_map(|e| e["writes"].as_array().cloned().unwrap_or_default())
        .filter(|w| w["key"].as_str().is_some_and(|k| k.starts_with("breaker/")))
        .map(|w| w["document"].clone())
        .collect()
}

#[allow(clippy::too_many_lines, reason = "one list of cases")]
pub fn cases(f: &mut Family, p: &str) {
    // Keys 2 and 3 were refused before the run: 0 and 1 are refused in
    // turn, then no key is left; the two attempts stay in the sealed run.
    let two_left = snapshot_after(&[
        (2, refused(), Some(401), NOW_2026 - 10),
        (3, refused(), Some(403), NOW_2026 - 10),
    ]);
    let script = json!({"attempts": [status(401, None), status(401, None), ok(false)],
        "store": {REGISTER: two_left.clone()}});
    case(
        f,
        "machine_pool_every_key_refused_in_turn_stops_sealed",
        p,
        &options(false),
        None,
        &script,
        "stop_no_usable_key",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1)]);
    let last = pool_writes(f).pop().expect("the pool written");
    for n in 0..4 {
        assert_eq!(state_of(&last, n), "disabled", "key {n}");
    }
    let sealed = bundle(p, &script);
    assert_eq!(sealed["receipt"]["terminal"], "stop_no_usable_key");
    assert_eq!(sealed["attempts"]["fleet_stop"]["reason"], "no_usable_key");
    assert_eq!(sealed["attempts"]["fleet_stop"]["key_pool"], POOL);
    assert_eq!(sealed["attempts"]["attempts"][1]["route_ordinal"], 1);
    f.eval(
        "evaluate_pool_every_key_refused",
        p,
        &t(&sealed["attempts"]),
        "stop_no_usable_key",
    );
    f.verify(
        "verify_pool_every_key_refused",
        &t(&sealed),
        "stop_no_usable_key",
    );

    // Under a breaker: refusals are no failure of the route (it stays
    // closed with no failure counted) and do not spend the route's two
    // attempts: the third key answers on the same route.
    let fenced = t(&policy_with(&[
        ("/fleet", fleet(json!({"breaker": breaker()}))),
        ("/routes/0/key_pool", json!(POOL)),
    ]));
    case(
        f,
        "machine_pool_breaker_refusals_are_no_route_failure",
        &fenced,
        &options(false),
        None,
        &json!({"attempts": [status(401, None), status(403, None), ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1), some(2)]);
    let breakers = breaker_writes(f);
    assert!(
        breakers.iter().all(|b| b["state"] == "closed"
            && b["consecutive_failures"].as_u64().unwrap_or(0) == 0),
        "no failure counted: {breakers:?}"
    );
    let sealed = bundle(
        &fenced,
        &json!({"attempts": [status(401, None), status(403, None), ok(false)]}),
    );
    assert_eq!(sealed["receipt"]["final_route_id"], "private-primary");
    f.verify(
        "verify_pool_two_refusals_then_success",
        &t(&sealed),
        "verified",
    );
    let attempts = &sealed["attempts"]["attempts"];
    assert_eq!(attempts[0]["key_refused"], "unauthorized");
    assert_eq!(attempts[1]["key_refused"], "forbidden");
    assert!(attempts[2].get("key_refused").is_none());

    // Tampered copies of that bundle, each refused with its drift.
    let tamper = |edit: &dyn Fn(&mut Value)| {
        let mut b = sealed.clone();
        edit(&mut b);
        t(&b)
    };
    f.verify(
        "verify_pool_key_not_in_the_pool",
        &tamper(&|b| {
            b["attempts"]["attempts"][2]["admission"]["key"]["key_sha256"] =
                json!(api::key_sha256("sk-not-in-the-pool").expect("key"));
        }),
        "/attempts/attempts/2/admission/key",
    );
    f.verify(
        "verify_pool_refused_key_sent_again",
        &tamper(&|b| {
            b["attempts"]["attempts"][2]["admission"]["key"]["key_sha256"] = json!(key(0));
        }),
        "/attempts/attempts/2/admission/key",
    );
    f.verify(
        "verify_pool_attempt_without_its_key",
        &tamper(&|b| {
            if let Some(adm) = b["attempts"]["attempts"][2]["admission"].as_object_mut() {
                adm.remove("key");
            }
        }),
        "/attempts/attempts/2/admission/key",
    );
    f.verify(
        "verify_pool_key_refused_on_a_success",
        &tamper(&|b| {
            b["attempts"]["attempts"][2]["key_refused"] = json!("unauthorized");
        }),
        "/attempts/attempts/2/key_refused",
    );
    f.verify(
        "verify_pool_refusal_unmarked_stops_the_run",
        &tamper(&|b| {
            if let Some(a) = b["attempts"]["attempts"][0].as_object_mut() {
                a.remove("key_refused");
            }
        }),
        "attempt_after_terminal",
    );
    let stopped = bundle(p, &script);
    f.verify(
        "verify_pool_stop_without_its_pool",
        &{
            let mut b = stopped.clone();
            if let Some(s) = b["attempts"]["fleet_stop"].as_object_mut() {
                s.remove("key_pool");
            }
            t(&b)
        },
        "admission_drift",
    );
    f.verify(
        "verify_pool_stop_of_another_pool",
        &{
            let mut b = stopped;
            b["attempts"]["fleet_stop"]["key_pool"] = json!("other-keys");
            t(&b)
        },
        "admission_drift",
    );

    // Journaled: each `dispatched` event records the key's digest before
    // the call, the `observed` attempt its refusal; no secret anywhere.
    case(
        f,
        "machine_pool_journal_records_each_key",
        p,
        &options(true),
        None,
        &json!({"attempts": [status(401, None), ok(false)]}),
        "completed",
    );
    let text = shown(f);
    assert!(
        text.contains(&format!(
            "\\\"key\\\":{{\\\"key_sha256\\\":\\\"{}\\\"",
            key(0)
        )) || text.contains(&key(0))
    );
    assert!(text.contains("key_refused"), "the refusal journaled");
    assert!(!text.contains("sk-test-key"), "no secret in any document");

    // Under fail_open with the store unreachable throughout, the run still
    // never sends a key it saw refused: its own refusals are applied to the
    // fresh pool it selects from.
    let open = t(&policy_with(&[
        (
            "/fleet",
            fleet(json!({"on_store_unavailable": "fail_open"})),
        ),
        ("/routes/0/key_pool", json!(POOL)),
    ]));
    case(
        f,
        "machine_pool_fail_open_store_down_never_resends_a_refused_key",
        &open,
        &options(false),
        None,
        &json!({"attempts": [status(401, None), ok(false)], "unavailable": [0, 1, 2, 3]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1)]);
    assert!(
        pool_writes(f).is_empty(),
        "nothing written without the store"
    );

    // A refusal counts against the run's total attempts.
    let short = t(&policy_with(&[
        ("/fleet", fleet(json!({}))),
        ("/routes/0/key_pool", json!(POOL)),
        ("/max_total_attempts", json!(2)),
    ]));
    case(
        f,
        "machine_pool_refusals_count_against_total_attempts",
        &short,
        &options(false),
        None,
        &json!({"attempts": [status(401, None), status(401, None), ok(false)]}),
        "stop_total_attempts",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1)]);

    // A pool with `disable_ms`: the refused key is held that long, then
    // usable again.
    let mut timed = pool();
    timed["disable_ms"] = json!(60_000);
    let timed_policy = t(&policy_with(&[
        (
            "/fleet",
            json!({"key_pools": [timed.clone()], "on_store_unavailable": "fail_closed"}),
        ),
        ("/routes/0/key_pool", json!(POOL)),
    ]));
    case(
        f,
        "machine_pool_disable_ms_holds_the_refused_key",
        &timed_policy,
        &options(false),
        None,
        &json!({"attempts": [status(401, None), ok(false)]}),
        "completed",
    );
    let held = pool_writes(f)
        .into_iter()
        .find(|s| state_of(s, 0) == "disabled")
        .expect("the refusal written");
    let until = held["keys"][0]["until_epoch_ms"].as_u64().expect("a hold");
    assert_eq!(until, NOW_2026 + 30 + 60_000, "refused at 30 ms, held 60 s");
    record(
        f,
        "record_401_under_disable_ms_holds_the_key",
        &timed,
        None,
        0,
        Some(401),
        NOW_2026,
        "until_epoch_ms",
    );
    let after = api::key_pool_record(
        &t(&timed),
        None,
        &key(0),
        &t(&refused()),
        Some(401),
        NOW_2026,
    )
    .expect("record");
    let after: Value = serde_json::from_str(&after).expect("json");
    f.add(
        "select_after_disable_ms_the_key_is_usable_again",
        "key_pool_select",
        vec![
            ("config", json!(t(&timed))),
            ("snapshot", json!(t(&after))),
            ("now_epoch_ms", json!(NOW_2026 + 60_000)),
        ],
        "ok",
    );
    let v = serde_json::to_value(f.cases.last().expect("a case")).expect("case");
    assert_eq!(v["expect"]["ok"]["selection"]["key_sha256"], json!(key(0)));
    assert_eq!(v["expect"]["ok"]["snapshot"]["keys"][0]["state"], "healthy");
    assert!(v["expect"]["ok"]["snapshot"]["keys"][0]
        .get("reason")
        .is_none());
    let mut zero = pool();
    zero["disable_ms"] = json!(0);
    record(
        f,
        "config_disable_ms_zero",
        &zero,
        None,
        0,
        Some(401),
        NOW_2026,
        "invalid_key_pool",
    );
    // A snapshot that records a reason for a key that is not disabled.
    let mut odd = after;
    odd["keys"][0]["state"] = json!("healthy");
    if let Some(k) = odd["keys"][0].as_object_mut() {
        k.remove("until_epoch_ms");
    }
    f.add(
        "snapshot_reason_on_a_healthy_key",
        "key_pool_select",
        vec![
            ("config", json!(t(&timed))),
            ("snapshot", json!(t(&odd))),
            ("now_epoch_ms", json!(NOW_2026)),
        ],
        "invalid_snapshot",
    );
}

#[allow(clippy::too_many_arguments, reason = "one vector's inputs")]
fn record(
    f: &mut Family,
    name: &str,
    cfg: &Value,
    snap: Option<&Value>,
    k: usize,
    status: Option<u64>,
    now: u64,
    want: &str,
) {
    let mut input = vec![("config", json!(t(cfg)))];
    if let Some(s) = snap {
        input.push(("snapshot", json!(t(s))));
    }
    input.push(("key_sha256", json!(key(k))));
    input.push(("outcome", json!(t(&refused()))));
    if let Some(s) = status {
        input.push(("status", json!(s)));
    }
    input.push(("now_epoch_ms", json!(now)));
    f.add(name, "key_pool_record", input, want);
}
