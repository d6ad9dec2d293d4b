//! The answer to a check, and how the answers of several tiers combine into one.

use std::fmt;
use std::time::Duration;

use std::collections::HashSet;
use std::sync::Mutex;

use crate::algorithm::{Algorithm, Decide, Tier, Verdict};

/// What a decision says of its rule: the name, each tier's window (µs) and the policy each
/// tier advertises.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Label {
    pub(crate) name: Box<str>,
    pub(crate) windows: Box<[u64]>,
    pub(crate) policies: Box<[Policy]>,
}

/// A tier as the IETF `RateLimit-Policy` field advertises it: a quota a client may rely on,
/// per window of whole seconds. A client that never sends more than `quota` in any `window`
/// is never denied by a window, log or bucket tier (a sliding window counter estimates, and
/// warm-up admits less while cold). For a bucket of capacity `burst` refilled at `limit` per
/// `period`, that is `burst` per the time a whole burst takes to refill, rounded up: 10 per
/// second with a burst of 20 is 20 per 2 s, not 20 per second.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Policy {
    /// The policy's name in the fields: the rule's, with the tier's period after a `/` when
    /// the rule has several tiers (`api/1s`, `api/10s`).
    pub(crate) name: Box<str>,
    /// Permits per window; also `X-RateLimit-Limit` (the tier's capacity).
    pub(crate) quota: u64,
    /// Seconds, at least 1.
    pub(crate) window: u64,
}

impl Policy {
    pub(crate) fn of(rule: &str, algorithm: &Algorithm, tiers: &[Tier], i: usize) -> Self {
        let tier = &tiers[i];
        let secs =
            |micros: u128| u64::try_from(micros.div_ceil(1_000_000).max(1)).unwrap_or(u64::MAX);
        let period = u128::from(tier.period_micros());
        let (quota, window) = if algorithm.uses_burst() {
            // The time a whole burst takes to refill at the tier's rate.
            let burst = tier.burst();
            let refill = (u128::from(burst) * period).div_ceil(u128::from(tier.limit()));
            (burst, secs(refill))
        } else {
            (tier.limit(), secs(period))
        };
        let name = match tiers {
            [_] => rule.into(),
            _ if tiers.iter().filter(|t| t.period() == tier.period()).count() > 1 => {
                format!("{rule}/{}", i).into()
            }
            _ => format!("{rule}/{}", Span(tier.period())).into(),
        };
        Self {
            name,
            quota,
            window,
        }
    }
}

/// A period as rule files write it: `10s`, `1m`, `1d`, `250ms`.
struct Span(Duration);

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let micros = self.0.as_micros();
        let units = [
            (86_400_000_000, "d"),
            (3_600_000_000, "h"),
            (60_000_000, "m"),
            (1_000_000, "s"),
            (1_000, "ms"),
        ];
        for (size, unit) in units {
            if micros.is_multiple_of(size) {
                return write!(f, "{}{unit}", micros / size);
            }
        }
        write!(f, "{micros}us")
    }
}

/// Labels live as long as the process, so that a decision names its rule with one pointer
/// and no reference count. Each distinct label is kept once.
pub(crate) fn intern(label: Label) -> &'static Label {
    static LABELS: Mutex<Option<HashSet<&'static Label>>> = Mutex::new(None);
    let mut labels = LABELS.lock().unwrap_or_else(|e| e.into_inner());
    let labels = labels.get_or_insert_with(HashSet::new);
    if let Some(&known) = labels.get(&label) {
        return known;
    }
    let leaked: &'static Label = Box::leak(Box::new(label));
    labels.insert(leaked);
    leaked
}

