//! Envoy domains over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`), from a management server the tests
//! start (`xds_server`), as Envoy Gateway and AI Gateway configure envoyproxy/ratelimit: the
//! first push serves; an update changes limits without losing the counts of those it keeps;
//! an invalid push is NACKed with the reason and changes nothing; a server killed and
//! restarted is subscribed to again, the last good limits serving meanwhile; TLS with a client
//! certificate; nothing listens before the first push unless told to start without it.

use crate::support;
use crate::xds_server;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::{Server, descriptor};
use xds_server::{Management, Tls, resource};

const FOO: &str = "domain: foo\ndescriptors:\n  - key: k1\n    value: v1\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: k2\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n";
const BAR: &str = "domain: bar\ndescriptors:\n  - key: k1\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n";

/// The settings that subscribe to `server`, quickly again when it goes away.
fn settings(server: &Management) -> Vec<String> {
    vec![
        "CONFIG_TYPE=GRPC_XDS_SOTW".into(),
        server.url_setting(),
        "CONFIG_GRPC_XDS_NODE_ID=test-node".into(),
        "CONFIG_GRPC_XDS_NODE_METADATA=zone=a,team=edge".into(),
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=x-tenant:acme".into(),
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=100ms".into(),
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=200ms".into(),
    ]
}

fn start(env: &[String]) -> Server {
    let wrapper: Vec<&str> = std::iter::once("env")
        .chain(env.iter().map(String::as_str))
        .collect();
    Server::start_under(&wrapper, &[], &[])
}

/// Asks `domain` about one descriptor; (code, remaining) of its status.
async fn ask(server: &Server, domain: &str, entries: &[(&str, &str)]) -> (i32, u32) {
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let response: RateLimitResponse = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![descriptor(entries)],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    (
        response.statuses[0].code,
        response.statuses[0].limit_remaining,
    )
}

