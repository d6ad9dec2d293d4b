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
//! - `/v1/rules`: the admin API (see [`crate::admin`]);
//! - `/metrics`, `/healthz`, `/readyz`.
//!
//! Every answer about a limit carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`,
//! `Retry-After` when denied (whole seconds, rounded up: never early), and the IETF
//! `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers).

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use tokio::net::TcpListener;
use tollgate::engine::{Descriptor, LimitOverride, Request, descriptor};
use tollgate::{Decision, Source};

use crate::admin;
use crate::connections::{Registry, Tracked};
use tollgate::layer::headers::{self, ceil_secs};

use crate::service::{CheckError, DescriptorOutcome, EnvoyAnswer, Outcome, Service};

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The service.
    pub service: Arc<Service>,
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
    let mut router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/healthcheck", get(healthcheck))
        .route("/json", axum::routing::post(envoy_json))
        .route("/metrics", get(render_metrics))
        .merge(admin::router().layer(limit));
    // The console only where an admin token guards it.
    if state.admin_token.is_some() && state.service.console().is_some() {
        router = router.merge(crate::console::api::router().layer(limit));
    }
    router.with_state(state)
}

/// Serves the HTTP API on `listener` until `shutdown` resolves, then lets the requests in
/// flight finish. Each connection is admitted and watched by `registry` (see
/// [`crate::connections`]): HTTP/1 request heads must arrive within its header timeout, and
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
    watched: crate::connections::Watched<IO>,
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
        .max_buf_size(crate::framing::MAX_HEAD)
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
            Box::pin(async move {
                let answer = check(state, request).await;
                drop(in_flight);
                Ok(answer)
            })
        } else if path == AUTH {
            let (state, peer) = (self.state.clone(), self.peer);
            Box::pin(async move {
                let answer = auth(state, peer, request).await;
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

/// A check's body, borrowing its strings from the request's bytes where JSON escapes allow.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
    #[serde(borrow)]
    request: Option<RequestBody<'a>>,
    rule: Option<String>,
    key: Option<String>,
    domain: Option<String>,
    descriptors: Option<Vec<DescriptorBody>>,
    #[serde(default = "one")]
    cost: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestBody<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    path: Cow<'a, str>,
    #[serde(default, borrow, deserialize_with = "pairs")]
    headers: Headers<'a>,
    client_ip: Option<IpAddr>,
}

/// Header (name, value) pairs, borrowed from the body where they have no escapes.
#[derive(Debug, Default)]
struct Headers<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl tollgate::engine::Headers for Headers<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in &self.0 {
            f(name, value.as_bytes());
        }
    }
}

/// A JSON object of strings as (name, value) pairs, borrowed where they have no escapes.
fn pairs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Headers<'de>, D::Error> {
    struct Text<'a>(Cow<'a, str>);
    impl<'de> Deserialize<'de> for Text<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Text<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Owned(v.to_string())))
                }
            }
            d.deserialize_str(V)
        }
    }
    struct Pairs;
    impl<'de> serde::de::Visitor<'de> for Pairs {
        type Value = Headers<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of header names to values")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(4));
            while let Some((Text(k), Text(v))) = map.next_entry::<Text<'de>, Text<'de>>()? {
                pairs.push((k, v));
            }
            Ok(Headers(pairs))
        }
    }
    d.deserialize_map(Pairs)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorBody {
    entries: Vec<EntryBody>,
    cost: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    key: String,
    value: String,
}

fn one() -> u64 {
    1
}

/// The check API's answer, written by hand into one buffer (it runs on every check):
/// `{"allowed": bool, "decisions": [{"rule", "allowed", "limit", "remaining",
/// "reset_after_ms", "retry_after_ms" (when denied), "window_s", "shadowed", "source"}]}`.
/// Rule names are letters, digits and `_ - . : /`, so they need no escaping.
fn answer_json(allowed: bool, decisions: &[Decision]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + 200 * decisions.len());
    let number = |out: &mut Vec<u8>, name: &str, n: u64| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    };
    let flag = |b: bool| if b { "true" } else { "false" };
    out.extend_from_slice(b"{\"allowed\":");
    out.extend_from_slice(flag(allowed).as_bytes());
    out.extend_from_slice(b",\"decisions\":[");
    for (i, d) in decisions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"rule\":\"");
        out.extend_from_slice(d.rule().as_bytes());
        out.extend_from_slice(b"\",\"allowed\":");
        out.extend_from_slice(flag(d.allowed()).as_bytes());
        number(&mut out, ",\"limit\":", d.limit());
        number(&mut out, ",\"remaining\":", d.remaining());
        number(&mut out, ",\"reset_after_ms\":", millis(d.reset_after()));
        if let Some(retry) = d.retry_after() {
            number(&mut out, ",\"retry_after_ms\":", millis(retry));
        }
        number(&mut out, ",\"window_s\":", ceil_secs(d.window()));
        out.extend_from_slice(b",\"shadowed\":");
        out.extend_from_slice(flag(d.shadowed()).as_bytes());
        out.extend_from_slice(b",\"source\":\"");
        out.extend_from_slice(source_name(d.source()).as_bytes());
        out.extend_from_slice(b"\"}");
    }
    out.extend_from_slice(b"]}");
    out
}

