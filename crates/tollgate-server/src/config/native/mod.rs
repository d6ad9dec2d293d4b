//! tollgate's native rule file:
//!
//! ```yaml
//! server: { http: 127.0.0.1:8080, grpc: 127.0.0.1:8081, max_connections: 10000, idle_timeout: 60s }
//! store: { kind: memory, max_keys: 1000000, when_full: evict }
//! rules:
//!   - id: get-product
//!     match: { methods: [GET], path: "/v1/organizations/{org}/product/*" }
//!     key: [segment:org, route, method]
//!     algorithm: fixed_window
//!     tiers: [{ limit: 1000, period: 10s }]
//! ```
//!
//! An older spelling (of the SLA files this format grew from) is accepted too: `slas` for `rules`, `pathPattern` for
//! `path`, `threshold` for `limit`, a period in seconds.

mod rule;

pub use rule::{
    MatchSpec, OnExpirySpec, OnPartitionSpec, Period, ReservationsSpec, RuleSpec, ScopeSpec,
    TierSpec, field_of_rule, parse_algorithm, parse_rule_spec, parse_rule_text,
};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate::WhenFull;

use super::duration;
use super::{
    ConfigError, DEFAULT_MAX_BYTES, DEFAULT_MAX_KEYS, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL,
    Limits, PeerSettings, RedisMode, RedisOptions, RegionsSettings, ServerConfig, StoreConfig,
    TlsFiles,
};

/// The JSON Schema of a native rule file.
pub fn schema() -> schemars::Schema {
    schemars::schema_for!(File)
}

/// A native rule file: the service's settings (`server`), where counters live (`store`), and
/// the rules. Every section may be left out; files served together may each hold some of
/// them, but `server` and `store` in one file only.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "tollgate rule file")]
struct File {
    /// Where the service listens and what it accepts. Without one in any file, the
    /// listeners are loopback (or the Envoy service's `PORT`, `GRPC_PORT` settings).
    #[schemars(with = "Option<ServerSection>")]
    server: Option<Spanned<ServerSection>>,
    /// Where counters live. Without one in any file, the memory store (or a strict Redis
    /// store from the Envoy service's `REDIS_URL` settings).
    #[schemars(with = "Option<StoreSection>")]
    store: Option<Spanned<StoreSection>>,
    /// The rules, each with its id, what it matches, its key, algorithm and tiers.
    #[serde(default, alias = "slas")]
    #[schemars(with = "Vec<RuleSpec>", extend("x-aliases" = ["slas"]))]
    rules: Vec<Spanned<RuleSpec>>,
}

