//! GCRA, the generic cell rate algorithm: the leaky bucket meter kept as one theoretical
//! arrival time (TAT), the time at which the bucket would be empty. The level at `now` is
//! `TAT - now`, so one timestamp replaces a level and a time.
//!
//! The TAT is exact: whole microseconds plus a fraction in `1 / per_micro` µs, which needs a
//! second word only when the emission interval is not a whole number of microseconds.
//!
//! State words: `[TAT (µs)]`, or `[TAT (µs), TAT fraction]`.

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};
use super::{MAX_EXACT, Tier};

/// The TAT and its fraction at `now`: once the TAT has passed, the bucket is empty and the
/// schedule restarts from now. A fraction kept under an earlier rate of this rule counts as
/// under a microsecond.
#[inline]
fn schedule(state: &[u64], now: u64, per_micro: u64) -> (u64, u64) {
    let fraction = state.get(1).map_or(0, |&f| f.min(per_micro - 1));
    if state[0] >= now {
        (state[0], fraction)
    } else {
        (now, 0)
    }
}

/// The bucket's level at `now`, in units.
fn level(state: &[u64], now: u64, per_micro: u64) -> u64 {
    let (tat, fraction) = schedule(state, now, per_micro);
    (tat - now)
        .saturating_mul(per_micro)
        .saturating_add(fraction)
}

/// Writes the schedule of a bucket at `level` units at `now`.
fn set_level(state: &mut [u64], now: u64, per_micro: u64, level: u64) {
    state[0] = now + level / per_micro;
    if let Some(word) = state.get_mut(1) {
        *word = level % per_micro;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra;

impl Decide for Gcra {
    fn name(&self) -> &'static str {
        "gcra"
    }

    fn uses_burst(&self) -> bool {
        true
    }

    fn words(&self, tier: &Tier) -> usize {
        if tier.rate().per_micro == 1 { 1 } else { 2 }
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
        let now = attempt.now.get();
        let (tat, fraction) = schedule(state, now, rate.per_micro);
        let level = (tat - now)
            .saturating_mul(rate.per_micro)
            .saturating_add(fraction);
        let verdict = rate.bucket(tier.burst(), level, attempt.cost);
        if verdict.allowed && attempt.writes() {
            let ticks = fraction + rate.units(attempt.cost);
            state[0] = tat + ticks / rate.per_micro;
            if let Some(word) = state.get_mut(1) {
                *word = ticks % rate.per_micro;
            }
        }
        verdict
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let rate = tier.rate();
        // The level in units, kept below 2^53 so that it stays exact in a double.
        let level = level(state, now, rate.per_micro)
            .saturating_add(rate.units(cost))
            .min(MAX_EXACT - 1);
        set_level(state, now, rate.per_micro, level);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, _at: Micros) {
        let now = now.get();
        let rate = tier.rate();
        // Never below empty: the schedule moves back by the cost, never before now.
        let level = level(state, now, rate.per_micro).saturating_sub(rate.units(cost));
        set_level(state, now, rate.per_micro, level);
    }

    fn expires_at(&self, _tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(state[0] + u64::from(state.get(1).is_some_and(|&f| f > 0)))
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND};

    #[test]
    fn admits_the_burst_then_one_per_emission_interval() {
        let mut key = Key::new(Algorithm::Gcra, [Tier::per_second(10).with_burst(3)]);
        assert_eq!(key.admitted(5, 1), 3);
        let denied = key.check(1);
        assert_eq!(denied.retry_after().unwrap().as_millis(), 100);
        assert_eq!(denied.reset_after().as_millis(), 300);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn one_word_when_the_interval_is_whole_microseconds() {
        let whole = Key::new(Algorithm::Gcra, [Tier::per_second(10)]);
        assert_eq!(whole.state.len(), 1);
        let fractional = Key::new(Algorithm::Gcra, [Tier::per_second(3)]);
        assert_eq!(fractional.state.len(), 2);
    }

    #[test]
    fn fractional_intervals_accumulate_exactly() {
        // Checked every microsecond for 3 s: the burst of 3 plus exactly 9 more. An interval
        // rounded up to 333_334 µs would have let only 8 more through by then.
        let mut key = Key::new(Algorithm::Gcra, [Tier::per_second(3)]);
        let mut admitted = u64::from(key.check(1).allowed());
        for _ in 0..3 * SECOND {
            key.advance(1);
            admitted += u64::from(key.check(1).allowed());
        }
        assert_eq!(admitted, 12);
        assert!(key.retry_after_is_exact(1));
    }
}
