//! Rules, validated once when the rule is built, and their all-or-nothing evaluation across
//! tiers.

use std::ops::Range;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Attempt, Decide, Invalid, Micros, Settle, Tier, Verdict};
use crate::decision::{Decision, Label, Policy, Source, intern};
use crate::error::{Error, RuleError};

/// The most state words a rule keeps per key, all tiers together (8 MiB): every check of a
/// key reads its state and may write it, in process or in one Redis value. The Lua functions
/// refuse tier arguments beyond it as well (`tiers_of` in `lua/prelude.lua`).
pub(crate) const MAX_WORDS: usize = 1 << 20;

/// What a rule does when its shared store fails: answers with an error, or not within the
/// timeout. Stores that keep all their state in this process never fail.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FailurePolicy {
    /// Admit without counting: availability before protection (the default, as in Envoy).
    #[default]
    Open,
    /// Deny until the store answers again: protection before availability.
    Closed,
    /// Limit in this process, with `share` (above 0, at most 1) of every tier's limit and
    /// burst: each instance enforces its share, e.g. `1 / instances`.
    Local {
        /// The fraction of each limit this instance enforces alone.
        share: f64,
    },
}

/// A named limit: an algorithm and one or more tiers that must all admit a check.
///
/// A check consumes from every tier or from none. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Rule {
    inner: Arc<RuleInner>,
}

#[derive(Debug, Clone)]
struct RuleInner {
    /// The name items use and its keys' state is kept under.
    name: &'static str,
    /// What its decisions carry: its name, unless [`Rule::reported_as`] said otherwise.
    label: &'static Label,
    algorithm: Algorithm,
    tiers: Box<[Tier]>,
    /// `offsets[i]..offsets[i + 1]` are tier `i`'s state words.
    offsets: Box<[usize]>,
    /// The largest cost every tier can admit.
    capacity: u64,
    /// Whether a key's expired state must be read as new (see [`Decide::forgets`]).
    forgets: bool,
    failure: FailurePolicy,
    /// The rule scaled to its local share, when its failure policy is [`FailurePolicy::Local`].
    local: Option<Rule>,
    shadow: bool,
    reservations: Reservations,
    scope: Scope,
}

/// Where a rule's limit holds: in each region apart, or once across every region that shares
/// it (see [`RegionStore`](crate::RegionStore)).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Scope {
    /// Each region enforces the whole limit on its own (the default, as without regions).
    #[default]
    Region,
    /// One limit across the regions: each region answers from its own store, and the regions
    /// exchange their counts.
    Global(Global),
}

/// How a global rule behaves when a peer region goes unheard.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Global {
    /// How long a peer may go unheard before this region stops counting on it and falls back
    /// (default 2 s). Until then, this region admits at most its in-flight allowance beyond
    /// what the peer confirmed.
    pub stale_after: std::time::Duration,
    /// What a region cut off from a peer admits once the peer is stale.
    pub on_partition: OnPartition,
}

impl Default for Global {
    fn default() -> Self {
        Self {
            stale_after: std::time::Duration::from_secs(2),
            on_partition: OnPartition::Share,
        }
    }
}

/// What a region admits of a global rule while a peer is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnPartition {
    /// At most its share of what was left: each stale peer is assumed to admit as much as
    /// this region admits without it, so the regions together never exceed the limit (the
    /// default).
    #[default]
    Share,
    /// The whole limit, counting the stale peers as last heard: each side of a partition may
    /// admit what is left, so the regions together may admit up to that many times it.
    Region,
}

