//! Envoy rate limit descriptors, as the Envoy ratelimit service configures and matches them.
//!
//! A domain holds a tree of nodes; each node matches one entry (`key`, and `value` exactly,
//! as a wildcard pattern where each `*` stands for any run of characters, or any value when
//! it has none) and may carry a limit. A descriptor (a list of entries) walks the tree entry
//! by entry, at each level preferring an exact value, then the first matching pattern in the
//! order configured, then a node of the key alone; its limit is the limit of the node its
//! last entry reaches, if every entry found one. Every limited node is one
//! [`HitCounter`](crate::Algorithm::HitCounter) [`Rule`] (every hit counts, as in the Envoy
//! service), named `domain.key_value.key…` as that service names its statistics, and the
//! counter key is the descriptor's entries (for a pattern node with `share_threshold`, the
//! pattern instead of the value, so that every value it matches shares one counter).
//!
//! A descriptor may carry its own limit (Envoy fills it from route configuration or dynamic
//! metadata); it applies instead of the tree's, counted under one rule per unit of the domain
//! whose keys include the limit, so that it never shares a count with a configured limit.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use super::{Hit, push_part};
use crate::algorithm::Algorithm;
use crate::algorithm::{MAX_EXACT, Tier};
use crate::rule::Rule;

/// One entry of a descriptor a proxy sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's key, e.g. `remote_address`.
    pub key: String,
    /// The entry's value.
    pub value: String,
}

/// A descriptor: entries, from the outermost.
pub type Descriptor = Vec<Entry>;

/// A descriptor of `(key, value)` pairs, from the outermost.
pub fn descriptor<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Descriptor {
    entries
        .into_iter()
        .map(|(key, value)| Entry {
            key: key.into(),
            value: value.into(),
        })
        .collect()
}

/// A node of a domain's tree, as configured.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// The key it matches.
    pub key: String,
    /// The value it matches: exactly, as a pattern when it holds a `*`, any when `None`.
    pub value: Option<String>,
    /// Its limit, if any.
    pub limit: Option<NodeLimit>,
    /// Whether metrics name each value this node matched (else the node).
    pub detailed_metric: bool,
    /// For a pattern value: every value it matches shares one counter.
    pub share_threshold: bool,
    /// Statistics name the value a request sent where this node matches a key alone or a
    /// pattern (without `share_threshold`), in place of the node's own name.
    pub value_to_metric: bool,
    /// Nodes for the next entry.
    pub children: Vec<Node>,
}

/// A node's limit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeLimit {
    /// Permits per unit; ignored when `unlimited`.
    pub requests_per_unit: u64,
    /// The unit's name as configured (`second`, `minute`, `hour`, `day`, `week`, `month`,
    /// `year`) and its length.
    pub unit: (String, Duration),
    /// Never limited (the descriptor is answered OK and counted nowhere).
    pub unlimited: bool,
    /// A name that other limits may replace.
    pub name: Option<String>,
    /// Names of limits that this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// Counted and reported, never denied.
    pub shadow: bool,
    /// Quota mode: a request is over the limit for its quota descriptors only when every one
    /// of them is over.
    pub quota: bool,
    /// A JSON object the Envoy service returns in its answer's dynamic metadata when this
    /// limit passes (with its `RESPONSE_DYNAMIC_METADATA`).
    pub metadata: Option<std::sync::Arc<str>>,
}

impl NodeLimit {
    /// The length of an Envoy unit: `second` to `year` (a month of 30 days, a year of 365).
    pub fn unit_length(unit: &str) -> Option<Duration> {
        let seconds = match unit.to_ascii_lowercase().as_str() {
            "second" => 1,
            "minute" => 60,
            "hour" => 3_600,
            "day" => 86_400,
            "week" => 7 * 86_400,
            "month" => 30 * 86_400,
            "year" => 365 * 86_400,
            _ => return None,
        };
        Some(Duration::from_secs(seconds))
    }
}

