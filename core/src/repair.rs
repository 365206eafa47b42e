//! Bounded semantic repair: what follows an `invalid_output` stop.
//!
//! Invalid output is not a transport retry. A repair is a new logical
//! request (the user's `repair(output, defects)` builds it; its own request
//! digest and idempotency key), with its own retry sequence, under the same
//! deadline and cost budget as the request it repairs, and its own count:
//! the policy's optional `repair` section says how many repairs a request
//! may have (`max_repairs`) and what share of the cost budget they may spend
//! together (`cost_share_percent`). Budgets are never merged: each repair
//! runs under a policy the core derives ([`next_repair`]) from the root
//! policy and the chain so far: the same policy but for the request and key
//! digests, the deadline that is left (`deadline_ms - started_at_ms`, on the
//! root run's clock) and the cost that is left (the smaller of what the
//! whole chain has left and what the repairs' share has left).
//!
//! A chain (`retryledger.repair_chain.v1`) holds the root run's bundle and
//! each repair's bundle with its `parent_request_sha256`, `repair_ordinal`
//! and `started_at_ms`. [`verify_chain`] replays every bundle and rejects a
//! repair beyond the budget (`repair_over_budget`), a repair after a run
//! that did not stop with `invalid_output` (`repair_after_terminal`: a
//! refusal is `policy_denied`, never repaired or sent elsewhere), and a
//! repair whose request is its parent's (`repair_same_request`).

use serde_json::Value;

use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::decode::{decode_list, object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::evaluate::Terminal;
use crate::ids::{schema_marker, Sha256Hex};
use crate::outcome::{NonRetryableKind, Outcome};
use crate::policy::{compile, Policy};
use crate::receipt::{verify_bundle, Bundle, Verdict};

/// The most repairs a policy may allow.
pub const MAX_REPAIRS: u64 = 8;

/// The policy's `repair` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairPolicy {
    /// Percent (0..=100) of `max_total_cost` the repairs may spend together.
    pub cost_share_percent: u64,
    /// Repairs one request may have (1..=[`MAX_REPAIRS`]).
    pub max_repairs: u64,
}

object!(RepairPolicy {
    cost_share_percent: u64,
    max_repairs: u64,
});

impl RepairPolicy {
    /// The section's own rules (checked with the policy).
    pub fn check(&self) -> Result<()> {
        if self.max_repairs == 0 || self.max_repairs > MAX_REPAIRS {
            return Err(Error::at(
                ErrorCode::BudgetUnbounded,
                "/repair/max_repairs",
                format!("max_repairs must be in 1..={MAX_REPAIRS}"),
            ));
        }
        if self.cost_share_percent > 100 {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/repair/cost_share_percent",
                "cost_share_percent is a percent: 0..=100",
            ));
        }
        Ok(())
    }
}

schema_marker!(
    /// `retryledger.repair_chain.v1`
    RepairChainSchema = "retryledger.repair_chain.v1"
);

/// One run of a chain: the root request's, or a repair's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairLink {
    /// The run, sealed.
    pub bundle: Bundle,
    /// The request this one repairs (absent on the root).
    pub parent_request_sha256: Option<Sha256Hex>,
    /// 1 for the first repair, … (absent on the root).
    pub repair_ordinal: Option<u64>,
    /// When the run started, on the root run's clock (0 for the root).
    pub started_at_ms: u64,
}

object!(RepairLink {
    bundle: doc,
    parent_request_sha256: opt_doc,
    repair_ordinal: opt_u64,
    started_at_ms: u64,
});

/// A request and its repairs, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairChain {
    /// The root run, then each repair.
    pub links: Vec<RepairLink>,
    /// `retryledger.repair_chain.v1`
    pub schema: RepairChainSchema,
}

/// Links a chain may hold: the root and at most [`MAX_REPAIRS`] repairs.
const MAX_LINKS: usize = 9;

