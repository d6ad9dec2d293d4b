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

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use tollgate::engine::{KeyPart, Match, PathPattern, Route};
use tollgate::{
    Algorithm, Calendar, CalendarUnit, FailurePolicy, LeakyBucket, OnExpiry, Reservations, Rule,
    SubWindows, Tier, TokenBucket, WarmUp, Weekday, WhenFull,
};

use super::duration::{self, parse_duration};
use super::{
    ConfigError, DEFAULT_MAX_BYTES, DEFAULT_MAX_KEYS, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL,
    Limits, RedisMode, RedisOptions, ServerConfig, StoreConfig, TlsFiles,
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

/// One rule as written, in a file or through the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's id, unique among the rules: 1 to 128 letters, digits and `_ - . : /`.
    /// Decisions, metrics and the admin API name the rule by it.
    pub id: String,
    /// A disabled rule is kept but matches nothing.
    #[serde(default = "yes")]
    #[schemars(extend("default" = true))]
    pub enabled: bool,
    /// Which requests it applies to; none: every request.
    #[serde(default, rename = "match")]
    pub matcher: MatchSpec,
    /// The counter key, from parts of the request, in order: `method`, `route` (the path
    /// pattern matched), `client_ip` (the client's network: an IPv6 client's /64, an IPv4
    /// address whole; `client_ip(v4=24 v6=48)` keeps other prefixes), `segment:NAME` (a named
    /// path segment), `header:NAME`, `text:VALUE`. None: one counter for every request the
    /// rule matches.
    #[serde(default)]
    pub key: Vec<String>,
    /// The algorithm, with its arguments in parentheses: `fixed_window`, `sliding_window`,
    /// `sub_windows(10)`, `sliding_log`, `token_bucket`, `token_bucket(initial=5)`,
    /// `interval_bucket`, `leaky_bucket`, `leaky_bucket(shaper)`, `gcra`, `warm_up(10s)`,
    /// `warm_up(10s, 3)`, `hit_counter`, `concurrency` (a cap on work in flight: each tier's
    /// `limit` is a number of slots and its `period` their lease).
    #[serde(default = "fixed_window")]
    #[schemars(extend("default" = "fixed_window"))]
    pub algorithm: String,
    /// One or more tiers, all of which must admit a check; a check takes from every tier or
    /// from none. A key's state in all of them is at most 2^20 words (8 MiB: a sliding log
    /// keeps a word per permit, concurrency one per slot, other algorithms one to four).
    pub tiers: Vec<TierSpec>,
    /// Shadow mode: evaluated and counted, never denies (decisions say when it would have).
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub shadow: bool,
    /// What decides when the shared store fails or is slow: `open` (admit uncounted),
    /// `closed` (deny), or `local:SHARE` (limit in this process at that share of every
    /// tier, e.g. `local:0.25` for four instances).
    #[serde(default = "open")]
    #[schemars(extend("default" = "open"))]
    pub on_failure: String,
    /// The IANA time zone (`Europe/Paris`) its calendar periods' windows begin in, unless a
    /// tier names its own; UTC when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// How the rule's reservations live and end (`POST /v1/reservations`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<ReservationsSpec>,
    /// Whether a check may state this rule's limit (`limit` in the `/v1/check`, `/v1/report`
    /// and `/v1/reservations` bodies, as Envoy's descriptor `limit`), in place of its tiers,
    /// counted apart for each limit stated: for a proxy that learns each tenant's plan from
    /// its auth. Off, a check stating a limit for this rule alone is refused (403).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub caller_limit: bool,
    /// How long a key that exceeds this rule is refused afterwards, whatever the rule's state
    /// (`10m`): its checks are denied until the ban ends, `Retry-After` saying when. Not for
    /// a shaper (`leaky_bucket(shaper)`) or a concurrency rule, whose denials are a wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<String>,
}

/// How a rule's reservations live and end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationsSpec {
    /// How long a reservation lives unsettled, unless its call says otherwise; at most a day.
    #[serde(
        default,
        with = "optional_period",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "duration::schema", extend("default" = "5m"))]
    #[schema(value_type = Option<String>, example = "5m")]
    pub ttl: Option<Duration>,
    /// What becomes of the estimate of a reservation that expires unsettled: `consumed` (it
    /// stays taken, as if the work used exactly its estimate: a caller that crashed never
    /// gets its work for free) or `released` (it comes back).
    #[serde(default)]
    #[schemars(extend("default" = "consumed"))]
    pub on_expiry: OnExpirySpec,
}

/// What becomes of an unsettled reservation's estimate.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnExpirySpec {
    /// It stays taken.
    #[default]
    Consumed,
    /// It comes back.
    Released,
}

