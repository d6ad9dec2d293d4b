//! Sliding log: the timestamps of the last `limit` admitted permits. Exact: no window of length
//! `period` ever holds more than `limit` permits, and a decision costs O(1) (O(log limit) to
//! report the remaining count).
//!
//! State words: `[permits ever logged, then a ring of limit timestamps]`; the k-th most recent
//! permit is at ring index `(logged - k) % limit`. Timestamps never decrease along the ring.

use super::Tier;
use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingLog;

/// The largest limit a sliding log accepts: memory is 8 bytes per permit of the limit per key.
const MAX_LIMIT: u64 = 100_000;

struct Log<'a> {
    state: &'a [u64],
    limit: u64,
    /// Permits held in the ring: those logged, at most `limit`.
    held: u64,
    /// Ring position of the most recent permit (0 when none was logged).
    newest: u64,
}

impl<'a> Log<'a> {
    /// The log of `state` for a tier of `limit`: its one division, finding the most recent
    /// permit's position; every other position is counted from it.
    #[inline]
    fn new(state: &'a [u64], limit: u64) -> Self {
        let logged = state[0];
        Self {
            state,
            limit,
            held: logged.min(limit),
            newest: logged.checked_sub(1).map_or(0, |l| l % limit),
        }
    }

    fn logged(&self) -> u64 {
        self.state[0]
    }

    /// The timestamp of the `k`-th most recent permit (1-based), if that many are held.
    #[inline]
    fn recent(&self, k: u64) -> Option<u64> {
        (k >= 1 && k <= self.held).then(|| {
            let back = k - 1;
            let at = match self.newest.checked_sub(back) {
                Some(at) => at,
                None => self.newest + self.limit - back,
            };
            self.state[1 + at as usize]
        })
    }

    /// Ring position of the next permit logged.
    #[inline]
    fn next(&self) -> u64 {
        match self.logged() {
            0 => 0,
            _ if self.newest + 1 == self.limit => 0,
            _ => self.newest + 1,
        }
    }

    /// Permits logged in the window `(now - period, now]`. The ends are looked at first: an
    /// idle key (its newest permit out of the window) and a full one (its oldest held permit
    /// in it) need no search.
    #[inline]
    fn in_window(&self, now: u64, period: u64) -> u64 {
        let held = self.held;
        let within = |k| self.recent(k).is_some_and(|t| t + period > now);
        if !within(1) {
            return 0;
        }
        if within(held) {
            return held;
        }
        // The newest is in the window and the oldest held is not: search between them.
        let (mut inside, mut outside) = (1, held);
        while outside - inside > 1 {
            let mid = (inside + outside) / 2;
            match self.recent(mid) {
                Some(t) if t + period > now => inside = mid,
                _ => outside = mid,
            }
        }
        inside
    }
}

/// Logs `count` permits at `at` from ring position `next` on (`count` at most `limit`).
fn log_permits(state: &mut [u64], limit: u64, mut next: u64, count: u64, at: u64) {
    for _ in 0..count {
        state[1 + next as usize] = at;
        next = if next + 1 == limit { 0 } else { next + 1 };
    }
    state[0] += count;
}

