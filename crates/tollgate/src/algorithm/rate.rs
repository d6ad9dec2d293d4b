//! Exact rate arithmetic shared by the bucket algorithms.
//!
//! A rate of `limit` permits per `period` µs is kept as two integers reduced by their gcd: one
//! permit is `per_permit` units and one microsecond drains (or refills) `per_micro` units. The
//! emission interval `per_permit / per_micro` µs is then exact, even for 3 per second, and no
//! rounding can make a bucket admit more, or less, than its rate.

use super::Invalid;
use super::Verdict;

/// Integers up to 2^53 are exact in a double; every quantity an algorithm computes stays below
/// this so the Redis Lua functions (doubles only) decide exactly as the Rust code does.
pub(crate) const MAX_EXACT: u64 = 1 << 53;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rate {
    pub(crate) per_permit: u64,
    pub(crate) per_micro: u64,
}

impl Rate {
    /// `limit` permits per `period_micros`; zero inputs give a zero rate that validation rejects.
    pub(crate) fn new(limit: u64, period_micros: u64) -> Self {
        let divisor = gcd(limit, period_micros).max(1);
        Self {
            per_permit: period_micros / divisor,
            per_micro: limit / divisor,
        }
    }

    /// Units of `permits`; exact for any cost up to a validated burst.
    #[inline]
    pub(crate) fn units(self, permits: u64) -> u64 {
        permits.saturating_mul(self.per_permit)
    }

    /// Whole permits in `units`, rounded down.
    #[inline]
    pub(crate) fn permits(self, units: u64) -> u64 {
        units / self.per_permit
    }

    /// Microseconds to drain `units`, rounded up so a wait is never short.
    #[inline]
    pub(crate) fn micros(self, units: u64) -> u64 {
        units.div_ceil(self.per_micro)
    }

    /// Units drained over `elapsed` microseconds (saturating).
    #[inline]
    pub(crate) fn drained(self, elapsed: u64) -> u64 {
        elapsed.saturating_mul(self.per_micro)
    }

    /// Rejects a bucket so large that its arithmetic would leave the exact range of a double.
    pub(crate) fn check_capacity(self, burst: u64) -> Result<(), Invalid> {
        let fits = burst
            .checked_mul(self.per_permit)
            .and_then(|units| units.checked_add(self.per_micro))
            .is_some_and(|units| units < MAX_EXACT);
        if fits {
            return Ok(());
        }
        Err(Invalid::Tier(
            "burst",
            format!(
                "a burst of {burst} at this rate needs {burst} x {} units, beyond exact \
                 arithmetic (2^53); lower the burst or pick a limit that divides the period",
                self.per_permit
            ),
        ))
    }

    /// The verdict for `cost` permits entering a bucket of `burst` permits that holds `level`
    /// units: admitted while the level stays within the bucket.
    #[inline]
    pub(crate) fn bucket(self, burst: u64, level: u64, cost: u64) -> Verdict {
        let capacity = self.units(burst);
        let after = level.saturating_add(self.units(cost));
        if after <= capacity {
            Verdict::allow(burst, self.permits(capacity - after), self.micros(after))
        } else {
            Verdict::deny(
                burst,
                self.permits(capacity.saturating_sub(level)),
                self.micros(level),
                self.micros(after - capacity),
            )
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_per_second_has_an_exact_interval() {
        let rate = Rate::new(3, 1_000_000);
        assert_eq!(
            rate,
            Rate {
                per_permit: 1_000_000,
                per_micro: 3
            }
        );
        // One permit drains in 333_333.3 µs: a wait rounds up, never down.
        assert_eq!(rate.micros(rate.units(1)), 333_334);
        assert_eq!(rate.micros(rate.units(3)), 1_000_000);
    }

    #[test]
    fn round_rates_reduce_to_small_units() {
        assert_eq!(
            Rate::new(1_000_000, 86_400_000_000),
            Rate {
                per_permit: 86_400,
                per_micro: 1
            }
        );
    }

    #[test]
    fn capacity_beyond_exact_arithmetic_is_rejected() {
        // 1_000_001 shares no factor with a day in microseconds: nothing reduces.
        let rate = Rate::new(1_000_001, 86_400_000_000);
        assert!(rate.check_capacity(10).is_ok());
        assert!(matches!(
            rate.check_capacity(1_000_001),
            Err(Invalid::Tier("burst", _))
        ));
    }

    #[test]
    fn bucket_admits_up_to_capacity_and_says_when_to_retry() {
        let rate = Rate::new(10, 1_000_000); // a permit drains in 100 ms
        let full = rate.units(10);
        let v = rate.bucket(10, full - rate.units(1), 1);
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
        let v = rate.bucket(10, full, 2);
        assert!(!v.allowed);
        assert_eq!(v.retry_after, 200_000);
        assert_eq!(v.reset_after, 1_000_000);
    }
}
