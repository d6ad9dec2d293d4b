//! The HTTP API of the real server: decisions and headers, 429s, bad input, the nginx
//! `auth_request` endpoint, shadow mode, the shipped multi-tenant example, metrics and health.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{Server, check, header};

/// Three per day per tenant header, as a token bucket (a refill every 8 h: none in a test).
const RULES: &str = r#"
rules:
  - id: api
    match: { methods: [GET, POST], path: "/api/**" }
    key: [header:x-tenant]
    algorithm: token_bucket
    tiers: [{ limit: 3, period: 1d }]
  - id: per-ip
    match: { path: "/ip/**" }
    key: [client_ip]
    algorithm: token_bucket
    tiers: [{ limit: 1, period: 1d }]
  - id: watch
    shadow: true
    match: { path: "/watched/{id}" }
    key: [segment:id]
    algorithm: token_bucket
    tiers: [{ limit: 1, period: 1d }]
"#;

fn request(tenant: &str) -> serde_json::Value {
    json!({ "request": { "method": "GET", "path": "/api/items?page=2", "headers": { "X-Tenant": tenant } } })
}

#[tokio::test]
async fn admits_the_limit_then_answers_429_with_headers_that_are_never_early() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let client = reqwest::Client::new();
    for remaining in [2, 1, 0] {
        let (status, headers, body) = check(&client, &server.http, request("a")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["allowed"], true);
        assert_eq!(body["decisions"][0]["rule"], "api");
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some("3"));
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some(&*remaining.to_string())
        );
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            Some("\"api\";q=3;w=86400")
        );
        assert!(header(&headers, "retry-after").is_none());
    }
    let (status, headers, body) = check(&client, &server.http, request("a")).await;
    assert_eq!(status, 429);
    assert_eq!(body["allowed"], false);
    // One token per 8 hours: the wait, in whole seconds rounded up.
    let retry: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((28_790..=28_800).contains(&retry), "{retry}");
    let ratelimit = header(&headers, "ratelimit").unwrap();
    assert!(ratelimit.starts_with("\"api\";r=0;t="), "{ratelimit}");
    assert!(body["decisions"][0]["retry_after_ms"].as_u64().unwrap() > 28_790_000);
    // Another tenant is untouched.
    let (status, headers, _) = check(&client, &server.http, request("b")).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("2"));
}

