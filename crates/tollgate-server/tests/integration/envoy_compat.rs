//! The expectations of envoyproxy/ratelimit's own tests, as facts about tollgate: which
//! configuration files load or fail and with which message (its `test/config/config_test.go`
//! and the files beside it), and which request gets which status, limit, remaining and reset
//! (its `test/integration/integration_test.go`, `test/redis/fixed_cache_impl_test.go` and
//! `src/service/ratelimit.go`), each over gRPC on the memory store, on strict Redis (a
//! server of the test's own), and with the same limits pushed over xDS by a management server
//! of the test's own (`CONFIG_TYPE=GRPC_XDS_SOTW`) instead of read from a file. The fixtures
//! are tollgate's own, of the same shapes.

use crate::support;
use crate::xds_server;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{Redis, Server, descriptor, run};
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// `tollgate validate` of one file: (exit code, what it printed).
fn validate(name: &str, text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let (code, out, err) = run(&["validate", path.to_str().unwrap()]);
    (code, format!("{out}{err}"))
}

/// Files that envoyproxy/ratelimit refuses, each with the message it gives (tollgate puts
/// the file, line and column in front).
#[test]
fn files_it_refuses_are_refused_with_its_messages() {
    let cases = [
        // empty_domain.yaml
        ("descriptors:\n", "config file cannot have empty domain"),
        ("", "config file cannot have empty domain"),
        (
            "# nothing but a comment\n",
            "config file cannot have empty domain",
        ),
        // empty_key.yaml
        (
            "domain: shop\ndescriptors:\n  - value: v\n",
            "descriptor has empty key",
        ),
        // duplicate_key.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    value: add\n  - key: cart\n    value: add\n",
            "envoy.yaml:5:5: duplicate descriptor composite key 'shop.cart_add'",
        ),
        // bad_limit_unit.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: fortnight, requests_per_unit: 3 }\n",
            "invalid rate limit unit 'fortnight'",
        ),
        // replaces_self.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit:\n      name: me\n      replaces: [{ name: me }]\n      unit: second\n      requests_per_unit: 5\n",
            "replaces should not contain name of same descriptor",
        ),
        // replaces_empty.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit:\n      name: me\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
            "should not have an empty replaces entry",
        ),
        // misspelled_key.yaml, misspelled_key2.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    ratelimit: { unit: day, requests_per_unit: 5 }\n",
            "config error, unknown key 'ratelimit'",
        ),
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: day, requestsperunit: 5 }\n",
            "config error, unknown key 'requestsperunit'",
        ),
        // unlimited_with_unit.yaml
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unlimited: true, unit: day, requests_per_unit: 25 }\n",
            "should not specify rate limit unit when unlimited",
        ),
        // share_threshold on a value without a wildcard
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    value: add\n    share_threshold: true\n    rate_limit: { unit: second, requests_per_unit: 5 }\n",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'cart_add'",
        ),
        // requests_per_unit is a uint32 there
        (
            "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: second, requests_per_unit: 4294967296 }\n",
            "requests_per_unit 4294967296 is above 4294967295",
        ),
        // bad_yaml.yaml
        ("'''\n", "envoy.yaml"),
        // non_map_list.yaml
        (
            "domain: shop\ndescriptors:\n  - a\n  - b\n",
            "3:5: config error, yaml file contains list of type other than map",
        ),
        // non_string_key.yaml: it says the key is not a string; tollgate, that it is unknown
        (
            "0.25: shop\ndescriptors:\n  - key: cart\n",
            "config error, unknown key '0.25'",
        ),
    ];
    for (text, says) in cases {
        let (code, out) = validate("envoy.yaml", text);
        assert_eq!(code, 1, "{text:?} was accepted: {out}");
        assert!(out.contains("envoy.yaml"), "{out}");
        assert!(out.contains(says), "{text:?}: wanted {says:?} in {out}");
    }
}

/// Files that it loads: every field it knows, an empty `descriptors`, wildcards anywhere.
#[test]
fn files_it_loads_are_loaded() {
    let cases = [
        // duplicate_domain.yaml alone: a domain with no descriptors.
        "domain: shop\ndescriptors:\n",
        "domain: shop\n",
        // metadata.yaml
        "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: second, requests_per_unit: 5 }\n    metadata:\n      owner: checkout\n      nested: { team: payments, ids: [1, 2] }\n",
        // quota_mode, value_to_metric, detailed_metric, shadow_mode
        "domain: shop\ndescriptors:\n  - key: cart\n    quota_mode: true\n    value_to_metric: true\n    detailed_metric: true\n    shadow_mode: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
        // wildcard.yaml: trailing, middle and repeated stars, share_threshold on each
        "domain: shop\ndescriptors:\n  - key: sku\n    value: tv*\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n  - key: sku\n    value: tv*4k\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n  - key: path\n    value: /api*v1*items\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n",
        // examples/ratelimit/config/example.yaml: a document marker, a node with
        // detailed_metric and no limit, shadow_mode beside a limit
        "---\ndomain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n    shadow_mode: true\n  - key: unspec\n    detailed_metric: true\n",
        // share_threshold.yaml: share_threshold on a node without a limit, above one
        "domain: shop\ndescriptors:\n  - key: user\n    value: user/*\n    share_threshold: true\n    descriptors:\n      - key: action\n        rate_limit: { unit: minute, requests_per_unit: 150 }\n",
        // fields written with no value read as their defaults, as its YAML reads them
        "domain: shop\ndescriptors:\n  - key: cart\n    value:\n    shadow_mode:\n    descriptors:\n    rate_limit:\n      unit: second\n      requests_per_unit:\n      replaces:\n",
        // a limit of 0 that another replaces, an unlimited limit that replaces
        "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { name: zero, unit: minute, requests_per_unit: 0 }\n  - key: vip\n    rate_limit: { unlimited: true, replaces: [{ name: zero }] }\n",
    ];
    for text in cases {
        let (code, out) = validate("envoy.yaml", text);
        assert_eq!(code, 0, "{text:?} was refused: {out}");
    }
}

