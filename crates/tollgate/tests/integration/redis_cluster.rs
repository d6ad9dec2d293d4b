//! A Redis Cluster as users outgrow one Redis, under the faults it meets: a dead master keeps
//! away only the checks of its own slots (each node has its own circuit breaker) and the
//! store says which nodes are failing; a cold cluster (no function library yet) is waited for,
//! never answered by the failure policy; slots migrating under load are followed; and checks
//! across slots never exceed a limit, whatever their concurrency, nor keep what they took when
//! denied.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::RedisCluster;
use tollgate::{Algorithm, FailurePolicy, Item, Limiter, RedisStore, Rule, Source, Tier};

/// Keys whose state lives on each master: `keys[m]` on `cluster.nodes[m]` (masters first).
fn keys_by_master(cluster: &RedisCluster, limiter: &Limiter<RedisStore>) -> Vec<Vec<String>> {
    let mut by_master = vec![Vec::new(); 3];
    for i in 0.. {
        let key = format!("tenant-{i}");
        let name = support::redis_keys(limiter, &key).remove(0);
        let owner = cluster.owner(&name);
        if owner < 3 && by_master[owner].len() < 8 {
            by_master[owner].push(key);
        }
        if by_master.iter().all(|k| k.len() == 8) {
            return by_master;
        }
    }
    unreachable!()
}

/// A limiter of two rules, `tenant` and `ip`, made by `rule`, on `store`.
fn tenant_and_ip(store: RedisStore, rule: impl Fn(&str) -> Rule) -> Limiter<RedisStore> {
    Limiter::builder(rule("tenant"))
        .rule(rule("ip"))
        .store(store)
        .build()
        .unwrap()
}

async fn store(cluster: &RedisCluster, timeout: Duration) -> RedisStore {
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisStore::cluster_builder(&nodes)
        .timeout(timeout)
        .build()
        .await
        .unwrap()
}

/// One master killed: its tenants are decided by their policy until its replica takes over;
/// every other tenant is decided by Redis all along, and the store says which node fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_keeps_away_only_the_checks_of_its_slots() {
    let mut cluster = RedisCluster::start_with(1, 1000);
    let store = store(&cluster, Duration::from_millis(100)).await;
    let rule = Rule::new(
        "tenants",
        Algorithm::FixedWindow,
        [Tier::per_hour(1_000_000)],
    )
    .unwrap()
    .on_failure(FailurePolicy::Closed)
    .unwrap();
    let limiter = Limiter::builder(rule).store(store.clone()).build().unwrap();
    let keys = keys_by_master(&cluster, &limiter);
    // Every master has answered once: its start-up allowance is over.
    for key in keys.iter().flatten() {
        assert_eq!(limiter.check(key, 1).await.unwrap().source(), Source::Redis);
    }
    assert_eq!(store.nodes().len(), 3);
    assert!(!store.degraded());

    cluster.nodes[0].kill();
    let started = Instant::now();
    let (mut healthy, mut by_redis, mut dead_by_policy) = (0, 0, 0);
    let mut saw_failing = false;
    // Until the dead master's replica decides its tenants again.
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replica never took over: {:?}\n{}",
            store.nodes(),
            cluster.nodes[1].cli(&["cluster", "nodes"])
        );
        for key in keys[1].iter().chain(&keys[2]) {
            healthy += 1;
            if limiter.check(key, 1).await.unwrap().source() == Source::Redis {
                by_redis += 1;
            }
        }
        let dead = limiter.check(&keys[0][0], 1).await.unwrap();
        let nodes = store.nodes();
        if nodes.iter().any(|n| n.failing) {
            saw_failing = true;
            assert!(store.degraded() && !store.down(), "{nodes:?}");
            let failing: usize = nodes.iter().filter(|n| n.failing).map(|n| n.slots).sum();
            assert!(
                failing < 16_384 / 2,
                "only the dead master's slots: {nodes:?}"
            );
        }
        if dead.source() == Source::Redis {
            break;
        }
        assert_eq!(dead.source(), Source::FailClosed);
        dead_by_policy += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "healthy masters' checks: {by_redis} of {healthy} by Redis; the dead master's: \
         {dead_by_policy} by policy, Redis again after {:?}",
        started.elapsed()
    );
    assert_eq!(
        by_redis, healthy,
        "every healthy master's check decided by Redis"
    );
    assert!(saw_failing, "the store said a node was failing");
    assert!(dead_by_policy > 0);
    // Its tenants keep their counts on the promoted replica.
    let after = limiter.check(&keys[0][1], 0).await.unwrap();
    assert_eq!(after.source(), Source::Redis);
}

