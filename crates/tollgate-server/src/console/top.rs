//! The hottest keys of a rule, by hits and by denials: Space-Saving summaries (Metwally,
//! Agrawal and El Abbadi) of a fixed number of counters, whatever the number of keys. A key
//! seen more than `n / capacity` times in a stream of `n` is always held, and a held key's
//! count overstates its true count by at most its `error` (itself at most `n / capacity`).
//! "Now" is the current minute and the one before: two generations, turned every minute.

use std::collections::HashMap;
use std::hash::BuildHasher;

use serde::Serialize;

/// Counters per summary.
pub const CAPACITY: usize = 64;

/// Keys longer than this are held by their first bytes, marked as cut (a reset needs the
/// whole key).
pub const MAX_KEY: usize = 256;

/// One Space-Saving summary. Its keys are indexed by a hash table of counter numbers (no
/// allocation to find one), and the least counted counters are kept in a list rebuilt by a
/// scan only when it runs out: with counts of 1, counting a key costs a lookup, and a
/// newcomer takes the least counted counter's place and its key buffer (allocating only when
/// the key is longer than that buffer).
#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    hasher: foldhash::fast::RandomState,
    /// The counters' numbers, by their keys' hashes.
    index: hashbrown::HashTable<u32>,
    /// Per counter: its key's hash, count, possible overcount and key.
    hashes: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    keys: Vec<Vec<u8>>,
    /// The least count when `least` was made, and the counters that had it (a counter
    /// counted since then is skipped when taken).
    least_count: u64,
    least: Vec<u32>,
    /// Every count added.
    total: u64,
    /// How many times counts were added: fewer than `total` when a sample stood for several.
    updates: u64,
}

/// A key as a summary holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hot {
    /// The key (its first [`MAX_KEY`] bytes when `cut`).
    #[serde(serialize_with = "lossy")]
    pub key: Vec<u8>,
    /// Whether the key was longer and is cut.
    pub cut: bool,
    /// Its count, at least its true count.
    pub count: u64,
    /// By how much `count` may overstate the true count.
    pub error: u64,
    /// Whether `count` is estimated from a sample (under heavy traffic): then it may also
    /// be under the true count.
    pub estimated: bool,
}

fn lossy<S: serde::Serializer>(key: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(key))
}

impl SpaceSaving {
    /// A summary of `capacity` counters (at most `u32::MAX`), allocated as keys come.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, u32::MAX as usize);
        Self {
            capacity,
            hasher: foldhash::fast::RandomState::default(),
            index: hashbrown::HashTable::new(),
            hashes: Vec::new(),
            counts: Vec::new(),
            errors: Vec::new(),
            keys: Vec::new(),
            least_count: 0,
            least: Vec::new(),
            total: 0,
            updates: 0,
        }
    }

    /// Counts `n` more of `key` (`n` of 0 counts nothing).
    pub fn add(&mut self, key: &[u8], n: u64) {
        if n == 0 {
            return;
        }
        self.total += n;
        self.updates += 1;
        let hash = self.hasher.hash_one(key);
        let keys = &self.keys;
        if let Some(&i) = self.index.find(hash, |&i| keys[i as usize] == key) {
            self.counts[i as usize] += n;
            return;
        }
        let hashes = &self.hashes;
        if self.counts.len() < self.capacity {
            let i = self.counts.len() as u32;
            self.index.insert_unique(hash, i, |&j| hashes[j as usize]);
            self.hashes.push(hash);
            self.counts.push(n);
            self.errors.push(0);
            self.keys.push(key.to_vec());
            return;
        }
        // The least counted gives its place, and its count as the newcomer's possible error.
        let i = self.take_least();
        let least = self.counts[i];
        let old = self.hashes[i];
        if let Ok(entry) = self.index.find_entry(old, |&j| j as usize == i) {
            entry.remove();
        }
        let hashes = &self.hashes;
        self.index
            .insert_unique(hash, i as u32, |&j| hashes[j as usize]);
        self.hashes[i] = hash;
        self.counts[i] = least + n;
        self.errors[i] = least;
        self.keys[i].clear();
        self.keys[i].extend_from_slice(key);
    }

    /// A counter with the least count, off the list of them (rebuilt by a scan when empty).
    /// Counts only grow, so a counter still at the count it was listed with is a least one.
    fn take_least(&mut self) -> usize {
        loop {
            while let Some(i) = self.least.pop() {
                if self.counts[i as usize] == self.least_count {
                    return i as usize;
                }
            }
            self.least_count = self.counts.iter().copied().min().unwrap_or(0);
            let least_count = self.least_count;
            self.least.extend(
                (0..self.counts.len() as u32).filter(|&i| self.counts[i as usize] == least_count),
            );
        }
    }

    /// Every count added so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// How many times counts were added so far (each sample once).
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// (key, count, error) of every counter, most counted first.
    fn sorted(&self) -> Vec<(&[u8], u64, u64)> {
        let mut sorted: Vec<(&[u8], u64, u64)> = (0..self.keys.len())
            .map(|i| (&self.keys[i][..], self.counts[i], self.errors[i]))
            .collect();
        sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        sorted
    }
}

