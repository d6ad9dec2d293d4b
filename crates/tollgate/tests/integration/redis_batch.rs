//! Batches on Redis: items of several rules and algorithms in one atomic call decide exactly
//! as the memory store does; on a cluster, items of different slots are still all-or-nothing;
//! under concurrency a shared key never admits more than its limit; shadow rules count but
//! never deny; an edited limit keeps its keys' state; and the functions and the module leave
//! the same keys, expiring alike.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{RedisCluster, RedisServer};
use tollgate::{
    Algorithm, Decisions, Error, Item, LeakyBucket, Limiter, ManualClock, MemoryStore, RedisStore,
    Rule, Settle, Source, StoreTime, SubWindows, Tier, TokenBucket, WarmUp,
};

/// xorshift64*: a reproducible stream.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn rules() -> Vec<Rule> {
    let ms = Duration::from_millis;
    vec![
        Rule::new("fixed", Algorithm::FixedWindow, [Tier::new(5, ms(600))]).unwrap(),
        Rule::new(
            "log",
            Algorithm::SlidingLog,
            [Tier::new(3, ms(300)), Tier::new(6, ms(1_800))],
        )
        .unwrap(),
        Rule::new(
            "bucket",
            Algorithm::TokenBucket(TokenBucket {
                initial_tokens: Some(1),
            }),
            [Tier::new(3, ms(700)).with_burst(4)],
        )
        .unwrap(),
        Rule::new(
            "gcra",
            Algorithm::Gcra,
            [Tier::per_second(10).with_burst(4), Tier::new(12, ms(3_000))],
        )
        .unwrap(),
        Rule::new(
            "sub",
            Algorithm::SubWindows(SubWindows { count: 6 }),
            [Tier::new(4, ms(600))],
        )
        .unwrap(),
        Rule::new(
            "shaper",
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            [Tier::new(3, ms(700)).with_burst(4)],
        )
        .unwrap(),
        Rule::new("shadow", Algorithm::FixedWindow, [Tier::new(2, ms(900))])
            .unwrap()
            .shadow(true),
        Rule::new("window", Algorithm::SlidingWindow, [Tier::new(4, ms(800))]).unwrap(),
        Rule::new(
            "interval",
            Algorithm::IntervalBucket,
            [Tier::new(3, ms(500))],
        )
        .unwrap(),
        Rule::new("slots", Algorithm::Concurrency, [Tier::new(3, ms(900))]).unwrap(),
        Rule::new(
            "warm",
            Algorithm::WarmUp(WarmUp::new(ms(1_000))),
            [Tier::new(5, ms(1_000))],
        )
        .unwrap(),
    ]
}

fn limiter<S: tollgate::Store>(store: S, clock: &ManualClock) -> Limiter<S, ManualClock> {
    let mut rules = rules().into_iter();
    let mut builder = Limiter::builder(rules.next().unwrap());
    for rule in rules {
        builder = builder.rule(rule);
    }
    builder.store(store).clock(clock.clone()).build().unwrap()
}

/// Everything a caller can read of a batch's decisions but their source.
fn seen(result: &Result<Decisions, Error>) -> String {
    match result {
        Ok(decisions) => decisions
            .iter()
            .map(|d| {
                format!(
                    "[{} {} {}/{} reset={:?} retry={:?} delay={:?} {}#{} {:?}]",
                    d.allowed(),
                    d.shadowed(),
                    d.remaining(),
                    d.limit(),
                    d.reset_after(),
                    d.retry_after(),
                    d.delay(),
                    d.rule(),
                    d.tier(),
                    d.window()
                )
            })
            .collect(),
        Err(e) => format!("error: {e}"),
    }
}

#[tokio::test]
async fn batches_on_redis_decide_as_in_memory() {
    on_one_server(RedisServer::start(), false, "cmdstat_fcall:").await;
}

