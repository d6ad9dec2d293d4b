//! Concurrency rules through the real server: a check holds slots under a permit, released
//! or extended by it, or freed when its lease ends; bad input refused with nothing changed;
//! four processes on one Redis never hold more slots than the limit, checked from Redis's own
//! state while 200 callers compete.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Redis, Server, eventually, header};

/// At most 2 exports running per tenant, each slot leased for 2 s; and a rate rule beside it
/// on the same requests, which a release never gives back.
const RULES: &str = r#"
rules:
  - id: exports
    match: { path: "/v1/exports/**" }
    key: [header:x-tenant]
    algorithm: concurrency
    tiers: [{ limit: 2, period: 2s }]
  - id: export-rate
    match: { path: "/v1/exports/**" }
    key: [header:x-tenant]
    tiers: [{ limit: 100, period: 1h }]
"#;

async fn post(server: &str, path: &str, body: Value) -> (u16, Value, Option<String>) {
    let answer = reqwest::Client::new()
        .post(format!("{server}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let permit = header(answer.headers(), "tollgate-permit").map(str::to_string);
    (status, answer.json().await.unwrap_or(Value::Null), permit)
}

fn export(tenant: &str) -> Value {
    json!({ "request": { "method": "POST", "path": "/v1/exports/csv", "headers": { "x-tenant": tenant } } })
}

async fn slots_are_held_released_and_extended(server: &str) {
    let (status, first, header) = post(server, "/v1/check", export("acme")).await;
    assert_eq!(status, 200, "{first}");
    let permit = first["permit"].as_str().expect("a permit").to_string();
    assert_eq!(permit.len(), 32);
    assert_eq!(header.as_deref(), Some(permit.as_str()));
    let lasts = first["permit_expires_in_ms"].as_u64().unwrap();
    assert!((1_000..=2_000).contains(&lasts), "{first}");
    let (status, second, _) = post(server, "/v1/check", export("acme")).await;
    assert_eq!(status, 200, "{second}");
    // Both slots held: the third waits for one, and took nothing from the rate rule.
    let (status, third, header) = post(server, "/v1/check", export("acme")).await;
    assert_eq!(status, 429, "{third}");
    assert!(third.get("permit").is_none() && header.is_none(), "{third}");
    let exports = &third["decisions"][0];
    assert_eq!(
        (exports["remaining"].as_u64(), exports["limit"].as_u64()),
        (Some(0), Some(2))
    );
    assert!(
        exports["retry_after_ms"].as_u64().unwrap() <= 2_000,
        "{third}"
    );
    // Another tenant has its own slots.
    assert_eq!(post(server, "/v1/check", export("other")).await.0, 200);

    let (status, renewed, _) = post(server, "/v1/extend", json!({ "permit": permit })).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["permit"], permit.as_str());
    assert!(
        renewed["expires_in_ms"].as_u64().unwrap() >= 1_000,
        "{renewed}"
    );

    let (status, released, _) = post(server, "/v1/release", json!({ "permit": permit })).await;
    assert_eq!(status, 200, "{released}");
    assert_eq!(released["decisions"][0]["remaining"], 1, "{released}");
    // Released once: a second release, and an extension, find nothing.
    let (status, again, _) = post(server, "/v1/release", json!({ "permit": permit })).await;
    assert_eq!(status, 404, "{again}");
    assert!(
        again["error"].as_str().unwrap().contains("no permit"),
        "{again}"
    );
    assert_eq!(
        post(server, "/v1/extend", json!({ "permit": permit }))
            .await
            .0,
        404
    );
    // The freed slot is taken again; the rate rule counts the three checks admitted (the
    // denied one took nothing), and a release gave back none of them.
    let (status, fourth, _) = post(server, "/v1/check", export("acme")).await;
    assert_eq!(status, 200, "{fourth}");
    assert_eq!(fourth["decisions"][1]["remaining"], 97, "{fourth}");
}

async fn bad_permits_change_nothing(server: &str) {
    let before = post(server, "/v1/check", export("bad")).await;
    assert_eq!(before.0, 200);
    for (body, status) in [
        (json!({ "permit": "0123456789abcdef0123456789abcdef" }), 404),
        (json!({ "permit": "not hex at all" }), 404),
        (json!({ "permit": 7 }), 422),
        (json!({ "id": "x" }), 422),
        (json!({}), 422),
    ] {
        for path in ["/v1/release", "/v1/extend"] {
            let (got, answer, _) = post(server, path, body.clone()).await;
            assert_eq!(got, status, "{path} {body}: {answer}");
            assert!(answer["error"].is_string(), "{answer}");
        }
    }
    // The one slot taken above is still held; the other is free.
    let (_, look, _) = post(server, "/v1/check", export("bad")).await;
    assert_eq!(look["decisions"][0]["remaining"], 0, "{look}");
}

/// A holder that never releases (a crashed one): its slots free themselves when their lease
/// ends, and the permit is unknown from then on.
async fn a_lost_holders_slots_come_back_after_the_lease(server: &str) {
    let (_, held, _) = post(server, "/v1/check", export("lost")).await;
    let permit = held["permit"].as_str().unwrap().to_string();
    assert_eq!(post(server, "/v1/check", export("lost")).await.0, 200);
    let (status, full, _) = post(server, "/v1/check", export("lost")).await;
    assert_eq!(status, 429, "{full}");
    eventually("the lost holder's slots free themselves", || async {
        post(server, "/v1/check", export("lost")).await.0 == 200
    })
    .await;
    assert_eq!(
        post(server, "/v1/release", json!({ "permit": permit }))
            .await
            .0,
        404
    );
}

/// The console shows a concurrency rule's keys by their slots in use.
async fn the_console_shows_slots_in_use(server: &str) {
    let (_, held, _) = post(server, "/v1/check", export("console")).await;
    assert!(held["permit"].is_string(), "{held}");
    let answer = reqwest::Client::new()
        .get(format!("{server}/v1/console/rules/exports"))
        .bearer_auth("secret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let view: Value = answer.json().await.unwrap();
    let hot = view["hot"]["hits"].as_array().unwrap();
    let key = hot
        .iter()
        .find(|k| k["display"] == "console")
        .expect("the key");
    assert_eq!(
        (&key["in_use"], &key["limit"]),
        (&json!(1), &json!(2)),
        "{view}"
    );
    // Neither the console nor a look (cost 0) took a slot or made a permit.
    let mut look = export("console");
    look["cost"] = json!(0);
    let (status, look, permit) = post(server, "/v1/check", look).await;
    assert_eq!(status, 200, "{look}");
    assert_eq!(look["decisions"][0]["remaining"], 1, "{look}");
    assert!(look.get("permit").is_none() && permit.is_none(), "{look}");
}

#[tokio::test]
async fn concurrency_on_the_memory_store() {
    let server = Server::start(&[("rules.yaml", RULES)], &["--admin-token", "secret-token"]);
    the_console_shows_slots_in_use(&server.http).await;
    slots_are_held_released_and_extended(&server.http).await;
    bad_permits_change_nothing(&server.http).await;
    a_lost_holders_slots_come_back_after_the_lease(&server.http).await;
    let metrics = support::metrics(&server.http).await;
    for event in ["held", "released", "extended"] {
        let series = format!("tollgate_permits_total{{event=\"{event}\"}}");
        assert!(metrics.contains(&series), "{series}: {metrics}");
    }
}

#[tokio::test]
async fn concurrency_on_redis() {
    let redis = Redis::start();
    let rules = format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n{RULES}",
        redis.url()
    );
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    slots_are_held_released_and_extended(&server.http).await;
    bad_permits_change_nothing(&server.http).await;
    a_lost_holders_slots_come_back_after_the_lease(&server.http).await;
}

/// Slots held on the Redis at `port` for keys of rule `exports`, by its own clock and state.
fn held_in_redis(port: u16) -> u64 {
    const COUNT: &str = "local n, t = 0, redis.call('TIME') \
        local now = t[1] * 1000000 + t[2] \
        for _, key in ipairs(redis.call('KEYS', 'tg:exports:*')) do \
          local v = redis.call('GET', key) \
          for i = 1, #v / 8 do \
            if struct.unpack('<d', v, 8 * (i - 1) + 1) > now then n = n + 1 end \
          end \
        end \
        return n";
    let out = std::process::Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "EVAL",
            COUNT,
            "0",
        ])
        .output()
        .expect("redis-cli is installed");
    let out = String::from_utf8_lossy(&out.stdout);
    out.trim().parse().unwrap_or_else(|_| panic!("{out}"))
}

