//! Hot reload (file change and SIGHUP) and the admin API, on the real server.

use crate::support;

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use support::{Server, admin, admin_ids, check, header, signal};

fn rules(limit: u64) -> String {
    format!(
        "rules:\n  - id: api\n    key: [header:x-tenant]\n    algorithm: sliding_log\n    tiers: [{{ limit: {limit}, period: 1d }}]\n"
    )
}

fn tenant(t: &str) -> serde_json::Value {
    json!({ "request": { "method": "GET", "path": "/", "headers": { "x-tenant": t } } })
}

async fn remaining(client: &reqwest::Client, server: &Server) -> String {
    let (_, headers, body) = check(client, &server.http, tenant("a")).await;
    header(&headers, "x-ratelimit-remaining")
        .unwrap_or_else(|| panic!("no headers: {body}"))
        .to_string()
}

/// Rewrites a rule file as editors and config maps do: a new file renamed over the old.
fn replace(server: &Server, name: &str, text: &str) {
    let temp = server.file(&format!(".{name}.tmp"));
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, server.file(name)).unwrap();
}

#[tokio::test]
async fn an_edited_file_is_reloaded_and_counters_survive() {
    let server = Server::start(&[("rules.yaml", &rules(10))], &[]);
    let client = reqwest::Client::new();
    assert_eq!(remaining(&client, &server).await, "9");
    assert_eq!(remaining(&client, &server).await, "8");
    replace(&server, "rules.yaml", &rules(20));
    server.wait_for_log("rules reloaded", Duration::from_secs(10));
    // Raising 10 to 20 gives the tenant 10 more, not a fresh start.
    assert_eq!(remaining(&client, &server).await, "17");
}

#[tokio::test]
async fn an_invalid_file_is_rejected_and_the_old_rules_keep_serving() {
    let server = Server::start(&[("rules.yaml", &rules(10))], &[]);
    let client = reqwest::Client::new();
    assert_eq!(remaining(&client, &server).await, "9");
    replace(
        &server,
        "rules.yaml",
        "rules:\n  - id: api\n    tiers: [{ limit: ten }]\n",
    );
    let line = server.wait_for_log("rejected", Duration::from_secs(10));
    assert!(line.contains("rules.yaml:3:"), "{line}");
    assert_eq!(remaining(&client, &server).await, "8");
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
}

/// A directory laid out as the kubelet mounts a ConfigMap (`rules.yaml` a link into `..data`,
/// itself a link to a timestamped directory, swapped by a rename on update): its files are
/// served once (the `..` entries are not read as rule files of their own), and a swap reloads.
#[tokio::test]
async fn a_config_map_mount_is_served_and_its_update_reloaded() {
    use std::os::unix::fs::symlink;
    let mount = tempfile::tempdir().unwrap();
    let at = |p: &str| mount.path().join(p);
    for (version, limit) in [
        ("..2026_12_04_10_00_00.1", 10),
        ("..2026_12_04_10_05_00.2", 4),
    ] {
        std::fs::create_dir(at(version)).unwrap();
        std::fs::write(at(version).join("rules.yaml"), rules(limit)).unwrap();
    }
    symlink("..2026_12_04_10_00_00.1", at("..data")).unwrap();
    symlink("..data/rules.yaml", at("rules.yaml")).unwrap();
    let config = mount.path().to_str().unwrap();
    let server = Server::start(&[], &["--config", config]);
    let client = reqwest::Client::new();
    assert_eq!(remaining(&client, &server).await, "9");
    // The kubelet's update: a new link renamed over `..data`.
    symlink("..2026_12_04_10_05_00.2", at("..data_tmp")).unwrap();
    std::fs::rename(at("..data_tmp"), at("..data")).unwrap();
    server.wait_for_log("rules reloaded", Duration::from_secs(10));
    assert_eq!(remaining(&client, &server).await, "2");
}

