//! The HTTP API:
//!
//! - `POST /v1/check`: a request to match (`{"request": {"method", "path", "headers",
//!   "client_ip"}, "cost"}`), a rule and key (`{"rule", "key", "cost"}`), or Envoy descriptors
//!   (`{"domain", "descriptors": [{"entries": [{"key", "value"}]}], "cost"}`); answers 200 or
//!   429 with the decisions;
//! - `/v1/auth` (any method): nginx `auth_request` and other proxies' forward-auth; reads the
//!   original method and URI from `X-Original-Method` and `X-Original-URI` (or `X-Forwarded-*`),
//!   the client from `X-Real-IP`, and answers 204 or 429 (`?deny_status=403` for nginx, whose
//!   `auth_request` passes only 401 and 403 on);
//! - `POST /v1/release` and `POST /v1/extend`: the permits of concurrency rules
//!   (`permits.rs`);
//! - `/v1/rules`: the admin API (see [`admin`]), with `/v1/overrides`, `/v1/lists` and
//!   `/v1/regions` (this region, its peers, a global rule's use per region);
//! - `/v1/console/...` and `/console`: the console (see [`console`]);
//! - `/metrics`, `/healthz`, `/readyz`, and the Envoy service's `/healthcheck` and `POST
//!   /json` (`health.rs`).
//!
//! The two checks are in `check.rs`.
//!
//! Every answer about a limit carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`,
//! `Retry-After` when denied (whole seconds, rounded up: never early), and the IETF
//! `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers).

pub mod admin;
pub mod answers;
mod check;
pub mod console;
mod health;
mod lists;
mod metered;
pub mod openapi;
mod overrides;
mod permits;
mod regions;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tracing::Instrument;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::envoy::Envoy;
use crate::net::connections::{Registry, Tracked, Watched};
use crate::service::Service;

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The service.
    pub service: Arc<Service>,
    /// Envoy's answers over the service (descriptors in `/v1/check`, `POST /json`).
    pub envoy: Arc<Envoy>,
    /// Renders `/metrics`.
    pub metrics: Option<PrometheusHandle>,
    /// The admin API's bearer token; `None`: the admin API refuses every call.
    pub admin_token: Option<Arc<str>>,
    /// The largest request body read, in bytes; a larger one gets 413.
    pub max_body_bytes: usize,
    /// The connections of both listeners, for the metrics.
    pub connections: Option<Arc<Registry>>,
}

/// The path of the check API.
const CHECK: &str = "/v1/check";
/// The path of the nginx `auth_request` endpoint.
const AUTH: &str = "/v1/auth";

/// The router of the HTTP API's other endpoints: `/v1/check` and `/v1/auth` are served by
/// [`Connection`] before it. Admin bodies are bounded to `max_body_bytes` by a layer; the
/// check handler bounds its own.
fn router(state: AppState) -> Router {
    let limit = DefaultBodyLimit::max(state.max_body_bytes);
    let (router, mut document) = OpenApiRouter::with_openapi(openapi::Document::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::ready))
        .routes(routes!(health::healthcheck))
        .routes(routes!(health::envoy_json))
        .routes(routes!(health::render_metrics))
        .routes(routes!(openapi::document))
        .merge(admin::router().layer(limit))
        .merge(metered::router().layer(limit))
        .merge(overrides::router().layer(limit))
        .merge(permits::router().layer(limit))
        .merge(lists::router().layer(limit))
        .merge(regions::router())
        .split_for_parts();
    // The console's routes are described always, and served only where an admin token
    // guards them.
    let (console, described) = console::router().layer(limit).split_for_parts();
    document.merge(described);
    openapi::keep(document);
    let mut router = router;
    if state.admin_token.is_some() && state.service.console().is_some() {
        router = router.merge(console);
    }
    router.with_state(state)
}

/// Serves the HTTP API on `listener` until `shutdown` resolves, then lets the requests in
/// flight finish. Each connection is admitted and watched by `registry` (see
/// [`crate::net::connections`]): HTTP/1 request heads must arrive within its header timeout, and
/// a client that half-closes its side after its request still gets the answer. With `tls`,
/// each connection's TLS handshake must end within the header timeout; the decrypted stream
/// is watched.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    registry: Arc<Registry>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let router = router(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Each connection's task holds a sender: when all are dropped, every connection ended.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let handshake_timeout = registry.limits().header_timeout;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer, admitted) = tokio::select! {
            accepted = registry.accept_admitted(&listener) => accepted,
            () = &mut shutdown => break,
        };
        let (state, router, registry) = (state.clone(), router.clone(), registry.clone());
        let (stop, done, acceptor) = (stop_rx.clone(), done_tx.clone(), acceptor.clone());
        tokio::spawn(async move {
            let Some(acceptor) = acceptor else {
                let watched = registry.watched(tcp, peer, admitted, true);
                return serve_connection(watched, state, router, stop, done).await;
            };
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp));
            match handshake.await {
                Ok(Ok(tls)) => {
                    let watched = registry.watched(tls, peer, admitted, true);
                    serve_connection(watched, state, router, stop, done).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake did not end in time"),
            }
        });
    }
    let _ = stop_tx.send(true);
    drop(done_tx);
    let _ = done_rx.recv().await;
}

