//! The deterministic schedule: capped exponential backoff, the bounded
//! Retry-After floor, and replayable jitter.
//!
//! After a retryable failure of per-route attempt `k` completed at `c`:
//!
//! ```text
//! e         = min(base_ms * 2^(k-1), max_ms)        (saturating: huge k gives max_ms)
//! floor     = min(retry_after_ms, retry_after_cap_ms)
//! term      = e, or a jitter sample drawn inside the mode's interval
//! delay     = max(term, floor)
//! not_before = c + delay
//! ```
//!
//! Jitter samples come from SHA-256 over the scheduler release, the seed and
//! the ordinal of the attempt being scheduled, so a replay draws the same
//! value. The interval's upper end is pulled below the deadline when it can
//! be, so jitter never moves a dispatch past the deadline; it never lowers
//! the Retry-After floor because the floor is applied after it.

use sha2::{Digest, Sha256};

use crate::policy::{Backoff, Jitter};

/// A jitter draw: its interval and the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JitterDraw {
    /// Smallest allowed sample, ms.
    pub min_ms: u64,
    /// Largest allowed sample, ms.
    pub max_ms: u64,
    /// The sample, ms.
    pub sample_ms: u64,
}

/// The delay before the next attempt and how it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    /// The delay, ms.
    pub delay_ms: u64,
    /// The bounded Retry-After floor, ms (0 without a hint).
    pub retry_after_floor_ms: u64,
    /// The jitter draw, when jitter is on.
    pub jitter: Option<JitterDraw>,
}

/// `min(base_ms * 2^(k-1), max_ms)` for per-route attempt `k >= 1`, saturating.
pub fn exponential_ms(backoff: &Backoff, route_ordinal: u64) -> u64 {
    let shift = u32::try_from(route_ordinal.saturating_sub(1)).ok();
    shift
        .and_then(|s| 1u64.checked_shl(s))
        .and_then(|factor| backoff.base_ms.checked_mul(factor))
        .map_or(backoff.max_ms, |v| v.min(backoff.max_ms))
}

/// The Retry-After hint bounded by the policy cap (0 without a hint).
pub fn retry_after_floor_ms(backoff: &Backoff, hint: Option<u64>) -> u64 {
    hint.unwrap_or(0).min(backoff.retry_after_cap_ms)
}

/// The jitter interval for a mode, or `None` when jitter is off.
///
/// `previous_sample` is the run's last jitter sample (for decorrelated
/// jitter); `latest_start` is the last start time before the deadline
/// relative to the failed attempt's completion.
pub fn jitter_interval(
    jitter: &Jitter,
    backoff: &Backoff,
    exponential: u64,
    previous_sample: Option<u64>,
    latest_delay: u64,
) -> Option<(u64, u64)> {
    let (lo, hi) = match jitter {
        Jitter::None => return None,
        Jitter::Full { .. } => (0, exponential),
        Jitter::Equal { .. } => (exponential / 2, exponential),
        Jitter::Decorrelated { .. } => {
            let prev = previous_sample
                .unwrap_or(backoff.base_ms)
                .max(backoff.base_ms);
            let hi = prev.saturating_mul(3).min(backoff.max_ms);
            (backoff.base_ms.min(hi), hi)
        }
    };
    Some((lo, hi.min(latest_delay).max(lo)))
}

/// Deterministic uniform draw in `[lo, hi]` from the jitter binding and an ordinal.
pub fn draw(scheduler_release: &str, seed: u64, ordinal: u64, lo: u64, hi: u64) -> u64 {
    let mut h = Sha256::new();
    h.update(b"retryledger.jitter.v1\0");
    h.update(scheduler_release.as_bytes());
    h.update(b"\0");
    h.update(seed.to_be_bytes());
    h.update(ordinal.to_be_bytes());
    let out = h.finalize();
    let mut word = [0u8; 8];
    for (dst, src) in word.iter_mut().zip(out.iter()) {
        *dst = *src;
    }
    let x = u64::from_be_bytes(word);
    match hi.checked_sub(lo).and_then(|d| d.checked_add(1)) {
        Some(span) => lo.saturating_add(x.checked_rem(span).unwrap_or(0)),
        None => lo,
    }
}

