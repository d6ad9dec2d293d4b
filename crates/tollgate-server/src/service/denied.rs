//! Keys Redis denied, answered in this process until their `retry_after`: a tenant flooding a
//! strict rule at many times its limit costs Redis one call per `retry_after` instead of one
//! per check.
//!
//! Exactly which checks it answers: those of the same rule (the rule each item is counted
//! under: an override's or a stated limit's has its own name) and the same key, of a cost no
//! smaller than the one denied, before the `retry_after` Redis gave (by this host's clock,
//! from when the answer arrived). The algorithms' `retry_after` is the earliest moment the
//! same check could be admitted if nothing is given back (the algorithm tests check it is
//! never early, and exact), and a larger cost needs at least as long. Not cached: shapers
//! (their denial is a wait the caller may shorten with `max_delay`), concurrency rules (a
//! release frees a slot at any time), rules in shadow mode (they never deny), and decisions a
//! failure policy took. Permits given back before then through another instance (a
//! reservation cancelled or committed below its estimate) are seen here from the cached
//! `retry_after` on at the latest; through this instance, they clear the cache, as resets,
//! reloads and overrides do.
//!
//! Bounded in bytes: when full, expired entries go first, and a denial that still finds no
//! room is not cached (its key asks Redis, as without a cache).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate::{Algorithm, Decision, Decisions, Item, LeakyBucket, Rule, Source};

/// Shards, so that checks of different keys rarely wait for one another.
const SHARDS: usize = 16;

/// What one entry costs beyond its name: the decision, the times, the table's slot and the
/// allocation's header, about.
const ENTRY_OVERHEAD: usize = 128;

/// Denied keys until their `retry_after`, within a byte budget.
#[derive(Debug)]
pub struct DeniedCache {
    shards: [Mutex<Shard>; SHARDS],
    /// Bytes per shard.
    budget: usize,
    /// Entries held, expired ones included until swept: none, and a check looks nothing up.
    held: AtomicUsize,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Vec<u8>, Entry>,
    bytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the denial was answered (µs since the epoch, this host's clock).
    at: u64,
    /// Until when no check of `cost` or more can be admitted (µs).
    until: u64,
    cost: u64,
    decision: Decision,
}

/// Whether `rule`'s denials may be cached.
pub(super) fn caches(rule: &Rule) -> bool {
    !rule.is_shadow()
        && !rule.algorithm().holds_slots()
        && !matches!(
            rule.algorithm(),
            Algorithm::LeakyBucket(LeakyBucket::Shaper)
        )
}

/// An entry's name: the rule, a zero byte, the key.
fn name(rule: &str, key: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(rule.len() + 1 + key.len());
    name.extend_from_slice(rule.as_bytes());
    name.push(0);
    name.extend_from_slice(key);
    name
}

/// Calls `f` with an entry's name, built on the stack when it is short (a check's lookup
/// allocates nothing then).
fn with_name<T>(rule: &str, key: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
    const SHORT: usize = 256;
    let len = rule.len() + 1 + key.len();
    if len > SHORT {
        return f(&name(rule, key));
    }
    let mut buffer = [0u8; SHORT];
    buffer[..rule.len()].copy_from_slice(rule.as_bytes());
    buffer[rule.len() + 1..len].copy_from_slice(key);
    f(&buffer[..len])
}

/// Now, in µs since the epoch, by this host's clock.
pub(super) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl DeniedCache {
    /// A cache of at most `bytes` (each entry's name plus `ENTRY_OVERHEAD`).
    pub fn new(bytes: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            budget: bytes / SHARDS,
            held: AtomicUsize::new(0),
        }
    }

