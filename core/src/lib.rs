//! # retryledger-core
//!
//! The deterministic control plane for retries and fallback of one logical
//! model or tool request. No I/O, no clock: the host observes, the core decides.
//!
//! 1. [`policy`] — a policy binds the request (its digest, idempotency key
//!    digest, [`capability`] requirements, behavior class, data boundary) to
//!    prioritized routes and budgets. [`policy::compile`] validates every rule
//!    before the first dispatch: the harness owns retries; priorities run
//!    0, 1, 2, …; route ids and releases are unique; each route covers the
//!    capabilities, carries the behavior class (or an allowed degraded one),
//!    stays inside the data boundary and honours idempotency; bounds are finite.
//! 2. [`evaluate::plan_next`] replays the observed [`attempt`]s and says what
//!    to dispatch next and not before when ([`schedule`]: capped exponential
//!    backoff, bounded Retry-After floor, replayable jitter), or the terminal.
//! 3. Each attempt's [`outcome`] is judged in a fixed order: drift is an
//!    error; then deadline, cost, and the outcome class. Before a dispatch:
//!    total attempts, route exhaustion, cost reservation, deadline.
//! 4. [`evaluate::evaluate`] seals a finished run in a [`receipt`]; a bundle
//!    of policy, attempts and receipt replays with [`receipt::verify_bundle`].
//! 5. Every document decodes strictly ([`decode`]) and hashes as SHA-256 over
//!    its RFC 8785 canonical JSON ([`canonical`]).
//!
//! [`http`] reads Retry-After hints and classifies HTTP observations;
//! [`provider`] holds the provider error tables and the hint precedence
//! (bodies, rate-limit resets) for routes that name their provider family;
//! [`observe`] judges what a host saw of one attempt (error class names and
//! codes, status, headers, output delivered, cancellation) by one set of
//! tables, and [`session`] is the state machine both drivers host.
//! [`request`] is the logical request (full RFC 8785, floats included) and
//! scoped idempotency keys, [`lift`] lifts it from an SDK call's parameters,
//! [`builder`] builds a policy from a request and catalog documents, and
//! [`price`] prices usage per route release, and [`stream`] is the stream
//! contract: tentative events, commit or invalidate, exact continuation.
//! [`job`] runs a provider's asynchronous job: submit once, then poll by id.
//! Across runs, [`breaker`] (a circuit breaker per route release) and
//! [`budget`] (a retry budget per scope) are pure transitions over snapshots
//! a store holds, and [`fleet`] admits each attempt under them. [`journal`]
//! makes a run durable (a hash-chained event log, verified against the
//! plan; recovery that reconciles an uncertain dispatch by idempotency key
//! instead of resubmitting it; lease fencing), and [`idempotency`] is the
//! receiver's record per scoped key. [`hedge`] sends a bounded duplicate
//! after a latency threshold: one winner, the losers cancelled or kept late
//! and never adopted, every attempt accounted. [`machine`] is the one
//! sans-I/O loop of a run (effects out, events in) on which the fleet, the
//! journal, streams and output checks are layers. [`lower`] turns a
//! provider-neutral conversation into each route's SDK body (openai chat
//! completions and responses, anthropic messages, google generateContent)
//! and refuses, before any dispatch, a route that cannot serve it. [`api`]
//! is the JSON-text boundary the WebAssembly and Python bindings call.
#![deny(missing_docs)]

pub mod admission;
pub mod api;
pub mod attempt;
pub mod breaker;
pub mod budget;
pub mod builder;
pub mod canonical;
pub mod capability;
pub mod decode;
pub mod error;
pub mod evaluate;
pub mod fleet;
pub mod hedge;
pub mod host;
pub mod http;
mod httpdate;
pub mod idempotency;
pub mod ids;
pub mod job;
pub mod journal;
pub mod keypool;
#[cfg(feature = "lab")]
pub mod lab;
pub mod lift;
pub mod limits;
pub mod lower;
pub mod machine;
pub mod observe;
pub mod outcome;
pub mod output;
mod parse;
pub mod policy;
pub mod preset;
pub mod price;
pub mod provider;
pub mod receipt;
pub mod receiver;
pub mod repair;
pub mod request;
pub mod schedule;
pub mod session;
pub mod stream;
pub mod template;
pub mod tenant_share;

pub use attempt::{Attempt, Attempts};
pub use error::{Error, ErrorCode, ErrorFamily, Result};
pub use evaluate::{evaluate, plan_next, Decision, Dispatch, Terminal};
pub use outcome::Outcome;
pub use policy::{compile, CompiledPolicy, Policy};
pub use receipt::{seal, verify_bundle, Bundle, Receipt, Verdict};
pub use session::Session;

/// Validate a policy; its digest, or the first rule it breaks.
pub fn validate_policy(policy: &Policy) -> Result<String> {
    Ok(compile(policy.clone())?.policy_sha256)
}

/// Digest of any document: lowercase hex SHA-256 of its canonical JSON.
pub fn digest<T: canonical::Encode>(document: &T) -> String {
    canonical::digest_of(document)
}
