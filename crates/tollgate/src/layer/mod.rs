//! A tower [`Layer`] for axum and hyper services (feature `tower`): each request is checked
//! under a [`Limiter`]'s rules for a key taken from it, or, with [`RateLimitLayer::engine`],
//! under the rules of the routes it matches; a denied request gets 429 with
//! `Retry-After`, and every answer carries the rate limit fields (see [`headers`]). Rules in
//! shadow mode count and report but never deny; when the store fails, each rule's failure
//! policy decides, as for any check. A request whose key cannot be found is refused unless
//! [`MissingKey`] says otherwise: the layer never stops limiting silently. A concurrency
//! rule's slots are held for the whole request, response body included, and given back when
//! the body ends or is dropped.
//!
//! Add it to a method router with `route_layer`, so that only requests the app serves are
//! counted (`Router::layer` would count 404s and 405s too, `Router::route_layer` 405s: a `PUT`
//! to a `GET` route would spend a `GET` permit), and serve the app with the connection's
//! address when a key needs it:
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::layer::{KeyExtractor, RateLimitLayer};
//! use tollgate::{Algorithm, Limiter, Rule, Tier};
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let rule = Rule::new("per-client", Algorithm::SlidingWindow, [Tier::per_minute(100)])?;
//! let per_client = RateLimitLayer::new(Limiter::new(rule), KeyExtractor::client_ip([]));
//! let app: Router = Router::new()
//!     .route("/products", get(|| async { "products" }).route_layer(per_client));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```

pub mod headers;
mod metered;

pub use metered::{Cost, Meter};

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::clock::{Clock, SystemClock};
use crate::decision::Decisions;
use crate::engine::{
    Engine, Hit, IpRange, Items, KeyPart, Prefixes, Request as EngineRequest, client_behind,
};
use crate::error::Error;
use crate::limiter::{Item, Limiter};
use crate::reservation::Reservation;
use crate::store::{MemoryStore, Store};

type Extract = dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync;

/// Takes a request's counter key. What happens to a request without one (no such header, no
/// address) is the layer's [`MissingKey`]. Cheap to clone.
#[derive(Clone)]
pub struct KeyExtractor(Source);

/// Where the key comes from; the built-in sources borrow it from the request.
#[derive(Clone)]
enum Source {
    ClientIp(Arc<[IpRange]>, Prefixes),
    Header(&'static str),
    Route,
    Custom(Arc<Extract>),
}

impl std::fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::ClientIp(trusted, prefixes) => {
                write!(f, "KeyExtractor::client_ip({trusted:?}, {prefixes:?})")
            }
            Source::Header(name) => write!(f, "KeyExtractor::header({name:?})"),
            Source::Route => f.write_str("KeyExtractor::route()"),
            Source::Custom(_) => f.write_str("KeyExtractor::custom(..)"),
        }
    }
}

impl KeyExtractor {
    /// The client's network: the connection's peer (axum's `ConnectInfo<SocketAddr>`, or a
    /// `SocketAddr` extension), or, when the peer is in one of the `trusted_proxies` ranges,
    /// the right-most address of `X-Forwarded-For` that is not itself trusted
    /// ([`client_behind`](crate::engine::client_behind)); grouped by the default
    /// [`Prefixes`]: an IPv6 client's /64, an IPv4 address whole. An address converts to a
    /// range of one: `[proxy_ip.into()]`.
    pub fn client_ip(trusted_proxies: impl IntoIterator<Item = IpRange>) -> Self {
        Self(Source::ClientIp(
            trusted_proxies.into_iter().collect(),
            Prefixes::default(),
        ))
    }

