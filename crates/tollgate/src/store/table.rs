//! The sharded table that holds the state words of keys in process memory, for any number of
//! rules at once: each entry is keyed by a rule's tag (a `u32` the owning store gives each
//! rule layout) and the key's bytes.
//!
//! A key's operation hashes once, locks one shard (of many; never a global lock) and works on
//! the entry's words in place. Entries are split in five classes by state size (one, two,
//! three, four words, and more), so that states of up to four words live inside the table
//! itself, each in a bucket no larger than it needs: a 16-byte key with one GCRA word takes a
//! 32-byte bucket, with the sliding window's three words 48. The buckets are open-addressed
//! ([`Buckets`]): a check reads its bucket's line and no other.
//!
//! Memory is bounded by a key count and by bytes, both exact: the bytes are what the tables
//! allocate (every bucket, used or not) and what keys and large states
//! take outside them, so the bound holds for what the process really holds. A shard's table
//! grows (doubling) only while the byte bound allows it and up to the size its share of the
//! key bound needs (a quarter more than an even share and seven standard deviations of a
//! random fill, at three quarters full); beyond, an insert into a shard at three quarters of
//! its buckets evicts in that shard, and a removal leaves no mark behind (see
//! [`Buckets::remove_at`]). So no pattern of inserts and evictions makes a table larger than
//! that.
//!
//! To make room, an insert samples a few entries (of its shard, and of two other shards when
//! its own table has room) and evicts the one whose state matters least, as its owner scores it
//! (state as good as new first, then the freshest); a used-up key is the last to go, so a flood
//! of new keys resets one only when every sampled key is used up. Under [`WhenFull::Refuse`]
//! nothing whose state still matters is evicted, and the new key is not kept; its search for
//! an expired state takes buckets and shards in turn rather than at random, so that the
//! refusals of a full store search all of it, not the same samples. Each insert also
//! drops entries at its shard's sweep cursor whose state is as good as new: while the store is
//! at most half full, only idle ones (as good as new for as long as their owner says; the
//! memory store's, for their rule's longest period), so that keys still in use stay in place.
//! All of it is bounded work per insert, and other shards are only ever tried, never waited
//! for.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use spin::mutex::SpinMutexGuard;

use super::buckets::Buckets;
use super::lock::ShardLock;

/// Key bytes kept inside the entry; longer keys get an allocation of their own.
const INLINE_KEY: usize = 18;

/// Buckets an insert inspects at its shard's sweep cursor, dropping expired entries.
const SWEEP_PER_INSERT: usize = 4;

/// Buckets an eviction inspects, from a random point of the shard, for its candidates; and
/// entries a refusal's search asks, from the shard's cursor, in at most four times as many
/// buckets.
const EVICTION_PROBES: usize = 64;

/// Occupied entries an eviction compares per shard it samples.
const EVICTION_CANDIDATES: usize = 8;

/// Shards other than its own an eviction samples, if they are free.
const OTHER_SHARDS: usize = 2;

/// Evictions one insert may make (a large state may need several small ones to go); beyond
/// that the new state is not kept.
const MAX_EVICTIONS_PER_INSERT: usize = 64;

/// A rule tag and a key's bytes, inline when short.
#[derive(Clone)]
pub(crate) enum KeyBytes {
    Inline {
        len: u8,
        tag: [u8; 4],
        bytes: [u8; INLINE_KEY],
    },
    Heap {
        tag: u32,
        bytes: Box<[u8]>,
    },
}

const _: () = assert!(std::mem::size_of::<KeyBytes>() == 24);

impl KeyBytes {
    #[inline]
    fn new(tag: u32, key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            Self::Inline {
                len: key.len() as u8,
                tag: tag.to_le_bytes(),
                bytes,
            }
        } else {
            Self::Heap {
                tag,
                bytes: key.into(),
            }
        }
    }

    /// Whether this is `key` of `tag`. Compared in place with fixed-size reads: this runs on
    /// every check.
    #[inline(always)]
    pub(crate) fn is(&self, tag: u32, key: &[u8]) -> bool {
        fn ends<const N: usize>(stored: &[u8; INLINE_KEY], key: &[u8]) -> bool {
            let len = key.len();
            stored[..N] == key[..N] && stored[len - N..len] == key[len - N..]
        }
        match self {
            Self::Inline {
                len,
                tag: stored,
                bytes,
            } if usize::from(*len) == key.len() && u32::from_le_bytes(*stored) == tag => {
                match key.len() {
                    16.. => ends::<16>(bytes, key),
                    8.. => ends::<8>(bytes, key),
                    4.. => ends::<4>(bytes, key),
                    len => bytes[..len] == *key,
                }
            }
            Self::Inline { .. } => false,
            Self::Heap { tag: stored, bytes } => *stored == tag && **bytes == *key,
        }
    }

    pub(crate) fn tag(&self) -> u32 {
        match self {
            Self::Inline { tag, .. } => u32::from_le_bytes(*tag),
            Self::Heap { tag, .. } => *tag,
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes, .. } => &bytes[..usize::from(*len)],
            Self::Heap { bytes, .. } => bytes,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap { bytes, .. } => bytes.len(),
        }
    }
}

