//! In-process checks: tollgate's memory store and governor side by side, in the same run.
//!
//! Groups: one key from one thread, one key from two threads; and metered work (a report, a
//! reservation and its commit) against one check, each awaited on a one-thread runtime. Rates
//! are high so that checks are admitted and write their state (the slower path); governor is
//! measured as users get it (DashMap + SipHash) and with foldhash, the hasher tollgate uses, to
//! separate hashing from the rest. A million keys: `benches/million_keys.rs`.
//!
//! Run: `cargo bench -p tollgate --bench memory`

use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::RateLimiter;
use tollgate::{Algorithm, Tier};

mod support;
use support::{Key, algorithms, key, limiter, quota, tier};

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
    targets = one_key_one_thread, one_key_two_threads, metered, quotas
}
criterion_main!(benches);
