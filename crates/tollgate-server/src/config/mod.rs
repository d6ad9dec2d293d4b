//! Rule files: tollgate's native format and the Envoy ratelimit service's, merged into one
//! [`Config`]. A file is Envoy's when it has a top-level `domain`; every other file is native.
//! Errors name the file, the line and the column, and say what is wrong.

mod duration;
mod envoy;
mod native;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::WhenFull;

use crate::connections::Limits;
use tollgate::engine::{Domain, Engine, Node, Route};

pub use duration::parse_duration;
pub use native::{RuleSpec, parse_algorithm, parse_rule_spec};

/// Where the service listens and what it accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// HTTP (check, auth, admin, metrics, health); loopback unless configured.
    pub http: SocketAddr,
    /// gRPC (Envoy's rate limit service); `None`: not served.
    pub grpc: Option<SocketAddr>,
    /// The largest request body accepted (bytes).
    pub max_body_bytes: usize,
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
    /// TLS on the gRPC listener, when set.
    pub grpc_tls: Option<GrpcTls>,
    /// gRPC on this Unix socket instead of a TCP address: the Envoy service's `GRPC_UDS`.
    pub grpc_uds: Option<PathBuf>,
    /// The metrics served on a listener of their own too, at this address and path: the Envoy
    /// service's `USE_PROMETHEUS`, `PROMETHEUS_ADDR` (`:9090`) and `PROMETHEUS_PATH`
    /// (`/metrics`). They are on the HTTP listener's `/metrics` anyway.
    pub prometheus: Option<(SocketAddr, String)>,
}

/// TLS on the gRPC listener: the server's certificate chain and key (PEM files), and, for
/// mutual TLS, the CA whose certificates clients must present. From the Envoy service's
/// `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and
/// `GRPC_CLIENT_TLS_CACERT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// The private key (PEM).
    pub key: PathBuf,
    /// The CA clients' certificates must chain to; `None`: clients present none.
    pub client_ca: Option<PathBuf>,
}

/// TLS on the gRPC listener from the environment (see [`GrpcTls`]).
///
/// # Errors
/// `GRPC_SERVER_USE_TLS` without a certificate or key, or `GRPC_CLIENT_TLS_SAN`, which
/// tollgate does not check (a client allowed by its CA is not refused for its name).
fn grpc_tls_from_env() -> Result<Option<GrpcTls>, ConfigError> {
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
const ENVOY_SETTINGS_NOT_READ: &[&str] = &[
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

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: Some(SocketAddr::from(([127, 0, 0, 1], 8081))),
            max_body_bytes: 64 * 1024,
            drain: Duration::from_secs(10),
            grpc_response_headers: false,
            connections: Limits::default(),
            envoy: EnvoySettings::default(),
            grpc_tls: None,
            grpc_uds: None,
            prometheus: None,
        }
    }
}

/// Where counters live.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    /// Process memory.
    Memory {
        /// The most keys held.
        max_keys: usize,
        /// The most bytes held.
        max_bytes: usize,
        /// What a full store does with a new key.
        when_full: WhenFull,
    },
    /// Redis or Redis Cluster.
    Redis {
        /// A server's URL.
        url: Option<String>,
        /// A cluster's seed nodes, instead of `url`.
        cluster: Vec<String>,
        /// strict, hybrid or lease.
        mode: RedisMode,
        /// The longest a check waits for Redis before the rule's failure policy decides.
        timeout: Duration,
        /// Instances expected to share the keys (hybrid and lease).
        instances: u32,
        /// Hybrid: how often counts are synced.
        sync_interval: Duration,
        /// Hybrid: the most permits of a key one instance admits per window beyond its
        /// claim (`None`: the store's default).
        max_unclaimed: Option<u64>,
    },
}

/// How long a check waits for Redis when a file sets no `timeout`.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(20);
/// How often the hybrid store syncs when a file sets no `sync_interval`.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// The memory store's key bound when a file sets none.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The memory store's byte bound when a file sets none (256 MiB).
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

impl Default for StoreConfig {
    fn default() -> Self {
        Self::Memory {
            max_keys: DEFAULT_MAX_KEYS,
            max_bytes: DEFAULT_MAX_BYTES,
            when_full: WhenFull::Evict,
        }
    }
}

/// How a Redis store decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One atomic round trip per check.
    Strict,
    /// In memory, synced in the background.
    Hybrid,
    /// From permits leased in batches.
    Lease,
}

