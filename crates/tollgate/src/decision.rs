//! The answer to a check, and how the answers of several tiers combine into one.

use std::time::Duration;

/// One tier's answer, in microseconds; what an algorithm returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Verdict {
    pub(crate) allowed: bool,
    /// The tier's capacity as reported to callers (limit, or burst for buckets).
    pub(crate) limit: u64,
    /// Permits that could still be taken now, after this check.
    pub(crate) remaining: u64,
    /// Until the tier is back to its full allowance if nothing else arrives (µs).
    pub(crate) reset_after: u64,
    /// When denied: until the same check would be admitted if nothing else arrives (µs, ≥ 1).
    pub(crate) retry_after: u64,
    /// When admitted by a shaping algorithm: how long to wait before proceeding (µs).
    pub(crate) delay: u64,
}

impl Verdict {
    #[inline]
    pub(crate) fn allow(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after,
            ..Self::default()
        }
    }

    #[inline]
    pub(crate) fn deny(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after: retry_after.max(1),
            delay: 0,
        }
    }

    #[inline]
    pub(crate) fn with_delay(mut self, delay: u64) -> Self {
        self.delay = delay;
        self
    }
}

impl Verdict {
    /// A verdict as a Redis script returns it: allowed (1/0), limit, remaining, reset_after,
    /// retry_after, delay.
    pub(crate) fn from_reply(reply: [u64; 6]) -> Self {
        let [allowed, limit, remaining, reset_after, retry_after, delay] = reply;
        Self {
            allowed: allowed == 1,
            limit,
            remaining,
            reset_after,
            retry_after,
            delay,
        }
    }
}

/// Which path produced a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The in-memory store of this process.
    Memory,
    /// The shared Redis store: the decision every instance agrees on.
    Redis,
    /// Redis failed; this process's local limiter decided with its share of the limit.
    Fallback,
    /// Redis failed; the rule fails open and admitted without counting.
    FailOpen,
    /// Redis failed; the rule fails closed and denied.
    FailClosed,
}

/// The answer to a check: whether it was admitted, and what the caller should know about the
/// tier that binds (the one with the least remaining when admitted; when denied, the one that
/// makes the caller wait longest), and which path decided.
///
/// A denied check consumed nothing, in any tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    verdict: Verdict,
    tier: usize,
    source: Source,
}

impl Decision {
    /// The decision of a rule with a single tier.
    #[inline]
    pub(crate) fn single(verdict: Verdict) -> Self {
        Self {
            verdict,
            tier: 0,
            source: Source::Memory,
        }
    }

    /// A decision taken without any store, when it failed: admitted (failing open) or denied
    /// until `retry_after` µs (failing closed).
    pub(crate) fn unchecked(limit: u64, retry_after: Option<u64>) -> Self {
        let (verdict, source) = match retry_after {
            None => (Verdict::allow(limit, limit, 0), Source::FailOpen),
            Some(wait) => (Verdict::deny(limit, 0, wait, wait), Source::FailClosed),
        };
        Self {
            verdict,
            tier: 0,
            source,
        }
    }

    /// The same decision, attributed to `source`.
    pub(crate) fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// Combines the verdicts of a rule's `tiers` tiers, `verdict(i)` being tier `i`'s.
    pub(crate) fn merge(tiers: usize, mut verdict: impl FnMut(usize) -> Verdict) -> Self {
        let mut merged = Self::single(verdict(0));
        for tier in 1..tiers {
            merged = merged.combine(Decision {
                verdict: verdict(tier),
                tier,
                source: merged.source,
            });
        }
        merged
    }

    fn combine(self, other: Decision) -> Decision {
        let (a, b) = (self.verdict, other.verdict);
        let delay = a.delay.max(b.delay);
        let mut binding = match (a.allowed, b.allowed) {
            (true, true) if b.remaining < a.remaining => other,
            (true, true) => self,
            (true, false) => other,
            (false, true) => self,
            (false, false) if b.retry_after > a.retry_after => other,
            (false, false) => self,
        };
        binding.verdict.delay = if binding.verdict.allowed { delay } else { 0 };
        binding
    }

    /// Whether the check was admitted (and consumed its cost).
    pub fn allowed(&self) -> bool {
        self.verdict.allowed
    }

    /// The binding tier's limit: permits per period, or the burst of a bucket.
    pub fn limit(&self) -> u64 {
        self.verdict.limit
    }

    /// Permits the binding tier would still admit now.
    pub fn remaining(&self) -> u64 {
        self.verdict.remaining
    }

    /// Time until the binding tier is back to its full allowance if nothing else arrives.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.verdict.reset_after)
    }

    /// When denied, the earliest time after which the same check is admitted if nothing else
    /// arrives; never early. `None` when admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.verdict.allowed).then(|| Duration::from_micros(self.verdict.retry_after))
    }

    /// When admitted by a shaping algorithm (leaky bucket as a shaper, warm-up under
    /// `acquire`), how long to wait before proceeding; zero otherwise.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.verdict.delay)
    }

    /// Index of the binding tier within the rule.
    pub fn tier(&self) -> usize {
        self.tier
    }

    /// Which path decided: the memory store, Redis, or a failure policy.
    pub fn source(&self) -> Source {
        self.source
    }

    pub(crate) fn retry_after_micros(&self) -> u64 {
        self.verdict.retry_after
    }

    pub(crate) fn delay_micros(&self) -> u64 {
        self.verdict.delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_decision_binds_to_the_tier_with_least_remaining_and_longest_delay() {
        let verdicts = [
            Verdict::allow(10, 7, 1_000).with_delay(5),
            Verdict::allow(50, 3, 9_000).with_delay(2),
        ];
        let d = Decision::merge(2, |i| verdicts[i]);
        assert!(d.allowed());
        assert_eq!((d.tier(), d.limit(), d.remaining()), (1, 50, 3));
        assert_eq!(d.delay(), Duration::from_micros(5));
        assert_eq!(d.retry_after(), None);
    }

    #[test]
    fn denied_decision_binds_to_the_longest_wait() {
        let verdicts = [
            Verdict::deny(10, 0, 100, 100),
            Verdict::allow(50, 3, 9_000).with_delay(7),
            Verdict::deny(50, 0, 900, 900),
        ];
        let d = Decision::merge(3, |i| verdicts[i]);
        assert!(!d.allowed());
        assert_eq!(d.tier(), 2);
        assert_eq!(d.retry_after(), Some(Duration::from_micros(900)));
        assert_eq!(d.delay(), Duration::ZERO);
    }

    #[test]
    fn a_denial_always_asks_to_wait_at_least_a_microsecond() {
        assert_eq!(Verdict::deny(1, 0, 0, 0).retry_after, 1);
    }
}
