//! One behaviour suite, run against every store: memory, Redis, Redis Cluster, hybrid and
//! lease. Each behaviour is a generic function; the macro at the end runs each on each store,
//! on a manual clock (the Redis stores decide at the caller's time). Metered work (reports
//! and reservations) runs on the stores that hold it (memory, Redis, Redis Cluster); the
//! hybrid and lease stores refuse it.

use crate::support;

use std::time::Duration;

use support::{RedisCluster, RedisServer};
use tollgate::{
    Algorithm, Clock, Error, HybridConfig, HybridStore, Item, LeaseConfig, LeaseStore, Limiter,
    MAX_KEY_LEN, ManualClock, MemoryStore, OnExpiry, RedisStore, Reservations, Rule, Source, Store,
    StoreTime, Tier,
};

/// A store to run the behaviours on, and the servers it needs.
trait Backend {
    type Store: Store;
    fn store(&self) -> Self::Store;
    /// The source of the decisions it takes when all is well.
    fn source(&self) -> Source;
}

struct Memory(MemoryStore);

struct Strict {
    store: RedisStore,
    _server: Option<RedisServer>,
    _cluster: Option<RedisCluster>,
}

struct Hybrid {
    store: HybridStore,
    _server: RedisServer,
}

struct Lease {
    store: LeaseStore,
    _server: RedisServer,
}

impl Memory {
    async fn start() -> Self {
        Self(MemoryStore::new())
    }
}

async fn redis(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url())
        .store_time(StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

impl Strict {
    async fn single() -> Self {
        let server = RedisServer::start();
        Self {
            store: redis(&server).await,
            _server: Some(server),
            _cluster: None,
        }
    }

    async fn cluster() -> Self {
        let cluster = RedisCluster::start();
        let store = cluster.local_store().await;
        Self {
            store,
            _server: None,
            _cluster: Some(cluster),
        }
    }
}

impl Hybrid {
    async fn start() -> Self {
        let server = RedisServer::start();
        // One instance alone, as every backend here: it may admit every permit it has not
        // claimed yet, which claims, tested in redis_hybrid.rs, bound between instances.
        let config = HybridConfig {
            max_unclaimed: Some(u64::MAX),
            ..HybridConfig::default()
        };
        let store = HybridStore::new(&redis(&server).await, config).unwrap();
        Self {
            store,
            _server: server,
        }
    }
}

impl Lease {
    async fn start() -> Self {
        let server = RedisServer::start();
        let store = LeaseStore::new(&redis(&server).await, LeaseConfig::default()).unwrap();
        Self {
            store,
            _server: server,
        }
    }
}

impl Backend for Memory {
    type Store = MemoryStore;
    fn store(&self) -> MemoryStore {
        self.0.clone()
    }
    fn source(&self) -> Source {
        Source::Memory
    }
}

impl Backend for Strict {
    type Store = RedisStore;
    fn store(&self) -> RedisStore {
        self.store.clone()
    }
    fn source(&self) -> Source {
        Source::Redis
    }
}

impl Backend for Hybrid {
    type Store = HybridStore;
    fn store(&self) -> HybridStore {
        self.store.clone()
    }
    fn source(&self) -> Source {
        Source::Hybrid
    }
}

impl Backend for Lease {
    type Store = LeaseStore;
    fn store(&self) -> LeaseStore {
        self.store.clone()
    }
    fn source(&self) -> Source {
        Source::Lease
    }
}

fn limiter<B: Backend>(
    backend: &B,
    clock: &ManualClock,
    rules: Vec<Rule>,
) -> Limiter<B::Store, ManualClock> {
    let mut rules = rules.into_iter();
    let mut builder = Limiter::builder(rules.next().unwrap());
    for rule in rules {
        builder = builder.rule(rule);
    }
    builder
        .store(backend.store())
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn window(name: &str, tiers: impl IntoIterator<Item = Tier>) -> Rule {
    Rule::new(name, Algorithm::FixedWindow, tiers).unwrap()
}

async fn admits_the_limit_then_denies_until_the_window_ends<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(15));
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("limit", [Tier::per_minute(5)])],
    );
    for left in (0..5).rev() {
        let decision = limiter.check("tenant", 1).await.unwrap();
        assert!(decision.allowed());
        assert_eq!(decision.remaining(), left);
        assert_eq!(decision.source(), backend.source());
    }
    let denied = limiter.check("tenant", 1).await.unwrap();
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(45)));
    assert_eq!((denied.limit(), denied.rule()), (5, "limit"));
    assert_eq!(denied.window(), Duration::from_secs(60));
    clock.advance(Duration::from_secs(45));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
}

