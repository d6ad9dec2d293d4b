//! Envoy rate limit descriptors, as the Envoy ratelimit service configures and matches them.
//!
//! A domain holds a tree of nodes; each node matches one entry (`key`, and `value` exactly,
//! as a `prefix*`, or any value when it has none) and may carry a limit. A descriptor (a list
//! of entries) walks the tree entry by entry, at each level preferring an exact value, then
//! the first matching prefix, then a node of the key alone; its limit is the limit of the node
//! its last entry reaches, if every entry found one. Every limited node is one fixed-window
//! [`Rule`], named `domain.key_value.key…` as the Envoy service names its statistics, and the
//! counter key is the descriptor's entries (for a prefix node with `share_threshold`, the
//! prefix instead of the value, so that every value it matches shares one counter).

use std::collections::HashMap;
use std::time::Duration;

use super::{Hit, push_part};
use crate::algorithm::Algorithm;
use crate::rule::{Rule, Tier};

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
    /// The value it matches: exactly, as a prefix when it ends in `*`, any when `None`.
    pub value: Option<String>,
    /// Its limit, if any.
    pub limit: Option<NodeLimit>,
    /// Counted and reported, never denied.
    pub shadow: bool,
    /// Whether metrics name each value this node matched (else the node).
    pub detailed_metric: bool,
    /// For a prefix value: every value it matches shares one counter.
    pub share_threshold: bool,
    /// Nodes for the next entry.
    pub children: Vec<Node>,
}

/// A node's limit.
#[derive(Debug, Clone, PartialEq)]
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

/// What the engine found for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub enum DescriptorHit<'a> {
    /// No node has a limit for it: not limited.
    None,
    /// Its node is `unlimited`.
    Unlimited,
    /// Its node allows 0 requests per unit: always over the limit, counted nowhere.
    Blocked(&'a NodeLimit),
    /// Its node's rule and the counter key, with the limit as configured.
    Limited {
        /// The rule and counter key to check.
        hit: Hit,
        /// The node's limit.
        limit: &'a NodeLimit,
        /// The name to report in metrics when a node asks for detailed metrics (the values
        /// included); otherwise the rule's name is.
        metric: Option<String>,
    },
}

/// A domain: one tree of descriptors, ready to match; see the module documentation.
#[derive(Debug, Clone)]
pub struct Domain {
    name: String,
    top: Level,
    rules: Vec<Rule>,
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
    prefixes: Vec<(String, String, usize)>,
    any: HashMap<String, usize>,
    nodes: Vec<Built>,
}

#[derive(Debug, Clone)]
struct Built {
    limit: Option<NodeLimit>,
    /// The node's rule, when it has a limit that is not `unlimited`.
    rule: Option<&'static str>,
    /// The value's prefix, when the node matches a prefix and shares one counter.
    shared: Option<String>,
    detailed_metric: bool,
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
        Ok(Domain {
            name: self.name,
            top,
            rules,
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
        let fresh = match &node.value {
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_string();
                let seen = level
                    .prefixes
                    .iter()
                    .any(|(k, p, _)| *k == node.key && *p == prefix);
                level.prefixes.push((node.key.clone(), prefix, index));
                !seen
            }
            Some(v) => level
                .exact
                .entry(node.key.clone())
                .or_default()
                .insert(v.clone(), index)
                .is_none(),
            None => level.any.insert(node.key.clone(), index).is_none(),
        };
        if !fresh {
            return Err(format!("duplicate descriptor composite key '{here}'"));
        }
        let rule = match &node.limit {
            Some(limit) if !limit.unlimited && limit.requests_per_unit > 0 => {
                let rule = Rule::new(
                    rule_name(&here),
                    Algorithm::FixedWindow,
                    [Tier::new(limit.requests_per_unit, limit.unit.1)],
                )
                .map_err(|e| format!("{here}: {e}"))?
                .shadow(node.shadow);
                let name = rule.name();
                rules.push(rule);
                Some(name)
            }
            _ => None,
        };
        let shared = match &node.value {
            Some(v) if node.share_threshold && v.ends_with('*') => {
                Some(v.trim_end_matches('*').to_string())
            }
            _ => None,
        };
        let children = build_level(&here, node.children, rules)?;
        level.nodes.push(Built {
            limit: node.limit,
            rule,
            shared,
            detailed_metric: node.detailed_metric,
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
                self.prefixes
                    .iter()
                    .find(|(k, p, _)| *k == entry.key && entry.value.starts_with(p.as_str()))
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

    /// The rules of its limited nodes.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter()
    }

    /// What each of `descriptors` hits, in order, with limits that another applying limit
    /// `replaces` taken out (answered as not limited).
    pub fn hits<'d>(
        &self,
        descriptors: impl IntoIterator<Item = &'d Descriptor>,
    ) -> Vec<DescriptorHit<'_>> {
        let mut hits: Vec<DescriptorHit<'_>> =
            descriptors.into_iter().map(|d| self.hit(d)).collect();
        let replaced: Vec<&str> = hits
            .iter()
            .filter_map(|h| match h {
                DescriptorHit::Limited { limit, .. } => Some(limit.replaces.iter()),
                _ => None,
            })
            .flatten()
            .map(String::as_str)
            .collect();
        if !replaced.is_empty() {
            for hit in &mut hits {
                if let DescriptorHit::Limited { limit, .. } = hit
                    && limit.name.as_deref().is_some_and(|n| replaced.contains(&n))
                {
                    *hit = DescriptorHit::None;
                }
            }
        }
        hits
    }

