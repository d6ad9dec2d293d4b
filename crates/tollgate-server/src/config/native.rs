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
//! The source documents' spelling is accepted too: `slas` for `rules`, `pathPattern` for
//! `path`, `threshold` for `limit`, a period in seconds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use tollgate::engine::{KeyPart, Match, PathPattern, Route};
use tollgate::{
    Algorithm, FailurePolicy, LeakyBucket, Rule, SubWindows, Tier, TokenBucket, WarmUp, WhenFull,
};

use super::duration::{self, parse_duration};
use super::{
    ConfigError, DEFAULT_MAX_BYTES, DEFAULT_MAX_KEYS, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL,
    Limits, RedisMode, RedisOptions, ServerConfig, StoreConfig, TlsFiles,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    server: Option<Spanned<ServerSection>>,
    store: Option<Spanned<StoreSection>>,
    #[serde(default, alias = "slas")]
    rules: Vec<Spanned<RuleSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    http: Option<SocketAddr>,
    /// An address, or `off`.
    grpc: Option<String>,
    max_body_bytes: Option<usize>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    drain: Option<Duration>,
    grpc_response_headers: Option<bool>,
    max_connections: Option<usize>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    header_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    idle_timeout: Option<Duration>,
    tls: Option<TlsFiles>,
    grpc_tls: Option<TlsFiles>,
    console_record_bytes: Option<usize>,
    console_record_always: Option<bool>,
}

/// The `store` section: its `kind`, and the settings of that kind (a setting of the other
/// kind is an error at its place). One flat mapping, so that every error has a place.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreSection {
    kind: Option<StoreKind>,
    max_keys: Option<usize>,
    max_bytes: Option<usize>,
    when_full: Option<WhenFullSpec>,
    url: Option<String>,
    #[serde(default)]
    cluster: Vec<String>,
    mode: Option<RedisMode>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    timeout: Option<Duration>,
    instances: Option<u32>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    sync_interval: Option<Duration>,
    max_unclaimed: Option<u64>,
    connections: Option<usize>,
    key_prefix: Option<String>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    expiry_jitter: Option<Duration>,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoreKind {
    Memory,
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
            ("tls_ca", self.tls_ca.is_some()),
            ("tls_cert", self.tls_cert.is_some()),
            ("tls_key", self.tls_key.is_some()),
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
                    tls_ca: self.tls_ca,
                    tls_cert: self.tls_cert,
                    tls_key: self.tls_key,
                }),
            },
        }
    }
}

/// `store.when_full` as written.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WhenFullSpec {
    Evict,
    Refuse,
}

/// One rule as written, in a file or through the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's id: letters, digits and `_ - . : /`.
    pub id: String,
    /// A disabled rule is kept but matches nothing.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Which requests it applies to.
    #[serde(default, rename = "match")]
    pub matcher: MatchSpec,
    /// Key parts: `method`, `route`, `client_ip`, `segment:NAME`, `header:NAME`, `text:VALUE`.
    #[serde(default)]
    pub key: Vec<String>,
    /// `fixed_window`, `sliding_window`, `sub_windows(10)`, `sliding_log`, `token_bucket`,
    /// `token_bucket(initial=5)`, `interval_bucket`, `leaky_bucket`, `leaky_bucket(shaper)`,
    /// `gcra`, `warm_up(10s)`, `warm_up(10s, 3)`, `hit_counter`.
    #[serde(default = "fixed_window")]
    pub algorithm: String,
    /// Every tier must admit.
    pub tiers: Vec<TierSpec>,
    /// Counted and reported, never denied.
    #[serde(default)]
    pub shadow: bool,
    /// What decides when the shared store fails: `open` (default), `closed`, `local:0.25`.
    #[serde(default = "open")]
    pub on_failure: String,
}

/// A rule's conditions as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// Methods; none: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// A path pattern; none: any path.
    #[serde(
        default,
        alias = "pathPattern",
        skip_serializing_if = "Option::is_none"
    )]
    pub path: Option<String>,
    /// Header name to the value required (`*` at the end: a prefix; `*` alone: present).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// One tier as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    /// Permits per period.
    #[serde(alias = "threshold")]
    pub limit: u64,
    /// `10s`, `1m`, `1h`, `1d`, or seconds.
    #[serde(with = "period")]
    pub period: Duration,
    /// A bucket's capacity, for the algorithms that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