async fn keys_are_counted_apart<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("apart", [Tier::per_minute(2)])],
    );
    for key in ["a", "b", "{a}", "a\u{0}b"] {
        assert!(limiter.check(key, 2).await.unwrap().allowed(), "{key:?}");
        assert!(!limiter.check(key, 1).await.unwrap().allowed(), "{key:?}");
    }
}

async fn tiers_consume_from_all_or_from_none<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let tiers = [Tier::per_second(3), Tier::new(5, Duration::from_secs(10))];
    let limiter = limiter(&backend, &clock, vec![window("tiers", tiers)]);
    assert!(limiter.check("k", 3).await.unwrap().allowed());
    let denied = limiter.check("k", 1).await.unwrap();
    assert_eq!((denied.allowed(), denied.tier()), (false, 0));
    clock.advance(Duration::from_secs(1));
    // The ten-second tier has 2 left: a cost of 3 is denied and takes nothing from either.
    let denied = limiter.check("k", 3).await.unwrap();
    assert_eq!((denied.allowed(), denied.tier()), (false, 1));
    assert!(limiter.check("k", 2).await.unwrap().allowed());
}

async fn looks_cost_nothing_and_bad_checks_are_errors<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let limiter = limiter(&backend, &clock, vec![window("bad", [Tier::per_minute(4)])]);
    assert!(limiter.check("k", 3).await.unwrap().allowed());
    for _ in 0..3 {
        assert_eq!(limiter.check("k", 0).await.unwrap().remaining(), 1);
    }
    let too_much = limiter.check("k", 5).await.unwrap_err();
    assert!(matches!(
        too_much,
        Error::CostExceedsCapacity { capacity: 4, .. }
    ));
    let huge = limiter.check(vec![b'k'; MAX_KEY_LEN + 1], 1).await;
    assert!(matches!(huge, Err(Error::KeyTooLong { .. })));
    assert_eq!(limiter.check("k", 0).await.unwrap().remaining(), 1);
}

async fn a_batch_across_rules_is_all_or_nothing<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let rules = vec![
        window("tenant", [Tier::per_minute(10)]),
        window("ip", [Tier::per_minute(1)]),
    ];
    let limiter = limiter(&backend, &clock, rules);
    let batch = |ip| [Item::new("tenant", "acme", 1), Item::new("ip", ip, 1)];
    assert!(
        limiter
            .check_batch(&batch("1.1.1.1"))
            .await
            .unwrap()
            .allowed()
    );
    let denied = limiter.check_batch(&batch("1.1.1.1")).await.unwrap();
    assert!(!denied.allowed() && denied[0].allowed() && !denied[1].allowed());
    let look = [Item::new("tenant", "acme", 0)];
    assert_eq!(limiter.check_batch(&look).await.unwrap()[0].remaining(), 9);
    assert!(
        limiter
            .check_batch(&batch("2.2.2.2"))
            .await
            .unwrap()
            .allowed()
    );
    // A limiter of two rules asks both about a key.
    let both = limiter.check("both", 1).await.unwrap();
    assert!(both.allowed() && both.rule() == "ip");
    assert!(!limiter.check("both", 1).await.unwrap().allowed());
}

async fn a_shadow_rule_counts_but_never_denies<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let rule = window("shadow", [Tier::per_minute(2)]).shadow(true);
    let limiter = limiter(&backend, &clock, vec![rule]);
    let mut shadowed = Vec::new();
    for _ in 0..4 {
        let decision = limiter.check("k", 1).await.unwrap();
        assert!(decision.allowed());
        shadowed.push(decision.shadowed());
    }
    assert_eq!(shadowed, [false, false, true, true]);
}

