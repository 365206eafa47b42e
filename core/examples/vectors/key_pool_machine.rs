//! `key_pool.json`, the run machine's side: a route that names a key pool
//! has its key selected with each admission, named on the dispatch effect
//! by digest, and the answer recorded into the pool's register
//! (`key_pool/<name>`) by compare-and-set, crossed with the other fleet
//! layers, the journal, store conflicts and outages; and the policy rules
//! of a route's `key_pool`.
//!
//! Each case is checked here against what it is meant to show (the keys
//! dispatched, in order, and what the store holds after), not only pinned.

use retryledger_core::api;
use serde_json::{json, Value};

use crate::common::{policy_with, t, NOW_2026};
use crate::composition::{breaker, budget, case, full_budget, limits, ok, options, status};
use crate::family::Family;

pub(crate) const POOL: &str = "openai-keys";
pub(crate) const REGISTER: &str = "key_pool/openai-keys";

pub(crate) fn key(n: usize) -> String {
    api::key_sha256(&format!("sk-test-key-{n}")).expect("key")
}

/// Four keys: 0 and 1 share account `acct-a`, 2 and 3 have their own quota.
pub(crate) fn pool() -> Value {
    json!({
        "cool_ms": 1_000,
        "keys": [
            {"account": "acct-a", "key_sha256": key(0)},
            {"account": "acct-a", "key_sha256": key(1)},
            {"key_sha256": key(2)},
            {"key_sha256": key(3)},
        ],
        "name": POOL,
        "park_ms": 3_600_000,
    })
}

/// The fleet section `extra` with the pool added.
pub(crate) fn fleet(mut extra: Value) -> Value {
    extra["key_pools"] = json!([pool()]);
    if extra.get("on_store_unavailable").is_none() {
        extra["on_store_unavailable"] = json!("fail_closed");
    }
    extra
}

/// The reference policy with `fleet`, its primary route taking its keys
/// from the pool (the fallback its host's own key).
pub(crate) fn policy(fleet: Value) -> String {
    t(&policy_with(&[
        ("/fleet", fleet),
        ("/routes/0/key_pool", json!(POOL)),
    ]))
}

/// A pool snapshot after recording `steps` (key, outcome, status, at)
/// from a fresh pool.
pub(crate) fn snapshot_after(steps: &[(usize, Value, Option<u64>, u64)]) -> Value {
    let mut snap: Option<Value> = None;
    for (k, o, st, at) in steps {
        let text = snap.as_ref().map(t);
        let answer = api::key_pool_record(&t(&pool()), text.as_deref(), &key(*k), &t(o), *st, *at)
            .expect("record");
        snap = Some(serde_json::from_str(&answer).expect("json"));
    }
    snap.expect("a step")
}

pub(crate) fn refused() -> Value {
    json!({"class": "non_retryable", "kind": "rejected"})
}

pub(crate) fn limited(ms: u64) -> Value {
    json!({"class": "retryable", "kind": "rate_limited", "retry_after_ms": ms})
}

