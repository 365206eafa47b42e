//! Key pools: one provider, several API keys, each with its own health.
//!
//! A pool is a policy's list of keys, each named by the SHA-256 of its
//! secret (never the secret), with the account whose quota it draws on. Its
//! state across runs is one register (`key_pool/<name>`) holding a
//! `retryledger.key_pool.v1` snapshot, written back with compare-and-set
//! like a breaker's. Two pure transitions:
//!
//! - [`select`]: which key the next attempt uses. A key that answered
//!   401 or 403 is disabled until the pool's configuration changes; a
//!   rate-limited key cools until its hint (or `cool_ms`); a key whose quota
//!   cannot clear is parked for `park_ms`. Among the usable keys the one
//!   least recently touched is taken: a key's recency is the later of its
//!   last use and its last limit, so a key that was just limited goes to
//!   the back of the line and every use does too. Keys are shared in turn
//!   and never drained one after another (ties: the least recently
//!   limited, then the configuration's order). With an affinity
//!   (the key a session used before, for prompt caching) the session keeps
//!   its key while it is usable and moves when it is not.
//! - [`record`]: what an attempt's outcome says about its key. A rate limit
//!   or an exhausted quota applies to every key of the same account (they
//!   share one quota); a refused key (401 `unauthorized`, 403 `forbidden`)
//!   only to itself: it is disabled with that reason until an operator
//!   changes the pool's configuration (rotates, removes or re-adds a key,
//!   or any other change), or, when the pool sets `disable_ms`, until that
//!   much time has passed — whichever comes first.
//!
//! Every change raises the generation. Time never goes back for a pool: a
//! clock behind `updated_at_epoch_ms` counts as that time.

use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::outcome::{NonRetryableKind, Outcome, RetryableKind};

schema_marker!(
    /// `retryledger.key_pool.v1`
    KeyPoolSchema = "retryledger.key_pool.v1"
);

/// Most keys in one pool.
pub const MAX_KEYS: usize = 64;

/// Longest `cool_ms` and `park_ms`: one week.
pub const MAX_HOLD_MS: u64 = 7 * 24 * 3_600_000;

/// One key of a pool. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKey {
    /// The account whose quota the key draws on: keys of one account cool
    /// and park together. Absent: the key has a quota of its own.
    pub account: Option<Identifier>,
    /// SHA-256 of the key's secret (its UTF-8 bytes).
    pub key_sha256: Sha256Hex,
}

object!(PoolKey {
    account: opt_doc,
    key_sha256: doc,
});

/// A pool's configuration. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPoolConfig {
    /// How long a rate-limited key cools when the answer gave no hint, ms.
    pub cool_ms: u64,
    /// How long a refused key (401, 403) stays disabled, ms. Absent (the
    /// default): until the pool's configuration changes, as a revoked key
    /// does not come back by itself.
    pub disable_ms: Option<u64>,
    /// The keys, in the order ties are broken.
    pub keys: Vec<PoolKey>,
    /// The pool's name: its register is `key_pool/<name>`.
    pub name: Identifier,
    /// How long a key whose quota cannot clear is parked, ms.
    pub park_ms: u64,
}

object!(KeyPoolConfig {
    cool_ms: u64,
    disable_ms: opt_u64,
    keys: list(MAX_KEYS),
    name: doc,
    park_ms: u64,
});

impl KeyPoolConfig {
    /// Check the configuration; `at` is its JSON Pointer.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |field: &str, msg: String| {
            Err(Error::at(
                ErrorCode::InvalidKeyPool,
                format!("{at}/{field}"),
                msg,
            ))
        };
        if self.keys.is_empty() {
            return bad("keys", "a key pool needs at least one key".to_owned());
        }
        for (i, k) in self.keys.iter().enumerate() {
            if self
                .keys
                .iter()
                .take(i)
                .any(|o| o.key_sha256 == k.key_sha256)
            {
                return bad(
                    &format!("keys/{i}/key_sha256"),
                    format!(
                        "key {} appears twice in the pool: each key once",
                        k.key_sha256.as_str()
                    ),
                );
            }
        }
        for (field, v) in [
            ("cool_ms", self.cool_ms),
            ("park_ms", self.park_ms),
            ("disable_ms", self.disable_ms.unwrap_or(1)),
        ] {
            if v == 0 || v > MAX_HOLD_MS {
                return bad(field, format!("{field} must be in 1..={MAX_HOLD_MS}"));
            }
        }
        Ok(())
    }

    /// The digest the snapshot records: a change of the configuration
    /// re-enables the keys an invalid-key answer disabled.
    pub fn sha256(&self) -> Sha256Hex {
        Sha256Hex::computed(digest_of(self))
    }

    fn account_of(&self, key: &Sha256Hex) -> Option<&Identifier> {
        self.keys
            .iter()
            .find(|k| &k.key_sha256 == key)
            .and_then(|k| k.account.as_ref())
    }
}