const SHOP: &str = "\
domain: shop
descriptors:
  - key: visitor
    rate_limit: { unit: second, requests_per_unit: 50 }
  - key: cart
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: checkout
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: named
    rate_limit: { name: the-name, unit: hour, requests_per_unit: 10 }
  - key: zero
    rate_limit: { name: zero, unit: hour, requests_per_unit: 0 }
  - key: vip
    rate_limit: { unlimited: true, replaces: [{ name: zero }] }
  - key: general
    rate_limit: { name: general, unit: hour, requests_per_unit: 0 }
  - key: special
    rate_limit: { unit: hour, requests_per_unit: 100, replaces: [{ name: general }] }
  - key: dark
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: dim
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: tokens
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: credits
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: sku
    value: tv*4k
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: path
    value: /api*v1*items
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: path
    value: /static*
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: tenant
    descriptors:
      - key: path
        rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: ip
    detailed_metric: true
    rate_limit: { unit: hour, requests_per_unit: 5 }
";

/// Where the counters live: every expectation holds on each.
#[derive(Debug, Clone, Copy)]
enum Store {
    Memory,
    /// Strict Redis, a server of the test's own.
    Redis,
    /// The memory store, [`SHOP`] pushed over xDS rather than read from a file
    /// (`RateLimitConfig` has no `share_threshold`: that descriptor is pushed without it).
    Xds,
}

const STORES: [Store; 3] = [Store::Memory, Store::Redis, Store::Xds];

/// `tollgate serve` of [`SHOP`] on `store`, with the settings `env` (`NAME=value`).
struct Shop {
    server: Server,
    _redis: Option<Redis>,
    _xds: Option<xds_server::Management>,
}

impl Shop {
    fn start(store: Store, env: &[&str]) -> Self {
        let wrapper: Vec<&str> = if env.is_empty() {
            Vec::new()
        } else {
            std::iter::once("env").chain(env.iter().copied()).collect()
        };
        match store {
            Store::Memory => Self {
                server: Server::start_under(&wrapper, &[("shop.yaml", SHOP)], &[]),
                _redis: None,
                _xds: None,
            },
            Store::Xds => {
                let shop = SHOP.replace("    share_threshold: true\n", "");
                let resources = vec![xds_server::resource("shop", &shop)];
                let management = xds_server::Management::start(Some(("1".into(), resources)), None);
                let url = management.url_setting();
                let wrapper: Vec<&str> = ["env", "CONFIG_TYPE=GRPC_XDS_SOTW", url.as_str()]
                    .into_iter()
                    .chain(env.iter().copied())
                    .collect();
                Self {
                    server: Server::start_under(&wrapper, &[], &[]),
                    _redis: None,
                    _xds: Some(management),
                }
            }
            Store::Redis => {
                let redis = Redis::start();
                let file = format!(
                    "store: {{ kind: redis, url: '{}', mode: strict, timeout: 1s }}\n",
                    redis.url()
                );
                let files = [("shop.yaml", SHOP), ("store.yaml", file.as_str())];
                Self {
                    server: Server::start_under(&wrapper, &files, &[]),
                    _redis: Some(redis),
                    _xds: None,
                }
            }
        }
    }
}

/// A value no other test run has used, so that counters start from nothing.
fn fresh(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{nanos}")
}

struct Rls(RateLimitServiceClient<Channel>);

impl Rls {
    /// A plain-text call to `server`: an error when it is not answered.
    async fn try_connect(server: &Server) -> Result<(), String> {
        let mut client = RateLimitServiceClient::connect(server.grpc.clone())
            .await
            .map_err(|e| e.to_string())?;
        let request = RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor(&[("checkout", "plain")])],
            hits_addend: 1,
        };
        client
            .should_rate_limit(request)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn connect(server: &Server) -> Self {
        Self(
            RateLimitServiceClient::connect(server.grpc.clone())
                .await
                .unwrap(),
        )
    }

    async fn ask(
        &mut self,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
        hits: u32,
    ) -> RateLimitResponse {
        self.0
            .should_rate_limit(RateLimitRequest {
                domain: domain.into(),
                descriptors,
                hits_addend: hits,
            })
            .await
            .unwrap()
            .into_inner()
    }

    async fn one(&mut self, d: RateLimitDescriptor, hits: u32) -> (i32, DescriptorStatus) {
        let response = self.ask("shop", vec![d], hits).await;
        (response.overall_code, response.statuses[0].clone())
    }
}

/// (code, requests per unit, remaining) of a status.
fn seen(status: &DescriptorStatus) -> (i32, u32, u32) {
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    (status.code, limit, status.limit_remaining)
}

/// Its integration test's sequence: one descriptor to its limit and past it, every hit
/// counted; then two descriptors, the one over its limit not stopping the other's count.
#[tokio::test]
async fn every_hit_counts_and_each_descriptor_counts_its_own() {
    for store in STORES {
        every_hit_counts_and_each_descriptor_counts_its_own_on(store).await;
    }
}

async fn every_hit_counts_and_each_descriptor_counts_its_own_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let unknown = rls
        .ask("nowhere", vec![descriptor(&[("visitor", "x")])], 1)
        .await;
    assert_eq!(unknown.overall_code, OK);
    assert_eq!(unknown.statuses[0].current_limit, None);
    assert_eq!(unknown.statuses[0].limit_remaining, 0);
    integration_sequence(std::slice::from_mut(&mut rls)).await;
}

/// Its integration test's two loops, the requests taking `clients` in turn: one descriptor
/// to its limit (20 per minute) and past it, every hit counted, resets in whole seconds; then
/// two descriptors, the one over its limit (10 per hour) not stopping the other's count.
async fn integration_sequence(clients: &mut [Rls]) {
    support::clear_of_a_minutes_turn().await;
    let turns = clients.len();
    let cart = fresh("cart");
    for i in 0..25u32 {
        let (overall, status) = clients[i as usize % turns]
            .one(descriptor(&[("cart", &cart)]), 1)
            .await;
        let (code, remaining) = if i >= 20 {
            (OVER, 0)
        } else {
            (OK, 20 - (i + 1))
        };
        assert_eq!(
            (overall, seen(&status)),
            (code, (code, 20, remaining)),
            "hit {i}"
        );
        let reset = status.duration_until_reset.unwrap();
        assert_eq!(reset.nanos, 0, "whole seconds");
        assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    }
    let (cart, checkout) = (fresh("cart"), fresh("checkout"));
    for i in 0..15u32 {
        let both = vec![
            descriptor(&[("cart", &cart)]),
            descriptor(&[("checkout", &checkout)]),
        ];
        let response = clients[i as usize % turns].ask("shop", both, 1).await;
        let over = i >= 10;
        assert_eq!(response.overall_code, if over { OVER } else { OK }, "{i}");
        assert_eq!(seen(&response.statuses[0]), (OK, 20, 20 - (i + 1)), "{i}");
        let checkout = if over {
            (OVER, 10, 0)
        } else {
            (OK, 10, 10 - (i + 1))
        };
        assert_eq!(seen(&response.statuses[1]), checkout, "{i}");
    }
}

/// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, the descriptors of a request that is over
/// stop counting, as its integration test expects (remaining stays at 10).
#[tokio::test]
async fn the_switch_stops_counting_the_others_once_one_is_over() {
    for store in STORES {
        the_switch_on(store).await;
    }
}

async fn the_switch_on(store: Store) {
    let shop = Shop::start(store, &["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let (cart, checkout) = (fresh("cart"), fresh("checkout"));
    support::clear_of_a_minutes_turn().await;
    for i in 0..15u32 {
        let both = vec![
            descriptor(&[("cart", &cart)]),
            descriptor(&[("checkout", &checkout)]),
        ];
        let response = rls.ask("shop", both, 1).await;
        let cart_left = if i >= 10 { 10 } else { 20 - (i + 1) };
        assert_eq!(seen(&response.statuses[0]), (OK, 20, cart_left), "{i}");
        assert_eq!(response.overall_code, if i >= 10 { OVER } else { OK });
    }
    if let Store::Xds = store {
        return;
    }
    // A setting that is not a boolean stops the service at start, naming it.
    let (code, _, err) = support::run_with_env(
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "sometimes")],
        &["validate", server.file("shop.yaml").to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=sometimes"),
        "{err}"
    );
}

/// The wire details: the same descriptor twice counts twice (9, then 8); a cost above the
/// limit is over, not an error, and counted; a look (hits 0) after going over is over (the
/// token quota pattern); the limit's name is the configured one, or empty.
#[tokio::test]
async fn duplicates_large_costs_looks_and_names() {
    for store in STORES {
        duplicates_large_costs_looks_and_names_on(store).await;
    }
}

async fn duplicates_large_costs_looks_and_names_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let checkout = fresh("checkout");
    let twice = vec![
        descriptor(&[("checkout", &checkout)]),
        descriptor(&[("checkout", &checkout)]),
    ];
    let response = rls.ask("shop", twice, 1).await;
    let left: Vec<u32> = response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect();
    assert_eq!(left, [9, 8]);
    assert_eq!(
        response.statuses[0].current_limit.as_ref().unwrap().name,
        ""
    );

    let named = rls.one(descriptor(&[("named", &fresh("n"))]), 1).await.1;
    let limit = named.current_limit.unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.unit),
        ("the-name", Unit::Hour as i32)
    );

    let big = fresh("checkout");
    let (overall, status) = rls.one(descriptor(&[("checkout", &big)]), 11).await;
    assert_eq!((overall, seen(&status)), (OVER, (OVER, 10, 0)));
    // Counted: a look now is over, and so is a single hit.
    let mut look = descriptor(&[("checkout", &big)]);
    look.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(rls.one(look, 1).await.0, OVER);
    assert_eq!(rls.one(descriptor(&[("checkout", &big)]), 1).await.0, OVER);

    // The token quota pattern: look with 0, then add the real cost when the stream ends.
    let quota = fresh("checkout");
    let mut zero = descriptor(&[("checkout", &quota)]);
    zero.hits_addend = Some(UInt64Value { value: 0 });
    let mut cost = descriptor(&[("checkout", &quota)]);
    cost.hits_addend = Some(UInt64Value { value: 7 });
    let mut admitted = 0;
    for _ in 0..4 {
        if rls.one(zero.clone(), 1).await.0 == OK {
            admitted += 1;
            rls.one(cost.clone(), 1).await;
        }
    }
    assert_eq!(admitted, 2, "7 + 7 went over 10: the third look is over");
}

/// `replaces`, `unlimited`, a limit of 0 and shadow mode, as its service applies them.
#[tokio::test]
async fn replaces_zero_unlimited_and_shadow() {
    for store in STORES {
        replaces_zero_unlimited_and_shadow_on(store).await;
    }
}

async fn replaces_zero_unlimited_and_shadow_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let (overall, zero) = rls.one(descriptor(&[("zero", "a")]), 1).await;
    assert_eq!((overall, seen(&zero)), (OVER, (OVER, 0, 0)));
    assert!(zero.duration_until_reset.is_some());
    // An unlimited limit replaces a limit of 0 named in its `replaces`.
    let both = vec![descriptor(&[("zero", "a")]), descriptor(&[("vip", "b")])];
    let response = rls.ask("shop", both, 1).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(seen(&response.statuses[0]), (OK, 0, 0));
    assert_eq!(seen(&response.statuses[1]), (OK, 0, u32::MAX));
    // A limit replaces a limit of 0.
    let both = vec![
        descriptor(&[("general", "a")]),
        descriptor(&[("special", &fresh("s"))]),
    ];
    let response = rls.ask("shop", both, 1).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(seen(&response.statuses[1]), (OK, 100, 99));
    // Shadow mode never denies, whatever the limit, 0 included.
    let (overall, dark) = rls.one(descriptor(&[("dark", "a")]), 5).await;
    assert_eq!((overall, dark.code), (OK, OK));
    let dim = fresh("dim");
    for _ in 0..3 {
        assert_eq!(rls.one(descriptor(&[("dim", &dim)]), 1).await.0, OK);
    }
    assert_eq!(rls.one(descriptor(&[("dim", &dim)]), 1).await.1.code, OK);
}

/// Quota mode: a request is over for its quota descriptors only when all of them are.
#[tokio::test]
async fn quota_descriptors_are_over_only_together() {
    for store in STORES {
        quota_descriptors_are_over_only_together_on(store).await;
    }
}

