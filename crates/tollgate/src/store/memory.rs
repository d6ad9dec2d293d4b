//! The in-memory store: the state words of every key of one rule, in a sharded hash table.
//!
//! A check hashes the key once, locks one shard (of many; never a global lock), finds or
//! creates the key's words and runs the rule over them. A key is inserted only when its state
//! is no longer all zeros, so looks and denials of unknown keys allocate nothing.
//!
//! Memory is bounded: each shard holds at most `max_keys / shards` keys. When a new key finds
//! its shard full, keys whose state has become equivalent to "never seen" are dropped first,
//! then the ones closest to that point (forgetting them changes the least). A shard also drops
//! idle keys every `sweep_interval` when new keys arrive; no background thread.
//!
//! Keys up to 22 bytes and states up to 4 words live inside the table itself: a 16-byte key
//! with one GCRA word takes 32 bytes plus the table's control byte and load-factor slack.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use super::lock::ShardLock;
use crate::algorithm::{Attempt, Decide, Visit};
use crate::decision::Decision;
use crate::rule::Rule;

/// Settings of a memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryConfig {
    /// The most keys held, spread evenly over the shards.
    pub(crate) max_keys: usize,
    /// Shards (rounded up to a power of two); more shards, less contention between keys.
    pub(crate) shards: usize,
    /// How often a shard drops idle keys, at most.
    pub(crate) sweep_interval: Duration,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self {
            max_keys: 1_000_000,
            shards: (threads * 8).clamp(16, 1_024),
            sweep_interval: Duration::from_secs(1),
        }
    }
}

const INLINE_KEY: usize = 22;

/// A key's bytes, inline when short so most entries need no allocation of their own.
#[derive(Clone)]
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<KeyBytes>() == 24);

impl KeyBytes {
    #[inline]
    fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Self::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(key.into())
        }
    }

    /// Whether this is `key`. Compared in place with fixed-size reads: this runs on every
    /// check.
    #[inline(always)]
    fn is(&self, key: &[u8]) -> bool {
        fn ends<const N: usize>(stored: &[u8; INLINE_KEY], key: &[u8]) -> bool {
            let len = key.len();
            stored[..N] == key[..N] && stored[len - N..len] == key[len - N..]
        }
        match self {
            Self::Inline { len, bytes } if usize::from(*len) == key.len() => match key.len() {
                16.. => ends::<16>(bytes, key),
                8.. => ends::<8>(bytes, key),
                4.. => ends::<4>(bytes, key),
                len => bytes[..len] == *key,
            },
            Self::Inline { .. } => false,
            Self::Heap(bytes) => **bytes == *key,
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

/// Storage for one key's state words: inline arrays for small states, a box otherwise.
trait Words: AsRef<[u64]> + AsMut<[u64]> + Send + 'static {
    fn zeroed(len: usize) -> Self;
}

impl<const N: usize> Words for [u64; N] {
    fn zeroed(_len: usize) -> Self {
        [0; N]
    }
}

impl Words for Box<[u64]> {
    fn zeroed(len: usize) -> Self {
        vec![0; len].into_boxed_slice()
    }
}

struct Entry<W> {
    key: KeyBytes,
    words: W,
}

struct Shard<W> {
    entries: HashTable<Entry<W>>,
    /// When (µs) this shard next drops idle keys.
    next_sweep: u64,
}

type Shards<W> = Box<[CachePadded<ShardLock<Shard<W>>>]>;

/// The table, specialised to the rule's state size.
enum Slots {
    One(Shards<[u64; 1]>),
    Two(Shards<[u64; 2]>),
    Four(Shards<[u64; 4]>),
    Many(Shards<Box<[u64]>>),
}

/// Every key's state for one rule. Thread-safe: a key's check holds its shard's lock.
pub(crate) struct MemoryStore {
    slots: Slots,
    hasher: foldhash::fast::RandomState,
    mask: usize,
    shard_capacity: usize,
    sweep_interval: u64,
    evictions: AtomicU64,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &(self.mask + 1))
            .field("shard_capacity", &self.shard_capacity)
            .field("keys", &self.len())
            .field("evictions", &self.evictions())
            .finish()
    }
}

fn shards<W>(count: usize) -> Shards<W> {
    (0..count)
        .map(|_| {
            CachePadded::new(ShardLock::new(Shard {
                entries: HashTable::new(),
                next_sweep: 0,
            }))
        })
        .collect()
}

