//! The policy document and its validation before any dispatch.
//!
//! A policy binds one logical request (its digest, idempotency key digest,
//! capability requirements and behavior class) to an ordered list of routes
//! and the run's budgets. [`compile`] checks every rule and returns a
//! [`CompiledPolicy`] carrying the digests, so a host validates once and
//! reuses it for every plan and evaluation of the run.

use serde_json::Value;

use crate::canonical::{digest_of, Encode, ObjectWriter, Sink};
use crate::capability::Capabilities;
use crate::decode::{decode_tag, names, object, pick, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::fleet::FleetConfig;
use crate::ids::{schema_marker, Identifier, Set, Sha256Hex};
use crate::limits::{MAX_ATTEMPTS, MAX_ROUTES};
use crate::stream::StreamContract;

schema_marker!(
    /// `retryledger.policy.v1`
    PolicySchema = "retryledger.policy.v1"
);

/// Who owns retries for this request. Only `harness` is accepted; the others
/// decode so that a policy cannot erase the distinction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOwner {
    /// This harness observes and decides every attempt.
    Harness,
    /// A provider adapter retries on its own.
    Adapter,
    /// The transport SDK retries on its own.
    TransportSdk,
}

/// Where request data may go, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DataBoundary {
    /// Stays in this process.
    LocalProcess,
    /// A service operated by the same organization.
    PrivateService,
    /// An external provider.
    ExternalProvider,
}

/// Capped exponential backoff with a bounded Retry-After floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after a route's first failed attempt, in ms (doubles per attempt).
    pub base_ms: u64,
    /// Cap on the exponential term, in ms.
    pub max_ms: u64,
    /// Cap on a server's Retry-After hint, in ms.
    pub retry_after_cap_ms: u64,
    /// What a hint above the cap does; absent is `clamp`.
    pub retry_after_over_cap: Option<OverCap>,
    /// What an account quota that cannot clear within the run
    /// (`quota_exhausted`) does; absent is `stop`.
    pub quota_exhausted: Option<QuotaExhausted>,
}

/// What a `quota_exhausted` answer does: the route's account cannot serve
/// the request within the run, but another provider's route may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaExhausted {
    /// Stop `stop_non_retryable` (as every non-retryable answer does).
    Stop,
    /// Leave the route: the next route by priority is planned at once
    /// (backoff only); with none left, stop `stop_non_retryable`.
    SkipRoute,
}

names!(QuotaExhausted {
    Stop => "stop",
    SkipRoute => "skip_route",
});

/// What a Retry-After hint above `retry_after_cap_ms` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverCap {
    /// Wait the cap instead (the next attempt may start before the hint).
    Clamp,
    /// Never dispatch to that route before the hint: move on to the next
    /// route by priority at once (backoff only), or stop `stop_retry_after`
    /// when none is left.
    SkipRoute,
    /// Stop `stop_retry_after`: the server asked for a longer wait than the
    /// policy allows.
    Stop,
}

names!(OverCap {
    Clamp => "clamp",
    SkipRoute => "skip_route",
    Stop => "stop",
});

/// Replayable jitter. The sample is drawn from the seed, the scheduler release
/// and the attempt ordinal, so a replay draws the same value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Jitter {
    /// No jitter: the exponential term is used as is.
    None,
    /// Uniform over `[0, e]` where `e` is the exponential term.
    Full {
        /// Scheduler release bound into every draw.
        scheduler_release: Identifier,
        /// Seed.
        seed: u64,
    },
    /// Uniform over `[e/2, e]`.
    Equal {
        /// Scheduler release bound into every draw.
        scheduler_release: Identifier,
        /// Seed.
        seed: u64,
    },
    /// Uniform over `[base, min(max, 3 * previous sample)]`.
    Decorrelated {
        /// Scheduler release bound into every draw.
        scheduler_release: Identifier,
        /// Seed.
        seed: u64,
    },
}