/// Everything the rule files say.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listening and limits of the service.
    pub server: ServerConfig,
    /// Where counters live.
    pub store: StoreConfig,
    /// The native rules, as written (the admin API lists and edits them).
    pub specs: Vec<RuleSpec>,
    /// Routes and domains, ready to match.
    pub engine: Engine,
    /// Where each part was written, for errors found after loading.
    pub places: Places,
}

/// A place in a rule file: the file, and the line and column (from 1) when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub file: PathBuf,
    /// Line and column.
    pub at: Option<(u64, u64)>,
}

impl Place {
    /// An error at this place.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::new(&self.file, self.at, message)
    }
}

/// Where the parts of a configuration were written.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// The first file.
    pub first: Option<PathBuf>,
    /// The `server` section, if a file has one.
    pub server: Option<Place>,
    /// The `store` section, if a file has one.
    pub store: Option<Place>,
    /// Each native rule, by id.
    pub rules: std::collections::HashMap<String, Place>,
}

impl Places {
    /// The place of the `server` section, or the first file.
    pub fn server(&self) -> Place {
        self.server.clone().unwrap_or_else(|| self.file())
    }

    /// The place of the `store` section, or the first file.
    pub fn store(&self) -> Place {
        self.store.clone().unwrap_or_else(|| self.file())
    }

    /// The place of rule `id`, or the first file.
    pub fn rule(&self, id: &str) -> Place {
        self.rules.get(id).cloned().unwrap_or_else(|| self.file())
    }

    fn file(&self) -> Place {
        Place {
            file: self.first.clone().unwrap_or_else(|| PathBuf::from("-")),
            at: None,
        }
    }
}

/// A rule file that cannot be loaded: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// Line and column (from 1), when the error has a place.
    pub at: Option<(u64, u64)>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, column)) => write!(
                f,
                "{}:{line}:{column}: {}",
                self.file.display(),
                self.message
            ),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn new(file: &Path, at: Option<(u64, u64)>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            at,
            message: message.into(),
        }
    }

    /// A YAML error in `text`, with its place and without the snippet the message may carry,
    /// in plain words: a message that names no field ("invalid boolean") is given the key
    /// written where it points, what is expected there and what is written instead.
    fn yaml(file: &Path, text: &str, err: &serde_saphyr::Error) -> Self {
        let at = err
            .location()
            .filter(|l| l.line() > 0)
            .map(|l| (l.line(), l.column()));
        let rendered = err.without_snippet().to_string();
        // The library prefixes its own rendering of the place; keep the reason.
        let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
        // The place is said once, in front.
        let message = match first.rfind(" at line ") {
            Some(i) if at.is_some() => &first[..i],
            _ => first,
        };
        let mut message = plain(message).unwrap_or_else(|| message.to_string());
        // A scalar of the wrong kind: what was expected, and what is written there.
        let wanted = match message.as_str() {
            "invalid boolean" => Some("true or false"),
            m if m.starts_with("invalid u") || m.starts_with("invalid i") => Some("a whole number"),
            _ => None,
        };
        if let Some(wanted) = wanted {
            message = match at.and_then(|(line, column)| scalar_at(text, line, column)) {
                Some(found) => format!("expected {wanted}, found `{found}`"),
                None => format!("expected {wanted}"),
            };
        }
        // Messages that name their own field keep it; the others get the key they are about.
        let named = ["unknown field", "`", "missing field"]
            .iter()
            .any(|n| message.starts_with(n));
        if let Some(key) = at.and_then(|(line, column)| key_at(text, line, column))
            && !named
            && !message.starts_with(&format!("{key}:"))
        {
            message = format!("{key}: {message}");
        }
        Self::new(file, at, message)
    }
}

/// The parts of one file.
#[derive(Debug, Default)]
struct Parsed {
    server: Option<(ServerConfig, Option<(u64, u64)>)>,
    store: Option<(StoreConfig, Option<(u64, u64)>)>,
    specs: Vec<(RuleSpec, Option<(u64, u64)>)>,
    domain: Option<envoy::Parsed>,
}