    /// With a client address key, the prefix kept per family (e.g. `v4: 24, v6: 48`);
    /// other keys are unchanged.
    pub fn prefixes(self, prefixes: Prefixes) -> Self {
        match self.0 {
            Source::ClientIp(trusted, _) => Self(Source::ClientIp(trusted, prefixes)),
            other => Self(other),
        }
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

    /// The key of the request whose head is `parts`, or why it has none.
    fn key<'a>(&self, parts: &'a Parts) -> Result<Cow<'a, [u8]>, Missing> {
        match &self.0 {
            Source::ClientIp(trusted, prefixes) => {
                let ip = client_ip(parts, trusted).ok_or(Missing::Address)?;
                Ok(Cow::Owned(prefixes.network(ip).into_bytes()))
            }
            Source::Header(name) => parts
                .headers
                .get(*name)
                .map(|v| v.as_bytes().into())
                .ok_or(Missing::Header(name)),
            Source::Route => parts
                .extensions
                .get::<MatchedPath>()
                .map(|p| p.as_str().as_bytes().into())
                .ok_or(Missing::Route),
            Source::Custom(f) => f(parts).map(Cow::Owned).ok_or(Missing::Custom),
        }
    }
}

/// What the layer does with a request in which its [`KeyExtractor`] finds no key, or, with
/// [`RateLimitLayer::engine`], whose routes key on a client address the server did not give.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// Refuse it (the default). `400 Bad Request` when the client left out the header the
    /// key comes from; `500 Internal Server Error`, said in the log the first time, when the
    /// server did not give the layer what it needs: no client address (serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()`), no matched route (add the
    /// layer with `route_layer`), or a custom extractor that found nothing.
    #[default]
    Refuse,
    /// Check it under this key, one counter shared by every request without a key of its own
    /// (with the engine: the routes' keys with an empty address).
    Shared(Vec<u8>),
    /// Pass it on unchecked: for keys whose absence means that no limit applies.
    Allow,
}

/// Why a request has no key.
#[derive(Debug, Clone, Copy)]
enum Missing {
    Header(&'static str),
    Address,
    Route,
    Custom,
}

impl Missing {
    /// Whether the client is to blame (else the server's wiring is).
    fn clients(self) -> bool {
        matches!(self, Self::Header(_))
    }

    fn message(self) -> String {
        match self {
            Self::Header(name) => {
                format!("the request has no `{name}` header, which its rate limit key comes from")
            }
            Self::Address => "rate limiting needs the client's address, which the server does \
                 not give: serve the app with into_make_service_with_connect_info::<SocketAddr>()"
                .into(),
            Self::Route => "rate limiting by route needs the route axum matched: add the layer \
                 with Router::route_layer"
                .into(),
            Self::Custom => "the rate limit key extractor found no key in the request".into(),
        }
    }
}

/// The connection's peer address, or, from a trusted proxy, the right-most address of
/// `X-Forwarded-For` that is not itself a trusted proxy.
fn client_ip(parts: &Parts, trusted: &[IpRange]) -> Option<IpAddr> {
    let peer = peer(parts)?;
    let hops = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok());
    Some(client_behind(peer, hops, trusted))
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
    missing: MissingKey,
    /// Whether a server-side missing key was logged yet (once per layer and its clones).
    warned: Arc<AtomicBool>,
    /// Metered work: each request reserves its cost, to live at most this long unsettled
    /// (none: its rules' time to live).
    metered: Option<Option<Duration>>,
    /// When this layer and its clones last settled expired reservations.
    sweeps: Arc<metered::Sweeps>,
}

/// How the layer finds what to check.
#[derive(Debug, Clone)]
enum Keys {
    /// Every rule of the limiter, for one key.
    Extract(KeyExtractor),
    /// The rules whose routes match the request, each for its own key; the client's address
    /// from the connection, which some route keys on when the flag says so.
    Engine(Arc<Engine>, bool),
}