/// Four processes on one Redis, 200 callers spread over them against 5 slots: Redis never
/// holds more than 5, checked from its own state while they run, and every caller gets its
/// turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_processes_never_hold_more_than_the_limit() {
    const LIMIT: u64 = 5;
    let redis = Redis::start();
    let rules = format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n\
         rules:\n  - id: exports\n    key: [text:one]\n    algorithm: concurrency\n    \
         tiers: [{{ limit: {LIMIT}, period: 30s }}]\n",
        redis.url()
    );
    let servers: Vec<Server> = (0..4)
        .map(|_| Server::start(&[("rules.yaml", &rules)], &[]))
        .collect();
    let urls: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.http.clone()).collect());
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let mut callers = Vec::new();
    for caller in 0..200 {
        let (urls, running, most, done, client) = (
            urls.clone(),
            running.clone(),
            most.clone(),
            done.clone(),
            client.clone(),
        );
        callers.push(tokio::spawn(async move {
            let url = &urls[caller % urls.len()];
            let body = json!({ "rule": "exports", "key": "any" });
            for _ in 0..2_000 {
                let answer = client
                    .post(format!("{url}/v1/check"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                if answer.status() == 429 {
                    tokio::time::sleep(Duration::from_millis(5 + (caller as u64 % 7))).await;
                    continue;
                }
                assert_eq!(answer.status(), 200);
                let held: Value = answer.json().await.unwrap();
                // Counted from admission to release: never more than the slots held.
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                let permit = held["permit"].as_str().unwrap();
                let released = client
                    .post(format!("{url}/v1/release"))
                    .json(&json!({ "permit": permit }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(released.status(), 200);
                done.fetch_add(1, Ordering::SeqCst);
                return;
            }
            panic!("caller {caller} never got a slot");
        }));
    }
    let mut seen_in_redis = 0;
    let mut samples = 0;
    while done.load(Ordering::SeqCst) < 200 && samples < 2_000 {
        let held = tokio::task::spawn_blocking({
            let port = redis.port;
            move || held_in_redis(port)
        })
        .await
        .unwrap();
        assert!(held <= LIMIT, "Redis holds {held} slots of {LIMIT}");
        seen_in_redis = seen_in_redis.max(held);
        samples += 1;
    }
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 200);
    assert!(most.load(Ordering::SeqCst) <= LIMIT);
    assert!(
        seen_in_redis >= 2,
        "the sampler saw the slots in use: {seen_in_redis}"
    );
    assert_eq!(held_in_redis(redis.port), 0, "every slot released");
}

/// On a Redis Cluster: a key's slots live in one key, so held, released and extended as on one
/// server; the permit's record lives in its own slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_on_a_cluster() {
    let cluster = support::Cluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
    let rules = format!(
        "store: {{ kind: redis, cluster: [{}], timeout: 2s }}\n{RULES}",
        nodes.join(", ")
    );
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    slots_are_held_released_and_extended(&server.http).await;
    bad_permits_change_nothing(&server.http).await;
    a_lost_holders_slots_come_back_after_the_lease(&server.http).await;
}