/// Storage for one key's state words: inline arrays for small states, a box otherwise.
pub(crate) trait Words: AsRef<[u64]> + AsMut<[u64]> + Send + 'static {
    /// Whether the storage is exactly as long as the state (else it may be longer).
    const EXACT: bool = false;

    fn zeroed(len: usize) -> Self;

    /// Bytes this storage holds outside the entry.
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl<const N: usize> Words for [u64; N] {
    fn zeroed(_len: usize) -> Self {
        [0; N]
    }
}

impl Words for Box<[u64]> {
    const EXACT: bool = true;

    fn zeroed(len: usize) -> Self {
        vec![0; len].into_boxed_slice()
    }

    fn heap_bytes(&self) -> usize {
        8 * self.len()
    }
}

pub(crate) struct Entry<W> {
    pub(crate) key: KeyBytes,
    pub(crate) words: W,
}

impl<W: Words> Entry<W> {
    pub(crate) fn new(tag: u32, key: &[u8], words: W) -> Self {
        Self {
            key: KeyBytes::new(tag, key),
            words,
        }
    }

    /// What this entry holds outside its bucket, counted against the table's byte bound.
    fn heap_bytes(&self) -> usize {
        self.key.heap_bytes() + self.words.heap_bytes()
    }
}

/// Bytes a table of `buckets` buckets of `W` entries allocates (an empty bucket is as large
/// as a full one).
fn table_bytes<W>(buckets: usize) -> usize {
    buckets * std::mem::size_of::<Option<Entry<W>>>()
}

/// The entries a table of `buckets` buckets holds before an insert must grow it or evict in
/// it: three quarters of its buckets (all but one of a small table's), so that a lookup of a
/// key not held, which reads buckets until an empty one, reads few.
fn load_limit(buckets: usize) -> usize {
    if buckets < 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 4 * 3
    }
}

pub(crate) struct Shard<W> {
    pub(crate) entries: Buckets<Entry<W>>,
    /// The next bucket the sweep inspects.
    cursor: usize,
    /// State of the shard's random sampling (xorshift).
    random: u64,
}

pub(crate) type Shards<W> = Box<[CachePadded<ShardLock<Shard<W>>>]>;

/// How the table's owner judges an entry it may drop: `None` when its state is as good as
/// new (dropping it changes nothing), else how little it matters: the entry with the highest
/// score is evicted first. Called under the entry's shard lock.
pub(crate) trait Score {
    fn score(&self, tag: u32, words: &mut [u64], now: u64) -> Option<f64>;

    /// Whether the sweep may drop the entry now: by default as soon as its state is as good
    /// as new. An owner may keep such a state for a while, so that a key back soon after its
    /// state expired (every key of a fixed window, at the window's turn) is found in place
    /// rather than dropped and inserted again; an eviction still takes it first.
    fn idle(&self, tag: u32, words: &mut [u64], now: u64) -> bool {
        self.expired(tag, words, now)
    }

    /// Whether the state is as good as new (`score` is `None`), which an owner may tell more
    /// cheaply than it scores a state.
    fn expired(&self, tag: u32, words: &mut [u64], now: u64) -> bool {
        self.score(tag, words, now).is_none()
    }
}

/// Size classes, each with its own shards.
const CLASSES: usize = 5;

/// The table's size class for a state of `words` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    One,
    Two,
    Three,
    Four,
    Many,
}

impl Class {
    pub(crate) fn of(words: usize) -> Self {
        match words {
            0 | 1 => Self::One,
            2 => Self::Two,
            3 => Self::Three,
            4 => Self::Four,
            _ => Self::Many,
        }
    }
}