impl<S: Store, C: Clock> Clone for RateLimitLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            cost: self.cost,
            missing: self.missing.clone(),
            warned: self.warned.clone(),
            metered: self.metered,
            sweeps: self.sweeps.clone(),
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
            missing: MissingKey::Refuse,
            warned: Arc::default(),
            metered: None,
            sweeps: Arc::default(),
        }
    }

    /// Checks each request under the rules of `engine`'s routes that match it (method, path,
    /// headers), each for the key its route builds, all-or-nothing. `limiter` must hold every
    /// rule of the engine (build it from [`Engine::rules`]). A request no route matches passes
    /// unchecked.
    pub fn engine(limiter: Arc<Limiter<S, C>>, engine: Arc<Engine>) -> Self {
        let by_address = engine
            .routes()
            .iter()
            .any(|r| r.key.iter().any(|k| matches!(k, KeyPart::ClientIp(_))));
        Self {
            limiter,
            key: Keys::Engine(engine, by_address),
            cost: 1,
            missing: MissingKey::Refuse,
            warned: Arc::default(),
            metered: None,
            sweeps: Arc::default(),
        }
    }

    /// Each request takes `cost` permits (under [`metered`](Self::metered), its estimate).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Metered work, whose cost is known once it is done (an LLM answer's tokens): each
    /// request reserves its [`cost`](Self::cost) as an estimate, decided as a check (a denied
    /// one gets 429 and never reaches the handler), living `ttl` unsettled (none: its rules'
    /// time to live). The handler states the real cost with a [`Cost`] in its response's
    /// extensions, or on the [`Meter`] in its request's extensions while its body streams;
    /// the layer commits it once the body has been sent (less than the estimate gives the
    /// difference back, more takes the excess: the key is in debt), or the estimate when
    /// none is stated. A request abandoned before its answer settles when its reservation
    /// expires, as its rules say (by default consumed at its estimate). The layer settles
    /// its store's expired reservations in the background, at most once a second. Not on
    /// the hybrid and lease stores, which take no reservations (every request gets 500).
    ///
    /// ```
    /// use axum::{Router, response::IntoResponse, routing::post};
    /// use tollgate::layer::{Cost, KeyExtractor, RateLimitLayer};
    /// use tollgate::{Algorithm, Limiter, Rule, Tier};
    ///
    /// async fn complete() -> impl IntoResponse {
    ///     let tokens = 730; // what the model's answer counted
    ///     let mut response = "an answer".into_response();
    ///     response.extensions_mut().insert(Cost(tokens));
    ///     response
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let budget = Rule::new("tokens", Algorithm::TokenBucket(Default::default()), [Tier::per_hour(100_000)])?;
    /// let layer = RateLimitLayer::new(Limiter::new(budget), KeyExtractor::header("x-tenant"))
    ///     .cost(1_000)
    ///     .metered(None);
    /// let app: Router = Router::new().route("/v1/chat", post(complete).route_layer(layer));
    /// # Ok(())
    /// # }
    /// ```
    pub fn metered(mut self, ttl: Option<Duration>) -> Self {
        self.metered = Some(ttl);
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Refuse`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
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
                Decided::Pass => return inner.call(request).await,
                Decided::Checked(Ok(decisions)) => decisions,
                Decided::Reserved(Ok(reserved)) => {
                    return layer.metered_call(inner, request, reserved).await;
                }
                Decided::Checked(Err(err)) | Decided::Reserved(Err(err)) => {
                    return Ok(refused(&err));
                }
                Decided::Missing(missing) => return Ok(layer.keyless(missing)),
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

/// What the layer made of a request.
enum Decided {
    /// No route matched, or no key and [`MissingKey::Allow`]: unchecked.
    Pass,
    /// Checked, all-or-nothing.
    Checked(Result<Decisions, Error>),
    /// Reserved, all-or-nothing (a metered layer).
    Reserved(Result<Reservation, Error>),
    /// No key, and [`MissingKey::Refuse`].
    Missing(Missing),
}

impl<S: Store, C: Clock> RateLimitLayer<S, C> {
    /// Serves a request whose estimate was reserved: refused when denied, else the handler's
    /// answer, its reservation committed at the cost it states once its body is sent.
    async fn metered_call<Inner, B>(
        &self,
        mut inner: Inner,
        mut request: Request<B>,
        reserved: Reservation,
    ) -> Result<Response<Body>, Inner::Error>
    where
        Inner: Service<Request<B>, Response = Response<Body>>,
    {
        if !reserved.allowed() {
            return Ok(too_many(reserved.decisions()));
        }
        self.sweeps.maybe(&self.limiter);
        // Admitted by a failure policy, nothing was taken: nothing to settle.
        let Some(id) = reserved.id() else {
            let mut response = inner.call(request).await?;
            headers::add(response.headers_mut(), reserved.decisions());
            return Ok(response);
        };
        let meter = Meter::default();
        request.extensions_mut().insert(meter.clone());
        let settlement = metered::Settlement {
            limiter: self.limiter.clone(),
            id: id.to_string(),
            meter,
            estimate: self.cost,
        };
        match inner.call(request).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                if let Some(Cost(cost)) = parts.extensions.get::<Cost>() {
                    settlement.meter.set(*cost);
                }
                headers::add(&mut parts.headers, reserved.decisions());
                Ok(Response::from_parts(parts, settlement.around(body)))
            }
            Err(e) => {
                settlement.spawn();
                Err(e)
            }
        }
    }

    /// The answer to a request refused for want of a key, logged the first time the server's
    /// wiring is to blame.
    fn keyless(&self, missing: Missing) -> Response<Body> {
        let status = if missing.clients() {
            StatusCode::BAD_REQUEST
        } else {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "{}; every request is refused with 500 until it does (said once)",
                    missing.message()
                );
            }
            StatusCode::INTERNAL_SERVER_ERROR
        };
        let mut response = Response::new(Body::from(format!("{}\n", missing.message())));
        *response.status_mut() = status;
        response
    }
}

/// The decisions for the request whose head is `parts`, all-or-nothing, or why there are
/// none. The key is borrowed from the head.
async fn decide<S: Store, C: Clock>(layer: &RateLimitLayer<S, C>, parts: &Parts) -> Decided {
    match &layer.key {
        Keys::Extract(extract) => {
            let key = match (extract.key(parts), &layer.missing) {
                (Ok(key), _) => key,
                (Err(missing), MissingKey::Refuse) => return Decided::Missing(missing),
                (Err(_), MissingKey::Shared(key)) => Cow::Borrowed(&key[..]),
                (Err(_), MissingKey::Allow) => return Decided::Pass,
            };
            if let Some(ttl) = layer.metered {
                let items: Vec<Item<'_>> = layer
                    .limiter
                    .rules()
                    .map(|r| Item::new(r.name(), &key, layer.cost))
                    .collect();
                return Decided::Reserved(layer.limiter.reserve(&items, ttl).await);
            }
            if holds_slots(&layer.limiter) {
                let items: Vec<Item<'_>> = layer
                    .limiter
                    .rules()
                    .map(|r| Item::new(r.name(), &key, layer.cost))
                    .collect();
                return Decided::Reserved(layer.limiter.hold(&items).await);
            }
            let decision = layer.limiter.check(&key, layer.cost).await;
            Decided::Checked(decision.map(Decisions::one))
        }
        Keys::Engine(engine, by_address) => {
            let hits = engine_hits(engine, parts);
            if hits.is_empty() {
                return Decided::Pass;
            }
            // Some route keys on the address: without one, every client would share a counter.
            if *by_address && peer(parts).is_none() {
                match layer.missing {
                    MissingKey::Refuse => return Decided::Missing(Missing::Address),
                    MissingKey::Allow => return Decided::Pass,
                    MissingKey::Shared(_) => {}
                }
            }
            let items = Items::of(&hits, layer.cost);
            match layer.metered {
                Some(ttl) => Decided::Reserved(layer.limiter.reserve(&items, ttl).await),
                None if holds_slots(&layer.limiter) => {
                    Decided::Reserved(layer.limiter.hold(&items).await)
                }
                None => Decided::Checked(layer.limiter.check_batch(&items).await),
            }
        }
    }
}

/// Whether some rule of `limiter` holds slots (a concurrency rule): its checks hold them
/// under a permit for the whole request, response body included, as a metered layer holds
/// its reservation.
fn holds_slots<S: Store, C: Clock>(limiter: &Limiter<S, C>) -> bool {
    limiter.rules().any(|r| r.algorithm().holds_slots())
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

/// The answer to a request whose check is an error: a key too long is the client's (400); a
/// store that could not keep a reservation now is unavailable (503); anything else, a cost
/// no rule admits, a store that takes no reservations, is the service's configuration (500).
fn refused(err: &Error) -> Response<Body> {
    let status = match err {
        Error::KeyTooLong { .. } => StatusCode::BAD_REQUEST,
        Error::ReservationsFull { .. } | Error::Store { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut response = Response::new(Body::from(format!("{err}\n")));
    *response.status_mut() = status;
    response
}