mod period {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        if d.subsec_millis() == 0 {
            s.serialize_str(&format!("{}s", d.as_secs()))
        } else {
            s.serialize_str(&format!("{}ms", d.as_millis()))
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::duration::deserialize(d)
    }
}

fn yes() -> bool {
    true
}

fn fixed_window() -> String {
    "fixed_window".into()
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

fn open() -> String {
    "open".into()
}

impl RuleSpec {
    /// The route this spec describes.
    ///
    /// # Errors
    /// What is wrong, naming the field.
    pub fn route(&self) -> Result<Route, String> {
        let field = |name: &str, e: String| format!("rule `{}`: {name}: {e}", self.id);
        let algorithm = parse_algorithm(&self.algorithm).map_err(|e| field("algorithm", e))?;
        let tiers = self.tiers.iter().map(|t| {
            let tier = Tier::new(t.limit, t.period);
            match t.burst {
                Some(burst) => tier.with_burst(burst),
                None => tier,
            }
        });
        let policy = parse_policy(&self.on_failure).map_err(|e| field("on_failure", e))?;
        let rule = Rule::new(self.id.clone(), algorithm, tiers)
            .and_then(|r| r.on_failure(policy))
            .map_err(|e| e.to_string())?
            .shadow(self.shadow);
        let path = self
            .matcher
            .path
            .as_deref()
            .map(PathPattern::parse)
            .transpose()
            .map_err(|e| field("match.path", e))?;
        let methods = self
            .matcher
            .methods
            .iter()
            .map(|m| {
                if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                    Err(field("match.methods", format!("`{m}` is not a method")))
                } else {
                    Ok(m.to_ascii_uppercase())
                }
            })
            .collect::<Result<_, _>>()?;
        let headers = self
            .matcher
            .headers
            .iter()
            .map(|(name, value)| {
                let value = (value != "*").then(|| value.clone());
                (name.to_ascii_lowercase(), value)
            })
            .collect();
        let key = self
            .key
            .iter()
            .map(|k| KeyPart::parse(k))
            .collect::<Result<_, _>>()
            .map_err(|e| field("key", e))?;
        let route = Route {
            rule,
            enabled: self.enabled,
            matcher: Match {
                methods,
                path,
                headers,
            },
            key,
        };
        route.validate().map_err(|e| field("key", e))?;
        Ok(route)
    }
}

/// Parses a rule spec from YAML or JSON text (the admin API's body).
///
/// # Errors
/// What is wrong and where.
pub fn parse_rule_spec(text: &str) -> Result<RuleSpec, String> {
    parse_rule_text(Path::new("body"), text).map_err(|e| e.to_string())
}

/// Parses one rule from YAML or JSON text, checked as a file's rule is, its errors at the
/// line and column of the field at fault (named `file`).
///
/// # Errors
/// The first error, placed.
pub fn parse_rule_text(file: &Path, text: &str) -> Result<RuleSpec, ConfigError> {
    let spec: RuleSpec =
        serde_saphyr::from_str(text).map_err(|e| ConfigError::yaml(file, text, &e))?;
    if let Err(e) = spec.route() {
        let rule = super::places::content_start(text);
        let at = super::places::field_place(text, rule, &spec.id, &e).unwrap_or(rule);
        return Err(ConfigError::new(file, Some(at), e));
    }
    Ok(spec)
}

/// Where the field that `error` (a rule's error, `rule `id`: tiers[1].period: ...`) names is
/// written in `text`, a rule on its own (the console's editor).
pub fn field_of_rule(text: &str, id: &str, error: &str) -> Option<(u64, u64)> {
    super::places::field_place(text, super::places::content_start(text), id, error)
}

