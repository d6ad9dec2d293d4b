//! What the Redis store leaves behind: every key expires within a second of its state being as
//! good as new, nothing is written for a look, a denied unknown key or a bad check, any bytes
//! make a key, and the memory a key takes.

use crate::support;

use std::time::Duration;

use support::RedisServer;
use tollgate::{
    Algorithm, Error, LeakyBucket, Limiter, MAX_KEY_LEN, ManualClock, RedisStore, Rule, Source,
    StoreTime, SubWindows, Tier, TokenBucket, WarmUp,
};

const SECOND: u64 = 1_000;
/// On the caller's time, keys live a minute longer by the server's clock.
const PADDING: u64 = 60 * SECOND;

/// Each algorithm, a tier, and how long (ms) one permit taken 10 s into a minute leaves state.
fn cases() -> Vec<(Algorithm, Tier, u64)> {
    let minute = Tier::per_minute(5);
    vec![
        (Algorithm::FixedWindow, minute.clone(), 50 * SECOND),
        (Algorithm::SlidingWindow, minute.clone(), 110 * SECOND),
        (
            Algorithm::SubWindows(SubWindows { count: 6 }),
            minute.clone(),
            60 * SECOND,
        ),
        (Algorithm::SlidingLog, minute.clone(), 60 * SECOND),
        (
            Algorithm::TokenBucket(TokenBucket::default()),
            minute.clone(),
            12 * SECOND,
        ),
        (Algorithm::IntervalBucket, minute.clone(), 60 * SECOND),
        (
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            minute.clone(),
            12 * SECOND,
        ),
        (
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            minute.clone(),
            12 * SECOND,
        ),
        (Algorithm::Gcra, minute, 12 * SECOND),
        // A cold key: the first permit costs 290 ms, then it cools back in 100 ms (+1 µs).
        (
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(2))),
            Tier::per_second(10),
            391,
        ),
    ]
}

async fn limiter(
    server: &RedisServer,
    algorithm: Algorithm,
    tier: Tier,
) -> Limiter<RedisStore, ManualClock> {
    let rule = Rule::new(format!("keys-{}", algorithm.name()), algorithm, [tier]).unwrap();
    let (limiter, clock) = on_a_manual_clock(server, rule).await;
    clock.advance(Duration::from_secs(10));
    limiter
}

