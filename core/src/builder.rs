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
use crate::limits::{MAX_ROUTES, MAX_SAFE_INTEGER};
use crate::policy::{
    compile, Backoff, CompiledPolicy, DataBoundary, Jitter, Policy, PolicySchema, RetryOwner, Route,
};
use crate::preset::Preset;
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
///
/// A route names its release either as a catalog document (`release`) or by
/// `provider`, `model` and `base_url` (with an optional `release_pin`, the
/// model when absent, and `provider_family`, the provider's when it names
/// one). Under a preset every other field has a default
/// ([`crate::preset`]); `price` (per million input and output tokens) stands
/// in for `reserve_cost`, which is then the worst case of the route's
/// context and output bounds.
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

/// A route's prices per million tokens, in the spec's cost unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPrice {
    /// Per million input tokens.
    pub input: u64,
    /// Per million output tokens.
    pub output: u64,
}

object!(TokenPrice {
    input: u64,
    output: u64,
});

/// A route as written, before the preset fills it in.
struct RawRoute {
    base_url: Option<Identifier>,
    behavior_class: Option<BehaviorClass>,
    capabilities: Option<Capabilities>,
    data_boundary: Option<DataBoundary>,
    max_attempts: Option<u64>,
    model: Option<Identifier>,
    price: Option<TokenPrice>,
    provider: Option<Identifier>,
    provider_family: Option<crate::provider::ProviderFamily>,
    release: Option<RouteRelease>,
    release_pin: Option<Identifier>,
    reserve_cost: Option<u64>,
    route_id: Option<Identifier>,
    supports_idempotency: Option<bool>,
}

impl Decode for RawRoute {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let mut f = Fields::open(v, at)?;
        let r = Self {
            base_url: f.opt("base_url"),
            behavior_class: f.opt("behavior_class"),
            capabilities: f.opt("capabilities"),
            data_boundary: f.opt("data_boundary"),
            max_attempts: f.opt("max_attempts"),
            model: f.opt("model"),
            price: f.opt("price"),
            provider: f.opt("provider"),
            provider_family: f.opt("provider_family"),
            release: f.opt("release"),
            release_pin: f.opt("release_pin"),
            reserve_cost: f.opt("reserve_cost"),
            route_id: f.opt("route_id"),
            supports_idempotency: f.opt("supports_idempotency"),
        };
        f.end()?;
        Ok(r)
    }
}

/// A field a spec without a preset must give.
fn need<T>(v: Option<T>, name: &str, at: &At<'_>, preset: Option<Preset>) -> Result<T> {
    v.ok_or_else(|| {
        let hint = if preset.is_none() {
            " (or name a `preset`: `interactive` or `batch`)"
        } else {
            ""
        };
        at.error(
            ErrorCode::MissingField,
            format!("missing field `{name}`{hint}"),
        )
    })
}

/// `ceil(tokens * price / 1_000_000)`, checked.
fn token_cost(tokens: u64, price: u64) -> Option<u64> {
    let product = u128::from(tokens).checked_mul(u128::from(price))?;
    u64::try_from(product.div_ceil(1_000_000)).ok()
}

/// A preset's own identifier (always valid; checked all the same).
fn known(s: &str, at: &At<'_>) -> Result<Identifier> {
    id_of(s, at)
}

fn id_of(s: &str, at: &At<'_>) -> Result<Identifier> {
    Identifier::parse(s).map_err(|(c, m)| at.error(c, m))
}

