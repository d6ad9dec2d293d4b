//! Rule tags: each rule layout (name and [fingerprint](Rule::fingerprint)) that a store keeps
//! keys of gets a `u32` tag, which with the key's bytes names an entry of the table. The
//! versions of a layout planned (limits edited by a hot reload) are kept, to read state
//! written under an earlier one.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard};

use crate::error::{Error, RuleError};
use crate::rule::Rule;

/// Versions of one rule layout kept to adopt state written under an earlier one.
const VERSIONS: usize = 8;

/// The tags of one store. Planning writes; checks that insert or evict read.
#[derive(Debug, Default)]
pub(crate) struct Tags {
    inner: RwLock<Versions>,
}

#[derive(Debug, Default)]
pub(crate) struct Versions {
    /// Per tag, the versions planned (newest last).
    versions: Vec<Vec<Rule>>,
    tags: HashMap<(&'static str, u32), u32>,
}

impl Versions {
    /// The newest version of `tag`.
    pub(crate) fn newest(&self, tag: u32) -> Option<&Rule> {
        self.versions.get(tag as usize)?.last()
    }

    /// The newest version of `tag` whose state has `words` words.
    pub(crate) fn version(&self, tag: u32, words: usize) -> Option<&Rule> {
        let versions = self.versions.get(tag as usize)?;
        versions.iter().rev().find(|r| r.words() == words)
    }
}

impl Tags {
    /// The tag of `rule`'s layout, made if new; `rule` becomes its newest version.
    pub(crate) fn tag(&self, rule: &Rule) -> Result<u32, Error> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let layout = (rule.name(), rule.fingerprint());
        let tag = match inner.tags.get(&layout) {
            Some(&tag) => tag,
            None => {
                let tag = u32::try_from(inner.versions.len()).map_err(|_| {
                    Error::from(RuleError {
                        rule: rule.name().into(),
                        field: "name".into(),
                        reason: "the store holds 2^32 rule layouts already".into(),
                    })
                })?;
                inner.versions.push(Vec::new());
                inner.tags.insert(layout, tag);
                tag
            }
        };
        let versions = &mut inner.versions[tag as usize];
        if versions.last().is_none_or(|v| v.tiers() != rule.tiers()) {
            if versions.len() == VERSIONS {
                versions.remove(0);
            }
            versions.push(rule.clone());
        }
        Ok(tag)
    }

    /// Every tag's versions, for reading under a shard lock.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Versions> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
}