impl Decode for RepairChain {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = crate::decode::Fields::open(v, at)?;
        let links = f.req_with("links", |v, at| decode_list(v, at, MAX_LINKS));
        let schema = f.req("schema");
        f.end()?;
        let (Some(links), Some(schema)) = (links, schema) else {
            return Err(f.incomplete());
        };
        Ok(Self { links, schema })
    }
}

impl Encode for RepairChain {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.list("links", &self.links);
        o.doc("schema", &self.schema);
        o.end();
    }
}

fn drift(code: ErrorCode, path: &str, message: impl Into<String>) -> Error {
    Error::at(code, path, message)
}

/// Whether a run ended as a repair may follow: stopped non-retryable on
/// an `invalid_output` attempt.
pub fn repairable(bundle: &Bundle) -> bool {
    bundle.receipt.terminal == Terminal::StopNonRetryable
        && bundle.attempts.attempts.last().is_some_and(|a| {
            a.outcome
                == Outcome::NonRetryable {
                    kind: NonRetryableKind::InvalidOutput,
                }
        })
}

/// The raw idempotency key of repair `ordinal` of a request whose root run
/// sent `root_key`: `<root_key>:repair:<ordinal>` (docs/REPAIR.md), so a
/// repair never reuses its parent's key.
pub fn repair_key(root_key: &str, ordinal: u64) -> String {
    format!("{root_key}:repair:{ordinal}")
}

/// What may follow a chain's last run: the ordinal of the repair that may
/// follow (the chain's length) when the last run stopped with invalid
/// output, or `None` when the last run's own end stands. Whether that
/// repair is within the policy's bounds is [`next_repair`]'s answer.
pub fn next_repair_ordinal(links: &[RepairLink]) -> Option<u64> {
    let last = links.last()?;
    repairable(&last.bundle).then(|| u64::try_from(links.len()).unwrap_or(u64::MAX))
}

/// The policy of the next repair of a chain: `links` are the runs so far
/// (the root first), `request_sha256` and `idempotency_key_sha256` the
/// repair's, `started_at_ms` when it starts on the root run's clock. Errors:
/// `repair_not_allowed` (the root policy has no `repair` section),
/// `repair_over_budget` (past `max_repairs`, the deadline, or the repairs'
/// share of the cost budget), `repair_after_terminal` (the last run did not
/// stop with `invalid_output`), `repair_same_request` (the parent's
/// request again), `repair_chain_drift` (a start before the parent ended).
pub fn next_repair(
    links: &[RepairLink],
    request_sha256: &Sha256Hex,
    idempotency_key_sha256: &Sha256Hex,
    started_at_ms: u64,
) -> Result<Policy> {
    let (Some(root), Some(parent)) = (links.first(), links.last()) else {
        return Err(drift(
            ErrorCode::RepairChainDrift,
            "/links",
            "a chain starts with its root run",
        ));
    };
    let root_policy = &root.bundle.policy;
    let Some(section) = root_policy.repair else {
        return Err(drift(
            ErrorCode::RepairNotAllowed,
            "/repair",
            "the policy has no repair section",
        ));
    };
    let ordinal = u64::try_from(links.len()).unwrap_or(u64::MAX);
    if ordinal > section.max_repairs {
        return Err(drift(
            ErrorCode::RepairOverBudget,
            "/repair/max_repairs",
            format!(
                "repair {ordinal} is beyond max_repairs {}",
                section.max_repairs
            ),
        ));
    }
    if !repairable(&parent.bundle) {
        return Err(drift(
            ErrorCode::RepairAfterTerminal,
            "/receipt/terminal",
            format!(
                "the run before ended {} without an invalid_output attempt; only invalid output is repaired",
                parent.bundle.receipt.terminal.as_str()
            ),
        ));
    }
    if request_sha256 == &parent.bundle.policy.logical_request_sha256 {
        return Err(drift(
            ErrorCode::RepairSameRequest,
            "/logical_request_sha256",
            "a repair is a new request: its digest is its parent's",
        ));
    }
    let parent_end = parent
        .started_at_ms
        .checked_add(parent.bundle.receipt.finished_at_ms)
        .ok_or_else(|| {
            drift(
                ErrorCode::ArithmeticOverflow,
                "/started_at_ms",
                "start past 2^64",
            )
        })?;
    if started_at_ms < parent_end {
        return Err(drift(
            ErrorCode::RepairChainDrift,
            "/started_at_ms",
            format!("a repair starting at {started_at_ms} before its parent ended at {parent_end}"),
        ));
    }
    if started_at_ms >= root_policy.deadline_ms {
        return Err(drift(
            ErrorCode::RepairOverBudget,
            "/deadline_ms",
            format!(
                "no time is left for a repair at {started_at_ms} (deadline {})",
                root_policy.deadline_ms
            ),
        ));
    }
    let spent: u64 = links
        .iter()
        .map(|l| l.bundle.receipt.total_cost)
        .fold(0, u64::saturating_add);
    let repairs_spent: u64 = links
        .iter()
        .skip(1)
        .map(|l| l.bundle.receipt.total_cost)
        .fold(0, u64::saturating_add);
    let share = root_policy
        .max_total_cost
        .checked_mul(section.cost_share_percent)
        .map_or(u64::MAX / 100, |c| c / 100);
    let share_left = share.saturating_sub(repairs_spent);
    let left = root_policy.max_total_cost.saturating_sub(spent);
    if share_left == 0 || left == 0 {
        return Err(drift(
            ErrorCode::RepairOverBudget,
            "/repair/cost_share_percent",
            format!("no cost is left for a repair (the repairs' share {share}, spent {repairs_spent}; the budget {}, spent {spent})", root_policy.max_total_cost),
        ));
    }
    let mut policy = root_policy.clone();
    policy.logical_request_sha256 = request_sha256.clone();
    policy.idempotency_key_sha256 = idempotency_key_sha256.clone();
    policy.deadline_ms = root_policy.deadline_ms.saturating_sub(started_at_ms);
    policy.max_total_cost = share_left.min(left);
    compile(policy.clone())?;
    Ok(policy)
}