/// The algorithms whose counts merge across regions: counts per bucket of time, summed over
/// regions, are the counts of one region that saw every request.
pub(crate) fn merges(algorithm: &Algorithm) -> Result<(), &'static str> {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SubWindows(_) => Ok(()),
        Algorithm::TokenBucket(_) | Algorithm::Gcra | Algorithm::LeakyBucket(_) => Err(
            "a bucket's level drains with time and stops at empty, so the sum of the regions' \
             levels is not the level of one bucket that saw every request; use sub_windows \
             (or sliding_window) of the same limit and period",
        ),
        Algorithm::SlidingLog => Err(
            "a log keeps one timestamp per permit, too much to send between regions; use \
             sub_windows, which counts within 1/count of the period",
        ),
        Algorithm::IntervalBucket | Algorithm::WarmUp(_) => Err(
            "its state starts at a key's first request, which each region sees at a different \
             time; use fixed_window or sub_windows",
        ),
        Algorithm::HitCounter => Err(
            "it counts denied hits too, which a region's in-flight allowance cannot bound; use \
             fixed_window",
        ),
        Algorithm::Concurrency => Err(
            "slots are held and released, and a release in one region cannot wait for the \
             others; keep concurrency per region",
        ),
    }
}

/// How a rule's reservations live and end (see
/// [`Limiter::reserve`](crate::Limiter::reserve)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservations {
    /// How long a reservation lives unsettled, unless its call says otherwise (5 minutes).
    pub ttl: std::time::Duration,
    /// What becomes of its estimate when it expires unsettled.
    pub on_expiry: OnExpiry,
}

impl Reservations {
    /// The longest a reservation may live.
    pub const MAX_TTL: std::time::Duration = std::time::Duration::from_secs(86_400);
}

impl Default for Reservations {
    fn default() -> Self {
        Self {
            ttl: std::time::Duration::from_secs(300),
            on_expiry: OnExpiry::Consumed,
        }
    }
}

/// What becomes of a reservation's estimate when it expires unsettled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExpiry {
    /// It stays taken, as if the work used exactly its estimate: a caller that crashed never
    /// gets its work for free (the default).
    #[default]
    Consumed,
    /// It comes back, as if the work was cancelled.
    Released,
}

impl Rule {
    /// Builds and validates a rule.
    ///
    /// # Errors
    /// A [`RuleError`] naming the field and the reason when a tier or the algorithm's
    /// parameters can never work (a zero limit or period, a warm-up that makes no sense, ...).
    pub fn new(
        name: impl Into<String>,
        algorithm: Algorithm,
        tiers: impl IntoIterator<Item = Tier>,
    ) -> Result<Self, RuleError> {
        let name = name.into();
        let tiers: Box<[Tier]> = tiers.into_iter().collect();
        let error = |field: String, reason: String| RuleError {
            rule: name.clone(),
            field,
            reason,
        };
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:/".contains(c);
        if name.is_empty() || name.len() > 128 || !name.chars().all(allowed) {
            return Err(error(
                "name".into(),
                "must be 1 to 128 letters, digits or any of _ - . : /".into(),
            ));
        }
        if tiers.is_empty() {
            return Err(error(
                "tiers".into(),
                "a rule needs at least one tier".into(),
            ));
        }
        let mut offsets = Vec::with_capacity(tiers.len() + 1);
        offsets.push(0);
        for (i, tier) in tiers.iter().enumerate() {
            tier.validate(&algorithm)
                .map_err(|(field, reason)| Invalid::Tier(field, reason))
                .and_then(|()| algorithm.validate(tier))
                .map_err(|invalid| match invalid {
                    Invalid::Tier(field, reason) => error(format!("tiers[{i}].{field}"), reason),
                    Invalid::Parameter(field, reason) => {
                        error(format!("algorithm.{field}"), reason)
                    }
                })?;
            offsets.push(offsets[i] + algorithm.words(tier));
            if offsets[i + 1] > MAX_WORDS {
                return Err(error(
                    "tiers".into(),
                    format!(
                        "a key's state would take more than {MAX_WORDS} words ({} MiB) in these \
                         tiers: use fewer tiers, or a sliding window for large limits",
                        (MAX_WORDS * 8) >> 20
                    ),
                ));
            }
        }
        let capacity = tiers
            .iter()
            .map(|t| algorithm.capacity(t))
            .min()
            .unwrap_or(0);
        let windows = tiers.iter().map(Tier::period_micros).collect();
        let policies = (0..tiers.len())
            .map(|i| Policy::of(&name, &algorithm, &tiers, i))
            .collect();
        let forgets = algorithm.forgets();
        let label = intern(Label {
            name: name.into(),
            windows,
            policies,
        });
        Ok(Self {
            inner: Arc::new(RuleInner {
                name: &label.name,
                label,
                algorithm,
                tiers,
                offsets: offsets.into(),
                capacity,
                forgets,
                failure: FailurePolicy::Open,
                local: None,
                shadow: false,
                reservations: Reservations::default(),
                scope: Scope::Region,
            }),
        })
    }