/// Which path produced a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The in-memory store of this process.
    Memory,
    /// The shared Redis store: the decision every instance agrees on.
    Redis,
    /// The shared Redis store, decided inside Redis by tollgate's module (`TOLLGATE.CHECK`)
    /// rather than its Lua functions: the same decision, on the same keys.
    RedisModule,
    /// This process, from its own count and the global count last read from Redis (hybrid).
    Hybrid,
    /// This process, from permits leased from the global budget in Redis (lease).
    Lease,
    /// A global rule, from every region's counts as this region's Redis holds them: each
    /// peer heard within its `stale_after`.
    Global,
    /// A global rule while a peer region is unheard past its `stale_after`: this region
    /// admitted at most its share of what was left (or its per-region limit, as the rule
    /// says).
    Partitioned,
    /// The shared store failed; this process's local limiter decided with its share of the
    /// limit.
    Fallback,
    /// The shared store failed; the rule fails open and admitted without counting.
    FailOpen,
    /// The shared store failed; the rule fails closed and denied.
    FailClosed,
    /// An allow or deny list entry, or a ban, decided before the store was asked (see
    /// [`Rule::listed`](crate::Rule::listed)): nothing was counted.
    Listed,
    /// A denial the store gave earlier, answered again by this process until its
    /// `retry_after` (see [`Decision::cached`]): nothing was asked or counted.
    Cache,
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
    /// Tier `tier` of the rule labelled `rule` decided alone.
    #[inline]
    pub(crate) fn of(rule: &'static Label, tier: usize, verdict: Verdict) -> Self {
        Self {
            verdict,
            rule,
            tier: tier as u32,
            source: Source::Memory,
            shadowed: false,
        }
    }

    /// The same decision, attributed to `source`.
    #[inline]
    pub(crate) fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
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

    /// This denial answered again from a cache of the caller's, `elapsed` after the store
    /// gave it, nothing having been asked since: its waits shorter by `elapsed` (a
    /// `retry_after` of at least 1 µs), its source [`Source::Cache`]. An admission is
    /// returned as it is.
    pub fn cached(mut self, elapsed: Duration) -> Decision {
        if self.verdict.allowed {
            return self;
        }
        let elapsed = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.verdict.retry_after = self.verdict.retry_after.saturating_sub(elapsed).max(1);
        self.verdict.reset_after = self.verdict.reset_after.saturating_sub(elapsed);
        self.source = Source::Cache;
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

    /// The binding tier's advertised policy (see [`Policy`]).
    #[cfg(feature = "tower")]
    pub(crate) fn policy(&self) -> &'static Policy {
        &self.rule.policies[self.tier as usize]
    }

    /// Every tier's advertised policy, in the rule's order.
    #[cfg(feature = "tower")]
    pub(crate) fn policies(&self) -> &'static [Policy] {
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

/// Decisions gathered by a caller (a service answering some items itself, from its lists),
/// in order.
impl FromIterator<Decision> for Decisions {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        Self::many(iter.into_iter().collect())
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

    /// The label of a fixed-window rule `d` of `tiers` tiers of 10 per 1 s, 2 s, ...
    fn rule(tiers: usize) -> &'static Label {
        let tiers: Vec<Tier> = (0..tiers)
            .map(|i| Tier::new(10, Duration::from_secs(1 + i as u64)))
            .collect();
        let algorithm = Algorithm::FixedWindow;
        intern(Label {
            name: "d".into(),
            windows: tiers.iter().map(Tier::period_micros).collect(),
            policies: (0..tiers.len())
                .map(|i| Policy::of("d", &algorithm, &tiers, i))
                .collect(),
        })
    }

    /// The decision of `verdicts`, one per tier of `rule`, combined.
    fn merge(rule: &'static Label, verdicts: &[Verdict]) -> Decision {
        let mut tiers = verdicts.iter().enumerate();
        let (_, first) = tiers.next().unwrap();
        tiers.fold(Decision::of(rule, 0, *first), |d, (i, v)| {
            d.combine(Decision::of(rule, i, *v))
        })
    }

    #[test]
    fn debug_prints_durations() {
        let denied = Decision::of(rule(1), 0, Verdict::deny(10, 0, 299_972, 299_972));
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
        let d = merge(rule(2), &verdicts);
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
        let d = merge(rule(3), &verdicts);
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
        let denied = Decision::of(rule, 0, Verdict::deny(10, 0, 50, 50));
        let shadowed = denied.shadow(true);
        assert!(shadowed.allowed() && shadowed.shadowed());
        assert_eq!(shadowed.retry_after(), None);
        assert_eq!(denied.shadow(false), denied);
        let batch = Decisions::many(vec![
            shadowed,
            Decision::of(rule, 0, Verdict::allow(10, 4, 9)),
        ]);
        assert!(batch.allowed());
        assert!(batch.binding().unwrap().shadowed());
        assert_eq!(batch.binding().unwrap().remaining(), 0);
    }
}
