//! The ceiling of the service benchmark: the same frameworks answering a constant and deciding
//! nothing: axum for every `POST /v1/check` (after reading its body), and, given a second
//! address, tonic for Envoy's `ShouldRateLimit` (always OK). `POST /v1/layered` is the same
//! handler behind tollgate's tower layer (GCRA, a billion per minute per `x-tenant`), to
//! measure what the layer adds; `POST /v1/identity` the same handler behind a layer that
//! changes nothing, to measure what axum charges for any layer; `POST /v1/fields` the same
//! handler behind a layer that adds the rate limit fields tollgate's layer writes, as
//! constants, deciding nothing: the floor of any layer that must write them. Given a third
//! address, the ceiling's app whole, wrapped in tollgate's layer from outside the router (as
//! a hyper or `ServiceBuilder` user applies it), where axum boxes nothing more. Given a fourth
//! address, the ceiling's handler with no router in front of it, as `tollgate serve` answers
//! its two checks.
//!
//! Run: `cargo run --release -p tollgate-server --example trivial -- 127.0.0.1:9000 127.0.0.1:9001`

use axum::body::Bytes;
use axum::http::{HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Router, ServiceExt};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::layer::{KeyExtractor, RateLimitLayer};
use tollgate::{Algorithm, Limiter, Rule, Tier};
use tower::Layer;

struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        }))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let http = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    if let Some(grpc) = args.next() {
        let addr = grpc.parse()?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(AlwaysOk))
                .serve(addr),
        );
    }
    let handler = |body: Bytes| async move {
        let _ = body.len();
        ([("content-type", "application/json")], "{\"allowed\":true}")
    };
    let rule = Rule::new("bench", Algorithm::Gcra, [Tier::per_minute(1_000_000_000)])?;
    let layer = RateLimitLayer::new(Limiter::new(rule), KeyExtractor::header("x-tenant"));
    // What axum charges for any layer: one that passes every answer through unchanged.
    let identity = tower::util::MapResponseLayer::new(|r: axum::response::Response| r);
    // The fields tollgate's layer adds to this rule's answers, as constants of the same length,
    // inserted as it inserts them (names known at compile time, room reserved first).
    let fields = tower::util::MapResponseLayer::new(|mut r: axum::response::Response| {
        const FIELDS: [(HeaderName, &str); 5] = [
            (HeaderName::from_static("x-ratelimit-limit"), "1000000000"),
            (
                HeaderName::from_static("x-ratelimit-remaining"),
                "999999999",
            ),
            (HeaderName::from_static("x-ratelimit-reset"), "1"),
            (
                HeaderName::from_static("ratelimit-policy"),
                "\"bench\";q=1000000000;w=60",
            ),
            (
                HeaderName::from_static("ratelimit"),
                "\"bench\";r=999999999;t=1",
            ),
        ];
        let headers = r.headers_mut();
        headers.reserve(FIELDS.len());
        for (name, value) in FIELDS {
            headers.insert(name, HeaderValue::from_static(value));
        }
        r
    });
    if let Some(wrapped) = args.next() {
        let app = layer.layer(Router::new().route("/v1/check", post(handler)));
        let listener = tokio::net::TcpListener::bind(&wrapped).await?;
        let app = ServiceExt::<axum::extract::Request>::into_make_service(app);
        tokio::spawn(axum::serve(listener, app).into_future());
    }
    if let Some(bare) = args.next() {
        let app = tower::service_fn(move |request: axum::extract::Request| async move {
            let body = axum::body::to_bytes(request.into_body(), usize::MAX).await;
            Ok::<_, std::convert::Infallible>(
                handler(body.unwrap_or_default()).await.into_response(),
            )
        });
        let listener = tokio::net::TcpListener::bind(&bare).await?;
        let app = ServiceExt::<axum::extract::Request>::into_make_service(app);
        tokio::spawn(axum::serve(listener, app).into_future());
    }
    let app = Router::new()
        .route("/v1/check", post(handler))
        .route("/v1/identity", post(handler).layer(identity))
        .route("/v1/fields", post(handler).layer(fields))
        .route("/v1/layered", post(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind(&http).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
