//! The tower layer under an axum app: headers on 2xx and 429, keys kept apart, the client
//! address taken from X-Forwarded-For only behind a trusted proxy, shadow mode, and Redis down
//! under each failure policy.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, Response};
use tollgate::layer::{KeyExtractor, RateLimitLayer};
use tollgate::{
    Algorithm, FailurePolicy, Limiter, ManualClock, MemoryStore, RedisStore, Rule, Store, Tier,
};
use tower::ServiceExt;

fn rule(limit: u64) -> Rule {
    Rule::new("api", Algorithm::SlidingLog, [Tier::per_hour(limit)]).unwrap()
}

fn app<S: Store>(limiter: Limiter<S, ManualClock>, key: KeyExtractor) -> Router {
    Router::new()
        .route("/orgs/{org}/items", get(|| async { "items" }))
        .layer(RateLimitLayer::new(limiter, key))
}

fn memory(rule: Rule) -> Limiter<MemoryStore, ManualClock> {
    Limiter::builder(rule)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

async fn call(app: &Router, peer: &str, headers: &[(&str, &str)]) -> Response<Body> {
    let mut request = Request::get("/orgs/acme/items");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(Body::empty()).unwrap();
    let peer = SocketAddr::new(peer.parse().unwrap(), 40000);
    request.extensions_mut().insert(ConnectInfo(peer));
    app.clone().oneshot(request).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn every_answer_carries_the_fields_and_a_denial_is_429() {
    let app = app(memory(rule(2)), KeyExtractor::header("x-org"));
    for remaining in ["1", "0"] {
        let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("2"));
        assert_eq!(header(&response, "x-ratelimit-remaining"), Some(remaining));
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"api\";q=2;w=3600")
        );
        assert!(header(&response, "retry-after").is_none());
    }
    let denied = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(denied.status(), 429);
    assert_eq!(header(&denied, "retry-after"), Some("3600"));
    assert_eq!(header(&denied, "ratelimit"), Some("\"api\";r=0;t=3600"));
    // Another key is its own; a request without a key is the client's mistake, not a way
    // around the limit.
    assert_eq!(
        call(&app, "10.0.0.1", &[("x-org", "b")]).await.status(),
        200
    );
    let keyless = call(&app, "10.0.0.1", &[]).await;
    assert_eq!(keyless.status(), 400);
    assert!(header(&keyless, "x-ratelimit-limit").is_none());
    let body = axum::body::to_bytes(keyless.into_body(), 1 << 10)
        .await
        .unwrap();
    assert_eq!(
        body,
        "the request has no `x-org` header, which its rate limit key comes from\n"
    );
}

/// `RateLimit-Policy`'s items as (name, quota, window).
fn policies(response: &Response<Body>) -> Vec<(String, u64, u64)> {
    let field = header(response, "ratelimit-policy").expect("a RateLimit-Policy field");
    field
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let mut number = |key: &str| {
                let part = parts.next().unwrap();
                part.strip_prefix(key).unwrap().parse::<u64>().unwrap()
            };
            (name, number("q="), number("w="))
        })
        .collect()
}

#[tokio::test]
async fn a_bucket_advertises_its_burst_per_refill_and_every_tier_is_listed() {
    let bucket = Tier::per_second(10).with_burst(20);
    let tb = Algorithm::TokenBucket(Default::default());
    let one = Rule::new("api", tb.clone(), [bucket.clone()]).unwrap();
    let app = app(memory(one), KeyExtractor::header("x-org"));
    let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    // 20 at once, then 20 more once they have refilled: 2 s, never 20 per second.
    assert_eq!(policies(&response), [("api".to_owned(), 20, 2)]);
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("20"));
    assert_eq!(header(&response, "ratelimit"), Some("\"api\";r=19;t=1"));

    let two = Rule::new("api", tb, [bucket, Tier::new(50, Duration::from_secs(10))]).unwrap();
    let app = self::app(memory(two), KeyExtractor::header("x-org"));
    let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(
        policies(&response),
        [("api/1s".to_owned(), 20, 2), ("api/10s".to_owned(), 50, 10)]
    );
    assert_eq!(header(&response, "ratelimit"), Some("\"api/1s\";r=19;t=1"));
}

