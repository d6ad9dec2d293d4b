//! Many threads on one key: no admission is lost or duplicated.
//!
//! Time is frozen, so each algorithm's exact capacity is known; every admitted check reports
//! the permits left after it, and across all threads those reports must be exactly
//! `capacity - 1, ..., 1, 0`, each once.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tollgate::{
    Algorithm, Decision, LeakyBucket, Limiter, ManualClock, MemoryStore, Rule, SubWindows, Tier,
    TokenBucket,
};

const THREADS: usize = 8;
const CHECKS_PER_THREAD: usize = 400;
const LIMIT: u64 = 1_000;

/// Runs `THREADS x CHECKS_PER_THREAD` checks of cost 1, all released at once on `keys`.
fn hammer(
    limiter: &Arc<Limiter<MemoryStore, ManualClock>>,
    keys: &[&'static str],
) -> Vec<(usize, Decision)> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limiter, barrier) = (limiter.clone(), barrier.clone());
            let keys = keys.to_vec();
            thread::spawn(move || {
                barrier.wait();
                (0..CHECKS_PER_THREAD)
                    .map(|i| {
                        let key = (t + i) % keys.len();
                        (key, limiter.check_now(keys[key], 1).unwrap())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect()
}

fn frozen(algorithm: Algorithm, tiers: Vec<Tier>) -> Arc<Limiter<MemoryStore, ManualClock>> {
    let rule = Rule::new("stress", algorithm, tiers).unwrap();
    Arc::new(
        Limiter::builder(rule)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

fn assert_exact(name: &str, decisions: &[Decision], capacity: u64) {
    let mut remaining: Vec<u64> = decisions
        .iter()
        .filter(|d| d.allowed())
        .map(Decision::remaining)
        .collect();
    remaining.sort_unstable();
    let expected: Vec<u64> = (0..capacity).collect();
    assert_eq!(remaining.len() as u64, capacity, "{name}: admissions");
    assert_eq!(
        remaining, expected,
        "{name}: each remaining count seen once"
    );
}

#[test]
fn one_key_admits_exactly_the_capacity_under_contention() {
    let burst = |algorithm| (algorithm, vec![Tier::per_minute(LIMIT).with_burst(LIMIT)]);
    let plain = |algorithm| (algorithm, vec![Tier::per_minute(LIMIT)]);
    let cases = [
        plain(Algorithm::FixedWindow),
        plain(Algorithm::SlidingWindow),
        plain(Algorithm::SubWindows(SubWindows { count: 6 })),
        plain(Algorithm::SlidingLog),
        plain(Algorithm::IntervalBucket),
        burst(Algorithm::TokenBucket(TokenBucket::default())),
        burst(Algorithm::LeakyBucket(LeakyBucket::Meter)),
        burst(Algorithm::LeakyBucket(LeakyBucket::Shaper)),
        burst(Algorithm::Gcra),
    ];
    for (algorithm, tiers) in cases {
        let name = algorithm.name();
        let limiter = frozen(algorithm, tiers);
        let decisions: Vec<Decision> = hammer(&limiter, &["one"])
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        assert_exact(name, &decisions, LIMIT);
    }
}

#[test]
fn a_shaper_under_contention_hands_out_every_delay_once() {
    let limiter = frozen(
        Algorithm::LeakyBucket(LeakyBucket::Shaper),
        vec![Tier::per_second(LIMIT)],
    );
    let mut delays: Vec<Duration> = hammer(&limiter, &["one"])
        .into_iter()
        .filter(|(_, d)| d.allowed())
        .map(|(_, d)| d.delay())
        .collect();
    delays.sort_unstable();
    let expected: Vec<Duration> = (0..LIMIT).map(Duration::from_millis).collect();
    assert_eq!(delays, expected);
}

#[test]
fn the_tightest_tier_binds_every_thread() {
    let limiter = frozen(
        Algorithm::FixedWindow,
        vec![Tier::per_second(LIMIT), Tier::per_minute(300)],
    );
    let decisions: Vec<Decision> = hammer(&limiter, &["one"])
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_exact("two tiers", &decisions, 300);
}

#[test]
fn many_keys_each_admit_exactly_their_limit() {
    let keys: Vec<&'static str> = (0..32)
        .map(|i| &*Box::leak(format!("tenant-{i}").into_boxed_str()))
        .collect();
    let limiter = frozen(Algorithm::Gcra, vec![Tier::per_second(50)]);
    let decisions = hammer(&limiter, &keys);
    for (key, name) in keys.iter().enumerate() {
        let of_key: Vec<Decision> = decisions
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|&(_, d)| d)
            .collect();
        assert_exact(name, &of_key, 50);
    }
    assert_eq!(limiter.store().keys(), keys.len());
}
