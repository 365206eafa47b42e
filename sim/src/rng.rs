//! The simulator's own seeded generator: splitmix64 to seed, xoshiro256**
//! to draw. Every draw is integer or IEEE-754 basic arithmetic (add,
//! multiply, divide), never the platform's `ln` or `exp`, so the same seed
//! gives the same numbers on every machine.

/// splitmix64: one step of the seeding generator.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `seed`, on its own `stream` (arrivals, each strategy, …).
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut sm = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = self.s;
        let result = s1.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s1 << 17;
        let mut n = [s0, s1, s2 ^ s0, s3 ^ s1];
        n[1] ^= n[2];
        n[0] ^= n[3];
        n[2] ^= t;
        n[3] = n[3].rotate_left(45);
        self.s = n;
        result
    }

    /// Uniform in `0..n` (0 when `n` is 0), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()).saturating_mul(u128::from(n));
        u64::try_from(wide >> 64).unwrap_or(0)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi <= lo`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo.saturating_add(self.below(hi.saturating_sub(lo).saturating_add(1)))
    }

    /// True with probability `permille / 1000`.
    pub fn chance_permille(&mut self, permille: u64) -> bool {
        self.below(1_000) < permille
    }

    /// Uniform in `(0, 1]`: 53 random bits.
    pub fn unit_open(&mut self) -> f64 {
        let bits = (self.next_u64() >> 11).saturating_add(1);
        // 2^53 values, exactly representable.
        #[allow(
            clippy::cast_precision_loss,
            reason = "a 53-bit integer is exact in an f64"
        )]
        let x = bits as f64;
        x / 9_007_199_254_740_992.0
    }

    /// An exponential draw with the given mean, in whole milliseconds
    /// (inverse CDF with [`ln`]; capped at 50 means).
    pub fn exp_ms(&mut self, mean_ms: u64) -> u64 {
        if mean_ms == 0 {
            return 0;
        }
        let u = self.unit_open();
        #[allow(clippy::cast_precision_loss, reason = "means are far below 2^53")]
        let mean = mean_ms as f64;
        let v = (-ln(u) * mean).min(mean * 50.0);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "v is in 0..=50 * mean, a small non-negative value"
        )]
        let ms = v as u64;
        ms
    }
}

/// Natural logarithm of `x > 0` with basic arithmetic only: `x = m * 2^e`
/// with `m` in `[1, 2)`, then `ln m = 2 atanh((m - 1) / (m + 1))` by its
/// series. Accurate to about 1e-15; deterministic everywhere.
pub fn ln(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return f64::NEG_INFINITY;
    }
    let bits = x.to_bits();
    let raw_exp = (bits >> 52) & 0x7FF;
    if raw_exp == 0 {
        // Subnormal: scale into the normal range first.
        return ln(x * 18_014_398_509_481_984.0) - 54.0 * std::f64::consts::LN_2;
    }
    let m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    #[allow(
        clippy::cast_possible_wrap,
        reason = "the biased exponent is 11 bits: it fits an i32"
    )]
    let e = i32::try_from(raw_exp).unwrap_or(0).saturating_sub(1023);
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let mut term = t;
    let mut sum = 0.0;
    let mut k = 1.0;
    // t <= 1/3, so t^(2n+1) falls below 1e-17 within 20 terms.
    for _ in 0..20 {
        sum += term / k;
        term *= t2;
        k += 2.0;
    }
    2.0 * sum + f64::from(e) * std::f64::consts::LN_2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_the_platform_closely() {
        for x in [1e-300, 1e-9, 0.001, 0.25, 0.5, 0.75, 1.0, 2.0, 10.0, 1e12] {
            assert!((ln(x) - x.ln()).abs() < 1e-12, "ln({x})");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_numbers() {
        let mut a = Rng::new(7, 1);
        let mut b = Rng::new(7, 1);
        let mut c = Rng::new(7, 2);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn exponential_draws_have_about_their_mean() {
        let mut r = Rng::new(1, 0);
        let n = 200_000u64;
        let sum: u64 = (0..n).map(|_| r.exp_ms(1_000)).sum();
        let mean = sum / n;
        assert!((980..=1_010).contains(&mean), "{mean}");
    }
}
