//! The service's own settings: listeners, bounds on connections and bodies, TLS, the
//! console's recorder, and how Envoy domains are answered.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The console recorder's budget when none is configured (bytes).
pub const DEFAULT_RECORD_BYTES: usize = 16 << 20;

/// Where the service listens and what it accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// HTTP (check, auth, admin, metrics, health); loopback unless configured.
    pub http: SocketAddr,
    /// gRPC (Envoy's rate limit service); `None`: not served.
    pub grpc: Option<SocketAddr>,
    /// The largest HTTP request body accepted (bytes).
    pub max_body_bytes: usize,
    /// The largest gRPC message accepted (bytes; 4 MiB by default, as grpc-go's).
    pub grpc_max_message_bytes: usize,
    /// How long shutdown waits for requests in flight.
    pub drain: Duration,
    /// Whether gRPC answers carry the rate limit fields of the HTTP answers in
    /// `response_headers_to_add`, which Envoy adds to its answer to the client. Off by default,
    /// as in Envoy's own rate limit service: Envoy's `enable_x_ratelimit_headers` would
    /// otherwise write `X-RateLimit-*` twice.
    pub grpc_response_headers: bool,
    /// Bounds on the connections of both listeners.
    pub connections: Limits,
    /// How Envoy domains are answered: the Envoy ratelimit service's settings, read from
    /// the environment under its names.
    pub envoy: EnvoySettings,
    /// The most bytes of requests the console keeps for its impact preview
    /// (`server.console_record_bytes`); the console is on only with an admin token.
    pub console_record_bytes: usize,
    /// Whether the console records requests always (`server.console_record_always`), or
    /// only while it is in use and for 30 minutes after (the default: a console nobody looks
    /// at records nothing).
    pub console_record_always: bool,
    /// TLS on the HTTP listener, when set (`server.tls`).
    pub tls: Option<TlsFiles>,
    /// TLS on the gRPC listener, when set (`server.grpc_tls`, or the Envoy service's
    /// settings).
    pub grpc_tls: Option<TlsFiles>,
    /// Where the memory store keeps the overrides set through the admin API, so that they
    /// outlive restarts (`server.overrides_file`); a Redis store keeps them in Redis.
    pub overrides_file: Option<PathBuf>,
    /// Where the memory store keeps the allow and deny lists (`server.lists_file`); a Redis
    /// store keeps them in Redis.
    pub lists_file: Option<PathBuf>,
    /// Redis strict: the bytes of denials answered here until their `retry_after`
    /// (`server.denied_cache_bytes`, 4 MiB by default; 0: off).
    pub denied_cache_bytes: usize,
    /// The proxies whose `X-Forwarded-For` is believed about the client behind them
    /// (`server.trusted_proxies`).
    pub trusted_proxies: Vec<tollgate::engine::IpRange>,
    /// gRPC on this Unix socket instead of a TCP address: the Envoy service's `GRPC_UDS`.
    pub grpc_uds: Option<PathBuf>,
    /// The metrics served on a listener of their own too, at this address and path: the Envoy
    /// service's `USE_PROMETHEUS`, `PROMETHEUS_ADDR` (`:9090`) and `PROMETHEUS_PATH`
    /// (`/metrics`). They are on the HTTP listener's `/metrics` anyway.
    pub prometheus: Option<(SocketAddr, String)>,
    /// OpenTelemetry traces, when set (`server.tracing`, or the Envoy service's
    /// `TRACING_ENABLED` and `TRACING_*` settings); off by default.
    pub tracing: Option<TracingSettings>,
}

/// OpenTelemetry traces over OTLP: a span per check, with the rule, the store and what
/// decided, a child of the caller's (W3C `traceparent` or B3), and a child span per Redis
/// call. Where they go: `endpoint`, else OTel's `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, else the collector on localhost (4318 for `http`, 4317 for
/// `grpc`); OTel's other `OTEL_EXPORTER_OTLP_*` settings (headers, timeout) apply.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TracingSettings {
    /// `service.name` (`TRACING_SERVICE_NAME`).
    #[serde(default = "default_service_name")]
    #[schemars(extend("default" = "tollgate"))]
    pub service_name: String,
    /// `service.namespace` (`TRACING_SERVICE_NAMESPACE`); none when empty.
    #[serde(default)]
    pub service_namespace: String,
    /// `service.instance.id` (`TRACING_SERVICE_INSTANCE_ID`); a random UUID when empty.
    #[serde(default)]
    pub service_instance_id: String,
    /// The share of traces started here that are kept, from 0 to 1 (`TRACING_SAMPLING_RATE`).
    /// A caller's trace is kept when the caller kept it, whatever the rate.
    #[serde(default = "one")]
    #[schemars(extend("default" = 1.0))]
    pub sampling_rate: f64,
    /// `http` (OTLP over HTTP, protobuf) or `grpc` (`TRACING_EXPORTER_PROTOCOL`).
    #[serde(default)]
    pub protocol: TracingProtocol,
    /// Where spans are sent: the full URL of the traces endpoint for `http`
    /// (`http://collector:4318/v1/traces`), the collector's URL for `grpc`.
    #[serde(default)]
    pub endpoint: Option<String>,
}