/// The `server` section: listeners, bounds on connections and bodies, TLS, the console's
/// recorder. Read at start: a change needs a restart.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    /// The HTTP listener's address (check, auth, admin, console, metrics, health).
    #[schemars(extend("default" = "127.0.0.1:8080"))]
    http: Option<SocketAddr>,
    /// The gRPC listener's address (Envoy's rate limit service), or `off`.
    #[schemars(extend("default" = "127.0.0.1:8081"))]
    grpc: Option<String>,
    /// The largest HTTP request body accepted, in bytes; at least 1024. A larger one is
    /// refused (413) before it is read whole.
    #[schemars(extend("default" = 65536))]
    max_body_bytes: Option<usize>,
    /// The largest gRPC message accepted, in bytes; at least 1024. The default is grpc-go's,
    /// which Envoy's own rate limit service keeps. A larger message, or one of more than
    /// 1,024 descriptors or 16,384 entries, is refused (`OUT_OF_RANGE`) before it is decoded.
    #[schemars(extend("default" = 4194304))]
    grpc_max_message_bytes: Option<usize>,
    /// OpenTelemetry traces over OTLP; off when absent (or the Envoy service's
    /// `TRACING_ENABLED`).
    tracing: Option<crate::config::TracingSettings>,
    /// How long shutdown waits for the requests in flight.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "10s"))]
    drain: Option<Duration>,
    /// gRPC answers carry the HTTP answers' rate limit fields in
    /// `response_headers_to_add`, for Envoy to add to its answer (off: Envoy's own
    /// `enable_x_ratelimit_headers` would write `X-RateLimit-*` a second time).
    #[schemars(extend("default" = false))]
    grpc_response_headers: Option<bool>,
    /// The most connections open at once, both listeners together (and below the process's
    /// descriptor limit); at the cap a new connection takes the place of the idlest.
    #[schemars(extend("default" = 10000))]
    max_connections: Option<usize>,
    /// The longest an HTTP/1 request head (or a TLS handshake) may take to arrive whole.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "10s"))]
    header_timeout: Option<Duration>,
    /// A connection with no request in flight that reads and writes nothing this long is
    /// closed.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "60s"))]
    idle_timeout: Option<Duration>,
    /// HTTPS on the HTTP listener (HTTP/2 by ALPN); with `client_ca`, mutual TLS.
    tls: Option<TlsFiles>,
    /// TLS on the gRPC listener; with `client_ca`, mutual TLS.
    grpc_tls: Option<TlsFiles>,
    /// The most bytes of requests the console keeps for its impact preview (newest kept,
    /// credentials never).
    #[schemars(extend("default" = 16777216))]
    console_record_bytes: Option<usize>,
    /// The console records requests always, not only from its first use until 30 minutes
    /// after its last.
    #[schemars(extend("default" = false))]
    console_record_always: Option<bool>,
    /// Memory store: the file where the overrides set through the admin API are kept (JSON),
    /// so that they outlive restarts; without it they last until the process ends. A Redis
    /// store keeps them in Redis.
    overrides_file: Option<PathBuf>,
    /// Memory store: the file where the allow and deny lists set through the admin API are
    /// kept (JSON), so that they outlive restarts; without it they last until the process
    /// ends. A Redis store keeps them in Redis. Bans are not written to it.
    lists_file: Option<PathBuf>,
    /// Redis strict: the most bytes of denials kept to answer a denied key in this process
    /// until its `retry_after` without asking Redis (a flood at many times a limit costs Redis
    /// a call per `retry_after`); 0 turns it off.
    #[schemars(extend("default" = 4194304))]
    denied_cache_bytes: Option<usize>,
    /// The proxies in front of the services that ask (addresses or ranges: `10.0.0.0/8`,
    /// `2001:db8::/32`). A request whose client address (`/v1/check`'s `client_ip`,
    /// `/v1/auth`'s `X-Real-IP` or peer) is one of them is keyed on the right-most address
    /// of its `X-Forwarded-For` that is not. None by default: the address given is the client.
    #[serde(default)]
    trusted_proxies: Vec<String>,
}

/// The `store` section: its `kind`, and the settings of that kind (a setting of the other
/// kind is an error at its place). One flat mapping, so that every error has a place. Read
/// at start: a change needs a restart.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    /// `memory` (in this process) or `redis` (shared by every instance on one Redis or
    /// Redis Cluster). Required.
    kind: Option<StoreKind>,
    /// Memory: the most keys held.
    #[schemars(extend("default" = 1000000))]
    max_keys: Option<usize>,
    /// Memory: the most bytes its tables hold, used or not (and keys longer than 18 bytes).
    #[schemars(extend("default" = 268435456))]
    max_bytes: Option<usize>,
    /// Memory: what a full store does with a new key. `evict` drops the key whose state
    /// matters least (expired first, then the one with the most allowance left), so every
    /// new key is counted at the price of forgetting an old one; `refuse` never drops a key
    /// whose state still matters: a new key that finds no room is decided by its rule's
    /// `on_failure` (`closed` denies, `open` admits uncounted).
    #[schemars(extend("default" = "evict"))]
    when_full: Option<WhenFullSpec>,
    /// Redis: a server's URL: `redis://[user:password@]host[:port][/db]`, `rediss://` for
    /// TLS, `unix:///path/to/redis.sock`. Either this or `cluster`.
    url: Option<String>,
    /// Redis: a cluster's seed nodes' URLs, instead of `url`.
    #[serde(default)]
    cluster: Vec<String>,
    /// Redis: `strict` (one atomic round trip per check, exact), `hybrid` (decided in
    /// memory, synced every `sync_interval`, over the limit by at most the instances'
    /// unclaimed permits) or `lease` (permits leased in batches, never over).
    #[schemars(extend("default" = "strict"))]
    mode: Option<RedisMode>,
    /// Redis: the longest a check waits for Redis before the rule's `on_failure` decides.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "20ms"))]
    timeout: Option<Duration>,
    /// Redis, hybrid and lease: the instances expected to share the keys, until they have
    /// said how many they are.
    #[schemars(extend("default" = 1))]
    instances: Option<u32>,
    /// Redis, hybrid: how often counts are pushed and claims renewed.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "1s"))]
    sync_interval: Option<Duration>,
    /// Redis, hybrid: the most permits of a key one instance admits per window beyond its
    /// claim; 0 never exceeds the limit. Default: 2, or a hundredth of the limit shared by
    /// the instances, whichever is more.
    max_unclaimed: Option<u64>,
    /// Redis: pipelined connections to a single server.
    #[schemars(extend("default" = 1))]
    connections: Option<usize>,
    /// Redis: in front of every key (keys then start with it, before `tg:`).
    #[schemars(extend("default" = ""))]
    key_prefix: Option<String>,
    /// Redis: keys live up to this much longer than their state, spread evenly.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "0s"))]
    expiry_jitter: Option<Duration>,
    /// Redis, strict: whether checks run in tollgate's Redis module on the nodes that load
    /// it (`TOLLGATE.CHECK`, the same decisions on the same keys, for less of Redis's CPU),
    /// else in its Lua functions. Nodes without it are found by asking.
    #[schemars(extend("default" = true))]
    redis_module: Option<bool>,
    /// Redis: the CA (PEM file) that `rediss://` servers' certificates must chain to,
    /// instead of the web PKI roots tollgate carries (Mozilla's, from webpki-roots).
    tls_ca: Option<PathBuf>,
    /// Redis: a client certificate chain (PEM file) for servers that ask for one, with
    /// `tls_key`.
    tls_cert: Option<PathBuf>,
    /// Redis: the client certificate's private key (PEM file).
    tls_key: Option<PathBuf>,
    /// Redis: this region and the peer regions it shares `scope: global` rules with. Each
    /// region answers from its own Redis; counts travel between regions in the background.
    regions: Option<RegionsSection>,
}

