//! Global rules across regions: three regions, each its own redis-server and two instances,
//! linked through proxies the tests delay, cut and heal. Each test tries a worst pattern and
//! holds every tenant's total, across regions, to the bound the documentation states:
//! `limit + (regions - 1) x allowance`, the allowance being `max(1, overshoot x limit /
//! peers)`.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::RedisServer;
use support::proxy::Proxy;
use tollgate::{
    Algorithm, AnyStore, FailurePolicy, Global, Limiter, ManualClock, OnPartition, Peer,
    RedisStore, RegionStore, RegionsConfig, Rule, Scope, Source, SubWindows, Tier,
};

/// A store of regions over a strict Redis store.
type Region = RegionStore<AnyStore>;

const NAMES: [&str; 4] = ["us-east", "eu-west", "ap-south", "sa-east"];

/// Regions, their links (`links[r][s]`: region `r`'s way to region `s`'s Redis) and
/// instances.
struct World {
    servers: Vec<RedisServer>,
    links: Vec<Vec<Option<Proxy>>>,
    instances: Vec<Vec<Region>>,
}

async fn redis(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

impl World {
    async fn start(regions: usize, instances: usize, interval: Duration, overshoot: f64) -> Self {
        let servers: Vec<RedisServer> = (0..regions).map(|_| RedisServer::start()).collect();
        let mut links = Vec::new();
        for r in 0..regions {
            let mut row = Vec::new();
            for (s, server) in servers.iter().enumerate() {
                row.push(match r == s {
                    true => None,
                    false => Some(Proxy::start(&format!("127.0.0.1:{}", server.port)).await),
                });
            }
            links.push(row);
        }
        let mut world = Self {
            servers,
            links,
            instances: Vec::new(),
        };
        for r in 0..regions {
            let mut row = Vec::new();
            for _ in 0..instances {
                row.push(world.instance(r, interval, overshoot).await);
            }
            world.instances.push(row);
        }
        world
    }

    /// A new instance of region `r`.
    async fn instance(&self, r: usize, interval: Duration, overshoot: f64) -> Region {
        let mut peers = Vec::new();
        for (s, link) in self.links[r].iter().enumerate() {
            if let Some(link) = link {
                peers.push(Peer {
                    name: NAMES[s].into(),
                    store: redis(&link.url()).await,
                });
            }
        }
        let own = redis(&self.servers[r].url()).await;
        let config = RegionsConfig {
            interval,
            overshoot,
            ..RegionsConfig::new(NAMES[r], peers)
        };
        RegionStore::new(AnyStore::Redis(own), config).unwrap()
    }

    /// Cuts (or heals) every link to and from region `r`.
    fn isolate(&self, r: usize, cut: bool) {
        for (a, row) in self.links.iter().enumerate() {
            for (b, link) in row.iter().enumerate() {
                if let Some(link) = link
                    && (a == r || b == r)
                {
                    match cut {
                        true => link.cut(),
                        false => link.heal(),
                    }
                }
            }
        }
    }

    fn delay(&self, delay: Duration) {
        for link in self.links.iter().flatten().flatten() {
            link.delay(delay);
        }
    }
}

fn global_rule(name: &str, algorithm: Algorithm, tier: Tier, stale_after: Duration) -> Rule {
    Rule::new(name, algorithm, [tier])
        .unwrap()
        .on_failure(FailurePolicy::Closed)
        .unwrap()
        .scope(Scope::Global(Global {
            stale_after,
            on_partition: OnPartition::Share,
        }))
        .unwrap()
}

fn limiter(store: &Region, rule: &Rule, clock: &ManualClock) -> Arc<Limiter<Region, ManualClock>> {
    Arc::new(
        Limiter::builder(rule.clone())
            .store(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// What was admitted, per region and tenant, and which sources decided.
struct Tally {
    admitted: Vec<Vec<AtomicU64>>,
    partitioned: Vec<AtomicU64>,
}

impl Tally {
    fn new(regions: usize, tenants: usize) -> Arc<Self> {
        Arc::new(Self {
            admitted: (0..regions)
                .map(|_| (0..tenants).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            partitioned: (0..regions).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn total(&self, tenant: usize) -> u64 {
        self.admitted
            .iter()
            .map(|r| r[tenant].load(Ordering::Relaxed))
            .sum()
    }

    fn of_region(&self, region: usize) -> u64 {
        self.admitted[region]
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .sum()
    }
}

/// Every instance checks each of `tenants` keys in a task of its own, as a client does:
/// again at once when admitted, after the decision's `retry_after` (at most 50 ms) when
/// denied; until a denial says the window is spent (a retry after more than a second), or
/// `duration` passes. `share[r]` is the fraction of turns region `r`'s tasks take (they
/// pause 1 ms instead).
async fn burst(
    world: &World,
    rule: &Rule,
    clocks: &[ManualClock],
    tenants: usize,
    share: &[f64],
    duration: Duration,
    tally: &Arc<Tally>,
) {
    let end = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (r, instances) in world.instances.iter().enumerate() {
        for (i, store) in instances.iter().enumerate() {
            let limiter = limiter(store, rule, &clocks[r]);
            for tenant in 0..tenants {
                let (limiter, tally, share) = (limiter.clone(), tally.clone(), share[r]);
                tasks.push(tokio::spawn(async move {
                    let mut turn = (i * 7919 + tenant * 104_729) as u64;
                    while Instant::now() < end {
                        turn += 1;
                        if (turn.wrapping_mul(2_654_435_761) % 1_000) as f64 >= share * 1_000.0 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                        let decision = limiter.check(format!("tenant-{tenant}"), 1).await.unwrap();
                        if decision.allowed() {
                            tally.admitted[r][tenant].fetch_add(1, Ordering::Relaxed);
                        }
                        if decision.source() == Source::Partitioned {
                            tally.partitioned[r].fetch_add(1, Ordering::Relaxed);
                        }
                        match decision.retry_after() {
                            Some(wait) if wait > Duration::from_secs(1) => return,
                            Some(wait) => {
                                tokio::time::sleep(wait.min(Duration::from_millis(50))).await
                            }
                            None => {}
                        }
                    }
                }));
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// The documented bound for `regions` at `overshoot`.
fn bound(limit: u64, regions: u64, overshoot: f64) -> u64 {
    let allowance = ((overshoot * limit as f64 / (regions - 1) as f64).floor() as u64).max(1);
    limit + (regions - 1) * allowance
}

/// The most of its own count any bucket of `rule` in `server`'s region says `peer` confirmed.
fn acked(server: &RedisServer, rule: &str, peer: &str) -> u64 {
    let keys = server.cli(&["--scan", "--pattern", &format!("tg:g:{rule}:*")]);
    keys.lines()
        .filter_map(|key| server.cli(&["hget", key, &format!("a{peer}")]).parse().ok())
        .max()
        .unwrap_or(0)
}

/// Each region's counts of every global bucket of `rule`, as its Redis holds them: bucket
/// name -> (field -> value).
fn held(server: &RedisServer, rule: &str) -> HashMap<String, HashMap<String, u64>> {
    let keys = server.cli(&["--scan", "--pattern", &format!("tg:g:{rule}:*")]);
    keys.lines()
        .map(|key| {
            let flat = server.cli(&["hgetall", key]);
            let lines: Vec<&str> = flat.lines().collect();
            let fields = lines
                .chunks(2)
                .filter(|pair| pair.len() == 2 && !pair[0].starts_with('a'))
                .map(|pair| (pair[0].to_string(), pair[1].parse().unwrap()))
                .collect();
            (key.to_string(), fields)
        })
        .collect()
}

/// Waits until `ready` says so, polling; fails after 10 s, saying `what`.
async fn until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What `limiter`'s rule has left of `key` now, by a look (cost 0, which takes nothing).
async fn left(limiter: &Limiter<Region, ManualClock>, key: &str) -> u64 {
    limiter.check(key, 0).await.unwrap().remaining()
}

fn clocks(regions: usize) -> Vec<ManualClock> {
    // The first microsecond of an hour, in every region.
    let clock = ManualClock::new();
    clock.set_micros(3_600_000_000 * 500_000);
    (0..regions).map(|_| clock.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_tenants_bursting_at_a_window_start_in_every_region_stay_within_the_bound() {
    let world = World::start(3, 2, Duration::from_millis(10), 0.01).await;
    let (limit, tenants) = (100, 30);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SubWindows(SubWindows { count: 6 }),
    ] {
        let name = format!("burst-{}", algorithm.name());
        let rule = global_rule(
            &name,
            algorithm,
            Tier::per_hour(limit),
            Duration::from_secs(5),
        );
        let tally = Tally::new(3, tenants);
        let clocks = clocks(3);
        burst(
            &world,
            &rule,
            &clocks,
            tenants,
            &[1.0; 3],
            Duration::from_secs(8),
            &tally,
        )
        .await;
        let bound = bound(limit, 3, 0.01);
        for tenant in 0..tenants {
            let total = tally.total(tenant);
            assert!(
                total <= bound,
                "{name}: tenant {tenant} admitted {total} > {bound}"
            );
            assert!(
                total >= limit,
                "{name}: tenant {tenant} admitted only {total}"
            );
        }
        for r in 0..3 {
            assert_eq!(tally.partitioned[r].load(Ordering::Relaxed), 0, "{name}");
            assert!(
                tally.of_region(r) > 0,
                "{name}: region {r} admitted nothing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uneven_load_across_links_of_fifty_milliseconds_stays_within_the_bound() {
    let world = World::start(3, 2, Duration::from_millis(20), 0.1).await;
    world.delay(Duration::from_millis(50));
    let (limit, tenants) = (600, 10);
    let rule = global_rule(
        "uneven",
        Algorithm::FixedWindow,
        Tier::per_hour(limit),
        Duration::from_secs(5),
    );
    let tally = Tally::new(3, tenants);
    let clocks = clocks(3);
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[0.9, 0.05, 0.05],
        Duration::from_secs(8),
        &tally,
    )
    .await;
    let bound = bound(limit, 3, 0.1);
    for tenant in 0..tenants {
        let total = tally.total(tenant);
        assert!(total <= bound, "tenant {tenant} admitted {total} > {bound}");
        assert!(total >= limit, "tenant {tenant} admitted only {total}");
    }
    assert!(tally.of_region(0) > tally.of_region(1) * 3);
    // The peers' round trips were heard: about twice the delay.
    for peer in world.instances[0][0].peers() {
        assert!(peer.lag >= Duration::from_millis(90), "{peer:?}");
        assert!(peer.last_heard.is_some() && !peer.failing, "{peer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_cut_off_for_a_window_admits_its_share_says_so_and_converges_after_heal() {
    let world = World::start(3, 2, Duration::from_millis(10), 0.05).await;
    let (limit, tenants) = (300, 10);
    let rule = global_rule(
        "cut",
        Algorithm::FixedWindow,
        Tier::per_hour(limit),
        Duration::from_millis(300),
    );
    let clocks = clocks(3);
    // A little of the window spent while the links hold.
    let tally = Tally::new(3, tenants);
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[0.2; 3],
        Duration::from_millis(100),
        &tally,
    )
    .await;
    world.isolate(2, true);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The worst order: one region after the other spends what it may, then all at once.
    for share in [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0; 3]] {
        burst(
            &world,
            &rule,
            &clocks,
            tenants,
            &share,
            Duration::from_millis(1_200),
            &tally,
        )
        .await;
    }
    let bound = bound(limit, 3, 0.05);
    for tenant in 0..tenants {
        let total = tally.total(tenant);
        assert!(
            total <= bound,
            "tenant {tenant} admitted {total} > {bound} while cut"
        );
    }
    // Both sides said so: the cut-off region and the two that lost it.
    for r in 0..3 {
        assert!(
            tally.partitioned[r].load(Ordering::Relaxed) > 0,
            "region {r} never said"
        );
    }
    let health = world.instances[2][0].peers();
    assert!(
        health.iter().all(|p| p.failures > 0 && p.pending > 0),
        "{health:?}"
    );
    assert!(world.instances[2][0].partitioned(Duration::from_millis(300)));
    // Healed: within a few intervals every region holds the same counts, and nothing
    // admitted during the cut is missing.
    world.isolate(2, false);
    until("every region holds the same counts", || async {
        let views: Vec<_> = world.servers.iter().map(|s| held(s, "cut")).collect();
        views[0] == views[1] && views[0] == views[2]
    })
    .await;
    let views: Vec<_> = world.servers.iter().map(|s| held(s, "cut")).collect();
    assert!(!views[0].is_empty());
    for (bucket, fields) in &views[0] {
        let counted: u64 = fields.values().sum();
        assert!(counted <= bound, "{bucket}: {fields:?}");
    }
    let admitted: u64 = (0..tenants).map(|t| tally.total(t)).sum();
    let counted: u64 = views[0].values().flat_map(|f| f.values()).sum();
    assert_eq!(
        counted, admitted,
        "what was admitted is what every region counts"
    );
    assert!(!world.instances[2][0].partitioned(Duration::from_millis(300)));
    // After the heal the regions decide from every count again.
    let limiter = limiter(&world.instances[2][0], &rule, &clocks[2]);
    let decision = limiter.check("tenant-0", 1).await.unwrap();
    assert_eq!(decision.source(), Source::Global);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_redis_restarted_mid_window_loses_nothing_it_admitted() {
    let mut world = World::start(3, 1, Duration::from_millis(10), 0.01).await;
    let (limit, tenants) = (300, 5);
    let rule = global_rule(
        "restart",
        Algorithm::FixedWindow,
        Tier::per_hour(limit),
        Duration::from_secs(5),
    );
    let clocks = clocks(3);
    let tally = Tally::new(3, tenants);
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[0.3; 3],
        Duration::from_millis(500),
        &tally,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    world.servers[1].restart();
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[1.0; 3],
        Duration::from_secs(3),
        &tally,
    )
    .await;
    // A restart can cost one more allowance: the region's unconfirmed permits start again.
    let bound = bound(limit, 3, 0.01) + 1;
    for tenant in 0..tenants {
        let total = tally.total(tenant);
        assert!(total <= bound, "tenant {tenant} admitted {total} > {bound}");
    }
    until("the restarted region holds every count again", || async {
        held(&world.servers[0], "restart") == held(&world.servers[1], "restart")
    })
    .await;
    let views: Vec<_> = world.servers.iter().map(|s| held(s, "restart")).collect();
    let admitted: u64 = (0..tenants).map(|t| tally.total(t)).sum();
    let counted: u64 = views[1].values().flat_map(|f| f.values()).sum();
    assert_eq!(counted, admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_and_reservations_in_one_region_are_spent_in_all() {
    let world = World::start(2, 1, Duration::from_millis(10), 0.01).await;
    let rule = global_rule(
        "tokens",
        Algorithm::FixedWindow,
        Tier::per_hour(1_000_000),
        Duration::from_secs(5),
    );
    let clocks = clocks(2);
    let east = limiter(&world.instances[0][0], &rule, &clocks[0]);
    let west = limiter(&world.instances[1][0], &rule, &clocks[1]);
    let reported = east.report("tenant", 400_000).await.unwrap();
    assert_eq!(reported.remaining(), 600_000);
    // Beyond the in-flight allowance (10,000) until the west confirms it holds the report.
    let waiting = east.check("tenant", 1).await.unwrap();
    assert!(!waiting.allowed(), "{waiting:?}");
    until("the west confirms the report", || async {
        acked(&world.servers[0], "tokens", "eu-west") == 400_000
    })
    .await;
    let reservation = east
        .reserve(&[tollgate::Item::new("tokens", "tenant", 300_000)], None)
        .await
        .unwrap();
    east.commit(reservation.id().unwrap(), 100_000)
        .await
        .unwrap();
    until(
        "the west holds the east's report and reservation",
        || async { left(&west, "tenant").await == 500_000 },
    )
    .await;
    let seen = west.check("tenant", 0).await.unwrap();
    assert_eq!(seen.remaining(), 500_000, "{seen:?}");
    assert_eq!(seen.source(), Source::Global);
    // The west spends what is left; the east then finds nothing.
    assert!(west.check("tenant", 500_000).await.unwrap().allowed());
    until("the east holds what the west spent", || async {
        left(&east, "tenant").await == 0
    })
    .await;
    assert!(!east.check("tenant", 1).await.unwrap().allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clocks_seconds_apart_shift_windows_but_each_window_holds_the_bound() {
    let world = World::start(3, 1, Duration::from_millis(10), 0.01).await;
    let (limit, tenants) = (100, 4);
    let rule = global_rule(
        "skew",
        Algorithm::FixedWindow,
        Tier::new(limit, Duration::from_secs(10)),
        Duration::from_secs(5),
    );
    let clocks: Vec<ManualClock> = (0..3)
        .map(|r| {
            let clock = ManualClock::new();
            // Region 2 runs three seconds ahead: it enters each window early.
            clock.set_micros(1_800_000_000_000_000 + 7_000_000 + r as u64 / 2 * 3_000_000);
            clock
        })
        .collect();
    let tally = Tally::new(3, tenants);
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[1.0; 3],
        Duration::from_secs(1),
        &tally,
    )
    .await;
    for clock in &clocks {
        clock.advance(Duration::from_secs(1));
    }
    burst(
        &world,
        &rule,
        &clocks,
        tenants,
        &[1.0; 3],
        Duration::from_secs(1),
        &tally,
    )
    .await;
    // Region 2 counted in the next window; each window, in every region's view, holds the
    // bound.
    until("region 0 holds region 2's next window", || async {
        held(&world.servers[0], "skew").len() >= 2 * tenants
    })
    .await;
    let bound = bound(limit, 3, 0.01);
    let view = held(&world.servers[0], "skew");
    assert!(view.len() >= 2 * tenants, "{view:?}");
    for (bucket, fields) in &view {
        let counted: u64 = fields.values().sum();
        assert!(counted <= bound, "{bucket}: {fields:?}");
    }
}

#[tokio::test]
async fn bad_settings_and_rules_are_refused_with_why() {
    let server = RedisServer::start();
    let own = redis(&server.url()).await;
    let peer = |name: &str| Peer {
        name: name.into(),
        store: own.clone(),
    };
    let refused = |config: RegionsConfig| {
        RegionStore::new(AnyStore::Redis(own.clone()), config)
            .unwrap_err()
            .to_string()
    };
    assert!(refused(RegionsConfig::new("us east", vec![])).contains("letters, digits"));
    assert!(refused(RegionsConfig::new("us", vec![peer("us")])).contains("is this region"));
    assert!(refused(RegionsConfig::new("us", vec![peer("eu"), peer("eu")])).contains("twice"));
    let config = RegionsConfig {
        overshoot: 0.0,
        ..RegionsConfig::new("us", vec![peer("eu")])
    };
    assert!(refused(config).contains("overshoot"));
    let memory = RegionStore::new(
        AnyStore::Memory(tollgate::MemoryStore::new()),
        RegionsConfig::new("us", vec![]),
    );
    assert!(memory.unwrap_err().to_string().contains("process memory"));
    for (algorithm, why) in [
        (Algorithm::Gcra, "drains with time"),
        (
            Algorithm::TokenBucket(Default::default()),
            "drains with time",
        ),
        (Algorithm::SlidingLog, "timestamp per permit"),
        (Algorithm::Concurrency, "release"),
    ] {
        let error = Rule::new("r", algorithm, [Tier::per_minute(10)])
            .unwrap()
            .scope(Scope::Global(Global::default()))
            .unwrap_err();
        assert!(error.to_string().contains(why), "{error}");
    }
    let store = RegionStore::new(
        AnyStore::Redis(own.clone()),
        RegionsConfig::new("us", vec![]),
    )
    .unwrap();
    let rule = global_rule(
        "g",
        Algorithm::FixedWindow,
        Tier::per_minute(5),
        Duration::from_secs(2),
    );
    let limiter = limiter(&store, &rule, &ManualClock::new());
    let reset = limiter.reset("g", "k").await.unwrap_err().to_string();
    assert!(reset.contains("only grow"), "{reset}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_its_peer_does_not_list_still_counts_there_and_a_garbage_peer_is_stale() {
    let east = RedisServer::start();
    let west = RedisServer::start();
    // A peer that answers garbage to whatever it is sent.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_port = garbage.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = garbage.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 || socket.write_all(b"?not redis\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let config = |region: &str, peers: Vec<Peer>| RegionsConfig {
        interval: Duration::from_millis(10),
        ..RegionsConfig::new(region, peers)
    };
    // The east lists the west; the west lists only the garbage peer.
    let east_store = RegionStore::new(
        AnyStore::Redis(redis(&east.url()).await),
        config(
            "us-east",
            vec![Peer {
                name: "eu-west".into(),
                store: redis(&west.url()).await,
            }],
        ),
    )
    .unwrap();
    let west_store = RegionStore::new(
        AnyStore::Redis(redis(&west.url()).await),
        config(
            "eu-west",
            vec![Peer {
                name: "nowhere".into(),
                store: redis(&format!("redis://127.0.0.1:{garbage_port}")).await,
            }],
        ),
    )
    .unwrap();
    let rule = global_rule(
        "odd",
        Algorithm::FixedWindow,
        Tier::per_hour(100),
        Duration::from_millis(100),
    );
    let clock = ManualClock::new();
    clock.set_micros(3_600_000_000 * 400_000);
    let east_limiter = limiter(&east_store, &rule, &clock);
    let west_limiter = limiter(&west_store, &rule, &clock);
    assert!(east_limiter.check("k", 40).await.unwrap().allowed());
    until(
        "the west holds the east's 40, its garbage peer stale",
        || async {
            let look = west_limiter.check("k", 0).await.unwrap();
            look.remaining() == 60 && look.source() == Source::Partitioned
        },
    )
    .await;
    // The west counts the east's permits though it does not list the east; its garbage
    // peer is stale, so it admits its share: (100 - 40) / 2.
    let look = west_limiter.check("k", 0).await.unwrap();
    assert_eq!(look.remaining(), 60, "{look:?}");
    assert_eq!(look.source(), Source::Partitioned);
    let health = west_store.peers();
    assert!(
        health[0].failures > 0 && health[0].last_heard.is_none(),
        "{health:?}"
    );
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u64::from(west_limiter.check("k", 1).await.unwrap().allowed());
    }
    assert_eq!(admitted, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_partition_region_admits_all_that_was_left_and_share_its_share() {
    let world = World::start(2, 1, Duration::from_millis(10), 0.01).await;
    let clocks = clocks(2);
    let rules: Vec<Rule> = [OnPartition::Share, OnPartition::Region]
        .into_iter()
        .enumerate()
        .map(|(i, on_partition)| {
            Rule::new(
                format!("p{i}"),
                Algorithm::FixedWindow,
                [Tier::per_hour(100)],
            )
            .unwrap()
            .scope(Scope::Global(Global {
                stale_after: Duration::from_millis(100),
                on_partition,
            }))
            .unwrap()
        })
        .collect();
    for rule in &rules {
        let west = limiter(&world.instances[1][0], rule, &clocks[1]);
        assert!(west.check("k", 40).await.unwrap().allowed());
    }
    for rule in &rules {
        let east = limiter(&world.instances[0][0], rule, &clocks[0]);
        until("the east holds the west's 40", || async {
            left(&east, "k").await == 60
        })
        .await;
    }
    world.isolate(0, true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admitted = Vec::new();
    for rule in &rules {
        let east = limiter(&world.instances[0][0], rule, &clocks[0]);
        let mut n = 0;
        for _ in 0..100 {
            let decision = east.check("k", 1).await.unwrap();
            assert_eq!(decision.source(), Source::Partitioned);
            n += u64::from(decision.allowed());
        }
        admitted.push(n);
    }
    // Share: half of the 60 left, for two regions; region: all 60.
    assert_eq!(admitted, [30, 60]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_on_a_redis_cluster_shares_a_limit_with_one_on_a_single_server() {
    let cluster = support::RedisCluster::start_with(0, 2_000);
    let single = RedisServer::start();
    let cluster_store = || async {
        RedisStore::cluster_builder(&cluster.urls())
            .timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let config = |region: &str, peer: &str, store: RedisStore| RegionsConfig {
        interval: Duration::from_millis(10),
        ..RegionsConfig::new(
            region,
            vec![Peer {
                name: peer.into(),
                store,
            }],
        )
    };
    let east = RegionStore::new(
        AnyStore::Redis(cluster_store().await),
        config("us-east", "eu-west", redis(&single.url()).await),
    )
    .unwrap();
    let west = RegionStore::new(
        AnyStore::Redis(redis(&single.url()).await),
        config("eu-west", "us-east", cluster_store().await),
    )
    .unwrap();
    let rule = global_rule(
        "both",
        Algorithm::FixedWindow,
        Tier::per_hour(100),
        Duration::from_secs(5),
    );
    let clock = ManualClock::new();
    clock.set_micros(3_600_000_000 * 500_000);
    let (east, west) = (limiter(&east, &rule, &clock), limiter(&west, &rule, &clock));
    // Tenants spread over the cluster's slots; each checked in both regions until spent.
    let mut tasks = Vec::new();
    for tenant in 0..12 {
        for limiter in [east.clone(), west.clone()] {
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                loop {
                    let decision = limiter.check(format!("tenant-{tenant}"), 1).await.unwrap();
                    if decision.allowed() {
                        admitted += 1;
                        continue;
                    }
                    let wait = decision.retry_after().unwrap();
                    if wait > Duration::from_secs(1) {
                        return (tenant, admitted);
                    }
                    tokio::time::sleep(wait.min(Duration::from_millis(20))).await;
                }
            }));
        }
    }
    let mut totals = [0u64; 12];
    for task in tasks {
        let (tenant, admitted) = task.await.unwrap();
        totals[tenant] += admitted;
    }
    // Two regions at 1%: an allowance of 1, a bound of 101.
    for (tenant, total) in totals.iter().enumerate() {
        assert!((100..=101).contains(total), "tenant {tenant}: {total}");
    }
}

#[tokio::test]
async fn a_batch_of_global_and_per_region_rules_is_all_or_nothing() {
    let server = RedisServer::start();
    let store = RegionStore::new(
        AnyStore::Redis(redis(&server.url()).await),
        RegionsConfig::new("us-east", vec![]),
    )
    .unwrap();
    let global = global_rule(
        "g",
        Algorithm::FixedWindow,
        Tier::per_hour(3),
        Duration::from_secs(2),
    );
    let local = Rule::new("l", Algorithm::FixedWindow, [Tier::per_hour(2)]).unwrap();
    let clock = ManualClock::new();
    clock.set_micros(3_600_000_000 * 500_000);
    let limiter = Limiter::builder(global)
        .rule(local)
        .store(store)
        .clock(clock)
        .build()
        .unwrap();
    let both = [
        tollgate::Item::new("g", "k", 1),
        tollgate::Item::new("l", "k", 1),
    ];
    for _ in 0..2 {
        let decisions = limiter.check_batch(&both).await.unwrap();
        assert!(decisions.allowed());
        let sources: Vec<Source> = decisions.iter().map(|d| d.source()).collect();
        assert_eq!(sources, [Source::Global, Source::Redis]);
    }
    // The per-region rule denies: what the global rule took comes back.
    assert!(!limiter.check_batch(&both).await.unwrap().allowed());
    let left = limiter
        .check_batch(&[tollgate::Item::new("g", "k", 0)])
        .await
        .unwrap();
    assert_eq!(left.iter().next().unwrap().remaining(), 1, "{left:?}");
    // The global rule denies: the per-region rule takes nothing either.
    assert!(
        limiter
            .check_batch(&[tollgate::Item::new("g", "k", 1)])
            .await
            .unwrap()
            .allowed()
    );
    let local_only = [tollgate::Item::new("l", "other", 1)];
    let mixed = [
        tollgate::Item::new("g", "k", 1),
        tollgate::Item::new("l", "other", 1),
    ];
    assert!(!limiter.check_batch(&mixed).await.unwrap().allowed());
    for _ in 0..2 {
        assert!(limiter.check_batch(&local_only).await.unwrap().allowed());
    }
}