/// Where the Envoy ratelimit service reads its files, from the environment as it does:
/// `RUNTIME_ROOT` (`/srv/runtime_data/current`), `RUNTIME_SUBDIRECTORY` and
/// `RUNTIME_APPDIRECTORY` (`config`), one below the other.
pub fn runtime_directory() -> PathBuf {
    let setting = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    let mut dir = PathBuf::from(setting("RUNTIME_ROOT", "/srv/runtime_data/current"));
    dir.push(setting("RUNTIME_SUBDIRECTORY", ""));
    dir.push(setting("RUNTIME_APPDIRECTORY", "config"));
    dir
}

/// The rule files `paths` name: a file itself, a directory every file below it (in name
/// order; files and directories whose names start with `.` left out, as editors' and
/// Kubernetes' own are, unless `RUNTIME_IGNOREDOTFILES` is set to false).
///
/// # Errors
/// A path that cannot be read, or `RUNTIME_IGNOREDOTFILES` that is not a boolean.
pub fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    let hidden_too = env_flag_set("RUNTIME_IGNOREDOTFILES")? == Some(false);
    fn walk(dir: &Path, files: &mut Vec<PathBuf>, hidden_too: bool) -> Result<(), ConfigError> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| ConfigError::new(dir, None, format!("cannot read: {e}")))?;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let hidden = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden && !hidden_too {
                continue;
            }
            if path.is_dir() {
                walk(&path, files, hidden_too)?;
            } else {
                files.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files, hidden_too)?;
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Loads and merges the files `paths` name (see [`files_of`]; each native or Envoy). With
/// `MERGE_DOMAIN_CONFIG` (the Envoy service's setting), files of one domain merge.
///
/// # Errors
/// The first file that cannot be read or is invalid, with the place and the reason; also two
/// files that both set `server` or `store`, two rules of one id, two domains of one name.
pub fn load(paths: &[PathBuf]) -> Result<Config, ConfigError> {
    let files = files_of(paths)?;
    let mut texts = Vec::with_capacity(files.len());
    for file in &files {
        let bytes = std::fs::read(file)
            .map_err(|e| ConfigError::new(file, None, format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            // The place of the first byte that is not UTF-8.
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
            let start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&valid[start..]).chars().count() as u64 + 1;
            ConfigError::new(
                file,
                Some((line, column)),
                "not UTF-8 text: rule files are UTF-8",
            )
        })?;
        texts.push((file.clone(), text));
    }
    load_texts(&texts)
}

