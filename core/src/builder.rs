//! Policies built from the call a user makes, every digest computed here.
//!
//! Hand-writing a policy means computing five digests whose meaning is easy
//! to guess wrong. A team instead keeps catalog documents in its repository —
//! a route release (`retryledger.route_release.v1`: provider, endpoint,
//! model, release pin) and a behavior class (`retryledger.behavior_class.v1`)
//! — and writes a policy spec (`retryledger.policy_spec.v1`) that names them
//! in place of their digests, lists routes in priority order and sets the
//! budgets. [`build_policy`] digests the logical request
//! ([`crate::request`]) and every catalog document, assembles the policy and
//! validates it with exactly the codes of [`crate::policy::compile`]. The
//! policy JSON stays the interchange format.

use serde_json::Value;

use crate::canonical::digest_of;
use crate::capability::Capabilities;
use crate::decode::{decode_list, object, At, Decode, Fields};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier, Set, Sha256Hex};
use crate::limits::MAX_ROUTES;
use crate::policy::{
    compile, Backoff, CompiledPolicy, DataBoundary, Jitter, Policy, PolicySchema, RetryOwner, Route,
};
use crate::request::Request;

schema_marker!(
    /// `retryledger.route_release.v1`
    RouteReleaseSchema = "retryledger.route_release.v1"
);

schema_marker!(
    /// `retryledger.behavior_class.v1`
    BehaviorClassSchema = "retryledger.behavior_class.v1"
);

schema_marker!(
    /// `retryledger.policy_spec.v1`
    PolicySpecSchema = "retryledger.policy_spec.v1"
);

/// An exact provider release a route calls. Its digest is the route's
/// `route_release_sha256`. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRelease {
    /// Where requests go (a URL or a service name).
    pub endpoint: Identifier,
    /// The model the provider serves.
    pub model: Identifier,
    /// How a logical request with `messages` is lowered for this release
    /// ([`crate::lower`]): the wire, context window, output ceiling, thinking
    /// budget, whether temperature is taken, what is supported. Absent, the
    /// release is not lowered and keeps its digest.
    pub lowering: Option<crate::lower::LoweringSettings>,
    /// The provider (`openai`, `anthropic`, `google`, …).
    pub provider: Identifier,
    /// The provider family whose error table and hint sources the route's
    /// failures are read by ([`crate::provider`]); the route carries it.
    pub provider_family: Option<crate::provider::ProviderFamily>,
    /// The pinned release (a dated model snapshot, an adapter version).
    pub release_pin: Identifier,
    /// `retryledger.route_release.v1`
    pub schema: RouteReleaseSchema,
}

object!(RouteRelease {
    endpoint: doc,
    lowering: opt_doc,
    model: doc,
    provider: doc,
    provider_family: opt_doc,
    release_pin: doc,
    schema: doc,
});

/// A behavior class: what counts as the same answer. Its digest is a
/// `behavior_class_sha256`. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BehaviorClass {
    /// The class's name, versioned by the team (`chat-general@2`).
    pub name: Identifier,
    /// `retryledger.behavior_class.v1`
    pub schema: BehaviorClassSchema,
}

object!(BehaviorClass {
    name: doc,
    schema: doc,
});

/// One route of a spec; its priority is its place in the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// The behavior class the route carries; the spec's when absent.
    pub behavior_class: Option<BehaviorClass>,
    /// What the route offers.
    pub capabilities: Capabilities,
    /// Where the route sends request data.
    pub data_boundary: DataBoundary,
    /// Attempts allowed on this route.
    pub max_attempts: u64,
    /// The release it calls.
    pub release: RouteRelease,
    /// Worst-case cost of one attempt.
    pub reserve_cost: u64,
    /// Route identity.
    pub route_id: Identifier,
    /// Whether the receiver honours the idempotency key.
    pub supports_idempotency: bool,
}

object!(RouteSpec {
    behavior_class: opt_doc,
    capabilities: doc,
    data_boundary: doc,
    max_attempts: u64,
    release: doc,
    reserve_cost: u64,
    route_id: doc,
    supports_idempotency: bool,
});

/// A policy spec: a policy with catalog documents in place of digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// Degraded classes a fallback may carry.
    pub allowed_degraded_behavior_classes: Option<Vec<BehaviorClass>>,
    /// Backoff parameters.
    pub backoff: Backoff,
    /// The behavior class the request requires.
    pub behavior_class: BehaviorClass,
    /// Unit of every cost.
    pub cost_unit: Identifier,
    /// Deadline on the run clock, ms.
    pub deadline_ms: u64,
    /// The idempotency key's digest (bare or scoped; never the raw key).
    pub idempotency_key_sha256: Sha256Hex,
    /// Jitter; `none` when absent.
    pub jitter: Option<Jitter>,
    /// The widest data boundary any route may have.
    pub max_data_boundary: DataBoundary,
    /// Attempts allowed across all routes.
    pub max_total_attempts: u64,
    /// Cost allowed across all attempts.
    pub max_total_cost: u64,
    /// The request's capability requirements.
    pub requirements: Capabilities,
    /// Routes in priority order: the first is the primary.
    pub routes: Vec<RouteSpec>,
    /// The stream contract, for a streamed request.
    pub stream: Option<crate::stream::StreamContract>,
    /// Fleet protection (breakers, retry budget).
    pub fleet: Option<crate::fleet::FleetConfig>,
    /// What a provider-bound part of the request's history does on a route
    /// whose wire cannot carry it: `refuse` (the route is excluded with
    /// `provider_bound_history`; the default) or `drop`.
    pub provider_bound_parts: Option<crate::lower::BoundParts>,
}