/// A rule's hottest keys now: by hits and by denials, in two generations each. Not
/// synchronized: its owner locks it (see `Watch`).
#[derive(Debug)]
pub struct HotKeys {
    /// The minute (since the epoch) the current generation counts.
    minute: u64,
    hits: [SpaceSaving; 2],
    denials: [SpaceSaving; 2],
}

impl Default for HotKeys {
    fn default() -> Self {
        let two = || [SpaceSaving::new(CAPACITY), SpaceSaving::new(CAPACITY)];
        Self {
            minute: 0,
            hits: two(),
            denials: two(),
        }
    }
}

impl HotKeys {
    /// Counts a check of `key` at `second` (since the epoch) `hits` times and a denial of it
    /// `denials` times (0: not at all; more than 1: a sample standing for that many).
    pub fn add(&mut self, second: u64, key: &[u8], hits: u64, denials: u64) {
        let key = &key[..key.len().min(MAX_KEY + 1)];
        self.turn(second / 60);
        self.hits[0].add(key, hits);
        self.denials[0].add(key, denials);
    }

    /// The summaries (hits, denials) that count at `second`: the current minute's and the
    /// one before's.
    pub fn now(&self, second: u64) -> Vec<(&SpaceSaving, &SpaceSaving)> {
        let minute = second / 60;
        let generations = if self.minute == minute {
            0..2
        } else if self.minute + 1 == minute {
            0..1
        } else {
            0..0
        };
        generations
            .map(|g| (&self.hits[g], &self.denials[g]))
            .collect()
    }

    fn turn(&mut self, minute: u64) {
        if minute == self.minute {
            return;
        }
        let fresh = || SpaceSaving::new(CAPACITY);
        if minute == self.minute + 1 {
            self.hits.swap(0, 1);
            self.denials.swap(0, 1);
            self.hits[0] = fresh();
            self.denials[0] = fresh();
        } else {
            self.hits = [fresh(), fresh()];
            self.denials = [fresh(), fresh()];
        }
        self.minute = minute;
    }
}

