//! Envoy's rate limit service over gRPC, from a real client, on the shipped Envoy example:
//! per-descriptor statuses, hits_addend, replaces, unlimited, blocked, shadow mode, each
//! descriptor counting its own hits, and INVALID_ARGUMENT for bad requests. (What
//! envoyproxy/ratelimit's own tests expect is in `envoy_compat.rs`.)

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::json;
use support::{Server, check, descriptor};
use tonic::transport::Channel;

fn example() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/envoy-ratelimit.yaml"
    ))
    .unwrap()
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap()
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .unwrap()
        .into_inner()
}

/// At least 800 ms left of the current second, so that checks of a per-second limit share
/// one window.
async fn fresh_second() {
    support::clear_of_a_windows_turn(Duration::from_secs(1), Duration::from_millis(800)).await;
}

fn codes(response: &RateLimitResponse) -> Vec<i32> {
    response.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn statuses_limits_and_remaining_per_descriptor() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    let ip = descriptor(&[("remote_address", "10.0.0.1")]);
    fresh_second().await;
    let response = ask(&mut c, vec![ip.clone()], 0).await;
    assert_eq!(response.overall_code, OK);
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, status.limit_remaining), (10, 9));
    assert!(status.duration_until_reset.is_some());
    // hits_addend: 9 more take the rest; one more is over.
    assert_eq!(
        ask(&mut c, vec![ip.clone()], 9).await.statuses[0].limit_remaining,
        0
    );
    let over = ask(&mut c, vec![ip], 1).await;
    assert_eq!((over.overall_code, codes(&over)), (OVER, vec![OVER]));
}

#[tokio::test]
async fn each_descriptor_counts_its_hits_whatever_the_others_outcome() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    let login = descriptor(&[("tenant", "t1"), ("path", "/login")]);
    let ip = descriptor(&[("remote_address", "10.0.0.2")]);
    support::clear_of_a_minutes_turn().await;
    fresh_second().await;
    for _ in 0..5 {
        assert_eq!(
            ask(&mut c, vec![login.clone(), ip.clone()], 1)
                .await
                .overall_code,
            OK
        );
    }
    // The login limit (5 per minute) is spent: the request is over, and the address counts
    // its hit all the same, as in Envoy's service.
    let response = ask(&mut c, vec![login, ip.clone()], 1).await;
    assert_eq!(
        (response.overall_code, codes(&response)),
        (OVER, vec![OVER, OK])
    );
    let alone = ask(&mut c, vec![ip], 1).await;
    assert_eq!(alone.statuses[0].limit_remaining, 3);
}

#[tokio::test]
async fn replaces_unlimited_blocked_and_shadow() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    // The login limit replaces the per-path one in the same request.
    let both = vec![
        descriptor(&[("tenant", "t"), ("path", "/other")]),
        descriptor(&[("tenant", "t"), ("path", "/login")]),
    ];
    let response = ask(&mut c, both, 1).await;
    assert!(response.statuses[0].current_limit.is_none(), "{response:?}");
    assert_eq!(
        response.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );

    let internal = ask(&mut c, vec![descriptor(&[("caller", "internal")])], 1_000).await;
    assert_eq!(internal.overall_code, OK);
    let banned = ask(&mut c, vec![descriptor(&[("caller", "banned")])], 1).await;
    assert_eq!(banned.overall_code, OVER);

    // A shadow descriptor past its limit is still OK.
    let key = descriptor(&[("api_key", "k")]);
    assert_eq!(
        ask(&mut c, vec![key.clone()], 10_000).await.overall_code,
        OK
    );
    assert_eq!(ask(&mut c, vec![key], 1).await.overall_code, OK);
}

#[tokio::test]
async fn wildcards_share_one_budget_when_asked_to() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    let first = ask(&mut c, vec![descriptor(&[("user_agent", "bot-a")])], 600).await;
    assert_eq!(first.statuses[0].limit_remaining, 400);
    let second = ask(&mut c, vec![descriptor(&[("user_agent", "bot-b")])], 600).await;
    assert_eq!(second.overall_code, OVER);
}