/// Loads and merges files given as (name, text).
///
/// # Errors
/// As [`load`].
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    if texts.is_empty() {
        return Err(ConfigError::new(Path::new("-"), None, "no rule file given"));
    }
    let (mut server, mut store) = (None, None);
    let mut specs: Vec<RuleSpec> = Vec::new();
    let mut routes: Vec<Route> = Vec::new();
    // Each domain's name, its nodes so far and the domain they make.
    let mut domains: Vec<(String, Vec<Node>, Domain)> = Vec::new();
    let merge = env_flag("MERGE_DOMAIN_CONFIG")?;
    let mut places = Places {
        first: Some(texts[0].0.clone()),
        ..Places::default()
    };
    let place = |file: &Path, at| Place {
        file: file.to_path_buf(),
        at,
    };
    for (file, text) in texts {
        let parsed = parse(file, text)?;
        if let Some((s, at)) = parsed.server {
            if server.replace(s).is_some() {
                return Err(ConfigError::new(file, at, "`server` is set in two files"));
            }
            places.server = Some(place(file, at));
        }
        if let Some((s, at)) = parsed.store {
            if store.replace(s).is_some() {
                return Err(ConfigError::new(file, at, "`store` is set in two files"));
            }
            places.store = Some(place(file, at));
        }
        for (spec, at) in parsed.specs {
            if specs.iter().any(|s| s.id == spec.id) {
                return Err(ConfigError::new(
                    file,
                    at,
                    format!("two rules have the id `{}`", spec.id),
                ));
            }
            let route = spec.route().map_err(|e| {
                let at = at.map(|rule| field_place(text, rule, &spec.id, &e).unwrap_or(rule));
                ConfigError::new(file, at, e)
            })?;
            routes.push(route);
            places.rules.insert(spec.id.clone(), place(file, at));
            specs.push(spec);
        }
        if let Some(envoy::Parsed {
            domain: name,
            at,
            nodes,
        }) = parsed.domain
        {
            match domains.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, merged, domain)) if merge => {
                    // Built again with this file's nodes, so that a key this file repeats
                    // is this file's error.
                    merged.extend(nodes);
                    *domain = envoy::build(file, at, &name, merged.clone())?;
                }
                Some(_) => {
                    return Err(ConfigError::new(
                        file,
                        Some(at),
                        format!("duplicate domain '{name}' in config file"),
                    ));
                }
                None => {
                    let domain = envoy::build(file, at, &name, nodes.clone())?;
                    domains.push((name, nodes, domain));
                }
            }
        }
    }
    let domains = domains.into_iter().map(|(_, _, domain)| domain).collect();
    // What the engine refuses is two rules of one name (a native rule's id that an Envoy
    // domain's limit also makes): placed at the native rule.
    let engine = Engine::new(routes, domains).map_err(|e| {
        let named = |id: &String| e.contains(&format!("`{id}`"));
        match places.rules.iter().find(|(id, _)| named(id)) {
            Some((_, place)) => place.error(e),
            None => places.file().error(e),
        }
    })?;
    // The environment's settings of the Envoy service where no file sets these sections.
    let mut server = match server {
        Some(server) => server,
        None => server_from_env()?,
    };
    server.envoy = EnvoySettings::from_env()?;
    server.grpc_tls = grpc_tls_from_env()?;
    server.grpc_uds = env("GRPC_UDS").map(PathBuf::from);
    server.prometheus = prometheus_from_env()?;
    let store = match store {
        Some(store) => store,
        None => store_from_env()?.unwrap_or_default(),
    };
    if let (StoreConfig::Redis { .. }, None) = (&store, &places.store) {
        places.store = Some(Place {
            file: PathBuf::from("environment"),
            at: None,
        });
    }
    Ok(Config {
        server,
        store,
        specs,
        engine,
        places,
    })
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
fn env_flag_set(name: &str) -> Result<Option<bool>, ConfigError> {
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
fn prometheus_from_env() -> Result<Option<(SocketAddr, String)>, ConfigError> {
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

/// The key written before `column` on `line` of `text` (`enabled` in `    enabled: yes`), or,
/// for a value that starts on a line of its own, the key that ends the line above it.
fn key_at(text: &str, line: u64, column: u64) -> Option<&str> {
    let index = usize::try_from(line).ok()?.checked_sub(1)?;
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(index)?;
    let column = usize::try_from(column).ok()?.saturating_sub(1);
    let upto = here
        .char_indices()
        .nth(column)
        .map_or(*here, |(byte, _)| &here[..byte]);
    // `key:`, perhaps followed by a block scalar's indicator, a tag or an anchor.
    let key_of = |before: &str| -> Option<usize> {
        let mut before = before.trim_end();
        if let Some((head, last)) = before.rsplit_once(char::is_whitespace)
            && (last.starts_with(['|', '>', '!', '&']))
        {
            before = head.trim_end();
        }
        let before = before.strip_suffix(':')?.trim_end();
        Some(before.len())
    };
    // The place may be the key itself, or the `:` after it.
    let at_key = {
        let rest = &here[upto.len()..];
        let word = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        rest[word..]
            .trim_start()
            .starts_with(':')
            .then_some(upto.len() + word)
    };
    let (source, end) = match key_of(upto).or(at_key) {
        Some(end) => (*here, end),
        None if upto.trim().is_empty() || upto.trim() == "-" => {
            // The value began on a later line than its key: the nearest line above that
            // is not blank or a comment, if it ends with `key:`.
            let above = lines[..index]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))?;
            (*above, key_of(above)?)
        }
        None => return None,
    };
    let before = &source[..end];
    let start = before
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some(&before[start..]).filter(|k| k.starts_with(|c: char| c.is_alphabetic() || c == '_'))
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let next = (row[j] + 1).min(row[j + 1] + 1).min(previous + cost);
            previous = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The one of `names` nearest to `name`, when it is close enough to be a misspelling of it
/// (at most 3 edits, and fewer than `name` has characters).
fn nearest<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .map(|n| (distance(name, n), n))
        .min()
        .filter(|(d, _)| *d <= 3 && *d < name.chars().count())
        .map(|(_, n)| n)
}

