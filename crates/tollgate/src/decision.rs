//! The answer to a check, and how the answers of several tiers combine into one.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Decide;
use crate::rule::{Label, Rule};

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

#[cfg(feature = "redis")]
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
    /// This process, from its own count and the global count last read from Redis (hybrid).
    Hybrid,
    /// This process, from permits leased from the global budget in Redis (lease).
    Lease,
    /// The shared store failed; this process's local limiter decided with its share of the
    /// limit.
    Fallback,
    /// The shared store failed; the rule fails open and admitted without counting.
    FailOpen,
    /// The shared store failed; the rule fails closed and denied.
    FailClosed,
}

/// The answer to a check: whether it was admitted, and what the caller should know about the
/// tier that binds (the one with the least remaining when admitted; when denied, the one that
/// makes the caller wait longest): its rule, window, limit and remaining permits, and which
/// path decided.
///
/// A denied check consumed nothing, in any tier of any rule.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    verdict: Verdict,
    rule: &'static Label,
    tier: u32,
    source: Source,
    /// A shadow rule would have denied: admitted anyway.
    shadowed: bool,
}

/// Durations as durations (`reset_after: 299.972ms`), not raw microseconds.
impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Decision");
        d.field("rule", &self.rule())
            .field("allowed", &self.allowed())
            .field("limit", &self.limit())
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after());
        if let Some(retry) = self.retry_after() {
            d.field("retry_after", &retry);
        }
        if self.verdict.delay > 0 {
            d.field("delay", &self.delay());
        }
        d.field("window", &self.window())
            .field("tier", &self.tier())
            .field("source", &self.source())
            .field("shadowed", &self.shadowed)
            .finish()
    }
}

impl Decision {
    /// Tier `tier` of `rule` decided alone.
    #[inline]
    pub(crate) fn of(rule: &Rule, tier: usize, verdict: Verdict) -> Self {
        Self {
            verdict,
            rule: rule.label(),
            tier: tier as u32,
            source: Source::Memory,
            shadowed: false,
        }
    }

    /// A decision of `rule` taken without any store, when it failed: admitted (failing open)
    /// or denied until `retry_after` µs (failing closed). Binds to the first tier.
    pub(crate) fn unchecked(rule: &Rule, retry_after: Option<u64>) -> Self {
        let limit = rule.algorithm().capacity(&rule.tiers()[0]);
        let (verdict, source) = match retry_after {
            None => (Verdict::allow(limit, limit, 0), Source::FailOpen),
            Some(wait) => (Verdict::deny(limit, 0, wait, wait), Source::FailClosed),
        };
        Self::of(rule, 0, verdict).with_source(source)
    }

    /// The same decision, attributed to `source`.
    #[inline]
    pub(crate) fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// Combines the verdicts of `rule`'s tiers, `verdict(i)` being tier `i`'s.
    pub(crate) fn merge(rule: &Rule, mut verdict: impl FnMut(usize) -> Verdict) -> Self {
        let mut merged = Self::of(rule, 0, verdict(0));
        for tier in 1..rule.tiers().len() {
            merged = merged.combine(Self::of(rule, tier, verdict(tier)));
        }
        merged
    }

    /// The decision binding among two: the one with least remaining when both admit, the
    /// denial when one denies, the longest wait when both deny. Shaping delays add up to the
    /// longest.
    pub(crate) fn combine(self, other: Decision) -> Decision {
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
        binding.shadowed = self.shadowed || other.shadowed;
        binding
    }

    /// For a rule in shadow mode: a denial becomes an admission marked
    /// [`shadowed`](Self::shadowed), which consumed nothing.
    pub(crate) fn shadow(mut self, shadow: bool) -> Self {
        if shadow && !self.verdict.allowed {
            self.verdict.allowed = true;
            self.verdict.retry_after = 0;
            self.shadowed = true;
        }
        self
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

    /// The binding rule's name.
    pub fn rule(&self) -> &'static str {
        &self.rule.name
    }

    /// The binding tier's period: the window its limit applies to.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.rule.windows[self.tier as usize])
    }

    /// Index of the binding tier within its rule.
    pub fn tier(&self) -> usize {
        self.tier as usize
    }

    /// Which path decided: the memory store, Redis, or a failure policy.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether a rule in shadow mode would have denied this check, which was admitted anyway.
    pub fn shadowed(&self) -> bool {
        self.shadowed
    }

    /// The binding tier's advertised policy (see [`crate::rule::Policy`]).
    #[cfg(feature = "tower")]
    pub(crate) fn policy(&self) -> &'static crate::rule::Policy {
        &self.rule.policies[self.tier as usize]
    }

    /// Every tier's advertised policy, in the rule's order.
    #[cfg(feature = "tower")]
    pub(crate) fn policies(&self) -> &'static [crate::rule::Policy] {
        &self.rule.policies
    }

    /// Whether both decisions are of the same rule (one label per rule).
    #[cfg(feature = "tower")]
    pub(crate) fn same_rule(&self, other: &Decision) -> bool {
        std::ptr::eq(self.rule, other.rule)
    }

    pub(crate) fn retry_after_micros(&self) -> u64 {
        self.verdict.retry_after
    }

    pub(crate) fn delay_micros(&self) -> u64 {
        self.verdict.delay
    }
}