/// A cluster that has never loaded tollgate's function library, asked by many checks at once
/// the moment the store is built: every one is decided by Redis (each node loads the
/// library within the start-up allowance), none by the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_cluster_is_waited_for_not_failed_over() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&nodes)
        .timeout(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let rule = Rule::new("cold", Algorithm::Gcra, [Tier::per_second(1_000)]).unwrap();
    let limiter = Arc::new(Limiter::builder(rule).store(store.clone()).build().unwrap());
    // Every check starts before any answers: one started after the first answer is no
    // longer a cold start's (its node answered), and on a loaded machine its 20 ms may pass.
    let ready = Arc::new(tokio::sync::Barrier::new(300));
    let checks: Vec<_> = (0..300)
        .map(|i| {
            let (limiter, ready) = (limiter.clone(), ready.clone());
            tokio::spawn(async move {
                ready.wait().await;
                limiter.check(&format!("k{i}"), 1).await.unwrap()
            })
        })
        .collect();
    let mut by_policy = 0;
    for check in checks {
        if check.await.unwrap().source() != Source::Redis {
            by_policy += 1;
        }
    }
    assert_eq!(by_policy, 0, "checks answered by policy at a cold start");
    assert!(!store.degraded());
}

/// Slots of busy keys migrate back and forth between two masters while checks run: the
/// checks follow ASK, MOVED and TRYAGAIN until the slot settles, none is decided by the
/// failure policy, and the limit holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_follow_slots_as_they_migrate() {
    follow_migrations(RedisCluster::start(), Source::Redis).await;
}

/// The same with tollgate's Redis module on every node: its command, its key declared,
/// follows the slot as the functions do; and its batch of keys in different slots is
/// refused (`CROSSSLOT`), as any command's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_by_the_module_follow_slots_as_they_migrate() {
    let cluster =
        RedisCluster::start_with_args(0, 2000, &["--loadmodule", support::redis_module()]);
    // Its keys are declared: a batch whose keys span slots is refused before it runs.
    let batch = [
        "tollgate.batch",
        "2",
        "{a}1",
        "{b}2",
        "c",
        "i",
        "r",
        "t",
        "r",
        "t",
    ];
    let refused = cluster.nodes[0].cli(&batch);
    assert!(refused.starts_with("CROSSSLOT"), "{refused}");
    follow_migrations(cluster, Source::RedisModule).await;
}

/// Moves the slot of a busy key 40 times while checks run; every check decided by `source`.
/// The store's timeout is long (2 s) for a machine loaded by other tests: what is held here
/// is that redirections are followed, not how fast.
async fn follow_migrations(cluster: RedisCluster, source: Source) {
    let store = store(&cluster, Duration::from_secs(2)).await;
    const LIMIT: u64 = 1 << 30;
    let rule = Rule::new("moving", Algorithm::FixedWindow, [Tier::per_day(LIMIT)]).unwrap();
    let limiter = Arc::new(Limiter::builder(rule).store(store).build().unwrap());
    let key = "mover";
    let name = String::from_utf8(support::redis_keys(&limiter, key).remove(0)).unwrap();
    let slot = cluster.nodes[0].cli(&["cluster", "keyslot", &name]);
    let id = |i: usize| cluster.nodes[i].cli(&["cluster", "myid"]);
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let checker = {
        let (limiter, running) = (limiter.clone(), running.clone());
        tokio::spawn(async move {
            let (mut admitted, mut by_policy) = (0u64, 0u64);
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                let d = limiter.check(key, 1).await.unwrap();
                if d.source() != source {
                    by_policy += 1;
                } else if d.allowed() {
                    admitted += 1;
                }
            }
            (admitted, by_policy)
        })
    };
    let mut owner = cluster.owner(name.as_bytes());
    for _ in 0..40 {
        let (from, to) = (owner, (owner + 1) % 3);
        let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
        target.cli(&["cluster", "setslot", &slot, "importing", &id(from)]);
        source.cli(&["cluster", "setslot", &slot, "migrating", &id(to)]);
        let port = target.port.to_string();
        source.cli(&[
            "migrate",
            "127.0.0.1",
            &port,
            "",
            "0",
            "5000",
            "keys",
            &name,
        ]);
        for node in [to, from, (to + 1) % 3] {
            cluster.nodes[node].cli(&["cluster", "setslot", &slot, "node", &id(to)]);
        }
        owner = to;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let (admitted, by_policy) = checker.await.unwrap();
    let look = limiter.check(key, 0).await.unwrap();
    let failures = limiter.store().failures();
    println!("{admitted} admitted while the slot moved 40 times; {by_policy} by policy");
    assert_eq!(
        by_policy, 0,
        "checks answered by policy (or not by {source:?}) while the slot moved: {failures:?}"
    );
    assert!(admitted > 0);
    assert_eq!(
        look.remaining(),
        LIMIT - admitted,
        "every admission counted once"
    );
}