fn default_service_name() -> String {
    "tollgate".into()
}

fn one() -> f64 {
    1.0
}

/// How spans are sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TracingProtocol {
    /// OTLP over HTTP, protobuf.
    #[default]
    Http,
    /// OTLP over gRPC.
    Grpc,
}

/// TLS on a listener: the server's certificate chain and key (PEM files), and, for mutual
/// TLS, the CA whose certificates clients must present. For gRPC, also from the Envoy
/// service's `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and
/// `GRPC_CLIENT_TLS_CACERT`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM file).
    pub cert: PathBuf,
    /// The certificate's private key (PEM file).
    pub key: PathBuf,
    /// The CA (PEM file) clients' certificates must chain to: mutual TLS, a client without
    /// one is refused. None: clients present no certificate.
    pub client_ca: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: Some(SocketAddr::from(([127, 0, 0, 1], 8081))),
            max_body_bytes: 64 * 1024,
            grpc_max_message_bytes: 4 << 20,
            drain: Duration::from_secs(10),
            grpc_response_headers: false,
            connections: Limits::default(),
            envoy: EnvoySettings::default(),
            console_record_bytes: DEFAULT_RECORD_BYTES,
            console_record_always: false,
            tls: None,
            grpc_tls: None,
            overrides_file: None,
            lists_file: None,
            denied_cache_bytes: 4 << 20,
            trusted_proxies: Vec::new(),
            grpc_uds: None,
            prometheus: None,
            tracing: None,
        }
    }
}

/// Bounds on the connections of both listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most connections open at once (default 10,000, and at most the descriptor limit
    /// less 128).
    pub max_connections: usize,
    /// The longest an HTTP/1 request head may take to arrive whole, from the first byte the
    /// server waits for (default 10 s).
    pub header_timeout: Duration,
    /// The longest a connection with no request in flight may read and write nothing
    /// (default 60 s).
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The Envoy ratelimit service's settings that change how its domains are answered, read
/// from the environment under its names (see `envoy::settings`).
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoySettings {
    /// When a descriptor of a request is over its limit, the others' hits are not counted
    /// (by default every descriptor counts its hits): `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_when_over: bool,
    /// Every request is answered OK, its descriptors' statuses as they are: `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// Every descriptor is in quota mode: `QUOTA_MODE`.
    pub quota_mode: bool,
    /// Unhealthy until an Envoy domain is loaded: `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    pub healthy_with_config: bool,
    /// With `LIMIT_RESPONSE_HEADERS_ENABLED`, the names of the three headers each answer asks
    /// Envoy to add (the limit, what remains, the seconds until the reset, of the descriptor
    /// closest to its limit): `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER` and
    /// `LIMIT_RESET_HEADER`, `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
    /// by default.
    pub response_headers: Option<[String; 3]>,
    /// The share of a limit past which admitted hits count as near it in the statistics:
    /// `NEAR_LIMIT_RATIO`, 0.8 by default.
    pub near_ratio: f32,
    /// Answers carry dynamic metadata: the request, and the `metadata` of the limits that
    /// passed: `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
    /// Bytes of a cache of descriptors over their limit, answered without the store until
    /// their window ends (0: none): `LOCAL_CACHE_SIZE_IN_BYTES`.
    pub local_cache_bytes: usize,
    /// The statistics of Envoy domains are kept (`DISABLE_STATS` unset or false).
    pub stats: bool,
    /// Where the statistics are pushed, besides `/metrics`: `USE_STATSD` or `USE_DOG_STATSD`.
    pub statsd: Option<Statsd>,
    /// The debug listener (`/rlconfig`, `/stats`): `DEBUG_HOST` and `DEBUG_PORT`.
    pub debug: Option<SocketAddr>,
    /// gRPC connections are asked to go away after this long, and closed this much later:
    /// `GRPC_MAX_CONNECTION_AGE` and `GRPC_MAX_CONNECTION_AGE_GRACE`.
    pub grpc_max_connection_age: Option<(Duration, Duration)>,
    /// `serve` starts with no rule file, and serves the files when they appear:
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`.
    pub force_start: bool,
    /// `/healthcheck` follows Redis after start (by default it waits for Redis to answer
    /// once at start, and then no longer depends on it): `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
    pub health_follows_redis: bool,
    /// How `serve` waits for Redis to answer at start: `REDIS_STARTUP_INITIAL_INTERVAL`,
    /// `REDIS_STARTUP_MAX_INTERVAL` and `REDIS_STARTUP_MAX_ELAPSED_TIME`.
    pub redis_startup: Startup,
    /// The Envoy domains come from an xDS management server instead of files:
    /// `CONFIG_TYPE=GRPC_XDS_SOTW` and the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` settings.
    pub xds: Option<XdsSettings>,
}

