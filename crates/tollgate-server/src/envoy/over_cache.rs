//! The Envoy service's local cache of descriptors over their limit
//! (`LOCAL_CACHE_SIZE_IN_BYTES`): once a descriptor's window is over its limit, the rest of
//! that window is answered over the limit in this process, without asking the store or
//! counting there, so a flood against one limit stops costing Redis a call per request.
//!
//! Entries end with their window (windows aligned to the epoch, by this host's clock); the
//! cache never holds more than its bytes: when full, expired entries go first, and a new
//! entry that still finds no room is not kept (that descriptor asks the store, as without
//! a cache).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Shards, so that checks of different descriptors rarely wait for one another.
const SHARDS: usize = 16;

/// What one entry costs beyond its name: the expiry, the table's slot and the allocation's
/// header, about.
const ENTRY_OVERHEAD: usize = 64;

/// Descriptors over their limit until their window ends, within a byte budget.
#[derive(Debug)]
pub struct OverCache {
    shards: [Mutex<Shard>; SHARDS],
    /// Bytes per shard.
    budget: usize,
}

#[derive(Debug, Default)]
struct Shard {
    /// Name (rule, key, window) to when the window ends (µs since the epoch).
    entries: HashMap<Vec<u8>, u64>,
    bytes: usize,
}

impl OverCache {
    /// A cache of at most `bytes` (counting each entry's name and
    /// `ENTRY_OVERHEAD`).
    pub fn new(bytes: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            budget: bytes / SHARDS,
        }
    }

    /// Whether `key` of `rule` is known to be over its limit in the window of `period`
    /// that holds `now` (µs since the epoch).
    pub fn over(&self, rule: &str, key: &[u8], period: Duration, now: u64) -> bool {
        let (name, _) = entry(rule, key, period, now);
        let shard = self.shard(&name).lock().unwrap_or_else(|e| e.into_inner());
        shard.entries.get(&name).is_some_and(|&end| end > now)
    }

    /// Remembers that `key` of `rule` is over its limit for the rest of the window of
    /// `period` that holds `now`.
    pub fn remember(&self, rule: &str, key: &[u8], period: Duration, now: u64) {
        let (name, end) = entry(rule, key, period, now);
        let cost = name.len() + ENTRY_OVERHEAD;
        let mut shard = self.shard(&name).lock().unwrap_or_else(|e| e.into_inner());
        if shard.entries.contains_key(&name) {
            return;
        }
        if shard.bytes + cost > self.budget {
            let Shard { entries, bytes } = &mut *shard;
            entries.retain(|name, end| {
                let keep = *end > now;
                if !keep {
                    *bytes -= name.len() + ENTRY_OVERHEAD;
                }
                keep
            });
            if shard.bytes + cost > self.budget {
                return;
            }
        }
        shard.bytes += cost;
        shard.entries.insert(name, end);
    }

    /// Forgets that `key` of `rule` is over its limit in the window of `period` that holds
    /// `now`: hits were given back.
    pub fn forget(&self, rule: &str, key: &[u8], period: Duration, now: u64) {
        let (name, _) = entry(rule, key, period, now);
        let mut shard = self.shard(&name).lock().unwrap_or_else(|e| e.into_inner());
        if shard.entries.remove(&name).is_some() {
            shard.bytes -= name.len() + ENTRY_OVERHEAD;
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).bytes)
            .sum()
    }

    fn shard(&self, name: &[u8]) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::default().hash_one(name);
        &self.shards[(hash as usize) % SHARDS]
    }
}

/// An entry's name (the rule, the key and the window's index) and when its window ends.
fn entry(rule: &str, key: &[u8], period: Duration, now: u64) -> (Vec<u8>, u64) {
    let period = u64::try_from(period.as_micros()).unwrap_or(u64::MAX).max(1);
    let window = now / period;
    let mut name = Vec::with_capacity(rule.len() + key.len() + 9);
    name.extend_from_slice(rule.as_bytes());
    name.push(0);
    name.extend_from_slice(&window.to_le_bytes());
    name.extend_from_slice(key);
    (name, (window + 1).saturating_mul(period))
}

/// Now, in µs since the epoch, by this host's clock.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn an_entry_lasts_until_its_window_ends() {
        let cache = OverCache::new(1 << 20);
        let start = 1_700_006_400_000_000; // a whole minute
        cache.remember("shop.cart", b"k", MINUTE, start + 10_000_000);
        assert!(cache.over("shop.cart", b"k", MINUTE, start + 59_999_999));
        assert!(!cache.over("shop.cart", b"k", MINUTE, start + 60_000_000));
        assert!(!cache.over("shop.cart", b"other", MINUTE, start + 20_000_000));
        assert!(!cache.over("shop.other", b"k", MINUTE, start + 20_000_000));
    }

    #[test]
    fn it_never_holds_more_than_its_bytes() {
        let budget = 64 * 1024;
        let cache = OverCache::new(budget);
        let now = 1_700_006_400_000_000;
        for i in 0..100_000u64 {
            cache.remember("r", &i.to_le_bytes(), MINUTE, now);
        }
        assert!(cache.bytes() <= budget, "{} bytes", cache.bytes());
        assert!(
            cache.bytes() > budget / 2,
            "it keeps what fits: {}",
            cache.bytes()
        );
        // A minute on, the old window's entries make room for the new window's.
        let later = now + 60_000_000;
        cache.remember("r", b"new", MINUTE, later);
        assert!(cache.over("r", b"new", MINUTE, later));
    }
}
