//! Metered work through the real server: reports past the limit, reservations committed
//! below and above their estimate, cancelled, expired; bad input refused with nothing
//! changed; on Redis, reservations that outlive the process that made them.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Redis, Server, eventually};

/// A budget of 1,000 tokens a day per tenant (a bucket: no window boundary for a test to
/// cross), its reservations living 2 s, consumed when they expire; and one whose expired
/// reservations are released.
const RULES: &str = r#"
rules:
  - id: tokens
    match: { path: "/v1/chat/**" }
    key: [header:x-tenant]
    algorithm: token_bucket
    tiers: [{ limit: 1000, period: 1d }]
    reservations: { ttl: 2s }
  - id: released
    match: { path: "/v1/batch/**" }
    key: [header:x-tenant]
    algorithm: token_bucket
    tiers: [{ limit: 100, period: 1h }]
    reservations: { ttl: 1s, on_expiry: released }
"#;

async fn post(server: &str, path: &str, body: Value) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .post(format!("{server}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

async fn delete(server: &str, path: &str) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .delete(format!("{server}{path}"))
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn chat(tenant: &str, cost: u64) -> Value {
    json!({ "request": { "method": "POST", "path": "/v1/chat/completions", "headers": { "x-tenant": tenant } }, "cost": cost })
}

/// What the tenant has left under `tokens`, looked at with a cost of 0.
async fn left(server: &str, tenant: &str) -> Value {
    let (_, body) = post(server, "/v1/check", chat(tenant, 0)).await;
    body["decisions"][0]["remaining"].clone()
}

/// The LLM gateway's pattern: a 1,000-token budget; an answer of 1,200 completes, and the
/// next request is refused until time pays the debt back.
async fn a_report_past_the_budget_refuses_the_next_request(server: &str) {
    let (status, body) = post(server, "/v1/check", chat("acme", 0)).await;
    assert_eq!((status, &body["allowed"]), (200, &json!(true)), "{body}");
    let (status, body) = post(server, "/v1/report", chat("acme", 1200)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["allowed"], false, "in debt: {body}");
    assert_eq!(body["decisions"][0]["remaining"], 0);
    assert!(body["decisions"][0]["retry_after_ms"].as_u64().unwrap() > 0);
    let (status, _) = post(server, "/v1/check", chat("acme", 0)).await;
    assert_eq!(status, 429, "the next request is refused");
    // Another tenant is untouched.
    assert_eq!(post(server, "/v1/check", chat("other", 0)).await.0, 200);
}

async fn reservations_settle_at_the_real_cost(server: &str) {
    let (status, reserved) = post(server, "/v1/reservations", chat("beta", 300)).await;
    assert_eq!(status, 200, "{reserved}");
    let id = reserved["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert!(reserved["expires_in_ms"].as_u64().unwrap() <= 2_000);
    assert_eq!(left(server, "beta").await, 700);
    // Used 120 of the 300 reserved: 180 come back.
    let (status, body) = post(
        server,
        &format!("/v1/reservations/{id}/commit"),
        json!({"cost": 120}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["remaining"], 880);
    // Settled once.
    let (status, body) = post(
        server,
        &format!("/v1/reservations/{id}/commit"),
        json!({"cost": 1}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains(&id));
    // Used more than reserved: the excess is taken.
    let (_, reserved) = post(server, "/v1/reservations", chat("beta", 100)).await;
    let id = reserved["id"].as_str().unwrap();
    let (_, body) = post(
        server,
        &format!("/v1/reservations/{id}/commit"),
        json!({"cost": 400}),
    )
    .await;
    assert_eq!(body["decisions"][0]["remaining"], 480);
    // Cancelled: everything comes back.
    let (_, reserved) = post(server, "/v1/reservations", chat("beta", 200)).await;
    let id = reserved["id"].as_str().unwrap();
    let (status, body) = delete(server, &format!("/v1/reservations/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["remaining"], 480);
    assert_eq!(
        delete(server, &format!("/v1/reservations/{id}")).await.0,
        404
    );
    // More than is left: refused as a check, nothing taken, no id.
    let (status, body) = post(server, "/v1/reservations", chat("beta", 481)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["id"], Value::Null);
    assert_eq!(left(server, "beta").await, 480);
}

async fn bad_metered_input_changes_nothing(server: &str) {
    let before = left(server, "gamma").await;
    let cases = [
        (
            "/v1/report",
            json!({"rule": "nope", "key": "k", "cost": 1}),
            400,
        ),
        (
            "/v1/report",
            json!({"rule": "tokens", "key": "k", "cost": -3}),
            422,
        ),
        (
            "/v1/report",
            json!({"rule": "tokens", "key": "k", "cost": 9_007_199_254_740_992u64}),
            400,
        ),
        (
            "/v1/report",
            json!({"domain": "d", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}]}),
            400,
        ),
        (
            "/v1/report",
            json!({"rule": "tokens", "key": "k", "ttl": "1m"}),
            400,
        ),
        (
            "/v1/reservations",
            json!({"rule": "tokens", "key": "k", "cost": 5000}),
            400,
        ),
        (
            "/v1/reservations",
            json!({"rule": "tokens", "key": "k", "cost": 1, "ttl": "soon"}),
            400,
        ),
        (
            "/v1/check",
            json!({"rule": "tokens", "key": "k", "ttl": "1m"}),
            400,
        ),
        (
            "/v1/reservations/0123456789abcdef0123456789abcdef/commit",
            json!({"cost": 1}),
            404,
        ),
        ("/v1/reservations/../commit", json!({"cost": 1}), 404),
        (
            "/v1/reservations/0123456789abcdef0123456789abcdef/commit",
            json!({"cost": -1}),
            422,
        ),
        (
            "/v1/reservations/0123456789abcdef0123456789abcdef/commit",
            json!({"tokens": 1}),
            422,
        ),
    ];
    for (path, body, expected) in cases {
        let (status, answer) = post(server, path, body.clone()).await;
        assert_eq!(status, expected, "{path} {body}: {answer}");
        if status != 404 || path.ends_with("/commit") && answer.is_object() {
            assert!(
                answer["error"].is_string() || status == 404,
                "{path}: {answer}"
            );
        }
    }
    assert_eq!(left(server, "gamma").await, before, "nothing changed");
}

/// An unsettled reservation settles by itself: consumed at its estimate under `tokens`,
/// given back under `released`.
async fn unsettled_reservations_expire_as_their_rules_say(server: &str) {
    let (_, kept) = post(server, "/v1/reservations", chat("delta", 250)).await;
    let batch = json!({ "request": { "method": "POST", "path": "/v1/batch/run", "headers": { "x-tenant": "delta" } }, "cost": 40 });
    let (_, released) = post(server, "/v1/reservations", batch.clone()).await;
    let (kept, released) = (
        kept["id"].as_str().unwrap().to_string(),
        released["id"].as_str().unwrap().to_string(),
    );
    let look = json!({ "request": batch["request"], "cost": 0 });
    eventually("the released estimate comes back", || async {
        let (_, body) = post(server, "/v1/check", look.clone()).await;
        body["decisions"][0]["remaining"] == 100
    })
    .await;
    // Past its time to live, a commit finds it gone, whether settled yet or not.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let (status, _) = post(
        server,
        &format!("/v1/reservations/{kept}/commit"),
        json!({"cost": 1}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(left(server, "delta").await, 750, "consumed at its estimate");
    assert_eq!(
        delete(server, &format!("/v1/reservations/{released}"))
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn metered_work_on_the_memory_store() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    a_report_past_the_budget_refuses_the_next_request(&server.http).await;
    reservations_settle_at_the_real_cost(&server.http).await;
    bad_metered_input_changes_nothing(&server.http).await;
    unsettled_reservations_expire_as_their_rules_say(&server.http).await;
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_reservations_total{event=\"created\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_reported_total{rule=\"tokens\"} 1200"),
        "{metrics}"
    );
}

fn redis_rules(redis: &Redis) -> String {
    format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 2s }}\n{RULES}",
        redis.url()
    )
}

#[tokio::test]
async fn metered_work_on_redis_outlives_the_process_that_reserved() {
    let redis = Redis::start();
    let rules = redis_rules(&redis);
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    a_report_past_the_budget_refuses_the_next_request(&server.http).await;
    reservations_settle_at_the_real_cost(&server.http).await;
    bad_metered_input_changes_nothing(&server.http).await;
    unsettled_reservations_expire_as_their_rules_say(&server.http).await;
    // A reservation made by one process is committed by the next one.
    let (_, reserved) = post(&server.http, "/v1/reservations", chat("epsilon", 500)).await;
    let id = reserved["id"].as_str().unwrap().to_string();
    assert!(server.terminate());
    let next = Server::start(&[("rules.yaml", &rules)], &[]);
    let (status, body) = post(
        &next.http,
        &format!("/v1/reservations/{id}/commit"),
        json!({"cost": 100}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decisions"][0]["remaining"], 900);
    // A killed process's reservation still settles by itself, in the next one.
    let (_, reserved) = post(&next.http, "/v1/reservations", chat("zeta", 600)).await;
    let id = reserved["id"].as_str().unwrap().to_string();
    support::signal(next.pid(), "KILL");
    drop(next);
    let last = Server::start(&[("rules.yaml", &rules)], &[]);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let (status, _) = post(
        &last.http,
        &format!("/v1/reservations/{id}/commit"),
        json!({"cost": 1}),
    )
    .await;
    assert_eq!(status, 404, "the killed process's reservation expired");
    assert_eq!(
        left(&last.http, "zeta").await,
        400,
        "consumed at its estimate"
    );
}

/// Redis gone: the loop that settles expired reservations, which tries every second, says so
/// once, not every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_said_once_by_the_expiry_loop() {
    let redis = Redis::start();
    let server = Server::start(&[("rules.yaml", &redis_rules(&redis))], &[]);
    drop(redis);
    server.wait_for_log(
        "cannot settle expired reservations now",
        Duration::from_secs(10),
    );
    let again = server.lines_within(Duration::from_millis(3_500));
    assert!(
        !again.iter().any(|l| l.contains("cannot settle expired")),
        "{again:#?}"
    );
}

/// Four processes on one Redis, 1,000 reservations at once of 10 against a budget of 5,000:
/// exactly 500 admitted; then each committed at a random real cost, and what the budget
/// counts is the sum of the commits, to the unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_are_exact_across_processes() {
    let redis = Redis::start();
    let rules = format!(
        "store: {{ kind: redis, url: \"{}\", timeout: 5s, connections: 2 }}\nrules:\n  - id: budget\n    key: [header:x-tenant]\n    tiers: [{{ limit: 5000, period: 1d }}]\n",
        redis.url()
    );
    let servers: Vec<Server> = (0..4)
        .map(|_| Server::start(&[("rules.yaml", &rules)], &[]))
        .collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(300)
        .build()
        .unwrap();
    let body = json!({ "request": { "method": "POST", "path": "/v1/chat", "headers": { "x-tenant": "shared" } }, "cost": 10 });
    let asks = (0..1_000).map(|i| {
        let (client, url, body) = (
            client.clone(),
            format!("{}/v1/reservations", servers[i % 4].http),
            body.clone(),
        );
        tokio::spawn(async move {
            let answer = client.post(url).json(&body).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.json::<Value>().await.unwrap())
        })
    });
    let answers: Vec<(u16, Value)> = futures_util::future::join_all(asks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let admitted: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    let denied = answers.iter().filter(|(s, _)| *s == 429).count();
    assert_eq!(
        (admitted.len(), denied),
        (500, 500),
        "{:?}",
        answers.iter().find(|(s, _)| *s != 200 && *s != 429)
    );
    // Each committed at a real cost of 0 to 12 (some above the estimate), on any process.
    let mut random = 0x2545_f491_4f6c_dd1du64;
    let mut total = 0;
    let commits = admitted.iter().enumerate().map(|(i, reserved)| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let cost = random % 13;
        total += cost;
        let id = reserved["id"].as_str().unwrap();
        let url = format!("{}/v1/reservations/{id}/commit", servers[(i + 1) % 4].http);
        let client = client.clone();
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({ "cost": cost }))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    });
    let statuses: Vec<u16> = futures_util::future::join_all(commits)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let look = json!({ "request": body["request"], "cost": 0 });
    let (_, answer) = post(&servers[0].http, "/v1/check", look).await;
    assert_eq!(
        answer["decisions"][0]["remaining"],
        5000 - total,
        "counted {total} committed"
    );
}

/// The command line does each: reserve (its id on standard output, for `jq`), commit,
/// cancel, report; exit codes 0 admitted, 1 denied or in debt, 2 anything else.
#[tokio::test]
async fn the_command_line_meters_work() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let ask = [
        "check",
        "--server",
        &server.http,
        "--rule",
        "tokens",
        "--key",
        "cli",
    ];
    let run = |more: &[&str]| {
        let args: Vec<&str> = ask.iter().chain(more).copied().collect();
        support::run(&args)
    };
    let (code, out, err) = run(&["--reserve", "--ttl", "1m", "--cost", "300"]);
    assert_eq!(code, 0, "{err}");
    let reserved: Value = serde_json::from_str(&out).unwrap();
    let id = reserved["id"].as_str().unwrap().to_string();
    assert!(reserved["expires_in_ms"].as_u64().unwrap() > 50_000);
    let commit = |id: &str, cost: &str| {
        support::run(&[
            "check",
            "--server",
            &server.http,
            "--commit",
            id,
            "--cost",
            cost,
        ])
    };
    let (code, out, _) = commit(&id, "100");
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["decisions"][0]["remaining"],
        900
    );
    let (code, _, err) = commit(&id, "100");
    assert_eq!(code, 2, "settled once: {err}");
    assert!(err.contains("404"), "{err}");
    let (code, out, _) = run(&["--report", "--cost", "1500"]);
    assert_eq!(code, 1, "in debt: {out}");
    let (code, _, _) = run(&["--reserve", "--cost", "1"]);
    assert_eq!(code, 1, "denied while in debt");
    let (code, _, err) = support::run(&["check", "--server", &server.http, "--cancel", "nope"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["--report", "--reserve"]);
    assert_eq!(code, 2, "one at a time: {err}");
}