/// What a full table does with a new key; see [`MemoryStoreBuilder::when_full`].
///
/// [`MemoryStoreBuilder::when_full`]: crate::MemoryStoreBuilder::when_full
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Evict the key whose state matters least (state as good as new first, then the most
    /// allowance left), even a used-up key when every key sampled is used up: new keys are
    /// always counted, and a forgotten key starts afresh.
    #[default]
    Evict,
    /// Evict only keys whose state is as good as new; while there are none, a new key is not
    /// kept and its rule's failure policy decides its checks (`closed` denies, `open` and
    /// `local` admit as a new key would be, uncounted): counted keys stay exact.
    Refuse,
}

/// Bounds of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) max_keys: usize,
    pub(crate) max_bytes: usize,
    pub(crate) shards: usize,
    pub(crate) when_full: WhenFull,
}

/// Where an eviction may look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The inserting shard and a few others that are free.
    Any,
    /// A few shards other than the inserting one, for a state as good as new only.
    ExpiredElsewhere,
}

pub(crate) struct Table {
    pub(crate) one: Shards<[u64; 1]>,
    pub(crate) two: Shards<[u64; 2]>,
    pub(crate) three: Shards<[u64; 3]>,
    pub(crate) four: Shards<[u64; 4]>,
    pub(crate) many: Shards<Box<[u64]>>,
    hasher: foldhash::fast::RandomState,
    mask: usize,
    bounds: Bounds,
    /// A shard's even share of `max_keys`.
    share: usize,
    /// The most buckets a shard's table grows to: enough, at three quarters full, for a quarter
    /// more than its share of `max_keys` and seven standard deviations of how many keys a
    /// random fill puts in one shard (`7 * sqrt(share)`, plus 16), so that a store filling up
    /// refuses or evicts for its key bound, not for one shard's luck (a fill of 1,000 keys
    /// over 16 shards overflowed one shard in 2 of 10,000 fills at a quarter more). Beyond, an
    /// insert evicts in its own shard.
    max_buckets: usize,
    keys: AtomicUsize,
    bytes: AtomicUsize,
    evictions: AtomicU64,
    limiting_evictions: AtomicU64,
    refused: AtomicU64,
    /// Under [`WhenFull::Refuse`], where the next eviction's search of other shards starts
    /// (`class * shards + index`, wrapping).
    refusal_cursor: AtomicUsize,
    /// Whether a used-up key was evicted yet (said once in the log).
    warned: AtomicBool,
}

fn shards<W>(count: usize) -> Shards<W> {
    (0..count)
        .map(|i| {
            CachePadded::new(ShardLock::new(Shard {
                entries: Buckets::new(),
                cursor: 0,
                random: 0x9e37_79b9_7f4a_7c15 ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd),
            }))
        })
        .collect()
}

