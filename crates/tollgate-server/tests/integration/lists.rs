//! Allow and deny lists and bans through the real server: checked before the rules, edited
//! through the admin API (audited), expiring, kept across restarts (a file on the memory
//! store, Redis otherwise) and shared by instances on one Redis within a second; bad edits
//! refused with nothing changed.

use crate::support;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use support::{Redis, Server, eventually};

const TOKEN: &str = "lists-token";

/// Two checks a second per tenant, and a key that exceeds it banned for 3 s; a second rule on
/// the same requests with no ban.
const RULES: &str = r#"
rules:
  - id: api
    match: { path: "/v1/api/**" }
    key: [header:x-tenant]
    tiers: [{ limit: 2, period: 1s }]
    ban: 3s
  - id: daily
    match: { path: "/v1/api/**" }
    key: [header:x-tenant]
    tiers: [{ limit: 1000, period: 1d }]
"#;

async fn check(server: &str, tenant: &str) -> (u16, Value) {
    let body = json!({ "request": { "method": "GET", "path": "/v1/api/items", "headers": { "x-tenant": tenant } } });
    let answer = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn edit(server: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{server}/v1/lists{path}"))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn entries(server: &str) -> Vec<Value> {
    let (status, body) = edit(server, Method::GET, "", None).await;
    assert_eq!(status, 200, "{body}");
    body["entries"].as_array().unwrap().clone()
}

/// What the daily rule counted for `tenant`, seen by a look (cost 0) at its request.
async fn counted(server: &str, tenant: &str) -> u64 {
    let body = json!({ "request": { "method": "GET", "path": "/v1/api/items", "headers": { "x-tenant": tenant } }, "cost": 0 });
    let answer: Value = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let decisions = answer["decisions"].as_array().unwrap();
    let daily = decisions.iter().find(|d| d["rule"] == "daily");
    1000 - daily.map_or(0, |d| d["remaining"].as_u64().unwrap())
}

/// Waits for the next second to begin: the `api` rule counts in windows of one second.
async fn fresh_second() {
    support::clear_of_a_windows_turn(Duration::from_secs(1), Duration::from_secs(1)).await;
}

async fn a_key_that_exceeds_a_rule_is_banned(server: &str) {
    fresh_second().await;
    assert_eq!(check(server, "greedy").await.0, 200);
    assert_eq!(check(server, "greedy").await.0, 200);
    let (status, over) = check(server, "greedy").await;
    assert_eq!(status, 429, "{over}");
    let api = &over["decisions"][0];
    assert_eq!(api["source"], "list", "{over}");
    let wait = api["retry_after_ms"].as_u64().unwrap();
    assert!((2_500..=3_000).contains(&wait), "the ban's end: {over}");
    let listed = entries(server).await;
    assert!(
        listed.iter().any(|e| e["list"] == "deny"
            && e["rule"] == "api"
            && e["key"] == "greedy"
            && e["reason"] == "ban"),
        "{listed:?}"
    );
    // The window has turned, the ban holds: refused before the rules, nothing counted.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let before = counted(server, "greedy").await;
    let (status, banned) = check(server, "greedy").await;
    assert_eq!(status, 429, "{banned}");
    assert_eq!(banned["decisions"][0]["source"], "list");
    assert_eq!(counted(server, "greedy").await, before);
    // Another tenant is not banned.
    assert_eq!(check(server, "modest").await.0, 200);
    eventually("the ban ends", || async {
        check(server, "greedy").await.0 == 200
    })
    .await;
}

async fn deny_and_allow_entries_come_before_the_rules(server: &str) {
    let (status, put) = edit(
        server,
        Method::PUT,
        "/deny/*/evil",
        Some(json!({ "status": 403, "reason": "scraping" })),
    )
    .await;
    assert_eq!(status, 201, "{put}");
    assert_eq!(put["reason"], "scraping");
    let (status, refused) = check(server, "evil").await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["decisions"][0]["source"], "list");
    // Every rule's check of the key is refused, a look included: only the deny decisions.
    assert_eq!(counted(server, "evil").await, 1000);
    assert_eq!(
        edit(server, Method::DELETE, "/deny/*/evil", None).await.0,
        204
    );
    assert_eq!(
        counted(server, "evil").await,
        0,
        "nothing was counted while denied"
    );
    assert_eq!(check(server, "evil").await.0, 200);

    assert_eq!(
        edit(server, Method::PUT, "/allow/api/vip", None).await.0,
        201
    );
    for _ in 0..5 {
        let (status, waved) = check(server, "vip").await;
        assert_eq!(status, 200, "{waved}");
        // Each rule's decision in the rules' order, the allowed one in its place.
        assert_eq!(waved["decisions"][1]["rule"], "daily", "{waved}");
        let api = waved["decisions"][0].clone();
        assert_eq!(api["rule"], "api", "{waved}");
        assert_eq!(
            (&api["source"], &api["remaining"]),
            (&json!("list"), &json!(2)),
            "{waved}"
        );
    }
    // Only the api rule is bypassed: the daily rule counted every check.
    assert_eq!(counted(server, "vip").await, 5);
    // A deny entry wins over an allow entry.
    assert_eq!(
        edit(
            server,
            Method::PUT,
            "/deny/api/vip",
            Some(json!({ "expires": "1s" }))
        )
        .await
        .0,
        201
    );
    assert_eq!(check(server, "vip").await.0, 429);
    eventually("the deny entry expires", || async {
        check(server, "vip").await.0 == 200
    })
    .await;
    assert_eq!(
        edit(server, Method::DELETE, "/allow/api/vip", None).await.0,
        204
    );
}

