//! The documented bounds on every input. Anything beyond them is a coded error.

/// Largest JSON input accepted by any decoder, in bytes (2 MiB).
pub const MAX_INPUT_BYTES: usize = 2 * 1024 * 1024;
/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 32;
/// Largest integer a document may hold: 2^53 - 1, exact in JavaScript.
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;
/// Longest identifier (route id, scheduler release, region, ...), in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// Most routes in a policy.
pub const MAX_ROUTES: usize = 64;
/// Most attempts in a run; also the upper bound on any attempt budget.
pub const MAX_ATTEMPTS: usize = 10_000;
/// Most items in any set-valued capability field.
pub const MAX_SET_ITEMS: usize = 64;
/// Longest Retry-After header value accepted, in bytes.
pub const MAX_RETRY_AFTER_BYTES: usize = 64;
/// Most headers `classify_http` looks at.
pub const MAX_HEADERS: usize = 256;
/// Most error class names or error codes a host passes for one attempt.
pub const MAX_ERROR_NAMES: usize = 32;
/// Longest error class name or error code, in bytes.
pub const MAX_ERROR_NAME_BYTES: usize = 256;
/// Most events in one run's stream event log.
pub const MAX_STREAM_EVENTS: usize = 100_000;
/// Largest `max_response_bytes` a stream contract may set (256 MiB).
pub const MAX_STREAM_RESPONSE_BYTES: u64 = 256 * 1024 * 1024;
/// Largest bundle text accepted, in bytes (32 MiB): a bundle may carry a
/// stream event log of up to [`MAX_STREAM_EVENTS`] events.
pub const MAX_BUNDLE_BYTES: usize = 32 * 1024 * 1024;