/// What `RateLimit-Policy` advertises is what a client may rely on: a client that sends a
/// whole quota at once, then waits a whole window, again and again, is never denied, for
/// every algorithm whose tier states an exact bound.
#[tokio::test]
async fn a_client_keeping_to_the_advertised_policy_is_never_denied() {
    use tollgate::{LeakyBucket, SubWindows, TokenBucket};
    let cases = [
        (Algorithm::FixedWindow, Tier::per_minute(7)),
        (Algorithm::SlidingLog, Tier::per_minute(7)),
        (
            Algorithm::SubWindows(SubWindows { count: 6 }),
            Tier::per_minute(7),
        ),
        (Algorithm::IntervalBucket, Tier::per_minute(7)),
        (Algorithm::HitCounter, Tier::per_minute(7)),
        (
            Algorithm::TokenBucket(TokenBucket::default()),
            Tier::per_second(10).with_burst(20),
        ),
        (
            Algorithm::TokenBucket(TokenBucket::default()),
            Tier::per_minute(3).with_burst(7),
        ),
        (Algorithm::Gcra, Tier::per_second(2).with_burst(5)),
        (Algorithm::Gcra, Tier::per_second(100).with_burst(20)),
        (
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            Tier::per_minute(4).with_burst(9),
        ),
    ];
    for (algorithm, tier) in cases {
        let name = format!("{algorithm:?} {tier:?}");
        let clock = ManualClock::new();
        // Start between window edges, as a client would.
        clock.advance(Duration::from_millis(1_234));
        let rule = Rule::new("api", algorithm, [tier]).unwrap();
        let limiter = Limiter::builder(rule).clock(clock.clone()).build().unwrap();
        let app = app(limiter, KeyExtractor::header("x-org"));
        let first = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
        let [(_, quota, window)] = policies(&first)[..] else {
            panic!("{name}: one policy")
        };
        assert_eq!(
            header(&first, "x-ratelimit-limit"),
            Some(&*quota.to_string()),
            "{name}"
        );
        for round in 0..6 {
            let sent = if round == 0 { 1 } else { 0 };
            for i in sent..quota {
                let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
                assert_eq!(response.status(), 200, "{name}: round {round}, request {i}");
            }
            clock.advance(Duration::from_secs(window));
        }
    }
}

