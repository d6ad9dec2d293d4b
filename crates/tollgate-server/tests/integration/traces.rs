//! OpenTelemetry traces, received by OTLP receivers of the test's own (HTTP and gRPC): a span
//! per check arrives, a child of the caller's trace (W3C `traceparent` over HTTP, B3 over
//! gRPC), with the rule, the store and what decided, and a child span per Redis call; the
//! sampling rate is honoured, and a caller's decision wins over it.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use serde_json::json;
use support::{Redis, Server, descriptor};

/// A span as received: its trace, its id, its parent, its name, its attributes (as text)
/// and its service's name.
#[derive(Debug, Clone)]
struct Received {
    trace: String,
    id: String,
    parent: String,
    name: String,
    attributes: Vec<(String, String)>,
    service: String,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn keep(spans: &Spans, request: ExportTraceServiceRequest) {
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    };
    let mut kept = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                kept.push(Received {
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(&a.value)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
}

struct Grpc(Spans);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP receiver over HTTP (`POST /v1/traces`, protobuf) or gRPC, on a free port.
async fn receiver(grpc: bool) -> (SocketAddr, Spans) {
    let spans = Spans::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let kept = spans.clone();
    if grpc {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Grpc(kept)))
                .serve_with_incoming(incoming),
        );
    } else {
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    keep(&kept, ExportTraceServiceRequest::decode(body).unwrap());
                    ExportTraceServiceResponse::default().encode_to_vec()
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    (addr, spans)
}

/// Waits until a span passes `test`; all the spans received then.
async fn wait_for(spans: &Spans, test: impl Fn(&Received) -> bool) -> Vec<Received> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = spans.lock().unwrap().clone();
        if now.iter().any(&test) {
            return now;
        }
        assert!(Instant::now() < deadline, "no such span: {now:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_a_span_of_the_callers_trace_with_its_redis_call() {
    let (addr, spans) = receiver(false).await;
    let redis = Redis::start();
    let rules = format!(
        "server:\n  tracing: {{ protocol: http, endpoint: 'http://{addr}/v1/traces', service_name: edge-limits }}\n\
         store: {{ kind: redis, url: '{}', mode: strict }}\n\
         rules:\n  - id: per-user\n    key: [header:x-user]\n    tiers: [{{ limit: 5, period: 1m }}]\n",
        redis.url()
    );
    let server = Server::start_under(
        &["env", "OTEL_BSP_SCHEDULE_DELAY=100"],
        &[("rules.yaml", &rules)],
        &[],
    );
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/check", server.http))
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .json(&json!({ "rule": "per-user", "key": "ada" }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let all = wait_for(&spans, |s| s.name == "FCALL" && s.trace == TRACE).await;
    let check = all
        .iter()
        .find(|s| s.name == "POST /v1/check")
        .unwrap_or_else(|| panic!("{all:#?}"));
    assert_eq!(
        (check.trace.as_str(), check.parent.as_str()),
        (TRACE, PARENT)
    );
    assert_eq!(check.service, "edge-limits");
    assert_eq!(check.attribute("tollgate.rule"), Some("per-user"));
    assert_eq!(check.attribute("tollgate.store"), Some("redis"));
    assert_eq!(check.attribute("tollgate.decided_by"), Some("redis"));
    assert_eq!(check.attribute("tollgate.allowed"), Some("true"));
    let call = all
        .iter()
        .find(|s| s.name == "FCALL" && s.trace == TRACE)
        .unwrap();
    assert_eq!(
        (call.trace.as_str(), call.parent.as_str()),
        (TRACE, check.id.as_str())
    );
    assert_eq!(call.attribute("db.system"), Some("redis"));

    // Redis gone: the policy decided, and the span says so.
    drop(redis);
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/check", server.http))
        .json(&json!({ "rule": "per-user", "key": "ada" }))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success() || answer.status() == 429);
    wait_for(&spans, |s| {
        s.attribute("tollgate.decided_by") == Some("policy")
    })
    .await;
}

/// Over gRPC, as Envoy calls with B3 headers, exported over OTLP/gRPC with the Envoy
/// service's settings; a sampling rate of 0 keeps only the traces callers sampled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_calls_with_b3_and_the_sampling_rate_over_grpc() {
    let (addr, spans) = receiver(true).await;
    let endpoint = format!("OTEL_EXPORTER_OTLP_ENDPOINT=http://{addr}");
    let envoy = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let server = Server::start_under(
        &[
            "env",
            "TRACING_ENABLED=true",
            "TRACING_EXPORTER_PROTOCOL=grpc",
            "TRACING_SERVICE_NAME=rl",
            "TRACING_SAMPLING_RATE=0",
            "OTEL_BSP_SCHEDULE_DELAY=100",
            &endpoint,
        ],
        &[("envoy.yaml", envoy)],
        &[],
    );
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let ask = |b3: Option<String>| {
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("ip", "10.0.0.1")])],
            hits_addend: 1,
        });
        if let Some(b3) = b3 {
            request.metadata_mut().insert("b3", b3.parse().unwrap());
        }
        request
    };
    // Not sampled by the caller, or no caller's trace: not kept at a rate of 0.
    for i in 0..20 {
        let unsampled = format!("{:032x}-{PARENT}-0", i + 1);
        client
            .should_rate_limit(ask(Some(unsampled)))
            .await
            .unwrap();
        client.should_rate_limit(ask(None)).await.unwrap();
    }
    // Sampled by the caller: kept.
    let sampled = format!("{TRACE}-{PARENT}-1");
    client.should_rate_limit(ask(Some(sampled))).await.unwrap();
    let all = wait_for(&spans, |s| s.trace == TRACE).await;
    // Give a late batch of the unsampled a moment: there is none to come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all: Vec<Received> = spans
        .lock()
        .unwrap()
        .clone()
        .into_iter()
        .chain(all)
        .collect();
    assert!(all.iter().all(|s| s.trace == TRACE), "{all:#?}");
    let check = all.iter().find(|s| s.name == "ShouldRateLimit").unwrap();
    assert_eq!(check.parent, PARENT);
    assert_eq!(check.service, "rl");
    assert_eq!(check.attribute("tollgate.domain"), Some("edge"));
    assert_eq!(check.attribute("tollgate.store"), Some("memory"));
    assert_eq!(check.attribute("tollgate.decided_by"), Some("memory"));
}