    /// The same rule with `reservations` for its reservations: how long one lives unsettled,
    /// and whether its estimate comes back when it expires.
    ///
    /// # Errors
    /// A [`RuleError`] for a time to live of zero or over a day.
    pub fn reservations(self, reservations: Reservations) -> Result<Self, RuleError> {
        if reservations.ttl.is_zero() || reservations.ttl > Reservations::MAX_TTL {
            return Err(RuleError {
                rule: self.name().into(),
                field: "reservations.ttl".into(),
                reason: format!(
                    "{:?} must be longer than zero and at most a day",
                    reservations.ttl
                ),
            });
        }
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.reservations = reservations;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The same rule with `scope`: per region, or one limit across regions.
    ///
    /// # Errors
    /// A [`RuleError`] when the rule is global and its algorithm's counts do not merge across
    /// regions (with why, and what to use), a tier has a calendar period, or `stale_after` is
    /// under 10 ms or over an hour.
    pub fn scope(self, scope: Scope) -> Result<Self, RuleError> {
        if let Scope::Global(global) = scope {
            let error = |field: &str, reason: String| RuleError {
                rule: self.name().into(),
                field: field.into(),
                reason,
            };
            if let Err(why) = merges(self.algorithm()) {
                return Err(error(
                    "scope",
                    format!("{} cannot be global: {why}", self.algorithm().name()),
                ));
            }
            if let Some(i) = self
                .tiers()
                .iter()
                .position(|t| t.calendar_period().is_some())
            {
                return Err(error(
                    &format!("tiers[{i}].period"),
                    "a global rule counts windows of one length in every region; calendar \
                     periods are per region"
                        .into(),
                ));
            }
            let range =
                std::time::Duration::from_millis(10)..=std::time::Duration::from_secs(3_600);
            if !range.contains(&global.stale_after) {
                return Err(error(
                    "stale_after",
                    format!("{:?} must be from 10ms to 1h", global.stale_after),
                ));
            }
        }
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.scope = scope;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Where the rule's limit holds.
    pub fn scope_of(&self) -> Scope {
        self.inner.scope
    }

    /// How the rule's reservations live and end.
    pub fn reservation_policy(&self) -> Reservations {
        self.inner.reservations
    }

    /// The same rule with `policy` for when its shared store fails.
    ///
    /// # Errors
    /// A [`RuleError`] when a local share is not in (0, 1], or the rule scaled to it is not
    /// valid (e.g. a warm-up too short for the smaller limits).
    pub fn on_failure(self, policy: FailurePolicy) -> Result<Self, RuleError> {
        let local = match policy {
            FailurePolicy::Local { share } if !(share > 0.0 && share <= 1.0) => {
                return Err(RuleError {
                    rule: self.name().into(),
                    field: "on_failure.share".into(),
                    reason: format!("{share} must be above 0 and at most 1"),
                });
            }
            FailurePolicy::Local { share } => Some(self.scaled(share)?),
            _ => None,
        };
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.failure = policy;
        inner.local = local;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The same rule in shadow mode (or not): it is evaluated and counts what it admits, but
    /// its denials never deny a check; [`Decision::shadowed`](crate::Decision::shadowed) says
    /// when it would have.
    pub fn shadow(self, shadow: bool) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        inner.shadow = shadow;
        Self {
            inner: Arc::new(inner),
        }
    }

    /// What the rule does when its shared store fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.failure
    }

    /// The rule scaled to its local share, under [`FailurePolicy::Local`].
    #[cfg(feature = "redis")]
    pub(crate) fn local(&self) -> Option<&Rule> {
        self.inner.local.as_ref()
    }

    /// Whether the rule is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.inner.shadow
    }