/// A limiter of `rule` deciding on the caller's time, a manual clock at a whole second.
async fn on_a_manual_clock(
    server: &RedisServer,
    rule: Rule,
) -> (Limiter<RedisStore, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(rule)
        .store(
            RedisStore::builder(&server.url())
                .store_time(StoreTime::Local)
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap(),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

/// The TTL (ms) of `key`, its padding taken off.
fn ttl(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["pttl", key]).parse::<u64>().unwrap() - PADDING
}

#[tokio::test]
async fn keys_expire_when_their_state_is_as_good_as_new() {
    let server = RedisServer::start();
    println!("| algorithm | keys | bytes after one permit | bytes with the limit used up |");
    println!("| --- | ---: | ---: | ---: |");
    for (algorithm, tier, lifetime_ms) in cases() {
        let name = algorithm.name();
        let limiter = limiter(&server, algorithm, tier).await;
        // A look at an unknown key writes nothing.
        assert!(limiter.check("tenant", 0).await.unwrap().allowed());
        let keys: Vec<String> = support::redis_keys(&limiter, "tenant")
            .into_iter()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        for key in &keys {
            assert_eq!(server.cli(&["exists", key]), "0", "{name}");
        }
        assert!(limiter.check("tenant", 1).await.unwrap().allowed());
        let mut bytes = Vec::new();
        for key in &keys {
            let ttl = ttl(&server, key);
            // No longer than the state needs, rounded up to a whole second; real time passing
            // only shortens it.
            assert!(
                ttl < lifetime_ms + SECOND,
                "{name}: {key} expires in {ttl} ms, needs {lifetime_ms}"
            );
            assert!(
                ttl + 2 * SECOND >= lifetime_ms,
                "{name}: {ttl} ms is too short"
            );
            bytes.push(server.cli(&["memory", "usage", key]));
        }
        while limiter.check("tenant", 1).await.unwrap().allowed() {}
        let full: Vec<String> = keys
            .iter()
            .map(|k| server.cli(&["memory", "usage", k]))
            .collect();
        println!(
            "| {name} | {} | {} | {} |",
            keys.len(),
            bytes.join(", "),
            full.join(", ")
        );
    }
}

#[tokio::test]
async fn after_any_traffic_every_key_has_a_ttl() {
    let server = RedisServer::start();
    for (algorithm, tier, _) in cases() {
        let limiter = limiter(&server, algorithm, tier).await;
        for i in 0..200u64 {
            let key = format!("k{}", i % 7);
            limiter.check(&key, i % 3).await.unwrap();
        }
    }
    let keys = server.cli(&["--scan"]);
    assert!(keys.lines().count() >= 10);
    for key in keys.lines() {
        // -1: no TTL; -2: it expired since the scan, which is fine.
        let ttl: i64 = server.cli(&["pttl", key]).parse().unwrap();
        assert_ne!(ttl, -1, "{key} has no TTL");
    }
}

/// A key is any bytes: invalid UTF-8, braces (which delimit the hash tag) and NUL each keep a
/// state of their own. A key too long or a cost no tier can ever admit is an error, and no
/// command reaches the server.
#[tokio::test]
async fn any_bytes_are_a_key_and_bad_checks_reach_no_server() {
    let server = RedisServer::start();
    // Per hour: no permit comes back during the test.
    let rule = Rule::new("bytes", Algorithm::Gcra, [Tier::per_hour(2)]).unwrap();
    let limiter = Limiter::builder(rule)
        .store(
            RedisStore::builder(&server.url())
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap(),
        )
        .build()
        .unwrap();
    let keys: [&[u8]; 6] = [b"\xff\xfe", b"a}{b", b"a}{c", b"{a}", b"a\0c", b"}"];
    for key in keys {
        assert!(limiter.check(key, 2).await.unwrap().allowed(), "{key:?}");
        assert!(!limiter.check(key, 1).await.unwrap().allowed(), "{key:?}");
    }
    assert_eq!(server.cli(&["dbsize"]), keys.len().to_string());

    let commands = || server.cli(&["info", "commandstats"]);
    let before = commands();
    let too_long = vec![7u8; MAX_KEY_LEN + 1];
    let err = limiter.check(&too_long, 1).await.unwrap_err();
    assert!(matches!(err, Error::KeyTooLong { .. }), "{err}");
    let err = limiter.check("tenant", 3).await.unwrap_err();
    assert!(
        matches!(err, Error::CostExceedsCapacity { tier: 0, .. }),
        "{err}"
    );
    // Only the INFO that read the counts ran since.
    let ran = |stats: &str| {
        stats
            .lines()
            .filter(|l| !l.starts_with("cmdstat_info:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(ran(&commands()), ran(&before));
}

/// A window's writes all expire at its end, so they keep the TTL its first write set (Redis
/// keeps a TTL for less than it sets one); the next window's first write sets a new one.
/// Whole-second windows expire exactly at their end.
#[tokio::test]
async fn writes_within_a_window_keep_its_ttl() {
    let server = RedisServer::start();
    let rule = Rule::new("window-ttl", Algorithm::FixedWindow, [Tier::per_minute(5)]).unwrap();
    let (limiter, clock) = on_a_manual_clock(&server, rule).await;
    let key = String::from_utf8(support::redis_keys(&limiter, "tenant").remove(0)).unwrap();
    let ttl = || ttl(&server, &key);
    clock.advance(Duration::from_secs(10));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    assert!(ttl() <= 50 * SECOND);
    // 30 s into the window: a TTL set anew would be 30 s; the first one still has almost 50.
    clock.advance(Duration::from_secs(20));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    let kept = ttl();
    assert!(kept > 40 * SECOND && kept <= 50 * SECOND, "{kept}");
    // 5 s into the next window: it ends in 55 s.
    clock.advance(Duration::from_secs(35));
    let decision = limiter.check("tenant", 1).await.unwrap();
    assert_eq!(decision.remaining(), 4);
    let renewed = ttl();
    assert!(renewed > 50 * SECOND && renewed <= 55 * SECOND, "{renewed}");
}

/// A state whose expiry moves with each write (GCRA) expires at the next whole second: writes
/// within that second keep the expiry the first set, and a write past it sets a new one.
/// Compared as absolute times (`PEXPIRETIME`), so however slow the machine.
#[tokio::test]
async fn writes_within_a_second_keep_their_ttl() {
    let server = RedisServer::start();
    // 10 ms per permit: each write moves the state's expiry by 10 ms.
    let rule = Rule::new("second-ttl", Algorithm::Gcra, [Tier::per_second(100)]).unwrap();
    let (limiter, clock) = on_a_manual_clock(&server, rule).await;
    let key = String::from_utf8(support::redis_keys(&limiter, "tenant").remove(0)).unwrap();
    let expiry = || server.cli(&["pexpiretime", &key]).parse::<u64>().unwrap();
    // 100 ms into a second: the state is as good as new 10 ms later, the key expires at the
    // second's end, 900 ms later.
    clock.advance(Duration::from_millis(100));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    let first = expiry();
    assert!(ttl(&server, &key) <= 900);
    // 400 ms in: a TTL set anew would end 300 ms earlier (less the real time between).
    clock.advance(Duration::from_millis(300));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    assert_eq!(expiry(), first);
    // 50 ms into the next second: the key now expires at that second's end.
    clock.advance(Duration::from_millis(650));
    assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    assert!(expiry() > first);
    assert!(ttl(&server, &key) <= 950);
}

/// On the server's clock, keys expire at a whole second of it, one time for every key
/// written within a second.
#[tokio::test]
async fn on_the_servers_clock_keys_expire_at_a_whole_second() {
    let server = RedisServer::start();
    // 100 an hour: the state lives 36 s, so the key outlives the reads below on any machine
    // (at 100 a second it could expire a millisecond after the check, at a second's turn).
    let rule = Rule::new("server-ttl", Algorithm::Gcra, [Tier::per_hour(100)]).unwrap();
    let limiter = Limiter::builder(rule)
        .store(
            RedisStore::builder(&server.url())
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap(),
        )
        .build()
        .unwrap();
    for tenant in ["a", "b"] {
        assert!(limiter.check(tenant, 1).await.unwrap().allowed());
        let key = String::from_utf8(support::redis_keys(&limiter, tenant).remove(0)).unwrap();
        let at: u64 = server.cli(&["pexpiretime", &key]).parse().unwrap();
        let time = server.cli(&["time"]);
        let now: u64 = time.lines().next().unwrap().parse::<u64>().unwrap() * SECOND;
        assert_eq!(at % SECOND, 0, "{at}");
        // The state is as good as new 36 s after the check, so the whole second after that.
        assert!(
            at > now + 34 * SECOND && at <= now + 38 * SECOND,
            "{at} {now}"
        );
    }
}

/// Checks once, runs `flush` on the server, and checks again: the second check is decided by
/// Redis on the state the first left.
async fn survives(server: &RedisServer, flush: &str) {
    // Per hour: the state lives for 36 s of real time, however slow the machine.
    let limiter = limiter(server, Algorithm::Gcra, Tier::per_hour(100)).await;
    assert_eq!(limiter.check("k", 1).await.unwrap().source(), Source::Redis);
    assert_eq!(server.cli(&[flush, "flush"]), "OK");
    let decision = limiter.check("k", 1).await.unwrap();
    assert_eq!(
        (decision.source(), decision.remaining()),
        (Source::Redis, 98)
    );
}

#[tokio::test]
async fn functions_flushed_from_the_server_are_reloaded() {
    let server = RedisServer::start();
    survives(&server, "function").await;
    assert!(server.cli(&["function", "list"]).contains("tollgate_"));
}

#[tokio::test]
async fn scripts_flushed_from_a_server_without_functions_are_reloaded() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    survives(&server, "script").await;
    let stats = server.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}

#[tokio::test]
async fn instances_whose_clocks_disagree_agree_on_the_server_time() {
    let server = RedisServer::start();
    let rule = Rule::new("skew", Algorithm::FixedWindow, [Tier::per_hour(10)]).unwrap();
    let store = || {
        RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(5))
            .build()
    };
    let (first, second) = (store().await.unwrap(), store().await.unwrap());
    let instance = |store: RedisStore, clock: ManualClock| {
        Limiter::builder(rule.clone())
            .store(store)
            .clock(clock)
            .build()
            .unwrap()
    };
    // One instance's clock is a day ahead of the other's: with the server's time they count
    // in the same window.
    let behind = instance(first, ManualClock::new());
    let ahead = ManualClock::new();
    ahead.advance(Duration::from_secs(86_400));
    let ahead = instance(second, ahead);
    for _ in 0..4 {
        assert!(behind.check("tenant", 1).await.unwrap().allowed());
    }
    assert_eq!(ahead.check("tenant", 0).await.unwrap().remaining(), 6);
    // On the server's time a key lives exactly as long as its window: at most an hour.
    let key = String::from_utf8(support::redis_keys(&behind, "tenant").remove(0)).unwrap();
    let ttl: u64 = server.cli(&["pttl", &key]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 3_600_000, "{ttl}");
}

/// Two deployments on one Redis, each with its key prefix: every key each writes starts with
/// its prefix, strict, hybrid and lease alike, and neither sees the other's counts.
#[tokio::test]
async fn key_prefixes_keep_deployments_apart() {
    use tollgate::{HybridConfig, HybridStore, LeaseConfig, LeaseStore};
    let server = RedisServer::start();
    let rule = Rule::new("shared", Algorithm::FixedWindow, [Tier::per_minute(3)]).unwrap();
    let store = |prefix: &'static str| {
        RedisStore::builder(&server.url())
            .key_prefix(prefix)
            .timeout(Duration::from_secs(5))
            .build()
    };
    let (a, b) = (
        store("blue_").await.unwrap(),
        store("green_").await.unwrap(),
    );
    let blue = Limiter::builder(rule.clone())
        .store(a.clone())
        .build()
        .unwrap();
    let green = Limiter::builder(rule.clone()).store(b).build().unwrap();
    for _ in 0..3 {
        assert!(blue.check("k", 1).await.unwrap().allowed());
    }
    assert!(!blue.check("k", 1).await.unwrap().allowed());
    assert!(
        green.check("k", 1).await.unwrap().allowed(),
        "green counts on its own"
    );
    let hybrid = HybridStore::new(&a, HybridConfig::default()).unwrap();
    let hybrid = Limiter::builder(rule.clone())
        .store(hybrid.clone())
        .build()
        .unwrap();
    hybrid.check("h", 1).await.unwrap();
    hybrid.store().sync().await.unwrap();
    let lease = LeaseStore::new(&a, LeaseConfig::default()).unwrap();
    let lease = Limiter::builder(rule).store(lease).build().unwrap();
    lease.check("l", 1).await.unwrap();
    let keys = server.cli(&["--scan"]);
    assert!(keys.lines().count() >= 4, "{keys}");
    for key in keys.lines() {
        assert!(
            key.starts_with("blue_tg:") || key.starts_with("green_tg:"),
            "{key} is outside both prefixes"
        );
    }
    assert!(keys.lines().any(|k| k.starts_with("blue_tg:c:")), "{keys}");
}

/// With an expiry jitter, keys outlive their state by up to the jitter, spread across keys,
/// and decisions do not change.
#[tokio::test]
async fn expiry_jitter_spreads_the_ttls_of_a_windows_keys() {
    let server = RedisServer::start();
    let rule = Rule::new("jitter", Algorithm::FixedWindow, [Tier::per_minute(2)]).unwrap();
    let store = RedisStore::builder(&server.url())
        .expiry_jitter(Duration::from_secs(300))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder(rule).store(store).build().unwrap();
    let mut ttls = Vec::new();
    for i in 0..32 {
        let key = format!("k{i}");
        assert!(limiter.check(&key, 1).await.unwrap().allowed());
        assert!(limiter.check(&key, 1).await.unwrap().allowed());
        assert!(!limiter.check(&key, 1).await.unwrap().allowed());
        let name = String::from_utf8(support::redis_keys(&limiter, &key).remove(0)).unwrap();
        ttls.push(server.cli(&["pttl", &name]).parse::<u64>().unwrap());
    }
    // A window of a minute: its keys live at most a minute and a second without jitter.
    let longest = ttls.iter().max().unwrap();
    assert!(*longest <= 61_000 + 300_000, "{ttls:?}");
    assert!(*longest > 61_000, "no key outlived its window: {ttls:?}");
    let spread: std::collections::HashSet<u64> = ttls.iter().map(|t| t / 18_750).collect();
    assert!(spread.len() >= 8, "TTLs not spread: {ttls:?}");
}