/// Serves one watched connection until it ends, or gracefully once `stop` says so.
async fn serve_connection<IO>(
    watched: Watched<IO>,
    state: AppState,
    router: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
    done: tokio::sync::mpsc::Sender<()>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = Connection {
        state,
        router,
        peer: watched.peer(),
        tracked: Some(watched.tracked().clone()),
    };
    // The header timeout is the watched IO's, with no timer per request.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .header_read_timeout(None)
        .max_buf_size(crate::net::framing::MAX_HEAD)
        .half_close(true);
    let service = tower::ServiceExt::map_request(
        connection,
        |request: axum::http::Request<hyper::body::Incoming>| request.map(Body::new),
    );
    let served = builder.serve_connection(TokioIo::new(watched), TowerToHyperService::new(service));
    let mut served = std::pin::pin!(served);
    tokio::select! {
        result = served.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended");
            }
        }
        () = async { drop(stop.wait_for(|stop| *stop).await) } => {
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        }
    }
    drop(done);
}

/// The HTTP API on one connection. The two checks, asked on every request of a service or
/// proxy, go straight to their handlers: the router would cost each an extension map (for
/// its `MatchedPath`), its extractors and its layers of futures, 3.0k of the 29k user-space
/// instructions of a JSON check and 3.5k of the 23.5k of an nginx one
/// (`benches/service/instructions`). Every other path goes to the router.
#[derive(Debug, Clone)]
pub struct Connection {
    state: AppState,
    router: Router,
    peer: SocketAddr,
    /// The connection as the registry tracks it, told of each request in flight.
    tracked: Option<Arc<Tracked>>,
}

impl Connection {
    /// The HTTP API over `state` on a connection from `peer` that no registry tracks (for
    /// tests and benchmarks that drive it directly).
    pub fn new(state: AppState, peer: SocketAddr) -> Self {
        let router = router(state.clone());
        Self {
            state,
            router,
            peer,
            tracked: None,
        }
    }
}

impl tower::Service<axum::extract::Request> for Connection {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<axum::extract::Request>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let in_flight = self.tracked.as_ref().map(|t| t.begin());
        if in_flight.as_ref().is_some_and(|f| f.ambiguous()) {
            // Proxies may frame such a body one way and this server another: a request
            // smuggled inside it is never read.
            return Box::pin(std::future::ready(Ok(ambiguous_length())));
        }
        let path = request.uri().path();
        // Each answer's future holds the request in flight until it is done.
        if path == CHECK {
            if request.method() != Method::POST {
                return Box::pin(std::future::ready(Ok(not_allowed("POST"))));
            }
            let state = self.state.clone();
            let store = state.service.store().kind();
            let span = crate::telemetry::check_span("POST /v1/check", request.headers(), store);
            Box::pin(async move {
                // Inline, not through a function taking the future: each layer of future
                // moved costs a copy of it on every check.
                let answer = if span.is_none() {
                    check::check(state, request).await
                } else {
                    check::check(state, request).instrument(span).await
                };
                drop(in_flight);
                Ok(answer)
            })
        } else if path == AUTH {
            let (state, peer) = (self.state.clone(), self.peer);
            let store = state.service.store().kind();
            let span = crate::telemetry::check_span("GET /v1/auth", request.headers(), store);
            Box::pin(async move {
                let answer = if span.is_none() {
                    check::auth(state, peer, request).await
                } else {
                    check::auth(state, peer, request).instrument(span).await
                };
                drop(in_flight);
                Ok(answer)
            })
        } else {
            let mut request = request;
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(self.peer));
            let answer = self.router.call(request);
            Box::pin(async move {
                let answer = answer.await;
                drop(in_flight);
                answer
            })
        }
    }
}

/// 400 for a request with both `Content-Length` and `Transfer-Encoding`, and the connection
/// closed after it.
fn ambiguous_length() -> Response {
    let mut response = (
        StatusCode::BAD_REQUEST,
        "a request may not have both Content-Length and Transfer-Encoding\n",
    )
        .into_response();
    let close = HeaderValue::from_static("close");
    response.headers_mut().insert(header::CONNECTION, close);
    response
}

/// 405, with the method the path takes.
fn not_allowed(allow: &'static str) -> Response {
    let mut response = StatusCode::METHOD_NOT_ALLOWED.into_response();
    let allow = HeaderValue::from_static(allow);
    response.headers_mut().insert(header::ALLOW, allow);
    response
}

/// A 4xx with a JSON body that says what is wrong.
pub(crate) fn bad_request(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() });
    (status, axum::Json(body)).into_response()
}
