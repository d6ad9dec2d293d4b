//! Under churn (many more distinct keys than the store holds, each checked once) the memory a
//! full store takes stays what it took when it first filled, and the byte bound holds for what
//! the process really holds: tables included. A test-sized version of 500,000 keys churned by
//! 12 million, whose tables used to double once evictions had left enough deleted buckets.
//!
//! In the memory binary (`tests/memory`), whose tests nextest runs each in a process of its
//! own, so that no other test shares the process whose memory it reads.

#![cfg(target_os = "linux")]

use crate::churning;

use churning::{check, limiter, resident};
use tollgate::MemoryStore;

#[test]
fn churn_does_not_grow_a_full_store() {
    // The size of the report that found the tables doubling, with TOLLGATE_CHURN_KEYS=500000.
    let keys = std::env::var("TOLLGATE_CHURN_KEYS").ok();
    let keys: u64 = keys.map_or(50_000, |k| k.parse().expect("a number of keys"));
    let before = resident();
    let limiter = limiter(
        MemoryStore::builder()
            .max_keys(keys as usize)
            .build()
            .unwrap(),
    );
    let store = limiter.store().clone();
    for i in 0..keys {
        check(&limiter, i);
    }
    let (full_bytes, full_resident) = (store.bytes(), resident() - before);
    // Twelve times as many keys again, each new one evicting one held.
    for i in keys..13 * keys {
        check(&limiter, i);
        if i % keys == 0 {
            assert_eq!(store.keys() as u64, keys);
            assert_eq!(store.bytes(), full_bytes, "the tables grew after {i} keys");
        }
    }
    assert_eq!(store.evictions(), 12 * keys);
    let churned = resident() - before;
    println!(
        "{keys} keys held: {full_bytes} bytes counted ({} per key), resident +{} KiB full, \
         +{} KiB after 12x churn",
        full_bytes / keys as usize,
        full_resident >> 10,
        churned >> 10
    );
    // What the tables allocate, and the allocator's own rounding.
    assert!(
        churned <= full_bytes + full_bytes / 4 + (1 << 20),
        "resident +{churned} bytes for {full_bytes} counted"
    );
}