/// Where and how `serve` subscribes to Envoy domains over xDS (state of the world, over ADS),
/// as the Envoy ratelimit service does with `CONFIG_TYPE=GRPC_XDS_SOTW`.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// The management server: `CONFIG_GRPC_XDS_SERVER_URL` (`localhost:18000`), a `host:port`
    /// or a URL.
    pub url: String,
    /// The node id the server keys its snapshots by: `CONFIG_GRPC_XDS_NODE_ID` (`default`).
    pub node_id: String,
    /// The node's metadata, as strings: `CONFIG_GRPC_XDS_NODE_METADATA` (`key1=v1,key2=v2`).
    pub node_metadata: Vec<(String, String)>,
    /// The wait between attempts to connect, with a jitter of half of it either way:
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (3 s).
    pub connect_retry: Duration,
    /// Metadata sent with the subscription: `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`
    /// (`name1:value1,name2:value2`).
    pub headers: Vec<(String, String)>,
    /// TLS to the server: `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files.
    pub tls: Option<XdsTls>,
    /// The wait before subscribing again once a subscription broke.
    pub backoff: XdsBackoff,
    /// The largest message taken from the server: `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (4 MiB,
    /// grpc-go's and tonic's default, when unset).
    pub max_message: Option<usize>,
}

/// TLS to the xDS server: the CA its certificate must chain to
/// (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`; the web's roots without it), a client certificate
/// and key (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`), and the name
/// its certificate must carry (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`; the URL's host without it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// The CA (PEM file).
    pub ca: Option<PathBuf>,
    /// The client's certificate chain and key (PEM files), for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must carry.
    pub san: Option<String>,
}

/// The wait before subscribing again, as the Envoy ratelimit service computes it (jpillora's
/// backoff): `initial` × `factor`^attempt, drawn between `initial` and that when `jitter`, and
/// kept within `initial` and `max`. Its default factor of 0.5 makes every wait `initial`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XdsBackoff {
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (10 s).
    pub initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (60 s).
    pub max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` (0.5).
    pub factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER` (true).
    pub jitter: bool,
}

/// A statsd sink, as the Envoy service pushes its statistics: counters' increases every
/// flush interval, named `ratelimit.service.rate_limit.DOMAIN.KEY.total_hits`.
#[derive(Debug, Clone, PartialEq)]
pub struct Statsd {
    /// `STATSD_HOST` (`localhost`) and `STATSD_PORT` (8125).
    pub host: String,
    /// The port.
    pub port: u16,
    /// DogStatsD over UDP, tags as `|#key:value` (`USE_DOG_STATSD`); else statsd over TCP,
    /// tags in the name as `.__key=value`, as the Envoy service's statsd sink writes them.
    pub dog: bool,
    /// `STATS_FLUSH_INTERVAL` (10 s).
    pub flush: Duration,
    /// `EXTRA_TAGS` (`key:value,key:value`), on every statistic.
    pub tags: Vec<(String, String)>,
}

/// Waiting for Redis to answer at start: first after `initial`, the waits doubling up to
/// `max`; `serve` stops if it has not answered within `give_up` (`None`: it waits for ever).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Startup {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// When to stop trying.
    pub give_up: Option<Duration>,
}

impl Default for Startup {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            give_up: None,
        }
    }
}

impl Default for EnvoySettings {
    fn default() -> Self {
        Self {
            stop_when_over: false,
            shadow_mode: false,
            quota_mode: false,
            healthy_with_config: false,
            response_headers: None,
            near_ratio: 0.8,
            dynamic_metadata: false,
            local_cache_bytes: 0,
            stats: true,
            statsd: None,
            debug: None,
            grpc_max_connection_age: None,
            force_start: false,
            health_follows_redis: false,
            redis_startup: Startup::default(),
            xds: None,
        }
    }
}
