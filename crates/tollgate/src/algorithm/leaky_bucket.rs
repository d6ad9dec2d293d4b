//! Leaky bucket of capacity `burst`, leaking `limit` per `period`. Each permit pours one unit
//! of water in. As a **meter** it rejects what would overflow (nginx `limit_req` with
//! `nodelay`); as a **shaper** it also admits what fits, but the request must wait until the
//! water ahead of it has leaked, and the decision says how long (nginx without `nodelay`).
//!
//! State words: `[water level (rate units), time of the last admission (µs)]`.

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};
use super::{MAX_EXACT, Tier};

/// Parameters of [`Algorithm::LeakyBucket`](super::Algorithm::LeakyBucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeakyBucket {
    /// Rejects a request that would overflow the bucket.
    #[default]
    Meter,
    /// Admits a request that fits, with a delay until the water ahead of it has leaked. A
    /// caller of `acquire` may bound the delay it accepts with its timeout.
    Shaper,
}

impl Decide for LeakyBucket {
    fn name(&self) -> &'static str {
        match self {
            Self::Meter => "leaky_bucket",
            Self::Shaper => "leaky_bucket_shaper",
        }
    }

    fn uses_burst(&self) -> bool {
        true
    }

    fn words(&self, _tier: &Tier) -> usize {
        2
    }

    fn capacity(&self, tier: &Tier) -> u64 {
        tier.burst()
    }

    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        tier.rate().check_capacity(tier.burst())
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let rate = tier.rate();
        let [level, last] = [state[0], state[1]];
        let level = level.saturating_sub(rate.drained(attempt.now.get().saturating_sub(last)));
        let verdict = rate.bucket(tier.burst(), level, attempt.cost);
        let verdict = match self {
            Self::Meter => verdict,
            Self::Shaper => {
                let delay = rate.micros(level);
                let patience = attempt.max_delay.unwrap_or(u64::MAX);
                if verdict.allowed && delay > patience {
                    // Fits the bucket, but the caller will not wait that long.
                    let wait = delay - patience;
                    Verdict::deny(verdict.limit, verdict.remaining, delay, wait)
                } else if verdict.allowed {
                    verdict.with_delay(delay)
                } else {
                    verdict
                }
            }
        };
        if verdict.allowed && attempt.writes() {
            state[0] = level + rate.units(attempt.cost);
            state[1] = attempt.now.get().max(last);
        }
        verdict
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let rate = tier.rate();
        let [level, last] = [state[0], state[1]];
        let level = level.saturating_sub(rate.drained(now.saturating_sub(last)));
        state[0] = level.saturating_add(rate.units(cost)).min(MAX_EXACT - 1);
        state[1] = now.max(last);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, _at: Micros) {
        let now = now.get();
        let rate = tier.rate();
        let [level, last] = [state[0], state[1]];
        let level = level.saturating_sub(rate.drained(now.saturating_sub(last)));
        state[0] = level.saturating_sub(rate.units(cost));
        state[1] = now.max(last);
    }

    fn module_parameters(&self) -> [f64; 2] {
        [f64::from(u8::from(*self == Self::Shaper)), 0.0]
    }

    fn script_parameters(&self, _tier: &Tier) -> [f64; 5] {
        let shaper = f64::from(u8::from(*self == Self::Shaper));
        [shaper, 0.0, 0.0, 0.0, 0.0]
    }

    fn layout(&self, tier: &Tier, feed: &mut dyn FnMut(u64)) {
        // The level is kept in units of the rate: a new rate is a new layout.
        let rate = tier.rate();
        for n in [tier.period_micros(), rate.per_permit, rate.per_micro] {
            feed(n);
        }
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(state[1] + tier.rate().micros(state[0]))
    }
}

/// The leaky bucket of the module's parameters (see [`Decide::module_parameters`]): 1, a shaper.
#[cfg(feature = "inside-redis")]
pub(crate) fn of_parameters(p: [f64; 2]) -> Result<super::Algorithm, &'static str> {
    Ok(super::Algorithm::LeakyBucket(match p[0] == 1.0 {
        true => LeakyBucket::Shaper,
        false => LeakyBucket::Meter,
    }))
}

#[cfg(test)]
mod tests {
    use super::LeakyBucket;
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND};

    #[test]
    fn meter_rejects_overflow_and_leaks_at_the_rate() {
        let mut key = Key::new(
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            [Tier::per_second(10).with_burst(5)],
        );
        assert_eq!(key.admitted(10, 1), 5);
        let denied = key.check(1);
        assert_eq!(denied.retry_after().unwrap().as_millis(), 100);
        assert_eq!(denied.delay().as_millis(), 0);
        assert!(key.retry_after_is_exact(1));
        key.advance(SECOND);
        assert_eq!(key.admitted(10, 1), 5);
    }

    #[test]
    fn shaper_admits_what_fits_with_a_delay_that_spaces_requests_at_the_rate() {
        let mut key = Key::new(
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            [Tier::per_second(10).with_burst(5)],
        );
        let delays: Vec<u128> = (0..5).map(|_| key.check(1).delay().as_millis()).collect();
        assert_eq!(delays, [0, 100, 200, 300, 400]);
        let denied = key.check(1);
        assert!(!denied.allowed());
        assert_eq!(denied.retry_after().unwrap().as_millis(), 100);
        key.advance(SECOND / 2);
        assert_eq!(key.check(1).delay().as_millis(), 0);
    }

    #[test]
    fn shaper_respects_the_delay_a_caller_accepts() {
        let mut key = Key::new(
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            [Tier::per_second(10)],
        );
        assert!(key.attempt(3, Some(0)).allowed());
        let impatient = key.attempt(1, Some(100_000));
        assert!(!impatient.allowed());
        assert_eq!(impatient.retry_after().unwrap().as_millis(), 200);
        assert_eq!(key.attempt(1, Some(300_000)).delay().as_millis(), 300);
    }
}