/// A YAML library's message in a user's words: which key is written twice, what type was
/// expected in plain terms, the nearest name to an unknown one; `None` when it reads well.
fn plain(message: &str) -> Option<String> {
    if let Some(rest) = message.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest);
        return Some(format!("`{key}` is written twice in one mapping: keep one"));
    }
    if message.starts_with("cannot deserialize null into ") {
        return Some("a value is needed here".into());
    }
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        let found = found
            .replace("floating point", "the number")
            .replace(" `", " ")
            .replace('`', "");
        return Some(format!("expected {}, found {found}", kind(expected)));
    }
    for (prefix, what) in [("unknown field `", "field"), ("unknown variant `", "value")] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((name, expected)) = rest.split_once('`')
            && let Some(names) = expected.strip_prefix(", expected one of ")
        {
            let names = names.split(", ").map(|n| n.trim_matches('`'));
            let list: Vec<&str> = names.collect();
            let guess = nearest(name, list.iter().copied())
                .map(|n| format!(": did you mean `{n}`?"))
                .unwrap_or_else(|| ",".into());
            return Some(format!(
                "unknown {what} `{name}`{guess} expected one of {}",
                list.join(", ")
            ));
        }
    }
    None
}

/// What serde calls a type, as a rule file's reader would say it.
fn kind(expected: &str) -> String {
    let known = [
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("u16", "a whole number"),
        ("a boolean", "true or false"),
        ("bool", "true or false"),
        (
            "a sequence",
            "a list (`[a, b]`, or lines starting with `- `)",
        ),
        (
            "a map",
            "a mapping (`key: value` lines, or `{ key: value }`)",
        ),
    ];
    if let Some((_, plain)) = known.iter().find(|(k, _)| *k == expected) {
        return (*plain).into();
    }
    if expected.starts_with("struct ") {
        return "a mapping (`key: value` lines, or `{ key: value }`)".into();
    }
    expected.to_string()
}

/// The lines of the section whose value starts at `at` in `text`: each line's number, the
/// byte where the section's part of it starts, and the line. The section ends at the first
/// later line (not blank, not a comment) indented less than its first key.
fn section_lines(text: &str, at: (u64, u64)) -> impl Iterator<Item = (u64, usize, &str)> {
    let (first, column) = (at.0 as usize, at.1 as usize);
    text.lines()
        .enumerate()
        .skip(first.saturating_sub(1))
        .map(move |(i, line)| {
            let start = if i + 1 == first {
                line.char_indices()
                    .nth(column.saturating_sub(1))
                    .map_or(line.len(), |(b, _)| b)
            } else {
                0
            };
            (i as u64 + 1, start, line)
        })
        .take_while(move |(n, _, line)| {
            let content = line.trim_start();
            let indent = line.len() - content.len();
            *n as usize == first
                || content.is_empty()
                || content.starts_with('#')
                || indent + 1 >= column
        })
}

/// A byte offset of `line` as a column (from 1).
fn column_of(line: &str, byte: usize) -> u64 {
    line[..byte].chars().count() as u64 + 1
}

/// Where `key`'s value is written in the section at `at` (the key's own place when nothing
/// follows it on its line).
fn section_key_place(text: &str, at: Option<(u64, u64)>, key: &str) -> Option<(u64, u64)> {
    section_lines(text, at?).find_map(|(n, start, line)| {
        let mut from = start;
        while let Some(found) = line[from..].find(key) {
            let begin = from + found;
            let end = begin + key.len();
            from = end;
            let before = line[..begin].chars().next_back();
            let bounded = before.is_none_or(|c| " \t{,-".contains(c));
            let rest = &line[end..];
            if bounded && rest.trim_start().starts_with(':') {
                let value = rest.trim_start()[1..].trim_start();
                let byte = if value.is_empty() {
                    begin
                } else {
                    line.len() - value.len()
                };
                return Some((n, column_of(line, byte)));
            }
        }
        None
    })
}

/// Where `value` is first written in the section at `at`.
fn value_place(text: &str, at: Option<(u64, u64)>, value: &str) -> Option<(u64, u64)> {
    if value.is_empty() {
        return None;
    }
    section_lines(text, at?).find_map(|(n, start, line)| {
        line[start..]
            .find(value)
            .map(|found| (n, column_of(line, start + found)))
    })
}

/// The plain scalar written at `line`:`column` of `text`, up to the end of its line, a
/// comment or the end of a flow collection's item.
fn scalar_at(text: &str, line: u64, column: u64) -> Option<&str> {
    let line = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let (byte, _) = line
        .char_indices()
        .nth(usize::try_from(column).ok()?.checked_sub(1)?)?;
    let rest = &line[byte..];
    let end = rest.find([',', '}', ']', '#']).unwrap_or(rest.len());
    Some(rest[..end].trim()).filter(|s| !s.is_empty())
}

