//! The key pool layer of the run machine: which key of a route's pool an
//! attempt is sent with, and what its answer says about that key.
//!
//! A route that names a pool (`key_pool`, one of the fleet section's
//! `key_pools`) has the pool's register, `key_pool/<name>`, read with the
//! admission and with the settlement, like its breaker. When the session
//! admits the attempt, the pool's snapshot (fresh when the store holds
//! none) goes through [`keypool::select`]: the key chosen rides on the
//! dispatch effect by digest (the host holds the secrets), and the
//! snapshot with the key's use recorded is written back with
//! compare-and-set after the breakers and before the admission limits; the
//! attempt's admission records the key (`admission.key`, its digest). A
//! pool with no usable key now but one that clears before the deadline
//! sleeps until then and admits again (nothing written); one that does
//! not (every key disabled, or the first clears at or after the deadline)
//! ends the run sealed: the fleet stop `no_usable_key` names the pool and
//! the terminal is `stop_no_usable_key`, the attempts before it kept.
//! After the observation the settlement records the answer
//! ([`keypool::record`]: 401/403 disable the key with its reason, a rate
//! limit cools the account's keys until the hint, an exhausted quota parks
//! them) and writes the snapshot back when it changed. A 401 or 403 to a
//! pool key also marks the attempt `key_refused`: the judge goes on with
//! the same route at once, and the next admission takes another key.
//!
//! Within a run the session keeps the key its last attempt used while the
//! key is usable (the options' `key_affinity` before the first). A store
//! that cannot be read under `fail_open` admits from a fresh snapshot with
//! the keys this run saw refused disabled in it (the judge never lets a run
//! send a refused key again) and writes nothing (the attempt records the
//! unavailable store); a write that keeps conflicting is `store_conflict`,
//! as for every register.

use crate::error::Result;
use crate::ids::Identifier;
use crate::ids::Sha256Hex;
use crate::keypool::{
    self, KeyChoice, KeyPoolConfig, KeyPoolSnapshot, KeyRef, KeyRefusal, KeySignal, Selection,
};
use crate::outcome::Outcome;
use crate::policy::CompiledPolicy;

use super::fleet::Reads;

/// What the layer keeps across a run.
#[derive(Debug, Clone, Default)]
pub(super) struct Layer {
    /// The key a session used before this run.
    affinity: Option<Sha256Hex>,
    /// The key of the admitted attempt, for its dispatch.
    chosen: Option<KeyChoice>,
    /// The key the last attempt was sent with, for its settlement.
    sent: Option<KeyChoice>,
}

/// The pool step of an admission.
#[derive(Debug)]
pub(super) enum Pick {
    /// The route takes no key from a pool.
    None,
    /// Send with this key; write this snapshot back (none when the store
    /// was unavailable).
    Key(KeyRef, Option<KeyPoolSnapshot>),
    /// No key is usable before this time (Unix ms).
    Wait(u64),
    /// Every key of this pool is disabled: nothing clears by waiting.
    NoKey(Identifier),
}

/// The pool `release`'s route names.
fn pool_of<'a>(cp: &'a CompiledPolicy, release: &Sha256Hex) -> Option<&'a KeyPoolConfig> {
    let name = cp
        .routes()
        .find(|r| &r.route_release_sha256 == release)?
        .key_pool
        .as_ref()?;
    cp.policy.fleet.as_ref()?.key_pools.as_ref()?.get(name)
}

/// The pool's snapshot as read, checked against its configuration (a fresh
/// one when the store holds none).
fn read(cfg: &KeyPoolConfig, reads: &Reads) -> Result<KeyPoolSnapshot> {
    match reads.pool(&cfg.name) {
        Some(s) => {
            s.check(cfg, "/rows")?;
            Ok(s.clone())
        }
        None => Ok(KeyPoolSnapshot::fresh(cfg)),
    }
}

impl Layer {
    pub(super) fn new(affinity: Option<Sha256Hex>) -> Self {
        Self {
            affinity,
            chosen: None,
            sent: None,
        }
    }

    /// Select the key of the admitted attempt on `release`, chosen at
    /// `now_epoch_ms` for its start at `start_epoch_ms` (after its backoff:
    /// a key whose hold ends by then is usable by it).
    pub(super) fn select(
        &mut self,
        cp: &CompiledPolicy,
        release: &Sha256Hex,
        reads: &Reads,
        (now_epoch_ms, start_epoch_ms): (u64, u64),
        (unavailable, refused): (bool, &[(KeyRef, KeyRefusal)]),
    ) -> Result<Pick> {
        self.chosen = None;
        let Some(cfg) = pool_of(cp, release) else {
            return Ok(Pick::None);
        };
        let snapshot = if unavailable {
            let mut fresh = KeyPoolSnapshot::fresh(cfg);
            for (key, why) in refused.iter().filter(|(k, _)| k.pool == cfg.name) {
                let signal = KeySignal::Refused(*why);
                fresh = keypool::record(cfg, &fresh, &key.key_sha256, signal, now_epoch_ms)?;
            }
            fresh
        } else {
            read(cfg, reads)?
        };
        let affinity = match &self.sent {
            Some(k) if k.pool == cfg.name => Some(&k.key_sha256),
            _ => self.affinity.as_ref(),
        };
        let (selection, next) =
            keypool::select_for_start(cfg, &snapshot, now_epoch_ms, start_epoch_ms, affinity);
        match selection {
            Selection::Key {
                key_sha256,
                affinity,
            } => {
                let key = KeyRef {
                    key_sha256: key_sha256.clone(),
                    pool: cfg.name.clone(),
                };
                self.chosen = Some(KeyChoice {
                    affinity,
                    key_sha256,
                    pool: cfg.name.clone(),
                });
                let write = (!unavailable && next != snapshot).then_some(next);
                Ok(Pick::Key(key, write))
            }
            Selection::Wait { until_epoch_ms } => Ok(Pick::Wait(until_epoch_ms)),
            Selection::NoUsableKey => Ok(Pick::NoKey(cfg.name.clone())),
        }
    }

    /// The key to send the admitted attempt with; it is then the key the
    /// attempt's settlement records.
    pub(super) fn send(&mut self) -> Option<KeyChoice> {
        let key = self.chosen.take();
        self.sent.clone_from(&key);
        key
    }

    /// The pool snapshot after the last attempt's answer, when it changed.
    pub(super) fn record(
        &self,
        cp: &CompiledPolicy,
        reads: &Reads,
        outcome: &Outcome,
        status: Option<u64>,
        now_epoch_ms: u64,
    ) -> Result<Option<KeyPoolSnapshot>> {
        let Some(sent) = &self.sent else {
            return Ok(None);
        };
        let pools = cp.policy.fleet.as_ref().and_then(|f| f.key_pools.as_ref());
        let Some(cfg) = pools.and_then(|p| p.get(&sent.pool)) else {
            return Ok(None);
        };
        let snapshot = read(cfg, reads)?;
        let status = status.and_then(|s| u16::try_from(s).ok());
        let signal = KeySignal::of(outcome, status);
        let next = keypool::record(cfg, &snapshot, &sent.key_sha256, signal, now_epoch_ms)?;
        Ok((next != snapshot).then_some(next))
    }
}

/// The pool `release`'s route names, for an error.
pub(super) fn pool_named<'a>(
    cp: &'a CompiledPolicy,
    release: &Sha256Hex,
) -> Option<&'a KeyPoolConfig> {
    pool_of(cp, release)
}