async fn quota_descriptors_are_over_only_together_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let (tokens, credits) = (fresh("t"), fresh("c"));
    let both = || {
        vec![
            descriptor(&[("tokens", &tokens)]),
            descriptor(&[("credits", &credits)]),
        ]
    };
    let codes = |r: &RateLimitResponse| {
        (
            r.overall_code,
            r.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
        )
    };
    // 3 each: credits (3) is at its limit, tokens (5) is not.
    assert_eq!(codes(&rls.ask("shop", both(), 3).await), (OK, vec![OK, OK]));
    // Credits over, tokens not: OK overall.
    assert_eq!(
        codes(&rls.ask("shop", both(), 1).await),
        (OK, vec![OK, OVER])
    );
    // Both over: over.
    assert_eq!(
        codes(&rls.ask("shop", both(), 2).await),
        (OVER, vec![OVER, OVER])
    );
}

/// Wildcards in the middle and repeated match; share_threshold puts every matching value on
/// one counter; without it each value counts apart.
#[tokio::test]
async fn wildcards_anywhere() {
    for store in STORES {
        wildcards_anywhere_on(store).await;
    }
}

async fn wildcards_anywhere_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let sku = |v: &str| descriptor(&[("sku", v)]);
    let (overall, status) = rls.one(sku(&format!("tv-{}-4k", fresh("x"))), 1).await;
    assert_eq!((overall, seen(&status)), (OK, (OK, 2, 1)));
    assert!(rls.one(sku("tv4k"), 1).await.1.current_limit.is_some());
    assert_eq!(rls.one(sku("tv-8k"), 1).await.1.current_limit, None);

    let shared = fresh("s");
    let left: Vec<(i32, u32)> = {
        let mut left = Vec::new();
        for value in [
            "/api/a/v1/items",
            "/api/v1/items",
            "/api/b/v1/c/items",
            "/api/v1/items",
        ] {
            let path = descriptor(&[("path", &format!("{value}?{shared}"))]);
            // The query makes the value end elsewhere: no match.
            assert_eq!(rls.one(path, 1).await.1.current_limit, None);
            let (_, status) = rls.one(descriptor(&[("path", value)]), 1).await;
            left.push((status.code, status.limit_remaining));
        }
        left
    };
    // One counter for all four values (a fresh server: nothing counted before); pushed
    // over xDS, which cannot say share_threshold, each value its own.
    match store {
        Store::Xds => assert_eq!(left, [(OK, 2), (OK, 2), (OK, 2), (OK, 1)]),
        Store::Memory | Store::Redis => assert_eq!(left, [(OK, 2), (OK, 1), (OK, 0), (OVER, 0)]),
    }
    // Without share_threshold, values count apart.
    let a = rls.one(descriptor(&[("path", "/static/a.css")]), 3).await.1;
    let b = rls.one(descriptor(&[("path", "/static/b.css")]), 1).await.1;
    assert_eq!((a.limit_remaining, b.limit_remaining), (0, 2));
}

/// A limit sent with the descriptor applies instead of the file's, to a descriptor the file
/// limits or not, and counts apart from the file's limit.
#[tokio::test]
async fn a_limit_in_the_request_applies() {
    for store in STORES {
        a_limit_in_the_request_applies_on(store).await;
    }
}

async fn a_limit_in_the_request_applies_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let with = |entries: &[(&str, &str)], n: u32| {
        let mut d = descriptor(entries);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: n,
            unit: Unit::Minute as i32,
        });
        d
    };
    let checkout = fresh("checkout");
    let (overall, status) = rls.one(with(&[("checkout", &checkout)], 3), 1).await;
    assert_eq!((overall, seen(&status)), (OK, (OK, 3, 2)));
    assert_eq!(
        status.current_limit.as_ref().unwrap().unit,
        Unit::Minute as i32
    );
    // The file's limit (10 per hour) of the same descriptor has its own count.
    let own = rls.one(descriptor(&[("checkout", &checkout)]), 1).await.1;
    assert_eq!(seen(&own), (OK, 10, 9));
    // A descriptor the file does not know gets the limit it carries.
    let stranger = fresh("stranger");
    for expected in [(OK, 1, 0), (OVER, 1, 0)] {
        let (_, status) = rls.one(with(&[("unknown", &stranger)], 1), 1).await;
        assert_eq!(seen(&status), expected);
    }
}

/// Descriptor values of 100,000 and 1,000,000 bytes, which the Envoy service takes within
/// grpc-go's 4 MiB message: each is counted under its own value, as any other.
#[tokio::test]
async fn values_of_a_hundred_thousand_and_a_million_bytes_count() {
    for store in STORES {
        long_values_count_on(store).await;
    }
}

async fn long_values_count_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let mut rls = Rls::connect(&shop.server).await;
    for length in [100_000, 1_000_000] {
        let mut value = fresh("checkout");
        value.extend(std::iter::repeat_n('x', length - value.len()));
        for remaining in [9, 8] {
            let (overall, status) = rls.one(descriptor(&[("checkout", &value)]), 1).await;
            assert_eq!(
                (overall, seen(&status)),
                (OK, (OK, 10, remaining)),
                "{length}"
            );
        }
        // A value differing in its last byte only has a count of its own.
        value.pop();
        value.push('y');
        let (_, status) = rls.one(descriptor(&[("checkout", &value)]), 1).await;
        assert_eq!(seen(&status), (OK, 10, 9), "{length}");
    }
}

/// What the Envoy service answers with a status is never an error here: a cost of 2^32 - 1
/// on a limit of 50 is over the limit.
#[tokio::test]
async fn absurd_costs_are_over_the_limit() {
    for store in STORES {
        absurd_costs_are_over_the_limit_on(store).await;
    }
}

async fn absurd_costs_are_over_the_limit_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let (overall, status) = rls
        .one(descriptor(&[("visitor", &fresh("v"))]), u32::MAX)
        .await;
    assert_eq!((overall, seen(&status)), (OVER, (OVER, 50, 0)));
}

/// The global `SHADOW_MODE` answers every request OK, its statuses as they are; the global
/// `QUOTA_MODE` puts every descriptor in quota mode.
#[tokio::test]
async fn global_shadow_and_quota_modes() {
    for store in STORES {
        global_modes_on(store).await;
    }
}

