//! The fleet layer of the run machine: which registers an admission and a
//! settlement read, the view the core builds from what the store answered,
//! and the compare-and-set writes that follow.
//!
//! A store only holds documents: a register is `get(key) -> (document,
//! generation)` and `compare_and_set(key, expected_generation, document)`.
//! The keys are the core's: `breaker/<release>`, `budget/<scope>`,
//! `admission/<release>[/<tenant>[/<principal>]]` and `key_pool/<name>`
//! (the key pool layer, `machine/keypool.rs`; a host may put them under
//! a namespace of its own). Generations are the store's (0 for a key it does
//! not hold); the machine writes each document expecting the generation it
//! read.

use std::sync::Arc;

use serde_json::Value;

use crate::admission::{key_of, AdmissionSnapshot};
use crate::breaker::BreakerSnapshot;
use crate::budget::RetryBudgetSnapshot;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{FleetConfig, FleetView, FleetWrites};
use crate::ids::{Identifier, Sha256Hex};
use crate::keypool::{pool_key, KeyPoolSnapshot};
use crate::policy::CompiledPolicy;

/// What a register holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Register {
    /// A route release's circuit breaker.
    Breaker(BreakerSnapshot),
    /// A scope's retry budget.
    Budget(RetryBudgetSnapshot),
    /// A route release's admission limits.
    Admission(AdmissionSnapshot),
    /// A key pool's keys and their health.
    KeyPool(KeyPoolSnapshot),
}

impl Encode for Register {
    fn encode(&self, sink: &mut dyn Sink) {
        match self {
            Self::Breaker(s) => s.encode(sink),
            Self::Budget(s) => s.encode(sink),
            Self::Admission(s) => s.encode(sink),
            Self::KeyPool(s) => s.encode(sink),
        }
    }
}

/// One register read: its document (absent when the store holds none) and
/// the store's generation (0 when absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The document as the store holds it.
    pub document: Option<Value>,
    /// The store's generation of the key.
    pub generation: u64,
}

/// One compare-and-set the machine asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cas {
    /// The register's key.
    pub key: String,
    /// The generation read; the write fails when the store holds another.
    pub expected_generation: u64,
    /// The document to write.
    pub document: Register,
}

/// `{"document": …, "expected_generation": …, "key": …}`.
impl Encode for Cas {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("document", &self.document)
            .u64("expected_generation", self.expected_generation)
            .str("key", &self.key)
            .end();
    }
}

/// The kind of register a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Breaker,
    Budget,
    Admission,
    KeyPool,
}

/// One register a read asks for: its key, what it holds and (for a
/// breaker or admission limits) the route release it belongs to.
#[derive(Debug, Clone)]
struct Key {
    key: String,
    kind: Kind,
    release: Option<Sha256Hex>,
    /// A key pool's name.
    pool: Option<Identifier>,
}

/// The registers one read asks for, in order, and what each holds. The
/// key list is shared: a run builds each list once ([`Keys`]) and every
/// read of it is a reference count.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reads {
    keys: Arc<[Key]>,
    /// What the store answered: each key's generation, once read.
    generations: Vec<u64>,
    /// The key pool snapshots read, by pool name.
    pools: Vec<(Identifier, KeyPoolSnapshot)>,
}

/// The key of a route release's breaker.
pub fn breaker_key(release: &Sha256Hex) -> String {
    format!("breaker/{}", release.as_str())
}

/// The key of a retry budget scope.
pub fn budget_key(scope: &str) -> String {
    format!("budget/{scope}")
}

/// The key of a route release's admission limits under the policy's scope.
pub fn admission_key(cfg: &crate::admission::AdmissionConfig, release: &Sha256Hex) -> String {
    format!(
        "admission/{}",
        key_of(release, cfg.tenant.as_ref(), cfg.principal.as_ref())
    )
}

/// A route release's reads: its settlement's keys, then its admission
/// limits' key alone.
type RouteKeys = (Sha256Hex, Arc<[Key]>, Arc<[Key]>);

