//! The key pool transitions, by example.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
use super::*;
use crate::canonical::sha256_hex;

fn key(n: u8) -> Sha256Hex {
    Sha256Hex::computed(sha256_hex(&[n]))
}

fn pool(accounts: &[Option<&str>]) -> KeyPoolConfig {
    KeyPoolConfig {
        cool_ms: 1_000,
        disable_ms: None,
        keys: accounts
            .iter()
            .enumerate()
            .map(|(i, a)| PoolKey {
                account: a.map(|a| Identifier::parse(a).unwrap()),
                key_sha256: key(u8::try_from(i).unwrap()),
            })
            .collect(),
        name: Identifier::parse("openai").unwrap(),
        park_ms: 60_000,
    }
}

fn picked(s: &Selection) -> Sha256Hex {
    match s {
        Selection::Key { key_sha256, .. } => key_sha256.clone(),
        other => panic!("no key: {other:?}"),
    }
}

#[test]
fn keys_are_taken_in_turn_not_drained_in_order() {
    let cfg = pool(&[None, None, None, None]);
    let mut snap = KeyPoolSnapshot::fresh(&cfg);
    let mut seen = Vec::new();
    for t in 1..=8 {
        let (s, next) = select(&cfg, &snap, t, None);
        seen.push(picked(&s));
        snap = next;
    }
    let first: Vec<_> = seen[..4].to_vec();
    for k in 0..4 {
        assert!(first.contains(&key(k)), "every key once in four calls");
    }
    assert_eq!(&seen[4..], &first[..], "then the same turn again");
}

#[test]
fn a_key_cooling_until_the_start_is_usable_by_it_and_held_for_others() {
    let cfg = pool(&[None, None]);
    let snap = KeyPoolSnapshot::fresh(&cfg);
    let limited = |ms| KeySignal::Limited(Some(ms));
    let snap = record(&cfg, &snap, &key(0), limited(4_000), 1_000).unwrap();
    let snap = record(&cfg, &snap, &key(1), limited(1_000), 1_000).unwrap();
    // Chosen at 2 000 for a start at 2 000: key 1's hold has ended.
    let (s, _) = select_for_start(&cfg, &snap, 2_000, 2_000, None);
    assert_eq!(picked(&s), key(1));
    // Chosen at 1 500 for a start at 5 000: both usable, the least
    // recently limited first (a tie: the configuration's order).
    let (s, next) = select_for_start(&cfg, &snap, 1_500, 5_000, None);
    assert_eq!(picked(&s), key(0));
    assert_eq!(
        next.keys[0].state,
        KeyHealth::Cooling,
        "held for every other run"
    );
    assert_eq!(next.keys[0].last_used_at_epoch_ms, Some(1_500));
    assert_eq!(next.updated_at_epoch_ms, 1_500);
    // For a start at 3 000 only key 1 has cooled.
    let (s, _) = select_for_start(&cfg, &snap, 1_500, 3_000, None);
    assert_eq!(picked(&s), key(1));
    // For a start at 1 500 neither: the first clears at 2 000.
    let (s, _) = select_for_start(&cfg, &snap, 1_500, 1_500, None);
    assert_eq!(
        s,
        Selection::Wait {
            until_epoch_ms: 2_000
        }
    );
}

#[test]
fn a_limit_cools_the_account_and_a_refusal_disables_until_the_config_changes() {
    let cfg = pool(&[Some("a"), Some("a"), None]);
    let snap = KeyPoolSnapshot::fresh(&cfg);
    let limited = Outcome::Retryable {
        kind: RetryableKind::RateLimited,
        retry_after_ms: Some(5_000),
        retry_after_source: None,
    };
    let snap = record(
        &cfg,
        &snap,
        &key(0),
        KeySignal::of(&limited, Some(429)),
        100,
    )
    .unwrap();
    assert_eq!(snap.keys[0].state, KeyHealth::Cooling);
    assert_eq!(snap.keys[1].until_epoch_ms, Some(5_100));
    assert_eq!(snap.keys[2].state, KeyHealth::Healthy);
    let (s, snap) = select(&cfg, &snap, 200, Some(&key(0)));
    assert_eq!(
        s,
        Selection::Key {
            key_sha256: key(2),
            affinity: Some(Affinity::Moved)
        }
    );
    let refused = Outcome::NonRetryable {
        kind: NonRetryableKind::Rejected,
    };
    let snap = record(
        &cfg,
        &snap,
        &key(2),
        KeySignal::of(&refused, Some(401)),
        300,
    )
    .unwrap();
    let (s, _) = select(&cfg, &snap, 400, None);
    assert_eq!(
        s,
        Selection::Wait {
            until_epoch_ms: 5_100
        }
    );
    let (s, _) = select(&cfg, &snap, 5_100, Some(&key(1)));
    assert_eq!(
        s,
        Selection::Key {
            key_sha256: key(1),
            affinity: Some(Affinity::Kept)
        }
    );
    let mut changed = cfg.clone();
    changed.cool_ms = 2_000;
    let (s, _) = select(&changed, &snap, 400, None);
    assert_eq!(picked(&s), key(2), "a new configuration re-enables the key");
}

#[test]
fn a_refusal_records_its_reason_and_disable_ms_lets_the_key_back() {
    let cfg = pool(&[None, None]);
    let snap = KeyPoolSnapshot::fresh(&cfg);
    let refused = Outcome::NonRetryable {
        kind: NonRetryableKind::PolicyDenied,
    };
    let forbidden = record(
        &cfg,
        &snap,
        &key(0),
        KeySignal::of(&refused, Some(403)),
        100,
    )
    .unwrap();
    assert_eq!(forbidden.keys[0].state, KeyHealth::Disabled);
    assert_eq!(forbidden.keys[0].reason, Some(KeyRefusal::Forbidden));
    assert_eq!(
        forbidden.keys[0].until_epoch_ms, None,
        "until the configuration changes"
    );
    forbidden.check(&cfg, "").unwrap();
    // Without disable_ms the key stays disabled however long it waits.
    let (s, _) = select(&cfg, &forbidden, u64::MAX / 2, Some(&key(0)));
    assert_eq!(picked(&s), key(1));
    // With disable_ms it is held that long, then usable, its reason gone.
    let mut timed = cfg.clone();
    timed.disable_ms = Some(5_000);
    let held = record(
        &timed,
        &KeyPoolSnapshot::fresh(&timed),
        &key(0),
        KeySignal::of(&refused, Some(401)),
        100,
    )
    .unwrap();
    assert_eq!(held.keys[0].reason, Some(KeyRefusal::Unauthorized));
    assert_eq!(held.keys[0].until_epoch_ms, Some(5_100));
    held.check(&timed, "").unwrap();
    let (s, next) = select(&timed, &held, 5_100, Some(&key(0)));
    assert_eq!(picked(&s), key(0));
    assert_eq!(next.keys[0].state, KeyHealth::Healthy);
    assert_eq!(next.keys[0].reason, None);
    // A reason on a key that is not disabled is refused.
    let mut odd = next;
    odd.keys[1].reason = Some(KeyRefusal::Unauthorized);
    assert_eq!(
        odd.check(&timed, "").unwrap_err().code,
        ErrorCode::InvalidSnapshot
    );
}