/// The same with tollgate's Redis module: a batch of one key per item is one
/// `TOLLGATE.BATCH`; one with a sliding log goes to the functions.
#[tokio::test]
async fn batches_by_the_module_decide_as_in_memory() {
    let server = RedisServer::start_with(&["--loadmodule", support::redis_module()]);
    on_one_server(server, true, "cmdstat_tollgate.batch:").await;
}

/// [`decide_as_in_memory`] on `server`, which then has run the command of `stat`.
async fn on_one_server(server: RedisServer, module: bool, stat: &str) {
    let store = RedisStore::builder(&server.url())
        .store_time(StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    decide_as_in_memory(store, ["a", "b", "c"], module).await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains(stat), "{stats}");
}

/// On a cluster, batches whose keys are on three masters: every slot takes, and gives back
/// when another denies, so every key ends as the memory store leaves it, which takes nothing
/// for a denied batch. (Warm-up, which cannot give back, only on the first key: a slot of
/// it is taken last.)
#[tokio::test]
async fn batches_across_slots_decide_as_in_memory() {
    across_slots(RedisCluster::start(), false).await;
}

/// The same with tollgate's Redis module on every master: each slot's part is one
/// `TOLLGATE.BATCH`, given back by the functions when another slot denies.
#[tokio::test]
async fn batches_across_slots_by_the_module_decide_as_in_memory() {
    let module = ["--loadmodule", support::redis_module()];
    across_slots(RedisCluster::start_with_args(0, 2000, &module), true).await;
}