/// One link of a verified chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSummary {
    /// The link's request.
    pub logical_request_sha256: Sha256Hex,
    /// The request it repairs (absent on the root).
    pub parent_request_sha256: Option<Sha256Hex>,
    /// Its receipt's digest.
    pub receipt_sha256: String,
    /// Its ordinal (absent on the root).
    pub repair_ordinal: Option<u64>,
    /// When it started on the root run's clock.
    pub started_at_ms: u64,
    /// How it ended.
    pub terminal: Terminal,
    /// What it cost.
    pub total_cost: u64,
}

impl Encode for LinkSummary {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.doc("logical_request_sha256", &self.logical_request_sha256);
        o.opt_doc("parent_request_sha256", self.parent_request_sha256.as_ref());
        o.str("receipt_sha256", &self.receipt_sha256);
        o.opt_u64("repair_ordinal", self.repair_ordinal);
        o.u64("started_at_ms", self.started_at_ms);
        o.doc("terminal", &self.terminal);
        o.u64("total_cost", self.total_cost);
        o.end();
    }
}

/// What replaying a chain says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainVerdict {
    /// Every run replays and every repair keeps the rules.
    Verified {
        /// Digest of the chain document.
        chain_sha256: String,
        /// Each run, root first.
        links: Vec<LinkSummary>,
        /// How many repairs.
        repairs: u64,
        /// How the last run ended.
        terminal: Terminal,
        /// What the whole chain cost.
        total_cost: u64,
    },
    /// The first thing wrong.
    Drift {
        /// Stable error code.
        code: String,
        /// The link (0 is the root).
        link_index: usize,
        /// Human-readable explanation.
        message: String,
        /// JSON Pointer into the chain.
        path: String,
    },
}

