//! The in-memory store: the state words of every key of every rule, in one bounded, sharded
//! table (see [`table`](super::table)).
//!
//! Each rule layout gets a tag in the table, by name and [fingerprint](Rule::fingerprint),
//! so rules share one bound, and a rule whose limit is edited (a hot reload) keeps its keys'
//! state. A check hashes the key once, locks one shard and runs the rule over the key's words
//! in place; a key is inserted only when its state is no longer all zeros, so looks and
//! denials of unknown keys allocate nothing. A batch of several keys locks their shards in one
//! global order, asks every item without writing, and writes only if all admit.

use std::fmt;
use std::future::{Future, ready};
use std::sync::{Arc, RwLockReadGuard};

use super::MAX_KEY_LEN;
use super::book::{Book, ReservationRecord};
pub use super::table::WhenFull;
use super::table::{Bounds, Class, Entry, Locked, Score, Shard, Table, Words};
use super::tags::{Tags, Versions};
use super::{LocalStore, Planned, Store};
use crate::algorithm::Tier;
use crate::algorithm::{Attempt, Decide, Micros, Visit};
use crate::decision::{Decision, Decisions, Source};
use crate::error::{Error, RuleError};
use crate::rule::{FailurePolicy, Rule};

/// Keys of every rule in process memory: concurrent, sharded, bounded by a key count and by
/// bytes, with idle keys dropped as new ones arrive. Cheap to clone: clones share the table,
/// so many limiters (and every version of a hot-reloaded rule set) can share one store.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    table: Table,
    tags: Tags,
    /// Open reservations.
    book: Book,
}

/// What a rule is in this store: its tag and where its keys' words live.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    tag: u32,
    words: usize,
    class: Class,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.keys())
            .field("bytes", &self.bytes())
            .field("evictions", &self.evictions())
            .field("limiting_evictions", &self.limiting_evictions())
            .field("refused", &self.refused())
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
    max_reservations: usize,
}

/// The least `max_bytes` a memory store takes: room for a few tables of small states.
pub const MIN_MAX_BYTES: usize = 4 << 10;

impl MemoryStoreBuilder {
    /// Holds at most `max_keys` keys across all rules (default a million; at least 1). A new
    /// key beyond it makes room as [`when_full`](Self::when_full) says.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.bounds.max_keys = max_keys;
        self
    }

    /// Holds at most `max_bytes` across all rules (default 512 MiB; at least
    /// [`MIN_MAX_BYTES`]): every bucket of the tables, used or not, and the keys longer than
    /// 18 bytes and the states of more than four words that live outside them. A 16-byte key
    /// takes 33 to 89 bytes with a GCRA state (a table is between 37.5% and 75% full).
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.bounds.max_bytes = max_bytes;
        self
    }

    /// What a full store does with a new key (default [`WhenFull::Evict`]). Evicting keeps
    /// counting every new key but, when every key sampled is used up, forgets one, which then
    /// starts afresh (counted in [`MemoryStore::limiting_evictions`] and logged the first
    /// time); refusing keeps every counted key exact and lets the rule's failure policy
    /// decide for new keys until old ones expire (counted in [`MemoryStore::refused`]).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.bounds.when_full = when_full;
        self
    }

    /// Keeps at most `max_reservations` open reservations (default
    /// [`DEFAULT_MAX_RESERVATIONS`](super::DEFAULT_MAX_RESERVATIONS)): a reservation beyond
    /// them is refused, with nothing taken.
    pub fn max_reservations(mut self, max_reservations: usize) -> Self {
        self.max_reservations = max_reservations;
        self
    }

    /// Splits the keys over `shards` independently locked shards (rounded up to a power of
    /// two; default eight per CPU, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.bounds.shards = shards;
        self
    }

    /// Whether a store built with these settings can hold `rule` (as planning it on the
    /// store would say), without building it.
    ///
    /// # Errors
    /// [`Error::Rule`] for a rule whose key cannot fit in `max_bytes`.
    pub fn holds(&self, rule: &Rule) -> Result<(), Error> {
        fits(rule, self.bounds.max_bytes)
    }

    /// Checks the settings, as [`build`](Self::build) does.
    ///
    /// # Errors
    /// [`Error::Store`] when `max_keys` is 0 or `max_bytes` below [`MIN_MAX_BYTES`].
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |message: String| Error::Store {
            message,
            transient: false,
        };
        if self.bounds.max_keys == 0 {
            return Err(invalid("max_keys: must be at least 1".into()));
        }
        if self.bounds.max_bytes < MIN_MAX_BYTES {
            return Err(invalid(format!(
                "max_bytes: must be at least {MIN_MAX_BYTES} (4 KiB), not {}",
                self.bounds.max_bytes
            )));
        }
        Ok(())
    }

    /// Builds the store.
    ///
    /// # Errors
    /// [`Error::Store`] when `max_keys` is 0 or `max_bytes` below [`MIN_MAX_BYTES`]: such a
    /// store could hold no key, so it would limit nothing.
    pub fn build(self) -> Result<MemoryStore, Error> {
        self.validate()?;
        Ok(MemoryStore {
            inner: Arc::new(Inner {
                table: Table::new(self.bounds),
                tags: Tags::default(),
                book: Book::new(self.max_reservations),
            }),
        })
    }
}