/// A check across slots whose second master does not answer is decided by its policy, and
/// what the master that did answer took is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_slots_takes_nothing_unless_admitted() {
    let cluster = RedisCluster::start();
    let store = store(&cluster, Duration::from_millis(200)).await;
    let rule = |name: &str| {
        Rule::new(name, Algorithm::FixedWindow, [Tier::per_day(10)])
            .unwrap()
            .on_failure(FailurePolicy::Closed)
            .unwrap()
    };
    let limiter = tenant_and_ip(store, rule);
    let keys = keys_by_master(&cluster, &limiter);
    let (tenant, ip) = (&keys[1][0], &keys[2][0]);
    let batch = [Item::new("tenant", tenant, 1), Item::new("ip", ip, 1)];
    assert!(limiter.check_batch(&batch).await.unwrap().allowed());
    cluster.nodes[2].pause();
    for _ in 0..3 {
        let denied = limiter.check_batch(&batch).await.unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied[1].source(), Source::FailClosed);
    }
    cluster.nodes[2].resume();
    // Given back as each check was left to its policy; then the frozen master's own takes,
    // given back as they land after the thaw.
    let deadline = Instant::now() + Duration::from_secs(2);
    let left = || async {
        let look = [Item::new("tenant", tenant, 0), Item::new("ip", ip, 0)];
        let look = limiter.check_batch(&look).await.unwrap();
        (look[0].remaining(), look[1].remaining())
    };
    let mut seen = left().await;
    while seen != (9, 9) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = left().await;
    }
    assert_eq!(seen, (9, 9), "the denied checks took nothing in the end");
}

/// How long checks take on a cluster when their keys share a slot and when they span two
/// masters (each slot asked at once, then written at once), and how many of each miss a
/// 20 ms timeout on this machine: printed for BENCHMARKS.md; every check is decided by Redis
/// or, when late, by the policy, never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_slot_and_cross_slot_checks_side_by_side() {
    let cluster = RedisCluster::start();
    let store = store(&cluster, Duration::from_millis(20)).await;
    let rule =
        |name: &str| Rule::new(name, Algorithm::FixedWindow, [Tier::per_day(1 << 40)]).unwrap();
    let limiter = tenant_and_ip(store, rule);
    let keys = keys_by_master(&cluster, &limiter);
    let mut report = Vec::new();
    for (label, other) in [("same slot", &keys[1][0]), ("two masters", &keys[2][0])] {
        let tenant = &keys[1][0];
        let batch = [Item::new("tenant", tenant, 1), Item::new("ip", other, 1)];
        let mut took = Vec::new();
        let mut late = 0;
        for _ in 0..2_000 {
            let started = Instant::now();
            let decisions = limiter.check_batch(&batch).await.unwrap();
            took.push(started.elapsed());
            if decisions.iter().any(|d| d.source() != Source::Redis) {
                late += 1;
            }
        }
        took.sort();
        report.push(format!(
            "{label}: p50 {:?}, p99 {:?}, {late} of 2000 past 20 ms",
            took[1_000], took[1_980]
        ));
    }
    println!("{}", report.join("; "));
}

