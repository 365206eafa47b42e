//! Scenarios: JSON files under `sim/scenarios/`, read strictly.
//!
//! The text goes through the core's strict reader (duplicate keys, floats,
//! `null` and out-of-range integers are refused with the core's codes), then
//! every object is mapped by hand: an unknown field is `unknown_field`, an
//! absent one `missing_field`, a wrong JSON type `invalid_type`, a value out
//! of its range `invalid_value`, each at its JSON Pointer. Nothing panics.

use serde_json::{Map, Value};

use crate::error::{Result, SimError};

/// `retryledger.sim_scenario.v1`
pub const SCENARIO_SCHEMA: &str = "retryledger.sim_scenario.v1";

/// Largest number of logical requests one run may simulate.
pub const MAX_REQUESTS: u64 = 20_000_000;

/// How logical requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Evenly spaced.
    Fixed,
}

/// The arrival process of logical requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrivals {
    /// Poisson or fixed.
    pub process: Process,
    /// Logical requests admitted per second, across every client.
    pub rate_per_s: u64,
}

/// The clients that admit logical requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clients {
    /// How many clients share the arrivals (each has its own jitter seed).
    pub count: u64,
    /// Each logical request's deadline after its admission, ms.
    pub deadline_ms: u64,
    /// A client gives up on one attempt after this long, ms.
    pub attempt_timeout_ms: u64,
}

/// The naive strategy's layers: each retries the layer below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers {
    /// Layers that each retry (workflow, harness, SDK, …).
    pub count: u64,
    /// Tries per call at each layer (1 = no retry).
    pub attempts: u64,
    /// Pause before a layer's retry, ms.
    pub delay_ms: u64,
}

/// The per-client capped exponential backoff of the baselines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientBackoff {
    /// Attempts per logical request, the first included.
    pub max_attempts: u64,
    /// Delay after the first failure, ms; doubles per attempt.
    pub base_ms: u64,
    /// Cap on the delay, ms.
    pub max_ms: u64,
}

/// One failure schedule of a route: a kind over a window of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What fails.
    pub kind: FailureKind,
    /// Window start, ms (inclusive).
    pub from_ms: u64,
    /// Window end, ms (exclusive): the recovery.
    pub until_ms: u64,
}

/// What a failure window does to a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureKind {
    /// Every attempt is refused at once (503), and attempts in service when
    /// the window opens fail at its start.
    Outage,
    /// This share of attempts is refused (503).
    Brownout {
        /// Share refused, per mille.
        failure_permille: u64,
    },
    /// At most this many attempts are served per one-second window; the rest
    /// get 429 with `retry-after-ms` up to the next window.
    RateLimit {
        /// Attempts served per second.
        per_second: u64,
    },
    /// This share of served attempts takes `slow_ms` longer.
    SlowTail {
        /// Share slowed, per mille.
        slow_permille: u64,
        /// Extra latency, ms.
        slow_ms: u64,
    },
}

/// Service latency: `base_ms` plus an exponential tail of mean `tail_mean_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latency {
    /// Minimum service time, ms.
    pub base_ms: u64,
    /// Mean of the exponential part, ms.
    pub tail_mean_ms: u64,
}

/// A route the clients call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// Name in tables and charts.
    pub id: String,
    /// Attempts in service at once; beyond it the route refuses at once (503).
    pub capacity: u64,
    /// How long a refusal (503 or 429) takes to reach the client, ms.
    pub reject_ms: u64,
    /// Service latency.
    pub latency: Latency,
    /// Cost of an attempt the route served (micro-USD), whatever its outcome.
    pub cost: u64,
    /// Failure schedules.
    pub failures: Vec<Failure>,
}

