//! The fleet retry budget: retries and fallbacks limited to a share of
//! admitted first attempts, shared across runs under one scope.
//!
//! Integers only, in milli-tokens: each first attempt deposits
//! `ratio_permille` (a ratio of 0.1 deposits 100), each later attempt (a
//! retry, a fallback, a hedge) withdraws 1,000, and the balance also grows by
//! `floor_per_second` tokens per second of wall clock, capped at
//! `max_tokens`. A withdrawal the balance does not cover is refused: the run
//! stops `stop_retry_budget` before dispatch, unless the budget has a
//! `wait_ms` (opt-in): then a retry or fallback short of budget waits
//! `wait_ms` and asks again, and stops only when that wait would reach the
//! deadline. The refused admission writes nothing, so the waiting runs take
//! the tokens later first attempts deposit: a cohort of attempts that failed
//! together (those in service when a route went down) is retried at the
//! budget's rate instead of being refused at once. Pure like the breaker: a
//! store only holds the snapshot; time never goes back for it.

use crate::decode::object;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{schema_marker, Identifier};

schema_marker!(
    /// `retryledger.retry_budget.v1`
    RetryBudgetSchema = "retryledger.retry_budget.v1"
);

/// Milli-tokens one retry withdraws.
pub const TOKEN: u64 = 1_000;
/// Largest `max_tokens`.
pub const MAX_TOKENS: u64 = 1_000_000;
/// Largest `wait_ms` (one minute).
pub const MAX_WAIT_MS: u64 = 60_000;

/// A policy's retry budget. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryBudgetConfig {
    /// Tokens per second added whatever the traffic (the floor).
    pub floor_per_second: u64,
    /// The balance's cap, in tokens.
    pub max_tokens: u64,
    /// Milli-tokens each first attempt deposits (per mille of a retry).
    pub ratio_permille: u64,
    /// The budget's key: runs under one scope share it.
    pub scope: Identifier,
    /// A retry or fallback short of budget waits this long and asks again
    /// (while the wait ends before the deadline) instead of stopping at once;
    /// omitted: it stops at once.
    pub wait_ms: Option<u64>,
}

object!(RetryBudgetConfig {
    floor_per_second: u64,
    max_tokens: u64,
    ratio_permille: u64,
    scope: doc,
    wait_ms: opt_u64,
});

impl RetryBudgetConfig {
    /// Check the configuration; `at` is its JSON Pointer in the policy.
    pub fn check(&self, at: &str) -> Result<()> {
        let bad = |field: &str, msg: &str| {
            Err(Error::at(
                ErrorCode::InvalidRetryBudget,
                format!("{at}/{field}"),
                msg.to_owned(),
            ))
        };
        if self.max_tokens == 0 || self.max_tokens > MAX_TOKENS {
            return bad("max_tokens", "max_tokens must be in 1..=1000000");
        }
        if self.ratio_permille > 10_000 {
            return bad("ratio_permille", "ratio_permille must be in 0..=10000");
        }
        if self.floor_per_second > self.max_tokens {
            return bad(
                "floor_per_second",
                "floor_per_second must not exceed max_tokens",
            );
        }
        if self.ratio_permille == 0 && self.floor_per_second == 0 {
            return bad(
                "ratio_permille",
                "a budget with neither a ratio nor a floor never admits a retry; omit the retry budget to allow none of them differently",
            );
        }
        if let Some(w) = self.wait_ms {
            if w == 0 || w > MAX_WAIT_MS {
                return bad("wait_ms", "wait_ms must be in 1..=60000");
            }
        }
        Ok(())
    }

    /// Whether a retry refused at `at_ms` (run clock) waits rather than
    /// stops: the budget waits, and its wait ends before `deadline_ms`. The
    /// wait's end on the run clock when it does.
    pub fn waits(&self, at_ms: u64, deadline_ms: u64) -> Option<u64> {
        let until = at_ms.saturating_add(self.wait_ms?);
        (until < deadline_ms).then_some(until)
    }

