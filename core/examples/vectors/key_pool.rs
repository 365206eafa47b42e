//! `key_pool.json`: a provider's API keys as one pool
//! (`retryledger.key_pool.v1`): which key an attempt uses, what an answer
//! says about its key, and the key's identity as a digest.

use retryledger_core::api;
use serde_json::{json, Value};

use crate::common::{id, t, NOW_2026};
use crate::family::Family;

const T0: u64 = NOW_2026;

fn key(n: usize) -> String {
    api::key_sha256(&format!("sk-test-key-{n}")).expect("key")
}

/// Four keys: 0 and 1 share account `acct-a`, 2 and 3 have their own quota.
fn config() -> Value {
    json!({
        "cool_ms": 1_000,
        "keys": [
            {"account": "acct-a", "key_sha256": key(0)},
            {"account": "acct-a", "key_sha256": key(1)},
            {"key_sha256": key(2)},
            {"key_sha256": key(3)},
        ],
        "name": "openai-keys",
        "park_ms": 3_600_000,
    })
}

/// The fragment of a selection of key `n` (a snapshot lists every key).
fn chosen(n: usize) -> String {
    format!("key_sha256\":\"{}\",\"kind", key(n))
}

fn limited(hint: Option<u64>) -> Value {
    match hint {
        Some(ms) => {
            json!({"class": "retryable", "kind": "rate_limited", "retry_after_ms": ms})
        }
        None => json!({"class": "retryable", "kind": "rate_limited"}),
    }
}

fn outcome(class: &str, kind: &str) -> Value {
    json!({"class": class, "kind": kind})
}

fn success() -> Value {
    json!({"class": "success"})
}

/// The snapshot out of an api answer (`select`'s is under `snapshot`).
fn snapshot_of(answer: &str) -> Value {
    let v: Value = serde_json::from_str(answer).expect("json");
    v.get("snapshot").cloned().unwrap_or(v)
}

/// Build a snapshot by recording `steps` (key index, outcome, status, at)
/// from a fresh pool under `cfg`.
fn after(cfg: &Value, steps: &[(usize, Value, Option<u64>, u64)]) -> Value {
    let mut snap: Option<Value> = None;
    for (k, o, status, at) in steps {
        let text = snap.as_ref().map(t);
        let answer = api::key_pool_record(&t(cfg), text.as_deref(), &key(*k), &t(o), *status, *at)
            .expect("record");
        snap = Some(snapshot_of(&answer));
    }
    snap.expect("at least one step")
}

/// The snapshot after `n` selections from a fresh pool, one ms apart.
fn after_turns(cfg: &Value, n: u64) -> Option<Value> {
    let mut snap: Option<Value> = None;
    for i in 0..n {
        let text = snap.as_ref().map(t);
        let answer = api::key_pool_select(&t(cfg), text.as_deref(), T0 + i, None).expect("select");
        snap = Some(snapshot_of(&answer));
    }
    snap
}

fn select(
    f: &mut Family,
    name: &str,
    cfg: &Value,
    snap: Option<&Value>,
    now: u64,
    affinity: Option<&str>,
    want: &str,
) {
    let mut input = vec![("config", json!(t(cfg)))];
    if let Some(s) = snap {
        input.push(("snapshot", json!(t(s))));
    }
    input.push(("now_epoch_ms", json!(now)));
    if let Some(a) = affinity {
        input.push(("affinity", json!(a)));
    }
    f.add(name, "key_pool_select", input, want);
}

#[allow(clippy::too_many_arguments, reason = "one vector's inputs")]
fn record(
    f: &mut Family,
    name: &str,
    cfg: &Value,
    snap: Option<&Value>,
    key_sha256: &str,
    o: &Value,
    status: Option<u64>,
    now: u64,
    want: &str,
) {
    let mut input = vec![("config", json!(t(cfg)))];
    if let Some(s) = snap {
        input.push(("snapshot", json!(t(s))));
    }
    input.push(("key_sha256", json!(key_sha256)));
    input.push(("outcome", json!(t(o))));
    if let Some(s) = status {
        input.push(("status", json!(s)));
    }
    input.push(("now_epoch_ms", json!(now)));
    f.add(name, "key_pool_record", input, want);
}