/// A 4xx with a JSON body that says what is wrong.
fn bad_request(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() });
    (status, axum::Json(body)).into_response()
}

fn millis(d: std::time::Duration) -> u64 {
    d.as_micros().div_ceil(1_000) as u64
}

/// The name of the path that decided, as the API reports it.
fn source_name(source: Source) -> &'static str {
    match source {
        Source::Memory => "memory",
        Source::Redis => "redis",
        Source::Hybrid => "hybrid",
        Source::Lease => "lease",
        Source::Fallback => "fallback",
        Source::FailOpen => "fail_open",
        Source::FailClosed => "fail_closed",
        _ => "other",
    }
}

async fn check(state: AppState, request: axum::extract::Request) -> Response {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return bad_request(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected a body of content-type application/json",
        );
    }
    let bytes = match axum::body::to_bytes(request.into_body(), state.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            return match over {
                true => bad_request(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is over {} bytes", state.max_body_bytes),
                ),
                false => bad_request(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                ),
            };
        }
    };
    // Checked once here: parsing from a `str` spares serde_json checking each string again.
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) => text,
        Err(e) => {
            return bad_request(
                StatusCode::BAD_REQUEST,
                format!("the body is not UTF-8: {e}"),
            );
        }
    };
    let body: CheckBody<'_> = match serde_json::from_str(text) {
        Ok(body) => body,
        Err(e) => {
            let status = match e.classify() {
                serde_json::error::Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::BAD_REQUEST,
            };
            return bad_request(status, format!("invalid body: {e}"));
        }
    };
    let cost = body.cost;
    match (&body.request, &body.rule, &body.domain) {
        (Some(r), None, None) if body.key.is_none() && body.descriptors.is_none() => {
            let path = r.path.split('?').next().unwrap_or_default();
            let request = Request {
                method: &r.method,
                path,
                headers: &r.headers,
                client_ip: r.client_ip,
            };
            let outcome = state.service.check_request(&request, cost).await;
            answer_outcome(outcome, StatusCode::TOO_MANY_REQUESTS, true)
        }
        (None, Some(rule), None) if body.descriptors.is_none() => {
            let Some(key) = &body.key else {
                return bad_request(StatusCode::BAD_REQUEST, "`rule` needs a `key`");
            };
            let outcome = state.service.check_key(rule, key.as_bytes(), cost).await;
            answer_outcome(outcome, StatusCode::TOO_MANY_REQUESTS, true)
        }
        (None, None, Some(domain)) if body.key.is_none() => {
            let Some(descriptors) = &body.descriptors else {
                return bad_request(StatusCode::BAD_REQUEST, "`domain` needs `descriptors`");
            };
            let list: Vec<(Descriptor, u64, Option<LimitOverride>)> = descriptors
                .iter()
                .map(|d| {
                    let entries = descriptor(d.entries.iter().map(|e| (&*e.key, &*e.value)));
                    (entries, d.cost.unwrap_or(cost), None)
                })
                .collect();
            match state.service.check_descriptors(domain, &list).await {
                Ok(answer) => answer_descriptors(&answer),
                Err(CheckError::Invalid(message)) => bad_request(StatusCode::BAD_REQUEST, message),
            }
        }
        _ => bad_request(
            StatusCode::BAD_REQUEST,
            "give one of: `request`; `rule` and `key`; `domain` and `descriptors`",
        ),
    }
}

/// The answer to a check: the decisions as JSON when `json`, the headers, and `denied` as the
/// status when the request is not admitted.
fn answer_outcome(
    outcome: Result<Outcome, CheckError>,
    denied: StatusCode,
    json: bool,
) -> Response {
    match outcome {
        Ok(outcome) => answer(&outcome.decisions, denied, json),
        Err(CheckError::Invalid(message)) => bad_request(StatusCode::BAD_REQUEST, message),
    }
}