mod optional_period {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => serde::Serialize::serialize(&super::Period::Fixed(*d), s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(d).map(Some)
    }
}

/// A rule's conditions as written: a request must meet all of them.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    /// Methods (`GET`, `PUT`, ...); none: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// A path pattern: literal segments, `{name}` (a named segment, which `segment:name`
    /// keys on), `*` (one segment), `**` (any rest); none: any path.
    #[serde(
        default,
        alias = "pathPattern",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("x-aliases" = ["pathPattern"]))]
    pub path: Option<String>,
    /// Header name to the value required (`*` at the end: a prefix; `*` alone: present).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// One tier as written: at most `limit` permits per `period`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    /// Permits per period: at least 1, below 2^53.
    #[serde(alias = "threshold")]
    #[schemars(extend("x-aliases" = ["threshold"]))]
    pub limit: u64,
    /// The period: a duration (`500ms`, `10s`, `1m`, `1h`, `1d`, `1w`, or a number of
    /// seconds), or a calendar period, `day`, `week`, `month` or `year`, whose windows begin at
    /// midnight in `time_zone` and last as the calendar makes them (fixed_window and
    /// hit_counter only; `30d` stays thirty days).
    #[schemars(schema_with = "period::schema")]
    #[schema(value_type = String, example = "10s")]
    pub period: Period,
    /// A bucket's capacity (token bucket, leaky bucket, GCRA): how many at once; the limit
    /// when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A calendar period's time zone, an IANA name (`Europe/Paris`); the rule's `time_zone`
    /// when not set, else UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// A calendar week's first day (`monday` unless set, as ISO 8601 has it; `sunday`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub week_starts: Option<String>,
}

impl TierSpec {
    /// A tier of `limit` per `period`, as written with nothing else.
    pub fn new(limit: u64, period: Period) -> Self {
        Self {
            limit,
            period,
            burst: None,
            time_zone: None,
            week_starts: None,
        }
    }

    /// The tier, a calendar period in `time_zone` unless the tier names its own.
    ///
    /// # Errors
    /// What is wrong, after the field's name: an unknown time zone or day, or a time zone or
    /// first day given to a period that is not a calendar one.
    pub fn tier(&self, time_zone: Option<&str>) -> Result<Tier, String> {
        let tier = match self.period {
            Period::Fixed(period) => {
                if let Some(zone) = &self.time_zone {
                    return Err(format!(
                        "time_zone: `{zone}` is for a calendar period (day, week, month, year), \
                         and this period is a duration"
                    ));
                }
                if self.week_starts.is_some() {
                    return Err("week_starts: is for a calendar week".into());
                }
                Tier::new(self.limit, period)
            }
            Period::Calendar(unit) => {
                let mut calendar = Calendar::new(unit);
                if let Some(zone) = self.time_zone.as_deref().or(time_zone) {
                    calendar = calendar
                        .in_zone(zone)
                        .map_err(|e| format!("time_zone: {e}"))?;
                }
                if let Some(day) = &self.week_starts {
                    if unit != CalendarUnit::Week {
                        return Err(format!(
                            "week_starts: is for a calendar week, not a {}",
                            unit.name()
                        ));
                    }
                    let day = Weekday::parse(day).ok_or_else(|| {
                        format!("week_starts: `{day}` is not a day of the week (monday ... sunday)")
                    })?;
                    calendar = calendar.week_starts(day);
                }
                Tier::calendar(self.limit, calendar)
            }
        };
        Ok(match self.burst {
            Some(burst) => tier.with_burst(burst),
            None => tier,
        })
    }
}

/// A tier's period: a duration, or a calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// Windows of one length, aligned to multiples of it since the epoch.
    Fixed(Duration),
    /// Windows the calendar draws.
    Calendar(CalendarUnit),
}

impl From<Duration> for Period {
    fn from(d: Duration) -> Self {
        Self::Fixed(d)
    }
}

mod period {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tollgate::CalendarUnit;

    use super::Period;

