//! Token bucket: capacity `burst`, refilled continuously at `limit` per `period`, computed
//! lazily when a key is checked; no background refill.
//!
//! State words: `[tokens (rate units), time of the last admission (µs; 0 = never)]`. A key in
//! debt (a report past what the bucket held) has no tokens and its last admission in the
//! future: the bucket refills from then on, so the debt is paid back at the bucket's rate.

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};
use super::{MAX_EXACT, Tier};

/// Parameters of [`Algorithm::TokenBucket`](super::Algorithm::TokenBucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucket {
    /// Tokens in a key's bucket when it is first seen, and again once it has stayed full for a
    /// whole period and is forgotten; defaults to a full bucket.
    pub initial_tokens: Option<u64>,
}

impl TokenBucket {
    /// The tokens at `now` and the time of the last admission: a key never seen holds its
    /// initial tokens; a bucket refills from its last admission, none while in debt.
    #[inline]
    fn refilled(&self, tier: &Tier, state: &[u64], now: u64) -> (u64, u64) {
        let (rate, burst) = (tier.rate(), tier.burst());
        match [state[0], state[1]] {
            [_, 0] => (rate.units(self.initial_tokens.unwrap_or(burst)), 0),
            [tokens, last] => {
                let refill = rate.drained(now.saturating_sub(last));
                (tokens.saturating_add(refill).min(rate.units(burst)), last)
            }
        }
    }
}

impl Decide for TokenBucket {
    fn name(&self) -> &'static str {
        "token_bucket"
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
        tier.rate().check_capacity(tier.burst())?;
        match self.initial_tokens {
            Some(initial) if initial > tier.burst() => Err(Invalid::Parameter(
                "initial_tokens",
                format!("{initial} exceeds the burst of a tier ({})", tier.burst()),
            )),
            _ => Ok(()),
        }
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let (rate, burst) = (tier.rate(), tier.burst());
        let capacity = rate.units(burst);
        let (tokens, last) = self.refilled(tier, state, attempt.now.get());
        // The bucket's emptiness is a leaky bucket's level: one arithmetic for both; a debt
        // is a level above the bucket's capacity.
        let debt = rate.drained(last.saturating_sub(attempt.now.get()));
        let level = (capacity - tokens).saturating_add(debt);
        let verdict = rate.bucket(burst, level, attempt.cost);
        if verdict.allowed && attempt.writes() {
            state[0] = tokens - rate.units(attempt.cost);
            state[1] = attempt.now.get().max(last);
        }
        verdict
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let rate = tier.rate();
        let (tokens, last) = self.refilled(tier, state, now);
        let need = rate.units(cost);
        if tokens >= need {
            state[0] = tokens - need;
            state[1] = now.max(last);
        } else {
            // What the bucket owes, as the time it takes to refill (rounded up), the owed
            // units kept with its capacity below 2^53 so that they stay exact in a double.
            let capacity = rate.units(tier.burst());
            let owed = rate
                .drained(last.saturating_sub(now))
                .saturating_add(need - tokens)
                .min(MAX_EXACT - 1 - capacity);
            state[0] = 0;
            state[1] = now + rate.micros(owed);
        }
    }

    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, _at: Micros) {
        let now = now.get();
        let rate = tier.rate();
        let capacity = rate.units(tier.burst());
        let (tokens, last) = self.refilled(tier, state, now);
        let give = rate.units(cost);
        if last > now {
            // A debt first: each whole microsecond of it the credit covers comes back.
            let owed = last - now;
            let back = give / rate.per_micro;
            if back < owed {
                state[1] = last - back;
                return;
            }
            state[0] = (give - owed * rate.per_micro).min(capacity);
            state[1] = now;
        } else {
            state[0] = tokens.saturating_add(give).min(capacity);
            state[1] = now.max(last);
        }
    }

    fn module_parameters(&self) -> [f64; 2] {
        [self.initial_tokens.map_or(-1.0, |t| t as f64), 0.0]
    }

    fn script_parameters(&self, _tier: &Tier) -> [f64; 5] {
        let initial = self.initial_tokens.map_or(-1.0, |tokens| tokens as f64);
        [initial, 0.0, 0.0, 0.0, 0.0]
    }

    fn forgets(&self) -> bool {
        self.initial_tokens.is_some()
    }

    fn denied(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) {
        if let (Some(initial), 0) = (self.initial_tokens, state[1]) {
            state[0] = tier.rate().units(initial);
            state[1] = attempt.now.get();
        }
    }

    fn layout(&self, tier: &Tier, feed: &mut dyn FnMut(u64)) {
        // The level is kept in units of the rate: a new rate is a new layout.
        let rate = tier.rate();
        for n in [tier.period_micros(), rate.per_permit, rate.per_micro] {
            feed(n);
        }
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        let rate = tier.rate();
        let full = match state[1] {
            0 => return Micros::new(0),
            last => last + rate.micros(rate.units(tier.burst()).saturating_sub(state[0])),
        };
        // A full bucket differs from a new one that starts partly empty: it is forgotten once
        // it has stayed full for a whole period.
        Micros::new(match self.initial_tokens {
            Some(initial) if initial < tier.burst() => full + tier.period_micros(),
            _ => full,
        })
    }
}