/// The jitter modes, as the `mode` tag names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JitterMode {
    /// [`Jitter::None`]
    None,
    /// [`Jitter::Full`]
    Full,
    /// [`Jitter::Equal`]
    Equal,
    /// [`Jitter::Decorrelated`]
    Decorrelated,
}

names!(JitterMode {
    None => "none",
    Full => "full",
    Equal => "equal",
    Decorrelated => "decorrelated",
});

impl Jitter {
    /// The mode.
    pub fn mode(&self) -> JitterMode {
        match self {
            Self::None => JitterMode::None,
            Self::Full { .. } => JitterMode::Full,
            Self::Equal { .. } => JitterMode::Equal,
            Self::Decorrelated { .. } => JitterMode::Decorrelated,
        }
    }
}

/// Jitter is an object tagged by `mode`. A bad tag is reported at `mode`;
/// everything else inside the object is reported at the object.
impl Decode for Jitter {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mode = pick(
            JitterMode::ALL,
            decode_tag(v, at, "mode", JitterMode::NAMES)?,
            at,
        )?;
        let mut f = Fields::open(v, at)?.variant("mode");
        if mode == JitterMode::None {
            f.end()?;
            return Ok(Self::None);
        }
        let scheduler_release = f.req("scheduler_release");
        let seed = f.req("seed");
        f.end()?;
        let (Some(scheduler_release), Some(seed)) = (scheduler_release, seed) else {
            return Err(f.incomplete());
        };
        Ok(match mode {
            JitterMode::Equal => Self::Equal {
                scheduler_release,
                seed,
            },
            JitterMode::Decorrelated => Self::Decorrelated {
                scheduler_release,
                seed,
            },
            JitterMode::Full | JitterMode::None => Self::Full {
                scheduler_release,
                seed,
            },
        })
    }
}

impl Encode for Jitter {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut o = ObjectWriter::new(sink);
        o.str("mode", self.mode().as_str());
        match self {
            Self::None => {}
            Self::Full {
                scheduler_release,
                seed,
            }
            | Self::Equal {
                scheduler_release,
                seed,
            }
            | Self::Decorrelated {
                scheduler_release,
                seed,
            } => {
                o.doc("scheduler_release", scheduler_release)
                    .u64("seed", *seed);
            }
        }
        o.end();
    }
}

/// One route: a prevalidated path to a provider release. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The behavior class whose evidence this route carries.
    pub behavior_class_sha256: Sha256Hex,
    /// What the route offers.
    pub capabilities: Capabilities,
    /// Where the route sends request data.
    pub data_boundary: DataBoundary,
    /// The key pool of the fleet section this route's attempts take their
    /// API key from ([`crate::keypool`]); absent, the host's own key.
    pub key_pool: Option<Identifier>,
    /// Attempts allowed on this route, at least 1.
    pub max_attempts: u64,
    /// Order of use: 0 is the primary, then 1, 2, ...
    pub priority: u64,
    /// The provider family whose error table and hint sources apply
    /// ([`crate::provider`]); absent, the v1 status rules.
    pub provider_family: Option<crate::provider::ProviderFamily>,
    /// Worst-case cost of one attempt, reserved before dispatch.
    pub reserve_cost: u64,
    /// Route identity.
    pub route_id: Identifier,
    /// Exact adapter/model/provider release.
    pub route_release_sha256: Sha256Hex,
    /// Whether the receiver honours the idempotency key.
    pub supports_idempotency: bool,
}

