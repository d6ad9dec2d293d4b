//! Overrides applied: each one a rule of its own, derived from its rule with its tiers (the
//! counter kept apart from the rule's: the derived rule's name is the rule's with `/o:` and a
//! hash of the key or pattern, so an edit of an override's tiers keeps its keys' counts; its
//! decisions, metrics and headers name the rule it overrides), and
//! an index from a rule and a key to the override that applies, looked up on every check of a
//! rule that has any: an exact key first, then the most specific pattern.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use tollgate::{Item, Rule, Tier};

use super::{EditError, Service};
use crate::config::{MAX_OVERRIDES, MAX_PATTERNS, OverrideSpec, Overrides};

/// The rule an override of `rule` for `key` is counted under.
pub(super) fn derive(rule: &Rule, key: &str, spec: &OverrideSpec) -> Result<Rule, String> {
    if spec.tiers.is_empty() {
        return Err(format!(
            "an override of `{}` needs at least one tier",
            rule.name()
        ));
    }
    let name = derived_name(rule.name(), "o", key.as_bytes());
    derived(rule, name, &spec.tiers, zone_of(rule))
        .map_err(|e| format!("the override of `{}` for `{key}`: {e}", rule.name()))
}

/// `rule` with `tiers` in place of its own (its algorithm, failure policy, reservations and
/// shadow mode kept), counted under `name` and answering as `rule`.
pub(super) fn derived(
    rule: &Rule,
    name: String,
    tiers: &[crate::config::TierSpec],
    time_zone: Option<&str>,
) -> Result<Rule, String> {
    let tiers = tiers
        .iter()
        .enumerate()
        .map(|(i, t)| t.tier(time_zone).map_err(|e| format!("tiers[{i}].{e}")))
        .collect::<Result<Vec<Tier>, String>>()?;
    let derived = Rule::new(name, rule.algorithm().clone(), tiers)
        .and_then(|r| r.on_failure(rule.failure_policy()))
        .and_then(|r| r.reservations(rule.reservation_policy()))
        .map_err(|e| format!("{}: {}", e.field, e.reason))?;
    Ok(derived.shadow(rule.is_shadow()).reported_as(rule.name()))
}

/// The time zone of `rule`'s calendar periods, if it has one: a derived rule's calendar
/// periods are in it unless they name their own.
pub(super) fn zone_of(rule: &Rule) -> Option<&str> {
    rule.tiers()
        .iter()
        .find_map(|t| t.calendar_period())
        .map(tollgate::Calendar::zone)
}

