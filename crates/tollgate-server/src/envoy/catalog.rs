//! Every environment setting of envoyproxy/ratelimit (its `src/settings/settings.go`), and
//! what tollgate does with it: honours it (under the same name, with the same meaning), meets
//! its purpose by design (named at start, not needed), refuses it (`serve` and `validate` stop,
//! saying what to do instead, unless it is set to the value that asks for nothing), or leaves
//! it unread because it matters only with a setting tollgate refuses, as that service does.

/// What tollgate does with a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Read under its name, with its meaning.
    Honoured,
    /// Its purpose is met without it; `serve` names it at start when set.
    MetByDesign,
    /// Refused when set, unless set to this value (`None`: any value is refused).
    Refused(Option<&'static str>),
    /// Read only with the setting named, which tollgate refuses; unread here, as there.
    With(&'static str),
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// What tollgate does with it.
    pub status: Status,
    /// What it does in tollgate, or why not.
    pub what: &'static str,
}

const fn setting(name: &'static str, status: Status, what: &'static str) -> Setting {
    Setting { name, status, what }
}

use Status::{Honoured, MetByDesign, Refused, With};

/// Every setting, grouped as the Envoy service's README groups them.
pub const SETTINGS: &[Setting] = &[
    // Listeners.
    setting(
        "HOST",
        Honoured,
        "The HTTP listener's host, read only with `PORT` (shells often set `HOST` to the machine's name); `0.0.0.0` by default. Where no file has a `server` section.",
    ),
    setting(
        "PORT",
        Honoured,
        "The HTTP listener's port (8080). Where no file has a `server` section; without it, tollgate's loopback default.",
    ),
    setting(
        "GRPC_HOST",
        Honoured,
        "The gRPC listener's host (`0.0.0.0`).",
    ),
    setting("GRPC_PORT", Honoured, "The gRPC listener's port (8081)."),
    setting(
        "GRPC_UDS",
        Honoured,
        "gRPC on this Unix socket instead of a TCP port.",
    ),
    setting(
        "GRPC_SERVER_USE_TLS",
        Honoured,
        "TLS on the gRPC listener, with `GRPC_SERVER_TLS_CERT` and `GRPC_SERVER_TLS_KEY`.",
    ),
    setting(
        "GRPC_SERVER_TLS_CERT",
        Honoured,
        "The gRPC listener's certificate chain (PEM file).",
    ),
    setting(
        "GRPC_SERVER_TLS_KEY",
        Honoured,
        "Its private key (PEM file).",
    ),
    setting(
        "GRPC_CLIENT_TLS_CACERT",
        Honoured,
        "Mutual TLS: clients' certificates must chain to this CA.",
    ),
    setting(
        "GRPC_CLIENT_TLS_SAN",
        Refused(None),
        "tollgate does not check the name in a client's certificate; any client whose certificate `GRPC_CLIENT_TLS_CACERT`'s CA signed is admitted: unset it, or give that CA to these clients alone.",
    ),
    setting(
        "GRPC_MAX_CONNECTION_AGE",
        Honoured,
        "gRPC connections are asked to go away after this long (a Go duration).",
    ),
    setting(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        Honoured,
        "...and closed this much later (1 h by default).",
    ),
    // Configuration.
    setting(
        "CONFIG_TYPE",
        Honoured,
        "`FILE` (the default): rules from files. `GRPC_XDS_SOTW`: Envoy domains from an xDS management server, subscribed to over ADS (state of the world) for `ratelimit.config.ratelimit.v3.RateLimitConfig`; each push is loaded as a reload (counters of unchanged limits carry over) and ACKed, an invalid one NACKed with the reason while the limits in use keep serving. Files given with `--config` are served beside them; the runtime directory is not read.",
    ),
    setting(
        "CONFIG_GRPC_XDS_SERVER_URL",
        Honoured,
        "The xDS management server (`localhost:18000`): `host:port`, or an `http://` or `https://` URL.",
    ),
    setting(
        "CONFIG_GRPC_XDS_NODE_ID",
        Honoured,
        "The node id sent to the xDS server, which keys its snapshots by it (`default`).",
    ),
    setting(
        "CONFIG_GRPC_XDS_NODE_METADATA",
        Honoured,
        "The node's metadata sent to the xDS server, as strings: `key1=value1,key2=value2`.",
    ),
    setting(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Honoured,
        "The wait between attempts to connect to the xDS server (3 s, with a jitter of half of it either way).",
    ),
    setting(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        Honoured,
        "Metadata sent with the subscription: `name1:value1,name2:value2`.",
    ),
    setting(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        Honoured,
        "TLS to the xDS server (its certificate checked against `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`, or the web's roots without it).",
    ),
    setting(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        Honoured,
        "A client certificate for the xDS server (PEM file), with `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`.",
    ),
    setting(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        Honoured,
        "Its private key (PEM file).",
    ),
    setting(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        Honoured,
        "The CA the xDS server's certificate must chain to (PEM file).",
    ),
    setting(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        Honoured,
        "The name the xDS server's certificate must carry, instead of the URL's host.",
    ),
    setting(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        Honoured,
        "The wait before subscribing again once a subscription broke (10 s).",
    ),
    setting(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        Honoured,
        "The longest such wait (60 s).",
    ),
    setting(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        Honoured,
        "The factor the wait grows by at each attempt (0.5, which keeps every wait at the initial interval, as there).",
    ),
    setting(
        "XDS_CLIENT_BACKOFF_JITTER",
        Honoured,
        "Each wait is drawn between the initial interval and the grown one (true).",
    ),
    setting(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        Honoured,
        "The largest message taken from the xDS server (4 MiB when unset).",
    ),
    setting(
        "RUNTIME_ROOT",
        Honoured,
        "Without `--config`, the rule files are those of `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY` (`/srv/runtime_data/current`); a link swapped by a deployment is followed.",
    ),
    setting("RUNTIME_SUBDIRECTORY", Honoured, "See `RUNTIME_ROOT`."),
    setting(
        "RUNTIME_APPDIRECTORY",
        Honoured,
        "See `RUNTIME_ROOT` (`config`).",
    ),
    setting(
        "RUNTIME_IGNOREDOTFILES",
        Honoured,
        "Files whose names start with `.` are left out unless this is `false` (the Envoy service reads them unless told otherwise: Kubernetes mounts `..data` entries, editors leave `.swp` files).",
    ),
    setting(
        "RUNTIME_WATCH_ROOT",
        MetByDesign,
        "tollgate watches the runtime directory and follows `RUNTIME_ROOT` when it is swapped.",
    ),
    setting(
        "MERGE_DOMAIN_CONFIG",
        Honoured,
        "Files of one domain merge, instead of being refused as a duplicate domain.",
    ),
    setting(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        Honoured,
        "`serve` starts with no rules while the files cannot be loaded, and serves them when they appear.",
    ),
    // Answers.
    setting(
        "SHADOW_MODE",
        Honoured,
        "Every request is answered OK; descriptors' statuses say what they would be.",
    ),
    setting(
        "QUOTA_MODE",
        Honoured,
        "Every descriptor with a limit is in quota mode.",
    ),
    setting(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        Honoured,
        "A request over one limit does not count the other descriptors' hits.",
    ),
    setting(
        "NEAR_LIMIT_RATIO",
        Honoured,
        "The share of a limit past which hits count as near it in the statistics (0.8).",
    ),
    setting(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        Honoured,
        "Descriptors found over their limit are answered over it without the store until their window ends, in a cache bounded in bytes (counted in `over_limit_with_local_cache`).",
    ),
    setting(
        "RESPONSE_DYNAMIC_METADATA",
        Honoured,
        "Answers carry the request and the `metadata` of the limits that passed as dynamic metadata.",
    ),
    setting(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        Honoured,
        "Answers ask Envoy to add the limit, what remains and the seconds until the reset of the descriptor closest to its limit.",
    ),
    setting(
        "LIMIT_LIMIT_HEADER",
        Honoured,
        "Those headers' names (`RateLimit-Limit`, ...).",
    ),
    setting(
        "LIMIT_REMAINING_HEADER",
        Honoured,
        "See `LIMIT_LIMIT_HEADER` (`RateLimit-Remaining`).",
    ),
    setting(
        "LIMIT_RESET_HEADER",
        Honoured,
        "See `LIMIT_LIMIT_HEADER` (`RateLimit-Reset`).",
    ),
    setting(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        Honoured,
        "`/healthcheck` and gRPC health say unhealthy until a domain is loaded.",
    ),
    // Redis.
    setting(
        "BACKEND_TYPE",
        Refused(Some("redis")),
        "tollgate's shared store is Redis (memcache is not a store of tollgate's).",
    ),
    setting(
        "REDIS_URL",
        Honoured,
        "A strict Redis store, where no file has a `store` section: the address (a socket path with `REDIS_SOCKET_TYPE=unix`, the default; nodes separated by commas for a cluster).",
    ),
    setting("REDIS_SOCKET_TYPE", Honoured, "`tcp` or `unix`."),
    setting(
        "REDIS_TYPE",
        Honoured,
        "`SINGLE` or `CLUSTER` (Sentinel is refused).",
    ),
    setting("REDIS_AUTH", Honoured, "`password` or `user:password`."),
    setting("REDIS_TLS", Honoured, "TLS to Redis (`rediss://`)."),
    setting(
        "REDIS_TLS_CACERT",
        Honoured,
        "The CA Redis's certificate must chain to.",
    ),
    setting(
        "REDIS_TLS_CLIENT_CERT",
        Honoured,
        "A client certificate for Redis, with `REDIS_TLS_CLIENT_KEY`.",
    ),
    setting("REDIS_TLS_CLIENT_KEY", Honoured, "Its private key."),
    setting(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        Refused(Some("false")),
        "tollgate verifies the Redis server's certificate and name; give its CA with `REDIS_TLS_CACERT`.",
    ),
    setting(
        "REDIS_POOL_SIZE",
        Honoured,
        "Pipelined connections to a single server.",
    ),
    setting(
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        Refused(Some("WAIT")),
        "tollgate's connections are multiplexed and never run out: only `WAIT` applies.",
    ),
    setting(
        "REDIS_TIMEOUT",
        Honoured,
        "How long a check waits for Redis before the rule's failure policy decides (tollgate's 20 ms when unset: the Envoy service waits 10 s).",
    ),
    setting(
        "REDIS_PIPELINE_WINDOW",
        MetByDesign,
        "tollgate writes every check queued while a write is in flight together, without waiting.",
    ),
    setting(
        "REDIS_PIPELINE_LIMIT",
        MetByDesign,
        "tollgate writes every check queued while a write is in flight together, without waiting.",
    ),
    setting(
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        MetByDesign,
        "tollgate sends the checks of a cluster's nodes at once.",
    ),
    setting(
        "REDIS_SENTINEL_AUTH",
        Refused(None),
        "tollgate connects to a single server or a cluster, not through Sentinel.",
    ),
    setting(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        Honoured,
        "`/healthcheck` follows Redis after start (by default it waits for Redis to answer once at start, then no longer depends on it).",
    ),
    setting(
        "REDIS_STARTUP_INITIAL_INTERVAL",
        Honoured,
        "How `serve` asks Redis at start: the first wait.",
    ),
    setting(
        "REDIS_STARTUP_MAX_INTERVAL",
        Honoured,
        "The longest wait between asks.",
    ),
    setting(
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        Honoured,
        "When `serve` gives up and stops (0: never).",
    ),
    setting(
        "CACHE_KEY_PREFIX",
        Honoured,
        "In front of every key tollgate writes.",
    ),
    setting(
        "EXPIRATION_JITTER_MAX_SECONDS",
        Honoured,
        "Keys outlive their window by a spread of up to this (only when set: the Envoy service adds up to 300 s by default).",
    ),
    setting(
        "REDIS_PERSECOND",
        Refused(Some("false")),
        "tollgate keeps every limit in one store: unset it, and per-second limits live in `REDIS_URL`'s server.",
    ),
    setting(
        "REDIS_PERSECOND_URL",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_SOCKET_TYPE",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_TYPE",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_AUTH",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_TLS",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_POOL_SIZE",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_TIMEOUT",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    setting(
        "REDIS_PERSECOND_SENTINEL_AUTH",
        With("REDIS_PERSECOND"),
        "Read only with `REDIS_PERSECOND=true`.",
    ),
    // Memcache.
    setting(
        "MEMCACHE_HOST_PORT",
        Refused(None),
        "memcache is not a store of tollgate's (Redis is).",
    ),
    setting(
        "MEMCACHE_SRV",
        Refused(None),
        "memcache is not a store of tollgate's (Redis is).",
    ),
    setting(
        "MEMCACHE_SRV_REFRESH",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_MAX_IDLE_CONNS",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_TLS",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_TLS_CACERT",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_TLS_CLIENT_CERT",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_TLS_CLIENT_KEY",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    setting(
        "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        With("BACKEND_TYPE"),
        "Read only with `BACKEND_TYPE=memcache`.",
    ),
    // Statistics, logs, traces.
    setting(
        "USE_STATSD",
        Honoured,
        "Statistics pushed to statsd over TCP, tags in the names as its sink writes them (only when `true`: the Envoy service pushes to `localhost:8125` unless told not to; tollgate serves `/metrics` anyway).",
    ),
    setting(
        "USE_DOG_STATSD",
        Honoured,
        "Statistics pushed to DogStatsD over UDP, tags as `|#key:value`.",
    ),
    setting(
        "USE_DOG_STATSD_MOGRIFIERS",
        Refused(None),
        "tollgate sends DogStatsD names as statsd names, with `EXTRA_TAGS` as tags, and does not rewrite them.",
    ),
    setting(
        "STATSD_HOST",
        Honoured,
        "The statsd sink's host (`localhost`).",
    ),
    setting("STATSD_PORT", Honoured, "Its port (8125)."),
    setting(
        "STATS_FLUSH_INTERVAL",
        Honoured,
        "How often statistics are pushed (10 s).",
    ),
    setting(
        "EXTRA_TAGS",
        Honoured,
        "`key:value,...` on every statistic pushed.",
    ),
    setting(
        "DISABLE_STATS",
        Honoured,
        "No Envoy statistics are kept or pushed.",
    ),
    setting(
        "USE_PROMETHEUS",
        Honoured,
        "The metrics on a listener of their own too, at `PROMETHEUS_ADDR` and `PROMETHEUS_PATH` (they are on the HTTP listener's `/metrics` anyway).",
    ),
    setting("PROMETHEUS_ADDR", Honoured, "Its address (`:9090`)."),
    setting("PROMETHEUS_PATH", Honoured, "Its path (`/metrics`)."),
    setting(
        "PROMETHEUS_MAPPER_YAML",
        Honoured,
        "A statsd exporter's mapping file, accepted when it maps to the names of the default mapping (as Envoy Gateway's `statsd-exporter-config` does), under which tollgate exports its statistics; one that maps to other names or drops is refused, naming the mapping. A file that cannot be read is passed over, as there.",
    ),
    setting(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        Refused(Some("false")),
        "tollgate reports response times in seconds.",
    ),
    setting(
        "DEBUG_HOST",
        Honoured,
        "The debug listener (`/rlconfig`, `/stats`) on this host, `0.0.0.0` by default; opened only when this or `DEBUG_PORT` is set (the Envoy service always opens 6070).",
    ),
    setting("DEBUG_PORT", Honoured, "Its port (6070)."),
    setting(
        "LOG_LEVEL",
        Honoured,
        "The log level when `RUST_LOG` is not set.",
    ),
    setting(
        "LOG_FORMAT",
        Honoured,
        "`text` or `json` (one object a line).",
    ),
    setting(
        "TRACING_ENABLED",
        Honoured,
        "OpenTelemetry traces over OTLP, where no file sets `server.tracing`: a span per check with the rule, the store and what decided, a child of the caller's (W3C or B3), and a span per Redis call. Where they go and how: OTel's `OTEL_EXPORTER_OTLP_*` settings.",
    ),
    setting(
        "TRACING_SERVICE_NAME",
        Honoured,
        "`service.name` (`RateLimit`).",
    ),
    setting(
        "TRACING_SERVICE_NAMESPACE",
        Honoured,
        "`service.namespace`.",
    ),
    setting(
        "TRACING_SERVICE_INSTANCE_ID",
        Honoured,
        "`service.instance.id` (a random UUID when unset).",
    ),
    setting(
        "TRACING_SAMPLING_RATE",
        Honoured,
        "The share of traces started here that are kept (1); a caller's trace is kept when the caller kept it.",
    ),
    setting(
        "TRACING_EXPORTER_PROTOCOL",
        Honoured,
        "`http` (the default) or `grpc`.",
    ),
];