    fn shard(&self, name: &[u8]) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::default().hash_one(name);
        &self.shards[(hash as usize) % SHARDS]
    }

    /// The denials of the items of `items` that are cached at `now` (µs) for their cost, as
    /// seen now; `None` when no item is: the batch must be asked.
    pub(super) fn deny(&self, items: &[Item<'_>], now: u64) -> Option<Decisions> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut denied = Vec::new();
        for item in items {
            let cached = with_name(item.rule, item.key, |name| {
                let shard = self.shard(name).lock().unwrap_or_else(|e| e.into_inner());
                let entry = shard.entries.get(name).copied()?;
                (entry.until > now && item.cost >= entry.cost).then_some(entry)
            });
            if let Some(entry) = cached {
                let elapsed = Duration::from_micros(now.saturating_sub(entry.at));
                denied.push(entry.decision.cached(elapsed));
            }
        }
        (!denied.is_empty()).then(|| denied.into_iter().collect())
    }

    /// Remembers the denials among `decisions` (one per item of `items`) that Redis gave at
    /// `now` (µs), for rules `cached` says may be.
    pub(super) fn remember(
        &self,
        items: &[Item<'_>],
        decisions: &Decisions,
        now: u64,
        cached: impl Fn(&str) -> bool,
    ) {
        for (item, decision) in items.iter().zip(decisions.iter()) {
            if decision.allowed()
                || !matches!(decision.source(), Source::Redis | Source::RedisModule)
                || !cached(item.rule)
            {
                continue;
            }
            let wait = u64::try_from(decision.retry_after().unwrap_or_default().as_micros())
                .unwrap_or(u64::MAX);
            let entry = Entry {
                at: now,
                until: now.saturating_add(wait),
                cost: item.cost,
                decision: *decision,
            };
            self.keep(name(item.rule, item.key), entry, now);
        }
    }

    fn keep(&self, name: Vec<u8>, entry: Entry, now: u64) {
        let cost = name.len() + ENTRY_OVERHEAD;
        let mut shard = self.shard(&name).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = shard.entries.get_mut(&name) {
            *kept = entry;
            return;
        }
        if shard.bytes + cost > self.budget {
            let Shard { entries, bytes } = &mut *shard;
            let before = entries.len();
            entries.retain(|name, e| {
                let keep = e.until > now;
                if !keep {
                    *bytes -= name.len() + ENTRY_OVERHEAD;
                }
                keep
            });
            self.held
                .fetch_sub(before - entries.len(), Ordering::Relaxed);
            if shard.bytes + cost > self.budget {
                return;
            }
        }
        shard.bytes += cost;
        shard.entries.insert(name, entry);
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets every entry: permits were given back, or a key was reset.
    pub(super) fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            self.held.fetch_sub(shard.entries.len(), Ordering::Relaxed);
            shard.entries.clear();
            shard.bytes = 0;
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::{Limiter, ManualClock, Tier};

    /// An entry of a denial that lasts forever.
    fn forever() -> Entry {
        let rule = Rule::new("api", Algorithm::FixedWindow, [Tier::per_second(1)]).unwrap();
        let limiter = Limiter::builder(rule)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        Entry {
            at: 0,
            until: u64::MAX,
            cost: 1,
            decision: denial(&limiter, "k")[0],
        }
    }

    fn denial(limiter: &Limiter<tollgate::MemoryStore, ManualClock>, key: &str) -> Decisions {
        let item = [Item::new("api", key, 1)];
        let mut decisions = None;
        for _ in 0..3 {
            decisions = Some(limiter.check_batch_now(&item).unwrap());
        }
        decisions.unwrap()
    }

    #[test]
    fn denials_the_store_of_this_process_gave_are_not_cached() {
        let rule = Rule::new("api", Algorithm::FixedWindow, [Tier::per_second(2)]).unwrap();
        let limiter = Limiter::builder(rule)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let cache = DeniedCache::new(1 << 20);
        let denied = denial(&limiter, "k");
        // A memory store's denial is not Redis's: not cached.
        let items = [Item::new("api", "k", 1)];
        cache.remember(&items, &denied, 1_000, |_| true);
        assert!(cache.deny(&items, 1_000).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn short_and_long_names_are_found() {
        let cache = DeniedCache::new(1 << 20);
        let long = "k".repeat(1_000);
        for key in ["k", long.as_str()] {
            with_name("api", key.as_bytes(), |n| {
                assert_eq!(n, name("api", key.as_bytes()))
            });
            cache.keep(name("api", key.as_bytes()), forever(), 0);
            let items = [Item::new("api", key, 1), Item::new("api", "other", 1)];
            let denied = cache.deny(&items, 1).expect("the key's denial is cached");
            assert_eq!(denied.len(), 1);
        }
    }

    #[test]
    fn the_cache_is_bounded_in_bytes() {
        let cache = DeniedCache::new(SHARDS * (ENTRY_OVERHEAD + 10));
        let entry = forever();
        for i in 0..1_000 {
            let key = format!("k{i:05}");
            cache.keep(name("api", key.as_bytes()), entry, 0);
        }
        assert!(
            cache.bytes() <= SHARDS * (ENTRY_OVERHEAD + 10),
            "{}",
            cache.bytes()
        );
        cache.clear();
        assert_eq!(cache.bytes(), 0);
        assert_eq!(cache.held.load(Ordering::Relaxed), 0);
    }
}
