//! A tenant's plan set at run time: a rule's tiers for one key, or for the keys a pattern
//! matches, in place of the rule's own, until they expire. Set through the admin API
//! (`/v1/overrides`), kept in Redis for a Redis store (every instance applies them within a
//! second) or in `server.overrides_file` for the memory store, so that they outlive reloads
//! and restarts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::native::TierSpec;

/// One override: the tiers of a rule for the keys it names, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideSpec {
    /// The rule's tiers for these keys, in place of its own: every tier must admit. Counted
    /// apart from the rule's own counter, as Envoy counts a descriptor's own limit apart.
    pub tiers: Vec<TierSpec>,
    /// When it ends, in seconds since the epoch; none: until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl OverrideSpec {
    /// Whether it has ended at `now` (seconds since the epoch).
    pub fn expired(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// The most overrides kept, in all: each one in force costs its rule and an index entry
/// (about 300 bytes), and each distinct plan's name is kept for the life of the process.
pub const MAX_OVERRIDES: usize = 100_000;

/// The most patterns per rule: a check of a rule's key that no exact override names tries
/// its patterns in turn.
pub const MAX_PATTERNS: usize = 1_000;

/// Every override, by rule and key (or pattern: `*` matches any run of characters).
pub type Overrides = BTreeMap<(String, String), OverrideSpec>;

/// One override as a list holds it: in files, in Redis, in the admin API's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideEntry {
    /// The rule's id.
    pub rule: String,
    /// The key (as the console shows it: a key of one part is that part; parts are joined by
    /// ` · `), or a pattern of keys (`acme-*`; `*` alone: every key).
    pub key: String,
    /// The rule's tiers for these keys, in place of its own: every tier must admit.
    pub tiers: Vec<TierSpec>,
    /// When it ends, in seconds since the epoch; none: until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl OverrideEntry {
    /// The override of `rule` for `key`.
    pub fn new(rule: String, key: String, spec: OverrideSpec) -> Self {
        Self {
            rule,
            key,
            tiers: spec.tiers,
            expires_at: spec.expires_at,
        }
    }
}

/// `overrides` as a list, in order.
pub fn entries(overrides: &Overrides) -> Vec<OverrideEntry> {
    overrides
        .iter()
        .map(|((rule, key), spec)| OverrideEntry::new(rule.clone(), key.clone(), spec.clone()))
        .collect()
}

/// A list of entries as overrides.
pub fn from_entries(entries: Vec<OverrideEntry>) -> Overrides {
    entries
        .into_iter()
        .map(|e| {
            let spec = OverrideSpec {
                tiers: e.tiers,
                expires_at: e.expires_at,
            };
            ((e.rule, e.key), spec)
        })
        .collect()
}