    /// The rule's name: what items name and its keys' state is kept under. Names are kept
    /// for the life of the process, one copy each.
    pub fn name(&self) -> &'static str {
        self.inner.name
    }

    /// The same rule, counted under its own name, whose decisions (and the policies they
    /// advertise) name `reported`: a tenant's plan counted apart from the rule it replaces
    /// answers as that rule.
    pub fn reported_as(self, reported: &str) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        let policies = (0..inner.tiers.len())
            .map(|i| Policy::of(reported, &inner.algorithm, &inner.tiers, i))
            .collect();
        inner.label = intern(Label {
            name: reported.into(),
            windows: inner.label.windows.clone(),
            policies,
        });
        inner.local = inner.local.map(|local| local.reported_as(reported));
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The rule's label, which decisions carry.
    #[inline]
    pub(crate) fn label(&self) -> &'static Label {
        self.inner.label
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &Algorithm {
        &self.inner.algorithm
    }

    /// The tiers, in the order given.
    pub fn tiers(&self) -> &[Tier] {
        &self.inner.tiers
    }

    /// The same rule with every tier's limit and burst scaled by `share` (rounded up, at least
    /// 1): what one instance enforces on its own when the shared store fails.
    ///
    /// # Errors
    /// When the scaled tiers no longer make a valid rule (e.g. a warm-up too short for them).
    pub fn scaled(&self, share: f64) -> Result<Self, RuleError> {
        let scale = |n: u64| ((n as f64 * share).ceil() as u64).max(1);
        let tiers = self.tiers().iter().map(|t| {
            let tier = Tier::new(scale(t.limit()), t.period());
            match t.explicit_burst() {
                Some(burst) => tier.with_burst(scale(burst)),
                None => tier,
            }
        });
        Self::new(self.name(), self.algorithm().clone(), tiers)
    }

    /// A fingerprint of what this rule's state words mean (the algorithm, its parameters and
    /// each tier's period and layout), the same in every process. Limits and bursts are left
    /// out, so that a rule whose limit is edited keeps its keys' state; a changed layout
    /// starts afresh rather than misreading the old state.
    pub(crate) fn fingerprint(&self) -> u32 {
        // FNV-1a over the layout, folded to 32 bits.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |n: u64| {
            for b in n.to_le_bytes() {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        let algorithm = self.algorithm();
        for b in algorithm.name().bytes() {
            feed(u64::from(b));
        }
        feed(self.tiers().len() as u64);
        for tier in self.tiers() {
            algorithm.layout(tier, &mut feed);
            // A calendar's windows begin elsewhere than another's of the same longest length.
            if let Some(calendar) = tier.calendar_period() {
                calendar.identity().bytes().for_each(|b| feed(u64::from(b)));
            }
        }
        (hash ^ (hash >> 32)) as u32
    }

    /// Rewrites `from`, a key's state under `previous` (an earlier version of this rule with
    /// the same fingerprint but other limits), as this rule's state `to`.
    pub(crate) fn adopt(&self, previous: &Rule, from: &[u64], to: &mut [u64]) {
        let algorithm = self.algorithm();
        for (i, (old, new)) in previous.tiers().iter().zip(self.tiers()).enumerate() {
            algorithm.adopt(
                old,
                &from[previous.tier_words(i)],
                new,
                &mut to[self.tier_words(i)],
            );
        }
    }

    /// A decision of this rule taken without any store, when it failed: admitted (failing open)
    /// or denied until `retry_after` µs (failing closed). Binds to the first tier.
    pub(crate) fn unchecked(&self, retry_after: Option<u64>) -> Decision {
        let limit = self.algorithm().capacity(&self.tiers()[0]);
        let (verdict, source) = match retry_after {
            None => (Verdict::allow(limit, limit, 0), Source::FailOpen),
            Some(wait) => (Verdict::deny(limit, 0, wait, wait), Source::FailClosed),
        };
        Decision::of(self.label(), 0, verdict).with_source(source)
    }

    /// A decision of this rule taken by a list before any store, counting nothing: admitted
    /// with the whole capacity left (an allowed key), or denied for `denied_for` (a denied
    /// or banned key: `retry_after` and `reset_after` say when the entry ends). Binds to the
    /// first tier; its source is [`Source::Listed`].
    pub fn listed(&self, denied_for: Option<std::time::Duration>) -> Decision {
        let limit = self.algorithm().capacity(&self.tiers()[0]);
        let verdict = match denied_for {
            None => Verdict::allow(limit, limit, 0),
            Some(wait) => {
                let wait = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
                Verdict::deny(limit, 0, wait, wait)
            }
        };
        Decision::of(self.label(), 0, verdict).with_source(Source::Listed)
    }

    /// Combines the verdicts of this rule's tiers, `verdict(i)` being tier `i`'s.
    pub(crate) fn merge(&self, mut verdict: impl FnMut(usize) -> Verdict) -> Decision {
        let mut merged = Decision::of(self.label(), 0, verdict(0));
        for tier in 1..self.tiers().len() {
            merged = merged.combine(Decision::of(self.label(), tier, verdict(tier)));
        }
        merged
    }

    /// The largest cost every tier can admit; a larger one is an error, not a denial.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// State words one key of this rule needs, across all tiers.
    pub(crate) fn words(&self) -> usize {
        self.inner.offsets[self.inner.tiers.len()]
    }

    /// Tier `i`'s slice of a key's state words.
    pub(crate) fn tier_words(&self, i: usize) -> Range<usize> {
        self.inner.offsets[i]..self.inner.offsets[i + 1]
    }

    /// Decides `attempt` for one key whose state words are `state`, consuming from every tier
    /// or from none. A denial writes nothing but what [`Decide::denied`] records.
    #[inline]
    pub(crate) fn evaluate<A: Decide>(
        &self,
        algorithm: &A,
        state: &mut [u64],
        attempt: Attempt,
    ) -> Decision {
        if self.inner.forgets && self.expires_at(algorithm, state) <= attempt.now {
            state.fill(0);
        }
        if let Some(settle) = attempt.settle {
            return self.settled(algorithm, state, attempt, settle);
        }
        let tiers = self.tiers();
        if let [tier] = tiers {
            let verdict = algorithm.decide(tier, state, &attempt);
            if !verdict.allowed && attempt.writes() {
                algorithm.denied(tier, state, &attempt);
            }
            return Decision::of(self.label(), 0, verdict);
        }
        if !attempt.writes() {
            return self
                .merge(|i| algorithm.decide(&tiers[i], &mut state[self.tier_words(i)], &attempt));
        }
        // One pass that writes (a verdict is the same whether it writes or not), the state
        // kept first so that a denial can put it back; a large state is asked first instead.
        const KEPT: usize = 16;
        let mut kept = [0; KEPT];
        let small = state.len() <= KEPT;
        if small {
            kept[..state.len()].copy_from_slice(state);
        } else {
            let probe = self.merge(|i| {
                let ask = Attempt {
                    commit: false,
                    ..attempt
                };
                algorithm.decide(&tiers[i], &mut state[self.tier_words(i)], &ask)
            });
            if !probe.allowed() {
                self.denied(algorithm, state, &attempt);
                return probe;
            }
        }
        let decision =
            self.merge(|i| algorithm.decide(&tiers[i], &mut state[self.tier_words(i)], &attempt));
        if !decision.allowed() && small {
            state.copy_from_slice(&kept[..state.len()]);
            self.denied(algorithm, state, &attempt);
        }
        decision
    }

    /// Settles `attempt`'s cost in every tier (takes it, or gives it back), then looks: the
    /// decision says what the key has left, denied while it is in debt.
    #[cold]
    fn settled<A: Decide>(
        &self,
        algorithm: &A,
        state: &mut [u64],
        attempt: Attempt,
        settle: Settle,
    ) -> Decision {
        // Nothing settled at no cost: the state stays as it is, a key never seen too.
        if attempt.cost > 0 {
            self.settle_tiers(algorithm, state, attempt.now, attempt.cost, settle);
        }
        self.evaluate(algorithm, state, Attempt::look(attempt.now))
    }

    /// Takes `cost` (at `now`, µs) in every tier whatever its state, gives it back, or renews
    /// as many slots held, as `settle` says.
    pub(crate) fn settle_tiers<A: Decide>(
        &self,
        algorithm: &A,
        state: &mut [u64],
        now: Micros,
        cost: u64,
        settle: Settle,
    ) {
        for (i, tier) in self.tiers().iter().enumerate() {
            let words = &mut state[self.tier_words(i)];
            match settle {
                Settle::Report => algorithm.debit(tier, words, now, cost),
                Settle::Credit { at } => {
                    algorithm.credit(tier, words, now, cost, Micros::new(at));
                }
                Settle::Renew => algorithm.renew(tier, words, now, cost),
            }
        }
    }

    /// Records in every tier what a denial of `attempt` records (see [`Decide::denied`]).
    pub(crate) fn denied<A: Decide>(&self, algorithm: &A, state: &mut [u64], attempt: &Attempt) {
        for (i, tier) in self.tiers().iter().enumerate() {
            algorithm.denied(tier, &mut state[self.tier_words(i)], attempt);
        }
    }

    /// When a key's `state` becomes equivalent to a key never seen, in every tier.
    pub(crate) fn expires_at<A: Decide>(&self, algorithm: &A, state: &[u64]) -> Micros {
        self.tiers()
            .iter()
            .enumerate()
            .map(|(i, tier)| algorithm.expires_at(tier, &state[self.tier_words(i)]))
            .max()
            .unwrap_or_default()
    }

    /// Rejects a cost that some tier can never admit.
    #[inline]
    pub(crate) fn check_cost(&self, cost: u64) -> Result<(), Error> {
        if cost <= self.inner.capacity {
            return Ok(());
        }
        let algorithm = &self.inner.algorithm;
        let (tier, capacity) = self
            .tiers()
            .iter()
            .map(|t| algorithm.capacity(t))
            .enumerate()
            .find(|&(_, capacity)| cost > capacity)
            .expect("some tier's capacity is below the cost");
        Err(Error::CostExceedsCapacity {
            rule: self.name().into(),
            tier,
            cost,
            capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{SubWindows, WarmUp};

    fn field_of(result: Result<Rule, RuleError>) -> String {
        result.expect_err("rule should be rejected").field
    }

    #[test]
    fn rejects_zero_limit_and_zero_period_naming_the_field() {
        let e = Rule::new("api", Algorithm::Gcra, [Tier::per_second(0)]).unwrap_err();
        assert_eq!(e.field, "tiers[0].limit");
        assert_eq!(
            e.to_string(),
            "rule `api`: tiers[0].limit: must be at least 1"
        );
        let e = Rule::new(
            "api",
            Algorithm::FixedWindow,
            [Tier::per_second(1), Tier::new(5, Duration::ZERO)],
        );
        assert_eq!(field_of(e), "tiers[1].period");
    }

    #[test]
    fn rejects_sub_microsecond_periods_and_empty_tiers() {
        let e = Rule::new(
            "api",
            Algorithm::FixedWindow,
            [Tier::new(1, Duration::from_nanos(1_500))],
        );
        assert_eq!(field_of(e), "tiers[0].period");
        let e = Rule::new("api", Algorithm::FixedWindow, []);
        assert_eq!(field_of(e), "tiers");
        for name in ["", "has space", "brace{", "x".repeat(129).as_str()] {
            let e = Rule::new(name, Algorithm::FixedWindow, [Tier::per_second(1)]);
            assert_eq!(field_of(e), "name");
        }
        assert!(
            Rule::new(
                "get-product/v1.2:a_b",
                Algorithm::Gcra,
                [Tier::per_second(1)]
            )
            .is_ok()
        );
    }

    #[test]
    fn a_rule_reported_as_another_keeps_its_name_and_state() {
        let rule = Rule::new("plan/o:1", Algorithm::FixedWindow, [Tier::per_second(3)])
            .and_then(|r| r.on_failure(FailurePolicy::Local { share: 0.5 }))
            .unwrap();
        let fingerprint = rule.fingerprint();
        let reported = rule.reported_as("plan");
        assert_eq!(reported.name(), "plan/o:1");
        assert_eq!(reported.fingerprint(), fingerprint);
        assert_eq!(&*reported.label().name, "plan");
        assert_eq!(&*reported.label().policies[0].name, "plan");
        let local = reported.inner.local.as_ref().unwrap();
        assert_eq!((local.name(), &*local.label().name), ("plan/o:1", "plan"));
    }

    #[test]
    fn rejects_burst_where_the_algorithm_has_none() {
        let e = Rule::new(
            "api",
            Algorithm::SlidingLog,
            [Tier::per_second(5).with_burst(10)],
        )
        .unwrap_err();
        assert_eq!(e.field, "tiers[0].burst");
        assert!(e.reason.contains("sliding_log"), "{}", e.reason);
    }

    #[test]
    fn rejects_algorithm_parameters_that_make_no_sense() {
        let e = Rule::new(
            "api",
            Algorithm::SubWindows(SubWindows { count: 0 }),
            [Tier::per_second(5)],
        );
        assert_eq!(field_of(e), "algorithm.count");
        let e = Rule::new(
            "api",
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(3 * 86_400))),
            [Tier::per_second(5)],
        );
        assert_eq!(field_of(e), "algorithm.warm_up");
    }

    #[test]
    fn the_fingerprint_follows_the_definition_not_the_process() {
        let rule = |limit, algorithm| Rule::new("r", algorithm, [Tier::per_second(limit)]).unwrap();
        let a = rule(10, Algorithm::Gcra);
        assert_eq!(a.fingerprint(), rule(10, Algorithm::Gcra).fingerprint());
        assert_ne!(a.fingerprint(), rule(11, Algorithm::Gcra).fingerprint());
        assert_ne!(
            a.fingerprint(),
            rule(10, Algorithm::FixedWindow).fingerprint()
        );
        let sub = |count| rule(10, Algorithm::SubWindows(SubWindows { count }));
        assert_ne!(sub(2).fingerprint(), sub(5).fingerprint());
    }

    #[test]
    fn a_local_share_scales_limits_and_bursts_up() {
        let rule = Rule::new(
            "r",
            Algorithm::Gcra,
            [Tier::per_second(10).with_burst(25), Tier::per_minute(1)],
        )
        .unwrap();
        let local = rule.scaled(0.25).unwrap();
        let sizes: Vec<(u64, u64)> = local
            .tiers()
            .iter()
            .map(|t| (t.limit(), t.burst()))
            .collect();
        assert_eq!(sizes, [(3, 7), (1, 1)]);
    }

    /// A rule whose key would keep more than MAX_WORDS state words is refused, saying so:
    /// eleven sliding-log tiers of 100,000 permits (1.1 million words); ten are kept.
    #[test]
    fn a_state_of_more_than_the_most_words_is_refused() {
        let tier = |hours: u64| Tier::new(100_000, Duration::from_secs(3_600 * hours));
        let refused = Rule::new("big", Algorithm::SlidingLog, (1..=11).map(tier)).unwrap_err();
        assert_eq!(refused.field, "tiers");
        assert!(refused.reason.contains("8 MiB"), "{}", refused.reason);
        assert!(Rule::new("big", Algorithm::SlidingLog, (1..=10).map(tier)).is_ok());
    }

    #[test]
    fn cost_above_any_tier_capacity_is_an_error_naming_the_tier() {
        let rule = Rule::new(
            "api",
            Algorithm::FixedWindow,
            [Tier::per_second(10), Tier::new(5, Duration::from_secs(10))],
        )
        .unwrap();
        assert!(rule.check_cost(5).is_ok());
        assert_eq!(
            rule.check_cost(7),
            Err(Error::CostExceedsCapacity {
                rule: "api".into(),
                tier: 1,
                cost: 7,
                capacity: 5
            })
        );
    }
}
