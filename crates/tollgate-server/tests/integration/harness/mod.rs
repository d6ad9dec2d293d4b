//! What each fuzz target does with its input (`fuzz/`), shared with the regression test of
//! the inputs fuzzing found (`tests/fuzzed.rs`), so that both run the very same checks: no
//! input may make the service panic, answer 5xx, or answer gRPC `INTERNAL`/`UNKNOWN`.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tollgate::engine::PathPattern;
use tollgate_server::envoy::Envoy;
use tollgate_server::envoy::rls::Rls;
use tollgate_server::envoy::wire::Bounded;
use tollgate_server::grpc::{Guards, GuardsLayer};
use tollgate_server::http::{AppState, Connection};
use tollgate_server::provider;
use tollgate_server::service::{self, Service};
use tower::ServiceExt;

/// Rules of both formats, for the HTTP and gRPC targets.
const NATIVE: &str = r#"
rules:
  - id: tenant
    match: { methods: [GET, POST], path: "/v1/organizations/{org}/product/*" }
    key: [segment:org, method, header:x-tenant]
    algorithm: sliding_window
    tiers: [{ limit: 5, period: 10s }, { limit: 50, period: 1h }]
  - id: ip
    match: { path: "/login/**", headers: { x-kind: "mobile*" } }
    key: [client_ip, route]
    algorithm: token_bucket(initial=2)
    tiers: [{ limit: 3, period: 1m, burst: 4 }]
    on_failure: closed
  - id: shaped
    match: { path: "/shaped" }
    algorithm: leaky_bucket(shaper)
    tiers: [{ limit: 2, period: 1s, burst: 3 }]
    shadow: true
"#;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: path
    value: "/api*"
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: plan
    value: free
    rate_limit: { unlimited: true }
"#;

/// One service for every input, on a runtime of its own.
struct Harness {
    runtime: tokio::runtime::Runtime,
    http: Connection,
    grpc: Guards<Bounded<RateLimitServiceServer<Rls>>>,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = [("native.yaml", NATIVE), ("envoy.yaml", ENVOY)]
            .into_iter()
            .map(|(name, text)| {
                let path = dir.path().join(name);
                std::fs::write(&path, text).unwrap();
                path
            })
            .collect();
        let config = provider::load(&files).unwrap();
        let service = Arc::new(runtime.block_on(Service::start(files, config)).unwrap());
        let envoy = Arc::new(Envoy::new(service.clone()));
        let state = AppState {
            service: service.clone(),
            envoy: envoy.clone(),
            metrics: None,
            admin_token: Some("token".into()),
            max_body_bytes: 64 * 1024,
            connections: None,
        };
        let peer: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        Harness {
            http: Connection::new(state, peer),
            grpc: tower::Layer::layer(
                &GuardsLayer,
                tollgate_server::envoy::rls::server(envoy, true, 4 << 20),
            ),
            runtime,
            _dir: dir,
        }
    })
}

/// A native rule file: loads or says why, and what loads passes or fails the service's
/// check, never panicking.
pub fn native_config(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        load(text);
    }
}

/// An Envoy rule file (the input after `domain: fuzz`), as [`native_config`].
pub fn envoy_config(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        load(&format!("domain: fuzz\n{text}"));
    }
}

fn load(text: &str) {
    let files = [(PathBuf::from("fuzzed.yaml"), text.to_string())];
    if let Ok(config) = provider::load_texts(&files) {
        let _ = service::check(&config);
    }
}

/// A `/v1/check` body: answered 2xx, 4xx or 429, never 5xx.
pub fn check_body(bytes: &[u8]) {
    let request = Request::post("/v1/check")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes.to_vec()))
        .unwrap();
    let status = call(request);
    assert!(!status.is_server_error(), "{status} for {bytes:?}");
}

/// `/v1/auth` inputs: the original method, URI and client, and the query, one per line.
pub fn auth(bytes: &[u8]) {
    let mut lines = bytes.split(|&b| b == b'\n');
    let mut next = || lines.next().unwrap_or_default();
    let (method, uri, ip, query) = (next(), next(), next(), next());
    let query = String::from_utf8_lossy(query);
    let query: String = query
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '#')
        .collect();
    let Ok(request) = Request::get(format!("/v1/auth?{query}"))
        .header("x-original-method", method)
        .header("x-original-uri", uri)
        .header("x-real-ip", ip)
        .header("x-kind", "mobile")
        .body(Body::empty())
    else {
        return;
    };
    let status = call(request);
    assert!(!status.is_server_error(), "{status} for {bytes:?}");
}

fn call(request: Request<Body>) -> StatusCode {
    let harness = harness();
    let connection = harness.http.clone();
    let response = harness
        .runtime
        .block_on(connection.oneshot(request))
        .unwrap();
    response.status()
}

/// A `ShouldRateLimit` message, as bytes: answered, or refused with a status that blames
/// the request, never `INTERNAL` or `UNKNOWN`.
pub fn rls_request(bytes: &[u8]) {
    let mut framed = vec![0];
    framed.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    framed.extend_from_slice(bytes);
    let request = Request::post("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .header(header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Body::from(framed)))
        .unwrap();
    let harness = harness();
    let server = harness.grpc.clone();
    let response = harness.runtime.block_on(server.oneshot(request)).unwrap();
    let status = response
        .headers()
        .get("grpc-status")
        .map(|s| s.as_bytes().to_vec());
    let status = match status {
        Some(status) => status,
        None => {
            let trailers = harness.runtime.block_on(async {
                use http_body_util::BodyExt;
                response
                    .into_body()
                    .collect()
                    .await
                    .ok()?
                    .trailers()
                    .cloned()
            });
            trailers
                .and_then(|t| t.get("grpc-status").map(|s| s.as_bytes().to_vec()))
                .unwrap_or_else(|| b"0".to_vec())
        }
    };
    let status = String::from_utf8_lossy(&status).into_owned();
    assert!(
        status != "13" && status != "2",
        "status {status} for {bytes:?}"
    );
}

/// A path pattern and a path, on two lines: parses or says why, matches or not, never
/// panicking.
pub fn path_pattern(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let (pattern, path) = text.split_once('\n').unwrap_or((&text, "/"));
    if let Ok(pattern) = PathPattern::parse(pattern) {
        let _ = pattern.matches(path);
    }
}
