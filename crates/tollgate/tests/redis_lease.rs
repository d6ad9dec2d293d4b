//! The lease store: permits leased from Redis and spent in memory. Never more than the limit
//! across instances under concurrency; a busy instance leases more; unused permits go back on
//! shutdown; Redis failing leaves the leases held usable and the policy deciding the rest.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::RedisServer;
use tollgate::{
    Algorithm, Clock, FailurePolicy, LeaseConfig, LeaseStore, Limiter, ManualClock, RedisStore,
    RedisStoreBuilder, Rule, Source, Store, StoreFailures, StoreTime, Tier,
};

fn redis(server: &RedisServer, time: StoreTime) -> RedisStoreBuilder {
    RedisStore::builder(&server.url())
        .store_time(time)
        .timeout(Duration::from_secs(5))
}

fn counter(server: &RedisServer, rule: &str) -> u64 {
    let counters = server.cli(&["--scan", "--pattern", &format!("tg:c:{rule}:*")]);
    let counter = counters.lines().next().expect("a counter");
    server.cli(&["get", counter]).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_together_never_admit_more_than_the_limit() {
    let server = RedisServer::start();
    const LIMIT: u64 = 300;
    let rule = Rule::new("exact", Algorithm::FixedWindow, [Tier::per_day(LIMIT)]).unwrap();
    let mut tasks = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let store = LeaseStore::new(
            &redis(&server, StoreTime::Server).build().await.unwrap(),
            LeaseConfig::default(),
        );
        let limiter = Arc::new(
            Limiter::builder(rule.clone())
                .store(store.clone())
                .build()
                .unwrap(),
        );
        stores.push(store);
        for _ in 0..16 {
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for n in 0..50u64 {
                    let cost = 1 + n % 2;
                    let decision = limiter.check("tenant", cost).await.unwrap();
                    assert_eq!(decision.source(), Source::Lease);
                    if decision.allowed() {
                        admitted += cost;
                    }
                }
                // Single permits to the end, so that no remainder is left by a cost of 2.
                for _ in 0..5 {
                    admitted += u64::from(limiter.check("tenant", 1).await.unwrap().allowed());
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, LIMIT);
    assert_eq!(counter(&server, "exact"), LIMIT);
    let calls: u64 = stores.iter().map(|s| s.stats().calls).sum();
    println!("{admitted} admitted with {calls} lease calls");
    assert!(calls < LIMIT / 2, "{calls} calls");
}

#[tokio::test]
async fn a_busy_instance_leases_more_and_unused_permits_go_back() {
    let server = RedisServer::start();
    let rule = Rule::new("adapt", Algorithm::FixedWindow, [Tier::per_day(100_000)]).unwrap();
    let clock = ManualClock::new();
    let config = LeaseConfig {
        instances: 2,
        ..LeaseConfig::default()
    };
    let busy = LeaseStore::new(
        &redis(&server, StoreTime::Local).build().await.unwrap(),
        config,
    );
    let quiet = LeaseStore::new(
        &redis(&server, StoreTime::Local).build().await.unwrap(),
        config,
    );
    let limiter = |store: &LeaseStore| {
        Limiter::builder(rule.clone())
            .store(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (limiter(&busy), limiter(&quiet));
    // A minute at 200 and 10 checks per second.
    for _ in 0..60 {
        for i in 0..200 {
            assert!(a.check("tenant", 1).await.unwrap().allowed());
            if i % 20 == 0 {
                assert!(b.check("tenant", 1).await.unwrap().allowed());
            }
        }
        clock.advance(Duration::from_secs(1));
    }
    let (busy_stats, quiet_stats) = (busy.stats(), quiet.stats());
    println!("busy {busy_stats:?}, quiet {quiet_stats:?}");
    // A lease lasts about a second of each one's own rate.
    let busy_batch = busy_stats.leased / busy_stats.calls;
    let quiet_batch = quiet_stats.leased / quiet_stats.calls;
    assert!(
        busy_batch >= 5 * quiet_batch,
        "{busy_batch} vs {quiet_batch}"
    );
    assert!(busy_stats.calls <= 70 && quiet_stats.calls <= 70);
    // What they leased and did not spend goes back.
    let spent = 60 * (200 + 10);
    busy.shutdown().await;
    quiet.shutdown().await;
    assert_eq!(counter(&server, "adapt"), spent);
    assert_eq!(
        busy.stats().leased + quiet.stats().leased - busy.stats().returned - quiet.stats().returned,
        spent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_held_are_spent_while_redis_is_down_and_leasing_resumes_after() {
    let mut server = RedisServer::start();
    let rule = Rule::new("outage", Algorithm::FixedWindow, [Tier::per_day(1_000)])
        .and_then(|rule| rule.on_failure(FailurePolicy::Closed))
        .unwrap();
    let store = LeaseStore::new(
        &redis(&server, StoreTime::Server)
            .circuit_breaker(2, Duration::from_millis(200))
            .build()
            .await
            .unwrap(),
        LeaseConfig::default(),
    );
    let limiter = Limiter::builder(rule).store(store.clone()).build().unwrap();
    for _ in 0..50 {
        let decision = limiter.check("tenant", 1).await.unwrap();
        assert_eq!(
            (decision.allowed(), decision.source()),
            (true, Source::Lease)
        );
    }
    // Leases grew past what was spent; those held are spent locally while Redis is down.
    let held = store.stats().leased - 50;
    assert!(held > 0);
    server.kill();
    for n in 0..held {
        let decision = limiter.check("tenant", 1).await.unwrap();
        assert_eq!(
            (decision.allowed(), decision.source()),
            (true, Source::Lease),
            "{n} of {held}: {decision:?} {:?}",
            store.stats()
        );
    }
    assert_eq!(store.failures(), StoreFailures::default());
    let denied = limiter.check("tenant", 1).await.unwrap();
    assert_eq!(
        (denied.allowed(), denied.source()),
        (false, Source::FailClosed)
    );
    let failures = store.failures();
    assert_eq!(failures.errors + failures.timeouts, 1, "{failures:?}");
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let decision = limiter.check("tenant", 1).await.unwrap();
        if decision.source() == Source::Lease {
            assert!(decision.allowed());
            break;
        }
        assert!(Instant::now() < deadline, "never leased again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ManualClock::new().now_micros() > 0);
}

#[tokio::test]
async fn rules_without_a_budget_per_window_are_refused() {
    let server = RedisServer::start();
    let store = LeaseStore::new(
        &redis(&server, StoreTime::Server).build().await.unwrap(),
        LeaseConfig::default(),
    );
    let rule = Rule::new("log", Algorithm::SlidingLog, [Tier::per_second(5)]).unwrap();
    let err = Limiter::builder(rule)
        .store(store.clone())
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule `log`: algorithm: the lease store holds only fixed_window (a budget of permits \
         per window, leased ahead); sliding_log is held by the strict Redis store and the \
         memory store"
    );
    // An algorithm the hybrid store holds is pointed there too.
    let rule = Rule::new("sliding", Algorithm::SlidingWindow, [Tier::per_second(5)]).unwrap();
    let err = Limiter::builder(rule).store(store).build().unwrap_err();
    assert!(
        err.to_string()
            .contains("sliding_window is held by the strict Redis store, the hybrid store"),
        "{err}"
    );
}
