//! Price schedules (`retryledger.price_schedule.v1`) and usage-based cost.
//!
//! A schedule prices each route release per million units of each usage kind
//! (`input`, `output`, `cached_input`, `reasoning`, …), in integers of the
//! policy's cost unit. An attempt's raw usage costs the sum over its kinds of
//! `ceil(units * price / 1_000_000)`, with checked arithmetic; a kind the
//! release does not price is an error, never a silent zero. Without usage an
//! attempt keeps its reservation (the drivers' default).

use serde_json::Value;

use crate::attempt::Attempts;
use crate::canonical::{Encode, Sink};
use crate::decode::{object, At, Decode};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier, Sha256Hex};
use crate::limits::{MAX_ROUTES, MAX_SAFE_INTEGER, MAX_SET_ITEMS};
use crate::policy::Policy;

schema_marker!(
    /// `retryledger.price_schedule.v1`
    PriceScheduleSchema = "retryledger.price_schedule.v1"
);

/// Integers by unit kind, in key order: prices per million units, or usage.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Units(pub Vec<(Identifier, u64)>);

impl Units {
    /// The count or price of a kind.
    pub fn get(&self, kind: &Identifier) -> Option<u64> {
        self.0
            .binary_search_by(|(k, _)| k.cmp(kind))
            .ok()
            .and_then(|i| self.0.get(i))
            .map(|(_, v)| *v)
    }
}

impl Decode for Units {
    fn decode(v: &Value, at: &At<'_>) -> Result<Self> {
        let Value::Object(map) = v else {
            return Err(at.error(ErrorCode::InvalidType, "expected an object"));
        };
        if map.len() > MAX_SET_ITEMS {
            return Err(at.error(
                ErrorCode::TooManyItems,
                format!("more than {MAX_SET_ITEMS} kinds"),
            ));
        }
        let mut out = Vec::with_capacity(map.len());
        for (k, x) in map {
            let here = At::Key(at, k);
            let kind = Identifier::parse(k).map_err(|(c, m)| here.error(c, m))?;
            out.push((kind, u64::decode(x, &here)?));
        }
        // Identifiers are ASCII: byte order is RFC 8785's UTF-16 order.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self(out))
    }
}

impl Encode for Units {
    fn encode(&self, sink: &mut dyn Sink) {
        // Usage kinds are the caller's names, not field names: keys, escaped.
        sink.begin_object();
        for (k, v) in &self.0 {
            sink.key(k.as_str());
            sink.u64(*v);
        }
        sink.end_object();
    }
}

/// One release's prices. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasePrices {
    /// Price per million units of each kind.
    pub prices_per_million: Units,
    /// The release priced.
    pub route_release_sha256: Sha256Hex,
}

object!(ReleasePrices {
    prices_per_million: doc,
    route_release_sha256: doc,
});

/// A price schedule. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceSchedule {
    /// The unit of every price; the policy's `cost_unit`.
    pub cost_unit: Identifier,
    /// Prices per release.
    pub releases: Vec<ReleasePrices>,
    /// `retryledger.price_schedule.v1`
    pub schema: PriceScheduleSchema,
}

object!(PriceSchedule {
    cost_unit: doc,
    releases: list(MAX_ROUTES),
    schema: doc,
});

impl PriceSchedule {
    fn prices(&self, release: &Sha256Hex) -> Option<&Units> {
        self.releases
            .iter()
            .find(|r| &r.route_release_sha256 == release)
            .map(|r| &r.prices_per_million)
    }
}

/// Check a schedule against a policy before any dispatch: the same cost unit,
/// each release priced once, every route's release priced.
pub fn check_schedule(policy: &Policy, schedule: &PriceSchedule) -> Result<()> {
    if schedule.cost_unit != policy.cost_unit {
        return Err(Error::at(
            ErrorCode::CostUnitMismatch,
            "/cost_unit",
            format!(
                "the schedule prices in `{}`, the policy counts `{}`",
                schedule.cost_unit, policy.cost_unit
            ),
        ));
    }
    for (i, r) in schedule.releases.iter().enumerate() {
        let first = schedule
            .releases
            .iter()
            .position(|x| x.route_release_sha256 == r.route_release_sha256);
        if first != Some(i) {
            return Err(Error::at(
                ErrorCode::DuplicateSetItem,
                format!("/releases/{i}/route_release_sha256"),
                "a release is priced twice",
            ));
        }
    }
    for (i, route) in policy.routes.iter().enumerate() {
        if schedule.prices(&route.route_release_sha256).is_none() {
            return Err(Error::at(
                ErrorCode::PriceScheduleMissingRelease,
                format!("/routes/{i}/route_release_sha256"),
                format!("route `{}` has no prices in the schedule", route.route_id),
            ));
        }
    }
    Ok(())
}

