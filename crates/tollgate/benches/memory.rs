//! In-process checks: tollgate's memory store and governor side by side, in the same run.
//!
//! Groups: one key from one thread, one key from two threads, one million live keys visited in
//! a scattered order (back to back, and each check waiting for the one before); and metered work (a report, a reservation and its commit) against one
//! check, each awaited on a one-thread runtime. Rates are high so that checks are admitted and write their state (the
//! slower path); governor is measured as users get it (DashMap + SipHash) and with foldhash,
//! the hasher tollgate uses, to separate hashing from the rest.
//!
//! Run: `cargo bench -p tollgate --bench memory`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate::{
    Algorithm, LeakyBucket, Limiter, MemoryStore, Rule, SubWindows, Tier, TokenBucket, WarmUp,
};

const RATE: u64 = 1_000_000_000;
const KEYS: usize = 1_000_000;
/// Coprime with `KEYS`: stepping by it visits every key in a cache-hostile order.
const STRIDE: usize = 611_953;

fn tier() -> Tier {
    Tier::per_second(RATE)
}

/// Every algorithm, configured to admit nearly every check.
fn algorithms() -> Vec<(&'static str, Algorithm, Tier)> {
    let bucket = tier().with_burst(RATE);
    vec![
        ("fixed_window", Algorithm::FixedWindow, tier()),
        ("sliding_window", Algorithm::SlidingWindow, tier()),
        (
            "sub_windows_10",
            Algorithm::SubWindows(SubWindows { count: 10 }),
            tier(),
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog,
            Tier::new(10, Duration::from_micros(1)),
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket(TokenBucket::default()),
            bucket.clone(),
        ),
        ("interval_bucket", Algorithm::IntervalBucket, tier()),
        (
            "leaky_bucket",
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            bucket.clone(),
        ),
        (
            "leaky_bucket_shaper",
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            bucket.clone(),
        ),
        ("gcra", Algorithm::Gcra, bucket),
        (
            "warm_up",
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(1))),
            tier(),
        ),
    ]
}

fn limiter(algorithm: Algorithm, tier: Tier) -> Limiter {
    let rule = Rule::new("bench", algorithm, [tier]).expect("valid rule");
    let store = MemoryStore::builder().max_keys(2 * KEYS).build().unwrap();
    Limiter::builder(rule)
        .store(store)
        .build()
        .expect("fits the store")
}

fn quota() -> Quota {
    let rate = NonZeroU32::new(RATE as u32).unwrap();
    Quota::per_second(rate).allow_burst(rate)
}

type Key = [u8; 16];

fn key(i: usize) -> Key {
    let mut key = [0; 16];
    key.copy_from_slice(format!("{i:016x}").as_bytes());
    key
}

/// Wall time for `iters` calls of `check` split over two threads started together.
fn two_threads(iters: u64, check: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(2);
    let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
        let workers: Vec<_> = [iters / 2, iters - iters / 2]
            .into_iter()
            .map(|n| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..n {
                        check();
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    end - start
}

fn one_key_one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_key_one_thread");
    let key = key(42);
    for (name, algorithm, tier) in algorithms() {
        let limiter = limiter(algorithm, tier);
        group.bench_function(BenchmarkId::new("tollgate", name), |b| {
            b.iter(|| limiter.check_now(black_box(&key), 1))
        });
    }
    let governor = RateLimiter::keyed(quota());
    group.bench_function(BenchmarkId::new("governor", "keyed"), |b| {
        b.iter(|| governor.check_key(black_box(&key)))
    });
    let governor =
        RateLimiter::dashmap_with_hasher(quota(), foldhash::fast::RandomState::default());
    group.bench_function(BenchmarkId::new("governor", "keyed_foldhash"), |b| {
        b.iter(|| governor.check_key(black_box(&key)))
    });
    let governor = RateLimiter::direct(quota());
    group.bench_function(BenchmarkId::new("governor", "direct_unkeyed"), |b| {
        b.iter(|| governor.check())
    });
    group.finish();
}

fn one_key_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_key_two_threads");
    let key = key(42);
    for (name, algorithm, tier) in algorithms() {
        let limiter = limiter(algorithm, tier);
        group.bench_function(BenchmarkId::new("tollgate", name), |b| {
            b.iter_custom(|iters| {
                two_threads(iters, &|| {
                    black_box(limiter.check_now(black_box(&key), 1)).ok();
                })
            })
        });
    }
    let governor = RateLimiter::keyed(quota());
    group.bench_function(BenchmarkId::new("governor", "keyed"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(governor.check_key(black_box(&key))).ok();
            })
        })
    });
    let governor =
        RateLimiter::dashmap_with_hasher(quota(), foldhash::fast::RandomState::default());
    group.bench_function(BenchmarkId::new("governor", "keyed_foldhash"), |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(governor.check_key(black_box(&key))).ok();
            })
        })
    });
    group.finish();
}

fn million_keys(c: &mut Criterion) {
    million::<false>(c, "million_keys");
    million::<true>(c, "million_keys_dependent");
}

