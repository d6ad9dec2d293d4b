//! Several `tollgate serve` processes on one Redis they share: the limit is global and exact in
//! strict mode, under concurrent requests to every process.

mod support;

use serde_json::json;
use support::{Redis, Server, check};

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
                assert_eq!(answer["decisions"][0]["source"], "redis");
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