/// The units of Envoy limits, in the order of the rules of a domain's per-request limits.
const UNITS: [&str; 7] = ["second", "minute", "hour", "day", "week", "month", "year"];

/// A limit a proxy sends with a descriptor, applying instead of the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Permits per unit.
    pub requests_per_unit: u64,
    /// The unit, by its name (`second` .. `year`).
    pub unit: &'static str,
}

/// What the engine found for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub enum DescriptorHit<'a> {
    /// No node has a limit for it, or another limit of the request replaces its own: not
    /// limited.
    None,
    /// Its node is `unlimited`.
    Unlimited(&'a NodeLimit),
    /// Its node allows 0 requests per unit: always over the limit (unless in shadow mode),
    /// counted nowhere.
    Blocked {
        /// The node's limit.
        limit: &'a NodeLimit,
        /// The name of its statistics (see `Limited`'s).
        stats: &'a str,
    },
    /// Its node's rule and the counter key, with the limit as configured.
    Limited {
        /// The rule and counter key to check.
        hit: Hit,
        /// The limit, as configured or as sent with the descriptor.
        limit: Cow<'a, NodeLimit>,
        /// The name to report in metrics when a node asks for detailed metrics (the values
        /// included), or for a limit sent with the descriptor; otherwise the rule's name is.
        metric: Option<String>,
        /// The limit came with the descriptor: its rule counts without a limit of its own
        /// (see [`Domain::over`]).
        overridden: bool,
        /// The name the Envoy service gives its statistics: the domain and the node's
        /// composite keys (`shop.cart_add.user`), each entry's value in place of a key alone
        /// where the node asks for detailed metrics, or the descriptor's entries for a limit
        /// sent with it.
        stats: Cow<'a, str>,
    },
}

/// A domain: one tree of descriptors, ready to match; see the module documentation.
#[derive(Debug, Clone)]
pub struct Domain {
    name: String,
    top: Level,
    rules: Vec<Rule>,
    /// The rules of per-request limits, one per unit of [`UNITS`].
    overrides: Vec<&'static str>,
}

/// Builds a [`Domain`] from its configured nodes.
#[derive(Debug)]
pub struct DomainBuilder {
    name: String,
}

#[derive(Debug, Clone, Default)]
struct Level {
    /// Key, then value, to the node.
    exact: HashMap<String, HashMap<String, usize>>,
    /// Key, the value's pattern, the node; in the order configured.
    patterns: Vec<(String, Pattern, usize)>,
    any: HashMap<String, usize>,
    nodes: Vec<Built>,
}

/// A value with `*`s, each standing for any run of characters (none included).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// The runs between the `*`s: at least two.
    parts: Vec<String>,
}

impl Pattern {
    fn new(text: &str) -> Option<Self> {
        text.contains('*').then(|| Self {
            parts: text.split('*').map(str::to_string).collect(),
        })
    }