async fn global_modes_on(store: Store) {
    let shadow = Shop::start(store, &["SHADOW_MODE=true"]);
    let mut rls = Rls::connect(&shadow.server).await;
    let (overall, zero) = rls.one(descriptor(&[("zero", "a")]), 1).await;
    assert_eq!((overall, zero.code), (OK, OVER));

    let quota = Shop::start(store, &["QUOTA_MODE=1"]);
    let mut rls = Rls::connect(&quota.server).await;
    let checkout = fresh("checkout");
    let both = vec![
        descriptor(&[("zero", "a")]),
        descriptor(&[("checkout", &checkout)]),
    ];
    let response = rls.ask("shop", both, 1).await;
    assert_eq!(
        response.overall_code, OK,
        "not every quota descriptor is over"
    );
    let (overall, _) = rls.one(descriptor(&[("zero", "a")]), 1).await;
    assert_eq!(overall, OVER);
}

/// Values as long as a real Envoy may send (a 20 KB header value): answered and counted
/// like any other, not refused.
#[tokio::test]
async fn long_values_are_answered() {
    for store in STORES {
        long_values_are_answered_on(store).await;
    }
}

async fn long_values_are_answered_on(store: Store) {
    let shop = Shop::start(store, &[]);
    let server = &shop.server;
    let mut rls = Rls::connect(server).await;
    let long = format!("{}{}", fresh("v"), "x".repeat(20_000));
    let other = format!("{}{}", fresh("w"), "x".repeat(20_000));
    let left = |s: DescriptorStatus| (s.code, s.limit_remaining);
    assert_eq!(
        left(rls.one(descriptor(&[("checkout", &long)]), 1).await.1),
        (OK, 9)
    );
    assert_eq!(
        left(rls.one(descriptor(&[("checkout", &long)]), 1).await.1),
        (OK, 8)
    );
    assert_eq!(
        left(rls.one(descriptor(&[("checkout", &other)]), 1).await.1),
        (OK, 9)
    );
}

/// `GET /healthcheck` and `grpc.health.v1.Health` as its service has them: healthy while it
/// serves; with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, not until a domain is loaded (how
/// health follows Redis: tests/envoy_settings.rs).
#[tokio::test]
async fn health_checks() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let http = |server: &Server| format!("{}/healthcheck", server.http);
    let grpc = |server: &Server| {
        let url = server.grpc.clone();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = HealthClient::new(channel);
            let ask = |service: &str| HealthCheckRequest {
                service: service.into(),
            };
            let ratelimit = client.check(ask("ratelimit")).await.unwrap().into_inner();
            let whole = client.check(ask("")).await.unwrap().into_inner();
            assert_eq!(ratelimit.status, whole.status);
            ratelimit.status
        }
    };
    let healthy = Server::start(&[("shop.yaml", SHOP)], &[]);
    let answer = reqwest::get(http(&healthy)).await.unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(answer.text().await.unwrap(), "OK");
    assert_eq!(grpc(&healthy).await, ServingStatus::Serving as i32);

    let native = "rules:\n  - id: a\n    tiers: [{ limit: 1, period: 1s }]\n";
    let unconfigured = Server::start_under(
        &["env", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"],
        &[("rules.yaml", native)],
        &[],
    );
    let answer = reqwest::get(http(&unconfigured)).await.unwrap();
    assert_eq!(answer.status().as_u16(), 500);
    // The gRPC status follows the health it checks every quarter of a second.
    let mut status = grpc(&unconfigured).await;
    for _ in 0..40 {
        if status == ServingStatus::NotServing as i32 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        status = grpc(&unconfigured).await;
    }
    assert_eq!(status, ServingStatus::NotServing as i32);
}

/// `POST /json`, as its handler's tests expect: no body or no JSON is 400; a request answers
/// in protobuf's JSON mapping, with 429 when over the limit.
#[tokio::test]
async fn the_json_endpoint() {
    let server = Server::start(&[("shop.yaml", SHOP)], &[]);
    let client = reqwest::Client::new();
    let post = |body: String| {
        let request = client.post(format!("{}/json", server.http)).body(body);
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status().as_u16();
            let kind = support::header(answer.headers(), "content-type")
                .unwrap_or_default()
                .to_string();
            (status, kind, answer.text().await.unwrap())
        }
    };
    for bad in [
        "",
        "}",
        r#"{"domain": "shop"}"#,
        r#"{"domain": "shop", "extra": 1}"#,
    ] {
        let (status, kind, text) = post(bad.into()).await;
        assert_eq!(
            (status, kind.as_str()),
            (400, "text/plain; charset=utf-8"),
            "{bad}"
        );
        assert!(text.starts_with("Bad Request"), "{text}");
    }
    let checkout = fresh("checkout");
    let body = format!(
        r#"{{"domain": "shop", "descriptors": [{{"entries": [{{"key": "checkout", "value": "{checkout}"}}]}}], "hitsAddend": 9}}"#
    );
    let (status, kind, text) = post(body.clone()).await;
    assert_eq!((status, kind.as_str()), (200, "application/json"));
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["overallCode"], "OK");
    let first = &answer["statuses"][0];
    assert_eq!(first["code"], "OK");
    assert_eq!(first["currentLimit"]["requestsPerUnit"], 10);
    assert_eq!(first["currentLimit"]["unit"], "HOUR");
    assert_eq!(first["limitRemaining"], 1);
    assert!(first["durationUntilReset"].as_str().unwrap().ends_with('s'));
    let (status, _, text) = post(body).await;
    assert_eq!(status, 429);
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");
    assert_eq!(answer["statuses"][0].get("limitRemaining"), None);
    // The proto's own names, and a descriptor's own limit and hits.
    let body = format!(
        r#"{{"domain": "shop", "descriptors": [{{"entries": [{{"key": "x", "value": "{checkout}"}}], "limit": {{"requests_per_unit": 5, "unit": "MINUTE"}}, "hits_addend": "2"}}]}}"#
    );
    let (status, _, text) = post(body).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (status, &answer["statuses"][0]["limitRemaining"]),
        (200, &serde_json::json!(3))
    );
}