/// A million live keys visited in a scattered order. Back to back, a loop's checks overlap
/// their memory misses with the next check's; `dependent`, each key's index waits for the
/// decision before it, as a service's next check waits for the work around the last, so every
/// check pays its own misses in full.
fn million<const DEPENDENT: bool>(c: &mut Criterion, name: &str) {
    let mut group = c.benchmark_group(name);
    let keys: Vec<Key> = (0..KEYS).map(key).collect();
    // Zero, unknown to the compiler: `x & zero` makes the next index wait for `x`.
    let zero = black_box(0);
    let next = move |i: usize, x: usize| {
        let wait = if DEPENDENT { x & zero } else { 0 };
        (i + STRIDE + wait) % KEYS
    };
    for (name, algorithm, tier) in algorithms() {
        // Every row holds a million live keys: a log of a microsecond would be as good as new
        // at each key's next check, so its row would measure an empty table.
        let tier = match algorithm {
            Algorithm::SlidingLog => Tier::per_second(10),
            _ => tier,
        };
        let limiter = limiter(algorithm, tier);
        for k in &keys {
            limiter.check_now(k, 1).unwrap();
        }
        group.bench_function(BenchmarkId::new("tollgate", name), |b| {
            let mut i = 0;
            b.iter(|| {
                let decision = limiter.check_now(black_box(&keys[i]), 1).unwrap();
                i = next(i, decision.remaining() as usize);
                decision
            })
        });
        assert_eq!(limiter.store().keys(), KEYS, "{name}: every key held");
    }
    let governor = RateLimiter::keyed(quota());
    let governor_foldhash =
        RateLimiter::dashmap_with_hasher(quota(), foldhash::fast::RandomState::default());
    for k in &keys {
        let _ = governor.check_key(k);
        let _ = governor_foldhash.check_key(k);
    }
    group.bench_function(BenchmarkId::new("governor", "keyed"), |b| {
        let mut i = 0;
        b.iter(|| {
            let decision = governor.check_key(black_box(&keys[i]));
            i = next(i, usize::from(decision.is_ok()));
            decision
        })
    });
    group.bench_function(BenchmarkId::new("governor", "keyed_foldhash"), |b| {
        let mut i = 0;
        b.iter(|| {
            let decision = governor_foldhash.check_key(black_box(&keys[i]));
            i = next(i, usize::from(decision.is_ok()));
            decision
        })
    });
    group.finish();
}

/// Metered work against one check, on 10,000 keys in turn: a check of 10, a report of 7, a
/// reservation of 10 committed at 7 (one settled request).
fn metered(c: &mut Criterion) {
    let mut group = c.benchmark_group("metered");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limiter = limiter(Algorithm::FixedWindow, tier());
    let keys: Vec<Key> = (0..10_000).map(key).collect();
    let next = std::cell::Cell::new(0usize);
    let key = || {
        let i = next.get();
        next.set((i + 1) % keys.len());
        &keys[i]
    };
    group.bench_function(BenchmarkId::new("tollgate", "check"), |b| {
        b.to_async(&runtime)
            .iter(|| async { limiter.check(black_box(key()), 10).await.unwrap() })
    });
    group.bench_function(BenchmarkId::new("tollgate", "report"), |b| {
        b.to_async(&runtime)
            .iter(|| async { limiter.report(black_box(key()), 7).await.unwrap() })
    });
    group.bench_function(BenchmarkId::new("tollgate", "reserve_commit"), |b| {
        b.to_async(&runtime).iter(|| async {
            let item = [tollgate::Item::new("bench", key(), 10)];
            let reserved = limiter.reserve(&item, None).await.unwrap();
            limiter.commit(reserved.id().unwrap(), 7).await.unwrap()
        })
    });
    group.finish();
}

/// What the quotas issue added against a plain check, on 10,000 keys in turn: a fixed
/// window by the hour; a calendar month in Paris; a slot of 10 held and released (two calls,
/// a permit's record made and taken out).
fn quotas(c: &mut Criterion) {
    let mut group = c.benchmark_group("quotas");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let keys: Vec<Key> = (0..10_000).map(key).collect();
    let next = std::cell::Cell::new(0usize);
    let key = || {
        let i = next.get();
        next.set((i + 1) % keys.len());
        &keys[i]
    };
    let plain = limiter(Algorithm::FixedWindow, Tier::per_hour(1_000_000_000));
    let month = tollgate::Calendar::month().in_zone("Europe/Paris").unwrap();
    let calendar = limiter(Algorithm::FixedWindow, Tier::calendar(1_000_000_000, month));
    let slots = limiter(
        Algorithm::Concurrency,
        Tier::new(10, Duration::from_secs(60)),
    );
    group.bench_function(BenchmarkId::new("tollgate", "check"), |b| {
        b.to_async(&runtime)
            .iter(|| async { plain.check(black_box(key()), 1).await.unwrap() })
    });
    group.bench_function(BenchmarkId::new("tollgate", "calendar_month"), |b| {
        b.to_async(&runtime)
            .iter(|| async { calendar.check(black_box(key()), 1).await.unwrap() })
    });
    group.bench_function(BenchmarkId::new("tollgate", "hold_release"), |b| {
        b.to_async(&runtime).iter(|| async {
            let item = [tollgate::Item::new("bench", key(), 1)];
            let held = slots.hold(&item).await.unwrap();
            slots.release(held.id().unwrap()).await.unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = one_key_one_thread, one_key_two_threads, million_keys, metered, quotas
}
criterion_main!(benches);
