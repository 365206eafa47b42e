//! Idempotency records: the receiver's half of idempotency, one record per
//! scoped key, kept in a register.
//!
//! A `retryledger.idempotency_record.v1` document is keyed by the scoped
//! idempotency key digest (`{tenant, operation, key}`, [`crate::request`]);
//! it holds the digest of the request that claimed the key, its status
//! (`in_progress`, `succeeded`, `failed_no_effect`, `indeterminate`), the
//! result's digest once it succeeded, and when it was created, last changed
//! and expires (Unix ms). [`claim`] answers a request arriving under a key:
//!
//! - no record (or an expired one under `expired: proceed`): `proceed`, with
//!   the new `in_progress` record to write by compare-and-set (exactly one
//!   of two racing claims wins the write);
//! - the same request, succeeded: `replay` the stored result;
//! - the same request, in progress: `poll` after a bounded delay;
//! - the same request after a verified no-effect failure: `proceed` again;
//! - the same request, indeterminate: `rejected` (`indeterminate`): the
//!   receiver does not know its own effect, so it never runs it again blind;
//! - another request under the key: `rejected` (`key_reuse`);
//! - an expired record under `expired: reject`: `rejected` (`key_expired`).
//!
//! [`complete`] moves the claim's record to its final status. Pure like the
//! breaker: the host reads, asks, and writes back with compare-and-set.

use crate::decode::{names, object};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Sha256Hex};
use crate::limits::MAX_SAFE_INTEGER;

schema_marker!(
    /// `retryledger.idempotency_record.v1`
    IdempotencyRecordSchema = "retryledger.idempotency_record.v1"
);

/// Where the request under a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// Claimed, not finished.
    InProgress,
    /// Finished with a result (`result_sha256`).
    Succeeded,
    /// Finished without any effect: the request may run again.
    FailedNoEffect,
    /// Finished without knowing its effect: never run again blind.
    Indeterminate,
}

names!(RecordStatus {
    InProgress => "in_progress",
    Succeeded => "succeeded",
    FailedNoEffect => "failed_no_effect",
    Indeterminate => "indeterminate",
});

/// One key's record. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// When the key was claimed, Unix ms.
    pub created_at_epoch_ms: u64,
    /// When the record stops answering for the key, Unix ms.
    pub expires_at_epoch_ms: u64,
    /// The scoped idempotency key digest (the record's key).
    pub idempotency_key_sha256: Sha256Hex,
    /// The digest of the request that claimed the key.
    pub request_sha256: Sha256Hex,
    /// The result's digest (`succeeded` only).
    pub result_sha256: Option<Sha256Hex>,
    /// `retryledger.idempotency_record.v1`
    pub schema: IdempotencyRecordSchema,
    /// Where the request stands.
    pub status: RecordStatus,
    /// When the record last changed, Unix ms.
    pub updated_at_epoch_ms: u64,
}

object!(IdempotencyRecord {
    created_at_epoch_ms: u64,
    expires_at_epoch_ms: u64,
    idempotency_key_sha256: doc,
    request_sha256: doc,
    result_sha256: opt_doc,
    schema: doc,
    status: doc,
    updated_at_epoch_ms: u64,
});

/// What an expired record means for a new claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExpired {
    /// The key is free again: the claim proceeds with a new record.
    Proceed,
    /// The key stays spent: the claim is rejected (`key_expired`).
    Reject,
}

names!(OnExpired {
    Proceed => "proceed",
    Reject => "reject",
});

/// How long records answer for their key, and how a claim treats one that
/// no longer does. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// What an expired record means (explicit: there is no default).
    pub expired: OnExpired,
    /// The delay a claim that finds its request in progress polls after, ms.
    pub poll_after_ms: u64,
    /// How long a record answers for its key after its last change, ms.
    pub ttl_ms: u64,
}

object!(Retention {
    expired: doc,
    poll_after_ms: u64,
    ttl_ms: u64,
});

impl Retention {
    /// Check the bounds: `ttl_ms` at least 1, `poll_after_ms` in 1..=`ttl_ms`.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |field: &str, msg: &str| {
            Err(Error::at(
                ErrorCode::IdempotencyRetentionInvalid,
                format!("{at}/{field}"),
                msg.to_owned(),
            ))
        };
        if self.ttl_ms == 0 {
            return bad("ttl_ms", "ttl_ms must be at least 1");
        }
        if self.poll_after_ms == 0 || self.poll_after_ms > self.ttl_ms {
            return bad("poll_after_ms", "poll_after_ms must be in 1..=ttl_ms");
        }
        Ok(())
    }
}