/// The `regions` setting of a Redis store.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RegionsSection {
    /// This region's name: 1 to 64 letters, digits, `-` or `_`, as its peers name it.
    region: String,
    /// How often this instance sends its region's counts to the peers: 1ms to 10s.
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    #[schemars(schema_with = "duration::schema", extend("default" = "100ms"))]
    interval: Option<Duration>,
    /// The most a global limit may be exceeded by while counts travel, as a fraction of it
    /// (above 0, at most 1): each region admits at most `overshoot x limit / peers` (at
    /// least 1) beyond what every peer confirmed.
    #[schemars(extend("default" = 0.01))]
    overshoot: Option<f64>,
    /// The peer regions, each with its Redis (`url`, or `cluster`), reached with this
    /// store's key prefix, TLS files and timeout.
    #[serde(default)]
    peers: Vec<PeerSection>,
}

/// A peer region.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PeerSection {
    /// Its name, as it names itself.
    name: String,
    /// Its Redis server's URL.
    url: Option<String>,
    /// Its Redis Cluster's seed nodes' URLs, instead of `url`.
    #[serde(default)]
    cluster: Vec<String>,
}

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum StoreKind {
    /// In this process.
    Memory,
    /// On Redis or Redis Cluster.
    Redis,
}

impl StoreSection {
    /// The settings written that a store of the other kind takes.
    fn misplaced(&self, kind: StoreKind) -> Option<&'static str> {
        let memory = [
            ("max_keys", self.max_keys.is_some()),
            ("max_bytes", self.max_bytes.is_some()),
            ("when_full", self.when_full.is_some()),
        ];
        let redis = [
            ("url", self.url.is_some()),
            ("cluster", !self.cluster.is_empty()),
            ("mode", self.mode.is_some()),
            ("timeout", self.timeout.is_some()),
            ("instances", self.instances.is_some()),
            ("sync_interval", self.sync_interval.is_some()),
            ("max_unclaimed", self.max_unclaimed.is_some()),
            ("connections", self.connections.is_some()),
            ("key_prefix", self.key_prefix.is_some()),
            ("expiry_jitter", self.expiry_jitter.is_some()),
            ("redis_module", self.redis_module.is_some()),
            ("tls_ca", self.tls_ca.is_some()),
            ("tls_cert", self.tls_cert.is_some()),
            ("tls_key", self.tls_key.is_some()),
            ("regions", self.regions.is_some()),
        ];
        let other: &[_] = match kind {
            StoreKind::Memory => &redis,
            StoreKind::Redis => &memory,
        };
        other.iter().find(|(_, set)| *set).map(|(name, _)| *name)
    }

    /// The store this section describes.
    fn config(self, kind: StoreKind) -> StoreConfig {
        match kind {
            StoreKind::Memory => StoreConfig::Memory {
                max_keys: self.max_keys.unwrap_or(DEFAULT_MAX_KEYS),
                max_bytes: self.max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
                when_full: match self.when_full {
                    None | Some(WhenFullSpec::Evict) => WhenFull::Evict,
                    Some(WhenFullSpec::Refuse) => WhenFull::Refuse,
                },
            },
            StoreKind::Redis => StoreConfig::Redis {
                url: self.url,
                cluster: self.cluster,
                mode: self.mode.unwrap_or(RedisMode::Strict),
                timeout: self.timeout.unwrap_or(DEFAULT_REDIS_TIMEOUT),
                instances: self.instances.unwrap_or(1),
                sync_interval: self.sync_interval.unwrap_or(DEFAULT_SYNC_INTERVAL),
                max_unclaimed: self.max_unclaimed,
                options: Box::new(RedisOptions {
                    connections: self.connections.unwrap_or(1),
                    key_prefix: self.key_prefix.unwrap_or_default(),
                    expiry_jitter: self.expiry_jitter.unwrap_or_default(),
                    module: self.redis_module.unwrap_or(true),
                    tls_ca: self.tls_ca,
                    tls_cert: self.tls_cert,
                    tls_key: self.tls_key,
                }),
                regions: self.regions.map(|r| {
                    Box::new(RegionsSettings {
                        region: r.region,
                        interval: r.interval.unwrap_or(Duration::from_millis(100)),
                        overshoot: r.overshoot.unwrap_or(0.01),
                        peers: r
                            .peers
                            .into_iter()
                            .map(|p| PeerSettings {
                                name: p.name,
                                url: p.url,
                                cluster: p.cluster,
                            })
                            .collect(),
                    })
                }),
            },
        }
    }
}