/// The retryledger strategy's policy knobs (the rest of the policy is the
/// replay lab's reference policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSpec {
    /// Attempts allowed on the primary route.
    pub primary_attempts: u64,
    /// Attempts allowed on the fallback route (when the scenario has one).
    pub fallback_attempts: u64,
    /// Attempts allowed across routes.
    pub max_total_attempts: u64,
    /// Backoff base, ms.
    pub base_ms: u64,
    /// Backoff cap, ms.
    pub max_ms: u64,
    /// Cap on a Retry-After hint, ms.
    pub retry_after_cap_ms: u64,
    /// Breaker: open after this many consecutive unhealthy outcomes.
    pub breaker_consecutive_failures: u64,
    /// Breaker: also open when unhealthy outcomes reach this share (per
    /// mille) of a window's outcomes (`failure_ratio_permille`,
    /// `minimum_volume`, `window_ms`), when given.
    pub breaker_failure_ratio: Option<(u64, u64, u64)>,
    /// Breaker: open this long before probing, ms.
    pub breaker_open_ms: u64,
    /// Breaker: probes admitted at once when half-open.
    pub breaker_half_open_probes: u64,
    /// Retry budget: milli-tokens each first attempt deposits.
    pub budget_ratio_permille: u64,
    /// Retry budget: tokens per second whatever the traffic.
    pub budget_floor_per_second: u64,
    /// Retry budget: cap, tokens.
    pub budget_max_tokens: u64,
    /// Retry budget: a retry short of budget waits this long and asks again
    /// (the budget's `wait_ms`) instead of stopping; none: it stops.
    pub budget_wait_ms: Option<u64>,
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// Its name (the file stem).
    pub name: String,
    /// One line about it.
    pub description: String,
    /// The seed of every draw.
    pub seed: u64,
    /// Arrivals happen in `0..duration_ms`; the run goes on until every
    /// logical request has ended.
    pub duration_ms: u64,
    /// Width of a load bucket, ms.
    pub bucket_ms: u64,
    /// Buckets before this are left out of the steady load (warm-up), ms.
    pub warmup_ms: u64,
    /// The recovery spike is the peak bucket this long after recovery, ms.
    pub recovery_window_ms: u64,
    /// Arrivals.
    pub arrivals: Arrivals,
    /// Clients.
    pub clients: Clients,
    /// The naive strategy's layers.
    pub layers: Layers,
    /// The backoff baselines' schedule.
    pub backoff: ClientBackoff,
    /// The primary route, then the fallback (if any).
    pub routes: Vec<RouteSpec>,
    /// The retryledger strategy's policy knobs.
    pub retryledger: LedgerSpec,
    /// The hedged strategy's knobs; the strategy runs only when given.
    pub hedge: Option<HedgeSpec>,
}

/// The hedged strategy: one attempt on the primary and, when it has not
/// answered after `delay_ms`, one hedge (no retry); the first success wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeSpec {
    /// How long the first attempt may go unanswered before the hedge, ms.
    pub delay_ms: u64,
}

impl Scenario {
    /// Logical requests the arrival rate gives over the duration (expected,
    /// for a Poisson process).
    pub fn expected_requests(&self) -> u64 {
        self.arrivals
            .rate_per_s
            .saturating_mul(self.duration_ms)
            .checked_div(1_000)
            .unwrap_or(0)
    }

    /// The primary route's first failure window: the one the figures measure
    /// around (steady load before it, the recovery spike after it).
    pub fn failure_window(&self) -> Option<(u64, u64)> {
        self.routes
            .first()
            .and_then(|r| r.failures.first())
            .map(|f| (f.from_ms, f.until_ms))
    }

    /// The scenario run `times` times back to back: the duration times
    /// `times`, every route's failure windows repeated in each period (the
    /// figures still measure around the first). The same traffic and
    /// concurrency, more logical requests: the throughput benchmark.
    pub fn tiled(&self, times: u64) -> Result<Self> {
        let mut s = self.clone();
        let period = self.duration_ms;
        s.duration_ms = period.checked_mul(times).ok_or_else(|| {
            SimError::new("invalid_value", "/duration_ms", "the tiled run overflows")
        })?;
        for r in &mut s.routes {
            let one = r.failures.clone();
            r.failures = (0..times)
                .flat_map(|k| {
                    let shift = k.saturating_mul(period);
                    one.iter().map(move |f| Failure {
                        kind: f.kind.clone(),
                        from_ms: f.from_ms.saturating_add(shift),
                        until_ms: f.until_ms.saturating_add(shift),
                    })
                })
                .collect();
        }
        check(&s)?;
        Ok(s)
    }

    /// The same scenario with `factor` times the traffic and route capacity
    /// (rate limits included), for the throughput benchmark.
    pub fn scaled(&self, factor: u64) -> Result<Self> {
        let mut s = self.clone();
        let mul = |v: u64, what: &str| {
            v.checked_mul(factor).ok_or_else(|| {
                SimError::new(
                    "invalid_value",
                    "/scale",
                    format!("{what} times {factor} overflows"),
                )
            })
        };
        s.arrivals.rate_per_s = mul(s.arrivals.rate_per_s, "rate_per_s")?;
        for r in &mut s.routes {
            r.capacity = mul(r.capacity, "capacity")?;
            for f in &mut r.failures {
                if let FailureKind::RateLimit { per_second } = &mut f.kind {
                    *per_second = mul(*per_second, "per_second")?;
                }
            }
        }
        s.retryledger.budget_max_tokens = mul(s.retryledger.budget_max_tokens, "max_tokens")?
            .min(retryledger_core::budget::MAX_TOKENS);
        s.retryledger.budget_floor_per_second =
            mul(s.retryledger.budget_floor_per_second, "floor")?
                .min(s.retryledger.budget_max_tokens);
        check(&s)?;
        Ok(s)
    }
}

