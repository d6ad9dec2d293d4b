//! Global rules across three regions, each its own `redis-server`, linked through proxies
//! that delay every chunk each way (this bench's stand-in for the distance between regions).
//!
//! 1. Overshoot against the delay (0, 50, 100, 250 ms each way) and the load (every region
//!    bursting at once, or nine checks in ten in one region): 10 tenants, 1,000 an hour each,
//!    the default settings (an interval of 100 ms, an overshoot of 1%), from a window's first
//!    microsecond until every tenant's limit is spent. Per run: the most any tenant got over
//!    the limit against the stated bound, and how long the regions took to spend the limits.
//! 2. Check latency of a global rule and of a per-region one, on the same store, interleaved.
//! 3. Redis calls per decision at 1,000 decisions a second in each region (two instances
//!    each), a global rule against a per-region one: the calls each region's Redis answered
//!    (`FCALL`, `EVALSHA`, `EVAL`, `PING` in its command statistics), replication's included,
//!    over the decisions.
//!
//! Run: `cargo bench -p tollgate --features redis --bench regions` (about 5 minutes; `--
//! overshoot`, `-- latency` or `-- calls` runs one part).

mod redis_server;

// The tests' proxy; this bench never heals a link.
#[path = "../tests/integration/support/proxy.rs"]
#[allow(dead_code, unreachable_pub)]
mod proxy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proxy::Proxy;
use redis_server::{Server, cli, start_redis};
use tollgate::{
    Algorithm, AnyStore, Global, Limiter, ManualClock, Peer, RedisStore, RegionStore,
    RegionsConfig, Rule, Scope, Tier,
};

type Region = RegionStore<AnyStore>;

const NAMES: [&str; 3] = ["us-east", "eu-west", "ap-south"];

/// Three regions: their servers, links (`links[r][s]`: `r`'s way to `s`'s Redis), and
/// `instances` stores each.
struct World {
    servers: Vec<Server>,
    /// Held while the world runs: dropped, a link is cut.
    _links: Vec<Vec<Option<Proxy>>>,
    stores: Vec<Vec<Region>>,
}

async fn redis(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .timeout(Duration::from_secs(1))
        .module(false)
        .build()
        .await
        .unwrap()
}

async fn world(instances: usize, delay: Duration) -> World {
    let servers: Vec<Server> = (0..3).map(|_| start_redis()).collect();
    let mut links = Vec::new();
    for r in 0..3 {
        let mut row = Vec::new();
        for (s, server) in servers.iter().enumerate() {
            row.push(if r == s {
                None
            } else {
                let proxy = Proxy::start(&format!("127.0.0.1:{}", server.port)).await;
                proxy.delay(delay);
                Some(proxy)
            });
        }
        links.push(row);
    }
    let mut stores = Vec::new();
    for r in 0..3 {
        let mut row = Vec::new();
        for _ in 0..instances {
            let mut peers = Vec::new();
            for (s, link) in links[r].iter().enumerate() {
                if let Some(link) = link {
                    peers.push(Peer {
                        name: NAMES[s].into(),
                        store: redis(&link.url()).await,
                    });
                }
            }
            let own = redis(&format!("redis://127.0.0.1:{}", servers[r].port)).await;
            let config = RegionsConfig::new(NAMES[r], peers);
            row.push(RegionStore::new(AnyStore::Redis(own), config).unwrap());
        }
        stores.push(row);
    }
    World {
        servers,
        _links: links,
        stores,
    }
}

fn rule(name: &str, limit: u64, period: Duration, global: bool) -> Rule {
    let rule = Rule::new(name, Algorithm::FixedWindow, [Tier::new(limit, period)]).unwrap();
    match global {
        true => rule.scope(Scope::Global(Global::default())).unwrap(),
        false => rule,
    }
}