    fn cap(&self) -> u64 {
        self.max_tokens.saturating_mul(TOKEN)
    }
}

/// The retry budget of one scope. Fields in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryBudgetSnapshot {
    /// The balance, milli-tokens.
    pub balance_milli: u64,
    /// First attempts that deposited.
    pub deposits: u64,
    /// Raised on every change.
    pub generation: u64,
    /// `retryledger.retry_budget.v1`
    pub schema: RetryBudgetSchema,
    /// The budget's key.
    pub scope: Identifier,
    /// The latest time it saw, Unix ms.
    pub updated_at_epoch_ms: u64,
    /// Retries, fallbacks and hedges that withdrew.
    pub withdrawals: u64,
}

object!(RetryBudgetSnapshot {
    balance_milli: u64,
    deposits: u64,
    generation: u64,
    schema: doc,
    scope: doc,
    updated_at_epoch_ms: u64,
    withdrawals: u64,
});

impl RetryBudgetSnapshot {
    /// An empty budget, for a scope the store does not hold.
    pub fn fresh(scope: Identifier, now_epoch_ms: u64) -> Self {
        Self {
            balance_milli: 0,
            deposits: 0,
            generation: 0,
            schema: RetryBudgetSchema,
            scope,
            updated_at_epoch_ms: now_epoch_ms,
            withdrawals: 0,
        }
    }

    /// Check the snapshot against its configuration; `at` is its pointer.
    pub fn check(&self, cfg: &RetryBudgetConfig, at: &str) -> Result<()> {
        if self.scope != cfg.scope {
            return Err(Error::at(
                ErrorCode::SnapshotKeyMismatch,
                format!("{at}/scope"),
                "the snapshot is another scope's budget",
            ));
        }
        if self.balance_milli > cfg.cap() {
            return Err(Error::at(
                ErrorCode::BudgetOverCap,
                format!("{at}/balance_milli"),
                format!(
                    "balance {} milli-tokens is over the cap of {} tokens",
                    self.balance_milli, cfg.max_tokens
                ),
            ));
        }
        Ok(())
    }

    /// The snapshot with the floor's tokens for the time since it was updated.
    fn refilled(&self, cfg: &RetryBudgetConfig, now_epoch_ms: u64) -> Self {
        let mut next = self.clone();
        let now = now_epoch_ms.max(self.updated_at_epoch_ms);
        let elapsed = now.saturating_sub(self.updated_at_epoch_ms);
        // floor_per_second tokens per 1,000 ms: floor_per_second milli-tokens per ms.
        let added = elapsed.saturating_mul(cfg.floor_per_second);
        next.balance_milli = next.balance_milli.saturating_add(added).min(cfg.cap());
        next.updated_at_epoch_ms = now;
        next
    }
}

/// A first attempt was admitted: deposit its share.
pub fn deposit(
    cfg: &RetryBudgetConfig,
    snapshot: &RetryBudgetSnapshot,
    now_epoch_ms: u64,
) -> RetryBudgetSnapshot {
    let mut next = snapshot.refilled(cfg, now_epoch_ms);
    next.balance_milli = next
        .balance_milli
        .saturating_add(cfg.ratio_permille)
        .min(cfg.cap());
    next.deposits = next.deposits.saturating_add(1);
    next.generation = next.generation.saturating_add(1);
    next
}

/// A retry, fallback or hedge asks for a token: whether it is granted, and
/// the next snapshot (refilled even when refused).
pub fn withdraw(
    cfg: &RetryBudgetConfig,
    snapshot: &RetryBudgetSnapshot,
    now_epoch_ms: u64,
) -> (bool, RetryBudgetSnapshot) {
    let mut next = snapshot.refilled(cfg, now_epoch_ms);
    if next.balance_milli < TOKEN {
        return (false, next);
    }
    next.balance_milli = next.balance_milli.saturating_sub(TOKEN);
    next.withdrawals = next.withdrawals.saturating_add(1);
    next.generation = next.generation.saturating_add(1);
    (true, next)
}
