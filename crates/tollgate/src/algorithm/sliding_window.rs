//! Sliding window counter: the previous aligned window's count, weighted by how much of it the
//! sliding window still overlaps, plus the current window's count.
//!
//! State words: `[current window start (µs), previous window's count, current window's count]`.
//!
//! The estimate is computed in doubles, in the same order of operations as the Redis script, so
//! both reach the same decisions; with `limit x period` below 2^53 it is exact.

use super::Verdict;
use super::{Attempt, Decide, Micros};
use super::{MAX_EXACT, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindow;

/// The two windows that matter at some time.
#[derive(Debug, Clone, Copy)]
struct Windows {
    start: u64,
    period: u64,
    previous: u64,
    current: u64,
}

impl Windows {
    #[inline]
    fn at(state: &[u64], now: u64, period: u64) -> Self {
        let s = state[0];
        // The window counted is now's (a state's start is always a multiple of its period: a
        // new period is a new layout): found without a division.
        let (start, previous, current) = if s <= now && now - s < period {
            (s, state[1], state[2])
        } else {
            let aligned = now - now % period;
            match s {
                // The current window (or a later one, written by a clock ahead of ours).
                s if s >= aligned => (s, state[1], state[2]),
                s if s + period == aligned => (aligned, state[2], 0),
                _ => (aligned, 0, 0),
            }
        };
        Self {
            start,
            period,
            previous,
            current,
        }
    }

    /// The previous window's weighted count at `now`, in the current window (or before a
    /// later one): the estimate there is this plus the current count.
    #[inline]
    fn weighted_previous(&self, now: u64) -> f64 {
        let period = double(self.period);
        let elapsed = now.saturating_sub(self.start);
        debug_assert!(elapsed < self.period);
        double(self.previous) * ((period - double(elapsed)) / period)
    }

    /// The weighted count at time `t` (no earlier than the window start), if nothing arrives.
    fn estimate(&self, t: u64) -> f64 {
        let period = double(self.period);
        let elapsed = t.saturating_sub(self.start);
        if elapsed < self.period {
            self.weighted_previous(t) + double(self.current)
        } else if elapsed < 2 * self.period {
            double(self.current) * ((period - double(elapsed - self.period)) / period)
        } else {
            0.0
        }
    }

    fn admits(&self, t: u64, cost: u64, limit: u64) -> bool {
        self.estimate(t) + double(cost) <= double(limit)
    }

    /// The earliest time at which `cost` (at most `limit`: rules refuse a cost above their
    /// capacity before any algorithm decides it) is admitted if nothing arrives.
    fn earliest(&self, cost: u64, limit: u64) -> u64 {
        debug_assert!(cost <= limit);
        let (limit_f, cost_f, period) = (limit as f64, cost as f64, self.period as f64);
        let room = limit_f - self.current as f64 - cost_f;
        let mut t = if room >= 0.0 {
            // Only the previous window's weight is in the way: wait for it to shrink to `room`.
            self.start + self.period - (room * period / self.previous as f64).floor() as u64
        } else {
            // The current window alone is too full: it must become the (weighted) previous.
            let room = limit_f - cost_f;
            self.start + 2 * self.period - (room * period / self.current as f64).floor() as u64
        };
        // Doubles may round the division down; step until the estimate really admits.
        while !self.admits(t, cost, limit) {
            t += 1;
        }
        t
    }

    fn reset_at(&self) -> u64 {
        match (self.previous, self.current) {
            (_, c) if c > 0 => self.start + 2 * self.period,
            (p, _) if p > 0 => self.start + self.period,
            _ => 0,
        }
    }
}

fn remaining(limit: u64, estimate: f64) -> u64 {
    // Truncation is the floor of what is not negative; below, 0.
    ((double(limit) - estimate) as i64).max(0) as u64
}

/// `x` as a double, exactly: every count, limit and time here is below 2^53 (rules are
/// validated so, counts stop there, and the Redis module refuses a stored word that is not),
/// so it converts through `i64`, one instruction on x86-64 where a `u64` takes several.
#[inline]
fn double(x: u64) -> f64 {
    debug_assert!(x <= MAX_EXACT);
    x as i64 as f64
}

impl Decide for SlidingWindow {
    fn name(&self) -> &'static str {
        "sliding_window"
    }

    fn words(&self, _tier: &Tier) -> usize {
        3
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (limit, now, cost) = (tier.limit(), attempt.now.get(), attempt.cost);
        let mut windows = Windows::at(state, now, tier.period_micros());
        // The previous window's weight is worked out once for both estimates at `now`.
        let weighted = windows.weighted_previous(now);
        let estimate = weighted + double(windows.current);
        if estimate + double(cost) <= double(limit) {
            windows.current += cost;
            if attempt.writes() {
                state.copy_from_slice(&[windows.start, windows.previous, windows.current]);
            }
            let reset_after = windows.reset_at().saturating_sub(now);
            let estimate = weighted + double(windows.current);
            Verdict::allow(limit, remaining(limit, estimate), reset_after)
        } else {
            Verdict::deny(
                limit,
                remaining(limit, estimate),
                windows.reset_at().saturating_sub(now),
                windows.earliest(cost, limit) - now,
            )
        }
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let w = Windows::at(state, now, tier.period_micros());
        let current = w.current.saturating_add(cost).min(MAX_EXACT - 1);
        state.copy_from_slice(&[w.start, w.previous, current]);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros) {
        let (now, at) = (now.get(), at.get());
        let period = tier.period_micros();
        let mut w = Windows::at(state, now, period);
        let window = at - at % period;
        if window == w.start {
            w.current = w.current.saturating_sub(cost);
        } else if window + period == w.start {
            w.previous = w.previous.saturating_sub(cost);
        } else {
            return;
        }
        state.copy_from_slice(&[w.start, w.previous, w.current]);
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        let period = tier.period_micros();
        Micros::new(Windows::at(state, state[0], period).reset_at())
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND, START};

    #[test]
    fn the_seed_example_rejects_at_4_25_over_4() {
        // 4 per minute; 3 in the previous window, 1 in the current one; a request at 25% of
        // the current window counts 3 x (1 - 25%) + 2 = 4.25 > 4 and is rejected.
        let mut key = Key::new(Algorithm::SlidingWindow, [Tier::per_minute(4)]);
        key.at(START + 30 * SECOND);
        assert_eq!(key.admitted(3, 1), 3);
        key.at(START + 60 * SECOND);
        assert!(key.check(1).allowed());
        key.at(START + 75 * SECOND);
        let denied = key.check(1);
        assert!(!denied.allowed());
        // 3 x 0.75 + 1 = 3.25 counted: no whole permit remains.
        assert_eq!(denied.remaining(), 0);
        // The previous window's weight must fall to 2/3: at 1:20 it is 3 x (40/60) = 2.
        assert_eq!(denied.retry_after().unwrap().as_secs(), 5);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn the_second_seed_example_rejects_at_11_75_over_10() {
        // 10 per minute; 9 in the previous window, 5 in the current (a state this rule would
        // not itself let arise, so it is set directly); at 25%: 9 x 0.75 + 5 + 1 = 12.75 > 10.
        let mut key = Key::new(Algorithm::SlidingWindow, [Tier::per_minute(10)]);
        key.state = vec![START + 60 * SECOND, 9, 5];
        key.at(START + 75 * SECOND);
        let denied = key.check(1);
        assert!(!denied.allowed());
        // 9 x 0.75 + 5 = 11.75 counted: over the limit, nothing remains.
        assert_eq!(denied.remaining(), 0);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn a_full_current_window_waits_for_the_next_one_to_weigh_it_down() {
        let mut key = Key::new(Algorithm::SlidingWindow, [Tier::per_minute(4)]);
        assert_eq!(key.admitted(5, 1), 4);
        let denied = key.check(2);
        // In the next window 4 x (1 - f) + 2 <= 4 needs f >= 1/2: 30 s into it.
        assert_eq!(denied.retry_after().unwrap().as_secs(), 90);
        assert!(key.retry_after_is_exact(2));
    }

    #[test]
    fn smooths_the_fixed_window_edge_burst() {
        let mut key = Key::new(Algorithm::SlidingWindow, [Tier::per_minute(100)]);
        key.at(START + 59 * SECOND + 900_000);
        assert_eq!(key.admitted(150, 1), 100);
        key.at(START + 60 * SECOND + 100_000);
        // The previous window still weighs 100 x 59.9/60: nothing more fits.
        assert_eq!(key.admitted(150, 1), 0);
    }

    #[test]
    fn idle_keys_forget_everything_after_two_windows() {
        let mut key = Key::new(Algorithm::SlidingWindow, [Tier::per_minute(4)]);
        assert_eq!(key.admitted(4, 1), 4);
        key.advance(120 * SECOND);
        assert_eq!(key.admitted(5, 1), 4);
    }
}