/// A cluster node with no slots assigned: no slot is known to any master, every check goes
/// to the store-wide backend, and once its breaker opens the store says it is down (the
/// service's readiness follows `down`), not that it is up for want of a master to blame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_no_slots_known_is_down_once_its_breaker_opens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _node = Killed(
        std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed"),
    );
    let url = format!("redis://127.0.0.1:{port}");
    let mut built = None;
    for _ in 0..100 {
        let store = RedisStore::cluster_builder(&[url.as_str()])
            .timeout(Duration::from_millis(50))
            .startup_allowance(Duration::ZERO)
            .circuit_breaker(2, Duration::from_secs(60))
            .build()
            .await;
        if let Ok(store) = store {
            built = Some(store);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = built.expect("a store on a node with no slots");
    let rule = Rule::new("tenants", Algorithm::FixedWindow, [Tier::per_day(10)])
        .unwrap()
        .on_failure(FailurePolicy::Closed)
        .unwrap();
    let limiter = Limiter::builder(rule).store(store.clone()).build().unwrap();
    assert!(!store.down(), "nothing failed yet");
    for _ in 0..3 {
        let denied = limiter.check("t", 1).await.unwrap();
        assert_eq!(denied.source(), Source::FailClosed);
    }
    assert!(store.nodes().is_empty(), "no master known");
    assert!(store.degraded());
    assert!(store.down(), "every check is kept away from Redis");
}

/// Two rules whose keys are on different masters, the common tenant-and-address pair, under
/// 5,000 checks from 64 callers of two instances: each check takes from both slots and gives
/// back when one denies, so no limit is exceeded, and no permit is lost to a denied check:
/// each binding limit is admitted exactly, and each key's count in Redis is what was admitted
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_across_slots_admit_each_limit_exactly() {
    const SMALL: u64 = 600;
    const ADDRESS: u64 = 1_500;
    let cluster = RedisCluster::start();
    let rules = || {
        // Exact for as long as the test runs: a sliding log keeps every permit of its hour,
        // and the tenants' buckets refill one permit a minute or slower.
        let day = Duration::from_secs(86_400);
        [
            Rule::new("small", Algorithm::Gcra, [Tier::new(SMALL, day)]).unwrap(),
            Rule::new("large", Algorithm::Gcra, [Tier::new(10 * SMALL, day)]).unwrap(),
            Rule::new("ip", Algorithm::SlidingLog, [Tier::per_hour(ADDRESS)]).unwrap(),
        ]
    };
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let [small, large, ip] = rules();
        let store = store(&cluster, Duration::from_secs(5)).await;
        let limiter = Limiter::builder(small)
            .rule(large)
            .rule(ip)
            .store(store)
            .build()
            .unwrap();
        limiters.push(Arc::new(limiter));
    }
    let keys = keys_by_master(&cluster, &limiters[0]);
    let (small, large, ip) = (keys[1][0].clone(), keys[1][1].clone(), keys[2][0].clone());
    let mut callers = Vec::new();
    for caller in 0..64 {
        let limiter = limiters[caller % 2].clone();
        let (small, large, ip) = (small.clone(), large.clone(), ip.clone());
        callers.push(tokio::spawn(async move {
            let (mut to_small, mut to_large) = (0, 0);
            // 5,000 checks in all, every other one to each tenant.
            for n in 0..(5_000 - caller).div_ceil(64) {
                let (rule, tenant) = match (caller + 64 * n) % 2 {
                    0 => ("small", &small),
                    _ => ("large", &large),
                };
                let batch = [Item::new(rule, tenant, 1), Item::new("ip", &ip, 1)];
                let decisions = limiter.check_batch(&batch).await.unwrap();
                assert!(decisions.iter().all(|d| d.source() == Source::Redis));
                if decisions.allowed() {
                    match rule {
                        "small" => to_small += 1,
                        _ => to_large += 1,
                    }
                }
            }
            (to_small, to_large)
        }));
    }
    let (mut to_small, mut to_large) = (0, 0);
    for caller in callers {
        let (s, l) = caller.await.unwrap();
        to_small += s;
        to_large += l;
    }
    assert_eq!(to_small, SMALL, "the small tenant's limit, exactly");
    assert_eq!(to_small + to_large, ADDRESS, "the address's limit, exactly");
    // What Redis counts for each key is what was admitted with it.
    let look = [
        Item::new("small", &small, 0),
        Item::new("large", &large, 0),
        Item::new("ip", &ip, 0),
    ];
    let look = limiters[0].check_batch(&look).await.unwrap();
    assert_eq!(look[0].remaining(), 0);
    assert_eq!(look[1].remaining(), 10 * SMALL - to_large);
    assert_eq!(look[2].remaining(), 0);
}