#[tokio::test]
async fn per_descriptor_hits_addend_and_the_http_form() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    let mut heavy = descriptor(&[("remote_address", "10.0.0.3")]);
    heavy.hits_addend = Some(UInt64Value { value: 7 });
    fresh_second().await;
    assert_eq!(
        ask(&mut c, vec![heavy], 1).await.statuses[0].limit_remaining,
        3
    );
    // The same counters over HTTP.
    let body = json!({
        "domain": "edge",
        "descriptors": [{ "entries": [{ "key": "remote_address", "value": "10.0.0.3" }] }],
        "cost": 3
    });
    let (status, _, answer) = check(&reqwest::Client::new(), &server.http, body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["decisions"][0]["remaining"], 0);
    assert_eq!(
        check(&reqwest::Client::new(), &server.http, body).await.0,
        429
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_arguments() {
    let server = Server::start(&[("envoy.yaml", &example())], &[]);
    let mut c = client(&server).await;
    let empty_domain = RateLimitRequest {
        domain: String::new(),
        descriptors: vec![descriptor(&[("a", "b")])],
        hits_addend: 1,
    };
    let err = c.should_rate_limit(empty_domain).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let none = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![],
        hits_addend: 1,
    };
    assert_eq!(
        c.should_rate_limit(none).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    // A cost no limit can admit is over the limit, as in Envoy's service, not an error.
    let absurd = ask(
        &mut c,
        vec![descriptor(&[("remote_address", "y")])],
        u32::MAX,
    )
    .await;
    assert_eq!(absurd.overall_code, OVER);
    // An unknown domain limits nothing, as in Envoy's service.
    let other = RateLimitRequest {
        domain: "unknown".into(),
        descriptors: vec![descriptor(&[("a", "b")])],
        hits_addend: 1,
    };
    assert_eq!(
        c.should_rate_limit(other)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        OK
    );
    // Nothing was lost: the address still has all its permits.
    fresh_second().await;
    let fresh = ask(&mut c, vec![descriptor(&[("remote_address", "x")])], 1).await;
    assert_eq!(fresh.statuses[0].limit_remaining, 9);
}

/// The answer's `response_headers_to_add`, as (name, value) pairs.
fn fields(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn answers_carry_the_rate_limit_fields_when_asked() {
    // Off by default, as in Envoy's own service.
    let plain = Server::start(&[("envoy.yaml", &example())], &[]);
    let ip = descriptor(&[("remote_address", "10.0.0.9")]);
    let answer = ask(&mut client(&plain).await, vec![ip.clone()], 1).await;
    assert!(answer.response_headers_to_add.is_empty());

    // On from the command line, or from a native file's `server` section.
    let native = "server: { grpc: 127.0.0.1:0, grpc_response_headers: true }\n";
    for server in [
        Server::start(&[("envoy.yaml", &example())], &["--grpc-response-headers"]),
        Server::start(&[("envoy.yaml", &example()), ("server.yaml", native)], &[]),
    ] {
        let mut c = client(&server).await;
        fresh_second().await;
        let first = fields(&ask(&mut c, vec![ip.clone()], 4).await);
        assert_eq!(field(&first, "x-ratelimit-limit"), Some("10"), "{first:?}");
        assert_eq!(field(&first, "x-ratelimit-remaining"), Some("6"));
        assert_eq!(field(&first, "x-ratelimit-reset"), Some("1"));
        assert_eq!(field(&first, "retry-after"), None);
        let policy = field(&first, "ratelimit-policy").unwrap();
        assert!(policy.ends_with(";q=10;w=1"), "{policy}");
        let limit = field(&first, "ratelimit").unwrap();
        assert!(limit.ends_with(";r=6;t=1"), "{limit}");

        let over = ask(&mut c, vec![ip.clone()], 7).await;
        assert_eq!(over.overall_code, OVER);
        let over = fields(&over);
        assert_eq!(field(&over, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(field(&over, "retry-after"), Some("1"), "{over:?}");
    }
}

/// Envoy AI Gateway's usage-based limits: on the request, a check of cost 0 (the descriptor's
/// own `hits_addend`); when the answer's stream ends, its tokens as `hits_addend`, whose answer
/// Envoy does not wait for. With a 1,000-token budget, a 1,200-token answer completes, and the
/// next request is refused; another tenant is not.
#[tokio::test]
async fn the_ai_gateway_pattern_reports_tokens_after_the_answer() {
    let budget = "domain: ai-gateway\ndescriptors:\n  - key: tenant\n    rate_limit: { unit: day, requests_per_unit: 1000 }\n";
    let server = Server::start(&[("ai.yaml", budget)], &[]);
    let mut c = client(&server).await;
    let with_hits = |tenant: &str, hits: u64| {
        let mut d = descriptor(&[("tenant", tenant)]);
        d.hits_addend = Some(UInt64Value { value: hits });
        d
    };
    let mut ask = async |tenant: &str, hits: u64| {
        c.should_rate_limit(RateLimitRequest {
            domain: "ai-gateway".into(),
            descriptors: vec![with_hits(tenant, hits)],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner()
    };
    // The request: a look, admitted with the whole budget left.
    let request = ask("acme", 0).await;
    assert_eq!(request.overall_code, OK);
    assert_eq!(request.statuses[0].limit_remaining, 1_000);
    // The answer streamed 1,200 tokens: all counted, past the budget.
    let usage = ask("acme", 1_200).await;
    assert_eq!(usage.statuses[0].limit_remaining, 0);
    // The next request is refused; another tenant's is not.
    let next = ask("acme", 0).await;
    assert_eq!((next.overall_code, codes(&next)), (OVER, vec![OVER]));
    assert_eq!(ask("beta", 0).await.overall_code, OK);
}

/// Envoy's negative hits (`is_negative_hits`): a descriptor counted to 5, then 3 negative hits
/// leave 2, then 10 leave 0, not below, each answered OK; and the pattern Envoy users build
/// concurrency caps with, +1 when a stream starts and -1 when it is done. On `files` (the
/// memory store, or Redis with a store file beside them).
async fn negative_hits_give_back(files: &[(&str, &str)]) {
    const STREAMS: &str = "domain: streams\ndescriptors:\n  - key: tenant\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n  - key: api_key\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let mut all = vec![("streams.yaml", STREAMS)];
    all.extend_from_slice(files);
    let server = Server::start(&all, &[]);
    let mut c = client(&server).await;
    let ask = |descriptor: RateLimitDescriptor, hits: u32| RateLimitRequest {
        domain: "streams".into(),
        descriptors: vec![descriptor],
        hits_addend: hits,
    };
    let negative = |entries: &[(&str, &str)]| RateLimitDescriptor {
        is_negative_hits: true,
        ..descriptor(entries)
    };
    let tenant = [("tenant", "acme")];
    let left = |r: &RateLimitResponse| {
        (
            r.overall_code,
            r.statuses[0].code,
            r.statuses[0].limit_remaining,
        )
    };
    let counted = c
        .should_rate_limit(ask(descriptor(&tenant), 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left(&counted), (OK, OK, 95));
    let three = c
        .should_rate_limit(ask(negative(&tenant), 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left(&three), (OK, OK, 98), "5 - 3 = 2 counted");
    let ten = c
        .should_rate_limit(ask(negative(&tenant), 10))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left(&ten), (OK, OK, 100), "floored at 0");
    let look = c
        .should_rate_limit(ask(descriptor(&tenant), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left(&look), (OK, OK, 99), "counting starts again from 0");

    // +1 per stream started, -1 per stream done: at most 2 streams of one key at once.
    let key = [("api_key", "k1")];
    for _ in 0..2 {
        let started = c
            .should_rate_limit(ask(descriptor(&key), 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(started.overall_code, OK);
    }
    let third = c
        .should_rate_limit(ask(descriptor(&key), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(third.overall_code, OVER, "two streams open");
    // Envoy gives back the two streams that started, when each is done. The refused third
    // stays counted (Envoy's service counts every hit, over the limit or not) until the
    // window ends: 1 counted, so one stream may start again, not two.
    for _ in 0..2 {
        let done = c
            .should_rate_limit(ask(negative(&key), 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(done.overall_code, OK, "a negative hit is never over");
    }
    let again = c
        .should_rate_limit(ask(descriptor(&key), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.overall_code, OK, "a stream done frees its place");
    let more = c
        .should_rate_limit(ask(descriptor(&key), 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(more.overall_code, OVER, "the refused hit still counts");
    let metrics = support::metrics(&server.http).await;
    assert!(
        metrics.contains("tollgate_envoy_negative_hits_total{descriptor=\"streams.tenant\"} 13"),
        "{metrics}"
    );
}

#[tokio::test]
async fn negative_hits_give_back_on_the_memory_store() {
    negative_hits_give_back(&[]).await;
}

#[tokio::test]
async fn negative_hits_give_back_on_redis() {
    let redis = support::Redis::start();
    let store = format!(
        "store: {{ kind: redis, url: '{}', mode: strict, timeout: 1s }}\n",
        redis.url()
    );
    negative_hits_give_back(&[("store.yaml", &store)]).await;
}

/// `POST /json` takes `isNegativeHits` as the gRPC service does; a value that is not a
/// boolean is refused.
#[tokio::test]
async fn negative_hits_over_json() {
    const STREAMS: &str = "domain: streams\ndescriptors:\n  - key: tenant\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n";
    let server = Server::start(&[("streams.yaml", STREAMS)], &[]);
    let post = |negative: serde_json::Value| {
        let body = json!({"domain": "streams", "hitsAddend": 4, "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}], "isNegativeHits": negative}]});
        let url = format!("{}/json", server.http);
        async move {
            let answer = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            (
                status,
                answer.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let (status, counted) = post(json!(false)).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["statuses"][0]["limitRemaining"], 96, "{counted}");
    let (status, given) = post(json!(true)).await;
    assert_eq!(status, 200, "{given}");
    assert_eq!(given["statuses"][0]["limitRemaining"], 100, "{given}");
    assert_eq!(post(json!("yes")).await.0, 400);
}
