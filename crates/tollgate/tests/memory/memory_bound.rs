//! The byte bound holds for what the process really holds, tables included: a store bounded
//! only by bytes, checked with ever more distinct keys, stays within them.
//!
//! In the memory binary (`tests/memory`), whose tests nextest runs each in a process of its
//! own, so that no other test shares the process whose memory it reads.

#![cfg(target_os = "linux")]

use crate::churning;

use churning::{check, limiter, resident};
use tollgate::MemoryStore;

#[test]
fn max_bytes_bounds_the_tables_too() {
    const MAX_BYTES: usize = 2 << 20;
    let before = resident();
    let store = MemoryStore::builder().max_bytes(MAX_BYTES).build().unwrap();
    let limiter = limiter(store.clone());
    for i in 0..400_000 {
        check(&limiter, i);
        assert!(
            store.bytes() <= MAX_BYTES,
            "{} bytes after {i} keys",
            store.bytes()
        );
    }
    let held = resident() - before;
    println!(
        "max_bytes {MAX_BYTES}: {} keys in {} bytes counted, resident +{} KiB",
        store.keys(),
        store.bytes(),
        held >> 10
    );
    // Shards fill unevenly and a table grows by doubling: most of the bound goes to keys.
    assert!(store.keys() * 33 > MAX_BYTES / 4, "{} keys", store.keys());
    assert!(
        held <= MAX_BYTES + MAX_BYTES / 4 + (1 << 20),
        "resident +{held} bytes for a bound of {MAX_BYTES}"
    );
}