impl Encode for ChainVerdict {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        match self {
            Self::Verified {
                chain_sha256,
                links,
                repairs,
                terminal,
                total_cost,
            } => {
                o.str("chain_sha256", chain_sha256);
                o.str("kind", "verified");
                o.list("links", links);
                o.u64("repairs", *repairs);
                o.doc("terminal", terminal);
                o.u64("total_cost", *total_cost);
            }
            Self::Drift {
                code,
                link_index,
                message,
                path,
            } => {
                o.str("code", code);
                o.str("kind", "drift");
                o.u64("link_index", u64::try_from(*link_index).unwrap_or(u64::MAX));
                o.str("message", message);
                o.str("path", path);
            }
        }
        o.end();
    }
}

fn at_link(index: usize, e: &Error) -> ChainVerdict {
    ChainVerdict::Drift {
        code: e.code.as_str().to_owned(),
        link_index: index,
        message: e.message.clone(),
        path: format!("/links/{index}{}", e.path.as_deref().unwrap_or("")),
    }
}

/// Replay a chain: every bundle verifies, the root is a root, and each
/// repair is the next one its chain allows, under exactly the policy
/// [`next_repair`] derives. A malformed chain is an error; anything else
/// wrong is the first drift.
pub fn verify_chain(chain: &RepairChain) -> Result<ChainVerdict> {
    let mut summaries = Vec::with_capacity(chain.links.len());
    for (i, link) in chain.links.iter().enumerate() {
        if i == 0 {
            if link.parent_request_sha256.is_some()
                || link.repair_ordinal.is_some()
                || link.started_at_ms != 0
            {
                return Ok(at_link(
                    0,
                    &drift(
                        ErrorCode::RepairChainDrift,
                        "",
                        "the root run has no parent, no repair ordinal and starts at 0",
                    ),
                ));
            }
        } else {
            let parent = chain
                .links
                .get(i.saturating_sub(1))
                .map(|l| &l.bundle.policy.logical_request_sha256);
            let want = u64::try_from(i).unwrap_or(u64::MAX);
            if link.repair_ordinal != Some(want) || link.parent_request_sha256.as_ref() != parent {
                return Ok(at_link(
                    i,
                    &drift(
                        ErrorCode::RepairChainDrift,
                        "/repair_ordinal",
                        format!("repair {want} names the request before it as its parent"),
                    ),
                ));
            }
            let prior = chain.links.get(..i).unwrap_or(&[]);
            let derived = match next_repair(
                prior,
                &link.bundle.policy.logical_request_sha256,
                &link.bundle.policy.idempotency_key_sha256,
                link.started_at_ms,
            ) {
                Ok(p) => p,
                Err(e) => return Ok(at_link(i, &e)),
            };
            if derived != link.bundle.policy {
                return Ok(at_link(i, &drift(
                    ErrorCode::RepairChainDrift,
                    "/bundle/policy",
                    "the repair's policy is not the one its chain derives (request, key, deadline and cost left)",
                )));
            }
        }
        match verify_bundle(&link.bundle)? {
            Verdict::Verified {
                receipt_sha256,
                terminal,
                ..
            } => summaries.push(LinkSummary {
                logical_request_sha256: link.bundle.policy.logical_request_sha256.clone(),
                parent_request_sha256: link.parent_request_sha256.clone(),
                receipt_sha256,
                repair_ordinal: link.repair_ordinal,
                started_at_ms: link.started_at_ms,
                terminal,
                total_cost: link.bundle.receipt.total_cost,
            }),
            Verdict::Drift {
                code,
                message,
                path,
                ..
            } => {
                return Ok(ChainVerdict::Drift {
                    code,
                    link_index: i,
                    message,
                    path: format!("/links/{i}/bundle{path}"),
                })
            }
        }
    }
    let Some(last) = summaries.last() else {
        return Ok(at_link(
            0,
            &drift(
                ErrorCode::RepairChainDrift,
                "",
                "a chain holds its root run",
            ),
        ));
    };
    Ok(ChainVerdict::Verified {
        chain_sha256: digest_of(chain),
        terminal: last.terminal,
        repairs: u64::try_from(summaries.len().saturating_sub(1)).unwrap_or(u64::MAX),
        total_cost: summaries
            .iter()
            .map(|s| s.total_cost)
            .fold(0, u64::saturating_add),
        links: summaries,
    })
}
