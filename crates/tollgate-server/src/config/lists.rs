//! Allow and deny lists of keys: an entry names a list, a rule (or `*`, every rule) and a key
//! as the console shows it, and lasts until it expires or is deleted. Set through the admin
//! API (`/v1/lists`) and the console, and by bans (a rule's `ban`); kept in Redis for a Redis
//! store (every instance applies an edit within a second) or in `server.lists_file` for the
//! memory store.

use serde::{Deserialize, Serialize};

/// Which list an entry is on.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ListKind {
    /// Checked before the rules: the key bypasses the rule.
    Allow,
    /// Checked before the rules: the key is refused, nothing counted.
    Deny,
}

impl ListKind {
    /// As paths and metrics write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// One entry of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListEntry {
    /// The list.
    pub list: ListKind,
    /// The rule's id, or `*`: every rule.
    #[schema(example = "get-product")]
    pub rule: String,
    /// The key, as the rule engine builds it and the console shows it.
    #[schema(example = "acme")]
    pub key: String,
    /// When it ends, in milliseconds since the epoch; none: until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Deny entries: the status a refused check answers with, 429 (the default) or 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why, in words (shown in the console); `ban` for a rule's ban.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ListEntry {
    /// Whether it has ended at `now_ms` (milliseconds since the epoch).
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// The most entries kept, in all lists together: every check of a listed rule looks a key up
/// among them, and each instance keeps them all.
pub const MAX_LIST_ENTRIES: usize = 100_000;