/// The fleet section's key pools (`fleet.key_pools`): each pool once by
/// name; a route names its pool by `key_pool`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyPools(pub Vec<KeyPoolConfig>);

/// Most key pools in one fleet section: one per route.
pub const MAX_POOLS: usize = crate::limits::MAX_ROUTES;

impl crate::decode::Decode for KeyPools {
    fn decode(v: &serde_json::Value, at: &crate::decode::At<'_>) -> Result<Self> {
        crate::decode::decode_list(v, at, MAX_POOLS).map(Self)
    }
}

impl Encode for KeyPools {
    fn encode(&self, sink: &mut dyn Sink) {
        crate::canonical::encode_list(self.0.iter(), sink);
    }
}

impl KeyPools {
    /// Check every pool and that no name repeats; `at` is the list's JSON
    /// Pointer.
    pub fn check(&self, at: &str) -> Result<()> {
        if self.0.is_empty() {
            return Err(Error::at(
                ErrorCode::InvalidKeyPool,
                at,
                "key_pools lists at least one pool (omit it when there is none)",
            ));
        }
        for (i, p) in self.0.iter().enumerate() {
            p.check(&format!("{at}/{i}"))?;
            if self.0.iter().take(i).any(|o| o.name == p.name) {
                return Err(Error::at(
                    ErrorCode::InvalidKeyPool,
                    format!("{at}/{i}/name"),
                    format!(
                        "pool `{}` is declared twice: each pool once",
                        p.name.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The pool of this name.
    pub fn get(&self, name: &Identifier) -> Option<&KeyPoolConfig> {
        self.0.iter().find(|p| &p.name == name)
    }
}

/// The register of a pool: `key_pool/<name>`.
pub fn pool_key(name: &Identifier) -> String {
    format!("key_pool/{}", name.as_str())
}

/// The key an attempt is dispatched with, as the run machine's dispatch
/// effect names it: the host looks the secret up by its digest. Fields in
/// canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChoice {
    /// With an affinity: whether the session kept its key or moved.
    pub affinity: Option<Affinity>,
    /// The key.
    pub key_sha256: Sha256Hex,
    /// The pool it was taken from.
    pub pool: Identifier,
}

object!(KeyChoice {
    affinity: opt_doc,
    key_sha256: doc,
    pool: doc,
});

/// A key's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHealth {
    /// Usable.
    Healthy,
    /// Rate limited: usable again at `until_epoch_ms`.
    Cooling,
    /// Its quota cannot clear soon: usable again at `until_epoch_ms`.
    Parked,
    /// The provider refused the key itself (401 or 403): unusable until
    /// the pool's configuration changes (or, with `disable_ms`, until
    /// `until_epoch_ms`).
    Disabled,
}

/// Why the provider refused a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefusal {
    /// HTTP 401: the key is invalid, revoked or expired.
    Unauthorized,
    /// HTTP 403: the key is valid but not allowed (disabled, region,
    /// organization, project).
    Forbidden,
}

names!(KeyRefusal {
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
});

impl KeyRefusal {
    /// The refusal an HTTP status stands for (401, 403).
    pub fn of_status(status: Option<u16>) -> Option<Self> {
        match status {
            Some(401) => Some(Self::Unauthorized),
            Some(403) => Some(Self::Forbidden),
            _ => None,
        }
    }
}

/// The key an attempt was sent with, as its admission records it: the
/// digest, never the secret. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRef {
    /// The key's digest.
    pub key_sha256: Sha256Hex,
    /// The pool it was taken from.
    pub pool: Identifier,
}

object!(KeyRef {
    key_sha256: doc,
    pool: doc,
});

names!(KeyHealth {
    Healthy => "healthy",
    Cooling => "cooling",
    Parked => "parked",
    Disabled => "disabled",
});

/// One key's state. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The key.
    pub key_sha256: Sha256Hex,
    /// When the key was last rate limited or parked (absent: never).
    pub last_limited_at_epoch_ms: Option<u64>,
    /// When the key was last selected (absent: never).
    pub last_used_at_epoch_ms: Option<u64>,
    /// Why a disabled key was refused (absent on every other key).
    pub reason: Option<KeyRefusal>,
    /// Its health.
    pub state: KeyHealth,
    /// When a cooling or parked key is usable again.
    pub until_epoch_ms: Option<u64>,
}

object!(KeyState {
    key_sha256: doc,
    last_limited_at_epoch_ms: opt_u64,
    last_used_at_epoch_ms: opt_u64,
    reason: opt_doc,
    state: doc,
    until_epoch_ms: opt_u64,
});

impl KeyState {
    fn fresh(key: &Sha256Hex) -> Self {
        Self {
            key_sha256: key.clone(),
            last_limited_at_epoch_ms: None,
            last_used_at_epoch_ms: None,
            reason: None,
            state: KeyHealth::Healthy,
            until_epoch_ms: None,
        }
    }

