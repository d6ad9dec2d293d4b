//! `tollgate bench` against a real server: its counts of admitted and denied checks are what
//! the rules allow, over HTTP and gRPC, closed loop, paced and timed; failures are counted and
//! said, and bad flags are refused.

use crate::support;

use support::{Server, run};

const RULES: &str = r#"
rules:
  - id: api
    match: { path: "/api/**" }
    key: [header:x-tenant]
    algorithm: sliding_log
    tiers: [{ limit: 50, period: 1h }]
"#;

const ENVOY: &str = r#"
domain: bench
descriptors:
  - key: ip
    rate_limit: { unit: hour, requests_per_unit: 5 }
"#;

/// The numbers of a report's `answers` line: (allowed, denied, failed).
fn answers(out: &str) -> (u64, u64, u64) {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("answers"))
        .unwrap_or_else(|| panic!("no answers in {out}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    (numbers[0], numbers[1], numbers[2])
}

/// Runs `tollgate bench` off the test's runtime threads.
async fn bench(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&[&["bench"], &args[..]].concat())
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

#[tokio::test]
async fn counts_what_the_rules_admit_over_http() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let http = server.http.as_str();
    // Requests of tenants t0, t1...: the first two flags of every run below but one.
    let tenants = [
        "--server",
        http,
        "--path",
        "/api/items",
        "-H",
        "x-tenant: t{key}",
    ];

    // Two tenants of 50 each, 300 checks from 8 connections at once.
    let more = ["--keys", "2", "--requests", "300", "--connections", "8"];
    let (code, out, err) = bench(args(&[&tenants[..], &more].concat())).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(answers(&out), (100, 200, 0), "{out}");
    assert!(out.contains("requests  300 in"), "{out}");
    assert!(out.contains("latency   p50 "), "{out}");

    // A rule and key, paced at 400 checks a second: another key's 50, then denials.
    let paced = [
        "--server",
        http,
        "--rule",
        "api",
        "--key",
        "k",
        "--requests",
        "60",
    ];
    let (code, out, err) = bench(args(&[&paced[..], &["--rate", "400"]].concat())).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(answers(&out), (50, 10, 0), "{out}");
    assert!(out.contains("400 per second due"), "{out}");

    // For a time rather than a count: every check of the two spent tenants is denied.
    let more = ["--keys", "2", "--duration", "1s", "--connections", "2"];
    let (code, out, err) = bench(args(&[&tenants[..], &more].concat())).await;
    assert_eq!(code, 0, "{out}{err}");
    let (allowed, denied, failed) = answers(&out);
    assert_eq!((allowed, failed), (0, 0), "{out}");
    assert!(denied > 0, "{out}");
}

#[tokio::test]
async fn counts_what_the_rules_admit_over_grpc() {
    let server = Server::start(&[("envoy.yaml", ENVOY)], &[]);
    // A bare address, without http://, is taken as one.
    let (code, out, err) = bench(args(&[
        "--grpc",
        server.grpc.trim_start_matches("http://"),
        "--domain",
        "bench",
        "--descriptor",
        "ip=10.0.0.{key}",
        "--keys",
        "4",
        "--requests",
        "50",
        "--connections",
        "4",
    ]))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(answers(&out), (20, 30, 0), "{out}");
    assert!(out.contains("(gRPC, domain bench)"), "{out}");
}

#[tokio::test]
async fn failures_are_counted_and_said_and_bad_flags_refused() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    // An unknown rule: every check gets a 400, each counted as a failure.
    let (code, out, _) = bench(args(&[
        "--server",
        &server.http,
        "--rule",
        "nope",
        "--key",
        "k",
        "--requests",
        "5",
    ]))
    .await;
    assert_eq!(code, 1, "{out}");
    assert_eq!(answers(&out), (0, 0, 5), "{out}");
    assert!(
        out.contains("first failure: 400") && out.contains("unknown rule"),
        "{out}"
    );
    // Nothing listens: failures, not a hang or a crash.
    let (code, out, _) = bench(args(&[
        "--server",
        "http://127.0.0.1:1",
        "--path",
        "/",
        "--requests",
        "3",
    ]))
    .await;
    assert_eq!(code, 1, "{out}");
    assert_eq!(answers(&out), (0, 0, 3), "{out}");
    assert!(out.contains("cannot reach"), "{out}");
    let (code, out, _) = bench(args(&[
        "--grpc",
        "http://127.0.0.1:1",
        "--domain",
        "d",
        "-d",
        "k=v",
        "--requests",
        "2",
    ]))
    .await;
    assert_eq!((code, answers(&out)), (1, (0, 0, 2)), "{out}");

    for (flags, says) in [
        (&["--requests", "5"][..], "give --path"),
        (
            &[
                "--grpc",
                "http://127.0.0.1:1",
                "--domain",
                "d",
                "-d",
                "novalue",
            ][..],
            "expected `key=value`",
        ),
        (
            &["--grpc", "http://127.0.0.1:1", "--domain", "d"][..],
            "--descriptor key=value",
        ),
        (&["--path", "/", "--connections", "0"][..], "at least 1"),
        (&["--path", "/", "--rate=-3"][..], "--rate must be"),
        (&["--path", "/", "--rate", "0"][..], "--rate must be"),
        (&["--path", "/", "--duration", "soon"][..], "duration"),
    ] {
        let (code, out, err) = bench(args(flags)).await;
        assert_ne!(code, 0, "{flags:?}: {out}");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
}
