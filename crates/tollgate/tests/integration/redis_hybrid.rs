//! The hybrid store: decisions in memory, counts synced and permits claimed through Redis.
//! One instance is exact; several, with the default settings, hammered from the first
//! microsecond of a window, started together or one after another, stay within the bound the
//! documentation states (the limit plus each instance's unclaimed permits); failing syncs lose
//! nothing and the failure policy decides once the counts are stale.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, FailurePolicy, HybridConfig, HybridStore, Limiter, ManualClock, RedisStore,
    Rule, Source, StoreTime, Tier, TokenBucket,
};

type HybridLimiter = Limiter<HybridStore, ManualClock>;

async fn redis(server: &RedisServer, time: StoreTime) -> RedisStore {
    RedisStore::builder(&server.url())
        .store_time(time)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A store on a manual clock whose syncs the test drives (the interval is an hour).
async fn driven(server: &RedisServer, max_unclaimed: Option<u64>) -> HybridStore {
    let config = HybridConfig {
        sync_interval: Duration::from_secs(3_600),
        max_unclaimed,
        ..HybridConfig::default()
    };
    HybridStore::new(&redis(server, StoreTime::Local).await, config).unwrap()
}

fn limiter(store: &HybridStore, rule: &Rule, clock: &ManualClock) -> HybridLimiter {
    Limiter::builder(rule.clone())
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The counts Redis holds for `rule`'s windows (all instances' admissions, once pushed).
fn window_counts(server: &RedisServer, rule: &str) -> Vec<u64> {
    counters(server, rule).into_values().collect()
}

/// Each window counter of `rule` Redis holds, by name (a counter that expires between the scan
/// and its read is left out).
fn counters(server: &RedisServer, rule: &str) -> HashMap<String, u64> {
    let keys = server.cli(&["--scan", "--pattern", &format!("tg:c:{rule}:*")]);
    keys.lines()
        .filter(|k| !k.ends_with(":claims"))
        .filter_map(|k| {
            let count = server.cli(&["get", k]);
            (!count.is_empty()).then(|| (k.to_string(), count.parse().unwrap()))
        })
        .collect()
}

#[tokio::test]
async fn one_instance_is_exact_and_its_counts_reach_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let name = algorithm.name();
        let rule = Rule::new(name, algorithm, [Tier::per_minute(50)]).unwrap();
        let store = driven(&server, None).await;
        let limiter = limiter(&store, &rule, &clock);
        let mut admitted = 0;
        for i in 0..120 {
            let decision = limiter.check_now("tenant", 1).unwrap();
            assert_eq!(decision.source(), Source::Hybrid);
            admitted += u32::from(decision.allowed());
            if i % 7 == 0 {
                store.sync().await.unwrap();
            }
        }
        assert_eq!(admitted, 50, "{name}");
        store.sync().await.unwrap();
        assert_eq!(window_counts(&server, name), [50], "{name}");
        let counters = server.cli(&["--scan", "--pattern", &format!("tg:c:{name}:*")]);
        for key in counters.lines() {
            let ttl: i64 = server.cli(&["pttl", key]).parse().unwrap();
            assert!(ttl > 0, "{name}: {key} expires");
        }
        // Every sync was one call; every decision but those took no round trip.
        let stats = store.stats();
        assert_eq!(stats.decisions, 120);
        assert_eq!(stats.calls, stats.syncs);
        assert!(stats.calls <= 20, "{stats:?}");
        clock.advance(Duration::from_secs(3_600));
    }
}

/// What the documentation states: the limit, plus each instance's unclaimed permits (2, or a
/// hundredth of the limit shared by the instances it knows of: with the default `instances`,
/// before its first sync, itself alone).
fn bound(limit: u64, instances: u64) -> u64 {
    limit + instances * (limit / 100).max(2)
}