/// The policy document. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Degraded behavior classes a fallback may carry; the receipt reports their use.
    pub allowed_degraded_behavior_classes: Option<Set<Sha256Hex>>,
    /// The async job section, for a request a provider runs as a job ([`crate::job`]).
    pub async_job: Option<crate::job::AsyncJob>,
    /// Backoff parameters.
    pub backoff: Backoff,
    /// The behavior class the request requires.
    pub behavior_class_sha256: Sha256Hex,
    /// Unit of every cost (e.g. `micro_usd`).
    pub cost_unit: Identifier,
    /// Absolute deadline on the run clock (ms since admission).
    pub deadline_ms: u64,
    /// Fleet protection: circuit breakers and a retry budget shared across runs.
    pub fleet: Option<FleetConfig>,
    /// Hedging: a bounded duplicate after a latency threshold ([`crate::hedge`]).
    pub hedge: Option<crate::hedge::HedgeSection>,
    /// Digest of the idempotency key every attempt carries.
    pub idempotency_key_sha256: Sha256Hex,
    /// Jitter mode.
    pub jitter: Jitter,
    /// Digest of the logical request every attempt carries.
    pub logical_request_sha256: Sha256Hex,
    /// The widest data boundary any route may have.
    pub max_data_boundary: DataBoundary,
    /// Attempts allowed across all routes.
    pub max_total_attempts: u64,
    /// Cost allowed across all attempts.
    pub max_total_cost: u64,
    /// Bounded semantic repair after an `invalid_output` stop
    /// ([`crate::repair`]); absent: no repair.
    pub repair: Option<crate::repair::RepairPolicy>,
    /// The capability contract of the request.
    pub requirements: Capabilities,
    /// The retry owner; must be `harness`.
    pub retry_owner: RetryOwner,
    /// Routes, in any order; priorities decide.
    pub routes: Vec<Route>,
    /// `retryledger.policy.v1`
    pub schema: PolicySchema,
    /// The stream contract, for a streamed request ([`crate::stream`]).
    pub stream: Option<StreamContract>,
}

names!(RetryOwner {
    Harness => "harness",
    Adapter => "adapter",
    TransportSdk => "transport_sdk",
});

names!(DataBoundary {
    LocalProcess => "local_process",
    PrivateService => "private_service",
    ExternalProvider => "external_provider",
});

object!(Backoff {
    base_ms: u64,
    max_ms: u64,
    quota_exhausted: opt_doc,
    retry_after_cap_ms: u64,
    retry_after_over_cap: opt_doc,
});

object!(Route {
    behavior_class_sha256: doc,
    capabilities: doc,
    data_boundary: doc,
    key_pool: opt_doc,
    max_attempts: u64,
    priority: u64,
    provider_family: opt_doc,
    reserve_cost: u64,
    route_id: doc,
    route_release_sha256: doc,
    supports_idempotency: bool,
});

object!(Policy {
    allowed_degraded_behavior_classes: opt_doc,
    async_job: opt_doc,
    backoff: doc,
    behavior_class_sha256: doc,
    cost_unit: doc,
    deadline_ms: u64,
    fleet: opt_doc,
    hedge: opt_doc,
    idempotency_key_sha256: doc,
    jitter: doc,
    logical_request_sha256: doc,
    max_data_boundary: doc,
    max_total_attempts: u64,
    max_total_cost: u64,
    repair: opt_doc,
    requirements: doc,
    retry_owner: doc,
    routes: list(MAX_ROUTES),
    schema: doc,
    stream: opt_doc,
});

/// A validated policy with its digests, ready to plan and evaluate runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    /// The policy as given.
    pub policy: Policy,
    /// Digest of the policy document.
    pub policy_sha256: String,
    /// Digest of the request's capability contract.
    pub capability_contract_sha256: String,
    /// Route indices in priority order.
    pub(crate) by_priority: Vec<usize>,
}

impl CompiledPolicy {
    /// The route at a priority.
    pub fn route_at(&self, priority: usize) -> Option<&Route> {
        self.by_priority
            .get(priority)
            .and_then(|&i| self.policy.routes.get(i))
    }

