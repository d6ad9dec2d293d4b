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

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate::engine::{Domain, DomainBuilder, Node, NodeLimit};

use super::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Spanned<Descriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    descriptors: Vec<Spanned<Descriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    share_threshold: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimit {
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: u64,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaces {
    name: String,
}

/// Parses one Envoy file into its domain.
pub(super) fn parse(file: &Path, text: &str) -> Result<Domain, ConfigError> {
    let parsed: File = serde_saphyr::from_str(text).map_err(|e| ConfigError::yaml(file, &e))?;
    if parsed.domain.is_empty() {
        return Err(ConfigError::new(
            file,
            None,
            "config file cannot have empty domain",
        ));
    }
    let nodes = nodes(file, parsed.descriptors)?;
    DomainBuilder::new(parsed.domain)
        .build(nodes)
        .map_err(|e| ConfigError::new(file, None, e))
}

fn nodes(file: &Path, descriptors: Vec<Spanned<Descriptor>>) -> Result<Vec<Node>, ConfigError> {
    descriptors
        .into_iter()
        .map(|spanned| {
            let at = Some((spanned.referenced.line(), spanned.referenced.column()))
                .filter(|(line, _)| *line > 0);
            let d = spanned.value;
            let err = |message: String| ConfigError::new(file, at, message);
            if d.key.is_empty() {
                return Err(err("descriptor has empty key".into()));
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
                    if r.replaces.iter().any(|x| x.name.is_empty()) {
                        return Err(err("should not have an empty replaces entry".into()));
                    }
                    Some(NodeLimit {
                        requests_per_unit: r.requests_per_unit,
                        unit,
                        unlimited: r.unlimited,
                        name: r.name,
                        replaces: r.replaces.into_iter().map(|x| x.name).collect(),
                    })
                }
            };
            Ok(Node {
                key: d.key,
                value: d.value.filter(|v| !v.is_empty()),
                limit,
                shadow: d.shadow_mode,
                detailed_metric: d.detailed_metric,
                share_threshold: d.share_threshold,
                children: nodes(file, d.descriptors)?,
            })
        })
        .collect()
}