/// The answer to `decisions`, all-or-nothing: see [`answer_outcome`].
fn answer(decisions: &[Decision], denied: StatusCode, json: bool) -> Response {
    answer_as(
        decisions.iter().all(Decision::allowed),
        decisions,
        denied,
        json,
    )
}

/// The answer to `decisions` when the request is `allowed` or not.
fn answer_as(allowed: bool, decisions: &[Decision], denied: StatusCode, json: bool) -> Response {
    let status = match (allowed, json) {
        (true, true) => StatusCode::OK,
        (true, false) => StatusCode::NO_CONTENT,
        (false, _) => denied,
    };
    // Room for the content type and every rate limit field, so that the map never grows.
    let mut fields = HeaderMap::with_capacity(8);
    let body = if json {
        let json = HeaderValue::from_static("application/json");
        fields.insert(header::CONTENT_TYPE, json);
        Body::from(answer_json(allowed, decisions))
    } else {
        Body::empty()
    };
    headers::add(&mut fields, decisions);
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = fields;
    response
}

/// The answer to Envoy descriptors: denied when the Envoy service would answer over the
/// limit (see [`DescriptorOutcome::overall_over`]).
fn answer_descriptors(answer: &EnvoyAnswer) -> Response {
    let decisions = DescriptorOutcome::decisions(&answer.outcomes);
    answer_as(
        !answer.over,
        &decisions,
        StatusCode::TOO_MANY_REQUESTS,
        true,
    )
}

#[derive(Deserialize)]
struct AuthQuery {
    deny_status: Option<u16>,
    cost: Option<u64>,
}

// The original request's fields, named ahead: a name given as text is parsed on every lookup.
const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

async fn auth(state: AppState, peer: SocketAddr, request: axum::extract::Request) -> Response {
    let query: AuthQuery = match Query::try_from_uri(request.uri()) {
        Ok(Query(query)) => query,
        Err(rejection) => return rejection.into_response(),
    };
    let headers = request.headers();
    let denied = match query.deny_status {
        None | Some(429) => StatusCode::TOO_MANY_REQUESTS,
        Some(401) => StatusCode::UNAUTHORIZED,
        Some(403) => StatusCode::FORBIDDEN,
        Some(other) => {
            return bad_request(
                StatusCode::BAD_REQUEST,
                format!("deny_status {other}: expected 401, 403 or 429"),
            );
        }
    };
    let text = |names: &[HeaderName]| {
        names
            .iter()
            .find_map(|n| headers.get(n).and_then(|v| v.to_str().ok()))
    };
    let Some(uri) = text(&[X_ORIGINAL_URI, X_FORWARDED_URI]) else {
        return bad_request(
            StatusCode::BAD_REQUEST,
            "missing X-Original-URI (nginx: proxy_set_header X-Original-URI $request_uri)",
        );
    };
    let method = text(&[X_ORIGINAL_METHOD, X_FORWARDED_METHOD]).unwrap_or("GET");
    let client_ip = text(&[X_REAL_IP])
        .and_then(|ip| ip.trim().parse().ok())
        .unwrap_or(peer.ip());
    let path = uri.split('?').next().unwrap_or_default();
    let request = Request {
        method,
        path,
        headers,
        client_ip: Some(client_ip),
    };
    let outcome = state
        .service
        .check_request(&request, query.cost.unwrap_or(1))
        .await;
    answer_outcome(outcome, denied, false)
}

/// The Envoy ratelimit service's health check: 200 `OK` while healthy (see
/// [`Service::healthy`]), else 500.
async fn healthcheck(State(state): State<AppState>) -> Response {
    if state.service.healthy() {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// The Envoy ratelimit service's `POST /json`: a `RateLimitRequest` in protobuf's JSON
/// mapping, answered as over gRPC, in JSON, with 429 when over the limit; 400 and the reason
/// for a body that is not a request.
async fn envoy_json(State(state): State<AppState>, request: axum::extract::Request) -> Response {
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
    let request = match crate::envoy_json::request(&body) {
        Ok(request) => request,
        Err(reason) => return bad(reason),
    };
    match crate::grpc::answer(&state.service, request, false).await {
        Ok(answer) => {
            let over = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit;
            let status = if answer.overall_code == over as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let json = [(header::CONTENT_TYPE, "application/json")];
            let body = crate::envoy_json::response(&answer).to_string();
            (status, json, body).into_response()
        }
        Err(status) => bad(status.message().to_string()),
    }
}

async fn ready(State(state): State<AppState>) -> Response {
    if !state.service.ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the shared store does not answer\n",
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

async fn render_metrics(State(state): State<AppState>) -> Response {
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
