//! The Envoy ratelimit service's settings, read from the environment under its names: where
//! no file has a `server` or `store` section, its listeners and Redis; how its domains are
//! answered; its TLS, metrics and logging.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::catalog::{SETTINGS, Status};
use crate::config::{
    ConfigError, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL, EnvoySettings, RedisMode,
    RedisOptions, ServerConfig, Startup, Statsd, StoreConfig, TlsFiles, TracingProtocol,
    TracingSettings, XdsBackoff, XdsSettings, XdsTls,
};

/// TLS on the gRPC listener from the environment (see [`TlsFiles`]).
///
/// # Errors
/// `GRPC_SERVER_USE_TLS` without a certificate or key.
pub fn grpc_tls_from_env() -> Result<Option<TlsFiles>, ConfigError> {
    if !env_flag("GRPC_SERVER_USE_TLS")? {
        return Ok(None);
    }
    let file = |name: &str| {
        env(name)
            .map(PathBuf::from)
            .ok_or_else(|| env_error(name, "GRPC_SERVER_USE_TLS needs it"))
    };
    Ok(Some(TlsFiles {
        cert: file("GRPC_SERVER_TLS_CERT")?,
        key: file("GRPC_SERVER_TLS_KEY")?,
        client_ca: env("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from),
    }))
}

/// The Envoy ratelimit service's settings set in the environment whose purpose tollgate
/// meets by design, with why: `serve` logs each at start.
pub fn met_by_design() -> Vec<(&'static str, &'static str)> {
    SETTINGS
        .iter()
        .filter(|s| s.status == Status::MetByDesign && env(s.name).is_some())
        .map(|s| (s.name, s.what))
        .collect()
}

/// The first refused setting (see [`SETTINGS`]) set to a value that asks for what tollgate
/// does not do.
fn refused() -> Result<(), ConfigError> {
    for (name, harmless, why) in SETTINGS.iter().filter_map(|s| match s.status {
        Status::Refused(harmless) => Some((s.name, harmless, s.what)),
        _ => None,
    }) {
        if let Some(value) = env(name) {
            let asks = match harmless {
                None => true,
                Some("false") => env_flag(name)?,
                Some(harmless) => !value.eq_ignore_ascii_case(harmless),
            };
            if asks {
                return Err(env_error(name, format!("`{value}`: {why}")));
            }
        }
    }
    Ok(())
}

/// The names the Envoy service's default statsd mapping gives its statistics, which tollgate
/// exports them under.
const MAPPED_NAMES: &[&str] = &[
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_over_limit",
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_within_limit",
    "ratelimit_service_rate_limit_shadow_mode",
    "ratelimit_service_should_rate_limit_error",
    "ratelimit_service_total_requests",
    "ratelimit_service_response_time_seconds",
    "ratelimit_service_config_load_success",
    "ratelimit_service_config_load_error",
];

/// `PROMETHEUS_MAPPER_YAML`, a statsd exporter's mapping file: accepted when each of its
/// mappings maps to a name of the default mapping (Envoy Gateway's `statsd-exporter-config`
/// is that mapping), since tollgate exports under those names; one that names anything else
/// or drops a statistic is refused, naming it. A file that cannot be read is passed over,
/// as the Envoy service passes it over.
fn mapping() -> Result<(), ConfigError> {
    #[derive(serde::Deserialize)]
    struct Mappings {
        #[serde(default)]
        mappings: Vec<Mapping>,
    }
    #[derive(serde::Deserialize)]
    struct Mapping {
        #[serde(rename = "match", default)]
        pattern: String,
        name: Option<String>,
        action: Option<String>,
    }
    const NAME: &str = "PROMETHEUS_MAPPER_YAML";
    let Some(path) = env(NAME) else {
        return Ok(());
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let file: Mappings = serde_saphyr::from_str(&text)
        .map_err(|e| env_error(NAME, format!("`{path}` is not a statsd mapping: {e}")))?;
    for mapping in file.mappings {
        let name = mapping.name.as_deref().unwrap_or("");
        if mapping.action.as_deref().is_some_and(|a| a != "map") || !MAPPED_NAMES.contains(&name) {
            return Err(env_error(
                NAME,
                format!(
                    "`{path}` maps `{}` to `{name}`{}: tollgate names its statistics as the default mapping does, and a mapping to other names does not apply",
                    mapping.pattern,
                    mapping
                        .action
                        .map(|a| format!(" with action `{a}`"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// The settings the environment gives.
///
/// # Errors
/// A setting that is not of its kind (a boolean, a number, a duration, an address),
/// or one that asks for what tollgate does not do, naming it.
pub fn from_env() -> Result<EnvoySettings, ConfigError> {
    refused()?;
    mapping()?;
    log_json()?;
    Ok(EnvoySettings {
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
        local_cache_bytes: env_number("LOCAL_CACHE_SIZE_IN_BYTES")?.unwrap_or(0),
        stats: !env_flag("DISABLE_STATS")?,
        statsd: statsd_from_env()?,
        debug: debug_from_env()?,
        grpc_max_connection_age: match env_duration("GRPC_MAX_CONNECTION_AGE")? {
            None => None,
            Some(age) => Some((
                age,
                env_duration("GRPC_MAX_CONNECTION_AGE_GRACE")?
                    .unwrap_or(Duration::from_secs(3_600)),
            )),
        },
        force_start: env_flag("FORCE_START_WITHOUT_INITIAL_CONFIG")?,
        health_follows_redis: env_flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")?,
        redis_startup: Startup {
            initial: env_duration("REDIS_STARTUP_INITIAL_INTERVAL")?
                .unwrap_or(Duration::from_secs(1)),
            max: env_duration("REDIS_STARTUP_MAX_INTERVAL")?.unwrap_or(Duration::from_secs(30)),
            give_up: env_duration("REDIS_STARTUP_MAX_ELAPSED_TIME")?.filter(|d| !d.is_zero()),
        },
        xds: xds_from_env()?,
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

/// The xDS subscription `CONFIG_TYPE=GRPC_XDS_SOTW` asks for, with its settings; `None` for
/// `FILE` (the default).
///
/// # Errors
/// Another `CONFIG_TYPE`, or a setting that is not of its kind, naming it.
pub fn xds_from_env() -> Result<Option<XdsSettings>, ConfigError> {
    match env("CONFIG_TYPE").as_deref() {
        None | Some("FILE") => return Ok(None),
        Some("GRPC_XDS_SOTW") => {}
        Some(other) => {
            return Err(env_error(
                "CONFIG_TYPE",
                format!("`{other}`: expected FILE or GRPC_XDS_SOTW"),
            ));
        }
    }
    // `a=1,b=2` for the node's metadata, `a:1,b:2` for headers (Go's envconfig maps); a pair
    // without its separator is left out, as there.
    let pairs = |name: &str, separator: char| -> Vec<(String, String)> {
        env(name)
            .unwrap_or_default()
            .split(',')
            .filter_map(|pair| pair.split_once(separator))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let tls = if env_flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")? {
        let identity = match (
            env("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            env("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        ) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(env_error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT needs it",
                ));
            }
            (None, Some(_)) => {
                return Err(env_error(
                    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY needs it",
                ));
            }
        };
        Some(XdsTls {
            ca: env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT").map(PathBuf::from),
            identity,
            san: env("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
        })
    } else {
        None
    };
    let factor = match env("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        None => 0.5,
        Some(f) => f
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .ok_or_else(|| {
                env_error(
                    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                    format!("`{f}` is not a number of 0 or more"),
                )
            })?,
    };
    let max_message = env_number::<usize>("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")?.filter(|&n| n > 0);
    Ok(Some(XdsSettings {
        url: env("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into()),
        node_id: env("CONFIG_GRPC_XDS_NODE_ID").unwrap_or_else(|| "default".into()),
        node_metadata: pairs("CONFIG_GRPC_XDS_NODE_METADATA", '='),
        connect_retry: env_duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")?
            .unwrap_or(Duration::from_secs(3)),
        headers: pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ':'),
        tls,
        backoff: XdsBackoff {
            initial: env_duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")?
                .unwrap_or(Duration::from_secs(10)),
            max: env_duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")?
                .unwrap_or(Duration::from_secs(60)),
            factor,
            jitter: env_flag_set("XDS_CLIENT_BACKOFF_JITTER")?.unwrap_or(true),
        },
        max_message,
    }))
}

/// Traces as `TRACING_ENABLED` asks for them, with `TRACING_SERVICE_NAME` (`RateLimit`),
/// `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`, `TRACING_SAMPLING_RATE` (1)
/// and `TRACING_EXPORTER_PROTOCOL` (`http`); `None` when not enabled.
///
/// # Errors
/// A setting that is not of its kind, naming it.
pub fn tracing_from_env() -> Result<Option<TracingSettings>, ConfigError> {
    if !env_flag("TRACING_ENABLED")? {
        return Ok(None);
    }
    let sampling_rate = match env("TRACING_SAMPLING_RATE") {
        None => 1.0,
        Some(rate) => rate
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                env_error(
                    "TRACING_SAMPLING_RATE",
                    format!("`{rate}`: expected 0 to 1"),
                )
            })?,
    };
    let protocol = match env("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("http") => TracingProtocol::Http,
        Some("grpc") => TracingProtocol::Grpc,
        Some(other) => {
            return Err(env_error(
                "TRACING_EXPORTER_PROTOCOL",
                format!("`{other}`: expected http or grpc"),
            ));
        }
    };
    Ok(Some(TracingSettings {
        service_name: env("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into()),
        service_namespace: env("TRACING_SERVICE_NAMESPACE").unwrap_or_default(),
        service_instance_id: env("TRACING_SERVICE_INSTANCE_ID").unwrap_or_default(),
        sampling_rate,
        protocol,
        endpoint: None,
    }))
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
pub fn env_flag_set(name: &str) -> Result<Option<bool>, ConfigError> {
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
pub fn prometheus_from_env() -> Result<Option<(SocketAddr, String)>, ConfigError> {
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

/// Whether logs are JSON lines (`LOG_FORMAT=json`) rather than text (`text`, the default).
///
/// # Errors
/// Any other format, naming the setting.
pub fn log_json() -> Result<bool, ConfigError> {
    match env("LOG_FORMAT").map(|f| f.to_ascii_lowercase()).as_deref() {
        None | Some("text") => Ok(false),
        Some("json") => Ok(true),
        Some(other) => Err(env_error(
            "LOG_FORMAT",
            format!("`{other}`: expected text or json"),
        )),
    }
}

/// A whole number from the environment setting `name`.
fn env_number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, ConfigError> {
    env(name)
        .map(|v| {
            v.parse()
                .map_err(|_| env_error(name, format!("`{v}` is not a whole number")))
        })
        .transpose()
}

/// A duration from the environment setting `name`, as Go writes one (`10s`, `1m30s`,
/// `500ms`, `1.5h`).
fn env_duration(name: &str) -> Result<Option<Duration>, ConfigError> {
    env(name)
        .map(|v| {
            go_duration(&v).ok_or_else(|| {
                env_error(
                    name,
                    format!("`{v}` is not a duration (`10s`, `1m30s`, `500ms`)"),
                )
            })
        })
        .transpose()
}

/// A duration as Go's `time.ParseDuration` reads it: signed decimal numbers, each with a
/// unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`); `0` alone. Negative ones are refused.
pub fn go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0.0_f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// A statsd sink from `USE_STATSD` or `USE_DOG_STATSD`, with `STATSD_HOST`, `STATSD_PORT`,
/// `STATS_FLUSH_INTERVAL` and `EXTRA_TAGS`. Unlike the Envoy service, tollgate pushes to
/// statsd only when asked (`USE_STATSD=true`): it serves Prometheus's `/metrics` anyway.
///
/// # Errors
/// A setting that is not of its kind, or two sinks at once, naming it.
fn statsd_from_env() -> Result<Option<Statsd>, ConfigError> {
    let (plain, dog) = (env_flag("USE_STATSD")?, env_flag("USE_DOG_STATSD")?);
    if plain && dog {
        return Err(env_error(
            "USE_DOG_STATSD",
            "unable to use more than one stats sink at the same time: set one of \
             USE_DOG_STATSD, USE_STATSD",
        ));
    }
    if !(plain || dog) || env_flag("DISABLE_STATS")? {
        return Ok(None);
    }
    let tags = match env("EXTRA_TAGS") {
        None => Vec::new(),
        Some(tags) => tags
            .split(',')
            .map(|pair| {
                pair.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                    .ok_or_else(|| env_error("EXTRA_TAGS", format!("`{pair}`: expected key:value")))
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(Some(Statsd {
        host: env("STATSD_HOST").unwrap_or_else(|| "localhost".into()),
        port: env_number("STATSD_PORT")?.unwrap_or(8125),
        dog,
        flush: env_duration("STATS_FLUSH_INTERVAL")?
            .filter(|d| !d.is_zero())
            .unwrap_or(Duration::from_secs(10)),
        tags,
    }))
}

/// The debug listener's address, when `DEBUG_PORT` or `DEBUG_HOST` is set (`0.0.0.0` and
/// 6070 by default, as the Envoy service's, which always opens it).
///
/// # Errors
/// A host or port that is not one, naming the setting.
fn debug_from_env() -> Result<Option<SocketAddr>, ConfigError> {
    if env("DEBUG_PORT").is_none() && env("DEBUG_HOST").is_none() {
        return Ok(None);
    }
    let host = env("DEBUG_HOST").unwrap_or_else(|| "0.0.0.0".into());
    let port: u16 = env_number("DEBUG_PORT")?.unwrap_or(6070);
    use std::net::ToSocketAddrs;
    (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut found| found.next())
        .map(Some)
        .ok_or_else(|| env_error("DEBUG_HOST", format!("`{host}` is not an address")))
}

/// A setting of the environment, `None` when unset or empty.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An error in the environment setting `name`.
pub fn env_error(name: &str, message: impl fmt::Display) -> ConfigError {
    ConfigError::new(Path::new("environment"), None, format!("{name}: {message}"))
}

/// The listeners' addresses from the Envoy service's settings: `PORT` (and `HOST`, read only
/// with `PORT`: shells often set it to the machine's name) for HTTP, `GRPC_PORT` or
/// `GRPC_HOST` for gRPC, with its defaults (`0.0.0.0`, 8080 and 8081) for the others; else
/// tollgate's defaults (loopback). A host may be a name, resolved now.
///
/// # Errors
/// A setting that is not a host or a port, naming it.
pub fn server_from_env() -> Result<ServerConfig, ConfigError> {
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
/// separated by commas), `REDIS_AUTH` (`password` or `user:password`), `REDIS_TLS` with
/// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`, `REDIS_POOL_SIZE`
/// (connections), `REDIS_TIMEOUT` (before the failure policy decides; tollgate's 20 ms when
/// unset), `CACHE_KEY_PREFIX` and `EXPIRATION_JITTER_MAX_SECONDS` (when set).
///
/// # Errors
/// A setting tollgate cannot honour, naming it.
pub fn store_from_env() -> Result<Option<StoreConfig>, ConfigError> {
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
    let options = RedisOptions {
        connections: env_number("REDIS_POOL_SIZE")?
            .filter(|&n| n > 0)
            .unwrap_or(1),
        key_prefix: env("CACHE_KEY_PREFIX").unwrap_or_default(),
        expiry_jitter: Duration::from_secs(
            env_number("EXPIRATION_JITTER_MAX_SECONDS")?.unwrap_or(0),
        ),
        module: true,
        tls_ca: env("REDIS_TLS_CACERT").map(PathBuf::from),
        tls_cert: env("REDIS_TLS_CLIENT_CERT").map(PathBuf::from),
        tls_key: env("REDIS_TLS_CLIENT_KEY").map(PathBuf::from),
    };
    match (&options.tls_cert, &options.tls_key) {
        (Some(_), None) => {
            return Err(env_error(
                "REDIS_TLS_CLIENT_KEY",
                "REDIS_TLS_CLIENT_CERT needs it: the certificate's private key (PEM file)",
            ));
        }
        (None, Some(_)) => {
            return Err(env_error(
                "REDIS_TLS_CLIENT_CERT",
                "REDIS_TLS_CLIENT_KEY needs it: the client's certificate (PEM file)",
            ));
        }
        _ => {}
    }
    if let Err(problem) = options.certificates() {
        let name = match problem.split(' ').next() {
            Some("tls_ca") => "REDIS_TLS_CACERT",
            Some("tls_key") => "REDIS_TLS_CLIENT_KEY",
            _ => "REDIS_TLS_CLIENT_CERT",
        };
        return Err(env_error(name, problem));
    }
    Ok(Some(StoreConfig::Redis {
        url,
        cluster,
        mode: RedisMode::Strict,
        timeout: env_duration("REDIS_TIMEOUT")?
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_REDIS_TIMEOUT),
        instances: 1,
        sync_interval: DEFAULT_SYNC_INTERVAL,
        max_unclaimed: None,
        options: Box::new(options),
        regions: None,
    }))
}

/// A header name from the environment setting `name`, `default` when unset or empty.
///
/// # Errors
/// A value that is not a header name, naming the setting.
pub fn env_header(name: &str, default: &str) -> Result<String, ConfigError> {
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