    /// Routes in priority order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.by_priority
            .iter()
            .filter_map(|&i| self.policy.routes.get(i))
    }

    /// Refuse, before any dispatch, a policy with a route the host has no
    /// client for (`has_client(route_id)` is false): `route_client_missing`
    /// at the first such route's `route_id` (priority order), naming every
    /// route without one.
    pub fn require_clients(&self, has_client: impl Fn(&str) -> bool) -> Result<()> {
        let missing: Vec<(usize, &str)> = self
            .by_priority
            .iter()
            .filter_map(|&i| self.policy.routes.get(i).map(|r| (i, r.route_id.as_str())))
            .filter(|(_, id)| !has_client(id))
            .collect();
        let Some(&(first, _)) = missing.first() else {
            return Ok(());
        };
        let names: Vec<&str> = missing.iter().map(|(_, id)| *id).collect();
        Err(route_err(
            ErrorCode::RouteClientMissing,
            first,
            "route_id",
            format!(
                "no client for route(s) {}: give every route of the policy its client, by route id",
                names.join(", ")
            ),
        ))
    }

    /// Whether a route carries a degraded (not the required) behavior class.
    pub fn is_degraded(&self, route: &Route) -> bool {
        route.behavior_class_sha256 != self.policy.behavior_class_sha256
    }
}

/// A route's `key_pool`: a pool of the fleet section, on a run the machine
/// selects keys for (neither hedged nor an async job, whose polls and
/// hedges would need the submit's key).
fn check_route_pool(p: &Policy, i: usize, name: &Identifier) -> Result<()> {
    let declared = p
        .fleet
        .as_ref()
        .and_then(|f| f.key_pools.as_ref())
        .is_some_and(|pools| pools.get(name).is_some());
    let why = if !declared {
        Some(format!(
            "key pool `{}` is not declared in fleet.key_pools",
            name.as_str()
        ))
    } else if p.hedge.is_some() {
        Some("a hedged run cannot take its keys from a pool yet: drop the hedge section or the key pool".to_owned())
    } else if p.async_job.is_some() {
        Some(
            "an async job's polls use the submit's key: a job cannot take its keys from a pool yet"
                .to_owned(),
        )
    } else {
        None
    };
    match why {
        Some(msg) => Err(route_err(ErrorCode::InvalidKeyPool, i, "key_pool", msg)),
        None => Ok(()),
    }
}

fn route_err(code: ErrorCode, i: usize, field: &str, msg: String) -> Error {
    Error::at(code, format!("/routes/{i}/{field}"), msg)
}