impl Decode for PolicySpec {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let allowed = f.opt_with("allowed_degraded_behavior_classes", |v, at| {
            decode_list::<BehaviorClass>(v, at, crate::limits::MAX_SET_ITEMS)
        });
        let backoff = f.req("backoff");
        let behavior_class = f.req("behavior_class");
        let cost_unit = f.req("cost_unit");
        let deadline_ms = f.req("deadline_ms");
        let fleet = f.opt("fleet");
        let idempotency_key_sha256 = f.req("idempotency_key_sha256");
        let jitter = f.opt("jitter");
        let max_data_boundary = f.req("max_data_boundary");
        let max_total_attempts = f.req("max_total_attempts");
        let max_total_cost = f.req("max_total_cost");
        let provider_bound_parts = f.opt("provider_bound_parts");
        let requirements = f.req("requirements");
        let routes = f.req_with("routes", |v, at| decode_list(v, at, MAX_ROUTES));
        let schema: Option<PolicySpecSchema> = f.req("schema");
        let stream = f.opt("stream");
        f.end()?;
        let (
            Some(backoff),
            Some(behavior_class),
            Some(cost_unit),
            Some(deadline_ms),
            Some(idempotency_key_sha256),
            Some(max_data_boundary),
            Some(max_total_attempts),
            Some(max_total_cost),
            Some(requirements),
            Some(routes),
            Some(_),
        ) = (
            backoff,
            behavior_class,
            cost_unit,
            deadline_ms,
            idempotency_key_sha256,
            max_data_boundary,
            max_total_attempts,
            max_total_cost,
            requirements,
            routes,
            schema,
        )
        else {
            return Err(f.incomplete());
        };
        Ok(Self {
            allowed_degraded_behavior_classes: allowed,
            backoff,
            behavior_class,
            cost_unit,
            deadline_ms,
            idempotency_key_sha256,
            jitter,
            max_data_boundary,
            max_total_attempts,
            max_total_cost,
            requirements,
            routes,
            stream,
            fleet,
            provider_bound_parts,
        })
    }
}

fn class_sha256(c: &BehaviorClass) -> Sha256Hex {
    Sha256Hex::computed(digest_of(c))
}

/// Build and validate the policy for `request` from `spec`: every digest
/// computed, routes prioritized in list order, the policy's own rules checked.
///
/// For a request with `messages`, a route whose release carries lowering
/// settings is first checked against the request ([`crate::lower::exclusions`]):
/// a route that cannot serve it is left out of the policy (never planned),
/// and when none is left the answer is `no_capable_route`.
pub fn build_policy(request: &Request, mut spec: PolicySpec) -> Result<CompiledPolicy> {
    spec.routes = crate::lower::capable_routes(request, spec.routes, spec.provider_bound_parts)?;
    let default_class = spec.behavior_class.clone();
    let routes = spec
        .routes
        .into_iter()
        .zip(0u64..)
        .map(|(r, priority)| Route {
            behavior_class_sha256: class_sha256(
                r.behavior_class.as_ref().unwrap_or(&default_class),
            ),
            capabilities: r.capabilities,
            data_boundary: r.data_boundary,
            max_attempts: r.max_attempts,
            priority,
            provider_family: r.release.provider_family,
            reserve_cost: r.reserve_cost,
            route_id: r.route_id,
            route_release_sha256: Sha256Hex::computed(digest_of(&r.release)),
            supports_idempotency: r.supports_idempotency,
        })
        .collect();
    let allowed = match spec.allowed_degraded_behavior_classes {
        Some(classes) => {
            let mut set: Set<Sha256Hex> = std::iter::empty().collect();
            for (i, c) in classes.iter().enumerate() {
                if !set.insert(class_sha256(c)) {
                    return Err(Error::at(
                        ErrorCode::DuplicateSetItem,
                        format!("/allowed_degraded_behavior_classes/{i}"),
                        "a behavior class is listed twice",
                    ));
                }
            }
            Some(set)
        }
        None => None,
    };
    compile(Policy {
        allowed_degraded_behavior_classes: allowed,
        async_job: None,
        backoff: spec.backoff,
        behavior_class_sha256: class_sha256(&spec.behavior_class),
        cost_unit: spec.cost_unit,
        deadline_ms: spec.deadline_ms,
        fleet: spec.fleet,
        hedge: None,
        idempotency_key_sha256: spec.idempotency_key_sha256,
        jitter: spec.jitter.unwrap_or(Jitter::None),
        logical_request_sha256: Sha256Hex::computed(request.sha256()),
        max_data_boundary: spec.max_data_boundary,
        max_total_attempts: spec.max_total_attempts,
        max_total_cost: spec.max_total_cost,
        repair: None,
        requirements: spec.requirements,
        retry_owner: RetryOwner::Harness,
        routes,
        schema: PolicySchema,
        stream: spec.stream,
    })
}