/// Every read a run of one policy makes, built once when the run starts:
/// the admission's and, per route release, the settlement's and the
/// release of a held slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    admission: Arc<[Key]>,
    /// Per route release: its settlement's keys, then its admission
    /// limits' key alone.
    routes: Vec<RouteKeys>,
}

impl Keys {
    /// The reads of a run of `cp` (none without a fleet section).
    pub(crate) fn of(cp: &CompiledPolicy) -> Self {
        let Some(fleet) = cp.policy.fleet.as_ref() else {
            return Self::default();
        };
        let mut admission = Vec::new();
        let mut routes = Vec::new();
        let mut pools = Vec::new();
        for r in cp.routes() {
            let release = &r.route_release_sha256;
            let breaker = fleet.breaker.is_some().then(|| Key {
                key: breaker_key(release),
                kind: Kind::Breaker,
                release: Some(release.clone()),
                pool: None,
            });
            let limits = fleet.admission.as_ref().map(|a| Key {
                key: admission_key(a, release),
                kind: Kind::Admission,
                release: Some(release.clone()),
                pool: None,
            });
            let pool = r.key_pool.as_ref().map(|name| Key {
                key: pool_key(name),
                kind: Kind::KeyPool,
                release: None,
                pool: Some(name.clone()),
            });
            let settle: Vec<Key> = breaker
                .iter()
                .chain(limits.iter())
                .chain(pool.iter())
                .cloned()
                .collect();
            if let Some(p) = pool {
                if !pools.iter().any(|o: &Key| o.key == p.key) {
                    pools.push(p);
                }
            }
            admission.extend(breaker);
            let slot: Arc<[Key]> = limits.into_iter().collect();
            routes.push((release.clone(), settle.into(), slot));
        }
        // Breakers first, then the budget, then the admission limits.
        if let Some(b) = &fleet.retry_budget {
            admission.push(Key {
                key: budget_key(b.scope.as_str()),
                kind: Kind::Budget,
                release: None,
                pool: None,
            });
        }
        admission.extend(
            routes
                .iter()
                .flat_map(|(_, _, limits)| limits.iter().cloned()),
        );
        // Then every route's key pool, once each.
        admission.extend(pools);
        Self {
            admission: admission.into(),
            routes,
        }
    }

    /// What an admission reads: every route's breaker, the budget, every
    /// route's admission limits (the plan may move to any route).
    pub(crate) fn admission(&self) -> Reads {
        Reads::of(&self.admission)
    }

    /// What settling an attempt on `release` reads: its breaker and its
    /// admission limits, as the policy has them; with `slot_only`, only
    /// the admission limits (freeing a slot reads nothing else).
    pub(crate) fn settlement(&self, release: &Sha256Hex, slot_only: bool) -> Reads {
        self.routes
            .iter()
            .find(|(r, _, _)| r == release)
            .map(|(_, settle, slot)| Reads::of(if slot_only { slot } else { settle }))
            .unwrap_or_default()
    }
}

