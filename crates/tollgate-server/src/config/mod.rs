//! Rule files: tollgate's native format and the Envoy ratelimit service's, merged into one
//! [`Config`]. A file is Envoy's when it has a top-level `domain`; every other file is native.
//! Errors name the file, the line and the column, and say what is wrong.

mod duration;
mod environment;
mod envoy;
mod native;
mod places;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::WhenFull;

use crate::connections::Limits;
use tollgate::engine::{Domain, Engine, Node, Route};

pub use duration::parse_duration;
pub use environment::{
    EnvoySettings, Startup, Statsd, env_flag, envoy_settings_met_by_design, log_json, log_level,
};
use environment::{
    env, env_flag_set, grpc_tls_from_env, prometheus_from_env, server_from_env, store_from_env,
};
pub use native::{RuleSpec, parse_algorithm, parse_rule_spec, parse_rule_text};
use places::{field_place, key_at, plain, scalar_at};

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
    /// gRPC on this Unix socket instead of a TCP address: the Envoy service's `GRPC_UDS`.
    pub grpc_uds: Option<PathBuf>,
    /// The metrics served on a listener of their own too, at this address and path: the Envoy
    /// service's `USE_PROMETHEUS`, `PROMETHEUS_ADDR` (`:9090`) and `PROMETHEUS_PATH`
    /// (`/metrics`). They are on the HTTP listener's `/metrics` anyway.
    pub prometheus: Option<(SocketAddr, String)>,
}

/// TLS on a listener: the server's certificate chain and key (PEM files), and, for mutual
/// TLS, the CA whose certificates clients must present. For gRPC, also from the Envoy
/// service's `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and
/// `GRPC_CLIENT_TLS_CACERT`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// The private key (PEM).
    pub key: PathBuf,
    /// The CA clients' certificates must chain to; `None`: clients present none.
    pub client_ca: Option<PathBuf>,
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
            console_record_bytes: crate::console::DEFAULT_RECORD_BYTES,
            console_record_always: false,
            tls: None,
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
        /// Connections, keys and TLS.
        options: Box<RedisOptions>,
    },
}

/// How the service reaches Redis and names its keys, beyond the address.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisOptions {
    /// Pipelined connections to a single server (1).
    pub connections: usize,
    /// In front of every key (none: keys start with `tg:`).
    pub key_prefix: String,
    /// Keys live up to this much longer than their state, spread (none).
    pub expiry_jitter: Duration,
    /// The CA (PEM file) that `rediss://` servers' certificates must chain to, instead of
    /// the system's roots.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate chain (PEM file) for servers that ask for one, with `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM file).
    pub tls_key: Option<PathBuf>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            connections: 1,
            key_prefix: String::new(),
            expiry_jitter: Duration::ZERO,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl RedisOptions {
    /// The TLS certificates these options name, read from their files; `None` when they
    /// name none.
    ///
    /// # Errors
    /// A file that cannot be read, or a certificate without its key (or a key without its
    /// certificate).
    pub fn certificates(&self) -> Result<Option<redis::TlsCertificates>, String> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("{what} `{}`: {e}", path.display()))
        };
        let client_tls = match (&self.tls_cert, &self.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert", cert)?,
                client_key: read("tls_key", key)?,
            }),
            (Some(_), None) => return Err("tls_cert needs tls_key, its private key".into()),
            (None, Some(_)) => return Err("tls_key needs tls_cert, its certificate".into()),
        };
        let root_cert = match &self.tls_ca {
            Some(ca) => Some(read("tls_ca", ca)?),
            None => None,
        };
        Ok(
            (client_tls.is_some() || root_cert.is_some()).then_some(redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }
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
    assemble(texts)
}

/// A configuration of no rule file: the environment's settings and no rules, which
/// `FORCE_START_WITHOUT_INITIAL_CONFIG` serves until the files load.
///
/// # Errors
/// A setting of the environment, as [`load`] refuses it.
pub fn without_files() -> Result<Config, ConfigError> {
    assemble(&[])
}

/// The configuration of `texts`, merged, with the environment's settings.
fn assemble(texts: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    let (mut server, mut store) = (None, None);
    let mut specs: Vec<RuleSpec> = Vec::new();
    let mut routes: Vec<Route> = Vec::new();
    // Each domain's name, its nodes so far and the domain they make.
    let mut domains: Vec<(String, Vec<Node>, Domain)> = Vec::new();
    let merge = env_flag("MERGE_DOMAIN_CONFIG")?;
    let mut places = Places {
        first: texts.first().map(|(file, _)| file.clone()),
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
    if server.grpc_tls.is_none() {
        server.grpc_tls = grpc_tls_from_env()?;
    }
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

/// Where the field that `error` (a rule's error, `rule `id`: tiers[1].period: ...`) names is
/// written in `text`, a rule on its own (the console's editor).
pub fn field_of_rule(text: &str, id: &str, error: &str) -> Option<(u64, u64)> {
    places::field_place(text, places::content_start(text), id, error)
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