    /// The largest unit that measures a duration exactly (`1h`, not `3600s`); a calendar
    /// period by its name.
    impl Serialize for Period {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let d = match self {
                Period::Calendar(unit) => return s.serialize_str(unit.name()),
                Period::Fixed(d) => d,
            };
            let millis = d.as_millis();
            let units = [
                (604_800_000, "w"),
                (86_400_000, "d"),
                (3_600_000, "h"),
                (60_000, "m"),
                (1_000, "s"),
            ];
            let (size, unit) = units
                .into_iter()
                .find(|(size, _)| millis > 0 && millis.is_multiple_of(*size))
                .unwrap_or((1, "ms"));
            s.serialize_str(&format!("{}{unit}", millis / size))
        }
    }

    impl<'de> Deserialize<'de> for Period {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            #[derive(Deserialize)]
            #[serde(untagged)]
            enum Written {
                Seconds(u64),
                Text(String),
            }
            match Written::deserialize(d).map_err(|_| {
                D::Error::custom(
                    "expected a duration (`10s`, `1m`, a number of seconds) or a calendar period \
                     (`day`, `week`, `month`, `year`)",
                )
            })? {
                Written::Seconds(s) => Ok(Period::Fixed(std::time::Duration::from_secs(s))),
                Written::Text(text) => parse(&text).map_err(D::Error::custom),
            }
        }
    }

    /// A period as written.
    fn parse(text: &str) -> Result<Period, String> {
        let trimmed = text.trim();
        if let Some(unit) = CalendarUnit::parse(trimmed) {
            return Ok(Period::Calendar(unit));
        }
        match super::duration::parse_duration(trimmed) {
            Ok(d) => Ok(Period::Fixed(d)),
            Err(e) => {
                let word = trimmed.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
                let word = word.strip_suffix('s').unwrap_or(word);
                match CalendarUnit::parse(word) {
                    Some(unit) if word != trimmed => Err(format!(
                        "`{text}`: a calendar period takes no number: write `{}` (or a \
                         duration such as `30d`)",
                        unit.name()
                    )),
                    _ => Err(format!("{e}, or a calendar period: day, week, month, year")),
                }
            }
        }
    }

    /// The JSON Schema of a period.
    pub(super) fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration (a whole number and ms, s, m, h, d or w: `10s`, `1m`; or a whole number of seconds), or a calendar period: `day`, `week`, `month`, `year`.",
            "oneOf": [
                { "type": "string", "pattern": "^([0-9]+ *(ms|s|m|h|d|w)?|day|week|month|year)$" },
                { "type": "integer", "minimum": 0 }
            ]
        })
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
    /// How long this rule bans a key that exceeds it, if it does.
    ///
    /// # Errors
    /// A ban that is not a duration, is zero, or is on an algorithm whose denials are a wait.
    pub fn ban(&self) -> Result<Option<std::time::Duration>, String> {
        let Some(ban) = &self.ban else {
            return Ok(None);
        };
        let algorithm = parse_algorithm(&self.algorithm)?;
        self.ban_of(ban, &algorithm).map(Some)
    }

    fn ban_of(&self, ban: &str, algorithm: &Algorithm) -> Result<std::time::Duration, String> {
        let ban = parse_duration(ban)?;
        if ban.is_zero() {
            return Err("a ban must be longer than zero".into());
        }
        if matches!(algorithm, Algorithm::LeakyBucket(LeakyBucket::Shaper))
            || algorithm.holds_slots()
        {
            return Err(format!(
                "{} makes a denied check wait its turn rather than refusing abuse: a ban \
                 takes a rule that counts a rate",
                self.algorithm
            ));
        }
        Ok(ban)
    }

    /// The route this spec describes.
    ///
    /// # Errors
    /// What is wrong, naming the field.
    pub fn route(&self) -> Result<Route, String> {
        let field = |name: &str, e: String| format!("rule `{}`: {name}: {e}", self.id);
        let algorithm = parse_algorithm(&self.algorithm).map_err(|e| field("algorithm", e))?;
        let tiers = self
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.tier(self.time_zone.as_deref())
                    .map_err(|e| format!("rule `{}`: tiers[{i}].{e}", self.id))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let policy = parse_policy(&self.on_failure).map_err(|e| field("on_failure", e))?;
        let reservations = match &self.reservations {
            None => Reservations::default(),
            Some(spec) => Reservations {
                ttl: spec.ttl.unwrap_or(Reservations::default().ttl),
                on_expiry: match spec.on_expiry {
                    OnExpirySpec::Consumed => OnExpiry::Consumed,
                    OnExpirySpec::Released => OnExpiry::Released,
                },
            },
        };
        if let Some(ban) = &self.ban {
            self.ban_of(ban, &algorithm).map_err(|e| field("ban", e))?;
        }
        let rule = Rule::new(self.id.clone(), algorithm, tiers)
            .and_then(|r| r.on_failure(policy))
            .and_then(|r| r.reservations(reservations))
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
        "concurrency" => none(Algorithm::Concurrency),
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
            const NAMES: [&str; 11] = [
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
                "concurrency",
            ];
            let nearest = super::places::nearest(name, NAMES)
                .map(|n| format!("did you mean `{n}`? "))
                .unwrap_or_default();
            Err(format!(
                "unknown algorithm `{name}`: {nearest}expected fixed_window, sliding_window, \
                 sub_windows(N), sliding_log, token_bucket, interval_bucket, leaky_bucket, gcra, \
                 warm_up(PERIOD), hit_counter or concurrency"
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