/// A request as a server without `ConnectInfo` passes it on: no client address.
async fn call_without_address(app: &Router, headers: &[(&str, &str)]) -> Response<Body> {
    let mut request = Request::get("/orgs/acme/items");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_missing_client_address_is_refused_not_waved_through() {
    let app = app(memory(rule(3)), KeyExtractor::client_ip([]));
    for _ in 0..5 {
        let response = call_without_address(&app, &[]).await;
        assert_eq!(response.status(), 500);
        let body = axum::body::to_bytes(response.into_body(), 1 << 10)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.contains("into_make_service_with_connect_info::<SocketAddr>()"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_missing_key_can_share_one_counter_or_pass_by_choice() {
    use tollgate::layer::MissingKey;
    let shared = Router::new()
        .route("/orgs/{org}/items", get(|| async { "items" }))
        .route_layer(
            RateLimitLayer::new(memory(rule(2)), KeyExtractor::client_ip([]))
                .on_missing_key(MissingKey::Shared(b"no address".to_vec())),
        );
    let statuses = |app: Router| async move {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(call_without_address(&app, &[]).await.status().as_u16());
        }
        statuses
    };
    assert_eq!(statuses(shared).await, [200, 200, 429]);
    let allowed = Router::new()
        .route("/orgs/{org}/items", get(|| async { "items" }))
        .route_layer(
            RateLimitLayer::new(memory(rule(2)), KeyExtractor::header("x-org"))
                .on_missing_key(MissingKey::Allow),
        );
    assert_eq!(statuses(allowed).await, [200, 200, 200]);
}

#[tokio::test]
async fn the_engine_refuses_address_keys_without_an_address() {
    use std::sync::Arc;
    use tollgate::engine::{Engine, KeyPart, Match, Route};

    let route = Route {
        rule: rule(2),
        enabled: true,
        matcher: Match::default(),
        key: vec![KeyPart::ClientIp(Default::default())],
    };
    let engine = Engine::new(vec![route], vec![]).unwrap();
    let limiter = Limiter::builder(rule(2))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orgs/{org}/items", get(|| async { "items" }))
        .route_layer(RateLimitLayer::engine(Arc::new(limiter), Arc::new(engine)));
    assert_eq!(call_without_address(&app, &[]).await.status(), 500);
    assert_eq!(call(&app, "10.0.0.1", &[]).await.status(), 200);
}

/// Served as a user would, over a real socket: plain `axum::serve` gives no address, and the
/// first request says so; with `ConnectInfo` the limit holds.
#[tokio::test]
async fn served_over_a_socket_the_wiring_decides_and_never_silently() {
    let serve = |with_address: bool| async move {
        let app = Router::new()
            .route("/x", get(|| async { "x" }))
            .route_layer(RateLimitLayer::new(
                Limiter::new(rule(3)),
                KeyExtractor::client_ip([]),
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            if with_address {
                let app = app.into_make_service_with_connect_info::<SocketAddr>();
                axum::serve(listener, app).await.unwrap();
            } else {
                axum::serve(listener, app).await.unwrap();
            }
        });
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream
                .write_all(b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            statuses.push(answer[9..12].parse::<u16>().unwrap());
        }
        statuses
    };
    assert_eq!(serve(false).await, [500; 5]);
    assert_eq!(serve(true).await, [200, 200, 200, 429, 429]);
}

/// With the method router's `route_layer`, a method the route does not have gets its 405,
/// and a path no route has its 404, without spending a permit (`Router::layer` counts both,
/// `Router::route_layer` the 405).
#[tokio::test]
async fn requests_to_no_route_spend_nothing() {
    let layer = RateLimitLayer::new(memory(rule(1)), KeyExtractor::header("x-org"));
    let app = Router::new().route(
        "/orgs/{org}/items",
        get(|| async { "items" }).route_layer(layer),
    );
    let put = Request::put("/orgs/acme/items")
        .header("x-org", "a")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(put).await.unwrap().status(), 405);
    let nowhere = Request::get("/nowhere")
        .header("x-org", "a")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(nowhere).await.unwrap().status(), 404);
    let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn x_forwarded_for_counts_only_behind_a_trusted_proxy() {
    let proxy: IpAddr = "10.9.9.9".parse().unwrap();
    let app = app(memory(rule(1)), KeyExtractor::client_ip([proxy.into()]));
    // Through the proxy: the client it names is the key.
    let via = |client: &'static str| [("x-forwarded-for", client)];
    assert_eq!(call(&app, "10.9.9.9", &via("1.1.1.1")).await.status(), 200);
    assert_eq!(call(&app, "10.9.9.9", &via("1.1.1.1")).await.status(), 429);
    assert_eq!(call(&app, "10.9.9.9", &via("2.2.2.2")).await.status(), 200);
    // A forged first hop before the real client is not believed: the right-most untrusted hop
    // is the client.
    let forged = [("x-forwarded-for", "3.3.3.3, 1.1.1.1")];
    assert_eq!(call(&app, "10.9.9.9", &forged).await.status(), 429);
    // From an untrusted peer the header is ignored: the peer is the key.
    let spoof = [("x-forwarded-for", "4.4.4.4")];
    assert_eq!(call(&app, "5.5.5.5", &spoof).await.status(), 200);
    assert_eq!(
        call(&app, "5.5.5.5", &[("x-forwarded-for", "6.6.6.6")])
            .await
            .status(),
        429
    );
}

#[tokio::test]
async fn ipv6_clients_count_by_their_64_and_proxies_come_in_ranges() {
    let balancers: tollgate::engine::IpRange = "10.0.0.0/8".parse().unwrap();
    let ranged = app(memory(rule(1)), KeyExtractor::client_ip([balancers]));
    // Two addresses of one /64: one client.
    assert_eq!(call(&ranged, "2001:db8:1:2::1", &[]).await.status(), 200);
    assert_eq!(
        call(&ranged, "2001:db8:1:2:ffff::9", &[]).await.status(),
        429
    );
    assert_eq!(call(&ranged, "2001:db8:1:3::1", &[]).await.status(), 200);
    // Any balancer of the range is believed about the client behind it.
    let via = [("x-forwarded-for", "198.51.100.7")];
    assert_eq!(call(&ranged, "10.1.2.3", &via).await.status(), 200);
    assert_eq!(call(&ranged, "10.200.0.1", &via).await.status(), 429);
    // Wider prefixes, by choice: a /24 of IPv4 is one client.
    let subnets =
        KeyExtractor::client_ip([]).prefixes(tollgate::engine::Prefixes { v4: 24, v6: 48 });
    let wide = app(memory(rule(1)), subnets);
    assert_eq!(call(&wide, "203.0.113.7", &[]).await.status(), 200);
    assert_eq!(call(&wide, "203.0.113.99", &[]).await.status(), 429);
}

#[tokio::test]
async fn the_route_extractor_counts_per_endpoint() {
    let limiter = memory(rule(1));
    let app = Router::new()
        .route("/a/{id}", get(|| async { "a" }))
        .route("/b/{id}", get(|| async { "b" }))
        .route_layer(RateLimitLayer::new(limiter, KeyExtractor::route()));
    let get = |path: &str| {
        app.clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
    };
    assert_eq!(get("/a/1").await.unwrap().status(), 200);
    assert_eq!(get("/a/2").await.unwrap().status(), 429);
    assert_eq!(get("/b/1").await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_shadow_rule_never_denies() {
    let app = app(memory(rule(1).shadow(true)), KeyExtractor::header("x-org"));
    for _ in 0..3 {
        let response = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
        assert_eq!(response.status(), 200);
        assert!(header(&response, "retry-after").is_none());
    }
}

#[tokio::test]
async fn redis_down_follows_each_rules_policy() {
    // Nothing listens on this port: every check fails within the timeout.
    let unused = support::UnusedPort::new();
    let url = format!("redis://127.0.0.1:{}", unused.port);
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let limiter = |policy| {
        Limiter::builder(rule(2).on_failure(policy).unwrap())
            .store(store.clone())
            .clock(ManualClock::new())
            .build()
            .unwrap()
    };
    let statuses = |app: Router| async move {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(
                call(&app, "10.0.0.1", &[("x-org", "a")])
                    .await
                    .status()
                    .as_u16(),
            );
        }
        statuses
    };
    let key = || KeyExtractor::header("x-org");
    let open = app(limiter(FailurePolicy::Open), key());
    assert_eq!(statuses(open).await, [200, 200, 200]);
    let closed = app(limiter(FailurePolicy::Closed), key());
    assert_eq!(statuses(closed).await, [429, 429, 429]);
    // Half of 2 per hour in this process alone.
    let local = app(limiter(FailurePolicy::Local { share: 0.5 }), key());
    assert_eq!(statuses(local).await, [200, 429, 429]);
}

#[tokio::test]
async fn a_key_too_long_is_the_clients_error() {
    let app = app(memory(rule(5)), KeyExtractor::header("x-org"));
    let long = "k".repeat(5_000);
    let response = call(&app, "10.0.0.1", &[("x-org", &long)]).await;
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn the_rule_engine_checks_the_routes_a_request_matches() {
    use std::sync::Arc;
    use tollgate::engine::{Engine, KeyPart, Match, PathPattern, Route};

    let route = |id: &str, method: &str, limit: u64| Route {
        rule: Rule::new(id, Algorithm::SlidingLog, [Tier::per_hour(limit)]).unwrap(),
        enabled: true,
        matcher: Match {
            methods: vec![method.into()],
            path: Some(PathPattern::parse("/orgs/{org}/items").unwrap()),
            headers: Vec::new(),
        },
        key: vec![KeyPart::Segment("org".into())],
    };
    let engine = Engine::new(
        vec![route("reads", "GET", 2), route("writes", "POST", 1)],
        vec![],
    )
    .unwrap();
    let mut rules = engine.rules().cloned();
    let first = rules.next().unwrap();
    let limiter = rules
        .fold(Limiter::builder(first), |b, r| b.rule(r))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let layer = RateLimitLayer::engine(Arc::new(limiter), Arc::new(engine));
    let app = Router::new()
        .route(
            "/orgs/{org}/items",
            get(|| async { "items" }).post(|| async { "added" }),
        )
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let send = |method: &str, path: &str| {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    assert_eq!(send("POST", "/orgs/a/items").await.unwrap().status(), 200);
    let denied = send("POST", "/orgs/a/items").await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"writes\";q=1;w=3600")
    );
    // Reads are their own rule, organizations their own keys, unmatched paths unchecked.
    let read = send("GET", "/orgs/a/items").await.unwrap();
    assert_eq!(
        (
            read.status().as_u16(),
            header(&read, "x-ratelimit-remaining")
        ),
        (200, Some("1"))
    );
    assert_eq!(send("POST", "/orgs/b/items").await.unwrap().status(), 200);
    let health = send("GET", "/health").await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(header(&health, "x-ratelimit-limit").is_none());
}

mod metered {
    //! Metered work: each request reserves an estimate; the handler states the real cost (a
    //! response extension, or the request's meter while its body streams); the layer commits
    //! it once the body is sent, or the estimate when none is stated.

    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::Extension;
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use bytes::Bytes;
    use http::Request;
    use http_body::Frame;
    use tollgate::layer::{Cost, KeyExtractor, Meter, RateLimitLayer};
    use tollgate::{
        Algorithm, Limiter, ManualClock, MemoryStore, OnExpiry, Reservations, Rule, Tier,
    };
    use tower::ServiceExt;

    use super::header;

    type Shared = Arc<Limiter<MemoryStore, ManualClock>>;

    /// 1,000 a day per tenant; reservations live 10 s and are released when they expire.
    fn limiter() -> (Shared, MemoryStore, ManualClock) {
        let rule = Rule::new("tokens", Algorithm::FixedWindow, [Tier::per_day(1_000)])
            .and_then(|r| {
                r.reservations(Reservations {
                    ttl: Duration::from_secs(10),
                    on_expiry: OnExpiry::Released,
                })
            })
            .unwrap();
        let (store, clock) = (MemoryStore::new(), ManualClock::new());
        let limiter = Limiter::builder(rule)
            .store(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        (Arc::new(limiter), store, clock)
    }

    /// A body of five chunks, each one recording 10 on the request's meter as it is sent.
    struct Streamed {
        meter: Meter,
        left: u32,
    }

    impl http_body::Body for Streamed {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            self.left -= 1;
            self.meter.add(10);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"token ")))))
        }
    }

    fn app(limiter: &Shared, served: &Arc<AtomicUsize>) -> Router {
        let layer = RateLimitLayer::shared(limiter.clone(), KeyExtractor::header("x-tenant"))
            .cost(100)
            .metered(None);
        let counted = |served: &Arc<AtomicUsize>| {
            let served = served.clone();
            move || {
                served.fetch_add(1, Ordering::Relaxed);
            }
        };
        let (a, b, c, d) = (
            counted(served),
            counted(served),
            counted(served),
            counted(served),
        );
        Router::new()
            .route(
                "/stated/{cost}",
                get(
                    move |axum::extract::Path(cost): axum::extract::Path<u64>| async move {
                        a();
                        let mut response = "answer".into_response();
                        response.extensions_mut().insert(Cost(cost));
                        response
                    },
                ),
            )
            .route(
                "/silent",
                get(move || async move {
                    b();
                    "answer"
                }),
            )
            .route(
                "/streamed",
                get(move |Extension(meter): Extension<Meter>| async move {
                    c();
                    Response::new(Body::new(Streamed { meter, left: 5 }))
                }),
            )
            .route(
                "/never",
                get(move || async move {
                    d();
                    std::future::pending::<&str>().await
                }),
            )
            .route_layer(layer)
    }

    async fn get_path(app: &Router, path: &str) -> Response {
        let request = Request::get(path)
            .header("x-tenant", "acme")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request).await.unwrap()
    }

    /// The answer's status and body, read whole (which commits its reservation).
    async fn read(response: Response) -> (u16, String) {
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn left(limiter: &Shared) -> u64 {
        limiter.check("acme", 0).await.unwrap().remaining()
    }

    /// Lets background settlements run.
    async fn settled(store: &MemoryStore, open: usize) {
        for _ in 0..1_000 {
            if store.reservations() == open {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{} reservations open, not {open}", store.reservations());
    }

    #[tokio::test]
    async fn the_layer_commits_the_cost_the_handler_states() {
        let (limiter, store, _) = limiter();
        let served = Arc::new(AtomicUsize::new(0));
        let app = app(&limiter, &served);
        // Stated below the estimate: the difference comes back once the body is sent.
        let response = get_path(&app, "/stated/30").await;
        assert_eq!(header(&response, "x-ratelimit-remaining"), Some("900"));
        assert_eq!(store.reservations(), 1, "open while the body is unsent");
        assert_eq!(read(response).await, (200, "answer".into()));
        assert_eq!((left(&limiter).await, store.reservations()), (970, 0));
        // None stated: the estimate.
        read(get_path(&app, "/silent").await).await;
        assert_eq!(left(&limiter).await, 870);
        // Recorded on the meter while the body streams: what it holds at the end.
        let (status, body) = read(get_path(&app, "/streamed").await).await;
        assert_eq!((status, body.len()), (200, 30));
        assert_eq!(left(&limiter).await, 820);
        // Above it: the excess is taken, the key is in debt, and the next one never reaches
        // the handler.
        read(get_path(&app, "/stated/1500").await).await;
        assert_eq!(left(&limiter).await, 0);
        let before = served.load(Ordering::Relaxed);
        let (status, _) = read(get_path(&app, "/silent").await).await;
        assert_eq!(status, 429);
        assert_eq!(
            served.load(Ordering::Relaxed),
            before,
            "denied before the handler"
        );
        assert_eq!(store.reservations(), 0, "a denial reserves nothing");
    }

    #[tokio::test]
    async fn an_answer_never_read_is_committed_all_the_same() {
        let (limiter, store, _) = limiter();
        let app = app(&limiter, &Arc::new(AtomicUsize::new(0)));
        // The client goes before reading the body: its meter's cost is committed anyway.
        drop(get_path(&app, "/stated/40").await);
        settled(&store, 0).await;
        assert_eq!(left(&limiter).await, 960);
    }

    #[tokio::test]
    async fn a_request_abandoned_mid_handler_settles_when_it_expires() {
        let (limiter, store, clock) = limiter();
        let app = app(&limiter, &Arc::new(AtomicUsize::new(0)));
        let abandoned = tokio::time::timeout(Duration::from_millis(10), get_path(&app, "/never"));
        assert!(abandoned.await.is_err());
        settled(&store, 1).await;
        assert_eq!(
            left(&limiter).await,
            900,
            "its estimate stays taken meanwhile"
        );
        // Past its time to live, the layer's next request settles it as its rule says:
        // released, here.
        clock.advance(Duration::from_secs(11));
        read(get_path(&app, "/stated/5").await).await;
        settled(&store, 0).await;
        assert_eq!(left(&limiter).await, 995);
    }
}

/// A concurrency rule's slot is held for the whole request, its response body included: a
/// second request is refused while the first one's body is still unsent, admitted once it is
/// sent; a body dropped unsent gives the slot back too.
#[tokio::test]
async fn a_concurrency_slot_is_held_until_the_body_is_sent() {
    let exports = Rule::new(
        "exports",
        Algorithm::Concurrency,
        [Tier::new(1, Duration::from_secs(60))],
    )
    .unwrap();
    let app = app(memory(exports), KeyExtractor::header("x-org"));
    let first = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(first.status(), 200);
    let refused = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(refused.status(), 429, "the first body is not sent yet");
    assert!(header(&refused, "retry-after").is_some());
    let body = axum::body::to_bytes(first.into_body(), usize::MAX).await;
    assert_eq!(&body.unwrap()[..], b"items");
    let second = call(&app, "10.0.0.1", &[("x-org", "a")]).await;
    assert_eq!(
        second.status(),
        200,
        "the slot came back with the body's end"
    );
    // Dropped unsent: given back in the background, at once.
    drop(second);
    tokio::task::yield_now().await;
    assert_eq!(
        call(&app, "10.0.0.1", &[("x-org", "a")]).await.status(),
        200
    );
}
