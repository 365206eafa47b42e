//! Fleet transitions over stored snapshots: breakers, retry budgets,
//! admission limits and key pools.

use crate::canonical::{Encode, ObjectWriter, Sink};
use crate::decode::from_str;
use crate::error::{Error, ErrorCode, Result};

use super::out;

/// `{"admission": …, "snapshot": …}`: a breaker answer and its next snapshot.
struct BreakerStep(
    crate::breaker::BreakerAdmission,
    crate::breaker::BreakerSnapshot,
);

impl Encode for BreakerStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("admission", &self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

/// `{"granted": …, "snapshot": …}`: a withdrawal's answer and the next snapshot.
struct BudgetStep(bool, crate::budget::RetryBudgetSnapshot);

impl Encode for BudgetStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .bool("granted", self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

fn breaker_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::breaker::BreakerConfig,
    crate::breaker::BreakerSnapshot,
)> {
    let cfg =
        from_str::<crate::breaker::BreakerConfig>(config_json).map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::breaker::BreakerSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, &snap.route_release_sha256, "/snapshot")?;
    Ok((cfg, snap))
}

fn budget_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::budget::RetryBudgetConfig,
    crate::budget::RetryBudgetSnapshot,
)> {
    let cfg = from_str::<crate::budget::RetryBudgetConfig>(config_json)
        .map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::budget::RetryBudgetSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, "/snapshot")?;
    Ok((cfg, snap))
}

/// `breaker_admit`: a breaker configuration and snapshot and the wall clock
/// in; `{"admission", "snapshot"}` out (the answer and the next snapshot).
pub fn breaker_admit(config_json: &str, snapshot_json: &str, now_epoch_ms: u64) -> Result<String> {
    let (cfg, snap) = breaker_inputs(config_json, snapshot_json)?;
    let (a, next) = crate::breaker::admit(&cfg, &snap, now_epoch_ms);
    Ok(out(&BreakerStep(a, next)))
}

/// `breaker_record`: an admitted attempt's outcome (and whether it was a
/// probe) recorded on the snapshot; the next snapshot out.
pub fn breaker_record(
    config_json: &str,
    snapshot_json: &str,
    probe: bool,
    outcome_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = breaker_inputs(config_json, snapshot_json)?;
    let outcome =
        from_str::<crate::outcome::Outcome>(outcome_json).map_err(|e| e.under("/outcome"))?;
    let health = crate::breaker::Health::of(&outcome);
    Ok(out(&crate::breaker::record(
        &cfg,
        &snap,
        probe,
        health,
        now_epoch_ms,
    )))
}

/// `budget_deposit`: a first attempt's deposit; the next snapshot out.
pub fn budget_deposit(config_json: &str, snapshot_json: &str, now_epoch_ms: u64) -> Result<String> {
    let (cfg, snap) = budget_inputs(config_json, snapshot_json)?;
    Ok(out(&crate::budget::deposit(&cfg, &snap, now_epoch_ms)))
}

/// `budget_withdraw`: a retry's withdrawal; `{"granted", "snapshot"}` out.
pub fn budget_withdraw(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = budget_inputs(config_json, snapshot_json)?;
    let (granted, next) = crate::budget::withdraw(&cfg, &snap, now_epoch_ms);
    Ok(out(&BudgetStep(granted, next)))
}

/// `{"answer": {"kind", …}, "snapshot": …}`: an admission's answer and the next snapshot.
struct AdmissionStep(
    crate::admission::LimitAnswer,
    crate::admission::AdmissionSnapshot,
);

struct LimitAnswerDoc(crate::admission::LimitAnswer);

