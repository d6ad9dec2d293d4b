//! Properties every algorithm must have, over random rules and arrival sequences.

use std::time::Duration;

use proptest::prelude::*;

use super::Tier;
use super::testing::START;
use super::{Algorithm, Attempt, Decide, LeakyBucket, Micros, SubWindows, TokenBucket, WarmUp};
use crate::rule::Rule;

/// Periods divisible by every sub-window count used below.
const PERIODS: [u64; 4] = [60_000, 600_000, 1_800_000, 6_000_000];

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingWindow),
        (1u32..=6).prop_map(|count| Algorithm::SubWindows(SubWindows { count })),
        Just(Algorithm::SlidingLog),
        proptest::option::of(0u64..=2)
            .prop_map(|initial_tokens| Algorithm::TokenBucket(TokenBucket { initial_tokens })),
        Just(Algorithm::IntervalBucket),
        Just(Algorithm::LeakyBucket(LeakyBucket::Meter)),
        Just(Algorithm::LeakyBucket(LeakyBucket::Shaper)),
        Just(Algorithm::Gcra),
        Just(Algorithm::HitCounter),
        Just(Algorithm::Concurrency),
        (2u64..=4).prop_map(
            |periods| Algorithm::WarmUp(WarmUp::new(Duration::from_micros(periods * PERIODS[3])))
        ),
    ]
}

fn tier(algorithm: &Algorithm) -> impl Strategy<Value = Tier> + use<> {
    let uses_burst = algorithm.uses_burst();
    (2u64..=12, 0..PERIODS.len(), 3u64..=16).prop_map(move |(limit, period, burst)| {
        let tier = Tier::new(limit, Duration::from_micros(PERIODS[period]));
        if uses_burst {
            tier.with_burst(burst)
        } else {
            tier
        }
    })
}

/// A rule with two tiers, and the same two tiers as rules of their own.
fn rules() -> impl Strategy<Value = (Rule, Rule, Rule)> {
    algorithm().prop_flat_map(|algorithm| {
        (tier(&algorithm), tier(&algorithm)).prop_map(move |(a, b)| {
            let rule = |tiers: Vec<Tier>| Rule::new("p", algorithm.clone(), tiers).unwrap();
            (
                rule(vec![a.clone(), b.clone()]),
                rule(vec![a]),
                rule(vec![b]),
            )
        })
    })
}

/// Gaps (µs) and costs: bursts at the same instant, short gaps and long idle periods.
fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..200_000,
        1 => 0u64..20_000_000,
    ];
    proptest::collection::vec((gap, 0u64..=3), 1..120)
}

fn attempt(now: u64, cost: u64, commit: bool) -> Attempt {
    Attempt {
        now: Micros::new(now),
        cost,
        max_delay: None,
        commit,
        settle: None,
    }
}

