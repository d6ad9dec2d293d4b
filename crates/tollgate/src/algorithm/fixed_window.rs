//! Fixed window: one counter per window aligned to multiples of the period since the epoch (or
//! to the calendar, for a calendar period), so every instance reading the same time counts in
//! the same window.
//!
//! State words: `[window start (µs), permits counted in it]`.

use super::Verdict;
use super::{Attempt, Decide, Micros};
use super::{MAX_EXACT, Tier};

/// The window of `now`: its start, its end and its count in `state`; a count from a later
/// window (written by a clock ahead of ours) keeps counting, until that window's end.
#[inline]
pub(super) fn window(tier: &Tier, state: &[u64], now: u64) -> (u64, u64, u64) {
    // Under load the window counted is now's: found without a division. (A state's start is
    // a multiple of its period, as now's window's is: a new period is a new layout. Not so
    // for a calendar's windows, which differ in length.)
    let (written, period) = (state[0], tier.period_micros());
    if written <= now && now - written < period && tier.calendar_period().is_none() {
        return (written, written + period, state[1]);
    }
    let (start, end) = tier.window(now);
    if state[0] > start {
        (state[0], tier.window(state[0]).1, state[1])
    } else if state[0] == start {
        (start, end, state[1])
    } else {
        (start, end, 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedWindow;

impl Decide for FixedWindow {
    fn name(&self) -> &'static str {
        "fixed_window"
    }

    fn takes_calendar(&self) -> bool {
        true
    }

    fn words(&self, _tier: &Tier) -> usize {
        2
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (limit, now) = (tier.limit(), attempt.now.get());
        let (start, end, count) = window(tier, state, now);
        let reset_after = end - now;
        let after = count.saturating_add(attempt.cost);
        if after <= limit {
            if attempt.writes() {
                state[0] = start;
                state[1] = after;
            }
            Verdict::allow(limit, limit - after, reset_after)
        } else {
            Verdict::deny(limit, limit.saturating_sub(count), reset_after, reset_after)
        }
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let (start, _, count) = window(tier, state, now);
        state[0] = start;
        state[1] = count.saturating_add(cost).min(MAX_EXACT - 1);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], _now: Micros, cost: u64, at: Micros) {
        let at = at.get();
        // Only while the window of `at` is the one counted: a later window never held it.
        if state[0] == tier.window(at).0 {
            state[1] = state[1].saturating_sub(cost);
        }
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(tier.window(state[0]).1)
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND, START};

    #[test]
    fn counts_up_to_the_limit_then_denies_until_the_window_ends() {
        let mut key = Key::new(Algorithm::FixedWindow, [Tier::per_minute(3)]);
        key.advance(10 * SECOND);
        assert_eq!(key.admitted(5, 1), 3);
        let denied = key.check(1);
        assert_eq!(denied.remaining(), 0);
        assert_eq!(denied.retry_after().unwrap().as_secs(), 50);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn admits_twice_the_limit_around_a_window_edge() {
        // 100 per minute: 100 in the last 100 ms of one window, 100 in the first 100 ms of the
        // next: 200 within 200 ms, the burst at a window's edge that fixed windows are known for.
        let mut key = Key::new(Algorithm::FixedWindow, [Tier::per_minute(100)]);
        key.at(START + 59 * SECOND + 900_000);
        assert_eq!(key.admitted(150, 1), 100);
        key.at(START + 60 * SECOND);
        assert_eq!(key.admitted(150, 1), 100);
    }

    #[test]
    fn windows_are_aligned_to_the_epoch_not_the_first_request() {
        let mut key = Key::new(Algorithm::FixedWindow, [Tier::new(1, 10 * SECOND_DURATION)]);
        key.at(START + 9 * SECOND);
        assert!(key.check(1).allowed());
        let denied = key.check(1);
        assert_eq!(denied.reset_after().as_secs(), 1);
        key.at(START + 10 * SECOND);
        assert!(key.check(1).allowed());
    }

    #[test]
    fn cost_counts_as_that_many_permits_and_zero_only_looks() {
        let mut key = Key::new(Algorithm::FixedWindow, [Tier::per_second(10)]);
        assert_eq!(key.check(7).remaining(), 3);
        assert!(!key.check(4).allowed());
        let look = key.check(0);
        assert!(look.allowed());
        assert_eq!(look.remaining(), 3);
        assert!(key.check(3).allowed());
    }

    const SECOND_DURATION: std::time::Duration = std::time::Duration::from_secs(1);
}