/// A request arriving under a key. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The scoped idempotency key digest.
    pub idempotency_key_sha256: Sha256Hex,
    /// The request's digest (its body, as the receiver defines it).
    pub request_sha256: Sha256Hex,
}

object!(ClaimRequest {
    idempotency_key_sha256: doc,
    request_sha256: doc,
});

/// The end of a claimed request. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The scoped idempotency key digest.
    pub idempotency_key_sha256: Sha256Hex,
    /// The digest of the request that claimed the key.
    pub request_sha256: Sha256Hex,
    /// The result's digest (`succeeded` only).
    pub result_sha256: Option<Sha256Hex>,
    /// `succeeded`, `failed_no_effect` or `indeterminate`.
    pub status: RecordStatus,
}

object!(Completion {
    idempotency_key_sha256: doc,
    request_sha256: doc,
    result_sha256: opt_doc,
    status: doc,
});

/// Why a claim is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// Another request claimed the key.
    KeyReuse,
    /// The record expired and the retention keeps the key spent.
    KeyExpired,
    /// The request's effect is unknown to the receiver itself.
    Indeterminate,
}

names!(RejectReason {
    KeyReuse => "key_reuse",
    KeyExpired => "key_expired",
    Indeterminate => "indeterminate",
});

/// The answer of [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Run the request; write `record` first with compare-and-set.
    Proceed {
        /// The new `in_progress` record.
        record: IdempotencyRecord,
    },
    /// Answer with the stored result.
    Replay {
        /// The result's digest.
        result_sha256: Sha256Hex,
    },
    /// The request is running elsewhere: ask again after `retry_after_ms`.
    Poll {
        /// When to ask again, Unix ms.
        poll_at_epoch_ms: u64,
        /// The delay, ms (bounded by the retention and the record's expiry).
        retry_after_ms: u64,
    },
    /// Refuse the request.
    Rejected {
        /// Why.
        reason: RejectReason,
    },
}

impl crate::canonical::Encode for Claim {
    fn encode(&self, sink: &mut dyn crate::canonical::Sink) {
        let mut o = crate::canonical::ObjectWriter::new(sink);
        match self {
            Self::Proceed { record } => {
                o.str("kind", "proceed").doc("record", record);
            }
            Self::Replay { result_sha256 } => {
                o.str("kind", "replay").doc("result_sha256", result_sha256);
            }
            Self::Poll {
                poll_at_epoch_ms,
                retry_after_ms,
            } => {
                o.str("kind", "poll")
                    .u64("poll_at_epoch_ms", *poll_at_epoch_ms)
                    .u64("retry_after_ms", *retry_after_ms);
            }
            Self::Rejected { reason } => {
                o.str("kind", "rejected").doc("reason", reason);
            }
        }
        o.end();
    }
}

impl IdempotencyRecord {
    /// Check the record's own consistency and its key; `at` is its pointer.
    pub fn check(&self, key: &Sha256Hex, at: &str) -> Result<()> {
        let bad = |code: ErrorCode, field: &str, msg: &str| {
            Err(Error::at(code, format!("{at}/{field}"), msg.to_owned()))
        };
        if &self.idempotency_key_sha256 != key {
            return bad(
                ErrorCode::IdempotencyScopeMismatch,
                "idempotency_key_sha256",
                "the record is another scoped key's",
            );
        }
        if self.updated_at_epoch_ms < self.created_at_epoch_ms {
            return bad(
                ErrorCode::IdempotencyRecordInvalid,
                "updated_at_epoch_ms",
                "the record changed before it was created",
            );
        }
        if self.expires_at_epoch_ms <= self.updated_at_epoch_ms {
            return bad(
                ErrorCode::IdempotencyRecordInvalid,
                "expires_at_epoch_ms",
                "the record expires before its last change",
            );
        }
        if (self.status == RecordStatus::Succeeded) != self.result_sha256.is_some() {
            return bad(
                ErrorCode::IdempotencyRecordInvalid,
                "result_sha256",
                "a succeeded record, and only one, holds its result's digest",
            );
        }
        Ok(())
    }
}

/// `ttl_ms` after `now`; a time past 2^53 - 1 is `invalid_value` at `/now_epoch_ms`.
fn expiry(now: u64, ttl_ms: u64) -> Result<u64> {
    now.checked_add(ttl_ms)
        .filter(|t| *t <= MAX_SAFE_INTEGER)
        .ok_or_else(|| {
            Error::at(
                ErrorCode::InvalidValue,
                "/now_epoch_ms",
                "now_epoch_ms + ttl_ms is past 2^53 - 1",
            )
        })
}