/// A JSON object being read: fields taken one by one, unknown ones refused.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    at: String,
    taken: Vec<&'static str>,
}

fn type_error(at: &str, want: &str) -> SimError {
    SimError::new("invalid_type", at, format!("expected {want}"))
}

impl<'a> Obj<'a> {
    fn open(v: &'a Value, at: &str) -> Result<Self> {
        match v {
            Value::Object(map) => Ok(Self {
                map,
                at: at.to_owned(),
                taken: Vec::new(),
            }),
            _ => Err(type_error(at, "an object")),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}/{key}", self.at)
    }

    fn get(&mut self, key: &'static str) -> Result<&'a Value> {
        self.taken.push(key);
        self.map.get(key).ok_or_else(|| {
            SimError::new(
                "missing_field",
                self.at.clone(),
                format!("`{key}` is required"),
            )
        })
    }

    fn opt(&mut self, key: &'static str) -> Option<&'a Value> {
        self.taken.push(key);
        self.map.get(key)
    }

    fn u64_in(&mut self, key: &'static str, lo: u64, hi: u64) -> Result<u64> {
        let v = self.get(key)?;
        let at = self.path(key);
        let n = v.as_u64().ok_or_else(|| type_error(&at, "an integer"))?;
        if n < lo || n > hi {
            return Err(SimError::new(
                "invalid_value",
                at,
                format!("must be in {lo}..={hi}, not {n}"),
            ));
        }
        Ok(n)
    }

    fn string(&mut self, key: &'static str) -> Result<String> {
        let v = self.get(key)?;
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| type_error(&self.path(key), "a string"))
    }

    fn object(&mut self, key: &'static str) -> Result<Obj<'a>> {
        let v = self.get(key)?;
        Obj::open(v, &self.path(key))
    }

    /// Every field present was read; the first other one (sorted) is unknown.
    fn end(self) -> Result<()> {
        let mut extra: Vec<&String> = self
            .map
            .keys()
            .filter(|k| !self.taken.contains(&k.as_str()))
            .collect();
        extra.sort();
        match extra.first() {
            Some(k) => Err(SimError::new(
                "unknown_field",
                format!("{}/{k}", self.at),
                format!("`{k}` is not a field here"),
            )),
            None => Ok(()),
        }
    }
}

const DAY_MS: u64 = 86_400_000;

/// Decode a scenario from JSON text; `name` is what tables call it.
pub fn decode(name: &str, text: &str) -> Result<Scenario> {
    let v = retryledger_core::decode::parse_strict(text).map_err(|e| SimError::core(&e))?;
    let mut o = Obj::open(&v, "")?;
    let schema = o.string("schema")?;
    if schema != SCENARIO_SCHEMA {
        return Err(SimError::new(
            "invalid_value",
            "/schema",
            format!("expected `{SCENARIO_SCHEMA}`"),
        ));
    }
    let description = o.string("description")?;
    let seed = o.u64_in("seed", 0, u64::MAX)?;
    let duration_ms = o.u64_in("duration_ms", 1, DAY_MS)?;
    let bucket_ms = o.u64_in("bucket_ms", 1, DAY_MS)?;
    let warmup_ms = o.u64_in("warmup_ms", 0, DAY_MS)?;
    let recovery_window_ms = o.u64_in("recovery_window_ms", 1, DAY_MS)?;

    let mut a = o.object("arrivals")?;
    let process = match a.string("process")?.as_str() {
        "poisson" => Process::Poisson,
        "fixed" => Process::Fixed,
        other => {
            return Err(SimError::new(
                "invalid_value",
                "/arrivals/process",
                format!("`{other}` is not `poisson` or `fixed`"),
            ))
        }
    };
    let rate_per_s = a.u64_in("rate_per_s", 1, 10_000_000)?;
    a.end()?;

    let mut c = o.object("clients")?;
    let clients = Clients {
        count: c.u64_in("count", 1, 100_000)?,
        deadline_ms: c.u64_in("deadline_ms", 1, DAY_MS)?,
        attempt_timeout_ms: c.u64_in("attempt_timeout_ms", 1, DAY_MS)?,
    };
    c.end()?;

    let mut l = o.object("layers")?;
    let layers = Layers {
        count: l.u64_in("count", 1, 6)?,
        attempts: l.u64_in("attempts", 1, 10)?,
        delay_ms: l.u64_in("delay_ms", 0, DAY_MS)?,
    };
    l.end()?;

    let mut b = o.object("backoff")?;
    let backoff = ClientBackoff {
        max_attempts: b.u64_in("max_attempts", 1, 100)?,
        base_ms: b.u64_in("base_ms", 1, DAY_MS)?,
        max_ms: b.u64_in("max_ms", 1, DAY_MS)?,
    };
    b.end()?;

    let routes_v = o.get("routes")?;
    let Value::Array(items) = routes_v else {
        return Err(type_error("/routes", "an array of routes"));
    };
    if items.is_empty() || items.len() > 2 {
        return Err(SimError::new(
            "invalid_value",
            "/routes",
            "one route (the primary) or two (primary, then fallback)",
        ));
    }
    let routes = items
        .iter()
        .enumerate()
        .map(|(i, r)| route(r, &format!("/routes/{i}"), duration_ms))
        .collect::<Result<Vec<_>>>()?;

    let mut r = o.object("retryledger")?;
    let retryledger = LedgerSpec {
        primary_attempts: r.u64_in("primary_attempts", 1, 100)?,
        fallback_attempts: r.u64_in("fallback_attempts", 1, 100)?,
        max_total_attempts: r.u64_in("max_total_attempts", 1, 100)?,
        base_ms: r.u64_in("base_ms", 1, DAY_MS)?,
        max_ms: r.u64_in("max_ms", 1, DAY_MS)?,
        retry_after_cap_ms: r.u64_in("retry_after_cap_ms", 0, DAY_MS)?,
        breaker_consecutive_failures: r.u64_in("breaker_consecutive_failures", 1, 1_000_000)?,
        breaker_failure_ratio: match r.opt("breaker_failure_ratio") {
            None => None,
            Some(v) => {
                let mut b = Obj::open(v, "/retryledger/breaker_failure_ratio")?;
                let ratio = (
                    b.u64_in("failure_ratio_permille", 1, 1_000)?,
                    b.u64_in("minimum_volume", 1, 1_000_000)?,
                    b.u64_in("window_ms", 1, DAY_MS)?,
                );
                b.end()?;
                Some(ratio)
            }
        },
        breaker_open_ms: r.u64_in("breaker_open_ms", 1, DAY_MS)?,
        breaker_half_open_probes: r.u64_in("breaker_half_open_probes", 1, 1_000)?,
        budget_ratio_permille: r.u64_in("budget_ratio_permille", 0, 10_000)?,
        budget_floor_per_second: r.u64_in("budget_floor_per_second", 0, 1_000_000)?,
        budget_max_tokens: r.u64_in("budget_max_tokens", 1, 1_000_000)?,
        budget_wait_ms: match r.opt("budget_wait_ms") {
            None => None,
            Some(_) => {
                Some(r.u64_in("budget_wait_ms", 1, retryledger_core::budget::MAX_WAIT_MS)?)
            }
        },
    };
    r.end()?;
    let hedge = match o.opt("hedge") {
        None => None,
        Some(v) => {
            let mut h = Obj::open(v, "/hedge")?;
            let spec = HedgeSpec {
                delay_ms: h.u64_in("delay_ms", 1, DAY_MS)?,
            };
            h.end()?;
            Some(spec)
        }
    };
    if let Some(extra) = o.opt("comment") {
        if !extra.is_string() {
            return Err(type_error("/comment", "a string"));
        }
    }
    o.end()?;

    let s = Scenario {
        name: name.to_owned(),
        description,
        seed,
        duration_ms,
        bucket_ms,
        warmup_ms,
        recovery_window_ms,
        arrivals: Arrivals {
            process,
            rate_per_s,
        },
        clients,
        layers,
        backoff,
        routes,
        retryledger,
        hedge,
    };
    check(&s)?;
    Ok(s)
}

fn route(v: &Value, at: &str, duration_ms: u64) -> Result<RouteSpec> {
    let mut o = Obj::open(v, at)?;
    let id = o.string("id")?;
    if id.is_empty() || id.len() > 64 {
        return Err(SimError::new(
            "invalid_value",
            format!("{at}/id"),
            "1 to 64 characters",
        ));
    }
    let capacity = o.u64_in("capacity", 1, 100_000_000)?;
    let reject_ms = o.u64_in("reject_ms", 0, DAY_MS)?;
    let mut l = o.object("latency")?;
    let latency = Latency {
        base_ms: l.u64_in("base_ms", 0, DAY_MS)?,
        tail_mean_ms: l.u64_in("tail_mean_ms", 0, DAY_MS)?,
    };
    l.end()?;
    let cost = o.u64_in("cost", 0, 1_000_000_000)?;
    let fv = o.get("failures")?;
    let Value::Array(items) = fv else {
        return Err(type_error(&format!("{at}/failures"), "an array"));
    };
    if items.len() > 16 {
        return Err(SimError::new(
            "invalid_value",
            format!("{at}/failures"),
            "at most 16 failure windows",
        ));
    }
    let failures = items
        .iter()
        .enumerate()
        .map(|(i, f)| failure(f, &format!("{at}/failures/{i}"), duration_ms))
        .collect::<Result<Vec<_>>>()?;
    o.end()?;
    Ok(RouteSpec {
        id,
        capacity,
        reject_ms,
        latency,
        cost,
        failures,
    })
}

fn failure(v: &Value, at: &str, duration_ms: u64) -> Result<Failure> {
    let mut o = Obj::open(v, at)?;
    let kind_name = o.string("kind")?;
    let from_ms = o.u64_in("from_ms", 0, duration_ms)?;
    let until_ms = o.u64_in("until_ms", 0, duration_ms)?;
    if until_ms <= from_ms {
        return Err(SimError::new(
            "invalid_value",
            format!("{at}/until_ms"),
            "until_ms must be after from_ms",
        ));
    }
    let kind = match kind_name.as_str() {
        "outage" => FailureKind::Outage,
        "brownout" => FailureKind::Brownout {
            failure_permille: o.u64_in("failure_permille", 0, 1_000)?,
        },
        "rate_limit" => FailureKind::RateLimit {
            per_second: o.u64_in("per_second", 1, 100_000_000)?,
        },
        "slow_tail" => FailureKind::SlowTail {
            slow_permille: o.u64_in("slow_permille", 0, 1_000)?,
            slow_ms: o.u64_in("slow_ms", 0, DAY_MS)?,
        },
        other => {
            return Err(SimError::new(
                "invalid_value",
                format!("{at}/kind"),
                format!("`{other}` is not outage, brownout, rate_limit or slow_tail"),
            ))
        }
    };
    o.end()?;
    Ok(Failure {
        kind,
        from_ms,
        until_ms,
    })
}

/// Rules across fields.
fn check(s: &Scenario) -> Result<()> {
    if s.expected_requests() > MAX_REQUESTS {
        return Err(SimError::new(
            "too_many_requests",
            "/arrivals/rate_per_s",
            format!(
                "{} logical requests; at most {MAX_REQUESTS} per run",
                s.expected_requests()
            ),
        ));
    }
    if s.expected_requests() == 0 {
        return Err(SimError::new(
            "invalid_value",
            "/duration_ms",
            "the rate and duration admit no logical request",
        ));
    }
    if s.bucket_ms > s.duration_ms {
        return Err(SimError::new(
            "invalid_value",
            "/bucket_ms",
            "a bucket must not be longer than the run",
        ));
    }
    if s.backoff.max_ms < s.backoff.base_ms {
        return Err(SimError::new(
            "invalid_value",
            "/backoff/max_ms",
            "max_ms must be at least base_ms",
        ));
    }
    let checked_pow = s
        .layers
        .attempts
        .checked_pow(u32::try_from(s.layers.count).unwrap_or(u32::MAX));
    if checked_pow.is_none_or(|n| n > 100_000) {
        return Err(SimError::new(
            "invalid_value",
            "/layers",
            "attempts^count must be at most 100000",
        ));
    }
    let l = &s.retryledger;
    if l.budget_floor_per_second > l.budget_max_tokens {
        return Err(SimError::new(
            "invalid_value",
            "/retryledger/budget_floor_per_second",
            "the floor must not exceed budget_max_tokens",
        ));
    }
    if l.budget_floor_per_second == 0 && l.budget_ratio_permille == 0 {
        return Err(SimError::new(
            "invalid_value",
            "/retryledger/budget_ratio_permille",
            "a budget with neither a ratio nor a floor never admits a retry",
        ));
    }
    if let Some((from, _)) = s.failure_window() {
        if from <= s.warmup_ms {
            return Err(SimError::new(
                "invalid_value",
                "/warmup_ms",
                "the warm-up must end before the primary's first failure window, or there is no steady load to compare with",
            ));
        }
    }
    Ok(())
}