#[tokio::test]
async fn a_request_no_rule_matches_is_admitted_without_headers() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let client = reqwest::Client::new();
    let body = json!({ "request": { "method": "DELETE", "path": "/api/x" } });
    let (status, headers, body) = check(&client, &server.http, body).await;
    assert_eq!((status, body["allowed"].clone()), (200, json!(true)));
    assert!(body["decisions"].as_array().unwrap().is_empty());
    assert!(header(&headers, "x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn a_shadow_rule_reports_but_never_denies() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let client = reqwest::Client::new();
    let body = json!({ "request": { "method": "GET", "path": "/watched/7" } });
    for shadowed in [false, true, true] {
        let (status, _, answer) = check(&client, &server.http, body.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(answer["decisions"][0]["shadowed"], shadowed, "{answer}");
    }
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_decisions_total{rule=\"watch\",outcome=\"shadow_denied\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_loses_nothing() {
    let server = Server::start(&[("rules.yaml", RULES)], &["--admin-token", "t"]);
    let client = reqwest::Client::new();
    let url = format!("{}/v1/check", server.http);
    let post = |body: Vec<u8>| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
    };
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, ""),
        (
            b"{\"request\": {\"method\": \"GET\", \"path\": \"/\xff\"}}".to_vec(),
            400,
            "not UTF-8",
        ),
        (
            br#"{"rule": "nope", "key": "k"}"#.to_vec(),
            400,
            "unknown rule `nope`",
        ),
        (
            br#"{"rule": "api", "key": "k", "cost": 4}"#.to_vec(),
            400,
            "can ever admit",
        ),
        (
            br#"{"rule": "api", "key": "k", "cost": -1}"#.to_vec(),
            422,
            "",
        ),
        (br#"{"rule": "api"}"#.to_vec(), 400, "needs a `key`"),
        (br#"{"surprise": 1}"#.to_vec(), 422, "unknown field"),
        (br#"{}"#.to_vec(), 400, "give one of"),
        (
            format!(r#"{{"rule": "api", "key": "{}"}}"#, "k".repeat(5_000)).into_bytes(),
            400,
            "exceeds",
        ),
        (vec![b' '; 100_000], 413, ""),
    ];
    for (body, status, says) in cases {
        let response = post(body.clone()).send().await.unwrap();
        let got = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(
            got,
            status,
            "{}: {text}",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
        assert!(text.contains(says), "{text}");
    }
    let plain = client
        .post(&url)
        .body(r#"{"rule": "api", "key": "k"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 415);
    let get = client.get(&url).send().await.unwrap();
    assert_eq!(get.status().as_u16(), 405);
    assert_eq!(header(get.headers(), "allow"), Some("POST"));
    let auth = client
        .get(format!("{}/v1/auth?cost=many", server.http))
        .header("X-Original-URI", "/api/things")
        .send()
        .await
        .unwrap();
    assert_eq!(auth.status().as_u16(), 400);
    assert!(auth.text().await.unwrap().contains("cost"));
    // The key the bad checks named still has all of its permits.
    let (status, headers, _) =
        check(&client, &server.http, json!({ "rule": "api", "key": "k" })).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("2"));
}

#[tokio::test]
async fn auth_request_reads_the_original_request() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let client = reqwest::Client::new();
    let auth = |deny: &str| {
        client
            .get(format!("{}/v1/auth{deny}", server.http))
            .header("X-Original-URI", "/api/things?x=1")
            .header("X-Original-Method", "POST")
            .header("X-Tenant", "t")
    };
    for remaining in ["2", "1", "0"] {
        let response = auth("").send().await.unwrap();
        assert_eq!(response.status().as_u16(), 204);
        assert_eq!(
            header(response.headers(), "x-ratelimit-remaining"),
            Some(remaining)
        );
    }
    let response = auth("").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert!(header(response.headers(), "retry-after").is_some());
    assert_eq!(
        auth("?deny_status=403")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        auth("?deny_status=500")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
    // The client is X-Real-IP when nginx sends it, else the connection's peer.
    let by_ip = |real_ip: Option<&str>| {
        let mut request = client
            .get(format!("{}/v1/auth", server.http))
            .header("X-Original-URI", "/ip/x");
        if let Some(ip) = real_ip {
            request = request.header("X-Real-IP", ip);
        }
        request.send()
    };
    assert_eq!(by_ip(None).await.unwrap().status().as_u16(), 204);
    assert_eq!(by_ip(None).await.unwrap().status().as_u16(), 429);
    assert_eq!(
        by_ip(Some("10.1.1.1")).await.unwrap().status().as_u16(),
        204
    );
    assert_eq!(
        by_ip(Some("10.1.1.1")).await.unwrap().status().as_u16(),
        429
    );
    let missing = client
        .get(format!("{}/v1/auth", server.http))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 400);
    assert!(missing.text().await.unwrap().contains("X-Original-URI"));
}

#[tokio::test]
async fn the_shipped_example_keeps_one_tenants_flood_from_another() {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/multi-tenant.yaml"
    ))
    .unwrap();
    let server = Server::start(&[("multi-tenant.yaml", &example)], &[]);
    let client = reqwest::Client::new();
    let put = |org: &str| json!({ "request": { "method": "PUT", "path": format!("/v1/organizations/{org}/product/1") } });
    // 3 s or more of a 10 s window left, so that the flood stays in one.
    support::clear_of_a_windows_turn(Duration::from_secs(10), Duration::from_secs(3)).await;
    let mut admitted = 0;
    for _ in 0..120 {
        let (status, _, _) = check(&client, &server.http, put("flood")).await;
        admitted += u32::from(status == 200);
    }
    assert_eq!(admitted, 100);
    let (status, headers, body) = check(&client, &server.http, put("quiet")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("99"));
    // GETs of the flooding organization are a rule of their own.
    let get =
        json!({ "request": { "method": "GET", "path": "/v1/organizations/flood/product/1" } });
    assert_eq!(check(&client, &server.http, get).await.0, 200);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let get = |path: &str| reqwest::get(format!("{}{path}", server.http));
    assert_eq!(get("/healthz").await.unwrap().status().as_u16(), 200);
    assert_eq!(get("/readyz").await.unwrap().status().as_u16(), 200);
    let client = reqwest::Client::new();
    for _ in 0..4 {
        check(&client, &server.http, request("m")).await;
    }
    let metrics = support::metrics(&server.http).await;
    for line in [
        "tollgate_decisions_total{rule=\"api\",outcome=\"allowed\"} 3",
        "tollgate_decisions_total{rule=\"api\",outcome=\"denied\"} 1",
        "tollgate_near_limit_total{rule=\"api\"} 1",
        "tollgate_keys 1",
        "tollgate_store_seconds_count{store=\"memory\"} 4",
        // A histogram (aggregable across instances), not a summary.
        "tollgate_store_seconds_bucket{store=\"memory\",le=\"+Inf\"} 4",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    assert!(server.terminate());
}

/// An HTTP/2 client on each listener that never reads again (so never answers the PING of a
/// graceful GOAWAY): SIGTERM still ends the process once `server.drain` is spent, saying so.
#[tokio::test]
async fn sigterm_ends_connections_still_open_after_the_drain() {
    use tokio::io::AsyncWriteExt;
    let rules = format!("server: {{ drain: 1s }}\n{RULES}");
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    let mut silent = Vec::new();
    for url in [&server.http, &server.grpc] {
        let addr = url.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The preface and an empty SETTINGS frame: a connection, with no stream.
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .unwrap();
        silent.push(stream);
    }
    // The connections are served before the signal.
    tokio::time::sleep(Duration::from_millis(200)).await;
    support::signal(server.pid(), "TERM");
    let log = server.wait_for_log(
        "connections still open after draining",
        Duration::from_secs(10),
    );
    assert!(log.contains("1s"), "{log}");
    assert!(server.terminate(), "did not exit cleanly");
    drop(silent);
}

#[tokio::test]
async fn the_check_command_asks_a_running_server() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let http = server.http.clone();
    let ask = move || {
        support::run(&[
            "check",
            "--server",
            &http,
            "--path",
            "/api/x",
            "-H",
            "x-tenant: cli",
        ])
    };
    for _ in 0..3 {
        let (code, out, err) = tokio::task::spawn_blocking(ask.clone()).await.unwrap();
        assert_eq!(code, 0, "{out}{err}");
        // The answer alone on standard output, as JSON (for jq); the status on stderr.
        let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(answer["allowed"], true, "{out}");
        assert!(err.contains("HTTP 200"), "{err}");
    }
    let (code, out, err) = tokio::task::spawn_blocking(ask).await.unwrap();
    assert_eq!(code, 1);
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["allowed"], false, "{out}");
    assert!(err.contains("HTTP 429"), "{err}");
    // A bare address is an http:// one.
    let bare = server.http.trim_start_matches("http://").to_string();
    let (code, _, err) = support::run(&["check", "--server", &bare, "--rule", "api", "--key", "k"]);
    assert_eq!(code, 0, "{err}");
    // No answer, or flags that contradict each other: 2.
    let (code, _, err) = support::run(&["check", "--server", "http://127.0.0.1:1", "--path", "/"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach"), "{err}");
    let (code, _, err) = support::run(&["check", "--path", "/x", "--rule", "api", "--key", "k"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
}

/// A memory store of 1,000 keys under 1 per hour, every key used up, then 3,000 new keys:
/// the first key's answer, the new keys' answers, and the metrics. A token bucket, so no
/// key's state ends at a clock boundary the test might straddle (a fixed window's hour did).
async fn a_full_memory_store(when_full: &str) -> (Server, u16, Vec<(u16, String)>, String) {
    let rules = format!(
        r#"
store: {{ kind: memory, max_keys: 1000, when_full: {when_full} }}
rules:
  - id: hourly
    key: [header:x-user]
    algorithm: token_bucket
    tiers: [{{ limit: 1, period: 1h }}]
    on_failure: closed
"#
    );
    let server = Server::start(&[("rules.yaml", &rules)], &[]);
    let client = reqwest::Client::new();
    let ask = |key: u32| json!({ "rule": "hourly", "key": key.to_string() });
    for key in 0..1_000 {
        let (status, _, body) = check(&client, &server.http, ask(key)).await;
        assert_eq!(status, 200, "{body}");
    }
    let mut answers = Vec::new();
    for key in 1_000..4_000 {
        let (status, _, body) = check(&client, &server.http, ask(key)).await;
        let source = body["decisions"][0]["source"]
            .as_str()
            .unwrap_or("")
            .to_string();
        answers.push((status, source));
    }
    let (first, _, _) = check(&client, &server.http, ask(0)).await;
    let metrics = support::metrics(&server.http).await;
    (server, first, answers, metrics)
}

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

#[tokio::test]
async fn a_full_memory_store_that_evicts_says_which_keys_it_forgot() {
    let (server, _, answers, metrics) = a_full_memory_store("evict").await;
    assert!(answers.iter().all(|(status, _)| *status == 200));
    server.wait_for_log(
        "evicted a key that was still limiting",
        Duration::from_secs(5),
    );
    assert!(
        counter(&metrics, "tollgate_limiting_evictions_total") >= 3_000,
        "{metrics}"
    );
    assert_eq!(counter(&metrics, "tollgate_refused_keys_total"), 0);
}

#[tokio::test]
async fn a_full_memory_store_that_refuses_keeps_its_keys_and_fails_closed() {
    let (_server, first, answers, metrics) = a_full_memory_store("refuse").await;
    assert_eq!(first, 429, "a used-up key was forgotten");
    assert!(
        answers
            .iter()
            .all(|(s, source)| (*s, source.as_str()) == (429, "fail_closed")),
        "{:?}",
        &answers[..3]
    );
    assert_eq!(counter(&metrics, "tollgate_refused_keys_total"), 3_000);
    assert_eq!(counter(&metrics, "tollgate_evictions_total"), 0);
}

/// A calendar day in UTC: the fields carry the real time to midnight, and the policy the
/// day's length.
#[tokio::test]
async fn a_calendar_day_resets_at_midnight_and_says_so() {
    let rules = "rules:\n  - id: daily\n    match: { path: \"/api/**\" }\n    key: [header:x-tenant]\n    tiers: [{ limit: 2, period: day }]\n";
    let server = Server::start(&[("rules.yaml", rules)], &[]);
    let client = reqwest::Client::new();
    let to_midnight = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        86_400 - now % 86_400
    };
    for _ in 0..2 {
        assert_eq!(check(&client, &server.http, request("t")).await.0, 200);
    }
    let before = to_midnight();
    let (status, headers, body) = check(&client, &server.http, request("t")).await;
    let after = to_midnight();
    assert_eq!(status, 429, "{body}");
    let retry: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    let reset: u64 = header(&headers, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    // Rounded up to whole seconds: at most a second past the moment asked.
    for seen in [retry, reset] {
        assert!(
            (after..=before + 1).contains(&seen),
            "{seen} s, midnight in {after}..={before}"
        );
    }
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some("\"daily\";q=2;w=86400")
    );
}

/// Clients as attackers have them: an IPv6 client's /64 is one key, and behind the proxies
/// of `server.trusted_proxies` the client is the one their `X-Forwarded-For` names, for
/// `/v1/check` and `/v1/auth` alike; from anyone else the header is not believed.
#[tokio::test]
async fn clients_are_their_networks_and_trusted_proxies_come_in_ranges() {
    let rules = "server: { trusted_proxies: [\"10.0.0.0/8\", \"2001:db8:ffff::/48\"] }\nrules:\n  - id: per-client\n    key: [client_ip]\n    algorithm: token_bucket\n    tiers: [{ limit: 1, period: 1d }]\n";
    let server = Server::start(&[("rules.yaml", rules)], &[]);
    let client = reqwest::Client::new();
    let ask = |ip: &'static str, forwarded: Option<&'static str>| {
        let mut headers = serde_json::Map::new();
        if let Some(hops) = forwarded {
            headers.insert("X-Forwarded-For".into(), json!(hops));
        }
        json!({ "request": { "method": "GET", "path": "/", "headers": headers, "client_ip": ip } })
    };
    let status = |body| {
        let client = client.clone();
        let http = server.http.clone();
        async move { check(&client, &http, body).await.0 }
    };
    // One /64: one client.
    assert_eq!(status(ask("2001:db8:1:2::1", None)).await, 200);
    assert_eq!(status(ask("2001:db8:1:2::abcd", None)).await, 429);
    assert_eq!(status(ask("2001:db8:1:3::1", None)).await, 200);
    // Through any proxy of the ranges: the client named.
    assert_eq!(status(ask("10.1.1.1", Some("198.51.100.7"))).await, 200);
    assert_eq!(
        status(ask("2001:db8:ffff::9", Some("198.51.100.7, 10.3.3.3"))).await,
        429
    );
    // From an address that is not a proxy, the header is not believed.
    assert_eq!(status(ask("203.0.113.9", Some("198.51.100.8"))).await, 200);
    assert_eq!(status(ask("203.0.113.9", Some("198.51.100.9"))).await, 429);
    // nginx's auth_request: X-Real-IP (or the peer) is the proxy, X-Forwarded-For the client.
    let auth = |real: &'static str, forwarded: &'static str| {
        client
            .get(format!("{}/v1/auth", server.http))
            .header("X-Original-URI", "/")
            .header("X-Real-IP", real)
            .header("X-Forwarded-For", forwarded)
            .send()
    };
    assert_eq!(
        auth("10.9.9.9", "192.0.2.50")
            .await
            .unwrap()
            .status()
            .as_u16(),
        204
    );
    assert_eq!(
        auth("10.8.8.8", "192.0.2.50")
            .await
            .unwrap()
            .status()
            .as_u16(),
        429
    );
}