/// The run clock of each dispatch effect, in order.
fn dispatch_starts(f: &Family) -> Vec<u64> {
    let case = f.cases.last().expect("a case");
    let v = serde_json::to_value(case).expect("case");
    let effects = v["expect"]["ok"]["effects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    effects
        .iter()
        .filter(|e| e["kind"] == "dispatch")
        .filter_map(|e| e["started_at_ms"].as_u64())
        .collect()
}

/// The keys the run's dispatch effects named, in order (`None`: no key).
pub(crate) fn dispatched(f: &Family) -> Vec<Option<String>> {
    let case = f.cases.last().expect("a case");
    let v = serde_json::to_value(case).expect("case");
    let effects = v["expect"]["ok"]["effects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    effects
        .iter()
        .filter(|e| e["kind"] == "dispatch")
        .map(|e| e["key"]["key_sha256"].as_str().map(str::to_owned))
        .collect()
}

/// The pool snapshot the run's last write of the register held.
fn last_pool_write(f: &Family) -> Option<Value> {
    pool_writes(f).pop()
}

/// Every pool snapshot the run wrote, in order.
pub(crate) fn pool_writes(f: &Family) -> Vec<Value> {
    let case = f.cases.last().expect("a case");
    let v = serde_json::to_value(case).expect("case");
    let effects = v["expect"]["ok"]["effects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    effects
        .iter()
        .filter(|e| e["kind"] == "write")
        .flat_map(|e| e["writes"].as_array().cloned().unwrap_or_default())
        .filter(|w| w["key"] == REGISTER)
        .map(|w| w["document"].clone())
        .collect()
}

pub(crate) fn state_of(snapshot: &Value, n: usize) -> String {
    snapshot["keys"][n]["state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

pub(crate) fn some(n: usize) -> Option<String> {
    Some(key(n))
}

#[allow(clippy::too_many_lines, reason = "one list of cases")]
pub fn cases(f: &mut Family) {
    let layers: [(&str, Value); 5] = [
        ("pool", json!({})),
        ("pool_breaker", json!({"breaker": breaker()})),
        ("pool_budget", json!({"retry_budget": budget()})),
        (
            "pool_limits",
            json!({"admission": limits(), "on_store_unavailable": "fail_open"}),
        ),
        (
            "pool_fleet",
            json!({"admission": limits(), "breaker": breaker(), "retry_budget": budget()}),
        ),
    ];
    // Every layer: a rate limit cools the key (and its account's other
    // key) for its hint, 3 s, longer than the policy's 2 s cap on a wait:
    // the retry, 2 s later, takes a key of another quota.
    for (name, extra) in &layers {
        let p = policy(fleet(extra.clone()));
        case(
            f,
            &format!("machine_{name}_rate_limited_key_cools_its_account"),
            &p,
            &options(false),
            None,
            &json!({"attempts": [status(429, Some("3")), ok(false)], "store": full_budget()}),
            "completed",
        );
        assert_eq!(dispatched(f), vec![some(0), some(2)], "{name}");
        // The settlement of the 429: key 0 and its account's other key cool.
        let writes = pool_writes(f);
        let cooled = writes
            .iter()
            .find(|s| state_of(s, 0) == "cooling")
            .expect("the 429 recorded");
        assert_eq!(state_of(cooled, 1), "cooling", "the account's other key");
        assert_eq!(state_of(cooled, 2), "healthy");
        assert_eq!(state_of(cooled, 3), "healthy");
    }
    let p = policy(fleet(json!({})));

    // Journaled: the key never enters the journal (it rides on the effect).
    case(
        f,
        "machine_pool_journal_success",
        &p,
        &options(true),
        None,
        &json!({"attempts": [ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0)]);

    // A streamed attempt (buffer) is admitted and settled as a plain one.
    let streamed = t(&policy_with(&[
        ("/fleet", fleet(json!({}))),
        ("/routes/0/key_pool", json!(POOL)),
        (
            "/stream",
            json!({"first_byte_timeout_ms": 1_000, "idle_timeout_ms": 500,
            "max_response_bytes": 65_536, "mode": "buffer"}),
        ),
    ]));
    case(
        f,
        "machine_pool_stream_buffer_rate_limited_then_streamed",
        &streamed,
        &options(false),
        None,
        &json!({"attempts": [status(429, Some("3")), ok(true)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(2)]);

    // A retry that waits the whole hint finds its key cooled: kept.
    case(
        f,
        "machine_pool_retry_after_the_whole_hint_keeps_the_key",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(429, Some("1")), ok(false)]}),
        "kept",
    );
    assert_eq!(dispatched(f), vec![some(0), some(0)]);

    // A healthy key is kept by the retry (prompt caching).
    case(
        f,
        "machine_pool_retry_keeps_a_healthy_key",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(503, None), ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(0)]);
    assert!(t(&serde_json::to_value(f.cases.last().expect("case")).expect("v")).contains("kept"));

    // A 401 disables the key in the store with its reason; the attempt
    // is `key_refused` and the run goes on at once with another key of the
    // pool, on the same route and per-route ordinal.
    case(
        f,
        "machine_pool_401_disables_the_key",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(401, None), ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1)]);
    let snap = pool_writes(f)
        .into_iter()
        .find(|s| state_of(s, 0) == "disabled")
        .expect("the refusal written");
    assert_eq!(snap["keys"][0]["reason"], "unauthorized");
    assert_eq!(
        state_of(&snap, 1),
        "healthy",
        "a refusal is the key's alone"
    );
    assert_eq!(
        dispatch_starts(f),
        vec![0, 30],
        "no backoff after a refusal"
    );

    // A 403 likewise (`forbidden`).
    case(
        f,
        "machine_pool_403_disables_the_key",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(403, None), ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(1)]);
    let snap = pool_writes(f)
        .into_iter()
        .find(|s| state_of(s, 0) == "disabled")
        .expect("the refusal written");
    assert_eq!(snap["keys"][0]["reason"], "forbidden");

    // The next run never takes the disabled key.
    let disabled0 = snapshot_after(&[(0, refused(), Some(401), NOW_2026 - 10)]);
    case(
        f,
        "machine_pool_disabled_key_never_taken_again",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(503, None), status(503, None), ok(false)],
            "store": {REGISTER: disabled0}}),
        "completed",
    );
    let keys = dispatched(f);
    assert!(
        !keys.contains(&some(0)),
        "the revoked key is never sent again"
    );
    assert_eq!(keys[0], some(1));

    // Keys in turn across runs: a pool whose keys were used in order 0..3
    // gives the least recently used next.
    let mut used = None::<Value>;
    for i in 0..3u64 {
        let text = used.as_ref().map(t);
        let answer = api::key_pool_select(&t(&pool()), text.as_deref(), NOW_2026 - 100 + i, None)
            .expect("select");
        let v: Value = serde_json::from_str(&answer).expect("json");
        used = Some(v["snapshot"].clone());
    }
    case(
        f,
        "machine_pool_takes_the_least_recently_used_key",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: used.expect("used")}}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(3)], "the key never used yet");

    // Affinity from the options: kept while usable, moved off a cooling key.
    let mut with_affinity = options(false);
    with_affinity["key_affinity"] = json!(key(2));
    case(
        f,
        "machine_pool_affinity_kept",
        &p,
        &with_affinity,
        None,
        &json!({"attempts": [ok(false)]}),
        "kept",
    );
    assert_eq!(dispatched(f), vec![some(2)]);
    let cooling2 = snapshot_after(&[(2, limited(60_000), Some(429), NOW_2026 - 10)]);
    case(
        f,
        "machine_pool_affinity_moved_off_a_cooling_key",
        &p,
        &with_affinity,
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: cooling2}}),
        "moved",
    );
    assert_eq!(dispatched(f), vec![some(0)]);

    // Every key cooling, the first clears inside the deadline: sleep, then
    // admit again and send with it.
    let all_cooling = snapshot_after(&[
        (0, limited(1_500), Some(429), NOW_2026),
        (2, limited(2_500), Some(429), NOW_2026),
        (3, limited(3_000), Some(429), NOW_2026),
    ]);
    case(
        f,
        "machine_pool_waits_for_the_first_key_to_cool",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: all_cooling}}),
        "until_ms\":1500",
    );
    assert_eq!(dispatched(f), vec![some(0)]);

    // ... and past the deadline: the run ends sealed, stop_no_usable_key.
    let past = snapshot_after(&[
        (0, limited(60_000), Some(429), NOW_2026),
        (2, limited(60_000), Some(429), NOW_2026),
        (3, limited(60_000), Some(429), NOW_2026),
    ]);
    case(
        f,
        "machine_pool_no_key_before_the_deadline",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: past}}),
        "stop_no_usable_key",
    );
    assert!(dispatched(f).is_empty());
    // Every key disabled: stop_no_usable_key.
    let none = snapshot_after(&[
        (0, refused(), Some(401), NOW_2026),
        (1, refused(), Some(401), NOW_2026),
        (2, refused(), Some(403), NOW_2026),
        (3, refused(), Some(401), NOW_2026),
    ]);
    case(
        f,
        "machine_pool_every_key_disabled",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: none.clone()}}),
        "stop_no_usable_key",
    );
    assert!(dispatched(f).is_empty());
    // A changed configuration re-enables them.
    let mut longer = pool();
    longer["cool_ms"] = json!(2_000);
    let changed = t(&policy_with(&[
        (
            "/fleet",
            json!({"key_pools": [longer], "on_store_unavailable": "fail_closed"}),
        ),
        ("/routes/0/key_pool", json!(POOL)),
    ]));
    case(
        f,
        "machine_pool_changed_configuration_re_enables",
        &changed,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: none}}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0)]);

    // The fallback route has no pool: its attempts carry no key.
    case(
        f,
        "machine_pool_fallback_route_without_a_pool",
        &p,
        &options(false),
        None,
        &json!({"attempts": [status(503, None), status(503, None), ok(false)]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0), some(0), None]);

    // The store: a conflict on the pool's write reads again and selects
    // again; conflicts past the bound are store_conflict; unreachable
    // fails closed, or open (a fresh pool, nothing written).
    case(
        f,
        "machine_pool_write_conflict_reads_again",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "conflicts": [0]}),
        "completed",
    );
    case(
        f,
        "machine_pool_conflicts_past_the_bound_are_store_conflict",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "conflicts": [0, 1, 2, 3, 4, 5]}),
        "store_conflict",
    );
    case(
        f,
        "machine_pool_store_unreachable_fails_closed",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "unavailable": [0]}),
        "stop_store_unavailable",
    );
    assert!(dispatched(f).is_empty());
    let open = policy(fleet(json!({"on_store_unavailable": "fail_open"})));
    case(
        f,
        "machine_pool_store_unreachable_fails_open",
        &open,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "unavailable": [0]}),
        "completed",
    );
    assert_eq!(dispatched(f), vec![some(0)]);
    assert!(
        last_pool_write(f).is_none(),
        "nothing written without the store"
    );

    // A stored document of another pool is refused with its code.
    let mut other = snapshot_after(&[(2, limited(1_000), Some(429), NOW_2026)]);
    other["name"] = json!("other-keys");
    case(
        f,
        "machine_pool_snapshot_of_another_pool",
        &p,
        &options(false),
        None,
        &json!({"attempts": [ok(false)], "store": {REGISTER: other}}),
        "snapshot_key_mismatch",
    );

    crate::key_pool_refusal::cases(f, &p);

    // The policy rules of a route's key pool.
    f.policy("policy_fleet_of_key_pools_alone", &p, "ok");
    let undeclared = t(&policy_with(&[
        (
            "/fleet",
            json!({"breaker": breaker(), "on_store_unavailable": "fail_closed"}),
        ),
        ("/routes/0/key_pool", json!(POOL)),
    ]));
    f.policy(
        "policy_route_names_an_undeclared_pool",
        &undeclared,
        "invalid_key_pool",
    );
    let twice = t(&policy_with(&[(
        "/fleet",
        json!({"key_pools": [pool(), pool()], "on_store_unavailable": "fail_closed"}),
    )]));
    f.policy("policy_a_pool_declared_twice", &twice, "invalid_key_pool");
    let empty = t(&policy_with(&[(
        "/fleet",
        json!({"key_pools": [], "on_store_unavailable": "fail_closed"}),
    )]));
    f.policy("policy_an_empty_pool_list", &empty, "invalid_key_pool");
    let mut hedged = serde_json::from_str::<Value>(&p).expect("json");
    hedged["hedge"] = json!({"cancelled_cost": "reserve", "cost_share_percent": 50, "delay_ms": 300,
        "effects": "none", "max_hedges": 1, "routes": ["external-fallback"]});
    f.policy(
        "policy_a_hedged_run_cannot_pool_its_keys",
        &t(&hedged),
        "invalid_key_pool",
    );
}
