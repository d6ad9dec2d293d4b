//! The in-memory store: the state words of every key of every rule, in one bounded, sharded
//! table (see [`table`](super::table)).
//!
//! Each rule layout gets a slot in the table, by name and [fingerprint](Rule::fingerprint),
//! so rules share one bound, and a rule whose limit is edited (a hot reload) keeps its keys'
//! state. A check hashes the key once, locks one shard and runs the rule over the key's words
//! in place; a key is inserted only when its state is no longer all zeros, so looks and
//! denials of unknown keys allocate nothing. A batch of several keys locks their shards in one
//! global order, asks every item without writing, and writes only if all admit.

use std::fmt;
use std::future::{Future, ready};
use std::sync::{Arc, RwLockReadGuard};

use super::slots::{Slots, Versions};
use super::table::{Bounds, Class, Entry, Locked, Score, Shard, Table, Words};
use super::{LocalStore, Planned, Store};
use crate::algorithm::{Attempt, Decide, Visit};
use crate::decision::{Decision, Decisions};
use crate::error::{Error, RuleError};
use crate::limiter::MAX_KEY_LEN;
use crate::rule::Rule;

/// Keys of every rule in process memory: concurrent, sharded, bounded by a key count and by
/// bytes, with idle keys dropped as new ones arrive. Cheap to clone: clones share the table,
/// so many limiters (and every version of a hot-reloaded rule set) can share one store.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    table: Table,
    slots: Slots,
}

/// What a rule is in this store: its slot and where its keys' words live.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    slot: u32,
    words: usize,
    class: Class,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.keys())
            .field("bytes", &self.bytes())
            .field("evictions", &self.evictions())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Configures a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    bounds: Bounds,
}

impl MemoryStoreBuilder {
    /// Holds at most `max_keys` keys across all rules (default a million). A new key beyond
    /// it evicts one whose state matters least.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.bounds.max_keys = max_keys;
        self
    }

    /// Holds at most `max_bytes` of keys and state across all rules (default 512 MiB; the
    /// tables' own slack comes on top, up to about half again).
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.bounds.max_bytes = max_bytes;
        self
    }

    /// Splits the keys over `shards` independently locked shards (rounded up to a power of
    /// two; default eight per CPU, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.bounds.shards = shards;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Inner {
                table: Table::new(self.bounds),
                slots: Slots::default(),
            }),
        }
    }
}

