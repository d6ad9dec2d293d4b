//! The service against clients that try to stall it: hundreds of connections that send
//! nothing or a byte at a time, under a descriptor limit, while normal checks go on; request
//! heads that never end; idle connections; clients that half-close after their request;
//! requests framed two ways at once.
//!
//! A test binary of its own: the server runs under a descriptor limit, and the test opens
//! hundreds of sockets.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{Server, check};

const RULES: &str = r#"
rules:
  - id: api
    key: [header:x-tenant]
    algorithm: fixed_window
    tiers: [{ limit: 1000000, period: 1h }]
"#;

fn addr(server: &Server) -> SocketAddr {
    server.http.trim_start_matches("http://").parse().unwrap()
}

/// Sends `head` and waits for the connection to end or answer; returns what came back, and
/// whether it came within `within`.
fn exchange(addr: SocketAddr, bytes: &[u8], within: Duration) -> (String, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(within)).unwrap();
    stream.write_all(bytes).unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let ended = stream.read_to_end(&mut answer).is_ok();
    (
        String::from_utf8_lossy(&answer).into_owned(),
        ended && start.elapsed() < within,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_do_not_stop_checks() {
    // 256 descriptors: the server keeps 128 of them for itself and takes at most 128
    // connections.
    let server = Server::start_under(
        &["prlimit", "--nofile=256:256"],
        &[("rules.yaml", RULES)],
        &[],
    );
    let addr = addr(&server);
    // 200 connections that send nothing, and 200 that send a request head a byte at a time.
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(TcpStream::connect(addr).unwrap());
    }
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (connected, all_connected) = std::sync::mpsc::channel::<()>();
    let slow = std::thread::spawn(move || {
        let mut slow: Vec<TcpStream> = (0..200)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        connected.send(()).unwrap();
        let head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ";
        let mut sent = 0;
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(Duration::from_millis(100))
        {
            let byte = if sent < head.len() { head[sent] } else { b'a' };
            slow.retain_mut(|s| s.write_all(&[byte]).is_ok());
            sent += 1;
        }
    });
    all_connected.recv().unwrap();
    // Normal checks, each on a new connection, all answered.
    let body = json!({ "rule": "api", "key": "tenant" });
    for _ in 0..50 {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let (status, _, answer) = check(&client, &server.http, body.clone()).await;
        assert_eq!(status, 200, "{answer}");
    }
    // And on a connection kept alive between them.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for _ in 0..50 {
        assert_eq!(check(&client, &server.http, body.clone()).await.0, 200);
    }
    let metrics = support::metrics(&server.http).await;
    let evicted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_connections_evicted_total "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    // 128 at most open: of 450 connections, most made room for others.
    assert!(evicted >= 250, "{evicted} evicted");
    drop(stop);
    slow.join().unwrap();
    drop(idle);
}

#[tokio::test]
async fn heads_that_never_end_and_idle_connections_are_closed() {
    let server = Server::start(
        &[(
            "rules.yaml",
            &format!("server: {{ header_timeout: 1s, idle_timeout: 1s }}\n{RULES}"),
        )],
        &[],
    );
    let addr = addr(&server);
    // A head begun and never finished, and a connection that sends nothing: both closed.
    let (answer, closed) = exchange(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost:",
        Duration::from_secs(10),
    );
    assert!(
        closed,
        "a head that never ends kept its connection: {answer}"
    );
    let (answer, closed) = exchange(addr, b"", Duration::from_secs(10));
    assert!(
        closed && answer.is_empty(),
        "an idle connection stayed: {answer}"
    );
}

#[tokio::test]
async fn a_client_that_half_closes_still_gets_its_answer() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let addr = addr(&server);
    let body = r#"{"rule": "api", "key": "t"}"#;
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..100 {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
}

#[tokio::test]
async fn a_request_framed_two_ways_is_refused() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let smuggled = "POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\
                    transfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    let (answer, closed) = exchange(addr(&server), smuggled.as_bytes(), Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(closed, "the connection stayed open");
    // Nothing after the ambiguous request was served.
    assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer:?}");
}