    fn usable(&self) -> bool {
        self.state == KeyHealth::Healthy
    }
}

/// A pool's state. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPoolSnapshot {
    /// The configuration the states were recorded under.
    pub config_sha256: Sha256Hex,
    /// Raised by every change.
    pub generation: u64,
    /// One state per key of the configuration, in its order.
    pub keys: Vec<KeyState>,
    /// The pool's name.
    pub name: Identifier,
    /// `retryledger.key_pool.v1`.
    pub schema: KeyPoolSchema,
    /// The wall clock of the latest change, Unix ms.
    pub updated_at_epoch_ms: u64,
}

object!(KeyPoolSnapshot {
    config_sha256: doc,
    generation: u64,
    keys: list(MAX_KEYS),
    name: doc,
    schema: doc,
    updated_at_epoch_ms: u64,
});

impl KeyPoolSnapshot {
    /// A pool the store holds nothing for: every key healthy, never used.
    pub fn fresh(cfg: &KeyPoolConfig) -> Self {
        Self {
            config_sha256: cfg.sha256(),
            generation: 0,
            keys: cfg
                .keys
                .iter()
                .map(|k| KeyState::fresh(&k.key_sha256))
                .collect(),
            name: cfg.name.clone(),
            schema: KeyPoolSchema,
            updated_at_epoch_ms: 0,
        }
    }

    /// Check the snapshot against its pool's configuration; `at` is its
    /// JSON Pointer.
    pub fn check(&self, cfg: &KeyPoolConfig, at: &str) -> Result<()> {
        if self.name != cfg.name {
            return Err(Error::at(
                ErrorCode::SnapshotKeyMismatch,
                format!("{at}/name"),
                format!(
                    "the snapshot is of pool `{}`, not of `{}`",
                    self.name.as_str(),
                    cfg.name.as_str()
                ),
            ));
        }
        // Under the same configuration the states are its keys, in order
        // (under another, they are lined up with it when read).
        let same = self.config_sha256 == cfg.sha256();
        if same
            && (self.keys.len() != cfg.keys.len()
                || self
                    .keys
                    .iter()
                    .zip(&cfg.keys)
                    .any(|(s, k)| s.key_sha256 != k.key_sha256))
        {
            return Err(Error::at(
                ErrorCode::InvalidSnapshot,
                format!("{at}/keys"),
                "the snapshot's keys are not its configuration's keys in order",
            ));
        }
        for (i, k) in self.keys.iter().enumerate() {
            let here = |f: &str| format!("{at}/keys/{i}/{f}");
            if self
                .keys
                .iter()
                .take(i)
                .any(|o| o.key_sha256 == k.key_sha256)
            {
                return Err(Error::at(
                    ErrorCode::InvalidSnapshot,
                    here("key_sha256"),
                    "a key's state appears twice",
                ));
            }
            let holds = matches!(k.state, KeyHealth::Cooling | KeyHealth::Parked);
            let may_hold = holds || k.state == KeyHealth::Disabled;
            if (holds && k.until_epoch_ms.is_none()) || (!may_hold && k.until_epoch_ms.is_some()) {
                return Err(Error::at(
                    ErrorCode::InvalidSnapshot,
                    here("until_epoch_ms"),
                    "until_epoch_ms is given for a cooling or parked key (and may be for a disabled one), and only for those",
                ));
            }
            if k.reason.is_some() && k.state != KeyHealth::Disabled {
                return Err(Error::at(
                    ErrorCode::InvalidSnapshot,
                    here("reason"),
                    "only a disabled key records why it was refused",
                ));
            }
        }
        Ok(())
    }
}