/// `LIMIT_RESPONSE_HEADERS_ENABLED`: each answer asks Envoy to add the limit, what remains and
/// the seconds until the reset of the descriptor closest to its limit, under the names
/// configured.
#[tokio::test]
async fn limit_response_headers() {
    let fields = |r: &RateLimitResponse| -> Vec<(String, String)> {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let plain = Shop::start(Store::Memory, &[]);
    let mut rls = Rls::connect(&plain.server).await;
    let answer = rls
        .ask("shop", vec![descriptor(&[("checkout", "a")])], 1)
        .await;
    assert!(answer.response_headers_to_add.is_empty());

    let on = Shop::start(Store::Memory, &["LIMIT_RESPONSE_HEADERS_ENABLED=true"]);
    let mut rls = Rls::connect(&on.server).await;
    let (cart, checkout) = (fresh("cart"), fresh("checkout"));
    let both = vec![
        descriptor(&[("cart", &cart)]),
        descriptor(&[("checkout", &checkout)]),
    ];
    let answer = rls.ask("shop", both, 3).await;
    let got = fields(&answer);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    );
    // The checkout limit (10 per hour, 7 left) is closer to its limit than the cart's (20, 17).
    assert_eq!((got[0].1.as_str(), got[1].1.as_str()), ("10", "7"));
    let reset: u64 = got[2].1.parse().unwrap();
    assert!((1..=3600).contains(&reset), "{reset}");

    let named = Shop::start(
        Store::Memory,
        &[
            "LIMIT_RESPONSE_HEADERS_ENABLED=1",
            "LIMIT_LIMIT_HEADER=X-Limit",
            "LIMIT_REMAINING_HEADER=X-Left",
            "LIMIT_RESET_HEADER=X-Reset",
        ],
    );
    let mut rls = Rls::connect(&named.server).await;
    let answer = rls
        .ask("shop", vec![descriptor(&[("checkout", &fresh("c"))])], 1)
        .await;
    let names: Vec<String> = fields(&answer).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["X-Limit", "X-Left", "X-Reset"]);
}

const OTHER: &str = "\
domain: other
descriptors:
  - key: k
    rate_limit: { unit: hour, requests_per_unit: 3 }
";

/// Without `--config`, the files of its runtime directory
/// (`$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`), every one, dotfiles left
/// out, and files added later once they appear.
#[tokio::test]
async fn the_runtime_directory() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(config.join("more")).unwrap();
    std::fs::write(config.join("shop.yaml"), SHOP).unwrap();
    std::fs::write(config.join(".editing.yaml.swp"), "not: [yaml").unwrap();
    let root_setting = format!("RUNTIME_ROOT={}", root.path().display());
    let server = Server::start_under(
        &["env", &root_setting, "RUNTIME_SUBDIRECTORY=ratelimit"],
        &[],
        &[],
    );
    let mut rls = Rls::connect(&server).await;
    let (_, status) = rls.one(descriptor(&[("checkout", &fresh("c"))]), 1).await;
    assert_eq!(seen(&status), (OK, 10, 9));
    let other = || vec![descriptor(&[("k", "v")])];
    let answer = rls.ask("other", other(), 1).await;
    assert_eq!(answer.statuses[0].limit_remaining, 0, "no such domain yet");
    std::fs::write(config.join("more").join("other.yaml"), OTHER).unwrap();
    server.wait_for_log("reloaded", std::time::Duration::from_secs(10));
    let answer = rls.ask("other", other(), 1).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2);
}

/// Two files of one domain are refused, unless `MERGE_DOMAIN_CONFIG`: then they merge, and a
/// key both define is the second file's error.
#[test]
fn merged_domains() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("a.yaml");
    let second = dir.path().join("b.yaml");
    std::fs::write(&first, "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n").unwrap();
    std::fs::write(&second, "domain: shop\ndescriptors:\n  - key: checkout\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n").unwrap();
    let args = ["validate", dir.path().to_str().unwrap()];
    let (code, _, err) = run(&args);
    assert_eq!(code, 1);
    assert!(
        err.contains("b.yaml:1:9: duplicate domain 'shop' in config file"),
        "{err}"
    );
    let merge = [("MERGE_DOMAIN_CONFIG", "true")];
    let (code, out, err) = support::run_with_env(&merge, &args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 rules (0 routes, 1 Envoy domains)"), "{out}");
    std::fs::write(&second, "domain: shop\ndescriptors:\n  - key: cart\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n").unwrap();
    let (code, _, err) = support::run_with_env(&merge, &args);
    assert_eq!(code, 1);
    assert!(
        err.contains("b.yaml:1:9: duplicate descriptor composite key 'shop.cart'"),
        "{err}"
    );
}

