//! Rate guarantees of each algorithm, checked over random arrival sequences through the public
//! API on a manual clock.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Algorithm, Clock, LeakyBucket, Limiter, ManualClock, MemoryStore, Rule, SubWindows, Tier,
    TokenBucket, WarmUp,
};

/// One admitted check: when (µs since the epoch) and how many permits.
type Admission = (u64, u64);

fn limiter(algorithm: Algorithm, tier: Tier) -> Limiter<MemoryStore, ManualClock> {
    let rule = Rule::new("prop", algorithm, [tier]).expect("valid rule");
    Limiter::builder(rule)
        .store(MemoryStore::builder().shards(1).build().unwrap())
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

/// Runs `arrivals` (gap before, cost) against `limiter`; returns what was admitted.
fn run(limiter: &Limiter<MemoryStore, ManualClock>, arrivals: &[(u64, u64)]) -> Vec<Admission> {
    let clock = limiter.clock();
    let mut admitted = Vec::new();
    for &(gap, cost) in arrivals {
        clock.advance(Duration::from_micros(gap));
        let cost = cost.min(limiter.rule().capacity());
        if limiter
            .check_now(b"key", cost)
            .expect("valid check")
            .allowed()
            && cost > 0
        {
            admitted.push((clock.now_micros(), cost));
        }
    }
    admitted
}

fn permits_between(admitted: &[Admission], from: u64, to: u64) -> u64 {
    admitted
        .iter()
        .filter(|&&(t, _)| from <= t && t <= to)
        .map(|&(_, c)| c)
        .sum()
}

fn arrivals(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![2 => Just(0), 5 => 0..max_gap, 1 => 0..max_gap * 20];
    proptest::collection::vec((gap, 0..=max_cost), 1..200)
}

/// A limit, a period (µs) and a burst; periods include ones the limit does not divide.
fn rate() -> impl Strategy<Value = (u64, u64, u64)> {
    (
        1u64..=20,
        prop::sample::select(vec![1_000u64, 7_000, 100_000, 1_000_000]),
        1u64..=30,
    )
}

fn tier(limit: u64, period: u64) -> Tier {
    Tier::new(limit, Duration::from_micros(period))
}

fn buckets() -> [Algorithm; 4] {
    [
        Algorithm::TokenBucket(TokenBucket::default()),
        Algorithm::LeakyBucket(LeakyBucket::Meter),
        Algorithm::LeakyBucket(LeakyBucket::Shaper),
        Algorithm::Gcra,
    ]
}

proptest! {
    /// No window of length `period`, anywhere, holds more than `limit` permits.
    #[test]
    fn sliding_log_is_exact((limit, period, _) in rate(), arrivals in arrivals(2_000, 3)) {
        let limiter = limiter(Algorithm::SlidingLog, tier(limit, period));
        let admitted = run(&limiter, &arrivals);
        for &(end, _) in &admitted {
            let window = permits_between(&admitted, (end + 1).saturating_sub(period), end);
            prop_assert!(window <= limit, "{window} permits in the window ending at {end}");
        }
    }

    /// In any interval, buckets admit at most `burst + rate x its length`.
    #[test]
    fn buckets_never_exceed_burst_plus_rate(
        (limit, period, burst) in rate(),
        arrivals in arrivals(3_000, 4),
    ) {
        for algorithm in buckets() {
            let limiter = limiter(algorithm, tier(limit, period).with_burst(burst));
            let admitted = run(&limiter, &arrivals);
            for (i, &(from, _)) in admitted.iter().enumerate() {
                for &(to, _) in &admitted[i..] {
                    let permits = permits_between(&admitted, from, to);
                    // permits <= burst + (to - from) x limit / period, in integers.
                    let bound = u128::from(burst) * u128::from(period)
                        + u128::from(to - from) * u128::from(limit);
                    prop_assert!(
                        u128::from(permits) * u128::from(period) <= bound,
                        "{} admitted {permits} in [{from}, {to}]",
                        limiter.rule().algorithm().name()
                    );
                }
            }
        }
    }

    /// A stream that never outpaces the rate is never denied, and never delayed.
    #[test]
    fn buckets_never_deny_a_stream_under_the_rate(
        (limit, period, burst) in rate(),
        extra in proptest::collection::vec((0u64..5_000, 1u64..=4), 1..150),
    ) {
        for algorithm in buckets() {
            let limiter = limiter(algorithm, tier(limit, period).with_burst(burst));
            let clock = limiter.clock();
            let mut previous_cost = 0;
            for &(slack, cost) in &extra {
                let cost = cost.min(burst);
                // The previous permits' emission time, rounded up, then any extra slack.
                let gap = (previous_cost * period).div_ceil(limit) + slack;
                clock.advance(Duration::from_micros(gap));
                let decision = limiter.check_now(b"key", cost).unwrap();
                prop_assert!(decision.allowed(), "{} denied a conforming stream", limiter.rule().algorithm().name());
                prop_assert_eq!(decision.delay(), Duration::ZERO);
                previous_cost = cost;
            }
        }
    }

    /// Token bucket, leaky bucket meter and GCRA are one algorithm in three representations:
    /// on any sequence they decide identically.
    #[test]
    fn token_bucket_leaky_meter_and_gcra_agree(
        (limit, period, burst) in rate(),
        arrivals in arrivals(3_000, 4),
    ) {
        let decisions = |algorithm| {
            let limiter = limiter(algorithm, tier(limit, period).with_burst(burst));
            arrivals
                .iter()
                .map(|&(gap, cost)| {
                    limiter.clock().advance(Duration::from_micros(gap));
                    limiter.check_now(b"key", cost.min(burst)).unwrap()
                })
                .collect::<Vec<_>>()
        };
        let token = decisions(Algorithm::TokenBucket(TokenBucket::default()));
        prop_assert_eq!(&token, &decisions(Algorithm::LeakyBucket(LeakyBucket::Meter)));
        prop_assert_eq!(&token, &decisions(Algorithm::Gcra));
    }

    /// No window aligned to the period ever holds more than `limit` permits.
    #[test]
    fn fixed_window_never_exceeds_the_limit_per_window((limit, period, _) in rate(), arrivals in arrivals(2_000, 3)) {
        let limiter = limiter(Algorithm::FixedWindow, tier(limit, period));
        let admitted = run(&limiter, &arrivals);
        for &(t, _) in &admitted {
            let start = t - t % period;
            prop_assert!(permits_between(&admitted, start, start + period - 1) <= limit);
        }
    }

    /// No span of `count` aligned sub-windows ever holds more than `limit` permits.
    #[test]
    fn sub_windows_never_exceed_the_limit_per_span(
        limit in 1u64..=20,
        count in 1u64..=10,
        length in 1u64..=500,
        arrivals in arrivals(300, 3),
    ) {
        let period = count * length;
        let algorithm = Algorithm::SubWindows(SubWindows { count: count as u32 });
        let limiter = limiter(algorithm, tier(limit, period));
        let admitted = run(&limiter, &arrivals);
        for &(t, _) in &admitted {
            let oldest = (t / length + 1).saturating_sub(count) * length;
            prop_assert!(permits_between(&admitted, oldest, t) <= limit);
        }
    }

    /// Warm-up never admits faster than the stable rate: each admission pays for the previous.
    #[test]
    fn warm_up_never_outpaces_the_stable_rate(
        limit in 1u64..=20,
        warm_up in 2u64..=10,
        arrivals in arrivals(200_000, 3),
    ) {
        let period = 1_000_000;
        let algorithm = Algorithm::WarmUp(WarmUp::new(Duration::from_micros(warm_up * period)));
        let limiter = limiter(algorithm, tier(limit, period));
        let admitted = run(&limiter, &arrivals);
        for pair in admitted.windows(2) {
            let [(t0, cost), (t1, _)] = [pair[0], pair[1]];
            prop_assert!((t1 - t0) * limit >= cost * period, "{cost} at {t0}, next at {t1}");
        }
    }
}