/// `rule`'s name, `/`, `kind`, `:` and a hash of `what` (FNV-1a, the same in every process).
pub(super) fn derived_name(rule: &str, kind: &str, what: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in what {
        hash = (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{rule}/{kind}:{hash:016x}")
}

/// Which override applies to a rule's key: exact keys, then patterns, the most specific
/// (the most literal characters) first.
#[derive(Debug, Default)]
pub(super) struct Index {
    by_rule: HashMap<&'static str, RuleIndex, foldhash::fast::RandomState>,
}

#[derive(Debug, Default)]
struct RuleIndex {
    exact: HashMap<String, (&'static str, Option<u64>)>,
    patterns: Vec<(Vec<String>, &'static str, Option<u64>)>,
}

impl Index {
    /// The index of `overrides` whose rules are among `rules`, each counted under the
    /// derived rule named in `derived`.
    pub(super) fn new<'a>(
        overrides: &Overrides,
        rules: impl Iterator<Item = &'a Rule>,
        derived: &[Rule],
    ) -> Self {
        let mut index = Self::default();
        let rules: HashMap<&str, &Rule> = rules.map(|r| (r.name(), r)).collect();
        for ((rule, key), spec) in overrides {
            let Some(base) = rules.get(rule.as_str()) else {
                continue;
            };
            let name = derived_name(base.name(), "o", key.as_bytes());
            let Some(counted) = derived.iter().find(|d| d.name() == name) else {
                continue;
            };
            let entry = index.by_rule.entry(base.name()).or_default();
            if key.contains('*') {
                let parts = key.split('*').map(str::to_string).collect();
                entry
                    .patterns
                    .push((parts, counted.name(), spec.expires_at));
            } else {
                entry
                    .exact
                    .insert(key.clone(), (counted.name(), spec.expires_at));
            }
        }
        for entry in index.by_rule.values_mut() {
            entry.patterns.sort_by_key(|(parts, _, _)| {
                std::cmp::Reverse(parts.iter().map(String::len).sum::<usize>())
            });
        }
        index
    }

    /// `items` with each one an override applies to counted under its override's rule:
    /// borrowed as they are when none applies.
    pub(super) fn apply<'a>(&self, items: &'a [Item<'a>]) -> Cow<'a, [Item<'a>]> {
        if self.by_rule.is_empty() {
            return Cow::Borrowed(items);
        }
        let mut out: Option<Vec<Item<'a>>> = None;
        let now = now_seconds();
        for (i, item) in items.iter().enumerate() {
            let Some(index) = self.by_rule.get(item.rule) else {
                continue;
            };
            let readable = crate::console::readable(item.key);
            let live = |expires: &Option<u64>| expires.is_none_or(|at| at > now);
            let found = match index.exact.get(&readable) {
                Some((name, expires)) if live(expires) => Some(*name),
                _ => index
                    .patterns
                    .iter()
                    .find(|(parts, _, expires)| live(expires) && matches(parts, &readable))
                    .map(|(_, name, _)| *name),
            };
            if let Some(name) = found {
                let out = out.get_or_insert_with(|| items.to_vec());
                out[i] = Item::new(name, item.key, item.cost);
            }
        }
        match out {
            Some(items) => Cow::Owned(items),
            None => Cow::Borrowed(items),
        }
    }
}

/// Whether `text` matches the pattern split at its `*`s into `parts`.
fn matches(parts: &[String], text: &str) -> bool {
    let (first, rest) = match parts {
        [] => return text.is_empty(),
        [first, rest @ ..] => (first, rest),
    };
    let Some(mut left) = text.strip_prefix(first.as_str()) else {
        return false;
    };
    for (i, part) in rest.iter().enumerate() {
        if i == rest.len() - 1 {
            return left.ends_with(part.as_str());
        }
        match left.find(part.as_str()) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.is_empty()
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Service {
    /// Every override in force.
    pub fn overrides(&self) -> Overrides {
        let now = now_seconds();
        let kept = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .filter(|(_, spec)| !spec.expired(now))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Sets (`Some`) or deletes (`None`) the override of `rule` for `key`, `expires` from now
    /// if given: kept in Redis for every instance on a Redis store, in
    /// `server.overrides_file` on the memory store. Returns whether one was there.
    ///
    /// # Errors
    /// [`EditError::Invalid`] for an unknown rule or tiers its algorithm cannot take,
    /// [`EditError::Unavailable`] when Redis or the file did not take it; nothing changes.
    pub async fn set_override(
        &self,
        rule: &str,
        key: &str,
        spec: Option<(Vec<crate::config::TierSpec>, Option<Duration>)>,
    ) -> Result<bool, EditError> {
        let _one_at_a_time = self.edits.lock().await;
        let old = self.current.load_full();
        let Some(base) = old.engine.routes().iter().find(|r| r.rule.name() == rule) else {
            return Err(EditError::Invalid(format!(
                "no native rule `{rule}`: overrides apply to the rules of native files and of \
                 the admin API"
            )));
        };
        if key.is_empty() {
            return Err(EditError::Invalid("the key is empty".into()));
        }
        let spec = spec.map(|(tiers, expires)| OverrideSpec {
            tiers,
            // In whole seconds, rounded up: an override lasts at least as long as asked.
            expires_at: expires.map(|e| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                (now + e).as_millis().div_ceil(1_000) as u64
            }),
        });
        if let Some(spec) = &spec {
            derive(&base.rule, key, spec).map_err(EditError::Invalid)?;
        }
        let mut candidate = self.overrides();
        let existed = candidate.contains_key(&(rule.to_string(), key.to_string()));
        if spec.is_some() && !existed {
            full(&candidate, rule, key).map_err(EditError::Invalid)?;
        }
        match &spec {
            Some(spec) => candidate.insert((rule.to_string(), key.to_string()), spec.clone()),
            None => candidate.remove(&(rule.to_string(), key.to_string())),
        };
        let overlay = self
            .overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let loaded = super::compose(
            old.config.clone(),
            &overlay,
            &candidate,
            &self.caller_limits(),
            &self.store,
        )
        .map_err(EditError::Invalid)?;
        if let Some(shared) = &self.shared {
            let version = shared
                .write_override(rule, key, spec.as_ref())
                .await
                .map_err(|e| EditError::Unavailable(e.to_string()))?;
            self.shared_version
                .store(version, std::sync::atomic::Ordering::Relaxed);
        } else if let Some(file) = &old.config.server.overrides_file {
            write_file(file, &candidate).map_err(|e| {
                EditError::Unavailable(format!(
                    "cannot keep the overrides in {}: {e}",
                    file.display()
                ))
            })?;
        }
        *self.overrides.lock().unwrap_or_else(|e| e.into_inner()) = candidate;
        self.current.store(std::sync::Arc::new(loaded));
        Ok(existed)
    }
}

/// Why `overrides` cannot take one more of `rule` for `key`, if they cannot.
fn full(overrides: &Overrides, rule: &str, key: &str) -> Result<(), String> {
    if overrides.len() >= MAX_OVERRIDES {
        return Err(format!(
            "already {MAX_OVERRIDES} overrides, the most kept: delete some, or give a pattern"
        ));
    }
    let patterns = overrides
        .keys()
        .filter(|(r, k)| r == rule && k.contains('*'))
        .count();
    if key.contains('*') && patterns >= MAX_PATTERNS {
        return Err(format!(
            "already {MAX_PATTERNS} patterns of `{rule}`, the most kept"
        ));
    }
    Ok(())
}

/// The overrides kept in `file`, none when it does not exist yet.
///
/// # Errors
/// A file that cannot be read, or is not a list of overrides.
pub(super) fn read_file(file: &std::path::Path) -> anyhow::Result<Overrides> {
    match std::fs::read(file) {
        Ok(bytes) => Ok(crate::config::from_entries(
            serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: not a list of overrides: {e}", file.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Overrides::new()),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", file.display())),
    }
}

/// Writes `overrides` to `file` whole: a file beside it, then renamed over it, so that a crash
/// never leaves half a file.
fn write_file(file: &std::path::Path, overrides: &Overrides) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(&crate::config::entries(overrides))?;
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, json)?;
    std::fs::rename(&partial, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_globs() {
        let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(matches(&parts("acme-*"), "acme-eu"));
        assert!(!matches(&parts("acme-*"), "acm"));
        assert!(matches(&parts("*"), "anything"));
        assert!(matches(&parts("a*c*e"), "abcde"));
        assert!(!matches(&parts("a*c*e"), "abcdef"));
        assert!(matches(&parts("*-eu"), "acme-eu"));
        assert!(matches(&parts("acme"), "acme"));
    }

    #[test]
    fn the_overrides_kept_are_bounded() {
        let spec = OverrideSpec {
            tiers: Vec::new(),
            expires_at: None,
        };
        let mut overrides: Overrides = (0..MAX_PATTERNS)
            .map(|i| (("plan".to_string(), format!("t{i}-*")), spec.clone()))
            .collect();
        assert!(
            full(&overrides, "plan", "more-*")
                .unwrap_err()
                .contains("patterns")
        );
        assert!(full(&overrides, "plan", "exact").is_ok());
        assert!(full(&overrides, "other", "more-*").is_ok());
        overrides.extend(
            (0..MAX_OVERRIDES).map(|i| (("other".to_string(), format!("k{i}")), spec.clone())),
        );
        assert!(
            full(&overrides, "plan", "exact")
                .unwrap_err()
                .contains("delete some")
        );
    }
}