impl MemoryStore {
    /// An empty store sized for `rule`'s state.
    pub(crate) fn new(rule: &Rule, config: MemoryConfig) -> Self {
        let count = config.shards.max(1).next_power_of_two();
        let slots = match rule.words() {
            1 => Slots::One(shards(count)),
            2 => Slots::Two(shards(count)),
            3 | 4 => Slots::Four(shards(count)),
            _ => Slots::Many(shards(count)),
        };
        Self {
            slots,
            hasher: foldhash::fast::RandomState::default(),
            mask: count - 1,
            shard_capacity: config.max_keys.div_ceil(count).max(1),
            sweep_interval: u64::try_from(config.sweep_interval.as_micros()).unwrap_or(u64::MAX),
            evictions: AtomicU64::new(0),
        }
    }

    /// Decides `attempt` for `key` under `rule` (the rule this store was made for).
    #[inline]
    pub(crate) fn check(&self, rule: &Rule, key: &[u8], attempt: Attempt) -> Decision {
        let hash = self.hasher.hash_one(key);
        match &self.slots {
            Slots::One(shards) => self.check_in(shards, rule, hash, key, attempt),
            Slots::Two(shards) => self.check_in(shards, rule, hash, key, attempt),
            Slots::Four(shards) => self.check_in(shards, rule, hash, key, attempt),
            Slots::Many(shards) => self.check_in(shards, rule, hash, key, attempt),
        }
    }

    #[inline]
    fn check_in<W: Words>(
        &self,
        shards: &Shards<W>,
        rule: &Rule,
        hash: u64,
        key: &[u8],
        attempt: Attempt,
    ) -> Decision {
        // High bits pick the shard; hashbrown uses the low bits and the top seven.
        let shard = &shards[(hash >> 32) as usize & self.mask];
        rule.algorithm().dispatch(Check {
            store: self,
            shard,
            rule,
            hash,
            key,
            attempt,
        })
    }

    /// Keys held now.
    pub(crate) fn len(&self) -> usize {
        fn count<W>(shards: &Shards<W>) -> usize {
            shards.iter().map(|s| s.lock().entries.len()).sum()
        }
        match &self.slots {
            Slots::One(s) => count(s),
            Slots::Two(s) => count(s),
            Slots::Four(s) => count(s),
            Slots::Many(s) => count(s),
        }
    }

    /// Keys dropped while their state still mattered, because their shard was full.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Drops idle keys when due, then, if the shard is still full, the keys closest to idle.
    fn make_room<W>(&self, shard: &mut Shard<W>, now: u64, expires_at: impl Fn(&W) -> u64) {
        let full = shard.entries.len() >= self.shard_capacity;
        if full || now >= shard.next_sweep {
            shard.entries.retain(|e| expires_at(&e.words) > now);
            shard.next_sweep = now.saturating_add(self.sweep_interval);
        }
        if shard.entries.len() < self.shard_capacity {
            return;
        }
        // Evict a sixteenth at once so that a flood of new keys costs amortised O(1).
        let evict = (self.shard_capacity / 16).clamp(1, shard.entries.len());
        let mut expiries: Vec<u64> = shard.entries.iter().map(|e| expires_at(&e.words)).collect();
        let (_, &mut cutoff, _) = expiries.select_nth_unstable(evict - 1);
        let mut left = evict;
        shard.entries.retain(|e| {
            let drop = left > 0 && expires_at(&e.words) <= cutoff;
            left -= usize::from(drop);
            !drop
        });
        self.evictions
            .fetch_add((evict - left) as u64, Ordering::Relaxed);
    }
}

/// One check, generic over the algorithm so that the whole path is statically dispatched.
struct Check<'s, W> {
    store: &'s MemoryStore,
    shard: &'s ShardLock<Shard<W>>,
    rule: &'s Rule,
    hash: u64,
    key: &'s [u8],
    attempt: Attempt,
}

