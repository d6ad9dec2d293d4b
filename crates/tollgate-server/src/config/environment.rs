//! The Envoy ratelimit service's settings, read from the environment under its names: where
//! no file has a `server` or `store` section, its listeners and Redis; how its domains are
//! answered; its TLS, metrics and logging.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{
    ConfigError, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL, GrpcTls, RedisMode, ServerConfig,
    StoreConfig,
};

/// TLS on the gRPC listener from the environment (see [`GrpcTls`]).
///
/// # Errors
/// `GRPC_SERVER_USE_TLS` without a certificate or key, or `GRPC_CLIENT_TLS_SAN`, which
/// tollgate does not check (a client allowed by its CA is not refused for its name).
pub(super) fn grpc_tls_from_env() -> Result<Option<GrpcTls>, ConfigError> {
    if env("GRPC_CLIENT_TLS_SAN").is_some() {
        return Err(env_error(
            "GRPC_CLIENT_TLS_SAN",
            "tollgate does not check the name in a client's certificate; any client whose \
             certificate GRPC_CLIENT_TLS_CACERT's CA signed is admitted: unset it, or give \
             that CA to these clients alone",
        ));
    }
    if !env_flag("GRPC_SERVER_USE_TLS")? {
        return Ok(None);
    }
    let file = |name: &str| {
        env(name)
            .map(PathBuf::from)
            .ok_or_else(|| env_error(name, "GRPC_SERVER_USE_TLS needs it"))
    };
    Ok(Some(GrpcTls {
        cert: file("GRPC_SERVER_TLS_CERT")?,
        key: file("GRPC_SERVER_TLS_KEY")?,
        client_ca: env("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from),
    }))
}

/// The Envoy ratelimit service's settings that change how its domains are answered, read
/// from the environment under its names (see [`EnvoySettings::from_env`]).
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
        }
    }
}

/// The settings the Envoy ratelimit service reads from its environment that tollgate does not
/// (yet) read; [`EnvoySettings::from_env`] reads the others.
pub(super) const ENVOY_SETTINGS_NOT_READ: &[&str] = &[
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "USE_DOG_STATSD",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "PROMETHEUS_MAPPER_YAML",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "CACHE_KEY_PREFIX",
    "REDIS_POOL_SIZE",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_URL",
    "REDIS_TIMEOUT",
    "MEMCACHE_HOST_PORT",
    "TRACING_ENABLED",
];

/// The Envoy ratelimit service's settings that are set in the environment and that tollgate
/// does not read, so that `serve` can say so at start rather than ignore them silently.
pub fn envoy_settings_not_read() -> Vec<&'static str> {
    ENVOY_SETTINGS_NOT_READ
        .iter()
        .copied()
        .filter(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
        .collect()
}

impl EnvoySettings {
    /// The settings the environment gives.
    ///
    /// # Errors
    /// A setting that is not a boolean, naming it.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            stop_when_over: env_flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")?,
            shadow_mode: env_flag("SHADOW_MODE")?,
            quota_mode: env_flag("QUOTA_MODE")?,
            healthy_with_config: env_flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")?,
            response_headers: if env_flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
                Some([
                    env_header("LIMIT_LIMIT_HEADER", "RateLimit-Limit")?,
                    env_header("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")?,
                    env_header("LIMIT_RESET_HEADER", "RateLimit-Reset")?,
                ])
            } else {
                None
            },
            dynamic_metadata: env_flag("RESPONSE_DYNAMIC_METADATA")?,
            near_ratio: match env("NEAR_LIMIT_RATIO") {
                None => 0.8,
                Some(ratio) => ratio
                    .parse::<f32>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        env_error("NEAR_LIMIT_RATIO", format!("`{ratio}`: expected 0 to 1"))
                    })?,
            },
        })
    }
}

/// A setting of the environment that is true or false, as Go reads one (`1`, `t`, `true`,
/// `0`, `f`, `false`, in any of their usual cases); unset or empty is false.
///
/// # Errors
/// Any other value, naming the setting.
pub fn env_flag(name: &str) -> Result<bool, ConfigError> {
    Ok(env_flag_set(name)?.unwrap_or(false))
}

/// As [`env_flag`], `None` when unset or empty.
///
/// # Errors
/// A value that is not a boolean, naming the setting.
pub(super) fn env_flag_set(name: &str) -> Result<Option<bool>, ConfigError> {
    let value = std::env::var(name).unwrap_or_default();
    match value.as_str() {
        "" => Ok(None),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(Some(false)),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Some(true)),
        other => Err(ConfigError::new(
            Path::new("environment"),
            None,
            format!("{name}={other}: expected true or false"),
        )),
    }
}

/// Where `USE_PROMETHEUS` asks for the metrics: `PROMETHEUS_ADDR` (`:9090`, a host left out
/// meaning every address) and `PROMETHEUS_PATH` (`/metrics`).
///
/// # Errors
/// An address or path that is not one, naming the setting.
pub(super) fn prometheus_from_env() -> Result<Option<(SocketAddr, String)>, ConfigError> {
    if !env_flag("USE_PROMETHEUS")? {
        return Ok(None);
    }
    let addr = env("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
    let full = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.clone(),
    };
    let addr: SocketAddr = full
        .parse()
        .map_err(|_| env_error("PROMETHEUS_ADDR", format!("`{addr}` is not an address")))?;
    let path = env("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".into());
    if !path.starts_with('/') {
        return Err(env_error(
            "PROMETHEUS_PATH",
            format!("`{path}` does not start with /"),
        ));
    }
    Ok(Some((addr, path)))
}