/// Which key an attempt uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Use this key.
    Key {
        /// The key.
        key_sha256: Sha256Hex,
        /// With an affinity: whether the session kept its key or moved.
        affinity: Option<Affinity>,
    },
    /// No key is usable now; the first one that cools or unparks is usable
    /// at this time.
    Wait {
        /// Unix ms.
        until_epoch_ms: u64,
    },
    /// Every key is disabled: nothing clears by waiting.
    NoUsableKey,
}

/// What became of a session's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// The session's key was usable and is kept.
    Kept,
    /// The session's key was not usable: another was taken.
    Moved,
}

names!(Affinity {
    Kept => "kept",
    Moved => "moved",
});

/// `{"affinity"?, "key_sha256", "kind": "key"}`, `{"kind": "wait",
/// "until_epoch_ms"}` or `{"kind": "no_usable_key"}`.
impl Encode for Selection {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut w = ObjectWriter::new(sink);
        match self {
            Self::Key {
                key_sha256,
                affinity,
            } => {
                if let Some(a) = affinity {
                    w.doc("affinity", a);
                }
                w.doc("key_sha256", key_sha256).str("kind", "key");
            }
            Self::Wait { until_epoch_ms } => {
                w.str("kind", "wait").u64("until_epoch_ms", *until_epoch_ms);
            }
            Self::NoUsableKey => {
                w.str("kind", "no_usable_key");
            }
        }
        w.end();
    }
}

/// The snapshot brought to `now` under `cfg`: a changed configuration
/// re-enables disabled keys and lines the states up with its keys (a key
/// kept keeps its state, a new key is fresh, a removed key is forgotten);
/// holds that have run out are lifted.
fn current(cfg: &KeyPoolConfig, snapshot: &KeyPoolSnapshot, now: u64) -> KeyPoolSnapshot {
    let mut next = snapshot.clone();
    let config = cfg.sha256();
    if next.config_sha256 != config {
        next.keys = cfg
            .keys
            .iter()
            .map(|k| {
                let mut s = snapshot
                    .keys
                    .iter()
                    .find(|s| s.key_sha256 == k.key_sha256)
                    .cloned()
                    .unwrap_or_else(|| KeyState::fresh(&k.key_sha256));
                if s.state == KeyHealth::Disabled {
                    s.state = KeyHealth::Healthy;
                    s.reason = None;
                    s.until_epoch_ms = None;
                }
                s
            })
            .collect();
        next.config_sha256 = config;
    }
    for k in &mut next.keys {
        if k.until_epoch_ms.is_some_and(|u| u <= now) {
            k.state = KeyHealth::Healthy;
            k.reason = None;
            k.until_epoch_ms = None;
        }
    }
    next
}

/// Raise the generation when `next` differs from `before`.
fn settled(before: &KeyPoolSnapshot, mut next: KeyPoolSnapshot, now: u64) -> KeyPoolSnapshot {
    if next != *before {
        next.generation = before.generation.saturating_add(1);
        next.updated_at_epoch_ms = now;
    }
    next
}

/// Which key the next attempt uses, and the snapshot to write back (the
/// key's use recorded). `affinity` is the key the session used before.
pub fn select(
    cfg: &KeyPoolConfig,
    snapshot: &KeyPoolSnapshot,
    now_epoch_ms: u64,
    affinity: Option<&Sha256Hex>,
) -> (Selection, KeyPoolSnapshot) {
    select_for_start(cfg, snapshot, now_epoch_ms, now_epoch_ms, affinity)
}