/// What a full memory store does with a new key.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum WhenFullSpec {
    /// Drops the key whose state matters least.
    Evict,
    /// Decides the new key by its rule's failure policy.
    Refuse,
}

/// A Redis URL of the store section at `at` that parses, checked without connecting: `serve`
/// would refuse it only when starting.
fn check_redis_url(file: &Path, at: Option<(u64, u64)>, url: &str) -> Result<(), ConfigError> {
    use redis::IntoConnectionInfo as _;
    match url.into_connection_info() {
        Ok(_) => Ok(()),
        Err(err) => Err(ConfigError::new(
            file,
            at,
            format!(
                "store: `{url}` is not a Redis URL (redis://host:port, rediss://..., \
                 unix:///path/to/redis.sock): {err}"
            ),
        )),
    }
}

/// A span's line and column, when it has them.
fn place(span: &serde_saphyr::Location) -> Option<(u64, u64)> {
    (span.line() > 0).then(|| (span.line(), span.column()))
}

/// A line and column (from 1) in a file.
pub type At = Option<(u64, u64)>;

/// The sections of one native file, each with where it was written.
#[derive(Debug, Default)]
pub struct Sections {
    /// The `server` section.
    pub server: Option<(ServerConfig, At)>,
    /// The `store` section.
    pub store: Option<(StoreConfig, At)>,
    /// The rules, in order.
    pub specs: Vec<(RuleSpec, At)>,
}

