//! Health, readiness and metrics: `/healthz`, `/readyz`, `/metrics`, and the Envoy service's
//! `/healthcheck` and `POST /json`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Whether the process answers at all: always 200 `ok`.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses((status = 200, description = "The process answers.", content_type = "text/plain", body = String, example = "ok\n")),
)]
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// The Envoy ratelimit service's health check: 200 `OK` while healthy, else 500.
#[utoipa::path(
    get,
    path = "/healthcheck",
    tag = "envoy",
    description = "As envoyproxy/ratelimit's: 200 `OK` while healthy; 500 once SIGTERM arrives, while its Redis has not answered since start (or, with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, does not answer now), and, with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, until a domain is loaded.",
    responses(
        (status = 200, description = "Healthy.", content_type = "text/plain", body = String, example = "OK"),
        (status = 500, description = "Not healthy."),
    ),
)]
pub(super) async fn healthcheck(State(state): State<AppState>) -> Response {
    if state.service.healthy() {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// The Envoy ratelimit service's `POST /json`: a `RateLimitRequest` in protobuf's JSON
/// mapping, answered as over gRPC, in JSON, with 429 when over the limit; 400 and the reason
/// for a body that is not a request.
#[utoipa::path(
    post,
    path = "/json",
    tag = "envoy",
    request_body(
        description = "An `envoy.service.ratelimit.v3.RateLimitRequest` in protobuf's JSON mapping.",
        content_type = "application/json",
        content = Object,
        example = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}),
    ),
    responses(
        (status = 200, description = "A `RateLimitResponse` in protobuf's JSON mapping: within the limits.", content_type = "application/json", body = Object, example = json!({"overallCode": "OK", "statuses": [{"code": "OK", "currentLimit": {"requestsPerUnit": 10, "unit": "SECOND"}, "limitRemaining": 9, "durationUntilReset": "1s"}]})),
        (status = 429, description = "The same, over a limit.", content_type = "application/json", body = Object),
        (status = 400, description = "Not a request: `Bad Request: ` and the reason.", content_type = "text/plain", body = String),
    ),
)]
pub(super) async fn envoy_json(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Response {
    let bad = |reason: String| {
        let text = format!("Bad Request: {reason}\n");
        let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
        (StatusCode::BAD_REQUEST, plain, text).into_response()
    };
    let body = match axum::body::to_bytes(request.into_body(), state.max_body_bytes).await {
        Ok(body) => body,
        Err(e) => return bad(format!("the body cannot be read: {e}")),
    };
    if body.is_empty() {
        return bad("no body".into());
    }
    let request = match crate::envoy::json::request(&body) {
        Ok(request) => request,
        Err(reason) => return bad(reason),
    };
    match crate::envoy::rls::answer(&state.envoy, request, false).await {
        Ok(answer) => {
            let over = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit;
            let status = if answer.overall_code == over as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let json = [(header::CONTENT_TYPE, "application/json")];
            let body = crate::envoy::json::response(&answer).to_string();
            (status, json, body).into_response()
        }
        Err(status) => bad(status.message().to_string()),
    }
}

/// Whether the service can decide: rules are loaded and a shared store, if any, answers some
/// checks.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "Ready; on a Redis Cluster with failing masters, `ready, partly:` and which, and how many slots their rules' failure policies decide; with regions whose peers do not answer, `ready, partitioned:` and which (global rules then admit this region's share).", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "The shared store does not answer: every check is decided by its rule's failure policy.", content_type = "text/plain", body = String),
    ),
)]
pub(super) async fn ready(State(state): State<AppState>) -> Response {
    if !state.service.ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the shared store does not answer\n",
        )
            .into_response();
    }
    let unheard = state.service.unheard_peers();
    if !unheard.is_empty() {
        let peers: Vec<String> = unheard
            .iter()
            .map(|(name, heard)| match heard {
                Some(ago) => format!("{name} (unheard for {:.1}s)", ago.as_secs_f64()),
                None => format!("{name} (never heard)"),
            })
            .collect();
        return (
            StatusCode::OK,
            format!(
                "ready, partitioned: peer regions do not answer: {}; past each global rule's \
                 stale_after this region admits only its share of what is left\n",
                peers.join(", ")
            ),
        )
            .into_response();
    }
    match state.service.outage() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(outage) => (
            StatusCode::OK,
            format!(
                "ready, partly: {} of {} Redis masters failing ({}), {} of 16384 slots decided by \
                 the rules' failure policies\n",
                outage.failing.len(),
                outage.nodes,
                outage.failing.join(", "),
                outage.slots
            ),
        )
            .into_response(),
    }
}

/// The metrics, in Prometheus's text format (docs/metrics.md lists them).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses(
        (status = 200, description = "Every metric.", content_type = "text/plain; version=0.0.4", body = String),
        (status = 404, description = "Metrics are off (a service embedded without them).", content_type = "text/plain", body = String),
    ),
)]
pub(super) async fn render_metrics(State(state): State<AppState>) -> Response {
    state.service.observe();
    if let Some(registry) = &state.connections {
        crate::metrics::connections(registry.open(), registry.evicted());
    }
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are off\n").into_response(),
    }
}