/// Validate a policy and compute its digests. Every rule has its own code.
pub fn compile(policy: Policy) -> Result<CompiledPolicy> {
    let p = &policy;
    if p.retry_owner != RetryOwner::Harness {
        return Err(Error::at(
            ErrorCode::RetryOwnerNotHarness,
            "/retry_owner",
            "retries must be owned by the harness; disable adapter and SDK retries",
        ));
    }
    let limit = MAX_ATTEMPTS as u64;
    if p.max_total_attempts == 0 || p.max_total_attempts > limit {
        return Err(Error::at(
            ErrorCode::BudgetUnbounded,
            "/max_total_attempts",
            format!("max_total_attempts must be in 1..={limit}"),
        ));
    }
    if p.deadline_ms == 0 {
        return Err(Error::at(
            ErrorCode::BudgetUnbounded,
            "/deadline_ms",
            "deadline_ms must be at least 1",
        ));
    }
    if p.backoff.base_ms == 0 || p.backoff.max_ms < p.backoff.base_ms {
        return Err(Error::at(
            ErrorCode::InvalidBackoff,
            "/backoff",
            "backoff needs base_ms >= 1 and max_ms >= base_ms",
        ));
    }
    if let Some(stream) = &p.stream {
        stream.check(p.deadline_ms)?;
    }
    if let Some(job) = &p.async_job {
        job.check(p.deadline_ms, p.stream.is_some())?;
        if p.hedge.is_some() {
            // A job is submitted once and then only polled: nothing to hedge.
            return Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                "/async_job",
                "an async job is submitted once and polled by its id: it is not hedged",
            ));
        }
    }
    if let Some(fleet) = &p.fleet {
        fleet.check()?;
    }
    if let Some(hedge) = &p.hedge {
        hedge.check(p)?;
    }
    if let Some(repair) = &p.repair {
        repair.check()?;
    }
    if p.routes.is_empty() {
        return Err(Error::at(
            ErrorCode::NoRoutes,
            "/routes",
            "a policy needs at least one route",
        ));
    }
    let n = p.routes.len();
    let mut by_priority: Vec<Option<usize>> = vec![None; n];
    for (i, r) in p.routes.iter().enumerate() {
        let slot = usize::try_from(r.priority)
            .ok()
            .and_then(|pr| by_priority.get_mut(pr));
        match slot {
            Some(Some(_)) => {
                return Err(route_err(
                    ErrorCode::DuplicatePriority,
                    i,
                    "priority",
                    format!("priority {} is used twice", r.priority),
                ));
            }
            Some(s) => *s = Some(i),
            None => {
                return Err(route_err(
                    ErrorCode::PriorityNotContiguous,
                    i,
                    "priority",
                    format!(
                        "priorities must be 0..{n} without gaps; found {}",
                        r.priority
                    ),
                ));
            }
        }
        for (j, other) in p.routes.iter().enumerate().take(i) {
            if other.route_id == r.route_id {
                return Err(route_err(
                    ErrorCode::DuplicateRouteId,
                    i,
                    "route_id",
                    format!(
                        "route id `{}` repeats route {j}: give each route its own `route_id`",
                        r.route_id
                    ),
                ));
            }
            if other.route_release_sha256 == r.route_release_sha256 {
                return Err(route_err(
                    ErrorCode::DuplicateRouteRelease,
                    i,
                    "route_release_sha256",
                    format!("release repeats route {j}"),
                ));
            }
        }
        if let Some((field, why)) = r.capabilities.uncovered(&p.requirements) {
            return Err(route_err(
                ErrorCode::CapabilityMissing,
                i,
                &format!("capabilities/{field}"),
                format!("route `{}` {why}", r.route_id),
            ));
        }
        let allowed = r.behavior_class_sha256 == p.behavior_class_sha256
            || p.allowed_degraded_behavior_classes
                .as_ref()
                .is_some_and(|s| s.contains(&r.behavior_class_sha256));
        if !allowed {
            return Err(route_err(
                ErrorCode::BehaviorClassMismatch,
                i,
                "behavior_class_sha256",
                format!("route `{}` carries a behavior class that is neither required nor an allowed degraded class", r.route_id),
            ));
        }
        if r.data_boundary > p.max_data_boundary {
            return Err(route_err(
                ErrorCode::DataBoundaryExceeded,
                i,
                "data_boundary",
                format!(
                    "route `{}` sends data to `{}`, beyond the policy's maximum `{}`: raise `max_data_boundary` to allow it, or route elsewhere",
                    r.route_id,
                    r.data_boundary.as_str(),
                    p.max_data_boundary.as_str()
                ),
            ));
        }
        if !r.supports_idempotency {
            return Err(route_err(
                ErrorCode::IdempotencyUnsupported,
                i,
                "supports_idempotency",
                format!("route `{}` does not honour the idempotency key", r.route_id),
            ));
        }
        if let Some(name) = &r.key_pool {
            check_route_pool(p, i, name)?;
        }
        if r.max_attempts == 0 || r.max_attempts > limit {
            return Err(route_err(
                ErrorCode::RouteAttemptsUnbounded,
                i,
                "max_attempts",
                format!("max_attempts must be in 1..={limit}"),
            ));
        }
    }
    // Every slot is filled: n routes, n distinct priorities, each below n.
    let by_priority: Vec<usize> = by_priority.into_iter().flatten().collect();
    let policy_sha256 = digest_of(&policy);
    let capability_contract_sha256 = digest_of(&policy.requirements);
    Ok(CompiledPolicy {
        policy,
        policy_sha256,
        capability_contract_sha256,
        by_priority,
    })
}
