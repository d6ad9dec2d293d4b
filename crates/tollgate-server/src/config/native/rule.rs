//! A rule as written in the native format: its id, what it matches, its key, algorithm,
//! tiers and policies, and how each becomes a [`Rule`] of the library.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tollgate::engine::{KeyPart, Match, PathPattern, Route};
use tollgate::{
    Algorithm, Calendar, CalendarUnit, FailurePolicy, Global, LeakyBucket, OnExpiry, OnPartition,
    Reservations, Rule, Scope, SubWindows, Tier, TokenBucket, WarmUp, Weekday,
};

use crate::config::ConfigError;
use crate::config::duration::{self, parse_duration};

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
    /// Where the limit holds: `region` (each region enforces it whole, as without regions)
    /// or `global` (one limit across the regions the `regions` section lists, each region
    /// answering from its own Redis; `fixed_window`, `sliding_window` and `sub_windows`).
    #[serde(default, skip_serializing_if = "ScopeSpec::is_region")]
    #[schemars(extend("default" = "region"))]
    pub scope: ScopeSpec,
    /// Global: how long a peer region may go unheard before this region stops counting on
    /// it and falls back (`on_partition`); 10ms to 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "2s"))]
    pub stale_after: Option<String>,
    /// Global: what a region admits while a peer is stale: `share` (at most its share of
    /// what was left, 1 / regions: never over the limit) or `region` (the whole of what was
    /// left, as it last heard: each side of a partition may admit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "share"))]
    pub on_partition: Option<OnPartitionSpec>,
}

/// Where a rule's limit holds.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ScopeSpec {
    /// In each region on its own.
    #[default]
    Region,
    /// Once across the regions.
    Global,
}

impl ScopeSpec {
    fn is_region(&self) -> bool {
        *self == Self::Region
    }
}

/// What a region admits of a global rule while a peer is stale.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnPartitionSpec {
    /// Its share of what was left.
    Share,
    /// The whole of what was left.
    Region,
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

    /// The scope this spec gives its rule; the field at fault and why when its global
    /// settings are wrong or written without `scope: global`.
    fn scope_of(&self) -> Result<Scope, (&'static str, String)> {
        if self.scope == ScopeSpec::Region {
            for (name, set) in [
                ("stale_after", self.stale_after.is_some()),
                ("on_partition", self.on_partition.is_some()),
            ] {
                if set {
                    return Err((
                        name,
                        "a setting of a global rule; add `scope: global`".into(),
                    ));
                }
            }
            return Ok(Scope::Region);
        }
        let mut global = Global::default();
        if let Some(stale_after) = &self.stale_after {
            global.stale_after = parse_duration(stale_after).map_err(|e| ("stale_after", e))?;
        }
        if let Some(OnPartitionSpec::Region) = self.on_partition {
            global.on_partition = OnPartition::Region;
        }
        Ok(Scope::Global(global))
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
        let scope = self.scope_of().map_err(|(name, e)| field(name, e))?;
        let rule = Rule::new(self.id.clone(), algorithm, tiers)
            .and_then(|r| r.on_failure(policy))
            .and_then(|r| r.reservations(reservations))
            .and_then(|r| r.scope(scope))
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
        let rule = crate::config::places::content_start(text);
        let at = crate::config::places::field_place(text, rule, &spec.id, &e).unwrap_or(rule);
        return Err(ConfigError::new(file, Some(at), e));
    }
    Ok(spec)
}

/// Where the field that `error` (a rule's error, `rule `id`: tiers[1].period: ...`) names is
/// written in `text`, a rule on its own (the console's editor).
pub fn field_of_rule(text: &str, id: &str, error: &str) -> Option<(u64, u64)> {
    crate::config::places::field_place(text, crate::config::places::content_start(text), id, error)
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
            let nearest = crate::config::places::nearest(name, NAMES)
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
