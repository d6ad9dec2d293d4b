//! A tenant's plan at run time, through the real server. Overrides: set for a key or a
//! pattern, counted apart from the rule's own counter, expiring, surviving reloads and
//! restarts (in `server.overrides_file` on the memory store, in Redis on a Redis store, where
//! a second instance applies an edit within a second). Limits stated by the check, for the
//! rules that take them. Bad input refused with nothing changed.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Redis, Server, eventually};

const TOKEN: &str = "secret";

/// A plan of 1,000 a day per tenant: a fixed window, whose count an override's edit keeps
/// (a day long, so that a test crosses its boundary once in tens of thousands of runs).
fn rules(store: &str) -> String {
    format!(
        "{store}rules:\n  - id: plan\n    match: {{ path: \"/v1/**\" }}\n    key: [header:x-tenant]\n    algorithm: fixed_window\n    tiers: [{{ limit: 1000, period: 1d }}]\n"
    )
}

/// A check of `tenant`'s request: its status and the plan's limit and remaining.
async fn check(server: &str, tenant: &str) -> (u16, Value, Value) {
    let body = json!({ "request": { "method": "GET", "path": "/v1/things", "headers": { "x-tenant": tenant } } });
    let answer = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    (
        status,
        body["decisions"][0]["limit"].clone(),
        body["decisions"][0]["remaining"].clone(),
    )
}

async fn call(
    server: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{server}/v1/overrides{path}"))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn put(server: &str, path: &str, body: Value) -> (u16, Value) {
    call(server, reqwest::Method::PUT, path, Some(body)).await
}

