//! Exact under any concurrency: four limiter instances, each with its own connections, and 64
//! tasks each hammer one key; the permits admitted equal the limit, not one more or fewer. And
//! on a cluster whose slots move: a key's state follows its slot.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::{RedisCluster, RedisServer};
use tollgate::{
    Algorithm, LeakyBucket, Limiter, ManualClock, RedisStore, RedisStoreBuilder, Rule, Source,
    StoreTime, SubWindows, Tier, TokenBucket,
};

const INSTANCES: usize = 4;
const TASKS: usize = 64;
const LIMIT: u64 = 300;

/// Every algorithm whose contract is exact, at `LIMIT` per day (refill during a test run is
/// far below one permit). The fixed window runs on a frozen caller clock, so that a run across
/// midnight UTC cannot see two windows.
fn exact_rules() -> Vec<(Rule, StoreTime)> {
    let day = Tier::per_day(LIMIT);
    let bucket = Tier::per_day(LIMIT).with_burst(LIMIT);
    let rule = |algorithm: Algorithm, tier: &Tier| {
        Rule::new(
            format!("exact-{}", algorithm.name()),
            algorithm,
            [tier.clone()],
        )
        .unwrap()
    };
    vec![
        (rule(Algorithm::FixedWindow, &day), StoreTime::Local),
        (rule(Algorithm::SlidingWindow, &day), StoreTime::Server),
        (
            rule(Algorithm::SubWindows(SubWindows { count: 6 }), &day),
            StoreTime::Server,
        ),
        (rule(Algorithm::SlidingLog, &day), StoreTime::Server),
        (
            rule(Algorithm::TokenBucket(TokenBucket::default()), &bucket),
            StoreTime::Server,
        ),
        (rule(Algorithm::IntervalBucket, &day), StoreTime::Server),
        (
            rule(Algorithm::LeakyBucket(LeakyBucket::Meter), &bucket),
            StoreTime::Server,
        ),
        (
            rule(Algorithm::LeakyBucket(LeakyBucket::Shaper), &bucket),
            StoreTime::Server,
        ),
        (rule(Algorithm::Gcra, &bucket), StoreTime::Server),
    ]
}