/// The decisions of a batch, one per item in order. The batch was admitted, and every item
/// consumed its cost, only if every decision admits; otherwise no item consumed anything,
/// and the admitting decisions say what their item alone would have left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decisions(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    One(Decision),
    Many(Vec<Decision>),
}

impl Decisions {
    pub(crate) fn one(decision: Decision) -> Self {
        Self(Repr::One(decision))
    }

    pub(crate) fn many(decisions: Vec<Decision>) -> Self {
        match <[Decision; 1]>::try_from(decisions) {
            Ok([one]) => Self::one(one),
            Err(many) => Self(Repr::Many(many)),
        }
    }

    /// Whether the batch was admitted: every item was.
    pub fn allowed(&self) -> bool {
        self.iter().all(Decision::allowed)
    }

    /// The one decision that binds the batch: the first denial with the longest wait, or the
    /// admission with the least remaining. `None` for an empty batch.
    pub fn binding(&self) -> Option<Decision> {
        self.iter().copied().reduce(Decision::combine)
    }
}

/// No decisions: the batch of no items.
impl Default for Decisions {
    fn default() -> Self {
        Self(Repr::Many(Vec::new()))
    }
}

impl std::ops::Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        match &self.0 {
            Repr::One(one) => std::slice::from_ref(one),
            Repr::Many(many) => many,
        }
    }
}

impl std::ops::DerefMut for Decisions {
    fn deref_mut(&mut self) -> &mut [Decision] {
        match &mut self.0 {
            Repr::One(one) => std::slice::from_mut(one),
            Repr::Many(many) => many,
        }
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::rule::Tier;

    fn rule(tiers: usize) -> Rule {
        let tiers = (0..tiers).map(|i| Tier::new(10, Duration::from_secs(1 + i as u64)));
        Rule::new("d", Algorithm::FixedWindow, tiers).unwrap()
    }

    #[test]
    fn debug_prints_durations() {
        let denied = Decision::of(&rule(1), 0, Verdict::deny(10, 0, 299_972, 299_972));
        let text = format!("{denied:?}");
        assert!(text.contains("reset_after: 299.972ms"), "{text}");
        assert!(text.contains("retry_after: 299.972ms"), "{text}");
        assert!(text.contains("rule: \"d\""), "{text}");
        assert!(!text.contains("299972"), "{text}");
    }

    #[test]
    fn admitted_decision_binds_to_the_tier_with_least_remaining_and_longest_delay() {
        let verdicts = [
            Verdict::allow(10, 7, 1_000).with_delay(5),
            Verdict::allow(50, 3, 9_000).with_delay(2),
        ];
        let d = Decision::merge(&rule(2), |i| verdicts[i]);
        assert!(d.allowed());
        assert_eq!((d.tier(), d.limit(), d.remaining()), (1, 50, 3));
        assert_eq!((d.rule(), d.window()), ("d", Duration::from_secs(2)));
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
        let d = Decision::merge(&rule(3), |i| verdicts[i]);
        assert!(!d.allowed());
        assert_eq!(d.tier(), 2);
        assert_eq!(d.window(), Duration::from_secs(3));
        assert_eq!(d.retry_after(), Some(Duration::from_micros(900)));
        assert_eq!(d.delay(), Duration::ZERO);
    }

    #[test]
    fn a_denial_always_asks_to_wait_at_least_a_microsecond() {
        assert_eq!(Verdict::deny(1, 0, 0, 0).retry_after, 1);
    }

    #[test]
    fn a_shadow_denial_admits_and_says_so() {
        let rule = rule(1);
        let denied = Decision::of(&rule, 0, Verdict::deny(10, 0, 50, 50));
        let shadowed = denied.shadow(true);
        assert!(shadowed.allowed() && shadowed.shadowed());
        assert_eq!(shadowed.retry_after(), None);
        assert_eq!(denied.shadow(false), denied);
        let batch = Decisions::many(vec![
            shadowed,
            Decision::of(&rule, 0, Verdict::allow(10, 4, 9)),
        ]);
        assert!(batch.allowed());
        assert!(batch.binding().unwrap().shadowed());
        assert_eq!(batch.binding().unwrap().remaining(), 0);
    }
}