/// `instances` hybrid stores with the default settings on one Redis, each checked by 4 tasks
/// as fast as they go, one key, a window of `period`; starting at the first microsecond of a
/// window, or one after another, `stagger` apart. Runs for `windows` windows and returns the
/// count of each window, as Redis holds it once every store pushed its last counts.
async fn hammer(
    server: &RedisServer,
    name: &str,
    limit: u64,
    period: Duration,
    instances: usize,
    stagger: Duration,
    windows: u32,
) -> Vec<u64> {
    let rule = Rule::new(name, Algorithm::FixedWindow, [Tier::new(limit, period)]).unwrap();
    let mut stores = Vec::new();
    for _ in 0..instances {
        let redis = redis(server, StoreTime::Server).await;
        stores.push(HybridStore::new(&redis, HybridConfig::default()).unwrap());
    }
    // The first microsecond of the next window, by the clock Redis shares with this machine.
    let period_us = period.as_micros() as u64;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let start = Instant::now() + Duration::from_micros(period_us - now % period_us);
    let end = start + period * windows;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let limiter = Arc::new(
            Limiter::builder(rule.clone())
                .store(store.clone())
                .build()
                .unwrap(),
        );
        for _ in 0..4 {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            let begin = start + stagger * i as u32;
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let decision = limiter.check("tenant", 1).await.unwrap();
                    assert_eq!(decision.source(), Source::Hybrid);
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    // Windows' counters expire a period after their window: read them while they last (a
    // count only grows, so its largest reading is its last).
    let seen = std::thread::scope(|scope| {
        let reading = scope.spawn(|| {
            let mut seen: HashMap<String, u64> = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                for (key, count) in counters(server, name) {
                    let kept = seen.entry(key).or_default();
                    *kept = (*kept).max(count);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        });
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                for task in tasks {
                    task.await.unwrap();
                }
                for store in &stores {
                    store.sync().await.unwrap();
                }
            })
        });
        stop.store(true, Ordering::Relaxed);
        reading.join().unwrap()
    });
    let mut counts = seen;
    for (key, count) in counters(server, name) {
        let kept = counts.entry(key).or_default();
        *kept = (*kept).max(count);
    }
    let mut windows: Vec<(String, u64)> = counts.into_iter().collect();
    windows.sort();
    windows.into_iter().map(|(_, count)| count).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_together_stay_within_the_bound_in_every_window() {
    let server = RedisServer::start();
    for (instances, limit) in [(2, 300), (3, 300), (8, 1_000)] {
        let name = format!("together-{instances}");
        let counts = hammer(
            &server,
            &name,
            limit,
            Duration::from_secs(2),
            instances,
            Duration::ZERO,
            3,
        )
        .await;
        println!("{instances} instances, {limit} per 2 s: {counts:?}");
        assert!(counts.len() >= 3, "{counts:?}");
        for count in counts {
            assert!(count <= bound(limit, instances as u64), "{name}: {count}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_one_after_another_stay_within_the_bound() {
    let server = RedisServer::start();
    // A long window that fills before the last instances start: they start cold at its limit.
    let counts = hammer(
        &server,
        "staggered",
        300,
        Duration::from_secs(8),
        5,
        Duration::from_millis(700),
        1,
    )
    .await;
    println!("5 instances, 700 ms apart, 300 per 8 s: {counts:?}");
    for count in &counts {
        assert!(*count <= bound(300, 5), "{count}");
    }
    // The first window held the limit (the instances admitted what it allowed).
    assert!(counts.iter().any(|&c| c >= 300), "{counts:?}");
}

/// Three instances on a manual clock whose syncs come in every order: a busy one, a slow one,
/// one that returns after its claim lapsed. With `max_unclaimed` 0 they never exceed the limit.
#[tokio::test]
async fn claims_alone_never_exceed_the_limit() {
    let server = RedisServer::start();
    const LIMIT: u64 = 300;
    let rule = Rule::new("claims", Algorithm::FixedWindow, [Tier::per_day(LIMIT)]).unwrap();
    let clock = ManualClock::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(driven(&server, Some(0)).await);
    }
    let limiters: Vec<HybridLimiter> = stores.iter().map(|s| limiter(s, &rule, &clock)).collect();
    let mut admitted = 0;
    for round in 0..200 {
        for (i, limiter) in limiters.iter().enumerate() {
            let checks = [10, 3, (round % 5 == 0) as usize * 20][i];
            for _ in 0..checks {
                admitted += u64::from(limiter.check_now("tenant", 1).unwrap().allowed());
            }
        }
        stores[round % 3].sync().await.unwrap();
        if round % 2 == 0 {
            stores[(round + 1) % 3].sync().await.unwrap();
        }
        clock.advance(Duration::from_millis(300));
    }
    for store in &stores {
        store.sync().await.unwrap();
    }
    assert_eq!(admitted, LIMIT);
    assert_eq!(window_counts(&server, "claims"), [LIMIT]);
}

/// A key new to an instance is admitted at once (its unclaimed permits), and so is a key that
/// comes back after its claim lapsed; without unclaimed permits, the first check waits for a
/// claim (denied, with a retry of a few milliseconds).
#[tokio::test]
async fn new_and_returning_keys_are_admitted_without_waiting() {
    let server = RedisServer::start();
    let rule = Rule::new("sporadic", Algorithm::FixedWindow, [Tier::per_day(1_000)]).unwrap();
    let clock = ManualClock::new();
    let store = driven(&server, None).await;
    let limiter = limiter(&store, &rule, &clock);
    for _ in 0..10 {
        // The default: a hundredth of 1000.
        assert!(limiter.check_now("tenant", 1).unwrap().allowed());
    }
    let starved = limiter.check_now("tenant", 1).unwrap();
    assert!(!starved.allowed());
    assert!(starved.retry_after().unwrap() <= Duration::from_millis(50));
    assert_eq!(store.stats().allowance_denials, 1);
    store.sync().await.unwrap();
    assert!(limiter.check_now("tenant", 1).unwrap().allowed());
    // Hours later, its claim long lapsed: admitted at once again.
    clock.advance(Duration::from_secs(7_200));
    store.sync().await.unwrap();
    assert!(limiter.check_now("tenant", 1).unwrap().allowed());

    let strict = driven(&server, Some(0)).await;
    let waits = self::limiter(&strict, &rule, &clock);
    assert!(!waits.check_now("other", 1).unwrap().allowed());
    strict.sync().await.unwrap();
    assert!(waits.check_now("other", 1).unwrap().allowed());
}

/// With `max_unclaimed: Some(0)` (never over the limit), a key's first check in a window waits
/// for the claim its sync brings, rather than being denied while the budget is untouched; a
/// denial then means the budget is spent. Two instances, 3 a day: the first check of each
/// is admitted, and together they admit exactly 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_without_a_claim_waits_for_it_and_a_denial_means_the_budget_is_spent() {
    let server = RedisServer::start();
    let rule = Rule::new("first", Algorithm::FixedWindow, [Tier::per_day(3)]).unwrap();
    let clock = ManualClock::new();
    let config = HybridConfig {
        sync_interval: Duration::from_secs(1),
        max_unclaimed: Some(0),
        ..HybridConfig::default()
    };
    let stores = [
        HybridStore::new(&redis(&server, StoreTime::Local).await, config).unwrap(),
        HybridStore::new(&redis(&server, StoreTime::Local).await, config).unwrap(),
    ];
    let limiters: Vec<HybridLimiter> = stores.iter().map(|s| limiter(s, &rule, &clock)).collect();
    for (i, limiter) in limiters.iter().enumerate() {
        let first = limiter.check(format!("tenant-{i}"), 1).await.unwrap();
        assert!(first.allowed(), "the first check of a fresh key: {first:?}");
        assert_eq!(first.remaining(), 2);
    }
    let mut admitted = 0;
    for round in 0..10 {
        let d = limiters[round % 2].check("shared", 1).await.unwrap();
        if d.allowed() {
            admitted += 1;
        } else {
            // Denied after the wait: the budget is spent, nothing is left to claim.
            assert_eq!(d.remaining(), 0, "round {round}: {d:?}");
        }
    }
    assert_eq!(admitted, 3);
}

/// Claims an idle instance holds lapse: after three sync intervals the others may admit the
/// whole limit.
#[tokio::test]
async fn an_idle_instances_claim_lapses() {
    let server = RedisServer::start();
    let rule = Rule::new("lapse", Algorithm::FixedWindow, [Tier::per_day(100)]).unwrap();
    let clock = ManualClock::new();
    let config = HybridConfig {
        sync_interval: Duration::from_secs(3_600),
        max_unclaimed: Some(0),
        ..HybridConfig::default()
    };
    let busy = HybridStore::new(&redis(&server, StoreTime::Local).await, config).unwrap();
    let other = HybridStore::new(&redis(&server, StoreTime::Local).await, config).unwrap();
    let (busy_limiter, other_limiter) = (
        limiter(&busy, &rule, &clock),
        limiter(&other, &rule, &clock),
    );
    // The busy instance claims, for the rate it saw, more than it then uses.
    busy_limiter.check_now("tenant", 1).unwrap();
    busy.sync().await.unwrap();
    let mut used = 0;
    while busy_limiter.check_now("tenant", 1).unwrap().allowed() {
        used += 1;
    }
    busy.sync().await.unwrap();
    assert!(used > 0);
    // The other instance is held back by the busy one's claim...
    other_limiter.check_now("tenant", 1).unwrap();
    other.sync().await.unwrap();
    let mut admitted = 0;
    while other_limiter.check_now("tenant", 1).unwrap().allowed() {
        admitted += 1;
        if admitted % 10 == 0 {
            other.sync().await.unwrap();
        }
    }
    let counted: u64 = window_counts(&server, "lapse").iter().sum();
    assert!(counted < 100, "{counted}");
    // ...until it lapses, three intervals later.
    clock.advance(Duration::from_secs(3 * 3_600 + 1));
    for _ in 0..20 {
        while other_limiter.check_now("tenant", 1).unwrap().allowed() {}
        other.sync().await.unwrap();
    }
    assert_eq!(window_counts(&server, "lapse"), [100]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_admitted_while_redis_is_down_reach_it_when_it_returns() {
    let mut server = RedisServer::start();
    let rule = Rule::new("outage", Algorithm::FixedWindow, [Tier::per_day(1_000)])
        .and_then(|rule| rule.on_failure(FailurePolicy::Closed))
        .unwrap();
    let clock = ManualClock::new();
    let config = HybridConfig {
        sync_interval: Duration::from_millis(100),
        ..HybridConfig::default()
    };
    let store = HybridStore::new(&redis(&server, StoreTime::Local).await, config).unwrap();
    let limiter = limiter(&store, &rule, &clock);
    for _ in 0..10 {
        assert!(limiter.check_now("tenant", 1).unwrap().allowed());
    }
    store.sync().await.unwrap();
    server.kill();
    // Still decided from the counts and claim held, and counted, until they are stale.
    for _ in 0..5 {
        let decision = limiter.check_now("tenant", 1).unwrap();
        assert_eq!(
            (decision.allowed(), decision.source()),
            (true, Source::Hybrid)
        );
    }
    assert!(store.sync().await.is_err());
    let failures = store.failures();
    assert!(failures.errors + failures.timeouts >= 1, "{failures:?}");
    // Stale after two intervals and a second: the rule fails closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.check_now("tenant", 0).unwrap().source() != Source::FailClosed {
        assert!(Instant::now() < deadline, "never went stale");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.degraded());
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.check_now("tenant", 0).unwrap().source() != Source::Hybrid {
        assert!(Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!store.degraded());
    // The restarted Redis holds the 5 admitted while it was down (its counts were lost with it;
    // this instance pushed what it had not sent).
    store.sync().await.unwrap();
    assert_eq!(window_counts(&server, "outage"), [5]);
    assert!(clock.now_micros() > 0);
}

#[tokio::test]
async fn settings_out_of_range_are_refused() {
    let server = RedisServer::start();
    let redis = redis(&server, StoreTime::Server).await;
    for (config, message) in [
        (
            HybridConfig {
                sync_interval: Duration::ZERO,
                ..HybridConfig::default()
            },
            "store: sync_interval: must be at least 1 ms",
        ),
        (
            HybridConfig {
                instances: 0,
                ..HybridConfig::default()
            },
            "store: instances: must be at least 1",
        ),
        (
            HybridConfig {
                max_keys: 0,
                ..HybridConfig::default()
            },
            "store: max_keys: must be at least 1",
        ),
    ] {
        let err = HybridStore::new(&redis, config).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
}

#[tokio::test]
async fn rules_whose_state_does_not_add_up_are_refused() {
    let server = RedisServer::start();
    let store = driven(&server, None).await;
    // README's token bucket: neither the hybrid nor the lease store holds it, so the error
    // must not send the user from one to the other.
    let rule = Rule::new(
        "bucket",
        Algorithm::TokenBucket(TokenBucket::default()),
        [Tier::per_second(5)],
    )
    .unwrap();
    let err = Limiter::builder(rule).store(store).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule `bucket`: algorithm: the hybrid store holds only fixed_window, sliding_window and hit_counter \
         (counts that add up across instances); token_bucket is held by the strict Redis store \
         and the memory store"
    );
}