impl Encode for LimitAnswerDoc {
    fn encode(&self, sink: &mut dyn Sink) {
        use crate::admission::LimitAnswer as A;
        let mut w = ObjectWriter::new(sink);
        match self.0 {
            A::Admitted { start_epoch_ms } => w
                .str("kind", "admitted")
                .u64("start_epoch_ms", start_epoch_ms),
            A::Refused { earliest_epoch_ms } => w
                .opt_u64("earliest_epoch_ms", earliest_epoch_ms)
                .str("kind", "refused"),
            A::Wait { until_epoch_ms } => {
                w.str("kind", "wait").u64("until_epoch_ms", until_epoch_ms)
            }
            A::OverShare { until_epoch_ms } => w
                .str("kind", "wait")
                .str("reason", "tenant_over_share")
                .u64("until_epoch_ms", until_epoch_ms),
            A::RefusedOverShare { earliest_epoch_ms } => w
                .u64("earliest_epoch_ms", earliest_epoch_ms)
                .str("kind", "refused")
                .str("reason", "tenant_over_share"),
        }
        .end();
    }
}

impl Encode for AdmissionStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("answer", &LimitAnswerDoc(self.0))
            .doc("snapshot", &self.1)
            .end();
    }
}

fn admission_inputs(
    config_json: &str,
    snapshot_json: &str,
) -> Result<(
    crate::admission::AdmissionConfig,
    crate::admission::AdmissionSnapshot,
)> {
    let cfg = from_str::<crate::admission::AdmissionConfig>(config_json)
        .map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = from_str::<crate::admission::AdmissionSnapshot>(snapshot_json)
        .map_err(|e| e.under("/snapshot"))?;
    snap.check(&cfg, &snap.route_release_sha256, "/snapshot")?;
    Ok((cfg, snap))
}

/// `admission_admit`: admission limits and a snapshot, the wall clock, when
/// the attempt first asked and the tokens it reserves in; `{"answer",
/// "snapshot"}` out (`admitted` with its start, `wait` until when, or
/// `refused` with the earliest start if any; the next snapshot).
///
/// Under tenant shares (`tenant_weights`) the call names its `tenant` (one
/// the limits list; otherwise, and for a tenant without shares,
/// `invalid_value` at `/tenant`); an answer for a tenant over its share
/// carries `"reason": "tenant_over_share"` (a `wait`, or a `refused`).
pub fn admission_admit(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
    queued_since_epoch_ms: u64,
    tokens: u64,
    tenant: Option<&str>,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    let view = crate::fleet::FleetView {
        tenant: tenant
            .map(|t| {
                crate::ids::Identifier::parse(t).map_err(|(code, m)| Error::at(code, "/tenant", m))
            })
            .transpose()?,
        ..crate::fleet::FleetView::default()
    };
    let tenant = crate::fleet::tenant_in(&cfg, &view)?;
    let (a, next) = crate::admission::admit_as(
        &cfg,
        &snap,
        now_epoch_ms,
        queued_since_epoch_ms,
        tokens,
        tenant.as_ref(),
    );
    Ok(out(&AdmissionStep(a, next)))
}

/// `admission_release`: an admitted attempt is over; its slot freed and its
/// `reserved` tokens settled with the `used` ones (none: not reported); the
/// next snapshot out.
pub fn admission_release(
    config_json: &str,
    snapshot_json: &str,
    now_epoch_ms: u64,
    reserved: u64,
    used: Option<u64>,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    Ok(out(&crate::admission::release(
        &cfg,
        &snap,
        now_epoch_ms,
        reserved,
        used,
    )))
}

/// `{"notes": [...], "snapshot": ...}`: what a response's rate-limit headers
/// did to an admission snapshot, and what was ignored.
struct ObservedStep(
    crate::admission::AdmissionSnapshot,
    Vec<crate::provider::Note>,
);

impl Encode for ObservedStep {
    fn encode(&self, sink: &mut dyn Sink) {
        let mut w = ObjectWriter::new(sink);
        if !self.1.is_empty() {
            w.list("notes", &self.1);
        }
        w.doc("snapshot", &self.0).end();
    }
}

/// `admission_observe`: admission limits, a snapshot, a response's headers
/// (a JSON array of `[name, value]` pairs) and the wall clock in;
/// `{"notes"?, "snapshot"}` out: the snapshot the rate-limit headers leave
/// (unchanged when none applies) and the headers ignored.
pub fn admission_observe(
    config_json: &str,
    snapshot_json: &str,
    headers_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = admission_inputs(config_json, snapshot_json)?;
    let headers =
        from_str::<crate::admission::SeenHeaders>(headers_json).map_err(|e| e.under("/headers"))?;
    let (next, notes) = crate::admission::observe(&cfg, &snap, &headers.0, now_epoch_ms);
    Ok(out(&ObservedStep(next, notes)))
}