    fn matches(&self, value: &str) -> bool {
        let (first, last) = (&self.parts[0], &self.parts[self.parts.len() - 1]);
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if value.len() < fixed
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[derive(Debug, Clone)]
struct Built {
    /// The name of its statistics: the domain and the composite keys down to it.
    stats: String,
    limit: Option<NodeLimit>,
    /// The node's rule, when it has a limit that is not `unlimited` nor 0.
    rule: Option<&'static str>,
    /// The pattern, when the node matches one and its values share one counter.
    shared: Option<String>,
    /// The value the node matches as configured (exactly or as a pattern); `None` for a key
    /// alone.
    value: Option<String>,
    detailed_metric: bool,
    value_to_metric: bool,
    children: Level,
}

impl DomainBuilder {
    /// A builder of the domain `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    /// The domain of `nodes`.
    ///
    /// # Errors
    /// A message naming the node: an empty domain name or key, a key and value twice at one
    /// level, a limit whose rule is invalid.
    pub fn build(self, nodes: Vec<Node>) -> Result<Domain, String> {
        if self.name.is_empty() {
            return Err("a domain must have a name".into());
        }
        let mut rules = Vec::new();
        let top = build_level(&self.name, nodes, &mut rules)?;
        let mut overrides = Vec::with_capacity(UNITS.len());
        for unit in UNITS {
            let length = NodeLimit::unit_length(unit).expect("a unit");
            // Counts without a limit of its own: the request's limit decides.
            let rule = Rule::new(
                rule_name(&format!("{}.limit_override_{unit}", self.name)),
                Algorithm::HitCounter,
                [Tier::new(MAX_EXACT - 1, length)],
            )
            .map_err(|e| format!("{}: {e}", self.name))?;
            overrides.push(rule.name());
            rules.push(rule);
        }
        Ok(Domain {
            name: self.name,
            top,
            rules,
            overrides,
        })
    }
}

/// One level of the tree under `path` (the domain's name and the composite keys above).
fn build_level(path: &str, nodes: Vec<Node>, rules: &mut Vec<Rule>) -> Result<Level, String> {
    let mut level = Level::default();
    for node in nodes {
        if node.key.is_empty() {
            return Err(format!("{path}: a descriptor has an empty key"));
        }
        let composite = match &node.value {
            Some(v) => format!("{}_{v}", node.key),
            None => node.key.clone(),
        };
        let here = format!("{path}.{composite}");
        let index = level.nodes.len();
        let pattern = node.value.as_deref().and_then(Pattern::new);
        let fresh = match (&node.value, pattern) {
            (Some(_), Some(pattern)) => {
                let seen = level
                    .patterns
                    .iter()
                    .any(|(k, p, _)| *k == node.key && *p == pattern);
                level.patterns.push((node.key.clone(), pattern, index));
                !seen
            }
            (Some(v), None) => level
                .exact
                .entry(node.key.clone())
                .or_default()
                .insert(v.clone(), index)
                .is_none(),
            (None, _) => level.any.insert(node.key.clone(), index).is_none(),
        };
        if !fresh {
            return Err(format!("duplicate descriptor composite key '{here}'"));
        }
        let rule = match &node.limit {
            Some(limit) if !limit.unlimited && limit.requests_per_unit > 0 => {
                let rule = Rule::new(
                    rule_name(&here),
                    Algorithm::HitCounter,
                    [Tier::new(limit.requests_per_unit, limit.unit.1)],
                )
                .map_err(|e| format!("{here}: {e}"))?
                .shadow(limit.shadow);
                let name = rule.name();
                rules.push(rule);
                Some(name)
            }
            _ => None,
        };
        let shared = match &node.value {
            Some(v) if node.share_threshold && v.contains('*') => Some(v.clone()),
            _ => None,
        };
        let children = build_level(&here, node.children, rules)?;
        level.nodes.push(Built {
            stats: here,
            limit: node.limit,
            rule,
            shared,
            value: node.value,
            detailed_metric: node.detailed_metric,
            value_to_metric: node.value_to_metric,
            children,
        });
    }
    Ok(level)
}

/// A rule name for the node at `path`: the path itself when it is a valid name, else the path
/// with other characters as `_`, cut to 110 bytes, and a hash of the whole path.
fn rule_name(path: &str) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || "_-.:/".contains(c);
    if path.len() <= 128 && path.chars().all(valid) {
        return path.to_string();
    }
    let mut name: String = path
        .chars()
        .map(|c| if valid(c) { c } else { '_' })
        .take(110)
        .collect();
    // FNV-1a: stable across processes and versions, unlike the std hasher.
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    name.push_str(&format!(":{hash:016x}"));
    name
}

impl Built {
    /// The value the counter key and the metric name use for `entry`.
    fn value<'e>(&'e self, entry: &'e Entry) -> &'e str {
        self.shared.as_deref().unwrap_or(&entry.value)
    }
}

impl Level {
    fn find(&self, entry: &Entry) -> Option<&Built> {
        let index = self
            .exact
            .get(entry.key.as_str())
            .and_then(|values| values.get(entry.value.as_str()))
            .or_else(|| {
                self.patterns
                    .iter()
                    .find(|(k, p, _)| *k == entry.key && p.matches(&entry.value))
                    .map(|(_, _, i)| i)
            })
            .or_else(|| self.any.get(&entry.key))?;
        Some(&self.nodes[*index])
    }
}

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rules of its limited nodes, and of the limits descriptors may carry.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter()
    }

    /// The statistics names of its nodes with a limit that is not `unlimited` (see
    /// [`DescriptorHit::Limited`]'s `stats`), in the order configured.
    pub fn stats_names(&self) -> Vec<&str> {
        fn walk<'a>(level: &'a Level, names: &mut Vec<&'a str>) {
            for node in &level.nodes {
                if node.limit.as_ref().is_some_and(|l| !l.unlimited) {
                    names.push(&node.stats);
                }
                walk(&node.children, names);
            }
        }
        let mut names = Vec::new();
        walk(&self.top, &mut names);
        names
    }

    /// Its limits, one line each in the order configured, as the Envoy service's debug
    /// listener prints them (`/rlconfig`): `shop.cart: unit=MINUTE requests_per_unit=10,
    /// shadow_mode: false, quota_mode: false`; an unlimited limit's unit is `UNKNOWN`.
    pub fn dump(&self) -> String {
        fn walk(level: &Level, out: &mut String) {
            for node in &level.nodes {
                if let Some(limit) = &node.limit {
                    let unit = match limit.unlimited {
                        true => "UNKNOWN".to_string(),
                        false => limit.unit.0.to_ascii_uppercase(),
                    };
                    out.push_str(&format!(
                        "{}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}\n",
                        node.stats, limit.requests_per_unit, limit.shadow, limit.quota
                    ));
                }
                walk(&node.children, out);
            }
        }
        let mut out = String::new();
        walk(&self.top, &mut out);
        out
    }

    /// How many of its nodes have a limit that is checked (neither `unlimited` nor 0).
    pub fn limits(&self) -> usize {
        self.rules.len() - self.overrides.len()
    }

    /// What each of `descriptors` hits, in order, each with the limit it carries if any;
    /// limits that another limit of the request `replaces` are taken out (answered as not
    /// limited), an `unlimited` one's replacing included.
    pub fn hits<'d>(
        &self,
        descriptors: impl IntoIterator<Item = (&'d Descriptor, Option<LimitOverride>)>,
    ) -> Vec<DescriptorHit<'_>> {
        let mut hits: Vec<DescriptorHit<'_>> = descriptors
            .into_iter()
            .map(|(d, limit)| match limit {
                Some(limit) => self.overridden(d, limit),
                None => self.hit(d),
            })
            .collect();
        let replaced: Vec<String> = hits
            .iter()
            .flat_map(|hit| match hit {
                DescriptorHit::None => &[][..],
                DescriptorHit::Unlimited(limit) | DescriptorHit::Blocked { limit, .. } => {
                    &limit.replaces
                }
                DescriptorHit::Limited { limit, .. } => &limit.replaces,
            })
            .cloned()
            .collect();
        if !replaced.is_empty() {
            for hit in &mut hits {
                let named = match hit {
                    DescriptorHit::Blocked { limit, .. } => limit.name.as_deref(),
                    DescriptorHit::Limited { limit, .. } => limit.name.as_deref(),
                    DescriptorHit::None | DescriptorHit::Unlimited(_) => None,
                };
                if named.is_some_and(|n| replaced.iter().any(|r| r == n)) {
                    *hit = DescriptorHit::None;
                }
            }
        }
        hits
    }

    /// Whether a check of a descriptor's own limit is over it, and the permits it leaves:
    /// such a rule counts with no limit of its own, so its count is what the decision's
    /// limit less its remaining is.
    pub fn over(limit: &NodeLimit, decision: &crate::Decision) -> (bool, u64) {
        let count = decision.limit().saturating_sub(decision.remaining());
        match limit.requests_per_unit.checked_sub(count) {
            Some(left) => (false, left),
            None => (true, 0),
        }
    }

    fn overridden(&self, descriptor: &Descriptor, limit: LimitOverride) -> DescriptorHit<'_> {
        let Some(unit) = UNITS.iter().position(|u| *u == limit.unit) else {
            return DescriptorHit::None;
        };
        let mut key = Vec::new();
        for entry in descriptor {
            push_part(&mut key, entry.key.as_bytes());
            push_part(&mut key, entry.value.as_bytes());
        }
        push_part(&mut key, limit.requests_per_unit.to_string().as_bytes());
        let mut metric = self.name.clone();
        for entry in descriptor {
            metric.push('.');
            metric.push_str(&entry.key);
            if !entry.value.is_empty() {
                metric.push('_');
                metric.push_str(&entry.value);
            }
        }
        DescriptorHit::Limited {
            hit: Hit {
                rule: self.overrides[unit],
                key,
            },
            limit: Cow::Owned(NodeLimit {
                requests_per_unit: limit.requests_per_unit,
                unit: (
                    limit.unit.to_string(),
                    NodeLimit::unit_length(limit.unit).expect("a unit"),
                ),
                ..NodeLimit::default()
            }),
            stats: Cow::Owned(metric.clone()),
            metric: Some(metric),
            overridden: true,
        }
    }

    fn hit(&self, descriptor: &Descriptor) -> DescriptorHit<'_> {
        let mut level = &self.top;
        let mut key = Vec::new();
        let mut detailed = false;
        // The statistics name with the values `value_to_metric` asks for, if any node does.
        let mut valued = self.name.clone();
        let mut by_value = false;
        for (i, entry) in descriptor.iter().enumerate() {
            let Some(node) = level.find(entry) else {
                return DescriptorHit::None;
            };
            push_part(&mut key, entry.key.as_bytes());
            push_part(&mut key, node.value(entry).as_bytes());
            detailed |= node.detailed_metric;
            let pattern = node.value.as_deref().filter(|v| v.contains('*'));
            let shown = match (&node.value, pattern, &node.shared) {
                (_, Some(pattern), Some(_)) => pattern,
                (_, Some(_), None) if node.value_to_metric => entry.value.as_str(),
                (_, Some(pattern), None) => pattern,
                (Some(_), None, _) => entry.value.as_str(),
                (None, _, _) if node.value_to_metric => entry.value.as_str(),
                (None, _, _) => "",
            };
            by_value |= node.value_to_metric && (node.value.is_none() || node.shared.is_none());
            valued.push('.');
            valued.push_str(&entry.key);
            if !shown.is_empty() {
                valued.push('_');
                valued.push_str(shown);
            }
            if i + 1 == descriptor.len() {
                return match (&node.limit, node.rule) {
                    (Some(limit), _) if limit.unlimited => DescriptorHit::Unlimited(limit),
                    (Some(limit), None) => DescriptorHit::Blocked {
                        limit,
                        stats: &node.stats,
                    },
                    (Some(limit), Some(rule)) => {
                        let metric = detailed.then(|| self.metric(descriptor));
                        DescriptorHit::Limited {
                            hit: Hit { rule, key },
                            limit: Cow::Borrowed(limit),
                            stats: match &metric {
                                Some(metric) => Cow::Owned(metric.clone()),
                                None if by_value => Cow::Owned(valued),
                                None => Cow::Borrowed(&node.stats),
                            },
                            metric,
                            overridden: false,
                        }
                    }
                    _ => DescriptorHit::None,
                };
            }
            level = &node.children;
        }
        DescriptorHit::None
    }

    /// The detailed metric name of a descriptor that reached a limit: the domain and each
    /// entry's key and value (a shared pattern's instead of the value), as Envoy names them.
    fn metric(&self, descriptor: &Descriptor) -> String {
        let mut metric = self.name.clone();
        let mut level = &self.top;
        for entry in descriptor {
            let Some(node) = level.find(entry) else {
                break;
            };
            metric.push('.');
            metric.push_str(&entry.key);
            metric.push('_');
            metric.push_str(node.value(entry));
            level = &node.children;
        }
        metric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(n: u64, unit: &str) -> Option<NodeLimit> {
        Some(NodeLimit {
            requests_per_unit: n,
            unit: (unit.into(), NodeLimit::unit_length(unit).unwrap()),
            ..NodeLimit::default()
        })
    }

    fn node(key: &str, value: Option<&str>, limit: Option<NodeLimit>, children: Vec<Node>) -> Node {
        Node {
            key: key.into(),
            value: value.map(Into::into),
            limit,
            children,
            ..Node::default()
        }
    }

    fn d(entries: &[(&str, &str)]) -> Descriptor {
        descriptor(entries.iter().copied())
    }

    fn hits<'a>(domain: &'a Domain, descriptors: &[Descriptor]) -> Vec<DescriptorHit<'a>> {
        domain.hits(descriptors.iter().map(|d| (d, None)))
    }

    fn rule_of(hit: &DescriptorHit<'_>) -> Option<&'static str> {
        match hit {
            DescriptorHit::Limited { hit, .. } => Some(hit.rule),
            _ => None,
        }
    }

    #[test]
    fn exact_then_pattern_then_any_and_only_the_last_entry_limits() {
        let domain = DomainBuilder::new("edge")
            .build(vec![
                node("to_cluster", Some("a"), limit(10, "second"), vec![]),
                node("to_cluster", Some("ab*"), limit(20, "second"), vec![]),
                node("to_cluster", None, limit(30, "second"), vec![]),
                node(
                    "remote_address",
                    None,
                    None,
                    vec![node("path", Some("/x"), limit(5, "minute"), vec![])],
                ),
            ])
            .unwrap();
        let found = hits(
            &domain,
            &[
                d(&[("to_cluster", "a")]),
                d(&[("to_cluster", "abc")]),
                d(&[("to_cluster", "zzz")]),
                d(&[("remote_address", "1.2.3.4")]),
                d(&[("remote_address", "1.2.3.4"), ("path", "/x")]),
                d(&[("remote_address", "1.2.3.4"), ("path", "/y")]),
                d(&[("nothing", "x")]),
            ],
        );
        let rules: Vec<_> = found.iter().map(rule_of).collect();
        assert_eq!(
            rules,
            [
                Some("edge.to_cluster_a"),
                Some("edge.to_cluster_ab_:703d551ba7a6abba"),
                Some("edge.to_cluster"),
                None,
                Some("edge.remote_address.path_/x"),
                None,
                None
            ]
        );
        // Four limited nodes, and the seven units of per-request limits.
        assert_eq!(domain.rules().count(), 4 + 7);
        assert!(
            domain
                .rules()
                .all(|r| *r.algorithm() == Algorithm::HitCounter)
        );
    }

    #[test]
    fn stars_anywhere_match_any_run_of_characters() {
        let domain = DomainBuilder::new("d")
            .build(vec![
                node("mid", Some("bar*b"), limit(1, "minute"), vec![]),
                node("multi", Some("foo*bar*baz"), limit(1, "minute"), vec![]),
                node("path", Some("/api*v1"), limit(1, "minute"), vec![]),
                node("any", Some("*"), limit(1, "minute"), vec![]),
            ])
            .unwrap();
        let matched =
            |key: &str, value: &str| rule_of(&hits(&domain, &[d(&[(key, value)])])[0]).is_some();
        for (key, value) in [
            ("mid", "barb"),
            ("mid", "bar-anything-b"),
            ("multi", "foobarbaz"),
            ("multi", "foo1bar2baz"),
            ("multi", "foo-bar-bar-baz"),
            ("path", "/api/v1"),
            ("path", "/api/users/v1"),
            ("any", ""),
            ("any", "x"),
        ] {
            assert!(matched(key, value), "{key}={value}");
        }
        for (key, value) in [
            ("mid", "bar"),
            ("mid", "barbx"),
            ("multi", "foobaz"),
            ("multi", "foobazbar"),
            ("multi", "fobarbaz"),
            ("path", "/api/v2"),
            ("path", "/apiv"),
        ] {
            assert!(!matched(key, value), "{key}={value}");
        }
    }

    #[test]
    fn values_count_apart_unless_the_pattern_shares_one_counter() {
        let mut shared = node("user", Some("bot*"), limit(1, "second"), vec![]);
        shared.share_threshold = true;
        let mut middle = node("path", Some("/api*v1"), limit(1, "second"), vec![]);
        middle.share_threshold = true;
        let domain = DomainBuilder::new("d")
            .build(vec![
                shared,
                middle,
                node("ip", None, limit(1, "second"), vec![]),
            ])
            .unwrap();
        let key = |e: &[(&str, &str)]| match &hits(&domain, &[d(e)])[0] {
            DescriptorHit::Limited { hit, .. } => hit.key.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key(&[("user", "bot1")]), key(&[("user", "bot2")]));
        assert_eq!(key(&[("path", "/api/a/v1")]), key(&[("path", "/api/b/v1")]));
        assert_ne!(key(&[("ip", "1")]), key(&[("ip", "2")]));
    }

    #[test]
    fn unlimited_replaces_and_shadow() {
        let mut unlimited = limit(1, "second").unwrap();
        unlimited.unlimited = true;
        unlimited.replaces = vec!["zero".into()];
        let mut general = limit(10, "minute").unwrap();
        general.name = Some("general".into());
        let mut special = limit(100, "minute").unwrap();
        special.replaces = vec!["general".into()];
        let mut zero = limit(0, "minute").unwrap();
        zero.name = Some("zero".into());
        let mut quiet = limit(1, "hour").unwrap();
        quiet.shadow = true;
        let domain = DomainBuilder::new("d")
            .build(vec![
                node("blocked", None, limit(0, "second"), vec![]),
                node("vip", None, Some(unlimited), vec![]),
                node("all", None, Some(general), vec![]),
                node("special", None, Some(special), vec![]),
                node("zero", None, Some(zero), vec![]),
                node("q", None, Some(quiet), vec![]),
            ])
            .unwrap();
        assert!(matches!(
            hits(&domain, &[d(&[("vip", "x")])])[0],
            DescriptorHit::Unlimited(_)
        ));
        assert!(matches!(
            hits(&domain, &[d(&[("blocked", "x")])])[0],
            DescriptorHit::Blocked {
                stats: "d.blocked",
                ..
            }
        ));
        let both = hits(&domain, &[d(&[("all", "x")]), d(&[("special", "y")])]);
        assert_eq!(both[0], DescriptorHit::None);
        assert_eq!(rule_of(&both[1]), Some("d.special"));
        assert_eq!(
            rule_of(&hits(&domain, &[d(&[("all", "x")])])[0]),
            Some("d.all")
        );
        // A limit of 0 is replaced like any other, and an unlimited limit replaces too.
        let zero = hits(&domain, &[d(&[("zero", "x")]), d(&[("vip", "y")])]);
        assert_eq!(zero[0], DescriptorHit::None);
        assert!(domain.rules().any(|r| r.name() == "d.q" && r.is_shadow()));
    }

    #[test]
    fn a_limit_sent_with_the_descriptor_applies_and_counts_apart() {
        let domain = DomainBuilder::new("d")
            .build(vec![node("k", Some("v"), limit(5, "minute"), vec![])])
            .unwrap();
        let configured = d(&[("k", "v")]);
        let unknown = d(&[("other", "x")]);
        let sent = |n| LimitOverride {
            requests_per_unit: n,
            unit: "hour",
        };
        let found = domain.hits([
            (&configured, None),
            (&configured, Some(sent(7))),
            (&unknown, Some(sent(7))),
            (&configured, Some(sent(8))),
        ]);
        let DescriptorHit::Limited { hit: own, .. } = &found[0] else {
            panic!("{found:?}")
        };
        let keys: Vec<_> = found[1..]
            .iter()
            .map(|h| match h {
                DescriptorHit::Limited {
                    hit,
                    limit,
                    overridden: true,
                    metric,
                    ..
                } => {
                    assert_eq!(hit.rule, "d.limit_override_hour");
                    assert_eq!(limit.unit.0, "hour");
                    assert!(metric.as_deref().unwrap().starts_with("d."));
                    hit.key.clone()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_ne!(own.key, keys[0]);
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
    }

    fn stats_of(hit: &DescriptorHit<'_>) -> String {
        match hit {
            DescriptorHit::Limited { stats, .. } => stats.to_string(),
            DescriptorHit::Blocked { stats, .. } => stats.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn value_to_metric_names_the_values_where_it_is_set() {
        let valued = |key: &str, value: Option<&str>, children| {
            let mut n = node(key, value, None, children);
            n.value_to_metric = true;
            n
        };
        let mut leaf = node("subject_id", None, limit(60, "minute"), vec![]);
        let route = valued(
            "route",
            None,
            vec![valued("http_method", None, vec![leaf.clone()])],
        );
        leaf.key = "k".into();
        let wild = valued("path", Some("/api/*"), vec![leaf]);
        let mut shared = node("files", Some("f/*"), limit(1, "minute"), vec![]);
        shared.share_threshold = true;
        shared.value_to_metric = true;
        let plain = node("plain", None, limit(1, "minute"), vec![]);
        let domain = DomainBuilder::new("domain")
            .build(vec![route, wild, shared, plain])
            .unwrap();
        let name = |e: &[(&str, &str)]| stats_of(&hits(&domain, &[d(e)])[0]);
        assert_eq!(
            name(&[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]),
            "domain.route_draw.http_method_GET.subject_id"
        );
        assert_eq!(
            name(&[("path", "/api/users"), ("k", "v")]),
            "domain.path_/api/users.k"
        );
        // share_threshold keeps the pattern; nodes without the flag keep their own name.
        assert_eq!(name(&[("files", "f/a")]), "domain.files_f/*");
        assert_eq!(name(&[("plain", "x")]), "domain.plain");
    }

    #[test]
    fn detailed_metrics_name_the_values() {
        let mut n = node("ip", None, limit(1, "second"), vec![]);
        n.detailed_metric = true;
        let domain = DomainBuilder::new("d").build(vec![n]).unwrap();
        match &hits(&domain, &[d(&[("ip", "1.2.3.4")])])[0] {
            DescriptorHit::Limited { metric, .. } => {
                assert_eq!(metric.as_deref(), Some("d.ip_1.2.3.4"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn duplicates_and_empty_keys_are_refused() {
        let twice = vec![
            node("k", Some("v"), None, vec![]),
            node("k", Some("v"), None, vec![]),
        ];
        let err = DomainBuilder::new("d").build(twice).unwrap_err();
        assert_eq!(err, "duplicate descriptor composite key 'd.k_v'");
        let patterns = vec![
            node("k", Some("a*b"), None, vec![]),
            node("k", Some("a*b"), None, vec![]),
        ];
        let err = DomainBuilder::new("d").build(patterns).unwrap_err();
        assert_eq!(err, "duplicate descriptor composite key 'd.k_a*b'");
        let empty = vec![node("", None, None, vec![])];
        assert!(
            DomainBuilder::new("d")
                .build(empty)
                .unwrap_err()
                .contains("empty key")
        );
        assert!(DomainBuilder::new("").build(vec![]).is_err());
    }
}
