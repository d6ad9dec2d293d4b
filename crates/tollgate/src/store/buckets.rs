//! The buckets of one shard's table: open addressing with linear probing, and no control
//! bytes. A lookup reads buckets from the one its hash names (the hash's low bits) until it
//! finds its entry or an empty bucket, so a check touches its bucket's cache line alone,
//! where a table with control bytes (hashbrown's) reads their line first: at a million keys
//! that read came from the last-level cache on every check (BENCHMARKS.md, "A million keys").
//!
//! A removal shifts the entries after it back (no tombstones), so the buckets never fill with
//! the marks of removed entries, and every entry stays reachable from the bucket its hash
//! names without a gap. The owner keeps the table at most three quarters full (see
//! `table::load_limit`), so that a lookup always reaches an empty bucket.

/// Buckets, a power of two of them (or none), each empty or holding one entry.
pub(crate) struct Buckets<T> {
    cells: Box<[Option<T>]>,
    len: usize,
}

impl<T> Buckets<T> {
    /// No buckets; the first insert needs [`Self::resize`] first.
    pub(crate) fn new() -> Self {
        Self {
            cells: Box::default(),
            len: 0,
        }
    }

    pub(crate) fn num_buckets(&self) -> usize {
        self.cells.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bucket an entry of `hash` is looked for from.
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        hash as usize & (self.cells.len() - 1)
    }

    /// The bucket of the entry of `hash` that `is` accepts.
    #[inline(always)]
    fn position(&self, hash: u64, is: impl Fn(&T) -> bool) -> Option<usize> {
        let cells = &*self.cells;
        if cells.is_empty() {
            return None;
        }
        // Masked where it indexes, so that no bounds check is left in the loop.
        let mask = cells.len() - 1;
        let mut at = hash as usize;
        loop {
            at &= mask;
            match &cells[at] {
                None => return None,
                Some(entry) if is(entry) => return Some(at),
                Some(_) => at += 1,
            }
        }
    }

    #[inline(always)]
    pub(crate) fn find_mut(&mut self, hash: u64, is: impl Fn(&T) -> bool) -> Option<&mut T> {
        let at = self.position(hash, is)?;
        self.cells[at].as_mut()
    }

    /// The entry in bucket `at`, if any (`at` below [`Self::num_buckets`]).
    pub(crate) fn get(&self, at: usize) -> Option<&T> {
        self.cells[at].as_ref()
    }

    /// The entry in bucket `at`, if any (`at` below [`Self::num_buckets`]).
    pub(crate) fn get_mut(&mut self, at: usize) -> Option<&mut T> {
        self.cells[at].as_mut()
    }

    /// Inserts `entry` of `hash`, which the table must not hold, into the first empty bucket
    /// from its home.
    ///
    /// # Panics
    /// If the buckets would be left without an empty one (the owner grows them first).
    pub(crate) fn insert(&mut self, hash: u64, entry: T) {
        assert!(self.len + 1 < self.cells.len(), "a bucket stays empty");
        let mask = self.cells.len() - 1;
        let mut at = self.home(hash);
        while self.cells[at].is_some() {
            at = (at + 1) & mask;
        }
        self.cells[at] = Some(entry);
        self.len += 1;
    }

    /// Removes and returns the entry of `hash` that `is` accepts; `hash_of` gives the hash of
    /// any entry, for the entries that shift back into its bucket.
    pub(crate) fn remove(
        &mut self,
        hash: u64,
        is: impl Fn(&T) -> bool,
        hash_of: impl Fn(&T) -> u64,
    ) -> Option<T> {
        let at = self.position(hash, is)?;
        self.remove_at(at, hash_of)
    }

    /// Removes and returns the entry in bucket `at`, if any, shifting back each entry after
    /// it that may then be found nearer its home (`hash_of` gives an entry's hash). An entry
    /// after `at` (wrapping) may so move back as far as `at`, never before it.
    pub(crate) fn remove_at(&mut self, at: usize, hash_of: impl Fn(&T) -> u64) -> Option<T> {
        let removed = self.cells[at].take()?;
        self.len -= 1;
        let mask = self.cells.len() - 1;
        let mut hole = at;
        let mut next = (at + 1) & mask;
        while let Some(entry) = &self.cells[next] {
            // It may fill the hole unless its home lies after the hole, up to where it is.
            let from_home = next.wrapping_sub(self.home(hash_of(entry))) & mask;
            if from_home >= next.wrapping_sub(hole) & mask {
                self.cells[hole] = self.cells[next].take();
                hole = next;
            }
            next = (next + 1) & mask;
        }
        Some(removed)
    }

