//! The Envoy ratelimit service's configuration format, complete, with the load errors that
//! service gives:
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api*"
//!     share_threshold: true
//!     rate_limit: { unit: minute, requests_per_unit: 100, name: api, replaces: [{ name: x }] }
//!     descriptors: [...]
//! ```

use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate::engine::{Domain, DomainBuilder, Node, NodeLimit};

use crate::config::{ConfigError, places};

/// A file in the Envoy ratelimit service's format: one domain and its descriptors, answered
/// as that service answers them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Envoy ratelimit configuration")]
struct File {
    /// The domain: Envoy's rate limit requests name it. Required, and unique among the
    /// files (unless `MERGE_DOMAIN_CONFIG` merges files of one domain).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    domain: Option<Spanned<Option<String>>>,
    /// The descriptors: each matches a key (and a value) of a request's descriptor entry,
    /// and nests the descriptors that match its next entries.
    #[serde(default)]
    #[schemars(with = "Option<Vec<Descriptor>>")]
    descriptors: Option<Vec<Spanned<Descriptor>>>,
}

/// A descriptor: matches one entry of a request's descriptor, and limits it or nests the
/// descriptors of the entries after it.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    /// The entry's key. Required.
    #[serde(default)]
    key: Option<String>,
    /// The entry's value; none: any value, each counted apart. `*` matches any run of
    /// characters, anywhere in the value.
    value: Option<String>,
    /// The limit of requests that match this far; none: the nested descriptors decide.
    rate_limit: Option<RateLimit>,
    /// Descriptors for the next entry of the request's descriptor.
    #[serde(default)]
    #[schemars(with = "Option<Vec<Descriptor>>")]
    descriptors: Option<Vec<Spanned<Descriptor>>>,
    /// Counted and reported, never over the limit.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    shadow_mode: bool,
    /// Quota mode: a request over this limit is over only when every descriptor in quota
    /// mode is.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    quota_mode: bool,
    /// Statistics name the whole descriptor, keys and values, rather than rolling a value the
    /// file does not write into this descriptor's statistics (at most 1,000 series).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    detailed_metric: bool,
    /// Statistics name the value the request sent for this key, even where the file writes
    /// no value or a wildcard.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    value_to_metric: bool,
    /// With a value ending in `*`: every value it matches shares one counter.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    share_threshold: bool,
    /// Returned to Envoy as dynamic metadata when the limit passes and the service is asked
    /// to (`RESPONSE_DYNAMIC_METADATA`); any map.
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A limit: `requests_per_unit` per `unit`, windows aligned to the unit (a month is 30 days,
/// a year 365, as the Envoy service counts them).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RateLimit {
    /// `second`, `minute`, `hour`, `day`, `week`, `month` or `year` (any case). Required
    /// unless `unlimited`.
    unit: Option<String>,
    /// Requests per unit; 0 refuses every request.
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = 0))]
    requests_per_unit: u64,
    /// No limit: every request is OK (and may replace other limits).
    #[serde(default, deserialize_with = "null_is_default")]
    #[schemars(extend("default" = false))]
    unlimited: bool,
    /// The limit's name, which `replaces` of other limits refer to and answers report.
    name: Option<String>,
    /// Limits of the same request this one replaces, by name.
    #[serde(default, deserialize_with = "null_is_default")]
    replaces: Vec<Replaces>,
}

/// A limit replaced by another.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Replaces {
    /// The replaced limit's name.
    #[serde(default)]
    name: Option<String>,
}

/// The JSON Schema of an Envoy file.
pub fn schema() -> schemars::Schema {
    schemars::schema_for!(File)
}

/// A field written with no value (`shadow_mode:`) reads as its default, as in the Envoy
/// service's YAML.
fn null_is_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One Envoy file: its domain's name, where the name is written (or, when it is not, where
/// the file's content starts), and its nodes.
#[derive(Debug)]
pub struct Parsed {
    /// The domain's name.
    pub domain: String,
    /// Where it is written.
    pub at: (u64, u64),
    /// Its descriptors, as nodes.
    pub nodes: Vec<Node>,
}

/// Parses one Envoy file.
///
/// # Errors
/// The first error, at its line and column, in the Envoy service's words.
pub fn parse(file: &Path, text: &str) -> Result<Parsed, ConfigError> {
    let parsed: File = serde_saphyr::from_str(text).map_err(|e| yaml(file, text, &e))?;
    let (domain, at) = match parsed.domain {
        Some(spanned) => (
            spanned.value.unwrap_or_default(),
            Some((spanned.referenced.line(), spanned.referenced.column())),
        ),
        None => (String::new(), None),
    };
    let at = at
        .filter(|(line, _)| *line > 0)
        .unwrap_or_else(|| places::content_start(text));
    if domain.is_empty() {
        return Err(ConfigError::new(
            file,
            Some(at),
            "config file cannot have empty domain",
        ));
    }
    let nodes = nodes(file, &domain, parsed.descriptors.unwrap_or_default())?;
    Ok(Parsed { domain, at, nodes })
}