/// Asks until the answer's limit reads `limit` (a push being applied), within 10 s.
async fn until_limit(server: &Server, domain: &str, entries: &[(&str, &str)], limit: u32) {
    for _ in 0..200 {
        let mut client = RateLimitServiceClient::connect(server.grpc.clone())
            .await
            .unwrap();
        let response = client
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors: vec![descriptor(entries)],
                hits_addend: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let now = response.statuses[0]
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit);
        if now == limit {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the limit of {domain} {entries:?} never became {limit}");
}

const OK: i32 = 1;
const OVER: i32 = 2;
const SECOND: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_serve_update_and_invalid_ones_are_refused() {
    let management = Management::start(Some(("1".into(), vec![resource("foo", FOO)])), None);
    let server = start(&settings(&management));
    // The first push serves.
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 4));
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 3));
    // ...and was ACKed: version 1, no error; the node and its metadata, and the headers.
    let ack = management.wait_for_request(SECOND, |r| r.version_info == "1");
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(ack.response_nonce, "1");
    let node = ack.node.unwrap();
    assert_eq!(node.id, "test-node");
    let metadata = node.metadata.unwrap().fields;
    assert_eq!(metadata.len(), 2, "{metadata:?}");
    let headers = management.state.headers.lock().unwrap()[0].clone();
    assert_eq!(headers.get("x-tenant").unwrap(), "acme");

    // An update: a new domain, k2's limit changed, k1_v1's kept with its count.
    let changed = FOO.replace("requests_per_unit: 3", "requests_per_unit: 7");
    management.set("2", vec![resource("foo", &changed), resource("bar", BAR)]);
    until_limit(&server, "foo", &[("k2", "x")], 7).await;
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 2));
    assert_eq!(ask(&server, "bar", &[("k1", "y")]).await, (OK, 99));
    management.wait_for_request(SECOND, |r| r.version_info == "2");

    // An invalid push: NACKed with the reason, still at version 2; nothing changes.
    let invalid = FOO.replace(
        "unit: hour, requests_per_unit: 5",
        "unit: fortnight, requests_per_unit: 5",
    );
    management.set("3", vec![resource("foo", &invalid)]);
    let nack = management.wait_for_request(SECOND, |r| r.error_detail.is_some());
    assert_eq!(nack.version_info, "2");
    let why = nack.error_detail.unwrap().message;
    assert!(why.contains("invalid rate limit unit 'UNKNOWN'"), "{why}");
    assert!(why.contains("xds:foo"), "{why}");
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 1));
    assert_eq!(ask(&server, "bar", &[("k1", "y")]).await, (OK, 98));
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_xds_pushes_total{result=\"rejected\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ratelimit_service_config_load_error 1"),
        "{metrics}"
    );
    // A valid push after it applies.
    management.set("4", vec![resource("foo", FOO)]);
    until_limit(&server, "foo", &[("k2", "x")], 3).await;
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 0));
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OVER, 0));
    // bar is gone: its descriptors match nothing.
    assert_eq!(ask(&server, "bar", &[("k1", "y")]).await, (OK, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_is_subscribed_to_again() {
    let mut management = Management::start(Some(("1".into(), vec![resource("foo", FOO)])), None);
    let server = start(&settings(&management));
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 4));
    // The client acknowledges version 1 after it applies the limits, so the acknowledgement
    // can still be on its way when the limits answer; it is in before the kill, so that the
    // resubscription below is the second request to hold that version.
    let acked = std::time::Instant::now() + SECOND;
    while !management.requests().iter().any(|r| r.version_info == "1") {
        assert!(
            std::time::Instant::now() < acked,
            "version 1 never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    management.kill();
    server.wait_for_log("the xDS subscription broke", SECOND);
    // The last good limits keep serving.
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 3));
    // Back, with a newer snapshot: the client comes back holding version 1, and gets 2.
    management.set(
        "2",
        vec![resource(
            "foo",
            &FOO.replace("requests_per_unit: 3", "requests_per_unit: 9"),
        )],
    );
    management.restart();
    until_limit(&server, "foo", &[("k2", "x")], 9).await;
    let requests = management.requests();
    assert!(
        requests.iter().filter(|r| r.version_info == "1").count() >= 2,
        "the version held is sent again on resubscribing: {requests:#?}"
    );
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key, client_cert, client_key] = support::certificates(dir.path());
    let tls = Tls {
        cert,
        key,
        client_ca: ca.clone(),
    };
    let management = Management::start(Some(("1".into(), vec![resource("foo", FOO)])), Some(tls));
    let path = |p: &std::path::Path| p.display().to_string();
    let mut env = settings(&management);
    env[1] = format!(
        "CONFIG_GRPC_XDS_SERVER_URL=localhost:{}",
        management.addr.port()
    );
    env.extend([
        "CONFIG_GRPC_XDS_SERVER_USE_TLS=true".to_string(),
        format!("CONFIG_GRPC_XDS_SERVER_TLS_CACERT={}", path(&ca)),
        format!("CONFIG_GRPC_XDS_CLIENT_TLS_CERT={}", path(&client_cert)),
        format!("CONFIG_GRPC_XDS_CLIENT_TLS_KEY={}", path(&client_key)),
    ]);
    let server = start(&env);
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 4));

    // Without the client certificate, the server refuses it: no push
    // (`FORCE_START_WITHOUT_INITIAL_CONFIG` to see it serve none meanwhile).
    let mut without: Vec<String> = env
        .iter()
        .filter(|s| !s.starts_with("CONFIG_GRPC_XDS_CLIENT_TLS"))
        .cloned()
        .collect();
    without.push("FORCE_START_WITHOUT_INITIAL_CONFIG=true".into());
    let refused = start(&without);
    // TLS 1.3 ends the handshake before the server checks the client's certificate: the
    // refusal breaks the subscription.
    refused.wait_for_log("the xDS subscription broke", SECOND);
    assert_eq!(ask(&refused, "foo", &[("k1", "v1")]).await, (OK, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listens_before_the_first_push() {
    let management = Management::start(None, None);
    let env = settings(&management);
    let starting = std::thread::spawn(move || {
        let server = start(&env);
        let started = std::time::Instant::now();
        (server, started)
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let pushed = std::time::Instant::now();
    management.set("1", vec![resource("foo", FOO)]);
    let (server, started) = starting.join().unwrap();
    assert!(started >= pushed, "it listened before the first push");
    assert!(
        server
            .logged("waiting for the xDS server's first push")
            .is_some()
    );
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 4));
}

/// With `FORCE_START_WITHOUT_INITIAL_CONFIG` it serves at once; with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` it says it is unhealthy until a push with a
/// domain arrives, as envoyproxy/ratelimit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_without_a_push_it_is_unhealthy_until_one_arrives() {
    let management = Management::start(None, None);
    let mut env = settings(&management);
    env.push("FORCE_START_WITHOUT_INITIAL_CONFIG=true".into());
    env.push("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true".into());
    let server = start(&env);
    let health = || async {
        reqwest::get(format!("{}/healthcheck", server.http))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(health().await, 500);
    assert_eq!(ask(&server, "foo", &[("k1", "v1")]).await, (OK, 0));
    management.set("1", vec![resource("foo", FOO)]);
    until_limit(&server, "foo", &[("k1", "v1")], 5).await;
    assert_eq!(health().await, 200);
}
