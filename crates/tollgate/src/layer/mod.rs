//! A tower [`Layer`] for axum and hyper services (feature `tower`): each request is checked
//! under a [`Limiter`]'s rules for a key taken from it, or, with [`RateLimitLayer::engine`],
//! under the rules of the routes it matches; a denied request gets 429 with
//! `Retry-After`, and every answer carries the rate limit fields (see [`headers`]). Rules in
//! shadow mode count and report but never deny; when the store fails, each rule's failure
//! policy decides, as for any check.
//!
//! ```
//! use axum::{Router, routing::get};
//! use tollgate::layer::{KeyExtractor, RateLimitLayer};
//! use tollgate::{Algorithm, Limiter, Rule, Tier};
//!
//! let rule = Rule::new("per-org", Algorithm::SlidingWindow, [Tier::per_minute(100)])?;
//! let app: Router = Router::new()
//!     .route("/products", get(|| async { "products" }))
//!     .layer(RateLimitLayer::new(Limiter::new(rule), KeyExtractor::header("x-org")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod headers;

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::clock::{Clock, SystemClock};
use crate::decision::Decisions;
use crate::engine::{Engine, Hit, Items, Request as EngineRequest};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::store::{MemoryStore, Store};

type Extract = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;

/// Takes a request's counter key. A request without one (no such header, no address) is
/// passed on unchecked. Cheap to clone.
#[derive(Clone)]
pub struct KeyExtractor(Source);

/// Where the key comes from; the built-in sources borrow it from the request.
#[derive(Clone)]
enum Source {
    ClientIp(Arc<[IpAddr]>),
    Header(&'static str),
    Route,
    Custom(Arc<Extract>),
}

impl std::fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::ClientIp(trusted) => write!(f, "KeyExtractor::client_ip({trusted:?})"),
            Source::Header(name) => write!(f, "KeyExtractor::header({name:?})"),
            Source::Route => f.write_str("KeyExtractor::route()"),
            Source::Custom(_) => f.write_str("KeyExtractor::custom(..)"),
        }
    }
}

impl KeyExtractor {
    /// The client's address: the connection's peer (axum's `ConnectInfo<SocketAddr>`, or a
    /// `SocketAddr` extension), or, when the peer is one of `trusted_proxies`, the right-most
    /// address of `X-Forwarded-For` that is not itself a trusted proxy.
    pub fn client_ip(trusted_proxies: impl IntoIterator<Item = IpAddr>) -> Self {
        Self(Source::ClientIp(trusted_proxies.into_iter().collect()))
    }

    /// A header's value (the first, if repeated).
    pub fn header(name: &'static str) -> Self {
        Self(Source::Header(name))
    }

    /// The route axum matched (its pattern, e.g. `/orgs/{org}/products`): one counter per
    /// endpoint.
    pub fn route() -> Self {
        Self(Source::Route)
    }

    /// Any function of the request's head.
    pub fn custom(f: impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        Self(Source::Custom(Arc::new(f)))
    }

    /// The key of the request whose head is `parts`.
    fn key<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, [u8]>> {
        match &self.0 {
            Source::ClientIp(trusted) => {
                let ip = client_ip(parts, trusted)?;
                Some(Cow::Owned(ip.to_string().into_bytes()))
            }
            Source::Header(name) => parts.headers.get(*name).map(|v| v.as_bytes().into()),
            Source::Route => parts
                .extensions
                .get::<MatchedPath>()
                .map(|p| p.as_str().as_bytes().into()),
            Source::Custom(f) => f(parts).map(Cow::Owned),
        }
    }
}

/// The connection's peer address, or, from a trusted proxy, the right-most address of
/// `X-Forwarded-For` that is not itself a trusted proxy.
fn client_ip(parts: &Parts, trusted: &[IpAddr]) -> Option<IpAddr> {
    let peer = peer(parts)?;
    let mut client = peer;
    if trusted.contains(&peer) {
        let hops = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|hop| hop.trim().parse::<IpAddr>())
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            match hop {
                Ok(ip) if trusted.contains(ip) => client = *ip,
                Ok(ip) => {
                    client = *ip;
                    break;
                }
                // A hop that is not an address ends what can be believed.
                Err(_) => break,
            }
        }
    }
    Some(client)
}

/// The connection's peer: axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` extension.
fn peer(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .or_else(|| parts.extensions.get::<SocketAddr>().copied())
        .map(|a| a.ip())
}

/// Checks every request under a limiter's rules; see the module documentation. Clones share
/// the limiter.
#[derive(Debug)]
pub struct RateLimitLayer<S: Store = MemoryStore, C: Clock = SystemClock> {
    limiter: Arc<Limiter<S, C>>,
    key: Keys,
    cost: u64,
}

