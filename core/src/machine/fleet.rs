//! The fleet layer of the run machine: which registers an admission and a
//! settlement read, the view the core builds from what the store answered,
//! and the compare-and-set writes that follow.
//!
//! A store only holds documents: a register is `get(key) -> (document,
//! generation)` and `compare_and_set(key, expected_generation, document)`.
//! The keys are the core's: `breaker/<release>`, `budget/<scope>` and
//! `admission/<release>[/<tenant>[/<principal>]]` (a host may put them under
//! a namespace of its own). Generations are the store's (0 for a key it does
//! not hold); the machine writes each document expecting the generation it
//! read.

use serde_json::Value;

use crate::admission::{key_of, AdmissionSnapshot};
use crate::breaker::BreakerSnapshot;
use crate::budget::RetryBudgetSnapshot;
use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::{At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::{FleetConfig, FleetView, FleetWrites};
use crate::ids::Sha256Hex;
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
}

impl Encode for Register {
    fn encode(&self, sink: &mut dyn Sink) {
        match self {
            Self::Breaker(s) => s.encode(sink),
            Self::Budget(s) => s.encode(sink),
            Self::Admission(s) => s.encode(sink),
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
}

/// The registers one read asks for, in order, and what each holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reads {
    keys: Vec<(String, Kind, Option<Sha256Hex>)>,
    /// What the store answered: each key's generation, once read.
    generations: Vec<u64>,
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

impl Reads {
    /// What an admission reads: every route's breaker, the budget, every
    /// route's admission limits (the plan may move to any route).
    pub(crate) fn admission(cp: &CompiledPolicy, fleet: &FleetConfig) -> Self {
        let mut keys = Vec::new();
        if fleet.breaker.is_some() {
            for r in cp.routes() {
                let release = r.route_release_sha256.clone();
                keys.push((breaker_key(&release), Kind::Breaker, Some(release)));
            }
        }
        if let Some(b) = &fleet.retry_budget {
            keys.push((budget_key(b.scope.as_str()), Kind::Budget, None));
        }
        if let Some(a) = &fleet.admission {
            for r in cp.routes() {
                let release = r.route_release_sha256.clone();
                keys.push((admission_key(a, &release), Kind::Admission, Some(release)));
            }
        }
        Self {
            keys,
            generations: Vec::new(),
        }
    }

    /// What settling an attempt on `release` reads: its breaker and its
    /// admission limits, as the policy has them.
    pub(crate) fn settlement(fleet: &FleetConfig, release: &Sha256Hex) -> Self {
        let mut keys = Vec::new();
        if fleet.breaker.is_some() {
            keys.push((breaker_key(release), Kind::Breaker, Some(release.clone())));
        }
        if let Some(a) = &fleet.admission {
            keys.push((
                admission_key(a, release),
                Kind::Admission,
                Some(release.clone()),
            ));
        }
        Self {
            keys,
            generations: Vec::new(),
        }
    }

    /// Only the admission limits' keys (freeing a slot reads nothing else).
    pub(crate) fn admission_only(&mut self) {
        self.keys.retain(|(_, kind, _)| *kind == Kind::Admission);
    }

    /// Whether there is nothing to read.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys, in the order the answer's rows follow.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.keys.iter().map(|(k, _, _)| k.clone()).collect()
    }

    /// The view of what the store answered, `rows` in the order of the
    /// keys; each document decoded as its register's type. The generations
    /// are kept for the writes that follow.
    pub(crate) fn view(&mut self, rows: &[Row], reserve_tokens: Option<u64>) -> Result<FleetView> {
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
            ..FleetView::default()
        };
        let mut generations = Vec::with_capacity(rows.len());
        for (i, ((_, kind, release), row)) in self.keys.iter().zip(rows).enumerate() {
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
                _ => {}
            }
        }
        self.generations = generations;
        Ok(view)
    }

    /// The generation read for `key` (0 when it was not read).
    fn generation(&self, key: &str) -> u64 {
        self.keys
            .iter()
            .zip(&self.generations)
            .find(|((k, _, _), _)| k == key)
            .map_or(0, |(_, g)| *g)
    }

    /// The compare-and-sets of an admission's writes, each expecting the
    /// generation read: the budget first, then breakers, then the
    /// admission limits (a slot taken and then abandoned by a conflict
    /// before it would hold the slot until released).
    pub(crate) fn writes(&self, fleet: &FleetConfig, writes: FleetWrites) -> Vec<Cas> {
        let mut out = Vec::new();
        if let Some(b) = writes.budget {
            let key = budget_key(b.scope.as_str());
            out.push(self.cas(key, Register::Budget(b)));
        }
        for s in writes.breakers {
            let key = breaker_key(&s.route_release_sha256);
            out.push(self.cas(key, Register::Breaker(s)));
        }
        if let Some(cfg) = &fleet.admission {
            for s in writes.admission {
                let key = admission_key(cfg, &s.route_release_sha256);
                out.push(self.cas(key, Register::Admission(s)));
            }
        }
        out
    }

    /// One compare-and-set of `key`, expecting the generation read.
    pub(crate) fn cas(&self, key: String, document: Register) -> Cas {
        Cas {
            expected_generation: self.generation(&key),
            key,
            document,
        }
    }
}