/// The log level of the Envoy service's `LOG_LEVEL` (`debug`, `info`, `warn`, `error`, ...),
/// for when `RUST_LOG` is not set; `info` without either.
pub fn log_level() -> &'static str {
    match env("LOG_LEVEL").map(|l| l.to_ascii_lowercase()).as_deref() {
        Some("trace") => "trace",
        Some("debug") => "debug",
        Some("warn" | "warning") => "warn",
        Some("error" | "fatal" | "panic") => "error",
        _ => "info",
    }
}

/// A setting of the environment, `None` when unset or empty.
pub(super) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An error in the environment setting `name`.
pub(super) fn env_error(name: &str, message: impl fmt::Display) -> ConfigError {
    ConfigError::new(Path::new("environment"), None, format!("{name}: {message}"))
}

/// The listeners' addresses from the Envoy service's settings: `PORT` (and `HOST`, read only
/// with `PORT`: shells often set it to the machine's name) for HTTP, `GRPC_PORT` or
/// `GRPC_HOST` for gRPC, with its defaults (`0.0.0.0`, 8080 and 8081) for the others; else
/// tollgate's defaults (loopback). A host may be a name, resolved now.
///
/// # Errors
/// A setting that is not a host or a port, naming it.
pub(super) fn server_from_env() -> Result<ServerConfig, ConfigError> {
    let mut server = ServerConfig::default();
    let address = |host_setting: &str, port_setting: &str, default: u16| {
        let host = env(host_setting).unwrap_or_else(|| "0.0.0.0".into());
        let port: u16 = match env(port_setting) {
            Some(p) => p
                .parse()
                .map_err(|_| env_error(port_setting, format!("`{p}` is not a port")))?,
            None => default,
        };
        use std::net::ToSocketAddrs;
        (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut found| found.next())
            .ok_or_else(|| env_error(host_setting, format!("`{host}` is not an address")))
    };
    if env("PORT").is_some() {
        server.http = address("HOST", "PORT", 8080)?;
    }
    if env("GRPC_HOST").is_some() || env("GRPC_PORT").is_some() {
        server.grpc = Some(address("GRPC_HOST", "GRPC_PORT", 8081)?);
    }
    Ok(server)
}

/// A strict Redis store from the Envoy service's settings, when `REDIS_URL` is set:
/// `REDIS_SOCKET_TYPE` (`tcp` or `unix`), `REDIS_TYPE` (`SINGLE`, or `CLUSTER` with the nodes
/// separated by commas), `REDIS_AUTH` (`password` or `user:password`) and `REDIS_TLS`.
/// `BACKEND_TYPE` other than `redis` is refused: memcache is not a store of tollgate's.
///
/// # Errors
/// A setting tollgate cannot honour, naming it.
pub(super) fn store_from_env() -> Result<Option<StoreConfig>, ConfigError> {
    if let Some(backend) = env("BACKEND_TYPE")
        && !backend.eq_ignore_ascii_case("redis")
    {
        return Err(env_error(
            "BACKEND_TYPE",
            format!("`{backend}` is not a store of tollgate's (redis is)"),
        ));
    }
    let Some(url) = env("REDIS_URL") else {
        return Ok(None);
    };
    let tls = env_flag("REDIS_TLS")?;
    let auth = match env("REDIS_AUTH") {
        Some(auth) if auth.contains(':') => format!("{auth}@"),
        Some(password) => format!(":{password}@"),
        None => String::new(),
    };
    let unix = match env("REDIS_SOCKET_TYPE").as_deref() {
        None | Some("unix") => true,
        Some("tcp") => false,
        Some(other) => {
            return Err(env_error(
                "REDIS_SOCKET_TYPE",
                format!("`{other}`: expected tcp or unix"),
            ));
        }
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let at = |node: &str| format!("{scheme}://{auth}{}", node.trim());
    let (url, cluster) = match env("REDIS_TYPE")
        .unwrap_or_else(|| "SINGLE".into())
        .to_ascii_uppercase()
        .as_str()
    {
        "SINGLE" if unix => (Some(format!("redis+unix://{url}")), Vec::new()),
        "SINGLE" => (Some(at(&url)), Vec::new()),
        "CLUSTER" if !unix => (None, url.split(',').map(at).collect()),
        other => {
            return Err(env_error(
                "REDIS_TYPE",
                format!(
                    "`{other}` with REDIS_SOCKET_TYPE {}: tollgate connects to a single server \
                     (tcp or unix) or a cluster (tcp)",
                    if unix { "unix" } else { "tcp" }
                ),
            ));
        }
    };
    Ok(Some(StoreConfig::Redis {
        url,
        cluster,
        mode: RedisMode::Strict,
        timeout: DEFAULT_REDIS_TIMEOUT,
        instances: 1,
        sync_interval: DEFAULT_SYNC_INTERVAL,
        max_unclaimed: None,
    }))
}

/// A header name from the environment setting `name`, `default` when unset or empty.
///
/// # Errors
/// A value that is not a header name, naming the setting.
pub(super) fn env_header(name: &str, default: &str) -> Result<String, ConfigError> {
    let value = std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string());
    match axum::http::HeaderName::from_bytes(value.as_bytes()) {
        Ok(_) => Ok(value),
        Err(_) => Err(ConfigError::new(
            Path::new("environment"),
            None,
            format!("{name}={value}: not a header name"),
        )),
    }
}