async fn a_plan_set_at_run_time_applies_to_its_keys(server: &str) {
    assert_eq!(check(server, "acme").await.1, 1000);
    let (status, body) = put(
        server,
        "/plan/acme",
        json!({"tiers": [{"limit": 3, "period": "1d"}]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["key"], "acme");
    // Counted apart from the rule's own counter: a fresh 3.
    for left in [2, 1, 0] {
        assert_eq!(check(server, "acme").await, (200, json!(3), json!(left)));
    }
    // Answered as the rule: its name in the decision, the fields and the metrics.
    let denied = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&json!({ "request": { "method": "GET", "path": "/v1/things", "headers": { "x-tenant": "acme" } } }))
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["ratelimit-policy"], "\"plan\";q=3;w=86400");
    let denied: Value = denied.json().await.unwrap();
    assert_eq!(denied["decisions"][0]["rule"], "plan");
    let metrics = reqwest::get(format!("{server}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tollgate_decisions_total{rule=\"plan\",outcome=\"denied\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("/o:"),
        "one series per rule, whatever the overrides"
    );
    // Others keep the rule's plan.
    assert_eq!(check(server, "zeta").await.1, 1000);
    // A pattern, and the most specific wins over it.
    let (status, _) = put(
        server,
        "/plan/beta-%2A",
        json!({"tiers": [{"limit": 7, "period": "1m"}]}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(check(server, "beta-eu").await.1, 7);
    assert_eq!(check(server, "beta-us").await.1, 7);
    assert_eq!(check(server, "betamax").await.1, 1000);
    // Raised: the tenant keeps its count (3 of 3 used) and gets the difference.
    let (status, _) = put(
        server,
        "/plan/acme",
        json!({"tiers": [{"limit": 5, "period": "1d"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(check(server, "acme").await, (200, json!(5), json!(1)));
    let (status, listed) = call(server, reqwest::Method::GET, "", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 2, "{listed}");
    let (status, one) = call(server, reqwest::Method::GET, "/plan/beta-%2A", None).await;
    assert_eq!((status, &one["tiers"][0]["limit"]), (200, &json!(7)));
}

async fn bad_overrides_change_nothing(server: &str) {
    let cases = [
        ("/plan/gamma", json!({"tiers": []}), 422),
        (
            "/plan/gamma",
            json!({"tiers": [{"limit": 0, "period": "1h"}]}),
            422,
        ),
        (
            "/plan/gamma",
            json!({"tiers": [{"limit": 5, "period": "1h", "burst": 9}]}),
            422,
        ),
        (
            "/nope/gamma",
            json!({"tiers": [{"limit": 5, "period": "1h"}]}),
            422,
        ),
        (
            "/plan/gamma",
            json!({"tiers": [{"limit": 5, "period": "1h"}], "expires": "soon"}),
            422,
        ),
        ("/plan/gamma", json!({"limits": 5}), 422),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = put(server, path, body.clone()).await;
        assert_eq!(status, expected, "{path} {body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    assert_eq!(check(server, "gamma").await.1, 1000, "nothing changed");
    let unauthorized = reqwest::Client::new()
        .put(format!("{server}/v1/overrides/plan/gamma"))
        .json(&json!({"tiers": [{"limit": 5, "period": "1h"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    assert_eq!(
        call(server, reqwest::Method::DELETE, "/plan/gamma", None)
            .await
            .0,
        404
    );
}

async fn an_override_expires(server: &str) {
    let (status, body) = put(
        server,
        "/plan/delta",
        json!({"tiers": [{"limit": 2, "period": "1h"}], "expires": "1s"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert!(body["expires_at"].as_u64().is_some());
    assert_eq!(check(server, "delta").await.1, 2);
    eventually("the override expires", || async {
        check(server, "delta").await.1 == 1000
    })
    .await;
}

#[tokio::test]
async fn overrides_on_the_memory_store_outlive_reloads_and_restarts() {
    let kept = tempfile::tempdir().unwrap();
    let file = kept.path().join("overrides.json");
    let store = format!("server: {{ overrides_file: \"{}\" }}\n", file.display());
    let rules = rules(&store);
    let server = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    a_plan_set_at_run_time_applies_to_its_keys(&server.http).await;
    bad_overrides_change_nothing(&server.http).await;
    an_override_expires(&server.http).await;
    // A reload keeps them.
    support::signal(server.pid(), "HUP");
    server.wait_for_log("rules reloaded", Duration::from_secs(10));
    assert_eq!(check(&server.http, "beta-eu").await.1, 7);
    // So does a restart, from the file.
    assert!(server.terminate());
    let next = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    assert_eq!(check(&next.http, "beta-eu").await.1, 7);
    assert_eq!(check(&next.http, "acme").await.1, 5);
    assert_eq!(
        call(&next.http, reqwest::Method::DELETE, "/plan/acme", None)
            .await
            .0,
        204
    );
    assert_eq!(check(&next.http, "acme").await.1, 1000);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(
        written
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["key"] != "acme"),
        "{written}"
    );
}

#[tokio::test]
async fn overrides_on_redis_reach_every_instance_and_outlive_them() {
    let redis = Redis::start();
    let rules = rules(&format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n",
        redis.url()
    ));
    let first = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    let second = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    a_plan_set_at_run_time_applies_to_its_keys(&first.http).await;
    bad_overrides_change_nothing(&first.http).await;
    eventually("the second instance applies them", || async {
        check(&second.http, "beta-eu").await.1 == 7
    })
    .await;
    // One counter for both: 4 of acme's 5 were used through the first.
    assert_eq!(check(&second.http, "acme").await, (200, json!(5), json!(0)));
    assert_eq!(check(&second.http, "acme").await.0, 429);
    drop((first, second));
    let third = Server::start(&[("rules.yaml", &rules)], &["--admin-token", TOKEN]);
    assert_eq!(check(&third.http, "beta-us").await.1, 7, "kept in Redis");
}

const STATED: &str = "rules:
  - id: tokens
    match: { path: \"/v1/chat/**\" }
    key: [header:x-tenant]
    algorithm: token_bucket
    tiers: [{ limit: 1000, period: 1h }]
    caller_limit: true
  - id: ips
    match: { path: \"/v1/**\" }
    key: [header:x-ip]
    algorithm: token_bucket
    tiers: [{ limit: 1000, period: 1h }]
";

/// A check of `path` by `tenant` stating `limit`: status, and each decision's rule, limit
/// and remaining.
async fn stated(server: &str, path: &str, tenant: &str, limit: Option<Value>) -> (u16, Value) {
    let mut body = json!({ "request": { "method": "POST", "path": path, "headers": { "x-tenant": tenant, "x-ip": tenant } } });
    if let Some(limit) = limit {
        body["limit"] = limit;
    }
    let answer = reqwest::Client::new()
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    let decisions = body["decisions"].as_array().map(|all| {
        all.iter()
            .map(|d| json!([d["rule"], d["limit"], d["remaining"]]))
            .collect::<Vec<_>>()
    });
    (status, decisions.map_or(body, Value::from))
}

#[tokio::test]
async fn a_limit_stated_by_the_check_applies_where_the_rule_takes_one() {
    let server = Server::start(&[("rules.yaml", STATED)], &["--admin-token", TOKEN]);
    let server = &server.http;
    let plan = json!({"limit": 3, "period": "1h"});
    // The rule that takes one applies it; the other keeps its own.
    for left in [2, 1, 0] {
        let (status, decisions) =
            stated(server, "/v1/chat/completions", "acme", Some(plan.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(decisions[0], json!(["tokens", 3, left]));
        assert_eq!(decisions[1][0], "ips");
        assert_eq!(decisions[1][1], 1000);
    }
    assert_eq!(
        stated(server, "/v1/chat/completions", "acme", Some(plan.clone()))
            .await
            .0,
        429
    );
    // Each distinct limit counted apart (as Envoy keys a stated limit's counter by its value);
    // without one, the rule's own tiers.
    let (_, decisions) = stated(
        server,
        "/v1/chat/completions",
        "acme",
        Some(json!({"limit": 5, "period": "1h"})),
    )
    .await;
    assert_eq!(decisions[0], json!(["tokens", 5, 4]));
    let (_, decisions) = stated(server, "/v1/chat/completions", "acme", None).await;
    assert_eq!(decisions[0], json!(["tokens", 1000, 999]));
    // Refused where no rule takes one, and nothing counted.
    let before = stated(server, "/v1/other", "beta", None).await.1[0].clone();
    assert_eq!(before, json!(["ips", 1000, 999]));
    let (status, refused) = stated(server, "/v1/other", "beta", Some(plan.clone())).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("caller_limit"),
        "{refused}"
    );
    assert_eq!(
        stated(server, "/v1/other", "beta", None).await.1[0],
        json!(["ips", 1000, 998])
    );
    // A limit the algorithm cannot take, or not a limit: refused, nothing counted.
    for (bad, expected) in [
        (json!({"limit": 0, "period": "1h"}), 400),
        (json!({"limit": 5, "period": "soon"}), 422),
        (json!({"limit": 5}), 422),
        (json!(5), 422),
    ] {
        let (status, refused) =
            stated(server, "/v1/chat/completions", "gamma", Some(bad.clone())).await;
        assert_eq!(status, expected, "{bad}: {refused}");
    }
    let (_, decisions) = stated(server, "/v1/chat/completions", "gamma", None).await;
    assert_eq!(decisions[0], json!(["tokens", 1000, 999]));
    // An operator's override wins over a stated limit.
    let (status, _) = put(
        server,
        "/tokens/delta",
        json!({"tiers": [{"limit": 2, "period": "1h"}]}),
    )
    .await;
    assert_eq!(status, 201);
    let (_, decisions) = stated(server, "/v1/chat/completions", "delta", Some(plan.clone())).await;
    assert_eq!(decisions[0], json!(["tokens", 2, 1]), "{decisions}");
    // Reports and reservations take it too.
    let report = reqwest::Client::new()
        .post(format!("{server}/v1/report"))
        .json(&json!({"rule": "tokens", "key": "epsilon", "cost": 4, "limit": plan}))
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), 200);
    let report: Value = report.json().await.unwrap();
    assert_eq!(
        (&report["allowed"], &report["decisions"][0]["limit"]),
        (&json!(false), &json!(3)),
        "{report}"
    );
    // Many distinct limits at once: each made once, every one counted apart.
    let checks = (0..20u64).map(|i| async move {
        let limit = json!({"limit": 100 + i % 5, "period": "1h"});
        stated(server, "/v1/chat/completions", "zeta", Some(limit)).await
    });
    let answers = futures_util::future::join_all(checks).await;
    assert!(answers.iter().all(|(status, _)| *status == 200));
    for i in 0..5u64 {
        let limit = json!({"limit": 100 + i, "period": "1h"});
        let (_, decisions) = stated(server, "/v1/chat/completions", "zeta", Some(limit)).await;
        assert_eq!(decisions[0], json!(["tokens", 100 + i, 100 + i - 5]));
    }
}