impl Table {
    pub(crate) fn new(bounds: Bounds) -> Self {
        let count = bounds.shards.max(1).next_power_of_two();
        let share = bounds.max_keys / count;
        let max_buckets = share
            .saturating_add(share / 4 + 7 * share.isqrt() + 16)
            .saturating_mul(4)
            .div_ceil(3)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX / 2 + 1);
        Self {
            one: shards(count),
            two: shards(count),
            three: shards(count),
            four: shards(count),
            many: shards(count),
            hasher: foldhash::fast::RandomState::default(),
            mask: count - 1,
            bounds,
            share,
            max_buckets,
            keys: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            limiting_evictions: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusal_cursor: AtomicUsize::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// The hash of `key` of `tag`: the key's, told apart between tags by an odd multiple of
    /// the tag, so that one key under several rules spreads over the table.
    #[inline]
    pub(crate) fn hash(&self, tag: u32, key: &[u8]) -> u64 {
        self.hasher.hash_one(key) ^ u64::from(tag).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The shard of a hash: its high bits (a shard's buckets use the low bits).
    #[inline]
    pub(crate) fn shard(&self, hash: u64) -> usize {
        (hash >> 32) as usize & self.mask
    }

    /// Keys held now.
    pub(crate) fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Bytes held now: the tables' buckets, used or not, and keys and states stored outside
    /// them.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Keys dropped while their state still mattered, to stay within the bounds.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Of [`evictions`](Self::evictions), keys that were limiting: used up (their next check
    /// would have been denied), or holding counts not yet shared.
    pub(crate) fn limiting_evictions(&self) -> u64 {
        self.limiting_evictions.load(Ordering::Relaxed)
    }

    /// New keys not kept, for want of room their state could take.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Bytes a new entry of `words` words for a key of `key_len` bytes takes at the least: its
    /// bucket, and what it stores outside (its table's slack comes on top).
    pub(crate) fn entry_bytes(words: usize, key_len: usize) -> usize {
        let (entry, heap_words) = match Class::of(words) {
            Class::One => (table_bytes::<[u64; 1]>(1), 0),
            Class::Two => (table_bytes::<[u64; 2]>(1), 0),
            Class::Three => (table_bytes::<[u64; 3]>(1), 0),
            Class::Four => (table_bytes::<[u64; 4]>(1), 0),
            Class::Many => (table_bytes::<Box<[u64]>>(1), 8 * words),
        };
        let heap_key = if key_len > INLINE_KEY { key_len } else { 0 };
        entry + heap_key + heap_words
    }

    /// Inserts `entry`, whose key hashes to `hash`, into `shard` (locked by the caller),
    /// first sweeping a few buckets, then making the room the bounds require: growing the
    /// shard's table while they allow, else evicting. Returns false, keeping nothing, when no
    /// room could be made within bounded work or [`WhenFull::Refuse`] forbids it.
    pub(crate) fn insert<W: Words>(
        &self,
        shard: &mut Shard<W>,
        hash: u64,
        entry: Entry<W>,
        now: u64,
        score: &dyn Score,
    ) -> bool {
        let size = entry.heap_bytes();
        let roomy = self.roomy();
        self.sweep(shard, now, score, roomy);
        let keys = self.keys.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        let mut room = true;
        let (buckets, len) = (shard.entries.num_buckets(), shard.entries.len());
        if len >= load_limit(buckets) {
            let grown = 2 * buckets.max(2);
            let growth = table_bytes::<W>(grown) - table_bytes::<W>(buckets);
            let can_grow =
                grown <= self.max_buckets && bytes.saturating_add(growth) <= self.bounds.max_bytes;
            let (own, _) = best(shard, now, score, self.refuses());
            // An expired state goes in place of growing the table, once it may be swept: a
            // key whose window just turned is likely back soon.
            let sweepable = own.filter(|&(s, at)| {
                s == f64::INFINITY
                    && shard
                        .entries
                        .get_mut(at)
                        .is_some_and(|e| sweepable(e, now, score, roomy))
            });
            // A full store grows a table only for a shard well under its share (a rule's
            // first keys), or in place of a state as good as new elsewhere.
            let grow = sweepable.is_none()
                && can_grow
                && (keys <= self.bounds.max_keys
                    || len < self.share / 2
                    || self.evict(shard, now, score, Scope::ExpiredElsewhere));
            room = if grow {
                self.grow(shard);
                true
            } else {
                own.is_some_and(|chosen| self.evict_own(shard, chosen))
            };
        }
        room = room && self.make_room(shard, now, score);
        if !room {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        shard.entries.insert(hash, entry);
        true
    }

    /// The hash of `entry`'s key, for the buckets to place it.
    fn hash_of<W>(&self, entry: &Entry<W>) -> u64 {
        self.hash(entry.key.tag(), entry.key.key())
    }

    /// Doubles the buckets of `shard`'s table (a first table has four), counting its bytes.
    fn grow<W: Words>(&self, shard: &mut Shard<W>) {
        let buckets = shard.entries.num_buckets();
        let grown = 2 * buckets.max(2);
        shard.entries.resize(grown, |e| self.hash_of(e));
        self.bytes.fetch_add(
            table_bytes::<W>(grown) - table_bytes::<W>(buckets),
            Ordering::Relaxed,
        );
        shard.cursor = 0;
    }

    /// Accounts for an entry whose words storage changed size from `old` to `new` bytes.
    pub(crate) fn resized(&self, old: usize, new: usize) {
        self.bytes.fetch_add(new, Ordering::Relaxed);
        self.bytes.fetch_sub(old, Ordering::Relaxed);
    }

    /// Whether the store is at most half full, in keys and in bytes: room enough that the
    /// sweep may keep states that only just expired, and still clear them all before the
    /// store fills up (an eviction searches only a few buckets at a time for one).
    fn roomy(&self) -> bool {
        self.keys.load(Ordering::Relaxed) <= self.bounds.max_keys / 2
            && self.bytes.load(Ordering::Relaxed) <= self.bounds.max_bytes / 2
    }

    /// Drops the entries that may be swept (see [`sweepable`]) among the next few buckets at
    /// the shard's cursor.
    fn sweep<W: Words>(&self, shard: &mut Shard<W>, now: u64, score: &dyn Score, roomy: bool) {
        let buckets = shard.entries.num_buckets();
        if buckets == 0 {
            return;
        }
        for _ in 0..SWEEP_PER_INSERT {
            let at = shard.cursor % buckets;
            let drop = shard
                .entries
                .get_mut(at)
                .is_some_and(|e| sweepable(e, now, score, roomy));
            // A removal may shift a later entry back into `at`: the cursor stays to see it.
            if !(drop && self.remove_at(shard, at)) {
                shard.cursor = at + 1;
            }
        }
    }

    /// Evicts until the bounds hold again (see [`Self::evict`]). False if they still do not.
    fn make_room<W: Words>(&self, shard: &mut Shard<W>, now: u64, score: &dyn Score) -> bool {
        for _ in 0..MAX_EVICTIONS_PER_INSERT {
            if self.within_bounds() {
                return true;
            }
            if !self.evict(shard, now, score, Scope::Any) {
                break;
            }
        }
        self.within_bounds()
    }

    /// Evicts the entry that matters least among samples of this shard and a few others that
    /// are free right now (of any class, so that expired states of other rules go first); or,
    /// in `Scope::ExpiredElsewhere`, a state as good as new in the others. False when there is
    /// none it may evict.
    fn evict<W: Words>(
        &self,
        shard: &mut Shard<W>,
        now: u64,
        score: &dyn Score,
        scope: Scope,
    ) -> bool {
        let (own, mut seen) = match scope {
            Scope::Any => best(shard, now, score, self.refuses()),
            Scope::ExpiredElsewhere => (None, 0),
        };
        let mut chosen = own.map(|(s, at)| (s, None, at));
        // A few other shards, and more while the sample is thin: a shard that holds only a
        // used-up key must not make it the one to go.
        let shards = self.mask + 1;
        // A table that refuses takes the other shards in turn, from where the last eviction
        // left off, and searches as many that hold entries, as it takes a shard's buckets
        // (see `best`): a state as good as new anywhere is found within bounded refusals.
        let refuses = self.refuses();
        let start = next_random(&mut shard.random) as usize;
        let (mut tried, mut searched) = (0, 0);
        while tried < CLASSES * shards
            && (if refuses { searched } else { tried } < OTHER_SHARDS || seen < EVICTION_CANDIDATES)
            && chosen.is_none_or(|(s, _, _)| s < f64::INFINITY)
        {
            let n = if refuses {
                self.refusal_cursor.fetch_add(1, Ordering::Relaxed)
            } else {
                start + tried
            } % (CLASSES * shards);
            let (class, index) = ((n / shards) as u64, n % shards);
            tried += 1;
            let Some((best, count)) = self.best_in(class, index, now, score) else {
                continue;
            };
            searched += usize::from(count > 0);
            seen += count;
            let Some((s, at)) = best else {
                continue;
            };
            if chosen.is_none_or(|(c, _, _)| s > c) {
                chosen = Some((s, Some((class, index)), at));
            }
        }
        match chosen {
            Some((s, _, _)) if scope == Scope::ExpiredElsewhere && s < f64::INFINITY => false,
            None => false,
            Some((s, None, at)) => self.evict_own(shard, (s, at)),
            Some((s, Some((class, index)), at)) => {
                // Taken meanwhile: this shard's best instead, if it may go.
                if self.evictable(s) && self.remove_in(class, index, at) {
                    self.evicted(s);
                    true
                } else {
                    own.is_some_and(|chosen| self.evict_own(shard, chosen))
                }
            }
        }
    }

    /// Evicts `chosen`, an entry of `shard` and its score, if the table may evict it.
    fn evict_own<W: Words>(&self, shard: &mut Shard<W>, (s, at): (f64, usize)) -> bool {
        if self.evictable(s) && self.remove_at(shard, at) {
            self.evicted(s);
            true
        } else {
            false
        }
    }

    /// Whether a new key that finds no room is refused (rather than evicting a key whose
    /// state matters).
    fn refuses(&self) -> bool {
        self.bounds.when_full == WhenFull::Refuse
    }

    /// Whether an entry of score `s` may be evicted: one as good as new always; another
    /// unless the table refuses new keys when full.
    fn evictable(&self, s: f64) -> bool {
        s == f64::INFINITY || self.bounds.when_full == WhenFull::Evict
    }

    /// Counts an eviction of score `s`, and says the first that forgot a limiting key.
    fn evicted(&self, s: f64) {
        if s == f64::INFINITY {
            return;
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        if s <= 0.0 {
            self.limiting_evictions.fetch_add(1, Ordering::Relaxed);
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max_keys = self.bounds.max_keys,
                    max_bytes = self.bounds.max_bytes,
                    "the memory bound evicted a key that was still limiting: every key \
                     sampled was used up, and the one forgotten starts afresh; raise \
                     max_keys or max_bytes, or refuse new keys when full (said once)"
                );
            }
        }
    }

    fn within_bounds(&self) -> bool {
        self.keys.load(Ordering::Relaxed) <= self.bounds.max_keys
            && self.bytes.load(Ordering::Relaxed) <= self.bounds.max_bytes
    }

    /// The best eviction candidate of shard `index` of `class` (see [`best`]) and how many
    /// entries were compared, if the shard is free right now.
    fn best_in(
        &self,
        class: u64,
        index: usize,
        now: u64,
        score: &dyn Score,
    ) -> Option<(Option<(f64, usize)>, usize)> {
        fn of<W: Words>(
            shards: &Shards<W>,
            index: usize,
            now: u64,
            score: &dyn Score,
            refuses: bool,
        ) -> Option<(Option<(f64, usize)>, usize)> {
            Some(best(&mut *shards[index].try_lock()?, now, score, refuses))
        }
        let refuses = self.refuses();
        match class {
            0 => of(&self.one, index, now, score, refuses),
            1 => of(&self.two, index, now, score, refuses),
            2 => of(&self.three, index, now, score, refuses),
            3 => of(&self.four, index, now, score, refuses),
            _ => of(&self.many, index, now, score, refuses),
        }
    }

    /// Removes whatever is at bucket `at` of shard `index` of `class`, if the shard is free.
    fn remove_in(&self, class: u64, index: usize, at: usize) -> bool {
        fn of<W: Words>(table: &Table, shards: &Shards<W>, index: usize, at: usize) -> bool {
            shards[index]
                .try_lock()
                .is_some_and(|mut shard| table.remove_at(&mut shard, at))
        }
        match class {
            0 => of(self, &self.one, index, at),
            1 => of(self, &self.two, index, at),
            2 => of(self, &self.three, index, at),
            3 => of(self, &self.four, index, at),
            _ => of(self, &self.many, index, at),
        }
    }

    /// Forgets `key` of `tag`, whose words live in `class`: its next check finds it new.
    pub(crate) fn forget(&self, tag: u32, key: &[u8], class: Class) {
        fn of<W: Words>(table: &Table, shards: &Shards<W>, hash: u64, tag: u32, key: &[u8]) {
            let mut shard = shards[table.shard(hash)].lock();
            table.remove(&mut shard, hash, tag, key);
        }
        let hash = self.hash(tag, key);
        match class {
            Class::One => of(self, &self.one, hash, tag, key),
            Class::Two => of(self, &self.two, hash, tag, key),
            Class::Three => of(self, &self.three, hash, tag, key),
            Class::Four => of(self, &self.four, hash, tag, key),
            Class::Many => of(self, &self.many, hash, tag, key),
        }
    }

    /// Removes the entry of `key` of `tag`, if held.
    pub(crate) fn remove<W: Words>(&self, shard: &mut Shard<W>, hash: u64, tag: u32, key: &[u8]) {
        let removed = shard
            .entries
            .remove(hash, |e| e.key.is(tag, key), |e| self.hash_of(e));
        if let Some(removed) = removed {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.bytes
                .fetch_sub(removed.heap_bytes(), Ordering::Relaxed);
        }
    }

    /// Removes the entry at bucket `at`, if there is one. Entries after it may move back, as
    /// far as `at` (see [`Buckets::remove_at`]).
    fn remove_at<W: Words>(&self, shard: &mut Shard<W>, at: usize) -> bool {
        let Some(removed) = shard.entries.remove_at(at, |e| self.hash_of(e)) else {
            return false;
        };
        self.keys.fetch_sub(1, Ordering::Relaxed);
        self.bytes
            .fetch_sub(removed.heap_bytes(), Ordering::Relaxed);
        true
    }
}

/// Whether the sweep may drop `entry`: once idle while the store is roomy, else as soon as
/// its state is as good as new.
fn sweepable<W: Words>(entry: &mut Entry<W>, now: u64, score: &dyn Score, roomy: bool) -> bool {
    let (tag, words) = (entry.key.tag(), entry.words.as_mut());
    if roomy {
        score.idle(tag, words, now)
    } else {
        score.expired(tag, words, now)
    }
}

fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The entry of `shard` that matters least among a sample (an expired one at once), as its
/// score and bucket, `None` if the shard is empty; and how many entries were compared. When
/// the table `refuses` new keys it cannot make room for, only an expired state may go: the
/// probes are searched for one, from the shard's sweep cursor on, and `None` when none is.
fn best<W: Words>(
    shard: &mut Shard<W>,
    now: u64,
    score: &dyn Score,
    refuses: bool,
) -> (Option<(f64, usize)>, usize) {
    let buckets = shard.entries.num_buckets();
    if shard.entries.is_empty() || buckets == 0 {
        return (None, 0);
    }
    let (mut best, mut seen) = (None::<(f64, usize)>, 0);
    if refuses {
        // Only a state as good as new may go: entries from the sweep's cursor on, as many as
        // an eviction probes buckets (in at most four times as many buckets, since a full
        // store's tables may be a quarter full), each asked that (cheaper than a score), none
        // scored. The cursor moves past those that may not go, so that the refusals a shard
        // sees search all of it in turn rather than the same sample; it stops at the one
        // found, since removing it may shift a later entry back into its bucket (never before
        // it).
        let mut at = shard.cursor % buckets;
        for _ in 0..buckets.min(4 * EVICTION_PROBES) {
            if let Some(e) = shard.entries.get_mut(at) {
                seen += 1;
                if score.expired(e.key.tag(), e.words.as_mut(), now) {
                    shard.cursor = at;
                    return (Some((f64::INFINITY, at)), seen);
                }
            }
            at = (at + 1) % buckets;
            if seen == EVICTION_PROBES {
                break;
            }
        }
        shard.cursor = at;
        return (None, seen);
    }
    let start = next_random(&mut shard.random) as usize;
    for i in 0..buckets.min(EVICTION_PROBES) {
        let at = (start + i) % buckets;
        let Some(e) = shard.entries.get_mut(at) else {
            continue;
        };
        let Some(s) = score.score(e.key.tag(), e.words.as_mut(), now) else {
            return (Some((f64::INFINITY, at)), seen + 1);
        };
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, at));
        }
        seen += 1;
        if seen == EVICTION_CANDIDATES {
            break;
        }
    }
    if best.is_some() {
        return (best, seen);
    }
    // A sparse table: its first entry.
    let first = (0..buckets).find(|&at| shard.entries.get(at).is_some());
    let best = first.and_then(|at| {
        let e = shard.entries.get_mut(at)?;
        let s = score.score(e.key.tag(), e.words.as_mut(), now);
        Some((s.unwrap_or(f64::INFINITY), at))
    });
    (best, 1)
}