impl MemoryStore {
    /// A store of at most a million keys and 512 MiB.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        MemoryStoreBuilder {
            bounds: Bounds {
                max_keys: 1_000_000,
                max_bytes: 512 << 20,
                shards: (threads * 8).clamp(16, 1_024),
            },
        }
    }

    /// Keys held now, across all rules.
    pub fn keys(&self) -> usize {
        self.inner.table.len()
    }

    /// Bytes of keys and state held now (not counting the tables' slack).
    pub fn bytes(&self) -> usize {
        self.inner.table.bytes()
    }

    /// Keys forgotten while their state still mattered, to stay within the bounds.
    pub fn evictions(&self) -> u64 {
        self.inner.table.evictions()
    }

    fn registry(&self) -> RwLockReadGuard<'_, Versions> {
        self.inner.slots.read()
    }

    /// Decides one item: one shard lock, the algorithm dispatched statically.
    #[inline]
    fn check_one(&self, item: &Planned<'_, MemoryPlan>, attempt: Attempt) -> Decision {
        let table = &self.inner.table;
        let hash = table.hash(item.plan.slot, item.key);
        let shard = table.shard(hash);
        match item.plan.class {
            Class::One => self.check_in(&table.one[shard], item, hash, attempt),
            Class::Two => self.check_in(&table.two[shard], item, hash, attempt),
            Class::Four => self.check_in(&table.four[shard], item, hash, attempt),
            Class::Many => self.check_in(&table.many[shard], item, hash, attempt),
        }
    }

    #[inline]
    fn check_in<W: Words>(
        &self,
        shard: &super::lock::ShardLock<Shard<W>>,
        item: &Planned<'_, MemoryPlan>,
        hash: u64,
        attempt: Attempt,
    ) -> Decision {
        item.rule.algorithm().dispatch(Check {
            store: self,
            shard,
            item,
            hash,
            attempt,
        })
    }

    /// The words of `key` in `shard`, rewritten first if they were kept under an earlier
    /// version of `rule` (only states of many words, like the sliding log's, change size).
    #[inline]
    fn entry<'s, W: Words>(
        &self,
        shard: &'s mut Shard<W>,
        hash: u64,
        item: &Planned<'_, MemoryPlan>,
    ) -> Option<&'s mut W> {
        let slot = item.plan.slot;
        let entry = shard.entries.find_mut(hash, |e| e.key.is(slot, item.key))?;
        if W::EXACT && entry.words.as_ref().len() != item.plan.words {
            self.adopt(entry, item);
        }
        Some(&mut entry.words)
    }

    #[cold]
    fn adopt<W: Words>(&self, entry: &mut Entry<W>, item: &Planned<'_, MemoryPlan>) {
        let old_len = entry.words.as_ref().len();
        let mut words = W::zeroed(item.plan.words);
        if let Some(previous) = self.registry().version(item.plan.slot, old_len) {
            item.rule
                .adopt(previous, entry.words.as_ref(), words.as_mut());
        }
        self.inner
            .table
            .resized(entry.words.heap_bytes(), words.heap_bytes());
        entry.words = words;
    }

    /// Keeps `words`, the new state of `item`'s key, unless it is as good as new.
    fn keep<W: Words>(
        &self,
        shard: &mut Shard<W>,
        hash: u64,
        item: &Planned<'_, MemoryPlan>,
        words: W,
        now: u64,
    ) {
        if words.as_ref().iter().all(|&w| w == 0) {
            return;
        }
        let scorer = Scorer {
            registry: self.registry(),
        };
        let entry = Entry::new(item.plan.slot, item.key, words);
        self.inner.table.insert(shard, hash, entry, now, &scorer);
    }

    /// Decides a batch of several items all-or-nothing; see [`Decisions`].
    fn check_many(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Decisions {
        let table = &self.inner.table;
        let hashes: Vec<u64> = items
            .iter()
            .map(|i| table.hash(i.plan.slot, i.key))
            .collect();
        let wanted = |class: Class| -> Vec<usize> {
            items
                .iter()
                .zip(&hashes)
                .filter(|(item, _)| item.plan.class == class)
                .map(|(_, &hash)| table.shard(hash))
                .collect()
        };
        let mut locked = Batch {
            store: self,
            one: Locked::lock(&table.one, wanted(Class::One)),
            two: Locked::lock(&table.two, wanted(Class::Two)),
            four: Locked::lock(&table.four, wanted(Class::Four)),
            many: Locked::lock(&table.many, wanted(Class::Many)),
        };
        let attempt = |cost, commit| Attempt {
            now,
            cost,
            max_delay,
            commit,
        };
        let mut decisions: Vec<Decision> = items
            .iter()
            .zip(&hashes)
            .map(|(item, &hash)| {
                let look = attempt(item.cost, false);
                locked
                    .with(item, hash, now, |rule, state| {
                        rule.evaluate(rule.algorithm(), state, look)
                    })
                    .shadow(item.rule.is_shadow())
            })
            .collect();
        let admitted = decisions.iter().all(Decision::allowed);
        for ((item, &hash), decision) in items.iter().zip(&hashes).zip(&mut decisions) {
            if item.cost == 0 || decision.shadowed() {
                continue;
            }
            if admitted {
                let commit = attempt(item.cost, true);
                *decision = locked.with(item, hash, now, |rule, state| {
                    rule.evaluate(rule.algorithm(), state, commit)
                });
            } else {
                locked.with(item, hash, now, |rule, state| {
                    rule.first_seen(rule.algorithm(), state, now);
                    *decision
                });
            }
        }
        Decisions::many(decisions)
    }
}

impl Store for MemoryStore {
    type Plan = MemoryPlan;

    fn plan(&self, rule: &Rule) -> Result<MemoryPlan, Error> {
        let words = rule.words();
        let bounds = self.inner.table.bounds();
        let largest = Table::entry_bytes(words, MAX_KEY_LEN);
        if largest > bounds.max_bytes {
            return Err(Error::Rule(RuleError {
                rule: rule.name().into(),
                field: "tiers".into(),
                reason: format!(
                    "a key of this rule can take {largest} bytes, more than the store's \
                     max_bytes of {}",
                    bounds.max_bytes
                ),
            }));
        }
        // A log's state grows with its limit, so every version of it must live in one class.
        let class = match rule.algorithm() {
            crate::Algorithm::SlidingLog => Class::Many,
            _ => Class::of(words),
        };
        let slot = self.inner.slots.slot(rule)?;
        Ok(MemoryPlan { slot, words, class })
    }