const ENVOY: &str = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";

/// Sends one gRPC `ShouldRateLimit` call whose message is `message`, as bytes; returns its
/// `grpc-status` and `grpc-message`.
async fn raw_grpc(server: String, message: Vec<u8>) -> (String, String) {
    let addr = server.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let head = http::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (answer, mut body) = client.send_request(head, false).unwrap();
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    // The server may refuse before reading it all.
    let _ = body.send_data(framed.into(), true);
    let answer = answer.await.unwrap();
    // grpc-message is percent-encoded.
    let field = |headers: &http::HeaderMap, name: &str| {
        headers.get(name).map(|v| {
            let mut text = Vec::new();
            let mut bytes = v.as_bytes().iter();
            while let Some(&b) = bytes.next() {
                if b == b'%' {
                    let hex: String = bytes.by_ref().take(2).map(|&h| h as char).collect();
                    text.push(u8::from_str_radix(&hex, 16).unwrap_or(b'?'));
                } else {
                    text.push(b);
                }
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let (status, message) = (
        field(answer.headers(), "grpc-status"),
        field(answer.headers(), "grpc-message"),
    );
    if let Some(status) = status {
        return (status, message.unwrap_or_default());
    }
    let mut body = answer.into_body();
    while body.data().await.is_some() {}
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    (
        field(&trailers, "grpc-status").unwrap_or_default(),
        field(&trailers, "grpc-message").unwrap_or_default(),
    )
}

/// Resident memory of process `pid`, in bytes.
fn resident(pid: u32) -> u64 {
    memory(pid, "VmRSS:")
}

/// The most resident memory process `pid` ever had, in bytes.
fn peak(pid: u32) -> u64 {
    memory(pid, "VmHWM:")
}

/// A size in bytes from `/proc/<pid>/status`, the line `field`.
fn memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// A varint, as protobuf writes lengths.
fn varint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[tokio::test]
async fn a_message_that_cannot_be_decoded_is_an_invalid_argument() {
    let server = Server::start(&[("envoy.yaml", ENVOY)], &[]);
    // A field of wire type 7, which does not exist.
    let (status, message) = raw_grpc(server.grpc.clone(), vec![0x0f, 0x01]).await;
    assert_eq!(status, "3", "{message}");
    assert!(
        message.starts_with("failed to decode Protobuf"),
        "{message}"
    );
}

/// A flood of empty descriptors fits in a message of 4 MiB but would take hundreds of MB
/// decoded: it is refused at its 1,025th descriptor, before the rest of it is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_descriptors_is_refused_before_it_is_decoded() {
    let server = Server::start(&[("envoy.yaml", ENVOY)], &[]);
    // Warm: the first calls' threads and buffers are not the flood's.
    raw_grpc(server.grpc.clone(), vec![0x12, 0x00]).await;
    let before = resident(server.pid());
    // 1.9 million empty descriptors: 3.8 MB on the wire, hundreds of MB decoded.
    let mut message = Vec::with_capacity(3_800_000);
    for _ in 0..1_900_000 {
        message.extend_from_slice(&[0x12, 0x00]);
    }
    let calls: Vec<_> = (0..8)
        .map(|_| tokio::spawn(raw_grpc(server.grpc.clone(), message.clone())))
        .collect();
    for call in calls {
        let (status, message) = call.await.unwrap();
        assert_eq!(status, "11", "OUT_OF_RANGE: {message}");
        assert!(message.contains("too many descriptors"), "{message}");
    }
    let grown = resident(server.pid()).saturating_sub(before);
    assert!(
        grown < 16 << 20,
        "resident memory grew by {} MB",
        grown >> 20
    );
}

/// The most a message may bring, 1,024 descriptors, of small values: a message of 23 KB whose
/// call's memory follows its descriptors (11 MB measured at the server's first such call,
/// 18.7 MB when all were checked at once); bounded here at 24 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_count_of_small_descriptors_is_answered_within_its_bound() {
    let envoy = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let server = Server::start(&[("envoy.yaml", envoy)], &[]);
    raw_grpc(
        server.grpc.clone(),
        vec![0x0a, 0x04, b'e', b'd', b'g', b'e'],
    )
    .await;
    let before = peak(server.pid());
    let mut message = vec![0x0a, 0x04, b'e', b'd', b'g', b'e'];
    for d in 0..1_024 {
        let value = format!("{d:010}").into_bytes();
        let mut entry = vec![0x0a, 0x04, b'u', b's', b'e', b'r', 0x12];
        varint(&mut entry, value.len());
        entry.extend_from_slice(&value);
        message.push(0x12);
        varint(&mut message, entry.len() + 2);
        message.push(0x0a);
        varint(&mut message, entry.len());
        message.extend_from_slice(&entry);
    }
    let (status, text) = raw_grpc(server.grpc.clone(), message).await;
    assert_eq!(status, "0", "{text}");
    let grown = peak(server.pid()).saturating_sub(before);
    assert!(grown < 24 << 20, "the peak grew by {} MB", grown >> 20);
}

/// A message over `server.grpc_max_message_bytes` (4 MiB) is refused from its length.
#[tokio::test]
async fn a_message_over_four_mib_is_refused_from_its_length() {
    let server = Server::start(&[("envoy.yaml", ENVOY)], &[]);
    let mut message = vec![0x0a];
    let length = (4 << 20) - 4;
    // Field 1 (the domain): a length-delimited value of `length` bytes; 4 MiB + 1 in all.
    varint(&mut message, length);
    message.resize(message.len() + length, b'a');
    assert_eq!(message.len(), (4 << 20) + 1);
    let (status, text) = raw_grpc(server.grpc.clone(), message).await;
    assert_eq!(status, "11", "OUT_OF_RANGE: {text}");
    assert!(text.contains("too large"), "{text}");
}

/// A `detailed_metric` wildcard makes one series per value; a flood of values is folded into
/// `rule="_other"` past the cap, counted, and `/metrics` stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_value_series_are_bounded() {
    let envoy = "domain: edge\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let server = Server::start(&[("envoy.yaml", envoy)], &[]);
    let client = reqwest::Client::new();
    for user in 0..1_500 {
        let body = json!({ "domain": "edge", "descriptors": [{ "entries": [{ "key": "user", "value": user.to_string() }] }] });
        assert_eq!(check(&client, &server.http, body).await.0, 200);
    }
    let metrics = support::metrics(&server.http).await;
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{"))
        .count();
    assert!(series <= 1_001 * 3, "{series} series");
    assert!(metrics.contains("rule=\"_other\""), "no _other series");
    let folded = folded(&metrics);
    assert_eq!(folded, 500);
}

/// A `detailed_metric` value of 10,000 bytes names no series: names longer than 1,024 bytes
/// are folded into `_other`, so that long values cannot grow the labels by megabytes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_values_name_no_series() {
    let envoy = "domain: edge\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let server = Server::start(&[("envoy.yaml", envoy)], &[]);
    let client = reqwest::Client::new();
    for user in 0..20 {
        let value = format!("{user}{}", "v".repeat(10_000));
        let body = json!({ "domain": "edge", "descriptors": [{ "entries": [{ "key": "user", "value": value }] }] });
        assert_eq!(check(&client, &server.http, body).await.0, 200);
    }
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.len() < 200_000,
        "/metrics is {} bytes",
        metrics.len()
    );
    assert!(metrics.contains("rule=\"_other\""), "no _other series");
    let folded = folded(&metrics);
    assert_eq!(folded, 20);
}

/// `tollgate_metric_series_folded_total` of a `/metrics` page.
fn folded(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_metric_series_folded_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"))
}