impl Reads {
    fn of(keys: &Arc<[Key]>) -> Self {
        Self {
            keys: Arc::clone(keys),
            generations: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// Whether there is nothing to read.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys, in the order the answer's rows follow.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.key.clone()).collect()
    }

    /// The view of what the store answered, `rows` in the order of the
    /// keys; each document decoded as its register's type. The generations
    /// are kept for the writes that follow.
    pub(crate) fn view(
        &mut self,
        rows: &[Row],
        reserve_tokens: Option<u64>,
        tenant: Option<&Identifier>,
    ) -> Result<FleetView> {
        if rows.len() != self.keys.len() {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/rows",
                format!(
                    "{} rows answer a read of {} keys, one row per key in order",
                    rows.len(),
                    self.keys.len()
                ),
            ));
        }
        let mut view = FleetView {
            reserve_tokens,
            tenant: tenant.cloned(),
            ..FleetView::default()
        };
        let mut generations = Vec::with_capacity(rows.len());
        let mut pools = Vec::new();
        for (
            i,
            (
                Key {
                    kind,
                    release,
                    pool,
                    ..
                },
                row,
            ),
        ) in self.keys.iter().zip(rows).enumerate()
        {
            generations.push(row.generation);
            let Some(doc) = &row.document else {
                continue;
            };
            let rows_at = At::Key(&At::Root, "rows");
            let row_at = At::Index(&rows_at, i);
            let at = At::Key(&row_at, "document");
            match (kind, release) {
                (Kind::Breaker, Some(r)) => view
                    .breakers
                    .push((r.clone(), BreakerSnapshot::decode(doc, &at)?)),
                (Kind::Admission, Some(r)) => view
                    .admission
                    .push((r.clone(), AdmissionSnapshot::decode(doc, &at)?)),
                (Kind::Budget, _) => view.budget = Some(RetryBudgetSnapshot::decode(doc, &at)?),
                (Kind::KeyPool, _) => {
                    if let Some(name) = pool {
                        pools.push((name.clone(), KeyPoolSnapshot::decode(doc, &at)?));
                    }
                }
                _ => {}
            }
        }
        self.generations = generations;
        self.pools = pools;
        Ok(view)
    }

    /// The compare-and-set of `document`, expecting the generation read
    /// for its register; a register that was not read is written under
    /// its own key expecting 0.
    fn cas(&self, fleet: &FleetConfig, document: Register) -> Cas {
        let (kind, release, pool) = match &document {
            Register::Breaker(s) => (Kind::Breaker, Some(&s.route_release_sha256), None),
            Register::Budget(_) => (Kind::Budget, None, None),
            Register::Admission(s) => (Kind::Admission, Some(&s.route_release_sha256), None),
            Register::KeyPool(s) => (Kind::KeyPool, None, Some(&s.name)),
        };
        let read = self
            .keys
            .iter()
            .zip(self.generations.iter().chain(std::iter::repeat(&0)))
            .find(|(k, _)| {
                k.kind == kind && k.release.as_ref() == release && k.pool.as_ref() == pool
            });
        let (key, expected_generation) = match read {
            Some((k, generation)) => (k.key.clone(), *generation),
            None => {
                let key = match &document {
                    Register::Breaker(s) => breaker_key(&s.route_release_sha256),
                    Register::Budget(b) => budget_key(b.scope.as_str()),
                    // Admission writes come only with admission limits.
                    Register::Admission(s) => fleet.admission.as_ref().map_or_else(
                        || format!("admission/{}", s.route_release_sha256.as_str()),
                        |cfg| admission_key(cfg, &s.route_release_sha256),
                    ),
                    Register::KeyPool(s) => pool_key(&s.name),
                };
                (key, 0)
            }
        };
        Cas {
            key,
            expected_generation,
            document,
        }
    }

    /// The key pool snapshot read for `name` (none when the store holds
    /// none).
    pub(crate) fn pool(&self, name: &Identifier) -> Option<&KeyPoolSnapshot> {
        self.pools.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// The compare-and-sets of an admission's writes, each expecting the
    /// generation read: the budget first, then breakers, then the
    /// admission limits (a slot taken and then abandoned by a conflict
    /// before it would hold the slot until released).
    pub(crate) fn writes(&self, fleet: &FleetConfig, writes: FleetWrites) -> Vec<Cas> {
        self.writes_with_pool(fleet, writes, None)
    }

    /// [`Reads::writes`] with a key pool's snapshot, written after the
    /// breakers and before the admission limits.
    pub(crate) fn writes_with_pool(
        &self,
        fleet: &FleetConfig,
        writes: FleetWrites,
        pool: Option<KeyPoolSnapshot>,
    ) -> Vec<Cas> {
        let admission = if fleet.admission.is_some() {
            writes.admission
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(writes.breakers.len().saturating_add(admission.len()));
        if let Some(b) = writes.budget {
            out.push(self.cas(fleet, Register::Budget(b)));
        }
        for s in writes.breakers {
            out.push(self.cas(fleet, Register::Breaker(s)));
        }
        if let Some(s) = pool {
            out.push(self.cas(fleet, Register::KeyPool(s)));
        }
        for s in admission {
            out.push(self.cas(fleet, Register::Admission(s)));
        }
        out
    }
}