/// Checks across slots while one of the masters stops answering for a while (frozen, its
/// connections open): checks caught in it are decided by their policy (closed), and what the
/// other master took for them is given back at once, not when the frozen one thaws; the
/// takes the frozen master answers once it thaws are given back too. Each key's count in
/// Redis is what Redis admitted with it, during the freeze and after: nothing over, nothing
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_frozen_mid_check_leaves_no_permit_taken_or_lost() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const LIMIT: u64 = 100_000;
    let cluster = RedisCluster::start();
    let store = store(&cluster, Duration::from_millis(50)).await;
    let rule = |name: &str| {
        Rule::new(name, Algorithm::FixedWindow, [Tier::per_day(LIMIT)])
            .unwrap()
            .on_failure(FailurePolicy::Closed)
            .unwrap()
    };
    let limiter = Arc::new(tenant_and_ip(store, rule));
    let keys = keys_by_master(&cluster, &limiter);
    let (tenant, ip) = (keys[1][0].clone(), keys[2][0].clone());
    let admitted = Arc::new(AtomicU64::new(0));
    let by_policy = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_millis(1_500);
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let (limiter, tenant, ip) = (limiter.clone(), tenant.clone(), ip.clone());
            let (admitted, by_policy) = (admitted.clone(), by_policy.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let batch = [Item::new("tenant", &tenant, 1), Item::new("ip", &ip, 1)];
                    let decisions = limiter.check_batch(&batch).await.unwrap();
                    if decisions.iter().all(|d| d.source() == Source::Redis) {
                        assert!(decisions.allowed(), "nothing binds: {decisions:?}");
                        admitted.fetch_add(1, Ordering::SeqCst);
                    } else {
                        assert!(!decisions.allowed(), "closed: {decisions:?}");
                        by_policy.fetch_add(1, Ordering::SeqCst);
                        // A caller that backs off, as a client told 429 would.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    // A look at the tenant's master, which is never frozen; on a loaded machine a look too
    // can outlast the store's 50 ms and be answered by policy: it is asked again.
    let tenant_left = || async {
        let look = [Item::new("tenant", &tenant, 0)];
        let give_up = Instant::now() + Duration::from_secs(2);
        loop {
            let answer = limiter.check_batch(&look).await.unwrap();
            if answer[0].source() == Source::Redis {
                return answer[0].remaining();
            }
            assert!(
                Instant::now() < give_up,
                "the tenant's master never answered"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes[2].pause();
    // While frozen (under the cluster's 2 s node timeout), the tenant's master comes to hold
    // just what was admitted (nothing is admitted while the address's master is frozen): what
    // the checks caught in the freeze took there is given back without waiting for the thaw.
    let frozen = Instant::now() + Duration::from_millis(1_200);
    let mut during = (0, 0);
    while Instant::now() < frozen {
        during = (tenant_left().await, admitted.load(Ordering::SeqCst));
        if during.0 == LIMIT - during.1 && by_policy.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.nodes[2].resume();
    for caller in callers {
        caller.await.unwrap();
    }
    assert!(
        by_policy.load(Ordering::SeqCst) > 0,
        "the freeze caught checks"
    );
    assert_eq!(
        during.0,
        LIMIT - during.1,
        "during the freeze, the tenant's master holds only what was admitted"
    );
    // The takes the thawed master answered are given back as they land.
    let admitted = admitted.load(Ordering::SeqCst);
    let counts = || async {
        let look = [Item::new("tenant", &tenant, 0), Item::new("ip", &ip, 0)];
        let look = limiter.check_batch(&look).await.unwrap();
        (look[0].remaining(), look[1].remaining())
    };
    let settled = Instant::now() + Duration::from_secs(5);
    let mut after = counts().await;
    while after != (LIMIT - admitted, LIMIT - admitted) && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = counts().await;
    }
    assert_eq!(after.0, LIMIT - admitted, "the tenant's count");
    assert_eq!(after.1, LIMIT - admitted, "the address's count");
}