impl<'a, W: Words> Visit<'a> for Check<'_, W> {
    type Output = Decision;

    #[inline]
    fn visit<A: Decide>(self, algorithm: &'a A) -> Decision {
        let Self {
            store,
            shard,
            rule,
            hash,
            key,
            attempt,
        } = self;
        let words = rule.words();
        let mut shard = shard.lock();
        if let Some(entry) = shard.entries.find_mut(hash, |e| e.key.is(key)) {
            return rule.evaluate(algorithm, &mut entry.words.as_mut()[..words], attempt);
        }
        let mut state = W::zeroed(words);
        let decision = rule.evaluate(algorithm, &mut state.as_mut()[..words], attempt);
        if state.as_ref().iter().any(|&word| word != 0) {
            store.make_room(&mut shard, attempt.now, |w: &W| {
                rule.expires_at(algorithm, &w.as_ref()[..words])
            });
            let entry = Entry {
                key: KeyBytes::new(key),
                words: state,
            };
            shard
                .entries
                .insert_unique(hash, entry, |e| store.hasher.hash_one(e.key.as_bytes()));
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::ManualClock;
    use crate::rule::Tier;

    const START: u64 = ManualClock::DEFAULT_START_MICROS;

    fn attempt(now: u64, cost: u64) -> Attempt {
        Attempt {
            now,
            cost,
            max_delay: None,
            commit: true,
        }
    }

    fn store(rule: &Rule, max_keys: usize, shards: usize) -> MemoryStore {
        MemoryStore::new(
            rule,
            MemoryConfig {
                max_keys,
                shards,
                sweep_interval: Duration::from_secs(1),
            },
        )
    }

    #[test]
    fn entries_are_small() {
        assert_eq!(std::mem::size_of::<Entry<[u64; 1]>>(), 32);
        assert_eq!(std::mem::size_of::<Entry<[u64; 2]>>(), 40);
    }

    #[test]
    fn short_and_long_keys_are_distinct_and_round_trip() {
        let keys: Vec<Vec<u8>> = (0..=40)
            .map(|len| (0..len).map(|i| i as u8 + 1).collect())
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let stored = KeyBytes::new(key);
            assert_eq!(stored.as_bytes(), &key[..]);
            for (j, other) in keys.iter().enumerate() {
                assert_eq!(stored.is(other), i == j, "{key:?} vs {other:?}");
            }
            // A key differing in any one byte is another key.
            for at in 0..key.len() {
                let mut other = key.clone();
                other[at] ^= 0x80;
                assert!(!stored.is(&other));
            }
        }
        let rule = Rule::new("r", Algorithm::FixedWindow, [Tier::per_second(1)]).unwrap();
        let store = store(&rule, 100, 4);
        let long = [1u8; 40];
        assert!(store.check(&rule, &long, attempt(START, 1)).allowed());
        assert!(!store.check(&rule, &long, attempt(START, 1)).allowed());
        assert!(store.check(&rule, &long[..39], attempt(START, 1)).allowed());
        assert!(store.check(&rule, b"", attempt(START, 1)).allowed());
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn looks_and_denials_of_unknown_keys_store_nothing() {
        let rule = Rule::new("r", Algorithm::Gcra, [Tier::per_second(5)]).unwrap();
        let store = store(&rule, 100, 4);
        assert!(store.check(&rule, b"k", attempt(START, 0)).allowed());
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn idle_keys_are_swept_when_new_keys_arrive() {
        let rule = Rule::new("r", Algorithm::Gcra, [Tier::per_second(10)]).unwrap();
        let store = store(&rule, 1_000, 1);
        for i in 0..100u32 {
            store.check(&rule, &i.to_be_bytes(), attempt(START, 1));
        }
        assert_eq!(store.len(), 100);
        // 100 ms later every bucket has drained; two sweep intervals later a new key sweeps.
        store.check(&rule, b"new", attempt(START + 2_000_000, 1));
        assert_eq!(store.len(), 1);
        assert_eq!(store.evictions(), 0);
    }

    #[test]
    fn a_flood_of_new_keys_stays_within_max_keys_evicting_the_closest_to_idle() {
        let rule = Rule::new("r", Algorithm::FixedWindow, [Tier::per_day(5)]).unwrap();
        let store = store(&rule, 64, 4);
        // A key counted in tomorrow's window (a clock ahead of ours): it matters longest.
        let tomorrow = START + 86_400_000_000;
        for _ in 0..5 {
            store.check(&rule, b"precious", attempt(tomorrow, 1));
        }
        for i in 0..10_000u32 {
            store.check(&rule, &i.to_be_bytes(), attempt(START, 1));
            assert!(store.len() <= 64);
        }
        assert!(store.evictions() > 9_000);
        // The key whose window ends last was never the one evicted.
        let precious = store.check(&rule, b"precious", attempt(tomorrow, 1));
        assert!(!precious.allowed());
    }
}
