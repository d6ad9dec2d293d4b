//! One million live keys of 16 bytes stay under 120 MB of resident memory (measured: 66 MB with
//! GCRA, 86 to 96 MB with the token bucket, whose tables' growth the allocator does not always
//! hand back at once). The sliding window's three words are held to the bytes the store
//! counts, exact whatever the allocator kept of the runs before: 97 MiB.
//!
//! In the memory binary (`tests/memory`), whose tests nextest runs each in a process of its
//! own, so that no other test shares the process whose memory it reads.

#![cfg(target_os = "linux")]

use crate::churning;

use churning::resident;
use tollgate::{Algorithm, Limiter, ManualClock, MemoryStore, Rule, Tier, TokenBucket};

const KEYS: u64 = 1_000_000;
const BUDGET: u64 = 120 << 20;

/// The resident memory a million keys added, and the bytes the store counts for them.
fn million_keys(algorithm: Algorithm, tier: Tier) -> (u64, u64) {
    let rule = Rule::new("footprint", algorithm, [tier]).unwrap();
    let before = resident();
    let store = MemoryStore::builder()
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap();
    let limiter = Limiter::builder(rule)
        .store(store)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    for i in 0..KEYS {
        let key = format!("{i:016x}");
        assert!(limiter.check_now(key.as_bytes(), 1).unwrap().allowed());
    }
    assert_eq!(limiter.store().keys() as u64, KEYS);
    assert_eq!(limiter.store().evictions(), 0);
    let counted = limiter.store().bytes() as u64;
    (resident().saturating_sub(before) as u64, counted)
}

#[test]
fn a_million_keys_fit_in_120_mb() {
    let (gcra, _) = million_keys(Algorithm::Gcra, Tier::per_second(10));
    assert!(gcra < BUDGET, "GCRA: {} MB", gcra >> 20);
    let (bucket, _) = million_keys(
        Algorithm::TokenBucket(TokenBucket::default()),
        Tier::per_day(20),
    );
    assert!(bucket < BUDGET, "token bucket: {} MB", bucket >> 20);
    // In 48-byte buckets of their own size (113 MiB in the four-word class's 56).
    let (_, sliding) = million_keys(Algorithm::SlidingWindow, Tier::per_day(20));
    assert!(sliding < 100 << 20, "sliding window: {} MiB", sliding >> 20);
    println!(
        "resident for 1M keys: GCRA {} MB, token bucket {} MB; sliding window counted {} MiB",
        gcra >> 20,
        bucket >> 20,
        sliding >> 20
    );
}