impl MemoryStore {
    /// The default bounds: a million keys and 512 MiB.
    pub(crate) const DEFAULT_MAX_BYTES: usize = 512 << 20;

    /// A store of at most a million keys and 512 MiB.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default bounds are valid")
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        MemoryStoreBuilder {
            max_reservations: super::DEFAULT_MAX_RESERVATIONS,
            bounds: Bounds {
                max_keys: 1_000_000,
                max_bytes: Self::DEFAULT_MAX_BYTES,
                shards: (threads * 8).clamp(16, 1_024),
                when_full: WhenFull::Evict,
            },
        }
    }

    /// Keys held now, across all rules.
    pub fn keys(&self) -> usize {
        self.inner.table.len()
    }

    /// Bytes held now, as [`MemoryStoreBuilder::max_bytes`] counts them: the tables'
    /// buckets, used or not, and what keys and states store outside them.
    pub fn bytes(&self) -> usize {
        self.inner.table.bytes()
    }

    /// Keys forgotten while their state still mattered, to stay within the bounds.
    pub fn evictions(&self) -> u64 {
        self.inner.table.evictions()
    }

    /// Of [`evictions`](Self::evictions), the keys that were used up when forgotten: their
    /// next check would have been denied, and is now admitted as a new key's.
    pub fn limiting_evictions(&self) -> u64 {
        self.inner.table.limiting_evictions()
    }

    /// New keys that found no room (under [`WhenFull::Refuse`], or when bounded work could
    /// not make room): their rule's failure policy decided.
    pub fn refused(&self) -> u64 {
        self.inner.table.refused()
    }

    fn registry(&self) -> RwLockReadGuard<'_, Versions> {
        self.inner.tags.read()
    }

    /// Decides one item: one shard lock, the algorithm dispatched statically.
    #[inline]
    fn check_one(&self, item: &Planned<'_, MemoryPlan>, attempt: Attempt) -> Decision {
        let table = &self.inner.table;
        let hash = table.hash(item.plan.tag, item.key);
        let shard = table.shard(hash);
        match item.plan.class {
            Class::One => self.check_in(&table.one[shard], item, hash, attempt),
            Class::Two => self.check_in(&table.two[shard], item, hash, attempt),
            Class::Three => self.check_in(&table.three[shard], item, hash, attempt),
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
        let tag = item.plan.tag;
        let entry = shard.entries.find_mut(hash, |e| e.key.is(tag, item.key))?;
        if W::EXACT && entry.words.as_ref().len() != item.plan.words {
            self.adopt(entry, item);
        }
        Some(&mut entry.words)
    }

    #[cold]
    fn adopt<W: Words>(&self, entry: &mut Entry<W>, item: &Planned<'_, MemoryPlan>) {
        let old_len = entry.words.as_ref().len();
        let mut words = W::zeroed(item.plan.words);
        if let Some(previous) = self.registry().version(item.plan.tag, old_len) {
            item.rule
                .adopt(previous, entry.words.as_ref(), words.as_mut());
        }
        self.inner
            .table
            .resized(entry.words.heap_bytes(), words.heap_bytes());
        entry.words = words;
    }

    /// Keeps `words`, the new state of `item`'s key, unless it is as good as new. False when
    /// the table found no room for it.
    fn keep<W: Words>(
        &self,
        shard: &mut Shard<W>,
        hash: u64,
        item: &Planned<'_, MemoryPlan>,
        words: W,
        now: u64,
    ) -> bool {
        if words.as_ref().iter().all(|&w| w == 0) {
            return true;
        }
        let scorer = Scorer {
            registry: self.registry(),
        };
        let entry = Entry::new(item.plan.tag, item.key, words);
        self.inner.table.insert(shard, hash, entry, now, &scorer)
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
            .map(|i| table.hash(i.plan.tag, i.key))
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
            three: Locked::lock(&table.three, wanted(Class::Three)),
            four: Locked::lock(&table.four, wanted(Class::Four)),
            many: Locked::lock(&table.many, wanted(Class::Many)),
        };
        let attempt = |cost, commit| Attempt {
            now: Micros::new(now),
            cost,
            max_delay,
            commit,
            settle: None,
        };
        let (mut decisions, mut new): (Vec<Decision>, Vec<bool>) = items
            .iter()
            .zip(&hashes)
            .map(|(item, &hash)| {
                let look = attempt(item.cost, false);
                let (decision, held) = locked.with(item, hash, now, |rule, state| {
                    rule.evaluate(rule.algorithm(), state, look)
                });
                (
                    decision.shadow(item.rule.is_shadow()),
                    held != Held::Existing,
                )
            })
            .unzip();
        let admitted = decisions.iter().all(Decision::allowed);
        if !admitted {
            // What a denial records, in every item (as the Redis batch does).
            for ((item, &hash), decision) in items.iter().zip(&hashes).zip(&decisions) {
                if item.cost > 0 {
                    locked.with(item, hash, now, |rule, state| {
                        rule.denied(rule.algorithm(), state, &attempt(item.cost, true));
                        *decision
                    });
                }
            }
            return Decisions::many(decisions);
        }
        // New keys first: one that finds no room under a rule that fails closed denies the
        // batch, and the new keys kept before it are forgotten again, as if never seen, while
        // no key held before has consumed yet.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| !new[i]);
        let looked = decisions.clone();
        let mut kept = Vec::new();
        for i in order {
            let (item, hash) = (&items[i], hashes[i]);
            if item.cost == 0 || decisions[i].shadowed() {
                continue;
            }
            let commit = attempt(item.cost, true);
            let (decision, held) = locked.with(item, hash, now, |rule, state| {
                rule.evaluate(rule.algorithm(), state, commit)
            });
            new[i] = held == Held::New;
            match held {
                Held::Unkept if item.rule.failure_policy() == FailurePolicy::Closed => {
                    for &k in &kept {
                        locked.forget(&items[k], hashes[k]);
                        decisions[k] = looked[k];
                    }
                    decisions[i] = unkept(item, decision);
                    return Decisions::many(decisions);
                }
                Held::Unkept => decisions[i] = unkept(item, decision),
                Held::New => {
                    kept.push(i);
                    decisions[i] = decision;
                }
                Held::Existing => decisions[i] = decision,
            }
        }
        Decisions::many(decisions)
    }
}