/// Part 1: every tenant's total, and how long spending every limit took.
async fn overshoot(delay: Duration, shares: [f64; 3]) -> (u64, Duration) {
    const TENANTS: usize = 10;
    const LIMIT: u64 = 1_000;
    let world = world(1, delay).await;
    let rule = rule("plan", LIMIT, Duration::from_secs(3_600), true);
    let clock = ManualClock::new();
    clock.set_micros(3_600_000_000 * 500_000);
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..TENANTS).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (r, stores) in world.stores.iter().enumerate() {
        let limiter = Arc::new(
            Limiter::builder(rule.clone())
                .store(stores[0].clone())
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        for tenant in 0..TENANTS {
            let (limiter, admitted, share) = (limiter.clone(), admitted.clone(), shares[r]);
            tasks.push(tokio::spawn(async move {
                let mut turn = tenant as u64 * 7_919;
                let deadline = Instant::now() + Duration::from_secs(90);
                while Instant::now() < deadline {
                    turn += 1;
                    if (turn.wrapping_mul(2_654_435_761) % 1_000) as f64 >= share * 1_000.0 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    let decision = limiter.check(format!("tenant-{tenant}"), 1).await.unwrap();
                    if decision.allowed() {
                        admitted[tenant].fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let wait = decision.retry_after().unwrap_or_default();
                    if wait > Duration::from_secs(1) {
                        return;
                    }
                    tokio::time::sleep(wait.min(Duration::from_millis(50))).await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    let worst = admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed).saturating_sub(LIMIT))
        .max()
        .unwrap_or(0);
    drop(world);
    (worst, took)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Part 2: the latency of `checks` checks of each rule, interleaved, on one instance.
async fn latency(checks: usize) -> [(f64, f64); 2] {
    let world = world(1, Duration::from_millis(100)).await;
    let period = Duration::from_secs(3_600);
    let limiter = Limiter::builder(rule("global", u64::MAX >> 12, period, true))
        .rule(rule("regional", u64::MAX >> 12, period, false))
        .store(world.stores[0][0].clone())
        .build()
        .unwrap();
    let mut micros = [Vec::new(), Vec::new()];
    for i in 0..checks {
        for (n, name) in ["global", "regional"].into_iter().enumerate() {
            let key = format!("tenant-{}", i % 25);
            let item = tollgate::Item::new(name, &key, 1);
            let started = Instant::now();
            limiter.check_batch(&[item]).await.unwrap();
            micros[n].push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.map(|mut m| {
        m.sort_by(f64::total_cmp);
        (percentile(&m, 0.5), percentile(&m, 0.99))
    })
}

/// Calls a region's Redis answered so far: its clients' commands (`FCALL`, `EVALSHA`,
/// `EVAL`, `PING`), not those the functions ran.
fn commands(server: &Server) -> u64 {
    cli(server.port, &["info", "commandstats"])
        .lines()
        .filter(|l| {
            ["fcall", "evalsha", "eval", "ping"]
                .iter()
                .any(|c| l.starts_with(&format!("cmdstat_{c}:")))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Part 3: each region's Redis commands per decision, at `rate` decisions a second in each
/// region for `seconds`, two instances each.
async fn calls(global: bool, rate: u64, seconds: u64) -> f64 {
    let world = world(2, Duration::from_millis(50)).await;
    let rule = rule("plan", 1_000_000_000, Duration::from_secs(3_600), global);
    let before: Vec<u64> = world.servers.iter().map(commands).collect();
    let decisions = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for stores in &world.stores {
        for store in stores {
            let limiter = Arc::new(
                Limiter::builder(rule.clone())
                    .store(store.clone())
                    .build()
                    .unwrap(),
            );
            let decisions = decisions.clone();
            let per_instance = rate / stores.len() as u64;
            tasks.push(tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_micros(1_000_000 / per_instance));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut checks = Vec::new();
                for i in 0..per_instance * seconds {
                    tick.tick().await;
                    let (limiter, decisions) = (limiter.clone(), decisions.clone());
                    checks.push(tokio::spawn(async move {
                        limiter
                            .check(format!("tenant-{}", i % 25), 1)
                            .await
                            .unwrap();
                        decisions.fetch_add(1, Ordering::Relaxed);
                    }));
                }
                for check in checks {
                    check.await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let after: Vec<u64> = world.servers.iter().map(commands).collect();
    let spent: u64 = before.iter().zip(&after).map(|(b, a)| a - b).sum();
    spent as f64 / decisions.load(Ordering::Relaxed) as f64
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let part = |name: &str| asked.is_empty() || asked.iter().any(|a| a == name);
    runtime.block_on(async {
        if !part("overshoot") {
            return;
        }
        let bound = 1_000 + 2 * 5;
        println!(
            "| delay each way | load | worst tenant over 1,000 | stated bound | limits spent in |"
        );
        println!("| ---: | --- | ---: | ---: | ---: |");
        for (delay, shares, load) in [
            (0, [1.0; 3], "every region"),
            (50, [1.0; 3], "every region"),
            (100, [1.0; 3], "every region"),
            (250, [1.0; 3], "every region"),
            (100, [0.9, 0.05, 0.05], "90% in one region"),
        ] {
            let (worst, took) = overshoot(Duration::from_millis(delay), shares).await;
            println!(
                "| {delay} ms | {load} | +{worst} | +{} | {:.1} s |",
                bound - 1_000,
                took.as_secs_f64()
            );
        }
    });
    runtime.block_on(async {
        if !part("latency") {
            return;
        }
        let [global, regional] = latency(5_000).await;
        println!();
        println!("| rule | p50 | p99 |");
        println!("| --- | ---: | ---: |");
        println!("| global | {:.1} µs | {:.1} µs |", global.0, global.1);
        println!(
            "| per region | {:.1} µs | {:.1} µs |",
            regional.0, regional.1
        );
    });
    runtime.block_on(async {
        if !part("calls") {
            return;
        }
        println!();
        println!("| rule | Redis calls per decision, 1,000 decisions/s per region |");
        println!("| --- | ---: |");
        for global in [false, true] {
            let per = calls(global, 1_000, 10).await;
            let name = if global { "global" } else { "per region" };
            println!("| {name} | {per:.3} |");
        }
    });
}