/// Where `text`'s content starts: the first line that is not blank, a comment or a document
/// marker, at its first character; 1:1 for a file of none.
fn content_start(text: &str) -> (u64, u64) {
    text.lines()
        .enumerate()
        .find_map(|(i, line)| {
            let content = line.trim_start();
            let skip = content.is_empty() || content.starts_with('#') || content == "---";
            let column = line.chars().count() - content.chars().count();
            (!skip).then_some((i as u64 + 1, column as u64 + 1))
        })
        .unwrap_or((1, 1))
}

/// Where the field an error of rule `id` names (`rule `id`: tiers[1].period: ...`) is
/// written in `text`, given the rule's place: the line and column of its value, searched for
/// in the rule's lines (block or flow style); `None` when it is not written there (a
/// default).
fn field_place(text: &str, rule: (u64, u64), id: &str, error: &str) -> Option<(u64, u64)> {
    let path = error
        .strip_prefix(&format!("rule `{id}`: "))?
        .split(": ")
        .next()?;
    // `tiers[1].period`: the second `period:` of the rule; `match.path`: its `path:`.
    let (mut nth, mut name) = (0, path.rsplit('.').next()?);
    if let Some(open) = path.find('[') {
        nth = path[open + 1..].split(']').next()?.parse().ok()?;
        if !path.contains('.') {
            name = &path[..open];
            nth = 0;
        }
    }
    let name = name.split('[').next()?;
    let (first, column) = (usize::try_from(rule.0).ok()?, usize::try_from(rule.1).ok()?);
    let mut seen = 0;
    for (i, line) in text.lines().enumerate().skip(first.saturating_sub(1)) {
        // The next item at the rule's depth or above ends it.
        let indent = line.len() - line.trim_start().len();
        if i + 1 > first && !line.trim().is_empty() && indent + 1 < column {
            return None;
        }
        let mut from = 0;
        while let Some(found) = line[from..].find(name) {
            let at = from + found;
            let before = line[..at].chars().last();
            let after = &line[at + name.len()..];
            let is_key = before.is_none_or(|c| " {,-".contains(c)) && after.starts_with(':');
            if is_key {
                if seen == nth {
                    let value = at + name.len() + 1;
                    let pad = line[value..].len() - line[value..].trim_start().len();
                    return Some((i as u64 + 1, (value + pad) as u64 + 1));
                }
                seen += 1;
            }
            from = at + name.len();
        }
    }
    None
}

/// A setting of the environment, `None` when unset or empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An error in the environment setting `name`.
fn env_error(name: &str, message: impl fmt::Display) -> ConfigError {
    ConfigError::new(Path::new("environment"), None, format!("{name}: {message}"))
}

/// The listeners' addresses from the Envoy service's settings: `PORT` (and `HOST`, read only
/// with `PORT`: shells often set it to the machine's name) for HTTP, `GRPC_PORT` or
/// `GRPC_HOST` for gRPC, with its defaults (`0.0.0.0`, 8080 and 8081) for the others; else
/// tollgate's defaults (loopback). A host may be a name, resolved now.
///
/// # Errors
/// A setting that is not a host or a port, naming it.
fn server_from_env() -> Result<ServerConfig, ConfigError> {
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
fn store_from_env() -> Result<Option<StoreConfig>, ConfigError> {
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
fn env_header(name: &str, default: &str) -> Result<String, ConfigError> {
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

/// Parses one file: Envoy's format when it has a top-level `domain` or `descriptors`, else
/// native. A file with nothing in it is refused.
fn parse(file: &Path, text: &str) -> Result<Parsed, ConfigError> {
    let top = |key: &str| {
        text.lines().any(|l| {
            l.strip_prefix(key)
                .or_else(|| {
                    l.strip_prefix('"')
                        .and_then(|l| l.strip_prefix(key)?.strip_prefix('"'))
                })
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
    };
    let empty = text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---" || l == "..."
    });
    if empty {
        return Err(ConfigError::new(
            file,
            Some((1, 1)),
            "the file is empty: config file cannot have empty domain (an Envoy file needs \
             `domain` and `descriptors`, a native file `rules`)",
        ));
    }
    if top("domain") || top("descriptors") {
        let domain = envoy::parse(file, text)?;
        Ok(Parsed {
            domain: Some(domain),
            ..Parsed::default()
        })
    } else {
        native::parse(file, text)
    }
}