impl RawRoute {
    fn resolve(self, at: &At<'_>, preset: Option<Preset>) -> Result<RouteSpec> {
        let short = self.base_url.is_some()
            || self.model.is_some()
            || self.provider.is_some()
            || self.provider_family.is_some()
            || self.release_pin.is_some();
        let release = match (self.release, short) {
            (Some(_), true) => return Err(at.error(
                ErrorCode::InvalidValue,
                "a route names its release once: `release`, or `provider`, `model` and `base_url`",
            )),
            (Some(release), false) => release,
            (None, _) if !short && preset.is_none() => {
                return Err(at.error(
                    ErrorCode::MissingField,
                    "missing field `release` (or `provider`, `model` and `base_url`)",
                ))
            }
            (None, _) => {
                let endpoint = need(self.base_url, "base_url", at, Some(Preset::Interactive))?;
                let model = need(self.model, "model", at, Some(Preset::Interactive))?;
                let provider = need(self.provider, "provider", at, Some(Preset::Interactive))?;
                let provider_family = self.provider_family.or_else(|| {
                    crate::provider::ProviderFamily::ALL
                        .iter()
                        .copied()
                        .find(|f| f.as_str() == provider.as_str())
                });
                RouteRelease {
                    endpoint,
                    lowering: None,
                    release_pin: self.release_pin.unwrap_or_else(|| model.clone()),
                    model,
                    provider,
                    provider_family,
                    schema: RouteReleaseSchema,
                }
            }
        };
        let capabilities = match (self.capabilities, preset) {
            (Some(c), _) => c,
            (None, Some(_)) => crate::preset::text_chat(),
            (None, None) => need(None, "capabilities", at, None)?,
        };
        let data_boundary = match preset {
            Some(_) => self.data_boundary.unwrap_or(crate::preset::DATA_BOUNDARY),
            None => need(self.data_boundary, "data_boundary", at, None)?,
        };
        let max_attempts = match preset {
            Some(p) => self.max_attempts.unwrap_or(p.route_attempts()),
            None => need(self.max_attempts, "max_attempts", at, None)?,
        };
        let reserve_cost = match (self.reserve_cost, self.price) {
            (Some(_), Some(_)) => {
                return Err(At::Key(at, "price").error(
                    ErrorCode::InvalidValue,
                    "give `price` or `reserve_cost`, not both",
                ))
            }
            (Some(cost), None) => cost,
            (None, Some(price)) => token_cost(capabilities.max_context_tokens, price.input)
                .zip(token_cost(capabilities.max_output_tokens, price.output))
                .and_then(|(a, b)| a.checked_add(b))
                .filter(|c| *c <= MAX_SAFE_INTEGER)
                .ok_or_else(|| {
                    At::Key(at, "price").error(
                        ErrorCode::IntegerOutOfRange,
                        "the worst-case cost of an attempt at this price is out of range",
                    )
                })?,
            (None, None) => {
                return Err(at.error(
                    ErrorCode::MissingField,
                    "missing field `reserve_cost` (or `price`: the cost unit per million input and output tokens)",
                ))
            }
        };
        let route_id = match (self.route_id, preset) {
            (Some(id), _) => id,
            (None, Some(_)) => id_of(
                &format!("{}/{}", release.provider.as_str(), release.model.as_str()),
                &At::Key(at, "route_id"),
            )?,
            (None, None) => need(None, "route_id", at, None)?,
        };
        let supports_idempotency = match preset {
            Some(_) => self.supports_idempotency.unwrap_or(true),
            None => need(self.supports_idempotency, "supports_idempotency", at, None)?,
        };
        Ok(RouteSpec {
            behavior_class: self.behavior_class,
            capabilities,
            data_boundary,
            max_attempts,
            release,
            reserve_cost,
            route_id,
            supports_idempotency,
        })
    }
}