    fn hit(&self, descriptor: &Descriptor) -> DescriptorHit<'_> {
        let mut level = &self.top;
        let mut key = Vec::new();
        let mut detailed = false;
        for (i, entry) in descriptor.iter().enumerate() {
            let Some(node) = level.find(entry) else {
                return DescriptorHit::None;
            };
            push_part(&mut key, entry.key.as_bytes());
            push_part(&mut key, node.value(entry).as_bytes());
            detailed |= node.detailed_metric;
            if i + 1 == descriptor.len() {
                return match (&node.limit, node.rule) {
                    (Some(limit), _) if limit.unlimited => DescriptorHit::Unlimited,
                    (Some(limit), None) => DescriptorHit::Blocked(limit),
                    (Some(limit), Some(rule)) => DescriptorHit::Limited {
                        hit: Hit { rule, key },
                        limit,
                        metric: detailed.then(|| self.metric(descriptor)),
                    },
                    _ => DescriptorHit::None,
                };
            }
            level = &node.children;
        }
        DescriptorHit::None
    }

    /// The detailed metric name of a descriptor that reached a limit: the domain and each
    /// entry's key and value (a shared prefix's instead of the value), as Envoy names them.
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
            unlimited: false,
            name: None,
            replaces: Vec::new(),
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

    fn rule_of(hit: &DescriptorHit<'_>) -> Option<&'static str> {
        match hit {
            DescriptorHit::Limited { hit, .. } => Some(hit.rule),
            _ => None,
        }
    }

    #[test]
    fn exact_then_prefix_then_any_and_only_the_last_entry_limits() {
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
        let hits = domain.hits(&[
            d(&[("to_cluster", "a")]),
            d(&[("to_cluster", "abc")]),
            d(&[("to_cluster", "zzz")]),
            d(&[("remote_address", "1.2.3.4")]),
            d(&[("remote_address", "1.2.3.4"), ("path", "/x")]),
            d(&[("remote_address", "1.2.3.4"), ("path", "/y")]),
            d(&[("nothing", "x")]),
        ]);
        let rules: Vec<_> = hits.iter().map(rule_of).collect();
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
        assert_eq!(domain.rules().count(), 4);
    }

    #[test]
    fn values_count_apart_unless_the_prefix_shares_one_counter() {
        let mut shared = node("user", Some("bot*"), limit(1, "second"), vec![]);
        shared.share_threshold = true;
        let domain = DomainBuilder::new("d")
            .build(vec![shared, node("ip", None, limit(1, "second"), vec![])])
            .unwrap();
        let key = |e: &[(&str, &str)]| match &domain.hits(&[d(e)])[0] {
            DescriptorHit::Limited { hit, .. } => hit.key.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key(&[("user", "bot1")]), key(&[("user", "bot2")]));
        assert_ne!(key(&[("ip", "1")]), key(&[("ip", "2")]));
    }

    #[test]
    fn unlimited_replaces_and_shadow() {
        let mut unlimited = limit(1, "second").unwrap();
        unlimited.unlimited = true;
        let mut general = limit(10, "minute").unwrap();
        general.name = Some("general".into());
        let mut special = limit(100, "minute").unwrap();
        special.replaces = vec!["general".into()];
        let mut quiet = node("q", None, limit(1, "hour"), vec![]);
        quiet.shadow = true;
        let domain = DomainBuilder::new("d")
            .build(vec![
                node("blocked", None, limit(0, "second"), vec![]),
                node("vip", None, Some(unlimited), vec![]),
                node("all", None, Some(general), vec![]),
                node("special", None, Some(special), vec![]),
                quiet,
            ])
            .unwrap();
        assert_eq!(
            domain.hits(&[d(&[("vip", "x")])])[0],
            DescriptorHit::Unlimited
        );
        let both = domain.hits(&[d(&[("all", "x")]), d(&[("special", "y")])]);
        assert_eq!(both[0], DescriptorHit::None);
        assert_eq!(rule_of(&both[1]), Some("d.special"));
        assert_eq!(
            rule_of(&domain.hits(&[d(&[("all", "x")])])[0]),
            Some("d.all")
        );
        assert!(domain.rules().any(|r| r.name() == "d.q" && r.is_shadow()));
    }

    #[test]
    fn detailed_metrics_name_the_values() {
        let mut n = node("ip", None, limit(1, "second"), vec![]);
        n.detailed_metric = true;
        let domain = DomainBuilder::new("d").build(vec![n]).unwrap();
        match &domain.hits(&[d(&[("ip", "1.2.3.4")])])[0] {
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