async fn acquire_waits_for_the_next_window<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("wait", [Tier::per_second(2)])],
    );
    let start = clock.now_micros();
    for _ in 0..5 {
        let decision = limiter
            .acquire("k", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(decision.allowed());
    }
    // Two per second: the fifth waits two seconds.
    assert_eq!(clock.now_micros() - start, 2_000_000);
    let err = limiter.acquire("k", 2, Duration::from_millis(10)).await;
    assert!(matches!(err, Err(Error::Timeout { .. })));
}

async fn a_reset_key_starts_afresh_and_others_keep_their_counts<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(5));
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("reset", [Tier::per_minute(3)])],
    );
    for key in ["a", "b"] {
        for _ in 0..3 {
            assert!(limiter.check(key, 1).await.unwrap().allowed());
        }
        assert!(!limiter.check(key, 1).await.unwrap().allowed());
    }
    limiter.reset("reset", "a").await.unwrap();
    let fresh = limiter.check("a", 1).await.unwrap();
    assert!(fresh.allowed());
    assert_eq!(fresh.remaining(), 2);
    assert!(
        !limiter.check("b", 1).await.unwrap().allowed(),
        "b keeps its count"
    );
    assert!(matches!(
        limiter.reset("nothing", "a").await,
        Err(Error::UnknownRule { .. })
    ));
}

async fn a_report_past_the_limit_is_a_debt_that_ends_with_the_window<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(20));
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("tokens", [Tier::new(10, Duration::from_secs(10))])],
    );
    assert!(limiter.check("t", 4).await.unwrap().allowed());
    // The work used 21 more than it checked: the window is over by 15.
    let after = limiter.report("t", 21).await.unwrap();
    assert!(!after.allowed(), "{after:?}");
    assert_eq!(after.remaining(), 0);
    assert_eq!(after.retry_after(), Some(Duration::from_secs(10)));
    // Even a look is refused while in debt; the next window starts afresh.
    assert!(!limiter.check("t", 0).await.unwrap().allowed());
    clock.advance(Duration::from_secs(10));
    let next = limiter.check("t", 1).await.unwrap();
    assert!(next.allowed());
    assert_eq!(next.remaining(), 9);
    // A report within the limit is admitted and says what is left.
    let within = limiter.report("t", 3).await.unwrap();
    assert!(within.allowed());
    assert_eq!(within.remaining(), 6);
    assert!(matches!(
        limiter.report("t", 1 << 53).await,
        Err(Error::CostTooLarge { .. })
    ));
}

async fn a_reservation_settles_at_the_real_cost<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(20));
    let limiter = limiter(
        &backend,
        &clock,
        vec![window("budget", [Tier::new(10, Duration::from_secs(10))])],
    );
    let item = [Item::new("budget", "acme", 6)];
    let reserved = limiter.reserve(&item, None).await.unwrap();
    assert!(reserved.allowed());
    assert_eq!(reserved.decision().remaining(), 4);
    let id = reserved.id().unwrap().to_string();
    assert_eq!(id.len(), 32);
    // Used 2 of the 6 reserved: 4 come back.
    let settled = limiter.commit(&id, 2).await.unwrap();
    assert_eq!(settled[0].remaining(), 8);
    assert!(matches!(
        limiter.commit(&id, 2).await,
        Err(Error::UnknownReservation { .. })
    ));
    assert!(matches!(
        limiter.cancel(&id).await,
        Err(Error::UnknownReservation { .. })
    ));
    // Used more than reserved: the excess is taken, past the limit if need be.
    let id = limiter
        .reserve(&item, None)
        .await
        .unwrap()
        .id()
        .unwrap()
        .to_string();
    let settled = limiter.commit(&id, 11).await.unwrap();
    assert!(!settled[0].allowed(), "in debt: 2 + 11 of 10");
    // A reservation that is denied takes nothing and has no id.
    let denied = limiter.reserve(&item, None).await.unwrap();
    assert!(!denied.allowed() && denied.id().is_none());
    clock.advance(Duration::from_secs(10));
    // Cancelled: everything comes back.
    let id = limiter
        .reserve(&item, None)
        .await
        .unwrap()
        .id()
        .unwrap()
        .to_string();
    assert_eq!(limiter.cancel(&id).await.unwrap()[0].remaining(), 10);
    assert!(matches!(
        limiter.commit("0123456789abcdef0123456789abcdef", 1).await,
        Err(Error::UnknownReservation { .. })
    ));
}