fn with(mut v: Value, pointer: &str, new: Value) -> Value {
    *v.pointer_mut(pointer).expect("pointer") = new;
    v
}

pub fn family() -> Family {
    let mut f = Family::new(
        "key_pool",
        "key_pool_select / key_pool_record / key_sha256: one provider's API keys as a pool (retryledger.key_pool.v1, one register per pool): the key an attempt uses (the usable key least recently used or limited, with a session's affinity), what an answer says about its key (401/403 disable it with its reason until the configuration changes or for the pool's disable_ms, a rate limit cools it and its account's keys until the hint, an exhausted quota parks them), a key named by the SHA-256 of its secret.",
        "keys taken in turn from a fresh pool and never drained in order, also after every key was limited once; affinity kept and moved; cooling with and without a hint, shared by an account; parking; refusal by 401 and 403; waiting for the first key to clear and no usable key; holds lifted by time; a changed configuration re-enables, adds and forgets keys; a clock behind the snapshot; answers that say nothing of the key; bad configurations, snapshots, keys, statuses and outcomes; the run machine with a route's key pool: the key selected with each admission and named on the dispatch, the answer recorded by compare-and-set (alone and under a breaker, a retry budget, admission limits, all three, a journal), a 401/403 key never taken again, a refused key marking its attempt key_refused and moving the run at once to another key of the pool (no breaker failure, not against the route's bound, against the total), every key refused in turn or none usable ending the run sealed with stop_no_usable_key, each key's digest in the admission and the journal and never a secret, disable_ms, the least recently used key, affinity kept and moved, a wait for the first key to cool, no usable key (all disabled, or not before the deadline), a changed configuration, a fallback route without a pool, store conflicts and outages, a snapshot of another pool; sealed pooled runs as evaluate and verify_bundle cases and tampered copies (a key not in the pool, a refused key sent again, a pooled attempt without its key, key_refused on a success, an unmarked refusal, a no_usable_key stop without or with another pool); the policy rules of key_pools and a route's key_pool",
    );
    let cfg = config();
    let cfg_t = &cfg;

    // The key's identity.
    f.add(
        "key_sha256_of_a_secret",
        "key_sha256",
        vec![("secret", json!("sk-test-key-0"))],
        &key(0),
    );
    f.add(
        "key_sha256_of_an_empty_secret",
        "key_sha256",
        vec![("secret", json!(""))],
        "invalid_value",
    );

    // In turn: a fresh pool gives each key once in four selections.
    for n in 0..6 {
        let snap = after_turns(cfg_t, n);
        select(
            &mut f,
            &format!("select_turn_{}", n + 1),
            cfg_t,
            snap.as_ref(),
            T0 + n,
            None,
            &chosen(usize::try_from(n % 4).expect("small")),
        );
    }

    // Affinity.
    let four = after_turns(cfg_t, 4);
    select(
        &mut f,
        "select_affinity_kept",
        cfg_t,
        four.as_ref(),
        T0 + 10,
        Some(&key(3)),
        "kept",
    );
    let cooled3 = after(cfg_t, &[(3, limited(Some(5_000)), Some(429), T0)]);
    select(
        &mut f,
        "select_affinity_moved_off_a_cooling_key",
        cfg_t,
        Some(&cooled3),
        T0 + 10,
        Some(&key(3)),
        "moved",
    );
    select(
        &mut f,
        "select_affinity_to_a_key_not_in_the_pool_moves",
        cfg_t,
        None,
        T0,
        Some(&id("a key of another pool")),
        "moved",
    );
    select(
        &mut f,
        "select_affinity_not_a_digest",
        cfg_t,
        None,
        T0,
        Some("sk-test-key-0"),
        "invalid_digest",
    );

    // Rate limits: the key and its account's keys cool.
    record(
        &mut f,
        "record_429_with_a_hint_cools_the_account",
        cfg_t,
        None,
        &key(0),
        &limited(Some(5_000)),
        Some(429),
        T0,
        &format!("until_epoch_ms\":{}", T0 + 5_000),
    );
    record(
        &mut f,
        "record_429_without_a_hint_cools_for_cool_ms",
        cfg_t,
        None,
        &key(2),
        &limited(None),
        Some(429),
        T0,
        &format!("until_epoch_ms\":{}", T0 + 1_000),
    );
    let cooled0 = after(cfg_t, &[(0, limited(Some(5_000)), Some(429), T0)]);
    select(
        &mut f,
        "select_skips_the_cooling_account",
        cfg_t,
        Some(&cooled0),
        T0 + 1,
        None,
        &chosen(2),
    );
    select(
        &mut f,
        "select_after_the_hint_the_key_is_usable_again",
        cfg_t,
        Some(&cooled0),
        T0 + 5_000,
        Some(&key(0)),
        "kept",
    );
    // Least recently limited first: 2 was limited after 3.
    let limited_both = after(
        cfg_t,
        &[
            (2, limited(Some(100)), Some(429), T0),
            (3, limited(Some(100)), Some(429), T0 + 10),
            (0, limited(Some(100)), Some(429), T0 + 20),
        ],
    );
    select(
        &mut f,
        "select_least_recently_limited_first",
        cfg_t,
        Some(&limited_both),
        T0 + 1_000,
        None,
        &chosen(2),
    );
    let never = after(cfg_t, &[(3, limited(Some(100)), Some(429), T0)]);
    select(
        &mut f,
        "select_a_never_limited_key_before_a_limited_one",
        cfg_t,
        Some(&never),
        T0 + 1_000,
        None,
        &chosen(0),
    );

    // Quotas that cannot clear park the account.
    record(
        &mut f,
        "record_quota_exhausted_parks_the_account",
        cfg_t,
        None,
        &key(1),
        &outcome("non_retryable", "quota_exhausted"),
        Some(429),
        T0,
        "parked",
    );
    let parked = after(
        cfg_t,
        &[(
            1,
            outcome("non_retryable", "quota_exhausted"),
            Some(429),
            T0,
        )],
    );
    record(
        &mut f,
        "record_a_cooling_peer_does_not_shorten_a_park",
        cfg_t,
        Some(&parked),
        &key(0),
        &limited(Some(10)),
        Some(429),
        T0 + 5,
        &format!("until_epoch_ms\":{}", T0 + 3_600_000),
    );

    // Refusals disable the key itself.
    for status in [401_u64, 403] {
        record(
            &mut f,
            &format!("record_{status}_disables_the_key"),
            cfg_t,
            None,
            &key(0),
            &outcome("non_retryable", "rejected"),
            Some(status),
            T0,
            "disabled",
        );
    }
    let disabled0 = after(
        cfg_t,
        &[(0, outcome("non_retryable", "rejected"), Some(401), T0)],
    );
    select(
        &mut f,
        "select_never_takes_a_disabled_key",
        cfg_t,
        Some(&disabled0),
        T0 + 1,
        Some(&key(0)),
        "moved",
    );
    record(
        &mut f,
        "record_a_limit_on_the_account_keeps_a_disabled_key_disabled",
        cfg_t,
        Some(&disabled0),
        &key(1),
        &limited(Some(1_000)),
        Some(429),
        T0 + 2,
        "disabled",
    );
    let changed = with(cfg.clone(), "/cool_ms", json!(2_000));
    select(
        &mut f,
        "select_a_changed_configuration_re_enables",
        &changed,
        Some(&disabled0),
        T0 + 3,
        Some(&key(0)),
        "kept",
    );
    let fewer = with(
        cfg.clone(),
        "/keys",
        json!([{"key_sha256": key(3)}, {"key_sha256": key(4)}]),
    );
    select(
        &mut f,
        "select_a_changed_configuration_forgets_and_adds_keys",
        &fewer,
        Some(&disabled0),
        T0 + 3,
        None,
        &chosen(3),
    );

    // Nothing usable.
    let all_cool = after(
        cfg_t,
        &[
            (0, limited(Some(7_000)), Some(429), T0),
            (2, limited(Some(3_000)), Some(429), T0),
            (3, limited(Some(9_000)), Some(429), T0),
        ],
    );
    select(
        &mut f,
        "select_waits_for_the_first_key_to_clear",
        cfg_t,
        Some(&all_cool),
        T0 + 1,
        None,
        &format!("until_epoch_ms\":{}", T0 + 3_000),
    );
    let all_refused = after(
        cfg_t,
        &[
            (0, outcome("non_retryable", "rejected"), Some(401), T0),
            (1, outcome("non_retryable", "rejected"), Some(401), T0),
            (2, outcome("non_retryable", "policy_denied"), Some(403), T0),
            (3, outcome("non_retryable", "rejected"), Some(401), T0),
        ],
    );
    select(
        &mut f,
        "select_no_usable_key_when_every_key_is_refused",
        cfg_t,
        Some(&all_refused),
        T0 + 1,
        None,
        "no_usable_key",
    );

    // Answers that say nothing of the key leave the pool as it was.
    for (name, o, status) in [
        ("success", success(), Some(200)),
        (
            "unavailable",
            outcome("retryable", "unavailable"),
            Some(503),
        ),
        (
            "timeout",
            outcome("retryable", "timeout_before_response"),
            None,
        ),
        (
            "invalid_request",
            outcome("non_retryable", "invalid_request"),
            Some(400),
        ),
    ] {
        record(
            &mut f,
            &format!("record_{name}_changes_nothing"),
            cfg_t,
            Some(&cooled0),
            &key(2),
            &o,
            status,
            T0 + 1,
            "generation\":1",
        );
    }

    // A clock behind the snapshot counts as the snapshot's time.
    select(
        &mut f,
        "select_a_clock_behind_the_snapshot",
        cfg_t,
        Some(&cooled0),
        T0 - 60_000,
        None,
        &format!("last_used_at_epoch_ms\":{T0}"),
    );

    // Bad input.
    let bad_configs = [
        ("no_keys", with(cfg.clone(), "/keys", json!([]))),
        (
            "a_key_twice",
            with(
                cfg.clone(),
                "/keys",
                json!([{"key_sha256": key(0)}, {"key_sha256": key(0)}]),
            ),
        ),
        ("cool_ms_zero", with(cfg.clone(), "/cool_ms", json!(0))),
        (
            "park_ms_over_a_week",
            with(cfg.clone(), "/park_ms", json!(7 * 24 * 3_600_000 + 1)),
        ),
    ];
    for (name, c) in &bad_configs {
        select(
            &mut f,
            &format!("config_{name}"),
            c,
            None,
            T0,
            None,
            "invalid_key_pool",
        );
    }
    let mut unknown = cfg.clone();
    unknown["max_keys"] = json!(4);
    select(
        &mut f,
        "config_unknown_field",
        &unknown,
        None,
        T0,
        None,
        "unknown_field",
    );
    select(
        &mut f,
        "config_name_not_an_identifier",
        &with(cfg.clone(), "/name", json!("open ai")),
        None,
        T0,
        None,
        "invalid_identifier",
    );
    select(
        &mut f,
        "snapshot_of_another_pool",
        cfg_t,
        Some(&with(cooled0.clone(), "/name", json!("anthropic-keys"))),
        T0,
        None,
        "snapshot_key_mismatch",
    );
    select(
        &mut f,
        "snapshot_cooling_without_until",
        cfg_t,
        Some(&with(
            cooled0.clone(),
            "/keys/0/until_epoch_ms",
            Value::Null,
        )),
        T0,
        None,
        "error",
    );
    let mut no_until = cooled0.clone();
    no_until["keys"][0]
        .as_object_mut()
        .expect("object")
        .remove("until_epoch_ms");
    select(
        &mut f,
        "snapshot_cooling_without_until_field",
        cfg_t,
        Some(&no_until),
        T0,
        None,
        "invalid_snapshot",
    );
    let mut swapped = cooled0.clone();
    swapped["keys"].as_array_mut().expect("keys").swap(0, 2);
    select(
        &mut f,
        "snapshot_keys_not_its_configurations",
        cfg_t,
        Some(&swapped),
        T0,
        None,
        "invalid_snapshot",
    );
    let mut extra = cooled0.clone();
    extra["keys"]
        .as_array_mut()
        .expect("keys")
        .push(json!({"key_sha256": key(7), "state": "healthy"}));
    select(
        &mut f,
        "snapshot_with_a_key_the_pool_does_not_hold",
        cfg_t,
        Some(&extra),
        T0,
        None,
        "invalid_snapshot",
    );
    select(
        &mut f,
        "snapshot_unknown_state",
        cfg_t,
        Some(&with(cooled0.clone(), "/keys/0/state", json!("resting"))),
        T0,
        None,
        "error",
    );
    record(
        &mut f,
        "record_a_key_not_in_the_pool",
        cfg_t,
        None,
        &key(9),
        &limited(None),
        Some(429),
        T0,
        "key_not_in_pool",
    );
    record(
        &mut f,
        "record_a_key_that_is_not_a_digest",
        cfg_t,
        None,
        "sk-test-key-0",
        &limited(None),
        Some(429),
        T0,
        "invalid_digest",
    );
    record(
        &mut f,
        "record_a_status_out_of_range",
        cfg_t,
        None,
        &key(0),
        &limited(None),
        Some(1_000),
        T0,
        "integer_out_of_range",
    );
    record(
        &mut f,
        "record_an_unknown_outcome",
        cfg_t,
        None,
        &key(0),
        &outcome("retryable", "overloaded"),
        Some(529),
        T0,
        "error",
    );
    in_turn_after_limits(&mut f);
    crate::key_pool_machine::cases(&mut f);
    f
}