impl Store for MemoryStore {
    type Plan = MemoryPlan;

    fn plan(&self, rule: &Rule) -> Result<MemoryPlan, Error> {
        fits(rule, self.inner.table.bounds().max_bytes)?;
        let words = rule.words();
        // A log's state grows with its limit, so every version of it must live in one class.
        let class = match rule.algorithm() {
            crate::Algorithm::SlidingLog => Class::Many,
            _ => Class::of(words),
        };
        let tag = self.inner.tags.tag(rule)?;
        Ok(MemoryPlan { tag, words, class })
    }

    fn check(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send {
        ready(Ok(self.check_now(items, now, max_delay)))
    }

    fn settles(&self) -> Result<(), Error> {
        Ok(())
    }

    fn settle(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        settle: super::Settle,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send {
        ready(Ok(self.settle_now(items, now, settle)))
    }

    fn keep_reservation(
        &self,
        record: &ReservationRecord,
        _now: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        ready(self.inner.book.keep(record.clone()))
    }

    fn take_reservation(
        &self,
        id: &str,
        _now: u64,
    ) -> impl Future<Output = Result<Option<ReservationRecord>, Error>> + Send {
        ready(Ok(self.inner.book.take(id)))
    }

    fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ReservationRecord>, Error>> + Send {
        ready(Ok(self.inner.book.expired(now, limit)))
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        ready(())
    }

    fn reset(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        _now: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        for item in items {
            self.inner
                .table
                .forget(item.plan.tag, item.key, item.plan.class);
        }
        ready(Ok(()))
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
            now: Micros::new(now),
            cost: item.cost,
            max_delay,
            commit: true,
            settle: None,
        };
        self.check_one(item, attempt)
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

impl MemoryStore {
    /// Open reservations now.
    pub fn reservations(&self) -> usize {
        self.inner.book.len()
    }

    /// Settles `items` now, as [`Store::settle`](super::Store::settle) does, without waiting.
    pub fn settle_now(
        &self,
        items: &[Planned<'_, MemoryPlan>],
        now: u64,
        settle: super::Settle,
    ) -> Decisions {
        let decided = items.iter().map(|item| {
            let attempt = Attempt {
                now: Micros::new(now),
                cost: item.cost,
                max_delay: None,
                commit: true,
                settle: Some(settle),
            };
            self.check_one(item, attempt)
        });
        Decisions::many(decided.collect())
    }
}

/// Whether a key of `rule` fits in a store of `max_bytes`.
pub(crate) fn fits(rule: &Rule, max_bytes: usize) -> Result<(), Error> {
    let largest = Table::entry_bytes(rule.words(), MAX_KEY_LEN);
    if largest > max_bytes {
        return Err(Error::from(RuleError {
            rule: rule.name().into(),
            field: "tiers".into(),
            reason: format!(
                "a key of this rule can take {largest} bytes, more than the store's max_bytes \
                 of {max_bytes}"
            ),
        }));
    }
    Ok(())
}

/// Judges entries for the table from the registry: a state as good as new may go; otherwise
/// the more allowance a key has left (a fraction of its binding tier's limit), the less its
/// state matters, so used-up keys stay.
struct Scorer<'a> {
    registry: RwLockReadGuard<'a, Versions>,
}

impl Scorer<'_> {
    /// The rule that wrote `words` of `tag`: `Err(true)` when no rule of that tag is planned
    /// any more (its state is of no use), `Err(false)` when none is known of that size.
    fn rule(&self, tag: u32, words: &[u64]) -> Result<&Rule, bool> {
        let newest = self.registry.newest(tag).ok_or(true)?;
        if newest.words() <= words.len() {
            return Ok(newest);
        }
        // Kept under an earlier version whose state was smaller.
        self.registry.version(tag, words.len()).ok_or(false)
    }

    /// Whether `words` of `tag` have been as good as new for `grace` of their rule (µs), or
    /// belong to no rule planned any more.
    fn expired_for(
        &self,
        tag: u32,
        words: &[u64],
        now: u64,
        grace: impl FnOnce(&Rule) -> Option<u64>,
    ) -> bool {
        let rule = match self.rule(tag, words) {
            Ok(rule) => rule,
            Err(gone) => return gone,
        };
        let expires = rule
            .expires_at(rule.algorithm(), &words[..rule.words()])
            .get();
        expires.saturating_add(grace(rule).unwrap_or(0)) <= now
    }
}

impl Score for Scorer<'_> {
    fn score(&self, tag: u32, words: &mut [u64], now: u64) -> Option<f64> {
        let rule = match self.rule(tag, words) {
            Ok(rule) => rule,
            Err(true) => return None,
            Err(false) => return Some(1.0),
        };
        let state = &mut words[..rule.words()];
        let algorithm = rule.algorithm();
        if rule.expires_at(algorithm, state).get() <= now {
            return None;
        }
        let binding = rule.evaluate(algorithm, state, Attempt::look(Micros::new(now)));
        Some(binding.remaining() as f64 / binding.limit().max(1) as f64)
    }

    /// As good as new for the rule's longest period: a key that comes back within a period of
    /// its state's expiry stays in place, so the turn of a fixed window, when every key's
    /// state expires at once, does not drop and insert again each key that is still in use.
    fn idle(&self, tag: u32, words: &mut [u64], now: u64) -> bool {
        self.expired_for(tag, words, now, |rule| {
            rule.tiers().iter().map(Tier::period_micros).max()
        })
    }

    fn expired(&self, tag: u32, words: &mut [u64], now: u64) -> bool {
        self.expired_for(tag, words, now, |_| None)
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
            return rule
                .evaluate(algorithm, &mut state.as_mut()[..words], attempt)
                .shadow(rule.is_shadow());
        }
        let mut state = W::zeroed(words);
        let decision = rule.evaluate(algorithm, &mut state.as_mut()[..words], attempt);
        let decision = if store.keep(&mut shard, hash, item, state, attempt.now.get()) {
            decision
        } else {
            unkept(item, decision)
        };
        decision.shadow(rule.is_shadow())
    }
}

