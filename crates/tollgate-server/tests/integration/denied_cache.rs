//! A flood against a strict Redis rule stops costing Redis a call per check: a denied key is
//! answered by the instance until its `retry_after`, for checks of the same rule and key of a
//! cost no smaller; a look, a shaper, a reset and a cache turned off all ask Redis.

use crate::support;

use serde_json::{Value, json};
use support::{Redis, Server, eventually};

const TOKEN: &str = "cache-token";

fn rules(redis: &Redis, server: &str) -> String {
    format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n{server}\
rules:
  - id: api
    match: {{ path: \"/v1/api/**\" }}
    key: [header:x-tenant]
    tiers: [{{ limit: 2, period: 5s }}]
  - id: shaped
    match: {{ path: \"/v1/shaped/**\" }}
    key: [header:x-tenant]
    algorithm: leaky_bucket(shaper)
    tiers: [{{ limit: 1, period: 10s, burst: 1 }}]
",
        redis.url()
    )
}

async fn check(server: &str, path: &str, tenant: &str, cost: u64) -> (u16, Value) {
    let body = json!({ "request": { "method": "GET", "path": path, "headers": { "x-tenant": tenant } }, "cost": cost });
    let answer = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// Waits for the next 5 s window of the `api` rule to begin.
async fn window_begins() {
    let window = std::time::Duration::from_secs(5);
    support::clear_of_a_windows_turn(window, window).await;
}

/// The calls of Redis functions and scripts so far.
fn redis_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
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

#[tokio::test]
async fn a_flooding_key_is_answered_here_until_its_retry_after() {
    let redis = Redis::start();
    let server = Server::start(
        &[("rules.yaml", &rules(&redis, ""))],
        &["--admin-token", TOKEN],
    );
    let http = &server.http;
    // What follows (about a second) happens within one 5 s window.
    window_begins().await;
    assert_eq!(check(http, "/v1/api/x", "flood", 1).await.0, 200);
    assert_eq!(check(http, "/v1/api/x", "flood", 1).await.0, 200);
    let (status, first) = check(http, "/v1/api/x", "flood", 1).await;
    assert_eq!(status, 429);
    assert_eq!(first["decisions"][0]["source"], "redis", "{first}");
    let first_wait = first["decisions"][0]["retry_after_ms"].as_u64().unwrap();

    let before = redis_calls(&redis);
    let mut last_wait = first_wait;
    for cost in [1, 2, 1, 2, 1].into_iter().cycle().take(50) {
        let (status, answer) = check(http, "/v1/api/x", "flood", cost).await;
        assert_eq!(status, 429, "{answer}");
        let decision = &answer["decisions"][0];
        assert_eq!(decision["source"], "cache", "{answer}");
        let wait = decision["retry_after_ms"].as_u64().unwrap();
        assert!(
            wait <= last_wait,
            "the wait shrinks: {wait} after {last_wait}"
        );
        last_wait = wait;
    }
    // The service's once-a-second sweep of expired reservations is a function call too.
    let calls = redis_calls(&redis) - before;
    assert!(calls <= 2, "50 denied checks, {calls} calls to Redis");

    // A smaller cost (a look) could succeed: it asks Redis. Other tenants ask Redis too.
    let (status, look) = check(http, "/v1/api/x", "flood", 0).await;
    assert_eq!(
        (status, &look["decisions"][0]["source"]),
        (200, &json!("redis")),
        "{look}"
    );
    assert_eq!(check(http, "/v1/api/x", "calm", 1).await.0, 200);
    let calls = redis_calls(&redis) - before;
    assert!((2..=4).contains(&calls), "{calls}");

    // A shaper's denial is a wait the caller may shorten: never cached.
    assert_eq!(check(http, "/v1/shaped/x", "flood", 1).await.0, 200);
    for _ in 0..3 {
        let (_, shaped) = check(http, "/v1/shaped/x", "flood", 1).await;
        assert_ne!(shaped["decisions"][0]["source"], "cache", "{shaped}");
    }

    // A reset forgets the cached denials: the next check asks Redis and is admitted.
    let reset = reqwest::Client::new()
        .post(format!("{http}/v1/console/rules/api/reset"))
        .bearer_auth(TOKEN)
        .json(&json!({ "key": "5:flood" }))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 204);
    let (status, again) = check(http, "/v1/api/x", "flood", 1).await;
    assert_eq!(
        (status, &again["decisions"][0]["source"]),
        (200, &json!("redis")),
        "{again}"
    );

    // Past its retry_after, a denied key is admitted again.
    check(http, "/v1/api/x", "flood", 1).await;
    let (status, denied) = check(http, "/v1/api/x", "flood", 1).await;
    assert_eq!(status, 429, "{denied}");
    eventually("the window turns", || async {
        check(http, "/v1/api/x", "flood", 1).await.0 == 200
    })
    .await;
    let metrics = support::metrics(http).await;
    let answered: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_denied_cache_total{rule=\"api\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(answered >= 50, "{answered}");
}

#[tokio::test]
async fn without_the_cache_every_denial_asks_redis() {
    let redis = Redis::start();
    let off = "server: { denied_cache_bytes: 0 }\n";
    let server = Server::start(&[("rules.yaml", &rules(&redis, off))], &[]);
    window_begins().await;
    for _ in 0..2 {
        assert_eq!(check(&server.http, "/v1/api/x", "flood", 1).await.0, 200);
    }
    let before = redis_calls(&redis);
    for _ in 0..10 {
        let (status, answer) = check(&server.http, "/v1/api/x", "flood", 1).await;
        assert_eq!(
            (status, &answer["decisions"][0]["source"]),
            (429, &json!("redis"))
        );
    }
    assert!(redis_calls(&redis) >= before + 10);
}