/// Shards of one class locked together for a batch, in ascending order; with every class
/// locked in class order, any two batches lock in the same order and cannot deadlock.
pub(crate) struct Locked<'a, W> {
    indices: Vec<usize>,
    guards: Vec<SpinMutexGuard<'a, Shard<W>>>,
}

impl<'a, W> Locked<'a, W> {
    /// Locks `indices` (sorted and deduplicated here) of `shards`.
    pub(crate) fn lock(shards: &'a Shards<W>, mut indices: Vec<usize>) -> Self {
        indices.sort_unstable();
        indices.dedup();
        let guards = indices.iter().map(|&i| shards[i].lock()).collect();
        Self { indices, guards }
    }

    pub(crate) fn shard(&mut self, index: usize) -> &mut Shard<W> {
        let at = self
            .indices
            .binary_search(&index)
            .expect("the batch locked this shard");
        &mut self.guards[at]
    }
}

/// One key of [`Table::access`]: `key` of `tag`, whose state is `words` words.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access<'a> {
    pub(crate) tag: u32,
    pub(crate) key: &'a [u8],
    pub(crate) words: usize,
}

#[cfg(feature = "redis")]
impl Table {
    /// Locks the shards of `keys` together (in the global order, so never deadlocking) and
    /// runs `f` over a copy of each key's words, zeros for a key not held; then writes the
    /// words back, and inserts each key not held whose words are no longer all zeros. Keys
    /// must be distinct. For the stores that keep their own words (hybrid, lease).
    pub(crate) fn access<R>(
        &self,
        keys: &[Access<'_>],
        now: u64,
        score: &dyn Score,
        f: impl FnOnce(&mut [Vec<u64>]) -> R,
    ) -> R {
        let hashes: Vec<u64> = keys.iter().map(|k| self.hash(k.tag, k.key)).collect();
        let wanted = |class: Class| -> Vec<usize> {
            keys.iter()
                .zip(&hashes)
                .filter(|(k, _)| Class::of(k.words) == class)
                .map(|(_, &hash)| self.shard(hash))
                .collect()
        };
        let mut one = Locked::lock(&self.one, wanted(Class::One));
        let mut two = Locked::lock(&self.two, wanted(Class::Two));
        let mut three = Locked::lock(&self.three, wanted(Class::Three));
        let mut four = Locked::lock(&self.four, wanted(Class::Four));
        let mut many = Locked::lock(&self.many, wanted(Class::Many));
        let mut words: Vec<Vec<u64>> = keys
            .iter()
            .zip(&hashes)
            .map(|(k, &hash)| match Class::of(k.words) {
                Class::One => self.read(&mut one, hash, k),
                Class::Two => self.read(&mut two, hash, k),
                Class::Three => self.read(&mut three, hash, k),
                Class::Four => self.read(&mut four, hash, k),
                Class::Many => self.read(&mut many, hash, k),
            })
            .collect();
        let result = f(&mut words);
        for ((k, &hash), words) in keys.iter().zip(&hashes).zip(&words) {
            match Class::of(k.words) {
                Class::One => self.write(&mut one, hash, k, words, now, score),
                Class::Two => self.write(&mut two, hash, k, words, now, score),
                Class::Three => self.write(&mut three, hash, k, words, now, score),
                Class::Four => self.write(&mut four, hash, k, words, now, score),
                Class::Many => self.write(&mut many, hash, k, words, now, score),
            }
        }
        result
    }

    fn read<W: Words>(&self, locked: &mut Locked<'_, W>, hash: u64, k: &Access<'_>) -> Vec<u64> {
        let shard = locked.shard(self.shard(hash));
        match shard.entries.find_mut(hash, |e| e.key.is(k.tag, k.key)) {
            Some(entry) => entry.words.as_ref()[..k.words].to_vec(),
            None => vec![0; k.words],
        }
    }

    fn write<W: Words>(
        &self,
        locked: &mut Locked<'_, W>,
        hash: u64,
        k: &Access<'_>,
        words: &[u64],
        now: u64,
        score: &dyn Score,
    ) {
        let shard = locked.shard(self.shard(hash));
        if let Some(entry) = shard.entries.find_mut(hash, |e| e.key.is(k.tag, k.key)) {
            entry.words.as_mut()[..k.words].copy_from_slice(words);
            return;
        }
        if words.iter().any(|&w| w != 0) {
            let mut stored = W::zeroed(k.words);
            stored.as_mut()[..k.words].copy_from_slice(words);
            self.insert(shard, hash, Entry::new(k.tag, k.key, stored), now, score);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Bounds, Table, load_limit};
    use crate::store::WhenFull;

    /// A store filled with `max_keys` random keys overflows no shard's table, but in under one
    /// fill of a billion: the Chernoff bound on one shard's count (binomial, of mean `share`)
    /// exceeding what its largest table holds at three quarters full, times the shards.
    #[test]
    fn a_random_fill_of_max_keys_fits_every_shard() {
        for max_keys in [
            1, 16, 100, 300, 1_000, 3_000, 10_000, 100_000, 1_000_000, 10_000_000,
        ] {
            for shards in [16, 64, 1_024] {
                let table = Table::new(Bounds {
                    max_keys,
                    max_bytes: usize::MAX,
                    shards,
                    when_full: WhenFull::Refuse,
                });
                let mean = max_keys as f64 / shards as f64;
                let holds = load_limit(table.max_buckets) as f64;
                // P(X >= c) <= exp(-mean * h(c / mean)), h(x) = x ln x - x + 1, for c > mean.
                let x = holds / mean;
                let overflow = (-mean * (x * x.ln() - x + 1.0)).exp() * shards as f64;
                assert!(
                    overflow < 1e-9,
                    "{max_keys} keys over {shards} shards: {holds} a shard, overflow {overflow:e}"
                );
            }
        }
    }

    /// A state of one to four words lives in a bucket of just its size: a 24-byte key (16
    /// bytes inline) and its words.
    #[test]
    fn a_state_takes_a_bucket_of_its_own_size() {
        let sizes: Vec<usize> = (1..=4).map(|words| Table::entry_bytes(words, 16)).collect();
        assert_eq!(sizes, [32, 40, 48, 56]);
    }
}