/// Its listeners' and Redis's settings, where no file sets `server` or `store`: `PORT`,
/// `GRPC_PORT`; `REDIS_SOCKET_TYPE`, `REDIS_URL`; a backend tollgate has not is refused.
#[tokio::test]
async fn its_ports_and_redis_from_the_environment() {
    let (http, grpc) = (support::free_port(), support::free_port());
    let (port, grpc_port) = (format!("PORT={http}"), format!("GRPC_PORT={grpc}"));
    let redis = Redis::start();
    let redis_url = format!("REDIS_URL=127.0.0.1:{}", redis.port);
    let server = Server::start_as_given(
        &[
            "env",
            &port,
            &grpc_port,
            "HOST=127.0.0.1",
            "GRPC_HOST=127.0.0.1",
            "REDIS_SOCKET_TYPE=tcp",
            &redis_url,
        ],
        &[("shop.yaml", SHOP)],
        &[],
    );
    assert_eq!(server.http, format!("http://127.0.0.1:{http}"));
    assert_eq!(server.grpc, format!("http://127.0.0.1:{grpc}"));
    let mut rls = Rls::connect(&server).await;
    let (_, status) = rls.one(descriptor(&[("checkout", "in-redis")]), 1).await;
    assert_eq!(seen(&status), (OK, 10, 9));
    let keys = redis.cli(&["--scan", "--pattern", "*in-redis*"]);
    assert!(!keys.trim().is_empty(), "the count is in Redis");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.yaml");
    std::fs::write(&file, SHOP).unwrap();
    let (code, _, err) = support::run_with_env(
        &[("BACKEND_TYPE", "memcache")],
        &["validate", file.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(err.contains("BACKEND_TYPE: `memcache`"), "{err}");
}

/// The value of the series `name` with every label of `labels` in a Prometheus text
/// exposition, 0 when absent.
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            let (inside, _) = l.split_once('}').unwrap();
            let count = inside.matches('=').count();
            count == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| inside.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Its statistics under the names its Prometheus mapping gives them: hits (not requests)
/// within, near and over the limit, and in shadow mode, by domain and the first two keys.
#[tokio::test]
async fn its_statistics_for_its_dashboards() {
    let server = Server::start(&[("shop.yaml", SHOP)], &[]);
    let mut rls = Rls::connect(&server).await;
    for _ in 0..25 {
        rls.one(descriptor(&[("cart", "one")]), 1).await;
    }
    rls.one(descriptor(&[("tenant", "t"), ("path", "/p")]), 2)
        .await;
    rls.one(descriptor(&[("dim", "x")]), 3).await;
    rls.one(descriptor(&[("ip", "10.0.0.1")]), 1).await;
    let text = reqwest::get(format!("{}/metrics", server.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let stat = |what: &str, labels: &[(&str, &str)]| {
        series(
            &text,
            &format!("ratelimit_service_rate_limit_{what}"),
            labels,
        )
    };
    let cart = [("domain", "shop"), ("key1", "cart")];
    // 20 per minute: 20 within (the last 4 past 80% of it), 5 over.
    assert_eq!(stat("total_hits", &cart), 25.0, "{text}");
    assert_eq!(stat("within_limit", &cart), 20.0);
    assert_eq!(stat("near_limit", &cart), 4.0);
    assert_eq!(stat("over_limit", &cart), 5.0);
    let nested = [("domain", "shop"), ("key1", "tenant"), ("key2", "path")];
    assert_eq!(stat("total_hits", &nested), 2.0);
    // Shadow mode: 3 hits over a limit of 2, counted over and in shadow mode.
    let dim = [("domain", "shop"), ("key1", "dim")];
    assert_eq!(stat("within_limit", &dim), 0.0);
    assert_eq!(stat("shadow_mode", &dim), 3.0);
    // Detailed metrics name the value, an address's dots as underscores.
    let ip = [("domain", "shop"), ("key1", "ip_10_0_0_1")];
    assert_eq!(stat("total_hits", &ip), 1.0);
}

/// TLS and mutual TLS on the gRPC listener, from its settings (`GRPC_SERVER_USE_TLS`,
/// `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY`, `GRPC_CLIENT_TLS_CACERT`): a client that
/// trusts the CA is answered; with mutual TLS, only one presenting a certificate the CA
/// signed. `GRPC_CLIENT_TLS_SAN`, which tollgate does not check, stops it at start.
#[tokio::test]
async fn grpc_over_tls_and_mutual_tls() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key, client_cert, client_key] = support::certificates(dir.path());
    let setting = |name: &str, path: &std::path::Path| format!("{name}={}", path.display());
    let (cert_setting, key_setting) = (
        setting("GRPC_SERVER_TLS_CERT", &cert),
        setting("GRPC_SERVER_TLS_KEY", &key),
    );
    let ca_setting = setting("GRPC_CLIENT_TLS_CACERT", &ca);
    let trust = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
            .domain_name("localhost")
    };
    let ask = |url: String, tls: ClientTlsConfig| async move {
        let url = url.replace("http://", "https://");
        let channel = Endpoint::from_shared(url)
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = RateLimitServiceClient::new(channel);
        let request = RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor(&[("checkout", &fresh("tls"))])],
            hits_addend: 1,
        };
        client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner().statuses[0].limit_remaining)
            .map_err(|e| e.to_string())
    };

    let tls = Server::start_under(
        &[
            "env",
            "GRPC_SERVER_USE_TLS=true",
            &cert_setting,
            &key_setting,
        ],
        &[("shop.yaml", SHOP)],
        &[],
    );
    assert_eq!(ask(tls.grpc.clone(), trust()).await, Ok(9));
    // Plain text to a TLS listener is not answered.
    assert!(Rls::try_connect(&tls).await.is_err());

    let mutual = Server::start_under(
        &[
            "env",
            "GRPC_SERVER_USE_TLS=true",
            &cert_setting,
            &key_setting,
            &ca_setting,
        ],
        &[("shop.yaml", SHOP)],
        &[],
    );
    assert!(
        ask(mutual.grpc.clone(), trust()).await.is_err(),
        "no client certificate"
    );
    let identity = Identity::from_pem(
        std::fs::read(&client_cert).unwrap(),
        std::fs::read(&client_key).unwrap(),
    );
    assert_eq!(
        ask(mutual.grpc.clone(), trust().identity(identity)).await,
        Ok(9)
    );

    let file = dir.path().join("shop.yaml");
    std::fs::write(&file, SHOP).unwrap();
    let (code, _, err) = support::run_with_env(
        &[("GRPC_CLIENT_TLS_SAN", "envoy")],
        &["validate", file.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(err.contains("GRPC_CLIENT_TLS_SAN"), "{err}");
}

/// Its integration test's sequence on two servers sharing one Redis, as its own runs it:
/// the requests alternate between them and count as on one.
#[tokio::test]
async fn two_servers_on_one_redis_count_as_one() {
    let redis = Redis::start();
    let store = format!(
        "store: {{ kind: redis, url: '{}', mode: strict, timeout: 1s }}\n",
        redis.url()
    );
    let files = [("shop.yaml", SHOP), ("store.yaml", store.as_str())];
    let (a, b) = (Server::start(&files, &[]), Server::start(&files, &[]));
    let mut clients = [Rls::connect(&a).await, Rls::connect(&b).await];
    integration_sequence(&mut clients).await;
}

/// `GRPC_UDS`: gRPC on a Unix socket instead of a TCP port, as its sidecar deployments use.
#[tokio::test]
async fn grpc_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ratelimit.sock");
    // A socket file left by an earlier process does not stop it.
    std::fs::write(&socket, "").unwrap();
    let setting = format!("GRPC_UDS={}", socket.display());
    let server = Server::start_under(&["env", &setting], &[("shop.yaml", SHOP)], &[]);
    assert!(server.grpc.contains("unix:"), "{}", server.grpc);
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let request = RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![descriptor(&[("checkout", &fresh("uds"))])],
        hits_addend: 1,
    };
    let answer = client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.statuses[0].limit_remaining, 9);
}

/// `RESPONSE_DYNAMIC_METADATA`: answers carry the request and the `metadata` of the limits
/// that passed, merged, as its service gives them; none without the setting.
#[tokio::test]
async fn dynamic_metadata() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let file = "\
domain: shop
descriptors:
  - key: cart
    rate_limit: { unit: hour, requests_per_unit: 1 }
    metadata: { owner: carts, team: { name: checkout } }
  - key: pay
    rate_limit: { unit: hour, requests_per_unit: 5 }
    metadata: { owner: payments, team: { oncall: alice } }
