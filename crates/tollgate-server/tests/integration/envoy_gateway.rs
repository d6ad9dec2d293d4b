//! tollgate's image in the place of envoyproxy/ratelimit's in an Envoy Gateway install, run
//! as Envoy Gateway's rate limit Deployment runs its container (envoyproxy/gateway,
//! `internal/infrastructure/kubernetes/ratelimit`, its `testdata/deployments/default.yaml`):
//! the command `/bin/ratelimit`, its environment as given there, certificates at `/certs`, a
//! mapping at `/etc/statsd-exporter/conf.yaml`, a read-only root, user 65534, no
//! capabilities. Redis answers at `redis.redis.svc:6379` and the management server at
//! `envoy-gateway:18001`, over TLS with the certificates' CA, on a private network. The
//! limits it pushes are served over gRPC with TLS on 8081; `/healthcheck` answers on 8080 and
//! the metrics on 19001, the ports its probes and Service name.

use crate::support;
use crate::xds_server;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::docker::{Container, Network, image};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use xds_server::{Management, Tls, resource};

/// The environment Envoy Gateway gives the container, as its default Deployment does.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// A statsd mapping to the default names, as Envoy Gateway's `statsd-exporter-config` is.
const MAPPING: &str = "mappings:
  - match: \"ratelimit.service.rate_limit.*.*.total_hits\"
    name: \"ratelimit_service_rate_limit_total_hits\"
    timer_type: histogram
    labels: { domain: \"$1\", key1: \"$2\" }
  - match: \"ratelimit.service.config_load_success\"
    name: \"ratelimit_service_config_load_success\"
    match_metric_type: counter
";

/// A route's limit as Envoy Gateway pushes it: a domain per listener, a descriptor per rule.
const ROUTE: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0
    value: httproute/default/backend/rule/0/match/0
    rate_limit: { unit: hour, requests_per_unit: 2 }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_serves_as_envoy_gateways_rate_limit_service() {
    let image = image();
    let network = Network::create();
    let _redis = network.run_as("redis.redis.svc", "redis:7-bookworm");

    // The Secret Envoy Gateway mounts at /certs: its CA, and the rate limit service's
    // certificate, which serves gRPC and is its client certificate to the management server.
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let [ca, gateway_cert, gateway_key, cert, key] =
        support::certificates_for(&certs, &["envoy-gateway"], &["envoy-ratelimit"]);
    for (from, to) in [(&cert, "tls.crt"), (&key, "tls.key"), (&ca, "ca.crt")] {
        std::fs::copy(from, certs.join(to)).unwrap();
    }
    let mapping = dir.path().join("statsd-exporter");
    std::fs::create_dir(&mapping).unwrap();
    std::fs::write(mapping.join("conf.yaml"), MAPPING).unwrap();
    readable_by_anyone(dir.path());

    // The management server, where the container finds `envoy-gateway:18001`.
    let gateway = network.gateway();
    let management = Management::start_on(
        (gateway, 18001).into(),
        Some(("1".into(), vec![resource("default/eg/http", ROUTE)])),
        Some(Tls {
            cert: gateway_cert,
            key: gateway_key,
            client_ca: ca.clone(),
        }),
    );

    let mut args: Vec<String> = [
        "--network",
        &network.name,
        "--add-host",
        &format!("envoy-gateway:{gateway}"),
        "--entrypoint",
        "/bin/ratelimit",
        "--read-only",
        "--user",
        "65534:65534",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &format!("{}:/certs:ro", certs.display()),
        "-v",
        &format!("{}:/etc/statsd-exporter:ro", mapping.display()),
        "-p",
        "127.0.0.1::8080",
        "-p",
        "127.0.0.1::8081",
        "-p",
        "127.0.0.1::19001",
    ]
    .map(String::from)
    .into();
    for (name, value) in ENVIRONMENT {
        args.extend(["-e".into(), format!("{name}={value}")]);
    }
    args.push(image);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ratelimit = Container::run(&args);

    // Its probes' route, on 8080.
    let health = format!("http://127.0.0.1:{}/healthcheck", ratelimit.port(8080));
    ratelimit.until_ok(&health).await;

    // Envoy's checks, over TLS on 8081, against the pushed limit of 2 an hour.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
        .domain_name("envoy-ratelimit");
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", ratelimit.port(8081)))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while codes.len() < 3 {
        let key = "httproute/default/backend/rule/0/match/0";
        let answer = client
            .should_rate_limit(RateLimitRequest {
                domain: "default/eg/http".into(),
                descriptors: vec![support::descriptor(&[(key, key)])],
                hits_addend: 1,
            })
            .await
            .unwrap()
            .into_inner();
        // Until the first push is applied, the domain is unknown: OK with no limit.
        if answer.statuses[0].current_limit.is_some() {
            codes.push(answer.overall_code);
        } else {
            assert!(
                std::time::Instant::now() < deadline,
                "no push applied: {}",
                ratelimit.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
    let subscribed = management.requests();
    assert!(
        subscribed
            .iter()
            .any(|r| r.node.as_ref().is_some_and(|n| n.id == "envoy-ratelimit")),
        "{subscribed:?}"
    );

    // Its metrics, on 19001, under the mapping's names; the counts are Redis's.
    let metrics = support::metrics(&format!("http://127.0.0.1:{}", ratelimit.port(19001))).await;
    assert!(
        metrics.contains("ratelimit_service_rate_limit_total_hits{"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_store_seconds_count{store=\"redis"),
        "{metrics}"
    );
    drop(client);
    let (code, _) = ratelimit.stop(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", ratelimit.logs());
}

/// Files the container's user (not the test's) reads.
fn readable_by_anyone(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        if path.is_dir() {
            readable_by_anyone(&path);
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}
