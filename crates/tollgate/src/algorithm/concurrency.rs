//! Concurrency: a cap on work in flight, not a rate. The tier's `limit` is a number of slots
//! and its `period` a lease: a check of cost `c` takes `c` free slots, each held until it is
//! given back ([`Decide::credit`]) or its lease ends, so that a holder that crashed cannot
//! keep it forever; a holder renews its lease ([`Decide::renew`]).
//!
//! State words: one per slot, the time its lease ends (µs; a slot is free from then on, 0 for
//! one never taken). Slots are not named: a release frees the slot whose lease ends first and
//! a renewal renews it, which never counts fewer slots held at any moment than holders that
//! still hold one (each holder's slot ends no earlier than some slot counted: a release or a
//! renewal by a holder whose lease is running moves the earliest end, never a later one). So
//! the cap is never exceeded; a slot given back early by a holder is at worst one that a
//! crashed holder would have kept until its lease ended.

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Concurrency;

/// The most slots a tier holds: a key keeps 8 bytes per slot, and each check reads them all.
const MAX_SLOTS: u64 = 1_000;

/// When the `k`-th slot (1-based) to be freed among those held at `now` is freed.
fn kth_end(state: &[u64], now: u64, k: usize) -> u64 {
    let mut held: Vec<u64> = state.iter().copied().filter(|&end| end > now).collect();
    let k = k.clamp(1, held.len().max(1));
    if held.is_empty() {
        return now;
    }
    *held.select_nth_unstable(k - 1).1
}

/// Frees (`renew` false) or renews until `until` the `count` held slots whose leases end first.
fn earliest(state: &mut [u64], now: u64, count: u64, until: Option<u64>) {
    for _ in 0..count {
        let first = state
            .iter_mut()
            .filter(|end| **end > now)
            .min_by_key(|end| **end);
        match first {
            Some(end) => *end = until.unwrap_or(0),
            None => return,
        }
    }
}

impl Decide for Concurrency {
    fn name(&self) -> &'static str {
        "concurrency"
    }

    fn words(&self, tier: &Tier) -> usize {
        tier.limit() as usize
    }

    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        if tier.limit() > MAX_SLOTS {
            return Err(Invalid::Tier(
                "limit",
                format!("a concurrency tier keeps each slot's lease, so at most {MAX_SLOTS} slots"),
            ));
        }
        Ok(())
    }

    /// Takes `cost` free slots when as many are free; `remaining` is the slots left free,
    /// `reset_after` when every slot held is free, `retry_after` when enough are.
    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (limit, now, cost) = (tier.limit(), attempt.now.get(), attempt.cost);
        // One pass: the slots held, and when the last lease ends (now when none is later).
        let (held, last) = state.iter().fold((0u64, now), |(held, last), &end| {
            (held + u64::from(end > now), last.max(end))
        });
        if held + cost <= limit {
            // The verdict as if taken, written or not (as remaining is).
            let mut reset = last;
            if cost > 0 {
                let until = now + tier.period_micros();
                if attempt.writes() {
                    let free = state.iter_mut().filter(|end| **end <= now);
                    free.take(cost as usize).for_each(|end| *end = until);
                }
                reset = until.max(last);
            }
            return Verdict::allow(limit, limit - held - cost, reset - now);
        }
        let wait = kth_end(state, now, (held + cost - limit) as usize);
        Verdict::deny(limit, limit - held, last - now, wait - now)
    }

    /// Takes up to `cost` free slots (at most every slot is held).
    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let until = now + tier.period_micros();
        let free = state.iter_mut().filter(|end| **end <= now);
        free.take(cost as usize).for_each(|end| *end = until);
    }

    /// Frees `cost` held slots, those whose leases end first.
    fn credit(&self, _tier: &Tier, state: &mut [u64], now: Micros, cost: u64, _at: Micros) {
        let now = now.get();
        earliest(state, now, cost, None);
    }

    fn renew(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        earliest(state, now, cost, Some(now + tier.period_micros()));
    }

    fn holds_slots(&self) -> bool {
        true
    }

    fn expires_at(&self, _tier: &Tier, state: &[u64]) -> Micros {
        Micros::new(state.iter().copied().max().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Key, SECOND};
    use crate::algorithm::{Algorithm, Settle, Tier};
    use std::time::Duration;

    fn slots(limit: u64, lease_secs: u64) -> Key {
        Key::new(
            Algorithm::Concurrency,
            [Tier::new(limit, Duration::from_secs(lease_secs))],
        )
    }

    #[test]
    fn slots_are_held_until_given_back() {
        let mut key = slots(2, 30);
        assert_eq!(key.check(1).remaining(), 1);
        assert_eq!(key.check(1).remaining(), 0);
        let full = key.check(1);
        assert!(!full.allowed());
        assert_eq!(full.retry_after(), Some(Duration::from_secs(30)));
        key.advance(10 * SECOND);
        key.settle(1, Settle::Credit { at: 0 });
        let again = key.check(1);
        assert!(again.allowed());
        assert_eq!(again.remaining(), 0);
    }

    #[test]
    fn a_lease_ends_by_itself() {
        let mut key = slots(1, 30);
        assert!(key.check(1).allowed());
        key.advance(29 * SECOND);
        assert!(!key.check(1).allowed());
        key.advance(SECOND);
        assert!(key.check(1).allowed());
    }

    #[test]
    fn a_renewed_lease_runs_from_the_renewal() {
        let mut key = slots(1, 30);
        assert!(key.check(1).allowed());
        key.advance(20 * SECOND);
        key.settle(1, Settle::Renew);
        key.advance(20 * SECOND);
        let held = key.check(1);
        assert!(!held.allowed());
        assert_eq!(held.retry_after(), Some(Duration::from_secs(10)));
    }

    #[test]
    fn a_release_frees_the_earliest_lease_and_never_more_than_is_held() {
        let mut key = slots(3, 30);
        assert!(key.check(1).allowed());
        key.advance(10 * SECOND);
        assert!(key.check(1).allowed());
        key.settle(5, Settle::Credit { at: 0 });
        assert_eq!(key.check(0).remaining(), 3);
    }

    #[test]
    fn a_denial_waits_for_enough_slots() {
        let mut key = slots(3, 30);
        for _ in 0..3 {
            assert!(key.check(1).allowed());
            key.advance(SECOND);
        }
        // Two slots must free: the second lease ends at 31 s, now is 3 s.
        let two = key.check(2);
        assert!(!two.allowed());
        assert_eq!(two.retry_after(), Some(Duration::from_secs(28)));
        assert_eq!(two.reset_after(), Duration::from_secs(29));
    }
}