/// A new `in_progress` record for `request` at `now_epoch_ms`.
fn fresh(
    request: &ClaimRequest,
    retention: &Retention,
    now_epoch_ms: u64,
) -> Result<IdempotencyRecord> {
    Ok(IdempotencyRecord {
        created_at_epoch_ms: now_epoch_ms,
        expires_at_epoch_ms: expiry(now_epoch_ms, retention.ttl_ms)?,
        idempotency_key_sha256: request.idempotency_key_sha256.clone(),
        request_sha256: request.request_sha256.clone(),
        result_sha256: None,
        schema: IdempotencyRecordSchema,
        status: RecordStatus::InProgress,
        updated_at_epoch_ms: now_epoch_ms,
    })
}

/// Answer a request arriving under its key at `now_epoch_ms` (wall clock),
/// given the record the store holds for the key, if any. A clock behind
/// the record's last change counts as that time.
pub fn claim(
    retention: &Retention,
    record: Option<&IdempotencyRecord>,
    request: &ClaimRequest,
    now_epoch_ms: u64,
) -> Result<Claim> {
    retention.check("/retention")?;
    let Some(rec) = record else {
        return Ok(Claim::Proceed {
            record: fresh(request, retention, now_epoch_ms)?,
        });
    };
    rec.check(&request.idempotency_key_sha256, "/record")?;
    let now = now_epoch_ms.max(rec.updated_at_epoch_ms);
    if now >= rec.expires_at_epoch_ms {
        return Ok(match retention.expired {
            OnExpired::Proceed => Claim::Proceed {
                record: fresh(request, retention, now)?,
            },
            OnExpired::Reject => Claim::Rejected {
                reason: RejectReason::KeyExpired,
            },
        });
    }
    if rec.request_sha256 != request.request_sha256 {
        return Ok(Claim::Rejected {
            reason: RejectReason::KeyReuse,
        });
    }
    Ok(match (rec.status, &rec.result_sha256) {
        (RecordStatus::Succeeded, Some(result)) => Claim::Replay {
            result_sha256: result.clone(),
        },
        (RecordStatus::InProgress, _) => {
            let retry_after_ms = retention
                .poll_after_ms
                .min(rec.expires_at_epoch_ms.saturating_sub(now));
            Claim::Poll {
                poll_at_epoch_ms: now.saturating_add(retry_after_ms),
                retry_after_ms,
            }
        }
        (RecordStatus::FailedNoEffect, _) => Claim::Proceed {
            record: IdempotencyRecord {
                created_at_epoch_ms: rec.created_at_epoch_ms,
                ..fresh(request, retention, now)?
            },
        },
        (RecordStatus::Indeterminate | RecordStatus::Succeeded, _) => Claim::Rejected {
            reason: RejectReason::Indeterminate,
        },
    })
}

/// The claimed record moved to its final status at `now_epoch_ms`: the
/// record to write back with compare-and-set. Its expiry is extended to
/// `ttl_ms` after the completion.
pub fn complete(
    retention: &Retention,
    record: &IdempotencyRecord,
    completion: &Completion,
    now_epoch_ms: u64,
) -> Result<IdempotencyRecord> {
    retention.check("/retention")?;
    record.check(&completion.idempotency_key_sha256, "/record")?;
    if record.status != RecordStatus::InProgress {
        return Err(Error::at(
            ErrorCode::IdempotencyNotInProgress,
            "/record/status",
            format!("the record is already {}", record.status.as_str()),
        ));
    }
    if record.request_sha256 != completion.request_sha256 {
        return Err(Error::at(
            ErrorCode::IdempotencyRequestMismatch,
            "/completion/request_sha256",
            "another request claimed the key",
        ));
    }
    if completion.status == RecordStatus::InProgress {
        return Err(Error::at(
            ErrorCode::InvalidValue,
            "/completion/status",
            "a completion is succeeded, failed_no_effect or indeterminate",
        ));
    }
    if (completion.status == RecordStatus::Succeeded) != completion.result_sha256.is_some() {
        return Err(Error::at(
            ErrorCode::IdempotencyRecordInvalid,
            "/completion/result_sha256",
            "a succeeded completion, and only one, holds its result's digest",
        ));
    }
    let now = now_epoch_ms.max(record.updated_at_epoch_ms);
    Ok(IdempotencyRecord {
        expires_at_epoch_ms: record
            .expires_at_epoch_ms
            .max(expiry(now, retention.ttl_ms)?),
        result_sha256: completion.result_sha256.clone(),
        status: completion.status,
        updated_at_epoch_ms: now,
        ..record.clone()
    })
}