/// After every key of a pool has been limited once and cooled, keys are
/// still taken in turn: each use sends a key to the back of the line, so
/// the key limited longest ago is not drained before the next one.
fn in_turn_after_limits(f: &mut Family) {
    let keys: Vec<Value> = (0..4).map(|n| json!({"key_sha256": key(n)})).collect();
    let cfg = json!({
        "cool_ms": 1_000,
        "keys": keys,
        "name": "own-quota-keys",
        "park_ms": 3_600_000,
    });
    let steps: Vec<(usize, Value, Option<u64>, u64)> = (0..4)
        .map(|n| (n, limited(Some(100)), Some(429), T0 + n as u64))
        .collect();
    let mut snap = after(&cfg, &steps);
    let start = T0 + 10_000;
    let mut taken = Vec::new();
    for i in 0..8_u64 {
        let answer =
            api::key_pool_select(&t(&cfg), Some(&t(&snap)), start + i, None).expect("select");
        let v: Value = serde_json::from_str(&answer).expect("json");
        let k = v["selection"]["key_sha256"]
            .as_str()
            .expect("a key")
            .to_owned();
        let n = (0..4).find(|n| key(*n) == k).expect("a pool key");
        if i < 4 {
            select(
                f,
                &format!("after_every_key_was_limited_turn_{i}_takes_key_{n}"),
                &cfg,
                Some(&snap),
                start + i,
                None,
                &chosen(n),
            );
        }
        taken.push(n);
        snap = snapshot_of(&answer);
    }
    // Never the same key twice in a row, each key twice in eight turns.
    assert!(
        taken.windows(2).all(|w| w[0] != w[1]),
        "drained in order: {taken:?}"
    );
    for n in 0..4 {
        assert_eq!(taken.iter().filter(|k| **k == n).count(), 2, "{taken:?}");
    }
}
