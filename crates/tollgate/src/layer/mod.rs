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
use crate::engine::{Engine, Hit, Request as EngineRequest};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::store::{MemoryStore, Store};

type Extract = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;

/// Takes a request's counter key. A request without one (no such header, no address) is
/// passed on unchecked. Cheap to clone.
#[derive(Clone)]
pub struct KeyExtractor(Arc<Extract>);

impl std::fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyExtractor")
    }
}

impl KeyExtractor {
    /// The client's address: the connection's peer (axum's `ConnectInfo<SocketAddr>`, or a
    /// `SocketAddr` extension), or, when the peer is one of `trusted_proxies`, the right-most
    /// address of `X-Forwarded-For` that is not itself a trusted proxy.
    pub fn client_ip(trusted_proxies: impl IntoIterator<Item = IpAddr>) -> Self {
        let trusted: Vec<IpAddr> = trusted_proxies.into_iter().collect();
        Self::custom(move |parts| {
            let peer = parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
                .or_else(|| parts.extensions.get::<SocketAddr>().copied())?
                .ip();
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
            Some(client.to_string().into_bytes())
        })
    }

    /// A header's value (the first, if repeated).
    pub fn header(name: &'static str) -> Self {
        Self::custom(move |parts| parts.headers.get(name).map(|v| v.as_bytes().to_vec()))
    }

    /// The route axum matched (its pattern, e.g. `/orgs/{org}/products`): one counter per
    /// endpoint.
    pub fn route() -> Self {
        Self::custom(|parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map(|p| p.as_str().as_bytes().to_vec())
        })
    }

    /// Any function of the request's head.
    pub fn custom(f: impl Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
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
        let (parts, body) = request.into_parts();
        let hits = match &self.layer.key {
            Keys::Extract(extract) => (extract.0)(&parts).map(Hits::One),
            Keys::Engine(engine) => Some(Hits::Many(engine_hits(engine, &parts))),
        };
        let request = Request::from_parts(parts, body);
        let (limiter, cost) = (self.layer.limiter.clone(), self.layer.cost);
        let Some(hits) = hits.filter(|h| !matches!(h, Hits::Many(m) if m.is_empty())) else {
            let answer = self.inner.call(request);
            return Box::pin(answer);
        };
        // The clone that was made ready serves this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let decisions = match decide(&limiter, &hits, cost).await {
                Ok(decisions) => decisions,
                Err(err) => return Ok(refused(&err)),
            };
            if !decisions.iter().all(crate::Decision::allowed) {
                return Ok(too_many(&decisions));
            }
            let mut response = inner.call(request).await?;
            headers::add(response.headers_mut(), &decisions);
            Ok(response)
        })
    }
}

/// Checks `hits` of `cost` permits each: one key under every rule, or the engine's items
/// all-or-nothing.
async fn decide<S: Store, C: Clock>(
    limiter: &Limiter<S, C>,
    hits: &Hits,
    cost: u64,
) -> Result<Vec<crate::Decision>, Error> {
    match hits {
        Hits::One(key) => limiter.check(key, cost).await.map(|d| vec![d]),
        Hits::Many(hits) => {
            let items: Vec<_> = hits.iter().map(|h| h.item(cost)).collect();
            limiter.check_batch(&items).await.map(|d| d.to_vec())
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

/// What a request is checked for.
enum Hits {
    One(Vec<u8>),
    Many(Vec<Hit>),
}

/// The (rule, key) items of the engine's routes that match a request's head.
fn engine_hits(engine: &Engine, parts: &Parts) -> Vec<Hit> {
    let headers: Vec<(&str, &[u8])> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect();
    let client_ip = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .or_else(|| parts.extensions.get::<SocketAddr>().copied())
        .map(|a| a.ip());
    engine.hits(&EngineRequest {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        headers: &headers,
        client_ip,
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