async fn bad_edits_change_nothing(server: &str) {
    let before = entries(server).await;
    for (method, path, body, status) in [
        (Method::PUT, "/grey/api/k", None, 404),
        (Method::PUT, "/deny/nope/k", None, 422),
        (
            Method::PUT,
            "/deny/api/k",
            Some(json!({ "status": 500 })),
            422,
        ),
        (
            Method::PUT,
            "/allow/api/k",
            Some(json!({ "status": 403 })),
            422,
        ),
        (
            Method::PUT,
            "/deny/api/k",
            Some(json!({ "expires": "soon" })),
            422,
        ),
        (
            Method::PUT,
            "/deny/api/k",
            Some(json!({ "expires": "0s" })),
            422,
        ),
        (
            Method::PUT,
            "/deny/api/k",
            Some(json!({ "until": "1h" })),
            422,
        ),
        (Method::DELETE, "/deny/api/never-listed", None, 404),
    ] {
        let (got, answer) = edit(server, method.clone(), path, body.clone()).await;
        assert_eq!(got, status, "{method} {path} {body:?}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    let unauthorized = reqwest::Client::new()
        .put(format!("{server}/v1/lists/deny/api/k"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    assert_eq!(entries(server).await, before);
}

async fn edits_are_audited(server: &str) {
    let audit: Value = reqwest::Client::new()
        .get(format!("{server}/v1/console/audit"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = audit.to_string();
    for action in ["deny list", "allow list", "delete deny list"] {
        assert!(text.contains(action), "{action}: {text}");
    }
}

#[tokio::test]
async fn lists_and_bans_on_the_memory_store_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lists.json");
    let rules = format!("server: {{ lists_file: \"{}\" }}\n{RULES}", file.display());
    let server = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    a_key_that_exceeds_a_rule_is_banned(&server.http).await;
    deny_and_allow_entries_come_before_the_rules(&server.http).await;
    bad_edits_change_nothing(&server.http).await;
    edits_are_audited(&server.http).await;
    let metrics = support::metrics(&server.http).await;
    for series in [
        "tollgate_list_decisions_total{list=\"deny\",rule=\"api\"}",
        "tollgate_list_decisions_total{list=\"allow\",rule=\"api\"}",
        "tollgate_bans_total{rule=\"api\",outcome=\"banned\"}",
        "tollgate_list_entries{list=\"deny\"}",
    ] {
        assert!(metrics.contains(series), "{series}: {metrics}");
    }
    let (status, _) = edit(
        &server.http,
        Method::PUT,
        "/deny/*/kept",
        Some(json!({ "reason": "abuse" })),
    )
    .await;
    assert_eq!(status, 201);
    assert!(server.terminate());
    let again = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    assert_eq!(
        check(&again.http, "kept").await.0,
        429,
        "kept across the restart"
    );
}

#[tokio::test]
async fn instances_on_one_redis_share_lists_and_bans() {
    let redis = Redis::start();
    let rules = format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n{RULES}",
        redis.url()
    );
    let a = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    let b = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    a_key_that_exceeds_a_rule_is_banned(&a.http).await;
    bad_edits_change_nothing(&a.http).await;
    // An entry made through one instance is applied by the other within a second.
    assert_eq!(
        edit(&a.http, Method::PUT, "/deny/api/shared", None).await.0,
        201
    );
    eventually("the other instance applies the entry", || async {
        check(&b.http, "shared").await.0 == 429
    })
    .await;
    // A ban made by one instance holds on the other, past the rule's window.
    fresh_second().await;
    for _ in 0..3 {
        check(&a.http, "roamer").await;
    }
    eventually("the other instance applies the ban", || async {
        let (status, body) = check(&b.http, "roamer").await;
        status == 429 && body["decisions"][0]["source"] == "list"
    })
    .await;
    assert_eq!(
        edit(&b.http, Method::DELETE, "/deny/api/shared", None)
            .await
            .0,
        204
    );
    eventually("the deletion reaches the first instance", || async {
        check(&a.http, "shared").await.0 == 200
    })
    .await;
    // Kept in Redis across a restart of every instance.
    assert_eq!(
        edit(&a.http, Method::PUT, "/deny/*/kept", None).await.0,
        201
    );
    drop((a, b));
    let c = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    assert_eq!(check(&c.http, "kept").await.0, 429);
}

/// On a Redis Cluster: the lists live in the admin rules' slot; bans and entries as on one
/// server, and a calendar day's quota counts there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_bans_and_calendar_days_on_a_cluster() {
    let cluster = support::Cluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
    let calendar = "  - id: day\n    match: { path: \"/v1/day/**\" }\n    key: [header:x-tenant]\n    time_zone: Europe/Paris\n    tiers: [{ limit: 3, period: day }]\n";
    let rules = format!(
        "store: {{ kind: redis, cluster: [{}], timeout: 2s }}\n{RULES}{calendar}",
        nodes.join(", ")
    );
    let server = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    a_key_that_exceeds_a_rule_is_banned(&server.http).await;
    deny_and_allow_entries_come_before_the_rules(&server.http).await;
    bad_edits_change_nothing(&server.http).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let body = json!({ "request": { "method": "GET", "path": "/v1/day/x", "headers": { "x-tenant": "acme" } } });
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/check", server.http))
            .json(&body)
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
        if answer.status() == 429 {
            let body: Value = answer.json().await.unwrap();
            let wait = body["decisions"][0]["retry_after_ms"].as_u64().unwrap();
            assert!(wait <= 25 * 3_600_000, "until midnight in Paris: {body}");
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}