/// The delay after a retryable failure of per-route attempt `route_ordinal`.
///
/// `next_ordinal` is the global ordinal of the attempt being scheduled;
/// `latest_delay` the largest delay that still starts before the deadline.
pub fn next_delay(
    backoff: &Backoff,
    jitter: &Jitter,
    route_ordinal: u64,
    hint: Option<u64>,
    previous_sample: Option<u64>,
    next_ordinal: u64,
    latest_delay: u64,
) -> Delay {
    let exponential = exponential_ms(backoff, route_ordinal);
    let floor = retry_after_floor_ms(backoff, hint);
    let draw = jitter_interval(jitter, backoff, exponential, previous_sample, latest_delay).map(
        |(lo, hi)| {
            let sample = match jitter {
                Jitter::Full {
                    scheduler_release,
                    seed,
                }
                | Jitter::Equal {
                    scheduler_release,
                    seed,
                }
                | Jitter::Decorrelated {
                    scheduler_release,
                    seed,
                } => draw(scheduler_release.as_str(), *seed, next_ordinal, lo, hi),
                Jitter::None => lo,
            };
            JitterDraw {
                min_ms: lo,
                max_ms: hi,
                sample_ms: sample,
            }
        },
    );
    let term = draw.map_or(exponential, |d| d.sample_ms);
    Delay {
        delay_ms: term.max(floor),
        retry_after_floor_ms: floor,
        jitter: draw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Identifier;

    fn backoff(base: u64, max: u64) -> Backoff {
        Backoff {
            base_ms: base,
            max_ms: max,
            retry_after_cap_ms: 2_000,
            retry_after_over_cap: None,
            quota_exhausted: None,
        }
    }

    #[test]
    fn chapter_exercise_two() {
        let b = backoff(200, 1_500);
        let delays: Vec<u64> = (1..=5)
            .map(|k| next_delay(&b, &Jitter::None, k, None, None, k + 1, u64::MAX).delay_ms)
            .collect();
        assert_eq!(delays, [200, 400, 800, 1_500, 1_500]);
        assert_eq!(
            next_delay(&b, &Jitter::None, 2, Some(1_200), None, 3, u64::MAX).delay_ms,
            1_200
        );
    }

    #[test]
    fn exponential_saturates() {
        let b = backoff(100, 1_000);
        assert_eq!(exponential_ms(&b, 1), 100);
        assert_eq!(exponential_ms(&b, 64), 1_000);
        assert_eq!(exponential_ms(&b, 65), 1_000);
        assert_eq!(exponential_ms(&b, u64::MAX), 1_000);
        let huge = Backoff {
            base_ms: u64::MAX / 2,
            max_ms: u64::MAX,
            retry_after_cap_ms: 0,
            retry_after_over_cap: None,
            quota_exhausted: None,
        };
        assert_eq!(exponential_ms(&huge, 3), u64::MAX);
    }

    #[test]
    fn retry_after_is_bounded() {
        let b = backoff(100, 1_000);
        assert_eq!(
            next_delay(&b, &Jitter::None, 1, Some(50_000), None, 2, u64::MAX).delay_ms,
            2_000
        );
    }

    #[test]
    fn jitter_is_replayable_and_inside_its_interval() {
        let b = backoff(100, 10_000);
        let rel = Identifier::parse("sched-1").unwrap();
        for jitter in [
            Jitter::Full {
                scheduler_release: rel.clone(),
                seed: 7,
            },
            Jitter::Equal {
                scheduler_release: rel.clone(),
                seed: 7,
            },
            Jitter::Decorrelated {
                scheduler_release: rel.clone(),
                seed: 7,
            },
        ] {
            for k in 1..20 {
                let a = next_delay(&b, &jitter, k, None, Some(300), k + 1, u64::MAX);
                let again = next_delay(&b, &jitter, k, None, Some(300), k + 1, u64::MAX);
                assert_eq!(a, again);
                let d = a.jitter.unwrap();
                assert!(d.min_ms <= d.sample_ms && d.sample_ms <= d.max_ms);
            }
        }
        let other = Jitter::Full {
            scheduler_release: rel,
            seed: 8,
        };
        let differs = (1..20).any(|k| {
            next_delay(&b, &other, 5, None, None, k, u64::MAX).delay_ms
                != next_delay(
                    &b,
                    &Jitter::Full {
                        scheduler_release: Identifier::parse("sched-1").unwrap(),
                        seed: 7,
                    },
                    5,
                    None,
                    None,
                    k,
                    u64::MAX,
                )
                .delay_ms
        });
        assert!(differs);
    }

    #[test]
    fn jitter_never_undercuts_the_floor_nor_passes_the_deadline() {
        let b = backoff(100, 10_000);
        let j = Jitter::Full {
            scheduler_release: Identifier::parse("s").unwrap(),
            seed: 1,
        };
        for ord in 1..200 {
            let d = next_delay(&b, &j, 6, Some(700), None, ord, 900);
            assert!(d.delay_ms >= 700);
            let draw = d.jitter.unwrap();
            assert!(draw.sample_ms <= 900);
        }
    }
}