/// The decision for a new key that found no room, `decided` being its decision as a new key:
/// its rule's failure policy's. `closed` denies for the rule's shortest period (by then held
/// keys may have expired); `open` and `local` admit as a new key would be, uncounted.
#[cold]
fn unkept(item: &Planned<'_, MemoryPlan>, decided: Decision) -> Decision {
    match item.rule.failure_policy() {
        FailurePolicy::Closed => {
            let wait = item.rule.tiers().iter().map(|t| t.period_micros()).min();
            item.rule.unchecked(Some(wait.unwrap_or(1)))
        }
        FailurePolicy::Open | FailurePolicy::Local { .. } => decided.with_source(Source::FailOpen),
    }
}

/// Whether a batch item's key was held before, is new and kept, or found no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Existing,
    New,
    Unkept,
}

/// The shards of a batch, locked.
struct Batch<'a> {
    store: &'a MemoryStore,
    one: Locked<'a, [u64; 1]>,
    two: Locked<'a, [u64; 2]>,
    three: Locked<'a, [u64; 3]>,
    four: Locked<'a, [u64; 4]>,
    many: Locked<'a, Box<[u64]>>,
}

impl Batch<'_> {
    /// Runs `f` over `item`'s state words, keeping them if the key was new and they changed;
    /// says whether the key was held.
    fn with(
        &mut self,
        item: &Planned<'_, MemoryPlan>,
        hash: u64,
        now: u64,
        f: impl FnOnce(&Rule, &mut [u64]) -> Decision,
    ) -> (Decision, Held) {
        fn on<W: Words>(
            store: &MemoryStore,
            locked: &mut Locked<'_, W>,
            item: &Planned<'_, MemoryPlan>,
            hash: u64,
            now: u64,
            f: impl FnOnce(&Rule, &mut [u64]) -> Decision,
        ) -> (Decision, Held) {
            let shard = locked.shard(store.inner.table.shard(hash));
            let words = item.plan.words;
            if let Some(state) = store.entry(shard, hash, item) {
                return (f(item.rule, &mut state.as_mut()[..words]), Held::Existing);
            }
            let mut state = W::zeroed(words);
            let decision = f(item.rule, &mut state.as_mut()[..words]);
            match store.keep(shard, hash, item, state, now) {
                true => (decision, Held::New),
                false => (decision, Held::Unkept),
            }
        }
        let store = self.store;
        match item.plan.class {
            Class::One => on(store, &mut self.one, item, hash, now, f),
            Class::Two => on(store, &mut self.two, item, hash, now, f),
            Class::Three => on(store, &mut self.three, item, hash, now, f),
            Class::Four => on(store, &mut self.four, item, hash, now, f),
            Class::Many => on(store, &mut self.many, item, hash, now, f),
        }
    }

    /// Forgets `item`'s key, kept new by this batch.
    fn forget(&mut self, item: &Planned<'_, MemoryPlan>, hash: u64) {
        fn on<W: Words>(
            table: &Table,
            locked: &mut Locked<'_, W>,
            item: &Planned<'_, MemoryPlan>,
            hash: u64,
        ) {
            let shard = locked.shard(table.shard(hash));
            table.remove(shard, hash, item.plan.tag, item.key);
        }
        let table = &self.store.inner.table;
        match item.plan.class {
            Class::One => on(table, &mut self.one, item, hash),
            Class::Two => on(table, &mut self.two, item, hash),
            Class::Three => on(table, &mut self.three, item, hash),
            Class::Four => on(table, &mut self.four, item, hash),
            Class::Many => on(table, &mut self.many, item, hash),
        }
    }
}