impl Decide for SlidingLog {
    fn name(&self) -> &'static str {
        "sliding_log"
    }

    fn words(&self, tier: &Tier) -> usize {
        1 + tier.limit() as usize
    }

    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        if tier.limit() > MAX_LIMIT {
            return Err(Invalid::Tier(
                "limit",
                format!(
                    "a sliding log keeps one timestamp per permit, so at most {MAX_LIMIT}; \
                     use sliding_window or sub_windows for larger limits"
                ),
            ));
        }
        Ok(())
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (limit, period, now, cost) = (
            tier.limit(),
            tier.period_micros(),
            attempt.now.get(),
            attempt.cost,
        );
        let log = Log::new(state, limit);
        let newest = log.recent(1).unwrap_or(0);
        let used = log.in_window(now, period);
        let reset_after = if used > 0 { newest + period - now } else { 0 };
        // Admitted unless the (limit - cost + 1)-th most recent permit is still in the window.
        // Only when the window holds too many for the cost can a permit in it block.
        let blocking = (used + cost > limit)
            .then(|| log.recent(limit + 1 - cost))
            .flatten()
            .filter(|&t| t + period > now);
        if let Some(blocking) = blocking {
            return Verdict::deny(limit, limit - used, reset_after, blocking + period - now);
        }
        if attempt.writes() {
            // A clock behind the newest entry logs at the newest time, keeping the ring sorted.
            let next = log.next();
            log_permits(state, limit, next, cost, now.max(newest));
        }
        let reset_after = if cost > 0 {
            now.max(newest) + period - now
        } else {
            reset_after
        };
        Verdict::allow(limit, limit - used - cost, reset_after)
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let limit = tier.limit();
        let log = Log::new(state, limit);
        let (at, next) = (now.max(log.recent(1).unwrap_or(0)), log.next());
        // More than `limit` entries would overwrite each other: the debt is one full log.
        log_permits(state, limit, next, cost.min(limit), at);
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros) {
        let (now, at) = (now.get(), at.get());
        let (limit, period) = (tier.limit(), tier.period_micros());
        let log = Log::new(state, limit);
        // The entries held, oldest first; up to `cost` of those still in the window and
        // logged at or after `at` go, the oldest of them first.
        let held = log.held;
        let mut entries: Vec<u64> = (1..=held).rev().filter_map(|k| log.recent(k)).collect();
        let mut left = cost;
        entries.retain(|&t| {
            let drop = left > 0 && t >= at && t + period > now;
            left -= u64::from(drop);
            !drop
        });
        if left == cost {
            return;
        }
        state.fill(0);
        state[0] = entries.len() as u64;
        state[1..=entries.len()].copy_from_slice(&entries);
    }

    fn layout(&self, tier: &Tier, feed: &mut dyn FnMut(u64)) {
        // A log of timestamps whatever the limit: a new limit keeps the most recent ones.
        feed(tier.period_micros());
    }

    fn adopt(&self, old: &Tier, from: &[u64], new: &Tier, to: &mut [u64]) {
        let log = Log::new(from, old.limit());
        let kept = log.held.min(new.limit());
        to.fill(0);
        to[0] = kept;
        for (i, k) in (1..=kept).rev().enumerate() {
            to[1 + i] = log.recent(k).expect("kept entries are logged");
        }
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        let log = Log::new(state, tier.limit());
        let newest = log.recent(1);
        Micros::new(newest.map_or(0, |newest| newest + tier.period_micros()))
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND, START};

    #[test]
    fn the_seed_example_two_per_minute() {
        // 2 per minute: 1:00:01 passes, 1:01:40 passes (1:00:01 has left), 1:01:50 passes,
        // 1:02:00 is rejected (three in the last minute would be too many).
        let mut key = Key::new(Algorithm::SlidingLog, [Tier::per_minute(2)]);
        key.at(START + SECOND);
        assert!(key.check(1).allowed());
        key.at(START + 100 * SECOND);
        assert!(key.check(1).allowed());
        key.at(START + 110 * SECOND);
        assert!(key.check(1).allowed());
        key.at(START + 120 * SECOND);
        let denied = key.check(1);
        assert!(!denied.allowed());
        assert_eq!(denied.retry_after().unwrap().as_secs(), 40);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn denies_the_fixed_window_edge_burst() {
        let mut key = Key::new(Algorithm::SlidingLog, [Tier::per_minute(100)]);
        key.at(START + 59 * SECOND + 900_000);
        assert_eq!(key.admitted(150, 1), 100);
        key.at(START + 60 * SECOND + 100_000);
        assert_eq!(key.admitted(150, 1), 0);
        key.at(START + 119 * SECOND + 900_000);
        assert_eq!(key.admitted(150, 1), 100);
    }

    #[test]
    fn cost_logs_one_entry_per_permit() {
        let mut key = Key::new(Algorithm::SlidingLog, [Tier::per_second(5)]);
        assert!(key.check(3).allowed());
        key.advance(500_000);
        assert!(key.check(2).allowed());
        assert!(!key.check(1).allowed());
        // The three first permits leave together.
        key.advance(500_000);
        let look = key.check(0);
        assert_eq!(look.remaining(), 3);
        assert!(key.check(3).allowed());
        assert!(key.retry_after_is_exact(4));
    }

    #[test]
    fn remaining_counts_only_the_window() {
        let mut key = Key::new(Algorithm::SlidingLog, [Tier::per_second(10)]);
        for _ in 0..10 {
            key.check(1);
            key.advance(100_000);
        }
        // At t = 1 s, the permit logged at t = 0 has just left.
        assert_eq!(key.check(0).remaining(), 1);
    }

    proptest::proptest! {
        /// Positions counted from the newest permit's are those of one division each: the
        /// k-th most recent at `(logged - k) % limit`, the next at `logged % limit`.
        #[test]
        fn ring_positions_are_those_of_a_division_each(
            limit in 1u64..40,
            logged in 0u64..200,
            k in 0u64..45,
        ) {
            let mut state = vec![logged];
            state.extend((0..limit).map(|i| 1_000 + i));
            let log = super::Log::new(&state, limit);
            let expected = (k >= 1 && k <= logged.min(limit))
                .then(|| state[1 + ((logged - k) % limit) as usize]);
            proptest::prop_assert_eq!(log.recent(k), expected);
            proptest::prop_assert_eq!(log.next(), logged % limit);
        }
    }
}