proptest! {
    /// A rule of several tiers admits exactly when every tier alone would, writes each tier's
    /// state exactly as that tier alone would, and writes nothing when any tier denies.
    #[test]
    fn tiers_are_all_or_nothing((both, first, second) in rules(), arrivals in arrivals()) {
        // A key that forgets does so once every tier has expired: its tiers are not alone.
        prop_assume!(!both.algorithm().forgets());
        let mut state = vec![0; both.words()];
        let mut alone = [vec![0; first.words()], vec![0; second.words()]];
        let singles = [&first, &second];
        let mut now = START;
        for (gap, cost) in arrivals {
            now += gap;
            let cost = cost.min(both.capacity());
            let before = state.clone();
            let decision = both.evaluate(both.algorithm(), &mut state, attempt(now, cost, true));
            let each: Vec<bool> = singles
                .iter()
                .zip(alone.iter_mut())
                .map(|(rule, s)| {
                    let mut probe = s.clone();
                    rule.evaluate(rule.algorithm(), &mut probe, attempt(now, cost, false)).allowed()
                })
                .collect();
            prop_assert_eq!(decision.allowed(), each.iter().all(|&a| a));
            if decision.allowed() {
                for (i, (rule, s)) in singles.iter().zip(alone.iter_mut()).enumerate() {
                    rule.evaluate(rule.algorithm(), s, attempt(now, cost, true));
                    prop_assert_eq!(&state[both.tier_words(i)], &s[..]);
                }
            } else {
                // Nothing consumed: only what a denial records, in every tier.
                let mut expected = before;
                for (i, (rule, s)) in singles.iter().zip(alone.iter_mut()).enumerate() {
                    let tier = &rule.tiers()[0];
                    let denied = attempt(now, cost, true);
                    both.algorithm().denied(tier, &mut expected[both.tier_words(i)], &denied);
                    rule.algorithm().denied(tier, s, &denied);
                }
                prop_assert_eq!(&expected, &state);
            }
        }
    }

    /// A tier's verdict is the same whether the attempt writes or only asks, so that a store
    /// may decide a batch's items, and a rule's tiers, in one pass that writes.
    #[test]
    fn a_verdict_does_not_depend_on_writing((rule, _, _) in rules(), arrivals in arrivals()) {
        let mut state = vec![0; rule.words()];
        let mut now = START;
        for (gap, cost) in arrivals {
            now += gap;
            let cost = cost.min(rule.capacity());
            for (i, tier) in rule.tiers().iter().enumerate() {
                let words = rule.tier_words(i);
                let mut asked = state[words.clone()].to_vec();
                let probe = rule.algorithm().decide(tier, &mut asked, &attempt(now, cost, false));
                let mut written = state[words].to_vec();
                let verdict = rule.algorithm().decide(tier, &mut written, &attempt(now, cost, true));
                prop_assert_eq!(probe, verdict);
            }
            rule.evaluate(rule.algorithm(), &mut state, attempt(now, cost, true));
        }
    }

    /// Waiting exactly `retry_after` after a denial is enough when nothing else arrives (for
    /// a cost that can ever be admitted: a hit counter checks costs above its limit, and
    /// denies them whenever they come).
    #[test]
    fn retry_after_is_never_early((rule, _, _) in rules(), arrivals in arrivals()) {
        let mut state = vec![0; rule.words()];
        let mut now = START;
        let admissible = match rule.algorithm() {
            Algorithm::HitCounter => rule.tiers().iter().map(Tier::limit).min().unwrap(),
            _ => rule.capacity(),
        };
        for (gap, cost) in arrivals {
            now += gap;
            let cost = cost.min(admissible);
            let decision = rule.evaluate(rule.algorithm(), &mut state, attempt(now, cost, true));
            if let Some(wait) = decision.retry_after() {
                let later = now + u64::try_from(wait.as_micros()).unwrap();
                let mut retry = state.clone();
                let again = rule.evaluate(rule.algorithm(), &mut retry, attempt(later, cost, true));
                prop_assert!(again.allowed(), "denied again at +{:?}: {:?}", wait, again);
            }
        }
    }

    /// A state is dropped only once it is equivalent to a key never seen: from `expires_at`
    /// on, every check decides as on fresh state.
    #[test]
    fn expired_state_decides_as_fresh((rule, _, _) in rules(), arrivals in arrivals(), cost in 0u64..=3) {
        let mut state = vec![0; rule.words()];
        let mut now = START;
        for (gap, c) in arrivals {
            now += gap;
            rule.evaluate(rule.algorithm(), &mut state, attempt(now, c.min(rule.capacity()), true));
        }
        let cost = cost.min(rule.capacity());
        let at = rule.expires_at(rule.algorithm(), &state).get().max(now);
        let mut kept = state.clone();
        let mut fresh = vec![0; rule.words()];
        let kept = rule.evaluate(rule.algorithm(), &mut kept, attempt(at, cost, true));
        let fresh = rule.evaluate(rule.algorithm(), &mut fresh, attempt(at, cost, true));
        // A token bucket that starts partly empty forgets a full bucket: stricter, never looser.
        if let Algorithm::TokenBucket(TokenBucket { initial_tokens: Some(_) }) = rule.algorithm() {
            prop_assert!(kept.allowed() || !fresh.allowed());
        } else {
            prop_assert_eq!(kept, fresh);
        }
    }
}
