//! Sliding window of sub-windows (Sentinel's `LeapArray`): the period is split into `count`
//! aligned sub-windows; a check counts the `count` most recent ones. Precision grows with the
//! count: the window slides one sub-window at a time.
//!
//! State words: `[index of the newest sub-window written, count of sub-window i at i % count]`
//! where a sub-window's index is its start time divided by its length.

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};
use super::{MAX_EXACT, Tier};

/// Parameters of [`Algorithm::SubWindows`](super::Algorithm::SubWindows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubWindows {
    /// Sub-windows per period, from 1 to 1000; the period must split into whole microseconds.
    pub count: u32,
}

const MAX_COUNT: u32 = 1_000;

/// One tier's sub-window counters, read from its state words.
struct Ring<'a> {
    state: &'a [u64],
    count: u64,
    newest: u64,
}

impl Ring<'_> {
    /// The counters of sub-windows `oldest..=newest` (at most `count`; none if `oldest` is
    /// later), in order, as at most two runs of the ring: one division, not one per
    /// sub-window.
    fn runs(&self, oldest: u64) -> (&[u64], &[u64]) {
        if oldest > self.newest {
            return (&[], &[]);
        }
        let ring = &self.state[1..=self.count as usize];
        let first = (oldest % self.count) as usize;
        let end = first + (self.newest - oldest + 1) as usize;
        match end.checked_sub(ring.len()) {
            None | Some(0) => (&ring[first..end], &[]),
            Some(wrapped) => (&ring[first..], &ring[..wrapped]),
        }
    }

    /// Permits in the window whose newest sub-window is `at` (at or after the newest written,
    /// so no cell read belongs to an overwritten sub-window). When `at` is the newest written
    /// (and a whole ring after the epoch), the window is the whole ring, summed without
    /// finding where it starts.
    #[inline]
    fn sum(&self, at: u64) -> u64 {
        if at == self.newest && at >= self.count - 1 {
            return self.state[1..=self.count as usize].iter().sum();
        }
        let (first, second) = self.runs((at + 1).saturating_sub(self.count));
        first.iter().sum::<u64>() + second.iter().sum::<u64>()
    }

    /// The first sub-window after `current` (whose window holds `used`) at which `cost` is
    /// admitted if nothing arrives: the window's count as its oldest sub-windows leave it, one
    /// at a time, so one pass over the ring rather than a sum per sub-window.
    fn next_admitting(&self, current: u64, used: u64, cost: u64, limit: u64) -> u64 {
        let mut total = used;
        for at in current + 1..=current + self.count {
            // The sub-window leaving as `at` becomes the newest, if it was counted.
            if let Some(left) = at
                .checked_sub(self.count)
                .filter(|&left| left <= self.newest)
            {
                total -= self.state[1 + (left % self.count) as usize];
            }
            if total + cost <= limit {
                return at;
            }
        }
        unreachable!("a whole period later every counted permit has left")
    }

    /// When every permit counted at `at` has left the window, if nothing arrives.
    fn reset_at(&self, at: u64, length: u64) -> u64 {
        let oldest = (at + 1).saturating_sub(self.count);
        let (first, second) = self.runs(oldest);
        let newest_counted = match second.iter().rposition(|&c| c > 0) {
            Some(p) => Some(first.len() + p),
            None => first.iter().rposition(|&c| c > 0),
        };
        newest_counted.map_or(0, |p| (oldest + p as u64 + self.count) * length)
    }
}

/// Moves a state's newest sub-window on to `current` (not earlier than the newest), emptying
/// the sub-windows it passes; the position of `current`'s counter.
#[inline]
fn advance(state: &mut [u64], count: u64, current: u64) -> usize {
    let stale = (state[0] + 1).max(current.saturating_sub(count - 1));
    let cell = (current % count) as usize;
    if stale <= current {
        // Back from `current`'s counter to `stale`'s, wrapping around the ring.
        let ring = &mut state[1..=count as usize];
        let mut at = cell;
        for _ in stale..=current {
            ring[at] = 0;
            at = at.checked_sub(1).unwrap_or(ring.len() - 1);
        }
    }
    state[0] = current;
    1 + cell
}

