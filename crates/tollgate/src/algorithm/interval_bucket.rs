//! Interval-refill bucket (a hard cap on calls to a paid third-party API): the bucket is
//! refilled to the full `limit` once per `period`, the period starting at the first request
//! after the previous one ended. Never more than `limit` in one period, no burst above it; like
//! a fixed window whose start follows the traffic instead of the clock.
//!
//! State words: `[permits used in the current period, its start (µs; 0 = none)]`.

use super::Verdict;
use super::{Attempt, Decide, Micros};
use super::{MAX_EXACT, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntervalBucket;

impl Decide for IntervalBucket {
    fn name(&self) -> &'static str {
        "interval_bucket"
    }

    fn words(&self, _tier: &Tier) -> usize {
        2
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (limit, period, now) = (tier.limit(), tier.period_micros(), attempt.now.get());
        let [used, start] = [state[0], state[1]];
        let running = start != 0 && now < start + period;
        let (used, start) = if running { (used, start) } else { (0, now) };
        let after = used.saturating_add(attempt.cost);
        if after > limit {
            let wait = start + period - now;
            return Verdict::deny(limit, limit.saturating_sub(used), wait, wait);
        }
        if attempt.writes() {
            state[0] = after;
            state[1] = start;
        }
        // A bucket whose period has not started is full: nothing to reset.
        let started = running || attempt.cost > 0;
        let reset_after = if started { start + period - now } else { 0 };
        Verdict::allow(limit, limit - after, reset_after)
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let [used, start] = [state[0], state[1]];
        let running = start != 0 && now < start + tier.period_micros();
        let (used, start) = if running { (used, start) } else { (0, now) };
        state[0] = used.saturating_add(cost).min(MAX_EXACT - 1);
        state[1] = start;
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros) {
        let (now, at) = (now.get(), at.get());
        let start = state[1];
        // Only within the period `at` was taken in: a new period starts full. A period with
        // nothing left taken in it is as if it never started: the next check starts one.
        if start != 0 && at >= start && now < start + tier.period_micros() {
            state[0] = state[0].saturating_sub(cost);
            if state[0] == 0 {
                state[1] = 0;
            }
        }
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(match state[1] {
            0 => 0,
            start => start + tier.period_micros(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND, START};

    #[test]
    fn the_period_starts_at_the_first_request_not_at_a_clock_boundary() {
        let mut key = Key::new(Algorithm::IntervalBucket, [Tier::per_second(3)]);
        key.at(START + 700_000);
        assert_eq!(key.admitted(5, 1), 3);
        // A fixed window would reset at START + 1 s; this bucket refills at START + 1.7 s.
        key.at(START + SECOND);
        assert!(!key.check(1).allowed());
        assert!(key.retry_after_is_exact(1));
        assert_eq!(key.now, START + 1_700_000);
        assert_eq!(key.admitted(5, 1), 2);
    }

    #[test]
    fn never_more_than_the_limit_in_a_period_and_no_accumulated_burst() {
        let mut key = Key::new(Algorithm::IntervalBucket, [Tier::per_second(5)]);
        // Idle for an hour: still only 5, unlike a token bucket with a larger burst.
        key.advance(3_600 * SECOND);
        assert_eq!(key.admitted(20, 1), 5);
        let look = key.check(0);
        assert_eq!((look.remaining(), look.reset_after().as_secs()), (0, 1));
    }

    #[test]
    fn a_look_at_an_idle_bucket_starts_nothing() {
        let mut key = Key::new(Algorithm::IntervalBucket, [Tier::per_second(5)]);
        let look = key.check(0);
        assert_eq!((look.remaining(), look.reset_after().as_micros()), (5, 0));
        assert_eq!(key.state, vec![0, 0]);
    }
}