async fn an_unsettled_reservation_expires_as_its_rule_says<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(20));
    let ttl = Duration::from_secs(2);
    let kept = window("kept", [Tier::per_minute(10)])
        .reservations(Reservations {
            ttl,
            on_expiry: OnExpiry::Consumed,
        })
        .unwrap();
    let released = window("released", [Tier::per_minute(10)])
        .reservations(Reservations {
            ttl,
            on_expiry: OnExpiry::Released,
        })
        .unwrap();
    let limiter = limiter(&backend, &clock, vec![kept, released]);
    let items = [Item::new("kept", "k", 7), Item::new("released", "k", 7)];
    let reserved = limiter.reserve(&items, None).await.unwrap();
    let id = reserved.id().unwrap().to_string();
    assert_eq!(
        limiter.settle_expired(100).await.unwrap(),
        0,
        "not expired yet"
    );
    clock.advance(Duration::from_secs(3));
    assert_eq!(limiter.settle_expired(100).await.unwrap(), 1);
    assert_eq!(
        limiter.settle_expired(100).await.unwrap(),
        0,
        "settled once"
    );
    let look = |rule: &'static str| {
        let limiter = &limiter;
        async move {
            limiter
                .check_batch(&[Item::new(rule, "k", 0)])
                .await
                .unwrap()[0]
                .remaining()
        }
    };
    assert_eq!(look("kept").await, 3, "consumed at its estimate");
    assert_eq!(look("released").await, 10, "given back");
    assert!(matches!(
        limiter.commit(&id, 1).await,
        Err(Error::UnknownReservation { .. })
    ));
}

async fn metered_work_is_refused_where_the_store_cannot_count_it<B: Backend>(backend: B) {
    let clock = ManualClock::new();
    let limiter = limiter(&backend, &clock, vec![window("m", [Tier::per_minute(10)])]);
    assert!(matches!(
        limiter.report("k", 1).await,
        Err(Error::Unsupported { .. })
    ));
    let reserved = limiter.reserve(&[Item::new("m", "k", 1)], None).await;
    assert!(
        matches!(reserved, Err(Error::Unsupported { .. })),
        "{reserved:?}"
    );
    // Nothing stays taken by the refused reservation.
    assert_eq!(limiter.check("k", 0).await.unwrap().remaining(), 10);
}

macro_rules! behaviours {
    ($($behaviour:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Memory::start().await).await;
            })*
        }
        mod redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Strict::single().await).await;
            })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Strict::cluster().await).await;
            })*
        }
        mod hybrid {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Hybrid::start().await).await;
            })*
        }
        mod lease {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Lease::start().await).await;
            })*
        }
    };
}

macro_rules! metered {
    ($($behaviour:ident),* $(,)?) => {
        mod metered_memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Memory::start().await).await;
            })*
        }
        mod metered_redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Strict::single().await).await;
            })*
        }
        mod metered_cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                super::$behaviour(super::Strict::cluster().await).await;
            })*
        }
    };
}

metered!(
    a_report_past_the_limit_is_a_debt_that_ends_with_the_window,
    a_reservation_settles_at_the_real_cost,
    an_unsettled_reservation_expires_as_its_rule_says,
);

#[tokio::test]
async fn the_hybrid_store_refuses_metered_work() {
    metered_work_is_refused_where_the_store_cannot_count_it(Hybrid::start().await).await;
}

#[tokio::test]
async fn the_lease_store_refuses_metered_work() {
    metered_work_is_refused_where_the_store_cannot_count_it(Lease::start().await).await;
}

behaviours!(
    admits_the_limit_then_denies_until_the_window_ends,
    keys_are_counted_apart,
    tiers_consume_from_all_or_from_none,
    looks_cost_nothing_and_bad_checks_are_errors,
    a_batch_across_rules_is_all_or_nothing,
    a_shadow_rule_counts_but_never_denies,
    acquire_waits_for_the_next_window,
    a_reset_key_starts_afresh_and_others_keep_their_counts,
);