    fn check(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send {
        ready(Ok(self.check_now(items, now, max_delay)))
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        ready(())
    }
}

impl LocalStore for MemoryStore {
    #[inline]
    fn check_one_now(
        &self,
        item: &Planned<'_, MemoryPlan>,
        now: u64,
        max_delay: Option<u64>,
    ) -> Decision {
        let attempt = Attempt {
            now,
            cost: item.cost,
            max_delay,
            commit: true,
        };
        self.check_one(item, attempt).shadow(item.rule.is_shadow())
    }

    fn check_now(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Decisions {
        match items {
            [item] => Decisions::one(self.check_one_now(item, now, max_delay)),
            items => self.check_many(items, now, max_delay),
        }
    }
}

/// Judges entries for the table from the registry: a state as good as new may go; otherwise
/// the more allowance a key has left (a fraction of its binding tier's limit), the less its
/// state matters, so used-up keys stay.
struct Scorer<'a> {
    registry: RwLockReadGuard<'a, Versions>,
}

impl Score for Scorer<'_> {
    fn score(&self, slot: u32, words: &mut [u64], now: u64) -> Option<f64> {
        // A rule whose layout is no longer planned has no use for its state.
        let newest = self.registry.newest(slot)?;
        let rule = if newest.words() <= words.len() {
            newest
        } else {
            // Kept under an earlier version whose state was smaller.
            match self.registry.version(slot, words.len()) {
                Some(rule) => rule,
                None => return Some(1.0),
            }
        };
        let state = &mut words[..rule.words()];
        let algorithm = rule.algorithm();
        if rule.expires_at(algorithm, state) <= now {
            return None;
        }
        let look = Attempt {
            now,
            cost: 0,
            max_delay: None,
            commit: false,
        };
        let binding = rule.evaluate(algorithm, state, look);
        Some(binding.remaining() as f64 / binding.limit().max(1) as f64)
    }
}

/// One item's check, generic over the algorithm so that the whole path is statically
/// dispatched.
struct Check<'s, 'i, W> {
    store: &'s MemoryStore,
    shard: &'s super::lock::ShardLock<Shard<W>>,
    item: &'s Planned<'i, MemoryPlan>,
    hash: u64,
    attempt: Attempt,
}

impl<'a, W: Words> Visit<'a> for Check<'_, '_, W> {
    type Output = Decision;

    #[inline]
    fn visit<A: Decide>(self, algorithm: &'a A) -> Decision {
        let Self {
            store,
            shard,
            item,
            hash,
            attempt,
        } = self;
        let (rule, words) = (item.rule, item.plan.words);
        let mut shard = shard.lock();
        if let Some(state) = store.entry(&mut shard, hash, item) {
            return rule.evaluate(algorithm, &mut state.as_mut()[..words], attempt);
        }
        let mut state = W::zeroed(words);
        let decision = rule.evaluate(algorithm, &mut state.as_mut()[..words], attempt);
        store.keep(&mut shard, hash, item, state, attempt.now);
        decision
    }
}

/// The shards of a batch, locked.
struct Batch<'a> {
    store: &'a MemoryStore,
    one: Locked<'a, [u64; 1]>,
    two: Locked<'a, [u64; 2]>,
    four: Locked<'a, [u64; 4]>,
    many: Locked<'a, Box<[u64]>>,
}

impl Batch<'_> {
    /// Runs `f` over `item`'s state words, keeping them if the key was new and they changed.
    fn with(
        &mut self,
        item: &Planned<'_, MemoryPlan>,
        hash: u64,
        now: u64,
        f: impl FnOnce(&Rule, &mut [u64]) -> Decision,
    ) -> Decision {
        fn on<W: Words>(
            store: &MemoryStore,
            locked: &mut Locked<'_, W>,
            item: &Planned<'_, MemoryPlan>,
            hash: u64,
            now: u64,
            f: impl FnOnce(&Rule, &mut [u64]) -> Decision,
        ) -> Decision {
            let shard = locked.shard(store.inner.table.shard(hash));
            let words = item.plan.words;
            if let Some(state) = store.entry(shard, hash, item) {
                return f(item.rule, &mut state.as_mut()[..words]);
            }
            let mut state = W::zeroed(words);
            let decision = f(item.rule, &mut state.as_mut()[..words]);
            store.keep(shard, hash, item, state, now);
            decision
        }
        let store = self.store;
        match item.plan.class {
            Class::One => on(store, &mut self.one, item, hash, now, f),
            Class::Two => on(store, &mut self.two, item, hash, now, f),
            Class::Four => on(store, &mut self.four, item, hash, now, f),
            Class::Many => on(store, &mut self.many, item, hash, now, f),
        }
    }
}
