//! The Lua scripts: for each algorithm, the shared prelude, the algorithm, then a driver. A
//! script decides a whole check, every tier, atomically in one round trip; its KEYS/ARGV
//! contract heads `lua/prelude.lua`.
//!
//! Why scripts: a script runs alone, so keys cannot expire or change between its reads and
//! its writes, as they can between `MULTI` and `EXEC`, and no lock is ever held across the
//! network.

use std::sync::LazyLock;

use redis::Script;

use crate::algorithm::Algorithm;

macro_rules! script {
    ($algorithm:literal, $driver:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/prelude.lua"),
                include_str!(concat!("lua/", $algorithm, ".lua")),
                include_str!(concat!("lua/", $driver, ".lua")),
            ))
        })
    };
}

static FIXED_WINDOW: LazyLock<Script> = script!("fixed_window", "words");
static SLIDING_WINDOW: LazyLock<Script> = script!("sliding_window", "words");
static SUB_WINDOWS: LazyLock<Script> = script!("sub_windows", "words");
static SLIDING_LOG: LazyLock<Script> = script!("sliding_log", "log");
static TOKEN_BUCKET: LazyLock<Script> = script!("token_bucket", "words");
static INTERVAL_BUCKET: LazyLock<Script> = script!("interval_bucket", "words");
static LEAKY_BUCKET: LazyLock<Script> = script!("leaky_bucket", "words");
static GCRA: LazyLock<Script> = script!("gcra", "words");
static WARM_UP: LazyLock<Script> = script!("warm_up", "words");

/// The script of `algorithm`, and whether it keeps one key per tier (else one per rule).
pub(crate) fn script(algorithm: &Algorithm) -> (&'static Script, bool) {
    match algorithm {
        Algorithm::FixedWindow => (&FIXED_WINDOW, false),
        Algorithm::SlidingWindow => (&SLIDING_WINDOW, false),
        Algorithm::SubWindows(_) => (&SUB_WINDOWS, false),
        Algorithm::SlidingLog => (&SLIDING_LOG, true),
        Algorithm::TokenBucket(_) => (&TOKEN_BUCKET, false),
        Algorithm::IntervalBucket => (&INTERVAL_BUCKET, false),
        Algorithm::LeakyBucket(_) => (&LEAKY_BUCKET, false),
        Algorithm::Gcra => (&GCRA, false),
        Algorithm::WarmUp(_) => (&WARM_UP, false),
    }
}