    /// Moves every entry into `buckets` buckets (a power of two, more than the entries),
    /// placed by `hash_of`.
    pub(crate) fn resize(&mut self, buckets: usize, hash_of: impl Fn(&T) -> u64) {
        assert!(buckets.is_power_of_two() && buckets > self.len);
        let old = std::mem::replace(
            &mut self.cells,
            std::iter::repeat_with(|| None).take(buckets).collect(),
        );
        self.len = 0;
        for entry in old.into_vec().into_iter().flatten() {
            let hash = hash_of(&entry);
            self.insert(hash, entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::Buckets;

    /// A hash of few values, so that entries share homes and runs wrap around the end.
    fn hash(key: u16) -> u64 {
        u64::from(key % 7) * 5
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16),
        Remove(u16),
        RemoveAt(usize),
        Grow,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u16..40).prop_map(Op::Insert),
            2 => (0u16..40).prop_map(Op::Remove),
            2 => (0usize..64).prop_map(Op::RemoveAt),
            1 => Just(Op::Grow),
        ]
    }

    proptest! {
        /// Inserts, removals by key and by bucket, and growth, on keys whose hashes collide:
        /// the buckets hold exactly what a map holds, and every entry is found from its home.
        #[test]
        fn every_entry_is_found_after_any_removals(ops in proptest::collection::vec(op(), 0..200)) {
            let mut buckets: Buckets<(u16, u32)> = Buckets::new();
            buckets.resize(8, |e| hash(e.0));
            let mut model = HashMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(key) if !model.contains_key(&key) => {
                        if buckets.len() + 2 > buckets.num_buckets() {
                            buckets.resize(2 * buckets.num_buckets(), |e| hash(e.0));
                        }
                        buckets.insert(hash(key), (key, n as u32));
                        model.insert(key, n as u32);
                    }
                    Op::Insert(key) => {
                        let found = buckets.find_mut(hash(key), |e| e.0 == key).unwrap();
                        found.1 = n as u32;
                        model.insert(key, n as u32);
                    }
                    Op::Remove(key) => {
                        let removed = buckets.remove(hash(key), |e| e.0 == key, |e| hash(e.0));
                        prop_assert_eq!(removed.map(|e| e.1), model.remove(&key));
                    }
                    Op::RemoveAt(at) => {
                        let at = at % buckets.num_buckets();
                        if let Some(removed) = buckets.remove_at(at, |e| hash(e.0)) {
                            prop_assert_eq!(model.remove(&removed.0), Some(removed.1));
                        }
                    }
                    // Up to a few times the keys' room: a larger table is as small's case.
                    Op::Grow if buckets.num_buckets() < 256 => {
                        buckets.resize(2 * buckets.num_buckets(), |e| hash(e.0));
                    }
                    Op::Grow => {}
                }
                prop_assert_eq!(buckets.len(), model.len());
                for key in 0..40u16 {
                    prop_assert_eq!(
                        buckets.find_mut(hash(key), |e| e.0 == key).map(|e| e.1),
                        model.get(&key).copied()
                    );
                }
                let held = (0..buckets.num_buckets()).filter(|&at| buckets.get(at).is_some());
                prop_assert_eq!(held.count(), model.len());
            }
        }
    }

    /// An entry takes no more room in a bucket than it does alone: a bucket is empty by a
    /// value of the entry's own that it never holds.
    #[test]
    fn a_bucket_is_as_large_as_its_entry() {
        use crate::store::table::Entry;
        assert_eq!(size_of::<Option<Entry<[u64; 1]>>>(), 32);
        assert_eq!(size_of::<Option<Entry<[u64; 2]>>>(), 40);
        assert_eq!(size_of::<Option<Entry<Box<[u64]>>>>(), 40);
    }
}
