//! Hit counter: a fixed window that counts every hit, admitted or not, as the Envoy rate limit
//! service counts (`INCRBY`, then compare): a check is over the limit when the window's count,
//! its own hits included, exceeds the limit, and its hits count all the same. So a caller
//! that checks with a cost of 0 sees whether earlier hits went over, and a cost above the
//! limit is not an error but over the limit (and counted).
//!
//! State words: `[window start (µs), hits counted in it]`, as the fixed window's.
//!
//! In a batch that is denied (all-or-nothing), an item counts its hits only when it is itself
//! over the limit ([`Decide::denied`]): the others consume nothing, as with the Envoy
//! service's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.

use super::Verdict;
use super::fixed_window::window;
use super::{Attempt, Decide, FixedWindow, Micros};
use super::{MAX_EXACT, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HitCounter;

impl Decide for HitCounter {
    fn name(&self) -> &'static str {
        "hit_counter"
    }

    fn takes_calendar(&self) -> bool {
        true
    }

    fn words(&self, _tier: &Tier) -> usize {
        2
    }

    /// Any cost is checked (and counted): one above the limit is over it.
    fn capacity(&self, _tier: &Tier) -> u64 {
        MAX_EXACT - 1
    }

    /// The fixed window's decision (which writes only what it admits); over the limit,
    /// nothing remains.
    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let verdict = FixedWindow.decide(tier, state, attempt);
        if verdict.allowed {
            verdict
        } else {
            Verdict::deny(verdict.limit, 0, verdict.reset_after, verdict.reset_after)
        }
    }

    fn denied(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) {
        let (start, _, count) = window(tier, state, attempt.now.get());
        let after = count.saturating_add(attempt.cost).min(MAX_EXACT - 1);
        if after > tier.limit() {
            state[0] = start;
            state[1] = after;
        }
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        FixedWindow.debit(tier, state, now, cost);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros) {
        FixedWindow.credit(tier, state, now, cost, at);
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(tier.window(state[0]).1)
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND};

    #[test]
    fn hits_over_the_limit_count_too() {
        let mut key = Key::new(Algorithm::HitCounter, [Tier::per_minute(10)]);
        key.advance(SECOND);
        assert_eq!(key.check(8).remaining(), 2);
        // Over: counted all the same, so a look (cost 0) now sees the window over.
        let over = key.check(5);
        assert!(!over.allowed());
        assert_eq!(over.remaining(), 0);
        assert!(!key.check(0).allowed());
        assert!(!key.check(1).allowed());
        // The next window starts from nothing.
        key.advance(60 * SECOND);
        assert_eq!(key.check(1).remaining(), 9);
    }

    #[test]
    fn a_cost_above_the_limit_is_over_not_an_error() {
        let mut key = Key::new(Algorithm::HitCounter, [Tier::per_minute(3)]);
        let over = key.check(4);
        assert!(!over.allowed());
        assert_eq!(over.remaining(), 0);
        assert!(!key.check(0).allowed());
    }

    #[test]
    fn a_look_at_the_limit_is_within_it() {
        let mut key = Key::new(Algorithm::HitCounter, [Tier::per_minute(3)]);
        assert!(key.check(3).allowed());
        let look = key.check(0);
        assert!(look.allowed());
        assert_eq!(look.remaining(), 0);
        assert!(!key.check(1).allowed());
    }
}