#[tokio::test]
async fn sighup_reloads() {
    let server = Server::start(&[("rules.yaml", &rules(10))], &[]);
    let client = reqwest::Client::new();
    assert_eq!(remaining(&client, &server).await, "9");
    // Written in place (no rename), then a hangup: one reload or two, the same rules.
    std::fs::write(server.file("rules.yaml"), rules(5)).unwrap();
    signal(server.pid(), "HUP");
    server.wait_for_log("rules reloaded", Duration::from_secs(10));
    assert_eq!(remaining(&client, &server).await, "3");
}

#[tokio::test]
async fn the_admin_api_needs_its_token_and_validates_like_the_files() {
    let server = Server::start(&[("rules.yaml", &rules(10))], &["--admin-token", "s3cret"]);
    let client = reqwest::Client::new();
    let without = client
        .get(format!("{}/v1/rules", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(without.status().as_u16(), 401);
    let wrong = admin(&server.http, "guess", Method::GET, "", None).await;
    assert_eq!(wrong.status().as_u16(), 401);
    assert_eq!(admin_ids(&server.http, "s3cret").await, ["api"]);
    // The scheme's case does not matter (RFC 9110); the token's does.
    for (authorization, status) in [
        ("bearer s3cret", 200),
        ("BEARER  s3cret", 200),
        ("Bearer S3CRET", 401),
        ("Basic s3cret", 401),
    ] {
        let answer = client
            .get(format!("{}/v1/rules", server.http))
            .header("authorization", authorization)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{authorization}");
    }

    let new_rule = json!({
        "id": "login",
        "match": { "methods": ["POST"], "path": "/login" },
        "key": ["client_ip"],
        "algorithm": "sliding_log",
        "tiers": [{ "limit": 2, "period": "1m" }]
    });
    let created = admin(
        &server.http,
        "s3cret",
        Method::PUT,
        "/login",
        Some(&new_rule),
    )
    .await;
    assert_eq!(created.status().as_u16(), 201);
    let login =
        json!({ "request": { "method": "POST", "path": "/login", "client_ip": "10.0.0.1" } });
    let statuses = [
        check(&client, &server.http, login.clone()).await.0,
        check(&client, &server.http, login.clone()).await.0,
        check(&client, &server.http, login.clone()).await.0,
    ];
    assert_eq!(statuses, [200, 200, 429]);

    let bad = json!({ "id": "login", "tiers": [{ "limit": 0, "period": "1m" }] });
    let refused = admin(&server.http, "s3cret", Method::PUT, "/login", Some(&bad)).await;
    assert_eq!(refused.status().as_u16(), 422);
    assert!(refused.text().await.unwrap().contains("limit"));
    // The refused edit changed nothing: the rule still denies.
    assert_eq!(check(&client, &server.http, login.clone()).await.0, 429);

    // Admin edits outlive a reload of the files.
    replace(&server, "rules.yaml", &rules(11));
    server.wait_for_log("rules reloaded", Duration::from_secs(10));
    assert_eq!(check(&client, &server.http, login.clone()).await.0, 429);

    let deleted = admin(&server.http, "s3cret", Method::DELETE, "/login", None).await;
    assert_eq!(deleted.status().as_u16(), 204);
    let (status, _, body) = check(&client, &server.http, login).await;
    assert_eq!(status, 200);
    let rules: Vec<&str> = body["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["rule"].as_str())
        .collect();
    assert_eq!(rules, ["api"]);
    let gone = admin(&server.http, "s3cret", Method::GET, "/login", None).await;
    assert_eq!(gone.status().as_u16(), 404);
}

#[tokio::test]
async fn without_a_token_the_admin_api_is_off() {
    let server = Server::start(&[("rules.yaml", &rules(10))], &[]);
    let response = admin(&server.http, "anything", Method::GET, "", None).await;
    assert_eq!(response.status().as_u16(), 403);
}