/// How the layer finds what to check.
#[derive(Debug, Clone)]
enum Keys {
    /// Every rule of the limiter, for one key.
    Extract(KeyExtractor),
    /// The rules whose routes match the request, each for its own key; the client's address
    /// from the connection.
    Engine(Arc<Engine>),
}

impl<S: Store, C: Clock> Clone for RateLimitLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            cost: self.cost,
        }
    }
}

impl<S: Store, C: Clock> RateLimitLayer<S, C> {
    /// Checks each request for the key `key` takes from it, one permit each.
    pub fn new(limiter: Limiter<S, C>, key: KeyExtractor) -> Self {
        Self::shared(Arc::new(limiter), key)
    }

    /// As [`new`](Self::new), with a limiter shared with other code.
    pub fn shared(limiter: Arc<Limiter<S, C>>, key: KeyExtractor) -> Self {
        Self {
            limiter,
            key: Keys::Extract(key),
            cost: 1,
        }
    }

    /// Checks each request under the rules of `engine`'s routes that match it (method, path,
    /// headers), each for the key its route builds, all-or-nothing. `limiter` must hold every
    /// rule of the engine (build it from [`Engine::rules`]). A request no route matches passes
    /// unchecked.
    pub fn engine(limiter: Arc<Limiter<S, C>>, engine: Arc<Engine>) -> Self {
        Self {
            limiter,
            key: Keys::Engine(engine),
            cost: 1,
        }
    }

    /// Each request takes `cost` permits.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
}

impl<Inner, S: Store, C: Clock> Layer<Inner> for RateLimitLayer<S, C> {
    type Service = RateLimit<Inner, S, C>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Debug)]
pub struct RateLimit<Inner, S: Store = MemoryStore, C: Clock = SystemClock> {
    inner: Inner,
    layer: RateLimitLayer<S, C>,
}

impl<Inner: Clone, S: Store, C: Clock> Clone for RateLimit<Inner, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<Inner, S, C, B> Service<Request<B>> for RateLimit<Inner, S, C>
where
    Inner: Service<Request<B>, Response = Response<Body>> + Clone + Send + 'static,
    Inner::Future: Send,
    S: Store,
    C: Clock,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Inner::Error;
    type Future = BoxFuture<Result<Response<Body>, Inner::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was made ready serves this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let decided = decide(&layer, &parts).await;
            let request = Request::from_parts(parts, body);
            let decisions = match decided {
                None => return inner.call(request).await,
                Some(Ok(decisions)) => decisions,
                Some(Err(err)) => return Ok(refused(&err)),
            };
            if !decisions.allowed() {
                return Ok(too_many(&decisions));
            }
            let mut response = inner.call(request).await?;
            headers::add(response.headers_mut(), &decisions);
            Ok(response)
        })
    }
}

/// The decisions for the request whose head is `parts`, all-or-nothing; `None` when it has no
/// key or matches no route, and goes through unchecked. The key is borrowed from the head.
async fn decide<S: Store, C: Clock>(
    layer: &RateLimitLayer<S, C>,
    parts: &Parts,
) -> Option<Result<Decisions, Error>> {
    match &layer.key {
        Keys::Extract(extract) => {
            let key = extract.key(parts)?;
            Some(
                layer
                    .limiter
                    .check(&key, layer.cost)
                    .await
                    .map(Decisions::one),
            )
        }
        Keys::Engine(engine) => {
            let hits = engine_hits(engine, parts);
            if hits.is_empty() {
                return None;
            }
            let items = Items::of(&hits, layer.cost);
            Some(layer.limiter.check_batch(&items).await)
        }
    }
}

/// A 429 with the fields of `decisions`.
fn too_many(decisions: &[crate::Decision]) -> Response<Body> {
    let mut response = Response::new(Body::from("too many requests\n"));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    headers::add(response.headers_mut(), decisions);
    response
}

/// The (rule, key) items of the engine's routes that match a request's head.
fn engine_hits(engine: &Engine, parts: &Parts) -> Vec<Hit> {
    engine.hits(&EngineRequest {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        headers: &parts.headers,
        client_ip: peer(parts),
    })
}

/// The answer to a request whose check is an error: a key too long is the client's (400);
/// anything else, a cost no rule admits, is the service's configuration (500).
fn refused(err: &Error) -> Response<Body> {
    let status = match err {
        Error::KeyTooLong { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut response = Response::new(Body::from(format!("{err}\n")));
    *response.status_mut() = status;
    response
}