/// Permits admitted for each of `keys` when `INSTANCES x TASKS` tasks check them, cost 1 or 2.
async fn hammer(
    stores: &[RedisStoreBuilder],
    rule: &Rule,
    time: StoreTime,
    keys: &[String],
) -> Vec<u64> {
    let clock = ManualClock::new();
    let mut limiters: Vec<Arc<Limiter<RedisStore, ManualClock>>> = Vec::new();
    for store in stores {
        let store = store
            .clone()
            .store_time(time)
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap();
        let limiter = Limiter::builder(rule.clone())
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        limiters.push(Arc::new(limiter));
    }
    let attempts_per_task = (3 * LIMIT as usize * keys.len()).div_ceil(INSTANCES * TASKS);
    let mut tasks = Vec::new();
    for (i, limiter) in limiters.iter().enumerate() {
        for t in 0..TASKS {
            let (limiter, keys) = (limiter.clone(), keys.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut admitted = vec![0u64; keys.len()];
                for n in 0..attempts_per_task {
                    let k = (i + t + n) % keys.len();
                    let cost = 1 + (n % 2) as u64;
                    let decision = limiter.check(&keys[k], cost).await.unwrap();
                    assert_eq!(decision.source(), Source::Redis, "{decision:?}");
                    if decision.allowed() {
                        admitted[k] += cost;
                    }
                }
                // Single permits to the end, so that no remainder is left by a cost of 2.
                for (k, key) in keys.iter().enumerate() {
                    while limiter.check(key, 1).await.unwrap().allowed() {
                        admitted[k] += 1;
                    }
                }
                admitted
            }));
        }
    }
    let mut totals = vec![0; keys.len()];
    for task in tasks {
        for (k, n) in task.await.unwrap().into_iter().enumerate() {
            totals[k] += n;
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_admits_exactly_the_limit() {
    let server = RedisServer::start();
    // Instances with 1 to 4 pipelined connections each.
    let stores: Vec<RedisStoreBuilder> = (0..INSTANCES)
        .map(|i| RedisStore::builder(&server.url()).connections(1 + i))
        .collect();
    for (rule, time) in exact_rules() {
        let admitted = hammer(&stores, &rule, time, &["tenant".to_string()]).await;
        assert_eq!(admitted, [LIMIT], "{}", rule.algorithm().name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_admits_exactly_the_limit_on_every_slot() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let stores = vec![RedisStore::cluster_builder(&nodes); INSTANCES];
    // Keys that land on different masters.
    let keys: Vec<String> = (0..6).map(|i| format!("tenant-{i}")).collect();
    for (rule, time) in exact_rules() {
        let admitted = hammer(&stores, &rule, time, &keys).await;
        assert_eq!(
            admitted,
            vec![LIMIT; keys.len()],
            "{}",
            rule.algorithm().name()
        );
    }
    // The keys were really spread over the masters.
    let held: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["dbsize"]).parse().unwrap())
        .collect();
    assert!(held.iter().filter(|&&n| n > 0).count() >= 2, "{held:?}");
}

/// A resharding moves a key's slot to another master between checks: the client follows ASK
/// while the slot migrates and MOVED once it has, and the key's state moves with it.
#[tokio::test]
async fn a_key_keeps_its_state_while_its_slot_moves_to_another_master() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&nodes)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let tier = Tier::per_day(LIMIT).with_burst(LIMIT);
    let rule = Rule::new("reshard", Algorithm::Gcra, [tier]).unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    let take = async || {
        let decision = limiter.check("tenant", 1).await.unwrap();
        assert_eq!(decision.source(), Source::Redis);
        decision.remaining()
    };
    assert_eq!(take().await, LIMIT - 1);

    let key = String::from_utf8(support::redis_keys(&limiter, "tenant").remove(0)).unwrap();
    let slot = cluster.nodes[0].cli(&["cluster", "keyslot", &key]);
    // Whether a node holds the key: EXISTS would be redirected while the slot migrates.
    let holds = |node: &RedisServer| node.cli(&["cluster", "countkeysinslot", &slot]) == "1";
    let id = |node: &RedisServer| node.cli(&["cluster", "myid"]);
    let source = cluster
        .nodes
        .iter()
        .position(holds)
        .expect("a master holds it");
    let (from, to) = (&cluster.nodes[source], &cluster.nodes[(source + 1) % 3]);
    let importing = ["cluster", "setslot", &slot, "importing", &id(from)];
    assert_eq!(to.cli(&importing), "OK");
    let migrating = ["cluster", "setslot", &slot, "migrating", &id(to)];
    assert_eq!(from.cli(&migrating), "OK");
    // Migrating, the key still on the source: decided there.
    assert_eq!(take().await, LIMIT - 2);
    let port = to.port.to_string();
    let migrate = ["migrate", "127.0.0.1", &port, "", "0", "5000", "keys", &key];
    assert_eq!(from.cli(&migrate), "OK");
    assert!(holds(to) && !holds(from));
    // Migrating, the key on the target: the source answers ASK.
    assert_eq!(take().await, LIMIT - 3);
    let owner = id(to);
    for node in [to, from].into_iter().chain(&cluster.nodes) {
        assert_eq!(
            node.cli(&["cluster", "setslot", &slot, "node", &owner]),
            "OK"
        );
    }
    // Moved: the source answers MOVED, and the client learns the new owner.
    assert_eq!(take().await, LIMIT - 4);
    assert_eq!(take().await, LIMIT - 5);
    assert!(holds(to) && !holds(from));
    let redirects = from.cli(&["info", "errorstats"]);
    assert!(redirects.contains("errorstat_ASK:count=1"), "{redirects}");
    assert!(redirects.contains("errorstat_MOVED:count=1"), "{redirects}");
}
