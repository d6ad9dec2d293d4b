//! Limits a check states for rules that take them (`caller_limit: true`), as Envoy's
//! descriptor `limit`: a proxy that learns each tenant's plan from its auth states it on
//! every check. Each distinct limit of a rule is a rule of its own, derived from the rule
//! (its algorithm, failure policy and reservations kept), counted apart (as Envoy keys a
//! stated limit's counter by its value) and answering as the rule; it is made at the first
//! check that states it, and kept until the process ends, across reloads.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tollgate::{Item, Rule};

use super::{CheckError, Loaded, Service, overrides};
use crate::config::TierSpec;

/// The most distinct limits kept per rule: each one is a rule, and its name is kept for the
/// life of the process.
pub const MAX_CALLER_LIMITS: usize = 1_000;

/// A stated limit as it is told apart: its tier as JSON (the same text for the same tier).
pub(super) type Stated = String;

/// Every limit stated so far, by rule.
pub(super) type Kept = BTreeSet<(String, Stated)>;

fn stated(tier: &TierSpec) -> Stated {
    serde_json::to_string(tier).unwrap_or_default()
}

/// The name of the rule a limit stated for `rule` is counted under.
fn name_of(rule: &str, tier: &Stated) -> String {
    overrides::derived_name(rule, "l", tier.as_bytes())
}

/// The rule a limit stated for `rule` is counted under.
pub(super) fn derive(rule: &Rule, tier: &Stated) -> Result<Rule, String> {
    let spec: TierSpec = serde_json::from_str(tier)
        .map_err(|e| format!("the limit stated for `{}`: {e}", rule.name()))?;
    let name = name_of(rule.name(), tier);
    overrides::derived(
        rule,
        name,
        std::slice::from_ref(&spec),
        overrides::zone_of(rule),
    )
    .map_err(|e| format!("the limit stated for `{}`: {e}", rule.name()))
}

/// The rules that take a stated limit, and the rule each limit stated so far is counted
/// under.
#[derive(Debug, Default)]
pub(super) struct Index {
    takes: HashSet<&'static str, foldhash::fast::RandomState>,
    /// By rule, then by the stated tier.
    counted: HashMap<&'static str, HashMap<Stated, &'static str>, foldhash::fast::RandomState>,
}

impl Index {
    /// The rule counting `tier` stated for `rule`, if it is made.
    fn counted(&self, rule: &str, tier: &str) -> Option<&'static str> {
        self.counted.get(rule)?.get(tier).copied()
    }
}

impl Index {
    /// The index of the rules that take a stated limit among `rules`, with the rules
    /// `derived` for the limits in `kept`.
    pub(super) fn new<'a>(
        takes: impl Iterator<Item = &'a Rule>,
        kept: &Kept,
        derived: &[Rule],
    ) -> Self {
        let mut index = Self::default();
        for rule in takes {
            index.takes.insert(rule.name());
        }
        let by_name: HashMap<&str, &Rule> = derived.iter().map(|r| (r.name(), r)).collect();
        for (rule, tier) in kept {
            let Some(&base) = index.takes.get(rule.as_str()) else {
                continue;
            };
            if let Some(rule) = by_name.get(name_of(base, tier).as_str()) {
                let of_rule = index.counted.entry(base).or_default();
                of_rule.insert(tier.clone(), rule.name());
            }
        }
        index
    }
}

/// Why `kept` has no room for one more limit of `rule`, if it has none.
fn room(kept: &Kept, rule: &str) -> Result<(), String> {
    let of_rule = kept.iter().filter(|(r, _)| r == rule).count();
    if of_rule >= MAX_CALLER_LIMITS {
        return Err(format!(
            "rule `{rule}` has taken {MAX_CALLER_LIMITS} distinct limits from its callers, the \
             most kept"
        ));
    }
    Ok(())
}