/// A key pool's configuration and its snapshot (a fresh one when the store
/// holds none), both checked.
fn key_pool_inputs(
    config_json: &str,
    snapshot_json: Option<&str>,
) -> Result<(
    crate::keypool::KeyPoolConfig,
    crate::keypool::KeyPoolSnapshot,
)> {
    let cfg =
        from_str::<crate::keypool::KeyPoolConfig>(config_json).map_err(|e| e.under("/config"))?;
    cfg.check("/config")?;
    let snap = match snapshot_json {
        Some(s) => {
            from_str::<crate::keypool::KeyPoolSnapshot>(s).map_err(|e| e.under("/snapshot"))?
        }
        None => crate::keypool::KeyPoolSnapshot::fresh(&cfg),
    };
    snap.check(&cfg, "/snapshot")?;
    Ok((cfg, snap))
}

/// `{"selection": …, "snapshot": …}`: the key chosen and the next snapshot.
struct KeyPoolStep(crate::keypool::Selection, crate::keypool::KeyPoolSnapshot);

impl Encode for KeyPoolStep {
    fn encode(&self, sink: &mut dyn Sink) {
        ObjectWriter::new(sink)
            .doc("selection", &self.0)
            .doc("snapshot", &self.1)
            .end();
    }
}

/// `key_pool_select`: which key of the pool the next attempt uses
/// ([`crate::keypool::select`]); `{"selection", "snapshot"}` out, the
/// snapshot to write back with compare-and-set. `affinity` is the key the
/// session used before.
pub fn key_pool_select(
    config_json: &str,
    snapshot_json: Option<&str>,
    now_epoch_ms: u64,
    affinity: Option<&str>,
) -> Result<String> {
    let (cfg, snap) = key_pool_inputs(config_json, snapshot_json)?;
    let affinity = affinity
        .map(|a| {
            crate::ids::Sha256Hex::parse(a)
                .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/affinity", m))
        })
        .transpose()?;
    let (selection, next) = crate::keypool::select(&cfg, &snap, now_epoch_ms, affinity.as_ref());
    Ok(out(&KeyPoolStep(selection, next)))
}

/// `key_pool_record`: the pool's next snapshot after `key_sha256` answered
/// with `outcome` (and the HTTP `status`, when there was one: 401 and 403
/// disable the key) ([`crate::keypool::record`]).
pub fn key_pool_record(
    config_json: &str,
    snapshot_json: Option<&str>,
    key_sha256: &str,
    outcome_json: &str,
    status: Option<u64>,
    now_epoch_ms: u64,
) -> Result<String> {
    let (cfg, snap) = key_pool_inputs(config_json, snapshot_json)?;
    let key = crate::ids::Sha256Hex::parse(key_sha256)
        .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/key_sha256", m))?;
    let outcome =
        from_str::<crate::outcome::Outcome>(outcome_json).map_err(|e| e.under("/outcome"))?;
    let status = status
        .map(|s| {
            u16::try_from(s)
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| {
                    Error::at(
                        ErrorCode::IntegerOutOfRange,
                        "/status",
                        format!("status {s} is not an HTTP status (100..=599)"),
                    )
                })
        })
        .transpose()?;
    let signal = crate::keypool::KeySignal::of(&outcome, status);
    let next = crate::keypool::record(&cfg, &snap, &key, signal, now_epoch_ms)?;
    Ok(out(&next))
}

/// `key_sha256`: a pool key's identity, the SHA-256 of its secret's UTF-8
/// bytes (the secret itself is never in a document).
pub fn key_sha256(secret: &str) -> Result<String> {
    if secret.is_empty() {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/secret",
            "a key's secret is not empty",
        ));
    }
    Ok(crate::canonical::sha256_hex(secret.as_bytes()))
}