impl Decide for SubWindows {
    fn name(&self) -> &'static str {
        "sub_windows"
    }

    fn words(&self, _tier: &Tier) -> usize {
        1 + self.count as usize
    }

    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        if self.count == 0 || self.count > MAX_COUNT {
            return Err(Invalid::Parameter(
                "count",
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        if !tier.period_micros().is_multiple_of(u64::from(self.count)) {
            return Err(Invalid::Tier(
                "period",
                format!(
                    "{:?} does not split into {} sub-windows of whole microseconds",
                    tier.period(),
                    self.count
                ),
            ));
        }
        Ok(())
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let count = u64::from(self.count);
        let length = tier.period_micros() / count;
        let (limit, now, cost) = (tier.limit(), attempt.now.get(), attempt.cost);
        // Under load the newest sub-window written is now's: found without a division. A
        // sub-window written by a clock ahead of ours is treated as the current one.
        let newest = state[0];
        let current = match now.checked_sub(newest.wrapping_mul(length)) {
            Some(into) if into < length => {
                // The hottest path: the window is the whole ring, and an admitted cost goes
                // into the newest sub-window's counter, which it already holds.
                if newest >= count - 1 && cost > 0 {
                    let ring = &mut state[1..=count as usize];
                    let used: u64 = ring.iter().sum();
                    if used + cost <= limit {
                        if attempt.writes() {
                            ring[(newest % count) as usize] += cost;
                        }
                        let reset_after = (newest + count) * length - now;
                        return Verdict::allow(limit, limit - used - cost, reset_after);
                    }
                }
                newest
            }
            _ => (now / length).max(newest),
        };
        let ring = Ring {
            state,
            count,
            newest,
        };
        let used = ring.sum(current);
        if used + cost > limit {
            let next = ring.next_admitting(current, used, cost, limit);
            return Verdict::deny(
                limit,
                limit.saturating_sub(used),
                ring.reset_at(current, length).saturating_sub(now),
                next * length - now,
            );
        }
        if cost == 0 {
            let reset_after = ring.reset_at(current, length).saturating_sub(now);
            return Verdict::allow(limit, limit - used, reset_after);
        }
        if attempt.writes() {
            let cell = advance(state, count, current);
            state[cell] += cost;
        }
        Verdict::allow(limit, limit - used - cost, (current + count) * length - now)
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let count = u64::from(self.count);
        let current = (now / (tier.period_micros() / count)).max(state[0]);
        let cell = advance(state, count, current);
        state[cell] = state[cell].saturating_add(cost).min(MAX_EXACT - 1);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], _now: Micros, cost: u64, at: Micros) {
        let at = at.get();
        let count = u64::from(self.count);
        let index = at / (tier.period_micros() / count);
        // Only a sub-window still held: not overwritten by a later one in its cell.
        if index <= state[0] && state[0] - index < count {
            let cell = &mut state[1 + (index % count) as usize];
            *cell = cell.saturating_sub(cost);
        }
    }

    fn module_parameters(&self) -> [f64; 2] {
        [f64::from(self.count), 0.0]
    }

    fn script_parameters(&self, _tier: &Tier) -> [f64; 5] {
        [f64::from(self.count), 0.0, 0.0, 0.0, 0.0]
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(
            (state[0] + u64::from(self.count)) * (tier.period_micros() / u64::from(self.count)),
        )
    }
}

/// The sub-windows of the module's parameters (see [`Decide::module_parameters`]).
#[cfg(feature = "inside-redis")]
pub(crate) fn of_parameters(p: [f64; 2]) -> Result<super::Algorithm, &'static str> {
    let count = crate::layout::whole(p[0])?;
    let count = u32::try_from(count).map_err(|_| "too many sub-windows")?;
    Ok(super::Algorithm::SubWindows(SubWindows { count }))
}

#[cfg(test)]
mod tests {
    use super::{Ring, SubWindows};
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND, START};

    fn six_by_ten_seconds(limit: u64) -> Key {
        Key::new(
            Algorithm::SubWindows(SubWindows { count: 6 }),
            [Tier::per_minute(limit)],
        )
    }

    #[test]
    fn blocks_the_fixed_window_edge_burst() {
        // The seed: 100 per minute in six 10 s sub-windows; 100 at 0:50-1:00 leave no room
        // at 1:00-1:10.
        let mut key = six_by_ten_seconds(100);
        key.at(START + 55 * SECOND);
        assert_eq!(key.admitted(150, 1), 100);
        key.at(START + 65 * SECOND);
        assert_eq!(key.admitted(10, 1), 0);
        // The 0:50 sub-window leaves the window at 1:50.
        let denied = key.check(1);
        assert_eq!(denied.retry_after().unwrap().as_secs(), 45);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn precision_is_one_sub_window() {
        // The seed's imprecision: from 0:05 to 1:05, 200 requests pass with 10 s sub-windows.
        let mut key = six_by_ten_seconds(100);
        key.at(START + 5 * SECOND);
        assert_eq!(key.admitted(150, 1), 100);
        key.at(START + 60 * SECOND);
        assert_eq!(key.admitted(150, 1), 100);
    }

    #[test]
    fn old_sub_windows_slide_out_one_at_a_time() {
        let mut key = six_by_ten_seconds(6);
        for i in 0..6 {
            key.at(START + i * 10 * SECOND);
            assert!(key.check(1).allowed());
        }
        key.at(START + 59 * SECOND);
        assert!(!key.check(1).allowed());
        key.at(START + 60 * SECOND);
        assert_eq!(key.admitted(3, 1), 1);
        key.at(START + 70 * SECOND);
        assert_eq!(key.admitted(3, 1), 1);
        key.advance(60 * SECOND);
        assert_eq!(key.admitted(10, 1), 6);
    }

    #[test]
    fn a_look_reports_remaining_without_counting() {
        let mut key = six_by_ten_seconds(10);
        assert!(key.check(4).allowed());
        let look = key.check(0);
        assert_eq!((look.allowed(), look.remaining()), (true, 6));
        assert_eq!(look.reset_after().as_secs(), 60);
    }

    proptest::proptest! {
        /// The one pass finds the sub-window a sum per sub-window finds, for any ring.
        #[test]
        fn the_next_admitting_sub_window_is_the_first_whose_sum_admits(
            counts in proptest::collection::vec(0u64..50, 1..12),
            newest in 0u64..40,
            ahead in 0u64..15,
            cost in 1u64..20,
            slack in 0u64..200,
        ) {
            let count = counts.len() as u64;
            let mut state = vec![newest];
            state.extend(&counts);
            let ring = Ring { state: &state, count, newest };
            let current = newest + ahead;
            let used = ring.sum(current);
            proptest::prop_assume!(used > 0);
            // A limit the window is over for the cost, which the cost alone is not.
            let limit = cost + slack % used;
            let expected = (current + 1..=current + count)
                .find(|&at| ring.sum(at) + cost <= limit)
                .unwrap();
            proptest::prop_assert_eq!(ring.next_admitting(current, used, cost, limit), expected);
        }
    }
}