/// The `n` most counted keys of `summaries` (of generations, of shards), counts and errors
/// added. A key with more than 1/[`CAPACITY`] of all their counts has more than that share
/// of one summary's, so it is held there and comes out.
pub fn merged<'a>(summaries: impl IntoIterator<Item = &'a SpaceSaving>, n: usize) -> Vec<Hot> {
    let mut by_key: HashMap<&[u8], (u64, u64, bool)> = HashMap::new();
    for summary in summaries {
        for (key, count, error) in summary.sorted() {
            let entry = by_key.entry(key).or_default();
            entry.0 += count;
            entry.1 += error;
            entry.2 |= summary.updates < summary.total;
        }
    }
    let mut hot: Vec<Hot> = by_key
        .into_iter()
        .map(|(key, (count, error, estimated))| Hot {
            cut: key.len() > MAX_KEY,
            key: key[..key.len().min(MAX_KEY)].to_vec(),
            count,
            error,
            estimated,
        })
        .collect();
    hot.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    hot.truncate(n);
    hot
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A skewed stream: key k appears about n / (k + 1) times (Zipf's law), interleaved.
    fn zipf(keys: u64, rounds: u64) -> Vec<u64> {
        let mut stream = Vec::new();
        for round in 1..=rounds {
            for k in 0..keys {
                if round % (k + 1) == 0 {
                    stream.push(k);
                }
            }
        }
        stream
    }

    #[test]
    fn space_saving_keeps_its_error_bound() {
        let stream = zipf(5_000, 2_000);
        let n = stream.len() as u64;
        let mut summary = SpaceSaving::new(CAPACITY);
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for k in &stream {
            summary.add(&k.to_le_bytes(), 1);
            *truth.entry(*k).or_default() += 1;
        }
        assert_eq!(summary.total(), n);
        let bound = n / CAPACITY as u64;
        let held: HashMap<u64, (u64, u64)> = summary
            .sorted()
            .into_iter()
            .map(|(key, count, error)| {
                (u64::from_le_bytes(key.try_into().unwrap()), (count, error))
            })
            .collect();
        assert_eq!(held.len(), CAPACITY);
        for (key, &(count, error)) in &held {
            let real = truth[key];
            assert!(count >= real, "{key}: {count} < {real}");
            assert!(count - real <= error, "{key}: beyond its error");
            assert!(error <= bound, "{key}: error {error} > n/k {bound}");
        }
        // Every key seen more than n / capacity times is held.
        for (key, &count) in &truth {
            if count > bound {
                assert!(
                    held.contains_key(key),
                    "{key} ({count} > {bound}) was dropped"
                );
            }
        }
        // And the ten hottest come out in order.
        let top: Vec<u64> = summary.sorted()[..10]
            .iter()
            .map(|(key, _, _)| u64::from_le_bytes((*key).try_into().unwrap()))
            .collect();
        assert_eq!(top, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn its_index_and_least_list_stay_true_under_churn() {
        let mut summary = SpaceSaving::new(8);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Hot keys 0-3 and a long tail, of lengths 1 to 40.
            let k = if seed.is_multiple_of(3) {
                seed % 4
            } else {
                seed % 5_000
            };
            let key = vec![b'a' + (k % 26) as u8; 1 + (k % 40) as usize];
            let key = [key, k.to_le_bytes().to_vec()].concat();
            summary.add(&key, 1 + step % 2);
            // Space-Saving's invariant: the counters add up to every count added.
            assert_eq!(summary.counts.iter().sum::<u64>(), summary.total());
            if step % 97 == 0 {
                assert_eq!(summary.index.len(), summary.counts.len());
                for (i, key) in summary.keys.iter().enumerate() {
                    let hash = summary.hasher.hash_one(key);
                    let found = summary
                        .index
                        .find(hash, |&j| summary.keys[j as usize] == *key);
                    assert_eq!(found, Some(&(i as u32)), "counter {i} is found by its key");
                }
            }
        }
        let (hot, _, _) = summary.sorted()[0];
        assert!(u64::from_le_bytes(hot[hot.len() - 8..].try_into().unwrap()) < 4);
    }

    #[test]
    fn hot_keys_are_of_this_minute_and_the_last() {
        fn top(hot: &HotKeys, second: u64) -> (Vec<Hot>, Vec<Hot>) {
            let now = hot.now(second);
            (
                merged(now.iter().map(|(h, _)| *h), 10),
                merged(now.iter().map(|(_, d)| *d), 10),
            )
        }
        let mut hot = HotKeys::default();
        let t = 1_700_006_400;
        for _ in 0..5 {
            hot.add(t, b"old", 1, 0);
        }
        for _ in 0..3 {
            hot.add(t + 61, b"new", 1, 1);
        }
        let (hits, denials) = top(&hot, t + 61);
        assert_eq!(hits.iter().map(|h| h.count).collect::<Vec<_>>(), [5, 3]);
        assert_eq!(denials.len(), 1);
        assert_eq!(denials[0].key, b"new");
        // Two minutes on, the first minute is gone.
        let (hits, _) = top(&hot, t + 125);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].key, b"new");
        let long = vec![b'x'; 1_000];
        hot.add(t + 125, &long, 1, 0);
        let (hits, _) = top(&hot, t + 125);
        assert!(hits.iter().any(|h| h.cut && h.key.len() == MAX_KEY));
    }
}