/// The cost of `usage` on `release`: the sum of `ceil(units * price / 10^6)`.
pub fn cost(schedule: &PriceSchedule, release: &Sha256Hex, usage: &Units) -> Result<u64> {
    let prices = schedule.prices(release).ok_or_else(|| {
        Error::at(
            ErrorCode::PriceScheduleMissingRelease,
            "/route_release_sha256",
            "the schedule has no prices for this release",
        )
    })?;
    let overflow = || {
        Error::at(
            ErrorCode::ArithmeticOverflow,
            "/usage",
            "the cost leaves 0..=2^53-1",
        )
    };
    let mut total: u64 = 0;
    for (kind, units) in &usage.0 {
        let price = prices.get(kind).ok_or_else(|| {
            Error::at(
                ErrorCode::UsageUnpriced,
                format!("/usage/{kind}"),
                format!("the release does not price `{kind}`"),
            )
        })?;
        let product = u128::from(*units)
            .checked_mul(u128::from(price))
            .ok_or_else(overflow)?;
        let part = product.div_ceil(1_000_000);
        let part = u64::try_from(part).map_err(|_| overflow())?;
        total = total.checked_add(part).ok_or_else(overflow)?;
    }
    if total > MAX_SAFE_INTEGER {
        return Err(overflow());
    }
    Ok(total)
}

impl Units {
    /// `self` plus `more`, kind by kind (checked: a sum above 2^53-1 is
    /// `arithmetic_overflow`).
    pub fn plus(&self, more: &Units) -> Result<Units> {
        let mut out = self.0.clone();
        for (kind, n) in &more.0 {
            match out.binary_search_by(|(k, _)| k.cmp(kind)) {
                Ok(i) => {
                    let Some((_, slot)) = out.get_mut(i) else {
                        continue;
                    };
                    *slot = slot
                        .checked_add(*n)
                        .filter(|t| *t <= MAX_SAFE_INTEGER)
                        .ok_or_else(|| {
                            Error::at(
                                ErrorCode::ArithmeticOverflow,
                                format!("/usage/{kind}"),
                                "the usage leaves 0..=2^53-1",
                            )
                        })?;
                }
                Err(i) => out.insert(i, (kind.clone(), *n)),
            }
        }
        Ok(Units(out))
    }
}

/// Replay's check of recorded usage: every attempt that records usage costs
/// exactly what its usage costs on its release under `schedule`.
pub fn verify_usage(schedule: Option<&PriceSchedule>, attempts: &Attempts) -> Result<()> {
    for (i, a) in attempts.attempts.iter().enumerate() {
        let Some(usage) = &a.usage else { continue };
        let Some(schedule) = schedule else {
            return Err(Error::attempt(
                ErrorCode::PriceScheduleMissing,
                i,
                "usage",
                "the attempt records usage but the bundle carries no price schedule",
            ));
        };
        let priced = cost(schedule, &a.route_release_sha256, usage)
            .map_err(|e| Error::attempt(e.code, i, "usage", e.message))?;
        if priced != a.cost {
            return Err(Error::attempt(
                ErrorCode::UsageCostDrift,
                i,
                "cost",
                format!("cost {} but the usage costs {priced}", a.cost),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::from_str;

    #[test]
    fn costs_round_up_per_kind_and_refuse_unpriced_units() {
        let release = "a".repeat(64);
        let schedule: PriceSchedule = from_str(&format!(
            r#"{{"schema":"retryledger.price_schedule.v1","cost_unit":"micro_usd","releases":[{{"route_release_sha256":"{release}","prices_per_million":{{"input":150000,"output":600000}}}}]}}"#
        ))
        .unwrap();
        let r = Sha256Hex::parse(&release).unwrap();
        let usage: Units = from_str(r#"{"input":1000,"output":1}"#).unwrap();
        // 1000 * 0.15 = 150; 1 * 0.6 = 0.6 -> 1
        assert_eq!(cost(&schedule, &r, &usage).unwrap(), 151);
        let e = cost(&schedule, &r, &from_str(r#"{"reasoning":5}"#).unwrap()).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::UsageUnpriced, Some("/usage/reasoning"))
        );
        assert_eq!(cost(&schedule, &r, &Units::default()).unwrap(), 0);
    }
}