/// The domain `name` of `nodes`, written at `at` in `file`, where its errors are placed.
///
/// # Errors
/// A composite key written twice, placed at the domain.
pub fn build(
    file: &Path,
    at: (u64, u64),
    name: &str,
    nodes: Vec<Node>,
) -> Result<Domain, ConfigError> {
    DomainBuilder::new(name)
        .build(nodes)
        .map_err(|e| ConfigError::new(file, Some(at), e))
}

/// A YAML error in Envoy's words where it has them: an unknown field is an unknown key.
fn yaml(file: &Path, text: &str, err: &serde_saphyr::Error) -> ConfigError {
    let mut error = ConfigError::yaml(file, text, err);
    if let Some(rest) = error.message.strip_prefix("unknown field `")
        && let Some((field, expected)) = rest.split_once('`')
    {
        error.message = format!("config error, unknown key '{field}'{expected}");
    } else if error.message.ends_with("expected mapping start") {
        error.message = "config error, yaml file contains list of type other than map: each \
                         descriptor is a mapping (`- key: ...`)"
            .into();
    }
    error
}

/// The nodes of `descriptors`, under `parent` (the domain and the composite keys above, as
/// the Envoy service names them in its errors).
fn nodes(
    file: &Path,
    parent: &str,
    descriptors: Vec<Spanned<Descriptor>>,
) -> Result<Vec<Node>, ConfigError> {
    let mut seen = std::collections::HashSet::new();
    descriptors
        .into_iter()
        .map(|spanned| {
            let at = Some((spanned.referenced.line(), spanned.referenced.column()))
                .filter(|(line, _)| *line > 0);
            let d = spanned.value;
            let err = |message: String| ConfigError::new(file, at, message);
            let key = d.key.unwrap_or_default();
            if key.is_empty() {
                return Err(err("descriptor has empty key".into()));
            }
            let value = d.value.filter(|v| !v.is_empty());
            let composite = match &value {
                Some(v) => format!("{key}_{v}"),
                None => key.clone(),
            };
            let here = format!("{parent}.{composite}");
            if !seen.insert(composite.clone()) {
                return Err(err(format!("duplicate descriptor composite key '{here}'")));
            }
            let limit = match d.rate_limit {
                None => None,
                Some(r) => {
                    let unit = match (&r.unit, r.unlimited) {
                        (Some(unit), true) if NodeLimit::unit_length(unit).is_some() => {
                            return Err(err(
                                "should not specify rate limit unit when unlimited".into()
                            ));
                        }
                        (_, true) => (String::new(), std::time::Duration::from_secs(1)),
                        (Some(unit), false) => match NodeLimit::unit_length(unit) {
                            Some(length) => (unit.to_ascii_lowercase(), length),
                            None => return Err(err(format!("invalid rate limit unit '{unit}'"))),
                        },
                        (None, false) => return Err(err("invalid rate limit unit ''".into())),
                    };
                    if r.requests_per_unit > u64::from(u32::MAX) {
                        return Err(err(format!(
                            "requests_per_unit {} is above 4294967295: Envoy's limits are 32-bit",
                            r.requests_per_unit
                        )));
                    }
                    let replaces: Vec<String> = r
                        .replaces
                        .into_iter()
                        .map(|x| x.name.unwrap_or_default())
                        .collect();
                    if replaces.iter().any(String::is_empty) {
                        return Err(err("should not have an empty replaces entry".into()));
                    }
                    let name = r.name.filter(|n| !n.is_empty());
                    if name.as_ref().is_some_and(|n| replaces.contains(n)) {
                        return Err(err(
                            "replaces should not contain name of same descriptor".into()
                        ));
                    }
                    Some(NodeLimit {
                        requests_per_unit: r.requests_per_unit,
                        unit,
                        unlimited: r.unlimited,
                        name,
                        replaces,
                        shadow: d.shadow_mode,
                        quota: d.quota_mode,
                        metadata: d
                            .metadata
                            .as_ref()
                            .filter(|m| !m.is_empty())
                            .map(|m| serde_json::Value::Object(m.clone()).to_string().into()),
                    })
                }
            };
            if d.share_threshold && !composite.contains('*') {
                return Err(err(format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found key '{composite}'"
                )));
            }
            let children = nodes(file, &here, d.descriptors.unwrap_or_default())?;
            Ok(Node {
                key,
                value,
                limit,
                detailed_metric: d.detailed_metric,
                share_threshold: d.share_threshold,
                value_to_metric: d.value_to_metric,
                children,
            })
        })
        .collect()
}
