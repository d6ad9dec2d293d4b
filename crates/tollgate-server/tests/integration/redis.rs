//! Several `tollgate serve` processes on one Redis they share: the limit is global and exact in
//! strict mode, under concurrent requests to every process.

use crate::support;

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use support::{Redis, Server, admin, admin_ids, check, eventually, metrics};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_is_global_and_exact_across_processes() {
    let redis = Redis::start();
    let rules = format!(
        "store:\n  kind: redis\n  url: {}\n  mode: strict\n  timeout: 500ms\nrules:\n  - id: shared\n    key: [header:x-tenant]\n    algorithm: sliding_log\n    tiers: [{{ limit: 50, period: 1h }}]\n",
        redis.url()
    );
    let servers = [
        Server::start(&[("rules.yaml", &rules)], &[]),
        Server::start(&[("rules.yaml", &rules)], &[]),
        Server::start(&[("rules.yaml", &rules)], &[]),
    ];
    let client = reqwest::Client::new();
    let body =
        json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": "t" } } });
    let mut tasks = Vec::new();
    for server in &servers {
        for _ in 0..40 {
            let (client, url, body) = (client.clone(), server.http.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let (status, _, answer) = check(&client, &url, body).await;
                assert!(status == 200 || status == 429, "{status}: {answer}");
                // Redis decides; a denied key may be answered again from the instance's
                // cache of denials until its retry_after.
                let source = &answer["decisions"][0]["source"];
                assert!(
                    source == "redis" || (status == 429 && source == "cache"),
                    "{answer}"
                );
                status == 200
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += u32::from(task.await.unwrap());
    }
    assert_eq!(admitted, 50);
    let ready = reqwest::get(format!("{}/readyz", servers[0].http))
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
}

/// A server with the admin token `tok` on `redis`, with one rule `base` (GET /base, `limit`
/// an hour).
fn admin_server(redis: &Redis, limit: u64) -> Server {
    let rules = format!(
        "store:\n  kind: redis\n  url: {}\n  timeout: 500ms\nrules:\n  - id: base\n    match: {{ path: /base }}\n    tiers: [{{ limit: {limit}, period: 1h }}]\n",
        redis.url()
    );
    Server::start(&[("rules.yaml", &rules)], &["--admin-token", "tok"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_edits_reach_every_instance_on_the_same_redis() {
    let redis = Redis::start();
    let (a, b) = (admin_server(&redis, 100), admin_server(&redis, 100));
    let client = reqwest::Client::new();
    let rule = json!({
        "id": "login",
        "match": { "path": "/login" },
        "key": ["client_ip"],
        "algorithm": "sliding_log",
        "tiers": [{ "limit": 3, "period": "1h" }]
    });
    let created = admin(&a.http, "tok", Method::PUT, "/login", Some(&rule)).await;
    assert_eq!(created.status().as_u16(), 201);
    // The other instance picks it up within its poll.
    let login =
        json!({ "request": { "method": "POST", "path": "/login", "client_ip": "10.1.1.1" } });
    eventually("b sees the rule", || async {
        let (_, _, body) = check(&client, &b.http, login.clone()).await;
        body["decisions"][0]["rule"] == "login"
    })
    .await;
    // One rule, one shared count: 3 in all across both (b used one above).
    let statuses = [
        check(&client, &a.http, login.clone()).await.0,
        check(&client, &b.http, login.clone()).await.0,
        check(&client, &a.http, login.clone()).await.0,
    ];
    assert_eq!(statuses, [200, 200, 429]);
    // A deletion through b reaches a.
    let deleted = admin(&b.http, "tok", Method::DELETE, "/login", None).await;
    assert_eq!(deleted.status().as_u16(), 204);
    eventually("a drops the rule", || async {
        let (status, _, body) = check(&client, &a.http, login.clone()).await;
        status == 200 && body["decisions"].as_array().unwrap().is_empty()
    })
    .await;
    // A new instance starts with the shared rules.
    let c = admin_server(&redis, 100);
    assert_eq!(admin_ids(&c.http, "tok").await, ["base"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_edit_redis_cannot_take_changes_nothing() {
    let redis = Redis::start();
    let rules = format!(
        "store:\n  kind: redis\n  url: {}\n  timeout: 100ms\nrules:\n  - id: base\n    tiers: [{{ limit: 100, period: 1h }}]\n",
        redis.url()
    );
    let server = Server::start(&[("rules.yaml", &rules)], &["--admin-token", "tok"]);
    drop(redis);
    let client = reqwest::Client::new();
    let rule = json!({ "id": "new", "tiers": [{ "limit": 1, "period": "1h" }] });
    let refused = admin(&server.http, "tok", Method::PUT, "/new", Some(&rule)).await;
    assert_eq!(refused.status().as_u16(), 503);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("shared rules could not be written")
    );
    assert_eq!(admin_ids(&server.http, "tok").await, ["base"]);
    // Checks go on under the rule's failure policy (open by default).
    let (status, _, body) =
        check(&client, &server.http, json!({ "rule": "base", "key": "k" })).await;
    assert_eq!(status, 200);
    assert_eq!(body["decisions"][0]["source"], "fail_open");
}

/// Every window counter Redis holds under `pattern` (not the lessees and claims beside them),
/// with its value read as an integer.
fn counters(port: u16, pattern: &str) -> Vec<i64> {
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    cli(&["--scan", "--pattern", pattern])
        .lines()
        .filter(|k| !k.is_empty() && !k.ends_with(":lessees") && !k.ends_with(":claims"))
        .map(|k| cli(&["get", k]).trim().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_returns_unused_leases_and_pushes_hybrid_counts() {
    let redis = Redis::start();
    let client = reqwest::Client::new();
    for (mode, rule) in [("lease", "leased"), ("hybrid", "synced")] {
        let rules = format!(
            "store:\n  kind: redis\n  url: {}\n  mode: {mode}\n  sync_interval: 1h\n  timeout: 2s\nrules:\n  - id: {rule}\n    key: [header:x-tenant]\n    tiers: [{{ limit: 1000, period: 1d }}]\n",
            redis.url()
        );
        // A timeout of seconds: the first lease connects and loads the library, which on a
        // busy machine takes longer than the default 20 ms, and this test is about shutdown.
        let server = Server::start(&[("rules.yaml", &rules)], &[]);
        let body =
            json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": "t" } } });
        for _ in 0..7 {
            let (status, _, answer) = check(&client, &server.http, body.clone()).await;
            assert_eq!(status, 200, "{answer}");
            assert_eq!(answer["decisions"][0]["source"], mode);
        }
        assert!(server.terminate(), "{mode}: a clean exit");
        // What Redis counts is what was admitted: leases not spent went back, and the hybrid
        // store's unsynced count (its sync is an hour away) was pushed on the way out.
        assert_eq!(
            counters(redis.port, &format!("tg:c:{rule}:*")),
            [7],
            "{mode}"
        );
    }
}

/// The sum of the samples of `name` in a `/metrics` text.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_redis_shows_in_metrics_and_readiness() {
    let redis = Redis::start();
    let rules = format!(
        "store:\n  kind: redis\n  url: {}\n  timeout: 200ms\nrules:\n  - id: r\n    key: [header:x-tenant]\n    tiers: [{{ limit: 10, period: 1m }}]\n",
        redis.url()
    );
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    let client = reqwest::Client::new();
    let body =
        json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": "t" } } });
    eventually("Redis decides", || async {
        check(&client, &server.http, body.clone()).await.2["decisions"][0]["source"] == "redis"
    })
    .await;
    let before = metrics(&server.http).await;
    assert_eq!(sample(&before, "tollgate_fallback_active"), 0.0, "{before}");
    let errors_before = sample(&before, "tollgate_store_errors_total");
    let ready = |server: String| async move {
        let answer = reqwest::get(format!("{server}/readyz")).await.unwrap();
        answer.status().as_u16()
    };
    assert_eq!(ready(server.http.clone()).await, 200);

    drop(redis);
    // Failing open (the default policy) until the breaker opens after five failures.
    for _ in 0..6 {
        let (status, _, answer) = check(&client, &server.http, body.clone()).await;
        assert_eq!(
            (status, answer["decisions"][0]["source"].as_str()),
            (200, Some("fail_open"))
        );
    }
    let during = metrics(&server.http).await;
    assert_eq!(sample(&during, "tollgate_fallback_active"), 1.0, "{during}");
    assert!(
        sample(&during, "tollgate_store_errors_total") >= errors_before + 5.0,
        "{during}"
    );
    assert!(
        sample(&during, "tollgate_policy_decisions_total") >= 6.0,
        "{during}"
    );
    assert_eq!(ready(server.http.clone()).await, 503);
}

/// Three `tollgate serve` in hybrid mode with the default settings, 1000 per day, 5000 checks
/// over 64 connections spread across them from a cold start: within the limit plus each
/// instance's unclaimed permits (a hundredth of the limit each, before they hear of one
/// another), where they once admitted up to 2207.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_instances_stay_within_the_stated_bound() {
    support::clear_of_a_windows_turn(Duration::from_secs(86_400), Duration::from_secs(60)).await;
    let redis = Redis::start();
    let rules = format!(
        "store:\n  kind: redis\n  url: {}\n  mode: hybrid\nrules:\n  - id: daily\n    key: [header:x-tenant]\n    algorithm: fixed_window\n    tiers: [{{ limit: 1000, period: 1d }}]\n",
        redis.url()
    );
    let servers: Vec<Server> = (0..3)
        .map(|_| Server::start(&[("rules.yaml", &rules)], &[]))
        .collect();
    let client = reqwest::Client::new();
    let body =
        json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": "t" } } });
    let mut tasks = Vec::new();
    for connection in 0..64 {
        let url = servers[connection % 3].http.clone();
        let (client, body) = (client.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..5_000 / 64 + 1 {
                let (status, _, answer) = check(&client, &url, body.clone()).await;
                assert!(status == 200 || status == 429, "{status}: {answer}");
                assert_eq!(answer["decisions"][0]["source"], "hybrid");
                admitted += u32::from(status == 200);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    println!("admitted {admitted} of 1000");
    assert!((1_000..=1_000 + 3 * 10).contains(&admitted), "{admitted}");
}

/// Hybrid with `max_unclaimed: 0` (never over the limit), one instance, 3 a day: the first
/// check of a key waits for its claim instead of being denied with the budget untouched; the
/// fourth is denied with nothing remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_without_unclaimed_permits_denies_only_a_spent_budget() {
    support::clear_of_a_windows_turn(Duration::from_secs(86_400), Duration::from_secs(60)).await;
    let redis = Redis::start();
    let rules = format!(
        "store: {{ kind: redis, url: '{}', mode: hybrid, max_unclaimed: 0, timeout: 1s }}\nrules:\n  - id: daily\n    key: [header:x-tenant]\n    algorithm: fixed_window\n    tiers: [{{ limit: 3, period: 1d }}]\n",
        redis.url()
    );
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    let client = reqwest::Client::new();
    let body =
        json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": "t" } } });
    for (expected, remaining) in [(200, 2), (200, 1), (200, 0), (429, 0)] {
        let (status, _, answer) = check(&client, &server.http, body.clone()).await;
        assert_eq!(status, expected, "{answer}");
        assert_eq!(answer["decisions"][0]["remaining"], remaining, "{answer}");
    }
}

/// A Redis Cluster with a master down: `/readyz` stays ready and says which master fails and
/// how many slots the failure policies decide; `/metrics` says the same, node by node; both
/// clear once the master's replica has taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_cluster_outage_is_said_by_readiness_and_metrics() {
    let mut cluster = support::Cluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
    let file = format!(
        "store: {{ kind: redis, cluster: [{}], timeout: 100ms }}\nrules:\n  - id: api\n    key: [header:x-tenant]\n    on_failure: closed\n    tiers: [{{ limit: 1000000, period: 1h }}]\n",
        nodes.join(", ")
    );
    let server = Server::start(&[("cluster.yaml", &file)], &[]);
    let client = reqwest::Client::new();
    let ask = |tenant: String| {
        let body = serde_json::json!({"request": {"method": "GET", "path": "/x",
            "headers": {"x-tenant": tenant}}});
        support::check(&client, &server.http, body)
    };
    // Tenants on every master, each master answered once.
    for i in 0..60 {
        assert_eq!(ask(format!("t{i}")).await.0, 200);
    }
    let ready = || async {
        let answer = reqwest::get(format!("{}/readyz", server.http))
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    };
    assert_eq!(ready().await, (200, "ready\n".to_string()));
    let dead = cluster.masters()[0];
    cluster.kill(dead);
    // Checks of the dead master's tenants fail until its breaker opens.
    support::eventually("the dead master's breaker opens", || async {
        for i in 0..60 {
            ask(format!("t{i}")).await;
        }
        ready().await.1.contains("partly")
    })
    .await;
    let (status, text) = ready().await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains(&format!("1 of 3 Redis masters failing (127.0.0.1:{dead})")),
        "{text}"
    );
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains(&format!(
            "tollgate_redis_node_up{{node=\"127.0.0.1:{dead}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_fallback_active 1"));
    let failing = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_redis_slots_failing "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert!((5_000.0..6_000.0).contains(&failing), "{failing}");
    // The replica takes over: every check decided by Redis again.
    support::eventually("the replica takes over", || async {
        for i in 0..60 {
            ask(format!("t{i}")).await;
        }
        ready().await.1 == "ready\n"
    })
    .await;
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_redis_slots_failing 0"),
        "{metrics}"
    );
}

/// Reads the console's JSON API at `path` of `server` with the admin token `tok`.
async fn console(server: &str, path: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{server}/v1/console/{path}"))
        .bearer_auth("tok")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_console_shows_every_instance_on_the_same_redis() {
    let redis = Redis::start();
    let (a, b) = (admin_server(&redis, 1000), admin_server(&redis, 1000));
    let client = reqwest::Client::new();
    let base = json!({ "request": { "method": "GET", "path": "/base" } });
    for _ in 0..30 {
        assert_eq!(check(&client, &a.http, base.clone()).await.0, 200);
    }
    // b, which decided nothing, sees a and its decisions.
    eventually("b lists both instances, a with its rate", || async {
        let overview = console(&b.http, "overview").await;
        let instances = overview["instances"].as_array().unwrap().clone();
        instances.len() == 2
            && instances
                .iter()
                .any(|i| i["self"] == false && i["rate"].as_f64().unwrap() > 0.0)
    })
    .await;
    eventually("b counts a's decisions under the rule", || async {
        let listed = console(&b.http, "rules").await;
        listed["rules"][0]["id"] == "base" && listed["rules"][0]["all_instances_per_minute"] == 30
    })
    .await;
    // The store's health comes with Redis's round trip now.
    let overview = console(&b.http, "overview").await;
    assert_eq!(overview["store"]["kind"], "redis");
    assert!(overview["store"]["ping"]["us"].is_u64(), "{overview}");
    // An instance gone is dropped from the others' lists once its summary goes stale.
    assert!(a.terminate());
    eventually("a drops from b's list", || async {
        console(&b.http, "overview").await["instances"]
            .as_array()
            .unwrap()
            .len()
            == 1
    })
    .await;
}