fn parse_policy(text: &str) -> Result<FailurePolicy, String> {
    match text.split_once(':') {
        None if text == "open" => Ok(FailurePolicy::Open),
        None if text == "closed" => Ok(FailurePolicy::Closed),
        Some(("local", share)) => share
            .trim()
            .parse::<f64>()
            .map(|share| FailurePolicy::Local { share })
            .map_err(|_| format!("`{share}` is not a share (a number above 0, at most 1)")),
        _ => Err(format!(
            "unknown policy `{text}`: expected open, closed or local:SHARE (e.g. local:0.25)"
        )),
    }
}

/// Parses an algorithm name with its arguments in parentheses, as rule files write it.
///
/// # Errors
/// An unknown name or bad arguments, saying what is accepted.
pub fn parse_algorithm(text: &str) -> Result<Algorithm, String> {
    let text = text.trim();
    let (name, args) = match text.split_once('(') {
        Some((name, rest)) => {
            let args = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("`{text}`: missing `)`"))?;
            (
                name.trim(),
                args.split(',').map(str::trim).collect::<Vec<_>>(),
            )
        }
        None => (text, Vec::new()),
    };
    let none = |a: Algorithm| {
        if args.is_empty() {
            Ok(a)
        } else {
            Err(format!("`{name}` takes no arguments"))
        }
    };
    match name {
        "fixed_window" => none(Algorithm::FixedWindow),
        "sliding_window" => none(Algorithm::SlidingWindow),
        "sliding_log" => none(Algorithm::SlidingLog),
        "interval_bucket" => none(Algorithm::IntervalBucket),
        "gcra" => none(Algorithm::Gcra),
        "hit_counter" => none(Algorithm::HitCounter),
        "sub_windows" => match args[..] {
            [count] => count
                .parse()
                .map(|count| Algorithm::SubWindows(SubWindows { count }))
                .map_err(|_| format!("sub_windows({count}): the count must be a whole number")),
            _ => Err("sub_windows takes the number of sub-windows: `sub_windows(10)`".into()),
        },
        "token_bucket" => match args[..] {
            [] => Ok(Algorithm::TokenBucket(TokenBucket::default())),
            [arg] => {
                let n = arg
                    .strip_prefix("initial=")
                    .and_then(|n| n.trim().parse().ok())
                    .ok_or_else(|| format!("token_bucket({arg}): expected `initial=N`"))?;
                Ok(Algorithm::TokenBucket(TokenBucket {
                    initial_tokens: Some(n),
                }))
            }
            _ => Err("token_bucket takes at most `initial=N`".into()),
        },
        "leaky_bucket" => match args[..] {
            [] | ["meter"] => Ok(Algorithm::LeakyBucket(LeakyBucket::Meter)),
            ["shaper"] => Ok(Algorithm::LeakyBucket(LeakyBucket::Shaper)),
            _ => Err("leaky_bucket takes `meter` (the default) or `shaper`".into()),
        },
        "warm_up" => {
            let (period, factor) = match args[..] {
                [period] => (period, None),
                [period, factor] => (period, Some(factor)),
                _ => {
                    return Err(
                        "warm_up takes a period and a cold factor: `warm_up(10s, 3)`".into(),
                    );
                }
            };
            let mut warm_up = WarmUp::new(parse_duration(period)?);
            if let Some(factor) = factor {
                warm_up.cold_factor = factor
                    .parse()
                    .map_err(|_| format!("warm_up: `{factor}` is not a cold factor"))?;
            }
            Ok(Algorithm::WarmUp(warm_up))
        }
        _ => {
            const NAMES: [&str; 10] = [
                "fixed_window",
                "sliding_window",
                "sub_windows",
                "sliding_log",
                "token_bucket",
                "interval_bucket",
                "leaky_bucket",
                "gcra",
                "warm_up",
                "hit_counter",
            ];
            let nearest = super::places::nearest(name, NAMES)
                .map(|n| format!("did you mean `{n}`? "))
                .unwrap_or_default();
            Err(format!(
                "unknown algorithm `{name}`: {nearest}expected fixed_window, sliding_window, \
                 sub_windows(N), sliding_log, token_bucket, interval_bucket, leaky_bucket, gcra, \
                 warm_up(PERIOD) or hit_counter"
            ))
        }
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
