//! What the in-process benches share: every algorithm configured to admit nearly every check,
//! governor's quota of the same rate, and 16-byte keys.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::Quota;
use tollgate::{
    Algorithm, LeakyBucket, Limiter, MemoryStore, Rule, SubWindows, Tier, TokenBucket, WarmUp,
};

pub(crate) const RATE: u64 = 1_000_000_000;
/// Keys of the largest bench; a store has room for four times as many, so that it is never
/// near its bound (where the sweep drops expired keys at once).
pub(crate) const KEYS: usize = 1_000_000;

pub(crate) fn tier() -> Tier {
    Tier::per_second(RATE)
}

/// Every algorithm, configured to admit nearly every check.
pub(crate) fn algorithms() -> Vec<(&'static str, Algorithm, Tier)> {
    let bucket = tier().with_burst(RATE);
    vec![
        ("fixed_window", Algorithm::FixedWindow, tier()),
        ("sliding_window", Algorithm::SlidingWindow, tier()),
        (
            "sub_windows_10",
            Algorithm::SubWindows(SubWindows { count: 10 }),
            tier(),
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog,
            Tier::new(10, Duration::from_micros(1)),
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket(TokenBucket::default()),
            bucket.clone(),
        ),
        ("interval_bucket", Algorithm::IntervalBucket, tier()),
        (
            "leaky_bucket",
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            bucket.clone(),
        ),
        (
            "leaky_bucket_shaper",
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            bucket.clone(),
        ),
        ("gcra", Algorithm::Gcra, bucket),
        (
            "warm_up",
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(1))),
            tier(),
        ),
    ]
}

pub(crate) fn limiter(algorithm: Algorithm, tier: Tier) -> Limiter {
    let rule = Rule::new("bench", algorithm, [tier]).expect("valid rule");
    let store = MemoryStore::builder().max_keys(4 * KEYS).build().unwrap();
    Limiter::builder(rule)
        .store(store)
        .build()
        .expect("fits the store")
}

pub(crate) fn quota() -> Quota {
    let rate = NonZeroU32::new(RATE as u32).unwrap();
    Quota::per_second(rate).allow_burst(rate)
}

pub(crate) type Key = [u8; 16];

pub(crate) fn key(i: usize) -> Key {
    let mut key = [0; 16];
    key.copy_from_slice(format!("{i:016x}").as_bytes());
    key
}