/// A policy spec: a policy with catalog documents in place of digests.
///
/// With a `preset` every field but `routes` (and, for [`build_policy`],
/// `idempotency_key_sha256`) may be left out; the defaults are those of
/// [`crate::preset`], written into the built policy.
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
    /// The idempotency key's digest (bare or scoped; never the raw key);
    /// absent in a template's spec, which binds it per call.
    pub idempotency_key_sha256: Option<Sha256Hex>,
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
        let backoff = f.opt("backoff");
        let behavior_class = f.opt("behavior_class");
        let cost_unit = f.opt("cost_unit");
        let deadline_ms = f.opt("deadline_ms");
        let fleet = f.opt("fleet");
        let idempotency_key_sha256 = f.opt("idempotency_key_sha256");
        let jitter = f.opt("jitter");
        let max_data_boundary = f.opt("max_data_boundary");
        let max_total_attempts = f.opt("max_total_attempts");
        let max_total_cost = f.opt("max_total_cost");
        let preset: Option<Preset> = f.opt("preset");
        let provider_bound_parts = f.opt("provider_bound_parts");
        let requirements = f.opt("requirements");
        let routes = f.req_with("routes", |v, at| {
            let raw: Vec<RawRoute> = decode_list(v, at, MAX_ROUTES)?;
            Ok(raw)
        });
        let schema: Option<PolicySpecSchema> = f.req("schema");
        let stream = f.opt("stream");
        f.end()?;
        let (Some(raw_routes), Some(_)) = (routes, schema) else {
            return Err(f.incomplete());
        };
        let backoff = match preset {
            Some(p) => backoff.unwrap_or_else(|| p.backoff()),
            None => need(backoff, "backoff", at, None)?,
        };
        let behavior_class = match preset {
            Some(_) => match behavior_class {
                Some(c) => c,
                None => BehaviorClass {
                    name: known(crate::preset::BEHAVIOR_CLASS, at)?,
                    schema: BehaviorClassSchema,
                },
            },
            None => need(behavior_class, "behavior_class", at, None)?,
        };
        let cost_unit = match preset {
            Some(_) => match cost_unit {
                Some(u) => u,
                None => known(crate::preset::COST_UNIT, at)?,
            },
            None => need(cost_unit, "cost_unit", at, None)?,
        };
        let deadline_ms = match preset {
            Some(p) => deadline_ms.unwrap_or(p.deadline_ms()),
            None => need(deadline_ms, "deadline_ms", at, None)?,
        };
        let max_data_boundary = match preset {
            Some(_) => max_data_boundary.unwrap_or(crate::preset::DATA_BOUNDARY),
            None => need(max_data_boundary, "max_data_boundary", at, None)?,
        };
        if preset.is_none() {
            need(max_total_attempts, "max_total_attempts", at, None)?;
            need(max_total_cost, "max_total_cost", at, None)?;
        }
        let requirements = match preset {
            Some(_) => requirements.unwrap_or_else(crate::preset::text_chat),
            None => need(requirements, "requirements", at, None)?,
        };
        let routes_at = At::Key(at, "routes");
        let mut routes = Vec::with_capacity(raw_routes.len());
        for (i, r) in raw_routes.into_iter().enumerate() {
            routes.push(r.resolve(&At::Index(&routes_at, i), preset)?);
        }
        // Under a preset the budgets default to what the routes allow: every
        // route's attempts, each at its reserve.
        let max_total_attempts = match max_total_attempts {
            Some(n) => n,
            None => routes
                .iter()
                .try_fold(0u64, |n, r| n.checked_add(r.max_attempts))
                .unwrap_or(u64::MAX)
                // A route without attempts is reported as such, not as an empty budget.
                .max(1),
        };
        let max_total_cost = match max_total_cost {
            Some(c) => c,
            None => routes
                .iter()
                .try_fold(0u64, |c, r| {
                    r.reserve_cost
                        .checked_mul(r.max_attempts)
                        .and_then(|x| c.checked_add(x))
                })
                .filter(|c| *c <= MAX_SAFE_INTEGER)
                .ok_or_else(|| {
                    At::Key(at, "max_total_cost").error(
                        ErrorCode::IntegerOutOfRange,
                        "the routes' attempts at their reserves exceed 2^53-1: set max_total_cost",
                    )
                })?,
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
    let Some(key) = spec.idempotency_key_sha256.clone() else {
        return Err(Error::at(
            ErrorCode::MissingField,
            "/idempotency_key_sha256",
            "missing field `idempotency_key_sha256`: build_policy binds one key (a template binds one per call)",
        ));
    };
    spec.routes = crate::lower::capable_routes(request, spec.routes, spec.provider_bound_parts)?;
    compile(assemble(spec, Sha256Hex::computed(request.sha256()), key)?)
}

/// The policy a spec describes, for one request digest and one key digest.
pub(crate) fn assemble(
    spec: PolicySpec,
    logical_request_sha256: Sha256Hex,
    idempotency_key_sha256: Sha256Hex,
) -> Result<Policy> {
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
            key_pool: None,
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
    Ok(Policy {
        allowed_degraded_behavior_classes: allowed,
        async_job: None,
        backoff: spec.backoff,
        behavior_class_sha256: class_sha256(&spec.behavior_class),
        cost_unit: spec.cost_unit,
        deadline_ms: spec.deadline_ms,
        fleet: spec.fleet,
        hedge: None,
        idempotency_key_sha256,
        jitter: spec.jitter.unwrap_or(Jitter::None),
        logical_request_sha256,
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
