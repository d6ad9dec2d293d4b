//! The hybrid store: decisions in memory, counts synced through Redis. One instance is exact;
//! several stay within the stated bound of `instances x max_unsynced`; failing syncs lose
//! nothing and the failure policy decides once the counts are stale.

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, FailurePolicy, HybridConfig, HybridStore, Limiter, ManualClock, RedisStore,
    Rule, Source, StoreTime, Tier, TokenBucket,
};

type HybridLimiter = Limiter<HybridStore, ManualClock>;

async fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .store_time(StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A store whose syncs the test drives (the interval is an hour).
async fn hybrid(server: &RedisServer, max_unsynced: Option<u64>, instances: u32) -> HybridStore {
    let config = HybridConfig {
        sync_interval: Duration::from_secs(3_600),
        max_unsynced,
        instances,
        ..HybridConfig::default()
    };
    HybridStore::new(&redis(server).await, config).unwrap()
}

fn limiter(store: &HybridStore, rule: &Rule, clock: &ManualClock) -> HybridLimiter {
    Limiter::builder(rule.clone())
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn one_instance_is_exact_and_its_counts_reach_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let name = algorithm.name();
        let rule = Rule::new(name, algorithm, [Tier::per_minute(50)]).unwrap();
        let store = hybrid(&server, None, 1).await;
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
        let counters = server.cli(&["--scan", "--pattern", &format!("tg:c:{name}:*")]);
        let current = counters.lines().max().expect("a counter per window");
        assert_eq!(server.cli(&["get", current]), "50", "{name}");
        let ttl: u64 = server.cli(&["pttl", current]).parse().unwrap();
        assert!(ttl > 0, "{name}: every counter expires");
        // Every sync was one call; every decision but those took no round trip.
        let stats = store.stats();
        assert_eq!(stats.decisions, 120);
        assert_eq!(stats.calls, stats.syncs);
        assert!(stats.calls <= 19, "{stats:?}");
        clock.advance(Duration::from_secs(3_600));
    }
}

#[tokio::test]
async fn three_instances_stay_within_the_stated_bound() {
    let server = RedisServer::start();
    const LIMIT: u64 = 300;
    const MAX_UNSYNCED: u64 = 20;
    let rule = Rule::new("shared", Algorithm::FixedWindow, [Tier::per_day(LIMIT)]).unwrap();
    let clock = ManualClock::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(hybrid(&server, Some(MAX_UNSYNCED), 3).await);
    }
    let limiters: Vec<HybridLimiter> = stores.iter().map(|s| limiter(s, &rule, &clock)).collect();
    let mut admitted = 0;
    // Uneven traffic: the first instance gets half of it.
    for round in 0..40 {
        for (i, limiter) in limiters.iter().enumerate() {
            let checks = if i == 0 { 10 } else { 5 };
            for _ in 0..checks {
                admitted += u64::from(limiter.check_now("tenant", 1).unwrap().allowed());
            }
        }
        // Instances sync at different moments.
        stores[round % 3].sync().await.unwrap();
        if round % 2 == 0 {
            stores[(round + 1) % 3].sync().await.unwrap();
        }
    }
    for store in &stores {
        store.sync().await.unwrap();
    }
    println!(
        "admitted {admitted} of a limit of {LIMIT} (bound {})",
        LIMIT + 3 * MAX_UNSYNCED
    );
    assert!(admitted <= LIMIT + 3 * MAX_UNSYNCED, "admitted {admitted}");
    assert!(admitted >= LIMIT - 3, "admitted only {admitted}");
    // Redis holds what was admitted, all instances together.
    let counters = server.cli(&["--scan", "--pattern", "tg:c:shared:*"]);
    let counter = counters.lines().next().expect("one counter");
    assert_eq!(server.cli(&["get", counter]), admitted.to_string());
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
    let store = HybridStore::new(&redis(&server).await, config).unwrap();
    let limiter = limiter(&store, &rule, &clock);
    for _ in 0..10 {
        assert!(limiter.check_now("tenant", 1).unwrap().allowed());
    }
    store.sync().await.unwrap();
    server.kill();
    // Still decided from the counts held, and counted, until they are stale.
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
    let counters = server.cli(&["--scan", "--pattern", "tg:c:outage:*"]);
    let counter = counters.lines().next().expect("a counter");
    assert_eq!(server.cli(&["get", counter]), "5");
    assert!(clock.now_micros() > 0);
}

#[tokio::test]
async fn rules_whose_state_does_not_add_up_are_refused() {
    let server = RedisServer::start();
    let store = hybrid(&server, None, 1).await;
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
        "rule `bucket`: algorithm: the hybrid store holds only fixed_window and sliding_window \
         (counts that add up across instances); token_bucket is held by the strict Redis store \
         and the memory store"
    );
}
