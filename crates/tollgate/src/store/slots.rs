//! Rule slots: each rule layout (name and [fingerprint](Rule::fingerprint)) that a store keeps
//! keys of gets a `u32` slot, which with the key's bytes names an entry of the table. The
//! versions of a layout planned (limits edited by a hot reload) are kept, to read state
//! written under an earlier one.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard};

use crate::error::{Error, RuleError};
use crate::rule::Rule;

/// Versions of one rule layout kept to adopt state written under an earlier one.
const VERSIONS: usize = 8;

/// The slots of one store. Planning writes; checks that insert or evict read.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    inner: RwLock<Versions>,
}

#[derive(Debug, Default)]
pub(crate) struct Versions {
    /// Per slot, the versions planned (newest last).
    versions: Vec<Vec<Rule>>,
    slots: HashMap<(&'static str, u32), u32>,
}

impl Versions {
    /// The newest version of `slot`.
    pub(crate) fn newest(&self, slot: u32) -> Option<&Rule> {
        self.versions.get(slot as usize)?.last()
    }

    /// The newest version of `slot` whose state has `words` words.
    pub(crate) fn version(&self, slot: u32, words: usize) -> Option<&Rule> {
        let versions = self.versions.get(slot as usize)?;
        versions.iter().rev().find(|r| r.words() == words)
    }
}

impl Slots {
    /// The slot of `rule`'s layout, made if new; `rule` becomes its newest version.
    pub(crate) fn slot(&self, rule: &Rule) -> Result<u32, Error> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let layout = (rule.name(), rule.fingerprint());
        let slot = match inner.slots.get(&layout) {
            Some(&slot) => slot,
            None => {
                let slot = u32::try_from(inner.versions.len()).map_err(|_| {
                    Error::from(RuleError {
                        rule: rule.name().into(),
                        field: "name".into(),
                        reason: "the store holds 2^32 rule layouts already".into(),
                    })
                })?;
                inner.versions.push(Vec::new());
                inner.slots.insert(layout, slot);
                slot
            }
        };
        let versions = &mut inner.versions[slot as usize];
        if versions.last().is_none_or(|v| v.tiers() != rule.tiers()) {
            if versions.len() == VERSIONS {
                versions.remove(0);
            }
            versions.push(rule.clone());
        }
        Ok(slot)
    }

    /// Every slot's versions, for reading under a shard lock.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Versions> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
}
