//! What the memory tests that read this process's resident memory share: they are a binary
//! of their own, and nextest runs each in a process of its own, so that no other test shares
//! the process.

#![allow(dead_code, unreachable_pub)]

use tollgate::{Algorithm, Limiter, ManualClock, MemoryStore, Rule, Tier};

/// Resident memory of this process, in bytes.
pub fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("procfs");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A limiter on `store` whose keys never expire in a test (GCRA, 20 a day): every eviction
/// forgets state that mattered.
pub fn limiter(store: MemoryStore) -> Limiter<MemoryStore, ManualClock> {
    let rule = Rule::new("churn", Algorithm::Gcra, [Tier::per_day(20)]).unwrap();
    Limiter::builder(rule)
        .store(store)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

/// Checks the `i`th key (16 bytes), which must be admitted.
pub fn check(limiter: &Limiter<MemoryStore, ManualClock>, i: u64) {
    let key = format!("{i:016x}");
    assert!(limiter.check_now(key.as_bytes(), 1).unwrap().allowed());
}