/// [`select`] for an attempt chosen at `now_epoch_ms` that starts at
/// `start_epoch_ms` (after its backoff): a key whose hold ends by the start
/// is usable by it. The snapshot records the use at `now_epoch_ms` and lifts
/// only the holds that have ended by then (a key taken for a later start
/// stays held for every other run until its hold ends).
pub fn select_for_start(
    cfg: &KeyPoolConfig,
    snapshot: &KeyPoolSnapshot,
    now_epoch_ms: u64,
    start_epoch_ms: u64,
    affinity: Option<&Sha256Hex>,
) -> (Selection, KeyPoolSnapshot) {
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    let start = start_epoch_ms.max(now);
    let mut next = current(cfg, snapshot, now);
    let usable = |k: &KeyState| k.usable() || k.until_epoch_ms.is_some_and(|u| u <= start);
    let kept = affinity.and_then(|a| {
        next.keys
            .iter()
            .position(|k| &k.key_sha256 == a && usable(k))
    });
    let chosen = kept.or_else(|| {
        next.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| usable(k))
            .min_by_key(|(i, k)| {
                let limited = k.last_limited_at_epoch_ms.unwrap_or(0);
                (
                    limited.max(k.last_used_at_epoch_ms.unwrap_or(0)),
                    limited,
                    *i,
                )
            })
            .map(|(i, _)| i)
    });
    let selection = match chosen.and_then(|i| next.keys.get_mut(i)) {
        Some(k) => {
            k.last_used_at_epoch_ms = Some(now);
            Selection::Key {
                key_sha256: k.key_sha256.clone(),
                affinity: affinity.map(|_| {
                    if kept.is_some() {
                        Affinity::Kept
                    } else {
                        Affinity::Moved
                    }
                }),
            }
        }
        None => match next.keys.iter().filter_map(|k| k.until_epoch_ms).min() {
            Some(until_epoch_ms) => Selection::Wait { until_epoch_ms },
            None => Selection::NoUsableKey,
        },
    };
    (selection, settled(snapshot, next, now))
}

/// What an attempt's answer says about the key it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySignal {
    /// Nothing about the key (a success, or a failure of something else).
    None,
    /// The provider refused the key itself (HTTP 401 or 403).
    Refused(KeyRefusal),
    /// Rate limited, with the answer's hint (ms) if it gave one.
    Limited(Option<u64>),
    /// A quota that cannot clear within a run.
    QuotaExhausted,
}

impl KeySignal {
    /// The signal of an attempt's outcome and HTTP status (when it had
    /// one): 401 and 403 refuse the key, whatever the outcome's kind.
    pub fn of(outcome: &Outcome, status: Option<u16>) -> Self {
        if let Some(why) = KeyRefusal::of_status(status) {
            return Self::Refused(why);
        }
        match outcome {
            Outcome::Retryable {
                kind: RetryableKind::RateLimited,
                retry_after_ms,
                ..
            } => Self::Limited(*retry_after_ms),
            Outcome::NonRetryable {
                kind: NonRetryableKind::QuotaExhausted,
            } => Self::QuotaExhausted,
            _ => Self::None,
        }
    }
}

/// The snapshot after `key` answered with `signal`; a key the pool does
/// not hold is `key_not_in_pool`.
pub fn record(
    cfg: &KeyPoolConfig,
    snapshot: &KeyPoolSnapshot,
    key: &Sha256Hex,
    signal: KeySignal,
    now_epoch_ms: u64,
) -> Result<KeyPoolSnapshot> {
    if !cfg.keys.iter().any(|k| &k.key_sha256 == key) {
        return Err(Error::at(
            ErrorCode::KeyNotInPool,
            "/key_sha256",
            format!(
                "key {} is not one of pool `{}`'s keys",
                key.as_str(),
                cfg.name.as_str()
            ),
        ));
    }
    let now = now_epoch_ms.max(snapshot.updated_at_epoch_ms);
    let mut next = current(cfg, snapshot, now);
    let hold = match signal {
        KeySignal::None => None,
        KeySignal::Refused(why) => {
            let until = cfg.disable_ms.map(|ms| now.saturating_add(ms));
            for k in next.keys.iter_mut().filter(|k| &k.key_sha256 == key) {
                k.state = KeyHealth::Disabled;
                k.reason = Some(why);
                k.until_epoch_ms = until;
            }
            None
        }
        KeySignal::Limited(hint) => Some((
            KeyHealth::Cooling,
            now.saturating_add(hint.unwrap_or(cfg.cool_ms)),
        )),
        KeySignal::QuotaExhausted => Some((KeyHealth::Parked, now.saturating_add(cfg.park_ms))),
    };
    if let Some((state, until)) = hold {
        let account = cfg.account_of(key);
        for k in &mut next.keys {
            let shares = &k.key_sha256 == key
                || (account.is_some() && cfg.account_of(&k.key_sha256) == account);
            if !shares || k.state == KeyHealth::Disabled {
                continue;
            }
            k.last_limited_at_epoch_ms = Some(now);
            // A longer hold already in place stays (a parked key is not
            // shortened by a cooling peer).
            if k.until_epoch_ms.is_some_and(|u| u >= until) {
                continue;
            }
            k.state = state;
            k.until_epoch_ms = Some(until);
        }
    }
    Ok(settled(snapshot, next, now))
}

#[cfg(test)]
mod tests;