async fn across_slots(cluster: RedisCluster, module: bool) {
    let store = cluster.local_store().await;
    let probe = limiter(store.clone(), &ManualClock::new());
    let mut keys: [Option<String>; 3] = [None, None, None];
    for i in 0.. {
        let key = format!("key-{i}");
        let owner = cluster.owner(&support::redis_keys(&probe, &key)[0]);
        if owner < 3 && keys[owner].is_none() {
            keys[owner] = Some(key);
        }
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    let keys = keys.map(Option::unwrap);
    decide_as_in_memory(store, [&keys[0], &keys[1], &keys[2]], module).await;
}

/// The time until a timeline's next step, and its batch: one to four items of the rules
/// `names` on `keys`, of costs 0-3 (warm-up's on the first key only: see [`across_slots`]).
fn random_step<'a>(
    random: &mut Random,
    names: &[&'a str],
    keys: [&'a str; 3],
) -> (Duration, Vec<Item<'a>>) {
    let gap = Duration::from_micros(match random.below(10) {
        0..=4 => 0,
        5..=8 => random.below(100_000),
        _ => random.below(2_000_000),
    });
    let items = (0..1 + random.below(4))
        .map(|_| {
            let rule = names[random.below(names.len() as u64) as usize];
            let key = match rule {
                "warm" => keys[0],
                _ => keys[random.below(3) as usize],
            };
            Item::new(rule, key, random.below(4))
        })
        .collect();
    (gap, items)
}

/// Random batches of every rule on `keys`, at random times, decided by `store` and by the
/// memory store: the same decisions at every step. With `module`, batches without a sliding
/// log are decided by the module.
async fn decide_as_in_memory(store: RedisStore, keys: [&str; 3], module: bool) {
    let (memory_clock, redis_clock) = (ManualClock::new(), ManualClock::new());
    let memory = limiter(MemoryStore::new(), &memory_clock);
    let redis = limiter(store, &redis_clock);
    let names: Vec<&str> = rules().iter().map(|r| r.name()).collect();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let (mut admitted, mut denied) = (0, 0);
    for step in 0..600 {
        let (gap, items) = random_step(&mut random, &names, keys);
        memory_clock.advance(gap);
        redis_clock.advance(gap);
        let expected = memory.check_batch_now(&items);
        let actual = redis.check_batch(&items).await;
        assert_eq!(seen(&expected), seen(&actual), "step {step}: {items:?}");
        if let Ok(decisions) = &actual {
            // With the module, batches without a sliding log are all its; across slots, a
            // slot's part with one goes to the functions.
            let no_log = items.iter().all(|i| i.rule != "log");
            for (item, d) in items.iter().zip(decisions.iter()) {
                let expected = match (module, no_log, item.rule == "log") {
                    (false, _, _) | (true, _, true) => Some(Source::Redis),
                    (true, true, _) => Some(Source::RedisModule),
                    (true, false, false) => None,
                };
                let source = d.source();
                assert!(
                    expected.is_none_or(|e| e == source),
                    "{source:?}: {items:?}"
                );
                assert!(matches!(source, Source::Redis | Source::RedisModule));
            }
            if decisions.allowed() {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
    }
    // The timeline exercised both outcomes.
    assert!(
        admitted > 100 && denied > 100,
        "{admitted} admitted, {denied} denied"
    );
}

/// The functions and the module on one server, each under its own prefix, given the same
/// random batches and reports of them: the same decisions, and after every step each key of
/// one has its twin in the other with the same value, expiring within 500 ms of it (what a
/// batch writes, its TTL too, is the same whichever decides: instances with and without the
/// module share keys).
#[tokio::test]
async fn batches_by_the_functions_and_the_module_leave_the_same_keys() {
    let server = RedisServer::start_with(&["--loadmodule", support::redis_module()]);
    let (functions_clock, module_clock) = (ManualClock::new(), ManualClock::new());
    let functions = limiter(
        support::local_store(&server, b"f:", false).await,
        &functions_clock,
    );
    let module = limiter(
        support::local_store(&server, b"m:", true).await,
        &module_clock,
    );
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let names: Vec<&str> = rules().iter().map(|r| r.name()).collect();
    let keys = ["a", "b", "c"];
    let mut random = Random(0x2545_f491_4f6c_dd1d);
    let mut by_module = 0;
    for step in 0..400 {
        let (gap, items) = random_step(&mut random, &names, keys);
        functions_clock.advance(gap);
        module_clock.advance(gap);
        let report = random.below(6) == 0;
        let (expected, actual) = if report {
            (
                functions.settle_batch(&items, Settle::Report).await,
                module.settle_batch(&items, Settle::Report).await,
            )
        } else {
            (
                functions.check_batch(&items).await,
                module.check_batch(&items).await,
            )
        };
        let at = format!("step {step}: {items:?}, report {report}");
        assert_eq!(seen(&expected), seen(&actual), "{at}");
        // A cost above a tier's capacity is refused before any store is asked.
        if let Ok(decisions) = &actual {
            by_module += decisions
                .iter()
                .filter(|d| d.source() == Source::RedisModule)
                .count();
        }
        support::same_keys(&mut connection, "tg:", &at).await;
    }
    assert!(by_module > 200, "{by_module} decisions by the module");
}

#[tokio::test]
async fn on_a_cluster_a_batch_across_slots_is_all_or_nothing() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&nodes)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let tenant = Rule::new("tenant", Algorithm::FixedWindow, [Tier::per_hour(10)]).unwrap();
    let ip = Rule::new("ip", Algorithm::Gcra, [Tier::per_hour(2)]).unwrap();
    let limiter = Limiter::builder(tenant)
        .rule(ip)
        .store(store)
        .build()
        .unwrap();
    // Keys chosen in different slots of different masters.
    let (acme, ips) = ("acme", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let batch = |ip| [Item::new("tenant", acme, 1), Item::new("ip", ip, 1)];
    for _ in 0..2 {
        assert!(limiter.check_batch(&batch(ips[0])).await.unwrap().allowed());
    }
    let denied = limiter.check_batch(&batch(ips[0])).await.unwrap();
    assert!(!denied.allowed());
    assert!(denied[0].allowed() && !denied[1].allowed());
    // The tenant's count did not move on the denied batch: 8 left after two admissions.
    let look = limiter
        .check_batch(&[Item::new("tenant", acme, 0)])
        .await
        .unwrap();
    assert_eq!(look[0].remaining(), 8);
    for ip in &ips[1..] {
        assert!(limiter.check_batch(&batch(ip)).await.unwrap().allowed());
    }
    let look = limiter
        .check_batch(&[Item::new("tenant", acme, 0)])
        .await
        .unwrap();
    assert_eq!(look[0].remaining(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_key_in_concurrent_batches_never_admits_more_than_its_limit() {
    let server = RedisServer::start();
    const TENANT_LIMIT: u64 = 200;
    let tenant = Rule::new(
        "tenant",
        Algorithm::SlidingLog,
        [Tier::per_day(TENANT_LIMIT)],
    )
    .unwrap();
    let ip = Rule::new("ip", Algorithm::FixedWindow, [Tier::per_day(30)]).unwrap();
    let mut tasks = Vec::new();
    for instance in 0..3 {
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap();
        let limiter = Arc::new(
            Limiter::builder(tenant.clone())
                .rule(ip.clone())
                .store(store)
                .build()
                .unwrap(),
        );
        for task in 0..16 {
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                let ip = format!("ip-{instance}-{task}");
                let mut tenant_permits = 0;
                for _ in 0..40 {
                    let items = [Item::new("tenant", "acme", 1), Item::new("ip", &ip, 1)];
                    let decisions = limiter.check_batch(&items).await.unwrap();
                    assert!(decisions.iter().all(|d| d.source() == Source::Redis));
                    tenant_permits += u64::from(decisions.allowed());
                }
                tenant_permits
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    // 48 IPs of 30 each could take 1,440; the tenant's 200 bind, exactly.
    assert_eq!(admitted, TENANT_LIMIT);
}

#[tokio::test]
async fn an_edited_limit_keeps_the_state_of_every_key_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
        let name = algorithm.name();
        let version = |limit| {
            let rule = Rule::new(name, algorithm.clone(), [Tier::per_day(limit)]).unwrap();
            Limiter::builder(rule).store(store.clone()).build().unwrap()
        };
        let before = version(20);
        for _ in 0..20 {
            assert!(before.check("tenant", 1).await.unwrap().allowed(), "{name}");
        }
        let after = version(25);
        let mut admitted = 0;
        for _ in 0..30 {
            admitted += u32::from(after.check("tenant", 1).await.unwrap().allowed());
        }
        assert_eq!(admitted, 5, "{name}");
    }
}

/// Round trips Redis has served since its statistics were reset: function calls.
fn calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    let line = stats.lines().find(|l| l.starts_with("cmdstat_fcall:"));
    line.and_then(|l| l.split("calls=").nth(1))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_reservation_and_its_commit_are_one_call_each_on_one_server() {
    let server = RedisServer::start();
    let limiter = || async {
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let tenant = Rule::new("tenant", Algorithm::FixedWindow, [Tier::per_hour(100)]).unwrap();
        let ip = Rule::new("ip", Algorithm::Gcra, [Tier::per_hour(50)]).unwrap();
        Limiter::builder(tenant)
            .rule(ip)
            .store(store)
            .build()
            .unwrap()
    };
    let (made, other) = (limiter().await, limiter().await);
    let items = [
        Item::new("tenant", "acme", 10),
        Item::new("ip", "10.0.0.1", 10),
    ];
    let left = |d: &Decisions| (d[0].remaining(), d[1].remaining());
    // Loads the library, then counts from nothing.
    made.check_batch(&[Item::new("tenant", "warm", 0)])
        .await
        .unwrap();
    server.cli(&["config", "resetstat"]);
    let reserved = made.reserve(&items, None).await.unwrap();
    assert_eq!((calls(&server), left(reserved.decisions())), (1, (90, 40)));
    let committed = made.commit(reserved.id().unwrap(), 4).await.unwrap();
    assert_eq!((calls(&server), left(&committed)), (2, (96, 46)));
    // A cancel is one call as well.
    let reserved = made.reserve(&items, None).await.unwrap();
    let cancelled = made.cancel(reserved.id().unwrap()).await.unwrap();
    assert_eq!((calls(&server), left(&cancelled)), (4, (96, 46)));
    // Another process commits what it did not reserve: the record first, then the settlement.
    let reserved = made.reserve(&items, None).await.unwrap();
    let committed = other.commit(reserved.id().unwrap(), 25).await.unwrap();
    assert_eq!((calls(&server), left(&committed)), (7, (71, 21)));
    // Settled once, whoever asks again.
    let again = made.commit(reserved.id().unwrap(), 1).await;
    assert!(
        matches!(again, Err(Error::UnknownReservation { .. })),
        "{again:?}"
    );
    // A denied reservation keeps nothing, and takes nothing.
    let denied = made
        .reserve(&[Item::new("ip", "10.0.0.1", 30)], None)
        .await
        .unwrap();
    assert!(denied.id().is_none() && !denied.allowed());
    assert_eq!(server.cli(&["zcard", "tg:r:{reservations}"]), "0");
    assert_eq!(made.check("10.0.0.1", 0).await.unwrap().remaining(), 21);
}

#[tokio::test]
async fn a_full_book_on_one_server_takes_nothing_in_its_one_call() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .max_reservations(1)
        .build()
        .await
        .unwrap();
    let rule = Rule::new("tenant", Algorithm::FixedWindow, [Tier::per_hour(100)]).unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    let item = [Item::new("tenant", "acme", 10)];
    limiter.reserve(&item, None).await.unwrap();
    let refused = limiter.reserve(&item, None).await;
    assert!(
        matches!(refused, Err(Error::ReservationsFull { max: 1 })),
        "{refused:?}"
    );
    assert_eq!(limiter.check("acme", 0).await.unwrap().remaining(), 90);
}

#[tokio::test]
async fn a_commit_in_one_call_after_the_time_to_live_settles_as_the_rule_says() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .store_time(StoreTime::Local)
        .build()
        .await
        .unwrap();
    let released = tollgate::Reservations {
        ttl: Duration::from_secs(10),
        on_expiry: tollgate::OnExpiry::Released,
    };
    let rule = Rule::new("budget", Algorithm::FixedWindow, [Tier::per_hour(100)])
        .and_then(|r| r.reservations(released))
        .unwrap();
    let clock = ManualClock::new();
    let limiter = Limiter::builder(rule)
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    let reserved = limiter
        .reserve(&[Item::new("budget", "acme", 40)], None)
        .await
        .unwrap();
    assert_eq!(limiter.check("acme", 0).await.unwrap().remaining(), 60);
    // Nobody swept it: the commit finds it expired, and settles it as its rule says.
    clock.advance(Duration::from_secs(11));
    let late = limiter.commit(reserved.id().unwrap(), 5).await;
    assert!(
        matches!(late, Err(Error::UnknownReservation { .. })),
        "{late:?}"
    );
    assert_eq!(
        limiter.check("acme", 0).await.unwrap().remaining(),
        100,
        "released"
    );
    assert_eq!(server.cli(&["zcard", "tg:r:{reservations}"]), "0");
}

/// On the server's clock (the default), a calendar day's window is the one Redis's own time
/// is in: it resets at midnight UTC as the memory store's does.
#[tokio::test]
async fn a_calendar_day_on_the_servers_clock_ends_at_midnight() {
    let server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let day = tollgate::Calendar::day();
    let rule = Rule::new("daily", Algorithm::FixedWindow, [Tier::calendar(2, day)]).unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    let to_midnight = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        Duration::from_secs(86_400)
            - Duration::from_micros((now.as_micros() % 86_400_000_000) as u64)
    };
    let before = to_midnight();
    let decision = limiter.check("acme", 1).await.unwrap();
    let after = to_midnight();
    assert_eq!(decision.source(), Source::Redis);
    assert!(
        decision.reset_after() <= before + Duration::from_millis(50)
            && decision.reset_after() >= after.saturating_sub(Duration::from_millis(50)),
        "{:?} against {after:?}..{before:?}",
        decision.reset_after()
    );
}