";
    let plain = Server::start(&[("shop.yaml", file)], &[]);
    let answer = Rls::connect(&plain)
        .await
        .ask("shop", vec![descriptor(&[("cart", &fresh("c"))])], 1)
        .await;
    assert_eq!(answer.dynamic_metadata, None);

    let server = Server::start_under(
        &["env", "RESPONSE_DYNAMIC_METADATA=true"],
        &[("shop.yaml", file)],
        &[],
    );
    let mut rls = Rls::connect(&server).await;
    let cart = fresh("c");
    let both = || vec![descriptor(&[("cart", &cart)]), descriptor(&[("pay", "p")])];
    let text = |v: &envoy_types::pb::google::protobuf::Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    let fields = |s: &envoy_types::pb::google::protobuf::Value| match &s.kind {
        Some(Kind::StructValue(s)) => s.fields.clone(),
        other => panic!("{other:?}"),
    };
    let first = rls.ask("shop", both(), 1).await.dynamic_metadata.unwrap();
    assert_eq!(text(&first.fields["domain"]), "shop");
    let metadata = fields(&first.fields["metadata"]);
    // Both passed: the first's owner wins, the teams merge.
    assert_eq!(text(&metadata["owner"]), "carts");
    let team = fields(&metadata["team"]);
    assert_eq!(
        (text(&team["name"]), text(&team["oncall"])),
        ("checkout".into(), "alice".into())
    );
    match &first.fields["descriptors"].kind {
        Some(Kind::ListValue(list)) => {
            let entries = &fields(&list.values[0])["entries"];
            match &entries.kind {
                Some(Kind::ListValue(e)) => assert_eq!(text(&e.values[0]), format!("cart={cart}")),
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    // The cart's limit (1) is spent: only the payment's metadata is merged.
    let second = rls.ask("shop", both(), 1).await.dynamic_metadata.unwrap();
    let metadata = fields(&second.fields["metadata"]);
    assert_eq!(text(&metadata["owner"]), "payments");
}

/// `USE_PROMETHEUS` serves the metrics where its scrape configuration looks for them
/// (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`); `LOG_LEVEL` sets the log level when `RUST_LOG`
/// does not.
#[tokio::test]
async fn its_metrics_address_and_log_level() {
    let port = support::free_port();
    let addr = format!("PROMETHEUS_ADDR=127.0.0.1:{port}");
    let server = Server::start_under(
        &[
            "env",
            "USE_PROMETHEUS=true",
            &addr,
            "PROMETHEUS_PATH=/stats/prometheus",
        ],
        &[("shop.yaml", SHOP)],
        &[],
    );
    Rls::connect(&server)
        .await
        .one(descriptor(&[("cart", &fresh("m"))]), 1)
        .await;
    let url = format!("http://127.0.0.1:{port}/stats/prometheus");
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    assert!(
        text.contains("ratelimit_service_rate_limit_total_hits"),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.yaml");
    std::fs::write(&file, SHOP).unwrap();
    let (code, _, err) = support::run_with_env(
        &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "nowhere")],
        &["validate", file.to_str().unwrap()],
    );
    assert_eq!(code, 1);
    assert!(err.contains("PROMETHEUS_ADDR"), "{err}");
}

/// `LOG_LEVEL=error` (with no `RUST_LOG`) leaves out the start's info lines.
#[tokio::test]
async fn its_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.yaml");
    std::fs::write(&file, SHOP).unwrap();
    let (http, grpc) = (support::free_port(), support::free_port());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", file.to_str().unwrap()])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .env_remove("RUST_LOG")
        .env("LOG_LEVEL", "error")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{http}/healthcheck");
    let mut up = false;
    for _ in 0..100 {
        if reqwest::get(&url).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    support::signal(child.id(), "TERM");
    let out = child.wait_with_output().unwrap();
    assert!(up, "it answered");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("listening"), "{log}");
}

/// A deployment that swaps `RUNTIME_ROOT` (a symbolic link, `current`) to a new directory:
/// the rules reload from the new one, and its files are watched from then on.
#[tokio::test]
async fn a_swapped_runtime_root_is_followed() {
    let base = tempfile::tempdir().unwrap();
    let release = |name: &str, text: &str| {
        let config = base.path().join(name).join("ratelimit").join("config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("rules.yaml"), text).unwrap();
        config
    };
    release("v1", SHOP);
    let current = base.path().join("current");
    std::os::unix::fs::symlink(base.path().join("v1"), &current).unwrap();
    let root = format!("RUNTIME_ROOT={}", current.display());
    let server = Server::start_under(&["env", &root, "RUNTIME_SUBDIRECTORY=ratelimit"], &[], &[]);
    let mut rls = Rls::connect(&server).await;
    let other = || vec![descriptor(&[("k", "v")])];
    assert_eq!(
        rls.ask("other", other(), 1).await.statuses[0].limit_remaining,
        0
    );

    // Swapped as deployments do: a new link renamed over the old one.
    let v2 = release("v2", OTHER);
    let next = base.path().join("next");
    std::os::unix::fs::symlink(base.path().join("v2"), &next).unwrap();
    std::fs::rename(&next, &current).unwrap();
    server.wait_for_log("reloaded", std::time::Duration::from_secs(10));
    assert_eq!(
        rls.ask("other", other(), 1).await.statuses[0].limit_remaining,
        2
    );

    // The new directory's files are watched now: the new limit applies within seconds.
    std::fs::write(
        v2.join("rules.yaml"),
        OTHER.replace("requests_per_unit: 3", "requests_per_unit: 30"),
    )
    .unwrap();
    let mut limit = 0;
    for _ in 0..100 {
        let status = rls.ask("other", other(), 0).await.statuses[0].clone();
        limit = status.current_limit.map_or(0, |l| l.requests_per_unit);
        if limit == 30 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(limit, 30);
}

/// A descriptor's own limit with no known unit is refused: applying none would let every
/// request through.
#[tokio::test]
async fn a_limit_of_no_known_unit_is_refused() {
    let server = Server::start(&[("shop.yaml", SHOP)], &[]);
    let mut d = descriptor(&[("checkout", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Unknown as i32,
    });
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![d],
        hits_addend: 1,
    };
    let err = client.should_rate_limit(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("no known unit"), "{}", err.message());
}