impl Service {
    /// Every limit checks have stated, by rule.
    pub(super) fn caller_limits(&self) -> Kept {
        self.caller_limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `items` ready for the limiter: each one an override applies to counted under its
    /// override (an operator's plan wins over a stated limit), then, with `limit`, each one
    /// of a rule that takes a stated limit counted under that limit. Returns the rules that
    /// count them when a stated limit was new (`loaded` then no longer has them).
    ///
    /// # Errors
    /// [`CheckError::Forbidden`] for a stated limit no rule of the items takes, and
    /// [`CheckError::Invalid`] for one the rule's algorithm cannot take or one past
    /// [`MAX_CALLER_LIMITS`]; nothing is counted.
    pub(super) async fn prepared<'a>(
        &self,
        loaded: &Loaded,
        items: &'a [Item<'a>],
        limit: Option<&TierSpec>,
    ) -> Result<(Option<Arc<Loaded>>, Cow<'a, [Item<'a>]>), CheckError> {
        let Some(limit) = limit else {
            return Ok((None, loaded.overrides.apply(items)));
        };
        let tier = stated(limit);
        let takers: Vec<&'static str> = {
            let mut names: Vec<&'static str> = items
                .iter()
                .filter_map(|i| loaded.caller_limits.takes.get(i.rule).copied())
                .collect();
            names.sort_unstable();
            names.dedup();
            names
        };
        if takers.is_empty() {
            let rules: BTreeSet<&str> = items.iter().map(|i| i.rule).collect();
            return Err(CheckError::Forbidden(match rules.is_empty() {
                true => "a limit was stated, and the request matches no rule".into(),
                false => format!(
                    "a limit was stated, and no rule it matches takes one ({}): a rule takes \
                     one with `caller_limit: true`",
                    rules.into_iter().collect::<Vec<_>>().join(", ")
                ),
            }));
        }
        // An override of the key wins: its items no longer name the rule that takes a limit.
        let items = loaded.overrides.apply(items);
        let missing = takers
            .iter()
            .any(|rule| loaded.caller_limits.counted(rule, &tier).is_none());
        let rebuilt = match missing {
            true => Some(self.keep_caller_limits(&takers, &tier).await?),
            false => None,
        };
        let index = &rebuilt.as_deref().unwrap_or(loaded).caller_limits;
        let items = items
            .iter()
            .map(|item| match index.counted(item.rule, &tier) {
                Some(name) => Item::new(name, item.key, item.cost),
                None => *item,
            })
            .collect();
        Ok((rebuilt, Cow::Owned(items)))
    }

    /// Makes the rules that count `tier` stated for each of `rules`, and applies them.
    async fn keep_caller_limits(
        &self,
        rules: &[&str],
        tier: &str,
    ) -> Result<Arc<Loaded>, CheckError> {
        let _one_at_a_time = self.edits.lock().await;
        let old = self.current.load_full();
        let made = |r: &&str| old.caller_limits.counted(r, tier).is_some();
        if rules.iter().all(made) {
            // Made while this call waited for its turn.
            return Ok(old);
        }
        let mut kept = self
            .caller_limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for rule in rules {
            let key = (rule.to_string(), tier.to_string());
            if kept.contains(&key) {
                continue;
            }
            let base = old.engine.rules().find(|r| r.name() == *rule);
            if let Some(base) = base {
                derive(base, &key.1).map_err(CheckError::Invalid)?;
            }
            room(&kept, rule).map_err(CheckError::Invalid)?;
            kept.insert(key);
        }
        let overlay = self
            .overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let loaded = super::compose(
            old.config.clone(),
            &overlay,
            &self.overrides(),
            &kept,
            &self.store,
        )
        .map_err(CheckError::Invalid)?;
        let loaded = Arc::new(loaded);
        *self.caller_limits.lock().unwrap_or_else(|e| e.into_inner()) = kept;
        self.current.store(loaded.clone());
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_kept_are_bounded_per_rule() {
        let mut kept: Kept = (0..MAX_CALLER_LIMITS as u64 - 1)
            .map(|i| ("tokens".to_string(), format!("{{\"limit\":{}}}", i + 1)))
            .collect();
        assert!(room(&kept, "tokens").is_ok());
        kept.insert(("tokens".to_string(), "{}".to_string()));
        let refused = room(&kept, "tokens").unwrap_err();
        assert!(refused.contains("1000 distinct limits"), "{refused}");
        assert!(room(&kept, "other").is_ok());
    }
}