/// Parses a native file.
///
/// # Errors
/// The first error, at its line and column.
pub fn parse(file: &Path, text: &str) -> Result<Sections, ConfigError> {
    let parsed: File =
        serde_saphyr::from_str(text).map_err(|e| ConfigError::yaml(file, text, &e))?;
    let server = match parsed.server {
        None => None,
        Some(spanned) => {
            let at = place(&spanned.referenced);
            let s = spanned.value;
            let defaults = ServerConfig::default();
            let grpc = match s.grpc.as_deref() {
                None => defaults.grpc,
                Some("off") => None,
                Some(addr) => Some(addr.parse().map_err(|_| {
                    ConfigError::new(
                        file,
                        super::places::section_key_place(text, at, "grpc").or(at),
                        format!("server.grpc: `{addr}` is not an address or `off`"),
                    )
                })?),
            };
            let config = ServerConfig {
                http: s.http.unwrap_or(defaults.http),
                grpc,
                max_body_bytes: s.max_body_bytes.unwrap_or(defaults.max_body_bytes),
                grpc_max_message_bytes: s
                    .grpc_max_message_bytes
                    .unwrap_or(defaults.grpc_max_message_bytes),
                tracing: s.tracing,
                drain: s.drain.unwrap_or(defaults.drain),
                grpc_response_headers: s
                    .grpc_response_headers
                    .unwrap_or(defaults.grpc_response_headers),
                envoy: defaults.envoy.clone(),
                tls: s.tls,
                grpc_tls: s.grpc_tls,
                console_record_bytes: s
                    .console_record_bytes
                    .unwrap_or(defaults.console_record_bytes),
                console_record_always: s
                    .console_record_always
                    .unwrap_or(defaults.console_record_always),
                overrides_file: s.overrides_file,
                lists_file: s.lists_file,
                denied_cache_bytes: s.denied_cache_bytes.unwrap_or(defaults.denied_cache_bytes),
                trusted_proxies: s
                    .trusted_proxies
                    .iter()
                    .map(|r| r.parse())
                    .collect::<Result<_, String>>()
                    .map_err(|e| {
                        ConfigError::new(
                            file,
                            super::places::section_key_place(text, at, "trusted_proxies").or(at),
                            format!("server.trusted_proxies: {e}"),
                        )
                    })?,
                grpc_uds: None,
                prometheus: None,
                connections: Limits {
                    max_connections: s
                        .max_connections
                        .unwrap_or(defaults.connections.max_connections),
                    header_timeout: s
                        .header_timeout
                        .unwrap_or(defaults.connections.header_timeout),
                    idle_timeout: s.idle_timeout.unwrap_or(defaults.connections.idle_timeout),
                },
            };
            Some((config, at))
        }
    };
    let store = match parsed.store {
        None => None,
        Some(section) => {
            let store_at = place(&section.referenced);
            let at = |key: &str| super::places::section_key_place(text, store_at, key).or(store_at);
            let section = section.value;
            let Some(kind) = section.kind else {
                return Err(ConfigError::new(
                    file,
                    store_at,
                    "store: `kind` is needed: memory or redis",
                ));
            };
            if let Some(name) = section.misplaced(kind) {
                let (kind, other) = match kind {
                    StoreKind::Memory => ("memory", "redis"),
                    StoreKind::Redis => ("redis", "memory"),
                };
                return Err(ConfigError::new(
                    file,
                    at(name),
                    format!(
                        "store: `{name}` is a setting of a {other} store, and this store is `kind: {kind}`"
                    ),
                ));
            }
            if kind == StoreKind::Redis {
                if section.url.is_none() == section.cluster.is_empty() {
                    return Err(ConfigError::new(
                        file,
                        store_at,
                        "store: a redis store needs either `url` or `cluster`",
                    ));
                }
                for url in section.url.iter().chain(&section.cluster) {
                    let url_at = super::places::value_place(text, store_at, url).or(store_at);
                    check_redis_url(file, url_at, url)?;
                }
                for peer in section.regions.iter().flat_map(|r| &r.peers) {
                    let peer_at =
                        super::places::value_place(text, store_at, &peer.name).or(at("regions"));
                    if peer.url.is_none() == peer.cluster.is_empty() {
                        return Err(ConfigError::new(
                            file,
                            peer_at,
                            format!(
                                "store.regions: peer `{}` needs either `url` or `cluster`",
                                peer.name
                            ),
                        ));
                    }
                    for url in peer.url.iter().chain(&peer.cluster) {
                        let url_at = super::places::value_place(text, store_at, url).or(peer_at);
                        check_redis_url(file, url_at, url)?;
                    }
                }
            }
            Some((section.config(kind), store_at))
        }
    };
    let specs = parsed
        .rules
        .into_iter()
        .map(|s| (s.value, place(&s.referenced)))
        .collect();
    Ok(Sections {
        server,
        store,
        specs,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::TierSpec;

    #[test]
    fn a_period_is_written_in_the_largest_unit_that_measures_it_and_read_back() {
        for (millis, text) in [
            (3_600_000, "1h"),
            (90_000, "90s"),
            (1_500, "1500ms"),
            (14 * 86_400_000, "2w"),
            (86_400_000, "1d"),
            (120_000, "2m"),
        ] {
            let tier = TierSpec::new(1, Duration::from_millis(millis).into());
            let json = serde_json::to_value(&tier).unwrap();
            assert_eq!(json["period"], text);
            assert_eq!(serde_json::from_value::<TierSpec>(json).unwrap(), tier);
        }
        for unit in ["day", "week", "month", "year"] {
            let tier: TierSpec =
                serde_json::from_value(serde_json::json!({"limit": 1, "period": unit})).unwrap();
            assert_eq!(serde_json::to_value(&tier).unwrap()["period"], unit);
        }
    }

    #[test]
    fn a_calendar_period_with_a_number_says_how_to_write_it() {
        for (written, hint) in [
            ("1month", "`month`"),
            ("2 weeks", "`week`"),
            ("1day", "`day`"),
        ] {
            let e = serde_json::from_value::<TierSpec>(
                serde_json::json!({"limit": 1, "period": written}),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("a calendar period takes no number") && e.contains(hint),
                "{e}"
            );
        }
        let e =
            serde_json::from_value::<TierSpec>(serde_json::json!({"limit": 1, "period": "soon"}))
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("or a calendar period: day, week, month, year"),
            "{e}"
        );
    }
}