/// The token bucket of the module's parameters (see [`Decide::module_parameters`]).
#[cfg(feature = "inside-redis")]
pub(crate) fn of_parameters(p: [f64; 2]) -> Result<super::Algorithm, &'static str> {
    let initial_tokens = match p[0] < 0.0 {
        true => None,
        false => Some(crate::layout::whole(p[0])?),
    };
    Ok(super::Algorithm::TokenBucket(TokenBucket {
        initial_tokens,
    }))
}

#[cfg(test)]
mod tests {
    use super::TokenBucket;
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND};
    use crate::rule::Rule;

    fn bucket(tier: Tier, initial_tokens: Option<u64>) -> Key {
        Key::new(
            Algorithm::TokenBucket(TokenBucket { initial_tokens }),
            [tier],
        )
    }

    #[test]
    fn a_full_bucket_admits_its_burst_then_the_rate() {
        let mut key = bucket(Tier::per_second(10).with_burst(20), None);
        assert_eq!(key.admitted(30, 1), 20);
        let denied = key.check(1);
        assert_eq!(denied.limit(), 20);
        assert_eq!(denied.retry_after().unwrap().as_millis(), 100);
        assert_eq!(denied.reset_after().as_secs(), 2);
        key.advance(SECOND);
        assert_eq!(key.admitted(30, 1), 10);
    }

    #[test]
    fn refill_is_exact_at_three_per_second() {
        let mut key = bucket(Tier::per_second(3).with_burst(1), None);
        assert!(key.check(1).allowed());
        // A token takes 333_333.3 µs: not there at 333_333, there at 333_334.
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn no_rounding_drift_over_many_refills() {
        // Checked every microsecond for 3 s: the initial 3 tokens plus exactly 9 refilled. An
        // interval rounded up to 333_334 µs would have refilled only 8 by then.
        let mut key = bucket(Tier::per_second(3), None);
        let mut admitted = u64::from(key.check(1).allowed());
        for _ in 0..3 * SECOND {
            key.advance(1);
            admitted += u64::from(key.check(1).allowed());
        }
        assert_eq!(admitted, 12);
    }

    #[test]
    fn initial_tokens_start_a_new_key_partly_empty() {
        let mut key = bucket(Tier::per_second(10), Some(2));
        assert_eq!(key.admitted(5, 1), 2);
        // 300 ms refill three tokens, on top of the bucket it has.
        key.advance(300_000);
        assert_eq!(key.admitted(20, 1), 3);
    }

    #[test]
    fn a_key_is_new_again_only_once_every_tier_has_stayed_full_for_its_period() {
        let rule = Rule::new(
            "t",
            Algorithm::TokenBucket(TokenBucket {
                initial_tokens: Some(1),
            }),
            [Tier::per_second(10), Tier::new(10, 10 * SECOND_DURATION)],
        )
        .unwrap();
        let mut key = Key::with_rule(rule);
        assert_eq!(key.admitted(5, 1), 1);
        // The per-second tier has long been full, the ten-second one not yet for a period.
        key.advance(10 * SECOND);
        assert_eq!(key.check(0).remaining(), 10);
        key.advance(10 * SECOND);
        assert_eq!(key.check(0).remaining(), 1);
    }

    const SECOND_DURATION: std::time::Duration = std::time::Duration::from_secs(1);

    #[test]
    fn a_bucket_full_for_a_whole_period_is_a_new_key_again_whether_or_not_it_was_dropped() {
        let mut key = bucket(Tier::per_second(10), Some(2));
        assert_eq!(key.admitted(5, 1), 2);
        // Full after a second, and still remembered.
        key.advance(SECOND);
        assert_eq!(key.check(0).remaining(), 10);
        // Full for a whole second more: forgotten, kept or dropped alike.
        key.advance(SECOND);
        assert_eq!(key.check(0).remaining(), 2);
        assert_eq!(key.admitted(20, 1), 2);
        key.advance(3 * SECOND);
        key.state.fill(0);
        assert_eq!(key.admitted(20, 1), 2);
    }

    #[test]
    fn a_new_key_denied_for_want_of_initial_tokens_starts_refilling_at_once() {
        let mut key = bucket(Tier::per_second(10), Some(0));
        assert!(!key.check(1).allowed());
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn refill_never_exceeds_the_burst() {
        let mut key = bucket(Tier::per_second(10).with_burst(5), None);
        key.check(5);
        key.advance(3_600 * SECOND);
        assert_eq!(key.check(0).remaining(), 5);
        assert_eq!(key.admitted(10, 1), 5);
    }

    #[test]
    fn cost_takes_that_many_tokens() {
        let mut key = bucket(Tier::per_second(10), None);
        assert_eq!(key.check(4).remaining(), 6);
        assert!(!key.check(7).allowed());
        assert!(key.retry_after_is_exact(7));
    }
}
